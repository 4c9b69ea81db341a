//! The directory's state and its bookkeeping: the actor ([`Directory`]) and the state its
//! handlers and the handshakes share ([`Shared`]): the user stripes, the memory of leased
//! and recent sessions, the counted writes, lookups, leases, expiry and refresh passes,
//! migrations of a user's sessions, new sessions and the start-up reconcile. A handshake's
//! decisions are in `handshake`, a rebalance's in `handover`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use lru::LruCache;
use parking_lot::Mutex;

use super::seam::{DirectoryError, Expired, ExpiryPass, SessionStore, UserMoves, WriteError};
use crate::actors::liveness::Router;
use crate::metrics::Metrics;
use crate::store::SessionRecord;
use crate::world::{now_ms, random_hex, random_u64};

#[derive(Debug, Clone, Copy, Default)]
pub struct DirectoryCounts {
    /// Sessions with a connection here.
    pub live: usize,
    /// Disconnected sessions in the memory cache.
    pub cached: usize,
    /// Records in the store (single node; `None` in cluster mode, where counting reads
    /// every key).
    pub stored: Option<u64>,
}

/// Expired sessions deleted per store pass; the directory serves handshakes in between.
const EXPIRE_BATCH: usize = 1000;

/// Lock stripes serialising the handshakes of users whose ids hash alike.
const USER_STRIPES: usize = 64;

/// The leased-sessions table is shrunk when its capacity is this many times its size...
const SPARSE_FACTOR: usize = 4;
/// ...and above this many entries' worth (small tables are not worth a rehash).
const SHRINK_ABOVE: usize = 1024;

/// The actor; its handlers run on [`Shared`].
pub struct Directory {
    pub(super) shared: Arc<Shared>,
}

/// How long sessions and their records live; see the module doc.
#[derive(Debug, Clone, Copy)]
pub struct DirectorySettings {
    pub migration_window: Duration,
    pub warmup: Duration,
    pub session_ttl: Duration,
    pub session_cache_max: usize,
}

pub(super) struct Shared {
    pub(super) sessions: Arc<dyn SessionStore>,
    pub(super) router: Arc<Router>,
    pub(super) node: String,
    pub(super) migration_window_ms: u64,
    pub(super) session_ttl_ms: u64,
    pub(super) warmup: Duration,
    /// This server start, as recorded with the sessions it has seen (a random id).
    pub(super) incarnation: u64,
    /// Held across a handshake's reads and writes, one stripe per user hash.
    pub(super) users: Vec<tokio::sync::Mutex<()>>,
    /// The stripes' hash, keyed at random at start: which users share a stripe cannot be
    /// computed from outside, so nobody can pick a user whose handshakes queue behind
    /// another's.
    pub(super) stripes: RandomState,
    pub(super) memory: Mutex<Memory>,
    pub(super) metrics: Arc<Metrics>,
    /// Cluster mode: where a move is announced.
    pub(super) moves: Option<Arc<dyn UserMoves>>,
}

/// What the directory holds in memory; locked only for moments, never across a network wait.
pub(super) struct Memory {
    pub(super) warmup_until: Option<Instant>,
    /// Sessions leased by a connection or a handshake here.
    pub(super) live: HashMap<String, Live>,
    /// Sessions this process has seen whose last connection here closed, least recently
    /// used first out (only where memory is current: single node).
    pub(super) recent: LruCache<String, SessionRecord>,
}

pub(super) struct Live {
    pub(super) record: SessionRecord,
    pub(super) leases: u32,
}

impl Directory {
    /// `moves`: where a move is announced to the other nodes (cluster mode), if anywhere.
    pub fn new(
        sessions: Arc<dyn SessionStore>,
        router: Arc<Router>,
        settings: DirectorySettings,
        metrics: Arc<Metrics>,
        moves: Option<Arc<dyn UserMoves>>,
    ) -> Self {
        let node = router.me().name.clone();
        let memory = Memory {
            warmup_until: None,
            live: HashMap::new(),
            recent: LruCache::new(
                NonZeroUsize::new(settings.session_cache_max).unwrap_or(NonZeroUsize::MIN),
            ),
        };
        let shared = Shared {
            sessions,
            router,
            node,
            migration_window_ms: settings.migration_window.as_millis() as u64,
            session_ttl_ms: settings.session_ttl.as_millis() as u64,
            warmup: settings.warmup,
            incarnation: random_u64().max(1),
            users: (0..USER_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            stripes: RandomState::new(),
            memory: Mutex::new(memory),
            metrics,
            moves,
        };
        Directory { shared: Arc::new(shared) }
    }
}

impl Shared {
    /// The lock serialising `user`'s handshakes (and the refreshes of its records).
    pub(super) fn user_lock(&self, user: &str) -> &tokio::sync::Mutex<()> {
        let hash = self.stripes.hash_one(user);
        &self.users[(hash % USER_STRIPES as u64) as usize]
    }

    pub(super) fn in_warmup(&self) -> bool {
        let mut memory = self.memory.lock();
        let active = memory.warmup_until.is_some_and(|until| Instant::now() < until);
        if !active && memory.warmup_until.take().is_some() {
            tracing::info!("warm-up over: sessions validated from memory only");
            self.metrics.warmup_active.set(0);
        }
        active
    }

    /// A counted directory write.
    pub(super) async fn write(
        &self,
        read_version: Option<u64>,
        record: SessionRecord,
    ) -> Result<SessionRecord, WriteError> {
        let result = self.sessions.write(read_version, &record).await;
        self.metrics.directory_write(match &result {
            Ok(_) => "ok",
            Err(WriteError::Stale(_)) => "stale",
            Err(_) => "error",
        });
        let written = result?;
        let mut memory = self.memory.lock();
        if let Some(live) = memory.live.get_mut(&written.session) {
            live.record = written.clone();
        } else if self.sessions.memory_is_current() {
            memory.recent.put(written.session.clone(), written.clone());
        }
        Ok(written)
    }

    /// What this process knows of `session`, or the store's record where the rules say
    /// to read it: always where memory is not current (another node may have moved it),
    /// and for a session this process does not remember (see [`SessionStore::recall`]).
    /// `count`: a handshake's own lookup, counted in the warm-up metrics (not the early
    /// look of [`Shared::refuse_early`]).
    pub(super) async fn lookup(
        &self,
        session: &str,
        warmup: bool,
        count: bool,
    ) -> Result<Option<SessionRecord>, DirectoryError> {
        let remembered = {
            let mut memory = self.memory.lock();
            match memory.live.get(session) {
                Some(live) => Some(live.record.clone()),
                None => memory.recent.get(session).cloned(),
            }
        };
        if count && warmup && remembered.is_none() {
            self.metrics.warmup_reconnect_attempts.inc();
        }
        match remembered {
            Some(record) if self.sessions.memory_is_current() => Ok(Some(record)),
            Some(_) => self.sessions.session(session).await,
            None => self.sessions.recall(session, warmup, self.incarnation).await,
        }
    }

    /// One more lease on `record`'s session; the first is recorded in the store, so a
    /// crash leaves the session marked connected rather than expiring under a client
    /// (`created`: the handshake created the session, which the store may know is
    /// connected without a mark).
    pub(super) fn hold(&self, record: SessionRecord, created: bool) -> Result<(), DirectoryError> {
        let mut memory = self.memory.lock();
        memory.recent.pop(&record.session);
        match memory.live.entry(record.session.clone()) {
            Entry::Occupied(mut held) => {
                held.get_mut().leases += 1;
                held.get_mut().record = record;
            }
            Entry::Vacant(free) => {
                self.sessions.connected(&record.session, self.incarnation, created)?;
                free.insert(Live { record, leases: 1 });
            }
        }
        Ok(())
    }

    pub(super) fn release(&self, session: &str) {
        let mut memory = self.memory.lock();
        let Some(live) = memory.live.get_mut(session) else { return };
        live.leases -= 1;
        if live.leases > 0 {
            return;
        }
        let Some(Live { record, .. }) = memory.live.remove(session) else { return };
        if let Err(error) = self.sessions.released(session, now_ms(), self.incarnation) {
            tracing::warn!(session, %error, "could not record the session's last close; it expires from an earlier time");
        }
        if self.sessions.memory_is_current() {
            memory.recent.put(record.session.clone(), record);
        }
    }

    /// One pass of expiry: (sessions deleted, whether there is more to do).
    pub(super) fn expire_batch(&self, now: u64) -> (usize, bool) {
        let mut memory = self.memory.lock();
        let Memory { live, recent, .. } = &mut *memory;
        // A wave of users that left leaves the table's capacity at its peak: give it back
        // once the table is far below it (the sweep then trims the allocator).
        if live.capacity() > SPARSE_FACTOR * live.len().max(SHRINK_ABOVE) {
            live.shrink_to(live.len() * 2);
        }
        let is_live = |session: &str| live.contains_key(session);
        let pass = ExpiryPass {
            now_ms: now,
            ttl_ms: self.session_ttl_ms,
            batch: EXPIRE_BATCH,
            cache_max: recent.cap().get(),
            is_live: &is_live,
        };
        match self.sessions.expire(&pass) {
            Ok(Expired { deleted, more }) => {
                for session in &deleted {
                    recent.pop(session);
                }
                if !deleted.is_empty() {
                    tracing::debug!(expired = deleted.len(), "sessions past their TTL deleted");
                    self.metrics.sessions_expired.inc_by(deleted.len() as u64);
                }
                (deleted.len(), more)
            }
            Err(error) => {
                tracing::warn!(%error, "could not expire sessions");
                (0, false)
            }
        }
    }

    /// Where records age out by themselves: rewrite those of sessions connected here
    /// before they would (a record is otherwise written only on create and migration).
    pub(super) async fn refresh_held(&self, now: u64) {
        let Some(refresh_after) =
            self.sessions.refresh_after(Duration::from_millis(self.session_ttl_ms))
        else {
            return;
        };
        let refresh_after = refresh_after.as_millis() as u64;
        let stale: Vec<SessionRecord> = self
            .memory
            .lock()
            .live
            .values()
            .filter(|l| l.record.updated_at_ms.saturating_add(refresh_after) <= now)
            .map(|l| l.record.clone())
            .collect();
        for record in stale {
            let _user = self.user_lock(&record.user).lock().await;
            let session = record.session.clone();
            let refreshed = SessionRecord { updated_at_ms: now, ..record.clone() };
            match self.write(Some(record.version), refreshed).await {
                Ok(_) => {}
                Err(WriteError::Stale(stale)) => {
                    // Written meanwhile (by a migration here, or another node): the
                    // next sweep refreshes it from what is stored, if still ours.
                    tracing::info!(session, %stale, "session record changed; refreshed next sweep");
                    if let Ok(Some(current)) = self.sessions.session(&session).await {
                        let mut memory = self.memory.lock();
                        if let Some(live) =
                            memory.live.get_mut(&session).filter(|_| current.owner == self.node)
                        {
                            live.record = current;
                        }
                    }
                }
                Err(WriteError::Failed(error)) => {
                    tracing::warn!(session, %error, "could not refresh the session record");
                    return;
                }
            }
        }
    }

    pub(super) fn counts(&self) -> DirectoryCounts {
        let memory = self.memory.lock();
        DirectoryCounts {
            live: memory.live.len(),
            cached: memory.recent.len(),
            stored: self.sessions.stored(),
        }
    }

    /// Move every session of `user` owned elsewhere to this node. A move the router
    /// forced is always made; one it did not choose (`charged`, its budget checked by the
    /// caller under the same hold of the user's stripe) is one budget charge, however
    /// many sessions move. Once a record moved, the move is announced ([`UserMoves`]):
    /// the user's connections elsewhere follow.
    /// Returns the asked session's record as it stands after the move.
    pub(super) async fn migrate_user(
        &self,
        user: &str,
        asked: &SessionRecord,
        now: u64,
        charged: bool,
    ) -> Result<SessionRecord, DirectoryError> {
        let mut records = self.sessions.sessions_of_user(user).await?;
        if !records.iter().any(|r| r.session == asked.session) {
            records.push(asked.clone());
        }
        let mut asked_now = asked.clone();
        let mut moved_any = false;
        for record in records {
            if record.owner == self.node {
                continue;
            }
            let from = record.owner.clone();
            let moved =
                SessionRecord { owner: self.node.clone(), updated_at_ms: now, ..record.clone() };
            match self.write(Some(record.version), moved).await {
                Ok(written) => {
                    moved_any = true;
                    tracing::info!(user, session = %written.session, from = %from, to = %self.node, version = written.version, "session migrated");
                    if written.session == asked.session {
                        asked_now = written;
                    }
                }
                Err(WriteError::Stale(stale)) => {
                    tracing::info!(user, session = %record.session, %stale, "migration lost a race; keeping the newer record");
                    if record.session == asked.session {
                        asked_now =
                            self.sessions.session(&asked.session).await?.unwrap_or(asked_now);
                    }
                }
                Err(WriteError::Failed(e)) => return Err(e),
            }
        }
        if charged {
            self.sessions.set_last_migration(user, now).await?;
        }
        if let Some(moves) = self.moves.as_ref().filter(|_| moved_any) {
            moves.moved(user, now);
        }
        self.metrics.migrations.inc();
        Ok(asked_now)
    }

    /// Draws until the router places the id here (one draw in cluster mode and on a
    /// single node; about one per configured node in peers mode).
    fn new_session_id(&self) -> String {
        loop {
            let id = random_hex(12);
            if self.router.places_here(&id) {
                return id;
            }
        }
    }

    pub(super) async fn create(
        &self,
        user: &str,
        now: u64,
    ) -> Result<SessionRecord, DirectoryError> {
        let record = SessionRecord {
            session: self.new_session_id(),
            user: user.to_string(),
            owner: self.node.clone(),
            version: 0,
            updated_at_ms: now,
        };
        match self.write(None, record).await {
            Ok(written) => Ok(written),
            Err(WriteError::Stale(stale)) => Err(DirectoryError::IdTaken(stale)),
            Err(WriteError::Failed(e)) => Err(e),
        }
    }

    pub(super) async fn reconcile(&self) -> Result<(usize, usize), DirectoryError> {
        // This node holds no connection yet: records it owned wait for their clients to
        // reconnect (here or elsewhere). Those an earlier run left connected count as
        // closed now (the embedded store marks them; cluster mode rewrites a bounded
        // number of them), so their TTL runs from this start, before any traffic.
        let orphans = self.sessions.release_orphans(now_ms(), self.incarnation).await?;
        if orphans > 0 {
            tracing::info!(
                sessions = orphans,
                "sessions left connected by the previous run count as closed now"
            );
        }
        let (sessions, owned) = self.sessions.count(&self.node).await?;
        if sessions > 0 && !self.warmup.is_zero() {
            self.memory.lock().warmup_until = Some(Instant::now() + self.warmup);
            self.metrics.warmup_active.set(1);
        }
        tracing::info!(
            sessions,
            owned_here = owned,
            warmup_secs = self.warmup.as_secs(),
            warmup = sessions > 0,
            "directory reconciled"
        );
        Ok((sessions, owned))
    }
}

impl Actor for Directory {
    type Context = Context<Self>;
}
