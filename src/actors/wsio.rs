//! livegate's own WebSocket transport: the socket of one upgraded connection, driven from
//! inside the connection's actor. It replaces actix-web-actors, whose connection lived in
//! actix-http's HTTP/1 dispatcher with an 8 KiB read and an 8 KiB write buffer for its
//! whole life, and needed a second descriptor to shut a stuck socket down.
//!
//! - Reading goes through one scratch buffer per thread; a connection keeps only the bytes
//!   of a frame not complete yet, so an idle connection holds no read buffer.
//! - Writing is a queue of encoded frames written with vectored writes: a room window's
//!   frame is encoded once ([`encode_text`]) and every subscriber queues the same bytes.
//!   The queue is counted ([`WsIo::queued_bytes`], and into the connection's
//!   [`Backlog`] once [`WsIo::count_into`] gave it one) so the owner can bound it.
//! - The owner decides before each frame is read whether to read at all
//!   ([`WsActor::may_read`]): a connection over its outbox bound is not read from, so the
//!   kernel's buffers fill and TCP pushes back on the client.
//! - The actor owns the socket, so a client that stops reading never freezes the actor:
//!   its timers still run, and stopping the actor ends the socket ([`WsIo::finish`]).
//!
//! Frames are parsed and encoded with actix-http's WebSocket codec (RFC 6455).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use actix::prelude::*;
use actix::fut::ActorFuture;
use actix_codec::{AsyncRead, AsyncWrite, Decoder, Encoder, ReadBuf};
use actix_http::ws::{self, CloseReason, Codec, Frame, Message, OpCode, Parser, ProtocolError};
use actix_web::web::{Bytes, BytesMut};

use crate::core::backlog::Backlog;

/// Bytes read per system call into the thread's scratch buffer.
const SCRATCH_BYTES: usize = 16 * 1024;
/// Frames read per turn before the actor's other work gets its go.
const FRAMES_PER_TURN: usize = 32;
/// Queued frames handed to one vectored write.
const SLICES_PER_WRITE: usize = 64;

thread_local! {
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH_BYTES].into_boxed_slice());
}

/// The byte stream under a WebSocket: plain TCP or TLS.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + 'static> Stream for T {}

/// Why a read ended the message stream.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("WebSocket protocol error: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("text frame is not valid UTF-8")]
    InvalidUtf8,
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}

/// The payload of a frame [`encode_text`] made: the bytes after its header (server
/// frames are unmasked, so the header is 2, 4 or 10 bytes by the payload's length).
pub fn payload_of(frame: &Bytes) -> Bytes {
    let header = match frame.get(1).map(|b| b & 0x7f) {
        None => return Bytes::new(),
        Some(126) => 4,
        Some(127) => 10,
        Some(_) => 2,
    };
    frame.slice(header.min(frame.len())..)
}

/// A whole frame, encoded as it goes on the wire (server frames are not masked).
pub fn encode_text(text: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(text.len() + 10);
    Parser::write_message(&mut out, text, OpCode::Text, true, false);
    out.freeze()
}

pub struct WsIo {
    stream: Box<dyn Stream>,
    codec: Codec,
    /// Bytes of a frame not complete yet (empty, and unallocated, between frames).
    read: BytesMut,
    /// Encoded frames not yet written; the first may be partly written.
    queue: VecDeque<Bytes>,
    /// Bytes of `queue[0]` already written.
    written: usize,
    queued: usize,
    /// Where `queued` is also counted: the connection's backlog (None: not bounded).
    counter: Option<std::sync::Arc<Backlog>>,
    /// The owning actor's task, to write from outside the poll (a handler, a timer).
    waker: Option<Waker>,
    /// The read side ended (end of stream or an error was reported).
    read_done: bool,
    /// Writing failed: everything queued is dropped from now on.
    broken: bool,
    /// Dropped once the socket is closed.
    finished: Option<Finished>,
}

impl WsIo {
    /// `leftover`: bytes the HTTP layer read past the upgrade request (the first frames).
    pub fn new(stream: Box<dyn Stream>, leftover: BytesMut, max_frame_bytes: usize) -> Self {
        WsIo {
            stream,
            codec: Codec::new().max_size(max_frame_bytes),
            read: leftover,
            queue: VecDeque::new(),
            written: 0,
            queued: 0,
            counter: None,
            waker: None,
            read_done: false,
            broken: false,
            finished: None,
        }
    }

    /// Keep `finished` until the socket is closed.
    pub fn hold(&mut self, finished: Finished) {
        self.finished = Some(finished);
    }

    /// Bytes queued and not yet written to the socket.
    pub fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// Wake the owning actor's task, so its owner decides again whether to read (an
    /// answer it waited for came in on another of the actor's futures).
    pub fn wake(&self) {
        if let Some(waker) = &self.waker {
            waker.wake_by_ref();
        }
    }

    /// Count what is queued in `backlog` too, from now on (the connection's bound).
    pub fn count_into(&mut self, backlog: std::sync::Arc<Backlog>) {
        backlog.set_queued(self.queued);
        self.counter = Some(backlog);
    }

    fn set_queued(&mut self, bytes: usize) {
        self.queued = bytes;
        if let Some(counter) = &self.counter {
            counter.set_queued(bytes);
        }
    }

    /// Queue an already encoded frame (shared bytes, not copied) and write what the
    /// socket takes now.
    pub fn frame(&mut self, frame: Bytes) {
        if self.broken || frame.is_empty() {
            return;
        }
        self.set_queued(self.queued + frame.len());
        self.queue.push_back(frame);
        self.write_now();
    }

    pub fn text(&mut self, text: &str) {
        self.frame(encode_text(text));
    }

    pub fn binary(&mut self, data: &[u8]) {
        self.message(Message::Binary(Bytes::copy_from_slice(data)));
    }

    pub fn ping(&mut self, payload: &[u8]) {
        self.message(Message::Ping(Bytes::copy_from_slice(payload)));
    }

    pub fn pong(&mut self, payload: &[u8]) {
        self.message(Message::Pong(Bytes::copy_from_slice(payload)));
    }

    pub fn close(&mut self, reason: Option<CloseReason>) {
        self.message(Message::Close(reason));
    }

    fn message(&mut self, message: Message) {
        let mut out = BytesMut::new();
        if self.codec.encode(message, &mut out).is_ok() {
            self.frame(out.freeze());
        }
    }

    /// Drop every queued frame no byte of which is written yet (a slow consumer's backlog),
    /// so a Close queued next goes out as soon as the client reads at all.
    pub fn discard_unsent(&mut self) {
        let keep = usize::from(self.written > 0).min(self.queue.len());
        self.queue.truncate(keep);
        self.set_queued(self.queue.front().map_or(0, |f| f.len() - self.written));
    }

    fn write_now(&mut self) {
        if let Some(waker) = self.waker.clone() {
            let mut cx = TaskContext::from_waker(&waker);
            let _ = self.poll_write(&mut cx);
        }
    }

    /// Write queued frames until the queue is empty or the socket is full.
    fn poll_write(&mut self, cx: &mut TaskContext<'_>) -> Poll<()> {
        while !self.queue.is_empty() && !self.broken {
            let mut slices = [IoSlice::new(&[]); SLICES_PER_WRITE];
            let mut count = 0;
            for (i, frame) in self.queue.iter().take(SLICES_PER_WRITE).enumerate() {
                slices[i] = IoSlice::new(if i == 0 { &frame[self.written..] } else { frame });
                count += 1;
            }
            match Pin::new(&mut *self.stream).poll_write_vectored(cx, &slices[..count]) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => self.break_writing(),
                Poll::Ready(Ok(n)) => self.advance(n),
            }
        }
        if self.queue.capacity() > 64 && self.queue.is_empty() {
            self.queue = VecDeque::new();
        }
        // TLS keeps records in its own buffer until flushed; plain TCP flushes at once.
        match Pin::new(&mut *self.stream).poll_flush(cx) {
            Poll::Ready(Err(_)) => self.break_writing(),
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(())) => {}
        }
        Poll::Ready(())
    }

    fn advance(&mut self, mut n: usize) {
        self.set_queued(self.queued - n);
        while n > 0 {
            let Some(front) = self.queue.front() else { break };
            let left = front.len() - self.written;
            if n < left {
                self.written += n;
                return;
            }
            n -= left;
            self.written = 0;
            self.queue.pop_front();
        }
    }

    fn break_writing(&mut self) {
        self.broken = true;
        self.queue.clear();
        self.set_queued(0);
        self.written = 0;
    }

    /// The next whole frame as a message, `Ready(None)` once the stream has ended.
    fn poll_read(&mut self, cx: &mut TaskContext<'_>) -> Poll<Option<Result<ws::Message, ReadError>>> {
        loop {
            if self.read_done {
                return Poll::Ready(None);
            }
            match self.codec.decode(&mut self.read) {
                Ok(Some(frame)) => {
                    if self.read.is_empty() {
                        // Give the buffer back between frames: idle connections hold none.
                        self.read = BytesMut::new();
                    }
                    return Poll::Ready(Some(message(frame)));
                }
                Ok(None) => {}
                Err(error) => {
                    self.read_done = true;
                    return Poll::Ready(Some(Err(error.into())));
                }
            }
            let filled = SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                let mut buf = ReadBuf::new(&mut scratch[..]);
                match Pin::new(&mut *self.stream).poll_read(cx, &mut buf) {
                    Poll::Ready(Ok(())) => {
                        self.read.extend_from_slice(buf.filled());
                        Poll::Ready(Ok(buf.filled().len()))
                    }
                    Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
                    Poll::Pending => Poll::Pending,
                }
            });
            match filled {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    self.read_done = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(error)) => {
                    self.read_done = true;
                    return Poll::Ready(Some(Err(error.into())));
                }
            }
        }
    }

    /// When the actor stops: write what is still queued (a Close frame), bounded by
    /// `within`, end the stream (FIN, or TLS close_notify) and close the socket. This
    /// `WsIo` is left with no socket.
    pub fn finish(&mut self, within: Duration) {
        let mut io = std::mem::replace(self, WsIo::new(Box::new(Gone), BytesMut::new(), 0));
        io.waker = None;
        // The connection is gone: what its socket still writes is no room's concern.
        if let Some(counter) = io.counter.take() {
            counter.set_queued(0);
        }
        let done = async move {
            let _ = std::future::poll_fn(|cx| io.poll_write(cx)).await;
            let _ = std::future::poll_fn(|cx| Pin::new(&mut *io.stream).poll_shutdown(cx)).await;
        };
        actix::spawn(async move {
            let _ = tokio::time::timeout(within, done).await;
        });
    }
}

/// The stream of a finished [`WsIo`]: reads end, writes fail.
struct Gone;

impl AsyncRead for Gone {
    fn poll_read(self: Pin<&mut Self>, _: &mut TaskContext<'_>, _: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Gone {
    fn poll_write(self: Pin<&mut Self>, _: &mut TaskContext<'_>, _: &[u8]) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Err(std::io::ErrorKind::NotConnected.into()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn message(frame: Frame) -> Result<ws::Message, ReadError> {
    Ok(match frame {
        Frame::Text(data) => {
            ws::Message::Text(bytestring::ByteString::try_from(data).map_err(|_| ReadError::InvalidUtf8)?)
        }
        Frame::Binary(data) => ws::Message::Binary(data),
        Frame::Continuation(item) => ws::Message::Continuation(item),
        Frame::Ping(payload) => ws::Message::Ping(payload),
        Frame::Pong(payload) => ws::Message::Pong(payload),
        Frame::Close(reason) => ws::Message::Close(reason),
    })
}

/// An actor that owns a [`WsIo`] and takes the messages read from it.
pub trait WsActor: Actor<Context = Context<Self>> {
    /// The socket; `None` for an actor on another transport (nothing to drive).
    fn io(&mut self) -> Option<&mut WsIo>;

    /// Whether the next frame may be read now (checked before each one). `false` leaves
    /// the socket unread until the actor's task is woken again: by the socket taking
    /// what is queued, a message, a timer or a future of the actor ending.
    fn may_read(&mut self, _ctx: &mut Context<Self>) -> bool {
        true
    }

    /// One whole frame, or the error that ended reading.
    fn on_read(&mut self, item: Result<ws::Message, ReadError>, ctx: &mut Context<Self>);

    /// The client's side of the stream ended.
    fn on_end(&mut self, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// Drive `A`'s socket from inside its context: call once, in `started`.
pub fn drive<A: WsActor>(ctx: &mut Context<A>) {
    ctx.spawn(Pump);
}

/// The actor's I/O, polled with its mailbox and timers on the actor's own task.
struct Pump;

impl<A: WsActor> ActorFuture<A> for Pump {
    type Output = ();

    fn poll(self: Pin<&mut Self>, act: &mut A, ctx: &mut Context<A>, task: &mut TaskContext<'_>) -> Poll<()> {
        let Some(io) = act.io() else { return Poll::Ready(()) };
        if !io.waker.as_ref().is_some_and(|w| w.will_wake(task.waker())) {
            io.waker = Some(task.waker().clone());
        }
        let _ = io.poll_write(task);
        for _ in 0..FRAMES_PER_TURN {
            if ctx.state().stopping() {
                return Poll::Ready(());
            }
            if !act.may_read(ctx) {
                return Poll::Pending;
            }
            let Some(io) = act.io() else { return Poll::Ready(()) };
            match io.poll_read(task) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(item)) => act.on_read(item, ctx),
                Poll::Ready(None) => {
                    act.on_end(ctx);
                    return Poll::Ready(());
                }
            }
        }
        task.waker().wake_by_ref();
        Poll::Pending
    }
}

/// What the HTTP layer hands the upgrade: given the connection's [`WsIo`], start its
/// actor. Put into a 101 response's extensions by a handler that accepted the upgrade.
pub struct Accepted {
    /// Largest frame the client may send.
    pub max_frame_bytes: usize,
    start: Box<dyn FnOnce(WsIo)>,
}

/// Dropped when the connection's actor is gone: the HTTP layer holds the connection's
/// place among the server's connections (so a graceful stop waits for it) until then.
pub struct Finished(Option<tokio::sync::oneshot::Sender<()>>);

impl Finished {
    pub fn new() -> (Finished, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Finished(Some(tx)), rx)
    }
}

impl Drop for Finished {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

impl Accepted {
    pub fn new(max_frame_bytes: usize, start: impl FnOnce(WsIo) + 'static) -> Self {
        Accepted { max_frame_bytes, start: Box::new(start) }
    }

    pub fn start(self, io: WsIo) {
        (self.start)(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frames_payload_is_its_text() {
        for len in [0, 1, 125, 126, 127, 65_535, 65_536, 300_000] {
            let text = "x".repeat(len);
            assert_eq!(payload_of(&encode_text(&text)), text.as_bytes(), "payload of {len} bytes");
        }
    }
}
