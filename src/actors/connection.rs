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

use super::link::{ConnectionLink, Machine};
use super::messages::*;
use super::publish::{Publisher, Submission};
use super::registry::Registry;
use super::room::RoomActor;
use super::rooms::Rooms;
use super::socket::{ends_closing, Fault, Inbound, MessageReader, CLOSE_HANDSHAKE_TIMEOUT, FINISH_WITHIN};
use super::transport::Transport;
use super::wsio::{self, ReadError, WsActor, WsIo};
use crate::core::backlog::Backlog;
use crate::core::connection::{self as machine, Action, Ask, Ending, Grants, Pending, Refusal};
use crate::core::subscriptions::Answer;
use crate::protocol::{self, ClientOp, CloseCode, ErrorCode, ServerOp};

pub use crate::core::connection::HISTORY_DEFAULT_LIMIT;

/// What every connection shares.
/// Where a kicked or replaced connection voids its session's resume credentials:
/// the embedded store, or NATS in cluster mode. Defined here, implemented by the wiring.
pub trait ResumeRevocations: Send + Sync {
    /// Credentials of `session` issued at or before `upto_ms` stop working.
    fn revoke(&self, session: &str, upto_ms: u64);
}


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

/// A resume credential handed to a connection.
#[derive(Clone)]
pub struct ResumeGrant {
    pub credential: String,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
}

/// Never prints the credential: it opens a connection as its user.
impl std::fmt::Debug for ResumeGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeGrant").field("issued_at_ms", &self.issued_at_ms).field("expires_at_ms", &self.expires_at_ms).finish_non_exhaustive()
    }
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
    /// The connection's machine (`core::connection`), shared with the rooms that write
    /// its windows from their threads, and its backlog.
    link: Arc<ConnectionLink>,
    /// The machine's clock starts here.
    born: Instant,
    reader: MessageReader,
    /// Held while the connection lives: its place in the connection limits.
    _permit: Option<Box<dyn Send>>,
    io: Transport,
    /// Subscribed once the connection has started (after `welcome`).
    initial: Vec<InitialSubscription>,
    /// The close code that ended (or is ending) the connection, for the metrics.
    close_code: Option<u16>,
}

/// Milliseconds on the machine's clock.
fn ms_since(born: Instant) -> u64 {
    born.elapsed().as_millis() as u64
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
        let limits = machine::Settings {
            max_subscriptions: settings.max_subscriptions,
            max_outbox_bytes: settings.max_outbox_bytes,
            max_messages_per_sec: settings.max_messages_per_sec,
            max_bad_messages: settings.max_bad_messages,
            max_room_starts_per_sec: settings.max_room_starts_per_sec,
            max_history_limit: settings.max_history_limit,
            heartbeat_ms: settings.heartbeat.as_millis() as u64,
            subscribe_timeout_ms: settings.subscribe_timeout.map(|t| t.as_millis() as u64),
            close_handshake_ms: CLOSE_HANDSHAKE_TIMEOUT.as_millis() as u64,
            reads: io.reads(),
            direct: io.outgoing().is_some(),
        };
        let grants = Grants {
            user: identity.user.clone(),
            device: identity.device.clone(),
            rooms: identity.rooms.clone(),
            publish: identity.publish.clone(),
        };
        let machine = Machine::new(grants, limits, 0);
        let link = ConnectionLink::new(machine, backlog, io.outgoing(), to, settings.metrics.clone());
        let reader = MessageReader::new(settings.max_message_bytes);
        let link = Arc::new(link);
        let born = Instant::now();
        Connection { id, identity, settings, rooms, registry, link, born, reader, _permit: None, io, initial: Vec::new(), close_code: None }
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

    fn now(&self) -> u64 {
        ms_since(self.born)
    }

    fn held(&self) -> usize {
        self.link.backlog().held()
    }

    /// One step of the machine (under its lock, which rooms writing from their threads
    /// wait on), then what it asked for, carried out in order.
    fn step<T>(&mut self, ctx: &mut Context<Self>, input: impl FnOnce(&mut Machine) -> T) -> T {
        let (out, actions) = {
            let mut machine = self.link.machine();
            let out = input(&mut machine);
            (out, std::iter::from_fn(|| machine.poll()).collect::<Vec<_>>())
        };
        for action in actions {
            self.act(action, ctx);
        }
        out
    }

    fn act(&mut self, action: Action<Addr<RoomActor>>, ctx: &mut Context<Self>) {
        let metrics = self.settings.metrics.clone();
        match action {
            Action::Error { reference, room, refusal, message } => {
                self.send_error(reference, room.as_deref(), error_code(refusal), &message)
            }
            Action::LimitHit(limit) => metrics.limit_hit(limit),
            Action::PublishOutcome(outcome) => metrics.client_publish(outcome),
            Action::Subscribe { generation, ask } => self.ask_room(generation, ask, ctx),
            Action::SubscribeInbox { room, generation } => self.park_inbox(room, generation, ctx),
            Action::Leave { generation, at: Some(addr), .. } => addr.do_send(Unsubscribe { conn: self.id, generation }),
            Action::Leave { room, generation, at: None } => self.rooms.release(&room, self.id, generation),
            Action::Subscriptions(delta) => {
                metrics.subscriptions.inc_by(delta);
            }
            Action::Unsubscribed { room, reference } => {
                self.io.text(ServerOp::Unsubscribed, &protocol::unsubscribed_frame(&room, reference))
            }
            Action::ReadHistory { room, since, limit, reference } => {
                let rooms = self.rooms.clone();
                let fut = async move { (rooms.history(&room, since, limit).await, room) };
                ctx.spawn(fut.into_actor(self).map(move |(result, room), conn, ctx| {
                    match result {
                        Ok(page) => conn.reply_history(&room, &page, reference),
                        Err(e) => conn.send_error(reference, Some(&room), ErrorCode::Unavailable, &e.to_string()),
                    }
                    conn.answered(Pending::Read, ctx);
                }));
            }
            Action::ReadPresence { room, reference } => {
                let rooms = self.rooms.clone();
                let fut = async move { (rooms.presence(&room).await, room) };
                ctx.spawn(fut.into_actor(self).map(move |(result, room), conn, ctx| {
                    let (reply, presence_off) = (ServerOp::Presence, ErrorCode::PresenceOff);
                    match result {
                        Ok(Ok(view)) => conn.reply(reply, protocol::presence_reply_frame(&room, &view, reference)),
                        Ok(Err(off)) => conn.send_error(reference, Some(&room), presence_off, &off.to_string()),
                        Err(e) => conn.send_error(reference, Some(&room), ErrorCode::Unavailable, &e.to_string()),
                    }
                    conn.answered(Pending::Read, ctx);
                }));
            }
            Action::Publish { room, id, data, state, reference } => self.publish(room, id, data, state, reference, ctx),
            Action::Ping => self.io.heartbeat(),
            Action::Evict { held } => {
                if let Some(held) = held {
                    let user = &self.identity.user;
                    tracing::info!(conn = self.id, %user, held, "slow consumer: over the outbox bound for the grace");
                }
                // Counted by whoever evicts first: a room (which saw the backlog) or this actor.
                if self.link.backlog().evict() {
                    metrics.slow_consumer_closes.inc();
                }
                // What it has not started to read is dropped, so the Close goes out next.
                self.io.discard_unsent();
            }
            Action::Close(ending) => {
                let (code, reason) = close_frame(ending);
                let (user, transport) = (&self.identity.user, self.io.name());
                tracing::debug!(conn = self.id, %user, transport, code, reason, "closing connection");
                self.io.close(code, &reason);
                self.close_code = Some(code);
            }
            Action::Arm { timer, after_ms } => {
                ctx.run_later(Duration::from_millis(after_ms), move |conn, ctx| {
                    let (held, now) = (conn.held(), conn.now());
                    conn.step(ctx, |m| m.on_timer(timer, held, now));
                });
            }
            Action::WakeReader => self.io.wake_reader(),
            Action::Stop => ctx.stop(),
        }
    }

    /// Write a reply frame, unless our Close already went out (nothing may follow it).
    fn reply(&mut self, op: ServerOp, frame: String) {
        if !self.link.machine().is_closing() {
            self.io.text(op, &frame);
        }
    }

    /// An `error` frame; `room`: the room the refused request named, if it named one.
    fn send_error(&mut self, reference: Option<i64>, room: Option<&str>, code: ErrorCode, message: &str) {
        self.reply(ServerOp::Error, protocol::error_frame(reference, room, code, message));
    }

    /// A read or publish was answered (on one of the actor's futures, which may run after
    /// the reader decided not to read).
    fn answered(&mut self, pending: Pending, ctx: &mut Context<Self>) {
        let (held, born) = (self.held(), self.born);
        self.step(ctx, |m| m.answered(pending, held, || ms_since(born)));
    }

    fn close(&mut self, ctx: &mut Context<Self>, code: CloseCode, reason: &str, force: bool) {
        let ending = Ending::Asked { code: code.code(), reason: reason.to_string() };
        self.step(ctx, |m| m.close(ending, force));
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
        self.io.window(window, || crate::core::sse::render_cursor(link.machine().subscriptions().positions()));
    }

    /// A history page, cut to what fits under the outbox bound (at least one event; then
    /// `complete` is false and the client reads on after the last seq it got).
    fn reply_history(&mut self, room: &str, page: &HistoryPage, reference: Option<i64>) {
        let device = &self.identity.device;
        let events: Vec<&str> = page.events.iter().filter(|e| e.is_for(device)).map(|e| &*e.json).collect();
        let epoch = page.epoch.as_deref();
        let overhead = protocol::history_frame(room, epoch, page.head, std::iter::empty(), false, reference).len();
        let held = self.held();
        let fits = self.link.machine().page_fits(held, overhead, events.iter().map(|e| e.len()));
        let complete = page.complete && fits == events.len();
        let frame = protocol::history_frame(room, epoch, page.head, events[..fits].iter().copied(), complete, reference);
        self.reply(ServerOp::History, frame)
    }

    fn handle_text(&mut self, text: &str, ctx: &mut Context<Self>) {
        let now = self.now();
        let request = match protocol::parse_client_frame(text) {
            Ok(request) => request,
            Err(e) => {
                self.send_error(e.reference, e.room.as_deref(), e.code, &e.message);
                return self.step(ctx, |m| m.strike(now));
            }
        };
        let (reference, publish) = (request.reference, matches!(request.op, ClientOp::Publish { .. }));
        if !self.step(ctx, |m| m.admit(publish, reference, request.op.room(), now)) {
            return;
        }
        match request.op {
            ClientOp::Ping => self.io.text(ServerOp::Pong, &protocol::pong_frame(reference)),
            ClientOp::Publish { room, id, data, state } => self.step(ctx, |m| m.publish(room, id, data, state, reference)),
            ClientOp::Subscribe { room, since, epoch, state, presence } => {
                let live = self.rooms.is_live(&room);
                let ask = Ask { room, since, epoch, state, presence, reference };
                self.step(ctx, |m| m.subscribe(ask, live, now))
            }
            ClientOp::Presence { room } => self.step(ctx, |m| m.presence(room, reference)),
            ClientOp::Unsubscribe { room } => self.step(ctx, |m| m.unsubscribe(room, reference)),
            ClientOp::History { room, since, limit } => {
                let live = self.rooms.is_live(&room);
                self.step(ctx, |m| m.history(room, since, limit, reference, live, now))
            }
        }
    }

    /// A client's publish the machine let through: submitted through `Publisher::submit`,
    /// the HTTP API's path and checks; `published` goes out once the event is durable. The
    /// event's `from` is this connection's user, whatever the client sent.
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
            match done {
                Some((room, Ok(published))) => {
                    metrics.publish_answered(published.duplicate);
                    metrics.client_publish(if published.duplicate { "duplicate" } else { "published" });
                    let frame = protocol::published_frame(&room, published.seq, published.duplicate, reference);
                    conn.reply(ServerOp::Published, frame);
                }
                Some((room, Err(error))) => {
                    let code = error.code();
                    metrics.client_publish(code.as_str());
                    tracing::debug!(conn = conn.id, %room, %error, "client publish refused");
                    conn.send_error(reference, Some(&room), code, &error.to_string());
                }
                None => {}
            }
            conn.answered(Pending::Publish, ctx);
        }));
    }

    /// Ask the room for generation `generation` of a subscribe the machine began.
    fn ask_room(&mut self, generation: u64, ask: Ask, ctx: &mut Context<Self>) {
        let Ask { room, since, epoch, state, presence, reference } = ask;
        let (rooms, conn, to) = (self.rooms.clone(), self.id, self.link.clone());
        let member = crate::core::presence::Member { user: self.identity.user.clone(), device: self.identity.device.clone() };
        let subscribe =
            Subscribe { conn, to, since, epoch, reference, generation, automatic: false, state, member: Some(member), presence };
        let name = room.clone();
        let fut = async move { rooms.subscribe(&name, subscribe).await };
        ctx.spawn(fut.into_actor(self).map(move |result, conn, ctx| match result {
            Ok(addr) => conn.step(ctx, |m| m.attached(&room, generation, addr)),
            Err(e) => conn.step(ctx, |m| m.refused(&room, generation, reference, e.to_string())),
        }));
    }

    /// The automatic inbox subscription: announced now, parked in the rooms table while
    /// the inbox has no actor (nothing is read until a message comes or the client asks).
    fn park_inbox(&mut self, room: Arc<str>, generation: u64, ctx: &mut Context<Self>) {
        self.io.text(ServerOp::Subscribed, &protocol::inbox_notice_frame(&room));
        let parked = Parked { conn: self.id, to: self.link.clone(), generation };
        let rooms = self.rooms.clone();
        let fut = async move { rooms.subscribe_inbox(&room, parked).await.map(|addr| (room, addr)) };
        ctx.spawn(fut.into_actor(self).map(move |result, conn, ctx| match result {
            Ok((room, Some(addr))) => conn.step(ctx, |m| m.attached(&room, generation, addr)),
            Ok((_, None)) => {}
            Err(error) => tracing::warn!(conn = conn.id, %error, "automatic inbox subscription failed"),
        }));
    }

    fn on_inbound(&mut self, inbound: Inbound, ctx: &mut Context<Self>) {
        match inbound {
            Inbound::Text(text) => self.handle_text(&text, ctx),
            Inbound::Binary(_) => {
                let message = "binary frames are not part of the protocol; send JSON text";
                self.send_error(None, None, ErrorCode::BadRequest, message);
                let now = self.now();
                self.step(ctx, |m| m.strike(now));
            }
            Inbound::Ping(payload) => self.io.pong(&payload),
            Inbound::Nothing => {}
            Inbound::Close(reason) => {
                tracing::debug!(conn = self.id, ?reason, "client closed");
                self.close_code = Some(reason.as_ref().map_or(1005, |r| u16::from(r.code)));
                self.link.machine().client_closed();
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
            Some(code) => self.close(ctx, code, fault.reason(), fault.fails_connection()),
            None => {
                // Keep a close code already known; otherwise this is an abnormal end (1006).
                self.close_code.get_or_insert(1006);
                ctx.stop();
            }
        }
    }

    /// An SSE stream's body ended: the client is gone (or took our close): stop.
    fn on_stream_end(&mut self, ctx: &mut Context<Self>) {
        if !self.link.machine().is_closing() {
            tracing::debug!(conn = self.id, user = %self.identity.user, "SSE client went away");
        }
        self.close_code.get_or_insert(1006);
        ctx.stop();
    }

    /// A room's update, taken off the mailbox.
    fn on_update(&mut self, update: RoomUpdate, ctx: &mut Context<Self>) {
        // What a room reserved for this window leaves the backlog whatever happens next.
        if let RoomUpdate::Events { window, .. } = &update {
            self.settings.metrics.outbox_seen(self.held());
            self.link.backlog().release(window.frame.len());
        }
        if let RoomUpdate::Presence { frame, .. } = &update {
            self.link.backlog().release(frame.frame.len());
        }
        if self.link.machine().is_closing() {
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
            RoomUpdate::Events { room, window } => {
                let plan = self.link.machine().on_window(&room, &window.epoch, &window.events, window.targeted);
                window.frames_for(plan, |frame| self.write_window(frame));
            }
            RoomUpdate::Presence { room, frame } => {
                if self.link.machine().is_live(&room) {
                    self.io.presence(&frame);
                }
            }
            RoomUpdate::SlowConsumer => self.step(ctx, |m| m.slow_consumer()),
            RoomUpdate::Moved { room, to } => {
                let reason = format!("room {room} moved to cell {to}: reconnect and resume");
                self.close(ctx, CloseCode::ServiceRestart, &reason, false);
            }
            RoomUpdate::Refused { room, reference, message, generation } => {
                self.step(ctx, |m| m.refused(&room, generation, reference, message))
            }
        }
        // A replay, or a frame this connection rendered itself, may have taken it over.
        let (held, born) = (self.held(), self.born);
        self.step(ctx, |m| m.wrote(held, || ms_since(born)));
    }
}

/// The wire's error code for a refusal.
fn error_code(refusal: Refusal) -> ErrorCode {
    match refusal {
        Refusal::BadRequest => ErrorCode::BadRequest,
        Refusal::BadRoom => ErrorCode::BadRoom,
        Refusal::Forbidden => ErrorCode::Forbidden,
        Refusal::TooManySubscriptions => ErrorCode::TooManySubscriptions,
        Refusal::RateLimited => ErrorCode::RateLimited,
        Refusal::Unavailable => ErrorCode::Unavailable,
    }
}

/// The wire's close code and reason for an ending.
fn close_frame(ending: Ending) -> (u16, String) {
    let (code, reason) = match ending {
        Ending::SlowConsumer => (CloseCode::SlowConsumer, "slow consumer: too many bytes queued"),
        Ending::TooManyRefused => (CloseCode::Policy, "too many refused messages"),
        Ending::NoSubscribe => (CloseCode::Policy, "no subscribe in time"),
        Ending::HeartbeatTimeout => (CloseCode::HeartbeatTimeout, "heartbeat timeout"),
        Ending::Asked { code, reason } => return (code, reason),
    };
    (code.code(), reason.to_string())
}

impl Actor for Connection {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        match &self.io {
            Transport::Ws(_) => wsio::drive(ctx),
            Transport::Sse(io) => {
                ctx.spawn(io.ended().into_actor(self).map(|(), conn, ctx| conn.on_stream_end(ctx)));
            }
        }
        let heartbeat_ms = self.settings.heartbeat.as_millis() as u64;
        let resume = self.identity.resume.as_ref().map(|grant| (grant.credential.as_str(), grant.expires_at_ms));
        let (session, node, warmup) = (&self.identity.session, &self.settings.node, self.identity.warmup);
        self.io.text(ServerOp::Welcome, &protocol::welcome_frame(session, node, heartbeat_ms, warmup, resume));
        let initial: Vec<(Ask, bool)> = std::mem::take(&mut self.initial)
            .into_iter()
            .map(|i| {
                let live = self.rooms.is_live(&i.room);
                let (since, epoch, state, presence) = (i.since, i.epoch, i.state, i.presence);
                (Ask { room: i.room, since, epoch, state, presence, reference: None }, live)
            })
            .collect();
        let now = self.now();
        self.step(ctx, |m| m.start(initial, now));
        self.registry.do_send(Register {
            conn: self.id,
            user: self.identity.user.clone(),
            device: self.identity.device.clone(),
            to: ctx.address().recipient(),
            credential: self.identity.credential,
        });
        ctx.run_interval(self.settings.heartbeat, |conn, ctx| {
            let (held, now) = (conn.held(), conn.now());
            conn.step(ctx, |m| m.heartbeat(held, now));
        });
        let metrics = &self.settings.metrics;
        metrics.connections_open.get_or_create(&metrics.device(&self.identity.device)).inc();
        let transport = crate::metrics::TransportLabel { transport: self.io.name() };
        metrics.connections_by_transport.get_or_create(&transport).inc();
        metrics.connects.inc();
        let (user, device) = (&self.identity.user, &self.identity.device);
        tracing::debug!(conn = self.id, %user, %device, transport = self.io.name(), "connected");
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.io.finish(FINISH_WITHIN);
        self.step(ctx, |m| m.stopped());
        // The gauge first: a kick answers on Unregister and must find it already down.
        let metrics = &self.settings.metrics;
        metrics.connections_open.get_or_create(&metrics.device(&self.identity.device)).dec();
        let transport = crate::metrics::TransportLabel { transport: self.io.name() };
        metrics.connections_by_transport.get_or_create(&transport).dec();
        self.registry.do_send(Unregister { conn: self.id });
        // No close code at all means the socket just ended.
        let code = self.close_code.unwrap_or(1006);
        metrics.disconnects.get_or_create(&crate::metrics::Metrics::close_code(code)).inc();
        tracing::debug!(conn = self.id, user = %self.identity.user, code, "disconnected");
    }
}

impl WsActor for Connection {
    fn io(&mut self) -> Option<&mut WsIo> {
        match &mut self.io {
            Transport::Ws(io) => Some(io),
            Transport::Sse(_) => None,
        }
    }

    /// As the machine says: not over the outbox bound nor with too many answers pending.
    fn may_read(&mut self, ctx: &mut Self::Context) -> bool {
        let (held, born) = (self.held(), self.born);
        self.step(ctx, |m| m.may_read(held, || ms_since(born)))
    }

    fn on_read(&mut self, item: Result<ws::Message, ReadError>, ctx: &mut Self::Context) {
        let now = self.now();
        let closing = {
            let mut machine = self.link.machine();
            machine.heard(now);
            machine.is_closing()
        };
        let read = self.reader.read(item);
        if closing {
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
        self.close(ctx, msg.code, &msg.reason, msg.force);
    }
}
