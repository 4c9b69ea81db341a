//! One actor per live room: the room's [`SeqLog`], its subscribers, recovery, history
//! reads, the batching window and idling. Durable events gather in the room's window;
//! when it closes, its frame is rendered once and the same bytes go to every subscriber.
//!
//! Where the room's events are kept is the room's [`Log`], made by the [`RoomLogs`] the
//! wiring chose at start-up — the embedded store ([`local`]) or the room's JetStream
//! subject in cluster mode ([`stream`]). What every log does is [`RoomLog`]; what only a
//! log shared with other nodes does (their events, a subscribe held while the stream is
//! away) is [`SharedLog`], reached through [`Log::shared`]. A log decides when an event
//! is durable and hands it to the room ([`RoomCore::deliver`]), and changes the room only
//! through [`RoomCore`]'s methods; subscribers, recovery and batching are the same in both
//! modes.
//!
//! A room also keeps its state in memory: the latest state whose event is
//! durable, read once with the room. A `state:true` subscribe gets it and the retained
//! events after its seq, on the same ordered channel as a replay; nothing is read from
//! the store for it and the log is never replayed to build it.

mod load;
mod local;
mod occupancy;
mod presence;
mod stream;

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

pub use self::load::RoomLoad;
pub use self::local::LocalRoomLogs;
pub use self::occupancy::{DelayedVacate, Occupancy};
pub use self::presence::PresenceHub;
pub use self::stream::StreamRoomLogs;
use super::messages::*;
use crate::cluster::roomlog::{LiveItem, StreamEvent};
use crate::core::backlog::Backlog;
use crate::core::holds::{Holds, Released, RoomNow, Until, AHEAD_WAIT};
use crate::core::names;
use crate::core::room::{self, seen_beyond_head, Action, Ask, Input, Limits, RoomMachine, Timer, Wire};
use crate::core::seqlog::{Retention, SeqLog};
use crate::protocol;
use crate::store::EventRecord;
use crate::world::now_ms;

/// A room's limits: shared by every room, but for what its namespace sets
/// ([`RoomSettings::with_options`]).
#[derive(Clone)]
pub struct RoomSettings {
    pub metrics: Arc<crate::metrics::Metrics>,
    pub retention: Retention,
    pub recovery_max_events: u64,
    /// A room with no subscribers and nothing pending stops after this long.
    pub idle_stop: Duration,
    /// How often a room trims expired history and checks whether it is idle.
    pub tick: Duration,
    /// How long durable events gather before they leave as one frame (0: every flush).
    pub batch_window: Duration,
    /// Whether the room keeps presence (its namespace's `presence`, default true).
    pub presence: bool,
    /// The node's presence: interval, members bound, other nodes' tables.
    pub presence_hub: Arc<PresenceHub>,
    /// Told of the room's local occupancy edges (webhooks); `None` when nobody listens.
    pub occupancy: Option<Arc<dyn Occupancy>>,
}

impl RoomSettings {
    /// These settings with `options` (the room's namespace) for retention, window and
    /// presence.
    pub fn with_options(&self, options: &crate::core::namespaces::RoomOptions) -> RoomSettings {
        RoomSettings {
            retention: options.retention(),
            batch_window: options.batch_window(),
            presence: options.presence,
            ..self.clone()
        }
    }
}

/// Makes each room's log; one implementation per backend, chosen once at start-up.
pub trait RoomLogs: Send + Sync + 'static {
    fn open(&self, room: &Arc<str>) -> Log;

    /// Watch `room`, an inbox whose subscribers are parked (no actor), for what other
    /// nodes store: `wake(after)` when an event after seq `after` arrives, and for what
    /// was stored after `head` (what the parked subscribers were sent) before the watch
    /// began. `None` on a single node, where every write goes through the room's actor.
    fn watch_parked(&self, _room: &Arc<str>, _head: Option<u64>, _wake: Box<dyn Fn(u64)>) -> Option<ParkedWatch> {
        None
    }
}

/// A parked inbox's watch ([`RoomLogs::watch_parked`]): its task ends when this is dropped.
pub struct ParkedWatch {
    task: tokio::task::AbortHandle,
    /// Resolves once the watch is subscribed (taken by the first to wait for it).
    ready: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl ParkedWatch {
    pub fn new(task: tokio::task::AbortHandle, ready: tokio::sync::oneshot::Receiver<()>) -> Self {
        ParkedWatch { task, ready: Some(ready) }
    }

    /// What to await until the watch is subscribed (once).
    pub fn ready(&mut self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.ready.take()
    }
}

impl Drop for ParkedWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One room's log. An enum rather than a trait object: each kind's asynchronous work
/// comes back to its own type ([`LogPart`]), and only the stream answers [`Log::shared`].
pub enum Log {
    Local(Box<local::LocalLog>),
    Stream(Box<stream::StreamLog>),
}

impl Log {
    /// What every log does.
    fn common(&mut self) -> &mut dyn RoomLog {
        match self {
            Log::Local(local) => local.as_mut(),
            Log::Stream(stream) => stream.as_mut(),
        }
    }

    /// What only a log shared with other nodes does (`None` on a single node).
    fn shared(&mut self) -> Option<&mut dyn SharedLog> {
        match self {
            Log::Local(_) => None,
            Log::Stream(stream) => Some(stream.as_mut()),
        }
    }
}

/// Where one room's events are kept, as the room actor needs it. It tells the room's
/// machine what the log did ([`RoomCore::input`]); its asynchronous work comes back
/// through [`spawn_then`] and [`later`], and the room's mailbox is never held meanwhile.
pub trait RoomLog {
    /// Read the room's log (a log that reads asynchronously keeps the room loading:
    /// requests that need the log are held meanwhile).
    fn load(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>);
    /// Store a publish and answer it once it is durable (a known id is a duplicate).
    fn publish(&mut self, room: &mut RoomCore, msg: Publish, ctx: &mut Context<RoomActor>);
    /// Store the room's state as of its head and answer once it is durable.
    fn put_state(&mut self, room: &mut RoomCore, msg: PutState, ctx: &mut Context<RoomActor>);
    /// The room's log dropped its events below `first_kept`, by age (`expired`) or size.
    fn trimmed(&mut self, room: &RoomCore, first_kept: u64, expired: bool);
    /// Carry out a write or flush the room's machine asked for.
    fn carry_out(&mut self, room: &mut RoomCore, action: Action<Frames>, ctx: &mut Context<RoomActor>);
    /// Whether requests still wait on the log beyond what the room's machine knows.
    fn busy(&self) -> bool;
}

/// What only a log other nodes write too needs of the room (cluster mode).
pub trait SharedLog {
    /// Another node's event.
    fn live_event(&mut self, room: &mut RoomCore, event: StreamEvent, ctx: &mut Context<RoomActor>);
    /// Another node's latest-state record.
    fn live_state(&mut self, room: &mut RoomCore, state: LiveState);
    /// Whether a subscribe or a read must wait for the room's live feed: a live room
    /// that dropped it starts taking it again (subscribe, read what it missed) beside
    /// its mailbox, once; `true` while that is in flight.
    fn refeeding(&mut self, room: &RoomCore, ctx: &mut Context<RoomActor>) -> bool;
    /// No retake of the live feed is in flight.
    fn fed(&self) -> bool;
    /// A subscriber saw events up to `since`, beyond the room's head: when the room has
    /// seen an event at or after `since` announced on its feed, it reads what it missed
    /// (one read at a time); otherwise nothing is read.
    fn ahead(&mut self, room: &mut RoomCore, since: u64, ctx: &mut Context<RoomActor>);
    /// The room's subscribers may have changed: a feed unwatched long enough is dropped.
    fn subscribers_changed(&mut self, room: &RoomCore, ctx: &mut Context<RoomActor>);
    /// Read what other writers added that this room may have missed.
    fn catch_up(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>);
    /// The room starts with parked subscribers, adopted for an event after `replay_after`.
    fn adopted(&mut self, replay_after: Option<u64>);
}

/// A kind of log, found again in the room's [`Log`] by its own continuations.
trait LogPart: RoomLog + 'static {
    fn part(log: &mut Log) -> Option<&mut Self>;
}

/// Run `work` on the room's context, then `then` with the room's log (of kind `L`: a
/// room's log never changes kind) and the result; then the room carries out what its
/// machine decided.
fn spawn_then<L: LogPart, T: 'static>(
    ctx: &mut Context<RoomActor>,
    work: impl Future<Output = T> + 'static,
    then: impl FnOnce(&mut L, &mut RoomCore, T, &mut Context<RoomActor>) + 'static,
) {
    ctx.spawn(actix::fut::wrap_future::<_, RoomActor>(work).map(move |out, actor, ctx| {
        if let Some(log) = L::part(&mut actor.log) {
            then(log, &mut actor.core, out, ctx);
            actor.settle(ctx);
        }
    }));
}

/// Run `then` with the room's log after `after`.
fn later<L: LogPart>(
    ctx: &mut Context<RoomActor>,
    after: Duration,
    then: impl FnOnce(&mut L, &mut RoomCore, &mut Context<RoomActor>) + 'static,
) {
    ctx.run_later(after, move |actor, ctx| {
        if let Some(log) = L::part(&mut actor.log) {
            then(log, &mut actor.core, ctx);
            actor.settle(ctx);
        }
    });
}

/// Where a subscriber's updates go (the machine's sink).
#[derive(Clone)]
pub struct Subscriber {
    to: Arc<dyn Outlet>,
    /// Wants the room's presence frames.
    presence: bool,
}

/// What a subscribe's answer carries back from the machine.
pub struct Ticket {
    reference: Option<i64>,
    member: Option<crate::core::presence::Member>,
}

/// Who waits for a publish's or a state's answer (the local log writes the publish
/// itself when the machine asks).
pub enum Pending {
    Publish(Publish),
    Reply(oneshot::Sender<Result<Published, PublishFailed>>),
}

impl Pending {
    fn send(self, result: Result<Published, PublishFailed>) {
        let _ = match self {
            Pending::Publish(msg) => msg.reply.send(result),
            Pending::Reply(reply) => reply.send(result),
        };
    }
}

/// The room machine's world as the actor makes it: windows rendered once and shared.
pub struct Frames;

impl Wire for Frames {
    type Event = Arc<Delivery>;
    type Window = Arc<Window>;
    type Sink = Subscriber;
    type Ticket = Ticket;
    type Reply = Pending;
    type Error = RoomLogError;
    type Failed = PublishFailed;

    fn cut(&self, epoch: &Arc<str>, events: Vec<Arc<Delivery>>) -> Vec<Arc<Window>> {
        Window::cut(epoch, events)
    }
    fn bytes(window: &Arc<Window>) -> usize {
        window.frame.len()
    }
    fn backlog(sink: &Subscriber) -> &Backlog {
        sink.to.backlog()
    }
    fn not_loaded() -> RoomLogError {
        RoomLogError::NotLoaded
    }
}

/// What a room needs of the table that started it: a place to leave its automatic
/// subscribers when it stops idle. Defined here, implemented by the rooms table, so a room
/// does not know the table's type.
pub trait RoomHome: Send + Sync {
    /// `head`: the room's durable head, the last event its subscribers were sent.
    fn retire(self: Arc<Self>, room: &Arc<str>, addr: &Addr<RoomActor>, subscribers: Vec<Parked>, head: u64);
}

pub struct RoomActor {
    core: RoomCore,
    log: Log,
    /// When the timer for the held requests' next deadline fires, if one is armed.
    release_at: Option<Instant>,
}

/// A request the room may hold while a read it needs is in flight (`core::holds`).
pub(super) enum Request {
    Subscribe(Subscribe),
    Publish(Publish),
    Put(PutState),
    ReadState(oneshot::Sender<Result<StateView, RoomGone>>),
    ReadHistory(ReadHistory, oneshot::Sender<Result<HistoryPage, RoomGone>>),
}

/// The room's machine and what the actor keeps beside it: where to report, presence,
/// and the requests held for a read in flight.
pub struct RoomCore {
    name: Arc<str>,
    settings: RoomSettings,
    home: Weak<dyn RoomHome>,
    machine: RoomMachine<Frames>,
    presence: presence::RoomPresence,
    /// Where the room reports its subscribers and head for the admin overview.
    load: Option<Arc<RoomLoad>>,
    /// Told of the room's occupancy edges (`None` for an inbox, or when nobody listens).
    occupancy: Option<Arc<dyn Occupancy>>,
    /// Requests waiting for a read in flight, while the room serves the others.
    held: Holds<Request>,
    /// Where the room moved ([`HomeMoved`]), for its subscribers.
    moved_to: Option<Arc<str>>,
}

/// The key a stored event's idempotency id is kept under in its room's log: a client's
/// ids are its user's alone ([`names::idempotency_key`]).
fn id_key(event: &EventRecord) -> Arc<str> {
    names::idempotency_key(&event.id, event.from.as_deref()).into()
}

/// [`id_key`] of a publish not yet stored.
fn publish_key(msg: &Publish) -> Arc<str> {
    match &msg.from {
        Some(user) => names::idempotency_key(&msg.id, Some(user.as_str())).into(),
        None => msg.id.clone(),
    }
}

/// Render a stored event once for every subscriber.
fn render(room: &str, event: &EventRecord) -> Arc<Delivery> {
    Arc::new(Delivery {
        seq: event.seq,
        ts_ms: event.ts_ms,
        json: protocol::render_event(room, event.seq, &event.id, event.ts_ms, event.from.as_deref(), &event.data).into(),
        devices: event.devices.as_ref().map(|d| d.iter().map(|s| s.as_str().into()).collect()),
    })
}

impl RoomActor {
    /// A room kept in `log`; it is read when the actor starts.
    pub fn new(name: Arc<str>, log: Log, settings: RoomSettings, home: Weak<dyn RoomHome>) -> Self {
        let inbox = names::inbox_owner(&name).is_some();
        let limits = Limits {
            retention: settings.retention,
            recovery_max_events: settings.recovery_max_events,
            batch_window: settings.batch_window,
            idle_stop: settings.idle_stop,
        };
        let occupancy = settings.occupancy.clone().filter(|_| !inbox);
        let mut machine = RoomMachine::new(Frames, limits, Instant::now());
        if occupancy.is_none() {
            machine = machine.without_occupancy();
        }
        let core = RoomCore {
            occupancy,
            presence: presence::RoomPresence::new(settings.presence_hub.clone(), settings.presence && !inbox),
            name,
            home,
            machine,
            settings,
            load: None,
            held: Holds::default(),
            moved_to: None,
        };
        RoomActor { core, log, release_at: None }
    }

    /// Take over the room's parked subscribers (automatic inbox subscriptions). They get
    /// no `Subscribed`: everything this actor delivers is newer than what they were sent.
    /// `replay_after` names the live event that started the room (cluster mode).
    pub fn adopting(mut self, parked: Vec<Parked>, replay_after: Option<u64>) -> Self {
        if let Some(shared) = self.log.shared().filter(|_| !parked.is_empty()) {
            shared.adopted(replay_after);
        }
        let parked = parked.into_iter().map(|p| (p.conn, p.generation, Subscriber { to: p.to, presence: false }));
        self.core.input(Input::Adopt(parked.collect()));
        self
    }

    /// Report the room's subscribers and head to `load` as they change (the admin
    /// overview's busiest rooms).
    pub fn reporting(mut self, load: Option<Arc<RoomLoad>>) -> Self {
        self.core.load = load;
        self
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        let RoomActor { core, log, .. } = self;
        core.input(Input::Expire { now_ms: now_ms() });
        if let Some(shared) = log.shared().filter(|_| !core.machine.members().is_empty()) {
            // A live copy lost while NATS reconnected is found here at the latest.
            shared.catch_up(core, ctx);
        }
        core.machine.prune(|sink| sink.to.connected());
        self.drive(ctx);
        let RoomActor { core, log, .. } = self;
        if let Some(shared) = log.shared() {
            shared.subscribers_changed(core, ctx);
        }
        core.presence_poke(ctx);
        let busy = self.busy();
        self.core.input(Input::CheckIdle { busy });
        self.drive(ctx);
    }

    /// Requests or reads in flight the machine does not see: the room must not stop.
    fn busy(&self) -> bool {
        let log_busy = match &self.log {
            Log::Local(local) => local.busy(),
            Log::Stream(stream) => stream.busy(),
        };
        log_busy || !self.core.held.is_empty() || !self.core.presence.settled()
    }

    /// Carry out what the room's machine decided, until it has nothing more.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        while let Some(action) = self.core.machine.poll() {
            let core = &mut self.core;
            let name = &core.name;
            match action {
                Action::Subscribed { conn, generation, sink, ticket, epoch, answer, state } => {
                    if let Some(why) = answer.refused {
                        tracing::debug!(room = %name, ?why, "recovery refused");
                    }
                    let (head, recovered, replay, reference) = (answer.head, answer.recovered, answer.replay, ticket.reference);
                    let room = name.clone();
                    sink.to.post(RoomUpdate::Subscribed { room, epoch, head, recovered, replay, reference, generation, state });
                    core.presence.join(conn, ticket.member);
                    core.presence_snapshot(conn);
                }
                Action::Refused { generation, sink, ticket, why } => {
                    let (room, reference, message) = (name.clone(), ticket.reference, why.to_string());
                    sink.to.post(RoomUpdate::Refused { room, reference, message, generation });
                }
                Action::Window { sink, window } => sink.to.window(name, &window),
                Action::Evict { conn, sink, outstanding } => {
                    tracing::info!(room = %name, conn, outstanding, "slow consumer evicted");
                    core.settings.metrics.slow_consumer_closes.inc();
                    sink.to.post(RoomUpdate::SlowConsumer);
                }
                Action::Left { conn } => core.presence.leave(conn),
                Action::Moved { conn: _, sink } => {
                    let to = core.moved_to.clone().unwrap_or_default();
                    sink.to.post(RoomUpdate::Moved { room: name.clone(), to });
                }
                Action::Batched { events, first } => {
                    let metrics = &core.settings.metrics;
                    metrics.batch_events.observe(events as f64);
                    metrics.delivery_latency.observe(now_ms().saturating_sub(first.ts_ms) as f64 / 1000.0);
                }
                Action::Occupancy(occupied) => {
                    if let Some(occupancy) = &core.occupancy {
                        occupancy.changed(name, occupied, now_ms());
                    }
                }
                Action::Load { subscribers, head } => {
                    if let Some(load) = &core.load {
                        load.set(subscribers, head);
                    }
                }
                Action::ArmTimer(timer, at) => {
                    ctx.run_later(at.saturating_duration_since(Instant::now()), move |room, ctx| {
                        let input = match timer {
                            Timer::Window => Input::WindowCloses,
                            Timer::Flush => Input::FlushRetry,
                            Timer::Linger => Input::Lingered { busy: room.busy() },
                        };
                        room.core.input(input);
                        room.settle(ctx);
                    });
                }
                Action::Trim { first_kept, expired } => self.log.common().trimmed(core, first_kept, expired),
                Action::Reply { to, result } => to.send(result),
                Action::Retire { parked, head } => {
                    let parked = parked.into_iter().map(|(conn, generation, sink)| Parked { conn, to: sink.to, generation });
                    if let Some(home) = core.home.upgrade() {
                        home.retire(name, &ctx.address(), parked.collect(), head);
                    }
                    tracing::debug!(room = %name, "idle room stopped");
                    ctx.stop();
                }
                action @ (Action::Write { .. } | Action::WriteState { .. } | Action::Flush { .. }) => {
                    self.log.common().carry_out(core, action, ctx)
                }
            }
        }
    }

    /// Carry out what the machine decided, then serve the held requests whose wait is
    /// over (after every read the room's log finishes, every live copy, every deadline).
    fn settle(&mut self, ctx: &mut Context<Self>) {
        self.drive(ctx);
        self.release_held(ctx);
    }
}

impl RoomCore {
    /// Tell the room's machine what happened, now; the actor carries out what it decides
    /// once the handler or continuation that called this returns.
    pub(super) fn input(&mut self, input: Input<Frames>) {
        self.machine.handle(input, Instant::now());
    }

    /// Every request starts here: a stopped room sends the caller back to the rooms
    /// table, a live one counts the request as activity.
    fn admit(&mut self) -> Result<(), RoomGone> {
        match self.machine.admit(Instant::now()) {
            true => Ok(()),
            false => Err(RoomGone),
        }
    }

    pub(super) fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub(super) fn metrics(&self) -> &crate::metrics::Metrics {
        &self.settings.metrics
    }

    /// How much history the room keeps (its namespace's).
    pub(super) fn retention(&self) -> Retention {
        self.settings.retention
    }

    pub(super) fn machine(&self) -> &RoomMachine<Frames> {
        &self.machine
    }

    /// The room's log, once it is loaded.
    pub(super) fn live(&self) -> Option<&SeqLog<Arc<Delivery>>> {
        self.machine.live()
    }

    /// The room's log to append to, once it is loaded, or why not.
    pub(super) fn live_mut(&mut self) -> Result<&mut SeqLog<Arc<Delivery>>, RoomLogError> {
        self.machine.live_mut()
    }

    /// The log is read: the room answers from `events`, with its state as stored.
    pub(super) fn loaded(&mut self, log: SeqLog<Arc<Delivery>>, state: Option<StateAt>) {
        self.settings.metrics.state_reads.inc();
        self.input(Input::Loaded { log, state });
    }

    /// Subscribes held until a read in flight is done: the room is watched.
    pub(super) fn held_subscribes(&self) -> usize {
        self.held.count(|request| matches!(request, Request::Subscribe(_)))
    }

    /// Tell the load slot how far behind its stream the room applied its last event
    /// (cluster mode, `core::lag`).
    pub(super) fn report_lag(&self, reading: crate::core::lag::Reading, now_ms: u64) {
        if let Some(load) = &self.load {
            load.set_lag(reading, now_ms);
        }
    }

    fn read_state(&self) -> StateView {
        let epoch = self.machine.live().map(|log| log.epoch().into());
        let (seq, data) = self.machine.current().map_or((0, None), |state| (state.seq, Some(state.data.clone())));
        StateView { epoch, seq, data }
    }

    fn read_history(&self, msg: ReadHistory) -> HistoryPage {
        match self.machine.live() {
            None => HistoryPage { epoch: None, head: 0, events: Vec::new(), complete: false },
            Some(log) => {
                let (events, complete) = log.read(msg.since, msg.limit);
                let events = events.into_iter().map(|e| e.payload.clone()).collect();
                HistoryPage { epoch: Some(log.epoch().into()), head: log.durable(), events, complete }
            }
        }
    }
}

impl Actor for RoomActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.core.settings.tick, |room, ctx| room.tick(ctx));
        let RoomActor { core, log, .. } = self;
        log.common().load(core, ctx);
        core.input(Input::Started);
        self.settle(ctx);
    }
}

/// A room that ends with explicit subscribers (its arbiter stopped at shutdown) reports
/// it is vacated: nobody is subscribed to it on this node any more.
impl Drop for RoomCore {
    fn drop(&mut self) {
        if let Some(occupancy) = self.occupancy.as_ref().filter(|_| self.machine.occupied()) {
            occupancy.changed(&self.name, false, now_ms());
        }
    }
}

/// The room's live feed (cluster mode), while it holds one.
impl StreamHandler<LiveItem> for RoomActor {
    fn handle(&mut self, item: LiveItem, ctx: &mut Self::Context) {
        let Some(shared) = self.log.shared() else { return };
        self.core.settings.metrics.cluster_live_copies.inc();
        match item {
            LiveItem::Event(event) => shared.live_event(&mut self.core, event, ctx),
            LiveItem::State(state, version) if self.core.machine.is_live() => {
                let state = StateAt { seq: state.seq, data: state.data.into() };
                shared.live_state(&mut self.core, LiveState { state, version })
            }
            LiveItem::State(..) => {}
        }
        self.settle(ctx);
    }

    /// The feed ends with the node's NATS connection (the node is stopping); the room
    /// goes on without it.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

impl Handler<HomeMoved> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: HomeMoved, ctx: &mut Self::Context) {
        if self.core.machine.is_stopped() {
            return;
        }
        self.core.moved_to = Some(msg.to.clone());
        self.core.input(Input::Moved);
        self.drive(ctx);
        tracing::info!(room = %self.core.name, to = %msg.to, "room moved to another cell: subscribers closed to resume there");
        ctx.stop();
    }
}

impl Handler<Resync> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: Resync, ctx: &mut Self::Context) {
        ctx.run_later(msg.after, |room, ctx| {
            if let Some(shared) = room.log.shared() {
                shared.catch_up(&mut room.core, ctx);
            }
            room.settle(ctx);
        });
    }
}

impl RoomActor {
    /// Serve `request` now, or hold it until what it needs is read (`patient`: a
    /// request whose wait ran out, or that found the room full of held ones, is
    /// answered from what the room has).
    fn serve(&mut self, request: Request, patient: bool, ctx: &mut Context<Self>) {
        let until = if patient { self.must_wait(&request, ctx) } else { None };
        let request = match until {
            Some(until) => match self.core.held.hold(until, request) {
                Ok(()) => return self.arm_release(ctx),
                Err(request) => {
                    tracing::debug!(room = %self.core.name, held = self.core.held.len(), "room holds all it may: answered at once");
                    request
                }
            },
            None => request,
        };
        self.answer(request, ctx);
    }

    /// What `request` must wait for before it is answered, starting the read it waits
    /// on where there is one (beside the mailbox: the room goes on serving the others).
    fn must_wait(&mut self, request: &Request, ctx: &mut Context<Self>) -> Option<Until> {
        let RoomActor { core, log, .. } = self;
        if core.machine.is_loading() {
            return Some(Until::LoadEnds);
        }
        let shared = log.shared()?;
        if let Request::Publish(_) | Request::Put(_) = request {
            return None;
        }
        if let Request::Subscribe(_) = request {
            // The stored state is read again with backoff: the subscriber waits for
            // it instead of being refused for good.
            if core.machine.is_failed() {
                return Some(Until::Loaded);
            }
        }
        if shared.refeeding(core, ctx) {
            return Some(Until::Fed);
        }
        let Request::Subscribe(msg) = request else { return None };
        let ask = Ask { since: msg.since, epoch: msg.epoch.as_deref(), state: msg.state };
        let since = msg.since.filter(|_| core.live().is_some_and(|log| seen_beyond_head(log, ask)))?;
        shared.ahead(core, since, ctx);
        Some(Until::Head { since, deadline: Instant::now() + AHEAD_WAIT })
    }

    /// Answer `request` from what the room has now.
    fn answer(&mut self, request: Request, ctx: &mut Context<Self>) {
        let core = &mut self.core;
        match request {
            Request::Subscribe(msg) => {
                core.input(Input::Expire { now_ms: now_ms() });
                let sink = Subscriber { to: msg.to, presence: msg.presence && core.presence.enabled() };
                core.input(Input::Subscribe(room::Subscribe {
                    conn: msg.conn,
                    generation: msg.generation,
                    automatic: msg.automatic,
                    since: msg.since,
                    epoch: msg.epoch,
                    state: msg.state,
                    sink,
                    ticket: Ticket { reference: msg.reference, member: msg.member },
                }));
                self.drive(ctx);
                self.core.presence_poke(ctx);
            }
            Request::Publish(msg) => self.log.common().publish(core, msg, ctx),
            Request::Put(msg) => self.log.common().put_state(core, msg, ctx),
            Request::ReadState(reply) => {
                let _ = reply.send(Ok(core.read_state()));
            }
            Request::ReadHistory(msg, reply) => {
                core.input(Input::Expire { now_ms: now_ms() });
                let _ = reply.send(Ok(core.read_history(msg)));
            }
        }
    }

    /// Serve the held requests whose wait is over.
    fn release_held(&mut self, ctx: &mut Context<Self>) {
        if self.core.held.is_empty() {
            return;
        }
        let fed = self.log.shared().is_none_or(|shared| shared.fed());
        let machine = &self.core.machine;
        let room = RoomNow { loading: machine.is_loading(), loaded: machine.is_live(), fed, head: machine.durable_head() };
        for (request, why) in self.core.held.release(room, Instant::now()) {
            self.serve(request, why == Released::Ready, ctx);
        }
        self.drive(ctx);
        self.arm_release(ctx);
    }

    /// A timer for the held requests' next deadline (one at a time, the earliest).
    fn arm_release(&mut self, ctx: &mut Context<Self>) {
        let Some(at) = self.core.held.next_deadline() else { return };
        if self.release_at.is_some_and(|armed| armed <= at) {
            return;
        }
        self.release_at = Some(at);
        ctx.run_later(at.saturating_duration_since(Instant::now()), move |room, ctx| {
            if room.release_at == Some(at) {
                room.release_at = None;
            }
            room.settle(ctx);
        });
    }

    /// Serve a request that came in a message (after the room admitted it).
    fn request(&mut self, request: Request, ctx: &mut Context<Self>) {
        self.serve(request, true, ctx);
        self.drive(ctx);
    }
}

impl Handler<Publish> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: Publish, ctx: &mut Self::Context) -> Self::Result {
        self.core.admit()?;
        self.request(Request::Publish(msg), ctx);
        Ok(())
    }
}

/// A subscribe waits, held by the room (never in its mailbox), while the room loads or
/// its stored state cannot be read, while it takes its live feed again, and while its
/// `since` is beyond the room's head (at most [`AHEAD_WAIT`]).
impl Handler<Subscribe> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: Subscribe, ctx: &mut Self::Context) -> Self::Result {
        self.core.admit()?;
        self.request(Request::Subscribe(msg), ctx);
        Ok(())
    }
}

impl Handler<PutState> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: PutState, ctx: &mut Self::Context) -> Self::Result {
        self.core.admit()?;
        self.request(Request::Put(msg), ctx);
        Ok(())
    }
}

/// A request answered once the room serves it (maybe after holding it): a room that
/// stopped meanwhile sends the caller back to the rooms table.
fn answered<T: 'static>(reply: oneshot::Receiver<Result<T, RoomGone>>) -> ResponseFuture<Result<T, RoomGone>> {
    Box::pin(async move { reply.await.unwrap_or(Err(RoomGone)) })
}

impl Handler<ReadState> for RoomActor {
    type Result = ResponseFuture<Result<StateView, RoomGone>>;

    fn handle(&mut self, _msg: ReadState, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        match self.core.admit() {
            Ok(()) => self.request(Request::ReadState(reply), ctx),
            Err(gone) => drop(reply.send(Err(gone))),
        }
        answered(answer)
    }
}

impl Handler<ReadHistory> for RoomActor {
    type Result = ResponseFuture<Result<HistoryPage, RoomGone>>;

    fn handle(&mut self, msg: ReadHistory, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        match self.core.admit() {
            Ok(()) => self.request(Request::ReadHistory(msg, reply), ctx),
            Err(gone) => drop(reply.send(Err(gone))),
        }
        answered(answer)
    }
}

impl Handler<CloseWindow> for RoomActor {
    type Result = ();

    fn handle(&mut self, _msg: CloseWindow, ctx: &mut Self::Context) {
        self.core.input(Input::WindowCloses);
        self.drive(ctx);
    }
}

impl Handler<Unsubscribe> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: Unsubscribe, ctx: &mut Self::Context) {
        self.core.input(Input::Unsubscribe { conn: msg.conn, generation: msg.generation });
        self.drive(ctx);
        let RoomActor { core, log, .. } = self;
        core.held.retain(|held| !matches!(held, Request::Subscribe(w) if w.conn == msg.conn && w.generation <= msg.generation));
        if let Some(shared) = log.shared() {
            shared.subscribers_changed(core, ctx);
        }
        core.presence_poke(ctx);
        self.drive(ctx);
    }
}

impl Handler<ReadPresence> for RoomActor {
    type Result = Result<Result<crate::core::presence::View, PresenceOff>, RoomGone>;

    fn handle(&mut self, _msg: ReadPresence, _ctx: &mut Self::Context) -> Self::Result {
        self.core.admit()?;
        Ok(self.core.presence.view(&self.core.name))
    }
}

impl Handler<PresenceChanged> for RoomActor {
    type Result = ();

    fn handle(&mut self, _msg: PresenceChanged, ctx: &mut Self::Context) {
        self.core.presence.remote_changed();
        self.core.presence_poke(ctx);
    }
}
