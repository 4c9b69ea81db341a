//! The session directory in the `lg_sessions` KV bucket. `s.<session>` holds a
//! [`SessionRecord`] whose `version` is checked on every write (compare-and-set on the
//! entry's KV revision, so a stale write from another node loses); `u.<user>` holds the
//! user's sessions and migration budget.
//!
//! While NATS is unreachable, reads come from a local cache (fresh for [`CACHE_TTL`];
//! after that only records this node owns are trusted), and writes are queued in sled and
//! replayed by version when NATS is back (a replay whose record moved on is dropped and
//! logged). A move charged to a user's migration budget is kept in this node's store
//! as well, so the budget still holds during an outage (for the charges this node made)
//! and the charge reaches the directory when NATS is back. After `outage_limit` without NATS, new writes, and so new sessions, are
//! refused instead of guessed.
//!
//! Records expire by the bucket's age limit (twice `session_ttl_secs`); the directory
//! rewrites the records of sessions connected to this node every half TTL, and a new
//! session prunes the user's list of ids whose records have gone. Which sessions are
//! connected here is marked in this node's store, so a start after a crash rewrites their
//! records as closed at the start (a bounded number: [`ORPHANS_RELEASED_MAX`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{CreateErrorKind, Store as Bucket, UpdateErrorKind};
use parking_lot::Mutex;

use super::errors::{ClusterError, Unreachable};
use super::names::{room_token, SESSIONS_BUCKET};
use super::Cluster;
use crate::core::nodes::sessions::{next_version, VersionError};
use crate::store::records;
use crate::store::{QueuedSessionWrite, SessionRecord, Store, UserRecord};

/// How long a cached record is trusted while NATS is unreachable.
pub const CACHE_TTL: Duration = Duration::from_secs(60);
/// Attempts of a read-modify-write of a user entry that keeps meeting other writers.
const USER_UPDATE_ATTEMPTS: usize = 8;
/// Records of sessions an earlier run left connected that a start rewrites at most
/// ([`KvSessions::release_orphans`]); the rest age out from their last refresh.
pub const ORPHANS_RELEASED_MAX: usize = 10_000;
/// Of those, rewritten at once.
const ORPHANS_IN_FLIGHT: usize = 32;

/// What a start did with the sessions an earlier run of this node left connected.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReleasedOrphans {
    /// Records still owned here, rewritten as closed now.
    pub released: usize,
    /// Records gone, moved to another node, or unreadable: left as they are.
    pub left: usize,
    /// Beyond [`ORPHANS_RELEASED_MAX`]: not read.
    pub beyond: usize,
}

struct Cached {
    record: SessionRecord,
    at: Instant,
}

#[derive(Clone)]
pub struct KvSessions {
    bucket: Bucket,
    cluster: Cluster,
    /// Where writes wait during an outage; `None` only for tools and tests.
    queue: Option<Store>,
    outage_limit: Duration,
    cache: Arc<Mutex<HashMap<String, Cached>>>,
    outage_since: Arc<Mutex<Option<Instant>>>,
    /// Users whose budget charge is kept in this node's store but not yet in the
    /// directory (`None` until the first replay, which writes every kept charge: a
    /// restart forgets which were pending).
    charges_pending: Arc<Mutex<Option<HashSet<String>>>>,
}

fn session_key(session: &str) -> String {
    format!("s.{}", room_token(session))
}

fn user_key(user: &str) -> String {
    format!("u.{}", room_token(user))
}

fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, ClusterError> {
    records::decode(what, bytes).map_err(ClusterError::Corrupt)
}

impl KvSessions {
    /// The directory without an outage queue: writes fail while NATS is unreachable.
    pub async fn open(cluster: &Cluster) -> Result<KvSessions, ClusterError> {
        KvSessions::open_with(cluster, None, Duration::ZERO).await
    }

    pub async fn open_with(
        cluster: &Cluster,
        queue: Option<Store>,
        outage_limit: Duration,
    ) -> Result<KvSessions, ClusterError> {
        let bucket = cluster.js.get_key_value(SESSIONS_BUCKET).await?;
        Ok(KvSessions {
            bucket,
            cluster: cluster.clone(),
            queue,
            outage_limit,
            cache: Arc::new(Mutex::new(HashMap::new())),
            outage_since: Arc::new(Mutex::new(None)),
            charges_pending: Arc::new(Mutex::new(None)),
        })
    }

    fn reachable(&self) -> bool {
        self.cluster.connected()
    }

    fn note_outage(&self, error: &ClusterError) {
        let mut since = self.outage_since.lock();
        if since.is_none() {
            tracing::warn!(%error, "session directory unreachable; serving from cache, queueing writes");
            *since = Some(Instant::now());
        }
    }

    fn note_reachable(&self) {
        self.outage_since.lock().take();
    }

    /// How long the directory has been unreachable.
    pub fn outage(&self) -> Option<Duration> {
        self.outage_since.lock().map(|t| t.elapsed())
    }

    fn remember(&self, record: &SessionRecord) {
        self.cache
            .lock()
            .insert(record.session.clone(), Cached { record: record.clone(), at: Instant::now() });
    }

    /// Forget cached records older than `max_age`, and the oldest beyond `keep`: the
    /// cache only bridges an outage.
    pub fn prune_cache(&self, max_age: Duration, keep: usize) {
        let mut cache = self.cache.lock();
        cache.retain(|_, c| c.at.elapsed() < max_age);
        if cache.len() > keep {
            let mut ages: Vec<Instant> = cache.values().map(|c| c.at).collect();
            ages.sort_unstable();
            let cutoff = ages[ages.len() - keep.max(1)];
            cache.retain(|_, c| c.at >= cutoff);
        }
    }

    /// The record under `key` and its KV revision, straight from NATS.
    async fn read<T: serde::de::DeserializeOwned>(
        &self,
        key: String,
    ) -> Result<Option<(T, u64)>, ClusterError> {
        if !self.reachable() {
            return Err(ClusterError::Unavailable(Unreachable::NotConnected));
        }
        let entry = self.bucket.entry(key).await?;
        match entry {
            Some(entry) if !entry.value.is_empty() => {
                Ok(Some((decode("lg_sessions", &entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// The record of `session` and its KV revision, straight from NATS.
    pub async fn entry(&self, session: &str) -> Result<Option<(SessionRecord, u64)>, ClusterError> {
        self.read(session_key(session)).await
    }

    /// The owner record of a session; from the cache while NATS is unreachable.
    pub async fn session(&self, session: &str) -> Result<Option<SessionRecord>, ClusterError> {
        match self.entry(session).await {
            Ok(found) => {
                self.note_reachable();
                if let Some((record, _)) = &found {
                    self.remember(record);
                }
                Ok(found.map(|(record, _)| record))
            }
            Err(error @ ClusterError::Unavailable(_)) => {
                self.note_outage(&error);
                let cache = self.cache.lock();
                Ok(cache
                    .get(session)
                    .filter(|c| c.at.elapsed() < CACHE_TTL || c.record.owner == self.cluster.node)
                    .map(|c| c.record.clone()))
            }
            Err(e) => Err(e),
        }
    }

    /// Write `record` if the stored version is still `read_version` (`None`: must not
    /// exist); the written record carries the next version. A stale write changes
    /// nothing and fails with [`ClusterError::Stale`]. While NATS is unreachable the write
    /// is queued (until the outage is older than the limit, then refused).
    pub async fn write_session(
        &self,
        read_version: Option<u64>,
        record: &SessionRecord,
    ) -> Result<SessionRecord, ClusterError> {
        match self.write_now(read_version, record).await {
            Err(error @ ClusterError::Unavailable(_)) => {
                self.note_outage(&error);
                self.queue_write(read_version, record, error)
            }
            Ok(written) => {
                self.note_reachable();
                self.remember(&written);
                Ok(written)
            }
            Err(e) => Err(e),
        }
    }

    async fn write_now(
        &self,
        read_version: Option<u64>,
        record: &SessionRecord,
    ) -> Result<SessionRecord, ClusterError> {
        let current = self.entry(&record.session).await?;
        let version = next_version(read_version, current.as_ref().map(|(r, _)| r.version))?;
        let written = SessionRecord { version, ..record.clone() };
        let value = records::encode(&written);
        let key = session_key(&record.session);
        let stale =
            || ClusterError::Stale(VersionError::Stale { read: read_version, stored: None });
        match current {
            None => match self.bucket.create(&key, value.into()).await {
                Ok(_) => {}
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => return Err(stale()),
                Err(e) => return Err(e.into()),
            },
            Some((_, revision)) => match self.bucket.update(&key, value.into(), revision).await {
                Ok(_) => {}
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => return Err(stale()),
                Err(e) => return Err(e.into()),
            },
        }
        // A new session also drops the ids whose records the bucket's age limit removed,
        // so the user's list holds only sessions that still exist.
        let mut expired = Vec::new();
        if read_version.is_none() {
            for session in
                self.user(&written.user).await?.map(|(u, _)| u.sessions).unwrap_or_default()
            {
                if self.entry(&session).await?.is_none() {
                    expired.push(session);
                }
            }
        }
        let session = written.session.clone();
        self.update_user(&written.user, move |user| {
            user.sessions.retain(|s| !expired.contains(s));
            if !user.sessions.contains(&session) {
                user.sessions.push(session.clone());
            }
        })
        .await?;
        Ok(written)
    }

    fn queue_write(
        &self,
        read_version: Option<u64>,
        record: &SessionRecord,
        error: ClusterError,
    ) -> Result<SessionRecord, ClusterError> {
        let (Some(queue), Some(outage)) = (&self.queue, self.outage()) else { return Err(error) };
        if outage >= self.outage_limit {
            return Err(ClusterError::Unavailable(Unreachable::Outage(outage)));
        }
        let written =
            SessionRecord { version: read_version.map_or(1, |v| v + 1), ..record.clone() };
        queue
            .directory_queue()
            .push(&QueuedSessionWrite { read_version, record: written.clone() })
            .map_err(ClusterError::Queue)?;
        tracing::info!(session = %written.session, version = written.version, "directory write queued until NATS is back");
        self.remember(&written);
        Ok(written)
    }

    /// Replay queued writes in order; each applies only if the record is still at the
    /// version it was based on. Returns (applied, dropped as stale).
    pub async fn replay_queue(&self) -> Result<(usize, usize), ClusterError> {
        let Some(queue) = &self.queue else { return Ok((0, 0)) };
        let writes = queue.directory_queue().all().map_err(ClusterError::Queue)?;
        let (mut applied, mut dropped) = (0, 0);
        for (id, write) in writes {
            match self.write_now(write.read_version, &write.record).await {
                Ok(_) => applied += 1,
                Err(ClusterError::Stale(stale)) => {
                    tracing::warn!(session = %write.record.session, %stale, "queued directory write is stale; dropped");
                    dropped += 1;
                }
                Err(e) => return Err(e),
            }
            queue.directory_queue().remove(id).map_err(ClusterError::Queue)?;
        }
        let charges = self.replay_charges().await?;
        if applied + dropped + charges > 0 {
            tracing::info!(
                applied,
                dropped,
                charges,
                "queued directory writes and budget charges replayed"
            );
        }
        self.note_reachable();
        Ok((applied, dropped))
    }

    async fn user(&self, user: &str) -> Result<Option<(UserRecord, u64)>, ClusterError> {
        self.read(user_key(user)).await
    }

    async fn update_user(
        &self,
        user: &str,
        change: impl Fn(&mut UserRecord),
    ) -> Result<(), ClusterError> {
        let key = user_key(user);
        for _ in 0..USER_UPDATE_ATTEMPTS {
            let current = self.user(user).await?;
            let revision = current.as_ref().map(|(_, r)| *r);
            let mut record = current.map(|(r, _)| r).unwrap_or_default();
            change(&mut record);
            let value = records::encode(&record).into();
            // Another writer in between: read again and retry.
            match revision {
                None => match self.bucket.create(&key, value).await {
                    Ok(_) => return Ok(()),
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e.into()),
                },
                Some(revision) => match self.bucket.update(&key, value, revision).await {
                    Ok(_) => return Ok(()),
                    Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
                    Err(e) => return Err(e.into()),
                },
            }
        }
        Err(ClusterError::Contended(user.to_string()))
    }

    /// Every session record of `user` (from the cache while NATS is unreachable).
    pub async fn sessions_of_user(&self, user: &str) -> Result<Vec<SessionRecord>, ClusterError> {
        match self.user(user).await {
            Ok(record) => {
                let mut sessions = Vec::new();
                for session in record.map(|(r, _)| r.sessions).unwrap_or_default() {
                    if let Some(found) = self.session(&session).await? {
                        sessions.push(found);
                    }
                }
                Ok(sessions)
            }
            Err(ClusterError::Unavailable(_)) => Ok(self
                .cache
                .lock()
                .values()
                .filter(|c| c.record.user == user)
                .map(|c| c.record.clone())
                .collect()),
            Err(e) => Err(e),
        }
    }

    /// The user's last move charged to the budget: the directory's, or one this node
    /// charged itself and has not yet written there (kept in its store until the window
    /// passes), whichever is later. While NATS is unreachable only this node's charges are
    /// known.
    pub async fn last_migration(&self, user: &str) -> Result<Option<u64>, ClusterError> {
        let here = self.charged_here(user)?;
        match self.user(user).await {
            Ok(record) => Ok(record.and_then(|(r, _)| r.last_migration_ms).max(here)),
            Err(error @ ClusterError::Unavailable(_)) => {
                self.note_outage(&error);
                Ok(here)
            }
            Err(e) => Err(e),
        }
    }

    fn charged_here(&self, user: &str) -> Result<Option<u64>, ClusterError> {
        match &self.queue {
            Some(store) => store.migrations().last(user).map_err(ClusterError::Queue),
            None => Ok(None),
        }
    }

    /// Charge a move to the user's budget: in this node's store first (so an outage cannot
    /// lose it), then in the directory; while NATS is unreachable the charge waits there
    /// and [`replay_queue`](Self::replay_queue) writes it when NATS is back.
    pub async fn set_last_migration(&self, user: &str, at_ms: u64) -> Result<(), ClusterError> {
        if let Some(store) = &self.queue {
            store.migrations().set_last(user, at_ms).map_err(ClusterError::Queue)?;
        }
        match self
            .update_user(user, |u| u.last_migration_ms = u.last_migration_ms.max(Some(at_ms)))
            .await
        {
            Err(error @ ClusterError::Unavailable(_)) => {
                self.note_outage(&error);
                match &self.queue {
                    Some(_) => {
                        if let Some(pending) = self.charges_pending.lock().as_mut() {
                            pending.insert(user.to_string());
                        }
                        tracing::info!(
                            user,
                            "migration charge kept on this node until NATS is back"
                        );
                    }
                    None => {
                        tracing::warn!(user, %error, "migration charge not recorded: directory unreachable")
                    }
                }
                Ok(())
            }
            other => other,
        }
    }

    /// Write the budget charges kept on this node while NATS was unreachable (after a
    /// start: every kept one still inside its window) into the directory; a later charge
    /// already there wins.
    async fn replay_charges(&self) -> Result<usize, ClusterError> {
        let Some(store) = &self.queue else { return Ok(0) };
        let pending = self.charges_pending.lock().clone();
        if pending.as_ref().is_some_and(HashSet::is_empty) {
            return Ok(0);
        }
        let mut charges = store.migrations().all().map_err(ClusterError::Queue)?;
        if let Some(pending) = &pending {
            charges.retain(|(user, _)| pending.contains(user));
        }
        for (user, at_ms) in &charges {
            self.update_user(user, |u| u.last_migration_ms = u.last_migration_ms.max(Some(*at_ms)))
                .await?;
            if let Some(pending) = self.charges_pending.lock().as_mut() {
                pending.remove(user);
            }
        }
        self.charges_pending.lock().get_or_insert_with(HashSet::new);
        Ok(charges.len())
    }

    /// Marks `session` connected here in this node's store (by process `incarnation`), so
    /// a start after a crash finds it ([`release_orphans`](Self::release_orphans)).
    pub fn mark_connected(&self, session: &str, incarnation: u64) -> Result<(), ClusterError> {
        match &self.queue {
            Some(store) => {
                store.sessions().connected(session, incarnation).map_err(ClusterError::Queue)
            }
            None => Ok(()),
        }
    }

    /// Its last connection here closed: the mark goes (the record ages out in the bucket).
    pub fn mark_disconnected(&self, session: &str) -> Result<(), ClusterError> {
        match &self.queue {
            Some(store) => store.sessions().disconnected(session).map_err(ClusterError::Queue),
            None => Ok(()),
        }
    }

    /// At start-up, before the node is ready: the sessions an earlier run of this node
    /// left marked connected (it crashed with them open) count as closed now. Each record
    /// the bucket still holds under this node's name is rewritten with `now_ms` (a
    /// version-checked write, so a node that took the session meanwhile keeps it), and its
    /// age in the bucket counts from this start, as a session closed now; nothing refreshes
    /// it any more unless its client comes back. Only the marks are read, never the
    /// bucket's keys: at most [`ORPHANS_RELEASED_MAX`] records, [`ORPHANS_IN_FLIGHT`] at
    /// once; the marks beyond are dropped and their records age out from their last
    /// refresh (1.5 to 2 TTLs after the crash). NATS unreachable: the records are left
    /// as they are, the same way.
    pub async fn release_orphans(
        &self,
        now_ms: u64,
        incarnation: u64,
    ) -> Result<ReleasedOrphans, ClusterError> {
        use futures_util::StreamExt;
        let Some(store) = &self.queue else { return Ok(ReleasedOrphans::default()) };
        let (orphans, beyond) = store
            .sessions()
            .take_orphans(incarnation, ORPHANS_RELEASED_MAX)
            .map_err(ClusterError::Queue)?;
        let mut done = ReleasedOrphans { beyond, ..ReleasedOrphans::default() };
        let mut releases = futures_util::stream::iter(orphans)
            .map(|session| async move { (self.release_orphan(&session, now_ms).await, session) })
            .buffer_unordered(ORPHANS_IN_FLIGHT);
        while let Some((released, session)) = releases.next().await {
            match released {
                Ok(true) => done.released += 1,
                Ok(false) => done.left += 1,
                Err(error) => {
                    tracing::warn!(session, %error, "could not release a session left connected by the previous run; it ages out from its last refresh");
                    done.left += 1;
                }
            }
        }
        Ok(done)
    }

    /// Rewrites `session`'s record as closed at `now_ms` if this node still owns it.
    async fn release_orphan(&self, session: &str, now_ms: u64) -> Result<bool, ClusterError> {
        let Some((record, revision)) = self.entry(session).await? else { return Ok(false) };
        if record.owner != self.cluster.node {
            return Ok(false);
        }
        let released =
            SessionRecord { version: record.version + 1, updated_at_ms: now_ms, ..record };
        match self
            .bucket
            .update(session_key(session), records::encode(&released).into(), revision)
            .await
        {
            Ok(_) => {
                self.remember(&released);
                Ok(true)
            }
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// How many sessions the directory holds (this node's share is not counted: that
    /// would read every record).
    pub async fn count_sessions(&self) -> Result<usize, ClusterError> {
        use futures_util::StreamExt;
        let mut keys = self.bucket.keys().await?;
        let mut sessions = 0;
        while let Some(key) = keys.next().await {
            sessions += usize::from(key?.starts_with("s."));
        }
        Ok(sessions)
    }
}
