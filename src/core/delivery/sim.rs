//! A deterministic simulation of one room and its connections, built from the same
//! machines the actors drive: the room's [`RoomMachine`] (its log, window, subscribers,
//! eviction and flush bookkeeping), and each connection's [`Subscriptions`], [`Backlog`]
//! and [`Outbox`]. The simulation is the room's driver: it carries out the machine's
//! actions as the room actor does, with a store whose writes and flushes it controls.
//! Mailboxes are FIFO queues, time is virtual, and proptest picks the interleaving:
//! publishes, flushes returning, windows closing, subscribes with `since`, resubscribes,
//! connections dropping and clients reconnecting from the last seq they saw, readers
//! that read and readers that do not, and slow reads that hold subscribes.
//!
//! Checked after every step and at the end:
//! - a client gets each durable event once and in order (each event it receives is the
//!   one after the last it saw), unless an answer said `recovered:false`, after which it
//!   goes on from that answer's head;
//! - a recovery is whole: `recovered:true` is followed by every event after `since`;
//! - what rooms reserve for a connection never takes it over its outbox bound, and a
//!   connection held over the bound for the grace is closed;
//! - a closed connection delivers nothing more;
//! - a publish is acknowledged when the flush that made it durable returns, whatever
//!   read is in flight (a slow read never delays an acknowledgement);
//! - once everything settles, every connected client has every durable event.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::backlog::Backlog;
use super::outbox::{Outbox, Verdict};
use super::room::machine::Plant;
use super::room::{Action, Input, Limits, LogInput, RoomMachine, Subscribe, Wire};
use super::seqlog::SeqLog;
use super::subscriptions::{Addressed, Answer, Subscriptions, WindowPlan};
use crate::core::rules::limits::Retention;

/// Bytes of one event on the wire.
const EVENT_BYTES: usize = 100;
const ROOM: &str = "room";

#[derive(Debug, Clone, PartialEq)]
struct Ev(u64);

impl Addressed for Ev {
    fn seq(&self) -> u64 {
        self.0
    }
    fn is_for(&self, _device: &str) -> bool {
        true
    }
}

/// The room's world as the simulation makes it: windows of at most `window_events`.
struct SimWire {
    window_events: usize,
}

impl Wire for SimWire {
    type Event = Ev;
    type Window = Vec<Ev>;
    /// The connection and its backlog.
    type Sink = (u64, Arc<Backlog>);
    type Ticket = ();
    /// The publish's number.
    type Reply = u64;
    type Error = String;
    type Failed = String;

    fn cut(&self, _epoch: &Arc<str>, events: Vec<Ev>) -> Vec<Vec<Ev>> {
        events.chunks(self.window_events).map(<[Ev]>::to_vec).collect()
    }
    fn bytes(window: &Vec<Ev>) -> usize {
        window.len() * EVENT_BYTES
    }
    fn backlog(sink: &(u64, Arc<Backlog>)) -> &Backlog {
        &sink.1
    }
    fn not_loaded() -> String {
        "not loaded".into()
    }
}

/// What a room sends a connection.
enum Update {
    Subscribed { generation: u64, head: u64, recovered: Option<bool>, replay: Vec<Ev> },
    Window(Vec<Ev>),
    SlowConsumer,
}

/// What a connection sends the room.
enum Request {
    Subscribe { conn: u64, generation: u64, since: Option<u64>, backlog: Arc<Backlog> },
    Unsubscribe { conn: u64, generation: u64 },
}

/// A connection as its actor holds it, and the client at its other end.
struct Conn {
    id: u64,
    subs: Subscriptions<()>,
    backlog: Arc<Backlog>,
    outbox: Outbox,
    inbox: VecDeque<Update>,
    closed: bool,
    /// Everything after this seq that the client saw came on this connection: a
    /// resubscribe from there must send none of it again.
    sent_from: u64,
}

struct Client {
    /// The last seq the client saw (over all its connections).
    last: u64,
    conn: Option<Conn>,
    /// Reads what the node writes; a slow one never does.
    reads: bool,
    /// Bytes written to it and not read yet.
    unread: usize,
    /// Events delivered after its connection closed (must stay 0).
    after_close: usize,
}

struct Sim {
    now_ms: u64,
    epoch_start: Instant,
    room: RoomMachine<SimWire>,
    /// When the armed window timer fires, if one is armed.
    window_timer: Option<Instant>,
    /// The flush in flight (up to this seq), if any.
    flushing: Option<u64>,
    /// Publishes sent, and the step at which each was acknowledged.
    published: u64,
    acked: Vec<Option<u64>>,
    /// The publishes the last returned flush made durable must be acknowledged by now.
    flushed_upto: u64,
    /// A read is in flight: subscribes wait for it (held, as the room actor holds them).
    reading: bool,
    held: VecDeque<Request>,
    room_mailbox: VecDeque<Request>,
    clients: Vec<Client>,
    next_conn: u64,
    max_outbox: usize,
    /// Steps run (the time an acknowledgement is read at).
    steps: u64,
}

#[derive(Debug, Clone)]
enum Step {
    Publish(u8),
    /// The flush in flight returns.
    Durable,
    /// A slow read starts (subscribes are held until it ends), or ends.
    ReadStarts,
    ReadEnds,
    CloseWindow,
    RoomTakes,
    ConnTakes(usize),
    ClientReads(usize),
    /// Subscribe again from this many events before the last one seen.
    Resubscribe(usize, u8),
    Drop(usize),
    Reconnect(usize),
    Tick(u16),
}

fn step() -> impl Strategy<Value = Step> {
    let client = 0usize..4;
    prop_oneof![
        3 => (1u8..4).prop_map(Step::Publish),
        3 => Just(Step::Durable),
        1 => Just(Step::ReadStarts),
        1 => Just(Step::ReadEnds),
        2 => Just(Step::CloseWindow),
        4 => Just(Step::RoomTakes),
        5 => client.clone().prop_map(Step::ConnTakes),
        3 => client.clone().prop_map(Step::ClientReads),
        2 => (client.clone(), 0u8..4).prop_map(|(n, back)| Step::Resubscribe(n, back)),
        1 => client.clone().prop_map(Step::Drop),
        2 => client.clone().prop_map(Step::Reconnect),
        1 => (0u16..3000).prop_map(Step::Tick),
    ]
}

impl Sim {
    fn new(
        keep: usize,
        max_recovery: u64,
        max_outbox: usize,
        window_events: usize,
        slow: &[bool],
    ) -> Sim {
        Sim::planted(keep, max_recovery, max_outbox, window_events, slow, Plant::None)
    }

    fn planted(
        keep: usize,
        max_recovery: u64,
        max_outbox: usize,
        window_events: usize,
        slow: &[bool],
        plant: Plant,
    ) -> Sim {
        let retention = Retention { max_events: keep, max_age_ms: u64::MAX };
        let limits = Limits {
            retention,
            recovery_max_events: max_recovery,
            batch_window: Duration::from_millis(20),
            idle_stop: Duration::from_secs(3600),
        };
        let epoch_start = Instant::now();
        let mut room = RoomMachine::new(SimWire { window_events }, limits, epoch_start);
        room.plant = plant;
        let log = SeqLog::restore("e1".into(), 0, Vec::new(), retention);
        room.handle(Input::Loaded { log, state: None }, epoch_start);
        let mut sim = Sim {
            now_ms: 0,
            epoch_start,
            room,
            window_timer: None,
            flushing: None,
            published: 0,
            acked: Vec::new(),
            flushed_upto: 0,
            reading: false,
            held: VecDeque::new(),
            room_mailbox: VecDeque::new(),
            clients: Vec::new(),
            next_conn: 0,
            steps: 0,
            max_outbox,
        };
        for &slow in slow {
            sim.clients.push(Client {
                last: 0,
                conn: None,
                reads: !slow,
                unread: 0,
                after_close: 0,
            });
            let n = sim.clients.len() - 1;
            sim.connect(n);
        }
        sim
    }

    fn now(&self) -> Instant {
        self.epoch_start + Duration::from_millis(self.now_ms)
    }

    /// The client connects and subscribes from the last seq it saw.
    fn connect(&mut self, client: usize) {
        self.next_conn += 1;
        let backlog = Arc::new(Backlog::new(self.max_outbox));
        let mut conn = Conn {
            id: self.next_conn,
            subs: Subscriptions::new("inbox".into(), "device".into(), 10),
            backlog: backlog.clone(),
            outbox: Outbox::new(self.max_outbox, super::outbox::GRACE_MS),
            inbox: VecDeque::new(),
            closed: false,
            sent_from: self.clients[client].last,
        };
        let since = Some(self.clients[client].last);
        let (generation, _) = conn.subs.begin(ROOM.into(), since);
        self.room_mailbox.push_back(Request::Subscribe {
            conn: conn.id,
            generation,
            since,
            backlog,
        });
        self.clients[client].conn = Some(conn);
    }

    fn run(&mut self, step: Step) {
        self.steps += 1;
        match step {
            Step::Publish(n) => {
                for _ in 0..n {
                    self.published += 1;
                    self.acked.push(None);
                    let key: Arc<str> = format!("id{}", self.published).into();
                    self.input(Input::Log(LogInput::Publish { key, reply: self.published }));
                }
            }
            Step::Durable => {
                // The flush returns; the one the room asks for next (the publishes that
                // came meanwhile) returns too.
                while let Some(upto) = self.flushing.take() {
                    self.flushed_upto = upto;
                    self.input(Input::Log(LogInput::Flushed { upto, result: Ok(()) }));
                }
            }
            Step::ReadStarts => self.reading = true,
            Step::ReadEnds => {
                self.reading = false;
                while let Some(request) = self.held.pop_front() {
                    self.room_takes_request(request);
                }
            }
            Step::CloseWindow => self.close_window(),
            Step::RoomTakes => self.room_takes(),
            Step::ConnTakes(n) => self.conn_takes(n),
            Step::ClientReads(n) => {
                let client = &mut self.clients[n];
                if client.reads {
                    client.unread = 0;
                    if let Some(conn) = &client.conn {
                        conn.backlog.set_queued(0);
                    }
                }
            }
            Step::Resubscribe(n, back) => {
                let last = self.clients[n].last;
                let Some(conn) = self.clients[n].conn.as_mut().filter(|c| !c.closed) else {
                    return;
                };
                let since = Some(last.saturating_sub(u64::from(back)).max(conn.sent_from));
                let (generation, old) = conn.subs.begin(ROOM.into(), since);
                if let Some(old) = old {
                    self.room_mailbox.push_back(Request::Unsubscribe {
                        conn: conn.id,
                        generation: old.generation,
                    });
                }
                let backlog = conn.backlog.clone();
                self.room_mailbox.push_back(Request::Subscribe {
                    conn: conn.id,
                    generation,
                    since,
                    backlog,
                });
            }
            Step::Drop(n) => self.drop_conn(n),
            Step::Reconnect(n) => {
                if self.clients[n].conn.is_none() {
                    self.clients[n].unread = 0;
                    self.connect(n);
                }
            }
            Step::Tick(ms) => {
                self.now_ms += u64::from(ms);
                for n in 0..self.clients.len() {
                    self.check_outbox(n);
                }
            }
        }
    }

    /// The window's timer fires: the clock moves on to its instant if it is not there yet.
    fn close_window(&mut self) {
        let Some(at) = self.window_timer.take() else { return };
        let due = at.saturating_duration_since(self.epoch_start).as_millis() as u64;
        self.now_ms = self.now_ms.max(due);
        self.input(Input::WindowCloses);
    }

    /// Tell the room's machine, and carry out what it decides (the room actor's drive).
    fn input(&mut self, input: Input<SimWire>) {
        let now = self.now();
        self.room.handle(input, now);
        while let Some(action) = self.room.poll() {
            match action {
                Action::Subscribed { conn, generation, answer, .. } => {
                    let (head, recovered, replay) = (answer.head, answer.recovered, answer.replay);
                    if let Some(c) = self.conn_mut(conn) {
                        c.inbox.push_back(Update::Subscribed {
                            generation,
                            head,
                            recovered,
                            replay,
                        });
                    }
                }
                Action::Window { sink: (conn, _), window } => {
                    if let Some(c) = self.conn_mut(conn) {
                        c.inbox.push_back(Update::Window(window));
                    }
                }
                Action::Evict { conn, .. } => {
                    if let Some(c) = self.conn_mut(conn) {
                        c.inbox.push_back(Update::SlowConsumer);
                    }
                }
                Action::ArmTimer(super::room::Timer::Window, at) => self.window_timer = Some(at),
                Action::Write { seq, key, reply } => {
                    let ts_ms = self.now_ms;
                    let written = LogInput::Written {
                        seq,
                        key,
                        ts_ms,
                        payload: Ev(seq),
                        reply,
                        result: Ok(()),
                    };
                    self.room.handle(Input::Log(written), now);
                }
                Action::Flush { upto } => {
                    assert!(self.flushing.is_none(), "one flush at a time");
                    self.flushing = Some(upto);
                }
                Action::Reply { to, result } => {
                    let published = result.expect("the simulated store never fails");
                    assert!(
                        published.seq <= self.flushed_upto,
                        "publish {to} acknowledged before its flush returned"
                    );
                    self.acked[to as usize - 1] = Some(self.steps);
                }
                Action::Refused { .. } | Action::WriteState { .. } | Action::Retire { .. } => {
                    unreachable!("the simulated room is live, has no states and never idles")
                }
                Action::ArmTimer(..)
                | Action::Left { .. }
                | Action::Moved { .. }
                | Action::Batched { .. }
                | Action::Occupancy(_)
                | Action::Load { .. }
                | Action::Trim { .. } => {}
            }
        }
    }

    fn conn_mut(&mut self, id: u64) -> Option<&mut Conn> {
        self.clients.iter_mut().filter_map(|c| c.conn.as_mut()).find(|c| c.id == id)
    }

    fn room_takes(&mut self) {
        let Some(request) = self.room_mailbox.pop_front() else { return };
        match request {
            // A read in flight holds subscribes (the room actor's holds), not the room.
            request @ Request::Subscribe { .. } if self.reading => self.held.push_back(request),
            request => self.room_takes_request(request),
        }
    }

    fn room_takes_request(&mut self, request: Request) {
        match request {
            Request::Subscribe { conn, generation, since, backlog } => {
                if self.conn_mut(conn).is_none() {
                    // The connection is gone: its unsubscribe is on its way.
                    return;
                }
                let sink = (conn, backlog);
                let ask = Subscribe {
                    conn,
                    generation,
                    automatic: false,
                    since,
                    epoch: None,
                    state: false,
                    sink,
                    ticket: (),
                };
                self.input(Input::Subscribe(ask));
            }
            Request::Unsubscribe { conn, generation } => {
                // A subscribe held for a read and left before it ended is dropped.
                let left = |held: &Request| matches!(held, Request::Subscribe { conn: c, generation: g, .. } if *c == conn && *g <= generation);
                self.held.retain(|held| !left(held));
                self.input(Input::Unsubscribe { conn, generation });
            }
        }
    }

    /// The connection takes the next update off its mailbox and writes what its
    /// subscriptions say; the client gets what is written.
    fn conn_takes(&mut self, n: usize) {
        let client = &mut self.clients[n];
        let Some(conn) = client.conn.as_mut() else { return };
        let Some(update) = conn.inbox.pop_front() else { return };
        let epoch: Arc<str> = "e1".into();
        let delivered: Vec<Ev> = match update {
            Update::Window(events) => {
                conn.backlog.release(events.len() * EVENT_BYTES);
                match conn.subs.on_window(ROOM, &epoch, &events, false) {
                    WindowPlan::Nothing => Vec::new(),
                    WindowPlan::Shared => events,
                    WindowPlan::Own(events) => events,
                }
            }
            Update::Subscribed { generation, head, recovered, replay } => {
                let answer = Answer {
                    room: ROOM,
                    generation,
                    epoch: &epoch,
                    head,
                    recovered,
                    state_seq: None,
                    replay: &replay,
                };
                match conn.subs.on_subscribed(answer) {
                    None => Vec::new(),
                    Some(answered) => {
                        if recovered == Some(false) {
                            // The client knows it missed events: it goes on from the head.
                            client.last = head;
                            conn.sent_from = head;
                        }
                        answered.fresh
                    }
                }
            }
            Update::SlowConsumer => {
                conn.backlog.evict();
                conn.subs.close();
                conn.closed = true;
                Vec::new()
            }
        };
        for event in &delivered {
            if conn.closed {
                client.after_close += 1;
            }
            assert_eq!(
                event.0,
                client.last + 1,
                "client {n} got {} after {}: not the next event",
                event.0,
                client.last
            );
            client.last = event.0;
        }
        client.unread += delivered.len() * EVENT_BYTES;
        conn.backlog.set_queued(client.unread);
        self.check_outbox(n);
    }

    /// The connection looks at what it holds: over its bound for the grace, it closes.
    fn check_outbox(&mut self, n: usize) {
        let now_ms = self.now_ms;
        let Some(conn) = self.clients[n].conn.as_mut().filter(|c| !c.closed) else { return };
        if conn.outbox.observe(conn.backlog.held(), now_ms) == Verdict::Close {
            conn.backlog.evict();
            conn.subs.close();
            conn.closed = true;
        }
    }

    /// The connection ends (the client went away, or it was closed): it leaves the room.
    fn drop_conn(&mut self, n: usize) {
        let Some(mut conn) = self.clients[n].conn.take() else { return };
        for (_, sub) in conn.subs.drain() {
            self.room_mailbox
                .push_back(Request::Unsubscribe { conn: conn.id, generation: sub.generation });
        }
    }

    fn check(&self) {
        for (n, acked) in self.acked.iter().enumerate() {
            let durable = (n as u64) < self.flushed_upto;
            assert_eq!(
                acked.is_some(),
                durable,
                "publish {} is durable but not acknowledged, or the reverse",
                n + 1
            );
        }
        for (n, client) in self.clients.iter().enumerate() {
            assert_eq!(client.after_close, 0, "client {n} got events after its connection closed");
            if let Some(conn) = &client.conn {
                assert!(
                    conn.backlog.outstanding() <= self.max_outbox,
                    "client {n}: rooms reserved past the bound"
                );
            }
        }
    }

    /// Let everything settle: windows close, mailboxes empty, readers read, closed
    /// connections reconnect; then every client that reads has every durable event.
    fn settle(&mut self) {
        self.run(Step::ReadEnds);
        self.run(Step::Durable);
        for _ in 0..20 {
            self.close_window();
            while !self.room_mailbox.is_empty() {
                self.room_takes();
            }
            for n in 0..self.clients.len() {
                while self.clients[n].conn.as_ref().is_some_and(|c| !c.inbox.is_empty()) {
                    self.conn_takes(n);
                }
                if self.clients[n].conn.as_ref().is_some_and(|c| c.closed) {
                    self.drop_conn(n);
                }
                if self.clients[n].conn.is_none() {
                    self.clients[n].reads = true;
                    self.connect(n);
                }
                self.run(Step::ClientReads(n));
            }
        }
        let head = self.room.durable_head();
        assert_eq!(head, self.published, "every publish is durable once flushed");
        for (n, client) in self.clients.iter().enumerate() {
            assert_eq!(client.last, head, "client {n} is not caught up after everything settled");
        }
    }
}

type Setup = (usize, u64, usize, usize, Vec<bool>, Vec<Step>);

fn setup() -> impl Strategy<Value = Setup> {
    (
        2usize..30,
        1u64..40,
        300usize..3000,
        1usize..5,
        proptest::collection::vec(any::<bool>(), 1..4),
        proptest::collection::vec(step(), 1..200),
    )
}

/// Run `steps` against a room with `plant` in its machine, checking after every step.
fn play((keep, max_recovery, max_outbox, window_events, slow, steps): Setup, plant: Plant) {
    let mut sim = Sim::planted(keep, max_recovery, max_outbox, window_events, &slow, plant);
    for step in steps {
        let step = match step {
            Step::ConnTakes(n)
            | Step::ClientReads(n)
            | Step::Resubscribe(n, _)
            | Step::Drop(n)
            | Step::Reconnect(n)
                if n >= sim.clients.len() =>
            {
                continue
            }
            step => step,
        };
        sim.run(step);
        sim.check();
    }
    sim.settle();
    sim.check();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn every_client_gets_every_durable_event_once_and_in_order(setup in setup()) {
        play(setup, Plant::None);
    }
}

/// The smallest case proptest finds with `plant` in the room's machine, if any.
fn found(plant: Plant) -> Option<String> {
    let config =
        ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    match runner.run(&setup(), |setup| {
        play(setup, plant);
        Ok(())
    }) {
        Ok(()) => None,
        Err(error) => Some(error.to_string()),
    }
}

#[test]
fn a_bug_planted_in_the_rooms_window_or_eviction_is_found() {
    for plant in [Plant::WindowDropsLast, Plant::EvictionKeeps] {
        let failure = found(plant);
        eprintln!("{plant:?}: {failure:?}");
        assert!(failure.is_some(), "{plant:?} went unnoticed");
    }
}

#[test]
fn a_client_that_does_not_read_is_closed_after_the_grace() {
    // Its subscribe's replay (500 bytes) takes it over its 300-byte bound at once.
    let mut sim = Sim::new(100, 100, 300, 1, &[true]);
    sim.run(Step::Publish(5));
    sim.run(Step::Durable);
    sim.run(Step::RoomTakes);
    sim.run(Step::ConnTakes(0));
    let conn = sim.clients[0].conn.as_ref().unwrap();
    assert!(!conn.closed, "over the bound, but within the grace");
    assert_eq!(conn.backlog.held(), 500);
    sim.run(Step::Tick(4_999));
    assert!(!sim.clients[0].conn.as_ref().unwrap().closed);
    sim.run(Step::Tick(1));
    assert!(sim.clients[0].conn.as_ref().unwrap().closed);
    sim.run(Step::Publish(1));
    sim.run(Step::Durable);
    sim.run(Step::CloseWindow);
    sim.run(Step::ConnTakes(0));
    sim.check();
    assert_eq!(sim.clients[0].last, 5);
}

#[test]
fn a_closed_connection_writes_nothing_more() {
    let mut sim = Sim::new(100, 100, 300, 1, &[true]);
    sim.run(Step::RoomTakes);
    sim.run(Step::ConnTakes(0));
    // Two windows wait in its mailbox when a large reply takes it over the bound.
    sim.run(Step::Publish(2));
    sim.run(Step::Durable);
    sim.run(Step::CloseWindow);
    sim.clients[0].unread = 400;
    sim.clients[0].conn.as_ref().unwrap().backlog.set_queued(400);
    sim.run(Step::Tick(1));
    sim.run(Step::Tick(5_000));
    assert!(sim.clients[0].conn.as_ref().unwrap().closed);
    sim.run(Step::ConnTakes(0));
    sim.run(Step::ConnTakes(0));
    sim.check();
    assert_eq!(sim.clients[0].last, 0);
}
