//! Server frames: one type per frame the server sends, serialized by the server and
//! deserialized by the terminal client (`client::subscriber`), so each frame has one
//! definition, and the renderers of each frame (the rendered event among them). A client
//! reads the [`FrameHead`] first and then the frame its `op` names. Text fields are `Cow`:
//! borrowed when the server renders, and when a client reads text without escapes.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{join_events, json_str, ErrorCode};
use crate::core::delivery::presence::{Diff, Member, View};

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
    /// A room's members (the `presence` reply) or who joined and left.
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
    /// token, until `resume_expires_at_ms`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_expires_at_ms: Option<u64>,
    /// What the protocol offers beyond v1's subscribe and history ([`FEATURES`]): a client
    /// decides by this list, never by an error's text. Absent from servers before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// The optional parts of the protocol this server has, named in every `welcome`: room
/// state (`subscribe` with `state`), presence (`presence` on subscribe, the `presence` op)
/// and client publish (the `publish` op).
pub const FEATURES: &[&str] = &["presence", "publish", "state"];

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
    /// The room the refused request named (subscribe, unsubscribe, history, presence,
    /// publish), so a client never reads it out of `message`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub room: Option<Cow<'a, str>>,
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

pub(super) fn members_json<'a>(
    members: Option<impl IntoIterator<Item = &'a Member>>,
) -> Option<Vec<MemberJson<'a>>> {
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
    render(&ServerFrame::PresenceReply(PresenceReply {
        room: room.into(),
        count: view.count,
        members,
        reference,
    }))
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
    serde_json::to_string(&CloseNotice { code, reason: reason.into() })
        .expect("close notices always serialise")
}

/// A server frame as JSON text. Through a `Value`, whose map sorts the keys: the bytes
/// livegate has always sent (key order is not part of the protocol).
fn render(frame: &ServerFrame) -> String {
    serde_json::to_value(frame).expect("server frames always serialise").to_string()
}

/// One event as it appears in `events` frames and history replies. `data` is JSON text.
/// `from`: the user whose connection published it (client publish), set by the server
/// and outside `data`, so nothing a client writes can pose as it.
pub fn render_event(
    room: &str,
    seq: u64,
    id: &str,
    ts_ms: u64,
    from: Option<&str>,
    data: &str,
) -> String {
    let from = from.map(|user| format!(r#""from":{},"#, json_str(user))).unwrap_or_default();
    format!(
        r#"{{"room":{},"seq":{seq},"id":{},"ts_ms":{ts_ms},{from}"data":{data}}}"#,
        json_str(room),
        json_str(id)
    )
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
pub fn welcome_frame(
    session: &str,
    node: &str,
    heartbeat_ms: u64,
    warmup: bool,
    resume: Option<(&str, u64)>,
) -> String {
    render(&ServerFrame::Welcome(Welcome {
        session: session.into(),
        node: node.into(),
        heartbeat_ms,
        warmup,
        resume: resume.map(|(credential, _)| credential.into()),
        resume_expires_at_ms: resume.map(|(_, expires)| expires),
        features: FEATURES.iter().map(|feature| (*feature).to_string()).collect(),
    }))
}

pub fn subscribed_frame(
    room: &str,
    epoch: &str,
    seq: u64,
    recovered: Option<bool>,
    reference: Option<i64>,
) -> String {
    render(&ServerFrame::Subscribed(Subscribed {
        room: room.into(),
        epoch: epoch.into(),
        seq,
        recovered,
        reference,
        state: None,
    }))
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
    render(&ServerFrame::Subscribed(Subscribed {
        room: room.into(),
        epoch: epoch.into(),
        seq,
        recovered,
        reference,
        state,
    }))
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

/// An `error` frame; `room`: the room the refused request named, if it named one.
pub fn error_frame(
    reference: Option<i64>,
    room: Option<&str>,
    code: ErrorCode,
    message: &str,
) -> String {
    let (code, message, room) = (code.as_str().into(), message.into(), room.map(Into::into));
    render(&ServerFrame::Error(ErrorFrame {
        reference,
        code,
        message,
        room,
        node: None,
        url: None,
    }))
}

/// The `error` frame a WebSocket gets before its close 4421: where its session is served.
pub fn wrong_node_frame(message: &str, node: &str, url: &str) -> String {
    let code = ErrorCode::WrongNode.as_str().into();
    render(&ServerFrame::Error(ErrorFrame {
        reference: None,
        code,
        message: message.into(),
        room: None,
        node: Some(node.into()),
        url: Some(url.into()),
    }))
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

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::protocol::{history_body, presence_body, state_body};

    #[test]
    fn server_frames_are_valid_json() {
        let event = render_event("r\"1", 3, "id\n", 5, None, r#"{"k":[1,2]}"#);
        let frame = events_frame([event.as_str(), event.as_str()], 0);
        let parsed: Value = serde_json::from_str(&frame).unwrap();
        assert_eq!(parsed["events"][1]["room"], "r\"1");
        assert_eq!(parsed["events"][0]["data"]["k"][1], 2);
        let history: Value =
            serde_json::from_str(&history_frame("r", None, 0, [], true, Some(2))).unwrap();
        assert_eq!(
            (history["epoch"].clone(), history["ref"].clone()),
            (Value::Null, Value::from(2))
        );
        let sub: Value =
            serde_json::from_str(&subscribed_frame("r", "E", 4, Some(false), None)).unwrap();
        assert_eq!(sub["recovered"], false);
        let body: Value =
            serde_json::from_str(&history_body("r", Some("E"), 1, [event.as_str()])).unwrap();
        assert_eq!(body["events"][0]["seq"], 3);
        assert_eq!(parsed["events"][0].get("from"), None, "a backend's event names no user");
        let from: Value =
            serde_json::from_str(&render_event("r", 1, "a", 5, Some("u\"1"), r#"{"from":"x"}"#))
                .unwrap();
        assert_eq!(
            (from["from"].clone(), from["data"]["from"].clone()),
            (Value::from("u\"1"), Value::from("x"))
        );
        let published: Value =
            serde_json::from_str(&published_frame("r", 9, true, Some(4))).unwrap();
        assert_eq!(
            published,
            serde_json::json!({"op":"published","room":"r","seq":9,"duplicate":true,"ref":4})
        );
    }

    #[test]
    fn server_frames_keep_their_bytes() {
        let cases = [
            (
                welcome_frame("s1", "n1", 30_000, false, None),
                r#"{"features":["presence","publish","state"],"heartbeat_ms":30000,"node":"n1","op":"welcome","session":"s1","warmup":false}"#,
            ),
            (
                welcome_frame("s1", "n1", 30_000, false, Some(("R", 7))),
                r#"{"features":["presence","publish","state"],"heartbeat_ms":30000,"node":"n1","op":"welcome","resume":"R","resume_expires_at_ms":7,"session":"s1","warmup":false}"#,
            ),
            (
                subscribed_frame("r", "E", 4, Some(true), Some(2)),
                r#"{"epoch":"E","op":"subscribed","recovered":true,"ref":2,"room":"r","seq":4}"#,
            ),
            (
                subscribed_frame("r", "E", 0, None, None),
                r#"{"epoch":"E","op":"subscribed","room":"r","seq":0}"#,
            ),
            (
                subscribed_state_frame("r", "E", 9, None, Some(1), Some((7, r#"{"b":1,"a":[2]}"#))),
                r#"{"epoch":"E","op":"subscribed","ref":1,"room":"r","seq":9,"state":{"data":{"a":[2],"b":1},"seq":7}}"#,
            ),
            (
                subscribed_state_frame("r", "E", 9, Some(false), None, None),
                r#"{"epoch":"E","op":"subscribed","recovered":false,"room":"r","seq":9,"state":null}"#,
            ),
            (
                state_body("r\"", Some("E"), 7, Some(r#"{"a":1}"#)),
                r#"{"room":"r\"","epoch":"E","seq":7,"data":{"a":1}}"#,
            ),
            (state_body("r", None, 0, None), r#"{"room":"r","epoch":null,"seq":0,"data":null}"#),
            (inbox_notice_frame("inbox:u"), r#"{"op":"subscribed","room":"inbox:u"}"#),
            (unsubscribed_frame("r", Some(3)), r#"{"op":"unsubscribed","ref":3,"room":"r"}"#),
            (pong_frame(None), r#"{"op":"pong"}"#),
            (
                close_event(1012, "service restart: reconnect in 5 ms"),
                r#"{"code":1012,"reason":"service restart: reconnect in 5 ms"}"#,
            ),
            (
                error_frame(Some(5), None, ErrorCode::BadRoom, "bad \"x\""),
                r#"{"code":"bad_room","message":"bad \"x\"","op":"error","ref":5}"#,
            ),
            (
                error_frame(Some(6), Some("a:b"), ErrorCode::Forbidden, "no"),
                r#"{"code":"forbidden","message":"no","op":"error","ref":6,"room":"a:b"}"#,
            ),
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
        let features = FEATURES.iter().map(|feature| (*feature).to_string()).collect();
        let expected = Welcome {
            session: "s1".into(),
            node: "n1".into(),
            heartbeat_ms: 30_000,
            warmup: true,
            resume: None,
            resume_expires_at_ms: None,
            features,
        };
        assert_eq!(welcome, expected);
        // A welcome from a server before `features` reads as one without them.
        let old: Welcome =
            serde_json::from_str(r#"{"op":"welcome","session":"s","node":"n","heartbeat_ms":1}"#)
                .unwrap();
        assert!(old.features.is_empty());

        let text = subscribed_frame("r", "E", 4, Some(false), Some(2));
        assert_eq!(head(&text), FrameHead { op: ServerOp::Subscribed, reference: Some(2) });
        let reply: Subscribed = serde_json::from_str(&text).unwrap();
        assert_eq!(
            reply,
            Subscribed {
                room: "r".into(),
                epoch: "E".into(),
                seq: 4,
                recovered: Some(false),
                reference: Some(2),
                state: None
            }
        );
        for state in [Some((3, r#"{"x":1}"#)), None] {
            let text = subscribed_state_frame("r", "E", 4, None, None, state);
            let reply: Subscribed = serde_json::from_str(&text).unwrap();
            let got: Value =
                serde_json::from_str(reply.state.expect("a null state is there too").0.get())
                    .unwrap();
            assert_eq!(got, serde_json::from_str::<Value>(&state_json(state)).unwrap(), "{text}");
        }
        let text = inbox_notice_frame("inbox:u");
        assert_eq!(head(&text), FrameHead { op: ServerOp::Subscribed, reference: None });
        assert_eq!(serde_json::from_str::<InboxNotice>(&text).unwrap().room, "inbox:u");
        assert!(serde_json::from_str::<Subscribed>(&text).is_err(), "a notice is not a reply");

        let text = unsubscribed_frame("r", Some(3));
        assert_eq!(head(&text).op, ServerOp::Unsubscribed);
        assert_eq!(
            serde_json::from_str::<Unsubscribed>(&text).unwrap(),
            Unsubscribed { room: "r".into(), reference: Some(3) }
        );
        assert_eq!(
            head(&pong_frame(Some(1))),
            FrameHead { op: ServerOp::Pong, reference: Some(1) }
        );

        let text = error_frame(Some(5), None, ErrorCode::BadRoom, "bad \"x\"\n");
        assert_eq!(head(&text), FrameHead { op: ServerOp::Error, reference: Some(5) });
        let error: ErrorFrame = serde_json::from_str(&text).unwrap();
        assert_eq!((error.code.as_ref(), error.message.as_ref()), ("bad_room", "bad \"x\"\n"));

        assert_eq!(
            head(&history_frame("r", None, 0, [], true, Some(2))),
            FrameHead { op: ServerOp::History, reference: Some(2) }
        );
        assert_eq!(head(r#"{"op":"later","ref":1}"#).op, ServerOp::Unknown);
        assert!(serde_json::from_str::<FrameHead>(r#"{"ref":1}"#).is_err());
    }

    #[test]
    fn presence_frames() {
        let (a, b) = (Member::new("ann", "web"), Member::new("bob", "phone"));
        let view = View { count: 2, members: Some([a.clone(), b.clone()].into_iter().collect()) };
        let reply: Value =
            serde_json::from_str(&presence_reply_frame("r", &view, Some(3))).unwrap();
        let want = serde_json::json!({"op":"presence","room":"r","count":2,"ref":3,
            "members":[{"user":"ann","device":"web"},{"user":"bob","device":"phone"}]});
        assert_eq!(reply, want);
        let body: Value =
            serde_json::from_str(&presence_body("r", &View { count: 5000, members: None }))
                .unwrap();
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
        let counted: Value = serde_json::from_str(&presence_frame(
            "r",
            &Diff { count: 9, joined: None, left: None },
        ))
        .unwrap();
        assert_eq!(
            counted,
            serde_json::json!({"op":"presence","room":"r","count":9,"joined":null,"left":null})
        );
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
        assert_eq!(
            heads,
            [EventHead { room: "r".into(), seq: 1 }, EventHead { room: "r\"2".into(), seq: 2 }]
        );
        assert_eq!(
            events_frame([], 0),
            serde_json::to_string(&ServerFrame::Events(Events { events: vec![] })).unwrap()
        );
    }
}
