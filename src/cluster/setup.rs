//! Streams and buckets made and checked at joining (their replicas raised, never
//! lowered), the cluster-wide secrets, and reads answered by a stream's leader.

use std::time::Duration;

use async_nats::jetstream::context::CreateStreamErrorKind;
use async_nats::jetstream::kv::CreateErrorKind;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, kv as nats_kv, stream};

use super::errors::ClusterError;

/// The replicas of every stream and bucket when NATS has this many JetStream servers or
/// more (and `cluster_replicas` is not set): a majority survives losing one server.
pub const REPLICATED: usize = 3;

/// A rooms stream's identity, its creation time: a stream made anew (its events lost)
/// has another.
pub(super) fn epoch_of(info: &stream::Info) -> String {
    format!("{:016x}", info.created.unix_timestamp_nanos() as u64)
}

/// A cluster-wide secret of 32 random bytes in `meta`: the first node to ask creates it
/// with `fresh`, the others read it. Read as part of joining ([`super::Cluster::connect_with`]),
/// so a node that starts while the NATS cluster settles tries again with the rest; from
/// the leader, since a bucket just made may have no replica serving direct gets yet.
pub(super) async fn shared_secret(
    meta: &nats_kv::Store,
    name: &str,
    fresh: [u8; 32],
) -> Result<Vec<u8>, ClusterError> {
    let key = format!("secret.{name}");
    match meta.create(&key, fresh.to_vec().into()).await {
        Ok(_) => return Ok(fresh.to_vec()),
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    leader_get(meta, &key).await?.ok_or(ClusterError::Vanished(key))
}

/// `key`'s value in `bucket` as its stream's leader has it (`None`: none, or deleted).
/// A bucket's `get` is a direct get, which a replica that has not applied the newest write
/// may answer; the checks that void credentials (a kick, a revocation just written on
/// another node) read here instead.
pub(super) async fn leader_get(
    bucket: &nats_kv::Store,
    key: &str,
) -> Result<Option<Vec<u8>>, ClusterError> {
    let message = last_message(&bucket.stream, &format!("{}{key}", bucket.prefix)).await?;
    Ok(message
        .filter(|m| {
            !m.headers.get("KV-Operation").is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
        })
        .map(|m| m.payload.to_vec()))
}

/// The newest message on `subject` as `stream`'s leader has it (`None`: the stream holds
/// none). Never a direct get, which a replica that lags its leader may answer.
pub(crate) async fn last_message<I>(
    stream: &stream::Stream<I>,
    subject: &str,
) -> Result<Option<jetstream::message::StreamMessage>, ClusterError> {
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(message) => Ok(Some(message)),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Create a KV bucket's stream by hand (async-nats' `create_key_value` fails against
/// nats-server 2.9): one message per subject, discard new, rollups allowed, deletes
/// denied, direct get allowed.
pub(super) async fn ensure_bucket(
    js: &jetstream::Context,
    bucket: &str,
    ttl: Duration,
    replicas: usize,
) -> Result<(), ClusterError> {
    let duplicate_window =
        Duration::from_secs(120).min(if ttl.is_zero() { Duration::from_secs(120) } else { ttl });
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
            num_replicas: replicas,
            ..Default::default()
        })
        .await?;
    // A bucket made by a run with another TTL takes this one's.
    let mut config = existing.cached_info().config.clone();
    if config.max_age != ttl {
        config = stream::Config { max_age: ttl, duplicate_window, ..config };
        js.update_stream(&config).await?;
        tracing::info!(bucket, max_age_secs = ttl.as_secs(), "KV bucket age limit changed");
    }
    raise_replicas(js, &config, replicas).await
}

/// A stream (or a bucket's) made with fewer replicas than `replicas` (by an earlier
/// build, or before NATS had three servers) is raised to them, and this is logged: a
/// replicated NATS with an R1 stream still loses it with one server. Never lowered: a
/// node configured with fewer replicas leaves the stream as it is, with a warning.
pub(crate) async fn raise_replicas(
    js: &jetstream::Context,
    config: &stream::Config,
    replicas: usize,
) -> Result<(), ClusterError> {
    // 0 is what a stream made without a count reports: one replica.
    let has = config.num_replicas.max(1);
    if has < replicas {
        js.update_stream(stream::Config { num_replicas: replicas, ..config.clone() }).await?;
        tracing::warn!(stream = %config.name, from = has, to = replicas, "raised the stream's replicas");
    } else if has > replicas {
        tracing::warn!(stream = %config.name, has, configured = replicas, "the stream has more replicas than configured; left as it is");
    }
    Ok(())
}

/// The replicas when `cluster_replicas` is not set: [`REPLICATED`] when NATS has that
/// many JetStream servers, else 1, logged. JetStream tells no client how many servers it
/// has, so a server outside a NATS cluster counts one, and in a cluster a small memory
/// stream of this node's asks JetStream to place [`REPLICATED`] replicas: placed, there
/// are that many (the stream is deleted at once); refused, there are fewer.
pub(super) async fn default_replicas(
    client: &async_nats::Client,
    js: &jetstream::Context,
    node: &str,
) -> Result<usize, ClusterError> {
    let info = client.server_info();
    let Some(nats_cluster) = info.cluster.filter(|name| !name.is_empty()) else {
        tracing::info!(server = %info.server_name, replicas = 1, "NATS is one server (no NATS cluster): streams and buckets with one replica");
        return Ok(1);
    };
    let probe = format!("LG_PROBE_{}", hex::encode(node));
    let placed = js
        .create_stream(stream::Config {
            name: probe.clone(),
            subjects: vec![format!("lg.probe.{}", hex::encode(node))],
            storage: stream::StorageType::Memory,
            num_replicas: REPLICATED,
            max_messages: 1,
            ..Default::default()
        })
        .await;
    match placed {
        Ok(_) => {
            if let Err(e) = js.delete_stream(&probe).await {
                tracing::warn!(stream = %probe, error = %e, "could not delete the replicas probe stream");
            }
            tracing::info!(%nats_cluster, replicas = REPLICATED, "NATS has {REPLICATED} or more JetStream servers: streams and buckets with {REPLICATED} replicas");
            Ok(REPLICATED)
        }
        Err(e) if matches!(e.kind(), CreateStreamErrorKind::JetStream(_)) => {
            tracing::warn!(%nats_cluster, replicas = 1, error = %e, "NATS cannot place {REPLICATED} replicas (fewer JetStream servers): streams and buckets with one replica");
            Ok(1)
        }
        Err(e) => Err(e.into()),
    }
}
