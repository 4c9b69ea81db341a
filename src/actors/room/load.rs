//! A room's load as the admin overview reads it (DESIGN §10): its explicit subscribers on
//! this node and its durable head, written by the room's actor as they change and read by
//! the rooms table without a message, so the overview never waits on a room's mailbox
//! and never reads the store. Inbox rooms have none.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct RoomLoad {
    subscribers: AtomicU64,
    head: AtomicU64,
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
}
