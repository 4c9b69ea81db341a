//! The table of live room actors: finds or starts the actor of a room on one of the room
//! arbiters (chosen by hashing the name), and asks a room's successor when the actor a
//! request reached had just stopped for idleness (`Rooms::ask`). A lookup table, not a
//! message path: requests still go to rooms as messages.
//!
//! It also holds the parked subscribers of inbox rooms without an actor: a connection's
//! automatic inbox subscription costs an entry here, not an actor and a store read. The
//! room actor started for the inbox's first message (or history read, or explicit
//! subscribe) adopts them, and an inbox room whose only subscribers are automatic parks
//! them here again when it goes idle. In cluster mode each parked inbox is watched for
//! what other nodes store in it (`RoomLogs::watch_parked`), which starts its actor.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use actix::prelude::*;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::messages::*;
use super::room::{ParkedWatch, RoomActor, RoomHome, RoomLoad, RoomLogs, RoomSettings};
use crate::cluster::forward::WriterRefusal;
use crate::core::rules::namespaces::{Namespaces, RoomOptions};

/// How often a request is retried against a freshly started room actor.
const ATTEMPTS: usize = 3;
/// A resync after a NATS reconnect spreads the rooms' stream reads over this much per
/// live room, and at most [`RESYNC_SPREAD_MAX`].
const RESYNC_SPREAD_PER_ROOM: std::time::Duration = std::time::Duration::from_millis(2);
const RESYNC_SPREAD_MAX: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum RoomError {
    /// Every attempt reached a room actor that had just stopped.
    #[error("room is unavailable: room kept stopping")]
    KeptStopping,
    /// The room's actor ended with the publish in hand (the node is stopping).
    #[error("room is unavailable: room stopped before answering")]
    StoppedBeforeAnswering(#[source] oneshot::error::RecvError),
    /// Cluster mode: the room's writer took the publish and failed.
    #[error("room is unavailable: {0}")]
    Writer(#[from] WriterRefusal),
    #[error(transparent)]
    Publish(#[from] PublishFailed),
    /// Cells with their own NATS: the room is homed in another cell, whose writer did not
    /// answer (or none is alive there); nothing was written.
    #[error("room {room} is homed in cell {cell}, which did not answer: not written; retry with the same id")]
    HomeUnavailable { room: String, cell: String },
}

impl RoomError {
    /// The error code an HTTP answer or an `error` frame carries.
    pub fn code(&self) -> crate::protocol::ErrorCode {
        match self {
            RoomError::HomeUnavailable { .. } => crate::protocol::ErrorCode::RoomHomeUnavailable,
            _ => crate::protocol::ErrorCode::Unavailable,
        }
    }
}

/// A room actor's address as the table hands it out: shared, since every clone of an
/// actix address allocates (a subscription holds one for its life).
pub type RoomAddr = Arc<Addr<RoomActor>>;

/// Room actors and parked subscribers, under one lock: a room is either live here or
/// its subscribers are parked, never both.
#[derive(Default)]
struct Tables {
    live: HashMap<Arc<str>, RoomAddr>,
    parked: HashMap<Arc<str>, Vec<Parked>>,
    /// Cluster mode: the watch of each parked inbox; an entry lives and leaves with its
    /// `parked` entry.
    watches: HashMap<Arc<str>, ParkedWatch>,
    /// What each live non-inbox room reports of its load (the admin overview); an entry
    /// leaves with the room's `live` entry.
    loads: HashMap<Arc<str>, Arc<RoomLoad>>,
}

/// The busiest rooms the admin overview lists, and how long one answer is reused: the
/// pass over the live rooms runs at most once per [`BUSIEST_FRESH`], however many pages
/// poll.
pub const BUSIEST_MAX: usize = 20;
const BUSIEST_FRESH: std::time::Duration = std::time::Duration::from_millis(500);

/// A live room as the admin overview lists it.
pub type RoomLoadView = crate::core::nodes::busiest::RoomLoad<Arc<str>>;

pub struct RoomsInner {
    tables: Mutex<Tables>,
    arbiters: Mutex<Vec<Arbiter>>,
    handles: Vec<ArbiterHandle>,
    logs: Arc<dyn RoomLogs>,
    settings: RoomSettings,
    /// Each room's retention, window and presence come from its namespace.
    namespaces: Arc<Namespaces>,
    /// The last answer of [`Rooms::busiest`] and when it was made.
    busiest: Mutex<Option<(std::time::Instant, Arc<Vec<RoomLoadView>>)>>,
    /// The last answer of [`Rooms::lag`] and when it was made.
    lag: Mutex<Option<(std::time::Instant, Arc<RoomsLag>)>>,
}

/// The node's lag behind its rooms' streams (cluster mode; `core::nodes::lag`).
pub type RoomsLag = crate::core::nodes::lag::Worst<Arc<str>>;

impl RoomsInner {
    /// Park `subscribers` of `room` (no actor), watched from the first one on; `head`:
    /// what they were sent, when a retiring actor knows it. Yields the new watch's
    /// readiness, to wait for.
    fn park(
        self: &Arc<Self>,
        tables: &mut Tables,
        room: &Arc<str>,
        subscribers: impl IntoIterator<Item = Parked>,
        head: Option<u64>,
    ) -> Option<oneshot::Receiver<()>> {
        let waiting = tables.parked.entry(room.clone()).or_default();
        waiting.retain(|p| p.to.connected());
        waiting.extend(subscribers);
        // Most inboxes have one connection parked: no spare room for three more.
        waiting.shrink_to_fit();
        if waiting.is_empty() {
            tables.parked.remove(room);
            tables.watches.remove(room);
            return None;
        }
        if tables.watches.contains_key(room) {
            return None;
        }
        let weak = Arc::downgrade(self);
        let name = room.clone();
        let wake = Box::new(move |after: u64| {
            if let Some(inner) = weak.upgrade() {
                Rooms { inner }.wake_parked(&name, after);
            }
        });
        let mut watch = self.logs.watch_parked(room, head, wake)?;
        let ready = watch.ready();
        tables.watches.insert(room.clone(), watch);
        ready
    }

    /// Drop `room` from the table if `addr` is still its actor.
    pub(crate) fn forget(&self, room: &str, addr: &Addr<RoomActor>) {
        let mut tables = self.tables.lock();
        if tables.live.get(room).is_some_and(|current| **current == *addr) {
            tables.live.remove(room);
            tables.loads.remove(room);
        }
    }
}

impl RoomHome for RoomsInner {
    /// An idle inbox room stops: drop it from the table and park its (automatic)
    /// subscribers for the next actor of the room.
    fn retire(
        self: Arc<Self>,
        room: &Arc<str>,
        addr: &Addr<RoomActor>,
        subscribers: Vec<Parked>,
        head: u64,
    ) {
        let mut tables = self.tables.lock();
        if tables.live.get(room).is_some_and(|current| **current == *addr) {
            tables.live.remove(room);
            tables.loads.remove(room);
        }
        let subscribers: Vec<Parked> =
            subscribers.into_iter().filter(|p| p.to.connected()).collect();
        if !subscribers.is_empty() {
            // Nothing waits for the watch: what is stored before it begins, after `head`,
            // wakes the room as soon as it does.
            drop(self.park(&mut tables, room, subscribers, Some(head)));
        }
    }
}

/// Handle to the rooms table; cheap to clone.
#[derive(Clone)]
pub struct Rooms {
    inner: Arc<RoomsInner>,
}

impl Rooms {
    /// Start `threads` room arbiters; each room takes `settings` with its namespace's options.
    pub fn start(
        logs: Arc<dyn RoomLogs>,
        settings: RoomSettings,
        namespaces: Arc<Namespaces>,
        threads: usize,
    ) -> Rooms {
        let arbiters: Vec<Arbiter> = (0..threads.max(1)).map(|_| Arbiter::new()).collect();
        let handles = arbiters.iter().map(Arbiter::handle).collect();
        Rooms {
            inner: Arc::new(RoomsInner {
                tables: Mutex::new(Tables::default()),
                arbiters: Mutex::new(arbiters),
                handles,
                logs,
                settings,
                namespaces,
                busiest: Mutex::new(None),
                lag: Mutex::new(None),
            }),
        }
    }

    /// The options of `room`, from its namespace (else the global keys).
    pub fn options(&self, room: &str) -> &RoomOptions {
        self.inner.namespaces.resolve(room)
    }

    /// The actor of `room`, started (and loaded from the store) if it is not live.
    pub fn addr(&self, room: &str) -> RoomAddr {
        let mut tables = self.inner.tables.lock();
        self.live_or_start(&mut tables, room, None)
    }

    /// The live actor of `room`, or a new one that adopts the room's parked subscribers
    /// (cluster mode: replaying to them what the stream holds after `replay_after`).
    fn live_or_start(
        &self,
        tables: &mut Tables,
        room: &str,
        replay_after: Option<u64>,
    ) -> RoomAddr {
        if let Some(addr) = tables.live.get(room) {
            if addr.connected() {
                return addr.clone();
            }
        }
        let name: Arc<str> = room.into();
        let adopted = tables.parked.remove(room).unwrap_or_default();
        // The actor takes the room's live feed before it reads the stream.
        tables.watches.remove(room);
        let mut hasher = DefaultHasher::new();
        name.hash(&mut hasher);
        let arbiter = &self.inner.handles[hasher.finish() as usize % self.inner.handles.len()];
        let home: Arc<dyn RoomHome> = self.inner.clone();
        let settings = self.inner.settings.with_options(self.options(room));
        let (logs, weak) = (self.inner.logs.clone(), Arc::downgrade(&home));
        let actor_name = name.clone();
        let load = crate::core::rules::names::inbox_owner(room)
            .is_none()
            .then(|| Arc::new(RoomLoad::default()));
        match &load {
            Some(load) => tables.loads.insert(name.clone(), load.clone()),
            None => tables.loads.remove(room),
        };
        let addr = Arc::new(RoomActor::start_in_arbiter(arbiter, move |_| {
            let log = logs.open(&actor_name);
            RoomActor::new(actor_name, log, settings, weak)
                .adopting(adopted, replay_after)
                .reporting(load)
        }));
        tables.live.insert(name, addr.clone());
        addr
    }

    /// A connection's automatic inbox subscription: parked when the inbox has no actor
    /// (nothing is read), else subscribed to the live actor, which answers with a
    /// [`RoomUpdate::Subscribed`] the connection keeps to itself. `Some` names that actor.
    /// In cluster mode a new parked inbox's watch is subscribed before this returns, so
    /// everything stored after it reaches the connection (unless NATS is away: then after
    /// one attempt, at most NATS's request timeout).
    // The tables are dropped before the parked watch is awaited; the lint does not follow
    // the `drop` on that path.
    #[allow(clippy::await_holding_lock)]
    pub async fn subscribe_inbox(
        &self,
        room: &str,
        parked: Parked,
    ) -> Result<Option<RoomAddr>, RoomError> {
        for _ in 0..ATTEMPTS {
            let addr = {
                let mut tables = self.inner.tables.lock();
                match tables.live.get(room).filter(|addr| addr.connected()) {
                    Some(addr) => addr.clone(),
                    None => {
                        let ready = self.inner.park(&mut tables, &room.into(), [parked], None);
                        drop(tables);
                        if let Some(ready) = ready {
                            let _ = ready.await;
                        }
                        return Ok(None);
                    }
                }
            };
            let msg = Subscribe {
                conn: parked.conn,
                to: parked.to.clone(),
                since: None,
                epoch: None,
                reference: None,
                generation: parked.generation,
                automatic: true,
                state: false,
                member: None,
                presence: false,
            };
            match addr.send(msg).await {
                Ok(Ok(())) => return Ok(Some(addr)),
                Ok(Err(RoomGone)) | Err(_) => self.forget(room, &addr),
            }
        }
        Err(RoomError::KeptStopping)
    }

    /// End a subscription whose room actor the connection does not know (parked, or
    /// adopted since): drop it from the parked table, or tell the live actor.
    pub fn release(&self, room: &str, conn: ConnId, generation: u64) {
        let mut tables = self.inner.tables.lock();
        if let Some(waiting) = tables.parked.get_mut(room) {
            waiting.retain(|p| p.conn != conn || p.generation > generation);
            if waiting.is_empty() {
                tables.parked.remove(room);
                tables.watches.remove(room);
            }
        } else if let Some(addr) = tables.live.get(room) {
            addr.do_send(Unsubscribe { conn, generation });
        }
    }

    fn forget(&self, room: &str, addr: &Addr<RoomActor>) {
        self.inner.forget(room, addr);
    }

    /// Ask `room`'s actor (started if need be) the message `make` builds. An actor that
    /// had just stopped is forgotten and its successor asked, [`ATTEMPTS`] times in all;
    /// the answer comes with the actor that gave it.
    async fn ask_at<M, T>(
        &self,
        room: &str,
        mut make: impl FnMut() -> M,
    ) -> Result<(RoomAddr, T), RoomError>
    where
        M: Message<Result = Result<T, RoomGone>> + Send + 'static,
        T: Send + 'static,
        RoomActor: Handler<M>,
    {
        for _ in 0..ATTEMPTS {
            let addr = self.addr(room);
            match addr.send(make()).await {
                Ok(Ok(answer)) => return Ok((addr, answer)),
                Ok(Err(RoomGone)) | Err(_) => self.forget(room, &addr),
            }
        }
        Err(RoomError::KeptStopping)
    }

    /// [`Rooms::ask_at`], for the answer alone.
    async fn ask<M, T>(&self, room: &str, make: impl FnMut() -> M) -> Result<T, RoomError>
    where
        M: Message<Result = Result<T, RoomGone>> + Send + 'static,
        T: Send + 'static,
        RoomActor: Handler<M>,
    {
        self.ask_at(room, make).await.map(|(_, answer)| answer)
    }

    /// Ask for a write that answers once durable: `make` builds the message around the
    /// reply channel, and the room's answer on it is the result.
    async fn write<M>(
        &self,
        room: &str,
        mut make: impl FnMut(oneshot::Sender<Result<Published, PublishFailed>>) -> M,
    ) -> Result<Published, RoomError>
    where
        M: Message<Result = Result<(), RoomGone>> + Send + 'static,
        RoomActor: Handler<M>,
    {
        let mut answer = None;
        self.ask(room, || {
            let (reply, waiting) = oneshot::channel();
            answer = Some(waiting);
            make(reply)
        })
        .await?;
        match answer.expect("asked at least once").await {
            Ok(result) => result.map_err(RoomError::from),
            Err(gone) => Err(RoomError::StoppedBeforeAnswering(gone)),
        }
    }

    /// Append an event to `room`; resolves once it is durable.
    pub async fn publish(&self, room: &str, event: NewEvent) -> Result<Published, RoomError> {
        self.write(room, |reply| {
            let NewEvent { id, data, devices, from, state } = event.clone();
            Publish { id, data, devices, from, state, reply }
        })
        .await
    }

    /// Set `room`'s state as of its head; resolves once it is durable.
    pub async fn put_state(&self, room: &str, data: Arc<str>) -> Result<Published, RoomError> {
        self.write(room, |reply| PutState { data: data.clone(), reply }).await
    }

    /// `room`'s state, from the room's memory (the room reads it once, when it loads).
    pub async fn state(&self, room: &str) -> Result<StateView, RoomError> {
        self.ask(room, || ReadState).await
    }

    /// Subscribe a connection (`subscribe.automatic` is false: the automatic inbox
    /// subscription goes through [`subscribe_inbox`](Self::subscribe_inbox)); the room
    /// answers through `subscribe.to`.
    pub async fn subscribe(&self, room: &str, subscribe: Subscribe) -> Result<RoomAddr, RoomError> {
        self.ask_at(room, || subscribe.clone()).await.map(|(addr, ())| addr)
    }

    /// Who is in `room`: asked of its live actor, which counts this node's
    /// members; without one, no member is here and the other nodes' tables answer
    /// (no actor is started, nothing is read).
    pub async fn presence(
        &self,
        room: &str,
    ) -> Result<Result<crate::core::delivery::presence::View, PresenceOff>, RoomError> {
        for _ in 0..ATTEMPTS {
            let live =
                self.inner.tables.lock().live.get(room).filter(|addr| addr.connected()).cloned();
            let Some(addr) = live else {
                if !self.options(room).presence
                    || crate::core::rules::names::inbox_owner(room).is_some()
                {
                    return Ok(Err(PresenceOff));
                }
                return Ok(Ok(self.inner.settings.presence_hub.view(room, None)));
            };
            match addr.send(ReadPresence).await {
                Ok(Ok(view)) => return Ok(view),
                Ok(Err(RoomGone)) | Err(_) => self.forget(room, &addr),
            }
        }
        Err(RoomError::KeptStopping)
    }

    /// Read durable history of `room`.
    pub async fn history(
        &self,
        room: &str,
        since: u64,
        limit: usize,
    ) -> Result<HistoryPage, RoomError> {
        self.ask(room, || ReadHistory { since, limit }).await
    }

    /// Cluster mode: another node stored an event after seq `after` in a parked inbox:
    /// its actor starts and sends the parked subscribers everything after `after`.
    fn wake_parked(&self, room: &str, after: u64) {
        let mut tables = self.inner.tables.lock();
        if tables.parked.contains_key(room) {
            self.live_or_start(&mut tables, room, Some(after));
        }
    }

    /// Cluster mode: have every live room read what the live feed may have missed, at
    /// random moments over [`RESYNC_SPREAD_PER_ROOM`] × rooms (at most
    /// [`RESYNC_SPREAD_MAX`]), so a reconnect does not send every read to NATS at once.
    pub fn resync_all(&self) {
        let tables = self.inner.tables.lock();
        let spread = (RESYNC_SPREAD_PER_ROOM * tables.live.len() as u32).min(RESYNC_SPREAD_MAX);
        for addr in tables.live.values() {
            let after = spread.mul_f64(crate::world::random_u64() as f64 / u64::MAX as f64);
            addr.do_send(Resync { after });
        }
    }

    /// A promotion moved the rooms `moved` names to cell `to`: their actors close their
    /// subscribers (who resume there) and stop; the next actor reads the room where it
    /// moved.
    pub fn moved(&self, moved: impl Fn(&str) -> bool, to: &str) {
        let mut tables = self.inner.tables.lock();
        let rooms: Vec<Arc<str>> = tables.live.keys().filter(|room| moved(room)).cloned().collect();
        for room in rooms {
            if let Some(addr) = tables.live.remove(&room) {
                tables.loads.remove(&room);
                addr.do_send(HomeMoved { to: to.into() });
            }
        }
        // Parked inboxes: their watches take the old home's live copies only.
        let parked: Vec<Arc<str>> =
            tables.parked.keys().filter(|room| moved(room)).cloned().collect();
        for room in parked {
            tables.watches.remove(&room);
            for subscriber in tables.parked.remove(&room).unwrap_or_default() {
                subscriber.to.post(RoomUpdate::Moved { room: room.clone(), to: to.into() });
            }
        }
    }

    /// Have every live room send its open window now (the drain, before the Close
    /// frames); resolves once each room has sent it.
    pub async fn close_windows(&self) {
        let rooms: Vec<RoomAddr> = self.inner.tables.lock().live.values().cloned().collect();
        for addr in rooms {
            let _ = addr.send(CloseWindow).await;
        }
    }

    /// Whether `room` has a live actor now (a request to it starts none).
    pub fn is_live(&self, room: &str) -> bool {
        self.inner.tables.lock().live.get(room).is_some_and(|addr| addr.connected())
    }

    /// Rooms with a live actor.
    pub fn live_count(&self) -> usize {
        self.inner.tables.lock().live.len()
    }

    /// The live non-inbox rooms with the most explicit subscribers here (at most
    /// [`BUSIEST_MAX`]), busiest first, each with its durable head: what the rooms last
    /// reported, read without a message or a store read, in one pass over the live rooms
    /// at most every [`BUSIEST_FRESH`].
    pub fn busiest(&self) -> Arc<Vec<RoomLoadView>> {
        let mut cached = self.inner.busiest.lock();
        if let Some((at, answer)) = cached.as_ref() {
            if at.elapsed() < BUSIEST_FRESH {
                return answer.clone();
            }
        }
        let answer = {
            let tables = self.inner.tables.lock();
            let reported = tables
                .loads
                .iter()
                .filter(|(room, _)| tables.live.get(*room).is_some_and(|addr| addr.connected()))
                .map(|(room, load)| {
                    let (subscribers, head) = load.get();
                    RoomLoadView { room: room.clone(), subscribers, head }
                });
            Arc::new(crate::core::nodes::busiest::busiest(reported, BUSIEST_MAX))
        };
        *cached = Some((std::time::Instant::now(), answer.clone()));
        answer
    }

    /// How far behind their streams the live non-inbox rooms here applied their events
    /// lately (cluster mode; each room's last reading while `core::nodes::lag::READING_FRESH_MS`
    /// counts it): the worst room's events and the oldest event's age. Read from the
    /// rooms' load slots without a message, in one pass over the live rooms at most every
    /// [`BUSIEST_FRESH`], however often `/metrics` and the overview ask.
    pub fn lag(&self, now_ms: u64) -> Arc<RoomsLag> {
        let mut cached = self.inner.lag.lock();
        if let Some((at, answer)) = cached.as_ref() {
            if at.elapsed() < BUSIEST_FRESH {
                return answer.clone();
            }
        }
        let answer = {
            let tables = self.inner.tables.lock();
            let readings = tables.loads.iter().filter_map(|(room, load)| {
                let (reading, at) = load.lag();
                Some((room.clone(), crate::core::nodes::lag::fresh(reading, at, now_ms)?))
            });
            Arc::new(crate::core::nodes::lag::worst(readings))
        };
        *cached = Some((std::time::Instant::now(), answer.clone()));
        answer
    }

    /// Inbox rooms whose subscribers are parked (no actor).
    pub fn parked_count(&self) -> usize {
        self.inner.tables.lock().parked.len()
    }

    /// Stop every room actor and its arbiter, and wait for them. Events appended but not
    /// yet flushed stay in the store for the caller's final flush.
    pub fn shutdown(&self) {
        *self.inner.tables.lock() = Tables::default();
        let arbiters = std::mem::take(&mut *self.inner.arbiters.lock());
        for arbiter in &arbiters {
            arbiter.stop();
        }
        for arbiter in arbiters {
            let _ = arbiter.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::rules::limits::Retention;
    use crate::core::rules::namespaces::Overrides;

    /// A room's settings take retention, window and presence from its namespace, and keep
    /// the rest of the shared settings.
    #[test]
    fn room_settings_follow_the_rooms_namespace() {
        let shared = RoomSettings {
            metrics: Arc::new(crate::metrics::Metrics::new(Vec::new())),
            retention: Retention { max_events: 1000, max_age_ms: 86_400_000 },
            recovery_max_events: 77,
            idle_stop: Duration::from_secs(120),
            tick: Duration::from_secs(10),
            batch_window: Duration::from_millis(100),
            presence: true,
            presence_hub: crate::actors::room::PresenceHub::new(Duration::from_secs(1), 1000, None),
            occupancy: None,
        };
        let global = RoomOptions {
            history_size: 1000,
            history_ttl_secs: 86_400,
            batch_window_ms: 100,
            presence: true,
            max_event_bytes: 65536,
        };
        let quiet = Overrides {
            presence: Some(false),
            history_size: Some(5),
            batch_window_ms: Some(0),
            ..Overrides::default()
        };
        let table = Namespaces::new(global, vec![("quiet:".into(), quiet)]).unwrap();
        let room = shared.with_options(table.resolve("quiet:1"));
        assert!(!room.presence, "presence = false in the namespace");
        assert_eq!(room.retention, Retention { max_events: 5, max_age_ms: 86_400_000 });
        assert_eq!(room.batch_window, Duration::ZERO);
        assert_eq!(
            (room.recovery_max_events, room.tick),
            (77, Duration::from_secs(10)),
            "the rest is shared"
        );
        let other = shared.with_options(table.resolve("lobby"));
        assert!(other.presence, "default true");
        assert_eq!((other.retention, other.batch_window), (shared.retention, shared.batch_window));
    }
}
