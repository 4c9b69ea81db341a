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
use std::time::Instant;

use actix::prelude::*;

use super::RoomLogs;
use super::{
    id_key, publish_key, render, spawn_then, Frames, Log, LogPart, Pending, RoomActor, RoomCore,
    RoomLog,
};
use crate::actors::messages::*;
use crate::core::delivery::room::{Action, Input, LogInput};
use crate::core::delivery::seqlog::{Entry, SeqLog};
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
        }))
    }
}

/// One room's log in the embedded store: the room's machine decides what to write and
/// when to flush; this writes to sled and tells it what happened.
pub struct LocalLog {
    store: Store,
    /// The epoch a room never written answers and stores with its first write.
    new_epoch: Arc<str>,
    /// The room has a record (its head, with its epoch) in the store.
    stored: bool,
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
    fn trim_below(&self, room: &RoomCore, first_kept: u64, why: &str) {
        match self.store.rooms().trim(room.name(), first_kept) {
            Ok(removed) => {
                room.metrics().history_trimmed.inc_by(removed as u64);
            }
            Err(error) => {
                tracing::warn!(room = %room.name(), %error, why, "could not delete history")
            }
        }
    }

    /// Write `msg` as event `seq` (the machine checked its key is new).
    fn write(&mut self, room: &mut RoomCore, seq: u64, key: Arc<str>, msg: Publish) {
        let name = room.name().clone();
        let Some(epoch) = room.live().map(|log| log.epoch().to_string()) else { return };
        let ts_ms = now_ms();
        let (id, data) = (msg.id.to_string(), msg.data.to_string());
        let record = EventRecord { seq, id, ts_ms, data, devices: msg.devices, from: msg.from };
        let written = match &msg.state {
            Some(state) => self.store.rooms().append_with_state(&name, &epoch, &record, state),
            None => self.store.rooms().append(&name, &epoch, &record),
        };
        if let Err(error) = &written {
            tracing::error!(room = %name, %error, "store write failed");
        }
        self.stored |= written.is_ok();
        let stored = written.is_ok();
        let (payload, reply) = (render(&name, &record), Pending::Reply(msg.reply));
        let result = written.map_err(PublishFailed::from);
        room.input(Input::Log(LogInput::Written { seq, key, ts_ms, payload, reply, result }));
        if let Some(data) = msg.state.filter(|_| stored) {
            room.input(Input::State(StateAt { seq, data }));
        }
    }

    /// Write the state at once (as of the head, durable or not) and flush it; it becomes
    /// the room's state once the events up to its seq are durable.
    fn write_state(
        &mut self,
        room: &mut RoomCore,
        state: StateAt,
        reply: Pending,
        ctx: &mut Context<RoomActor>,
    ) {
        let name = room.name().clone();
        let Some(epoch) = room.live().map(|log| log.epoch().to_string()) else { return };
        // A room's first write stores its record (with its epoch) too.
        let created = if self.stored { Ok(()) } else { self.store.rooms().create(&name, &epoch) };
        let record = StateRecord { seq: state.seq, data: state.data.to_string() };
        if let Err(error) = created.and_then(|()| self.store.rooms().put_state(&name, &record)) {
            tracing::error!(room = %name, %error, "store write failed");
            let result = Err(error.into());
            return room.input(Input::Log(LogInput::StateStored { state, reply, result }));
        }
        self.stored = true;
        spawn_then(ctx, self.store.flush_soon(), move |_: &mut LocalLog, room, result, _ctx| {
            if let Err(error) = &result {
                tracing::error!(room = %room.name(), %error, "flush of a state failed");
            }
            let result = result.map_err(PublishFailed::from);
            room.input(Input::Log(LogInput::StateStored { state, reply, result }));
        });
    }

    /// Flush the store: the events up to `upto` are durable once it returns.
    fn flush(&mut self, upto: u64, ctx: &mut Context<RoomActor>) {
        let since = Instant::now();
        spawn_then(ctx, self.store.flush_soon(), move |_: &mut LocalLog, room, result, _ctx| {
            room.metrics().store_flush_latency.observe(since.elapsed().as_secs_f64());
            if let Err(error) = &result {
                tracing::error!(room = %room.name(), %error, "flush failed; publishers get an error, retrying");
            }
            room.input(Input::Log(LogInput::Flushed {
                upto,
                result: result.map_err(PublishFailed::from),
            }));
        });
    }
}

impl RoomLog for LocalLog {
    fn load(&mut self, room: &mut RoomCore, _ctx: &mut Context<RoomActor>) {
        let (name, retention) = (room.name().clone(), room.retention());
        let name = &name;
        match self.store.rooms().load(name, retention.max_events) {
            Ok(None) => room.loaded(
                SeqLog::restore(self.new_epoch.to_string(), 0, Vec::new(), retention),
                None,
            ),
            Ok(Some(stored)) => {
                self.stored = true;
                let entries = stored
                    .events
                    .into_iter()
                    .map(|e| Entry {
                        seq: e.seq,
                        payload: render(name, &e),
                        id: id_key(&e),
                        ts_ms: e.ts_ms,
                    })
                    .collect();
                let log = SeqLog::restore(stored.head.epoch, stored.head.head, entries, retention);
                if let Some(oldest) = log.oldest() {
                    if let Err(error) = self.store.rooms().trim(name, oldest) {
                        tracing::warn!(room = %name, %error, "could not trim history beyond retention");
                    }
                }
                room.loaded(log, stored.state.map(|s| StateAt { seq: s.seq, data: s.data.into() }));
            }
            Err(error) => {
                tracing::error!(room = %name, %error, "room state unreadable");
                room.input(Input::Failed(error.into()));
            }
        }
    }

    fn publish(&mut self, room: &mut RoomCore, msg: Publish, _ctx: &mut Context<RoomActor>) {
        let key = publish_key(&msg);
        room.input(Input::Log(LogInput::Publish { key, reply: Pending::Publish(msg) }));
    }

    fn put_state(&mut self, room: &mut RoomCore, msg: PutState, _ctx: &mut Context<RoomActor>) {
        room.input(Input::Log(LogInput::Put { data: msg.data, reply: Pending::Reply(msg.reply) }));
    }

    fn trimmed(&mut self, room: &RoomCore, first_kept: u64, expired: bool) {
        self.trim_below(room, first_kept, if expired { "expired" } else { "trimmed by size" });
    }

    fn carry_out(
        &mut self,
        room: &mut RoomCore,
        action: Action<Frames>,
        ctx: &mut Context<RoomActor>,
    ) {
        match action {
            Action::Write { seq, key, reply: Pending::Publish(msg) } => {
                self.write(room, seq, key, msg)
            }
            Action::WriteState { state, reply } => self.write_state(room, state, reply, ctx),
            Action::Flush { upto } => self.flush(upto, ctx),
            _ => {}
        }
    }

    /// What waits on the store is the machine's to know.
    fn busy(&self) -> bool {
        false
    }
}
