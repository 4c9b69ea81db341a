//! Every message between actors, with its reply type: this module is the API between
//! connections, rooms and the registry.

use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::cluster::ClusterError;
use crate::store::StoreError;

/// Process-unique id of one WebSocket connection.
pub type ConnId = u64;

/// One durable event as subscribers get it: rendered to wire JSON once, shared by all.
#[derive(Debug, PartialEq)]
pub struct Delivery {
    pub seq: u64,
    /// When the event was published (ms since the Unix epoch).
    pub ts_ms: u64,
    pub json: Box<str>,
    /// Devices an inbox message is for (`None`: every device).
    pub devices: Option<Box<[Box<str>]>>,
}

impl Delivery {
    pub fn is_for(&self, device: &str) -> bool {
        self.devices.as_ref().is_none_or(|devices| devices.iter().any(|d| &**d == device))
    }
}

impl crate::core::delivery::subscriptions::Addressed for Delivery {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn is_for(&self, device: &str) -> bool {
        Delivery::is_for(self, device)
    }
}

/// An `events` frame is cut after this many bytes of events (at least one event each).
pub const FRAME_TARGET_BYTES: usize = 256 * 1024;

/// The events one room window carries to every subscriber, rendered once as the whole
/// `events` frame: every subscriber that has seen none of them and is not filtered by
/// device writes these same shared bytes.
#[derive(Debug)]
pub struct Window {
    /// Contiguous seqs, ascending.
    pub events: Box<[Arc<Delivery>]>,
    /// The whole WebSocket frame, encoded once.
    pub frame: actix_web::web::Bytes,
    /// Some event names the devices it is for: each connection filters (inbox rooms).
    pub targeted: bool,
    /// The room's epoch (an SSE stream's cursor names it).
    pub epoch: Arc<str>,
    /// The `events` JSON as SSE `data:` lines, made by the first SSE subscriber that
    /// writes this window (a WebSocket never touches it): a slice of `frame` unless the
    /// JSON has line breaks.
    sse: std::sync::OnceLock<actix_web::web::Bytes>,
}

impl Window {
    /// Cut `events` (contiguous, ascending) into windows of at most about
    /// [`FRAME_TARGET_BYTES`], each rendered once.
    pub fn cut(epoch: &Arc<str>, events: Vec<Arc<Delivery>>) -> Vec<Arc<Window>> {
        let mut windows = Vec::new();
        let mut rest = events.as_slice();
        while !rest.is_empty() {
            let mut end = 0;
            let mut bytes = 0;
            while end < rest.len()
                && (end == 0 || bytes + rest[end].json.len() < FRAME_TARGET_BYTES)
            {
                bytes += rest[end].json.len() + 1;
                end += 1;
            }
            let (chunk, tail) = rest.split_at(end);
            let frame = crate::protocol::events_frame(chunk.iter().map(|e| &*e.json), bytes);
            windows.push(Arc::new(Window {
                targeted: chunk.iter().any(|e| e.devices.is_some()),
                events: chunk.into(),
                frame: super::wsio::encode_text(&frame),
                epoch: epoch.clone(),
                sse: std::sync::OnceLock::new(),
            }));
            rest = tail;
        }
        windows
    }

    /// Hand `write` the frames `plan` (the connection's machine's decision about this
    /// window) says to write: this window's shared frame, frames of the events left for
    /// the connection, or none.
    pub fn frames_for(
        &self,
        plan: crate::core::delivery::subscriptions::WindowPlan<Arc<Delivery>>,
        mut write: impl FnMut(&Window),
    ) {
        use crate::core::delivery::subscriptions::WindowPlan;
        match plan {
            WindowPlan::Nothing => {}
            WindowPlan::Shared => write(self),
            WindowPlan::Own(fresh) => {
                for own in Window::cut(&self.epoch, fresh) {
                    write(&own);
                }
            }
        }
    }

    /// The `events` JSON framed as SSE data, shared by every SSE subscriber.
    pub fn sse_data(&self) -> actix_web::web::Bytes {
        self.sse.get_or_init(|| super::sse::data(super::wsio::payload_of(&self.frame))).clone()
    }

    pub fn first_seq(&self) -> u64 {
        self.events.first().map_or(0, |e| e.seq)
    }

    pub fn last_seq(&self) -> u64 {
        self.events.last().map_or(0, |e| e.seq)
    }
}

/// The room actor stopped (evicted while idle) before handling the message: ask the
/// rooms table again, which starts a fresh one from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("room actor has stopped")]
pub struct RoomGone;

// ---- connection → room ----

/// How a room reaches one subscribing connection. Every update goes through `post`, in
/// order; a window goes through `window`, which the connection may decide and write from
/// the room's own thread (`actors::link`) instead of taking it off its mailbox.
pub trait Outlet: Send + Sync {
    /// Every byte held for the connection: the room reserves a frame's size here before
    /// it sends it, and evicts a connection over its bound.
    fn backlog(&self) -> &crate::core::delivery::backlog::Backlog;
    /// Send an update to the connection's mailbox (after everything posted before it).
    fn post(&self, update: RoomUpdate);
    /// A window of the room's, its size reserved in the backlog: written now, or posted.
    fn window(&self, room: &Arc<str>, window: &Arc<Window>) {
        self.post(RoomUpdate::Events { room: room.clone(), window: window.clone() });
    }
    /// Whether the connection still takes updates (its actor is alive).
    fn connected(&self) -> bool;
}

/// Add a subscriber. The room answers through `to` with [`RoomUpdate::Subscribed`]
/// (carrying any replay) before it sends that subscriber any live events.
#[derive(Message, Clone)]
#[rtype(result = "Result<(), RoomGone>")]
pub struct Subscribe {
    pub conn: ConnId,
    pub to: Arc<dyn Outlet>,
    /// Last seq the client saw; `None` subscribes live only.
    pub since: Option<u64>,
    pub epoch: Option<String>,
    pub reference: Option<i64>,
    /// The connection's counter for this subscription, echoed in the answer so a stale
    /// answer (the client resubscribed meanwhile) is recognised.
    pub generation: u64,
    /// The connection's automatic inbox subscription: an inbox room with only these
    /// parks them in the rooms table when idle instead of keeping its actor.
    pub automatic: bool,
    /// `"state":true`: without `since`, or when recovery fails, answer with the room's
    /// state and the events after it.
    pub state: bool,
    /// Who subscribes, for the room's presence (`None`: the automatic inbox subscription,
    /// which is no member).
    pub member: Option<crate::core::delivery::presence::Member>,
    /// The subscriber wants the room's presence frames.
    pub presence: bool,
}

/// A connection's automatic inbox subscription while the inbox room has no actor: kept
/// in the rooms table, adopted by the room's next actor as a subscriber.
pub struct Parked {
    pub conn: ConnId,
    pub to: Arc<dyn Outlet>,
    pub generation: u64,
}

/// Remove a subscriber (no reply frame: the connection answers the client itself).
/// Only subscriptions up to `generation` go: a late unsubscribe for a superseded
/// subscribe never removes the newer one.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Unsubscribe {
    pub conn: ConnId,
    pub generation: u64,
}

/// Read durable history after `since`.
#[derive(Message)]
#[rtype(result = "Result<HistoryPage, RoomGone>")]
pub struct ReadHistory {
    pub since: u64,
    pub limit: usize,
}

#[derive(Debug, Clone)]
pub struct HistoryPage {
    /// `None` while the room cannot be read (a room never written has the epoch its
    /// first write will store).
    pub epoch: Option<Arc<str>>,
    pub head: u64,
    /// Events, oldest first.
    pub events: Vec<Arc<Delivery>>,
    /// Whether `events` reach the head with nothing missing.
    pub complete: bool,
}

// ---- http → room ----

/// An event on its way into a room's sequence, its checks done: what
/// [`Publisher::publish`](super::publish::Publisher::publish) and
/// [`Rooms::publish`](super::rooms::Rooms::publish) take.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub id: Arc<str>,
    /// The event's JSON text.
    pub data: Arc<str>,
    /// Devices an inbox message is for (`None`: every device).
    pub devices: Option<Vec<String>>,
    /// The publishing connection's user (client publish); `None`: a backend.
    pub from: Option<String>,
    /// The room's state as of this event (JSON text), stored atomically with it.
    pub state: Option<Arc<str>>,
}

/// Append an event. The room answers on `reply` once the event is durable.
#[derive(Message)]
#[rtype(result = "Result<(), RoomGone>")]
pub struct Publish {
    pub id: Arc<str>,
    /// The event's JSON text.
    pub data: Arc<str>,
    /// Devices an inbox message is for (`None`: every device).
    pub devices: Option<Vec<String>>,
    /// The publishing connection's user (client publish); `None`: a backend.
    pub from: Option<String>,
    /// The room's state as of this event (JSON text), stored atomically with it.
    pub state: Option<Arc<str>>,
    pub reply: oneshot::Sender<Result<Published, PublishFailed>>,
}

/// A room's state as of one of its events, and a publish's answer: the room machine's.
pub use crate::core::delivery::room::{Published, StateAt};

/// Set the room's state as of its current head (`PUT /v1/rooms/{room}/state`). Answered
/// on `reply` once durable; the answer names the seq it was set at.
#[derive(Message)]
#[rtype(result = "Result<(), RoomGone>")]
pub struct PutState {
    pub data: Arc<str>,
    pub reply: oneshot::Sender<Result<Published, PublishFailed>>,
}

/// Read the room's state (`GET /v1/rooms/{room}/state`), from memory.
#[derive(Message)]
#[rtype(result = "Result<StateView, RoomGone>")]
pub struct ReadState;

/// A room's state as `GET /v1/rooms/{room}/state` answers it: `seq` 0 and no data when
/// none was ever set; `epoch` `None` while the room cannot be read.
#[derive(Debug, Clone, PartialEq)]
pub struct StateView {
    pub epoch: Option<Arc<str>>,
    pub seq: u64,
    pub data: Option<Arc<str>>,
}

/// Why a room did not take a publish. `Clone`: a failed flush or stream read answers
/// every publisher waiting on it with the same error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishFailed {
    #[error("the store could not take the event: {0}")]
    Store(#[from] RoomLogError),
    /// Cluster mode: other nodes kept appending first; the publisher may retry.
    #[error("the store could not take the event: the room is contended; retry")]
    Contended,
}

impl From<StoreError> for PublishFailed {
    fn from(e: StoreError) -> Self {
        PublishFailed::Store(e.into())
    }
}

impl From<ClusterError> for PublishFailed {
    fn from(e: ClusterError) -> Self {
        PublishFailed::Store(e.into())
    }
}

/// Why a room's log could not be read or written: sled on a single node, the room's
/// stream in cluster mode. The cause is shared (`Arc`) so that one failure can answer
/// many requests.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RoomLogError {
    #[error(transparent)]
    Store(Arc<StoreError>),
    #[error(transparent)]
    Cluster(Arc<ClusterError>),
    /// Cluster mode: the room's stream has not been read yet.
    #[error("room is not loaded")]
    NotLoaded,
}

impl From<StoreError> for RoomLogError {
    fn from(e: StoreError) -> Self {
        RoomLogError::Store(Arc::new(e))
    }
}

impl From<ClusterError> for RoomLogError {
    fn from(e: ClusterError) -> Self {
        RoomLogError::Cluster(Arc::new(e))
    }
}

/// Who is in the room now: the distinct members across the cluster.
#[derive(Message)]
#[rtype(result = "Result<Result<crate::core::delivery::presence::View, PresenceOff>, RoomGone>")]
pub struct ReadPresence;

/// The room's namespace keeps no presence (or the room is an inbox).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this room keeps no presence")]
pub struct PresenceOff;

/// Cluster mode: another node's members of the room changed (or that node died).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PresenceChanged;

/// A room's presence frame, rendered once for every subscriber that asked for it: the
/// WebSocket frame and the JSON (an SSE `event: presence`).
#[derive(Debug)]
pub struct PresenceFrame {
    pub frame: actix_web::web::Bytes,
    pub json: Box<str>,
}

impl PresenceFrame {
    pub fn new(json: String) -> Arc<PresenceFrame> {
        Arc::new(PresenceFrame { frame: super::wsio::encode_text(&json), json: json.into() })
    }
}

// ---- cluster live feed → room ----

/// Cluster mode: a room's latest-state record as the room's writer stored it, with its
/// sequence on the state stream (`version`, which orders the records). Not a message:
/// the room takes it from its own live feed.
pub struct LiveState {
    pub state: StateAt,
    pub version: u64,
}

/// Cluster mode: the live feed may have missed events (NATS reconnected): read the
/// stream, `after` this long (rooms resync spread out, not all at once).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resync {
    pub after: std::time::Duration,
}

/// A promotion moved the room's home to cell `to`: its log is elsewhere now, under a new
/// epoch. The room sends its subscribers [`RoomUpdate::Moved`] and stops; the next actor
/// of the room reads it where it moved.
#[derive(Message)]
#[rtype(result = "()")]
pub struct HomeMoved {
    pub to: Arc<str>,
}

// ---- supervisor → room ----

/// The node is draining: send the open window's events to the subscribers now, so they
/// go out before the connections' Close frames. Answered once they are sent.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CloseWindow;

// ---- room → connection ----

/// What a room sends a subscriber, in order on one channel, so a replay always precedes
/// the live events that follow it.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub enum RoomUpdate {
    Subscribed {
        room: Arc<str>,
        epoch: Arc<str>,
        /// Durable head at the moment the subscriber was added.
        head: u64,
        /// `Some` when the subscribe named `since`.
        recovered: Option<bool>,
        replay: Vec<Arc<Delivery>>,
        reference: Option<i64>,
        generation: u64,
        /// `Some` when the subscribe asked for the state and gets it (no `since`, or a
        /// failed recovery): the state (`None`: the room has none), and `replay` holds
        /// the events after its seq.
        state: Option<Option<StateAt>>,
    },
    /// A closed window of newly durable events, rendered once and shared by every
    /// subscriber.
    Events { room: Arc<str>, window: Arc<Window> },
    /// The room's presence changed (or, right after `Subscribed`, who is there): sent to
    /// subscribers that asked; its size is reserved in the backlog like a window's.
    Presence { room: Arc<str>, frame: Arc<PresenceFrame> },
    /// The connection's backlog went over its bound: stop and close with 4009.
    SlowConsumer,
    /// A promotion moved the room to cell `to` (a new epoch): close with 1012, so the
    /// client resumes it there and learns it did not recover.
    Moved { room: Arc<str>, to: Arc<str> },
    /// The room cannot serve (its stored state is unreadable); the subscription is void.
    Refused { room: Arc<str>, reference: Option<i64>, message: String, generation: u64 },
}

// ---- anyone → connection ----

/// Close a connection with a WebSocket close code. The connection then waits (bounded)
/// for the client's Close; `force` stops it at once, and so does a second close.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct CloseConnection {
    pub code: crate::protocol::CloseCode,
    pub reason: String,
    pub force: bool,
}

// ---- connection ↔ registry ----

#[derive(Message)]
#[rtype(result = "()")]
pub struct Register {
    pub conn: ConnId,
    pub user: Arc<str>,
    pub device: Arc<str>,
    pub to: Recipient<CloseConnection>,
    /// A kick the handshake's check missed closes it (`core::credentials::kicks`).
    pub credential: CredentialTimes,
}

/// The times the registry judges a registering connection by (`core::credentials::kicks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CredentialTimes {
    /// When the credential was issued (a token without an issue time: the earliest it
    /// could have been).
    pub issued_at_ms: u64,
    /// When the handshake read the durable kicks.
    pub checked_at_ms: u64,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Unregister {
    pub conn: ConnId,
}

/// Close a user's connections (on one device when named) with 4502; replies with how
/// many were closed, once each has handled its close.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Kick {
    pub user: String,
    pub device: Option<String>,
    /// When the kick was made (its durable record says the same): the registry remembers
    /// it for connections that register later with an older credential.
    pub at_ms: u64,
}

/// Close every connection; replies with how many were asked to close.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct CloseAll {
    pub close: CloseConnection,
}

/// Send Close 1012 to every connection, in batches spread over `spread`, each with its
/// own suggested reconnect delay; replies with how many will be closed.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct DrainClose {
    pub spread: std::time::Duration,
}

/// How many connections are registered.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct CountConnections;

// ---- rebalance ↔ registry ----

/// The users with connections here and how many each has, oldest registration first
/// (a rebalance's candidates); at most `limit` of them.
#[derive(Message)]
#[rtype(result = "Vec<(String, usize)>")]
pub struct UsersHere {
    pub limit: usize,
}

/// A rebalance handed `user`'s sessions over to another node: close the user's
/// connections here with 4421, whose reason is that node's URL, so its clients reconnect
/// there at once. Replies with how many were closed.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct HandOverUser {
    pub user: String,
    pub url: String,
}
