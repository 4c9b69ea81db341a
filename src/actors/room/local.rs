//! A room's log in the embedded store (single node). A publish is written to sled at
//! once and appended to the room's log; it is delivered and acknowledged after the next
//! (grouped) flush made it durable, so a subscriber never sees an event a crash could
//! take back. A publish with a state writes event, head and state in one transaction;
//! the state becomes the room's once that flush returns.
//!
//! A room never written has no record: loading it costs one read, and it answers head 0
//! in the store's [`Rooms::epoch`](crate::store::Rooms::epoch), which its first publish
//! (or state) stores with it. Subscribes, history and presence of such a room write nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::{id_key, publish_key, render, spawn_then, Log, LogPart, RoomActor, RoomCore, RoomLog, RoomLogs};
use crate::actors::messages::*;
use crate::core::seqlog::{Append, Entry, SeqLog};
use crate::store::{EventRecord, StateRecord, Store, StoreError};
use crate::world::now_ms;

/// The embedded store's room logs.
pub struct LocalRoomLogs {
    store: Store,
    /// The epoch of rooms never written ([`Rooms::epoch`](crate::store::Rooms::epoch)).
    epoch: Arc<str>,
}

impl LocalRoomLogs {
    pub fn new(store: Store) -> Result<LocalRoomLogs, StoreError> {
        let epoch = store.rooms().epoch()?.into();
        Ok(LocalRoomLogs { store, epoch })
    }
}

impl RoomLogs for LocalRoomLogs {
    fn open(&self, _room: &Arc<str>) -> Log {
        Log::Local(Box::new(LocalLog {
            store: self.store.clone(),
            new_epoch: self.epoch.clone(),
            stored: false,
            waiting: Vec::new(),
            flushing_since: None,
            flushing: false,
            putting: 0,
        }))
    }
}

struct Waiter {
    seq: u64,
    duplicate: bool,
    reply: oneshot::Sender<Result<Published, PublishFailed>>,
}

/// One room's log in the embedded store.
pub struct LocalLog {
    store: Store,
    /// The epoch a room never written answers and stores with its first write.
    new_epoch: Arc<str>,
    /// The room has a record (its head, with its epoch) in the store.
    stored: bool,
    /// Publishers waiting for their event's flush.
    waiting: Vec<Waiter>,
    /// When the running flush was requested.
    flushing_since: Option<Instant>,
    flushing: bool,
    /// State writes waiting for their flush.
    putting: usize,
}

impl LogPart for LocalLog {
    fn part(log: &mut Log) -> Option<&mut Self> {
        match log {
            Log::Local(local) => Some(local.as_mut()),
            _ => None,
        }
    }
}

impl LocalLog {
    /// Start a flush when events wait for one and none is running.
    fn request_flush(&mut self, room: &RoomCore, ctx: &mut Context<RoomActor>) {
        let Some(log) = room.live() else { return };
        if self.flushing || log.head() == log.durable() {
            return;
        }
        self.flushing = true;
        self.flushing_since = Some(Instant::now());
        let upto = log.head();
        spawn_then(ctx, self.store.flush_soon(), move |local: &mut LocalLog, room, result, ctx| local.flushed(room, upto, result, ctx));
    }

    fn flushed(&mut self, room: &mut RoomCore, upto: u64, result: Result<(), StoreError>, ctx: &mut Context<RoomActor>) {
        self.flushing = false;
        if let Some(since) = self.flushing_since.take() {
            room.metrics().store_flush_latency.observe(since.elapsed().as_secs_f64());
        }
        let Ok(log) = room.live_log() else { return };
        if let Err(error) = result {
            tracing::error!(room = %room.name(), %error, "flush failed; publishers get an error, retrying");
            let failed = PublishFailed::from(error);
            for waiter in self.waiting.drain(..) {
                let _ = waiter.reply.send(Err(failed.clone()));
            }
            super::later(ctx, Duration::from_secs(1), |local: &mut LocalLog, room, ctx| local.request_flush(room, ctx));
            return;
        }
        let fresh: Vec<Arc<Delivery>> = log.mark_durable(upto).map(|e| e.payload.clone()).collect();
        let epoch: Arc<str> = log.epoch().into();
        room.deliver(fresh, ctx);
        let (done, still): (Vec<_>, Vec<_>) = self.waiting.drain(..).partition(|w| w.seq <= upto);
        self.waiting = still;
        for waiter in done {
            let _ = waiter.reply.send(Ok(Published { seq: waiter.seq, epoch: epoch.clone(), duplicate: waiter.duplicate }));
        }
        self.request_flush(room, ctx);
    }

    fn trim_below(&self, room: &RoomCore, first_kept: u64, why: &str) {
        match self.store.rooms().trim(room.name(), first_kept) {
            Ok(removed) => {
                room.metrics().history_trimmed.inc_by(removed as u64);
            }
            Err(error) => tracing::warn!(room = %room.name(), %error, why, "could not delete history"),
        }
    }
}

impl RoomLog for LocalLog {
    fn load(&mut self, room: &mut RoomCore, _ctx: &mut Context<RoomActor>) {
        let (name, retention) = (room.name().clone(), room.retention());
        let name = &name;
        match self.store.rooms().load(name, retention.max_events) {
            Ok(None) => room.go_live(SeqLog::restore(self.new_epoch.to_string(), 0, Vec::new(), retention)),
            Ok(Some(stored)) => {
                self.stored = true;
                let entries = stored
                    .events
                    .into_iter()
                    .map(|e| Entry { seq: e.seq, payload: render(name, &e), id: id_key(&e), ts_ms: e.ts_ms })
                    .collect();
                let log = SeqLog::restore(stored.head.epoch, stored.head.head, entries, retention);
                room.restore_state(stored.state.map(|s| StateAt { seq: s.seq, data: s.data.into() }));
                if let Some(oldest) = log.oldest() {
                    if let Err(error) = self.store.rooms().trim(name, oldest) {
                        tracing::warn!(room = %name, %error, "could not trim history beyond retention");
                    }
                }
                room.go_live(log);
            }
            Err(error) => {
                tracing::error!(room = %name, %error, "room state unreadable");
                room.fail(error.into());
            }
        }
    }

    fn publish(&mut self, room: &mut RoomCore, msg: Publish, ctx: &mut Context<RoomActor>) {
        let name = room.name().clone();
        let log = match room.live_log() {
            Ok(log) => log,
            Err(why) => {
                let _ = msg.reply.send(Err(why.into()));
                return;
            }
        };
        let key = publish_key(&msg);
        if let Some(seq) = log.seq_of(&key) {
            if seq <= log.durable() {
                let _ = msg.reply.send(Ok(Published { seq, epoch: log.epoch().into(), duplicate: true }));
            } else {
                self.waiting.push(Waiter { seq, duplicate: true, reply: msg.reply });
            }
            return;
        }
        let ts_ms = now_ms();
        let record = EventRecord { seq: log.head() + 1, id: msg.id.to_string(), ts_ms, data: msg.data.to_string(), devices: msg.devices, from: msg.from };
        let written = match &msg.state {
            Some(state) => self.store.rooms().append_with_state(&name, log.epoch(), &record, state),
            None => self.store.rooms().append(&name, log.epoch(), &record),
        };
        if let Err(error) = written {
            tracing::error!(room = %name, %error, "store write failed");
            let _ = msg.reply.send(Err(error.into()));
            return;
        }
        self.stored = true;
        let rendered = render(&name, &record);
        match log.append(key, ts_ms, |_| rendered) {
            Append::Appended { seq, trimmed_below } => {
                self.waiting.push(Waiter { seq, duplicate: false, reply: msg.reply });
                if let Some(first_kept) = trimmed_below {
                    self.trim_below(room, first_kept, "trimmed by size");
                }
            }
            Append::Duplicate { .. } => unreachable!("checked by seq_of above"),
        }
        if let Some(data) = msg.state {
            room.offer_state(StateAt { seq: record.seq, data });
        }
        self.request_flush(room, ctx);
    }

    /// The state is written at once (as of the head, durable or not) and answered after
    /// a flush; it becomes the room's state once the events up to its seq are durable.
    fn put_state(&mut self, room: &mut RoomCore, msg: PutState, ctx: &mut Context<RoomActor>) {
        let name = room.name().clone();
        let (seq, epoch): (u64, Arc<str>) = match room.live_log() {
            Ok(log) => (log.head(), log.epoch().into()),
            Err(why) => {
                let _ = msg.reply.send(Err(why.into()));
                return;
            }
        };
        // A room's first write stores its record (with its epoch) too.
        let created = if self.stored { Ok(()) } else { self.store.rooms().create(&name, &epoch) };
        if let Err(error) = created.and_then(|()| self.store.rooms().put_state(&name, &StateRecord { seq, data: msg.data.to_string() })) {
            tracing::error!(room = %name, %error, "store write failed");
            let _ = msg.reply.send(Err(error.into()));
            return;
        }
        self.stored = true;
        self.putting += 1;
        let (reply, data) = (msg.reply, msg.data);
        spawn_then(ctx, self.store.flush_soon(), move |local: &mut LocalLog, room, result, _ctx| {
            local.putting -= 1;
            match result {
                Ok(()) => {
                    room.offer_state(StateAt { seq, data });
                    let _ = reply.send(Ok(Published { seq, epoch, duplicate: false }));
                }
                Err(error) => {
                    tracing::error!(room = %room.name(), %error, "flush of a state failed");
                    let _ = reply.send(Err(error.into()));
                }
            }
        });
    }

    fn expired(&mut self, room: &RoomCore, first_kept: u64) {
        self.trim_below(room, first_kept, "expired");
    }

    fn busy(&self) -> bool {
        self.flushing || !self.waiting.is_empty() || self.putting > 0
    }
}
