//! The bodies of the public HTTP API (`/v1/tokens`, `/v1/rooms/*`, `/v1/users/*`,
//! `/v1/route`): requests parsed into types, replies serialised or rendered from
//! already-rendered events, and the error body every HTTP error answer has.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::server::{members_json, PresenceReply};
use super::{join_events, json_str, ErrorCode};
use crate::core::delivery::presence::View;

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
    /// Room patterns the connection may publish to; none by default.
    #[serde(default)]
    pub publish: Vec<String>,
    /// The user's home cell, one of the configured `cells`; none: the rendezvous choice.
    #[serde(default)]
    pub cell: Option<String>,
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
    /// The room's state as of this event; `null` or absent: none.
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

/// `GET /v1/route`
#[derive(Debug, Serialize)]
pub struct RouteReply {
    pub node: String,
    pub url: String,
    /// The node's cell.
    pub cell: String,
    /// The user's home cell (empty: none configured); `cell` differs while the home has
    /// no node that may serve.
    pub home: String,
    /// Asked for (`nodes=true`) with the API key: every node this one knows, with its load and headroom
    /// (what placement weighed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<RouteNode>>,
}

/// A node in `GET /v1/route`'s answer.
#[derive(Debug, Serialize)]
pub struct RouteNode {
    pub node: String,
    pub cell: String,
    /// `ready`, `draining` or `down` (this node: its own phase).
    pub phase: &'static str,
    #[serde(flatten)]
    pub load: crate::protocol::admin::NodeLoadView,
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

/// The body of `GET /v1/rooms/{room}/presence`.
pub fn presence_body(room: &str, view: &View) -> String {
    let members = members_json(view.members.as_ref());
    serde_json::to_value(PresenceReply {
        room: room.into(),
        count: view.count,
        members,
        reference: None,
    })
    .expect("presence answers always serialise")
    .to_string()
}

/// The body of `GET /v1/rooms/{room}/events`; `events` are rendered events.
pub fn history_body<'a>(
    room: &str,
    epoch: Option<&str>,
    head: u64,
    events: impl IntoIterator<Item = &'a str>,
) -> String {
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

/// `{"error":{"code","message"}}`, with `"room"` when the refused request named one.
pub fn error_body(code: ErrorCode, message: &str, room: Option<&str>) -> String {
    let mut error = serde_json::json!({"code": code.as_str(), "message": message});
    if let Some(room) = room {
        error["room"] = room.into();
    }
    serde_json::json!({ "error": error }).to_string()
}

/// `{"error":{"code":"wrong_node","message","node","url"}}`: the HTTP answer (421) to a
/// handshake on a node that does not serve its session.
pub fn wrong_node_body(message: &str, node: &str, url: &str) -> String {
    let code = ErrorCode::WrongNode.as_str();
    serde_json::json!({"error": {"code": code, "message": message, "node": node, "url": url}})
        .to_string()
}

pub fn parse_token_request(body: &[u8]) -> Result<TokenRequest, serde_json::Error> {
    serde_json::from_slice(body)
}

pub fn parse_publish_request(body: &[u8]) -> Result<PublishRequest, serde_json::Error> {
    serde_json::from_slice(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::to_json;

    #[test]
    fn state_bodies() {
        let state = |body: &str| {
            parse_publish_request(body.as_bytes())
                .map(|r| r.state.map(|s| s.get().to_string()))
                .map_err(|e| e.to_string())
        };
        assert_eq!(state(r#"{"data":1}"#), Ok(None));
        assert_eq!(state(r#"{"data":1,"state":null}"#), Ok(None));
        assert_eq!(
            state(r#"{"data":1,"state":{"last_id":"e-1"}}"#),
            Ok(Some(r#"{"last_id":"e-1"}"#.into()))
        );
        let put = |body: &str| {
            parse_put_state_request(body.as_bytes())
                .map(|r| r.data.get().to_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(put(r#"{"data":{"a":1}}"#), Ok(r#"{"a":1}"#.into()));
        assert_eq!(put(r#"{"data":null}"#), Ok("null".into()));
        assert!(put(r#"{}"#).is_err(), "data is required");
        assert!(put(r#"{"data":1,"seq":2}"#).is_err(), "unknown fields are refused");
        assert!(
            parse_user_message_request(br#"{"data":1,"state":{}}"#).is_err(),
            "an inbox has no state"
        );
        assert_eq!(
            to_json(&PutStateReply { room: "r".into(), epoch: "E".into(), seq: 3 }),
            r#"{"room":"r","epoch":"E","seq":3}"#
        );
    }
}
