//! What a connection is given: the settings every connection shares, who is connected,
//! and the rooms it subscribes to as it starts.

use std::sync::Arc;
use std::time::Duration;

use crate::actors::messages::CredentialTimes;
use crate::actors::publish::Publisher;
use crate::core::credentials::ResumeGrant;
use crate::core::delivery::connection::Settings as MachineSettings;
use crate::store::credentials::ResumeRevocations;

/// What every connection shares.
pub struct ConnectionSettings {
    /// Where connections register (one handle shared by all: each clone of an actix
    /// address is two allocations).
    pub registry: actix::Addr<crate::actors::registry::Registry>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub revocations: Arc<dyn ResumeRevocations>,
    /// Clients' `publish` ops go through it, the HTTP API's path (cluster mode too); it
    /// knows each room's `max_event_bytes`.
    pub publisher: Publisher,
    pub node: String,
    pub heartbeat: Duration,
    pub max_subscriptions: usize,
    /// Largest client message, assembled from continuation frames.
    pub max_message_bytes: usize,
    /// Bytes sent to a connection but not yet written before it is closed with 4009.
    pub max_outbox_bytes: usize,
    /// Client messages per second (burst: twice that); 0: no limit.
    pub max_messages_per_sec: u64,
    /// Refused client messages per minute before a close with 1008.
    pub max_bad_messages: u64,
    /// Room actors a connection may start per second (a subscribe or history read of a
    /// room not live here); burst [`room_start_burst`]; 0: no limit.
    pub max_room_starts_per_sec: u64,
    /// Largest `limit` of a history read.
    pub max_history_limit: usize,
    /// Close a connection that has not subscribed to a room by then (None: never).
    pub subscribe_timeout: Option<Duration>,
    /// Told of every client publish once it is durable (`client_published`); `None`:
    /// webhooks are off.
    pub webhooks: Option<crate::actors::webhooks::Webhooks>,
    /// The connection machine's limits, made once per kind of connection and shared.
    pub limits: SharedLimits,
}

/// One copy of the connection machine's settings per kind of connection (whether the
/// client sends, whether rooms write to its socket directly), made on first use: they
/// are the same for every connection of a kind, and each connection kept its own copy.
#[derive(Default)]
pub struct SharedLimits([std::sync::OnceLock<Arc<MachineSettings>>; 4]);

impl SharedLimits {
    pub fn get(
        &self,
        reads: bool,
        direct: bool,
        make: impl FnOnce() -> MachineSettings,
    ) -> Arc<MachineSettings> {
        let kind = usize::from(reads) * 2 + usize::from(direct);
        let shared = self.0[kind].get_or_init(|| Arc::new(make()));
        debug_assert!(shared.reads == reads && shared.direct == direct);
        shared.clone()
    }
}

/// Who is connected, as the token said.
#[derive(Debug, Clone)]
pub struct Identity {
    pub user: Arc<str>,
    pub device: Arc<str>,
    pub session: String,
    /// Room patterns from the token (empty: any room). The connection's machine takes
    /// them when the connection is made.
    pub rooms: Vec<String>,
    /// Room patterns the token lets it publish to (empty: none; never an inbox); taken
    /// by the machine like `rooms`.
    pub publish: Vec<String>,
    /// Whether the node validated this session in warm-up (reported in `welcome`).
    pub warmup: bool,
    /// This connection's one-time resume credential (sent in `welcome`; its text is
    /// dropped once sent, its times are kept).
    pub resume: Option<ResumeGrant>,
    /// When the credential it opened with was issued and checked against the kicks.
    pub credential: CredentialTimes,
}

/// A room a connection subscribes to as it starts (an SSE stream's `rooms`), with the
/// position its cursor named, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialSubscription {
    pub room: String,
    pub since: Option<u64>,
    pub epoch: Option<String>,
    /// With the room's state (`state=1`).
    pub state: bool,
    /// Send the room's presence frames (`&presence=1`).
    pub presence: bool,
}
