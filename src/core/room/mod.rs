//! A room's decisions about its subscribers, apart from where its events are kept: how a
//! subscribe is answered from the room's [`SeqLog`] ([`answer_subscribe`]), which
//! generation of a connection's subscription is current ([`Members`]), and the durable
//! events waiting for the batching window ([`Outgoing`]). The room actor drives these
//! with its log, its mailbox and its timers; `S` is what it keeps per subscriber (where to
//! send, the connection's backlog) and `T` an event as subscribers get it.
//!
//! What holds (checked with the connection's machine by the simulation in `core::sim`):
//! - an answer's replay is every durable event after the subscriber's `since`, up to the
//!   head it names, or the answer says `recovered:false` and replays nothing (but a
//!   requested state and the events after it);
//! - a subscriber gets the windows after the head its answer named, and only the
//!   generation that subscribed last gets them;
//! - an event made durable while nobody is subscribed is not queued: a later subscriber
//!   starts after it or finds it in its replay.

pub mod machine;

use std::collections::HashMap;
use std::time::Instant;

use super::batch::{BatchAction, BatchWindow};
use super::seqlog::{NotRecovered, Recovery, SeqLog};

pub use self::machine::{Action, Input, Limits, LogInput, Published, RoomMachine, StateAt, Subscribe, Timer, Wire};

/// What a subscriber asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// The last seq the client saw (`None`: live from now on).
    pub since: Option<u64>,
    /// The epoch that seq belongs to (`None`: the room's current one).
    pub epoch: Option<&'a str>,
    /// The room's state and the events after it.
    pub state: bool,
}

/// How a subscribe is answered.
#[derive(Debug, PartialEq)]
pub struct SubscribeAnswer<T> {
    /// The durable head: the subscriber's windows start after it.
    pub head: u64,
    /// `Some` when the ask named a `since`: whether the replay is every event after it.
    pub recovered: Option<bool>,
    /// Why a recovery was refused, for the log.
    pub refused: Option<NotRecovered>,
    /// Events to send before any window, ascending, up to `head`.
    pub replay: Vec<T>,
    /// The answer carries the room's state (with the events after its seq in `replay`).
    pub with_state: bool,
}

/// Answer a subscribe from `log`: a replay after `since` when the log can give all of it
/// (at most `max_events`), else `recovered:false`; with `state` asked, the state (at seq
/// `state_seq`, 0 for none) and the retained events after it, when there is no recovery.
pub fn answer_subscribe<T: Clone>(log: &SeqLog<T>, ask: Ask<'_>, state_seq: u64, max_events: u64) -> SubscribeAnswer<T> {
    let head = log.durable();
    let snapshot = || log.read(state_seq, usize::MAX).0.into_iter().map(|e| e.payload.clone()).collect();
    let answer = |recovered, refused, replay, with_state| SubscribeAnswer { head, recovered, refused, replay, with_state };
    match ask.since {
        None if ask.state => answer(None, None, snapshot(), true),
        None => answer(None, None, Vec::new(), false),
        Some(since) => match log.recover(since, ask.epoch, max_events) {
            Recovery::Replay(events) => answer(Some(true), None, events.into_iter().map(|e| e.payload.clone()).collect(), false),
            Recovery::NotRecovered(why) if ask.state => answer(Some(false), Some(why), snapshot(), true),
            Recovery::NotRecovered(why) => answer(Some(false), Some(why), Vec::new(), false),
        },
    }
}

/// Whether the subscriber saw events in the room's epoch that `log` has not taken yet.
/// A log other nodes append to (cluster mode) can be behind its own clients (a live copy
/// still in flight, a client moved from another node): such a room holds the subscribe
/// until its head reaches `since` (`core::holds`, at most `AHEAD_WAIT`), so the answer
/// neither refuses the recovery nor sends the client those events again. A log only this node writes is never behind an
/// acknowledged event: there the ask is a client's error, answered `recovered:false`.
pub fn seen_beyond_head<T>(log: &SeqLog<T>, ask: Ask<'_>) -> bool {
    ask.since.is_some_and(|since| since > log.durable()) && ask.epoch.is_none_or(|epoch| epoch == log.epoch())
}

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

    /// Events became durable at `now`: they wait for the window, which the first one
    /// opens (the driver arms the timer, or sends at once). With nobody subscribed they
    /// are not kept.
    pub fn on_durable(&mut self, fresh: Vec<T>, subscribed: bool, now: Instant) -> BatchAction {
        if fresh.is_empty() || !subscribed {
            return BatchAction::Wait;
        }
        self.pending.extend(fresh);
        self.window.on_event(now)
    }

    /// The window closes: what it gathered, to send now.
    pub fn close(&mut self) -> Vec<T> {
        self.window.on_sent();
        std::mem::take(&mut self.pending)
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::seqlog::Retention;

    fn log(events: u64, keep: usize) -> SeqLog<u64> {
        let mut log = SeqLog::restore("e".into(), 0, Vec::new(), Retention { max_events: keep, max_age_ms: u64::MAX });
        for n in 1..=events {
            log.append(format!("id{n}").into(), 0, |seq| seq);
            let _ = log.mark_durable(n).count();
        }
        log
    }

    fn ask(since: Option<u64>, state: bool) -> Ask<'static> {
        Ask { since, epoch: None, state }
    }

    #[test]
    fn a_client_ahead_of_the_head_in_the_rooms_epoch_is_seen_beyond_it() {
        let log = log(10, 5);
        let cases = [
            (Ask { since: Some(11), epoch: None, state: false }, true),
            (Ask { since: Some(11), epoch: Some("e"), state: true }, true),
            (Ask { since: Some(11), epoch: Some("other"), state: false }, false),
            (Ask { since: Some(10), epoch: Some("e"), state: false }, false),
            (Ask { since: Some(3), epoch: None, state: false }, false),
            (Ask { since: None, epoch: None, state: true }, false),
        ];
        for (ask, beyond) in cases {
            assert_eq!(seen_beyond_head(&log, ask), beyond, "{ask:?}");
        }
    }

    #[test]
    fn answers() {
        let log = log(10, 5);
        let cases: &[(Ask, u64, Option<bool>, &[u64], bool)] = &[
            // (ask, state seq, recovered, replay, with state)
            (ask(None, false), 0, None, &[], false),
            (ask(Some(7), false), 0, Some(true), &[8, 9, 10], false),
            (ask(Some(10), false), 0, Some(true), &[], false),
            // 5 is the last seq before what is retained (6..=10): still whole.
            (ask(Some(5), false), 0, Some(true), &[6, 7, 8, 9, 10], false),
            (ask(Some(4), false), 0, Some(false), &[], false),
            (ask(Some(11), false), 0, Some(false), &[], false),
            (ask(None, true), 8, None, &[9, 10], true),
            (ask(Some(2), true), 8, Some(false), &[9, 10], true),
            // A recovery that works needs no state.
            (ask(Some(9), true), 8, Some(true), &[10], false),
        ];
        for (n, (ask, state_seq, recovered, replay, with_state)) in cases.iter().enumerate() {
            let answer = answer_subscribe(&log, *ask, *state_seq, 100);
            assert_eq!(answer.head, 10, "case {n}");
            assert_eq!(answer.recovered, *recovered, "case {n}");
            assert_eq!(answer.replay, replay.to_vec(), "case {n}");
            assert_eq!(answer.with_state, *with_state, "case {n}");
        }
        let too_many = answer_subscribe(&log, ask(Some(6), false), 0, 3);
        assert_eq!((too_many.recovered, too_many.refused), (Some(false), Some(NotRecovered::TooManyMissing)));
        let other_epoch = answer_subscribe(&log, Ask { since: Some(9), epoch: Some("old"), state: false }, 0, 100);
        assert_eq!(other_epoch.refused, Some(NotRecovered::EpochChanged));
    }

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
        let mut out = Outgoing::new(std::time::Duration::from_millis(10));
        assert_eq!(out.on_durable(vec![1], false, now), BatchAction::Wait);
        assert!(out.is_empty());
        assert!(matches!(out.on_durable(vec![2], true, now), BatchAction::ArmTimer(_)));
        assert_eq!(out.on_durable(vec![3], true, now), BatchAction::Wait);
        assert_eq!(out.close(), vec![2, 3]);
        assert!(matches!(out.on_durable(vec![4], true, now), BatchAction::ArmTimer(_)));
    }
}
