//! Stored record types and their encoding: one format-version byte, then bincode
//! (standard config, size-limited on decode). Core types stay plain; these are their
//! serialisable counterparts at the storage edge.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::StoreError;

/// Version byte in front of every stored record.
pub const RECORD_VERSION: u8 = 1;
/// Largest record decoded (an event is bounded by `max_event_bytes` ≤ 16 MiB).
const DECODE_LIMIT: usize = 32 << 20;

/// Head of a room: epoch and last seq, stored as one unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoomHeadRecord {
    pub epoch: String,
    pub head: u64,
}

/// One event of a room's history. `data` is the event's JSON text as published.
/// Stored by [`encode_event`]: format [`RECORD_VERSION`] without `from` (what every
/// build wrote before client publish, and still writes for backend publishes), format
/// [`EVENT_FROM_VERSION`] with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub seq: u64,
    pub id: String,
    pub ts_ms: u64,
    pub data: String,
    /// Devices an inbox message is for (`None`: every device).
    pub devices: Option<Vec<String>>,
    /// The user whose connection published it (client publish); `None`: a backend.
    pub from: Option<String>,
}

/// Format byte of an event record that names its publishing user.
pub const EVENT_FROM_VERSION: u8 = 2;

/// An event record of format 1: the fields before `from`.
#[derive(Serialize, Deserialize)]
struct EventRecordV1 {
    seq: u64,
    id: String,
    ts_ms: u64,
    data: String,
    devices: Option<Vec<String>>,
}

/// An event record: format 1 when it has no `from` (older builds read it), else 2.
pub fn encode_event(event: &EventRecord) -> Vec<u8> {
    if event.from.is_some() {
        return encode_as(EVENT_FROM_VERSION, event);
    }
    let EventRecord { seq, id, ts_ms, data, devices, from: _ } = event.clone();
    encode(&EventRecordV1 { seq, id, ts_ms, data, devices })
}

/// An event record of either format.
pub fn decode_event(tree: &'static str, bytes: &[u8]) -> Result<EventRecord, StoreError> {
    if bytes.first() == Some(&EVENT_FROM_VERSION) {
        return decode_as(EVENT_FROM_VERSION, tree, bytes);
    }
    let EventRecordV1 { seq, id, ts_ms, data, devices } = decode(tree, bytes)?;
    Ok(EventRecord { seq, id, ts_ms, data, devices, from: None })
}

/// A room's state as of event `seq`: the JSON text published with that
/// event, or set by `PUT /v1/rooms/{room}/state` at the head then (`seq` 0: before any
/// event). One per room, kept in `room_state` beside the head, so trimming the history
/// never drops it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateRecord {
    pub seq: u64,
    pub data: String,
}

/// Who owns a session. `version` is inside the value, so sled's whole-value
/// compare-and-swap is a version check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub session: String,
    pub user: String,
    pub owner: String,
    pub version: u64,
    pub updated_at_ms: u64,
}

/// When a session's last connection closed, and which process saw it (a random id per
/// server start: after warm-up a process accepts only sessions it has seen itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenRecord {
    pub last_seen_ms: u64,
    pub seen_by: u64,
}

/// When a user's sessions last changed owner (the migration budget).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationRecord {
    pub last_migration_ms: u64,
}

/// A session write made while the cluster directory was unreachable, replayed when it
/// is back: it applies only if the record is still at `read_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedSessionWrite {
    pub read_version: Option<u64>,
    pub record: SessionRecord,
}

/// A user's entry in the cluster directory: their sessions and their migration budget.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub sessions: Vec<String>,
    pub last_migration_ms: Option<u64>,
}

/// A used token nonce, kept until the token would have expired anyway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NonceRecord {
    pub expires_at_ms: u64,
}

/// A session's resume credentials revoked (a kick or a replace) up to `at_ms`, or a user
/// (or one device of theirs) kicked at `at_ms`: what was issued at or before then is void.
/// Kept until the last of them would have expired anyway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RevokedRecord {
    pub at_ms: u64,
    pub keep_until_ms: u64,
}

/// A queued webhook: its room (the lane it waits in), its id and its JSON
/// body as sent, rendered once when it was queued. Signed when it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookRecord {
    pub room: String,
    pub id: String,
    pub body: String,
}

/// A webhook given up (a dead letter): what was queued, where it went, and how its
/// attempts ended. Kept in `webhook_dead` until replayed, deleted or pushed out by newer
/// ones (`webhook_dead_letters_max`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterRecord {
    /// The webhook's id (the body's `id`, the `X-Livegate-Id` of every attempt).
    pub id: String,
    /// The body's `type` (`room_occupied`, `room_vacated`, `client_published`).
    pub kind: String,
    pub room: String,
    /// The webhook URL of its attempts, as it may be logged (no userinfo, query or
    /// fragment).
    pub url: String,
    /// The JSON body as sent.
    pub body: String,
    /// Attempts made, replays included.
    pub attempts: u64,
    pub first_attempt_ms: u64,
    pub last_attempt_ms: u64,
    /// How the last attempt failed: `HTTP 500`, `timeout`, `unreachable: …`.
    pub last_error: String,
    /// Why it was given up: `attempts` or `rejected`.
    pub reason: String,
}

pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    encode_as(RECORD_VERSION, record)
}

fn encode_as<T: Serialize>(version: u8, record: &T) -> Vec<u8> {
    let mut out = vec![version];
    let body = bincode::serde::encode_to_vec(record, bincode::config::standard())
        .expect("plain records always encode");
    out.extend_from_slice(&body);
    out
}

pub fn decode<T: DeserializeOwned>(tree: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    decode_as(RECORD_VERSION, tree, bytes)
}

fn decode_as<T: DeserializeOwned>(
    expected: u8,
    tree: &'static str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    let corrupt = |why: String| StoreError::Corrupt { tree, why };
    let (version, body) = bytes.split_first().ok_or_else(|| corrupt("empty record".into()))?;
    if *version != expected {
        return Err(corrupt(format!("record format {version}, this build reads {expected}")));
    }
    let config = bincode::config::standard().with_limit::<DECODE_LIMIT>();
    let (record, used) =
        bincode::serde::decode_from_slice(body, config).map_err(|e| corrupt(e.to_string()))?;
    if used != body.len() {
        return Err(corrupt("trailing bytes after record".into()));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(from: Option<&str>) -> EventRecord {
        EventRecord {
            seq: 7,
            id: "e-7".into(),
            ts_ms: 1,
            data: r#"{"a":1}"#.into(),
            devices: Some(vec!["phone".into()]),
            from: from.map(str::to_string),
        }
    }

    #[test]
    fn round_trip_and_rejections() {
        for (event, version) in
            [(event(None), RECORD_VERSION), (event(Some("u1")), EVENT_FROM_VERSION)]
        {
            let bytes = encode_event(&event);
            assert_eq!(bytes[0], version);
            assert_eq!(decode_event("t", &bytes).unwrap(), event);

            let mut wrong_version = bytes.clone();
            wrong_version[0] = 9;
            let mut trailing = bytes.clone();
            trailing.push(0);
            for bad in [vec![], wrong_version, bytes[..bytes.len() - 1].to_vec(), trailing] {
                assert!(
                    matches!(decode_event("t", &bad), Err(StoreError::Corrupt { .. })),
                    "{bad:?}"
                );
            }
        }
    }

    #[test]
    fn webhook_records_round_trip() {
        let record = WebhookRecord {
            room: "lobby".into(),
            id: "w-1".into(),
            body: r#"{"id":"w-1"}"#.into(),
        };
        let bytes = encode(&record);
        assert_eq!(bytes[0], RECORD_VERSION);
        assert_eq!(decode::<WebhookRecord>("webhooks", &bytes).unwrap(), record);
        assert!(decode::<WebhookRecord>("webhooks", &bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn dead_letter_records_round_trip() {
        let record = DeadLetterRecord {
            id: "w-1".into(),
            kind: "room_occupied".into(),
            room: "lobby".into(),
            url: "http://backend/hooks".into(),
            body: r#"{"id":"w-1"}"#.into(),
            attempts: 12,
            first_attempt_ms: 1,
            last_attempt_ms: 2,
            last_error: "HTTP 500".into(),
            reason: "attempts".into(),
        };
        let bytes = encode(&record);
        assert_eq!(bytes[0], RECORD_VERSION);
        assert_eq!(decode::<DeadLetterRecord>("webhook_dead", &bytes).unwrap(), record);
        assert!(decode::<DeadLetterRecord>("webhook_dead", &bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn state_records_round_trip() {
        let state = StateRecord { seq: 42, data: r#"{"score":[1,0]}"#.into() };
        let bytes = encode(&state);
        assert_eq!(bytes[0], RECORD_VERSION);
        assert_eq!(decode::<StateRecord>("room_state", &bytes).unwrap(), state);
        assert!(decode::<StateRecord>("room_state", &bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn events_stored_before_client_publish_still_read() {
        // The bytes a build without `from` wrote for this event (format 1).
        let old = EventRecordV1 {
            seq: 7,
            id: "e-7".into(),
            ts_ms: 1,
            data: r#"{"a":1}"#.into(),
            devices: Some(vec!["phone".into()]),
        };
        let bytes = encode(&old);
        assert_eq!(bytes[0], 1);
        assert_eq!(decode_event("t", &bytes).unwrap(), event(None));
    }
}
