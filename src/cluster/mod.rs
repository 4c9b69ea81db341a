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
//!   `lg.node.<node>.rebalance` (`bus::send_order`);
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

pub mod bus;
pub mod credentials;
pub mod kv;
pub mod occupancy;
pub mod presence;
pub mod promotion;
pub mod roomlog;

pub use bus::FORWARD_WAIT;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::{CreateStreamErrorKind, PublishErrorKind};
use async_nats::jetstream::kv::{
    CreateErrorKind, EntryErrorKind, PutErrorKind, UpdateErrorKind, WatchErrorKind,
    WatcherErrorKind,
};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, PurgeErrorKind};
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::{self, kv as nats_kv, stream};
use thiserror::Error;

use crate::core::nodes::heartbeats::{NodeInfo, Usage, MAX_ROUTES_LISTED};
use crate::core::nodes::peer_input::{self, PeerInputError};
use crate::core::nodes::routing::RoomHomes;
use crate::core::nodes::sessions::VersionError;
use crate::core::rules::redact::url_for_log;
use crate::store::StoreError;

/// The stream every room's events are stored in.
pub const ROOMS_STREAM: &str = "LG_ROOMS";
pub const LIVE_SUBJECTS: &str = "lg.live.>";
/// Rooms' latest states, one message per room (see [`roomlog`]).
pub const STATE_STREAM: &str = "LG_STATE";
/// Where the state stream republishes what it stores, for the other nodes' rooms.
pub const LIVE_STATE_SUBJECTS: &str = "lg.livestate.>";
pub const SESSIONS_BUCKET: &str = "lg_sessions";
pub const NONCES_BUCKET: &str = "lg_nonces";
pub const META_BUCKET: &str = "lg_meta";
pub const HEARTBEAT_SUBJECT: &str = "lg.node.heartbeat";
pub const LEAVE_SUBJECT: &str = "lg.node.leave";
/// A heartbeat's header with the node's open connections (absent from earlier builds).
pub const CONNECTIONS_HEADER: &str = "Lg-Connections";
/// A heartbeat's header with the connections the node admits, its limit in force
/// (absent from earlier builds).
pub const CAPACITY_HEADER: &str = "Lg-Capacity";
/// A heartbeat's header with the node's use of its machine: `cpu_permille,resident_bytes,
/// deliveries_per_sec` (absent from earlier builds; see `core::nodes::heartbeats::Usage`).
pub const USAGE_HEADER: &str = "Lg-Usage";
/// A heartbeat's header with the sender's last probe of its cell's store: `1` passed,
/// `0` failed; absent: no report (an earlier build ignores it, as this one ignores its
/// absence).
pub const CELL_PROBE_HEADER: &str = "Lg-Cell-Probe";
/// A heartbeat's header with the release the sender belongs to (absent from earlier
/// builds): `core::nodes::routing::release_first`.
pub const RELEASE_HEADER: &str = "Lg-Release";
/// A heartbeat's header with the peers of the sender's cell it routes to, comma-separated
/// (`core::nodes::heartbeats::Heartbeats::routes_to`, at most `MAX_ROUTES_LISTED`; absent from
/// earlier builds): what a joining node waits for before it says it is ready.
pub const ROUTES_HEADER: &str = "Lg-Routes";
/// A heartbeat's header with the epoch of the rooms homed in the sender's cell (absent
/// from earlier builds): with cell domains, how a node knows another cell's epoch while
/// that cell cannot be asked, to serve its rooms from a mirror.
pub const EPOCH_HEADER: &str = "Lg-Epoch";
/// A heartbeat's header, with cell domains: the last sequence of the sender's cell's
/// rooms stream the sender knows (see [`promotion`]).
pub const ROOMS_HEAD_HEADER: &str = "Lg-Rooms-Head";
/// A heartbeat's header, with cell domains: the promotions the sender knows,
/// `<from>><to>:<epoch>` separated by `,` (see [`promotion`]).
pub const MOVES_HEADER: &str = "Lg-Moves";
pub const REPLACE_SUBJECT: &str = "lg.user.replace";
pub const KICK_SUBJECT: &str = "lg.user.kick";
/// A node took a user's sessions (a move): the user's connections on the other nodes
/// follow there.
pub const MOVED_SUBJECT: &str = "lg.user.moved";
/// How long a call to another cell (a read through its domain, a publish forwarded to
/// its writer) may take: a silent cut does not close a leaf connection for minutes.
pub const CROSS_CELL_TIMEOUT: Duration = Duration::from_millis(800);
/// How long one NATS request may take before the node treats NATS as unreachable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The replicas of every stream and bucket when NATS has this many JetStream servers or
/// more (and `cluster_replicas` is not set): a majority survives losing one server.
pub const REPLICATED: usize = 3;

#[derive(Debug, Error)]
pub enum ClusterError {
    /// NATS could not be reached or gave no answer: callers may fall back (the session
    /// directory's cache and queue, a nonce checked on this node only).
    #[error("NATS is unreachable: {0}")]
    Unavailable(#[source] Unreachable),
    /// NATS answered, and refused (or async-nats refused before sending).
    #[error("NATS: {0}")]
    Nats(#[source] NatsError),
    /// `url` as [`url_for_log`] shows it: without its credentials.
    #[error("could not connect to NATS at {url}: {source}")]
    Connect { url: String, source: async_nats::ConnectError },
    #[error(transparent)]
    Stale(#[from] VersionError),
    #[error("corrupt cluster record: {0}")]
    Corrupt(#[source] StoreError),
    /// A record another node created first is not there when read.
    #[error("corrupt cluster record: {0} vanished")]
    Vanished(String),
    /// The sled queue that keeps directory writes through an outage failed.
    #[error("could not queue the write: {0}")]
    Queue(#[source] StoreError),
    /// A user's record kept changing under this node's read-modify-write.
    #[error("user {0}: too many concurrent updates")]
    Contended(String),
    /// With cell domains: a write to a room homed in another cell, which only that
    /// cell's writer makes.
    #[error("room {room} is homed in cell {home}: only that cell writes it")]
    NotHome { room: String, home: String },
    /// A promotion that cannot be made (see [`promotion::PromotionError`]).
    #[error(transparent)]
    Promotion(#[from] promotion::PromotionError),
    /// A room's occupancy record kept changing under this node's compare-and-set.
    #[error("room {0}: too many concurrent occupancy updates")]
    RoomContended(String),
}

/// Why NATS could not be reached.
#[derive(Debug, Error)]
pub enum Unreachable {
    #[error("not connected")]
    NotConnected,
    /// The session directory has been unreachable longer than `directory_outage_secs`.
    #[error("session directory unreachable for {} s; new sessions are refused until it is back", .0.as_secs())]
    Outage(Duration),
    /// A room's home cell did not answer (another cell's NATS, through the leaf).
    #[error("the room's home cell did not answer: {0}")]
    HomeCell(String),
    /// A cell probe's write and read took longer than this.
    #[error("the cell probe got no answer within {} ms", .0.as_millis())]
    ProbeTimedOut(Duration),
    /// A read of a mirror's state (its lag) took longer than this.
    #[error("the mirror's stream info got no answer within {} ms", .0.as_millis())]
    InfoTimedOut(Duration),
    /// A call that got no answer (timed out, connection lost, no JetStream responder).
    #[error(transparent)]
    NoAnswer(NatsError),
}

/// An async-nats error, typed as the call that failed returns it.
#[derive(Debug, Error)]
pub enum NatsError {
    #[error(transparent)]
    Stream(#[from] jetstream::context::CreateStreamError),
    /// A stream handle refused (a name JetStream does not take).
    #[error(transparent)]
    Handle(#[from] jetstream::context::GetStreamError),
    #[error(transparent)]
    Bucket(#[from] jetstream::context::KeyValueError),
    #[error(transparent)]
    Entry(#[from] nats_kv::EntryError),
    #[error(transparent)]
    Create(#[from] nats_kv::CreateError),
    #[error(transparent)]
    Update(#[from] nats_kv::UpdateError),
    #[error(transparent)]
    Put(#[from] nats_kv::PutError),
    #[error(transparent)]
    Keys(#[from] nats_kv::WatchError),
    #[error(transparent)]
    Key(#[from] nats_kv::WatcherError),
    /// A read of a stream, answered by its leader (`roomlog`: what a room knows).
    #[error(transparent)]
    Read(#[from] stream::LastRawMessageError),
    #[error(transparent)]
    Append(#[from] jetstream::context::PublishError),
    #[error(transparent)]
    Purge(#[from] stream::PurgeError),
    #[error(transparent)]
    Delete(#[from] stream::DeleteMessageError),
    #[error(transparent)]
    Publish(#[from] async_nats::PublishError),
    #[error(transparent)]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error(transparent)]
    Flush(#[from] async_nats::client::FlushError),
    /// A JetStream API request (a stream's info).
    #[error(transparent)]
    Request(#[from] jetstream::context::RequestError),
}

impl NatsError {
    /// Whether the call got no answer from NATS, judged by the error's kind: a timeout,
    /// a lost connection, no JetStream responder. async-nats reports a lost connection as
    /// `Other` for KV reads and writes, so those count as no answer too; an invalid key or
    /// subject, a JetStream error response or a size limit is an answer.
    pub fn no_answer(&self) -> bool {
        match self {
            NatsError::Stream(e) => matches!(
                e.kind(),
                CreateStreamErrorKind::TimedOut | CreateStreamErrorKind::JetStreamUnavailable
            ),
            // Opening a bucket at start-up, where nothing falls back: its kinds (the
            // name, the bucket's stream, JetStream) do not tell a timeout apart.
            NatsError::Bucket(_) | NatsError::Handle(_) => false,
            NatsError::Entry(e) => {
                matches!(e.kind(), EntryErrorKind::TimedOut | EntryErrorKind::Other)
            }
            NatsError::Create(e) => {
                matches!(e.kind(), CreateErrorKind::Publish | CreateErrorKind::Other)
            }
            NatsError::Update(e) => {
                matches!(e.kind(), UpdateErrorKind::TimedOut | UpdateErrorKind::Other)
            }
            NatsError::Put(e) => matches!(e.kind(), PutErrorKind::Publish | PutErrorKind::Ack),
            NatsError::Keys(e) => {
                matches!(e.kind(), WatchErrorKind::TimedOut | WatchErrorKind::Other)
            }
            NatsError::Key(e) => e.kind() == WatcherErrorKind::Other,
            // A stream between leaders answers "not available", or nothing (`Other`).
            NatsError::Read(e) => match e.kind() {
                LastRawMessageErrorKind::Other => true,
                LastRawMessageErrorKind::JetStream(e) => {
                    [ErrorCode::CLUSTER_NOT_AVAILABLE, ErrorCode::STREAM_OFFLINE]
                        .contains(&e.error_code())
                }
                LastRawMessageErrorKind::NoMessageFound
                | LastRawMessageErrorKind::InvalidSubject => false,
            },
            NatsError::Append(e) => {
                matches!(
                    e.kind(),
                    PublishErrorKind::TimedOut
                        | PublishErrorKind::BrokenPipe
                        | PublishErrorKind::StreamNotFound
                )
            }
            NatsError::Purge(e) => {
                matches!(e.kind(), PurgeErrorKind::TimedOut | PurgeErrorKind::Request)
            }
            NatsError::Delete(e) => matches!(
                e.kind(),
                stream::DeleteMessageErrorKind::TimedOut | stream::DeleteMessageErrorKind::Request
            ),
            NatsError::Publish(e) => e.kind() == async_nats::PublishErrorKind::Send,
            NatsError::Subscribe(e) => e.kind() == async_nats::SubscribeErrorKind::Other,
            // Either kind is the connection's: the client could not send, or got no pong.
            NatsError::Flush(_) => true,
            NatsError::Request(e) => matches!(
                e.kind(),
                jetstream::context::RequestErrorKind::TimedOut
                    | jetstream::context::RequestErrorKind::NoResponders
                    | jetstream::context::RequestErrorKind::Other
            ),
        }
    }
}

impl From<NatsError> for ClusterError {
    fn from(e: NatsError) -> Self {
        if e.no_answer() {
            ClusterError::Unavailable(Unreachable::NoAnswer(e))
        } else {
            ClusterError::Nats(e)
        }
    }
}

/// `?` on any async-nats call: the error classified by its kind.
macro_rules! from_nats_errors {
    ($($error:ty),* $(,)?) => {$(
        impl From<$error> for ClusterError {
            fn from(e: $error) -> Self {
                NatsError::from(e).into()
            }
        }
    )*};
}

from_nats_errors!(
    jetstream::context::CreateStreamError,
    jetstream::context::KeyValueError,
    jetstream::context::GetStreamError,
    nats_kv::EntryError,
    nats_kv::CreateError,
    nats_kv::UpdateError,
    nats_kv::PutError,
    nats_kv::WatchError,
    nats_kv::WatcherError,
    stream::LastRawMessageError,
    jetstream::context::PublishError,
    stream::PurgeError,
    stream::DeleteMessageError,
    async_nats::PublishError,
    async_nats::SubscribeError,
    async_nats::client::FlushError,
    jetstream::context::RequestError,
);

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
    /// `cluster_replicas`: the replicas of every stream and bucket; `None`: [`REPLICATED`]
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

/// Where every room is homed, shared by the cluster (which writes and reads it there)
/// and the router (which picks its writer there); a promotion changes it.
pub type SharedHomes = Arc<parking_lot::RwLock<RoomHomes>>;

/// `cluster_cell_domains`: this node's cell and every configured cell, each running its
/// own NATS whose JetStream domain is the cell's name, joined by leaf node connections.
#[derive(Debug, Clone)]
pub struct CellDomains {
    pub cell: String,
    /// Every configured cell (this one among them).
    pub cells: Vec<String>,
    /// Where each room is homed.
    pub homes: SharedHomes,
}

/// How a node joins NATS: its login, the token key when configured
/// (`cluster_token_secret`), and its cell's domain when cells run their own NATS.
#[derive(Clone, Default)]
pub struct Joining {
    pub auth: NatsAuth,
    pub token_secret: Option<Vec<u8>>,
    pub cells: Option<CellDomains>,
}

/// The cells of [`CellDomains`] as a node reaches them.
struct Domains {
    cell: String,
    homes: SharedHomes,
    /// Every other cell's rooms and states streams, through its domain's API, and
    /// their mirrors in this cell.
    remote: HashMap<String, RemoteCell>,
    /// Promoted cells, by origin: where their rooms are now, and their new epoch.
    moves: parking_lot::RwLock<BTreeMap<String, promotion::Moved>>,
}

/// Another cell as a node reaches it: its origin streams through its domain, and this
/// cell's mirrors of them, which keep the origin's sequence numbers and serve its rooms'
/// reads while it does not answer.
struct RemoteCell {
    rooms: stream::Stream<()>,
    states: stream::Stream<()>,
    rooms_mirror: stream::Stream<()>,
    states_mirror: stream::Stream<()>,
    /// The epoch of the cell's rooms, as its heartbeats say.
    epoch: parking_lot::Mutex<Option<String>>,
    /// Until when reads go straight to the mirrors: the cell did not answer lately.
    silent_until: parking_lot::Mutex<Option<std::time::Instant>>,
    /// The highest last sequence of the cell's rooms stream its heartbeats announced.
    head_seen: AtomicU64,
}

/// How long reads of a cell that did not answer go to the mirrors without asking it.
const SILENT_CELL_SKIP: Duration = Duration::from_secs(2);

/// The name of this cell's mirror of `cell`'s stream `stream`.
pub fn mirror_name(stream: &str, cell: &str) -> String {
    format!("{stream}_{cell}")
}

/// Where a room's events and state are kept: its home cell's streams (this node's, or
/// another cell's through its domain) and its subjects on them.
pub(crate) struct RoomPlace {
    pub rooms: stream::Stream<()>,
    pub states: stream::Stream<()>,
    /// The subjects the room's events and state are stored under (its origin cell's).
    pub room_subject: String,
    pub state_subject: String,
    /// The subjects a write is published to: the stored ones, but for a moved room the
    /// subjects its new home's stream takes and stores under the stored ones
    /// ([`promotion`]), so the old origin, back, never takes them too.
    pub room_write_subject: String,
    pub state_write_subject: String,
    /// The streams are this cell's mirrors of the home cell's.
    pub mirror: bool,
    /// The streams whose republished live copies are the room's events and states (a
    /// copy with another `Nats-Stream` comes from a fenced origin).
    pub live_stream: String,
    pub live_state_stream: String,
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

    /// With cell domains, `room`'s home cell (its namespace's `home_cell`, else a
    /// rendezvous hash over the configured cells: [`RoomHomes`]); `None` when every cell
    /// shares this NATS.
    pub fn room_home(&self, room: &str) -> Option<String> {
        self.domains.as_deref()?.homes.read().home(room).map(str::to_string)
    }

    /// With cell domains, the cell `room` was first homed in (see [`RoomHomes::origin`]).
    pub fn room_origin(&self, room: &str) -> Option<String> {
        self.domains.as_deref()?.homes.read().origin(room).map(str::to_string)
    }

    /// With cell domains, where rooms are homed (shared with the router).
    pub fn room_homes(&self) -> Option<SharedHomes> {
        self.domains.as_deref().map(|d| d.homes.clone())
    }

    /// Cells with their own NATS: how many messages this cell's mirror of each other
    /// cell's rooms stream lacks, as JetStream reports it (`StreamInfo.mirror.lag`), by
    /// cell name. One `STREAM.INFO` request per other cell (at most `MAX_CELLS - 1`), one
    /// after the other, each within [`REQUEST_TIMEOUT`]; nothing else waits on them.
    /// Empty when every cell shares this NATS.
    pub async fn mirror_lags(&self) -> Vec<(String, Result<u64, ClusterError>)> {
        let Some(domains) = self.domains.as_deref() else { return Vec::new() };
        let mut cells: Vec<&String> = domains.remote.keys().collect();
        cells.sort();
        let mut lags = Vec::with_capacity(cells.len());
        for cell in cells {
            let read = tokio::time::timeout(
                REQUEST_TIMEOUT,
                self.js.get_stream(mirror_name(ROOMS_STREAM, cell)),
            )
            .await;
            let lag = match read {
                Ok(Ok(stream)) => {
                    Ok(stream.cached_info().mirror.as_ref().map_or(0, |mirror| mirror.lag))
                }
                Ok(Err(error)) => Err(ClusterError::from(error)),
                Err(_) => {
                    Err(ClusterError::Unavailable(Unreachable::InfoTimedOut(REQUEST_TIMEOUT)))
                }
            };
            lags.push((cell.clone(), lag));
        }
        lags
    }

    /// This node's cell when cells run their own NATS.
    pub fn own_cell(&self) -> Option<&str> {
        self.domains.as_deref().map(|d| d.cell.as_str())
    }

    /// Where `room` is kept: this node's streams, or its home cell's through that cell's
    /// domain (with `mirror`, this cell's mirrors of them instead).
    pub(crate) fn room_place(&self, room: &str, mirror: bool) -> RoomPlace {
        let token = room_token(room);
        let (origin, home) = match self.domains.as_deref() {
            Some(domains) => {
                let homes = domains.homes.read();
                (homes.origin(room).map(str::to_string), homes.home(room).map(str::to_string))
            }
            None => (None, None),
        };
        let subject = |kind: &str, cell: Option<&str>| match cell {
            Some(cell) => format!("lg.{kind}.{cell}.{token}"),
            None => format!("lg.{kind}.{token}"),
        };
        let (room_subject, state_subject) =
            (subject("room", origin.as_deref()), subject("state", origin.as_deref()));
        // `moved_from`: the room's rooms moved from this origin (their streams are named after it).
        let place = |rooms: &stream::Stream<()>,
                     states: &stream::Stream<()>,
                     write_cell: Option<&str>,
                     mirror: bool,
                     moved_from: Option<&str>| RoomPlace {
            rooms: rooms.clone(),
            states: states.clone(),
            room_write_subject: subject("room", write_cell),
            state_write_subject: subject("state", write_cell),
            room_subject: room_subject.clone(),
            state_subject: state_subject.clone(),
            mirror,
            live_stream: moved_from
                .map_or(ROOMS_STREAM.to_string(), |from| mirror_name(ROOMS_STREAM, from)),
            live_state_stream: moved_from
                .map_or(STATE_STREAM.to_string(), |from| mirror_name(STATE_STREAM, from)),
        };
        if let (Some(origin), Some(home), Some(domains)) = (&origin, &home, self.domains.as_deref())
        {
            if origin != home {
                if let Some(moved) = domains.moves.read().get(origin) {
                    let write_cell = promotion::moved_subject_cell(origin, home);
                    return place(
                        &moved.rooms,
                        &moved.states,
                        Some(&write_cell),
                        false,
                        Some(origin),
                    );
                }
            }
        }
        let remote = home.as_deref().and_then(|home| self.domains.as_deref()?.remote.get(home));
        match remote {
            Some(cell) if mirror => {
                place(&cell.rooms_mirror, &cell.states_mirror, origin.as_deref(), true, None)
            }
            Some(cell) => place(&cell.rooms, &cell.states, origin.as_deref(), false, None),
            None => place(&self.rooms, &self.states, origin.as_deref(), false, None),
        }
    }

    /// `room`'s home cell when it is another cell (with cell domains), and how it is reached.
    fn remote_home(&self, room: &str) -> Option<(String, &RemoteCell)> {
        let domains = self.domains.as_deref()?;
        let home = self.room_home(room)?;
        domains.remote.get(&home).map(|cell| (home, cell))
    }

    /// Where to read `room` now: its home's streams, or this cell's mirrors of them while
    /// the home cell is marked silent ([`Cluster::home_silent`]).
    pub(crate) fn read_place(&self, room: &str) -> RoomPlace {
        let silent = self.remote_home(room).is_some_and(|(_, cell)| {
            cell.silent_until.lock().is_some_and(|until| std::time::Instant::now() < until)
        });
        self.room_place(room, silent)
    }

    /// `room`'s home cell did not answer a read: read its rooms from the mirrors for a
    /// while. Yields whether there is a mirror to read (the room is homed elsewhere).
    pub(crate) fn home_silent(&self, room: &str) -> bool {
        let Some((home, cell)) = self.remote_home(room) else { return false };
        let mut until = cell.silent_until.lock();
        if until.is_none_or(|until| std::time::Instant::now() >= until) {
            tracing::warn!(
                cell = home,
                "a room's home cell did not answer: reading its rooms from this cell's mirror"
            );
        }
        *until = Some(std::time::Instant::now() + SILENT_CELL_SKIP);
        true
    }

    /// With cell domains, what another cell's heartbeat says of its rooms' epoch.
    pub fn learn_epoch(&self, cell: &str, epoch: String) {
        let Some(remote) = self.domains.as_deref().and_then(|d| d.remote.get(cell)) else { return };
        let mut known = remote.epoch.lock();
        if known.as_deref() != Some(epoch.as_str()) {
            tracing::info!(cell, %epoch, "learned a cell's rooms epoch");
            *known = Some(epoch);
        }
    }

    /// `room`'s epoch: its home cell's rooms stream's identity (for another cell: as its
    /// heartbeats say, else asked of its JetStream).
    pub async fn room_epoch(&self, room: &str) -> Result<String, ClusterError> {
        if let Some(epoch) = self.moved_epoch(room) {
            return Ok(epoch);
        }
        let Some((home, cell)) = self.remote_home(room) else { return Ok(self.epoch.clone()) };
        if let Some(epoch) = cell.epoch.lock().clone() {
            return Ok(epoch);
        }
        let info = cell.rooms.get_info().await.map_err(|e| {
            ClusterError::Unavailable(Unreachable::HomeCell(format!("{home}: {e}")))
        })?;
        let epoch = epoch_of(&info);
        *cell.epoch.lock() = Some(epoch.clone());
        Ok(epoch)
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

/// A rooms stream's identity, its creation time: a stream made anew (its events lost)
/// has another.
fn epoch_of(info: &stream::Info) -> String {
    format!("{:016x}", info.created.unix_timestamp_nanos() as u64)
}

/// A stream's subjects: `lg.<kind>.>`, or with cell domains `lg.<kind>.<cell>.>`.
fn cell_subjects(kind: &str, cell: Option<&str>) -> String {
    match cell {
        Some(cell) => format!("lg.{kind}.{cell}.>"),
        None => format!("lg.{kind}.>"),
    }
}

impl Domains {
    /// Handles on every other cell's streams through its domain's API (nothing is
    /// asked of them yet: a cell down at start is only a cell down).
    /// Also creates this cell's mirrors of every other cell's streams in `js` (this
    /// cell's domain) when they do not exist: made while the other cell is down, a mirror
    /// starts copying once it is back.
    async fn reach(
        client: &async_nats::Client,
        js: &jetstream::Context,
        cells: &CellDomains,
        limits: &StreamLimits,
        replicas: usize,
    ) -> Result<Domains, ClusterError> {
        let mut remote = HashMap::new();
        for cell in cells.cells.iter().filter(|cell| **cell != cells.cell) {
            let mut origin = jetstream::with_domain(client.clone(), cell);
            origin.set_timeout(CROSS_CELL_TIMEOUT);
            for (stream, per_subject) in
                [(ROOMS_STREAM, limits.history_size as i64), (STATE_STREAM, 1)]
            {
                let mirror = js
                    .get_or_create_stream(stream::Config {
                        name: mirror_name(stream, cell),
                        mirror: Some(stream::Source {
                            name: stream.into(),
                            external: Some(stream::External {
                                api_prefix: format!("$JS.{cell}.API"),
                                delivery_prefix: None,
                            }),
                            ..Default::default()
                        }),
                        max_messages_per_subject: per_subject,
                        storage: stream::StorageType::File,
                        allow_direct: true,
                        num_replicas: replicas,
                        ..Default::default()
                    })
                    .await?;
                raise_replicas(js, &mirror.cached_info().config, replicas).await?;
            }
            remote.insert(
                cell.clone(),
                RemoteCell {
                    rooms: origin.get_stream_no_info(ROOMS_STREAM).await?,
                    states: origin.get_stream_no_info(STATE_STREAM).await?,
                    rooms_mirror: js.get_stream_no_info(mirror_name(ROOMS_STREAM, cell)).await?,
                    states_mirror: js.get_stream_no_info(mirror_name(STATE_STREAM, cell)).await?,
                    epoch: Default::default(),
                    silent_until: Default::default(),
                    head_seen: AtomicU64::new(0),
                },
            );
        }
        Ok(Domains {
            cell: cells.cell.clone(),
            homes: cells.homes.clone(),
            remote,
            moves: Default::default(),
        })
    }
}

/// A cluster-wide secret of 32 random bytes in `meta`: the first node to ask creates it
/// with `fresh`, the others read it. Read as part of joining ([`Cluster::connect_with`]),
/// so a node that starts while the NATS cluster settles tries again with the rest; from
/// the leader, since a bucket just made may have no replica serving direct gets yet.
async fn shared_secret(
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
async fn leader_get(bucket: &nats_kv::Store, key: &str) -> Result<Option<Vec<u8>>, ClusterError> {
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
async fn ensure_bucket(
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
async fn default_replicas(
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

/// A room name as one subject token (and KV key part): lowercase hex of its bytes.
pub fn room_token(room: &str) -> String {
    hex::encode(room)
}

/// The room a subject token names, if it is one [`room_token`] made.
pub fn room_from_token(token: &str) -> Option<String> {
    String::from_utf8(hex::decode(token).ok()?).ok()
}

/// Heartbeat body: `name\ncell\nurl\ndraining\nstarted_at_ms` (names and URLs hold no
/// newline; a body without the last line comes from a node of an earlier build).
pub fn encode_node(info: &NodeInfo) -> String {
    format!(
        "{}\n{}\n{}\n{}\n{}",
        info.name,
        info.cell,
        info.url,
        u8::from(info.draining),
        info.started_at_ms
    )
}

/// A heartbeat body, read as client input is (`core::nodes::peer_input`): at most
/// [`peer_input::MAX_HEARTBEAT_BYTES`], a node name and cell by the configuration's rule,
/// an http(s) URL, `0` or `1`, a number.
pub fn decode_node(body: &[u8]) -> Result<NodeInfo, PeerInputError> {
    let text = peer_input::text("heartbeat", body, peer_input::MAX_HEARTBEAT_BYTES)?;
    let fields = peer_input::fields("heartbeat", text, 4, 5, "4 or 5")?;
    let started_at_ms = match fields.get(4) {
        Some(text) => peer_input::number("heartbeat start time", text)?,
        None => 0,
    };
    Ok(NodeInfo {
        name: peer_input::node_name("heartbeat name", fields[0])?.into(),
        cell: peer_input::node_name("heartbeat cell", fields[1])?.into(),
        url: peer_input::url("heartbeat url", fields[2])?.into(),
        draining: peer_input::flag("heartbeat draining", fields[3])?,
        started_at_ms,
        connections: None,
        capacity: None,
        usage: None,
        probe: None,
        release: String::new(),
        routes_to: None,
    })
}

/// A heartbeat's [`RELEASE_HEADER`] (absent: an earlier build, empty): a name by the
/// configuration's rule for `release`.
pub fn decode_release(value: Option<&[u8]>) -> Result<String, PeerInputError> {
    let Some(value) = value else { return Ok(String::new()) };
    let text = peer_input::text("heartbeat release", value, peer_input::MAX_NODE_NAME_LEN)?;
    peer_input::node_name("heartbeat release", text).map(str::to_string)
}

/// A heartbeat's [`ROUTES_HEADER`] (absent: an earlier build): at most
/// [`MAX_ROUTES_LISTED`] node names, comma-separated (empty: none), read unsplit only
/// within the bytes that many names take.
pub fn decode_routes(value: Option<&[u8]>) -> Result<Option<Vec<String>>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let max = MAX_ROUTES_LISTED * (peer_input::MAX_NODE_NAME_LEN + 1);
    let text = peer_input::text("heartbeat routes", value, max)?;
    if text.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let names: Vec<&str> = text.splitn(MAX_ROUTES_LISTED + 1, ',').collect();
    if names.len() > MAX_ROUTES_LISTED {
        return Err(PeerInputError::Fields {
            what: "heartbeat routes",
            got: names.len(),
            expected: "at most 64 names",
        });
    }
    names
        .into_iter()
        .map(|name| peer_input::node_name("heartbeat routes", name).map(str::to_string))
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A heartbeat's [`CONNECTIONS_HEADER`] (absent from earlier builds), clamped to
/// [`peer_input::MAX_NODE_CONNECTIONS`].
pub fn decode_connections(
    value: Option<&[u8]>,
) -> Result<Option<peer_input::Count>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat connections", value, peer_input::MAX_HEADER_BYTES)?;
    peer_input::count("heartbeat connections", text, peer_input::MAX_NODE_CONNECTIONS).map(Some)
}

/// A heartbeat's [`CAPACITY_HEADER`] (absent from earlier builds), clamped as
/// connections are.
pub fn decode_capacity(value: Option<&[u8]>) -> Result<Option<peer_input::Count>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat capacity", value, peer_input::MAX_HEADER_BYTES)?;
    peer_input::count("heartbeat capacity", text, peer_input::MAX_NODE_CONNECTIONS).map(Some)
}

/// A heartbeat's [`USAGE_HEADER`] (absent from earlier builds): three counts, each
/// clamped (a claim past a bound is shown at the bound, never trusted past it).
pub fn decode_usage(value: Option<&[u8]>) -> Result<Option<Usage>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat usage", value, peer_input::MAX_HEADER_BYTES)?;
    let fields: Vec<&str> = text.splitn(4, ',').collect();
    if fields.len() != 3 {
        return Err(PeerInputError::Fields {
            what: "heartbeat usage",
            got: fields.len(),
            expected: "3",
        });
    }
    let count = |what, text, cap| peer_input::count(what, text, cap).map(|c| c.value);
    Ok(Some(Usage {
        cpu_permille: count("heartbeat cpu", fields[0], MAX_CPU_PERMILLE)?,
        resident_bytes: count("heartbeat memory", fields[1], MAX_RESIDENT_BYTES)?,
        deliveries_per_sec: count("heartbeat delivery rate", fields[2], MAX_DELIVERIES_PER_SEC)?,
    }))
}

/// Bounds of what a heartbeat's usage may claim: 4,096 cores, 16 TiB, 10^9 events a second.
const MAX_CPU_PERMILLE: u64 = 4_096_000;
const MAX_RESIDENT_BYTES: u64 = 16 << 40;
const MAX_DELIVERIES_PER_SEC: u64 = 1_000_000_000;

/// A heartbeat's [`EPOCH_HEADER`] (absent: an earlier build): 16 hex digits.
pub fn decode_epoch(value: Option<&[u8]>) -> Result<Option<String>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat epoch", value, peer_input::MAX_HEADER_BYTES)?;
    if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PeerInputError::BadNumber("heartbeat epoch"));
    }
    Ok(Some(text.to_string()))
}

/// A heartbeat's [`CELL_PROBE_HEADER`] (absent: no report), `0` or `1` of at most
/// [`peer_input::MAX_HEADER_BYTES`].
pub fn decode_probe(value: Option<&[u8]>) -> Result<Option<bool>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat cell probe", value, peer_input::MAX_HEADER_BYTES)?;
    peer_input::flag("heartbeat cell probe", text).map(Some)
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
        for junk in ["6", "zz", "ff", "6g", "+6"] {
            assert_eq!(room_from_token(junk), None, "{junk}");
        }
    }

    #[test]
    fn nats_errors_are_classified_by_kind() {
        let js_error = |code: u64| -> jetstream::Error {
            serde_json::from_value(
                serde_json::json!({"code": 503, "err_code": code, "description": "test"}),
            )
            .expect("a JetStream error")
        };
        let read = |kind| ClusterError::from(stream::LastRawMessageError::new(kind));
        let unreachable =
            |e: ClusterError| matches!(e, ClusterError::Unavailable(Unreachable::NoAnswer(_)));
        let cases: [(ClusterError, bool); 13] = [
            (nats_kv::EntryError::new(EntryErrorKind::TimedOut).into(), true),
            (nats_kv::EntryError::new(EntryErrorKind::InvalidKey).into(), false),
            (nats_kv::UpdateError::new(UpdateErrorKind::TimedOut).into(), true),
            (jetstream::context::PublishError::new(PublishErrorKind::StreamNotFound).into(), true),
            (jetstream::context::PublishError::new(PublishErrorKind::BrokenPipe).into(), true),
            (
                jetstream::context::PublishError::new(PublishErrorKind::MaxPayloadExceeded).into(),
                false,
            ),
            (read(LastRawMessageErrorKind::Other), true),
            (
                read(LastRawMessageErrorKind::JetStream(js_error(
                    ErrorCode::CLUSTER_NOT_AVAILABLE.0,
                ))),
                true,
            ),
            (
                read(LastRawMessageErrorKind::JetStream(js_error(ErrorCode::STREAM_NOT_FOUND.0))),
                false,
            ),
            (read(LastRawMessageErrorKind::NoMessageFound), false),
            (stream::PurgeError::new(PurgeErrorKind::TimedOut).into(), true),
            (
                stream::DeleteMessageError::new(stream::DeleteMessageErrorKind::TimedOut).into(),
                true,
            ),
            (stream::DeleteMessageError::new(stream::DeleteMessageErrorKind::Request).into(), true),
        ];
        for (error, expected) in cases {
            let text = error.to_string();
            assert_eq!(text.starts_with("NATS is unreachable: "), expected, "{text}");
            assert_eq!(unreachable(error), expected, "{text}");
        }
    }

    #[test]
    fn nats_credentials_are_not_shown() {
        let login =
            NatsAuth::UserPassword { user: "livegate".into(), password: "s3cret-pw".into() };
        assert_eq!(format!("{login:?}"), "UserPassword { user: \"livegate\", .. }");
        assert_eq!(format!("{:?}", NatsAuth::Token("t0ken-xyz".into())), "Token(..)");
    }

    #[test]
    fn cluster_errors_cross_threads() {
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<ClusterError>();
    }

    #[test]
    fn a_heartbeats_release_and_routes_are_read_as_peer_input() {
        assert_eq!(decode_release(None), Ok(String::new()), "an earlier build says none");
        assert_eq!(decode_release(Some(b"5d4f8b9c7")), Ok("5d4f8b9c7".to_string()));
        assert_eq!(decode_release(Some(b"r 1")), Err(PeerInputError::BadName("heartbeat release")));
        assert!(matches!(
            decode_release(Some("x".repeat(65).as_bytes())),
            Err(PeerInputError::TooLarge { .. })
        ));
        assert_eq!(decode_routes(None), Ok(None), "an earlier build lists nothing: not waited for");
        assert_eq!(decode_routes(Some(b"")), Ok(Some(Vec::new())));
        assert_eq!(
            decode_routes(Some(b"a,b-1")),
            Ok(Some(vec!["a".to_string(), "b-1".to_string()]))
        );
        assert_eq!(decode_routes(Some(b"a,,b")), Err(PeerInputError::BadName("heartbeat routes")));
        let most: Vec<String> = (0..MAX_ROUTES_LISTED).map(|i| format!("{i:0>64}")).collect();
        assert_eq!(
            decode_routes(Some(most.join(",").as_bytes())),
            Ok(Some(most.clone())),
            "the bound's worst case is read"
        );
        let more: Vec<String> = (0..MAX_ROUTES_LISTED + 1).map(|i| format!("n{i}")).collect();
        assert!(matches!(
            decode_routes(Some(more.join(",").as_bytes())),
            Err(PeerInputError::Fields { .. })
        ));
        let long = format!("{},x", most.join(","));
        assert!(
            matches!(decode_routes(Some(long.as_bytes())), Err(PeerInputError::TooLarge { .. })),
            "refused unread past the bound"
        );
    }

    #[test]
    fn heartbeat_bodies_round_trip() {
        let info = NodeInfo {
            name: "a".into(),
            cell: "eu".into(),
            url: "http://127.0.0.1:1".into(),
            draining: true,
            started_at_ms: 1_700_000_000_123,
            connections: None,
            capacity: None,
            usage: None,
            probe: None,
            release: String::new(),
            routes_to: None,
        };
        assert_eq!(decode_node(encode_node(&info).as_bytes()), Ok(info));
        let earlier_build =
            decode_node(b"a\neu\nhttp://x\n0").expect("a body without the start time");
        assert_eq!(earlier_build.started_at_ms, 0);
        let long_url = format!("a\neu\nhttp://{}\n0", "x".repeat(300));
        let huge = format!("a\neu\nhttp://x\n0\n{}", "1".repeat(2000));
        let cases: &[(&str, PeerInputError)] = &[
            ("", PeerInputError::Fields { what: "heartbeat", got: 1, expected: "4 or 5" }),
            ("a", PeerInputError::Fields { what: "heartbeat", got: 1, expected: "4 or 5" }),
            (
                "a\nb\nhttp://c",
                PeerInputError::Fields { what: "heartbeat", got: 3, expected: "4 or 5" },
            ),
            ("\nb\nhttp://c\n0", PeerInputError::BadName("heartbeat name")),
            (
                "a\nb\nhttp://c\n0\n5\nmore",
                PeerInputError::Fields { what: "heartbeat", got: 6, expected: "4 or 5" },
            ),
            ("a b\neu\nhttp://x\n0", PeerInputError::BadName("heartbeat name")),
            ("a\ne u\nhttp://x\n0", PeerInputError::BadName("heartbeat cell")),
            ("a\neu\nhttp://attacker.example/ x\n0", PeerInputError::BadUrl("heartbeat url")),
            ("a\neu\njavascript:x\n0", PeerInputError::BadUrl("heartbeat url")),
            (long_url.as_str(), PeerInputError::BadUrl("heartbeat url")),
            ("a\neu\nhttp://x\nyes", PeerInputError::BadFlag("heartbeat draining")),
            ("a\neu\nhttp://x\n0\n-1", PeerInputError::BadNumber("heartbeat start time")),
            (
                huge.as_str(),
                PeerInputError::TooLarge {
                    what: "heartbeat",
                    len: huge.len(),
                    max: peer_input::MAX_HEARTBEAT_BYTES,
                },
            ),
        ];
        for (junk, error) in cases {
            assert_eq!(decode_node(junk.as_bytes()).as_ref(), Err(error), "{junk:?}");
        }
    }

    #[test]
    fn a_heartbeat_reports_its_epoch_as_16_hex_digits_or_nothing() {
        assert_eq!(decode_epoch(None), Ok(None), "an earlier build says nothing");
        assert_eq!(
            decode_epoch(Some(b"0123456789abcDEF")),
            Ok(Some("0123456789abcDEF".to_string()))
        );
        let long = "a".repeat(100);
        for junk in [
            "",
            "0123456789abcde",
            "0123456789abcdef0",
            "0123456789abcdeg",
            " 123456789abcdef",
            long.as_str(),
        ] {
            assert!(decode_epoch(Some(junk.as_bytes())).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn a_heartbeat_reports_its_cell_probe_or_nothing() {
        assert_eq!(decode_probe(None), Ok(None), "an earlier build says nothing");
        assert_eq!(decode_probe(Some(b"1")), Ok(Some(true)));
        assert_eq!(decode_probe(Some(b"0")), Ok(Some(false)));
        let long = "1".repeat(100);
        for junk in ["", "yes", "2", " 1", long.as_str()] {
            assert!(decode_probe(Some(junk.as_bytes())).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn a_heartbeat_claims_at_most_the_cap() {
        use peer_input::{Count, MAX_NODE_CONNECTIONS};
        let read = |v: &str| decode_connections(Some(v.as_bytes()));
        assert_eq!(decode_connections(None), Ok(None), "an earlier build says nothing");
        assert_eq!(read("42"), Ok(Some(Count { value: 42, clamped: false })));
        for claim in ["1000000000000000", "18446744073709551615", "99999999999999999999999"] {
            assert_eq!(
                read(claim),
                Ok(Some(Count { value: MAX_NODE_CONNECTIONS, clamped: true })),
                "{claim}"
            );
        }
        for junk in ["", "-1", "1e15", "lots", "9".repeat(100).as_str()] {
            assert!(read(junk).is_err(), "{junk:?}");
        }
    }
}
