//! Clients of a running server's public API, behind the command line's `token`,
//! `publish`, `status`, `state`, `presence`, `cells`, `webhooks` and `subscribe`: [`http`] for the HTTP API, [`subscriber`] for
//! following rooms over a WebSocket, [`cells`] for printing the cells' breakers, [`webhooks`] for the dead letters. They speak the wire format through `protocol`'s
//! types and know nothing of the server's insides: the layer rule keeps this module below
//! actors and handlers.

pub mod cells;
pub mod http;
pub mod subscriber;
pub mod webhooks;

use std::path::PathBuf;

use crate::config::ConfigError;

pub use http::Client;
pub use subscriber::{Subscriber, Subscription};

/// Why a client command failed; `Display` is the one line the command line prints.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A bad `--url`, or no way to know the server's address: the caller's to fix.
    #[error("{0}")]
    Usage(String),
    #[error("no API key: start the server once or set api_key (no key file at {})", key_file.display())]
    NoApiKey { key_file: PathBuf },
    #[error("cannot reach livegate at {base}: {}", http::transport_reason(transport))]
    Unreachable {
        base: String,
        #[source]
        transport: Box<ureq::Transport>,
    },
    /// A reply with a status other than 2xx; `request` is `METHOD /path`.
    #[error("{request}: {}", http::status_error(*status, body))]
    Refused { request: String, status: u16, body: String },
    #[error("{request}: cannot read the reply: {source}")]
    ReadReply { request: String, source: std::io::Error },
    #[error("{request}: unexpected reply {body:?}")]
    UnexpectedReply { request: String, body: String },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// The subscription ended for good: the server said not to reconnect, or the first
    /// connection failed. The message says which and why.
    #[error("{0}")]
    Disconnected(String),
}
