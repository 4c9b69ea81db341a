//! Per-connection backlog: bytes rooms have sent to a connection that it has not yet
//! taken off its mailbox, counted by the sender. A room refuses to send past `max` and
//! evicts the connection (4009); the connection bounds what waits in its socket itself
//! (`wsio::WsIo::queued_bytes`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub struct Backlog {
    bytes: AtomicUsize,
    max: usize,
    evicted: AtomicBool,
}

impl Backlog {
    pub fn new(max: usize) -> Self {
        Backlog { bytes: AtomicUsize::new(0), max, evicted: AtomicBool::new(false) }
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
}
