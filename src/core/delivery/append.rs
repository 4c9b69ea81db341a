//! A room's log in cluster mode, as decisions: the room's publishes and `PUT`s queue here,
//! one append or state write goes to the stream at a time (with the stream's
//! expected-sequence guard), other nodes' events come in from the live feed and from
//! catch-up reads, and the machine says what the driver (`actors/room/stream.rs`) must do
//! next. The driver feeds it each result and carries out what [`Pipeline::poll`] returns,
//! one [`Action`] at a time, against the room's [`SeqLog`] as it is then. `P` is a queued
//! publish, `S` a queued `PUT`, `E` an event as the stream stored it and `X` why the
//! stream failed; nothing here does I/O or reads a clock (randomness for the backoff is a
//! parameter).
//!
//! What holds (checked by the tests below against a simulated stream):
//! - at most one append or state write is in flight, and none starts while a catch-up
//!   read runs; `PUT`s are written between appends, each as of the head then;
//! - every queued publish gets exactly one answer; an answer `Stored` names the seq the
//!   stream stored its id under; a failed catch-up fails every queued publish (also the
//!   one whose append is in flight: its result then answers nobody);
//! - the room's log takes the stream's events in order, each once: an older one is
//!   ignored, a gap in the live feed is read from the stream first, and the log skips
//!   ahead only when a read shows the stream no longer holds the next seq;
//! - a gap the live feed shows is remembered until the log reaches it: a read that ends
//!   short of it (the event came after the read began, or the read went to a mirror
//!   still behind the home) is followed by another, at once when it made progress, else
//!   after a backoff, and given up after [`FILL_ATTEMPTS`] reads in a row without any;
//! - after a conflict (or a duplicate the room does not hold) a catch-up read ends before
//!   the next append; after [`APPEND_ATTEMPTS`] of them in a row the publish in flight is
//!   answered `Contended`;
//! - latest-state record versions only move forward.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::seqlog::SeqLog;
use crate::core::rules::backoff::{Backoff, BackoffPolicy, Jitter};

/// How often an append that keeps losing to other nodes is retried before it fails.
pub const APPEND_ATTEMPTS: u32 = 20;
/// Reading the stream again after a failed load or catch-up: the rooms of a node that
/// lost NATS together retry spread out, and less often the longer it lasts.
pub const READ_RETRY: BackoffPolicy = BackoffPolicy {
    first: Duration::from_millis(500),
    max: Duration::from_secs(5),
    jitter: Jitter::Full,
};

/// How often a gap the live feed showed is read for again without the log getting any
/// closer, before the room leaves it to its tick (and to the next live event).
pub const FILL_ATTEMPTS: u32 = 10;
/// Reading a gap again when a read brought nothing new: long enough in all (several
/// seconds) for a home cell's mirror to catch up or the home to be asked again.
pub const FILL_RETRY: BackoffPolicy = BackoffPolicy {
    first: Duration::from_millis(200),
    max: Duration::from_secs(2),
    jitter: Jitter::Full,
};

/// What the machine needs of an event the stream stored.
pub trait Sequenced {
    /// The room's seq of the event.
    fn seq(&self) -> u64;
    /// The stream's sequence of the message holding it.
    fn stream_seq(&self) -> u64;
}

/// What the stream said to an append.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<E, X> {
    /// Stored as `E`.
    Stored(E),
    /// The id was stored before: nothing new was written.
    Duplicate,
    /// Another node appended first.
    Conflict,
    /// The stream could not be reached; the event may be stored anyway.
    Failed(X),
}

/// The answer to a publish.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply<X> {
    Stored {
        seq: u64,
        duplicate: bool,
    },
    NotLoaded,
    /// Other nodes kept appending first.
    Contended,
    Failed(X),
}

/// What the driver must do.
#[derive(Debug, PartialEq)]
pub enum Action<P, S, E, X> {
    /// Append the publish [`Pipeline::appending`] names as event `seq`, if the room's last
    /// message on the stream is still `expected` (its stream sequence; 0: none).
    Append {
        expected: u64,
        seq: u64,
    },
    /// Write `put` as the room's latest-state record at `seq`.
    WriteState {
        put: S,
        seq: u64,
    },
    /// Read the room's events after stream sequence `after`.
    CatchUp {
        after: u64,
    },
    Answer {
        publish: P,
        reply: Reply<X>,
    },
    /// Answer a `PUT`: the room is not loaded.
    RefusePut(S),
    /// The room's next event: append it to the log (it is durable) and deliver it.
    Deliver(E),
    /// The stream no longer holds the events after `head` before `next`: the log starts
    /// again, empty, after `next - 1`.
    SkipAhead {
        head: u64,
        next: u64,
    },
    /// Call [`Pipeline::catch_up`] again after this long.
    RetryCatchUp {
        after: Duration,
    },
    /// [`FILL_ATTEMPTS`] reads in a row did not bring the log from `head` any closer to
    /// `wanted`, which the live feed announced: the room stops reading for it (its tick
    /// and the next live event read again).
    FillAbandoned {
        head: u64,
        wanted: u64,
    },
}

/// What is in flight to the stream (one thing at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flight {
    /// An append of the front publish; `answered` once a failed catch-up answered it.
    Append {
        answered: bool,
    },
    StateWrite,
}

/// Work the machine has decided on, or must decide against the log as it will be.
#[derive(Debug)]
enum Todo<P, S, E, X> {
    Do(Action<P, S, E, X>),
    /// Take an event from the stream; `read` from a catch-up (it may skip ahead).
    Take {
        event: E,
        read: bool,
    },
    CatchUp,
    /// A read's events were taken: read again if the log is still short of a gap the live
    /// feed showed (`roll` draws the backoff).
    Refill {
        roll: u64,
    },
    /// Start the next write, unless one is in flight or a catch-up runs.
    Pump,
}

/// One room's appends to its stream.
#[derive(Debug)]
pub struct Pipeline<P, S, E, X> {
    /// Stream sequence of the newest event the log holds (0: none).
    last_stream_seq: u64,
    /// Publishes by idempotency key, the front's append possibly in flight.
    queue: VecDeque<(Arc<str>, P)>,
    /// `PUT`s of the room's state, written between appends.
    puts: VecDeque<S>,
    /// Sequence on the state stream of the newest latest-state record the room took.
    state_version: u64,
    flight: Option<Flight>,
    catching_up: bool,
    /// The log's head when the catch-up read running (or the last one) began.
    read_from_head: u64,
    /// The highest seq the live feed announced beyond a gap in the log (0: none): reads
    /// go on until the log holds it ([`FILL_ATTEMPTS`]).
    wanted: u64,
    /// Reads in a row that left the log short of `wanted` without taking anything.
    fill_retry: Backoff,
    /// Conflicts (and duplicates) in a row.
    conflicts: u32,
    /// Failed loads or catch-ups in a row.
    read_retry: Backoff,
    todo: VecDeque<Todo<P, S, E, X>>,
}

impl<P, S, E, X> Default for Pipeline<P, S, E, X> {
    fn default() -> Self {
        Pipeline {
            last_stream_seq: 0,
            queue: VecDeque::new(),
            puts: VecDeque::new(),
            state_version: 0,
            flight: None,
            catching_up: false,
            read_from_head: 0,
            wanted: 0,
            fill_retry: Backoff::new(FILL_RETRY),
            conflicts: 0,
            read_retry: Backoff::new(READ_RETRY),
            todo: VecDeque::new(),
        }
    }
}

impl<P, S, E: Sequenced, X: Clone> Pipeline<P, S, E, X> {
    /// The room was read: its newest event is at stream sequence `last_stream_seq`, its
    /// latest-state record at `state_version`.
    pub fn loaded(&mut self, last_stream_seq: u64, state_version: u64) {
        self.read_retry.reset();
        self.last_stream_seq = last_stream_seq;
        self.state_version = self.state_version.max(state_version);
    }

    /// The room could not be read: how long to wait before reading again, given `roll`
    /// (a uniformly random `u64`).
    pub fn load_failed(&mut self, roll: u64) -> Duration {
        self.read_retry.next_delay(roll)
    }

    /// A publish with idempotency key `key` to the live `log`: answered at once when the
    /// log holds the key, else queued.
    pub fn publish<T>(&mut self, key: Arc<str>, publish: P, log: &SeqLog<T>) {
        match log.seq_of(&key) {
            Some(seq) => {
                let reply = Reply::Stored { seq, duplicate: true };
                self.todo.push_back(Todo::Do(Action::Answer { publish, reply }));
            }
            None => {
                self.queue.push_back((key, publish));
                self.todo.push_back(Todo::Pump);
            }
        }
    }

    /// A `PUT` to the live room: written between appends, as of the head then.
    pub fn put(&mut self, put: S) {
        self.puts.push_back(put);
        self.todo.push_back(Todo::Pump);
    }

    /// The append [`Action::Append`] started came back.
    pub fn appended(&mut self, outcome: Outcome<E, X>) {
        let flight = self.flight.take();
        debug_assert!(matches!(flight, Some(Flight::Append { .. })), "no append in flight");
        // Its publish is the front, unless a failed catch-up answered it meanwhile: then
        // the result answers nobody.
        let answers_front = flight == Some(Flight::Append { answered: false });
        let mut answer = |reply| {
            let (_, publish) = if answers_front { self.queue.pop_front()? } else { return None };
            Some(Todo::Do(Action::Answer { publish, reply }))
        };
        match outcome {
            Outcome::Stored(event) => {
                self.conflicts = 0;
                let seq = event.seq();
                let answer = answer(Reply::Stored { seq, duplicate: false });
                self.todo.push_back(Todo::Take { event, read: false });
                self.todo.extend(answer);
                self.todo.push_back(Todo::Pump);
            }
            // Stored before (a retried publish): read what this node missed, then the
            // queue answers it as a duplicate. Counted like a conflict, so an id whose
            // event is no longer in the room's history cannot loop.
            Outcome::Duplicate | Outcome::Conflict => {
                self.conflicts += 1;
                if self.conflicts >= APPEND_ATTEMPTS {
                    self.conflicts = 0;
                    let answer = answer(Reply::Contended);
                    self.todo.extend(answer);
                }
                self.todo.push_back(Todo::CatchUp);
            }
            // A timed-out append may be stored anyway: read before the next one.
            Outcome::Failed(error) => {
                self.conflicts = 0;
                let answer = answer(Reply::Failed(error));
                self.todo.extend(answer);
                self.todo.push_back(Todo::CatchUp);
            }
        }
    }

    /// The state write [`Action::WriteState`] started came back: stored as `version` on
    /// the state stream, or not (the driver answers the `PUT`).
    pub fn state_written(&mut self, version: Option<u64>) {
        debug_assert_eq!(self.flight, Some(Flight::StateWrite), "no state write in flight");
        self.flight = None;
        if let Some(version) = version {
            self.state_recorded(version);
        }
        self.todo.push_back(Todo::Pump);
    }

    /// A latest-state record this node wrote (with an appended event) got `version`.
    pub fn state_recorded(&mut self, version: u64) {
        self.state_version = self.state_version.max(version);
    }

    /// Another node's latest-state record: whether the room takes it (only one newer than
    /// any it took, so a late copy never undoes a newer `PUT` at the same seq).
    pub fn live_state(&mut self, version: u64) -> bool {
        if version <= self.state_version {
            return false;
        }
        self.state_version = version;
        true
    }

    /// The stream sequence of the newest event the room took: a read of what it missed
    /// starts after it.
    pub fn read_from(&self) -> u64 {
        self.last_stream_seq
    }

    /// An event from the live feed (another node's, or this node's own).
    pub fn live_event(&mut self, event: E) {
        self.todo.push_back(Todo::Take { event, read: false });
    }

    /// Read what the stream holds beyond the log's head (unless a read runs already).
    pub fn catch_up(&mut self) {
        self.todo.push_back(Todo::CatchUp);
    }

    /// The read [`Action::CatchUp`] started came back with `events`, oldest first; `roll`
    /// (a uniformly random `u64`) draws the delay of a read again, if one is due.
    pub fn caught_up(&mut self, events: Vec<E>, roll: u64) {
        self.catching_up = false;
        self.read_retry.reset();
        self.todo.extend(events.into_iter().map(|event| Todo::Take { event, read: true }));
        self.todo.push_back(Todo::Refill { roll });
        self.todo.push_back(Todo::Pump);
    }

    /// The highest seq the live feed announced beyond a gap the log has not filled yet
    /// (`None`: no such gap).
    pub fn wanted(&self) -> Option<u64> {
        (self.wanted > 0).then_some(self.wanted)
    }

    /// The read [`Action::CatchUp`] started failed: every queued publish fails with
    /// `error`, and the read is retried after a backoff drawn with `roll`.
    pub fn catch_up_failed(&mut self, error: X, roll: u64) {
        self.catching_up = false;
        if let Some(Flight::Append { answered }) = &mut self.flight {
            *answered = true;
        }
        for (_, publish) in self.queue.drain(..) {
            self.todo.push_back(Todo::Do(Action::Answer {
                publish,
                reply: Reply::Failed(error.clone()),
            }));
        }
        let after = self.read_retry.next_delay(roll);
        self.todo.push_back(Todo::Do(Action::RetryCatchUp { after }));
    }

    /// The next thing to do, given the room's log as it is now (`None`: not loaded) and
    /// whether the room stopped. Call until it returns `None`, carrying out each action
    /// before asking for the next.
    pub fn poll<T>(
        &mut self,
        log: Option<&SeqLog<T>>,
        stopped: bool,
    ) -> Option<Action<P, S, E, X>> {
        while let Some(todo) = self.todo.pop_front() {
            let action = match todo {
                Todo::Do(action) => Some(action),
                Todo::Take { event, read } => self.take(event, read, log, stopped),
                Todo::CatchUp => self.start_catch_up(log.map(SeqLog::head), stopped),
                Todo::Refill { roll } => self.refill(log.map(SeqLog::head), stopped, roll),
                Todo::Pump => self.pump(log),
            };
            if action.is_some() {
                return action;
            }
        }
        None
    }

    /// The publish whose append is in flight (while no failed catch-up answered it).
    pub fn appending(&self) -> Option<&P> {
        match self.flight {
            Some(Flight::Append { answered: false }) => {
                self.queue.front().map(|(_, publish)| publish)
            }
            _ => None,
        }
    }

    /// Whether publishes or `PUT`s still wait on the stream.
    pub fn busy(&self) -> bool {
        !self.queue.is_empty() || !self.puts.is_empty() || self.flight.is_some()
    }

    /// An event from the stream: the next seq is delivered, an older one ignored, and a
    /// gap is read from the stream first (or, in what a read returned, skipped).
    fn take<T>(
        &mut self,
        event: E,
        read: bool,
        log: Option<&SeqLog<T>>,
        stopped: bool,
    ) -> Option<Action<P, S, E, X>> {
        let log = log?;
        let (head, next) = (log.head(), event.seq());
        if next <= head {
            return None;
        }
        if next > head + 1 {
            if read {
                // The stream's retention dropped them: the log jumps to what it holds.
                self.todo.push_front(Todo::Take { event, read: false });
                return Some(Action::SkipAhead { head, next });
            }
            // Remembered until the log holds it: a read running now may end before it.
            self.wanted = self.wanted.max(next);
            return self.start_catch_up(Some(head), stopped);
        }
        // What `SeqLog::append_sequenced` takes.
        if log.durable() != head {
            return None;
        }
        self.last_stream_seq = event.stream_seq();
        Some(Action::Deliver(event))
    }

    /// Start a read after the newest event the log took (`head`: its head, `None`: the
    /// room is not loaded), unless one runs.
    fn start_catch_up(&mut self, head: Option<u64>, stopped: bool) -> Option<Action<P, S, E, X>> {
        let head = head?;
        if self.catching_up || stopped {
            return None;
        }
        self.catching_up = true;
        self.read_from_head = head;
        Some(Action::CatchUp { after: self.last_stream_seq })
    }

    /// After a read's events were taken: a gap the live feed showed that the log still
    /// lacks is read again, at once if the read brought something, else after a backoff,
    /// and abandoned after [`FILL_ATTEMPTS`] reads in a row that brought nothing.
    fn refill(
        &mut self,
        head: Option<u64>,
        stopped: bool,
        roll: u64,
    ) -> Option<Action<P, S, E, X>> {
        let head = head?;
        if self.wanted <= head || stopped {
            self.wanted = 0;
            self.fill_retry.reset();
            return None;
        }
        if head > self.read_from_head {
            self.fill_retry.reset();
            return self.start_catch_up(Some(head), stopped);
        }
        if self.fill_retry.attempts() >= FILL_ATTEMPTS {
            let wanted = std::mem::take(&mut self.wanted);
            self.fill_retry.reset();
            return Some(Action::FillAbandoned { head, wanted });
        }
        Some(Action::RetryCatchUp { after: self.fill_retry.next_delay(roll) })
    }

    /// Start the next write: a `PUT` first, else the first queued publish the log does
    /// not hold (those it holds are answered as duplicates).
    fn pump<T>(&mut self, log: Option<&SeqLog<T>>) -> Option<Action<P, S, E, X>> {
        if self.flight.is_some() || self.catching_up {
            return None;
        }
        let Some(log) = log else {
            let refused = self
                .queue
                .drain(..)
                .map(|(_, publish)| Action::Answer { publish, reply: Reply::NotLoaded });
            let refused: Vec<_> =
                refused.chain(self.puts.drain(..).map(Action::RefusePut)).collect();
            self.push_front(refused);
            return None;
        };
        if let Some(put) = self.puts.pop_front() {
            self.flight = Some(Flight::StateWrite);
            return Some(Action::WriteState { put, seq: log.head() });
        }
        // A queued id the stream got meanwhile (a retry racing its original) is answered.
        let mut answered = Vec::new();
        while let Some(seq) = self.queue.front().and_then(|(key, _)| log.seq_of(key)) {
            let (_, publish) = self.queue.pop_front().expect("front exists");
            answered
                .push(Action::Answer { publish, reply: Reply::Stored { seq, duplicate: true } });
        }
        if !self.queue.is_empty() {
            self.flight = Some(Flight::Append { answered: false });
            answered.push(Action::Append { expected: self.last_stream_seq, seq: log.head() + 1 });
        }
        self.push_front(answered);
        None
    }

    /// `actions` to be polled next, in order.
    fn push_front(&mut self, actions: Vec<Action<P, S, E, X>>) {
        for action in actions.into_iter().rev() {
            self.todo.push_front(Todo::Do(action));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::core::delivery::seqlog::Entry;
    use crate::core::rules::limits::Retention;

    #[derive(Debug, Clone, PartialEq)]
    struct Ev {
        seq: u64,
        stream_seq: u64,
        key: Arc<str>,
    }

    impl Sequenced for Ev {
        fn seq(&self) -> u64 {
            self.seq
        }
        fn stream_seq(&self) -> u64 {
            self.stream_seq
        }
    }

    fn ev(seq: u64, stream_seq: u64, key: &str) -> Ev {
        Ev { seq, stream_seq, key: key.into() }
    }

    type Act = Action<usize, usize, Ev, &'static str>;

    fn answer(publish: usize, reply: Reply<&'static str>) -> Act {
        Action::Answer { publish, reply }
    }

    fn stored(seq: u64, duplicate: bool) -> Reply<&'static str> {
        Reply::Stored { seq, duplicate }
    }

    /// The machine and the room's log, driven as `actors/room/stream.rs` drives them.
    struct Node {
        appends: Pipeline<usize, usize, Ev, &'static str>,
        log: SeqLog<u64>,
        retention: Retention,
    }

    impl Node {
        /// A room loaded from `retained`, keeping `keep` events of history.
        fn loaded(retained: &[Ev], keep: usize) -> Node {
            let retention = Retention { max_events: keep, max_age_ms: u64::MAX };
            let head = retained.last().map_or(0, |e| e.seq);
            let entry = |e: &Ev| Entry { seq: e.seq, id: e.key.clone(), ts_ms: 0, payload: e.seq };
            let entries = retained.iter().map(entry).collect();
            let mut appends = Pipeline::default();
            appends.loaded(retained.last().map_or(0, |e| e.stream_seq), 0);
            Node { appends, log: SeqLog::restore("e".into(), head, entries, retention), retention }
        }

        /// Every action until the machine is idle, with `Deliver` and `SkipAhead` carried
        /// out on the log.
        fn run(&mut self) -> Vec<Act> {
            let mut done = Vec::new();
            while let Some(action) = self.appends.poll(Some(&self.log), false) {
                match &action {
                    Action::Deliver(e) => self
                        .log
                        .append_sequenced(e.seq, e.key.clone(), 0, e.seq)
                        .expect("the next seq"),
                    Action::SkipAhead { next, .. } => {
                        self.log = SeqLog::restore(
                            self.log.epoch().into(),
                            next - 1,
                            Vec::new(),
                            self.retention,
                        )
                    }
                    _ => {}
                }
                done.push(action);
            }
            done
        }

        fn publish(&mut self, publish: usize, key: &str) -> Vec<Act> {
            self.appends.publish(key.into(), publish, &self.log);
            self.run()
        }

        fn appended(&mut self, outcome: Outcome<Ev, &'static str>) -> Vec<Act> {
            self.appends.appended(outcome);
            self.run()
        }

        fn caught_up(&mut self, events: &[Ev]) -> Vec<Act> {
            self.appends.caught_up(events.to_vec(), u64::MAX);
            self.run()
        }

        fn live(&mut self, event: Ev) -> Vec<Act> {
            self.appends.live_event(event);
            self.run()
        }
    }

    #[test]
    fn appends_go_one_at_a_time_and_are_answered_with_their_seq() {
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        assert_eq!(node.publish(0, "x"), vec![Action::Append { expected: 10, seq: 2 }]);
        assert_eq!(node.appends.appending(), Some(&0));
        assert_eq!(node.publish(1, "y"), vec![], "one append in flight");
        assert_eq!(node.publish(2, "a"), vec![answer(2, stored(1, true))], "an id the log holds");
        assert_eq!(
            node.appended(Outcome::Stored(ev(2, 12, "x"))),
            vec![
                Action::Deliver(ev(2, 12, "x")),
                answer(0, stored(2, false)),
                Action::Append { expected: 12, seq: 3 }
            ]
        );
        assert_eq!(node.appends.appending(), Some(&1));
        assert!(node.appends.busy());
        assert_eq!(
            node.appended(Outcome::Stored(ev(3, 13, "y"))),
            vec![Action::Deliver(ev(3, 13, "y")), answer(1, stored(3, false))]
        );
        assert!(!node.appends.busy());
    }

    #[test]
    fn a_queued_id_the_log_took_meanwhile_is_a_duplicate() {
        let mut node = Node::loaded(&[], 100);
        assert_eq!(node.publish(0, "x"), vec![Action::Append { expected: 0, seq: 1 }]);
        assert_eq!(node.publish(1, "x"), vec![]);
        assert_eq!(node.publish(2, "y"), vec![]);
        assert_eq!(
            node.appended(Outcome::Stored(ev(1, 5, "x"))),
            vec![
                Action::Deliver(ev(1, 5, "x")),
                answer(0, stored(1, false)),
                answer(1, stored(1, true)),
                Action::Append { expected: 5, seq: 2 },
            ]
        );
    }

    #[test]
    fn a_conflict_reads_the_stream_before_the_next_append() {
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        node.publish(0, "x");
        assert_eq!(node.appended(Outcome::Conflict), vec![Action::CatchUp { after: 10 }]);
        assert_eq!(node.publish(1, "y"), vec![], "no append while catching up");
        assert_eq!(
            node.caught_up(&[ev(2, 11, "o")]),
            vec![Action::Deliver(ev(2, 11, "o")), Action::Append { expected: 11, seq: 3 }]
        );
        // A duplicate: the read brings the original, and the queue answers it.
        assert_eq!(node.appended(Outcome::Duplicate), vec![Action::CatchUp { after: 11 }]);
        assert_eq!(
            node.caught_up(&[ev(3, 14, "x")]),
            vec![
                Action::Deliver(ev(3, 14, "x")),
                answer(0, stored(3, true)),
                Action::Append { expected: 14, seq: 4 }
            ]
        );
    }

    #[test]
    fn an_append_that_keeps_losing_is_contended() {
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        node.publish(0, "x");
        node.publish(1, "y");
        for _ in 1..APPEND_ATTEMPTS {
            assert_eq!(node.appended(Outcome::Conflict), vec![Action::CatchUp { after: 10 }]);
            assert_eq!(node.caught_up(&[]), vec![Action::Append { expected: 10, seq: 2 }]);
        }
        assert_eq!(
            node.appended(Outcome::Duplicate),
            vec![answer(0, Reply::Contended), Action::CatchUp { after: 10 }]
        );
        assert_eq!(node.caught_up(&[]), vec![Action::Append { expected: 10, seq: 2 }]);
        assert_eq!(node.appends.appending(), Some(&1));
        assert_eq!(
            node.appended(Outcome::Conflict),
            vec![Action::CatchUp { after: 10 }],
            "counted afresh"
        );
    }

    #[test]
    fn a_failed_append_is_answered_and_the_stream_read() {
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        node.publish(0, "x");
        node.publish(1, "y");
        assert_eq!(
            node.appended(Outcome::Failed("down")),
            vec![answer(0, Reply::Failed("down")), Action::CatchUp { after: 10 }]
        );
        // It was stored anyway: the read finds it.
        assert_eq!(
            node.caught_up(&[ev(2, 11, "x")]),
            vec![Action::Deliver(ev(2, 11, "x")), Action::Append { expected: 11, seq: 3 }]
        );
    }

    #[test]
    fn a_failed_catch_up_fails_every_queued_publish() {
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        node.publish(0, "x");
        assert_eq!(
            node.live(ev(3, 12, "o")),
            vec![Action::CatchUp { after: 10 }],
            "a gap in the live feed"
        );
        node.publish(1, "y");
        node.appends.put(7);
        node.appends.catch_up_failed("read", u64::MAX);
        assert_eq!(
            node.run(),
            vec![
                answer(0, Reply::Failed("read")),
                answer(1, Reply::Failed("read")),
                Action::RetryCatchUp { after: READ_RETRY.first }
            ]
        );
        assert_eq!(node.appends.appending(), None, "answered already");
        // The append in flight answers nobody, and the PUT waits for the read.
        node.publish(2, "z");
        assert_eq!(
            node.appended(Outcome::Stored(ev(2, 11, "x"))),
            vec![Action::Deliver(ev(2, 11, "x")), Action::WriteState { put: 7, seq: 2 }]
        );
        node.appends.state_written(None);
        assert_eq!(node.run(), vec![Action::Append { expected: 11, seq: 3 }]);
        node.appends.catch_up();
        assert_eq!(node.run(), vec![Action::CatchUp { after: 11 }]);
        node.appends.catch_up_failed("read", u64::MAX);
        assert_eq!(
            node.run(),
            vec![
                answer(2, Reply::Failed("read")),
                Action::RetryCatchUp { after: READ_RETRY.first * 2 }
            ]
        );
        assert_eq!(
            node.appended(Outcome::Conflict),
            vec![Action::CatchUp { after: 11 }],
            "answers nobody"
        );
        assert_eq!(node.caught_up(&[ev(3, 12, "o")]), vec![Action::Deliver(ev(3, 12, "o"))]);
        node.appends.catch_up();
        node.run();
        node.appends.catch_up_failed("read", u64::MAX);
        assert_eq!(
            node.run(),
            vec![Action::RetryCatchUp { after: READ_RETRY.first }],
            "a read succeeded since"
        );
    }

    #[test]
    fn live_events_are_taken_in_order_and_gaps_read() {
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        assert_eq!(node.live(ev(1, 10, "a")), vec![], "an old one");
        assert_eq!(node.live(ev(2, 11, "b")), vec![Action::Deliver(ev(2, 11, "b"))]);
        assert_eq!(node.live(ev(4, 15, "d")), vec![Action::CatchUp { after: 11 }]);
        assert_eq!(node.live(ev(5, 16, "e")), vec![], "one read at a time");
        let read = [ev(3, 13, "c"), ev(4, 15, "d"), ev(5, 16, "e")];
        assert_eq!(
            node.caught_up(&read),
            read.iter().cloned().map(Action::Deliver).collect::<Vec<_>>()
        );
        assert_eq!(node.log.head(), 5);
    }

    #[test]
    fn a_gap_announced_while_a_read_runs_is_read_again_once_that_read_ends_short() {
        // A cut healed: the first live copy shows a gap, and the copies after it come
        // while the (long) read runs; that read ends at the stream's head when it began.
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        assert_eq!(node.live(ev(5, 20, "e")), vec![Action::CatchUp { after: 10 }]);
        assert_eq!(node.live(ev(6, 21, "f")), vec![], "one read at a time");
        assert_eq!(node.live(ev(7, 22, "g")), vec![]);
        assert_eq!(node.appends.wanted(), Some(7));
        let first = [ev(2, 11, "b"), ev(3, 12, "c"), ev(4, 13, "d"), ev(5, 20, "e")];
        let mut want: Vec<Act> = first.iter().cloned().map(Action::Deliver).collect();
        want.push(Action::CatchUp { after: 20 });
        assert_eq!(node.caught_up(&first), want, "short of 7: read again at once");
        assert_eq!(
            node.caught_up(&[ev(6, 21, "f"), ev(7, 22, "g")]),
            vec![Action::Deliver(ev(6, 21, "f")), Action::Deliver(ev(7, 22, "g"))]
        );
        assert_eq!(node.appends.wanted(), None);
        assert_eq!(node.log.head(), 7);
        assert_eq!(node.live(ev(8, 23, "h")), vec![Action::Deliver(ev(8, 23, "h"))]);
    }

    #[test]
    fn a_gap_a_read_cannot_fill_yet_is_read_again_with_backoff_then_abandoned() {
        // The home cell is silent and its mirror here is behind the live copy.
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        assert_eq!(node.live(ev(4, 20, "d")), vec![Action::CatchUp { after: 10 }]);
        let mut delays = Vec::new();
        for attempt in 0..FILL_ATTEMPTS {
            match node.caught_up(&[]).as_slice() {
                [Action::RetryCatchUp { after }] => delays.push(*after),
                other => panic!("attempt {attempt}: {other:?}"),
            }
            node.appends.catch_up();
            assert_eq!(node.run(), vec![Action::CatchUp { after: 10 }]);
        }
        assert_eq!(delays[0], FILL_RETRY.first);
        assert!(
            delays.windows(2).all(|w| w[0] <= w[1]) && delays.iter().all(|d| *d <= FILL_RETRY.max),
            "{delays:?}"
        );
        assert_eq!(
            node.caught_up(&[]),
            vec![Action::FillAbandoned { head: 1, wanted: 4 }],
            "bounded"
        );
        assert_eq!(node.appends.wanted(), None);
        node.appends.catch_up();
        assert_eq!(node.run(), vec![Action::CatchUp { after: 10 }], "the tick still reads");
        assert_eq!(node.caught_up(&[]), vec![], "and nothing is retried for it");
        // A read that brings part of it goes on at once, and the count starts again.
        assert_eq!(node.live(ev(4, 20, "d")), vec![Action::CatchUp { after: 10 }]);
        assert!(matches!(node.caught_up(&[]).as_slice(), [Action::RetryCatchUp { .. }]));
        node.appends.catch_up();
        node.run();
        assert_eq!(
            node.caught_up(&[ev(2, 11, "b")]),
            vec![Action::Deliver(ev(2, 11, "b")), Action::CatchUp { after: 11 }]
        );
        assert_eq!(
            node.caught_up(&[]),
            vec![Action::RetryCatchUp { after: FILL_RETRY.first }],
            "progress resets the backoff"
        );
        node.appends.catch_up();
        node.run();
        assert_eq!(
            node.caught_up(&[ev(3, 12, "c"), ev(4, 20, "d")]),
            vec![Action::Deliver(ev(3, 12, "c")), Action::Deliver(ev(4, 20, "d"))]
        );
        assert_eq!(node.appends.wanted(), None);
    }

    #[test]
    fn a_read_past_the_streams_retention_skips_ahead() {
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        node.appends.catch_up();
        assert_eq!(node.run(), vec![Action::CatchUp { after: 10 }]);
        assert_eq!(
            node.caught_up(&[ev(5, 20, "e"), ev(6, 21, "f")]),
            vec![
                Action::SkipAhead { head: 1, next: 5 },
                Action::Deliver(ev(5, 20, "e")),
                Action::Deliver(ev(6, 21, "f"))
            ]
        );
        assert_eq!(node.publish(0, "x"), vec![Action::Append { expected: 21, seq: 7 }]);
    }

    #[test]
    fn puts_are_written_between_appends_as_of_the_head() {
        let mut node = Node::loaded(&[ev(1, 10, "a")], 100);
        node.publish(0, "x");
        node.appends.put(7);
        node.publish(1, "y");
        assert_eq!(
            node.appended(Outcome::Stored(ev(2, 11, "x"))),
            vec![
                Action::Deliver(ev(2, 11, "x")),
                answer(0, stored(2, false)),
                Action::WriteState { put: 7, seq: 2 }
            ]
        );
        assert_eq!(node.publish(2, "z"), vec![], "a state write in flight");
        node.appends.state_written(Some(3));
        assert_eq!(node.run(), vec![Action::Append { expected: 11, seq: 3 }]);
        // Latest-state versions only move forward.
        assert!(!node.appends.live_state(3));
        assert!(node.appends.live_state(4));
        assert!(!node.appends.live_state(4));
        node.appends.state_recorded(2);
        assert!(node.appends.live_state(5));
    }

    #[test]
    fn a_room_not_loaded_refuses_and_a_stopped_one_reads_nothing() {
        let mut node = Node::loaded(&[], 100);
        node.appends.publish("x".into(), 0, &node.log);
        node.appends.put(7);
        let none: Option<&SeqLog<u64>> = None;
        assert_eq!(node.appends.poll(none, false), Some(answer(0, Reply::NotLoaded)));
        assert_eq!(node.appends.poll(none, false), Some(Action::RefusePut(7)));
        assert_eq!(node.appends.poll(none, false), None);
        node.appends.catch_up();
        assert_eq!(node.appends.poll(Some(&node.log), true), None);
        assert_eq!(node.appends.load_failed(u64::MAX), READ_RETRY.first);
        assert_eq!(node.appends.load_failed(u64::MAX), READ_RETRY.first * 2);
        node.appends.loaded(0, 0);
        assert_eq!(node.appends.load_failed(u64::MAX), READ_RETRY.first);
    }

    /// What happens next in the simulation.
    #[derive(Debug, Clone)]
    enum Step {
        /// A publish with id `k{n}` (a small set: retries meet their originals).
        Publish(u8),
        Put,
        /// The stream answers the append in flight (by its guard and its ids).
        AppendDone,
        /// The append fails; it was stored anyway if `stored` and the stream would have.
        AppendFails {
            stored: bool,
        },
        WriteDone {
            ok: bool,
        },
        ReadDone {
            ok: bool,
            roll: u64,
        },
        RetryFires,
        Tick,
        OtherNodeWrites(u8),
        FeedNext,
        /// The live feed brings an event it brought before again.
        FeedRepeat(usize),
        FeedLoses,
        /// The stream's retention drops its oldest events (but the newest).
        Trim(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u8..6).prop_map(Step::Publish),
            1 => Just(Step::Put),
            5 => Just(Step::AppendDone),
            1 => any::<bool>().prop_map(|stored| Step::AppendFails { stored }),
            2 => any::<bool>().prop_map(|ok| Step::WriteDone { ok }),
            4 => (prop::bool::weighted(0.8), any::<u64>()).prop_map(|(ok, roll)| Step::ReadDone { ok, roll }),
            1 => Just(Step::RetryFires),
            1 => Just(Step::Tick),
            2 => (1u8..3).prop_map(Step::OtherNodeWrites),
            4 => Just(Step::FeedNext),
            1 => any::<usize>().prop_map(Step::FeedRepeat),
            1 => Just(Step::FeedLoses),
            1 => (1u8..4).prop_map(Step::Trim),
        ]
    }

    /// A node and the stream it appends to, which is the truth.
    struct Sim {
        node: Node,
        /// Every event the stream ever stored (its ids are never stored twice).
        stream: Vec<Ev>,
        /// Index in `stream` of the oldest event it still holds.
        retained_from: usize,
        next_stream_seq: u64,
        feed: VecDeque<Ev>,
        fed: Vec<Ev>,
        /// Each publish's key and its answers.
        publishes: Vec<(Arc<str>, Vec<Reply<&'static str>>)>,
        put_answers: Vec<usize>,
        /// In flight: an append (expected, seq, publish), a state write (put, seq), a read.
        append: Option<(u64, u64, usize)>,
        write: Option<(usize, u64)>,
        read: Option<u64>,
        retries: usize,
        next_version: u64,
        /// Conflicts and duplicates in a row.
        conflicts: u32,
        /// A conflict, duplicate or failure came back: a read must end before an append.
        read_due: bool,
    }

    impl Sim {
        fn new(before: u64, trimmed: usize, keep: usize) -> Sim {
            let mut sim = Sim {
                node: Node::loaded(&[], keep),
                stream: Vec::new(),
                retained_from: 0,
                next_stream_seq: 1,
                feed: VecDeque::new(),
                fed: Vec::new(),
                publishes: Vec::new(),
                put_answers: Vec::new(),
                append: None,
                write: None,
                read: None,
                retries: 0,
                next_version: 1,
                conflicts: 0,
                read_due: false,
            };
            sim.other_node_writes(before);
            sim.trim(trimmed);
            sim.feed.clear();
            sim.node = Node::loaded(sim.retained(), keep);
            sim
        }

        fn retained(&self) -> &[Ev] {
            &self.stream[self.retained_from..]
        }

        fn last_stream_seq(&self) -> u64 {
            self.stream.last().map_or(0, |e| e.stream_seq)
        }

        fn store(&mut self, key: Arc<str>) -> Ev {
            let event =
                Ev { seq: self.stream.len() as u64 + 1, stream_seq: self.next_stream_seq, key };
            // Other rooms' messages sit between a room's.
            self.next_stream_seq += 1 + self.stream.len() as u64 % 3;
            self.stream.push(event.clone());
            self.feed.push_back(event.clone());
            event
        }

        fn other_node_writes(&mut self, n: u64) {
            for _ in 0..n {
                let key = format!("o{}", self.stream.len() + 1).into();
                self.store(key);
            }
        }

        fn trim(&mut self, n: usize) {
            self.retained_from = (self.retained_from + n).min(self.stream.len().saturating_sub(1));
        }

        fn unanswered(&self) -> Vec<usize> {
            (0..self.publishes.len()).filter(|&p| self.publishes[p].1.is_empty()).collect()
        }

        /// Carry out what the machine decides, checking each action.
        fn drive(&mut self) -> Vec<Act> {
            let head_before = self.node.log.head();
            let done = self.node.run();
            let mut head = head_before;
            for action in &done {
                match action {
                    Action::Append { expected, seq } => {
                        assert!(
                            self.append.is_none() && self.write.is_none(),
                            "one write at a time"
                        );
                        assert!(self.read.is_none(), "no append while a read runs");
                        assert!(
                            !self.read_due,
                            "a read ends between a conflict and the next append"
                        );
                        assert_eq!(*seq, head + 1);
                        let publish = *self.node.appends.appending().expect("the append's publish");
                        self.append = Some((*expected, *seq, publish));
                    }
                    Action::WriteState { put, seq } => {
                        assert!(
                            self.append.is_none() && self.write.is_none(),
                            "one write at a time"
                        );
                        assert!(self.read.is_none(), "no state write while a read runs");
                        assert_eq!(*seq, head);
                        self.write = Some((*put, *seq));
                    }
                    Action::CatchUp { after } => {
                        assert!(self.read.is_none(), "one read at a time");
                        self.read = Some(*after);
                    }
                    Action::Answer { publish, reply } => {
                        let (key, answers) = &mut self.publishes[*publish];
                        assert!(
                            answers.is_empty(),
                            "publish {publish} answered twice: {answers:?}, {reply:?}"
                        );
                        answers.push(reply.clone());
                        if let Reply::Stored { seq, .. } = reply {
                            let truth = self.stream.iter().find(|e| e.key == *key).map(|e| e.seq);
                            assert_eq!(
                                truth,
                                Some(*seq),
                                "publish {publish}: not the seq the stream stored it under"
                            );
                        }
                    }
                    Action::RefusePut(_) => panic!("the room is loaded"),
                    Action::Deliver(e) => {
                        assert_eq!(e.seq, head + 1, "contiguous");
                        assert_eq!(&self.stream[e.seq as usize - 1], e, "the stream's event");
                        head = e.seq;
                    }
                    Action::SkipAhead { head: from, next } => {
                        assert_eq!(*from, head);
                        assert!(*next > head + 1);
                        assert!(
                            self.retained_from > head as usize,
                            "skipped events the stream still holds"
                        );
                        head = next - 1;
                    }
                    Action::RetryCatchUp { after } => {
                        assert!(*after <= READ_RETRY.max);
                        self.retries += 1;
                    }
                    Action::FillAbandoned { .. } => {
                        panic!("a read of the whole stream always fills the gap")
                    }
                }
            }
            assert_eq!(self.node.log.head(), head);
            assert!(head >= head_before, "the head went back");
            done
        }

        fn run(&mut self, step: Step) {
            match step {
                Step::Publish(n) => {
                    let key: Arc<str> = format!("k{n}").into();
                    self.publishes.push((key.clone(), Vec::new()));
                    self.node.appends.publish(key, self.publishes.len() - 1, &self.node.log);
                    self.drive();
                }
                Step::Put => {
                    self.put_answers.push(0);
                    self.node.appends.put(self.put_answers.len() - 1);
                    self.drive();
                }
                Step::AppendDone => self.append_done(None),
                Step::AppendFails { stored } => self.append_done(Some(stored)),
                Step::WriteDone { ok } => {
                    let Some((put, _)) = self.write.take() else { return };
                    self.next_version += 1;
                    self.node.appends.state_written(ok.then_some(self.next_version));
                    self.put_answers[put] += 1;
                    self.drive();
                }
                Step::ReadDone { ok, roll } => {
                    let Some(after) = self.read.take() else { return };
                    self.read_due = false;
                    if ok {
                        let events = self
                            .retained()
                            .iter()
                            .filter(|e| e.stream_seq > after)
                            .cloned()
                            .collect();
                        self.node.appends.caught_up(events, roll);
                        self.drive();
                    } else {
                        let queued = self.unanswered();
                        self.node.appends.catch_up_failed("read", roll);
                        self.drive();
                        for p in queued {
                            assert_eq!(
                                self.publishes[p].1,
                                vec![Reply::Failed("read")],
                                "publish {p}"
                            );
                        }
                    }
                }
                Step::RetryFires | Step::Tick => {
                    if matches!(step, Step::RetryFires) {
                        let Some(left) = self.retries.checked_sub(1) else { return };
                        self.retries = left;
                    }
                    self.node.appends.catch_up();
                    self.drive();
                }
                Step::OtherNodeWrites(n) => self.other_node_writes(n.into()),
                Step::FeedNext | Step::FeedLoses => {
                    let Some(event) = self.feed.pop_front() else { return };
                    if matches!(step, Step::FeedNext) {
                        self.fed.push(event.clone());
                        self.node.appends.live_event(event);
                        self.drive();
                    }
                }
                Step::FeedRepeat(n) => {
                    let Some(event) = self.fed.get(n % self.fed.len().max(1)).cloned() else {
                        return;
                    };
                    self.node.appends.live_event(event);
                    self.drive();
                }
                Step::Trim(n) => self.trim(n.into()),
            }
        }

        /// The stream answers the append in flight as JetStream would (ids first, then the
        /// expected-sequence guard), or it fails (`Some(stored)`: stored anyway if it would
        /// have been).
        fn append_done(&mut self, fails: Option<bool>) {
            let Some((expected, seq, publish)) = self.append.take() else { return };
            let key = self.publishes[publish].0.clone();
            let outcome = if self.stream.iter().any(|e| e.key == key) {
                Outcome::Duplicate
            } else if expected != self.last_stream_seq() {
                Outcome::Conflict
            } else if fails == Some(false) {
                Outcome::Failed("append")
            } else {
                assert_eq!(
                    seq,
                    self.stream.len() as u64 + 1,
                    "the room's seqs on the stream are contiguous"
                );
                Outcome::Stored(self.store(key))
            };
            let outcome = if fails.is_some() { Outcome::Failed("append") } else { outcome };
            // What the result must answer its publish with, unless a failed read did.
            let own = match &outcome {
                Outcome::Duplicate | Outcome::Conflict => {
                    self.conflicts += 1;
                    self.read_due = true;
                    (self.conflicts == APPEND_ATTEMPTS).then(|| {
                        self.conflicts = 0;
                        Reply::Contended
                    })
                }
                Outcome::Stored(e) => {
                    self.conflicts = 0;
                    Some(stored(e.seq, false))
                }
                Outcome::Failed(why) => {
                    self.conflicts = 0;
                    self.read_due = true;
                    Some(Reply::Failed(*why))
                }
            };
            let own = own.filter(|_| self.publishes[publish].1.is_empty());
            self.node.appends.appended(outcome);
            let answers: Vec<_> = self
                .drive()
                .into_iter()
                .filter_map(|action| match action {
                    Action::Answer { publish, reply } => Some((publish, reply)),
                    _ => None,
                })
                .collect();
            let (mine, others): (Vec<_>, Vec<_>) =
                answers.into_iter().partition(|(p, _)| *p == publish);
            let mine: Vec<_> = mine.into_iter().map(|(_, reply)| reply).collect();
            assert_eq!(mine, Vec::from_iter(own), "the append's result answers its publish");
            assert!(
                others.iter().all(|(_, r)| matches!(r, Reply::Stored { duplicate: true, .. })),
                "an append's result answered another publish: {others:?}"
            );
        }

        /// Let everything finish without other writers, then everything is answered and the
        /// room holds what the stream holds.
        fn settle(&mut self) {
            for round in 0..2 {
                for _ in 0..10_000 {
                    let step = if self.append.is_some() {
                        Step::AppendDone
                    } else if self.write.is_some() {
                        Step::WriteDone { ok: true }
                    } else if self.read.is_some() {
                        Step::ReadDone { ok: true, roll: 0 }
                    } else if !self.feed.is_empty() {
                        Step::FeedNext
                    } else if self.retries > 0 {
                        Step::RetryFires
                    } else {
                        break;
                    };
                    self.run(step);
                }
                if round == 0 {
                    // A live event lost for good is found by the room's tick.
                    self.run(Step::Tick);
                }
            }
            assert_eq!(self.unanswered(), Vec::<usize>::new(), "publishes never answered");
            assert!(
                self.put_answers.iter().all(|&n| n == 1),
                "every PUT answered once: {:?}",
                self.put_answers
            );
            assert!(!self.node.appends.busy());
            assert_eq!(
                self.node.log.head(),
                self.stream.len() as u64,
                "the room holds what the stream holds"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        #[test]
        fn the_room_follows_the_stream_and_every_publish_is_answered_once(
            before in 0u64..4,
            trimmed in 0usize..3,
            keep in 1usize..6,
            steps in proptest::collection::vec(step(), 1..300),
        ) {
            let mut sim = Sim::new(before, trimmed, keep);
            for step in steps {
                sim.run(step);
            }
            sim.settle();
        }
    }

    #[test]
    fn a_publish_whose_event_left_the_rooms_history_is_contended_not_looped() {
        // The stream still knows the id; the room keeps one event, not that one.
        let mut sim = Sim::new(0, 0, 1);
        sim.run(Step::Publish(0));
        sim.run(Step::AppendDone);
        sim.run(Step::OtherNodeWrites(1));
        sim.run(Step::FeedNext);
        sim.run(Step::FeedNext);
        sim.run(Step::Publish(0));
        sim.settle();
        assert_eq!(sim.publishes[0].1, vec![stored(1, false)]);
        assert_eq!(sim.publishes[1].1, vec![Reply::Contended]);
    }
}
