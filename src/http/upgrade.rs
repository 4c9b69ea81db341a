//! actix-http's upgrade hook: every request that asks for a protocol upgrade comes here
//! with the connection's framed I/O. It runs through the same actix-web app as any other
//! request, so routing, checks and error bodies are the handlers' own. A handler that
//! accepts answers 101 with [`Accepted`] in the response's extensions: this queues the
//! 101 on livegate's own transport (written with the connection's first frames), takes
//! the socket out of the HTTP layer (its 8 KiB buffers are dropped) and starts the
//! connection's actor on that transport. Any other answer is
//! written as it is and the connection then ends. A request that is not a WebSocket
//! handshake on a WebSocket route (`GET /v1/sse` with `Upgrade: websocket`, say) is
//! refused here with 400 before the app sees it: nothing is checked or spent, and no
//! handler's streaming answer is ever held in this hook.
//!
//! The HTTP layer's future for the connection lasts until the socket is closed, so the
//! server counts the connection and a graceful stop waits for it: the connection actors
//! run on the HTTP workers' threads, which a stop with nothing counted ends at once.
//! While it waits it holds only that wait (about 1 KiB of actix-http's dispatcher and
//! task); the handshake's state, the HTTP codec and its buffers are gone by then.

use std::rc::Rc;

use actix_codec::{AsyncRead, AsyncWrite, Framed};
use actix_http::body::{BodySize, BoxBody};
use actix_http::{h1, ConnectionType, Request};
use actix_service::{Service, ServiceFactory};
use actix_web::dev::ServiceResponse;
use actix_web::ResponseError;
use futures_util::future::LocalBoxFuture;
use futures_util::SinkExt;
use tokio::sync::oneshot;

use crate::actors::wsio::{Accepted, Finished, WsIo};

/// The routes that answer with a WebSocket: the only ones an upgrade request reaches.
pub const WEBSOCKET_ROUTES: &[&str] = &["/v1/ws", "/v1/echo"];

/// Largest refusal body written on an upgrade request.
const BODY_LIMIT: usize = 64 * 1024;

/// Builds an [`Upgrade`] per worker around a fresh instance of the app.
pub struct UpgradeFactory<F> {
    app: F,
}

impl<F> UpgradeFactory<F> {
    pub fn new(app: F) -> Self {
        UpgradeFactory { app }
    }
}

impl<T, F, S> ServiceFactory<(Request, Framed<T, h1::Codec>)> for UpgradeFactory<F>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    F: ServiceFactory<
        Request,
        Config = (),
        Service = S,
        Response = ServiceResponse,
        Error = actix_web::Error,
    >,
    F::Future: 'static,
    F::InitError: 'static,
    S: Service<Request, Response = ServiceResponse, Error = actix_web::Error> + 'static,
{
    type Response = ();
    type Error = actix_web::Error;
    type Config = ();
    type Service = Upgrade<S>;
    type InitError = F::InitError;
    type Future = LocalBoxFuture<'static, Result<Self::Service, Self::InitError>>;

    fn new_service(&self, _: ()) -> Self::Future {
        let app = self.app.new_service(());
        Box::pin(async move { Ok(Upgrade { app: Rc::new(app.await?) }) })
    }
}

pub struct Upgrade<S> {
    app: Rc<S>,
}

impl<T, S> Service<(Request, Framed<T, h1::Codec>)> for Upgrade<S>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    S: Service<Request, Response = ServiceResponse, Error = actix_web::Error> + 'static,
{
    type Response = ();
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<(), actix_web::Error>>;

    actix_service::always_ready!();

    fn call(&self, (req, framed): (Request, Framed<T, h1::Codec>)) -> Self::Future {
        if let Err(refusal) = websocket_handshake(&req) {
            tracing::debug!(
                path = req.path(),
                "upgrade refused: not a WebSocket handshake on a WebSocket route"
            );
            return Box::pin(async move {
                write_refusal(framed, refusal.error_response().into()).await
            });
        }
        let app = self.app.clone();
        // The handshake in a box of its own: what waits for the socket to close is only
        // the receiver, not the handshake's state with the HTTP codec's leftover write
        // buffer (about 5 KiB per idle connection in the bench).
        let handshake: LocalBoxFuture<'static, _> = Box::pin(handshake(app, req, framed));
        Box::pin(async move {
            // A statement of its own: the handshake's box is freed here, not held by the
            // `if let` while the socket lives.
            let closed = handshake.await?;
            if let Some(closed) = closed {
                let _ = closed.await;
            }
            Ok(())
        })
    }
}

/// Runs the upgrade request through the app and writes its answer. When the handler
/// accepted, starts the connection's actor on the socket and returns what resolves once
/// the socket is closed.
async fn handshake<T, S>(
    app: Rc<S>,
    req: Request,
    mut framed: Framed<T, h1::Codec>,
) -> Result<Option<oneshot::Receiver<()>>, actix_web::Error>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    S: Service<Request, Response = ServiceResponse, Error = actix_web::Error> + 'static,
{
    let mut response: actix_http::Response<_> = match app.call(req).await {
        Ok(response) => response.into(),
        Err(error) => error.error_response().into(),
    };
    let accepted = response.extensions_mut().remove::<Accepted>();
    match accepted {
        Some(accepted) if response.status() == actix_http::StatusCode::SWITCHING_PROTOCOLS => {
            // The 101 is encoded, not written: it leads the socket's queue, so it goes out
            // in one write with the first frames the connection queues (its `welcome`),
            // one system call and one segment fewer per handshake.
            std::pin::Pin::new(&mut framed)
                .write(h1::Message::Item((response.drop_body(), BodySize::None)))?;
            let parts = framed.into_parts();
            let fd = super::sockets::plain_tcp_fd(&parts.io);
            let mut io =
                WsIo::new(Box::new(parts.io), parts.read_buf, accepted.max_frame_bytes, fd);
            // Copied out: the codec's write buffer is 8 KiB, the 101 a few hundred bytes.
            io.frame(actix_web::web::Bytes::copy_from_slice(&parts.write_buf));
            let (finished, closed) = Finished::new();
            io.hold(finished);
            accepted.start(io);
            Ok(Some(closed))
        }
        _ => {
            write_refusal(framed, response).await?;
            Ok(None)
        }
    }
}

/// Whether `req` may go on to the app as an upgrade: a route that answers with a WebSocket
/// ([`WEBSOCKET_ROUTES`]) and `Upgrade: websocket`. The route's handler checks the
/// rest of the handshake.
fn websocket_handshake(req: &Request) -> Result<(), super::errors::ApiError> {
    let websocket = req
        .head()
        .headers
        .get(actix_http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"));
    if websocket && WEBSOCKET_ROUTES.contains(&req.path()) {
        return Ok(());
    }
    let routes = WEBSOCKET_ROUTES.join(" and ");
    Err(super::errors::api_error(
        crate::protocol::ErrorCode::BadRequest,
        format!("only a WebSocket handshake (Upgrade: websocket) to {routes} upgrades the connection; send this request without Upgrade"),
    ))
}

/// Write an answer that does not upgrade, then end the connection.
async fn write_refusal<T>(
    mut framed: Framed<T, h1::Codec>,
    response: actix_http::Response<BoxBody>,
) -> Result<(), actix_web::Error>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (mut head, body) = response.into_parts();
    let body = actix_web::body::to_bytes_limited(body, BODY_LIMIT)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    head.head_mut().set_connection_type(ConnectionType::Close);
    let size = BodySize::Sized(body.len() as u64);
    // Head and body in one write: some clients read a refusal's body only from what
    // arrived with its head.
    framed.feed(h1::Message::Item((head, size))).await?;
    if !body.is_empty() {
        framed.feed(h1::Message::Chunk(Some(body))).await?;
    }
    framed.feed(h1::Message::Chunk(None)).await?;
    // `close` only shuts the socket down: write the buffer first.
    framed.flush().await?;
    let _ = framed.close().await;
    Ok(())
}
