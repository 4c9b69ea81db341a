//! A publish forwarded to a room's writer, the one node that appends to the room: the
//! request on `lg.node.<node>.publish` (an event, or a `PUT` of the room's state) and the
//! writer's answer, both in headers. [`super::bus`] takes the requests sent to this node.

use std::time::Duration;

use super::names::room_token;
use super::Cluster;

/// A publish another node forwarded to this one, the room's writer.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardedPublish {
    pub room: String,
    pub id: String,
    pub data: String,
    pub devices: Option<Vec<String>>,
    /// The publishing connection's user (client publish).
    pub from: Option<String>,
    /// The room's state as of the event.
    pub state: Option<String>,
    /// Not an event but a `PUT` of the room's state (`data`), as of the writer's head.
    pub put_state: bool,
}

/// An event to forward to the room's writer ([`forward_publish`]).
#[derive(Debug, Clone, Copy)]
pub struct ForwardEvent<'a> {
    pub id: &'a str,
    pub data: &'a str,
    pub devices: Option<&'a [String]>,
    pub from: Option<&'a str>,
    pub state: Option<&'a str>,
}

/// The writer's answer to a forwarded publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Appended {
    pub seq: u64,
    pub epoch: String,
    pub duplicate: bool,
}

/// Longest a forwarded publish waits for the answer of a writer in this node's cell.
pub const FORWARD_WAIT: Duration = Duration::from_secs(5);

/// Where a node takes publishes forwarded to it as a room's writer.
pub(super) fn publish_subject(node: &str) -> String {
    format!("lg.node.{}.publish", room_token(node))
}

pub(super) fn decode_forward(message: &async_nats::Message) -> Option<ForwardedPublish> {
    let headers = message.headers.as_ref()?;
    let text = |name: &str| headers.get(name).map(|v| v.as_str().to_string());
    let devices = text("Lg-Devices").map(|d| d.split(',').map(str::to_string).collect());
    // As on the stream: a state rides after the event's JSON, `Lg-State-Len` bytes long.
    let payload = String::from_utf8(message.payload.to_vec()).ok()?;
    let (data, state) = match text("Lg-State-Len") {
        Some(len) => {
            let at = payload.len().checked_sub(len.parse().ok()?)?;
            (payload.get(..at)?.to_string(), Some(payload.get(at..)?.to_string()))
        }
        None => (payload, None),
    };
    let put_state = text("Lg-Put-State").as_deref() == Some("1");
    let id = if put_state { String::new() } else { text("Lg-Id")? };
    Some(ForwardedPublish {
        room: text("Lg-Room")?,
        id,
        data,
        devices,
        from: text("Lg-From"),
        state,
        put_state,
    })
}

/// A forwarded publish this node could not read (not from a livegate node).
#[derive(Debug, thiserror::Error)]
#[error("malformed forwarded publish")]
pub(super) struct MalformedForward;

pub(super) fn encode_answer(
    answer: &Result<Appended, Box<dyn std::error::Error>>,
) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    match answer {
        Ok(published) => {
            headers.insert("Lg-Seq", published.seq.to_string().as_str());
            headers.insert("Lg-Epoch", &*published.epoch);
            headers.insert("Lg-Duplicate", if published.duplicate { "1" } else { "0" });
        }
        Err(error) => {
            headers.insert("Lg-Error", error.to_string().replace(['\r', '\n'], " ").as_str())
        }
    }
    headers
}

/// Why a forwarded publish did not happen on the writer.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The writer could not be reached (gone, or NATS is away): publish here instead.
    #[error("room writer unreachable: {0}")]
    Unreachable(#[from] async_nats::RequestError),
    /// An answer without the named header is no livegate writer's: as unreachable.
    #[error("room writer unreachable: answer without {0}")]
    Malformed(&'static str),
    /// The writer tried and failed.
    #[error("room writer refused: {0}")]
    Refused(#[source] WriterRefusal),
}

/// A room writer's reason for failing a forwarded publish, as it sent it: the error
/// was typed on the writer and crosses NATS as its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WriterRefusal(pub String);

/// Have `writer` publish the event, as the one node that appends to `room`.
/// Waits at most `wait` for the answer.
pub async fn forward_publish(
    cluster: &Cluster,
    writer: &str,
    room: &str,
    event: ForwardEvent<'_>,
    wait: Duration,
) -> Result<Appended, ForwardError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Lg-Room", room);
    headers.insert("Lg-Id", event.id);
    if let Some(from) = event.from {
        headers.insert("Lg-From", from);
    }
    if let Some(devices) = event.devices {
        headers.insert("Lg-Devices", devices.join(",").as_str());
    }
    let payload = match event.state {
        Some(state) => {
            headers.insert("Lg-State-Len", state.len().to_string().as_str());
            [event.data, state].concat()
        }
        None => event.data.to_string(),
    };
    request_writer(cluster, writer, headers, payload, wait).await
}

/// Have `writer` set the room's state as of its head (`PUT /v1/rooms/{room}/state`).
pub async fn forward_put_state(
    cluster: &Cluster,
    writer: &str,
    room: &str,
    data: &str,
    wait: Duration,
) -> Result<Appended, ForwardError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Lg-Room", room);
    headers.insert("Lg-Put-State", "1");
    request_writer(cluster, writer, headers, data.to_string(), wait).await
}

async fn request_writer(
    cluster: &Cluster,
    writer: &str,
    headers: async_nats::HeaderMap,
    payload: String,
    wait: Duration,
) -> Result<Appended, ForwardError> {
    let request =
        async_nats::Request::new().headers(headers).payload(payload.into()).timeout(Some(wait));
    let answer = cluster.client.send_request(publish_subject(writer), request).await?;
    let headers = answer.headers.ok_or(ForwardError::Malformed("headers"))?;
    let text = |name: &str| headers.get(name).map(|v| v.as_str().to_string());
    if let Some(error) = text("Lg-Error") {
        return Err(ForwardError::Refused(WriterRefusal(error)));
    }
    let seq = text("Lg-Seq").and_then(|s| s.parse().ok()).ok_or(ForwardError::Malformed("seq"))?;
    let epoch = text("Lg-Epoch").ok_or(ForwardError::Malformed("epoch"))?;
    Ok(Appended { seq, epoch, duplicate: text("Lg-Duplicate").as_deref() == Some("1") })
}
