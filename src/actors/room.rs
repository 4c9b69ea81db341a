//! One actor per live room: the room's [`SeqLog`], its subscribers, the publishers
//! waiting for durability and the batching window. Events are written to the store as
//! they are appended, and delivered and acknowledged only after a (grouped) flush made
//! them durable, so a subscriber never sees an event a crash could take back. Durable
//! events gather in the room's window; when it closes, its frame is rendered once and
//! the same bytes go to every subscriber.
//!
//! In cluster mode ([`RoomStore::Cluster`]) the room's log is its JetStream subject: the
//! actor loads the retained events when it starts, appends one event at a time with the
//! stream's expected-sequence guard (catching up and retrying when another node wrote
//! first), and takes other nodes' events from the live feed ([`LiveEvent`]), reading the
//! stream to fill any gap. Subscribers, recovery and batching are the same in both modes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::backlog::{Backlog, Reserve};
use super::messages::*;
use crate::cluster::roomlog::{self, AppendError, Appended, StreamEvent};
use crate::cluster::{Cluster, ClusterError};
use crate::core::batch::{BatchAction, BatchWindow};
use crate::core::seqlog::{Append, Recovery, Retention, SeqLog};
use crate::protocol;
use crate::store::{EventRecord, Store, StoreError};
use crate::world::{now_ms, random_hex};

/// Limits every room shares.
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
}

/// Where rooms keep their events: sled on a single node, JetStream in cluster mode.
#[derive(Clone)]
pub enum RoomStore {
    Local(Store),
    Cluster(Cluster),
}

/// How often an append that keeps losing to other nodes is retried before it fails.
const APPEND_ATTEMPTS: u32 = 20;

enum RoomState {
    /// Cluster mode: the retained events are being read from the stream.
    Loading,
    /// Never created: no epoch yet. Reads answer empty; a write creates it.
    Absent,
    Live(SeqLog<Arc<Delivery>>),
    /// The stored state could not be read; every request gets this error.
    Failed(RoomLogError),
}

struct Subscriber {
    to: Recipient<RoomUpdate>,
    backlog: Arc<Backlog>,
    generation: u64,
    /// A connection's automatic inbox subscription (see [`Parked`]).
    automatic: bool,
}

struct Waiter {
    seq: u64,
    duplicate: bool,
    reply: oneshot::Sender<Result<Published, PublishFailed>>,
}

/// Cluster mode: the append in flight and the publishes queued behind it.
#[derive(Default)]
struct ClusterLog {
    /// Stream sequence of the newest event the log holds (0: none).
    last_stream_seq: u64,
    queue: VecDeque<Publish>,
    appending: bool,
    catching_up: bool,
    /// Conflicts the front publish met so far.
    conflicts: u32,
    /// Subscribes that arrived while the stream could not be read.
    waiting_subscribers: Vec<Subscribe>,
    /// Parked subscribers adopted for a live event: once loaded, they get the events
    /// after this seq (the live event and any that came while loading).
    replay_after: Option<u64>,
}

/// What a room needs of the table that started it: a place to leave its automatic
/// subscribers when it stops idle. Defined here, implemented by the rooms table, so a room
/// does not know the table's type.
pub trait RoomHome: Send + Sync {
    fn retire(&self, room: &Arc<str>, addr: &Addr<RoomActor>, subscribers: Vec<Parked>);
}

pub struct RoomActor {
    name: Arc<str>,
    store: RoomStore,
    cluster: ClusterLog,
    settings: RoomSettings,
    home: Weak<dyn RoomHome>,
    state: RoomState,
    subscribers: HashMap<ConnId, Subscriber>,
    waiting: Vec<Waiter>,
    /// Durable events not yet sent to subscribers (contiguous seqs), and the window that
    /// sends them.
    pending: Vec<Arc<Delivery>>,
    window: BatchWindow,
    /// When the running flush was requested.
    flushing_since: Option<Instant>,
    flushing: bool,
    last_active: Instant,
    stopped: bool,
}

/// Render a stored event once for every subscriber.
fn render(room: &str, event: &EventRecord) -> Arc<Delivery> {
    Arc::new(Delivery {
        seq: event.seq,
        ts_ms: event.ts_ms,
        json: protocol::render_event(room, event.seq, &event.id, event.ts_ms, &event.data).into(),
        devices: event.devices.as_ref().map(|d| d.iter().map(|s| s.as_str().into()).collect()),
    })
}

impl RoomActor {
    /// Load the room from the store (a room never created starts `Absent`).
    pub fn load(name: Arc<str>, store: RoomStore, settings: RoomSettings, home: Weak<dyn RoomHome>) -> Self {
        let state = match &store {
            RoomStore::Local(local) => RoomActor::load_local(&name, local, &settings),
            RoomStore::Cluster(_) => RoomState::Loading,
        };
        RoomActor {
            name,
            store,
            cluster: ClusterLog::default(),
            home,
            state,
            subscribers: HashMap::new(),
            waiting: Vec::new(),
            pending: Vec::new(),
            window: BatchWindow::new(settings.batch_window),
            settings,
            flushing_since: None,
            flushing: false,
            last_active: Instant::now(),
            stopped: false,
        }
    }

    /// Take over the room's parked subscribers (automatic inbox subscriptions). They get
    /// no `Subscribed`: everything this actor delivers is newer than what they were sent.
    /// Cluster mode: `replay_after` names the live event that started the room.
    pub fn adopting(mut self, parked: Vec<Parked>, replay_after: Option<u64>) -> Self {
        if !parked.is_empty() && matches!(self.store, RoomStore::Cluster(_)) {
            self.cluster.replay_after = replay_after;
        }
        for p in parked {
            self.subscribers.insert(p.conn, Subscriber { to: p.to, backlog: p.backlog, generation: p.generation, automatic: true });
        }
        self
    }

    fn load_local(name: &Arc<str>, store: &Store, settings: &RoomSettings) -> RoomState {
        match store.load_room(&name, settings.retention.max_events) {
            Ok(None) => RoomState::Absent,
            Ok(Some(stored)) => {
                let entries = stored
                    .events
                    .into_iter()
                    .map(|e| crate::core::seqlog::Entry {
                        seq: e.seq,
                        payload: render(name, &e),
                        id: e.id.into(),
                        ts_ms: e.ts_ms,
                    })
                    .collect();
                let log = SeqLog::restore(stored.head.epoch, stored.head.head, entries, settings.retention);
                if let Some(oldest) = log.oldest() {
                    if let Err(error) = store.trim_events(name, oldest) {
                        tracing::warn!(room = %name, %error, "could not trim history beyond retention");
                    }
                }
                RoomState::Live(log)
            }
            Err(error) => {
                tracing::error!(room = %name, %error, "room state unreadable");
                RoomState::Failed(error.into())
            }
        }
    }

    fn local_store(&self) -> Option<&Store> {
        match &self.store {
            RoomStore::Local(store) => Some(store),
            RoomStore::Cluster(_) => None,
        }
    }

    /// Every request starts here: a stopped room sends the caller back to the rooms
    /// table, a live one counts the request as activity.
    fn admit(&mut self) -> Result<(), RoomGone> {
        if self.stopped {
            return Err(RoomGone);
        }
        self.last_active = Instant::now();
        Ok(())
    }

    /// The room's log, creating the room (a new epoch, head 0) on first write.
    fn live_log(&mut self) -> Result<&mut SeqLog<Arc<Delivery>>, RoomLogError> {
        if let (RoomState::Absent, RoomStore::Local(store)) = (&self.state, &self.store) {
            let epoch = random_hex(8);
            store.create_room(&self.name, &epoch)?;
            tracing::debug!(room = %self.name, %epoch, "room created");
            self.state = RoomState::Live(SeqLog::restore(epoch, 0, Vec::new(), self.settings.retention));
        }
        match &mut self.state {
            RoomState::Live(log) => Ok(log),
            RoomState::Failed(why) => Err(why.clone()),
            RoomState::Absent | RoomState::Loading => Err(RoomLogError::NotLoaded),
        }
    }

    fn trim_expired(&mut self) {
        if let RoomState::Live(log) = &mut self.state {
            let trimmed = log.trim_expired(now_ms());
            // In cluster mode the stream keeps the newest event: it holds the room's head.
            if let (Some(_), None, RoomStore::Cluster(cluster)) = (trimmed, log.oldest(), &self.store) {
                let (cluster, name) = (cluster.clone(), self.name.clone());
                actix::spawn(async move {
                    if let Err(error) = roomlog::purge_expired(&cluster, &name).await {
                        tracing::warn!(room = %name, %error, "could not delete expired history from the stream");
                    }
                });
            }
            if let (Some(first_kept), RoomStore::Local(store)) = (trimmed, &self.store) {
                match store.trim_events(&self.name, first_kept) {
                    Ok(removed) => {
                        self.settings.metrics.history_trimmed.inc_by(removed as u64);
                    }
                    Err(error) => tracing::warn!(room = %self.name, %error, "could not delete expired history"),
                };
            }
        }
    }

    /// Start a flush when events wait for one and none is running.
    fn request_flush(&mut self, ctx: &mut Context<Self>) {
        let RoomState::Live(log) = &self.state else { return };
        if self.flushing || log.head() == log.durable() {
            return;
        }
        self.flushing = true;
        self.flushing_since = Some(Instant::now());
        let upto = log.head();
        let Some(store) = self.local_store() else { return };
        ctx.spawn(store.flush_soon().into_actor(self).map(move |result, room, ctx| room.flushed(upto, result, ctx)));
    }

    fn flushed(&mut self, upto: u64, result: Result<(), StoreError>, ctx: &mut Context<Self>) {
        self.flushing = false;
        if let Some(since) = self.flushing_since.take() {
            self.settings.metrics.store_flush_latency.observe(since.elapsed().as_secs_f64());
        }
        let RoomState::Live(log) = &mut self.state else { return };
        if let Err(error) = result {
            tracing::error!(room = %self.name, %error, "flush failed; publishers get an error, retrying");
            let failed = PublishFailed::from(error);
            for waiter in self.waiting.drain(..) {
                let _ = waiter.reply.send(Err(failed.clone()));
            }
            ctx.run_later(Duration::from_secs(1), |room, ctx| room.request_flush(ctx));
            return;
        }
        let fresh: Vec<Arc<Delivery>> = log.mark_durable(upto).map(|e| e.payload.clone()).collect();
        let epoch: Arc<str> = log.epoch().into();
        self.deliver(fresh, ctx);
        let (done, still): (Vec<_>, Vec<_>) = self.waiting.drain(..).partition(|w| w.seq <= upto);
        self.waiting = still;
        for waiter in done {
            let _ = waiter.reply.send(Ok(Published { seq: waiter.seq, epoch: epoch.clone(), duplicate: waiter.duplicate }));
        }
        self.request_flush(ctx);
    }

    /// Newly durable events join the open window; the first one opens it (window 0:
    /// they leave at once). With nobody subscribed there is nobody to send them to: a
    /// later subscriber starts after them (or gets them in its replay).
    fn deliver(&mut self, fresh: Vec<Arc<Delivery>>, ctx: &mut Context<Self>) {
        if fresh.is_empty() || self.subscribers.is_empty() {
            return;
        }
        self.pending.extend(fresh);
        match self.window.on_event(Instant::now()) {
            BatchAction::SendNow => self.close_window(),
            BatchAction::ArmTimer(at) => {
                ctx.run_later(at.saturating_duration_since(Instant::now()), |room, _| room.close_window());
            }
            BatchAction::Wait => {}
        }
    }

    /// Send the window's events, rendered once, to every subscriber, evicting those too
    /// far behind. The window's metrics are taken here, once, not per subscriber.
    fn close_window(&mut self) {
        self.window.on_sent();
        if self.pending.is_empty() {
            return;
        }
        let events = std::mem::take(&mut self.pending);
        let metrics = &self.settings.metrics;
        metrics.batch_events.observe(events.len() as f64);
        metrics.delivery_latency.observe(now_ms().saturating_sub(events[0].ts_ms) as f64 / 1000.0);
        for window in Window::cut(events) {
            self.send_window(window);
        }
    }

    fn send_window(&mut self, window: Arc<Window>) {
        let bytes = window.frame.len();
        let (name, metrics) = (&self.name, &self.settings.metrics);
        // Subscribers that went away unsubscribe, and the tick prunes any left over.
        self.subscribers.retain(|conn, sub| match sub.backlog.reserve(bytes) {
            Reserve::Ok => {
                sub.to.do_send(RoomUpdate::Events { room: name.clone(), window: window.clone() });
                true
            }
            Reserve::EvictNow => {
                tracing::info!(room = %name, conn, outstanding = sub.backlog.outstanding(), "slow consumer evicted");
                metrics.slow_consumer_closes.inc();
                sub.to.do_send(RoomUpdate::SlowConsumer);
                false
            }
            Reserve::Evicted => false,
        });
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        self.trim_expired();
        if !self.subscribers.is_empty() {
            // A live copy lost while NATS reconnected is found here at the latest.
            self.catch_up(ctx);
        }
        self.subscribers.retain(|_, sub| sub.to.connected());
        // An inbox followed only by its users' automatic subscriptions parks them and
        // stops like an unwatched room: its actor lives while messages come.
        let unwatched = self.subscribers.values().all(|sub| sub.automatic);
        let idle = unwatched
            && self.waiting.is_empty()
            && self.pending.is_empty()
            && !self.flushing
            && self.cluster.queue.is_empty()
            && self.cluster.waiting_subscribers.is_empty()
            && !self.cluster.appending
            && !matches!(self.state, RoomState::Loading);
        if idle && self.last_active.elapsed() >= self.settings.idle_stop {
            let parked: Vec<Parked> = self
                .subscribers
                .drain()
                .map(|(conn, sub)| Parked { conn, to: sub.to, backlog: sub.backlog, generation: sub.generation })
                .collect();
            if let Some(home) = self.home.upgrade() {
                home.retire(&self.name, &ctx.address(), parked);
            }
            self.stopped = true;
            tracing::debug!(room = %self.name, "idle room stopped");
            ctx.stop();
        }
    }
}

/// Cluster mode: loading, appending through the stream's guard, catching up.
impl RoomActor {
    fn start_loading(&mut self, ctx: &mut Context<Self>) {
        let RoomStore::Cluster(cluster) = &self.store else { return };
        self.state = RoomState::Loading;
        let (cluster, name) = (cluster.clone(), self.name.clone());
        // Requests wait in the mailbox until the room is loaded.
        ctx.wait(async move { roomlog::load(&cluster, &name).await }.into_actor(self).map(|loaded, room, ctx| room.loaded(loaded, ctx)));
    }

    fn loaded(&mut self, loaded: Result<roomlog::LoadedRoom, ClusterError>, ctx: &mut Context<Self>) {
        match loaded {
            Ok(stored) => {
                let head = stored.events.last().map_or(0, |e| e.event.seq);
                self.cluster.last_stream_seq = stored.events.last().map_or(0, |e| e.stream_seq);
                let entries = stored.events.iter().map(|e| self.entry(&e.event)).collect();
                let log = SeqLog::restore(stored.epoch, head, entries, self.settings.retention);
                let replay: Vec<Arc<Delivery>> = match self.cluster.replay_after.take() {
                    Some(after) => log.read(after, usize::MAX).0.into_iter().map(|e| e.payload.clone()).collect(),
                    None => Vec::new(),
                };
                self.state = RoomState::Live(log);
                tracing::debug!(room = %self.name, head, adopted = self.subscribers.len(), "room loaded from the stream");
                // The only subscribers yet are the adopted ones: requests wait for the load.
                if !replay.is_empty() {
                    for window in Window::cut(replay) {
                        self.send_window(window);
                    }
                }
                for waiting in std::mem::take(&mut self.cluster.waiting_subscribers) {
                    self.subscribe(waiting);
                }
            }
            Err(error) => {
                tracing::warn!(room = %self.name, %error, "room could not be read from the stream; retrying");
                self.state = RoomState::Failed(error.into());
                ctx.run_later(Duration::from_secs(1), |room, ctx| {
                    if matches!(room.state, RoomState::Failed(_)) && !room.stopped {
                        room.start_loading(ctx);
                    }
                });
            }
        }
    }

    fn entry(&self, event: &EventRecord) -> crate::core::seqlog::Entry<Arc<Delivery>> {
        crate::core::seqlog::Entry { seq: event.seq, payload: render(&self.name, event), id: event.id.as_str().into(), ts_ms: event.ts_ms }
    }

    fn publish_clustered(&mut self, msg: Publish, ctx: &mut Context<Self>) {
        let log = match self.live_log() {
            Ok(log) => log,
            Err(why) => {
                let _ = msg.reply.send(Err(why.into()));
                return;
            }
        };
        if let Some(seq) = log.seq_of(&msg.id) {
            let _ = msg.reply.send(Ok(Published { seq, epoch: log.epoch().into(), duplicate: true }));
            return;
        }
        self.cluster.queue.push_back(msg);
        self.pump(ctx);
    }

    /// Start appending the first queued publish, unless an append or catch-up runs.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.cluster.appending || self.cluster.catching_up {
            return;
        }
        let RoomStore::Cluster(cluster) = &self.store else { return };
        let RoomState::Live(log) = &self.state else {
            for msg in self.cluster.queue.drain(..) {
                let _ = msg.reply.send(Err(RoomLogError::NotLoaded.into()));
            }
            return;
        };
        // A queued id the stream got meanwhile (a retry racing its original) is answered.
        while let Some(seq) = self.cluster.queue.front().and_then(|front| log.seq_of(&front.id)) {
            let msg = self.cluster.queue.pop_front().expect("front exists");
            let _ = msg.reply.send(Ok(Published { seq, epoch: log.epoch().into(), duplicate: true }));
        }
        let Some(front) = self.cluster.queue.front() else { return };
        let record = EventRecord {
            seq: log.head() + 1,
            id: front.id.to_string(),
            ts_ms: now_ms(),
            data: front.data.to_string(),
            devices: front.devices.clone(),
        };
        self.cluster.appending = true;
        let (cluster, name, expected) = (cluster.clone(), self.name.clone(), self.cluster.last_stream_seq);
        let append = async move {
            let result = roomlog::append(&cluster, &name, expected, &record).await;
            (record, result)
        };
        ctx.spawn(append.into_actor(self).map(|(record, result), room, ctx| room.appended(record, result, ctx)));
    }

    fn appended(&mut self, record: EventRecord, result: Result<Appended, AppendError>, ctx: &mut Context<Self>) {
        self.cluster.appending = false;
        match result {
            Ok(Appended { stream_seq, duplicate: false }) => {
                self.cluster.conflicts = 0;
                let seq = record.seq;
                self.apply(StreamEvent { stream_seq, event: record }, ctx);
                if let (Some(msg), RoomState::Live(log)) = (self.cluster.queue.pop_front(), &self.state) {
                    let _ = msg.reply.send(Ok(Published { seq, epoch: log.epoch().into(), duplicate: false }));
                }
                self.pump(ctx);
            }
            // Stored before (a retried publish): read what this node missed, then the
            // queue answers it as a duplicate. Counted like a conflict, so an id whose
            // event is no longer in the history cannot loop.
            Ok(Appended { duplicate: true, .. }) | Err(AppendError::Conflict) => {
                self.cluster.conflicts += 1;
                if matches!(result, Err(AppendError::Conflict)) {
                    self.settings.metrics.cluster_append_conflicts.inc();
                }
                if self.cluster.conflicts >= APPEND_ATTEMPTS {
                    self.cluster.conflicts = 0;
                    if let Some(msg) = self.cluster.queue.pop_front() {
                        let _ = msg.reply.send(Err(PublishFailed::Contended));
                    }
                }
                self.catch_up(ctx);
            }
            Err(AppendError::Cluster(error)) => {
                tracing::warn!(room = %self.name, %error, "append to the stream failed");
                self.cluster.conflicts = 0;
                if let Some(msg) = self.cluster.queue.pop_front() {
                    let _ = msg.reply.send(Err(error.into()));
                }
                // A timed-out append may be stored anyway: read before the next one.
                self.catch_up(ctx);
            }
        }
    }

    /// Read what the stream holds beyond this node's head, then go on appending.
    fn catch_up(&mut self, ctx: &mut Context<Self>) {
        if self.cluster.catching_up || self.stopped {
            return;
        }
        let (RoomStore::Cluster(cluster), RoomState::Live(_)) = (&self.store, &self.state) else { return };
        self.cluster.catching_up = true;
        let (cluster, name, after) = (cluster.clone(), self.name.clone(), self.cluster.last_stream_seq);
        let read = async move { roomlog::read_after(&cluster, &name, after).await };
        ctx.spawn(read.into_actor(self).map(|result, room, ctx| {
            room.cluster.catching_up = false;
            match result {
                Ok(events) => {
                    for event in events {
                        room.apply_or_jump(event, ctx);
                    }
                    room.pump(ctx);
                }
                Err(error) => {
                    tracing::warn!(room = %room.name, %error, "catching up from the stream failed; retrying");
                    let failed = PublishFailed::from(error);
                    for msg in room.cluster.queue.drain(..) {
                        let _ = msg.reply.send(Err(failed.clone()));
                    }
                    ctx.run_later(Duration::from_millis(500), |room, ctx| room.catch_up(ctx));
                }
            }
        }));
    }

    /// Take an event from the stream: the next seq is appended and delivered, an older
    /// one is ignored, and a gap is filled by reading the stream first.
    fn apply(&mut self, stored: StreamEvent, ctx: &mut Context<Self>) {
        let RoomState::Live(log) = &mut self.state else { return };
        let seq = stored.event.seq;
        if seq <= log.head() {
            return;
        }
        if seq > log.head() + 1 {
            self.catch_up(ctx);
            return;
        }
        let payload = render(&self.name, &stored.event);
        if log.append_sequenced(seq, stored.event.id.as_str().into(), stored.event.ts_ms, payload.clone()).is_ok() {
            self.cluster.last_stream_seq = stored.stream_seq;
            self.deliver(vec![payload], ctx);
        }
    }

    /// [`RoomActor::apply`] for events read from the stream: when the stream no longer
    /// holds the next seq (its retention dropped it), the log jumps to what it holds.
    fn apply_or_jump(&mut self, stored: StreamEvent, ctx: &mut Context<Self>) {
        if let RoomState::Live(log) = &mut self.state {
            if stored.event.seq > log.head() + 1 {
                tracing::warn!(room = %self.name, head = log.head(), next = stored.event.seq, "events beyond the stream's retention are gone; skipping ahead");
                let epoch = log.epoch().to_string();
                *log = SeqLog::restore(epoch, stored.event.seq - 1, Vec::new(), self.settings.retention);
            }
        }
        self.apply(stored, ctx);
    }
}

impl Handler<LiveEvent> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: LiveEvent, ctx: &mut Self::Context) {
        self.apply(msg.0, ctx);
    }
}

impl Handler<Resync> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: Resync, ctx: &mut Self::Context) {
        ctx.run_later(msg.after, |room, ctx| room.catch_up(ctx));
    }
}

impl Actor for RoomActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.settings.tick, |room, ctx| room.tick(ctx));
        self.start_loading(ctx);
    }
}

impl Handler<Publish> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: Publish, ctx: &mut Self::Context) -> Self::Result {
        self.admit()?;
        if let RoomStore::Cluster(_) = self.store {
            self.publish_clustered(msg, ctx);
            return Ok(());
        }
        let name = self.name.clone();
        let Some(store) = self.local_store().cloned() else { return Ok(()) };
        let log = match self.live_log() {
            Ok(log) => log,
            Err(why) => {
                let _ = msg.reply.send(Err(why.into()));
                return Ok(());
            }
        };
        if let Some(seq) = log.seq_of(&msg.id) {
            if seq <= log.durable() {
                let published = Published { seq, epoch: log.epoch().into(), duplicate: true };
                let _ = msg.reply.send(Ok(published));
            } else {
                self.waiting.push(Waiter { seq, duplicate: true, reply: msg.reply });
            }
            return Ok(());
        }
        let ts_ms = now_ms();
        let record = EventRecord {
            seq: log.head() + 1,
            id: msg.id.to_string(),
            ts_ms,
            data: msg.data.to_string(),
            devices: msg.devices,
        };
        if let Err(error) = store.append_event(&name, log.epoch(), &record) {
            tracing::error!(room = %name, %error, "store write failed");
            let _ = msg.reply.send(Err(error.into()));
            return Ok(());
        }
        let rendered = render(&name, &record);
        match log.append(msg.id, ts_ms, |_| rendered) {
            Append::Appended { seq, trimmed_below } => {
                if let Some(first_kept) = trimmed_below {
                    match store.trim_events(&name, first_kept) {
                        Ok(removed) => {
                            self.settings.metrics.history_trimmed.inc_by(removed as u64);
                        }
                        Err(error) => tracing::warn!(room = %name, %error, "could not delete trimmed history"),
                    };
                }
                self.waiting.push(Waiter { seq, duplicate: false, reply: msg.reply });
            }
            Append::Duplicate { .. } => unreachable!("checked by seq_of above"),
        }
        self.request_flush(ctx);
        Ok(())
    }
}

impl Handler<Subscribe> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: Subscribe, _ctx: &mut Self::Context) -> Self::Result {
        self.admit()?;
        // Cluster mode, stream unreachable: the subscriber waits for the room to load
        // (the load is retried every second) instead of being refused for good.
        if let (RoomState::Failed(_), RoomStore::Cluster(_)) = (&self.state, &self.store) {
            self.cluster.waiting_subscribers.push(msg);
            return Ok(());
        }
        self.subscribe(msg);
        Ok(())
    }
}

impl RoomActor {
    /// Add a subscriber at the durable head: it gets the replay up to that head now, and
    /// of the open window's events only those after it (the connection drops the rest).
    fn subscribe(&mut self, msg: Subscribe) {
        self.trim_expired();
        let max_events = self.settings.recovery_max_events;
        let name = self.name.clone();
        // A subscribe overtaken by a newer one of the same connection is void (the
        // connection sees its generation is stale and never waits for an answer).
        if self.subscribers.get(&msg.conn).is_some_and(|s| s.generation > msg.generation) {
            return;
        }
        // An inbox never written to is not created for its automatic subscription.
        if msg.automatic && matches!(self.state, RoomState::Absent) {
            let subscriber = Subscriber { to: msg.to, backlog: msg.backlog, generation: msg.generation, automatic: true };
            self.subscribers.insert(msg.conn, subscriber);
            return;
        }
        let log = match self.live_log() {
            Ok(log) => log,
            Err(why) => {
                let (generation, message) = (msg.generation, why.to_string());
                msg.to.do_send(RoomUpdate::Refused { room: name, reference: msg.reference, message, generation });
                return;
            }
        };
        let head = log.durable();
        let (recovered, replay) = match msg.since {
            None => (None, Vec::new()),
            Some(since) => match log.recover(since, msg.epoch.as_deref(), max_events) {
                Recovery::Replay(events) => (Some(true), events.into_iter().map(|e| e.payload.clone()).collect()),
                Recovery::NotRecovered(why) => {
                    tracing::debug!(room = %name, since, ?why, "recovery refused");
                    (Some(false), Vec::new())
                }
            },
        };
        msg.to.do_send(RoomUpdate::Subscribed {
            room: name,
            epoch: log.epoch().into(),
            head,
            recovered,
            replay,
            reference: msg.reference,
            generation: msg.generation,
        });
        let subscriber = Subscriber { to: msg.to, backlog: msg.backlog, generation: msg.generation, automatic: msg.automatic };
        self.subscribers.insert(msg.conn, subscriber);
    }
}

impl Handler<CloseWindow> for RoomActor {
    type Result = ();

    fn handle(&mut self, _msg: CloseWindow, _ctx: &mut Self::Context) {
        self.close_window();
    }
}

impl Handler<Unsubscribe> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: Unsubscribe, _ctx: &mut Self::Context) {
        if self.subscribers.get(&msg.conn).is_some_and(|s| s.generation <= msg.generation) {
            self.subscribers.remove(&msg.conn);
        }
        self.cluster.waiting_subscribers.retain(|w| w.conn != msg.conn || w.generation > msg.generation);
        self.last_active = Instant::now();
    }
}

impl Handler<ReadHistory> for RoomActor {
    type Result = Result<HistoryPage, RoomGone>;

    fn handle(&mut self, msg: ReadHistory, _ctx: &mut Self::Context) -> Self::Result {
        self.admit()?;
        self.trim_expired();
        Ok(match &self.state {
            RoomState::Absent | RoomState::Failed(_) | RoomState::Loading => {
                HistoryPage { epoch: None, head: 0, events: Vec::new(), complete: matches!(self.state, RoomState::Absent) }
            }
            RoomState::Live(log) => {
                let (events, complete) = log.read(msg.since, msg.limit);
                HistoryPage {
                    epoch: Some(log.epoch().into()),
                    head: log.durable(),
                    events: events.into_iter().map(|e| e.payload.clone()).collect(),
                    complete,
                }
            }
        })
    }
}
