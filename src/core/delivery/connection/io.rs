//! What the connection's machine takes and gives: its [`Settings`] and [`Grants`], the
//! [`Action`]s it decides, its timers, what it waits for ([`Pending`]), how a room's
//! window is routed ([`Route`]), a subscribe as asked ([`Ask`]), refusals and endings.

use std::sync::Arc;

use crate::core::delivery::subscriptions::WindowPlan;

/// The limits of one connection (from the configuration), in milliseconds.
#[derive(Debug, Clone)]
pub struct Settings {
    pub max_subscriptions: usize,
    /// Bytes held for the connection before it is not read, and after the grace closed.
    pub max_outbox_bytes: usize,
    /// Client messages per second (burst: twice that); 0: no limit.
    pub max_messages_per_sec: u64,
    /// Refused client messages per minute before a close with a policy violation.
    pub max_bad_messages: u64,
    /// Rooms a connection may start per second; 0: no limit.
    pub max_room_starts_per_sec: u64,
    pub max_history_limit: usize,
    pub heartbeat_ms: u64,
    /// Close a connection that has not subscribed to a room by then (None: never).
    pub subscribe_timeout_ms: Option<u64>,
    /// How long to wait for the client's Close after ours.
    pub close_handshake_ms: u64,
    /// The client can send (a WebSocket): only then does silence mean it is gone, and
    /// only then can it subscribe after it started.
    pub reads: bool,
    /// Rooms may write windows straight to the socket from their own threads.
    pub direct: bool,
}

/// Who is connected and what the token lets it do.
#[derive(Debug, Clone)]
pub struct Grants {
    pub user: Arc<str>,
    pub device: Arc<str>,
    /// Room patterns it may read (empty: any room).
    pub rooms: Vec<String>,
    /// Room patterns it may publish to (empty: none).
    pub publish: Vec<String>,
}

/// Why a request is refused (the driver names the wire's error code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    BadRequest,
    BadRoom,
    Forbidden,
    TooManySubscriptions,
    RateLimited,
    /// The room refused the subscribe or could not be reached.
    Unavailable,
}

/// Why the connection closes (the driver names the wire's close code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Over its outbox bound for the grace, or a room found it over (4009).
    SlowConsumer,
    /// Too many refused messages in a minute (policy).
    TooManyRefused,
    /// No subscribe within `subscribe_timeout` (policy).
    NoSubscribe,
    /// Silent for too many heartbeats (4008).
    HeartbeatTimeout,
    /// Asked by the driver (a kick, a drain, a moved room, a bad frame): code and reason.
    Asked { code: u16, reason: String },
}

/// The driver's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// The outbox's grace ends: look at it again.
    Grace,
    /// The time to subscribe is up.
    SubscribeDeadline,
    /// The client did not answer our Close.
    CloseHandshake,
}

/// A request waiting for its answer, which the driver gets on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// A history or presence read.
    Read,
    /// A publish waiting to be durable.
    Publish,
}

/// Where a room's window goes, decided on the room's thread.
#[derive(Debug, PartialEq)]
pub enum Route<E> {
    /// Written now, from the room's thread, as the plan says.
    Write(WindowPlan<E>),
    /// Posted to the connection's mailbox (behind what waits there); decided when taken.
    Post,
}

/// What the driver carries out, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action<R> {
    /// An `error` frame.
    Error { reference: Option<i64>, room: Option<String>, refusal: Refusal, message: String },
    /// A limit was hit (`livegate_limit_hits_total{limit}`).
    LimitHit(&'static str),
    /// A client publish ended before it was submitted, or was refused for the rate.
    PublishOutcome(&'static str),
    /// Ask the room for a subscribe of this generation.
    Subscribe { generation: u64, ask: Ask },
    /// The automatic inbox subscription: announce it and park it with the rooms.
    SubscribeInbox { room: Arc<str>, generation: u64 },
    /// This generation of the room's subscription ended: tell the room (`at`), or the
    /// rooms table where it is parked (`None`).
    Leave { room: Arc<str>, generation: u64, at: Option<R> },
    /// Subscriptions gained or lost (the gauge).
    Subscriptions(i64),
    /// The `unsubscribed` frame.
    Unsubscribed { room: String, reference: Option<i64> },
    /// Read a history page; answer with [`Connection::answered`].
    ReadHistory { room: String, since: u64, limit: usize, reference: Option<i64> },
    /// Read who is in a room; answer with [`Connection::answered`].
    ReadPresence { room: String, reference: Option<i64> },
    /// Submit a client's publish; answer with [`Connection::answered`] once it is durable.
    Publish {
        room: String,
        id: Option<String>,
        data: String,
        state: Option<String>,
        reference: Option<i64>,
    },
    /// The heartbeat: a Ping (or SSE comment).
    Ping,
    /// Drop what the client has not started to read and mark the backlog evicted;
    /// `held`: the bytes it held when its grace ran out (None: a room found it over).
    Evict { held: Option<usize> },
    /// Send the Close (after what is queued); nothing more is written after it.
    Close(Ending),
    /// Arm a timer; hand it back to [`Connection::on_timer`].
    Arm { timer: Timer, after_ms: u64 },
    /// Have the reader look again whether it may read (nothing else would wake it).
    WakeReader,
    /// Stop the connection.
    Stop,
}

/// A subscribe as the client (or an SSE stream's URL) asked it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub room: String,
    pub since: Option<u64>,
    pub epoch: Option<String>,
    pub state: bool,
    pub presence: bool,
    pub reference: Option<i64>,
}
