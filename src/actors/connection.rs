//! One actor per client connection, the driver of its machine (`core::delivery::connection`, which
//! decides subscriptions, limits, strikes, the outbox bound and its grace, pending
//! answers, heartbeat and close): the actor keeps the socket, feeds the machine what
//! happened with the time, and carries out its actions ([`Connection::step`]).
//! Rooms batch their events into windows and render each window's frame
//! once; a connection writes that shared frame as it is, and renders its own only where
//! it must filter (a replay overlapping what it sent, device-targeted inbox messages).
//! On a plain-TCP WebSocket the room's thread does that write itself whenever nothing
//! the rooms posted waits in the mailbox ([`super::link`]); the decision is the same
//! machine's either way.
//!
//! - [`client`]: what the client sends; [`rooms`]: what rooms send and are asked;
//!   [`requests`]: history, presence and publish; [`lifecycle`]: start and stop;
//!   [`settings`]: what a connection is given.
//!
//! The client is on a WebSocket (livegate's own transport, [`wsio`], driven inside this
//! actor) or a Server-Sent Events stream ([`super::sse`]); [`Transport`] is the one place
//! they differ, so everything else here is the same code for both.
//!
//! Every byte held for the connection is counted in its [`Backlog`] against
//! `max_outbox_bytes` (`core::delivery::outbox`): over it the socket is not read, and after the
//! grace the connection is closed with 4009.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_http::ws;

use super::link::{ConnectionLink, Machine};
use super::messages::*;
use super::publish::Submission;
use super::rooms::{RoomAddr, Rooms};
use super::socket::{
    ends_closing, Fault, Inbound, MessageReader, CLOSE_HANDSHAKE_TIMEOUT, FINISH_WITHIN,
};
use super::transport::Transport;
use super::wsio::{self, ReadError, WsActor, WsIo};
use crate::core::delivery::backlog::Backlog;
use crate::core::delivery::connection::{
    self as machine, Action, Ask, Ending, Grants, Pending, Refusal,
};
use crate::core::delivery::subscriptions::Answer;
use crate::protocol::{self, ClientOp, CloseCode, ErrorCode, ServerOp};

mod client;
mod lifecycle;
mod requests;
mod rooms;
mod settings;

pub use crate::core::delivery::connection::HISTORY_DEFAULT_LIMIT;
pub use settings::{ConnectionSettings, Identity, InitialSubscription};

pub struct Connection {
    id: ConnId,
    identity: Identity,
    settings: Arc<ConnectionSettings>,
    rooms: Rooms,
    /// The connection's machine (`core::delivery::connection`), shared with the rooms that write
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
        mut identity: Identity,
        settings: Arc<ConnectionSettings>,
        rooms: Rooms,
        mut io: Transport,
        to: Recipient<RoomUpdate>,
    ) -> Self {
        let backlog = Arc::new(Backlog::new(settings.max_outbox_bytes));
        io.count_into(backlog.clone());
        let (reads, direct) = (io.reads(), io.outgoing().is_some());
        let limits = settings.limits.get(reads, direct, || machine::Settings {
            max_subscriptions: settings.max_subscriptions,
            max_outbox_bytes: settings.max_outbox_bytes,
            max_messages_per_sec: settings.max_messages_per_sec,
            max_bad_messages: settings.max_bad_messages,
            max_room_starts_per_sec: settings.max_room_starts_per_sec,
            max_history_limit: settings.max_history_limit,
            heartbeat_ms: settings.heartbeat.as_millis() as u64,
            subscribe_timeout_ms: settings.subscribe_timeout.map(|t| t.as_millis() as u64),
            close_handshake_ms: CLOSE_HANDSHAKE_TIMEOUT.as_millis() as u64,
            reads,
            direct,
        });
        let grants = Grants {
            user: identity.user.clone(),
            device: identity.device.clone(),
            // The machine checks them; nothing else reads them again.
            rooms: std::mem::take(&mut identity.rooms),
            publish: std::mem::take(&mut identity.publish),
        };
        let machine = Machine::new(grants, limits, 0);
        let link =
            ConnectionLink::new(machine, backlog, io.outgoing(), to, settings.metrics.clone());
        let reader = MessageReader::new(settings.max_message_bytes);
        let link = Arc::new(link);
        let born = Instant::now();
        Connection {
            id,
            identity,
            settings,
            rooms,
            link,
            born,
            reader,
            _permit: None,
            io,
            initial: Vec::new(),
            close_code: None,
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
            (out, machine.take_actions())
        };
        for action in actions {
            self.act(action, ctx);
        }
        out
    }

    fn act(&mut self, action: Action<RoomAddr>, ctx: &mut Context<Self>) {
        let metrics = self.settings.metrics.clone();
        match action {
            Action::Error { reference, room, refusal, message } => {
                self.send_error(reference, room.as_deref(), error_code(refusal), &message)
            }
            Action::LimitHit(limit) => metrics.limit_hit(limit),
            Action::PublishOutcome(outcome) => metrics.client_publish(outcome),
            Action::Subscribe { generation, ask } => self.ask_room(generation, ask, ctx),
            Action::SubscribeInbox { room, generation } => self.park_inbox(room, generation, ctx),
            Action::Leave { generation, at: Some(addr), .. } => {
                addr.do_send(Unsubscribe { conn: self.id, generation })
            }
            Action::Leave { room, generation, at: None } => {
                self.rooms.release(&room, self.id, generation)
            }
            Action::Subscriptions(delta) => {
                metrics.subscriptions.inc_by(delta);
            }
            Action::Unsubscribed { room, reference } => self
                .io
                .text(ServerOp::Unsubscribed, &protocol::unsubscribed_frame(&room, reference)),
            Action::ReadHistory { room, since, limit, reference } => {
                self.read_history(room, since, limit, reference, ctx)
            }
            Action::ReadPresence { room, reference } => self.read_presence(room, reference, ctx),
            Action::Publish { room, id, data, state, reference } => {
                self.publish(room, id, data, state, reference, ctx)
            }
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
    fn send_error(
        &mut self,
        reference: Option<i64>,
        room: Option<&str>,
        code: ErrorCode,
        message: &str,
    ) {
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
