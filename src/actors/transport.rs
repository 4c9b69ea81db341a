//! What a connection's actor writes to, whichever way the client is connected: a
//! WebSocket ([`WsIo`]) or a Server-Sent Events stream ([`SseIo`]). The connection's
//! logic (subscriptions, windows, recovery, registry, kicks, drain, the outbox bound,
//! limits, metrics, resume revocation) is one code path over this; only the framing and
//! what the client can send differ. Over SSE the client sends nothing: there are no
//! reads, so no heartbeat timeout, and a client gone shows up as the body ending.
//!
//! The WebSocket arms are exactly the calls the connection made on `WsIo` before: a room
//! window's shared frame is queued as it is, with nothing added per delivery.

use actix_http::ws::{self, CloseReason};

use super::messages::{PresenceFrame, Window};
use super::sse::SseIo;
use super::wsio::WsIo;
use crate::protocol::{self, ServerOp};

pub enum Transport {
    Ws(WsIo),
    Sse(SseIo),
}

impl Transport {
    /// The metrics label of this transport (`livegate_connections_by_transport`).
    pub fn name(&self) -> &'static str {
        match self {
            Transport::Ws(_) => "websocket",
            Transport::Sse(_) => "sse",
        }
    }

    /// Whether the client sends anything (a WebSocket): only then does silence mean
    /// it is gone (the heartbeat timeout).
    pub fn reads(&self) -> bool {
        matches!(self, Transport::Ws(_))
    }

    /// A server frame (`op` names it: the SSE event's name).
    pub fn text(&mut self, op: ServerOp, frame: &str) {
        match self {
            Transport::Ws(io) => io.text(frame),
            Transport::Sse(io) => io.message(op.as_str(), frame),
        }
    }

    /// A room window's `events`, rendered once for every subscriber: the WebSocket frame
    /// as it is; over SSE the same JSON after `cursor()`, the connection's cursor after it.
    pub fn window(&mut self, window: &Window, cursor: impl FnOnce() -> String) {
        match self {
            Transport::Ws(io) => io.frame(window.frame.clone()),
            Transport::Sse(io) => io.events(&cursor(), window.sse_data()),
        }
    }

    /// A room's presence frame, rendered once for its subscribers: the WebSocket frame
    /// as it is, or `event: presence` with the same JSON.
    pub fn presence(&mut self, frame: &PresenceFrame) {
        match self {
            Transport::Ws(io) => io.frame(frame.frame.clone()),
            Transport::Sse(io) => io.message(ServerOp::Presence.as_str(), &frame.json),
        }
    }

    /// The heartbeat: a WebSocket Ping, or an SSE `: ping` comment.
    pub fn heartbeat(&mut self) {
        match self {
            Transport::Ws(io) => io.ping(b""),
            Transport::Sse(io) => io.ping(),
        }
    }

    /// Answer a client's Ping (WebSocket only: SSE clients send nothing).
    pub fn pong(&mut self, payload: &[u8]) {
        if let Transport::Ws(io) = self {
            io.pong(payload);
        }
    }

    /// The server closes: a Close frame, or `event: close` with `{"code","reason"}`
    /// after which the SSE stream ends.
    pub fn close(&mut self, code: u16, reason: &str) {
        match self {
            Transport::Ws(io) => io.close(Some(CloseReason {
                code: ws::CloseCode::from(code),
                description: Some(reason.to_string()),
            })),
            Transport::Sse(io) => io.close(&protocol::close_event(code, reason)),
        }
    }

    /// Answer the client's Close with the same reason (WebSocket only).
    pub fn echo_close(&mut self, reason: Option<CloseReason>) {
        if let Transport::Ws(io) = self {
            io.close(reason);
        }
    }

    /// Count what the transport queues in `backlog` too (the connection's one bound).
    pub fn count_into(&mut self, backlog: std::sync::Arc<crate::core::delivery::backlog::Backlog>) {
        match self {
            Transport::Ws(io) => io.count_into(backlog),
            Transport::Sse(io) => io.count_into(backlog),
        }
    }

    /// The write side rooms may write windows to from their own threads: a WebSocket on
    /// plain TCP (TLS and SSE frames go through the connection's mailbox).
    pub fn outgoing(&self) -> Option<std::sync::Arc<super::wsio::Outgoing>> {
        match self {
            Transport::Ws(io) => Some(io.outgoing()).filter(|out| out.direct()),
            Transport::Sse(_) => None,
        }
    }

    /// Have a WebSocket look again whether it may read (its actor's task is woken); an
    /// SSE client sends nothing.
    pub fn wake_reader(&self) {
        if let Transport::Ws(io) = self {
            io.wake();
        }
    }

    /// Drop what the client has not started to read (a slow consumer's backlog).
    pub fn discard_unsent(&mut self) {
        match self {
            Transport::Ws(io) => io.discard_unsent(),
            Transport::Sse(io) => io.discard_unsent(),
        }
    }

    /// The actor stopped: write what is queued (bounded by `within` on a WebSocket) and end.
    pub fn finish(&mut self, within: std::time::Duration) {
        match self {
            Transport::Ws(io) => io.finish(within),
            Transport::Sse(io) => io.finish(),
        }
    }
}
