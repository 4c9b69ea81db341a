//! The Server-Sent Events transport: what a connection's actor writes on a
//! `/v1/sse` stream, and the response body actix-web streams it from.
//!
//! [`SseIo`] is the actor's end: a queue of encoded messages (`event:`, `id:`, `data:`
//! lines), counted like [`super::wsio::WsIo`]'s write queue (and into the connection's
//! backlog, [`SseIo::count_into`]) so the connection's `max_outbox_bytes` bound covers it. [`SseBody`] is the response body's end, polled by
//! actix-http's dispatcher when it has room to write. Both live on the HTTP worker's
//! thread (the actor is started by the handler there), so they share the queue in an
//! `Rc<RefCell>` without locks.
//!
//! Nothing is read from an SSE client. A client that went away shows up as actix
//! dropping the body (its socket failed, or it ended): the body's `Drop` wakes the
//! actor's [`SseIo::ended`] future, and the actor stops, releasing its registration,
//! limits permit and gauges. After the actor's last message ([`SseIo::close`] or
//! [`SseIo::finish`]) the body yields what is queued and then ends the response.
//!
//! Unlike a WebSocket, the stream stays in actix-http's HTTP/1 dispatcher (its read and
//! write buffers) while it lasts: the price of being a plain HTTP response, which is what
//! lets it through proxies that break the upgrade.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, Waker};

use actix_web::web::Bytes;

use crate::core::delivery::backlog::Backlog;
use crate::core::delivery::sse::data_lines;

/// The comment sent every heartbeat.
const PING: &[u8] = b": ping\n\n";
/// What ends every message.
const END: &[u8] = b"\n\n";

#[derive(Default)]
struct Shared {
    /// Encoded pieces not yet taken by the body, each marked when it ends a message.
    queue: VecDeque<(Bytes, bool)>,
    queued: usize,
    /// Where `queued` is also counted: the connection's backlog.
    counter: Option<std::sync::Arc<Backlog>>,
    /// The body took part of a message, not its end yet.
    mid_message: bool,
    /// The body waiting for something to write.
    body: Option<Waker>,
    /// The actor waiting for the body to end.
    actor: Option<Waker>,
    /// The actor wrote its last message: the body ends once the queue is empty.
    finished: bool,
    /// The body ended the response or was dropped: nothing more can be written.
    gone: bool,
}

impl Shared {
    fn set_queued(&mut self, bytes: usize) {
        self.queued = bytes;
        if let Some(counter) = &self.counter {
            counter.set_queued(bytes);
        }
    }
}

/// The actor's end of one SSE stream.
pub struct SseIo {
    shared: Rc<RefCell<Shared>>,
}

/// The response body of one SSE stream (see [`SseIo`]).
pub struct SseBody {
    shared: Rc<RefCell<Shared>>,
}

/// A new stream: the actor's end and the response body.
pub fn stream() -> (SseIo, SseBody) {
    let shared = Rc::new(RefCell::new(Shared::default()));
    (SseIo { shared: shared.clone() }, SseBody { shared })
}

/// The data of a message, as it follows its first `data: `: `text` itself when it has no
/// line break, else its lines joined by `\ndata: ` ([`data_lines`]).
pub fn data(text: Bytes) -> Bytes {
    match data_lines(&text) {
        None => text,
        Some(lines) => Bytes::from(lines),
    }
}

impl SseIo {
    /// Bytes queued and not yet taken by the response body.
    pub fn queued_bytes(&self) -> usize {
        self.shared.borrow().queued
    }

    /// Count what is queued in `backlog` too, from now on (the connection's bound).
    pub fn count_into(&mut self, backlog: std::sync::Arc<Backlog>) {
        let mut shared = self.shared.borrow_mut();
        backlog.set_queued(shared.queued);
        shared.counter = Some(backlog);
    }

    fn push(&mut self, pieces: impl IntoIterator<Item = Bytes>) {
        let mut shared = self.shared.borrow_mut();
        if shared.finished || shared.gone {
            return;
        }
        let mut pieces = pieces.into_iter().peekable();
        while let Some(piece) = pieces.next() {
            let queued = shared.queued + piece.len();
            shared.set_queued(queued);
            let last = pieces.peek().is_none();
            shared.queue.push_back((piece, last));
        }
        if let Some(body) = shared.body.take() {
            body.wake();
        }
    }

    /// A message `event: NAME` with `text` (JSON, possibly with line breaks) as its data.
    pub fn message(&mut self, event: &str, text: &str) {
        let head = Bytes::from(format!("event: {event}\ndata: "));
        self.push([head, data(Bytes::copy_from_slice(text.as_bytes())), Bytes::from_static(END)]);
    }

    /// An `events` message: `id: CURSOR`, and `data`, already framed by [`data`] (shared
    /// by every SSE subscriber of a room window, not copied).
    pub fn events(&mut self, cursor: &str, data: Bytes) {
        let head = Bytes::from(format!("event: events\nid: {cursor}\ndata: "));
        self.push([head, data, Bytes::from_static(END)]);
    }

    /// The heartbeat comment.
    pub fn ping(&mut self) {
        self.push([Bytes::from_static(PING)]);
    }

    /// The last message: `event: close` with `text` as its data; the stream ends after it.
    pub fn close(&mut self, text: &str) {
        self.message("close", text);
        self.finish();
    }

    /// Drop what is queued (a slow consumer's backlog), so a close queued next is the
    /// next thing the client reads after the rest of a message the body already began.
    pub fn discard_unsent(&mut self) {
        let mut shared = self.shared.borrow_mut();
        let keep = match shared.mid_message {
            true => shared.queue.iter().position(|(_, last)| *last).map_or(0, |end| end + 1),
            false => 0,
        };
        shared.queue.truncate(keep);
        let queued = shared.queue.iter().map(|(piece, _)| piece.len()).sum();
        shared.set_queued(queued);
    }

    /// Write nothing more: the body ends the response once the queue is empty.
    pub fn finish(&mut self) {
        let mut shared = self.shared.borrow_mut();
        shared.finished = true;
        if let Some(body) = shared.body.take() {
            body.wake();
        }
    }

    /// Resolves once the body has ended the response or was dropped (the client is gone).
    pub fn ended(&self) -> impl std::future::Future<Output = ()> + 'static {
        let shared = self.shared.clone();
        std::future::poll_fn(move |cx| {
            let mut shared = shared.borrow_mut();
            if shared.gone {
                return Poll::Ready(());
            }
            if !shared.actor.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                shared.actor = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }
}

impl SseBody {
    fn end(&self) {
        let mut shared = self.shared.borrow_mut();
        shared.gone = true;
        shared.queue.clear();
        shared.set_queued(0);
        if let Some(actor) = shared.actor.take() {
            actor.wake();
        }
    }
}

impl futures_util::Stream for SseBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let mut shared = self.shared.borrow_mut();
        if let Some((piece, last)) = shared.queue.pop_front() {
            let queued = shared.queued - piece.len();
            shared.set_queued(queued);
            shared.mid_message = !last;
            if shared.queue.capacity() > 64 && shared.queue.is_empty() {
                shared.queue = VecDeque::new();
            }
            return Poll::Ready(Some(Ok(piece)));
        }
        if shared.finished || shared.gone {
            drop(shared);
            self.end();
            return Poll::Ready(None);
        }
        if !shared.body.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            shared.body = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// The client is gone (or the response ended): the actor hears of it.
impl Drop for SseBody {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn text(pieces: Vec<Bytes>) -> String {
        pieces.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect()
    }

    #[tokio::test]
    async fn messages_then_close_end_the_body() {
        let (mut io, body) = stream();
        io.message("welcome", "{\"op\":\"welcome\"}");
        io.events("r:E:2", data(Bytes::from_static(b"{\"a\":\n1}")));
        io.ping();
        assert!(io.queued_bytes() > 0);
        io.close("{\"code\":1012}");
        io.ping(); // after the close: dropped
        let pieces: Vec<Bytes> = body.map(|p| p.unwrap()).collect().await;
        assert_eq!(
            text(pieces),
            "event: welcome\ndata: {\"op\":\"welcome\"}\n\n\
             event: events\nid: r:E:2\ndata: {\"a\":\ndata: 1}\n\n\
             : ping\n\n\
             event: close\ndata: {\"code\":1012}\n\n"
        );
        io.ended().await;
        assert_eq!(io.queued_bytes(), 0);
    }

    #[tokio::test]
    async fn a_dropped_body_ends_the_stream_for_the_actor() {
        let (mut io, body) = stream();
        io.ping();
        drop(body);
        io.ended().await;
        assert_eq!(io.queued_bytes(), 0);
        io.ping();
        assert_eq!(io.queued_bytes(), 0, "nothing is queued for a body that is gone");
    }

    #[tokio::test]
    async fn discarding_finishes_a_message_the_body_began() {
        let (mut io, mut body) = stream();
        io.events("r:E:1", Bytes::from_static(b"{}"));
        io.events("r:E:2", Bytes::from_static(b"{}"));
        let head = body.next().await.unwrap().unwrap();
        assert_eq!(&head[..], b"event: events\nid: r:E:1\ndata: ");
        io.discard_unsent();
        io.close("{\"code\":4009}");
        let pieces: Vec<Bytes> = body.map(|p| p.unwrap()).collect().await;
        assert_eq!(text(pieces), "{}\n\nevent: close\ndata: {\"code\":4009}\n\n");
    }

    #[tokio::test]
    async fn discarding_keeps_what_follows() {
        let (mut io, body) = stream();
        io.message("events", "{}");
        io.discard_unsent();
        assert_eq!(io.queued_bytes(), 0);
        io.close("{\"code\":4009}");
        let pieces: Vec<Bytes> = body.map(|p| p.unwrap()).collect().await;
        assert_eq!(text(pieces), "event: close\ndata: {\"code\":4009}\n\n");
    }
}
