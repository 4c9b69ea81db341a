//! One actor per WebSocket connection: identity, subscriptions, heartbeat, limits and
//! close codes. Rooms batch their events into windows and render each window's frame
//! once; a connection writes that shared frame as it is, and renders its own only where
//! it must filter (a replay overlapping what it sent, device-targeted inbox messages).
//! On a plain-TCP WebSocket the room's thread does that write itself whenever nothing
//! the rooms posted waits in the mailbox ([`super::link`]); the decision is the same
//! subscription machine's either way.
//! The client is on a WebSocket (livegate's own transport, [`wsio`], driven inside this
//! actor) or a Server-Sent Events stream ([`super::sse`]); [`Transport`] is the one place
//! they differ, so everything else here is the same code for both.
//!
//! Every byte held for the connection is counted in its [`Backlog`] against
//! `max_outbox_bytes` (`core::outbox`): over it the socket is not read, and after the
//! grace the connection is closed with 4009.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_http::ws;

use super::messages::*;
use super::publish::{Publisher, Submission};
use super::registry::Registry;
use super::room::RoomActor;
use super::rooms::Rooms;
use super::socket::{ends_closing, Fault, Inbound, MessageReader, CLOSE_HANDSHAKE_TIMEOUT, FINISH_WITHIN};
use super::transport::Transport;
use super::wsio::{self, ReadError, WsActor, WsIo};
use crate::core::backlog::Backlog;
use crate::core::credentials::ResumeGrant;
use crate::core::limits::{self, burst_for, room_start_burst, Strikes, TokenBucket};
use crate::core::names;
use crate::core::outbox::{Outbox, Verdict};
use crate::core::subscriptions::{Answer, Subscription, Subscriptions};
use super::link::ConnectionLink;
use crate::protocol::{self, ClientOp, ClientRequest, CloseCode, ErrorCode, ServerOp};
use crate::store::credentials::ResumeRevocations;

/// `limit` of a `history` request that names none.
pub const HISTORY_DEFAULT_LIMIT: usize = 100;
/// A connection's publishes waiting to be durable; more are refused (`rate_limited`),
/// so a client cannot pile up appends even with `max_messages_per_sec = 0`.
pub const MAX_PUBLISHES_IN_FLIGHT: usize = 64;

/// Why a connection may not read a room (`subscribe`, `history`, `presence`).
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    #[error(transparent)]
    BadName(#[from] names::NameError),
    #[error("this connection may not read room {0}")]
    Forbidden(String),
}

impl Unreadable {
    fn code(&self) -> ErrorCode {
        match self {
            Unreadable::BadName(_) => ErrorCode::BadRoom,
            Unreadable::Forbidden(_) => ErrorCode::Forbidden,
        }
    }
}

/// What every connection shares.
pub struct ConnectionSettings {
    pub metrics: Arc<crate::metrics::Metrics>,
    pub revocations: Arc<dyn ResumeRevocations>,
    /// Clients' `publish` ops go through it, the HTTP API's path (cluster mode too); it
    /// knows each room's `max_event_bytes`.
    pub publisher: Publisher,
    pub node: String,
    pub heartbeat: Duration,
    pub max_subscriptions: usize,
    /// Largest client message, assembled from continuation frames.
    pub max_message_bytes: usize,
    /// Bytes sent to a connection but not yet written before it is closed with 4009.
    pub max_outbox_bytes: usize,
    /// Client messages per second (burst: twice that); 0: no limit.
    pub max_messages_per_sec: u64,
    /// Refused client messages per minute before a close with 1008.
    pub max_bad_messages: u64,
    /// Room actors a connection may start per second (a subscribe or history read of a
    /// room not live here); burst [`room_start_burst`]; 0: no limit.
    pub max_room_starts_per_sec: u64,
    /// Largest `limit` of a history read.
    pub max_history_limit: usize,
    /// Close a connection that has not subscribed to a room by then (None: never).
    pub subscribe_timeout: Option<Duration>,
    /// Told of every client publish once it is durable (`client_published`); `None`:
    /// webhooks are off.
    pub webhooks: Option<super::webhooks::Webhooks>,
}

/// Who is connected, as the token said.
#[derive(Debug, Clone)]
pub struct Identity {
    pub user: Arc<str>,
    pub device: Arc<str>,
    pub session: String,
    /// Room patterns from the token (empty: any room).
    pub rooms: Vec<String>,
    /// Room patterns the token lets it publish to (empty: none; never an inbox).
    pub publish: Vec<String>,
    /// Whether the node validated this session in warm-up (reported in `welcome`).
    pub warmup: bool,
    /// This connection's one-time resume credential (sent in `welcome`).
    pub resume: Option<ResumeGrant>,
    /// When the credential it opened with was issued and checked against the kicks.
    pub credential: CredentialTimes,
}

/// A room a connection subscribes to as it starts (an SSE stream's `rooms`), with the
/// position its cursor named, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialSubscription {
    pub room: String,
    pub since: Option<u64>,
    pub epoch: Option<String>,
    /// With the room's state (`state=1`).
    pub state: bool,
    /// Send the room's presence frames (`&presence=1`).
    pub presence: bool,
}

/// A client publish's `client_published` webhook, waiting for the event to be durable.
struct PublishedWebhook {
    webhooks: super::webhooks::Webhooks,
    user: String,
    device: String,
    event_id: Option<String>,
    data: String,
}

impl PublishedWebhook {
    fn enqueue(self, room: &str, seq: u64) {
        let Some(data) = protocol::event_data(self.data) else {
            // The op's data was parsed as JSON; this cannot happen.
            return tracing::error!(%room, seq, "client publish data is not JSON: no webhook");
        };
        self.webhooks.enqueue(super::webhooks::WebhookEvent::ClientPublished {
            room: room.to_string(),
            ts_ms: crate::world::now_ms(),
            user: self.user,
            device: Some(self.device),
            seq,
            event_id: self.event_id,
            data,
        });
    }
}

pub struct Connection {
    id: ConnId,
    identity: Identity,
    settings: Arc<ConnectionSettings>,
    rooms: Rooms,
    registry: Addr<Registry>,
    /// Its subscriptions and what it sent of each (`core::subscriptions`), shared with
    /// the rooms that write its windows from their threads (`link`).
    link: Arc<ConnectionLink>,
    last_heard: Instant,
    reader: MessageReader,
    /// Client messages allowed now, refilled at `max_messages_per_sec`.
    message_rate: TokenBucket,
    /// Room actors this connection may start now, refilled at `max_room_starts_per_sec`.
    room_starts: TokenBucket,
    /// Refused messages this minute.
    strikes: Strikes,
    /// Whether the client has subscribed to a room (the automatic inbox not counted).
    subscribed_once: bool,
    /// This connection's publishes not yet answered (at most [`MAX_PUBLISHES_IN_FLIGHT`]).
    publishing: usize,
    /// History and presence requests whose answers have not come back (with the
    /// subscribes not yet answered, at most `core::outbox::MAX_ANSWERS_PENDING`; then
    /// the socket is not read).
    answers_pending: usize,
    /// The bound on what is held for this connection, and since when it is over it.
    outbox: Outbox,
    /// A timer is set to look at the outbox again when the grace ends.
    grace_timer: bool,
    /// Held while the connection lives: its place in the connection limits.
    _permit: Option<Box<dyn Send>>,
    io: Transport,
    /// Subscribed once the connection has started (after `welcome`).
    initial: Vec<InitialSubscription>,
    /// A Close frame was sent; waiting for the client's.
    closing: bool,
    /// The close code that ended (or is ending) the connection, for the metrics.
    close_code: Option<u16>,
}

impl Connection {
    pub fn new(
        id: ConnId,
        identity: Identity,
        settings: Arc<ConnectionSettings>,
        rooms: Rooms,
        registry: Addr<Registry>,
        mut io: Transport,
        to: Recipient<RoomUpdate>,
    ) -> Self {
        let backlog = Arc::new(Backlog::new(settings.max_outbox_bytes));
        io.count_into(backlog.clone());
        let inbox = names::inbox_room(&identity.user).into();
        let machine = Subscriptions::new(inbox, identity.device.clone(), settings.max_subscriptions);
        let link = ConnectionLink::new(machine, backlog, io.outgoing(), to, settings.metrics.clone());
        Connection {
            link: Arc::new(link),
            io,
            initial: Vec::new(),
            closing: false,
            close_code: None,
            id,
            identity,
            rooms,
            registry,
            last_heard: Instant::now(),
            reader: MessageReader::new(settings.max_message_bytes),
            message_rate: TokenBucket::new(burst_for(settings.max_messages_per_sec), crate::world::now_ms()),
            room_starts: TokenBucket::new(
                room_start_burst(settings.max_room_starts_per_sec, settings.max_subscriptions),
                crate::world::now_ms(),
            ),
            strikes: Strikes::default(),
            subscribed_once: false,
            publishing: 0,
            answers_pending: 0,
            outbox: Outbox::new(settings.max_outbox_bytes, crate::core::outbox::GRACE_MS),
            grace_timer: false,
            _permit: None,
            settings,
        }
    }

    /// Hold `permit` (its place in the connection limits) while the connection lives.
    pub fn holding(mut self, permit: Box<dyn Send>) -> Self {
        self._permit = Some(permit);
        self
    }

    /// Subscribe to `rooms` once started, right after `welcome`.
    pub fn subscribing(mut self, rooms: Vec<InitialSubscription>) -> Self {
        self.initial = rooms;
        self
    }

    /// Write a reply frame, unless our Close already went out (nothing may follow it).
    fn reply(&mut self, op: ServerOp, frame: String) {
        if !self.closing {
            self.io.text(op, &frame);
        }
    }

    /// An `error` frame; `room`: the room the refused request named, if it named one.
    fn send_error(&mut self, reference: Option<i64>, room: Option<&str>, code: ErrorCode, message: &str) {
        self.reply(ServerOp::Error, protocol::error_frame(reference, room, code, message));
    }

    /// Write `events` (of one room of `epoch`, ascending) as `events` frames of bounded size.
    fn write_events(&mut self, epoch: &Arc<str>, events: Vec<Arc<Delivery>>) {
        for window in Window::cut(epoch, events) {
            self.write_window(&window);
        }
    }

    fn write_window(&mut self, window: &Window) {
        self.settings.metrics.frame_written(window.events.len());
        let link = &self.link;
        self.io.window(window, || crate::core::sse::render_cursor(link.machine().positions()));
    }

    /// A room's window: the shared frame, a frame of the connection's own, or nothing,
    /// as the subscription machine decides.
    fn on_window(&mut self, room: &str, window: &Window) {
        let plan = self.link.machine().on_window(room, &window.epoch, &window.events, window.targeted);
        window.frames_for(plan, |frame| self.write_window(frame));
    }

    /// Close as a slow consumer: nothing more is queued for a client that does not read.
    fn evict_slow(&mut self, ctx: &mut Context<Self>) {
        // Counted by whoever evicts first: a room (which saw the backlog) or this actor.
        if self.link.backlog().evict() {
            self.settings.metrics.slow_consumer_closes.inc();
        }
        // What it has not started to read is dropped, so the Close goes out next.
        self.io.discard_unsent();
        self.close(ctx, CloseCode::SlowConsumer, "slow consumer: too many bytes queued");
    }

    /// Every byte held for this connection against its bound: over it for the grace,
    /// close with 4009; over it, look again when the grace ends.
    fn check_outbox(&mut self, ctx: &mut Context<Self>) {
        if self.closing {
            return;
        }
        let held = self.link.backlog().held();
        // The clock is read only over the bound: this runs before every frame read.
        let now_ms = if self.outbox.full(held) { crate::world::now_ms() } else { 0 };
        match self.outbox.observe(held, now_ms) {
            Verdict::Under => {}
            Verdict::Over { close_in_ms } => {
                if !self.grace_timer {
                    self.grace_timer = true;
                    ctx.run_later(Duration::from_millis(close_in_ms), |conn, ctx| {
                        conn.grace_timer = false;
                        conn.answered(ctx);
                    });
                }
            }
            Verdict::Close => {
                tracing::info!(conn = self.id, user = %self.identity.user, held, "slow consumer: over the outbox bound for the grace");
                self.evict_slow(ctx);
            }
        }
    }

    /// An answer came in (or the grace's timer fired), on one of the actor's futures
    /// that may run after the reader decided not to read: count it against the bound and
    /// have the reader look again (nothing else would wake it).
    fn answered(&mut self, ctx: &mut Context<Self>) {
        self.check_outbox(ctx);
        self.io.wake_reader();
    }

    /// Requests whose answers have not come back: history and presence reads, and
    /// subscribes the room has not answered yet.
    fn pending_answers(&self) -> usize {
        self.answers_pending + self.link.machine().unanswered()
    }

    /// Send a Close frame (after what is written already) and wait, bounded, for the
    /// client's Close. A second close, or `force`, stops at once.
    fn close_with(&mut self, ctx: &mut Context<Self>, code: CloseCode, reason: &str, force: bool) {
        if self.closing {
            ctx.stop();
            return;
        }
        let code = code.code();
        tracing::debug!(conn = self.id, user = %self.identity.user, transport = self.io.name(), code, reason, force, "closing connection");
        // The machine first: a room writing from its thread sends nothing after the Close.
        self.link.machine().close();
        self.io.close(code, reason);
        self.closing = true;
        self.close_code = Some(code);
        if force {
            ctx.stop();
        } else {
            ctx.run_later(CLOSE_HANDSHAKE_TIMEOUT, |_, ctx| ctx.stop());
        }
    }

    fn close(&mut self, ctx: &mut Context<Self>, code: CloseCode, reason: &str) {
        self.close_with(ctx, code, reason, false);
    }

    fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        if self.closing {
            return;
        }
        if limits::client_timed_out(self.io.reads(), self.last_heard.elapsed(), self.settings.heartbeat) {
            self.close(ctx, CloseCode::HeartbeatTimeout, "heartbeat timeout");
        } else {
            self.io.heartbeat();
            self.check_outbox(ctx);
        }
    }

    fn handle_text(&mut self, text: &str, ctx: &mut Context<Self>) {
        let request = match protocol::parse_client_frame(text) {
            Ok(request) => request,
            Err(e) => return self.refuse(ctx, e.reference, e.room.as_deref(), e.code, &e.message),
        };
        let rate = self.settings.max_messages_per_sec;
        if let Err(wait_ms) = self.message_rate.take(rate, burst_for(rate), crate::world::now_ms()) {
            self.settings.metrics.limit_hit("message_rate");
            if matches!(request.op, ClientOp::Publish { .. }) {
                self.settings.metrics.client_publish("rate_limited");
            }
            let message = format!("more than {rate} messages per second; retry in {wait_ms} ms");
            return self.refuse(ctx, request.reference, request.op.room(), ErrorCode::RateLimited, &message);
        }
        self.handle_request(request, ctx)
    }

    fn handle_request(&mut self, request: ClientRequest, ctx: &mut Context<Self>) {
        let reference = request.reference;
        match request.op {
            ClientOp::Ping => self.io.text(ServerOp::Pong, &protocol::pong_frame(reference)),
            ClientOp::Publish { room, id, data, state } => self.publish(room, id, data, state, reference, ctx),
            ClientOp::Subscribe { room, since, epoch, state, presence } => {
                self.subscribed_once = true;
                self.subscribe(room, since, epoch, state, presence, reference, ctx)
            }
            ClientOp::Presence { room } => self.read_presence(room, reference, ctx),
            ClientOp::Unsubscribe { room } => {
                if names::check_room(&room).is_err() {
                    return self.send_error(reference, Some(&room), ErrorCode::BadRoom, &names::NameError::BadRoom.to_string());
                }
                self.unsubscribe(&room);
                self.io.text(ServerOp::Unsubscribed, &protocol::unsubscribed_frame(&room, reference));
            }
            ClientOp::History { room, since, limit } => {
                if let Err(why) = self.check_readable(&room) {
                    return self.send_error(reference, Some(&room), why.code(), &why.to_string());
                }
                let limit = match limits::history_limit(limit, HISTORY_DEFAULT_LIMIT, self.settings.max_history_limit) {
                    Ok(limit) => limit,
                    Err(too_high) => {
                        self.settings.metrics.limit_hit("history_limit");
                        return self.refuse(ctx, reference, Some(&room), ErrorCode::BadRequest, &too_high.to_string());
                    }
                };
                if !self.may_start_room(&room, reference, ctx) {
                    return;
                }
                let rooms = self.rooms.clone();
                let fut = async move { (rooms.history(&room, since, limit).await, room) };
                self.answers_pending += 1;
                ctx.spawn(fut.into_actor(self).map(move |(result, room), conn, ctx| {
                    conn.answers_pending -= 1;
                    match result {
                        Ok(page) => conn.reply_history(&room, &page, reference),
                        Err(e) => conn.send_error(reference, Some(&room), ErrorCode::Unavailable, &e.to_string()),
                    }
                    conn.answered(ctx);
                }));
            }
        }
    }

    /// A history page, cut to what fits under the outbox bound (at least one event; then
    /// `complete` is false and the client reads on after the last seq it got).
    fn reply_history(&mut self, room: &str, page: &HistoryPage, reference: Option<i64>) {
        let device = &self.identity.device;
        let events: Vec<&str> = page.events.iter().filter(|e| e.is_for(device)).map(|e| &*e.json).collect();
        let epoch = page.epoch.as_deref();
        let overhead = protocol::history_frame(room, epoch, page.head, std::iter::empty(), false, reference).len();
        let fits = self.outbox.page_fits(self.link.backlog().held(), overhead, events.iter().map(|e| e.len()));
        let complete = page.complete && fits == events.len();
        let frame = protocol::history_frame(room, epoch, page.head, events[..fits].iter().copied(), complete, reference);
        self.reply(ServerOp::History, frame)
    }

    /// A client's publish: only to a room the token's publish patterns name
    /// (never an inbox), through `Publisher::submit`, the HTTP API's path and checks;
    /// `published` goes out once the event is durable. The event's `from` is this
    /// connection's user, whatever the client sent.
    fn publish(
        &mut self,
        room: String,
        id: Option<String>,
        data: String,
        state: Option<String>,
        reference: Option<i64>,
        ctx: &mut Context<Self>,
    ) {
        let metrics = self.settings.metrics.clone();
        if let Err(e) = names::check_room(&room) {
            metrics.client_publish("bad_room");
            return self.send_error(reference, Some(&room), ErrorCode::BadRoom, &e.to_string());
        }
        if !names::may_publish(&self.identity.publish, &room) {
            metrics.client_publish("forbidden");
            return self.send_error(reference, Some(&room), ErrorCode::Forbidden, &format!("this connection may not publish to room {room}"));
        }
        if self.publishing >= MAX_PUBLISHES_IN_FLIGHT {
            metrics.client_publish("rate_limited");
            let message = format!("at most {MAX_PUBLISHES_IN_FLIGHT} publishes may wait to be stored at once");
            return self.send_error(reference, Some(&room), ErrorCode::RateLimited, &message);
        }
        self.publishing += 1;
        let from = Some(self.identity.user.to_string());
        // What the `client_published` webhook tells, kept only when webhooks are on.
        let told = self.settings.webhooks.clone().map(|webhooks| PublishedWebhook {
            webhooks,
            user: self.identity.user.to_string(),
            device: self.identity.device.to_string(),
            event_id: id.clone(),
            data: data.clone(),
        });
        let event = Submission { id, data: data.into(), devices: None, from, state: state.map(Into::into) };
        let publisher = self.settings.publisher.clone();
        let fut = async move {
            let result = publisher.submit(&room, event).await;
            // Queued once durable, before the answer; a duplicate's went with the original.
            if let (Some(told), Ok(published)) = (told, &result) {
                if !published.duplicate {
                    told.enqueue(&room, published.seq);
                }
            }
            (room, result)
        };
        // The publish is a task of its own, not the actor's: a publish op read before its
        // connection closed is still stored, and its webhook queued, once it is durable.
        let task = actix::spawn(fut);
        ctx.spawn(async move { task.await.ok() }.into_actor(self).map(move |done, conn, ctx| {
            conn.publishing -= 1;
            let Some((room, result)) = done else { return };
            match result {
                Ok(published) => {
                    metrics.publish_answered(published.duplicate);
                    metrics.client_publish(if published.duplicate { "duplicate" } else { "published" });
                    let frame = protocol::published_frame(&room, published.seq, published.duplicate, reference);
                    conn.reply(ServerOp::Published, frame);
                }
                Err(error) => {
                    let code = error.code();
                    metrics.client_publish(code.as_str());
                    tracing::debug!(conn = conn.id, %room, %error, "client publish refused");
                    conn.send_error(reference, Some(&room), code, &error.to_string());
                }
            }
            conn.answered(ctx);
        }));
    }

    /// A request to a room with no live actor here starts one: it takes one of the
    /// connection's room starts, and without one it is refused (`rate_limited`, counted
    /// as `room_starts`, a strike like any refused message). A room that stops between
    /// this look and the request is started anyway: at most one start per request.
    fn may_start_room(&mut self, room: &str, reference: Option<i64>, ctx: &mut Context<Self>) -> bool {
        let rate = self.settings.max_room_starts_per_sec;
        if rate == 0 || self.rooms.is_live(room) {
            return true;
        }
        let burst = room_start_burst(rate, self.settings.max_subscriptions);
        match self.room_starts.take(rate, burst, crate::world::now_ms()) {
            Ok(()) => true,
            Err(wait_ms) => {
                self.settings.metrics.limit_hit("room_starts");
                let message = format!("more than {rate} new rooms per second; retry in {wait_ms} ms");
                self.refuse(ctx, reference, Some(room), ErrorCode::RateLimited, &message);
                false
            }
        }
    }

    fn check_readable(&self, room: &str) -> Result<(), Unreadable> {
        names::check_room(room)?;
        if !names::may_read(&self.identity.user, &self.identity.rooms, room) {
            return Err(Unreadable::Forbidden(room.to_string()));
        }
        Ok(())
    }

    /// The `presence` op: who is in a room this connection may read.
    fn read_presence(&mut self, room: String, reference: Option<i64>, ctx: &mut Context<Self>) {
        if let Err(why) = self.check_readable(&room) {
            return self.send_error(reference, Some(&room), why.code(), &why.to_string());
        }
        let rooms = self.rooms.clone();
        let fut = async move { (rooms.presence(&room).await, room) };
        self.answers_pending += 1;
        ctx.spawn(fut.into_actor(self).map(move |(result, room), conn, ctx| {
            conn.answers_pending -= 1;
            match result {
                Ok(Ok(view)) => conn.reply(ServerOp::Presence, protocol::presence_reply_frame(&room, &view, reference)),
                Ok(Err(off)) => conn.send_error(reference, Some(&room), ErrorCode::PresenceOff, &off.to_string()),
                Err(e) => conn.send_error(reference, Some(&room), ErrorCode::Unavailable, &e.to_string()),
            }
            conn.answered(ctx);
        }));
    }

    fn subscribe(
        &mut self,
        room: String,
        since: Option<u64>,
        epoch: Option<String>,
        state: bool,
        presence: bool,
        reference: Option<i64>,
        ctx: &mut Context<Self>,
    ) {
        if let Err(why) = self.check_readable(&room) {
            return self.send_error(reference, Some(&room), why.code(), &why.to_string());
        }
        let room: Arc<str> = room.into();
        let admitted = self.link.machine().admits(&room);
        if let Err(too_many) = admitted {
            self.settings.metrics.limit_hit("subscriptions");
            return self.send_error(reference, Some(&room), ErrorCode::TooManySubscriptions, &too_many.to_string());
        }
        if !self.may_start_room(&room, reference, ctx) {
            return;
        }
        let (generation, replaced) = self.link.machine().begin(room.clone(), since);
        match replaced {
            Some(old) => self.leave(&room, old),
            None => {
                self.settings.metrics.subscriptions.inc();
            }
        }
        let (rooms, conn, to) = (self.rooms.clone(), self.id, self.link.clone());
        let name = room.clone();
        let member = crate::core::presence::Member { user: self.identity.user.clone(), device: self.identity.device.clone() };
        let subscribe =
            Subscribe { conn, to, since, epoch, reference, generation, automatic: false, state, member: Some(member), presence };
        let fut = async move { rooms.subscribe(&name, subscribe).await };
        ctx.spawn(fut.into_actor(self).map(move |result, conn, _| match result {
            Ok(addr) => {
                let attached = conn.link.machine().attach(&room, generation, addr);
                if let Err(stale) = attached {
                    stale.do_send(Unsubscribe { conn: conn.id, generation });
                }
            }
            Err(e) => conn.refused(&room, generation, reference, &e.to_string()),
        }));
    }

    fn unsubscribe(&mut self, room: &str) {
        let ended = self.link.machine().end(room);
        if let Some(sub) = ended {
            self.ended(room, sub);
        }
    }

    /// Generation `generation` of the room's subscribe was refused (by the room, or the
    /// room could not be reached): if it is still current it ends, and the client is told.
    fn refused(&mut self, room: &str, generation: u64, reference: Option<i64>, message: &str) {
        let refused = self.link.machine().on_refused(room, generation);
        if let Some(sub) = refused {
            self.ended(room, sub);
            self.send_error(reference, Some(room), ErrorCode::Unavailable, message);
        }
    }

    /// A subscription ended: count it and leave the room.
    fn ended(&mut self, room: &str, sub: Subscription<Addr<RoomActor>>) {
        self.settings.metrics.subscriptions.dec();
        self.leave(room, sub);
    }

    /// Tell the room (or the rooms table, for a parked inbox) that `sub` ended.
    fn leave(&self, room: &str, sub: Subscription<Addr<RoomActor>>) {
        match sub.room {
            Some(addr) => addr.do_send(Unsubscribe { conn: self.id, generation: sub.generation }),
            None => self.rooms.release(room, self.id, sub.generation),
        }
    }

    /// The automatic inbox subscription: announced now, parked in the rooms table while
    /// the inbox has no actor (nothing is read until a message comes or the client asks).
    fn subscribe_inbox(&mut self, ctx: &mut Context<Self>) {
        let room = self.link.machine().inbox().clone();
        self.io.text(ServerOp::Subscribed, &protocol::inbox_notice_frame(&room));
        self.settings.metrics.subscriptions.inc();
        let generation = self.link.machine().begin_inbox();
        let parked = Parked { conn: self.id, to: self.link.clone(), generation };
        let rooms = self.rooms.clone();
        let fut = async move { rooms.subscribe_inbox(&room, parked).await.map(|addr| (room, addr)) };
        ctx.spawn(fut.into_actor(self).map(move |result, conn, _| match result {
            Ok((room, Some(addr))) => {
                let attached = conn.link.machine().attach(&room, generation, addr);
                if let Err(stale) = attached {
                    stale.do_send(Unsubscribe { conn: conn.id, generation });
                }
            }
            Ok((_, None)) => {}
            Err(error) => tracing::warn!(conn = conn.id, %error, "automatic inbox subscription failed"),
        }));
    }

    /// A refused message: answer it, and close with 1008 once a client keeps sending them.
    fn refuse(&mut self, ctx: &mut Context<Self>, reference: Option<i64>, room: Option<&str>, code: ErrorCode, message: &str) {
        self.send_error(reference, room, code, message);
        if self.strikes.strike(self.settings.max_bad_messages, crate::world::now_ms()) {
            self.settings.metrics.limit_hit("bad_messages");
            self.close(ctx, CloseCode::Policy, "too many refused messages");
        }
    }

    fn on_inbound(&mut self, inbound: Inbound, ctx: &mut Context<Self>) {
        match inbound {
            Inbound::Text(text) => self.handle_text(&text, ctx),
            Inbound::Binary(_) => {
                self.refuse(ctx, None, None, ErrorCode::BadRequest, "binary frames are not part of the protocol; send JSON text")
            }
            Inbound::Ping(payload) => self.io.pong(&payload),
            Inbound::Nothing => {}
            Inbound::Close(reason) => {
                tracing::debug!(conn = self.id, ?reason, "client closed");
                self.close_code = Some(reason.as_ref().map_or(1005, |r| u16::from(r.code)));
                self.closing = true;
                self.link.machine().close();
                self.io.echo_close(reason);
                ctx.stop();
            }
        }
    }

    fn on_fault(&mut self, fault: Fault, ctx: &mut Context<Self>) {
        if let Some(limit) = fault.limit() {
            self.settings.metrics.limit_hit(limit);
        }
        match fault.close_code() {
            Some(code) => self.close_with(ctx, code, fault.reason(), fault.fails_connection()),
            None => {
                // Keep a close code already known; otherwise this is an abnormal end (1006).
                self.close_code.get_or_insert(1006);
                ctx.stop();
            }
        }
    }

    /// An SSE stream's body ended: the client is gone (or took our close): stop.
    fn on_stream_end(&mut self, ctx: &mut Context<Self>) {
        if !self.closing {
            tracing::debug!(conn = self.id, user = %self.identity.user, "SSE client went away");
        }
        self.close_code.get_or_insert(1006);
        ctx.stop();
    }

    /// Close a connection that never subscribed to a room.
    fn check_subscribed(&mut self, ctx: &mut Context<Self>) {
        if !self.subscribed_once && !self.closing {
            self.settings.metrics.limit_hit("subscribe_timeout");
            self.close(ctx, CloseCode::Policy, "no subscribe in time");
        }
    }
}

impl Actor for Connection {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        match &self.io {
            Transport::Ws(_) => wsio::drive(ctx),
            Transport::Sse(io) => {
                ctx.spawn(io.ended().into_actor(self).map(|(), conn, ctx| conn.on_stream_end(ctx)));
                // The stream names its rooms up front; it can never subscribe later.
                self.subscribed_once = true;
            }
        }
        let heartbeat_ms = self.settings.heartbeat.as_millis() as u64;
        let resume = self.identity.resume.as_ref().map(|grant| (grant.credential.as_str(), grant.expires_at_ms));
        let welcome = protocol::welcome_frame(&self.identity.session, &self.settings.node, heartbeat_ms, self.identity.warmup, resume);
        self.io.text(ServerOp::Welcome, &welcome);
        self.subscribe_inbox(ctx);
        for initial in std::mem::take(&mut self.initial) {
            self.subscribed_once = true;
            self.subscribe(initial.room, initial.since, initial.epoch, initial.state, initial.presence, None, ctx);
        }
        self.registry.do_send(Register {
            conn: self.id,
            user: self.identity.user.clone(),
            device: self.identity.device.clone(),
            to: ctx.address().recipient(),
            credential: self.identity.credential,
        });
        ctx.run_interval(self.settings.heartbeat, |conn, ctx| conn.heartbeat(ctx));
        if let Some(timeout) = self.settings.subscribe_timeout {
            ctx.run_later(timeout, |conn, ctx| conn.check_subscribed(ctx));
        }
        let metrics = &self.settings.metrics;
        metrics.connections_open.get_or_create(&metrics.device(&self.identity.device)).inc();
        metrics.connections_by_transport.get_or_create(&crate::metrics::TransportLabel { transport: self.io.name() }).inc();
        metrics.connects.inc();
        tracing::debug!(conn = self.id, user = %self.identity.user, device = %self.identity.device, transport = self.io.name(), "connected");
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.io.finish(FINISH_WITHIN);
        let metrics = &self.settings.metrics;
        let ended: Vec<_> = self.link.machine().drain().collect();
        metrics.subscriptions.dec_by(ended.len() as i64);
        for (room, sub) in ended {
            self.leave(&room, sub);
        }
        // The gauge first: a kick answers on Unregister and must find it already down.
        metrics.connections_open.get_or_create(&metrics.device(&self.identity.device)).dec();
        metrics.connections_by_transport.get_or_create(&crate::metrics::TransportLabel { transport: self.io.name() }).dec();
        self.registry.do_send(Unregister { conn: self.id });
        // No close code at all means the socket just ended.
        metrics.disconnects.get_or_create(&crate::metrics::Metrics::close_code(self.close_code.unwrap_or(1006))).inc();
        tracing::debug!(conn = self.id, user = %self.identity.user, code = self.close_code.unwrap_or(1006), "disconnected");
    }
}

impl WsActor for Connection {
    fn io(&mut self) -> Option<&mut WsIo> {
        match &mut self.io {
            Transport::Ws(io) => Some(io),
            Transport::Sse(_) => None,
        }
    }

    /// Not while over the outbox bound or with too many answers pending: what a request
    /// read now would add could not be bounded. After our Close, only the client's
    /// Close matters, and reading goes on to see it.
    fn may_read(&mut self, ctx: &mut Self::Context) -> bool {
        self.check_outbox(ctx);
        self.closing || self.outbox.may_read(self.link.backlog().held(), self.pending_answers())
    }

    fn on_read(&mut self, item: Result<ws::Message, ReadError>, ctx: &mut Self::Context) {
        self.last_heard = Instant::now();
        let read = self.reader.read(item);
        if self.closing {
            if ends_closing(&read) {
                ctx.stop();
            }
            return;
        }
        match read {
            Ok(inbound) => self.on_inbound(inbound, ctx),
            Err(fault) => self.on_fault(fault, ctx),
        }
    }
}

impl Handler<RoomUpdate> for Connection {
    type Result = ();

    fn handle(&mut self, update: RoomUpdate, ctx: &mut Self::Context) {
        self.on_update(update, ctx);
        // Only now, with what it wrote queued: rooms may write to the socket directly again.
        self.link.handled();
    }
}

impl Connection {
    /// A room's update, taken off the mailbox.
    fn on_update(&mut self, update: RoomUpdate, ctx: &mut Context<Self>) {
        // What a room reserved for this window leaves the backlog whatever happens next.
        if let RoomUpdate::Events { window, .. } = &update {
            self.settings.metrics.outbox_seen(self.link.backlog().held());
            self.link.backlog().release(window.frame.len());
        }
        if let RoomUpdate::Presence { frame, .. } = &update {
            self.link.backlog().release(frame.frame.len());
        }
        if self.closing {
            return;
        }
        match update {
            RoomUpdate::Subscribed { room, epoch, head, recovered, replay, reference, generation, state } => {
                let state_seq = state.as_ref().map(|state| state.as_ref().map_or(0, |s| s.seq));
                let answer = Answer { room: &room, generation, epoch: &epoch, head, recovered, state_seq, replay: &replay };
                let Some(answered) = self.link.machine().on_subscribed(answer) else { return };
                if let Some(recovered) = recovered {
                    self.settings.metrics.recovery(recovered);
                }
                if answered.announce {
                    let frame = match &state {
                        Some(state) => {
                            let state = state.as_ref().map(|s| (s.seq, &*s.data));
                            protocol::subscribed_state_frame(&room, &epoch, head, recovered, reference, state)
                        }
                        None => protocol::subscribed_frame(&room, &epoch, head, recovered, reference),
                    };
                    self.io.text(ServerOp::Subscribed, &frame);
                }
                if !answered.fresh.is_empty() {
                    self.write_events(&epoch, answered.fresh);
                }
            }
            RoomUpdate::Events { room, window } => self.on_window(&room, &window),
            RoomUpdate::Presence { room, frame } => {
                if self.link.machine().is_live(&room) {
                    self.io.presence(&frame);
                }
            }
            RoomUpdate::SlowConsumer => self.evict_slow(ctx),
            RoomUpdate::Moved { room, to } => {
                self.close(ctx, CloseCode::ServiceRestart, &format!("room {room} moved to cell {to}: reconnect and resume"));
            }
            RoomUpdate::Refused { room, reference, message, generation } => self.refused(&room, generation, reference, &message),
        }
        // A replay, or a frame this connection rendered itself, may have taken it over.
        self.check_outbox(ctx);
    }
}

impl Handler<CloseConnection> for Connection {
    type Result = ();

    fn handle(&mut self, msg: CloseConnection, ctx: &mut Self::Context) {
        // A kicked session must not come back with any credential handed out so far; a
        // replaced connection not with its own (nor older ones), while the connection that
        // replaced it, holding a newer one, keeps it.
        let revoke_upto = match msg.code {
            CloseCode::Kicked => Some(crate::world::now_ms()),
            CloseCode::Replaced => self.identity.resume.as_ref().map(|grant| grant.issued_at_ms),
            _ => None,
        };
        if let Some(upto) = revoke_upto {
            self.settings.revocations.revoke(&self.identity.session, upto);
        }
        self.close_with(ctx, msg.code, &msg.reason, msg.force);
    }
}
