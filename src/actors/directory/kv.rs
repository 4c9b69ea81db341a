//! Session records in the cluster's NATS KV bucket. Every node writes there, so a
//! session is always read back from the bucket; records age out with the bucket's age
//! limit, so the directory refreshes those connected here before it reaches them.

use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use super::seam::{DirectoryError, Expired, ExpiryPass, SessionStore, WriteError};
use crate::cluster::kv::KvSessions;
use crate::cluster::ClusterError;
use crate::store::SessionRecord;

impl From<ClusterError> for WriteError {
    fn from(e: ClusterError) -> Self {
        match e {
            ClusterError::Stale(stale) => WriteError::Stale(stale),
            other => WriteError::Failed(other.into()),
        }
    }
}

impl SessionStore for KvSessions {
    fn session<'a>(
        &'a self,
        session: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<SessionRecord>, DirectoryError>> {
        Box::pin(async move { Ok(KvSessions::session(self, session).await?) })
    }

    fn write<'a>(
        &'a self,
        read_version: Option<u64>,
        record: &'a SessionRecord,
    ) -> LocalBoxFuture<'a, Result<SessionRecord, WriteError>> {
        Box::pin(async move { Ok(self.write_session(read_version, record).await?) })
    }

    fn sessions_of_user<'a>(
        &'a self,
        user: &'a str,
    ) -> LocalBoxFuture<'a, Result<Vec<SessionRecord>, DirectoryError>> {
        Box::pin(async move { Ok(KvSessions::sessions_of_user(self, user).await?) })
    }

    fn last_migration<'a>(
        &'a self,
        user: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<u64>, DirectoryError>> {
        Box::pin(async move { Ok(KvSessions::last_migration(self, user).await?) })
    }

    fn set_last_migration<'a>(
        &'a self,
        user: &'a str,
        at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<(), DirectoryError>> {
        Box::pin(async move { Ok(KvSessions::set_last_migration(self, user, at_ms).await?) })
    }

    /// This node's share is not counted: that would read every record.
    fn count<'a>(
        &'a self,
        _node: &'a str,
    ) -> LocalBoxFuture<'a, Result<(usize, usize), DirectoryError>> {
        Box::pin(async move { Ok((self.count_sessions().await?, 0)) })
    }

    fn memory_is_current(&self) -> bool {
        false
    }

    fn recall<'a>(
        &'a self,
        session: &'a str,
        _warmup: bool,
        _incarnation: u64,
    ) -> LocalBoxFuture<'a, Result<Option<SessionRecord>, DirectoryError>> {
        SessionStore::session(self, session)
    }

    /// Cluster mode marks every connected session, new ones too: its orphans are the marks.
    fn connected(
        &self,
        session: &str,
        incarnation: u64,
        _created: bool,
    ) -> Result<(), DirectoryError> {
        Ok(self.mark_connected(session, incarnation)?)
    }

    fn released(
        &self,
        session: &str,
        _now_ms: u64,
        _incarnation: u64,
    ) -> Result<(), DirectoryError> {
        Ok(self.mark_disconnected(session)?)
    }

    fn release_orphans(
        &self,
        now_ms: u64,
        incarnation: u64,
    ) -> LocalBoxFuture<'_, Result<usize, DirectoryError>> {
        Box::pin(async move {
            let done = KvSessions::release_orphans(self, now_ms, incarnation).await?;
            if done.left > 0 || done.beyond > 0 {
                tracing::info!(
                    released = done.released,
                    left = done.left,
                    beyond = done.beyond,
                    "sessions left connected by the previous run: some were not rewritten"
                );
            }
            Ok(done.released)
        })
    }

    fn refresh_after(&self, ttl: Duration) -> Option<Duration> {
        // The bucket's age limit is twice the TTL: half a TTL leaves a margin of 1.5.
        Some(ttl / 2)
    }

    /// Nothing to delete (the bucket's age limit does that); the outage cache is pruned.
    fn expire(&self, pass: &ExpiryPass<'_>) -> Result<Expired, DirectoryError> {
        self.prune_cache(Duration::from_millis(pass.ttl_ms), pass.cache_max);
        Ok(Expired::default())
    }
}
