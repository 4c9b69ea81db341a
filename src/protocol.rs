//! The JSON wire format, and the only module that knows it: client frames parsed into
//! typed requests, server frames as types that the server renders and the terminal client
//! (`client::subscriber`) reads back, HTTP request and reply bodies.
//! An event is rendered once, when it is published, and the rendered text is shared by
//! every subscriber's outbox and by history replies.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::core::presence::{Diff, Member, View};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Event `data` as the JSON text that was sent, validated but not re-encoded.
pub type EventData = RawValue;

/// The WebSocket close codes livegate sends, with what each means to a client: 4000–4499
/// ask it to reconnect, 4500–4999 not to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseCode {
    Normal,
    GoingAway,
    ProtocolError,
    Unsupported,
    InvalidPayload,
    Policy,
    TooBig,
    ServerError,
    ServiceRestart,
    HeartbeatTimeout,
    SlowConsumer,
    MigrationBudget,
    /// The session is served by another node: reconnect to the URL in the reason.
    WrongNode,
    Replaced,
    Kicked,
    TokenInvalid,
}

impl CloseCode {
    pub const ALL: [CloseCode; 16] = [
        CloseCode::Normal,
        CloseCode::GoingAway,
        CloseCode::ProtocolError,
        CloseCode::Unsupported,
        CloseCode::InvalidPayload,
        CloseCode::Policy,
        CloseCode::TooBig,
        CloseCode::ServerError,
        CloseCode::ServiceRestart,
        CloseCode::HeartbeatTimeout,
        CloseCode::SlowConsumer,
        CloseCode::MigrationBudget,
        CloseCode::WrongNode,
        CloseCode::Replaced,
        CloseCode::Kicked,
        CloseCode::TokenInvalid,
    ];

    pub const fn code(self) -> u16 {
        match self {
            CloseCode::Normal => 1000,
            CloseCode::GoingAway => 1001,
            CloseCode::ProtocolError => 1002,
            CloseCode::Unsupported => 1003,
            CloseCode::InvalidPayload => 1007,
            CloseCode::Policy => 1008,
            CloseCode::TooBig => 1009,
            CloseCode::ServerError => 1011,
            CloseCode::ServiceRestart => 1012,
            CloseCode::HeartbeatTimeout => 4008,
            CloseCode::SlowConsumer => 4009,
            CloseCode::MigrationBudget => 4029,
            CloseCode::WrongNode => 4421,
            CloseCode::Replaced => 4501,
            CloseCode::Kicked => 4502,
            CloseCode::TokenInvalid => 4503,
        }
    }

    pub fn from_code(code: u16) -> Option<CloseCode> {
        CloseCode::ALL.into_iter().find(|c| c.code() == code)
    }

    pub const fn meaning(self) -> &'static str {
        match self {
            CloseCode::Normal => "normal close",
            CloseCode::GoingAway => "server stopping",
            CloseCode::ProtocolError => "WebSocket protocol error",
            CloseCode::Unsupported => "unsupported message",
            CloseCode::InvalidPayload => "text is not valid UTF-8",
            CloseCode::Policy => "protocol violation",
            CloseCode::TooBig => "frame too big",
            CloseCode::ServerError => "server error",
            CloseCode::ServiceRestart => "server restarting",
            CloseCode::HeartbeatTimeout => "heartbeat timeout",
            CloseCode::SlowConsumer => "too slow reading events",
            CloseCode::MigrationBudget => "migration budget spent",
            CloseCode::WrongNode => "served by another node: reconnect to the URL in the reason",
            CloseCode::Replaced => "replaced by a newer connection of the same user and device",
            CloseCode::Kicked => "kicked by an operator",
            CloseCode::TokenInvalid => "token no longer valid",
        }
    }
}

/// What a close code received means, livegate's own or any other.
pub fn close_meaning(code: u16) -> &'static str {
    match CloseCode::from_code(code) {
        Some(known) => known.meaning(),
        None => match code {
            4000..=4499 => "reconnect",
            4500..=4999 => "do not reconnect",
            _ => "unknown code",
        },
    }
}

/// Error codes sent in `error` frames and HTTP error bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadRequest,
    UnknownOp,
    BadRoom,
    Forbidden,
    TooManySubscriptions,
    PayloadTooLarge,
    Unauthorized,
    MissingToken,
    InvalidToken,
    TokenExpired,
    TokenReplayed,
    /// A resume credential that is malformed, spent, expired or revoked (DESIGN §7).
    ResumeInvalid,
    MigrationBudget,
    /// The session is served by another node, named with its URL (issue 30).
    WrongNode,
    NoAliveNode,
    NotFound,
    Unavailable,
    Internal,
    RateLimited,
    TooManyConnections,
    ForbiddenOrigin,
    DirectoryUnavailable,
    /// The room's namespace keeps no presence (DESIGN §9).
    PresenceOff,
    /// The request cannot be done in the cluster's present state (a rebalance towards a
    /// node that is not alive and taking connections, or outside cluster mode).
    Conflict,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::BadRoom => "bad_room",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::TooManySubscriptions => "too_many_subscriptions",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::MissingToken => "missing_token",
            ErrorCode::InvalidToken => "invalid_token",
            ErrorCode::TokenExpired => "token_expired",
            ErrorCode::TokenReplayed => "token_replayed",
            ErrorCode::ResumeInvalid => "resume_invalid",
            ErrorCode::MigrationBudget => "migration_budget",
            ErrorCode::WrongNode => "wrong_node",
            ErrorCode::NoAliveNode => "no_alive_node",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::ForbiddenOrigin => "forbidden_origin",
            ErrorCode::DirectoryUnavailable => "directory_unavailable",
            ErrorCode::PresenceOff => "presence_off",
            ErrorCode::Conflict => "conflict",
        }
    }

    /// The HTTP status an error answer with this code has (codes only sent in `error`
    /// frames have one too, so the table is total). One exception is made by the handler:
    /// `too_many_connections` for one address is 429 (see `http::admit`).
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest | ErrorCode::UnknownOp | ErrorCode::BadRoom => 400,
            ErrorCode::Unauthorized
            | ErrorCode::MissingToken
            | ErrorCode::InvalidToken
            | ErrorCode::TokenExpired
            | ErrorCode::TokenReplayed
            | ErrorCode::ResumeInvalid => 401,
            ErrorCode::Forbidden | ErrorCode::ForbiddenOrigin => 403,
            ErrorCode::NotFound | ErrorCode::PresenceOff => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::WrongNode => 421,
            ErrorCode::TooManySubscriptions | ErrorCode::MigrationBudget | ErrorCode::RateLimited => 429,
            ErrorCode::Internal => 500,
            ErrorCode::Unavailable
            | ErrorCode::NoAliveNode
            | ErrorCode::TooManyConnections
            | ErrorCode::DirectoryUnavailable => 503,
        }
    }
}

/// A request from a client, after parsing. `reference` is the client's `ref`, echoed back.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRequest {
    pub reference: Option<i64>,
    pub op: ClientOp,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ClientOp {
    /// `state`: answer with the room's state and the events after it (DESIGN §9);
    /// `presence`: the client wants the room's presence frames.
    Subscribe { room: String, since: Option<u64>, epoch: Option<String>, state: bool, presence: bool },
    Unsubscribe { room: String },
    History { room: String, since: u64, limit: Option<usize> },
    /// Client publish (DESIGN §9); `data` is the JSON text as sent.
    /// `state`: the room's state as of this event (JSON text); `null` or absent: none.
    Publish { room: String, id: Option<String>, data: String, state: Option<String> },
    /// Who is in the room now (DESIGN §9).
    Presence { room: String },
    Ping,
}

/// Why a client frame could not be parsed; carries the `ref` when it could be read.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameError {
    pub reference: Option<i64>,
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeFields {
    room: String,
    since: Option<u64>,
    epoch: Option<String>,
    #[serde(default)]
    state: bool,
    #[serde(default)]
    presence: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoomField {
    room: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryFields {
    room: String,
    #[serde(default)]
    since: u64,
    limit: Option<usize>,
}

/// A `publish` frame read again for its fields: `data` and `state` as the client's bytes
/// (key order, number spelling and whitespace kept, as an HTTP publish keeps them).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishFields {
    /// Read (and checked) by [`parse_client_frame`] already.
    #[serde(rename = "ref")]
    _reference: Option<serde::de::IgnoredAny>,
    #[serde(rename = "op")]
    _op: serde::de::IgnoredAny,
    room: String,
    id: Option<String>,
    /// Required (`null` is a value).
    data: Box<RawValue>,
    /// Optional; `null` is none.
    state: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// Parse one client text frame.
pub fn parse_client_frame(text: &str) -> Result<ClientRequest, FrameError> {
    let fail = |reference, code, message: String| FrameError { reference, code, message };
    let mut fields: Map<String, Value> = serde_json::from_str(text)
        .map_err(|e| fail(None, ErrorCode::BadRequest, format!("frame is not a JSON object: {e}")))?;
    let reference = match fields.remove("ref") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.is_i64() => n.as_i64(),
        Some(_) => return Err(fail(None, ErrorCode::BadRequest, "ref must be an integer".into())),
    };
    let op = match fields.remove("op") {
        Some(Value::String(op)) => op,
        _ => return Err(fail(reference, ErrorCode::BadRequest, "missing string field op".into())),
    };
    let rest = Value::Object(fields);
    let bad = |e: serde_json::Error| fail(reference, ErrorCode::BadRequest, format!("{op}: {e}"));
    let op = match op.as_str() {
        "subscribe" => {
            let f: SubscribeFields = serde_json::from_value(rest).map_err(bad)?;
            ClientOp::Subscribe { room: f.room, since: f.since, epoch: f.epoch, state: f.state, presence: f.presence }
        }
        "unsubscribe" => {
            let f: RoomField = serde_json::from_value(rest).map_err(bad)?;
            ClientOp::Unsubscribe { room: f.room }
        }
        "history" => {
            let f: HistoryFields = serde_json::from_value(rest).map_err(bad)?;
            ClientOp::History { room: f.room, since: f.since, limit: f.limit }
        }
        "publish" => {
            // The frame again, for `data` and `state` as sent (the map above re-encodes).
            let f: PublishFields = serde_json::from_str(text).map_err(bad)?;
            ClientOp::Publish { room: f.room, id: f.id, data: f.data.get().to_string(), state: f.state.map(|s| s.get().to_string()) }
        }
        "presence" => {
            let f: RoomField = serde_json::from_value(rest).map_err(bad)?;
            ClientOp::Presence { room: f.room }
        }
        "ping" => {
            let _: NoFields = serde_json::from_value(rest).map_err(bad)?;
            ClientOp::Ping
        }
        other => {
            return Err(fail(reference, ErrorCode::UnknownOp, format!("unknown op {other:?}")));
        }
    };
    Ok(ClientRequest { reference, op })
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("strings always serialise")
}

// ---- Server frames ----
//
// One type per frame the server sends, serialized by the server and deserialized by the
// terminal client (`client::subscriber`), so each frame has one definition. A client
// reads the [`FrameHead`] first and then the frame its `op` names. Text fields are `Cow`:
// borrowed when the server renders, and when a client reads text without escapes.

/// The `op` of a server frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerOp {
    Welcome,
    Subscribed,
    Unsubscribed,
    Events,
    History,
    Published,
    Pong,
    Error,
    /// A room's members (the `presence` reply) or who joined and left (DESIGN §9).
    Presence,
    /// An op this build does not know (a newer server's).
    #[serde(other)]
    Unknown,
}

impl ServerOp {
    /// The op as it is written (an SSE message's `event:` name).
    pub const fn as_str(self) -> &'static str {
        match self {
            ServerOp::Welcome => "welcome",
            ServerOp::Subscribed => "subscribed",
            ServerOp::Unsubscribed => "unsubscribed",
            ServerOp::Events => "events",
            ServerOp::History => "history",
            ServerOp::Published => "published",
            ServerOp::Pong => "pong",
            ServerOp::Error => "error",
            ServerOp::Presence => "presence",
            ServerOp::Unknown => "unknown",
        }
    }
}

/// What every server frame starts with: its `op`, and the `ref` of the request it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct FrameHead {
    pub op: ServerOp,
    #[serde(rename = "ref", default)]
    pub reference: Option<i64>,
}

/// A frame the server sends, as it is serialized: `op` names the variant. `events` and
/// `history` frames are written from already-rendered events by [`events_frame`] and
/// [`history_frame`] instead (the same bytes as serializing [`Events`], checked in a test).
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ServerFrame<'a> {
    Welcome(Welcome<'a>),
    Subscribed(Subscribed<'a>),
    #[serde(rename = "subscribed")]
    InboxNotice(InboxNotice<'a>),
    Unsubscribed(Unsubscribed<'a>),
    Events(Events<'a>),
    Published(PublishedFrame<'a>),
    Pong(Pong),
    Error(ErrorFrame<'a>),
    #[serde(rename = "presence")]
    PresenceReply(PresenceReply<'a>),
    #[serde(rename = "presence")]
    PresenceDiff(PresenceDiff<'a>),
}

/// `welcome`: the first frame on a connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome<'a> {
    #[serde(borrow)]
    pub session: Cow<'a, str>,
    #[serde(borrow)]
    pub node: Cow<'a, str>,
    pub heartbeat_ms: u64,
    /// The node is still warming up after a start (sessions may move).
    #[serde(default)]
    pub warmup: bool,
    /// A one-time credential that reopens this connection (`/v1/ws?resume=R`) without a
    /// token, until `resume_expires_at_ms` (DESIGN §7).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_expires_at_ms: Option<u64>,
}

/// `subscribed`: the reply to a `subscribe`, with the room's epoch and head; `recovered`
/// when the request named a `since`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscribed<'a> {
    #[serde(borrow)]
    pub room: Cow<'a, str>,
    #[serde(borrow)]
    pub epoch: Cow<'a, str>,
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered: Option<bool>,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<i64>,
    /// A subscribe with `"state":true` that got the state: `{"seq","data"}` or `null`
    /// (kept as JSON text; present even when `null`).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub state: Option<RawJson>,
}

/// JSON text kept as it is, compared by its text.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RawJson(pub Box<RawValue>);

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl RawJson {
    /// Wrap JSON text this module rendered.
    fn from_rendered(text: String) -> RawJson {
        RawJson(RawValue::from_string(text).expect("rendered JSON is valid"))
    }
}

/// A field that is there, even as `null`, is `Some`.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<RawJson>, D::Error> {
    Box::<RawValue>::deserialize(deserializer).map(|raw| Some(RawJson(raw)))
}

/// The `state` of a `subscribed`: `{"seq":S,"data":...}`, or `null` for a room without one.
pub fn state_json(state: Option<(u64, &str)>) -> String {
    match state {
        Some((seq, data)) => format!(r#"{{"seq":{seq},"data":{data}}}"#),
        None => "null".into(),
    }
}

/// `subscribed` without epoch or head and without `ref`: the automatic subscription to
/// the user's inbox, sent after `welcome`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InboxNotice<'a> {
    #[serde(borrow)]
    pub room: Cow<'a, str>,
}

/// `unsubscribed`: the reply to an `unsubscribe`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unsubscribed<'a> {
    #[serde(borrow)]
    pub room: Cow<'a, str>,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<i64>,
}

/// `events`: rendered events (see [`render_event`]), in seq order per room.
#[derive(Debug, Serialize, Deserialize)]
pub struct Events<'a> {
    #[serde(borrow)]
    pub events: Vec<&'a RawValue>,
}

/// The fields of a rendered event that order it, read without touching the rest (a
/// client prints the event as the server wrote it).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EventHead<'a> {
    #[serde(borrow)]
    pub room: Cow<'a, str>,
    pub seq: u64,
}

/// `published`: the reply to a client's `publish`, once the event is durable; a
/// repeated `id` answers `duplicate:true` with the first seq.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedFrame<'a> {
    #[serde(borrow)]
    pub room: Cow<'a, str>,
    pub seq: u64,
    pub duplicate: bool,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<i64>,
}

/// `pong`: the reply to a `ping`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pong {
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<i64>,
}

/// `error`: a request refused (`ref` names it) or a fault of the connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorFrame<'a> {
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<i64>,
    /// One of [`ErrorCode::as_str`], or a newer server's.
    #[serde(borrow, default)]
    pub code: Cow<'a, str>,
    #[serde(borrow, default)]
    pub message: Cow<'a, str>,
    /// `wrong_node`: the node that serves the session, and its base URL.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub url: Option<Cow<'a, str>>,
}

/// One member of a room in presence answers and frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberJson<'a> {
    #[serde(borrow)]
    pub user: Cow<'a, str>,
    #[serde(borrow)]
    pub device: Cow<'a, str>,
}

impl<'a> From<&'a Member> for MemberJson<'a> {
    fn from(m: &'a Member) -> Self {
        MemberJson { user: Cow::Borrowed(&m.user), device: Cow::Borrowed(&m.device) }
    }
}

fn members_json<'a>(members: Option<impl IntoIterator<Item = &'a Member>>) -> Option<Vec<MemberJson<'a>>> {
    members.map(|ms| ms.into_iter().map(MemberJson::from).collect())
}

/// `presence` reply to the op (and, without `op` and `ref`, the body of
/// `GET /v1/rooms/{room}/presence`): the distinct members across the cluster; `members`
/// is null above `presence_members_max`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PresenceReply<'a> {
    #[serde(borrow)]
    pub room: Cow<'a, str>,
    pub count: usize,
    #[serde(borrow)]
    pub members: Option<Vec<MemberJson<'a>>>,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<i64>,
}

/// `presence` frame to a subscriber that asked for it: who joined and left since the
/// room's last frame (null, with the count alone, above `presence_members_max`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PresenceDiff<'a> {
    #[serde(borrow)]
    pub room: Cow<'a, str>,
    pub count: usize,
    #[serde(borrow)]
    pub joined: Option<Vec<MemberJson<'a>>>,
    #[serde(borrow)]
    pub left: Option<Vec<MemberJson<'a>>>,
}

/// The reply to the `presence` op.
pub fn presence_reply_frame(room: &str, view: &View, reference: Option<i64>) -> String {
    let members = members_json(view.members.as_ref());
    render(&ServerFrame::PresenceReply(PresenceReply { room: room.into(), count: view.count, members, reference }))
}

/// The body of `GET /v1/rooms/{room}/presence`.
pub fn presence_body(room: &str, view: &View) -> String {
    let members = members_json(view.members.as_ref());
    serde_json::to_value(PresenceReply { room: room.into(), count: view.count, members, reference: None })
        .expect("presence answers always serialise")
        .to_string()
}

/// A room's presence frame, rendered once for every subscriber that asked.
pub fn presence_frame(room: &str, diff: &Diff) -> String {
    render(&ServerFrame::PresenceDiff(PresenceDiff {
        room: room.into(),
        count: diff.count,
        joined: members_json(diff.joined.as_ref()),
        left: members_json(diff.left.as_ref()),
    }))
}

/// The data of an SSE stream's last message, `event: close`: the close code and reason a
/// WebSocket's Close frame would carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloseNotice<'a> {
    pub code: u16,
    #[serde(borrow)]
    pub reason: Cow<'a, str>,
}

/// `{"code":C,"reason":"..."}`, the data of an SSE `event: close`.
pub fn close_event(code: u16, reason: &str) -> String {
    serde_json::to_string(&CloseNotice { code, reason: reason.into() }).expect("close notices always serialise")
}

/// A server frame as JSON text. Through a `Value`, whose map sorts the keys: the bytes
/// livegate has always sent (key order is not part of the protocol).
fn render(frame: &ServerFrame) -> String {
    serde_json::to_value(frame).expect("server frames always serialise").to_string()
}

/// One event as it appears in `events` frames and history replies. `data` is JSON text.
/// `from`: the user whose connection published it (client publish), set by the server
/// and outside `data`, so nothing a client writes can pose as it.
pub fn render_event(room: &str, seq: u64, id: &str, ts_ms: u64, from: Option<&str>, data: &str) -> String {
    let from = from.map(|user| format!(r#""from":{},"#, json_str(user))).unwrap_or_default();
    format!(
        r#"{{"room":{},"seq":{seq},"id":{},"ts_ms":{ts_ms},{from}"data":{data}}}"#,
        json_str(room),
        json_str(id)
    )
}

fn join_events<'a>(out: &mut String, events: impl IntoIterator<Item = &'a str>) {
    out.push('[');
    for (i, event) in events.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(event);
    }
    out.push(']');
}

/// The `events` frame carrying already-rendered events.
pub fn events_frame<'a>(events: impl IntoIterator<Item = &'a str>, capacity: usize) -> String {
    let mut out = String::with_capacity(capacity + 32);
    out.push_str(r#"{"op":"events","events":"#);
    join_events(&mut out, events);
    out.push('}');
    out
}

/// `resume`: the connection's resume credential and when it expires.
pub fn welcome_frame(session: &str, node: &str, heartbeat_ms: u64, warmup: bool, resume: Option<(&str, u64)>) -> String {
    render(&ServerFrame::Welcome(Welcome {
        session: session.into(),
        node: node.into(),
        heartbeat_ms,
        warmup,
        resume: resume.map(|(credential, _)| credential.into()),
        resume_expires_at_ms: resume.map(|(_, expires)| expires),
    }))
}

pub fn subscribed_frame(room: &str, epoch: &str, seq: u64, recovered: Option<bool>, reference: Option<i64>) -> String {
    render(&ServerFrame::Subscribed(Subscribed { room: room.into(), epoch: epoch.into(), seq, recovered, reference, state: None }))
}

/// [`subscribed_frame`] of a subscribe that asked for the state: `state` is the room's
/// (`None`: it has none, rendered `null`).
pub fn subscribed_state_frame(
    room: &str,
    epoch: &str,
    seq: u64,
    recovered: Option<bool>,
    reference: Option<i64>,
    state: Option<(u64, &str)>,
) -> String {
    let state = Some(RawJson::from_rendered(state_json(state)));
    render(&ServerFrame::Subscribed(Subscribed { room: room.into(), epoch: epoch.into(), seq, recovered, reference, state }))
}

/// The automatic subscription to the user's inbox, sent after `welcome`: the inbox is
/// not read at connect, so it carries no epoch or head (a `subscribe` to it does).
pub fn inbox_notice_frame(room: &str) -> String {
    render(&ServerFrame::InboxNotice(InboxNotice { room: room.into() }))
}

pub fn unsubscribed_frame(room: &str, reference: Option<i64>) -> String {
    render(&ServerFrame::Unsubscribed(Unsubscribed { room: room.into(), reference }))
}

pub fn published_frame(room: &str, seq: u64, duplicate: bool, reference: Option<i64>) -> String {
    render(&ServerFrame::Published(PublishedFrame { room: room.into(), seq, duplicate, reference }))
}

pub fn pong_frame(reference: Option<i64>) -> String {
    render(&ServerFrame::Pong(Pong { reference }))
}

pub fn error_frame(reference: Option<i64>, code: ErrorCode, message: &str) -> String {
    render(&ServerFrame::Error(ErrorFrame { reference, code: code.as_str().into(), message: message.into(), node: None, url: None }))
}

/// The `error` frame a WebSocket gets before its close 4421: where its session is served.
pub fn wrong_node_frame(message: &str, node: &str, url: &str) -> String {
    let code = ErrorCode::WrongNode.as_str().into();
    render(&ServerFrame::Error(ErrorFrame { reference: None, code, message: message.into(), node: Some(node.into()), url: Some(url.into()) }))
}

/// The `history` reply frame; `events` are rendered events.
pub fn history_frame<'a>(
    room: &str,
    epoch: Option<&str>,
    head: u64,
    events: impl IntoIterator<Item = &'a str>,
    complete: bool,
    reference: Option<i64>,
) -> String {
    let mut out = String::with_capacity(256);
    out.push_str(r#"{"op":"history","room":"#);
    out.push_str(&json_str(room));
    out.push_str(r#","epoch":"#);
    out.push_str(&epoch.map_or_else(|| "null".to_string(), json_str));
    out.push_str(&format!(r#","head":{head},"complete":{complete}"#));
    if let Some(r) = reference {
        out.push_str(&format!(r#","ref":{r}"#));
    }
    out.push_str(r#","events":"#);
    join_events(&mut out, events);
    out.push('}');
    out
}

/// The `data` of a demo match event.
pub fn demo_event_data(event: &crate::core::matchsim::MatchEvent) -> String {
    serde_json::json!({
        "type": event.kind.as_str(),
        "match": event.match_id,
        "home": event.home,
        "away": event.away,
        "minute": event.minute,
        "team": event.team.map(|side| if side == 0 { "home" } else { "away" }),
        "score": event.score,
        "text": event.text,
    })
    .to_string()
}

/// The room state of a demo match (DESIGN §9): what the score page shows on load and
/// what a restarted simulator resumes from.
pub fn demo_state_data(match_id: u32, home: &str, away: &str, state: &crate::core::matchsim::MatchState) -> String {
    serde_json::json!({
        "match": match_id,
        "home": home,
        "away": away,
        "minute": state.minute,
        "score": state.score,
        "status": state.status.as_str(),
    })
    .to_string()
}

/// A demo match's stored state, if it reads as one.
pub fn parse_demo_state(text: &str) -> Option<crate::core::matchsim::MatchState> {
    #[derive(Deserialize)]
    struct Stored {
        minute: u32,
        score: [u32; 2],
        status: String,
    }
    let stored: Stored = serde_json::from_str(text).ok()?;
    let status = crate::core::matchsim::Status::parse(&stored.status)?;
    Some(crate::core::matchsim::MatchState { minute: stored.minute, score: stored.score, status })
}

// ---- HTTP bodies ----

/// `POST /v1/tokens`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub user: String,
    #[serde(default = "default_device")]
    pub device: String,
    #[serde(default = "default_token_ttl")]
    pub ttl_secs: u64,
    #[serde(default)]
    pub rooms: Vec<String>,
    /// Room patterns the connection may publish to (DESIGN §9); none by default.
    #[serde(default)]
    pub publish: Vec<String>,
}

fn default_device() -> String {
    "web".into()
}

fn default_token_ttl() -> u64 {
    60
}

#[derive(Debug, Serialize)]
pub struct TokenReply {
    pub token: String,
    pub expires_at_ms: u64,
}

/// `POST /v1/rooms/{room}/events`; `data` is kept as the JSON text that was sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    pub id: Option<String>,
    pub data: Box<RawValue>,
    /// The room's state as of this event (DESIGN §9); `null` or absent: none.
    pub state: Option<Box<RawValue>>,
}

/// `PUT /v1/rooms/{room}/state`: the room's state as of its head.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutStateRequest {
    pub data: Box<RawValue>,
}

pub fn parse_put_state_request(body: &[u8]) -> Result<PutStateRequest, serde_json::Error> {
    serde_json::from_slice(body)
}

/// Answer of `PUT /v1/rooms/{room}/state`: the seq the state is as of.
#[derive(Debug, Serialize)]
pub struct PutStateReply {
    pub room: String,
    pub epoch: String,
    pub seq: u64,
}

/// The body of `GET /v1/rooms/{room}/state`: `seq` 0 and `data` null when the room has
/// no state, `epoch` null while the room cannot be read.
pub fn state_body(room: &str, epoch: Option<&str>, seq: u64, data: Option<&str>) -> String {
    format!(
        r#"{{"room":{},"epoch":{},"seq":{seq},"data":{}}}"#,
        json_str(room),
        epoch.map_or_else(|| "null".to_string(), json_str),
        data.unwrap_or("null")
    )
}

/// `POST /v1/users/{user}/messages`: an event for the user's inbox room, optionally only
/// for some of the user's devices.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserMessageRequest {
    pub id: Option<String>,
    pub data: Box<RawValue>,
    pub devices: Option<Vec<String>>,
}

pub fn parse_user_message_request(body: &[u8]) -> Result<UserMessageRequest, serde_json::Error> {
    serde_json::from_slice(body)
}

/// `GET /v1/admin/status`
#[derive(Debug, Serialize)]
pub struct StatusReply {
    pub node: String,
    pub version: &'static str,
    pub uptime_secs: u64,
    /// `starting`, `ready` or `draining`.
    pub phase: &'static str,
    pub warmup: bool,
    pub connections: usize,
    pub subscriptions: u64,
    pub rooms_live: usize,
    pub rooms_parked: usize,
    /// Sessions with a connection here.
    pub sessions_live: usize,
    /// Disconnected sessions kept in memory (at most `session_cache_max`).
    pub sessions_cached: usize,
    /// Session records in the embedded store; absent in cluster mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions_stored: Option<u64>,
    pub store_bytes: u64,
}

/// `GET /v1/admin/overview`: what the admin page polls.
#[derive(Debug, Serialize)]
pub struct OverviewReply {
    pub node: String,
    pub version: &'static str,
    /// `starting`, `ready` or `draining`.
    pub phase: &'static str,
    pub ts_ms: u64,
    pub uptime_secs: u64,
    /// This node first, then the peers it knows.
    pub nodes: Vec<OverviewNode>,
    pub connections: usize,
    pub subscriptions: u64,
    pub rooms_live: usize,
    /// The busiest live rooms here (at most 20), busiest first.
    pub rooms: Vec<OverviewRoom>,
    pub counters: OverviewCounters,
}

#[derive(Debug, Serialize)]
pub struct OverviewNode {
    pub node: String,
    pub url: String,
    /// `starting`, `ready` or `draining`; a probed peer may be `down`.
    pub phase: &'static str,
    #[serde(rename = "self")]
    pub itself: bool,
}

#[derive(Debug, Serialize)]
pub struct OverviewRoom {
    pub room: String,
    /// Explicit subscribers on this node.
    pub subscribers: u64,
    /// The room's durable head seq.
    pub head: u64,
}

/// The node's monotonic totals since it started.
#[derive(Debug, Serialize)]
pub struct OverviewCounters {
    pub publishes: u64,
    pub deliveries: u64,
    pub slow_consumers: u64,
    pub migrations: u64,
}

/// `GET /v1/route`
#[derive(Debug, Serialize)]
pub struct RouteReply {
    pub node: String,
    pub url: String,
}

/// `DELETE /v1/users/{user}/connections`
#[derive(Debug, Serialize)]
pub struct KickReply {
    pub closed: usize,
}

#[derive(Debug, Serialize)]
pub struct PublishReply {
    pub room: String,
    pub seq: u64,
    pub epoch: String,
    pub duplicate: bool,
}

/// The body of `GET /v1/rooms/{room}/events`; `events` are rendered events.
pub fn history_body<'a>(room: &str, epoch: Option<&str>, head: u64, events: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = String::with_capacity(256);
    out.push_str(r#"{"room":"#);
    out.push_str(&json_str(room));
    out.push_str(r#","epoch":"#);
    out.push_str(&epoch.map_or_else(|| "null".to_string(), json_str));
    out.push_str(&format!(r#","head":{head},"events":"#));
    join_events(&mut out, events);
    out.push('}');
    out
}

/// `{"error":{"code","message"}}`
pub fn error_body(code: ErrorCode, message: &str) -> String {
    serde_json::json!({"error": {"code": code.as_str(), "message": message}}).to_string()
}

/// `{"error":{"code":"wrong_node","message","node","url"}}`: the HTTP answer (421) to a
/// handshake on a node that does not serve its session.
pub fn wrong_node_body(message: &str, node: &str, url: &str) -> String {
    let code = ErrorCode::WrongNode.as_str();
    serde_json::json!({"error": {"code": code, "message": message, "node": node, "url": url}}).to_string()
}

pub fn parse_token_request(body: &[u8]) -> Result<TokenRequest, serde_json::Error> {
    serde_json::from_slice(body)
}

pub fn parse_publish_request(body: &[u8]) -> Result<PublishRequest, serde_json::Error> {
    serde_json::from_slice(body)
}

/// `POST /v1/admin/rebalance` (an empty body: all defaults).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebalanceRequest {
    /// The node to fill (default: the node answering).
    pub to: Option<String>,
    pub per_second: Option<u32>,
    /// Connections to move at most, in all.
    pub limit: Option<u64>,
}

pub fn parse_rebalance_request(body: &[u8]) -> Result<RebalanceRequest, serde_json::Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(RebalanceRequest::default());
    }
    serde_json::from_slice(body)
}

/// A rebalance as its planning node issued it (the 202 of `POST /v1/admin/rebalance`,
/// and `issued` in `GET`).
#[derive(Debug, Clone, Serialize)]
pub struct RebalancePlanReply {
    pub id: String,
    pub to: String,
    pub per_second: u32,
    /// The mean load the plan levels towards.
    pub mean: u64,
    /// Connections to move in all.
    pub total: u64,
    pub at_ms: u64,
    pub shares: Vec<RebalanceShare>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RebalanceShare {
    pub node: String,
    /// Connections it hands over.
    pub connections: u64,
    /// Its part of the operation's rate (by share, at least 1).
    pub per_second: u32,
    /// It acknowledged its order.
    pub accepted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// This node's part of the last rebalance it was given.
#[derive(Debug, Clone, Serialize)]
pub struct RebalanceShedding {
    pub id: String,
    pub to: String,
    pub per_second: u32,
    pub planned: u64,
    pub moved: u64,
    pub users: u64,
    pub skipped_budget: u64,
    pub skipped_gone: u64,
    pub errors: u64,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    /// `running`, `done`, `no_more_users`, `target_gone`, `draining` or `replaced`.
    pub state: &'static str,
}

/// A node's load as this node hears it.
#[derive(Debug, Serialize)]
pub struct RebalanceLoad {
    pub node: String,
    /// `null`: a node of an earlier build that does not say.
    pub connections: Option<u64>,
    pub draining: bool,
}

/// `GET /v1/admin/rebalance`
#[derive(Debug, Serialize)]
pub struct RebalanceStatusReply {
    pub node: String,
    pub issued: Option<RebalancePlanReply>,
    pub shedding: Option<RebalanceShedding>,
    /// Every node this one hears, itself first (empty outside cluster mode).
    pub loads: Vec<RebalanceLoad>,
}

/// Answer of `POST /v1/admin/reload`: how many API keys and allowed origins are in force.
#[derive(Debug, Serialize)]
pub struct ReloadReply {
    pub api_keys: usize,
    pub allowed_origins: usize,
}

pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("reply bodies always serialise")
}

/// A webhook's body (DESIGN §10), one JSON object per request; `user`, `device`, `seq`,
/// `event_id` and `data` only on `client_published` (`device` and `event_id` when known).
#[derive(Debug, Serialize)]
pub struct WebhookBody<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub room: &'a str,
    pub ts_ms: u64,
    pub node: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<&'a RawValue>,
}

pub fn webhook_body(body: &WebhookBody<'_>) -> String {
    to_json(body)
}

/// Event data given as JSON text (a client's publish op), as the webhook body carries it;
/// `None` if it is not JSON.
pub fn event_data(text: String) -> Option<Box<EventData>> {
    RawValue::from_string(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<ClientRequest, (Option<i64>, ErrorCode)>) {
        let got = parse_client_frame(text).map_err(|e| (e.reference, e.code));
        assert_eq!(got, expected, "frame {text}");
    }

    fn req(reference: Option<i64>, op: ClientOp) -> Result<ClientRequest, (Option<i64>, ErrorCode)> {
        Ok(ClientRequest { reference, op })
    }

    #[test]
    fn client_frames() {
        let room = || "match:1".to_string();
        check(r#"{"op":"ping"}"#, req(None, ClientOp::Ping));
        check(r#"{"op":"ping","ref":7}"#, req(Some(7), ClientOp::Ping));
        check(
            r#"{"op":"subscribe","room":"match:1"}"#,
            req(None, ClientOp::Subscribe { room: room(), since: None, epoch: None, state: false, presence: false }),
        );
        check(
            r#"{"op":"subscribe","room":"match:1","since":42,"epoch":"E","ref":1}"#,
            req(Some(1), ClientOp::Subscribe { room: room(), since: Some(42), epoch: Some("E".into()), state: false, presence: false }),
        );
        check(
            r#"{"op":"subscribe","room":"match:1","state":true}"#,
            req(None, ClientOp::Subscribe { room: room(), since: None, epoch: None, state: true, presence: false }),
        );
        check(
            r#"{"op":"subscribe","room":"match:1","since":3,"state":false}"#,
            req(None, ClientOp::Subscribe { room: room(), since: Some(3), epoch: None, state: false, presence: false }),
        );
        check(r#"{"op":"subscribe","room":"r","state":1}"#, Err((None, ErrorCode::BadRequest)));
        check(r#"{"op":"subscribe","room":"r","state":"yes"}"#, Err((None, ErrorCode::BadRequest)));
        check(
            r#"{"op":"subscribe","room":"match:1","presence":true}"#,
            req(None, ClientOp::Subscribe { room: room(), since: None, epoch: None, state: false, presence: true }),
        );
        check(r#"{"op":"subscribe","room":"r","presence":1}"#, Err((None, ErrorCode::BadRequest)));
        check(r#"{"op":"presence","room":"match:1","ref":8}"#, req(Some(8), ClientOp::Presence { room: room() }));
        check(r#"{"op":"presence","ref":9}"#, Err((Some(9), ErrorCode::BadRequest)));
        check(r#"{"op":"unsubscribe","room":"match:1"}"#, req(None, ClientOp::Unsubscribe { room: room() }));
        check(
            r#"{"op":"history","room":"match:1","since":40,"limit":100}"#,
            req(None, ClientOp::History { room: room(), since: 40, limit: Some(100) }),
        );
        check("not json", Err((None, ErrorCode::BadRequest)));
        check("[1,2]", Err((None, ErrorCode::BadRequest)));
        check(r#"{"room":"x"}"#, Err((None, ErrorCode::BadRequest)));
        check(r#"{"op":"dance","ref":3}"#, Err((Some(3), ErrorCode::UnknownOp)));
        check(r#"{"op":"subscribe","ref":4}"#, Err((Some(4), ErrorCode::BadRequest)));
        check(r#"{"op":"subscribe","room":"r","since":-1}"#, Err((None, ErrorCode::BadRequest)));
        check(r#"{"op":"subscribe","room":"r","extra":1}"#, Err((None, ErrorCode::BadRequest)));
        check(r#"{"op":"ping","ref":"x"}"#, Err((None, ErrorCode::BadRequest)));
        check(
            r#"{"op":"publish","room":"chat:1","id":"c-1","data":{"text": "hi"},"ref":5}"#,
            req(
                Some(5),
                ClientOp::Publish { room: "chat:1".into(), id: Some("c-1".into()), data: r#"{"text": "hi"}"#.into(), state: None },
            ),
        );
        check(
            r#"{"op":"publish","room":"chat:1","data":null}"#,
            req(None, ClientOp::Publish { room: "chat:1".into(), id: None, data: "null".into(), state: None }),
        );
        let publish = |state: Option<&str>| ClientOp::Publish { room: "chat:1".into(), id: None, data: "1".into(), state: state.map(Into::into) };
        for (text, state) in [
            (r#"{"op":"publish","room":"chat:1","data":1,"state":{"n": 1}}"#, Some(r#"{"n": 1}"#)),
            (r#"{"op":"publish","room":"chat:1","data":1,"state":[1, "x"]}"#, Some(r#"[1, "x"]"#)),
            (r#"{"op":"publish","room":"chat:1","data":1,"state":0}"#, Some("0")),
            (r#"{"op":"publish","room":"chat:1","data":1,"state":null}"#, None),
        ] {
            check(text, req(None, publish(state)));
        }
        check(r#"{"op":"publish","room":"chat:1","ref":6}"#, Err((Some(6), ErrorCode::BadRequest)));
        // The data as sent: key order, numbers beyond 64 bits and spacing kept.
        check(
            r#"{"ref":7,"op":"publish","data":{"b":1,"a":18446744073709551616000, "c":1.50},"room":"chat:1"}"#,
            req(Some(7), ClientOp::Publish { room: "chat:1".into(), id: None, data: r#"{"b":1,"a":18446744073709551616000, "c":1.50}"#.into(), state: None }),
        );
        check(r#"{"op":"publish","room":"chat:1","data":1,"data":2}"#, Err((None, ErrorCode::BadRequest)));
        check(r#"{"op":"publish","room":"chat:1","data":1,"from":"admin"}"#, Err((None, ErrorCode::BadRequest)));
    }

    #[test]
    fn demo_states_read_back() {
        use crate::core::matchsim::{MatchState, Status};
        let state = MatchState { minute: 61, score: [3, 2], status: Status::Playing };
        let text = demo_state_data(2, "Harbour FC", "City Rovers", &state);
        assert_eq!(parse_demo_state(&text), Some(state), "{text}");
        for bad in ["null", "{}", r#"{"minute":1,"score":[0,0],"status":"halftime"}"#, r#"{"minute":-1,"score":[0,0],"status":"playing"}"#] {
            assert_eq!(parse_demo_state(bad), None, "{bad}");
        }
    }

    #[test]
    fn state_bodies() {
        let state = |body: &str| parse_publish_request(body.as_bytes()).map(|r| r.state.map(|s| s.get().to_string())).map_err(|e| e.to_string());
        assert_eq!(state(r#"{"data":1}"#), Ok(None));
        assert_eq!(state(r#"{"data":1,"state":null}"#), Ok(None));
        assert_eq!(state(r#"{"data":1,"state":{"last_id":"e-1"}}"#), Ok(Some(r#"{"last_id":"e-1"}"#.into())));
        let put = |body: &str| parse_put_state_request(body.as_bytes()).map(|r| r.data.get().to_string()).map_err(|e| e.to_string());
        assert_eq!(put(r#"{"data":{"a":1}}"#), Ok(r#"{"a":1}"#.into()));
        assert_eq!(put(r#"{"data":null}"#), Ok("null".into()));
        assert!(put(r#"{}"#).is_err(), "data is required");
        assert!(put(r#"{"data":1,"seq":2}"#).is_err(), "unknown fields are refused");
        assert!(parse_user_message_request(br#"{"data":1,"state":{}}"#).is_err(), "an inbox has no state");
        assert_eq!(to_json(&PutStateReply { room: "r".into(), epoch: "E".into(), seq: 3 }), r#"{"room":"r","epoch":"E","seq":3}"#);
    }

    /// The statuses the HTTP API promises for its codes (README, HTTP API; DESIGN.md §2–3).
    #[test]
    fn error_codes_carry_the_documented_status() {
        let documented = [
            (ErrorCode::BadRequest, 400),
            (ErrorCode::BadRoom, 400),
            (ErrorCode::Unauthorized, 401),
            (ErrorCode::MissingToken, 401),
            (ErrorCode::InvalidToken, 401),
            (ErrorCode::TokenExpired, 401),
            (ErrorCode::TokenReplayed, 401),
            (ErrorCode::ResumeInvalid, 401),
            (ErrorCode::ForbiddenOrigin, 403),
            (ErrorCode::NotFound, 404),
            (ErrorCode::PresenceOff, 404),
            (ErrorCode::Conflict, 409),
            (ErrorCode::PayloadTooLarge, 413),
            (ErrorCode::MigrationBudget, 429),
            (ErrorCode::RateLimited, 429),
            (ErrorCode::Internal, 500),
            (ErrorCode::Unavailable, 503),
            (ErrorCode::NoAliveNode, 503),
            (ErrorCode::TooManyConnections, 503),
            (ErrorCode::DirectoryUnavailable, 503),
        ];
        for (code, status) in documented {
            assert_eq!(code.http_status(), status, "{}", code.as_str());
        }
    }

    #[test]
    fn server_frames_are_valid_json() {
        let event = render_event("r\"1", 3, "id\n", 5, None, r#"{"k":[1,2]}"#);
        let frame = events_frame([event.as_str(), event.as_str()], 0);
        let parsed: Value = serde_json::from_str(&frame).unwrap();
        assert_eq!(parsed["events"][1]["room"], "r\"1");
        assert_eq!(parsed["events"][0]["data"]["k"][1], 2);
        let history: Value = serde_json::from_str(&history_frame("r", None, 0, [], true, Some(2))).unwrap();
        assert_eq!((history["epoch"].clone(), history["ref"].clone()), (Value::Null, Value::from(2)));
        let sub: Value = serde_json::from_str(&subscribed_frame("r", "E", 4, Some(false), None)).unwrap();
        assert_eq!(sub["recovered"], false);
        let body: Value = serde_json::from_str(&history_body("r", Some("E"), 1, [event.as_str()])).unwrap();
        assert_eq!(body["events"][0]["seq"], 3);
        assert_eq!(parsed["events"][0].get("from"), None, "a backend's event names no user");
        let from: Value = serde_json::from_str(&render_event("r", 1, "a", 5, Some("u\"1"), r#"{"from":"x"}"#)).unwrap();
        assert_eq!((from["from"].clone(), from["data"]["from"].clone()), (Value::from("u\"1"), Value::from("x")));
        let published: Value = serde_json::from_str(&published_frame("r", 9, true, Some(4))).unwrap();
        assert_eq!(published, serde_json::json!({"op":"published","room":"r","seq":9,"duplicate":true,"ref":4}));
    }

    #[test]
    fn server_frames_keep_their_bytes() {
        let cases = [
            (welcome_frame("s1", "n1", 30_000, false, None), r#"{"heartbeat_ms":30000,"node":"n1","op":"welcome","session":"s1","warmup":false}"#),
            (
                welcome_frame("s1", "n1", 30_000, false, Some(("R", 7))),
                r#"{"heartbeat_ms":30000,"node":"n1","op":"welcome","resume":"R","resume_expires_at_ms":7,"session":"s1","warmup":false}"#,
            ),
            (subscribed_frame("r", "E", 4, Some(true), Some(2)), r#"{"epoch":"E","op":"subscribed","recovered":true,"ref":2,"room":"r","seq":4}"#),
            (subscribed_frame("r", "E", 0, None, None), r#"{"epoch":"E","op":"subscribed","room":"r","seq":0}"#),
            (
                subscribed_state_frame("r", "E", 9, None, Some(1), Some((7, r#"{"b":1,"a":[2]}"#))),
                r#"{"epoch":"E","op":"subscribed","ref":1,"room":"r","seq":9,"state":{"data":{"a":[2],"b":1},"seq":7}}"#,
            ),
            (
                subscribed_state_frame("r", "E", 9, Some(false), None, None),
                r#"{"epoch":"E","op":"subscribed","recovered":false,"room":"r","seq":9,"state":null}"#,
            ),
            (state_body("r\"", Some("E"), 7, Some(r#"{"a":1}"#)), r#"{"room":"r\"","epoch":"E","seq":7,"data":{"a":1}}"#),
            (state_body("r", None, 0, None), r#"{"room":"r","epoch":null,"seq":0,"data":null}"#),
            (inbox_notice_frame("inbox:u"), r#"{"op":"subscribed","room":"inbox:u"}"#),
            (unsubscribed_frame("r", Some(3)), r#"{"op":"unsubscribed","ref":3,"room":"r"}"#),
            (pong_frame(None), r#"{"op":"pong"}"#),
            (close_event(1012, "service restart: reconnect in 5 ms"), r#"{"code":1012,"reason":"service restart: reconnect in 5 ms"}"#),
            (error_frame(Some(5), ErrorCode::BadRoom, "bad \"x\""), r#"{"code":"bad_room","message":"bad \"x\"","op":"error","ref":5}"#),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn server_frames_read_back_as_their_types() {
        let head = |text: &str| serde_json::from_str::<FrameHead>(text).unwrap();
        let text = welcome_frame("s1", "n1", 30_000, true, None);
        assert_eq!(head(&text), FrameHead { op: ServerOp::Welcome, reference: None });
        let welcome: Welcome = serde_json::from_str(&text).unwrap();
        let expected = Welcome { session: "s1".into(), node: "n1".into(), heartbeat_ms: 30_000, warmup: true, resume: None, resume_expires_at_ms: None };
        assert_eq!(welcome, expected);

        let text = subscribed_frame("r", "E", 4, Some(false), Some(2));
        assert_eq!(head(&text), FrameHead { op: ServerOp::Subscribed, reference: Some(2) });
        let reply: Subscribed = serde_json::from_str(&text).unwrap();
        assert_eq!(
            reply,
            Subscribed { room: "r".into(), epoch: "E".into(), seq: 4, recovered: Some(false), reference: Some(2), state: None }
        );
        for state in [Some((3, r#"{"x":1}"#)), None] {
            let text = subscribed_state_frame("r", "E", 4, None, None, state);
            let reply: Subscribed = serde_json::from_str(&text).unwrap();
            let got: Value = serde_json::from_str(reply.state.expect("a null state is there too").0.get()).unwrap();
            assert_eq!(got, serde_json::from_str::<Value>(&state_json(state)).unwrap(), "{text}");
        }
        let text = inbox_notice_frame("inbox:u");
        assert_eq!(head(&text), FrameHead { op: ServerOp::Subscribed, reference: None });
        assert_eq!(serde_json::from_str::<InboxNotice>(&text).unwrap().room, "inbox:u");
        assert!(serde_json::from_str::<Subscribed>(&text).is_err(), "a notice is not a reply");

        let text = unsubscribed_frame("r", Some(3));
        assert_eq!(head(&text).op, ServerOp::Unsubscribed);
        assert_eq!(serde_json::from_str::<Unsubscribed>(&text).unwrap(), Unsubscribed { room: "r".into(), reference: Some(3) });
        assert_eq!(head(&pong_frame(Some(1))), FrameHead { op: ServerOp::Pong, reference: Some(1) });

        let text = error_frame(Some(5), ErrorCode::BadRoom, "bad \"x\"\n");
        assert_eq!(head(&text), FrameHead { op: ServerOp::Error, reference: Some(5) });
        let error: ErrorFrame = serde_json::from_str(&text).unwrap();
        assert_eq!((error.code.as_ref(), error.message.as_ref()), ("bad_room", "bad \"x\"\n"));

        assert_eq!(head(&history_frame("r", None, 0, [], true, Some(2))), FrameHead { op: ServerOp::History, reference: Some(2) });
        assert_eq!(head(r#"{"op":"later","ref":1}"#).op, ServerOp::Unknown);
        assert!(serde_json::from_str::<FrameHead>(r#"{"ref":1}"#).is_err());
    }

    #[test]
    fn presence_frames() {
        let (a, b) = (Member::new("ann", "web"), Member::new("bob", "phone"));
        let view = View { count: 2, members: Some([a.clone(), b.clone()].into_iter().collect()) };
        let reply: Value = serde_json::from_str(&presence_reply_frame("r", &view, Some(3))).unwrap();
        let want = serde_json::json!({"op":"presence","room":"r","count":2,"ref":3,
            "members":[{"user":"ann","device":"web"},{"user":"bob","device":"phone"}]});
        assert_eq!(reply, want);
        let body: Value = serde_json::from_str(&presence_body("r", &View { count: 5000, members: None })).unwrap();
        assert_eq!(body, serde_json::json!({"room":"r","count":5000,"members":null}));
        let diff = Diff { count: 1, joined: Some(vec![a]), left: Some(vec![b]) };
        let text = presence_frame("r", &diff);
        let frame: Value = serde_json::from_str(&text).unwrap();
        let want = serde_json::json!({"op":"presence","room":"r","count":1,
            "joined":[{"user":"ann","device":"web"}],"left":[{"user":"bob","device":"phone"}]});
        assert_eq!(frame, want);
        assert_eq!(serde_json::from_str::<FrameHead>(&text).unwrap().op, ServerOp::Presence);
        let read: PresenceDiff = serde_json::from_str(&text).unwrap();
        assert_eq!(read.joined.unwrap()[0].user, "ann");
        let counted: Value = serde_json::from_str(&presence_frame("r", &Diff { count: 9, joined: None, left: None })).unwrap();
        assert_eq!(counted, serde_json::json!({"op":"presence","room":"r","count":9,"joined":null,"left":null}));
    }

    #[test]
    fn events_frames_are_the_serialized_type() {
        let first = render_event("r", 1, "a", 5, None, r#"{"k": [1, 2]}"#);
        let second = render_event("r\"2", 2, "b", 6, Some("u\"1"), "null");
        let frame = events_frame([first.as_str(), second.as_str()], 0);
        let parsed: Events = serde_json::from_str(&frame).unwrap();
        let raw: Vec<&str> = parsed.events.iter().map(|e| e.get()).collect();
        assert_eq!(raw, [first.as_str(), second.as_str()], "events pass through unchanged");
        assert_eq!(serde_json::to_string(&ServerFrame::Events(parsed)).unwrap(), frame);
        let heads: Vec<EventHead> = raw.iter().map(|e| serde_json::from_str(e).unwrap()).collect();
        assert_eq!(heads, [EventHead { room: "r".into(), seq: 1 }, EventHead { room: "r\"2".into(), seq: 2 }]);
        assert_eq!(events_frame([], 0), serde_json::to_string(&ServerFrame::Events(Events { events: vec![] })).unwrap());
    }
}
