//! Where a room's events are kept, as the room actor needs it: the log each backend
//! opens ([`RoomLogs`]), what every log does ([`RoomLog`]) and what only a log shared
//! with other nodes does ([`SharedLog`]). A log tells the room's machine what it did;
//! its asynchronous work comes back through [`spawn_then`] and [`later`], which hand it
//! its own state and the room's again, and the room then carries out what its machine
//! decided. The room's mailbox is never held while that work is in flight.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::{local, stream, Frames, RoomActor, RoomCore};
use crate::actors::messages::*;
use crate::cluster::roomlog::StreamEvent;
use crate::core::delivery::room::Action;
use crate::core::rules::names;
use crate::protocol;
use crate::store::EventRecord;

/// Makes each room's log; one implementation per backend, chosen once at start-up.
pub trait RoomLogs: Send + Sync + 'static {
    fn open(&self, room: &Arc<str>) -> Log;

    /// Watch `room`, an inbox whose subscribers are parked (no actor), for what other
    /// nodes store: `wake(after)` when an event after seq `after` arrives, and for what
    /// was stored after `head` (what the parked subscribers were sent) before the watch
    /// began. `None` on a single node, where every write goes through the room's actor.
    fn watch_parked(
        &self,
        _room: &Arc<str>,
        _head: Option<u64>,
        _wake: Box<dyn Fn(u64)>,
    ) -> Option<ParkedWatch> {
        None
    }
}

/// A parked inbox's watch ([`RoomLogs::watch_parked`]): its task ends when this is dropped.
pub struct ParkedWatch {
    task: tokio::task::AbortHandle,
    /// Resolves once the watch is subscribed (taken by the first to wait for it).
    ready: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl ParkedWatch {
    pub fn new(task: tokio::task::AbortHandle, ready: tokio::sync::oneshot::Receiver<()>) -> Self {
        ParkedWatch { task, ready: Some(ready) }
    }

    /// What to await until the watch is subscribed (once).
    pub fn ready(&mut self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.ready.take()
    }
}

impl Drop for ParkedWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One room's log. An enum rather than a trait object: each kind's asynchronous work
/// comes back to its own type ([`LogPart`]), and only the stream answers [`Log::shared`].
pub enum Log {
    Local(Box<local::LocalLog>),
    Stream(Box<stream::StreamLog>),
}

impl Log {
    /// What every log does.
    pub(super) fn common(&mut self) -> &mut dyn RoomLog {
        match self {
            Log::Local(local) => local.as_mut(),
            Log::Stream(stream) => stream.as_mut(),
        }
    }

    /// What only a log shared with other nodes does (`None` on a single node).
    pub(super) fn shared(&mut self) -> Option<&mut dyn SharedLog> {
        match self {
            Log::Local(_) => None,
            Log::Stream(stream) => Some(stream.as_mut()),
        }
    }
}

/// Where one room's events are kept, as the room actor needs it. It tells the room's
/// machine what the log did ([`RoomCore::input`]); its asynchronous work comes back
/// through [`spawn_then`] and [`later`], and the room's mailbox is never held meanwhile.
pub trait RoomLog {
    /// Read the room's log (a log that reads asynchronously keeps the room loading:
    /// requests that need the log are held meanwhile).
    fn load(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>);
    /// Store a publish and answer it once it is durable (a known id is a duplicate).
    fn publish(&mut self, room: &mut RoomCore, msg: Publish, ctx: &mut Context<RoomActor>);
    /// Store the room's state as of its head and answer once it is durable.
    fn put_state(&mut self, room: &mut RoomCore, msg: PutState, ctx: &mut Context<RoomActor>);
    /// The room's log dropped its events below `first_kept`, by age (`expired`) or size.
    fn trimmed(&mut self, room: &RoomCore, first_kept: u64, expired: bool);
    /// Carry out a write or flush the room's machine asked for.
    fn carry_out(
        &mut self,
        room: &mut RoomCore,
        action: Action<Frames>,
        ctx: &mut Context<RoomActor>,
    );
    /// Whether requests still wait on the log beyond what the room's machine knows.
    fn busy(&self) -> bool;
}

/// What only a log other nodes write too needs of the room (cluster mode).
pub trait SharedLog {
    /// Another node's event.
    fn live_event(&mut self, room: &mut RoomCore, event: StreamEvent, ctx: &mut Context<RoomActor>);
    /// Another node's latest-state record.
    fn live_state(&mut self, room: &mut RoomCore, state: LiveState);
    /// Whether a subscribe or a read must wait for the room's live feed: a live room
    /// that dropped it starts taking it again (subscribe, read what it missed) beside
    /// its mailbox, once; `true` while that is in flight.
    fn refeeding(&mut self, room: &RoomCore, ctx: &mut Context<RoomActor>) -> bool;
    /// No retake of the live feed is in flight.
    fn fed(&self) -> bool;
    /// A subscriber saw events up to `since`, beyond the room's head: when the room has
    /// seen an event at or after `since` announced on its feed, it reads what it missed
    /// (one read at a time); otherwise nothing is read.
    fn ahead(&mut self, room: &mut RoomCore, since: u64, ctx: &mut Context<RoomActor>);
    /// The room's subscribers may have changed: a feed unwatched long enough is dropped.
    fn subscribers_changed(&mut self, room: &RoomCore, ctx: &mut Context<RoomActor>);
    /// Read what other writers added that this room may have missed.
    fn catch_up(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>);
    /// The room starts with parked subscribers, adopted for an event after `replay_after`.
    fn adopted(&mut self, replay_after: Option<u64>);
    /// The cell the room's home moved to since its log was read, if it did: the log's
    /// epoch and sequence are no longer the room's, and the room must not be served.
    fn moved_away(&self, room: &RoomCore) -> Option<Arc<str>>;
}

/// A kind of log, found again in the room's [`Log`] by its own continuations.
pub(super) trait LogPart: RoomLog + 'static {
    fn part(log: &mut Log) -> Option<&mut Self>;
}

/// Run `work` on the room's context, then `then` with the room's log (of kind `L`: a
/// room's log never changes kind) and the result; then the room carries out what its
/// machine decided.
pub(super) fn spawn_then<L: LogPart, T: 'static>(
    ctx: &mut Context<RoomActor>,
    work: impl Future<Output = T> + 'static,
    then: impl FnOnce(&mut L, &mut RoomCore, T, &mut Context<RoomActor>) + 'static,
) {
    ctx.spawn(actix::fut::wrap_future::<_, RoomActor>(work).map(move |out, actor, ctx| {
        if let Some(log) = L::part(&mut actor.log) {
            then(log, &mut actor.core, out, ctx);
            actor.settle(ctx);
        }
    }));
}

/// Run `then` with the room's log after `after`.
pub(super) fn later<L: LogPart>(
    ctx: &mut Context<RoomActor>,
    after: Duration,
    then: impl FnOnce(&mut L, &mut RoomCore, &mut Context<RoomActor>) + 'static,
) {
    ctx.run_later(after, move |actor, ctx| {
        if let Some(log) = L::part(&mut actor.log) {
            then(log, &mut actor.core, ctx);
            actor.settle(ctx);
        }
    });
}

/// Who waits for a publish's or a state's answer (the local log writes the publish
/// itself when the machine asks).
pub enum Pending {
    Publish(Publish),
    Reply(oneshot::Sender<Result<Published, PublishFailed>>),
}

impl Pending {
    pub(super) fn send(self, result: Result<Published, PublishFailed>) {
        let _ = match self {
            Pending::Publish(msg) => msg.reply.send(result),
            Pending::Reply(reply) => reply.send(result),
        };
    }
}

/// The key a stored event's idempotency id is kept under in its room's log: a client's
/// ids are its user's alone ([`names::idempotency_key`]).
pub(super) fn id_key(event: &EventRecord) -> Arc<str> {
    names::idempotency_key(&event.id, event.from.as_deref()).into()
}

/// [`id_key`] of a publish not yet stored.
pub(super) fn publish_key(msg: &Publish) -> Arc<str> {
    match &msg.from {
        Some(user) => names::idempotency_key(&msg.id, Some(user.as_str())).into(),
        None => msg.id.clone(),
    }
}

/// Render a stored event once for every subscriber.
pub(super) fn render(room: &str, event: &EventRecord) -> Arc<Delivery> {
    Arc::new(Delivery {
        seq: event.seq,
        ts_ms: event.ts_ms,
        json: protocol::render_event(
            room,
            event.seq,
            &event.id,
            event.ts_ms,
            event.from.as_deref(),
            &event.data,
        )
        .into(),
        devices: event.devices.as_ref().map(|d| d.iter().map(|s| s.as_str().into()).collect()),
    })
}
