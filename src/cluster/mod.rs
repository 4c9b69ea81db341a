//! Cluster mode: several nodes joined through NATS with JetStream (one server, or a
//! cluster of servers the client reconnects to any of), never a home-made protocol.
//! Every stream and bucket has the same replicas ([`Cluster::replicas`]). This module
//! owns every NATS subject, stream and bucket name and the connection; the parts that use
//! it are:
//!
//! - [`roomlog`]: each room's events on the `LG_ROOMS` stream (subject `lg.room.<room>`),
//!   sequenced with the expected-last-subject-sequence guard, fanned out live through
//!   the stream's republish to `lg.live.<room>`, which a node subscribes to only while
//!   it has subscribers in the room (interest-based fan-out);
//! - [`kv`]: the session directory in the `lg_sessions` bucket (compare-and-set on
//!   revisions), with a cache and a sled-backed queue for outages;
//! - heartbeats on `lg.node.heartbeat` (each node's open connections in a header), and
//!   user commands (exclusive-device replacement, kicks, a user's sessions moved to
//!   another node) on `lg.user.*`, handled here and
//!   in the liveness and registry actors; a rebalance's orders on
//!   `lg.node.<node>.rebalance` (`bus::send_order`); publishes forwarded to a room's
//!   writer on `lg.node.<node>.publish` ([`forward`]);
//! - [`occupancy`]: cluster-wide room occupancy in the `lg_occupancy` bucket (one record
//!   per occupied room: its nodes with subscribers), changes forwarded to each room's
//!   writer on `lg.node.<node>.occupancy`;
//! - [`presence`]: each node's members of each room on `lg.presence.room.<room>` (NATS
//!   core), and a starting node's hello on `lg.presence.hello`.
//!
//! With cell domains (`cluster_cell_domains`, [`Joining::cells`]) each cell's NATS is its
//! own JetStream domain: the buckets above stay in it, a room's events are on its home
//! cell's streams under `lg.room.<cell>.<room>` ([`Cluster::room_place`]), other cells'
//! rooms are read through their domain's API or, while they do not answer, from this
//! cell's mirrors of their streams (`LG_ROOMS_<cell>`, `LG_STATE_<cell>`). A cell lost
//! for good is promoted ([`promotion`]): its mirror in another cell becomes the origin
//! of its rooms there, under a new epoch.
//!
//! Room names travel hex-encoded in subjects and keys, so any valid room is a valid token.
//!
//! The handle's own parts: [`names`] (every shared subject, stream and bucket name; a room
//! as a subject token), [`heartbeat`] (a heartbeat's body and headers on the wire),
//! [`cells`] (cell domains: where a room is kept, the mirrors, a silent home cell),
//! [`setup`] (streams and buckets made and raised at joining, the shared secrets, reads
//! from a stream's leader) and [`errors`] (what a call fails with, NATS' errors classified).

pub mod bus;
pub mod cells;
pub mod credentials;
pub mod errors;
pub mod forward;
pub mod heartbeat;
pub mod kv;
pub mod names;
pub mod occupancy;
pub mod presence;
pub mod promotion;
pub mod roomlog;
pub mod setup;

pub use cells::{CellDomains, SharedHomes};
pub use errors::{ClusterError, NatsError, Unreachable};
pub use forward::FORWARD_WAIT;
pub use names::ROOMS_STREAM;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv as nats_kv, stream};

use crate::core::nodes::heartbeats::NodeInfo;
use crate::core::rules::redact::url_for_log;
use cells::Domains;
use heartbeat::{
    encode_node, CAPACITY_HEADER, CELL_PROBE_HEADER, CONNECTIONS_HEADER, EPOCH_HEADER,
    MOVES_HEADER, RELEASE_HEADER, ROOMS_HEAD_HEADER, ROUTES_HEADER, USAGE_HEADER,
};
use names::{
    cell_subjects, HEARTBEAT_SUBJECT, LEAVE_SUBJECT, LIVE_STATE_SUBJECTS, LIVE_SUBJECTS,
    META_BUCKET, NONCES_BUCKET, SESSIONS_BUCKET, STATE_STREAM,
};
use setup::{default_replicas, ensure_bucket, epoch_of, leader_get, raise_replicas, shared_secret};

/// How long a call to another cell (a read through its domain, a publish forwarded to
/// its writer) may take: a silent cut does not close a leaf connection for minutes.
pub const CROSS_CELL_TIMEOUT: Duration = Duration::from_millis(800);
/// How long one NATS request may take before the node treats NATS as unreachable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Room retention on the stream (the largest `history_size` of any namespace: each room
/// trims its own history to its namespace's size and age in memory). Age is not a stream limit: the stream
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
    /// `cluster_replicas`: the replicas of every stream and bucket; `None`: [`setup::REPLICATED`]
    /// when NATS has that many JetStream servers, else 1.
    pub replicas: Option<usize>,
}

/// How a node logs in to NATS: `cluster_nats_user` and `cluster_nats_password`, or
/// `cluster_nats_token`, or nothing. `Debug` shows no secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum NatsAuth {
    #[default]
    None,
    UserPassword {
        user: String,
        password: String,
    },
    Token(String),
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NatsAuth::None => f.write_str("None"),
            NatsAuth::UserPassword { user, .. } => {
                f.debug_struct("UserPassword").field("user", user).finish_non_exhaustive()
            }
            NatsAuth::Token(_) => f.write_str("Token(..)"),
        }
    }
}

/// The node's NATS connection and JetStream handles; cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub node: String,
    /// The replicas of every stream and bucket this node creates or raises.
    pub replicas: usize,
    rooms: stream::Stream<()>,
    states: stream::Stream<()>,
    /// `cluster_cell_domains`: this node's cell and the other cells' streams, reached
    /// through their JetStream domains; `None`: every cell shares this NATS.
    domains: Option<Arc<Domains>>,
    nonces: nats_kv::Store,
    /// `lg_meta`: the shared secrets, and each node's cell probe key.
    meta: nats_kv::Store,
    /// The key every node signs and checks connection tokens with (the `lg_meta` bucket's
    /// `secret.token`: the first node to join makes it).
    token_secret: Vec<u8>,
    /// The rooms stream's identity; every room's epoch in cluster mode (with cell
    /// domains: of every room homed in this node's cell).
    epoch: String,
    /// The last sequence of this node's rooms stream it knows of (its start, its own
    /// appends): with cell domains, heartbeats carry it, so that a promotion elsewhere
    /// knows how many of this cell's events its mirror lacks.
    rooms_head: Arc<AtomicU64>,
}

/// How a node joins NATS: its login, the token key when configured
/// (`cluster_token_secret`), and its cell's domain when cells run their own NATS.
#[derive(Clone, Default)]
pub struct Joining {
    pub auth: NatsAuth,
    pub token_secret: Option<Vec<u8>>,
    pub cells: Option<CellDomains>,
}

impl Cluster {
    /// Connect with default limits (tests and tools).
    pub async fn connect(url: &str, node: &str) -> Result<Cluster, ClusterError> {
        let day = Duration::from_secs(86_400);
        let limits =
            StreamLimits { history_size: 1000, nonce_ttl: day, session_ttl: day, replicas: None };
        Cluster::connect_with(url, node, limits).await
    }

    /// [`Cluster::connect_as`] without credentials (a NATS that asks for none).
    pub async fn connect_with(
        urls: &str,
        node: &str,
        limits: StreamLimits,
    ) -> Result<Cluster, ClusterError> {
        Cluster::connect_as(urls, node, limits, &Joining::default()).await
    }

    /// Connect to NATS through any of `urls` (comma-separated seeds; reconnecting in the
    /// background after the first success, to any seed or server NATS tells of) with
    /// `auth`, and create the streams and buckets when they do not exist yet, each with
    /// the replicas of [`Cluster::replicas`] (an existing one with fewer is raised).
    /// With cell domains ([`Joining::cells`]), room subjects carry the cell
    /// (`lg.room.<cell>.<room>`), so a leaf node that carries them to another cell's NATS
    /// finds no stream there to store them twice.
    pub async fn connect_as(
        urls: &str,
        node: &str,
        limits: StreamLimits,
        joining: &Joining,
    ) -> Result<Cluster, ClusterError> {
        let seeds = crate::config::nats_seeds(urls);
        let options = match joining.auth.clone() {
            NatsAuth::None => async_nats::ConnectOptions::new(),
            NatsAuth::UserPassword { user, password } => {
                async_nats::ConnectOptions::with_user_and_password(user, password)
            }
            NatsAuth::Token(token) => async_nats::ConnectOptions::with_token(token),
        };
        let client = options
            .name(format!("livegate {node}"))
            .connection_timeout(REQUEST_TIMEOUT)
            .request_timeout(Some(REQUEST_TIMEOUT))
            .max_reconnects(None)
            .reconnect_delay_callback(|attempt| {
                Duration::from_millis((100 * attempt as u64).min(1000))
            })
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Connected => tracing::info!("NATS connected"),
                    async_nats::Event::Disconnected => {
                        tracing::warn!("NATS disconnected; reconnecting")
                    }
                    // A refused publish or subscribe (a permissions violation: the NATS
                    // account lacks a subject this build uses) or a refused login.
                    async_nats::Event::ServerError(error) => {
                        tracing::error!(%error, "NATS refused a request of this node")
                    }
                    other => tracing::info!(event = %other, "NATS event"),
                }
            })
            .connect(seeds)
            .await
            .map_err(|source| ClusterError::Connect { url: url_for_log(urls), source })?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(REQUEST_TIMEOUT);
        let replicas = match limits.replicas {
            Some(replicas) => {
                tracing::info!(replicas, "cluster mode: streams and buckets with the configured replicas (cluster_replicas)");
                replicas
            }
            None => default_replicas(&client, &js, node).await?,
        };
        let own_cell = joining.cells.as_ref().map(|c| c.cell.as_str());
        let (room_subjects, state_subjects) =
            (cell_subjects("room", own_cell), cell_subjects("state", own_cell));
        let rooms = js
            .get_or_create_stream(stream::Config {
                name: ROOMS_STREAM.into(),
                subjects: vec![room_subjects.clone()],
                max_messages_per_subject: limits.history_size as i64,
                storage: stream::StorageType::File,
                allow_direct: true,
                duplicate_window: Duration::from_secs(120),
                republish: Some(stream::Republish {
                    source: room_subjects,
                    destination: LIVE_SUBJECTS.into(),
                    headers_only: false,
                }),
                num_replicas: replicas,
                ..Default::default()
            })
            .await?;
        let states = js
            .get_or_create_stream(stream::Config {
                name: STATE_STREAM.into(),
                subjects: vec![state_subjects.clone()],
                max_messages_per_subject: 1,
                storage: stream::StorageType::File,
                allow_direct: true,
                republish: Some(stream::Republish {
                    source: state_subjects,
                    destination: LIVE_STATE_SUBJECTS.into(),
                    headers_only: false,
                }),
                num_replicas: replicas,
                ..Default::default()
            })
            .await?;
        raise_replicas(&js, &states.cached_info().config, replicas).await?;
        // A stream made with a smaller per-room limit (a namespace or history_size grew
        // since) keeps fewer events than some room keeps: raise it, never lower it.
        let kept = rooms.cached_info().config.max_messages_per_subject;
        let mut config = rooms.cached_info().config.clone();
        if kept > 0 && kept < limits.history_size as i64 {
            config =
                stream::Config { max_messages_per_subject: limits.history_size as i64, ..config };
            js.update_stream(&config).await?;
            tracing::info!(
                stream = ROOMS_STREAM,
                from = kept,
                to = limits.history_size,
                "raised the rooms stream's events per room"
            );
        }
        raise_replicas(&js, &config, replicas).await?;
        let epoch = epoch_of(rooms.cached_info());
        let rooms_head = Arc::new(AtomicU64::new(rooms.cached_info().state.last_sequence));
        let sessions_ttl = limits.session_ttl * 2;
        for (bucket, ttl) in [
            (SESSIONS_BUCKET, sessions_ttl),
            (NONCES_BUCKET, limits.nonce_ttl),
            (META_BUCKET, Duration::ZERO),
        ] {
            ensure_bucket(&js, bucket, ttl, replicas).await?;
        }
        let nonces = js.get_key_value(NONCES_BUCKET).await?;
        let meta = js.get_key_value(META_BUCKET).await?;
        let token_secret = match &joining.token_secret {
            Some(secret) => secret.clone(),
            None => shared_secret(&meta, "token", crate::world::random_bytes()).await?,
        };
        let domains = match &joining.cells {
            Some(cells) => {
                Some(Arc::new(Domains::reach(&client, &js, cells, &limits, replicas).await?))
            }
            None => None,
        };
        let (rooms, states) = (
            js.get_stream_no_info(ROOMS_STREAM).await?,
            js.get_stream_no_info(STATE_STREAM).await?,
        );
        tracing::info!(url = %url_for_log(urls), node, cell = own_cell, stream = ROOMS_STREAM, %epoch, replicas, "cluster mode: joined through NATS");
        let cluster = Cluster {
            client,
            js,
            node: node.to_string(),
            replicas,
            rooms,
            states,
            domains,
            nonces,
            meta,
            token_secret,
            epoch,
            rooms_head,
        };
        cluster.load_moves().await?;
        Ok(cluster)
    }

    /// This node's rooms stream (with cell domains: of the rooms homed in its cell).
    pub fn rooms_stream(&self) -> &stream::Stream<()> {
        &self.rooms
    }

    /// The rooms' latest states (one message per room subject).
    pub fn state_stream(&self) -> &stream::Stream<()> {
        &self.states
    }

    /// The epoch of the rooms homed in this node's cell (every room without cell domains).
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The key every node signs and checks connection tokens with.
    pub fn token_secret(&self) -> &[u8] {
        &self.token_secret
    }

    /// Announce this node (every heartbeat period; `draining` when it takes no new clients).
    /// The load rides in a header ([`CONNECTIONS_HEADER`]), not the body: a node of an
    /// earlier build refuses a body with a line more, and would count this one dead.
    pub async fn heartbeat(&self, info: &NodeInfo) -> Result<(), ClusterError> {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(connections) = info.connections {
            headers.insert(CONNECTIONS_HEADER, connections.to_string().as_str());
        }
        if let Some(capacity) = info.capacity {
            headers.insert(CAPACITY_HEADER, capacity.to_string().as_str());
        }
        if let Some(usage) = info.usage {
            headers.insert(
                USAGE_HEADER,
                format!(
                    "{},{},{}",
                    usage.cpu_permille, usage.resident_bytes, usage.deliveries_per_sec
                )
                .as_str(),
            );
        }
        if let Some(passed) = info.probe {
            headers.insert(CELL_PROBE_HEADER, if passed { "1" } else { "0" });
        }
        if !info.release.is_empty() {
            headers.insert(RELEASE_HEADER, info.release.as_str());
        }
        if let Some(routes) = &info.routes_to {
            headers.insert(ROUTES_HEADER, routes.join(",").as_str());
        }
        headers.insert(EPOCH_HEADER, self.epoch.as_str());
        if self.domains.is_some() {
            headers.insert(
                ROOMS_HEAD_HEADER,
                self.rooms_head.load(Ordering::Relaxed).to_string().as_str(),
            );
            if let Some(moves) = self.encode_moves() {
                headers.insert(MOVES_HEADER, moves.as_str());
            }
        }
        Ok(self
            .client
            .publish_with_headers(HEARTBEAT_SUBJECT, headers, encode_node(info).into())
            .await?)
    }

    /// Probe this node's cell: a real write and read through JetStream, the put of this
    /// node's own key `probe.<node>` in `lg_meta` (the time, `at_ms`: idempotent, one key
    /// per node) and its read from the stream's leader, which must give back what was
    /// written. Each call is bounded by `timeout`; a store that cannot write (full, no
    /// JetStream leader) fails it.
    pub async fn probe_cell(&self, at_ms: u64, timeout: Duration) -> Result<(), ClusterError> {
        let key = format!("probe.{}", self.node);
        let value = at_ms.to_string();
        let probe = async {
            self.meta.put(&key, value.clone().into_bytes().into()).await?;
            match leader_get(&self.meta, &key).await? {
                Some(read) if read == value.as_bytes() => Ok(()),
                _ => Err(ClusterError::Vanished(key.clone())),
            }
        };
        tokio::time::timeout(timeout, probe)
            .await
            .unwrap_or(Err(ClusterError::Unavailable(Unreachable::ProbeTimedOut(timeout))))
    }

    /// Say goodbye, so peers stop routing here before the heartbeat times out.
    pub async fn leave(&self) {
        let _ = self.client.publish(LEAVE_SUBJECT, self.node.clone().into()).await;
        let _ = self.client.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_credentials_are_not_shown() {
        let login =
            NatsAuth::UserPassword { user: "livegate".into(), password: "s3cret-pw".into() };
        assert_eq!(format!("{login:?}"), "UserPassword { user: \"livegate\", .. }");
        assert_eq!(format!("{:?}", NatsAuth::Token("t0ken-xyz".into())), "Token(..)");
    }
}
