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

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use actix::prelude::*;

pub use self::load::RoomLoad;
pub use self::local::LocalRoomLogs;
pub use self::occupancy::{DelayedVacate, Occupancy};
pub use self::presence::PresenceHub;
pub use self::stream::StreamRoomLogs;
use crate::core::backlog::Reserve;
use super::messages::*;
use crate::cluster::roomlog::{LiveItem, StreamEvent};
use crate::core::batch::BatchAction;
use crate::core::holds::{Holds, Released, RoomNow, Until, AHEAD_WAIT};
use crate::core::room::{answer_subscribe, seen_beyond_head, Ask, Joined, Member, Members, Outgoing};
use crate::core::names;
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

/// Where one room's events are kept, as the room actor needs it. Its asynchronous work
/// comes back through [`spawn_then`] and [`later`], which hand it its own state and the
/// room's again; the room's mailbox is never held while that work is in flight.
pub trait RoomLog {
    /// Make the room live from what is stored, or failed (a log that reads
    /// asynchronously keeps it loading: requests that need the log are held meanwhile).
    fn load(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>);
    /// Store a publish and answer it once it is durable (a known id is a duplicate).
    fn publish(&mut self, room: &mut RoomCore, msg: Publish, ctx: &mut Context<RoomActor>);
    /// Store the room's state as of its head and answer once it is durable.
    fn put_state(&mut self, room: &mut RoomCore, msg: PutState, ctx: &mut Context<RoomActor>);
    /// The room's log dropped its events below `first_kept` by age.
    fn expired(&mut self, room: &RoomCore, first_kept: u64);
    /// Whether requests still wait on the log (the room must not stop while they do).
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
    /// (one read at a time); otherwise nothing is read (the live copy may be on its way,
    /// or the client claims more than was stored).
    fn ahead(&mut self, room: &mut RoomCore, since: u64, ctx: &mut Context<RoomActor>);
    /// The room's subscribers may have changed (its tick, an unsubscribe): a feed
    /// unwatched long enough is dropped.
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

/// The log of kind `L` of the room running `work`'s continuation. A room's log never
/// changes kind, so a continuation always finds the log that spawned it.
fn parts<L: LogPart>(actor: &mut RoomActor) -> Option<(&mut L, &mut RoomCore)> {
    Some((L::part(&mut actor.log)?, &mut actor.core))
}

/// `work` as an actor future whose output goes to `then`, with the room's log and state;
/// then the requests the room held for it are served.
fn continued<L: LogPart, T: 'static>(
    work: impl Future<Output = T> + 'static,
    then: impl FnOnce(&mut L, &mut RoomCore, T, &mut Context<RoomActor>) + 'static,
) -> impl ActorFuture<RoomActor, Output = ()> {
    actix::fut::wrap_future::<_, RoomActor>(work).map(move |out, actor, ctx| {
        if let Some((log, room)) = parts::<L>(actor) {
            then(log, room, out, ctx);
            actor.release_held(ctx);
        }
    })
}

/// Run `work` on the room's context, then `then` with the room's log and the result.
fn spawn_then<L: LogPart, T: 'static>(
    ctx: &mut Context<RoomActor>,
    work: impl Future<Output = T> + 'static,
    then: impl FnOnce(&mut L, &mut RoomCore, T, &mut Context<RoomActor>) + 'static,
) {
    ctx.spawn(continued(work, then));
}

/// Run `then` with the room's log after `after`.
fn later<L: LogPart>(
    ctx: &mut Context<RoomActor>,
    after: Duration,
    then: impl FnOnce(&mut L, &mut RoomCore, &mut Context<RoomActor>) + 'static,
) {
    ctx.run_later(after, move |actor, ctx| {
        if let Some((log, room)) = parts::<L>(actor) {
            then(log, room, ctx);
            actor.release_held(ctx);
        }
    });
}

enum RoomState {
    /// The retained events are being read (cluster mode).
    Loading,
    /// The room's log; a room never written is live too, at head 0 in the epoch its first
    /// write will store (nothing is written before that).
    Live(SeqLog<Arc<Delivery>>),
    /// The stored state could not be read; every request gets this error.
    Failed(RoomLogError),
}

/// Where a subscriber's updates go (`core::room::Member`'s sink).
struct Subscriber {
    to: Arc<dyn Outlet>,
    /// Wants the room's presence frames.
    presence: bool,
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
    /// A [`RoomActor::linger`] check is armed.
    lingering: bool,
    /// When the timer for the held requests' next deadline fires, if one is armed.
    release_at: Option<Instant>,
}

/// A request the room may hold while a read it needs is in flight (`core::holds`).
pub(super) enum Request {
    Subscribe(Subscribe),
    Publish(Publish),
    Put(PutState),
    ReadState(tokio::sync::oneshot::Sender<Result<StateView, RoomGone>>),
    ReadHistory(ReadHistory, tokio::sync::oneshot::Sender<Result<HistoryPage, RoomGone>>),
}

/// How long a room never written to lives without a subscriber or a request.
const EMPTY_ROOM_LINGER: Duration = Duration::from_secs(1);

/// What a room is whatever keeps its events: its log in memory, its subscribers and its
/// window.
pub struct RoomCore {
    name: Arc<str>,
    settings: RoomSettings,
    home: Weak<dyn RoomHome>,
    state: RoomState,
    subscribers: Members<Subscriber>,
    /// Durable events not yet sent to subscribers (contiguous seqs), and the window that
    /// sends them.
    outgoing: Outgoing<Arc<Delivery>>,
    /// The epoch the last window carried, shared by the windows after it.
    window_epoch: Option<Arc<str>>,
    /// The room's latest durable state, read once with the room; its seq is
    /// at most the durable head.
    current: Option<StateAt>,
    /// States whose event is not durable yet, by seq: each becomes `current` when it is.
    pending_states: VecDeque<StateAt>,
    last_active: Instant,
    stopped: bool,
    presence: presence::RoomPresence,
    /// Where the room reports its subscribers and head for the admin overview (not for
    /// inboxes).
    load: Option<Arc<RoomLoad>>,
    /// Told of the room's occupancy edges (`None` for an inbox, or when nobody listens).
    occupancy: Option<Arc<dyn Occupancy>>,
    /// Whether the last edge told was "occupied": the room has an explicit subscriber.
    occupied: bool,
    /// Requests waiting for a read in flight (the log loading, the feed coming back, a
    /// subscriber's `since`), while the room serves the others.
    held: Holds<Request>,
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
        let inbox = crate::core::names::inbox_owner(&name).is_some();
        let enabled = settings.presence && !inbox;
        let core = RoomCore {
            occupancy: settings.occupancy.clone().filter(|_| !inbox),
            occupied: false,
            presence: presence::RoomPresence::new(settings.presence_hub.clone(), enabled),
            name,
            home,
            state: RoomState::Loading,
            subscribers: Members::default(),
            outgoing: Outgoing::new(settings.batch_window),
            window_epoch: None,
            current: None,
            pending_states: VecDeque::new(),
            settings,
            last_active: Instant::now(),
            stopped: false,
            load: None,
            held: Holds::default(),
        };
        RoomActor { core, log, lingering: false, release_at: None }
    }

    /// Take over the room's parked subscribers (automatic inbox subscriptions). They get
    /// no `Subscribed`: everything this actor delivers is newer than what they were sent.
    /// `replay_after` names the live event that started the room (cluster mode).
    pub fn adopting(mut self, parked: Vec<Parked>, replay_after: Option<u64>) -> Self {
        if let Some(shared) = self.log.shared().filter(|_| !parked.is_empty()) {
            shared.adopted(replay_after);
        }
        for p in parked {
            let sink = Subscriber { to: p.to, presence: false };
            self.core.subscribers.join(p.conn, Member { generation: p.generation, automatic: true, sink });
        }
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
        core.trim_expired(log.common());
        if let Some(shared) = log.shared().filter(|_| !core.subscribers.is_empty()) {
            // A live copy lost while NATS reconnected is found here at the latest.
            shared.catch_up(core, ctx);
        }
        core.subscribers.retain(|conn, member| {
            let connected = member.sink.to.connected();
            if !connected {
                core.presence.leave(conn);
            }
            connected
        });
        if let Some(shared) = log.shared() {
            shared.subscribers_changed(core, ctx);
        }
        core.report_load();
        core.occupancy_check();
        core.presence_poke(ctx);
        self.stop_if_idle(ctx);
    }

    /// Stop an unwatched room with nothing pending once it has been idle for
    /// `room_idle_secs`, or for [`EMPTY_ROOM_LINGER`] when it was never written (it
    /// holds nothing a restart would not read back). An inbox followed only by its users'
    /// automatic subscriptions parks them and stops like an unwatched room: its actor
    /// lives while messages come.
    fn stop_if_idle(&mut self, ctx: &mut Context<Self>) {
        let RoomActor { core, log, .. } = self;
        if core.stopped {
            return;
        }
        let idle = core.unwatched()
            && core.outgoing.is_empty()
            && !log.common().busy()
            && core.held.is_empty()
            && !matches!(core.state, RoomState::Loading)
            && core.presence.settled();
        let after = if core.never_written() { EMPTY_ROOM_LINGER.min(core.settings.idle_stop) } else { core.settings.idle_stop };
        if idle && core.last_active.elapsed() >= after {
            let parked: Vec<Parked> = core
                .subscribers
                .drain()
                .map(|(conn, member)| Parked { conn, to: member.sink.to, generation: member.generation })
                .collect();
            if let Some(home) = core.home.upgrade() {
                home.retire(&core.name, &ctx.address(), parked, core.durable_head());
            }
            core.stopped = true;
            core.occupancy_check();
            tracing::debug!(room = %core.name, "idle room stopped");
            ctx.stop();
        }
    }

    /// A room that may be empty and unwatched checks again after [`EMPTY_ROOM_LINGER`]
    /// (one timer at a time) instead of waiting for its tick: a client reading or leaving
    /// rooms nobody writes to keeps their actors for about a second, not `room_idle_secs`.
    fn linger(&mut self, ctx: &mut Context<Self>) {
        let core = &self.core;
        let may_be_empty = core.never_written() || matches!(core.state, RoomState::Loading);
        if self.lingering || core.stopped || !may_be_empty || !core.unwatched() {
            return;
        }
        self.lingering = true;
        ctx.run_later(EMPTY_ROOM_LINGER, |room, ctx| {
            room.lingering = false;
            room.stop_if_idle(ctx);
            room.linger(ctx);
        });
    }
}

impl RoomCore {
    /// Every request starts here: a stopped room sends the caller back to the rooms
    /// table, a live one counts the request as activity.
    fn admit(&mut self) -> Result<(), RoomGone> {
        if self.stopped {
            return Err(RoomGone);
        }
        self.last_active = Instant::now();
        Ok(())
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

    /// The room stopped: nothing more is done for it.
    pub(super) fn is_stopped(&self) -> bool {
        self.stopped
    }

    pub(super) fn is_live(&self) -> bool {
        matches!(self.state, RoomState::Live(_))
    }

    /// The stored state could not be read (every request gets the error).
    pub(super) fn is_failed(&self) -> bool {
        matches!(self.state, RoomState::Failed(_))
    }

    /// The log is being read; requests that need it are held (`core::holds`), the
    /// mailbox is not.
    pub(super) fn start_loading(&mut self) {
        self.state = RoomState::Loading;
    }

    /// The log is read: the room answers from `events`.
    pub(super) fn go_live(&mut self, events: SeqLog<Arc<Delivery>>) {
        self.state = RoomState::Live(events);
    }

    /// The room's state as stored, read with the room: it is the room's state.
    pub(super) fn restore_state(&mut self, state: Option<StateAt>) {
        self.settings.metrics.state_reads.inc();
        self.current = state;
    }

    /// The log could not be read: every request gets `why` until it is.
    pub(super) fn fail(&mut self, why: RoomLogError) {
        self.state = RoomState::Failed(why);
    }

    /// Explicit and automatic subscribers.
    pub(super) fn subscriber_count(&self) -> usize {
        self.subscribers.len()
    }

    /// Subscribes held until a read in flight is done: the room is watched.
    pub(super) fn held_subscribes(&self) -> usize {
        self.held.count(|request| matches!(request, Request::Subscribe(_)))
    }

    /// The room's log, once it is loaded.
    pub(super) fn live(&self) -> Option<&SeqLog<Arc<Delivery>>> {
        match &self.state {
            RoomState::Live(log) => Some(log),
            _ => None,
        }
    }

    /// The events before `head` are gone from where the log keeps them: the room's log
    /// starts again after them, empty, in its epoch.
    pub(super) fn skip_to(&mut self, head: u64) {
        let retention = self.settings.retention;
        if let RoomState::Live(log) = &mut self.state {
            *log = SeqLog::restore(log.epoch().to_string(), head, Vec::new(), retention);
        }
    }

    /// Send the adopted subscribers (the only ones yet) every event after `after` at
    /// once, outside any window.
    pub(super) fn replay_adopted(&mut self, after: u64) {
        let RoomState::Live(log) = &self.state else { return };
        let replay: Vec<Arc<Delivery>> = log.read(after, usize::MAX).0.into_iter().map(|e| e.payload.clone()).collect();
        if replay.is_empty() {
            return;
        }
        for window in Window::cut(&self.epoch(), replay) {
            self.send_window(window);
        }
    }

    /// The room's log, once it is loaded, or why not.
    pub(super) fn live_log(&mut self) -> Result<&mut SeqLog<Arc<Delivery>>, RoomLogError> {
        match &mut self.state {
            RoomState::Live(log) => Ok(log),
            RoomState::Failed(why) => Err(why.clone()),
            RoomState::Loading => Err(RoomLogError::NotLoaded),
        }
    }

    /// A room nobody ever published to (nor set a state of): nothing of it is stored, so
    /// its actor need not wait `room_idle_secs` once nobody uses it.
    fn never_written(&self) -> bool {
        let empty = matches!(&self.state, RoomState::Live(log) if log.head() == 0);
        empty && self.current.is_none() && self.pending_states.is_empty()
    }

    /// No subscriber but automatic inbox subscriptions.
    fn unwatched(&self) -> bool {
        self.subscribers.unwatched()
    }

    /// Tell the load slot the room's subscribers and head. Only non-inbox rooms have a
    /// slot, and their subscribers are all explicit (automatic ones are inboxes').
    pub(super) fn report_load(&self) {
        if let Some(load) = &self.load {
            load.set(self.subscribers.len(), self.durable_head());
        }
    }

    /// Tell the load slot how far behind its stream the room applied its last event
    /// (cluster mode, `core::lag`).
    pub(super) fn report_lag(&self, reading: crate::core::lag::Reading, now_ms: u64) {
        if let Some(load) = &self.load {
            load.set_lag(reading, now_ms);
        }
    }

    /// The durable head (0 while the room is not live).
    fn durable_head(&self) -> u64 {
        match &self.state {
            RoomState::Live(log) => log.durable(),
            _ => 0,
        }
    }

    /// A state the log stored: the room's state once its seq is durable, unless a newer
    /// one is (the later of two at one seq wins: a second `PUT` at the same head).
    pub(super) fn offer_state(&mut self, offered: StateAt) {
        if self.current.as_ref().is_some_and(|current| current.seq > offered.seq) {
            return;
        }
        let at = self.pending_states.partition_point(|p| p.seq <= offered.seq);
        self.pending_states.insert(at, offered);
        self.promote_states();
    }

    /// Pending states whose event became durable become the room's state, in seq order.
    fn promote_states(&mut self) {
        let durable = self.durable_head();
        while self.pending_states.front().is_some_and(|p| p.seq <= durable) {
            let state = self.pending_states.pop_front().expect("front exists");
            if self.current.as_ref().is_none_or(|current| current.seq <= state.seq) {
                self.current = Some(state);
            }
        }
    }

    fn trim_expired(&mut self, log: &mut dyn RoomLog) {
        if let RoomState::Live(events) = &mut self.state {
            if let Some(first_kept) = events.trim_expired(now_ms()) {
                log.expired(self, first_kept);
            }
        }
    }

    /// Newly durable events: the states they made durable become the room's, and they
    /// join the open window; the first one opens it (window 0: they leave at once). With
    /// nobody subscribed there is nobody to send them to: a later subscriber starts after
    /// them (or gets them in its replay).
    pub(super) fn deliver(&mut self, fresh: Vec<Arc<Delivery>>, ctx: &mut Context<RoomActor>) {
        self.promote_states();
        self.report_load();
        match self.outgoing.on_durable(fresh, !self.subscribers.is_empty(), Instant::now()) {
            BatchAction::SendNow => self.close_window(),
            BatchAction::ArmTimer(at) => {
                ctx.run_later(at.saturating_duration_since(Instant::now()), |room, _| room.core.close_window());
            }
            BatchAction::Wait => {}
        }
    }

    /// Send the window's events, rendered once, to every subscriber, evicting those too
    /// far behind. The window's metrics are taken here, once, not per subscriber.
    fn close_window(&mut self) {
        let events = self.outgoing.close();
        if events.is_empty() {
            return;
        }
        let metrics = &self.settings.metrics;
        metrics.batch_events.observe(events.len() as f64);
        metrics.delivery_latency.observe(now_ms().saturating_sub(events[0].ts_ms) as f64 / 1000.0);
        for window in Window::cut(&self.epoch(), events) {
            self.send_window(window);
        }
        self.report_load();
    }

    /// The room's epoch, for the windows it sends (empty while it has none: no window
    /// then); kept between windows, so a window costs no allocation for it.
    fn epoch(&mut self) -> Arc<str> {
        let current = match &self.state {
            RoomState::Live(log) => log.epoch(),
            _ => "",
        };
        match &self.window_epoch {
            Some(kept) if **kept == *current => kept.clone(),
            _ => self.window_epoch.insert(current.into()).clone(),
        }
    }

    fn send_window(&mut self, window: Arc<Window>) {
        let bytes = window.frame.len();
        let before = self.subscribers.len();
        let (name, metrics, presence) = (&self.name, &self.settings.metrics, &mut self.presence);
        // Subscribers that went away unsubscribe, and the tick prunes any left over.
        self.subscribers.retain(|conn, member| match member.sink.to.backlog().reserve(bytes) {
            Reserve::Ok => {
                member.sink.to.window(name, &window);
                true
            }
            Reserve::EvictNow => {
                tracing::info!(room = %name, conn, outstanding = member.sink.to.backlog().outstanding(), "slow consumer evicted");
                metrics.slow_consumer_closes.inc();
                member.sink.to.post(RoomUpdate::SlowConsumer);
                presence.leave(conn);
                false
            }
            Reserve::Evicted => {
                presence.leave(conn);
                false
            }
        });
        if self.subscribers.len() != before {
            self.occupancy_check();
        }
    }

    /// Tell the occupancy seam when the room's explicit subscribers went from none to
    /// some, or from some to none (called wherever subscribers come and go; an inbox has
    /// no seam). Cheap: a room other than an inbox has only explicit subscribers, so the
    /// first one answers.
    fn occupancy_check(&mut self) {
        let Some(occupancy) = &self.occupancy else { return };
        let occupied = self.subscribers.occupied();
        if occupied != self.occupied {
            self.occupied = occupied;
            occupancy.changed(&self.name, occupied, now_ms());
        }
    }

    /// Add a subscriber at the durable head: it gets the answer `core::room` gives from
    /// the log (a replay up to that head, the state), and of the open window's events only
    /// those after it (the connection drops the rest).
    pub(super) fn subscribe(&mut self, msg: Subscribe, log: &mut dyn RoomLog) {
        self.trim_expired(log);
        let (name, max_events) = (self.name.clone(), self.settings.recovery_max_events);
        // A subscribe overtaken by a newer one of the same connection is void (the
        // connection sees its generation is stale and never waits for an answer).
        if self.subscribers.admits(msg.conn, msg.generation) == Joined::Stale {
            return;
        }
        let current = self.current.clone();
        let events = match self.live_log() {
            Ok(events) => events,
            Err(why) => {
                let generation = msg.generation;
                let message = why.to_string();
                msg.to.post(RoomUpdate::Refused { room: name, reference: msg.reference, message, generation });
                return;
            }
        };
        let ask = Ask { since: msg.since, epoch: msg.epoch.as_deref(), state: msg.state };
        let state_seq = current.as_ref().map_or(0, |state| state.seq);
        let answer = answer_subscribe(events, ask, state_seq, max_events);
        if let Some(why) = answer.refused {
            tracing::debug!(room = %name, since = msg.since, ?why, state = msg.state, "recovery refused");
        }
        msg.to.post(RoomUpdate::Subscribed {
            room: name,
            epoch: events.epoch().into(),
            head: answer.head,
            recovered: answer.recovered,
            replay: answer.replay,
            reference: msg.reference,
            generation: msg.generation,
            state: answer.with_state.then_some(current),
        });
        let presence = msg.presence && self.presence.enabled();
        let sink = Subscriber { to: msg.to, presence };
        self.subscribers.join(msg.conn, Member { generation: msg.generation, automatic: msg.automatic, sink });
        self.occupancy_check();
        self.presence.join(msg.conn, msg.member);
        self.presence_snapshot(msg.conn);
    }
}

impl Actor for RoomActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.core.settings.tick, |room, ctx| room.tick(ctx));
        let RoomActor { core, log, .. } = self;
        log.common().load(core, ctx);
        core.report_load();
        self.linger(ctx);
    }
}

/// A room that ends with explicit subscribers (its arbiter stopped at shutdown) reports
/// it is vacated: nobody is subscribed to it on this node any more.
impl Drop for RoomCore {
    fn drop(&mut self) {
        if let Some(occupancy) = self.occupancy.as_ref().filter(|_| self.occupied) {
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
            LiveItem::State(state, version) if self.core.is_live() => {
                shared.live_state(&mut self.core, LiveState { state: StateAt { seq: state.seq, data: state.data.into() }, version })
            }
            LiveItem::State(..) => {}
        }
        self.release_held(ctx);
    }

    /// The feed ends with the node's NATS connection (the node is stopping); the room
    /// goes on without it.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

impl Handler<HomeMoved> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: HomeMoved, ctx: &mut Self::Context) {
        let core = &mut self.core;
        if core.stopped {
            return;
        }
        for (conn, member) in core.subscribers.drain() {
            member.sink.to.post(RoomUpdate::Moved { room: core.name.clone(), to: msg.to.clone() });
            core.presence.leave(conn);
        }
        core.stopped = true;
        core.occupancy_check();
        tracing::info!(room = %core.name, to = %msg.to, "room moved to another cell: subscribers closed to resume there");
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
        if matches!(core.state, RoomState::Loading) {
            return Some(Until::LoadEnds);
        }
        let shared = log.shared()?;
        if let Request::Publish(_) | Request::Put(_) = request {
            return None;
        }
        if let Request::Subscribe(_) = request {
            // The stored state is read again with backoff: the subscriber waits for
            // it instead of being refused for good.
            if core.is_failed() {
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
        match request {
            Request::Subscribe(msg) => {
                self.core.subscribe(msg, self.log.common());
                self.core.report_load();
                self.core.presence_poke(ctx);
            }
            Request::Publish(msg) => self.log.common().publish(&mut self.core, msg, ctx),
            Request::Put(msg) => self.log.common().put_state(&mut self.core, msg, ctx),
            Request::ReadState(reply) => {
                let _ = reply.send(Ok(self.read_state()));
            }
            Request::ReadHistory(msg, reply) => {
                let _ = reply.send(Ok(self.read_history(msg)));
            }
        }
    }

    /// Serve the held requests whose wait is over (after every read the room's log
    /// finishes, every live copy and every deadline).
    fn release_held(&mut self, ctx: &mut Context<Self>) {
        if self.core.held.is_empty() {
            return;
        }
        let fed = self.log.shared().is_none_or(|shared| shared.fed());
        let loading = matches!(self.core.state, RoomState::Loading);
        let room = RoomNow { loading, loaded: self.core.is_live(), fed, head: self.core.durable_head() };
        for (request, why) in self.core.held.release(room, Instant::now()) {
            self.serve(request, why == Released::Ready, ctx);
        }
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
            room.release_held(ctx);
        });
    }

    fn read_state(&self) -> StateView {
        let core = &self.core;
        let epoch = match &core.state {
            RoomState::Live(log) => Some(log.epoch().into()),
            _ => None,
        };
        let (seq, data) = core.current.as_ref().map_or((0, None), |state| (state.seq, Some(state.data.clone())));
        StateView { epoch, seq, data }
    }

    fn read_history(&mut self, msg: ReadHistory) -> HistoryPage {
        self.core.trim_expired(self.log.common());
        match &self.core.state {
            RoomState::Failed(_) | RoomState::Loading => HistoryPage { epoch: None, head: 0, events: Vec::new(), complete: false },
            RoomState::Live(log) => {
                let (events, complete) = log.read(msg.since, msg.limit);
                HistoryPage {
                    epoch: Some(log.epoch().into()),
                    head: log.durable(),
                    events: events.into_iter().map(|e| e.payload.clone()).collect(),
                    complete,
                }
            }
        }
    }
}

impl Handler<Publish> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: Publish, ctx: &mut Self::Context) -> Self::Result {
        self.core.admit()?;
        self.serve(Request::Publish(msg), true, ctx);
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
        self.serve(Request::Subscribe(msg), true, ctx);
        Ok(())
    }
}

impl Handler<PutState> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: PutState, ctx: &mut Self::Context) -> Self::Result {
        self.core.admit()?;
        self.serve(Request::Put(msg), true, ctx);
        Ok(())
    }
}

/// A request answered once the room serves it (maybe after holding it): a room that
/// stopped meanwhile sends the caller back to the rooms table.
fn answered<T: 'static>(reply: tokio::sync::oneshot::Receiver<Result<T, RoomGone>>) -> ResponseFuture<Result<T, RoomGone>> {
    Box::pin(async move { reply.await.unwrap_or(Err(RoomGone)) })
}

impl Handler<ReadState> for RoomActor {
    type Result = ResponseFuture<Result<StateView, RoomGone>>;

    fn handle(&mut self, _msg: ReadState, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = tokio::sync::oneshot::channel();
        match self.core.admit() {
            Ok(()) => self.serve(Request::ReadState(reply), true, ctx),
            Err(gone) => drop(reply.send(Err(gone))),
        }
        answered(answer)
    }
}

impl Handler<CloseWindow> for RoomActor {
    type Result = ();

    fn handle(&mut self, _msg: CloseWindow, _ctx: &mut Self::Context) {
        self.core.close_window();
    }
}

impl Handler<Unsubscribe> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: Unsubscribe, ctx: &mut Self::Context) {
        let core = &mut self.core;
        if core.subscribers.leave(msg.conn, msg.generation).is_some() {
            core.presence.leave(msg.conn);
            core.occupancy_check();
        }
        core.held.retain(|held| !matches!(held, Request::Subscribe(w) if w.conn == msg.conn && w.generation <= msg.generation));
        if let Some(shared) = self.log.shared() {
            shared.subscribers_changed(core, ctx);
        }
        core.last_active = Instant::now();
        core.report_load();
        core.presence_poke(ctx);
        self.linger(ctx);
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

impl Handler<ReadHistory> for RoomActor {
    type Result = ResponseFuture<Result<HistoryPage, RoomGone>>;

    fn handle(&mut self, msg: ReadHistory, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = tokio::sync::oneshot::channel();
        match self.core.admit() {
            Ok(()) => self.serve(Request::ReadHistory(msg, reply), true, ctx),
            Err(gone) => drop(reply.send(Err(gone))),
        }
        answered(answer)
    }
}
