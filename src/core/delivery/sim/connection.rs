//! One simulated connection: the real connection machine ([`Connection`]) and what its
//! actor keeps beside it (the backlog rooms reserve in, the mailbox of the updates rooms
//! posted, the timers it armed), driven as `actors::connection` and `actors::link` drive
//! it: a room's window is routed by the machine on the room's side (written at once, or
//! posted behind what waits), updates are taken off the mailbox one at a time, the reader
//! looks whether it may read, and the machine's actions are carried out in order.

use std::collections::VecDeque;
use std::sync::Arc;

use super::wire::{Request, Update, EPOCH, EVENT_BYTES, ROOM};
use crate::core::delivery::backlog::Backlog;
use crate::core::delivery::connection::{
    Action, Ask, Connection, Grants, Plant, Route, Settings, Timer,
};
use crate::core::delivery::subscriptions::{Answer, WindowPlan};
use crate::core::delivery::testing::Ev;

/// What a connection wrote to its client in one step.
#[derive(Default)]
pub struct Written {
    /// An answer said `recovered:false` with this head: the client goes on from there.
    pub gap_to: Option<u64>,
    pub events: Vec<Ev>,
}

pub struct Conn {
    pub id: u64,
    machine: Connection<()>,
    pub backlog: Arc<Backlog>,
    inbox: VecDeque<Update>,
    /// Armed timers and when they fire (ms).
    timers: Vec<(Timer, u64)>,
    /// Its Close went out: nothing may reach the client after it.
    pub closed: bool,
    /// It stopped (and left the room).
    pub stopped: bool,
}

fn ask(since: Option<u64>) -> Ask {
    Ask { room: ROOM.into(), since, epoch: None, state: false, presence: false, reference: None }
}

impl Conn {
    /// A connection opened at `now_ms` that subscribes to the room from `since`; its
    /// requests go to `room`.
    pub fn open(
        id: u64,
        max_outbox: usize,
        direct: bool,
        plant: Plant,
        since: u64,
        now_ms: u64,
        room: &mut VecDeque<Request>,
    ) -> Conn {
        let settings = Settings {
            max_subscriptions: 10,
            max_outbox_bytes: max_outbox,
            max_messages_per_sec: 0,
            max_bad_messages: 100,
            max_room_starts_per_sec: 0,
            max_history_limit: 100,
            heartbeat_ms: 60_000,
            subscribe_timeout_ms: None,
            close_handshake_ms: 5_000,
            reads: true,
            direct,
        };
        let grants = Grants {
            user: format!("u{id}").into(),
            device: "device".into(),
            rooms: Vec::new(),
            publish: Vec::new(),
        };
        let mut machine = Connection::new(grants, settings, now_ms);
        machine.plant = plant;
        let mut conn = Conn {
            id,
            machine,
            backlog: Arc::new(Backlog::new(max_outbox)),
            inbox: VecDeque::new(),
            timers: Vec::new(),
            closed: false,
            stopped: false,
        };
        conn.machine.start(Vec::new(), now_ms);
        conn.machine.subscribe(ask(Some(since)), true, now_ms);
        conn.act(now_ms, room);
        conn
    }

    pub fn has_mail(&self) -> bool {
        !self.inbox.is_empty()
    }

    /// Carry out what the machine asks for, in order.
    fn act(&mut self, now_ms: u64, room: &mut VecDeque<Request>) {
        while let Some(action) = self.machine.poll() {
            match action {
                Action::Subscribe { generation, ask } => room.push_back(Request::Subscribe {
                    conn: self.id,
                    generation,
                    since: ask.since,
                    backlog: self.backlog.clone(),
                }),
                // The automatic inbox has no room here.
                Action::Leave { room: left, generation, .. } if &*left == ROOM => {
                    room.push_back(Request::Unsubscribe { conn: self.id, generation })
                }
                Action::Evict { .. } => {
                    self.backlog.evict();
                }
                Action::Close(_) => self.closed = true,
                Action::Arm { timer, after_ms } => self.timers.push((timer, now_ms + after_ms)),
                Action::Stop => {
                    self.stopped = true;
                    self.machine.stopped();
                }
                Action::Leave { .. }
                | Action::SubscribeInbox { .. }
                | Action::Subscriptions(_)
                | Action::LimitHit(_)
                | Action::WakeReader => {}
                other => panic!("connection {} asked for {other:?}", self.id),
            }
        }
    }

    /// Subscribe again from `since` (the old generation is left).
    pub fn resubscribe(&mut self, since: u64, now_ms: u64, room: &mut VecDeque<Request>) {
        self.machine.subscribe(ask(Some(since)), true, now_ms);
        self.act(now_ms, room);
    }

    /// A room posts an update to the mailbox.
    pub fn post(&mut self, update: Update) {
        self.inbox.push_back(update);
    }

    /// A room's window, on the room's side (`actors::link`): the machine writes it now
    /// (what it wrote is returned) or it is posted behind what waits in the mailbox.
    pub fn window(&mut self, window: Vec<Ev>) -> Vec<Ev> {
        let epoch: Arc<str> = EPOCH.into();
        let bytes = window.len() * EVENT_BYTES;
        match self.machine.route_window(self.inbox.len(), ROOM, &epoch, &window, false) {
            Route::Write(plan) => {
                let written = planned(plan, window);
                self.queue(&written);
                self.backlog.release(bytes);
                written
            }
            Route::Post => {
                self.post(Update::Window(window));
                Vec::new()
            }
        }
    }

    /// Take the next update off the mailbox and write what the machine says.
    pub fn take(&mut self, now_ms: u64, room: &mut VecDeque<Request>) -> Written {
        let Some(update) = self.inbox.pop_front() else { return Written::default() };
        let epoch: Arc<str> = EPOCH.into();
        if let Update::Window(events) = &update {
            self.backlog.release(events.len() * EVENT_BYTES);
        }
        if self.machine.is_closing() {
            return Written::default();
        }
        let mut written = Written::default();
        match update {
            Update::Window(events) => {
                let plan = self.machine.on_window(ROOM, &epoch, &events, false);
                written.events = planned(plan, events);
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
                if let Some(answered) = self.machine.on_subscribed(answer) {
                    written.gap_to = (recovered == Some(false)).then_some(head);
                    written.events = answered.fresh;
                }
            }
            Update::SlowConsumer => {
                self.machine.slow_consumer();
                self.act(now_ms, room);
            }
        }
        self.queue(&written.events);
        self.machine.wrote(self.backlog.held(), || now_ms);
        self.act(now_ms, room);
        written
    }

    /// What was written waits in the socket until the client reads it.
    fn queue(&self, events: &[Ev]) {
        let queued = self.backlog.held() - self.backlog.outstanding();
        self.backlog.set_queued(queued + events.len() * EVENT_BYTES);
    }

    /// The client read everything written to it.
    pub fn read_all(&self) {
        self.backlog.set_queued(0);
    }

    /// The reader looks whether it may read (before each frame it would read).
    pub fn look(&mut self, now_ms: u64, room: &mut VecDeque<Request>) {
        self.machine.may_read(self.backlog.held(), || now_ms);
        self.act(now_ms, room);
    }

    /// The timers due by `now_ms` fire.
    pub fn tick(&mut self, now_ms: u64, room: &mut VecDeque<Request>) {
        let (due, later) = self.timers.drain(..).partition(|(_, at)| *at <= now_ms);
        self.timers = later;
        for (timer, _) in due {
            self.machine.on_timer(timer, self.backlog.held(), now_ms);
            self.act(now_ms, room);
        }
    }

    /// The client went away: its Close came in and the connection stops.
    pub fn client_left(&mut self, now_ms: u64, room: &mut VecDeque<Request>) {
        self.machine.client_closed();
        self.machine.stopped();
        self.stopped = true;
        self.act(now_ms, room);
    }
}

/// The events a window's plan writes.
fn planned(plan: WindowPlan<Ev>, window: Vec<Ev>) -> Vec<Ev> {
    match plan {
        WindowPlan::Nothing => Vec::new(),
        WindowPlan::Shared => window,
        WindowPlan::Own(events) => events,
    }
}
