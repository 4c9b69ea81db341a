//! A room's log on JetStream. Each event is one message on `lg.room.<room>`: the payload
//! is the event's JSON, headers carry the room seq, the publish time, the devices of an
//! inbox message, the publishing user of a client publish (`Lg-From`) and the event's
//! idempotency key (`Lg-Key`: the id, a client's behind its user and a space,
//! `core::rules::names::idempotency_key`, so it never takes a backend's). JetStream's
//! deduplication key (`Nats-Msg-Id`) is the room's token and that key, so a retried
//! publish is stored once and an id used in another room is that room's own.
//!
//! Room state: an event published with the room's state carries it in the
//! same message, so the two are stored atomically: header `Lg-State-Len` names the
//! state's length in bytes and the payload is the event's JSON followed by the state's.
//! The room's writer then stores the state as the room's latest-state record on the
//! `LG_STATE` stream (subject `lg.state.<room>`, one message per subject, header
//! `Lg-Seq`), which outlives the history's trimming; a `PUT` of the state writes only
//! that record. A crash between the event and the record leaves the state in the event:
//! loading takes the newer of the record and the newest event that carries a state.
//! `LG_STATE` republishes to `lg.livestate.<room>`, so other nodes' rooms learn a `PUT`.
//!
//! Every read here is answered by the stream's leader (JetStream's `STREAM.MSG.GET`),
//! never a direct get: with replicas, a direct get may be answered by a follower that has
//! not applied the newest appends yet, and a room that loaded from one would start behind
//! its own clients (a client that saw seq 379 told `subscribed` at 376, then sent 377–379
//! again). What a room knows comes from the one server that ordered it.
//!
//! An append names the stream sequence of the room's last message
//! (`Nats-Expected-Last-Subject-Sequence`): a writer that missed another node's append is
//! refused, catches up and retries, so the room seq stays contiguous.
//!
//! Interest-based fan-out: a node takes a room's live copies only while it watches the
//! room ([`watch`]: one subscription to `lg.live.<room>`, one to `lg.livestate.<room>`),
//! so NATS routes each event only to the nodes that asked for its room.

use std::pin::Pin;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::HeaderMap;
use futures_util::{Stream, StreamExt};

use super::cells::RoomPlace;
use super::errors::{ClusterError, Unreachable};
use super::names::{room_token, ROOMS_STREAM};
use super::setup::last_message;
use super::{Cluster, REQUEST_TIMEOUT};
use crate::core::rules::names;
use crate::store::EventRecord;

const SEQ_HEADER: &str = "Lg-Seq";
const TS_HEADER: &str = "Lg-Ts";
const DEVICES_HEADER: &str = "Lg-Devices";
const FROM_HEADER: &str = "Lg-From";
const STATE_LEN_HEADER: &str = "Lg-State-Len";
/// The event's idempotency key ([`names::idempotency_key`]).
const KEY_HEADER: &str = "Lg-Key";
/// JetStream's deduplication key ([`dedup_id`]); events stored before `Lg-Key` existed
/// carry their idempotency key here alone.
const DEDUP_HEADER: &str = "Nats-Msg-Id";
/// Set by the stream's republish on live copies: the message's stream sequence.
const STREAM_SEQ_HEADER: &str = "Nats-Sequence";

/// An event as the stream holds it, with its stream sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    pub stream_seq: u64,
    pub event: EventRecord,
    /// The room's state as of this event, when it was published with one.
    pub state: Option<String>,
}

/// A room's state as of its event `seq` (JSON text).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredState {
    pub seq: u64,
    pub data: String,
}

/// A room as the stream holds it: its retained events, oldest first, and its latest
/// state (the newer of the latest-state record and the events' states).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedRoom {
    pub epoch: String,
    pub events: Vec<StreamEvent>,
    pub state: Option<StoredState>,
    /// The latest-state record's sequence on `LG_STATE` (0: none): live copies of the
    /// record at or below it are old news.
    pub state_version: u64,
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

/// Every retained event of `room` (with cell domains, from its home cell's stream: a
/// room homed in another cell is read through that cell's domain).
pub async fn load(cluster: &Cluster, room: &str) -> Result<LoadedRoom, ClusterError> {
    let epoch = cluster.room_epoch(room).await?;
    let events = read_after(cluster, room, 0).await?;
    let record = load_state(cluster, room).await?;
    let state_version = record.as_ref().map_or(0, |(_, version)| *version);
    let in_events = events
        .iter()
        .rev()
        .find_map(|e| Some(StoredState { seq: e.event.seq, data: e.state.clone()? }));
    let state = newer(record.map(|(state, _)| state), in_events);
    Ok(LoadedRoom { epoch, events, state, state_version })
}

/// With cell domains, refuse a write to a room homed in another cell: only that cell's
/// writer writes it (a publish here is forwarded there, or refused).
fn homed_here(cluster: &Cluster, room: &str) -> Result<(), ClusterError> {
    match cluster.room_home(room).filter(|home| Some(home.as_str()) != cluster.own_cell()) {
        Some(home) => Err(ClusterError::NotHome { room: room.to_string(), home }),
        None => Ok(()),
    }
}

/// The newer of two states (by seq; the record when both name the same seq).
fn newer(record: Option<StoredState>, in_events: Option<StoredState>) -> Option<StoredState> {
    match (record, in_events) {
        (Some(r), Some(e)) => Some(if e.seq > r.seq { e } else { r }),
        (r, e) => r.or(e),
    }
}

/// The room's latest-state record, if it has one, with its sequence on `LG_STATE`.
pub async fn load_state(
    cluster: &Cluster,
    room: &str,
) -> Result<Option<(StoredState, u64)>, ClusterError> {
    let message = read_home(cluster, room, |place| async move {
        last_message(&place.states, &place.state_subject).await
    })
    .await?;
    Ok(message.and_then(|m| Some((decode_state(&m.headers, &m.payload)?, m.sequence))))
}

/// Store the room's latest-state record (the writer, after the event that carries it,
/// or for a `PUT`); yields its sequence on `LG_STATE`.
pub async fn write_state(
    cluster: &Cluster,
    room: &str,
    state: &StoredState,
) -> Result<u64, ClusterError> {
    if !cluster.connected() {
        return Err(ClusterError::Unavailable(Unreachable::NotConnected));
    }
    homed_here(cluster, room)?;
    let mut headers = HeaderMap::new();
    headers.insert(SEQ_HEADER, state.seq.to_string().as_str());
    let sent = cluster
        .js
        .publish_with_headers(
            cluster.room_place(room, false).state_write_subject,
            headers,
            state.data.clone().into(),
        )
        .await?;
    Ok(sent.await?.sequence)
}

/// A live copy from `lg.livestate.<room>` ([`watch`] knows the room): its latest state
/// and the record's sequence on `LG_STATE` (which orders the records).
fn decode_live_state(headers: Option<&HeaderMap>, payload: &[u8]) -> Option<(StoredState, u64)> {
    let headers = headers?;
    let version = headers.get(STREAM_SEQ_HEADER)?.as_str().parse().ok()?;
    Some((decode_state(headers, payload)?, version))
}

fn decode_state(headers: &HeaderMap, payload: &[u8]) -> Option<StoredState> {
    let seq = headers.get(SEQ_HEADER)?.as_str().parse().ok()?;
    Some(StoredState { seq, data: String::from_utf8(payload.to_vec()).ok()? })
}

/// The room's events stored after stream sequence `after`, oldest first. A room homed in
/// another cell that does not answer is read from this cell's mirror, which keeps the
/// origin's stream sequences (up to what it received).
pub async fn read_after(
    cluster: &Cluster,
    room: &str,
    after: u64,
) -> Result<Vec<StreamEvent>, ClusterError> {
    read_home(cluster, room, |place| async move { read_after_in(&place, room, after).await }).await
}

/// `read` of `room` where [`Cluster::read_place`] says; a home cell elsewhere that does
/// not answer is marked silent and `read` runs again on this cell's mirror of it.
async fn read_home<T, F, Fut>(cluster: &Cluster, room: &str, read: F) -> Result<T, ClusterError>
where
    F: Fn(RoomPlace) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClusterError>>,
{
    let place = cluster.read_place(room);
    let mirrored = place.mirror;
    if mirrored {
        tracing::debug!(room, "home cell marked silent: reading this cell's mirror of it");
    }
    match read(place).await {
        Err(ClusterError::Unavailable(error)) if !mirrored && cluster.home_silent(room) => {
            tracing::debug!(room, %error, "home cell did not answer a read: reading this cell's mirror of it");
            read(cluster.room_place(room, true)).await
        }
        result => result,
    }
}

async fn read_after_in(
    place: &RoomPlace,
    room: &str,
    after: u64,
) -> Result<Vec<StreamEvent>, ClusterError> {
    let (subject, stream) = (&place.room_subject, &place.rooms);
    let Some(last) = last_message(stream, subject).await?.map(|m| m.sequence) else {
        return Ok(Vec::new());
    };
    let mut events = Vec::new();
    let mut next = after + 1;
    while next <= last {
        let message = match stream.get_first_raw_message_by_subject(subject, next).await {
            Ok(message) => message,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => break,
            Err(e) => return Err(e.into()),
        };
        next = message.sequence + 1;
        match decode(&message.headers, &message.payload) {
            Some((event, state)) => {
                events.push(StreamEvent { stream_seq: message.sequence, event, state })
            }
            None => tracing::warn!(
                room,
                stream_seq = message.sequence,
                "skipping a message that is not a livegate event"
            ),
        }
    }
    Ok(events)
}

/// Append `event` (with the room's `state` as of it, in the same message) if the room's
/// last stored message is still `expected_last` (0: none).
pub async fn append(
    cluster: &Cluster,
    room: &str,
    expected_last: u64,
    event: &EventRecord,
    state: Option<&str>,
) -> Result<Appended, AppendError> {
    if !cluster.connected() {
        return Err(ClusterError::Unavailable(Unreachable::NotConnected).into());
    }
    homed_here(cluster, room)?;
    let mut headers = HeaderMap::new();
    let key = names::idempotency_key(&event.id, event.from.as_deref());
    headers.insert(DEDUP_HEADER, dedup_id(room, &key).as_str());
    headers.insert(KEY_HEADER, key.as_str());
    headers.insert("Nats-Expected-Last-Subject-Sequence", expected_last.to_string().as_str());
    headers.insert(SEQ_HEADER, event.seq.to_string().as_str());
    headers.insert(TS_HEADER, event.ts_ms.to_string().as_str());
    if let Some(devices) = &event.devices {
        headers.insert(DEVICES_HEADER, devices.join(",").as_str());
    }
    if let Some(from) = &event.from {
        headers.insert(FROM_HEADER, from.as_str());
    }
    let payload = match state {
        Some(state) => {
            headers.insert(STATE_LEN_HEADER, state.len().to_string().as_str());
            [event.data.as_bytes(), state.as_bytes()].concat()
        }
        None => event.data.clone().into_bytes(),
    };
    let place = cluster.room_place(room, false);
    let sent =
        cluster.js.publish_with_headers(place.room_write_subject, headers, payload.into()).await;
    let ack = match sent {
        Ok(future) => future.await,
        Err(e) => return Err(ClusterError::from(e).into()),
    };
    match ack {
        Ok(ack) => {
            if place.live_stream == ROOMS_STREAM {
                cluster.appended_own(ack.sequence);
            }
            Ok(Appended { stream_seq: ack.sequence, duplicate: ack.duplicate })
        }
        Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Err(AppendError::Conflict),
        Err(e) => Err(ClusterError::from(e).into()),
    }
}

/// JetStream's deduplication key of an event: its idempotency key within its room.
/// JetStream remembers ids per stream, and one stream holds every room, so the room is
/// part of it: an id used again in another room is a new event there.
fn dedup_id(room: &str, key: &str) -> String {
    format!("{} {key}", room_token(room))
}

/// Delete a room's stored events except the newest, which keeps the room's head (used
/// once every event is older than the history TTL).
pub async fn purge_expired(cluster: &Cluster, room: &str) -> Result<(), ClusterError> {
    if homed_here(cluster, room).is_err() {
        return Ok(()); // The home cell's nodes trim it.
    }
    let place = cluster.room_place(room, false);
    place.rooms.purge().filter(place.room_subject).keep(1).await?;
    Ok(())
}

/// Delete a room's stored events but the newest `keep` (a room whose namespace keeps
/// fewer events than the stream's per-room limit).
pub async fn purge_beyond(cluster: &Cluster, room: &str, keep: u64) -> Result<(), ClusterError> {
    if homed_here(cluster, room).is_err() {
        return Ok(()); // The home cell's nodes trim it.
    }
    let place = cluster.room_place(room, false);
    place.rooms.purge().filter(place.room_subject).keep(keep.max(1)).await?;
    Ok(())
}

/// What a room's live subjects carry.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveItem {
    /// An event the rooms stream stored.
    Event(StreamEvent),
    /// A latest-state record the state stream stored, with its sequence there.
    State(StoredState, u64),
}

/// A room's live copies, for as long as it is held: dropping it unsubscribes.
pub type LiveFeed = Pin<Box<dyn Stream<Item = LiveItem> + Send>>;

/// Subscribe to `room`'s live events (and its latest-state records with `states`). The
/// server has the subscriptions when this returns (the connection is flushed), so every
/// message stored after that reaches the feed; what came before is the caller's to read.
/// Copies that do not decode are dropped (logged at debug).
pub async fn watch(cluster: &Cluster, room: &str, states: bool) -> Result<LiveFeed, ClusterError> {
    let token = room_token(room);
    let place = cluster.room_place(room, false);
    let (events_from, states_from) = (place.live_stream, place.live_state_stream);
    let events = cluster.client.subscribe(format!("lg.live.{token}")).await?.filter_map(move |message| {
        let event = from_stream(message.headers.as_ref(), &events_from)
            .then(|| decode_live(message.headers.as_ref(), &message.payload).map(LiveItem::Event))
            .flatten();
        if event.is_none() {
            tracing::debug!(subject = %message.subject, "ignoring a live message that is not a livegate event of the room's home");
        }
        std::future::ready(event)
    });
    let feed: LiveFeed = if states {
        let records = cluster.client.subscribe(format!("lg.livestate.{token}")).await?.filter_map(
            move |message| {
                let record = from_stream(message.headers.as_ref(), &states_from)
                    .then(|| decode_live_state(message.headers.as_ref(), &message.payload))
                    .flatten();
                std::future::ready(record.map(|(state, version)| LiveItem::State(state, version)))
            },
        );
        Box::pin(futures_util::stream::select(events, records))
    } else {
        Box::pin(events)
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, cluster.client.flush()).await {
        Ok(Ok(())) => Ok(feed),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(ClusterError::Unavailable(Unreachable::NotConnected)),
    }
}

/// A live copy was republished by `stream` (JetStream names it in `Nats-Stream`): a copy
/// from another stream is an old origin's, fenced by a promotion (see [`super::promotion`]).
fn from_stream(headers: Option<&HeaderMap>, stream: &str) -> bool {
    headers.and_then(|h| h.get("Nats-Stream")).is_some_and(|name| name.as_str() == stream)
}

/// The room seq of `room`'s newest stored event (`None`: the stream holds none).
pub async fn last_seq(cluster: &Cluster, room: &str) -> Result<Option<u64>, ClusterError> {
    let message = read_home(cluster, room, |place| async move {
        last_message(&place.rooms, &place.room_subject).await
    })
    .await?;
    Ok(message.and_then(|m| m.headers.get(SEQ_HEADER)?.as_str().parse().ok()))
}

/// A live copy from `lg.live.<room>` ([`watch`] knows the room): its event, or `None`
/// for anything else.
fn decode_live(headers: Option<&HeaderMap>, payload: &[u8]) -> Option<StreamEvent> {
    let headers = headers?;
    let stream_seq = headers.get(STREAM_SEQ_HEADER)?.as_str().parse().ok()?;
    let (event, state) = decode(headers, payload)?;
    Some(StreamEvent { stream_seq, event, state })
}

/// An event message: the event, and the state its payload carries after the event's JSON.
fn decode(headers: &HeaderMap, payload: &[u8]) -> Option<(EventRecord, Option<String>)> {
    let text = |name: &str| headers.get(name).map(|v| v.as_str().to_string());
    let devices = text(DEVICES_HEADER).map(|d| d.split(',').map(str::to_string).collect());
    let (data, state) = split_state(text(STATE_LEN_HEADER).as_deref(), payload)?;
    let from = text(FROM_HEADER);
    let event = EventRecord {
        seq: text(SEQ_HEADER)?.parse().ok()?,
        id: names::id_of_key(&text(KEY_HEADER).or_else(|| text(DEDUP_HEADER))?, from.as_deref())
            .to_string(),
        ts_ms: text(TS_HEADER)?.parse().ok()?,
        data,
        devices,
        from,
    };
    Some((event, state))
}

/// The payload's event JSON and state, split at the state's length (`Lg-State-Len`).
fn split_state(state_len: Option<&str>, payload: &[u8]) -> Option<(String, Option<String>)> {
    let Some(len) = state_len else {
        return Some((String::from_utf8(payload.to_vec()).ok()?, None));
    };
    let len: usize = len.parse().ok()?;
    let (data, state) = payload.split_at(payload.len().checked_sub(len)?);
    Some((String::from_utf8(data.to_vec()).ok()?, Some(String::from_utf8(state.to_vec()).ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_rides_after_the_event_and_the_newer_state_wins() {
        let split = |len: Option<&str>, payload: &str| split_state(len, payload.as_bytes());
        assert_eq!(split(None, r#"{"a":1}"#), Some((r#"{"a":1}"#.into(), None)));
        assert_eq!(
            split(Some("7"), r#"{"a":1}{"s":2}"#),
            Some((r#"{"a":1}"#.into(), Some(r#"{"s":2}"#.into())))
        );
        assert_eq!(split(Some("0"), "null"), Some(("null".into(), Some(String::new()))));
        assert_eq!(split(Some("9"), "short"), None, "a length beyond the payload");
        assert_eq!(split(Some("x"), "null"), None);
        let at = |seq: u64| Some(StoredState { seq, data: seq.to_string() });
        assert_eq!(newer(at(3), at(5)), at(5));
        assert_eq!(newer(at(5), at(3)), at(5));
        assert_eq!(newer(None, at(3)), at(3));
        assert_eq!(newer(at(3), None), at(3));
        assert_eq!(newer(None, None), None);
    }
}
