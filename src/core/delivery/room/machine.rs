//! The room as a machine: what a room decides, with no I/O, no clock and no actor. The
//! driver (the room actor, or `core::delivery::sim`) feeds it [`Input`]s with the time they
//! happen at, and carries out the [`Action`]s it takes from [`RoomMachine::poll`]:
//! send a window to a subscriber, evict one, answer a subscribe or a publish, arm a
//! timer, write to or flush the log, retire the room. Nothing it does waits: a read or
//! a flush in flight is an action out and an input back, and every other input is
//! handled meanwhile.
//!
//! It owns the room's phase (loading, live, failed) and its [`SeqLog`], the batching
//! window and its epoch, the subscribers and their eviction, the states waiting for
//! their event to be durable, the occupancy edges, idle stop and linger, and the local
//! log's flush bookkeeping (who waits for which flush). What a subscriber is, how a
//! window is cut and measured, and what an answer carries back are the driver's
//! ([`Wire`]).
//!
//! Bounds: one window timer, one linger timer and one flush at a time; the publishers
//! waiting for a flush are the room's publishes not yet durable.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::answer::{answer_subscribe, Ask};
use super::io::{Action, Input, Limits, LogInput, Published, StateAt, Subscribe, Timer, Wire};
use super::members::{Joined, Member, Members, Outgoing};
use crate::core::delivery::backlog::Reserve;
use crate::core::delivery::batch::{BatchAction, Closing};
use crate::core::delivery::seqlog::{Append, SeqLog};

/// How long a room never written to lives without a subscriber or a request.
pub const EMPTY_ROOM_LINGER: Duration = Duration::from_secs(1);

/// How long a failed flush waits before the next.
pub const FLUSH_RETRY: Duration = Duration::from_secs(1);

enum Phase<W: Wire> {
    Loading,
    /// A room never written is live too, at head 0 in the epoch its first write stores.
    Live(SeqLog<W::Event>),
    Failed(W::Error),
}

struct Waiter<R> {
    seq: u64,
    duplicate: bool,
    reply: R,
}

/// A bug planted on purpose, to show the simulation finds it (tests only).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Plant {
    #[default]
    None,
    /// A window's last event is left out.
    WindowDropsLast,
    /// An evicted subscriber is kept (and sent nothing more, nor told).
    EvictionKeeps,
}

/// One room's decisions.
pub struct RoomMachine<W: Wire> {
    wire: W,
    limits: Limits,
    phase: Phase<W>,
    members: Members<W::Sink>,
    outgoing: Outgoing<W::Event>,
    /// The epoch the last window carried, shared by the windows after it.
    window_epoch: Option<Arc<str>>,
    /// The room's latest durable state; its seq is at most the durable head.
    current: Option<StateAt>,
    /// States whose event is not durable yet, by seq.
    pending_states: VecDeque<StateAt>,
    last_active: Instant,
    stopped: bool,
    lingering: bool,
    /// Whether occupancy edges are told (not for an inbox).
    tells_occupancy: bool,
    occupied: bool,
    /// Publishers waiting for their event's flush.
    waiting: Vec<Waiter<W::Reply>>,
    /// A write is in flight ([`Action::Write`]): the publishes after it wait for it, in
    /// order, so each is written at the seq after the one before.
    writing: bool,
    to_write: VecDeque<(Arc<str>, W::Reply)>,
    flushing: bool,
    /// State writes waiting for their flush.
    putting: usize,
    actions: VecDeque<Action<W>>,
    #[cfg(test)]
    pub(crate) plant: Plant,
}

impl<W: Wire> RoomMachine<W> {
    /// A room loading its log at `now`.
    pub fn new(wire: W, limits: Limits, now: Instant) -> Self {
        RoomMachine {
            wire,
            limits,
            phase: Phase::Loading,
            members: Members::default(),
            outgoing: Outgoing::new(limits.batch_window),
            window_epoch: None,
            current: None,
            pending_states: VecDeque::new(),
            last_active: now,
            stopped: false,
            lingering: false,
            tells_occupancy: true,
            occupied: false,
            waiting: Vec::new(),
            writing: false,
            to_write: VecDeque::new(),
            flushing: false,
            putting: 0,
            actions: VecDeque::new(),
            #[cfg(test)]
            plant: Plant::None,
        }
    }

    /// Tell no occupancy edges (an inbox, or nobody listens).
    pub fn without_occupancy(mut self) -> Self {
        self.tells_occupancy = false;
        self
    }

    /// A request came at `now`: `false` when the room stopped (the caller goes back to
    /// the rooms table), else it counts as activity.
    pub fn admit(&mut self, now: Instant) -> bool {
        self.last_active = now;
        !self.stopped
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The room's log, once it is read.
    pub fn live(&self) -> Option<&SeqLog<W::Event>> {
        match &self.phase {
            Phase::Live(log) => Some(log),
            _ => None,
        }
    }

    /// The room's log, once it is read, or why not (a log shared with other nodes
    /// appends what they stored here).
    pub fn live_mut(&mut self) -> Result<&mut SeqLog<W::Event>, W::Error> {
        match &mut self.phase {
            Phase::Live(log) => Ok(log),
            Phase::Failed(why) => Err(why.clone()),
            Phase::Loading => Err(W::not_loaded()),
        }
    }

    pub fn is_loading(&self) -> bool {
        matches!(self.phase, Phase::Loading)
    }

    pub fn is_live(&self) -> bool {
        matches!(self.phase, Phase::Live(_))
    }

    pub fn is_failed(&self) -> bool {
        matches!(self.phase, Phase::Failed(_))
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The last occupancy edge told was "occupied".
    pub fn occupied(&self) -> bool {
        self.occupied
    }

    /// The durable head (0 while the room is not live).
    pub fn durable_head(&self) -> u64 {
        self.live().map_or(0, |log| log.durable())
    }

    /// The room's latest durable state.
    pub fn current(&self) -> Option<&StateAt> {
        self.current.as_ref()
    }

    pub fn members(&self) -> &Members<W::Sink> {
        &self.members
    }

    /// A room nobody ever published to (nor set a state of): nothing of it is stored.
    fn never_written(&self) -> bool {
        let empty = matches!(&self.phase, Phase::Live(log) if log.head() == 0);
        empty && self.current.is_none() && self.pending_states.is_empty()
    }

    /// The next thing to carry out.
    pub fn poll(&mut self) -> Option<Action<W>> {
        self.actions.pop_front()
    }

    pub fn handle(&mut self, input: Input<W>, now: Instant) {
        match input {
            Input::Loading => self.phase = Phase::Loading,
            Input::Loaded { log, state } => {
                self.phase = Phase::Live(log);
                self.current = state;
                self.load_changed();
            }
            Input::Failed(why) => self.phase = Phase::Failed(why),
            Input::Activity => self.last_active = now,
            Input::Subscribe(ask) => self.subscribe(ask),
            Input::Unsubscribe { conn, generation } => {
                if self.members.leave(conn, generation).is_some() {
                    self.actions.push_back(Action::Left { conn });
                    self.occupancy_check();
                }
                self.last_active = now;
                self.load_changed();
                self.linger(now);
            }
            Input::Adopt(parked) => {
                for (conn, generation, sink) in parked {
                    self.members.join(conn, Member { generation, automatic: true, sink });
                }
            }
            Input::Durable(fresh) => self.deliver(fresh, now),
            Input::State(state) => self.offer_state(state),
            Input::SkipTo(head) => {
                if let Phase::Live(log) = &mut self.phase {
                    *log = SeqLog::restore(
                        log.epoch().to_string(),
                        head,
                        Vec::new(),
                        self.limits.retention,
                    );
                }
            }
            Input::ReplayAdopted(after) => {
                let Phase::Live(log) = &self.phase else {
                    return;
                };
                let replay: Vec<W::Event> =
                    log.read(after, usize::MAX).0.into_iter().map(|e| e.payload.clone()).collect();
                if !replay.is_empty() {
                    let epoch = self.epoch();
                    for window in self.wire.cut(&epoch, replay) {
                        self.send_window(window);
                    }
                }
            }
            Input::Expire { now_ms } => {
                if let Phase::Live(log) = &mut self.phase {
                    if let Some(first_kept) = log.trim_expired(now_ms) {
                        self.actions.push_back(Action::Trim { first_kept, expired: true });
                    }
                }
            }
            Input::WindowCloses => match self.outgoing.on_timer(now) {
                Closing::Send => self.send_then_open_window(),
                Closing::Idle | Closing::Early => {}
            },
            Input::WindowWritten => {
                if let Some(until) = self.outgoing.on_sent(now) {
                    self.actions.push_back(Action::ArmTimer(Timer::Window, until));
                }
            }
            Input::SendWindowNow => self.send_pending(),
            Input::FlushRetry => self.request_flush(),
            Input::Lingered { busy } => {
                self.lingering = false;
                self.stop_if_idle(busy, now);
                self.linger(now);
            }
            Input::CheckIdle { busy } => self.stop_if_idle(busy, now),
            Input::Started => self.linger(now),
            Input::Moved => {
                if self.stopped {
                    return;
                }
                for (conn, member) in self.members.drain() {
                    self.actions.push_back(Action::Moved { conn, sink: member.sink });
                    self.actions.push_back(Action::Left { conn });
                }
                self.stopped = true;
                self.occupancy_check();
            }
            Input::Log(input) => self.log_input(input, now),
        }
    }

    /// A subscriber's connection went away: it is dropped (`keep` says which stay).
    pub fn prune(&mut self, mut keep: impl FnMut(&W::Sink) -> bool) {
        let actions = &mut self.actions;
        self.members.retain(|conn, member| {
            let kept = keep(&member.sink);
            if !kept {
                actions.push_back(Action::Left { conn });
            }
            kept
        });
        self.occupancy_check();
        self.load_changed();
    }

    fn subscribe(&mut self, ask: Subscribe<W>) {
        // A subscribe overtaken by a newer one of the same connection is void (the
        // connection sees its generation is stale and never waits for an answer).
        if self.members.admits(ask.conn, ask.generation) == Joined::Stale {
            return;
        }
        let log = match &self.phase {
            Phase::Live(log) => log,
            Phase::Failed(why) => {
                let why = why.clone();
                let (generation, sink, ticket) = (ask.generation, ask.sink, ask.ticket);
                return self.actions.push_back(Action::Refused { generation, sink, ticket, why });
            }
            Phase::Loading => {
                let (generation, sink, ticket, why) =
                    (ask.generation, ask.sink, ask.ticket, W::not_loaded());
                return self.actions.push_back(Action::Refused { generation, sink, ticket, why });
            }
        };
        let asked = Ask { since: ask.since, epoch: ask.epoch.as_deref(), state: ask.state };
        let state_seq = self.current.as_ref().map_or(0, |state| state.seq);
        let answer = answer_subscribe(log, asked, state_seq, self.limits.recovery_max_events);
        let epoch: Arc<str> = log.epoch().into();
        let state = answer.with_state.then(|| self.current.clone());
        let member =
            Member { generation: ask.generation, automatic: ask.automatic, sink: ask.sink.clone() };
        self.members.join(ask.conn, member);
        // The occupied edge goes out before the answer: a client that subscribes room after
        // room sees their webhooks queued in the order it subscribed.
        self.occupancy_check();
        let (conn, generation, sink, ticket) = (ask.conn, ask.generation, ask.sink, ask.ticket);
        self.actions.push_back(Action::Subscribed {
            conn,
            generation,
            sink,
            ticket,
            epoch,
            answer,
            state,
        });
        self.load_changed();
    }

    /// Newly durable events: the states they made durable become the room's, and they
    /// join the open window; the first one opens it (window 0: they leave at once). With
    /// nobody subscribed there is nobody to send them to: a later subscriber starts after
    /// them (or gets them in its replay).
    fn deliver(&mut self, fresh: Vec<W::Event>, now: Instant) {
        self.promote_states();
        self.load_changed();
        match self.outgoing.on_durable(fresh, !self.members.is_empty(), now) {
            BatchAction::SendNow => self.send_pending(),
            BatchAction::Send => self.send_then_open_window(),
            BatchAction::Wait => {}
        }
    }

    /// Send what waits now; the window opens once the driver reports it written.
    fn send_then_open_window(&mut self) {
        self.send_pending();
        self.actions.push_back(Action::ReportWritten);
    }

    /// Send the events waiting to every subscriber, evicting those too far behind.
    fn send_pending(&mut self) {
        #[allow(unused_mut)]
        let mut events = self.outgoing.take();
        #[cfg(test)]
        if self.plant == Plant::WindowDropsLast && events.len() > 1 {
            events.pop();
        }
        let Some(first) = events.first().cloned() else {
            return;
        };
        self.actions.push_back(Action::Batched { events: events.len(), first });
        let epoch = self.epoch();
        for window in self.wire.cut(&epoch, events) {
            self.send_window(window);
        }
        self.load_changed();
    }

    fn send_window(&mut self, window: W::Window) {
        let bytes = W::bytes(&window);
        let before = self.members.len();
        let actions = &mut self.actions;
        #[cfg(test)]
        let keeps = self.plant == Plant::EvictionKeeps;
        #[cfg(not(test))]
        let keeps = false;
        // Subscribers that went away unsubscribe, and the driver prunes any left over.
        self.members.retain(|conn, member| match W::backlog(&member.sink).reserve(bytes) {
            Reserve::Ok => {
                actions.push_back(Action::Window {
                    sink: member.sink.clone(),
                    window: window.clone(),
                });
                true
            }
            Reserve::EvictNow if keeps => true,
            Reserve::EvictNow => {
                let outstanding = W::backlog(&member.sink).outstanding();
                actions.push_back(Action::Evict { conn, sink: member.sink.clone(), outstanding });
                actions.push_back(Action::Left { conn });
                false
            }
            Reserve::Evicted => {
                actions.push_back(Action::Left { conn });
                false
            }
        });
        if self.members.len() != before {
            self.occupancy_check();
        }
    }

    /// The room's epoch for its windows, kept between windows (no allocation per window).
    fn epoch(&mut self) -> Arc<str> {
        let current = match &self.phase {
            Phase::Live(log) => log.epoch(),
            _ => "",
        };
        match &self.window_epoch {
            Some(kept) if **kept == *current => kept.clone(),
            _ => self.window_epoch.insert(current.into()).clone(),
        }
    }

    fn occupancy_check(&mut self) {
        let occupied = self.members.occupied();
        if self.tells_occupancy && occupied != self.occupied {
            self.occupied = occupied;
            self.actions.push_back(Action::Occupancy(occupied));
        }
    }

    fn load_changed(&mut self) {
        let (subscribers, head) = (self.members.len(), self.durable_head());
        self.actions.push_back(Action::Load { subscribers, head });
    }

    /// A state the log stored: the room's state once its seq is durable, unless a newer
    /// one is (the later of two at one seq wins: a second `PUT` at the same head).
    fn offer_state(&mut self, offered: StateAt) {
        if self.current.as_ref().is_some_and(|current| current.seq > offered.seq) {
            return;
        }
        let at = self.pending_states.partition_point(|p| p.seq <= offered.seq);
        self.pending_states.insert(at, offered);
        self.promote_states();
    }

    fn promote_states(&mut self) {
        let durable = self.durable_head();
        while self.pending_states.front().is_some_and(|p| p.seq <= durable) {
            let state = self.pending_states.pop_front().expect("front exists");
            if self.current.as_ref().is_none_or(|current| current.seq <= state.seq) {
                self.current = Some(state);
            }
        }
    }

    /// Stop an unwatched room with nothing pending once it has been idle for
    /// `idle_stop`, or for [`EMPTY_ROOM_LINGER`] when it was never written. Its automatic
    /// subscribers are parked.
    fn stop_if_idle(&mut self, busy: bool, now: Instant) {
        if self.stopped {
            return;
        }
        let idle = self.members.unwatched()
            && self.outgoing.is_empty()
            && !busy
            && !self.log_busy()
            && !matches!(self.phase, Phase::Loading);
        let after = if self.never_written() {
            EMPTY_ROOM_LINGER.min(self.limits.idle_stop)
        } else {
            self.limits.idle_stop
        };
        if idle && now.saturating_duration_since(self.last_active) >= after {
            let parked = self
                .members
                .drain()
                .map(|(conn, member)| (conn, member.generation, member.sink))
                .collect();
            self.actions.push_back(Action::Retire { parked, head: self.durable_head() });
            self.stopped = true;
            self.occupancy_check();
        }
    }

    /// A room that may be empty and unwatched checks again after [`EMPTY_ROOM_LINGER`]
    /// (one timer at a time) instead of waiting for the driver's tick.
    fn linger(&mut self, now: Instant) {
        let may_be_empty = self.never_written() || matches!(self.phase, Phase::Loading);
        if self.lingering || self.stopped || !may_be_empty || !self.members.unwatched() {
            return;
        }
        self.lingering = true;
        self.actions.push_back(Action::ArmTimer(Timer::Linger, now + EMPTY_ROOM_LINGER));
    }

    fn log_input(&mut self, input: LogInput<W>, now: Instant) {
        match input {
            LogInput::Publish { key, reply } if self.writing => {
                self.to_write.push_back((key, reply))
            }
            LogInput::Publish { key, reply } => {
                let log = match &self.phase {
                    Phase::Live(log) => log,
                    Phase::Failed(why) => return self.reply(reply, Err(why.clone().into())),
                    Phase::Loading => return self.reply(reply, Err(W::not_loaded().into())),
                };
                match log.seq_of(&key) {
                    Some(seq) if seq <= log.durable() => {
                        let epoch = log.epoch().into();
                        self.reply(reply, Ok(Published { seq, epoch, duplicate: true }))
                    }
                    Some(seq) => self.waiting.push(Waiter { seq, duplicate: true, reply }),
                    None => {
                        let seq = log.head() + 1;
                        self.writing = true;
                        self.actions.push_back(Action::Write { seq, key, reply });
                    }
                }
            }
            LogInput::Written { seq, key, ts_ms, payload, reply, result } => {
                self.writing = false;
                match result {
                    Ok(()) => self.append(seq, key, ts_ms, payload, reply),
                    Err(failed) => self.reply(reply, Err(failed)),
                }
                if let Some((key, reply)) = self.to_write.pop_front() {
                    self.log_input(LogInput::Publish { key, reply }, now);
                }
            }
            LogInput::Flushed { upto, result } => self.flushed(upto, result, now),
            LogInput::Put { data, reply } => {
                let log = match &self.phase {
                    Phase::Live(log) => log,
                    Phase::Failed(why) => return self.reply(reply, Err(why.clone().into())),
                    Phase::Loading => return self.reply(reply, Err(W::not_loaded().into())),
                };
                self.putting += 1;
                let state = StateAt { seq: log.head(), data };
                self.actions.push_back(Action::WriteState { state, reply });
            }
            LogInput::StateStored { state, reply, result } => {
                self.putting = self.putting.saturating_sub(1);
                let Phase::Live(log) = &self.phase else {
                    return;
                };
                let epoch: Arc<str> = log.epoch().into();
                let seq = state.seq;
                if result.is_ok() {
                    self.offer_state(state);
                }
                self.reply(reply, result.map(|()| Published { seq, epoch, duplicate: false }));
            }
        }
    }

    /// Event `seq` is written where the log keeps it: it waits for a flush.
    fn append(&mut self, seq: u64, key: Arc<str>, ts_ms: u64, payload: W::Event, reply: W::Reply) {
        let Phase::Live(log) = &mut self.phase else {
            return;
        };
        debug_assert_eq!(seq, log.head() + 1, "one write at a time");
        match log.append(key, ts_ms, |_| payload) {
            Append::Appended { seq, trimmed_below } => {
                self.waiting.push(Waiter { seq, duplicate: false, reply });
                if let Some(first_kept) = trimmed_below {
                    self.actions.push_back(Action::Trim { first_kept, expired: false });
                }
            }
            Append::Duplicate { .. } => {
                unreachable!("a key is written once: checked before the write")
            }
        }
        self.request_flush();
    }

    fn reply(&mut self, to: W::Reply, result: Result<Published, W::Failed>) {
        self.actions.push_back(Action::Reply { to, result });
    }

    /// Start a flush when events wait for one and none is running.
    fn request_flush(&mut self) {
        let Phase::Live(log) = &self.phase else {
            return;
        };
        if self.flushing || log.head() == log.durable() {
            return;
        }
        self.flushing = true;
        self.actions.push_back(Action::Flush { upto: log.head() });
    }

    fn flushed(&mut self, upto: u64, result: Result<(), W::Failed>, now: Instant) {
        self.flushing = false;
        let Phase::Live(log) = &mut self.phase else {
            return;
        };
        if let Err(failed) = result {
            for waiter in std::mem::take(&mut self.waiting) {
                self.actions
                    .push_back(Action::Reply { to: waiter.reply, result: Err(failed.clone()) });
            }
            self.actions.push_back(Action::ArmTimer(Timer::Flush, now + FLUSH_RETRY));
            return;
        }
        let fresh: Vec<W::Event> = log.mark_durable(upto).map(|e| e.payload.clone()).collect();
        let epoch: Arc<str> = log.epoch().into();
        let (done, still): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|w| w.seq <= upto);
        self.waiting = still;
        self.deliver(fresh, now);
        for waiter in done {
            let result = Ok(Published {
                seq: waiter.seq,
                epoch: epoch.clone(),
                duplicate: waiter.duplicate,
            });
            self.actions.push_back(Action::Reply { to: waiter.reply, result });
        }
        self.request_flush();
    }

    /// Whether the log has writes or flushes in flight (the room must not stop).
    pub fn log_busy(&self) -> bool {
        self.flushing
            || self.writing
            || !self.to_write.is_empty()
            || !self.waiting.is_empty()
            || self.putting > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::delivery::backlog::Backlog;
    use crate::core::rules::limits::Retention;

    /// Events are seqs, a window is one frame of 10 bytes per event.
    struct Test;

    impl Wire for Test {
        type Event = u64;
        type Window = Vec<u64>;
        type Sink = (u64, Arc<Backlog>);
        type Ticket = ();
        type Reply = &'static str;
        type Error = String;
        type Failed = String;

        fn cut(&self, _epoch: &Arc<str>, events: Vec<u64>) -> Vec<Vec<u64>> {
            vec![events]
        }
        fn bytes(window: &Vec<u64>) -> usize {
            window.len() * 10
        }
        fn backlog(sink: &(u64, Arc<Backlog>)) -> &Backlog {
            &sink.1
        }
        fn not_loaded() -> String {
            "not loaded".into()
        }
    }

    const WINDOW: Duration = Duration::from_millis(20);

    fn room(t0: Instant) -> RoomMachine<Test> {
        let retention = Retention { max_events: 100, max_age_ms: u64::MAX };
        let limits = Limits {
            retention,
            recovery_max_events: 100,
            batch_window: WINDOW,
            idle_stop: Duration::from_secs(60),
        };
        let mut room = RoomMachine::new(Test, limits, t0);
        room.handle(
            Input::Loaded {
                log: SeqLog::restore("e".into(), 0, Vec::new(), retention),
                state: None,
            },
            t0,
        );
        drain(&mut room);
        room
    }

    fn drain(room: &mut RoomMachine<Test>) -> Vec<Action<Test>> {
        std::iter::from_fn(|| room.poll()).collect()
    }

    fn subscribe(room: &mut RoomMachine<Test>, conn: u64, backlog: &Arc<Backlog>, t: Instant) {
        let sink = (conn, backlog.clone());
        let ask = Subscribe {
            conn,
            generation: 1,
            automatic: false,
            since: None,
            epoch: None,
            state: false,
            sink,
            ticket: (),
        };
        room.handle(Input::Subscribe(ask), t);
    }

    /// The room asks to write, the driver writes at once.
    fn publish(
        room: &mut RoomMachine<Test>,
        key: &str,
        reply: &'static str,
        t: Instant,
    ) -> Vec<Action<Test>> {
        room.handle(Input::Log(LogInput::Publish { key: key.into(), reply }), t);
        let mut out = Vec::new();
        for action in drain(room) {
            match action {
                Action::Write { seq, key, reply } => {
                    let written = LogInput::Written {
                        seq,
                        key,
                        ts_ms: 0,
                        payload: seq,
                        reply,
                        result: Ok(()),
                    };
                    room.handle(Input::Log(written), t);
                    out.extend(drain(room));
                }
                other => out.push(other),
            }
        }
        out
    }

    fn windows(actions: &[Action<Test>]) -> Vec<(u64, Vec<u64>)> {
        let window = |a: &Action<Test>| match a {
            Action::Window { sink, window } => Some((sink.0, window.clone())),
            _ => None,
        };
        actions.iter().filter_map(window).collect()
    }

    fn replies(actions: &[Action<Test>]) -> Vec<(&'static str, u64, bool)> {
        let reply = |a: &Action<Test>| match a {
            Action::Reply { to, result: Ok(p) } => Some((*to, p.seq, p.duplicate)),
            _ => None,
        };
        actions.iter().filter_map(reply).collect()
    }

    #[test]
    fn a_publish_is_answered_when_its_flush_returns_and_a_calm_room_sends_it_at_once() {
        let t0 = Instant::now();
        let mut room = room(t0);
        let backlog = Arc::new(Backlog::new(1000));
        subscribe(&mut room, 1, &backlog, t0);
        let answered = drain(&mut room);
        assert!(
            matches!(
                answered.as_slice(),
                [Action::Occupancy(true), Action::Subscribed { conn: 1, .. }, ..]
            ),
            "the occupied edge goes out before the answer"
        );
        let written = publish(&mut room, "a", "A", t0);
        assert!(
            matches!(written.as_slice(), [Action::Flush { upto: 1 }]),
            "one flush for the first"
        );
        assert!(
            publish(&mut room, "b", "B", t0).is_empty(),
            "a second waits for the flush running"
        );
        assert!(room.log_busy());
        room.handle(Input::Log(LogInput::Flushed { upto: 1, result: Ok(()) }), t0);
        let after = drain(&mut room);
        assert_eq!(replies(&after), vec![("A", 1, false)]);
        assert_eq!(
            windows(&after),
            vec![(1, vec![1])],
            "the room was calm: its event leaves at once"
        );
        let report = after.iter().position(|a| matches!(a, Action::ReportWritten));
        let window = after.iter().position(|a| matches!(a, Action::Window { .. }));
        assert!(report > window, "written is asked for after the fan-out: {report:?}");
        assert!(!after.iter().any(|a| matches!(a, Action::ArmTimer(Timer::Window, _))));
        assert!(
            matches!(after.last(), Some(Action::Flush { upto: 2 })),
            "the next flush takes the rest"
        );
        // The fan-out took 10 ms: the window opens from its end.
        let written = t0 + Duration::from_millis(10);
        room.handle(Input::WindowWritten, written);
        let opened = drain(&mut room);
        assert!(
            matches!(opened.as_slice(), [Action::ArmTimer(Timer::Window, at)] if *at == written + WINDOW),
            "one timer, a window after the fan-out's end"
        );
        // A repeat of a durable key is answered at once; of one in flight, with its flush.
        assert_eq!(replies(&publish(&mut room, "a", "A2", t0)), vec![("A2", 1, true)]);
        assert!(publish(&mut room, "b", "B2", t0).is_empty());
        room.handle(Input::Log(LogInput::Flushed { upto: 2, result: Ok(()) }), written);
        assert_eq!(replies(&drain(&mut room)), vec![("B", 2, false), ("B2", 2, true)]);
        room.handle(Input::WindowCloses, t0 + WINDOW);
        assert!(windows(&drain(&mut room)).is_empty(), "a timer before the window's end");
        room.handle(Input::WindowCloses, written + WINDOW);
        let closed = drain(&mut room);
        assert_eq!(windows(&closed), vec![(1, vec![2])], "what the open window gathered");
        assert!(matches!(closed.last(), Some(Action::ReportWritten)));
        let next = written + WINDOW + WINDOW;
        room.handle(Input::WindowWritten, written + WINDOW);
        assert!(drain(&mut room)
            .iter()
            .any(|a| matches!(a, Action::ArmTimer(Timer::Window, at) if *at == next)));
        room.handle(Input::WindowCloses, next);
        assert!(drain(&mut room).is_empty(), "an empty window closes without a timer");
        assert!(!room.log_busy());
    }

    #[test]
    fn publishes_taken_while_a_write_is_in_flight_are_written_after_it_in_order() {
        let t0 = Instant::now();
        let mut room = room(t0);
        for (key, reply) in [("a", "A"), ("b", "B"), ("a", "A2")] {
            room.handle(Input::Log(LogInput::Publish { key: key.into(), reply }), t0);
        }
        let mut written = Vec::new();
        while let Some(action) = room.poll() {
            if let Action::Write { seq, key, reply } = action {
                written.push((seq, reply));
                let input =
                    LogInput::Written { seq, key, ts_ms: 0, payload: seq, reply, result: Ok(()) };
                room.handle(Input::Log(input), t0);
            }
        }
        assert_eq!(written, vec![(1, "A"), (2, "B")], "the repeat of a is no write");
        room.handle(Input::Log(LogInput::Flushed { upto: 1, result: Ok(()) }), t0);
        assert_eq!(replies(&drain(&mut room)), vec![("A", 1, false), ("A2", 1, true)]);
        room.handle(Input::Log(LogInput::Flushed { upto: 2, result: Ok(()) }), t0);
        assert_eq!(replies(&drain(&mut room)), vec![("B", 2, false)]);
    }

    #[test]
    fn a_failed_flush_answers_its_publishers_and_is_tried_again() {
        let t0 = Instant::now();
        let mut room = room(t0);
        publish(&mut room, "a", "A", t0);
        room.handle(Input::Log(LogInput::Flushed { upto: 1, result: Err("disk".into()) }), t0);
        let after = drain(&mut room);
        assert!(matches!(&after[0], Action::Reply { to: "A", result: Err(why) } if why == "disk"));
        assert!(matches!(after[1], Action::ArmTimer(Timer::Flush, at) if at == t0 + FLUSH_RETRY));
        room.handle(Input::FlushRetry, t0 + FLUSH_RETRY);
        assert!(matches!(drain(&mut room).as_slice(), [Action::Flush { upto: 1 }]));
    }

    #[test]
    fn a_subscriber_over_its_bound_is_evicted_and_the_room_is_vacated() {
        let t0 = Instant::now();
        let mut room = room(t0);
        let backlog = Arc::new(Backlog::new(15));
        subscribe(&mut room, 7, &backlog, t0);
        assert!(drain(&mut room).iter().any(|a| matches!(a, Action::Occupancy(true))));
        room.handle(Input::Durable(vec![1, 2]), t0);
        room.handle(Input::WindowCloses, t0 + WINDOW);
        let after = drain(&mut room);
        assert!(after.iter().any(|a| matches!(a, Action::Evict { conn: 7, .. })));
        assert!(after.iter().any(|a| matches!(a, Action::Left { conn: 7 })));
        assert!(after.iter().any(|a| matches!(a, Action::Occupancy(false))));
        assert!(!after.iter().any(|a| matches!(a, Action::Window { .. })));
        assert!(room.members().is_empty());
    }

    #[test]
    fn a_state_is_the_rooms_once_its_event_is_durable() {
        let t0 = Instant::now();
        let mut room = room(t0);
        publish(&mut room, "a", "A", t0);
        room.handle(Input::State(StateAt { seq: 1, data: "{}".into() }), t0);
        assert!(room.current().is_none(), "its event is not durable yet");
        room.handle(Input::Log(LogInput::Flushed { upto: 1, result: Ok(()) }), t0);
        assert_eq!(room.current().map(|s| s.seq), Some(1));
    }

    #[test]
    fn a_room_never_written_stops_after_the_linger_and_parks_its_automatic_subscribers() {
        let t0 = Instant::now();
        let mut room = room(t0);
        room.handle(Input::Started, t0);
        assert!(matches!(drain(&mut room).as_slice(), [Action::ArmTimer(Timer::Linger, at)]
                if *at == t0 + EMPTY_ROOM_LINGER));
        room.handle(Input::Adopt(vec![(3, 2, (3, Arc::new(Backlog::new(10))))]), t0);
        room.handle(Input::Lingered { busy: true }, t0 + EMPTY_ROOM_LINGER);
        assert!(!room.is_stopped(), "a busy room stays");
        drain(&mut room);
        room.handle(Input::Lingered { busy: false }, t0 + EMPTY_ROOM_LINGER);
        let after = drain(&mut room);
        assert!(
            matches!(&after[0], Action::Retire { parked, head: 0 } if parked.len() == 1 && parked[0].0 == 3)
        );
        assert!(room.is_stopped());
        assert!(!room.admit(t0), "a stopped room sends requests back");
    }

    #[test]
    fn a_room_that_cannot_be_read_refuses_subscribes_and_publishes() {
        let t0 = Instant::now();
        let mut room = room(t0);
        room.handle(Input::Failed("unreadable".into()), t0);
        subscribe(&mut room, 1, &Arc::new(Backlog::new(10)), t0);
        assert!(
            matches!(drain(&mut room).as_slice(), [Action::Refused { why, .. }] if why == "unreadable")
        );
        room.handle(Input::Log(LogInput::Publish { key: "a".into(), reply: "A" }), t0);
        assert!(matches!(drain(&mut room).as_slice(), [Action::Reply { to: "A", result: Err(_) }]));
    }
}
