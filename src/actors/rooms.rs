//! The table of live room actors: finds or starts the actor of a room on one of the room
//! arbiters (chosen by hashing the name), and retries a request once when the room it
//! reached had just stopped for idleness. A lookup table, not a message path: requests
//! still go to rooms as messages.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use actix::prelude::*;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::messages::*;
use super::room::{RoomActor, RoomSettings, RoomStore};

/// How often a request is retried against a freshly started room actor.
const ATTEMPTS: usize = 3;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RoomError {
    #[error("room is unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Publish(#[from] PublishFailed),
}

pub struct RoomsInner {
    live: Mutex<HashMap<Arc<str>, Addr<RoomActor>>>,
    arbiters: Mutex<Vec<Arbiter>>,
    handles: Vec<ArbiterHandle>,
    store: RoomStore,
    settings: RoomSettings,
}

impl RoomsInner {
    /// Drop `room` from the table if `addr` is still its actor.
    pub(crate) fn forget(&self, room: &str, addr: &Addr<RoomActor>) {
        let mut live = self.live.lock();
        if live.get(room).is_some_and(|current| current == addr) {
            live.remove(room);
        }
    }
}

/// Handle to the rooms table; cheap to clone.
#[derive(Clone)]
pub struct Rooms {
    inner: Arc<RoomsInner>,
}

impl Rooms {
    /// Start `threads` room arbiters.
    pub fn start(store: RoomStore, settings: RoomSettings, threads: usize) -> Rooms {
        let arbiters: Vec<Arbiter> = (0..threads.max(1)).map(|_| Arbiter::new()).collect();
        let handles = arbiters.iter().map(Arbiter::handle).collect();
        Rooms {
            inner: Arc::new(RoomsInner {
                live: Mutex::new(HashMap::new()),
                arbiters: Mutex::new(arbiters),
                handles,
                store,
                settings,
            }),
        }
    }

    /// The actor of `room`, started (and loaded from the store) if it is not live.
    pub fn addr(&self, room: &str) -> Addr<RoomActor> {
        let mut live = self.inner.live.lock();
        if let Some(addr) = live.get(room) {
            if addr.connected() {
                return addr.clone();
            }
        }
        let name: Arc<str> = room.into();
        let mut hasher = DefaultHasher::new();
        name.hash(&mut hasher);
        let arbiter = &self.inner.handles[hasher.finish() as usize % self.inner.handles.len()];
        let (store, settings, weak) = (self.inner.store.clone(), self.inner.settings.clone(), Arc::downgrade(&self.inner));
        let actor_name = name.clone();
        let addr = RoomActor::start_in_arbiter(arbiter, move |_| RoomActor::load(actor_name, store, settings, weak));
        live.insert(name, addr.clone());
        addr
    }

    fn forget(&self, room: &str, addr: &Addr<RoomActor>) {
        self.inner.forget(room, addr);
    }

    /// Append an event to `room`; resolves once it is durable.
    pub async fn publish(
        &self,
        room: &str,
        id: Arc<str>,
        data: Arc<str>,
        devices: Option<Vec<String>>,
    ) -> Result<Published, RoomError> {
        for _ in 0..ATTEMPTS {
            let addr = self.addr(room);
            let (reply, answer) = oneshot::channel();
            let msg = Publish { id: id.clone(), data: data.clone(), devices: devices.clone(), reply };
            match addr.send(msg).await {
                Ok(Ok(())) => {
                    return match answer.await {
                        Ok(result) => result.map_err(RoomError::from),
                        Err(_) => Err(RoomError::Unavailable("room stopped before answering".into())),
                    }
                }
                Ok(Err(RoomGone)) | Err(_) => self.forget(room, &addr),
            }
        }
        Err(RoomError::Unavailable("room kept stopping".into()))
    }

    /// Subscribe a connection; the room answers through `to`.
    pub async fn subscribe(
        &self,
        room: &str,
        conn: ConnId,
        to: Recipient<RoomUpdate>,
        backlog: Arc<super::backlog::Backlog>,
        since: Option<u64>,
        epoch: Option<String>,
        reference: Option<i64>,
        generation: u64,
    ) -> Result<Addr<RoomActor>, RoomError> {
        for _ in 0..ATTEMPTS {
            let addr = self.addr(room);
            let msg = Subscribe { conn, to: to.clone(), backlog: backlog.clone(), since, epoch: epoch.clone(), reference, generation };
            match addr.send(msg).await {
                Ok(Ok(())) => return Ok(addr),
                Ok(Err(RoomGone)) | Err(_) => self.forget(room, &addr),
            }
        }
        Err(RoomError::Unavailable("room kept stopping".into()))
    }

    /// Read durable history of `room`.
    pub async fn history(&self, room: &str, since: u64, limit: usize) -> Result<HistoryPage, RoomError> {
        for _ in 0..ATTEMPTS {
            let addr = self.addr(room);
            match addr.send(ReadHistory { since, limit }).await {
                Ok(Ok(page)) => return Ok(page),
                Ok(Err(RoomGone)) | Err(_) => self.forget(room, &addr),
            }
        }
        Err(RoomError::Unavailable("room kept stopping".into()))
    }

    /// Cluster mode: hand a live event to its room, if the room is live on this node (a
    /// room started later reads the stream itself).
    pub fn live_event(&self, room: &str, event: crate::cluster::roomlog::StreamEvent) {
        let addr = self.inner.live.lock().get(room).cloned();
        if let Some(addr) = addr {
            addr.do_send(LiveEvent(event));
        }
    }

    /// Cluster mode: have every live room read what the live feed may have missed.
    pub fn resync_all(&self) {
        for addr in self.inner.live.lock().values() {
            addr.do_send(Resync);
        }
    }

    /// Have every live room send its open window now (the drain, before the Close
    /// frames); resolves once each room has sent it.
    pub async fn close_windows(&self) {
        let rooms: Vec<Addr<RoomActor>> = self.inner.live.lock().values().cloned().collect();
        for addr in rooms {
            let _ = addr.send(CloseWindow).await;
        }
    }

    /// Rooms with a live actor.
    pub fn live_count(&self) -> usize {
        self.inner.live.lock().len()
    }

    /// Stop every room actor and its arbiter, and wait for them. Events appended but not
    /// yet flushed stay in the store for the caller's final flush.
    pub fn shutdown(&self) {
        self.inner.live.lock().clear();
        let arbiters = std::mem::take(&mut *self.inner.arbiters.lock());
        for arbiter in &arbiters {
            arbiter.stop();
        }
        for arbiter in arbiters {
            let _ = arbiter.join();
        }
    }
}
