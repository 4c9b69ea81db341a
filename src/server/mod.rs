//! `run(listener, config, shutdown)`: a [`Node`] built on the given listener (the store
//! opened, the actors started, the HTTP server bound), served until `shutdown` resolves
//! and the supervisor drained (1012 to every connection, spread out), then stopped in
//! order ([`Node::shutdown`]) before returning. `main` and the tests call the same code;
//! the caller owns the listener and the signals.
//!
//! `node.rs` is the node: its wiring, serving and shutdown order; `bridges.rs`
//! implements the cluster's seams over the actors; `upkeep.rs` holds the node's timers
//! (purges, the session sweep) and its signal forwarding; `http_server.rs` the HTTP
//! server (plain TCP or TLS).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use futures_util::stream::{self, Stream, StreamExt};
use thiserror::Error;

use crate::actors::supervisor::StartError;
use crate::actors::webhooks::WebhookError;
use crate::cluster::ClusterError;
use crate::config::{Config, ConfigError};
use crate::http::ReloadConfig;
use crate::store::StoreError;

mod bridges;
mod http_server;
mod node;
mod upkeep;

pub use node::{Node, NodeOptions};

#[derive(Debug, Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("startup failed: {0}")]
    Start(#[from] StartError),
    #[error("webhooks: {0}")]
    Webhooks(#[from] WebhookError),
    #[error("startup failed: the supervisor is gone: {0}")]
    SupervisorGone(#[source] actix::MailboxError),
    #[error("TLS: cannot read the {what} from {}: {source}", path.display())]
    TlsPem { what: &'static str, path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("TLS: cannot read the certificate chain from {}: no CERTIFICATE block", path.display())]
    TlsNoCertificate { path: PathBuf },
    #[error("TLS: certificate {} and key {}: {source}", cert.display(), key.display())]
    TlsConfig { cert: PathBuf, key: PathBuf, source: rustls::Error },
    #[error("cluster: {0}")]
    Cluster(#[from] ClusterError),
    #[error("JWT keys: {0}")]
    JwtKeys(#[from] crate::http::jwt::JwtKeyError),
}

/// Signals as a stream: each item is one signal.
pub type Signals = Pin<Box<dyn Stream<Item = ()>>>;

/// How a running node is steered from outside.
pub struct Control {
    /// The first item starts a drain, a second one forces it (SIGTERM, SIGINT).
    pub shutdown: Signals,
    /// Each item reloads the API keys and allowed origins (SIGHUP).
    pub reload: Signals,
    /// Where a reload reads the configuration; `None` keeps the one given at start.
    pub reload_config: Option<ReloadConfig>,
    /// Adds the score page and the match simulator.
    pub demo: bool,
    /// Development mode (`serve --dev`): pages from allowed origins mint tokens without
    /// the API key.
    pub dev: bool,
}

/// Serve on `listener` until `shutdown` resolves, then drain. Must run inside an actix
/// system.
pub async fn run(
    listener: std::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + 'static,
) -> Result<(), ServerError> {
    let control = Control {
        shutdown: Box::pin(stream::once(shutdown).chain(stream::pending())),
        reload: Box::pin(stream::pending()),
        reload_config: None,
        demo: false,
        dev: false,
    };
    run_controlled(listener, config, control).await
}

/// Serve on `listener`, steered by `control`: build the node, serve until drained, stop
/// it in order. Must run inside an actix system.
pub async fn run_controlled(
    listener: std::net::TcpListener,
    config: Config,
    control: Control,
) -> Result<(), ServerError> {
    let Control { shutdown, reload, reload_config, demo, dev } = control;
    let mut node = Node::build(listener, config, NodeOptions { reload_config, demo, dev }).await?;
    let served = node.serve(shutdown, reload).await;
    // Stopped in order whether or not it served to the end (a start that failed too).
    let stopped = node.shutdown().await;
    stopped.and(served)
}

/// The process's soft limit on open files.
fn open_files_limit() -> u64 {
    rlimit::Resource::NOFILE.get_soft().unwrap_or(1024)
}

/// Raise the soft open-file limit to the hard one, as a server holding many sockets
/// should; returns the limit now in force.
pub fn raise_open_files_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or_else(|_| open_files_limit())
}

/// The TLS server configuration when `tls_cert` and `tls_key` are set, read from their
/// files; callers check it before announcing a listener.
pub fn tls_config(config: &Config) -> Result<Option<rustls::ServerConfig>, ServerError> {
    config
        .tls_cert
        .as_ref()
        .zip(config.tls_key.as_ref())
        .map(|(cert, key)| http_server::tls_server_config(cert, key))
        .transpose()
}
