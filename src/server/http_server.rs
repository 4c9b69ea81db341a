//! The node's HTTP server on its listener, plain TCP or TLS (rustls from PEM files):
//! every accepted socket takes a plain HTTP place (`http::sockets`), the first request
//! head and every later one are timed, and upgrade requests go through the same app
//! (`http::upgrade`) before leaving the HTTP layer for livegate's own WebSocket transport.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix_http::HttpService;
use actix_service::ServiceFactoryExt;
use actix_web::rt::net::TcpStream;
use actix_web::{web, App};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::ServerError;
use crate::actors::supervisor::DrainTiming;
use crate::http::sockets::{SocketState, Timed};
use crate::http::{self, AppState};

/// How long a keep-alive connection may wait, idle, for a next request.
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// How long a finished connection may linger for the client to hang up first.
const CLIENT_DISCONNECT_TIMEOUT: Duration = Duration::from_millis(200);

/// The HTTP server on `listener` (TLS when configured), not yet running. Upgrade requests
/// go through the same app (`http::upgrade`), then leave the HTTP layer for livegate's
/// own WebSocket transport.
pub(super) fn http_server(
    listener: std::net::TcpListener,
    tls: Option<rustls::ServerConfig>,
    state: web::Data<AppState>,
    timing: &DrainTiming,
) -> Result<actix_server::ServerBuilder, ServerError> {
    let handshake_timeout = state.config.handshake_timeout();
    let on_connect = Arc::new(http::on_connect(state.metrics.clone(), handshake_timeout));
    let budget = state.sockets.clone();
    let make_app = move || {
        App::new()
            .app_data(state.clone())
            .wrap_fn(|req, service| {
                if let Some(watch) = req.conn_data::<Arc<http::RequestWatch>>() {
                    watch.seen();
                }
                http::sockets::watch_request(req, service)
            })
            .wrap_fn(http::cors::client_files)
            .configure(http::configure)
    };
    // Every accepted socket takes a plain HTTP place first (none free: closed at once)
    // and reads through the head deadline's wrapper.
    let accept = move || {
        let budget = budget.clone();
        actix_service::fn_service(move |io: TcpStream| {
            let state = SocketState::open(&budget, handshake_timeout);
            async move {
                let Some(state) = state else {
                    tracing::debug!(peer = ?io.peer_addr().ok(), "no place for another plain HTTP socket; closed");
                    return Err(std::io::Error::other("no place for another plain HTTP socket"));
                };
                // Frames are written whole; never hold one back for the next.
                io.set_nodelay(true)?;
                let peer = io.peer_addr().ok();
                Ok::<_, std::io::Error>(Timed::new(io, state, peer))
            }
        })
    };
    let shutdown_timeout = timing.spread.as_secs() + timing.grace.as_secs() + 5;
    let builder = actix_server::Server::build()
        .workers(threads())
        .disable_signals()
        // The supervisor decides when connections end; this only bounds the very last step.
        .shutdown_timeout(shutdown_timeout);
    // On a stop, idle keep-alive connections close at once instead of lingering.
    let stopping = builder.graceful_shutdown_signal();
    // One HTTP service per worker for either stream type (plain TCP, TLS).
    macro_rules! http_service {
        ($io:ty) => {{
            let (make_app, on_connect, stopping) =
                (make_app.clone(), on_connect.clone(), stopping.clone());
            move || {
                let (on_connect, stopping) = (on_connect.clone(), stopping.clone());
                let app = || {
                    actix_service::map_config(make_app(), |_| actix_web::dev::AppConfig::default())
                };
                HttpService::build()
                    // Slowloris: the first request head (so a WebSocket upgrade) must arrive
                    // in time; `Timed` times every later one.
                    .client_request_timeout(handshake_timeout)
                    // An idle keep-alive connection (not a byte of a next request) closes.
                    .keep_alive(KEEP_ALIVE)
                    // After a last response drop the TCP connection promptly instead of
                    // lingering actix's default second: clients wait for the server's FIN.
                    .client_disconnect_timeout(CLIENT_DISCONNECT_TIMEOUT)
                    // A client that ends its side of the connection is gone: an SSE
                    // stream's response stops at once (its connection is released now,
                    // not at the next heartbeat's failed write). No client of this API
                    // half-closes and then waits for an answer.
                    .h1_allow_half_closed(false)
                    .graceful_shutdown_signal(move || {
                        let stopping = stopping.clone();
                        async move { stopping.notified().await }
                    })
                    .on_connect_ext(move |io: &$io, data: &mut actix_web::dev::Extensions| {
                        on_connect(io as &dyn std::any::Any, data)
                    })
                    .upgrade(http::upgrade::UpgradeFactory::new(app()))
                    .finish(app())
            }
        }};
    }
    Ok(match tls {
        Some(mut tls) => {
            use actix_tls::accept::rustls_0_23::{Acceptor, TlsStream};
            use actix_tls::accept::TlsError;
            let service = http_service!(TlsStream<Timed<TcpStream>>);
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
            let acceptor = Acceptor::new(tls);
            builder.listen("livegate", listener, move || {
                accept()
                    .map_err(TlsError::Tls)
                    .and_then(
                        acceptor.clone().map_init_err(|_| ()).map_err(TlsError::into_service_error),
                    )
                    .and_then(|io: TlsStream<Timed<TcpStream>>| async move {
                        let peer = io.get_ref().0.peer();
                        Ok((io, actix_http::Protocol::Http1, peer))
                    })
                    .and_then(service().map_err(TlsError::Service))
            })?
        }
        None => {
            let service = http_service!(Timed<TcpStream>);
            builder.listen("livegate", listener, move || {
                accept()
                    .map_err(actix_http::error::DispatchError::Io)
                    .and_then(|io: Timed<TcpStream>| async move {
                        let peer = io.peer();
                        Ok((io, actix_http::Protocol::Http1, peer))
                    })
                    .and_then(service())
            })?
        }
    })
}

/// The rustls server configuration from PEM files (ring provider, TLS 1.2 and 1.3).
pub(super) fn tls_server_config(
    cert: &Path,
    key: &Path,
) -> Result<rustls::ServerConfig, ServerError> {
    let failed = |what: &'static str, path: &Path, source| ServerError::TlsPem {
        what,
        path: path.to_path_buf(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| failed("certificate chain", cert, e))?;
    if certs.is_empty() {
        return Err(ServerError::TlsNoCertificate { path: cert.to_path_buf() });
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| failed("private key", key, e))?;
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_no_client_auth().with_single_cert(certs, key_der))
        .map_err(|source| ServerError::TlsConfig {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            source,
        })
}

/// Worker threads: the HTTP server's, and the rooms' arbiters.
pub(super) fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}
