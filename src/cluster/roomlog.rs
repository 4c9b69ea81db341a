//! A room's log on JetStream. Each event is one message on `lg.room.<room>`: the payload
//! is the event's JSON, headers carry the room seq, the publish time, the devices of an
//! inbox message, the publishing user of a client publish (`Lg-From`) and the event id (`Nats-Msg-Id`, so a retried publish is stored once).
//! An append names the stream sequence of the room's last message
//! (`Nats-Expected-Last-Subject-Sequence`): a writer that missed another node's append is
//! refused, catches up and retries, so the room seq stays contiguous.

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::DirectGetErrorKind;
use async_nats::HeaderMap;

use super::{room_token, Cluster, ClusterError, Unreachable};
use crate::store::EventRecord;

const SEQ_HEADER: &str = "Lg-Seq";
const TS_HEADER: &str = "Lg-Ts";
const DEVICES_HEADER: &str = "Lg-Devices";
const FROM_HEADER: &str = "Lg-From";
const ID_HEADER: &str = "Nats-Msg-Id";
/// Set by the stream's republish on live copies: the message's stream sequence.
const STREAM_SEQ_HEADER: &str = "Nats-Sequence";

/// An event as the stream holds it, with its stream sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    pub stream_seq: u64,
    pub event: EventRecord,
}

/// A room as the stream holds it: its retained events, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedRoom {
    pub epoch: String,
    pub events: Vec<StreamEvent>,
}

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// Another node appended first: catch up and retry.
    #[error("another node appended to the room first")]
    Conflict,
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// What JetStream said to an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub stream_seq: u64,
    /// The id was stored before (within the duplicate window): nothing new was written.
    pub duplicate: bool,
}

pub fn room_subject(room: &str) -> String {
    format!("lg.room.{}", room_token(room))
}

/// Every retained event of `room`.
pub async fn load(cluster: &Cluster, room: &str) -> Result<LoadedRoom, ClusterError> {
    let events = read_after(cluster, room, 0).await?;
    Ok(LoadedRoom { epoch: cluster.epoch().to_string(), events })
}

/// The room's events stored after stream sequence `after`, oldest first.
pub async fn read_after(cluster: &Cluster, room: &str, after: u64) -> Result<Vec<StreamEvent>, ClusterError> {
    let subject = room_subject(room);
    let stream = cluster.rooms_stream();
    let last = match stream.direct_get_last_for_subject(subject.clone()).await {
        Ok(message) => message.sequence,
        Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut events = Vec::new();
    let mut next = after + 1;
    while next <= last {
        let message = match stream.direct_get_next_for_subject(subject.clone(), Some(next)).await {
            Ok(message) => message,
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
            Err(e) => return Err(e.into()),
        };
        next = message.sequence + 1;
        match decode(&message.headers, &message.payload) {
            Some(event) => events.push(StreamEvent { stream_seq: message.sequence, event }),
            None => tracing::warn!(room, stream_seq = message.sequence, "skipping a message that is not a livegate event"),
        }
    }
    Ok(events)
}

/// Append `event` if the room's last stored message is still `expected_last` (0: none).
pub async fn append(cluster: &Cluster, room: &str, expected_last: u64, event: &EventRecord) -> Result<Appended, AppendError> {
    if !cluster.connected() {
        return Err(ClusterError::Unavailable(Unreachable::NotConnected).into());
    }
    let mut headers = HeaderMap::new();
    headers.insert(ID_HEADER, event.id.as_str());
    headers.insert("Nats-Expected-Last-Subject-Sequence", expected_last.to_string().as_str());
    headers.insert(SEQ_HEADER, event.seq.to_string().as_str());
    headers.insert(TS_HEADER, event.ts_ms.to_string().as_str());
    if let Some(devices) = &event.devices {
        headers.insert(DEVICES_HEADER, devices.join(",").as_str());
    }
    if let Some(from) = &event.from {
        headers.insert(FROM_HEADER, from.as_str());
    }
    let sent = cluster.js.publish_with_headers(room_subject(room), headers, event.data.clone().into()).await;
    let ack = match sent {
        Ok(future) => future.await,
        Err(e) => return Err(ClusterError::from(e).into()),
    };
    match ack {
        Ok(ack) => Ok(Appended { stream_seq: ack.sequence, duplicate: ack.duplicate }),
        Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Err(AppendError::Conflict),
        Err(e) => Err(ClusterError::from(e).into()),
    }
}

/// Delete a room's stored events except the newest, which keeps the room's head (used
/// once every event is older than the history TTL).
pub async fn purge_expired(cluster: &Cluster, room: &str) -> Result<(), ClusterError> {
    cluster.rooms_stream().purge().filter(room_subject(room)).keep(1).await?;
    Ok(())
}

/// Delete a room's stored events but the newest `keep` (a room whose namespace keeps
/// fewer events than the stream's per-room limit).
pub async fn purge_beyond(cluster: &Cluster, room: &str, keep: u64) -> Result<(), ClusterError> {
    cluster.rooms_stream().purge().filter(room_subject(room)).keep(keep.max(1)).await?;
    Ok(())
}

/// A live copy from `lg.live.<room>`: the room and its event, or `None` for anything else.
pub fn decode_live(subject: &str, headers: Option<&HeaderMap>, payload: &[u8]) -> Option<(String, StreamEvent)> {
    let room = super::room_from_token(subject.strip_prefix("lg.live.")?)?;
    let headers = headers?;
    let stream_seq = headers.get(STREAM_SEQ_HEADER)?.as_str().parse().ok()?;
    Some((room, StreamEvent { stream_seq, event: decode(headers, payload)? }))
}

fn decode(headers: &HeaderMap, payload: &[u8]) -> Option<EventRecord> {
    let text = |name: &str| headers.get(name).map(|v| v.as_str().to_string());
    let devices = text(DEVICES_HEADER).map(|d| d.split(',').map(str::to_string).collect());
    Some(EventRecord {
        seq: text(SEQ_HEADER)?.parse().ok()?,
        id: text(ID_HEADER)?,
        ts_ms: text(TS_HEADER)?.parse().ok()?,
        data: String::from_utf8(payload.to_vec()).ok()?,
        devices,
        from: text(FROM_HEADER),
    })
}
