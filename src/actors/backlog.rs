//! Per-connection backlog: bytes rooms have sent to a connection that it has not yet
//! written into its socket, counted by the sender. actix-web-actors queues without bound
//! and stops running an actor whose socket is full, so the bound is kept here: a room
//! refuses to send past `max` and evicts the connection (4009); a connection that cannot
//! even take its Close frame is shut down at the TCP level through [`SocketAbort`].

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Weak;

/// A duplicate of a connection's socket, taken when it was accepted, to shut it down
/// from outside the (possibly frozen) connection actor. Dropped with the connection.
pub struct SocketAbort(pub OwnedFd);

impl SocketAbort {
    pub fn shutdown(&self) {
        let _ = socket2::SockRef::from(&self.0).shutdown(std::net::Shutdown::Both);
    }

    /// End the read side once a WebSocket is finished: actix-http then sees the end of the
    /// request, writes what it still holds (the Close frame) and closes the connection.
    /// Without this it keeps a finished WebSocket's TCP connection open for seconds.
    pub fn finish_reading(&self) {
        let _ = socket2::SockRef::from(&self.0).shutdown(std::net::Shutdown::Read);
    }
}

pub struct Backlog {
    bytes: AtomicUsize,
    max: usize,
    evicted: AtomicBool,
    socket: Option<Weak<SocketAbort>>,
}

impl Backlog {
    pub fn new(max: usize, socket: Option<Weak<SocketAbort>>) -> Self {
        Backlog { bytes: AtomicUsize::new(0), max, evicted: AtomicBool::new(false), socket }
    }

    /// A sender is about to send `bytes`. `false` when the connection is (now) over its
    /// bound: the sender must not send, and the first to see it evicts the connection.
    pub fn reserve(&self, bytes: usize) -> Reserve {
        if self.evicted.load(Ordering::Acquire) {
            return Reserve::Evicted;
        }
        let total = self.bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if total <= self.max {
            return Reserve::Ok;
        }
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        match self.evicted.swap(true, Ordering::AcqRel) {
            false => Reserve::EvictNow,
            true => Reserve::Evicted,
        }
    }

    /// The connection took `bytes` off its mailbox.
    pub fn release(&self, bytes: usize) {
        let _ = self.bytes.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| Some(b.saturating_sub(bytes)));
    }

    pub fn outstanding(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    pub fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Mark evicted (the connection found its own outbox over the bound).
    pub fn evict(&self) -> bool {
        !self.evicted.swap(true, Ordering::AcqRel)
    }

    /// End the socket's read side (see [`SocketAbort::finish_reading`]).
    pub fn finish_reading(&self) {
        if let Some(socket) = self.socket.as_ref().and_then(Weak::upgrade) {
            socket.finish_reading();
        }
    }

    /// Shut the socket down if the connection still exists.
    pub fn abort_socket(&self) {
        if let Some(socket) = self.socket.as_ref().and_then(Weak::upgrade) {
            tracing::info!("slow consumer did not close in time; socket shut down");
            socket.shutdown();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    Ok,
    /// Over the bound just now: this sender evicts the connection.
    EvictNow,
    /// Already evicted by someone else.
    Evicted,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_release_evict() {
        let backlog = Backlog::new(100, None);
        assert_eq!(backlog.reserve(60), Reserve::Ok);
        assert_eq!(backlog.reserve(30), Reserve::Ok);
        backlog.release(50);
        assert_eq!(backlog.outstanding(), 40);
        assert_eq!(backlog.reserve(60), Reserve::Ok);
        assert_eq!(backlog.reserve(1), Reserve::EvictNow);
        assert_eq!(backlog.reserve(1), Reserve::Evicted);
        assert!(backlog.is_evicted());
        assert!(!backlog.evict());
        backlog.release(1_000);
        assert_eq!(backlog.outstanding(), 0);
        backlog.abort_socket(); // no socket: nothing to do
    }
}
