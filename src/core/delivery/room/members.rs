//! Who the room sends to and what waits to be sent: each connection's current subscription
//! generation ([`Members`]) and the durable events waiting for the batching window ([`Outgoing`]).

use std::collections::HashMap;
use std::time::Instant;

use crate::core::delivery::batch::{BatchAction, BatchWindow, Closing};

/// One subscriber of the room.
#[derive(Debug)]
pub struct Member<S> {
    pub generation: u64,
    /// A connection's automatic inbox subscription (it does not make the room watched).
    pub automatic: bool,
    pub sink: S,
}

/// What [`Members::join`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Joined {
    /// The connection subscribes (again): answer it.
    Current,
    /// The connection already subscribed in a newer generation: this one is void and
    /// gets no answer (the connection sees its generation is stale).
    Stale,
}

/// The room's subscribers by connection; one current generation each.
#[derive(Debug)]
pub struct Members<S> {
    by_conn: HashMap<u64, Member<S>>,
}

impl<S> Default for Members<S> {
    fn default() -> Self {
        Members { by_conn: HashMap::new() }
    }
}

impl<S> Members<S> {
    /// Whether generation `generation` of `conn`'s subscription may be answered.
    pub fn admits(&self, conn: u64, generation: u64) -> Joined {
        match self.by_conn.get(&conn).is_some_and(|m| m.generation > generation) {
            true => Joined::Stale,
            false => Joined::Current,
        }
    }

    /// Add (or replace) `conn`'s subscription, once [`Members::admits`] said `Current`.
    pub fn join(&mut self, conn: u64, member: Member<S>) {
        self.by_conn.insert(conn, member);
    }

    /// `conn` left with generation `generation`: removed unless it subscribed again since.
    pub fn leave(&mut self, conn: u64, generation: u64) -> Option<Member<S>> {
        match self.by_conn.get(&conn).is_some_and(|m| m.generation <= generation) {
            true => self.by_conn.remove(&conn),
            false => None,
        }
    }

    pub fn get(&self, conn: u64) -> Option<&Member<S>> {
        self.by_conn.get(&conn)
    }

    pub fn len(&self) -> usize {
        self.by_conn.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_conn.is_empty()
    }

    /// No subscriber but automatic inbox subscriptions.
    pub fn unwatched(&self) -> bool {
        self.by_conn.values().all(|m| m.automatic)
    }

    /// Some subscriber is explicit (the room is occupied).
    pub fn occupied(&self) -> bool {
        !self.unwatched()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&u64, &Member<S>)> {
        self.by_conn.iter()
    }

    /// Keep the subscribers `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &mut Member<S>) -> bool) {
        self.by_conn.retain(|conn, member| keep(*conn, member));
    }

    pub fn drain(&mut self) -> impl Iterator<Item = (u64, Member<S>)> + '_ {
        self.by_conn.drain()
    }
}

/// Durable events not sent yet (contiguous seqs), and the batching window that sends them.
#[derive(Debug)]
pub struct Outgoing<T> {
    pending: Vec<T>,
    window: BatchWindow,
}

impl<T> Outgoing<T> {
    pub fn new(window: std::time::Duration) -> Self {
        Outgoing { pending: Vec::new(), window: BatchWindow::new(window) }
    }

    /// Events became durable at `now`: they leave at once when the window is closed, else
    /// wait for it to close. With nobody subscribed they are not
    /// kept.
    pub fn on_durable(&mut self, fresh: Vec<T>, subscribed: bool, now: Instant) -> BatchAction {
        if fresh.is_empty() || !subscribed {
            return BatchAction::Wait;
        }
        self.pending.extend(fresh);
        self.window.on_event(now)
    }

    /// The window's timer fired at `now`.
    pub fn on_timer(&mut self, now: Instant) -> Closing {
        self.window.on_timer(now, !self.pending.is_empty())
    }

    /// The frame sent last is written at `now`: the window opens until the instant
    /// returned.
    pub fn on_sent(&mut self, now: Instant) -> Option<Instant> {
        self.window.on_sent(now)
    }

    /// What waits, to send now.
    pub fn take(&mut self) -> Vec<T> {
        std::mem::take(&mut self.pending)
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn only_the_newest_generation_counts() {
        let mut members = Members::default();
        assert_eq!(members.admits(1, 2), Joined::Current);
        members.join(1, Member { generation: 2, automatic: false, sink: () });
        assert_eq!(members.admits(1, 1), Joined::Stale, "an overtaken subscribe");
        assert!(members.leave(1, 1).is_none(), "an old generation's unsubscribe");
        assert!(members.occupied());
        assert!(members.leave(1, 2).is_some());
        members.join(2, Member { generation: 1, automatic: true, sink: () });
        assert!(members.unwatched());
    }

    #[test]
    fn events_wait_for_the_window_only_with_subscribers() {
        let now = Instant::now();
        let window = std::time::Duration::from_millis(10);
        let mut out = Outgoing::new(window);
        assert_eq!(out.on_durable(vec![1], false, now), BatchAction::Wait);
        assert!(out.is_empty(), "nobody subscribed: not kept");
        assert_eq!(out.on_durable(vec![2], true, now), BatchAction::Send);
        assert_eq!(out.take(), vec![2], "the first leaves at once");
        assert_eq!(out.on_durable(vec![3], true, now), BatchAction::Wait);
        assert_eq!(out.on_sent(now), Some(now + window));
        assert_eq!(out.on_durable(vec![4], true, now), BatchAction::Wait);
        assert_eq!(out.on_timer(now + window), Closing::Send);
        assert_eq!(out.take(), vec![3, 4]);
        assert_eq!(out.on_sent(now + window), Some(now + 2 * window));
        assert_eq!(out.on_timer(now + 2 * window), Closing::Idle);
    }
}
