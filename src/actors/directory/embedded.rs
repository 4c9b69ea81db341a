//! Session records in the embedded store (single node). This process is the only writer,
//! so what it remembers is current; it records which sessions are connected and when the
//! last connection of each closed, and deletes the records past their TTL itself.

use futures_util::future::{ready, LocalBoxFuture};

use super::seam::{DirectoryError, Expired, ExpiryPass, SessionStore, WriteError};
use crate::store::{SessionRecord, Store, StoreError};

impl From<StoreError> for WriteError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Stale(stale) => WriteError::Stale(stale),
            other => WriteError::Failed(other.into()),
        }
    }
}

impl SessionStore for Store {
    fn session<'a>(
        &'a self,
        session: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<SessionRecord>, DirectoryError>> {
        Box::pin(ready(self.sessions().get(session).map_err(Into::into)))
    }

    fn write<'a>(
        &'a self,
        read_version: Option<u64>,
        record: &'a SessionRecord,
    ) -> LocalBoxFuture<'a, Result<SessionRecord, WriteError>> {
        Box::pin(ready(self.sessions().write(read_version, record).map_err(Into::into)))
    }

    fn sessions_of_user<'a>(
        &'a self,
        user: &'a str,
    ) -> LocalBoxFuture<'a, Result<Vec<SessionRecord>, DirectoryError>> {
        Box::pin(ready(self.sessions().of_user(user).map_err(Into::into)))
    }

    fn last_migration<'a>(
        &'a self,
        user: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<u64>, DirectoryError>> {
        Box::pin(ready(self.migrations().last(user).map_err(Into::into)))
    }

    fn set_last_migration<'a>(
        &'a self,
        user: &'a str,
        at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<(), DirectoryError>> {
        Box::pin(ready(self.migrations().set_last(user, at_ms).map_err(Into::into)))
    }

    fn count<'a>(
        &'a self,
        node: &'a str,
    ) -> LocalBoxFuture<'a, Result<(usize, usize), DirectoryError>> {
        Box::pin(ready(self.sessions().count(node).map_err(Into::into)))
    }

    fn memory_is_current(&self) -> bool {
        true
    }

    /// During warm-up every stored session may come back; after it, only those this run
    /// has seen (the rest belong to a run before the restart and are treated as new).
    fn recall<'a>(
        &'a self,
        session: &'a str,
        warmup: bool,
        incarnation: u64,
    ) -> LocalBoxFuture<'a, Result<Option<SessionRecord>, DirectoryError>> {
        let recalled = if warmup {
            self.sessions().get(session)
        } else {
            match self.sessions().seen(session) {
                Ok(Some(seen)) if seen.seen_by == incarnation => self.sessions().get(session),
                Ok(_) => Ok(None),
                Err(e) => Err(e),
            }
        };
        Box::pin(ready(recalled.map_err(Into::into)))
    }

    /// A session created by this handshake has no `session_seen` record yet, which says
    /// connected by itself (`store::sessions`): only a session that closed before is marked.
    fn connected(
        &self,
        session: &str,
        incarnation: u64,
        created: bool,
    ) -> Result<(), DirectoryError> {
        if created {
            return Ok(());
        }
        Ok(self.sessions().connected(session, incarnation)?)
    }

    fn released(&self, session: &str, now_ms: u64, incarnation: u64) -> Result<(), DirectoryError> {
        Ok(self.sessions().released(session, now_ms, incarnation)?)
    }

    fn release_orphans(
        &self,
        now_ms: u64,
        incarnation: u64,
    ) -> LocalBoxFuture<'_, Result<usize, DirectoryError>> {
        Box::pin(ready(self.sessions().release_orphans(now_ms, incarnation).map_err(Into::into)))
    }

    fn expire(&self, pass: &ExpiryPass<'_>) -> Result<Expired, DirectoryError> {
        let cutoff = pass.now_ms.saturating_sub(pass.ttl_ms);
        let (examined, deleted) = self.sessions().expire(cutoff, pass.batch, pass.is_live)?;
        Ok(Expired { more: examined == pass.batch, deleted })
    }

    fn stored(&self) -> Option<u64> {
        Some(self.sessions().stored())
    }
}
