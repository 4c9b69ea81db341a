//! A connection's subscriptions as a machine: which rooms it follows, in which generation,
//! whether the room has answered, what it has sent of each, and what to write when a
//! room's answer or window arrives. The connection actor drives it: it asks a room for a
//! subscribe after [`Subscriptions::begin`], hands the room's answer to
//! [`Subscriptions::on_subscribed`] and each window to [`Subscriptions::on_window`], and
//! writes what they return. Nothing here reads a clock or touches a socket; `R` is
//! whatever handle the driver keeps for a room (the actor's address; `()` in tests).
//!
//! What holds, whatever the order of answers, windows and resubscribes (checked by the
//! simulation in `core::delivery::sim`):
//! - a subscription writes nothing before its room answered, and nothing of a window it
//!   has already sent (also across a resubscribe with an older `since`);
//! - a window's events at or below the head the room answered with are dropped (the room
//!   sent them before the subscribe and the answer's replay carries them);
//! - an answer or a refusal of an older generation of the room's subscription is ignored;
//! - once [`Subscriptions::close`] is called, nothing more is written.

use std::sync::Arc;

use self::table::Table;
use super::sent::SentRange;

mod table;

/// What the machine needs of an event a room delivers.
pub trait Addressed {
    fn seq(&self) -> u64;
    /// Whether the connection of `device` gets it (an inbox message may name devices).
    fn is_for(&self, device: &str) -> bool;
}

impl<T: Addressed> Addressed for Arc<T> {
    fn seq(&self) -> u64 {
        (**self).seq()
    }
    fn is_for(&self, device: &str) -> bool {
        (**self).is_for(device)
    }
}

/// One room's subscription on the connection.
#[derive(Debug)]
pub struct Subscription<R> {
    pub generation: u64,
    /// The room's handle, once the room acknowledged the subscribe.
    pub room: Option<R>,
    /// Live once the room's answer arrived; windows before it are dropped.
    live: bool,
    /// The room's epoch, once known.
    epoch: Option<Arc<str>>,
    /// What this connection has sent of the room.
    sent: SentRange,
    /// The `since` of the pending subscribe.
    since: Option<u64>,
    /// The room's head when the subscribe was answered.
    floor: u64,
    /// The automatic inbox subscription: announced at connect without epoch or head, so
    /// the room's answer is not written.
    automatic: bool,
}

impl<R> Subscription<R> {
    /// Of `events`, those after `floor` that this connection has not sent and that are
    /// for `device`.
    fn unsent<E: Addressed + Clone>(&self, events: &[E], floor: u64, device: &str) -> Vec<E> {
        events
            .iter()
            .filter(|e| e.seq() > floor && !self.sent.contains(e.seq()) && e.is_for(device))
            .cloned()
            .collect()
    }
}

/// A subscribe over the connection's `max_subscriptions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("at most {max} subscriptions per connection")]
pub struct TooManySubscriptions {
    pub max: usize,
}

/// A room's answer to a subscribe, as the connection got it.
#[derive(Debug)]
pub struct Answer<'a, E> {
    pub room: &'a str,
    pub generation: u64,
    pub epoch: &'a Arc<str>,
    pub head: u64,
    /// `Some` when the subscribe named a `since`: whether every event after it is replayed.
    pub recovered: Option<bool>,
    /// `Some` when the answer carries the room's state: the state's seq (0: no state yet).
    pub state_seq: Option<u64>,
    /// Events up to `head` (after `since`, or after the state's seq), ascending.
    pub replay: &'a [E],
}

/// What to write for a room's answer.
#[derive(Debug, PartialEq)]
pub struct Answered<E> {
    /// Write the `subscribed` frame (not for the automatic inbox, announced at connect).
    pub announce: bool,
    /// The replay's events this connection has not sent and are for its device.
    pub fresh: Vec<E>,
}

/// What to write for a room's window.
#[derive(Debug, PartialEq)]
pub enum WindowPlan<E> {
    /// Nothing: not subscribed, not answered yet, closed, or all of it was sent before.
    Nothing,
    /// The window's shared frame as it is.
    Shared,
    /// A frame of the connection's own with these events.
    Own(Vec<E>),
}

/// Every subscription of one connection.
#[derive(Debug)]
pub struct Subscriptions<R> {
    by_room: Table<Subscription<R>>,
    next_generation: u64,
    /// The user's inbox: subscribed automatically, not counted against `max`.
    inbox: Arc<str>,
    max: usize,
    device: Arc<str>,
    closed: bool,
}

impl<R> Subscriptions<R> {
    pub fn new(inbox: Arc<str>, device: Arc<str>, max: usize) -> Self {
        Subscriptions {
            by_room: Table::default(),
            next_generation: 0,
            inbox,
            max,
            device,
            closed: false,
        }
    }

    pub fn inbox(&self) -> &Arc<str> {
        &self.inbox
    }

    pub fn len(&self) -> usize {
        self.by_room.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_room.is_empty()
    }

    /// Whether a subscribe to `room` fits: a resubscribe and the inbox always do.
    pub fn admits(&self, room: &str) -> Result<(), TooManySubscriptions> {
        if self.by_room.contains_key(room) || *room == *self.inbox {
            return Ok(());
        }
        let counted = self.by_room.keys().filter(|r| **r != self.inbox).count();
        match counted < self.max {
            true => Ok(()),
            false => Err(TooManySubscriptions { max: self.max }),
        }
    }

    /// Start a (re)subscribe to `room` from `since`: a new generation, waiting for the
    /// room's answer. A resubscribe keeps what was sent, so nothing goes out twice; the
    /// subscription it replaces is returned for the driver to leave.
    pub fn begin(&mut self, room: Arc<str>, since: Option<u64>) -> (u64, Option<Subscription<R>>) {
        let old = self.by_room.remove(&room);
        let (epoch, sent) =
            old.as_ref().map_or((None, SentRange::default()), |old| (old.epoch.clone(), old.sent));
        let generation = self.next_generation();
        let pending = Subscription {
            generation,
            room: None,
            live: false,
            epoch,
            sent,
            since,
            floor: 0,
            automatic: false,
        };
        self.by_room.insert(room, pending);
        (generation, old)
    }

    /// The automatic inbox subscription, live at once (announced at connect; the inbox's
    /// first window tells its epoch).
    pub fn begin_inbox(&mut self) -> u64 {
        let generation = self.next_generation();
        let sub = Subscription {
            generation,
            room: None,
            live: true,
            epoch: None,
            sent: SentRange::default(),
            since: None,
            floor: 0,
            automatic: true,
        };
        self.by_room.insert(self.inbox.clone(), sub);
        generation
    }

    fn next_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// The room acknowledged generation `generation` of the subscription with its handle;
    /// `Err(handle)` when that generation is gone (the driver unsubscribes it there).
    pub fn attach(&mut self, room: &str, generation: u64, handle: R) -> Result<(), R> {
        match self.current(room, generation) {
            Some(sub) => {
                sub.room = Some(handle);
                Ok(())
            }
            None => Err(handle),
        }
    }

    /// Whether generation `generation` is the room's current subscription.
    fn is_current(&self, room: &str, generation: u64) -> bool {
        self.by_room.get(room).is_some_and(|s| s.generation == generation)
    }

    fn current(&mut self, room: &str, generation: u64) -> Option<&mut Subscription<R>> {
        self.by_room.get_mut(room).filter(|s| s.generation == generation)
    }

    /// Whether the room's subscription is answered (its windows are written).
    pub fn is_live(&self, room: &str) -> bool {
        self.by_room.get(room).is_some_and(|s| s.live)
    }

    /// End the room's subscription; the driver leaves it at the room.
    pub fn end(&mut self, room: &str) -> Option<Subscription<R>> {
        self.by_room.remove(room)
    }

    /// End every subscription (the connection stopped).
    pub fn drain(&mut self) -> impl Iterator<Item = (Arc<str>, Subscription<R>)> + '_ {
        self.by_room.drain()
    }

    /// Subscribes the rooms have not answered yet.
    pub fn unanswered(&self) -> usize {
        self.by_room.values().filter(|s| !s.live).count()
    }

    /// Nothing more is written: the connection's Close went out (or came in).
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// The room answered a subscribe: the subscription goes live at `head`; the frames to
    /// write are returned. `None`: the answer is for an older generation, or the
    /// connection is closed (nothing is written).
    pub fn on_subscribed<E: Addressed + Clone>(
        &mut self,
        answer: Answer<'_, E>,
    ) -> Option<Answered<E>> {
        if self.closed {
            return None;
        }
        let device = self.device.clone();
        let sub = self.current(answer.room, answer.generation)?;
        sub.live = true;
        sub.floor = answer.head;
        // A state starts the client's view of the room again: the events after it are
        // sent even if this connection sent them before; so does a new epoch.
        if sub.epoch.as_ref().is_some_and(|seen| seen != answer.epoch) || answer.state_seq.is_some()
        {
            sub.sent = SentRange::default();
        }
        sub.epoch = Some(answer.epoch.clone());
        let replayed_after = match answer.state_seq {
            Some(seq) => Some(seq),
            None if answer.recovered == Some(true) => sub.since,
            None => None,
        };
        let fresh = sub.unsent(answer.replay, 0, &device);
        sub.sent.on_subscribed(answer.head, replayed_after);
        Some(Answered { announce: !sub.automatic, fresh })
    }

    /// A room's window (`events` contiguous and ascending, `targeted` when some name
    /// devices): the shared frame when this connection sent none of it and nothing is
    /// filtered by device; otherwise a frame of its own with what is left.
    pub fn on_window<E: Addressed + Clone>(
        &mut self,
        room: &str,
        epoch: &Arc<str>,
        events: &[E],
        targeted: bool,
    ) -> WindowPlan<E> {
        let (Some(first), Some(last)) = (events.first().map(E::seq), events.last().map(E::seq))
        else {
            return WindowPlan::Nothing;
        };
        if self.closed {
            return WindowPlan::Nothing;
        }
        let device = self.device.clone();
        let Some(sub) = self.by_room.get_mut(room).filter(|s| s.live) else {
            return WindowPlan::Nothing;
        };
        if sub.epoch.is_none() {
            // An automatic inbox learns its epoch from its first window.
            sub.epoch = Some(epoch.clone());
        }
        if last <= sub.floor {
            return WindowPlan::Nothing;
        }
        if !targeted && first > sub.floor && !sub.sent.overlaps(first, last) {
            sub.sent.on_live_run(first, last);
            return WindowPlan::Shared;
        }
        let fresh = sub.unsent(events, sub.floor, &device);
        sub.sent.on_live_run(first.max(sub.floor + 1), last);
        match fresh.is_empty() {
            true => WindowPlan::Nothing,
            false => WindowPlan::Own(fresh),
        }
    }

    /// The room refused generation `generation` of the subscribe: it ends (the driver
    /// tells the client). `None` when that generation is not current.
    pub fn on_refused(&mut self, room: &str, generation: u64) -> Option<Subscription<R>> {
        match self.is_current(room, generation) {
            true => self.end(room),
            false => None,
        }
    }

    /// Where the connection stands: each room whose epoch it knows, at the last seq it
    /// sent there, sorted (an SSE `events` message's cursor).
    pub fn positions(&self) -> Vec<(&str, &str, u64)> {
        let mut positions: Vec<(&str, &str, u64)> = self
            .by_room
            .iter()
            .filter_map(|(room, sub)| Some((&**room, sub.epoch.as_deref()?, sub.sent.last())))
            .collect();
        positions.sort_unstable();
        positions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Ev {
        seq: u64,
        device: Option<&'static str>,
    }

    impl Addressed for Ev {
        fn seq(&self) -> u64 {
            self.seq
        }
        fn is_for(&self, device: &str) -> bool {
            self.device.is_none_or(|d| d == device)
        }
    }

    fn evs(seqs: std::ops::RangeInclusive<u64>) -> Vec<Ev> {
        seqs.map(|seq| Ev { seq, device: None }).collect()
    }

    fn subs() -> Subscriptions<()> {
        Subscriptions::new("inbox".into(), "phone".into(), 2)
    }

    fn answer<'a>(
        room: &'a str,
        generation: u64,
        epoch: &'a Arc<str>,
        head: u64,
        recovered: Option<bool>,
        replay: &'a [Ev],
    ) -> Answer<'a, Ev> {
        Answer { room, generation, epoch, head, recovered, state_seq: None, replay }
    }

    fn seqs(plan: WindowPlan<Ev>) -> Option<Vec<u64>> {
        match plan {
            WindowPlan::Nothing => Some(vec![]),
            WindowPlan::Shared => None,
            WindowPlan::Own(events) => Some(events.iter().map(|e| e.seq).collect()),
        }
    }

    #[test]
    fn windows_before_the_answer_and_at_or_below_its_head_are_dropped() {
        let epoch: Arc<str> = "e1".into();
        let mut subs = subs();
        let (generation, _) = subs.begin("a".into(), Some(2));
        assert_eq!(
            subs.on_window("a", &epoch, &evs(3..=4), false),
            WindowPlan::Nothing,
            "not answered yet"
        );
        let replay = evs(3..=5);
        let answered =
            subs.on_subscribed(answer("a", generation, &epoch, 5, Some(true), &replay)).unwrap();
        assert!(answered.announce);
        assert_eq!(answered.fresh, replay);
        // The room's open window still carried 4..=6: only 6 is new.
        assert_eq!(seqs(subs.on_window("a", &epoch, &evs(4..=6), false)), Some(vec![6]));
        assert_eq!(seqs(subs.on_window("a", &epoch, &evs(7..=8), false)), None, "the shared frame");
        assert_eq!(subs.positions(), vec![("a", "e1", 8)]);
    }

    #[test]
    fn a_stale_answer_or_refusal_is_ignored() {
        let epoch: Arc<str> = "e1".into();
        let mut subs = subs();
        let (old, _) = subs.begin("a".into(), None);
        let (new, replaced) = subs.begin("a".into(), None);
        assert_eq!(replaced.map(|s| s.generation), Some(old));
        assert!(subs.on_subscribed(answer("a", old, &epoch, 3, None, &[])).is_none());
        assert!(subs.on_refused("a", old).is_none());
        assert_eq!(subs.attach("a", old, ()), Err(()));
        assert!(subs.on_subscribed(answer("a", new, &epoch, 3, None, &[])).is_some());
        assert_eq!(subs.unanswered(), 0);
    }

    #[test]
    fn a_resubscribe_from_an_older_since_sends_nothing_twice() {
        let epoch: Arc<str> = "e1".into();
        let mut subs = subs();
        let (g1, _) = subs.begin("a".into(), Some(0));
        let replay = evs(1..=4);
        subs.on_subscribed(answer("a", g1, &epoch, 4, Some(true), &replay)).unwrap();
        assert_eq!(seqs(subs.on_window("a", &epoch, &evs(5..=5), false)), None);
        let (g2, _) = subs.begin("a".into(), Some(1));
        let replay = evs(2..=5);
        let answered = subs.on_subscribed(answer("a", g2, &epoch, 5, Some(true), &replay)).unwrap();
        assert!(answered.fresh.is_empty());
    }

    #[test]
    fn a_new_epoch_or_a_state_sends_again() {
        let (e1, e2): (Arc<str>, Arc<str>) = ("e1".into(), "e2".into());
        let mut subs = subs();
        let (g1, _) = subs.begin("a".into(), Some(0));
        subs.on_subscribed(answer("a", g1, &e1, 2, Some(true), &evs(1..=2))).unwrap();
        let (g2, _) = subs.begin("a".into(), Some(0));
        let replay = evs(1..=2);
        let fresh = subs.on_subscribed(answer("a", g2, &e2, 2, Some(true), &replay)).unwrap().fresh;
        assert_eq!(fresh, replay, "another epoch: another log");
        let (g3, _) = subs.begin("a".into(), None);
        let with_state =
            Answer { state_seq: Some(1), ..answer("a", g3, &e2, 2, None, &replay[1..]) };
        assert_eq!(subs.on_subscribed(with_state).unwrap().fresh, evs(2..=2));
    }

    #[test]
    fn targeted_events_reach_only_their_device() {
        let epoch: Arc<str> = "e1".into();
        let mut subs = subs();
        subs.begin_inbox();
        let window = vec![
            Ev { seq: 1, device: Some("laptop") },
            Ev { seq: 2, device: Some("phone") },
            Ev { seq: 3, device: None },
        ];
        assert_eq!(seqs(subs.on_window("inbox", &epoch, &window, true)), Some(vec![2, 3]));
        assert_eq!(subs.positions(), vec![("inbox", "e1", 3)]);
    }

    #[test]
    fn the_inbox_is_not_counted_and_a_closed_connection_writes_nothing() {
        let epoch: Arc<str> = "e1".into();
        let mut subs = subs();
        subs.begin_inbox();
        subs.begin("a".into(), None);
        let (g, _) = subs.begin("b".into(), None);
        assert_eq!(subs.admits("c"), Err(TooManySubscriptions { max: 2 }));
        assert_eq!(subs.admits("a"), Ok(()));
        subs.close();
        assert!(subs.on_subscribed(answer("b", g, &epoch, 1, None, &[])).is_none());
        assert_eq!(subs.on_window("inbox", &epoch, &evs(1..=1), false), WindowPlan::Nothing);
    }
}
