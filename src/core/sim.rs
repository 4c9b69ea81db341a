//! A deterministic simulation of one room and its connections, built from the same
//! machines the actors drive: the room's [`SeqLog`], [`answer_subscribe`], [`Members`]
//! and [`Outgoing`]; each connection's [`Subscriptions`], [`Backlog`] and [`Outbox`].
//! Mailboxes are FIFO queues, time is virtual, and proptest picks the interleaving:
//! publishes, events becoming durable, windows closing, subscribes with `since`,
//! resubscribes, connections dropping and clients reconnecting from the last seq they
//! saw, readers that read and readers that do not.
//!
//! Checked after every step and at the end:
//! - a client gets each durable event once and in order (each event it receives is the
//!   one after the last it saw), unless an answer said `recovered:false`, after which it
//!   goes on from that answer's head;
//! - a recovery is whole: `recovered:true` is followed by every event after `since`;
//! - what rooms reserve for a connection never takes it over its outbox bound, and a
//!   connection held over the bound for the grace is closed;
//! - a closed connection delivers nothing more;
//! - once everything settles, every connected client has every durable event.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::backlog::{Backlog, Reserve};
use super::batch::BatchAction;
use super::outbox::{Outbox, Verdict};
use super::room::{answer_subscribe, Ask, Joined, Member, Members, Outgoing};
use super::seqlog::{Retention, SeqLog};
use super::subscriptions::{Addressed, Answer, Subscriptions, WindowPlan};

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
    log: SeqLog<Ev>,
    members: Members<(u64, Arc<Backlog>)>,
    outgoing: Outgoing<Ev>,
    window_armed: bool,
    room_mailbox: VecDeque<Request>,
    clients: Vec<Client>,
    next_conn: u64,
    max_outbox: usize,
    max_recovery: u64,
    window_events: usize,
}

#[derive(Debug, Clone)]
enum Step {
    Publish(u8),
    Durable,
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
    fn new(keep: usize, max_recovery: u64, max_outbox: usize, window_events: usize, slow: &[bool]) -> Sim {
        let retention = Retention { max_events: keep, max_age_ms: u64::MAX };
        let mut sim = Sim {
            now_ms: 0,
            epoch_start: Instant::now(),
            log: SeqLog::restore("e1".into(), 0, Vec::new(), retention),
            members: Members::default(),
            outgoing: Outgoing::new(Duration::from_millis(20)),
            window_armed: false,
            room_mailbox: VecDeque::new(),
            clients: Vec::new(),
            next_conn: 0,
            max_outbox,
            max_recovery,
            window_events,
        };
        for &slow in slow {
            sim.clients.push(Client { last: 0, conn: None, reads: !slow, unread: 0, after_close: 0 });
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
        self.room_mailbox.push_back(Request::Subscribe { conn: conn.id, generation, since, backlog });
        self.clients[client].conn = Some(conn);
    }

    fn run(&mut self, step: Step) {
        match step {
            Step::Publish(n) => {
                for _ in 0..n {
                    let id: Arc<str> = format!("id{}", self.log.head() + 1).into();
                    self.log.append(id, self.now_ms, Ev);
                }
            }
            Step::Durable => {
                let fresh: Vec<Ev> = self.log.mark_durable(self.log.head()).map(|e| e.payload.clone()).collect();
                match self.outgoing.on_durable(fresh, !self.members.is_empty(), self.now()) {
                    BatchAction::SendNow => self.close_window(),
                    BatchAction::ArmTimer(_) => self.window_armed = true,
                    BatchAction::Wait => {}
                }
            }
            Step::CloseWindow => {
                if self.window_armed {
                    self.close_window();
                }
            }
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
                let Some(conn) = self.clients[n].conn.as_mut().filter(|c| !c.closed) else { return };
                let since = Some(last.saturating_sub(u64::from(back)).max(conn.sent_from));
                let (generation, old) = conn.subs.begin(ROOM.into(), since);
                if let Some(old) = old {
                    self.room_mailbox.push_back(Request::Unsubscribe { conn: conn.id, generation: old.generation });
                }
                let backlog = conn.backlog.clone();
                self.room_mailbox.push_back(Request::Subscribe { conn: conn.id, generation, since, backlog });
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

    fn close_window(&mut self) {
        self.window_armed = false;
        let events = self.outgoing.close();
        for window in events.chunks(self.window_events) {
            let bytes = window.len() * EVENT_BYTES;
            // Each member's update: the window, or `None` for an eviction.
            let mut sends = Vec::new();
            self.members.retain(|conn, member| match member.sink.1.reserve(bytes) {
                Reserve::Ok => {
                    sends.push((conn, Some(window.to_vec())));
                    true
                }
                Reserve::EvictNow => {
                    sends.push((conn, None));
                    false
                }
                Reserve::Evicted => false,
            });
            for (conn, window) in sends {
                let update = match window {
                    Some(events) => Update::Window(events),
                    None => Update::SlowConsumer,
                };
                if let Some(c) = self.conn_mut(conn) {
                    c.inbox.push_back(update);
                }
            }
        }
    }

    fn conn_mut(&mut self, id: u64) -> Option<&mut Conn> {
        self.clients.iter_mut().filter_map(|c| c.conn.as_mut()).find(|c| c.id == id)
    }

    fn room_takes(&mut self) {
        let Some(request) = self.room_mailbox.pop_front() else { return };
        match request {
            Request::Subscribe { conn, generation, since, backlog } => {
                if self.members.admits(conn, generation) == Joined::Stale {
                    return;
                }
                let ask = Ask { since, epoch: None, state: false };
                let answer = answer_subscribe(&self.log, ask, 0, self.max_recovery);
                if let Some(c) = self.conn_mut(conn) {
                    let update =
                        Update::Subscribed { generation, head: answer.head, recovered: answer.recovered, replay: answer.replay };
                    c.inbox.push_back(update);
                    self.members.join(conn, Member { generation, automatic: false, sink: (conn, backlog) });
                }
            }
            Request::Unsubscribe { conn, generation } => {
                self.members.leave(conn, generation);
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
                let answer = Answer { room: ROOM, generation, epoch: &epoch, head, recovered, state_seq: None, replay: &replay };
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
            assert_eq!(event.0, client.last + 1, "client {n} got {} after {}: not the next event", event.0, client.last);
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
            self.room_mailbox.push_back(Request::Unsubscribe { conn: conn.id, generation: sub.generation });
        }
    }

    fn check(&self) {
        for (n, client) in self.clients.iter().enumerate() {
            assert_eq!(client.after_close, 0, "client {n} got events after its connection closed");
            if let Some(conn) = &client.conn {
                assert!(conn.backlog.outstanding() <= self.max_outbox, "client {n}: rooms reserved past the bound");
            }
        }
    }

    /// Let everything settle: windows close, mailboxes empty, readers read, closed
    /// connections reconnect; then every client that reads has every durable event.
    fn settle(&mut self) {
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
        let head = self.log.durable();
        for (n, client) in self.clients.iter().enumerate() {
            assert_eq!(client.last, head, "client {n} is not caught up after everything settled");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn every_client_gets_every_durable_event_once_and_in_order(
        keep in 2usize..30,
        max_recovery in 1u64..40,
        max_outbox in 300usize..3000,
        window_events in 1usize..5,
        slow in proptest::collection::vec(any::<bool>(), 1..4),
        steps in proptest::collection::vec(step(), 1..200),
    ) {
        let mut sim = Sim::new(keep, max_recovery, max_outbox, window_events, &slow);
        for step in steps {
            let step = match step {
                Step::ConnTakes(n) | Step::ClientReads(n) | Step::Resubscribe(n, _) | Step::Drop(n) | Step::Reconnect(n)
                    if n >= sim.clients.len() => continue,
                step => step,
            };
            sim.run(step);
            sim.check();
        }
        sim.settle();
        sim.check();
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
