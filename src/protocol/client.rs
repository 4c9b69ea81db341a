//! Client frames: a WebSocket text frame parsed into a typed [`ClientRequest`], or a
//! [`FrameError`] that says why not (with the `ref` and the `room`, when they could be read).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::ErrorCode;

/// A request from a client, after parsing. `reference` is the client's `ref`, echoed back.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRequest {
    pub reference: Option<i64>,
    pub op: ClientOp,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ClientOp {
    /// `state`: answer with the room's state and the events after it;
    /// `presence`: the client wants the room's presence frames.
    Subscribe {
        room: String,
        since: Option<u64>,
        epoch: Option<String>,
        state: bool,
        presence: bool,
    },
    Unsubscribe {
        room: String,
    },
    History {
        room: String,
        since: u64,
        limit: Option<usize>,
    },
    /// Client publish; `data` is the JSON text as sent.
    /// `state`: the room's state as of this event (JSON text); `null` or absent: none.
    Publish {
        room: String,
        id: Option<String>,
        data: String,
        state: Option<String>,
    },
    /// Who is in the room now.
    Presence {
        room: String,
    },
    Ping,
}

/// Why a client frame could not be parsed; carries the `ref` and the `room` when they
/// could be read.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameError {
    pub reference: Option<i64>,
    pub room: Option<String>,
    pub code: ErrorCode,
    pub message: String,
}

impl ClientOp {
    /// The room the request names, if it names one.
    pub fn room(&self) -> Option<&str> {
        match self {
            ClientOp::Subscribe { room, .. }
            | ClientOp::Unsubscribe { room }
            | ClientOp::History { room, .. }
            | ClientOp::Publish { room, .. }
            | ClientOp::Presence { room } => Some(room),
            ClientOp::Ping => None,
        }
    }
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
    let fail =
        |reference, code, message: String| FrameError { reference, room: None, code, message };
    let mut fields: Map<String, Value> = serde_json::from_str(text).map_err(|e| {
        fail(None, ErrorCode::BadRequest, format!("frame is not a JSON object: {e}"))
    })?;
    // A frame refused for another field still names its room to the client.
    let room = fields.get("room").and_then(Value::as_str).map(str::to_string);
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
    let bad = |e: serde_json::Error| FrameError {
        room: room.clone(),
        ..fail(reference, ErrorCode::BadRequest, format!("{op}: {e}"))
    };
    let op = match op.as_str() {
        "subscribe" => {
            let f: SubscribeFields = serde_json::from_value(rest).map_err(bad)?;
            ClientOp::Subscribe {
                room: f.room,
                since: f.since,
                epoch: f.epoch,
                state: f.state,
                presence: f.presence,
            }
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
            ClientOp::Publish {
                room: f.room,
                id: f.id,
                data: f.data.get().to_string(),
                state: f.state.map(|s| s.get().to_string()),
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<ClientRequest, (Option<i64>, ErrorCode)>) {
        let got = parse_client_frame(text).map_err(|e| (e.reference, e.code));
        assert_eq!(got, expected, "frame {text}");
    }

    fn req(
        reference: Option<i64>,
        op: ClientOp,
    ) -> Result<ClientRequest, (Option<i64>, ErrorCode)> {
        Ok(ClientRequest { reference, op })
    }

    #[test]
    fn client_frames() {
        let room = || "match:1".to_string();
        check(r#"{"op":"ping"}"#, req(None, ClientOp::Ping));
        check(r#"{"op":"ping","ref":7}"#, req(Some(7), ClientOp::Ping));
        check(
            r#"{"op":"subscribe","room":"match:1"}"#,
            req(
                None,
                ClientOp::Subscribe {
                    room: room(),
                    since: None,
                    epoch: None,
                    state: false,
                    presence: false,
                },
            ),
        );
        check(
            r#"{"op":"subscribe","room":"match:1","since":42,"epoch":"E","ref":1}"#,
            req(
                Some(1),
                ClientOp::Subscribe {
                    room: room(),
                    since: Some(42),
                    epoch: Some("E".into()),
                    state: false,
                    presence: false,
                },
            ),
        );
        check(
            r#"{"op":"subscribe","room":"match:1","state":true}"#,
            req(
                None,
                ClientOp::Subscribe {
                    room: room(),
                    since: None,
                    epoch: None,
                    state: true,
                    presence: false,
                },
            ),
        );
        check(
            r#"{"op":"subscribe","room":"match:1","since":3,"state":false}"#,
            req(
                None,
                ClientOp::Subscribe {
                    room: room(),
                    since: Some(3),
                    epoch: None,
                    state: false,
                    presence: false,
                },
            ),
        );
        check(r#"{"op":"subscribe","room":"r","state":1}"#, Err((None, ErrorCode::BadRequest)));
        check(r#"{"op":"subscribe","room":"r","state":"yes"}"#, Err((None, ErrorCode::BadRequest)));
        check(
            r#"{"op":"subscribe","room":"match:1","presence":true}"#,
            req(
                None,
                ClientOp::Subscribe {
                    room: room(),
                    since: None,
                    epoch: None,
                    state: false,
                    presence: true,
                },
            ),
        );
        check(r#"{"op":"subscribe","room":"r","presence":1}"#, Err((None, ErrorCode::BadRequest)));
        check(
            r#"{"op":"presence","room":"match:1","ref":8}"#,
            req(Some(8), ClientOp::Presence { room: room() }),
        );
        check(r#"{"op":"presence","ref":9}"#, Err((Some(9), ErrorCode::BadRequest)));
        check(
            r#"{"op":"unsubscribe","room":"match:1"}"#,
            req(None, ClientOp::Unsubscribe { room: room() }),
        );
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
                ClientOp::Publish {
                    room: "chat:1".into(),
                    id: Some("c-1".into()),
                    data: r#"{"text": "hi"}"#.into(),
                    state: None,
                },
            ),
        );
        check(
            r#"{"op":"publish","room":"chat:1","data":null}"#,
            req(
                None,
                ClientOp::Publish {
                    room: "chat:1".into(),
                    id: None,
                    data: "null".into(),
                    state: None,
                },
            ),
        );
        let publish = |state: Option<&str>| ClientOp::Publish {
            room: "chat:1".into(),
            id: None,
            data: "1".into(),
            state: state.map(Into::into),
        };
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
            req(
                Some(7),
                ClientOp::Publish {
                    room: "chat:1".into(),
                    id: None,
                    data: r#"{"b":1,"a":18446744073709551616000, "c":1.50}"#.into(),
                    state: None,
                },
            ),
        );
        check(
            r#"{"op":"publish","room":"chat:1","data":1,"data":2}"#,
            Err((None, ErrorCode::BadRequest)),
        );
        check(
            r#"{"op":"publish","room":"chat:1","data":1,"from":"admin"}"#,
            Err((None, ErrorCode::BadRequest)),
        );
    }

    #[test]
    fn refusals_name_the_room_the_frame_named() {
        let room = |text: &str| parse_client_frame(text).err().map(|e| e.room);
        assert_eq!(
            room(r#"{"op":"subscribe","room":"r","since":"x","ref":1}"#),
            Some(Some("r".into()))
        );
        assert_eq!(room(r#"{"op":"history","room":"h","limit":-1}"#), Some(Some("h".into())));
        assert_eq!(room(r#"{"op":"subscribe","room":7}"#), Some(None), "not a room name");
        assert_eq!(room(r#"{"op":"unknown","room":"r"}"#), Some(None));
        let op = |text: &str| parse_client_frame(text).unwrap().op;
        assert_eq!(op(r#"{"op":"presence","room":"p"}"#).room(), Some("p"));
        assert_eq!(op(r#"{"op":"ping"}"#).room(), None);
    }
}
