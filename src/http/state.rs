//! What every handler shares: [`AppState`], built once by the server and handed to every
//! worker, and the store probe behind `/healthz` it keeps.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use actix::Addr;

use super::limits::{ConnectionLimits, SharedAccess};
use super::{durable, jwt, seams, sockets};
use crate::actors::connection::ConnectionSettings;
use crate::actors::directory::{Directory, SessionOpener, SessionStore};
use crate::actors::liveness::{LivenessActor, Router};
use crate::actors::publish::Publisher;
use crate::actors::registry::Registry;
use crate::actors::rooms::Rooms;
use crate::config::Config;
use crate::core::credentials::spent::SpentNonces;
use crate::core::nodes::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::store::credentials::CredentialStore;
use crate::store::Store;

/// Loads the configuration again (file, environment, flags) for a reload.
pub type ReloadConfig = Box<dyn Fn() -> Result<Config, crate::config::ConfigError> + Send + Sync>;

/// Everything a handler needs, shared by all workers.
pub struct AppState {
    pub config: Arc<Config>,
    /// API keys and allowed origins; replaced by a reload.
    pub access: SharedAccess,
    /// Where a reload reads the configuration; `None` keeps the one the node started with.
    pub reload: Option<ReloadConfig>,
    pub limits: Arc<ConnectionLimits>,
    /// Plain HTTP sockets' places in the open-file budget (`max_http_connections`).
    pub sockets: Arc<sockets::SocketBudget>,
    pub store: Store,
    pub rooms: Rooms,
    pub registry: Addr<Registry>,
    pub directory: Addr<Directory>,
    /// Handshakes open their sessions through it, on their own thread.
    pub session_opener: SessionOpener,
    /// Handshakes wait here for their spent nonce and session to be durable (group commit).
    pub handshake_flushes: Arc<durable::HandshakeFlushes>,
    /// Session records (sled, or the KV bucket in cluster mode), for routing questions.
    pub sessions: Arc<dyn SessionStore>,
    /// Where token nonces are marked used (the store, or NATS in cluster mode).
    pub credentials: Arc<dyn CredentialStore>,
    /// Nonces this node knows are void, checked before `credentials` is asked anything.
    pub spent: Arc<parking_lot::Mutex<SpentNonces>>,
    /// Kicks reach other nodes' connections through it (cluster mode).
    pub other_nodes: Arc<dyn seams::OtherNodes>,
    pub liveness: Addr<LivenessActor>,
    /// Where sessions are served: `/v1/route` and the handshakes ask it.
    pub router: Arc<Router>,
    /// This node's part of rebalances, and what it planned (`/v1/admin/rebalance`).
    pub rebalance: crate::actors::rebalance::Rebalance,
    /// Every publish goes through it (forwarded to the room's writer in cluster mode).
    pub publisher: Publisher,
    /// The webhooks' queue and senders (`None`: webhooks off); replays go through it.
    pub webhooks: Option<crate::actors::webhooks::Webhooks>,
    /// The webhooks given up (`/v1/admin/webhooks/dead`).
    pub dead_letters: crate::actors::webhooks::DeadLetters,
    pub metrics: Arc<Metrics>,
    pub token_secret: Vec<u8>,
    /// The keys JWTs a backend signs are checked with (none: JWTs are refused).
    pub jwt: Arc<jwt::JwtKeys>,
    pub connection: Arc<ConnectionSettings>,
    pub lifecycle: Arc<Lifecycle>,
    pub next_conn: AtomicU64,
    pub started: std::time::Instant,
    /// The last store probe behind `/healthz`.
    pub health: HealthProbe,
    /// Demo mode: the score page at `/` and unauthenticated demo tokens.
    pub demo: bool,
    /// Development mode (`serve --dev`): `POST /v1/tokens` from a page of a listed origin
    /// needs no API key.
    pub dev: bool,
}

/// How often `/healthz` really probes the store; the answers in between repeat the last
/// probe's outcome.
pub(super) const HEALTH_PROBE_EVERY_MS: u64 = 1000;

/// The last store probe behind `/healthz`: when (ms) and whether it succeeded.
#[derive(Default)]
pub struct HealthProbe(parking_lot::Mutex<Option<(u64, bool)>>);

impl HealthProbe {
    /// Whether the store can serve: the last probe's outcome while it is recent, else a
    /// new probe (callers meanwhile wait for it and share its outcome).
    pub(super) fn check(&self, store: &Store, metrics: &Metrics, now_ms: u64) -> bool {
        let mut last = self.0.lock();
        if let Some((at, healthy)) = *last {
            if (at..at + HEALTH_PROBE_EVERY_MS).contains(&now_ms) {
                return healthy;
            }
        }
        metrics.store_probes.inc();
        let healthy = match store.probe() {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, "store probe failed");
                false
            }
        };
        *last = Some((now_ms, healthy));
        healthy
    }
}
