//! One actor per live room: the room's [`SeqLog`], its subscribers and the publishers
//! waiting for durability. Events are written to the store as they are appended, and
//! delivered and acknowledged only after a (grouped) flush made them durable, so a
//! subscriber never sees an event a crash could take back.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::backlog::{Backlog, Reserve};
use super::messages::*;
use super::rooms::RoomsInner;
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
}

enum RoomState {
    /// Never created: no epoch yet. Reads answer empty; a write creates it.
    Absent,
    Live(SeqLog<Arc<Delivery>>),
    /// The stored state could not be read; every request gets an error.
    Failed(String),
}

/// How long an evicted slow consumer has to take its Close frame before its socket is
/// shut down.
const EVICT_GRACE: Duration = Duration::from_secs(2);

struct Subscriber {
    to: Recipient<RoomUpdate>,
    backlog: Arc<Backlog>,
    generation: u64,
}

struct Waiter {
    seq: u64,
    duplicate: bool,
    reply: oneshot::Sender<Result<Published, PublishFailed>>,
}

pub struct RoomActor {
    name: Arc<str>,
    store: Store,
    settings: RoomSettings,
    rooms: Weak<RoomsInner>,
    state: RoomState,
    subscribers: HashMap<ConnId, Subscriber>,
    waiting: Vec<Waiter>,
    /// When the running flush was requested.
    flushing_since: Option<Instant>,
    flushing: bool,
    last_active: Instant,
    stopped: bool,
}

/// Bytes a batch of events occupies in a connection's backlog.
pub fn events_bytes(events: &[Arc<Delivery>]) -> usize {
    events.iter().map(|e| e.json.len()).sum()
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
    pub fn load(name: Arc<str>, store: Store, settings: RoomSettings, rooms: Weak<RoomsInner>) -> Self {
        let state = match store.load_room(&name, settings.retention.max_events) {
            Ok(None) => RoomState::Absent,
            Ok(Some(stored)) => {
                let entries = stored
                    .events
                    .into_iter()
                    .map(|e| crate::core::seqlog::Entry {
                        seq: e.seq,
                        payload: render(&name, &e),
                        id: e.id.into(),
                        ts_ms: e.ts_ms,
                    })
                    .collect();
                let log = SeqLog::restore(stored.head.epoch, stored.head.head, entries, settings.retention);
                if let Some(oldest) = log.oldest() {
                    if let Err(error) = store.trim_events(&name, oldest) {
                        tracing::warn!(room = %name, %error, "could not trim history beyond retention");
                    }
                }
                RoomState::Live(log)
            }
            Err(error) => {
                tracing::error!(room = %name, %error, "room state unreadable");
                RoomState::Failed(error.to_string())
            }
        };
        RoomActor {
            name,
            store,
            settings,
            rooms,
            state,
            subscribers: HashMap::new(),
            waiting: Vec::new(),
            flushing_since: None,
            flushing: false,
            last_active: Instant::now(),
            stopped: false,
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
    fn live_log(&mut self) -> Result<&mut SeqLog<Arc<Delivery>>, String> {
        if let RoomState::Absent = self.state {
            let epoch = random_hex(8);
            self.store.create_room(&self.name, &epoch).map_err(|e| e.to_string())?;
            tracing::debug!(room = %self.name, %epoch, "room created");
            self.state = RoomState::Live(SeqLog::restore(epoch, 0, Vec::new(), self.settings.retention));
        }
        match &mut self.state {
            RoomState::Live(log) => Ok(log),
            RoomState::Failed(why) => Err(why.clone()),
            RoomState::Absent => unreachable!("created above"),
        }
    }

    fn trim_expired(&mut self) {
        if let RoomState::Live(log) = &mut self.state {
            if let Some(first_kept) = log.trim_expired(now_ms()) {
                match self.store.trim_events(&self.name, first_kept) {
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
        ctx.spawn(self.store.flush_soon().into_actor(self).map(move |result, room, ctx| room.flushed(upto, result, ctx)));
    }

    fn flushed(&mut self, upto: u64, result: Result<(), StoreError>, ctx: &mut Context<Self>) {
        self.flushing = false;
        if let Some(since) = self.flushing_since.take() {
            self.settings.metrics.store_flush_latency.observe(since.elapsed().as_secs_f64());
        }
        let RoomState::Live(log) = &mut self.state else { return };
        if let Err(error) = result {
            tracing::error!(room = %self.name, %error, "flush failed; publishers get an error, retrying");
            for waiter in self.waiting.drain(..) {
                let _ = waiter.reply.send(Err(PublishFailed::Store(error.to_string())));
            }
            ctx.run_later(Duration::from_secs(1), |room, ctx| room.request_flush(ctx));
            return;
        }
        let fresh: Arc<[Arc<Delivery>]> = log.mark_durable(upto).map(|e| e.payload.clone()).collect();
        if !fresh.is_empty() {
            let bytes = events_bytes(&fresh);
            let name = self.name.clone();
            // Subscribers that went away unsubscribe, and the tick prunes any left over.
            self.subscribers.retain(|conn, sub| {
                match sub.backlog.reserve(bytes) {
                    Reserve::Ok => {
                        sub.to.do_send(RoomUpdate::Events { room: name.clone(), events: fresh.clone() });
                        true
                    }
                    Reserve::EvictNow => {
                        tracing::info!(room = %name, conn, outstanding = sub.backlog.outstanding(), "slow consumer evicted");
                        self.settings.metrics.slow_consumer_closes.inc();
                        sub.to.do_send(RoomUpdate::SlowConsumer);
                        let backlog = sub.backlog.clone();
                        ctx.run_later(EVICT_GRACE, move |_, _| backlog.abort_socket());
                        false
                    }
                    Reserve::Evicted => false,
                }
            });
        }
        let epoch: Arc<str> = log.epoch().into();
        let (done, still): (Vec<_>, Vec<_>) = self.waiting.drain(..).partition(|w| w.seq <= upto);
        self.waiting = still;
        for waiter in done {
            let _ = waiter.reply.send(Ok(Published { seq: waiter.seq, epoch: epoch.clone(), duplicate: waiter.duplicate }));
        }
        self.request_flush(ctx);
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        self.trim_expired();
        self.subscribers.retain(|_, sub| sub.to.connected());
        let idle = self.subscribers.is_empty() && self.waiting.is_empty() && !self.flushing;
        if idle && self.last_active.elapsed() >= self.settings.idle_stop {
            if let Some(rooms) = self.rooms.upgrade() {
                rooms.forget(&self.name, &ctx.address());
            }
            self.stopped = true;
            tracing::debug!(room = %self.name, "idle room stopped");
            ctx.stop();
        }
    }
}

impl Actor for RoomActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.settings.tick, |room, ctx| room.tick(ctx));
    }
}

impl Handler<Publish> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: Publish, ctx: &mut Self::Context) -> Self::Result {
        self.admit()?;
        let name = self.name.clone();
        let store = self.store.clone();
        let log = match self.live_log() {
            Ok(log) => log,
            Err(why) => {
                let _ = msg.reply.send(Err(PublishFailed::Store(why)));
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
            let _ = msg.reply.send(Err(PublishFailed::Store(error.to_string())));
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
        self.trim_expired();
        let max_events = self.settings.recovery_max_events;
        let name = self.name.clone();
        let log = match self.live_log() {
            Ok(log) => log,
            Err(message) => {
                let generation = msg.generation;
                msg.to.do_send(RoomUpdate::Refused { room: name, reference: msg.reference, message, generation });
                return Ok(());
            }
        };
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
            head: log.durable(),
            recovered,
            replay,
            reference: msg.reference,
            generation: msg.generation,
        });
        self.subscribers.insert(msg.conn, Subscriber { to: msg.to, backlog: msg.backlog, generation: msg.generation });
        Ok(())
    }
}

impl Handler<Unsubscribe> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: Unsubscribe, _ctx: &mut Self::Context) {
        if self.subscribers.get(&msg.conn).is_some_and(|s| s.generation <= msg.generation) {
            self.subscribers.remove(&msg.conn);
        }
        self.last_active = Instant::now();
    }
}

impl Handler<ReadHistory> for RoomActor {
    type Result = Result<HistoryPage, RoomGone>;

    fn handle(&mut self, msg: ReadHistory, _ctx: &mut Self::Context) -> Self::Result {
        self.admit()?;
        self.trim_expired();
        Ok(match &self.state {
            RoomState::Absent | RoomState::Failed(_) => {
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
