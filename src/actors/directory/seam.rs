//! The directory's seam to where session records live: the [`SessionStore`] trait its
//! backends implement (`embedded`, `kv`), its errors, an expiry pass's limits and outcome,
//! and [`UserMoves`], where a move is told to the other nodes.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use crate::actors::liveness::Unroutable;
use crate::cluster::ClusterError;
use crate::core::nodes::sessions::{BudgetError, VersionError};
use crate::store::{SessionRecord, StoreError};

#[derive(Debug, Clone, thiserror::Error)]
pub enum DirectoryError {
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The session is served by another live node: the client goes there.
    #[error("session served by node {node} ({url})")]
    Elsewhere { node: String, url: String },
    /// No node can serve the session: none alive, or no cell healthy.
    #[error("no node can serve the session: {0}")]
    Unroutable(#[source] Unroutable),
    /// Cluster mode: NATS has been unreachable too long to hand out new sessions.
    #[error("{0}")]
    Unavailable(#[source] Arc<ClusterError>),
    #[error("session directory: {0}")]
    Store(#[source] Arc<StoreError>),
    #[error("session directory: {0}")]
    Cluster(#[source] Arc<ClusterError>),
    #[error("session directory: a fresh session id was taken: {0}")]
    IdTaken(#[source] VersionError),
}

impl From<StoreError> for DirectoryError {
    fn from(e: StoreError) -> Self {
        DirectoryError::Store(Arc::new(e))
    }
}

impl From<ClusterError> for DirectoryError {
    fn from(e: ClusterError) -> Self {
        match e {
            unavailable @ ClusterError::Unavailable(..) => {
                DirectoryError::Unavailable(Arc::new(unavailable))
            }
            other => DirectoryError::Cluster(Arc::new(other)),
        }
    }
}

/// A directory write that lost a compare-and-swap, or failed.
pub enum WriteError {
    Stale(VersionError),
    Failed(DirectoryError),
}

impl From<DirectoryError> for WriteError {
    fn from(e: DirectoryError) -> Self {
        WriteError::Failed(e)
    }
}

/// One expiry pass's limits.
pub struct ExpiryPass<'a> {
    pub now_ms: u64,
    pub ttl_ms: u64,
    /// Records examined at most.
    pub batch: usize,
    /// Disconnected sessions a backend keeps in memory at most.
    pub cache_max: usize,
    /// Whether a session has a connection here (never expired then).
    pub is_live: &'a dyn Fn(&str) -> bool,
}

/// What an expiry pass did.
#[derive(Debug, Default)]
pub struct Expired {
    pub deleted: Vec<String>,
    /// The pass stopped at its batch limit: run another.
    pub more: bool,
}

/// Where session records live, as the directory needs them. Implemented by the embedded
/// store ([`embedded`](super::embedded)) and by the cluster's KV bucket ([`kv`](super::kv)); a third backend is one
/// more implementation and a line in the wiring.
pub trait SessionStore: Send + Sync + 'static {
    /// The stored record of `session`.
    fn session<'a>(
        &'a self,
        session: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<SessionRecord>, DirectoryError>>;
    /// Write `record` if the stored version is still `read_version` (`None`: must not
    /// exist); the written record has the next version.
    fn write<'a>(
        &'a self,
        read_version: Option<u64>,
        record: &'a SessionRecord,
    ) -> LocalBoxFuture<'a, Result<SessionRecord, WriteError>>;
    fn sessions_of_user<'a>(
        &'a self,
        user: &'a str,
    ) -> LocalBoxFuture<'a, Result<Vec<SessionRecord>, DirectoryError>>;
    fn last_migration<'a>(
        &'a self,
        user: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<u64>, DirectoryError>>;
    fn set_last_migration<'a>(
        &'a self,
        user: &'a str,
        at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<(), DirectoryError>>;
    /// Sessions stored, and how many of them `node` owns (0 where counting is costly).
    fn count<'a>(
        &'a self,
        node: &'a str,
    ) -> LocalBoxFuture<'a, Result<(usize, usize), DirectoryError>>;
    /// Whether what this process remembers of a session is current (it is the only
    /// writer), or the record must be read on every handshake (other nodes write too).
    fn memory_is_current(&self) -> bool;
    /// The record of a session this process does not remember, if a handshake may reuse
    /// it: `warmup` says the node is in warm-up, `incarnation` names this run.
    fn recall<'a>(
        &'a self,
        session: &'a str,
        warmup: bool,
        incarnation: u64,
    ) -> LocalBoxFuture<'a, Result<Option<SessionRecord>, DirectoryError>>;
    /// How old a record of a session connected here may get before it is rewritten, for
    /// backends whose records age out by themselves (`None`: they never do).
    fn refresh_after(&self, _ttl: Duration) -> Option<Duration> {
        None
    }
    /// A session's first connection here opened; `created`: its handshake created the
    /// session (a backend may know such a session connected without a mark).
    fn connected(
        &self,
        _session: &str,
        _incarnation: u64,
        _created: bool,
    ) -> Result<(), DirectoryError> {
        Ok(())
    }
    /// A session's last connection here closed at `now_ms`.
    fn released(
        &self,
        _session: &str,
        _now_ms: u64,
        _incarnation: u64,
    ) -> Result<(), DirectoryError> {
        Ok(())
    }
    /// At start-up, before the node is ready: sessions an earlier run left connected count
    /// as released now (their expiry counts from this start). Replies with how many.
    fn release_orphans(
        &self,
        now_ms: u64,
        incarnation: u64,
    ) -> LocalBoxFuture<'_, Result<usize, DirectoryError>>;
    /// Delete what is past its TTL (at most `pass.batch` records examined).
    fn expire(&self, pass: &ExpiryPass<'_>) -> Result<Expired, DirectoryError>;
    /// Records stored, where that is known without reading them.
    fn stored(&self) -> Option<u64> {
        None
    }
}

/// Where a move is told to the other nodes (cluster mode: `server::bridges`, on NATS).
/// Each node then closes the user's connections it holds that opened before the move
/// with 4421 and this node's URL, so they reconnect here, to sessions that are this
/// node's already: no move, no charge.
pub trait UserMoves: Send + Sync {
    /// This node took `user`'s sessions from other nodes at `at_ms`.
    fn moved(&self, user: &str, at_ms: u64);
}
