//! Per-connection backlog (shared by the rooms that send to a connection and the
//! connection itself, as atomics; no I/O): every byte the node holds for one connection, in one count
//! against `max_outbox_bytes` (`core::delivery::outbox`). Two parts: what rooms have sent that the
//! connection has not yet taken off its mailbox (reserved by the sender, released by the
//! connection), and what waits in its transport's queue (its socket's write queue or SSE
//! stream, kept up to date by `WsIo` and `SseIo`: replies, pongs, errors, the Close and
//! the windows already taken off the mailbox). A room refuses to send past the bound and
//! evicts the connection (4009); the connection stops reading over it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub struct Backlog {
    /// Reserved by rooms, not yet taken off the mailbox.
    bytes: AtomicUsize,
    /// Queued in the transport, not yet written (or taken by the SSE body).
    queued: AtomicUsize,
    max: usize,
    evicted: AtomicBool,
}

impl Backlog {
    pub fn new(max: usize) -> Self {
        Backlog {
            bytes: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            max,
            evicted: AtomicBool::new(false),
        }
    }

    /// A sender is about to send `bytes`. `false` when the connection is (now) over its
    /// bound, counting what waits in its transport: the sender must not send, and the
    /// first to see it evicts the connection.
    pub fn reserve(&self, bytes: usize) -> Reserve {
        if self.evicted.load(Ordering::Acquire) {
            return Reserve::Evicted;
        }
        let total = self.bytes.fetch_add(bytes, Ordering::AcqRel)
            + bytes
            + self.queued.load(Ordering::Acquire);
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
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| Some(b.saturating_sub(bytes)));
    }

    /// Bytes in the mailbox (reserved by rooms, not yet taken).
    pub fn outstanding(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// The transport's queue now holds `bytes` (set by `WsIo` / `SseIo` on every change).
    pub fn set_queued(&self, bytes: usize) {
        self.queued.store(bytes, Ordering::Release);
    }

    /// Every byte held for the connection: its mailbox and its transport's queue.
    pub fn held(&self) -> usize {
        self.outstanding() + self.queued.load(Ordering::Acquire)
    }

    pub fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Mark evicted (the connection found its own outbox over the bound).
    pub fn evict(&self) -> bool {
        !self.evicted.swap(true, Ordering::AcqRel)
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
        let backlog = Backlog::new(100);
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
    }

    #[test]
    fn what_waits_in_the_transport_counts_against_the_same_bound() {
        let backlog = Backlog::new(100);
        backlog.set_queued(70);
        assert_eq!(backlog.reserve(30), Reserve::Ok);
        assert_eq!(backlog.held(), 100);
        backlog.release(30);
        assert_eq!(backlog.reserve(31), Reserve::EvictNow, "70 queued + 31 is over 100");
        assert_eq!(backlog.held(), 70, "a refused reservation is not kept");
    }
}
