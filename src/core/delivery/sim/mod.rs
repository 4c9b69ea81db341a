//! A deterministic simulation of one room and its connections, made of the machines the
//! actors drive: the room's [`RoomMachine`] (its log, window, subscribers, eviction and
//! flush bookkeeping) and each connection's [`Connection`] machine (its subscriptions,
//! outbox bound and grace, close), with the direct-write decision between them. The
//! simulation is their driver ([`connection`] for a connection's side): it carries out
//! the machines' actions as the room actor, the connection actor and the link between
//! them do, with a store whose writes and flushes it controls. Mailboxes are FIFO queues,
//! time is virtual, and proptest picks the interleaving: publishes, flushes returning,
//! windows closing, subscribes with `since`, resubscribes, connections dropping and
//! clients reconnecting from the last seq they saw, readers that read and readers that do
//! not, connections whose windows rooms may write at once and ones whose are all posted,
//! and slow reads that hold subscribes.
//!
//! Checked after every step and at the end:
//! - a client gets each durable event once and in order (each event it receives is the
//!   one after the last it saw), unless an answer said `recovered:false`, after which it
//!   goes on from that answer's head;
//! - a recovery is whole: `recovered:true` is followed by every event after `since`;
//! - what rooms reserve for a connection never takes it over its outbox bound, and a
//!   connection held at or over the bound for the grace is closed;
//! - a closed connection delivers nothing more;
//! - a publish is acknowledged when the flush that made it durable returns, whatever
//!   read is in flight (a slow read never delays an acknowledgement);
//! - once everything settles, every connected client has every durable event.
//!
//! [`Connection`]: crate::core::delivery::connection::Connection

mod connection;
mod wire;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use self::connection::{Conn, Written};
use self::wire::{Request, SimWire, Update, EPOCH, EVENT_BYTES};
use crate::core::delivery::connection::Plant as ConnPlant;
use crate::core::delivery::outbox::GRACE_MS;
use crate::core::delivery::room::machine::Plant as RoomPlant;
use crate::core::delivery::room::{Action, Input, Limits, LogInput, RoomMachine, Subscribe, Timer};
use crate::core::delivery::seqlog::SeqLog;
use crate::core::delivery::testing::Ev;
use crate::core::rules::limits::Retention;

/// The client at the other end of a connection.
struct Client {
    /// The last seq the client saw (over all its connections).
    last: u64,
    conn: Option<Conn>,
    /// Reads what the node writes; a slow one never does.
    reads: bool,
    /// Rooms may write its windows at once (a WebSocket on plain TCP).
    direct: bool,
    /// Everything after this seq that the client saw came on its connection: a
    /// resubscribe from there must send none of it again.
    sent_from: u64,
    /// Since when its connection has held at least its bound, as its reader saw it.
    over_since: Option<u64>,
    /// Events delivered after its connection closed (must stay 0).
    after_close: usize,
}

/// Bugs planted in the machines (none for the proptest).
#[derive(Debug, Clone, Copy, Default)]
struct Plants {
    room: RoomPlant,
    conn: ConnPlant,
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
    plants: Plants,
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

/// A client: (does not read, rooms may write to it at once).
type Kind = (bool, bool);

impl Sim {
    fn new(
        keep: usize,
        max_recovery: u64,
        max_outbox: usize,
        window_events: usize,
        clients: &[Kind],
    ) -> Sim {
        Sim::planted(keep, max_recovery, max_outbox, window_events, clients, Plants::default())
    }

    fn planted(
        keep: usize,
        max_recovery: u64,
        max_outbox: usize,
        window_events: usize,
        clients: &[Kind],
        plants: Plants,
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
        room.plant = plants.room;
        let log = SeqLog::restore(EPOCH.into(), 0, Vec::new(), retention);
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
            plants,
        };
        for &(slow, direct) in clients {
            sim.clients.push(Client {
                last: 0,
                conn: None,
                reads: !slow,
                direct,
                sent_from: 0,
                over_since: None,
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
    fn connect(&mut self, n: usize) {
        self.next_conn += 1;
        let client = &mut self.clients[n];
        client.sent_from = client.last;
        client.over_since = None;
        let conn = Conn::open(
            self.next_conn,
            self.max_outbox,
            client.direct,
            self.plants.conn,
            client.last,
            self.now_ms,
            &mut self.room_mailbox,
        );
        client.conn = Some(conn);
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
                if let Some(conn) = client.conn.as_ref().filter(|_| client.reads) {
                    conn.read_all();
                }
            }
            Step::Resubscribe(n, back) => {
                let client = &mut self.clients[n];
                let since = client.last.saturating_sub(u64::from(back)).max(client.sent_from);
                if let Some(conn) = client.conn.as_mut().filter(|c| !c.closed) {
                    conn.resubscribe(since, self.now_ms, &mut self.room_mailbox);
                }
            }
            Step::Drop(n) => {
                if let Some(mut conn) = self.clients[n].conn.take() {
                    conn.client_left(self.now_ms, &mut self.room_mailbox);
                }
            }
            Step::Reconnect(n) => {
                if self.clients[n].conn.is_none() {
                    self.connect(n);
                }
            }
            Step::Tick(ms) => {
                self.now_ms += u64::from(ms);
                for n in 0..self.clients.len() {
                    self.with_conn(n, |conn, now_ms, room| conn.tick(now_ms, room));
                }
            }
        }
        self.readers_look();
    }

    /// Each connection's reader looks whether it may read, as it does before each frame;
    /// the simulation notes since when each has held at least its bound.
    fn readers_look(&mut self) {
        for n in 0..self.clients.len() {
            self.with_conn(n, |conn, now_ms, room| {
                if !conn.closed {
                    conn.look(now_ms, room);
                }
            });
            let (now_ms, max) = (self.now_ms, self.max_outbox);
            let client = &mut self.clients[n];
            match client.conn.as_ref().filter(|c| !c.closed && c.backlog.held() >= max) {
                Some(_) => _ = client.over_since.get_or_insert(now_ms),
                None => client.over_since = None,
            }
        }
    }

    /// Run `f` on client `n`'s connection, if it has one; a connection that stopped is gone.
    fn with_conn(&mut self, n: usize, f: impl FnOnce(&mut Conn, u64, &mut VecDeque<Request>)) {
        let Some(conn) = self.clients[n].conn.as_mut() else { return };
        f(conn, self.now_ms, &mut self.room_mailbox);
        if conn.stopped {
            self.clients[n].conn = None;
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
                    if let Some(n) = self.client_of(conn) {
                        let update = Update::Subscribed { generation, head, recovered, replay };
                        self.clients[n].conn.as_mut().unwrap().post(update);
                    }
                }
                Action::Window { sink: (conn, _), window } => {
                    if let Some(n) = self.client_of(conn) {
                        let events = self.clients[n].conn.as_mut().unwrap().window(window);
                        self.delivered(n, Written { gap_to: None, events });
                    }
                }
                Action::Evict { conn, .. } => {
                    if let Some(n) = self.client_of(conn) {
                        self.clients[n].conn.as_mut().unwrap().post(Update::SlowConsumer);
                    }
                }
                Action::ArmTimer(Timer::Window, at) => self.window_timer = Some(at),
                // The fan-out above wrote each window at this virtual instant.
                Action::ReportWritten => self.room.handle(Input::WindowWritten, now),
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

    fn client_of(&self, conn: u64) -> Option<usize> {
        self.clients.iter().position(|c| c.conn.as_ref().is_some_and(|c| c.id == conn))
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
                if self.client_of(conn).is_none() {
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

    /// The connection takes the next update off its mailbox and writes what its machine
    /// says; the client gets what is written.
    fn conn_takes(&mut self, n: usize) {
        let mut written = Written::default();
        self.with_conn(n, |conn, now_ms, room| written = conn.take(now_ms, room));
        self.delivered(n, written);
    }

    /// What a connection wrote reaches its client: each event the one after the last it saw.
    fn delivered(&mut self, n: usize, written: Written) {
        let client = &mut self.clients[n];
        let closed = client.conn.as_ref().is_none_or(|c| c.closed);
        if let Some(head) = written.gap_to {
            // The client knows it missed events: it goes on from the head.
            client.last = head;
            client.sent_from = head;
        }
        for event in &written.events {
            if closed {
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
            let Some(conn) = &client.conn else { continue };
            assert!(
                conn.backlog.outstanding() <= self.max_outbox,
                "client {n}: rooms reserved past the bound"
            );
            if let Some(since) = client.over_since {
                assert!(
                    self.now_ms - since < GRACE_MS,
                    "client {n}'s connection held its bound from {since} ms to {} ms and is open",
                    self.now_ms
                );
            }
        }
    }

    /// Let everything settle: windows close, mailboxes empty, readers read, closed
    /// connections reconnect; then every client has every durable event.
    fn settle(&mut self) {
        self.run(Step::ReadEnds);
        self.run(Step::Durable);
        for _ in 0..20 {
            self.close_window();
            while !self.room_mailbox.is_empty() {
                self.room_takes();
            }
            for n in 0..self.clients.len() {
                while self.clients[n].conn.as_ref().is_some_and(Conn::has_mail) {
                    self.conn_takes(n);
                }
                if self.clients[n].conn.as_ref().is_some_and(|c| c.closed) {
                    self.run(Step::Drop(n));
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

// The proptest, the bugs it must find when planted in the room's or the connection's
// machine, and a few cases played by hand.

type Setup = (usize, u64, usize, usize, Vec<Kind>, Vec<Step>);

fn setup() -> impl Strategy<Value = Setup> {
    (
        2usize..30,
        1u64..40,
        // Bounds of whole events too, which windows can fill to the byte.
        prop_oneof![300usize..3000, (3usize..30).prop_map(|events| events * EVENT_BYTES)],
        1usize..5,
        proptest::collection::vec(any::<Kind>(), 1..4),
        proptest::collection::vec(step(), 1..200),
    )
}

/// Run `steps` with `plants` in the machines, checking after every step.
fn play((keep, max_recovery, max_outbox, window_events, clients, steps): Setup, plants: Plants) {
    let mut sim = Sim::planted(keep, max_recovery, max_outbox, window_events, &clients, plants);
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
        play(setup, Plants::default());
    }
}

/// The smallest case proptest finds with `plants` in the machines, if any.
fn found(plants: Plants) -> Option<String> {
    let config =
        ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    match runner.run(&setup(), |setup| {
        play(setup, plants);
        Ok(())
    }) {
        Ok(()) => None,
        Err(error) => Some(error.to_string()),
    }
}

#[test]
fn a_bug_planted_in_the_rooms_window_or_eviction_is_found() {
    for room in [RoomPlant::WindowDropsLast, RoomPlant::EvictionKeeps] {
        let failure = found(Plants { room, ..Plants::default() });
        eprintln!("{room:?}: {failure:?}");
        assert!(failure.is_some(), "{room:?} went unnoticed");
    }
}

#[test]
fn a_bug_planted_in_the_connections_grace_or_direct_writes_is_found() {
    for conn in [ConnPlant::GraceNeverEnds, ConnPlant::WriteOvertakes] {
        let failure = found(Plants { conn, ..Plants::default() });
        eprintln!("{conn:?}: {failure:?}");
        assert!(failure.is_some(), "{conn:?} went unnoticed");
    }
}

#[test]
fn a_client_that_does_not_read_is_closed_after_the_grace() {
    // Its subscribe's replay (500 bytes) takes it over its 300-byte bound at once.
    let mut sim = Sim::new(100, 100, 300, 1, &[(true, false)]);
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
    // The client never answers the Close: the connection stops and leaves the room.
    sim.run(Step::Tick(5_000));
    assert!(sim.clients[0].conn.is_none());
}

#[test]
fn a_closed_connection_writes_nothing_more() {
    for direct in [false, true] {
        let mut sim = Sim::new(100, 100, 300, 1, &[(true, direct)]);
        sim.run(Step::RoomTakes);
        sim.run(Step::ConnTakes(0));
        // Two windows wait in its mailbox (or were written at once) when a large reply
        // takes it over the bound.
        sim.run(Step::Publish(2));
        sim.run(Step::Durable);
        sim.run(Step::CloseWindow);
        let conn = sim.clients[0].conn.as_ref().unwrap();
        conn.backlog.set_queued(400);
        sim.run(Step::Tick(1));
        sim.run(Step::Tick(5_000));
        assert!(sim.clients[0].conn.as_ref().unwrap().closed, "direct: {direct}");
        let last = sim.clients[0].last;
        sim.run(Step::ConnTakes(0));
        sim.run(Step::ConnTakes(0));
        sim.run(Step::Publish(1));
        sim.run(Step::Durable);
        sim.run(Step::CloseWindow);
        sim.check();
        assert_eq!(sim.clients[0].last, last, "direct: {direct}");
    }
}
