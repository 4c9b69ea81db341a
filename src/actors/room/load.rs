//! A room's load as the admin overview reads it: its explicit subscribers on
//! this node and its durable head, written by the room's actor as they change and read by
//! the rooms table without a message, so the overview never waits on a room's mailbox
//! and never reads the store. In cluster mode also the room's last lag reading
//! (`core::nodes::lag`), read the same way by `/metrics` and the overview. Inbox rooms have none.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::nodes::lag::Reading;

#[derive(Debug, Default)]
pub struct RoomLoad {
    subscribers: AtomicU64,
    head: AtomicU64,
    lag_events: AtomicU64,
    lag_millis: AtomicU64,
    /// When the lag reading was made (0: never).
    lag_at_ms: AtomicU64,
}

impl RoomLoad {
    /// The room now has `subscribers` explicit subscribers here and its head at `head`.
    pub fn set(&self, subscribers: usize, head: u64) {
        self.subscribers.store(subscribers as u64, Ordering::Relaxed);
        self.head.store(head, Ordering::Relaxed);
    }

    /// (subscribers, head) as last reported.
    pub fn get(&self) -> (u64, u64) {
        (self.subscribers.load(Ordering::Relaxed), self.head.load(Ordering::Relaxed))
    }

    /// The room applied an event at `at_ms`, `reading` behind its stream.
    pub fn set_lag(&self, reading: Reading, at_ms: u64) {
        self.lag_events.store(reading.events, Ordering::Relaxed);
        self.lag_millis.store(reading.millis, Ordering::Relaxed);
        self.lag_at_ms.store(at_ms, Ordering::Relaxed);
    }

    /// The last lag reading and when it was made (0: never). The three are written one
    /// after the other: a reader may pair a reading with the next one's time, which is
    /// as fresh.
    pub fn lag(&self) -> (Reading, u64) {
        let reading = Reading {
            events: self.lag_events.load(Ordering::Relaxed),
            millis: self.lag_millis.load(Ordering::Relaxed),
        };
        (reading, self.lag_at_ms.load(Ordering::Relaxed))
    }
}
