//! Cluster mode: several nodes joined through one NATS server with JetStream, never a
//! home-made protocol. This module owns every NATS subject, stream and bucket name and
//! the connection; the parts that use it are:
//!
//! - [`roomlog`]: each room's events on the `LG_ROOMS` stream (subject `lg.room.<room>`),
//!   sequenced with the expected-last-subject-sequence guard, fanned out live through
//!   the stream's republish to `lg.live.<room>`;
//! - [`kv`]: the session directory in the `lg_sessions` bucket (compare-and-set on
//!   revisions), with a cache and a sled-backed queue for outages;
//! - heartbeats on `lg.node.heartbeat`, and user commands (exclusive-device replacement,
//!   kicks) on `lg.user.*`, handled here and in the liveness and registry actors.
//!
//! Room names travel hex-encoded in subjects and keys, so any valid room is a valid token.

pub mod bus;
pub mod kv;
pub mod roomlog;

use std::time::Duration;

use async_nats::jetstream::{self, kv as nats_kv, stream};
use thiserror::Error;

use crate::core::heartbeats::NodeInfo;
use crate::core::sessions::VersionError;

/// The stream every room's events are stored in.
pub const ROOMS_STREAM: &str = "LG_ROOMS";
pub const ROOM_SUBJECTS: &str = "lg.room.>";
pub const LIVE_SUBJECTS: &str = "lg.live.>";
pub const SESSIONS_BUCKET: &str = "lg_sessions";
pub const NONCES_BUCKET: &str = "lg_nonces";
pub const META_BUCKET: &str = "lg_meta";
pub const HEARTBEAT_SUBJECT: &str = "lg.node.heartbeat";
pub const LEAVE_SUBJECT: &str = "lg.node.leave";
pub const REPLACE_SUBJECT: &str = "lg.user.replace";
pub const KICK_SUBJECT: &str = "lg.user.kick";
/// How long one NATS request may take before the node treats NATS as unreachable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Error)]
pub enum ClusterError {
    #[error("NATS is unreachable: {0}")]
    Unavailable(String),
    #[error("NATS: {0}")]
    Nats(String),
    #[error(transparent)]
    Stale(#[from] VersionError),
    #[error("corrupt cluster record: {0}")]
    Corrupt(String),
}

impl ClusterError {
    pub fn nats(e: impl std::fmt::Display) -> Self {
        ClusterError::Nats(e.to_string())
    }
}

/// Room retention on the stream (`history_size`). Age is not a stream limit: the stream
/// would drop a quiet room's last event and with it the room's head, so rooms trim
/// expired events themselves ([`roomlog::purge_expired`]).
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    pub history_size: u64,
    /// How long used token nonces are remembered (the longest token lifetime).
    pub nonce_ttl: Duration,
    /// `session_ttl_secs`: the session bucket's age limit is twice this, and a node
    /// rewrites the records of its connected sessions every half TTL, so a record goes
    /// between one and two TTLs after its last connection closed.
    pub session_ttl: Duration,
}

/// The node's NATS connection and JetStream handles; cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub node: String,
    rooms: stream::Stream,
    nonces: nats_kv::Store,
    meta: nats_kv::Store,
    /// The rooms stream's identity; every room's epoch in cluster mode.
    epoch: String,
}

impl Cluster {
    /// Connect with default limits (tests and tools).
    pub async fn connect(url: &str, node: &str) -> Result<Cluster, ClusterError> {
        let day = Duration::from_secs(86_400);
        let limits = StreamLimits { history_size: 1000, nonce_ttl: day, session_ttl: day };
        Cluster::connect_with(url, node, limits).await
    }

    /// Connect to NATS (retrying in the background after the first success), and create
    /// the stream and buckets when they do not exist yet.
    pub async fn connect_with(url: &str, node: &str, limits: StreamLimits) -> Result<Cluster, ClusterError> {
        let client = async_nats::ConnectOptions::new()
            .name(format!("livegate {node}"))
            .connection_timeout(REQUEST_TIMEOUT)
            .request_timeout(Some(REQUEST_TIMEOUT))
            .max_reconnects(None)
            .reconnect_delay_callback(|attempt| Duration::from_millis((100 * attempt as u64).min(1000)))
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Connected => tracing::info!("NATS connected"),
                    async_nats::Event::Disconnected => tracing::warn!("NATS disconnected; reconnecting"),
                    other => tracing::info!(event = %other, "NATS event"),
                }
            })
            .connect(url)
            .await
            .map_err(|e| ClusterError::Unavailable(format!("{url}: {e}")))?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(REQUEST_TIMEOUT);
        let rooms = js
            .get_or_create_stream(stream::Config {
                name: ROOMS_STREAM.into(),
                subjects: vec![ROOM_SUBJECTS.into()],
                max_messages_per_subject: limits.history_size as i64,
                storage: stream::StorageType::File,
                allow_direct: true,
                duplicate_window: Duration::from_secs(120),
                republish: Some(stream::Republish { source: ROOM_SUBJECTS.into(), destination: LIVE_SUBJECTS.into(), headers_only: false }),
                ..Default::default()
            })
            .await
            .map_err(ClusterError::nats)?;
        let created = rooms.cached_info().created;
        let epoch = format!("{:016x}", created.unix_timestamp_nanos() as u64);
        let sessions_ttl = limits.session_ttl * 2;
        for (bucket, ttl) in [(SESSIONS_BUCKET, sessions_ttl), (NONCES_BUCKET, limits.nonce_ttl), (META_BUCKET, Duration::ZERO)] {
            ensure_bucket(&js, bucket, ttl).await?;
        }
        let nonces = js.get_key_value(NONCES_BUCKET).await.map_err(ClusterError::nats)?;
        let meta = js.get_key_value(META_BUCKET).await.map_err(ClusterError::nats)?;
        tracing::info!(url, node, stream = ROOMS_STREAM, %epoch, "cluster mode: joined through NATS");
        Ok(Cluster { client, js, node: node.to_string(), rooms, nonces, meta, epoch })
    }

    pub fn rooms_stream(&self) -> &stream::Stream {
        &self.rooms
    }

    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// A cluster-wide secret of 32 random bytes: the first node to ask creates it.
    pub async fn secret(&self, name: &str, fresh: [u8; 32]) -> Result<Vec<u8>, ClusterError> {
        let key = format!("secret.{name}");
        match self.meta.create(&key, fresh.to_vec().into()).await {
            Ok(_) => return Ok(fresh.to_vec()),
            Err(e) if e.kind() == nats_kv::CreateErrorKind::AlreadyExists => {}
            Err(e) => return Err(ClusterError::nats(e)),
        }
        let stored = self.meta.get(&key).await.map_err(ClusterError::nats)?;
        stored.map(|b| b.to_vec()).ok_or_else(|| ClusterError::Corrupt(format!("{key} vanished")))
    }

    /// Mark a token nonce used cluster-wide. `Ok(false)`: used before (a replay).
    pub async fn use_nonce(&self, nonce: &[u8; 16]) -> Result<bool, ClusterError> {
        if !self.connected() {
            return Err(ClusterError::Unavailable("not connected".into()));
        }
        let key: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        match self.nonces.create(&key, vec![1u8].into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == nats_kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(ClusterError::Unavailable(e.to_string())),
        }
    }

    /// Announce this node (every heartbeat period; `draining` when it takes no new clients).
    pub async fn heartbeat(&self, info: &NodeInfo) -> Result<(), ClusterError> {
        self.client.publish(HEARTBEAT_SUBJECT, encode_node(info).into()).await.map_err(ClusterError::nats)
    }

    /// Say goodbye, so peers stop routing here before the heartbeat times out.
    pub async fn leave(&self) {
        let _ = self.client.publish(LEAVE_SUBJECT, self.node.clone().into()).await;
        let _ = self.client.flush().await;
    }
}

/// Create a KV bucket's stream by hand (async-nats' `create_key_value` fails against
/// nats-server 2.9): one message per subject, discard new, rollups allowed, deletes
/// denied, direct get allowed.
async fn ensure_bucket(js: &jetstream::Context, bucket: &str, ttl: Duration) -> Result<(), ClusterError> {
    let duplicate_window = Duration::from_secs(120).min(if ttl.is_zero() { Duration::from_secs(120) } else { ttl });
    let existing = js
        .get_or_create_stream(stream::Config {
            name: format!("KV_{bucket}"),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_age: ttl,
            discard: stream::DiscardPolicy::New,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            storage: stream::StorageType::File,
            duplicate_window,
            ..Default::default()
        })
        .await
        .map_err(ClusterError::nats)?;
    // A bucket made by a run with another TTL takes this one's.
    let config = existing.cached_info().config.clone();
    if config.max_age != ttl {
        js.update_stream(stream::Config { max_age: ttl, duplicate_window, ..config }).await.map_err(ClusterError::nats)?;
        tracing::info!(bucket, max_age_secs = ttl.as_secs(), "KV bucket age limit changed");
    }
    Ok(())
}

/// A room name as one subject token (and KV key part): lowercase hex of its bytes.
pub fn room_token(room: &str) -> String {
    room.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The room a subject token names, if it is one [`room_token`] made.
pub fn room_from_token(token: &str) -> Option<String> {
    if token.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len()).step_by(2).map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

/// Heartbeat body: `name\ncell\nurl\ndraining` (names and URLs hold no newline).
pub fn encode_node(info: &NodeInfo) -> String {
    format!("{}\n{}\n{}\n{}", info.name, info.cell, info.url, u8::from(info.draining))
}

pub fn decode_node(body: &[u8]) -> Option<NodeInfo> {
    let text = std::str::from_utf8(body).ok()?;
    let mut parts = text.split('\n');
    let (name, cell, url, draining) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if name.is_empty() || parts.next().is_some() {
        return None;
    }
    Some(NodeInfo { name: name.into(), cell: cell.into(), url: url.into(), draining: draining == "1" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_tokens_round_trip_and_reject_junk() {
        for room in ["a", "user:alice@x.org", "match:2026.final-1_b"] {
            let token = room_token(room);
            assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
            assert_eq!(room_from_token(&token).as_deref(), Some(room));
        }
        for junk in ["6", "zz", "ff", "6g"] {
            assert_eq!(room_from_token(junk), None, "{junk}");
        }
    }

    #[test]
    fn heartbeat_bodies_round_trip() {
        let info = NodeInfo { name: "a".into(), cell: "eu".into(), url: "http://127.0.0.1:1".into(), draining: true };
        assert_eq!(decode_node(encode_node(&info).as_bytes()), Some(info));
        for junk in ["", "a", "a\nb\nc", "\nb\nc\n0", "a\nb\nc\n0\nextra"] {
            assert_eq!(decode_node(junk.as_bytes()), None, "{junk:?}");
        }
    }
}
