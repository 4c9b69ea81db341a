//! Plain HTTP sockets: their place in the node's open-file budget and the deadline of
//! every request head on them.
//!
//! The budget: every accepted socket takes one of `max_http_connections` places
//! ([`SocketBudget`]); with none free it is closed at once, unanswered. A socket that
//! becomes a WebSocket (101) or an SSE stream gives its place back and from then on holds
//! only its connection's permit (`max_connections`, `limits.rs`), which the open-file
//! limit bounds to what the plain places leave: streams and plain HTTP sockets never
//! take each other's descriptors.
//!
//! The deadline: actix-http times only the first request head of a connection (408 after
//! `handshake_timeout_ms`), and its keep-alive timer stops at the first byte of the next
//! request, so a client that sends one byte of a second request would hold the socket for
//! ever. [`Timed`] wraps the socket and fails its reads (the connection ends) when the
//! next head is not complete `handshake_timeout_ms` after the previous answer was written
//! (each byte of that answer the client takes starts the time again, so a slow reader is
//! not cut off while it reads). The app tells the socket's [`SocketState`] when a head
//! arrived and when its answer is done ([`watch_request`]).
//!
//! Every accepted connection also passes [`on_connect`]: its place and deadline handed to
//! its requests, `TCP_USER_TIMEOUT` set, and a [`RequestWatch`] that counts a connection
//! the head timeout cut off.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_codec::{AsyncRead, AsyncWrite, ReadBuf};
use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::rt::net::{ActixStream, Ready, TcpStream};
use actix_web::web::Bytes;
use tokio::time::{Instant, Sleep};

use crate::metrics::Metrics;

/// The node's places for plain HTTP sockets, shared by every worker.
pub struct SocketBudget {
    max: usize,
    open: AtomicUsize,
    metrics: Arc<Metrics>,
}

impl SocketBudget {
    pub fn new(max: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(SocketBudget { max, open: AtomicUsize::new(0), metrics })
    }

    /// Take a place for a newly accepted socket, if one is free.
    fn take(&self) -> bool {
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.max).then_some(open + 1)
            })
            .is_ok();
        if !taken {
            self.metrics.limit_hit("http_connections");
        }
        taken
    }

    fn give_back(&self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    /// Plain HTTP sockets holding a place now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

/// One socket's place and head deadline, shared (on its worker's thread) by its [`Timed`]
/// reader and the requests on it (as connection data).
pub struct SocketState {
    budget: Arc<SocketBudget>,
    timeout: Duration,
    /// By when the next request head must be complete; `None` while there is no such
    /// deadline (before the first head, which actix-http times; while a request is being
    /// answered; on a stream).
    deadline: Cell<Option<Instant>>,
    /// Holds a place in the budget (until it becomes a stream or closes).
    placed: Cell<bool>,
    stream: Cell<bool>,
}

impl SocketState {
    /// A place for a new socket, or `None` (the socket is to be closed) when the budget is full.
    pub fn open(budget: &Arc<SocketBudget>, timeout: Duration) -> Option<Rc<Self>> {
        budget.take().then(|| {
            Rc::new(SocketState {
                budget: budget.clone(),
                timeout,
                deadline: Cell::new(None),
                placed: Cell::new(true),
                stream: Cell::new(false),
            })
        })
    }

    /// A request head arrived: no deadline while it is answered.
    pub fn request_started(&self) {
        self.deadline.set(None);
    }

    /// The answer was handed to the socket: the next head is due within the timeout.
    pub fn answered(&self) {
        if !self.stream.get() {
            self.deadline.set(Some(Instant::now() + self.timeout));
        }
    }

    /// The socket is a WebSocket or an SSE stream now: no head deadline ever again, and
    /// its place goes back to the budget (the connection's permit counts it from now).
    pub fn became_stream(&self) {
        self.stream.set(true);
        self.deadline.set(None);
        self.give_back();
    }

    fn give_back(&self) {
        if self.placed.replace(false) {
            self.budget.give_back();
        }
    }

    /// Bytes of the answer went out: the client is reading, so its time starts again.
    fn wrote(&self) {
        if self.deadline.get().is_some() {
            self.deadline.set(Some(Instant::now() + self.timeout));
        }
    }
}

impl Drop for SocketState {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// A socket whose reads fail once a request head is overdue ([`SocketState`]).
pub struct Timed<T> {
    io: T,
    /// Dropped once the socket is a stream: it never has a deadline again.
    state: Option<Rc<SocketState>>,
    /// The timer of the deadline in force, made when the first one is.
    sleep: Option<Pin<Box<Sleep>>>,
    peer: Option<SocketAddr>,
}

impl<T> Timed<T> {
    pub fn new(io: T, state: Rc<SocketState>, peer: Option<SocketAddr>) -> Self {
        Timed { io, state: Some(state), sleep: None, peer }
    }

    pub fn state(&self) -> Option<&Rc<SocketState>> {
        self.state.as_ref()
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }

    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Whether the head deadline passed (then the read fails); arms the timer otherwise.
    fn overdue(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(state) = &self.state else { return false };
        if state.stream.get() {
            // The connection data keeps what the stream still needs of the state.
            (self.state, self.sleep) = (None, None);
            return false;
        }
        let Some(deadline) = state.deadline.get() else { return false };
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        if sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        state.budget.metrics.limit_hit("handshake_timeout");
        tracing::debug!(peer = ?self.peer, "request head not complete in time; connection closed");
        true
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Timed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.overdue(cx) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head not complete in time",
            )));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Timed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(state)) = (&written, &self.state) {
            if *n > 0 {
                state.wrote();
            }
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(state)) = (&written, &self.state) {
            if *n > 0 {
                state.wrote();
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The descriptor of `io` when it is a plain TCP socket of this server (`None` for TLS):
/// what a WebSocket's rooms may write to from their own threads.
pub fn plain_tcp_fd(io: &dyn std::any::Any) -> Option<std::os::fd::RawFd> {
    use std::os::fd::AsRawFd;
    io.downcast_ref::<Timed<TcpStream>>().map(|timed| timed.io.as_raw_fd())
}

/// The TLS acceptor reads readiness through it.
impl ActixStream for Timed<TcpStream> {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<Ready>> {
        <TcpStream as ActixStream>::poll_read_ready(&self.io, cx)
    }

    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<Ready>> {
        <TcpStream as ActixStream>::poll_write_ready(&self.io, cx)
    }
}

/// The app's part (a `wrap_fn` around every route): a request head arrived; when its
/// answer is a WebSocket or an SSE stream the socket becomes a stream, otherwise the
/// head deadline starts again once the answer's body is done.
pub fn watch_request<S>(
    req: ServiceRequest,
    service: &S,
) -> impl Future<Output = Result<ServiceResponse, actix_web::Error>>
where
    S: actix_web::dev::Service<
        ServiceRequest,
        Response = ServiceResponse,
        Error = actix_web::Error,
    >,
{
    let state = req.conn_data::<Rc<SocketState>>().cloned();
    if let Some(state) = &state {
        state.request_started();
    }
    let answer = service.call(req);
    async move {
        let response = match answer.await {
            Ok(response) => response,
            Err(error) => {
                // actix-http answers it; the next head is due as after any answer.
                if let Some(state) = &state {
                    state.answered();
                }
                return Err(error);
            }
        };
        let Some(state) = state else { return Ok(response) };
        if is_stream(&response) {
            state.became_stream();
            return Ok(response);
        }
        Ok(response.map_body(|_, body| BoxBody::new(Answer { body, state: Some(state) })))
    }
}

/// A 101 (the socket leaves HTTP for a WebSocket) or an event stream.
fn is_stream(response: &ServiceResponse) -> bool {
    response.status() == actix_web::http::StatusCode::SWITCHING_PROTOCOLS
        || response
            .headers()
            .get(actix_web::http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// An answer's body; when it is dropped (written whole, or abandoned) the socket waits
/// for its next request head.
struct Answer {
    body: BoxBody,
    state: Option<Rc<SocketState>>,
}

impl MessageBody for Answer {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.body).poll_next(cx)
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            state.answered();
        }
    }
}

/// A socket with data unacknowledged this long is dropped by the kernel: the backstop for
/// peers that vanished or stopped reading.
const TCP_USER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Notes whether a TCP connection ever completed a request head; one that ends without
/// one after the handshake timeout was cut off by it (a slowloris, or a client that gave up).
pub struct RequestWatch {
    opened: std::time::Instant,
    seen: std::sync::atomic::AtomicBool,
    timeout: std::time::Duration,
    metrics: Arc<Metrics>,
}

impl RequestWatch {
    /// Mark that a complete request head arrived on this connection.
    pub fn seen(&self) {
        self.seen.store(true, Ordering::Relaxed);
    }
}

impl Drop for RequestWatch {
    fn drop(&mut self) {
        // actix answers 408 when the timeout fires; allow for timer granularity.
        if !self.seen.load(Ordering::Relaxed) && self.opened.elapsed() >= self.timeout.mul_f32(0.9)
        {
            self.metrics.limit_hit("handshake_timeout");
        }
    }
}

/// The hook called for every accepted connection (see [`prepare_connection`]).
pub fn on_connect(
    metrics: Arc<Metrics>,
    handshake_timeout: std::time::Duration,
) -> impl Fn(&dyn std::any::Any, &mut actix_web::dev::Extensions) + Send + Sync + 'static {
    move |conn, data| {
        let watch = RequestWatch {
            opened: std::time::Instant::now(),
            seen: Default::default(),
            timeout: handshake_timeout,
            metrics: metrics.clone(),
        };
        data.insert(Arc::new(watch));
        prepare_connection(conn, data);
    }
}

/// Hand the socket's place and head deadline ([`SocketState`]) to its requests,
/// and bound how long unacknowledged data may wait: the kernel's backstop for a peer that
/// vanished (the connection's own timers handle one that stopped reading).
fn prepare_connection(conn: &dyn std::any::Any, data: &mut actix_web::dev::Extensions) {
    use actix_tls::accept::rustls_0_23::TlsStream;
    use actix_web::rt::net::TcpStream;
    let timed = match conn.downcast_ref::<Timed<TcpStream>>() {
        Some(plain) => plain,
        None => match conn.downcast_ref::<TlsStream<Timed<TcpStream>>>() {
            Some(tls) => tls.get_ref().0,
            None => return,
        },
    };
    if let Some(state) = timed.state() {
        data.insert(state.clone());
    }
    let socket = socket2::SockRef::from(timed.get_ref());
    if let Err(error) = socket.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT)) {
        tracing::debug!(%error, "could not set TCP_USER_TIMEOUT");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_counted_and_given_back_once() {
        let budget = SocketBudget::new(2, Arc::new(Metrics::default()));
        let a = SocketState::open(&budget, Duration::from_secs(1)).expect("first");
        let b = SocketState::open(&budget, Duration::from_secs(1)).expect("second");
        assert!(SocketState::open(&budget, Duration::from_secs(1)).is_none(), "full");
        // A stream gives its place back at once, and not again when it closes.
        b.became_stream();
        assert_eq!(budget.open(), 1);
        drop(b);
        assert_eq!(budget.open(), 1);
        let c = SocketState::open(&budget, Duration::from_secs(1)).expect("a place came back");
        drop((a, c));
        assert_eq!(budget.open(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_is_due_after_each_answer_but_not_on_a_stream() {
        let budget = SocketBudget::new(4, Arc::new(Metrics::default()));
        let state = SocketState::open(&budget, Duration::from_secs(5)).unwrap();
        assert_eq!(state.deadline.get(), None, "the first head is actix-http's");
        state.request_started();
        state.answered();
        let due = state.deadline.get().expect("due after an answer");
        assert_eq!(due, Instant::now() + Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(2)).await;
        state.wrote();
        assert_eq!(
            state.deadline.get(),
            Some(Instant::now() + Duration::from_secs(5)),
            "a reading client's time starts again"
        );
        state.request_started();
        assert_eq!(state.deadline.get(), None);
        state.became_stream();
        state.answered();
        state.wrote();
        assert_eq!(state.deadline.get(), None, "a stream has no head deadline");
    }
}
