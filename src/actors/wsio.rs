//! livegate's own WebSocket transport: the socket of one upgraded connection, driven from
//! inside the connection's actor. It replaces actix-web-actors, whose connection lived in
//! actix-http's HTTP/1 dispatcher with an 8 KiB read and an 8 KiB write buffer for its
//! whole life, and needed a second descriptor to shut a stuck socket down.
//!
//! - Reading goes through one scratch buffer per thread; a connection keeps only the bytes
//!   of a frame not complete yet, so an idle connection holds no read buffer.
//! - Writing is a queue of encoded frames written with vectored writes: a room window's
//!   frame is encoded once ([`encode_text`]) and every subscriber queues the same bytes.
//!   The queue and, on plain TCP, the descriptor sit behind one lock ([`Outgoing`]), so a
//!   room's thread writes a shared frame to an idle socket itself, with no wake-up.
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
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use actix::fut::ActorFuture;
use actix::prelude::*;
use actix_codec::{AsyncRead, AsyncWrite, Decoder, Encoder, ReadBuf};
use actix_http::ws::{self, CloseReason, Codec, Frame, Message, OpCode, Parser, ProtocolError};
use actix_web::web::{Bytes, BytesMut};
use parking_lot::Mutex;

use crate::core::delivery::backlog::Backlog;

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
    /// What is queued to write, shared with rooms that write windows straight to the
    /// socket ([`Outgoing::write_shared`]).
    out: Arc<Outgoing>,
    /// The read side ended (end of stream or an error was reported).
    read_done: bool,
    /// Dropped once the socket is closed.
    finished: Option<Finished>,
}

/// The write side of one WebSocket, behind one lock: its queue of encoded frames and,
/// on plain TCP, the socket's descriptor, so a room's thread can write a shared frame
/// itself when nothing is queued before it. Every write, the actor's and a room's, is
/// made holding the lock, so frames never interleave and leave in the order queued.
pub struct Outgoing {
    state: Mutex<OutQueue>,
}

struct OutQueue {
    /// Encoded frames not yet written; the first may be partly written.
    queue: VecDeque<Bytes>,
    /// Bytes of `queue[0]` already written.
    written: usize,
    queued: usize,
    /// Where `queued` is also counted: the connection's backlog (None: not bounded).
    counter: Option<Arc<Backlog>>,
    /// The owning actor's task, to write from outside the poll (a handler, a timer, a
    /// room that queued behind a full socket).
    waker: Option<Waker>,
    /// The socket's descriptor for writes from another thread: plain TCP only, and only
    /// while the socket is open ([`WsIo::finish`] and drop clear it first).
    fd: Option<RawFd>,
    /// Writing failed: everything queued is dropped from now on.
    broken: bool,
    /// The actor is gone: frames from rooms are dropped; what is queued is being
    /// written by the finishing task.
    sealed: bool,
}

/// What [`Outgoing::write_shared`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrote {
    /// All of it is on the socket.
    Written,
    /// Some or all of it waits in the queue; the actor was woken to write it.
    Queued,
    /// The socket is gone or broken: dropped.
    Dropped,
}

impl OutQueue {
    fn set_queued(&mut self, bytes: usize) {
        self.queued = bytes;
        if let Some(counter) = &self.counter {
            counter.set_queued(bytes);
        }
    }

    fn push(&mut self, frame: Bytes) {
        self.set_queued(self.queued + frame.len());
        self.queue.push_back(frame);
    }

    fn wake(&self) {
        if let Some(waker) = &self.waker {
            waker.wake_by_ref();
        }
    }

    /// Write queued frames through `stream` until the queue is empty or the socket is full.
    fn poll_write(&mut self, stream: &mut dyn Stream, cx: &mut TaskContext<'_>) -> Poll<()> {
        let mut stream = Pin::new(stream);
        while !self.queue.is_empty() && !self.broken {
            let mut slices = [IoSlice::new(&[]); SLICES_PER_WRITE];
            let mut count = 0;
            for (i, frame) in self.queue.iter().take(SLICES_PER_WRITE).enumerate() {
                slices[i] = IoSlice::new(if i == 0 { &frame[self.written..] } else { frame });
                count += 1;
            }
            match stream.as_mut().poll_write_vectored(cx, &slices[..count]) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => self.break_writing(),
                Poll::Ready(Ok(n)) => self.advance(n),
            }
        }
        if self.queue.is_empty() && self.queue.capacity() > 0 {
            // Drained: give the buffer back, so an idle connection holds none.
            self.queue = VecDeque::new();
        }
        // TLS keeps records in its own buffer until flushed; plain TCP flushes at once.
        match stream.as_mut().poll_flush(cx) {
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
        self.queue = VecDeque::new();
        self.set_queued(0);
        self.written = 0;
    }
}

impl Outgoing {
    fn new(fd: Option<RawFd>) -> Arc<Self> {
        Arc::new(Outgoing {
            state: Mutex::new(OutQueue {
                queue: VecDeque::new(),
                written: 0,
                queued: 0,
                counter: None,
                waker: None,
                fd,
                broken: false,
                sealed: false,
            }),
        })
    }

    /// Whether frames can be written from another thread (plain TCP, still open).
    pub fn direct(&self) -> bool {
        self.state.lock().fd.is_some()
    }

    /// A frame encoded once and shared (a room's window), from any thread. With nothing
    /// queued before it, it is written to the socket now, without a wake-up; whatever the
    /// socket does not take waits in the queue, and the actor is woken to write it.
    /// Callers that decide whether to write (the connection's subscription machine) hold
    /// their own lock across this call, so the decision and the write are one step.
    pub fn write_shared(&self, frame: &Bytes) -> Wrote {
        let mut out = self.state.lock();
        if out.broken || out.sealed || frame.is_empty() {
            return Wrote::Dropped;
        }
        let fd = match out.fd {
            Some(fd) if out.queue.is_empty() => fd,
            _ => {
                out.push(frame.clone());
                out.wake();
                return Wrote::Queued;
            }
        };
        let sent = send_now(fd, frame);
        if sent == frame.len() {
            return Wrote::Written;
        }
        // Partly written, full (EAGAIN), or an error the actor's own write will meet.
        out.push(frame.slice(sent..));
        out.wake();
        Wrote::Queued
    }
}

/// One non-blocking send of `bytes` on `fd`: how many bytes the socket took (0 when it
/// took none or failed; the caller queues the rest and the owner's write sees any error).
fn send_now(fd: RawFd, bytes: &[u8]) -> usize {
    // SAFETY: `fd` is an open socket: it is only read under the `Outgoing` lock, and the
    // socket's owner clears it under that lock before the socket can be closed. The
    // buffer is a live slice. MSG_NOSIGNAL: a reset peer gives EPIPE, not SIGPIPE.
    let sent = unsafe {
        libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
    usize::try_from(sent).unwrap_or(0)
}

impl WsIo {
    /// `leftover`: bytes the HTTP layer read past the upgrade request (the first frames).
    /// `fd`: the socket's descriptor when it is plain TCP (rooms may then write to it
    /// from their threads); `None` for TLS.
    pub fn new(
        stream: Box<dyn Stream>,
        leftover: BytesMut,
        max_frame_bytes: usize,
        fd: Option<RawFd>,
    ) -> Self {
        WsIo {
            stream,
            codec: Codec::new().max_size(max_frame_bytes),
            read: leftover,
            out: Outgoing::new(fd),
            read_done: false,
            finished: None,
        }
    }

    /// Keep `finished` until the socket is closed.
    pub fn hold(&mut self, finished: Finished) {
        self.finished = Some(finished);
    }

    /// The write side, for rooms to write shared frames to (see [`Outgoing`]).
    pub fn outgoing(&self) -> Arc<Outgoing> {
        self.out.clone()
    }

    /// Bytes queued and not yet written to the socket.
    pub fn queued_bytes(&self) -> usize {
        self.out.state.lock().queued
    }

    /// Wake the owning actor's task, so its owner decides again whether to read (an
    /// answer it waited for came in on another of the actor's futures).
    pub fn wake(&self) {
        self.out.state.lock().wake();
    }

    /// Count what is queued in `backlog` too, from now on (the connection's bound).
    pub fn count_into(&mut self, backlog: Arc<Backlog>) {
        let mut out = self.out.state.lock();
        backlog.set_queued(out.queued);
        out.counter = Some(backlog);
    }

    /// Queue an already encoded frame (shared bytes, not copied) and write what the
    /// socket takes now.
    pub fn frame(&mut self, frame: Bytes) {
        let mut out = self.out.state.lock();
        if out.broken || frame.is_empty() {
            return;
        }
        out.push(frame);
        if let Some(waker) = out.waker.clone() {
            let _ = out.poll_write(&mut *self.stream, &mut TaskContext::from_waker(&waker));
        }
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
        let mut out = self.out.state.lock();
        let keep = usize::from(out.written > 0).min(out.queue.len());
        out.queue.truncate(keep);
        let left = out.queue.front().map_or(0, |f| f.len() - out.written);
        out.set_queued(left);
    }

    /// The next whole frame as a message, `Ready(None)` once the stream has ended.
    fn poll_read(
        &mut self,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<ws::Message, ReadError>>> {
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

    /// Stop other threads writing: the descriptor is forgotten and rooms' frames are
    /// dropped from now on (before the socket can be closed).
    fn seal(&self) {
        let mut out = self.out.state.lock();
        out.fd = None;
        out.sealed = true;
        out.waker = None;
    }

    /// When the actor stops: write what is still queued (a Close frame), bounded by
    /// `within`, end the stream (FIN, or TLS close_notify) and close the socket. This
    /// `WsIo` is left with no socket.
    pub fn finish(&mut self, within: Duration) {
        self.seal();
        let mut io = std::mem::replace(self, WsIo::new(Box::new(Gone), BytesMut::new(), 0, None));
        // The connection is gone: what its socket still writes is no room's concern.
        if let Some(counter) = io.out.state.lock().counter.take() {
            counter.set_queued(0);
        }
        let done = async move {
            let _ = std::future::poll_fn(|cx| {
                let out = io.out.clone();
                let mut out = out.state.lock();
                out.poll_write(&mut *io.stream, cx)
            })
            .await;
            let _ = std::future::poll_fn(|cx| Pin::new(&mut *io.stream).poll_shutdown(cx)).await;
        };
        actix::spawn(async move {
            let _ = tokio::time::timeout(within, done).await;
        });
    }
}

impl Drop for WsIo {
    fn drop(&mut self) {
        self.seal();
    }
}

/// The stream of a finished [`WsIo`]: reads end, writes fail.
struct Gone;

impl AsyncRead for Gone {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut TaskContext<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Gone {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut TaskContext<'_>,
        _: &[u8],
    ) -> Poll<std::io::Result<usize>> {
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
        Frame::Text(data) => ws::Message::Text(
            bytestring::ByteString::try_from(data).map_err(|_| ReadError::InvalidUtf8)?,
        ),
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

    fn poll(
        self: Pin<&mut Self>,
        act: &mut A,
        ctx: &mut Context<A>,
        task: &mut TaskContext<'_>,
    ) -> Poll<()> {
        let Some(io) = act.io() else { return Poll::Ready(()) };
        {
            let mut out = io.out.state.lock();
            if !out.waker.as_ref().is_some_and(|w| w.will_wake(task.waker())) {
                out.waker = Some(task.waker().clone());
            }
            let _ = out.poll_write(&mut *io.stream, task);
        }
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

    /// A connected pair on loopback: the server's end as a `WsIo` that rooms may write
    /// to directly, and the client's end, blocking, with a small receive buffer.
    async fn pair() -> (WsIo, std::net::TcpStream) {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        socket2::SockRef::from(&server).set_send_buffer_size(4096).unwrap();
        socket2::SockRef::from(&client).set_recv_buffer_size(4096).unwrap();
        let server = tokio::net::TcpStream::from_std(server).unwrap();
        let fd = server.as_raw_fd();
        (WsIo::new(Box::new(server), BytesMut::new(), 1 << 20, Some(fd)), client)
    }

    fn read_exactly(client: &mut std::net::TcpStream, n: usize) -> Vec<u8> {
        use std::io::Read;
        let mut got = vec![0; n];
        client.read_exact(&mut got).unwrap();
        got
    }

    #[tokio::test]
    async fn a_shared_frame_goes_straight_out_when_nothing_is_queued() {
        let (io, mut client) = pair().await;
        let out = io.outgoing();
        assert!(out.direct());
        let frame = encode_text("hello");
        assert_eq!(out.write_shared(&frame), Wrote::Written);
        assert_eq!(io.queued_bytes(), 0);
        assert_eq!(read_exactly(&mut client, frame.len()), frame.to_vec());
    }

    #[tokio::test]
    async fn behind_a_full_socket_frames_queue_and_leave_whole_and_in_order() {
        let (mut io, mut client) = pair().await;
        let out = io.outgoing();
        let frames: Vec<Bytes> =
            (0..400).map(|i| encode_text(&format!("{i:04}{}", "x".repeat(1_000)))).collect();
        let mut outcomes = Vec::new();
        for (i, frame) in frames.iter().enumerate() {
            // The actor's own frames share the queue with the rooms' (a reply between windows).
            if i == 200 {
                io.text("reply");
            }
            outcomes.push(out.write_shared(frame));
        }
        assert_eq!(outcomes[0], Wrote::Written);
        assert_eq!(outcomes.last(), Some(&Wrote::Queued), "the socket filled up: {outcomes:?}");
        assert!(io.queued_bytes() > 0);
        let expected: Vec<u8> = frames[..200]
            .iter()
            .chain(std::iter::once(&encode_text("reply")))
            .chain(&frames[200..])
            .flat_map(|f| f.to_vec())
            .collect();
        let reader =
            std::thread::spawn(move || read_exactly(&mut client, expected.len()) == expected);
        std::future::poll_fn(|cx| {
            let out = io.out.clone();
            let mut out = out.state.lock();
            out.poll_write(&mut *io.stream, cx)
        })
        .await;
        assert_eq!(io.queued_bytes(), 0);
        assert_eq!(io.out.state.lock().queue.capacity(), 0, "a drained queue holds no buffer");
        assert!(reader.join().unwrap(), "every byte arrives once, in the order queued");
    }

    #[tokio::test]
    async fn an_idle_connection_holds_no_read_or_write_buffer_once_a_burst_is_written() {
        let (mut io, mut client) = pair().await;
        // The actor's own frames (replies) go through the queue; here the socket takes them.
        for i in 0..10 {
            io.text(&format!("reply {i}"));
        }
        std::future::poll_fn(|cx| {
            let out = io.out.clone();
            let mut out = out.state.lock();
            out.poll_write(&mut *io.stream, cx)
        })
        .await;
        let sent: usize = (0..10).map(|i| encode_text(&format!("reply {i}")).len()).sum();
        read_exactly(&mut client, sent);
        assert_eq!(io.queued_bytes(), 0);
        assert_eq!(io.out.state.lock().queue.capacity(), 0, "the write queue's buffer is freed");
        assert_eq!(io.read.capacity(), 0, "no read buffer between frames");
    }

    #[tokio::test]
    async fn once_the_socket_is_finished_rooms_write_nothing() {
        let (mut io, _client) = pair().await;
        let out = io.outgoing();
        // The finishing write runs on the actor's thread's local task set.
        tokio::task::LocalSet::new()
            .run_until(async { io.finish(Duration::from_millis(100)) })
            .await;
        assert!(!out.direct(), "the descriptor is forgotten before the socket can close");
        assert_eq!(out.write_shared(&encode_text("late")), Wrote::Dropped);
    }

    #[test]
    fn a_frames_payload_is_its_text() {
        for len in [0, 1, 125, 126, 127, 65_535, 65_536, 300_000] {
            let text = "x".repeat(len);
            assert_eq!(payload_of(&encode_text(&text)), text.as_bytes(), "payload of {len} bytes");
        }
    }
}
