//! What the room's machine takes and gives: its [`Input`]s, the [`Action`]s it decides,
//! the log's answers ([`LogInput`]), its timers, its [`Limits`], and what the driver
//! decides for it ([`Wire`]: what a subscriber, a window and a reply are).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::answer::SubscribeAnswer;
use crate::core::delivery::backlog::Backlog;
use crate::core::delivery::seqlog::SeqLog;
use crate::core::rules::limits::Retention;

/// A room's state as of one of its events: what the room keeps in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct StateAt {
    pub seq: u64,
    /// JSON text.
    pub data: Arc<str>,
}

/// A publish or a state the log took, as its publisher is answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub seq: u64,
    pub epoch: Arc<str>,
    pub duplicate: bool,
}

/// A room's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub retention: Retention,
    /// Most events a recovery replays.
    pub recovery_max_events: u64,
    /// How long durable events gather before they leave as one frame (0: at once).
    pub batch_window: Duration,
    /// A room with no subscribers and nothing pending stops after this long.
    pub idle_stop: Duration,
}

/// What the driver's world looks like to the room.
pub trait Wire {
    /// A durable event as subscribers get it.
    type Event: Clone;
    /// Events cut to be sent as one frame, shared by every subscriber.
    type Window: Clone;
    /// Where one subscriber's updates go.
    type Sink: Clone;
    /// What a subscribe's answer carries back to the driver (its reference, its member).
    type Ticket;
    /// Where a publish's or a state's answer goes.
    type Reply;
    /// Why the log cannot be read.
    type Error: Clone;
    /// Why a publish was not taken.
    type Failed: Clone + From<Self::Error>;

    /// `events` (contiguous, ascending) as the windows to send, in order.
    fn cut(&self, epoch: &Arc<str>, events: Vec<Self::Event>) -> Vec<Self::Window>;
    /// A window's bytes, reserved in each subscriber's backlog.
    fn bytes(window: &Self::Window) -> usize;
    fn backlog(sink: &Self::Sink) -> &Backlog;
    /// The error of a log not read yet.
    fn not_loaded() -> Self::Error;
}

/// What the machine hears.
pub enum Input<W: Wire> {
    /// The log is being read; requests that need it wait (the driver holds them).
    Loading,
    /// The log is read: the room answers from `log`, with its state as stored.
    Loaded {
        log: SeqLog<W::Event>,
        state: Option<StateAt>,
    },
    /// The log could not be read: every request gets `why` until it is.
    Failed(W::Error),
    /// A request came (the room is active).
    Activity,
    Subscribe(Subscribe<W>),
    Unsubscribe {
        conn: u64,
        generation: u64,
    },
    /// The room's parked subscribers (automatic inbox subscriptions), taken over.
    Adopt(Vec<(u64, u64, W::Sink)>),
    /// Events became durable (the log's own, or read from where it is shared).
    Durable(Vec<W::Event>),
    /// A state the log stored: the room's once its event is durable.
    State(StateAt),
    /// The events before `head` are gone where the log keeps them: start again after.
    SkipTo(u64),
    /// Send the adopted subscribers every event after this seq, outside any window.
    ReplayAdopted(u64),
    /// The wall clock, in ms since the Unix epoch: history older than the retention goes.
    Expire {
        now_ms: u64,
    },
    /// The window timer ([`Timer::Window`]) fired: what the window gathered leaves, and
    /// the next window opens once that is written if it sent anything (at most one frame
    /// per window and fan-out).
    WindowCloses,
    /// The windows handed out before [`Action::ReportWritten`] are written to their
    /// subscribers, at the instant this input is handled at: the next window opens from
    /// then.
    WindowWritten,
    /// Send what waits now, the window staying as it is (the drain, before its Close
    /// frames).
    SendWindowNow,
    /// The flush retry timer ([`Timer::Flush`]) fired.
    FlushRetry,
    /// The linger timer ([`Timer::Linger`]) fired; `busy`: as for [`Input::CheckIdle`].
    Lingered {
        busy: bool,
    },
    /// The driver started: a room that may be empty arms its linger.
    Started,
    /// Whether the room may stop now; `busy`: the driver has requests or reads in flight.
    CheckIdle {
        busy: bool,
    },
    /// The room moved to another node: every subscriber is told, the room stops.
    Moved,
    /// The driver's reads and writes for the local log.
    Log(LogInput<W>),
}

/// A subscriber's ask.
pub struct Subscribe<W: Wire> {
    pub conn: u64,
    pub generation: u64,
    pub automatic: bool,
    pub since: Option<u64>,
    pub epoch: Option<String>,
    pub state: bool,
    pub sink: W::Sink,
    pub ticket: W::Ticket,
}

/// The local log's side of a publish: the machine decides, the driver writes.
pub enum LogInput<W: Wire> {
    /// A publish with this idempotency key.
    Publish { key: Arc<str>, reply: W::Reply },
    /// The driver wrote event `seq` ([`Action::Write`]); `Err`: it is not stored.
    Written {
        seq: u64,
        key: Arc<str>,
        ts_ms: u64,
        payload: W::Event,
        reply: W::Reply,
        result: Result<(), W::Failed>,
    },
    /// A flush up to `upto` ([`Action::Flush`]) returned.
    Flushed { upto: u64, result: Result<(), W::Failed> },
    /// A state put as of the head.
    Put { data: Arc<str>, reply: W::Reply },
    /// The driver wrote a state ([`Action::WriteState`]) and flushed it, or failed to.
    StateStored { state: StateAt, reply: W::Reply, result: Result<(), W::Failed> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// The batching window closes.
    Window,
    /// A room that may be empty checks whether it can stop.
    Linger,
    /// A failed flush is tried again.
    Flush,
}

/// What the driver carries out.
pub enum Action<W: Wire> {
    /// A subscribe answered: the subscriber joined at `answer.head`.
    Subscribed {
        conn: u64,
        generation: u64,
        sink: W::Sink,
        ticket: W::Ticket,
        epoch: Arc<str>,
        answer: SubscribeAnswer<W::Event>,
        /// `Some` when the answer carries the room's state.
        state: Option<Option<StateAt>>,
    },
    /// A subscribe the room cannot answer (its log is unreadable).
    Refused {
        generation: u64,
        sink: W::Sink,
        ticket: W::Ticket,
        why: W::Error,
    },
    /// A window for one subscriber (its bytes are reserved in its backlog).
    Window {
        sink: W::Sink,
        window: W::Window,
    },
    /// The windows before this action are the whole fan-out of one frame: answer with
    /// [`Input::WindowWritten`] once they are written (at once when carrying them out
    /// wrote them), which opens the batching window from then.
    ReportWritten,
    /// A subscriber too far behind: tell it to close. `outstanding`: its backlog's bytes.
    Evict {
        conn: u64,
        sink: W::Sink,
        outstanding: usize,
    },
    /// A subscriber is gone (evicted, unsubscribed, disconnected, moved).
    Left {
        conn: u64,
    },
    /// A subscriber of a room that moved: tell it to resume elsewhere.
    Moved {
        conn: u64,
        sink: W::Sink,
    },
    /// A window closed with `events` events; `first` is the oldest (for its latency).
    Batched {
        events: usize,
        first: W::Event,
    },
    /// The room's explicit subscribers went from none to some (`true`) or back.
    Occupancy(bool),
    /// The room's subscribers or head changed (the admin overview's figures).
    Load {
        subscribers: usize,
        head: u64,
    },
    ArmTimer(Timer, Instant),
    /// History below `first_kept` is gone from the log in memory (by age, or by size as
    /// `trimmed: true`): delete it where it is kept.
    Trim {
        first_kept: u64,
        expired: bool,
    },
    /// Answer a publish or a state.
    Reply {
        to: W::Reply,
        result: Result<Published, W::Failed>,
    },
    /// Write event `seq` with this key, then tell [`LogInput::Written`].
    Write {
        seq: u64,
        key: Arc<str>,
        reply: W::Reply,
    },
    /// Write this state as of the head and flush it, then tell [`LogInput::StateStored`].
    WriteState {
        state: StateAt,
        reply: W::Reply,
    },
    /// Flush the log up to `upto`, then tell [`LogInput::Flushed`].
    Flush {
        upto: u64,
    },
    /// The room stops idle: park its automatic subscribers (conn, generation, sink).
    Retire {
        parked: Vec<(u64, u64, W::Sink)>,
        head: u64,
    },
}
