//! A room's log in cluster mode: the room's JetStream subject. The room loads the
//! retained events when it starts, appends one event at a time with the stream's
//! expected-sequence guard (catching up and retrying when another node wrote first),
//! and takes other nodes' events from the live feed ([`LiveEvent`]), reading the stream
//! to fill any gap. An event is delivered only once the stream stored it. A state rides
//! in its event's message, then the writer stores it as the room's latest-state record
//! (`PUT`s too, queued between appends); other nodes take those records from the live
//! feed in the state stream's order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::{id_key, later, publish_key, render, spawn_then, wait_then, Log, LogPart, RoomActor, RoomCore, RoomLog, RoomLogs, SharedLog};
use crate::actors::messages::*;
use crate::cluster::roomlog::{self, AppendError, Appended, LoadedRoom, StoredState, StreamEvent};
use crate::cluster::{Cluster, ClusterError};
use crate::core::backoff::{Backoff, BackoffPolicy, Jitter};
use crate::core::seqlog::{Entry, SeqLog};
use crate::store::EventRecord;
use crate::world::{now_ms, random_u64};

/// How often an append that keeps losing to other nodes is retried before it fails.
const APPEND_ATTEMPTS: u32 = 20;
/// Reading the stream again after a failed load or catch-up: the rooms of a node that
/// lost NATS together retry spread out, and less often the longer it lasts.
const READ_RETRY: BackoffPolicy =
    BackoffPolicy { first: Duration::from_millis(500), max: Duration::from_secs(5), jitter: Jitter::Full };

/// The cluster's room logs, one JetStream subject per room.
pub struct StreamRoomLogs(pub Cluster);

impl RoomLogs for StreamRoomLogs {
    fn open(&self, _room: &Arc<str>) -> Log {
        Log::Stream(Box::new(StreamLog {
            cluster: self.0.clone(),
            last_stream_seq: 0,
            queue: VecDeque::new(),
            puts: VecDeque::new(),
            state_version: 0,
            appending: false,
            front_in_flight: false,
            catching_up: false,
            conflicts: 0,
            waiting_subscribers: Vec::new(),
            replay_after: None,
            read_retry: Backoff::new(READ_RETRY),
        }))
    }
}

/// One room's log on its JetStream subject: the append in flight and the publishes
/// queued behind it.
pub struct StreamLog {
    cluster: Cluster,
    /// Stream sequence of the newest event the log holds (0: none).
    last_stream_seq: u64,
    queue: VecDeque<Publish>,
    /// `PUT`s of the room's state, written between appends (each as of the head then).
    puts: VecDeque<PutState>,
    /// Sequence on `LG_STATE` of the newest latest-state record this room took.
    state_version: u64,
    /// An append or a state write is in flight.
    appending: bool,
    /// The append in flight is of the front publish, which no failed catch-up answered
    /// meanwhile: its result answers it.
    front_in_flight: bool,
    catching_up: bool,
    /// Conflicts the front publish met so far.
    conflicts: u32,
    /// Subscribes that arrived while the stream could not be read.
    waiting_subscribers: Vec<Subscribe>,
    /// Parked subscribers adopted for a live event: once loaded, they get the events
    /// after this seq (the live event and any that came while loading).
    replay_after: Option<u64>,
    /// Failed loads or catch-ups in a row.
    read_retry: Backoff,
}

fn entry(room: &str, event: &EventRecord) -> Entry<Arc<Delivery>> {
    Entry { seq: event.seq, payload: render(room, event), id: id_key(event), ts_ms: event.ts_ms }
}

impl LogPart for StreamLog {
    fn part(log: &mut Log) -> Option<&mut Self> {
        match log {
            Log::Stream(stream) => Some(stream.as_mut()),
            _ => None,
        }
    }
}

impl StreamLog {
    fn loaded(&mut self, room: &mut RoomCore, loaded: Result<LoadedRoom, ClusterError>, ctx: &mut Context<RoomActor>) {
        match loaded {
            Ok(stored) => {
                self.read_retry.reset();
                let head = stored.events.last().map_or(0, |e| e.event.seq);
                self.last_stream_seq = stored.events.last().map_or(0, |e| e.stream_seq);
                let name = room.name().clone();
                let entries = stored.events.iter().map(|e| entry(&name, &e.event)).collect();
                let keep = room.retention().max_events;
                if stored.events.len() > keep {
                    // The stream keeps the largest namespace's history; this room keeps its own.
                    let (cluster, name) = (self.cluster.clone(), name.clone());
                    actix::spawn(async move {
                        if let Err(error) = roomlog::purge_beyond(&cluster, &name, keep as u64).await {
                            tracing::warn!(room = %name, %error, "could not delete history beyond the room's size from the stream");
                        }
                    });
                }
                room.go_live(SeqLog::restore(stored.epoch, head, entries, room.retention()));
                self.state_version = self.state_version.max(stored.state_version);
                // A record beyond the stream's head belongs to a wiped stream (a new epoch).
                let state = stored.state.filter(|state| state.seq <= head);
                room.restore_state(state.map(|StoredState { seq, data }| StateAt { seq, data: data.into() }));
                tracing::debug!(room = %name, head, adopted = room.subscriber_count(), "room loaded from the stream");
                // The only subscribers yet are the adopted ones: requests wait for the load.
                if let Some(after) = self.replay_after.take() {
                    room.replay_adopted(after);
                }
                for waiting in std::mem::take(&mut self.waiting_subscribers) {
                    room.subscribe(waiting, self);
                }
                room.report_load();
            }
            Err(error) => {
                tracing::warn!(room = %room.name(), %error, "room could not be read from the stream; retrying");
                room.fail(error.into());
                later(ctx, self.read_retry.next_delay(random_u64()), |stream: &mut StreamLog, room, ctx| {
                    if room.is_failed() && !room.is_stopped() {
                        stream.load(room, ctx);
                    }
                });
            }
        }
    }

    /// Start appending the first queued publish, unless an append or catch-up runs.
    fn pump(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>) {
        if self.appending || self.catching_up {
            return;
        }
        let Some(log) = room.live() else {
            for msg in self.queue.drain(..) {
                let _ = msg.reply.send(Err(RoomLogError::NotLoaded.into()));
            }
            for put in self.puts.drain(..) {
                let _ = put.reply.send(Err(RoomLogError::NotLoaded.into()));
            }
            return;
        };
        if let Some(put) = self.puts.pop_front() {
            let state = StoredState { seq: log.head(), data: put.data.to_string() };
            let epoch: Arc<str> = log.epoch().into();
            self.appending = true;
            let (cluster, name) = (self.cluster.clone(), room.name().clone());
            let write = async move {
                let result = roomlog::write_state(&cluster, &name, &state).await;
                (state, result)
            };
            spawn_then(ctx, write, move |stream: &mut StreamLog, room, (state, result), ctx| {
                stream.appending = false;
                match result {
                    Ok(version) => {
                        stream.state_version = stream.state_version.max(version);
                        let seq = state.seq;
                        room.offer_state(StateAt { seq, data: state.data.into() });
                        let _ = put.reply.send(Ok(Published { seq, epoch, duplicate: false }));
                    }
                    Err(error) => {
                        tracing::warn!(room = %room.name(), %error, "state write to the stream failed");
                        let _ = put.reply.send(Err(error.into()));
                    }
                }
                stream.pump(room, ctx);
            });
            return;
        }
        // A queued id the stream got meanwhile (a retry racing its original) is answered.
        while let Some(seq) = self.queue.front().and_then(|front| log.seq_of(&publish_key(front))) {
            let msg = self.queue.pop_front().expect("front exists");
            let _ = msg.reply.send(Ok(Published { seq, epoch: log.epoch().into(), duplicate: true }));
        }
        let Some(front) = self.queue.front() else { return };
        let record = EventRecord {
            seq: log.head() + 1,
            id: front.id.to_string(),
            ts_ms: now_ms(),
            data: front.data.to_string(),
            devices: front.devices.clone(),
            from: front.from.clone(),
        };
        let state = front.state.as_deref().map(str::to_string);
        self.appending = true;
        self.front_in_flight = true;
        let (cluster, name, expected) = (self.cluster.clone(), room.name().clone(), self.last_stream_seq);
        let append = async move {
            let result = roomlog::append(&cluster, &name, expected, &record, state.as_deref()).await;
            // The event carries its state; the latest-state record, written after it in
            // order (one append at a time), keeps it once the history drops the event.
            let mut version = None;
            if let (Ok(Appended { duplicate: false, .. }), Some(data)) = (&result, &state) {
                let latest = StoredState { seq: record.seq, data: data.clone() };
                match roomlog::write_state(&cluster, &name, &latest).await {
                    Ok(v) => version = Some(v),
                    Err(error) => tracing::warn!(room = %name, %error, "latest-state record not written; the event keeps the state"),
                }
            }
            (record, state, version, result)
        };
        spawn_then(ctx, append, |stream: &mut StreamLog, room, (record, state, version, result), ctx| {
            if let Some(version) = version {
                stream.state_version = stream.state_version.max(version);
            }
            stream.appended(room, record, state, result, ctx)
        });
    }

    fn appended(
        &mut self,
        room: &mut RoomCore,
        record: EventRecord,
        state: Option<String>,
        result: Result<Appended, AppendError>,
        ctx: &mut Context<RoomActor>,
    ) {
        self.appending = false;
        // Its publish, unless a failed catch-up answered it meanwhile: then the result
        // answers nobody (the front is a later publish, not appended yet).
        let answers_front = std::mem::take(&mut self.front_in_flight);
        let answered = |queue: &mut VecDeque<Publish>| if answers_front { queue.pop_front() } else { None };
        match result {
            Ok(Appended { stream_seq, duplicate: false }) => {
                self.conflicts = 0;
                let seq = record.seq;
                self.apply(room, StreamEvent { stream_seq, event: record, state }, ctx);
                if let (Some(msg), Some(log)) = (answered(&mut self.queue), room.live()) {
                    let _ = msg.reply.send(Ok(Published { seq, epoch: log.epoch().into(), duplicate: false }));
                }
                self.pump(room, ctx);
            }
            // Stored before (a retried publish): read what this node missed, then the
            // queue answers it as a duplicate. Counted like a conflict, so an id whose
            // event is no longer in the history cannot loop.
            Ok(Appended { duplicate: true, .. }) | Err(AppendError::Conflict) => {
                self.conflicts += 1;
                if matches!(result, Err(AppendError::Conflict)) {
                    room.metrics().cluster_append_conflicts.inc();
                }
                if self.conflicts >= APPEND_ATTEMPTS {
                    self.conflicts = 0;
                    if let Some(msg) = answered(&mut self.queue) {
                        let _ = msg.reply.send(Err(PublishFailed::Contended));
                    }
                }
                self.catch_up(room, ctx);
            }
            Err(AppendError::Cluster(error)) => {
                tracing::warn!(room = %room.name(), %error, "append to the stream failed");
                self.conflicts = 0;
                if let Some(msg) = answered(&mut self.queue) {
                    let _ = msg.reply.send(Err(error.into()));
                }
                // A timed-out append may be stored anyway: read before the next one.
                self.catch_up(room, ctx);
            }
        }
    }

    /// Take an event from the stream: the next seq is appended and delivered, an older
    /// one is ignored, and a gap is filled by reading the stream first.
    fn apply(&mut self, room: &mut RoomCore, stored: StreamEvent, ctx: &mut Context<RoomActor>) {
        let Some(head) = room.live().map(|log| log.head()) else { return };
        let seq = stored.event.seq;
        if seq <= head {
            return;
        }
        if seq > head + 1 {
            self.catch_up(room, ctx);
            return;
        }
        let payload = render(room.name(), &stored.event);
        let Ok(log) = room.live_log() else { return };
        if log.append_sequenced(seq, id_key(&stored.event), stored.event.ts_ms, payload.clone()).is_ok() {
            self.last_stream_seq = stored.stream_seq;
            if let Some(data) = stored.state {
                room.offer_state(StateAt { seq, data: data.into() });
            }
            room.deliver(vec![payload], ctx);
        }
    }

    /// [`StreamLog::apply`] for events read from the stream: when the stream no longer
    /// holds the next seq (its retention dropped it), the log jumps to what it holds.
    fn apply_or_jump(&mut self, room: &mut RoomCore, stored: StreamEvent, ctx: &mut Context<RoomActor>) {
        let next = stored.event.seq;
        if let Some(head) = room.live().map(|log| log.head()).filter(|head| next > head + 1) {
            tracing::warn!(room = %room.name(), head, next, "events beyond the stream's retention are gone; skipping ahead");
            room.skip_to(next - 1);
        }
        self.apply(room, stored, ctx);
    }
}

impl RoomLog for StreamLog {
    fn load(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>) {
        room.start_loading();
        let (cluster, name) = (self.cluster.clone(), room.name().clone());
        // Requests wait in the mailbox until the room is loaded.
        let load = async move { roomlog::load(&cluster, &name).await };
        wait_then(ctx, load, |stream: &mut StreamLog, room, loaded, ctx| stream.loaded(room, loaded, ctx));
    }

    fn publish(&mut self, room: &mut RoomCore, msg: Publish, ctx: &mut Context<RoomActor>) {
        let log = match room.live_log() {
            Ok(log) => log,
            Err(why) => {
                let _ = msg.reply.send(Err(why.into()));
                return;
            }
        };
        if let Some(seq) = log.seq_of(&publish_key(&msg)) {
            let _ = msg.reply.send(Ok(Published { seq, epoch: log.epoch().into(), duplicate: true }));
            return;
        }
        self.queue.push_back(msg);
        self.pump(room, ctx);
    }

    /// The stream keeps the newest event (it holds the room's head): only a log emptied
    /// by age is purged from it, down to that one.
    fn expired(&mut self, room: &RoomCore, _first_kept: u64) {
        let Some(log) = room.live() else { return };
        if log.oldest().is_some() {
            return;
        }
        let (cluster, name) = (self.cluster.clone(), room.name().clone());
        actix::spawn(async move {
            if let Err(error) = roomlog::purge_expired(&cluster, &name).await {
                tracing::warn!(room = %name, %error, "could not delete expired history from the stream");
            }
        });
    }

    fn busy(&self) -> bool {
        !self.queue.is_empty() || !self.puts.is_empty() || !self.waiting_subscribers.is_empty() || self.appending
    }

    /// Queued with the publishes: written between appends, as of the head then.
    fn put_state(&mut self, room: &mut RoomCore, msg: PutState, ctx: &mut Context<RoomActor>) {
        if let Err(why) = room.live_log() {
            let _ = msg.reply.send(Err(why.into()));
            return;
        }
        self.puts.push_back(msg);
        self.pump(room, ctx);
    }
}

impl SharedLog for StreamLog {
    /// A latest-state record newer than any this room took (the records' stream order
    /// decides, so a late copy never undoes a newer `PUT` at the same seq).
    fn live_state(&mut self, room: &mut RoomCore, live: LiveState) {
        if live.version <= self.state_version {
            return;
        }
        self.state_version = live.version;
        room.offer_state(live.state);
    }

    /// The subscriber waits for the room to load (retried with backoff) instead of being
    /// refused for good.
    fn hold_subscribe(&mut self, msg: Subscribe) {
        self.waiting_subscribers.push(msg);
    }

    fn unsubscribed(&mut self, conn: ConnId, generation: u64) {
        self.waiting_subscribers.retain(|w| w.conn != conn || w.generation > generation);
    }

    fn live_event(&mut self, room: &mut RoomCore, event: StreamEvent, ctx: &mut Context<RoomActor>) {
        self.apply(room, event, ctx);
    }

    /// Read what the stream holds beyond this node's head, then go on appending.
    fn catch_up(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>) {
        if self.catching_up || room.is_stopped() || !room.is_live() {
            return;
        }
        self.catching_up = true;
        let (cluster, name, after) = (self.cluster.clone(), room.name().clone(), self.last_stream_seq);
        let read = async move { roomlog::read_after(&cluster, &name, after).await };
        spawn_then(ctx, read, |stream: &mut StreamLog, room, result, ctx| {
            stream.catching_up = false;
            match result {
                Ok(events) => {
                    stream.read_retry.reset();
                    for event in events {
                        stream.apply_or_jump(room, event, ctx);
                    }
                    stream.pump(room, ctx);
                }
                Err(error) => {
                    tracing::warn!(room = %room.name(), %error, "catching up from the stream failed; retrying");
                    let failed = PublishFailed::from(error);
                    // The publish of an append in flight too: its result answers nobody.
                    stream.front_in_flight = false;
                    for msg in stream.queue.drain(..) {
                        let _ = msg.reply.send(Err(failed.clone()));
                    }
                    let retry = stream.read_retry.next_delay(random_u64());
                    later(ctx, retry, |stream: &mut StreamLog, room, ctx| stream.catch_up(room, ctx));
                }
            }
        });
    }

    fn adopted(&mut self, replay_after: Option<u64>) {
        self.replay_after = replay_after;
    }
}
