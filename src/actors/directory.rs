//! The session directory actor: decides which session a handshake gets and records
//! session ownership in the store with version checks. It writes only when a session is
//! created or migrates (never on heartbeats), charges every owner change to the user's
//! migration budget, and during warm-up after a restart validates sessions from the store
//! instead of from memory. The records live in sled on a single node and in a NATS KV
//! bucket in cluster mode ([`Sessions`] is that seam); the decisions are the same.
//!
//! In memory a session exists while a connection (or a handshake) holds a
//! [`SessionLease`] on it, and then in a cache of at most `session_cache_max` entries;
//! past that it is read back from the store, which remembers which process saw it. A
//! session with no connection for `session_ttl_secs` is deleted by [`ExpireSessions`]
//! (single node) or left to the KV bucket's age limit after its owner stops refreshing
//! it (cluster mode).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use lru::LruCache;

use crate::cluster::kv::KvSessions;
use crate::cluster::ClusterError;
use crate::core::sessions::{check_migration_budget, plan_session, BudgetError, SessionPlan, SessionView};
use crate::metrics::Metrics;
use crate::store::{SessionRecord, Store, StoreError};
use crate::world::{now_ms, random_hex, random_u64};

/// Open a session for a handshake of `user`, which asked for `asked`.
#[derive(Message)]
#[rtype(result = "Result<SessionGrant, DirectoryError>")]
pub struct OpenSession {
    pub user: String,
    pub asked: Option<String>,
}

pub struct SessionGrant {
    pub session: String,
    /// The node is in warm-up (reported in `welcome`).
    pub warmup: bool,
    pub migrated: bool,
    /// Keeps the session in memory and unexpired until dropped with the connection.
    pub lease: SessionLease,
}

/// A connection's hold on its session: dropping it tells the directory the connection
/// (or the handshake that never became one) is gone.
pub struct SessionLease {
    session: String,
    directory: Addr<Directory>,
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        self.directory.do_send(ReleaseSession { session: std::mem::take(&mut self.session) });
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct ReleaseSession {
    session: String,
}

/// Delete the sessions nobody has connected to for the TTL (single node); refresh the
/// records of sessions connected here so the KV age limit spares them (cluster mode).
/// Replies with the number of sessions deleted.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ExpireSessions;

/// What the directory holds now, for `/v1/admin/status`.
#[derive(Message)]
#[rtype(result = "DirectoryCounts")]
pub struct CountSessions;

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

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DirectoryError {
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// Cluster mode: NATS has been unreachable too long to hand out new sessions.
    #[error("{0}")]
    Unavailable(String),
    #[error("session directory: {0}")]
    Store(String),
}

/// A directory write that lost a compare-and-swap, or failed.
enum WriteError {
    Stale(String),
    Failed(DirectoryError),
}

impl From<StoreError> for DirectoryError {
    fn from(e: StoreError) -> Self {
        DirectoryError::Store(e.to_string())
    }
}

impl From<ClusterError> for DirectoryError {
    fn from(e: ClusterError) -> Self {
        match e {
            ClusterError::Unavailable(why) => DirectoryError::Unavailable(why.to_string()),
            other => DirectoryError::Store(other.to_string()),
        }
    }
}

impl From<DirectoryError> for WriteError {
    fn from(e: DirectoryError) -> Self {
        WriteError::Failed(e)
    }
}

/// Where session records live: sled on a single node, the KV bucket in cluster mode.
#[derive(Clone)]
pub enum Sessions {
    Local(Store),
    Cluster(KvSessions),
}

impl Sessions {
    pub async fn session(&self, session: &str) -> Result<Option<SessionRecord>, DirectoryError> {
        Ok(match self {
            Sessions::Local(store) => store.session(session)?,
            Sessions::Cluster(kv) => kv.session(session).await?,
        })
    }

    async fn write(&self, read_version: Option<u64>, record: &SessionRecord) -> Result<SessionRecord, WriteError> {
        match self {
            Sessions::Local(store) => match store.write_session(read_version, record) {
                Ok(written) => Ok(written),
                Err(StoreError::Stale(stale)) => Err(WriteError::Stale(stale.to_string())),
                Err(e) => Err(WriteError::Failed(e.into())),
            },
            Sessions::Cluster(kv) => match kv.write_session(read_version, record).await {
                Ok(written) => Ok(written),
                Err(ClusterError::Stale(stale)) => Err(WriteError::Stale(stale.to_string())),
                Err(e) => Err(WriteError::Failed(e.into())),
            },
        }
    }

    async fn sessions_of_user(&self, user: &str) -> Result<Vec<SessionRecord>, DirectoryError> {
        Ok(match self {
            Sessions::Local(store) => store.sessions_of_user(user)?,
            Sessions::Cluster(kv) => kv.sessions_of_user(user).await?,
        })
    }

    async fn last_migration(&self, user: &str) -> Result<Option<u64>, DirectoryError> {
        Ok(match self {
            Sessions::Local(store) => store.last_migration(user)?,
            Sessions::Cluster(kv) => kv.last_migration(user).await?,
        })
    }

    async fn set_last_migration(&self, user: &str, at_ms: u64) -> Result<(), DirectoryError> {
        match self {
            Sessions::Local(store) => store.set_last_migration(user, at_ms)?,
            Sessions::Cluster(kv) => kv.set_last_migration(user, at_ms).await?,
        }
        Ok(())
    }

    /// (sessions in the directory, sessions owned by `node`; 0 when unknown).
    async fn count(&self, node: &str) -> Result<(usize, usize), DirectoryError> {
        Ok(match self {
            Sessions::Local(store) => store.count_sessions(node)?,
            Sessions::Cluster(kv) => (kv.count_sessions().await?, 0),
        })
    }
}

/// Count the directory and start warm-up when it holds sessions; replies with
/// (sessions, sessions owned by this node).
#[derive(Message)]
#[rtype(result = "Result<(usize, usize), DirectoryError>")]
pub struct Reconcile;

/// Whether the node is in warm-up now.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct InWarmup;

/// The actor: requests are served one at a time, in arrival order, by [`State`].
pub struct Directory {
    state: Arc<tokio::sync::Mutex<State>>,
}

/// How long sessions and their records live; see the module doc.
#[derive(Debug, Clone, Copy)]
pub struct DirectorySettings {
    pub migration_window: Duration,
    pub warmup: Duration,
    pub session_ttl: Duration,
    pub session_cache_max: usize,
}

struct State {
    sessions: Sessions,
    node: String,
    migration_window_ms: u64,
    session_ttl_ms: u64,
    warmup: Duration,
    warmup_until: Option<Instant>,
    /// This server start, as recorded with the sessions it has seen (a random id).
    incarnation: u64,
    /// Sessions leased by a connection or a handshake here.
    live: HashMap<String, Live>,
    /// Single node: sessions this process has seen whose last connection here closed,
    /// least recently used first out.
    recent: LruCache<String, SessionRecord>,
    metrics: Arc<Metrics>,
}

struct Live {
    record: SessionRecord,
    leases: u32,
}

impl Directory {
    pub fn new(sessions: Sessions, node: String, settings: DirectorySettings, metrics: Arc<Metrics>) -> Self {
        let state = State {
            sessions,
            node,
            migration_window_ms: settings.migration_window.as_millis() as u64,
            session_ttl_ms: settings.session_ttl.as_millis() as u64,
            warmup: settings.warmup,
            warmup_until: None,
            incarnation: random_u64().max(1),
            live: HashMap::new(),
            recent: LruCache::new(NonZeroUsize::new(settings.session_cache_max).unwrap_or(NonZeroUsize::MIN)),
            metrics,
        };
        Directory { state: Arc::new(tokio::sync::Mutex::new(state)) }
    }
}

impl State {
    fn in_warmup(&mut self) -> bool {
        let active = self.warmup_until.is_some_and(|until| Instant::now() < until);
        if !active && self.warmup_until.take().is_some() {
            tracing::info!("warm-up over: sessions validated from memory only");
            self.metrics.warmup_active.set(0);
        }
        active
    }

    /// A counted directory write.
    async fn write(&mut self, read_version: Option<u64>, record: SessionRecord) -> Result<SessionRecord, WriteError> {
        let result = self.sessions.write(read_version, &record).await;
        self.metrics.directory_write(match &result {
            Ok(_) => "ok",
            Err(WriteError::Stale(_)) => "stale",
            Err(_) => "error",
        });
        let written = result?;
        if let Some(live) = self.live.get_mut(&written.session) {
            live.record = written.clone();
        } else if matches!(self.sessions, Sessions::Local(_)) {
            self.recent.put(written.session.clone(), written.clone());
        }
        Ok(written)
    }

    /// What this process knows of `session`, or the store's record where the rules say
    /// to read it: always in cluster mode (another node may have moved it), during
    /// warm-up, and after it for a session this process saw but no longer caches.
    async fn lookup(&mut self, session: &str, warmup: bool) -> Result<Option<SessionRecord>, DirectoryError> {
        let remembered = match self.live.get(session) {
            Some(live) => Some(live.record.clone()),
            None => self.recent.get(session).cloned(),
        };
        if warmup && remembered.is_none() {
            self.metrics.warmup_reconnect_attempts.inc();
        }
        match (&self.sessions, remembered) {
            (Sessions::Local(_), Some(record)) => Ok(Some(record)),
            (Sessions::Cluster(_), _) => self.sessions.session(session).await,
            (Sessions::Local(store), None) if warmup => Ok(store.session(session)?),
            (Sessions::Local(store), None) => match store.session_seen(session)? {
                Some(seen) if seen.seen_by == self.incarnation => Ok(store.session(session)?),
                _ => Ok(None),
            },
        }
    }

    /// One more lease on `record`'s session; the first is recorded in the store, so a
    /// crash leaves the session marked connected rather than expiring under a client.
    fn hold(&mut self, record: SessionRecord) -> Result<(), DirectoryError> {
        self.recent.pop(&record.session);
        match self.live.entry(record.session.clone()) {
            Entry::Occupied(mut held) => {
                held.get_mut().leases += 1;
                held.get_mut().record = record;
            }
            Entry::Vacant(free) => {
                if let Sessions::Local(store) = &self.sessions {
                    store.session_connected(&record.session, self.incarnation)?;
                }
                free.insert(Live { record, leases: 1 });
            }
        }
        Ok(())
    }

    fn release(&mut self, session: &str) {
        let Some(live) = self.live.get_mut(session) else { return };
        live.leases -= 1;
        if live.leases > 0 {
            return;
        }
        let Some(Live { record, .. }) = self.live.remove(session) else { return };
        if let Sessions::Local(store) = &self.sessions {
            if let Err(error) = store.session_released(session, now_ms(), self.incarnation) {
                tracing::warn!(session, %error, "could not record the session's last close; it expires from an earlier time");
            }
            self.recent.put(record.session.clone(), record);
        }
    }

    /// One pass of expiry: (sessions deleted, whether there is more to do).
    async fn expire_batch(&mut self, now: u64) -> (usize, bool) {
        match &self.sessions {
            Sessions::Local(store) => {
                let live = &self.live;
                match store.expire_sessions(now.saturating_sub(self.session_ttl_ms), EXPIRE_BATCH, |s| live.contains_key(s)) {
                    Ok((examined, deleted)) => {
                        for session in &deleted {
                            self.recent.pop(session);
                        }
                        if !deleted.is_empty() {
                            tracing::debug!(expired = deleted.len(), "sessions past their TTL deleted");
                            self.metrics.sessions_expired.inc_by(deleted.len() as u64);
                        }
                        (deleted.len(), examined == EXPIRE_BATCH)
                    }
                    Err(error) => {
                        tracing::warn!(%error, "could not expire sessions");
                        (0, false)
                    }
                }
            }
            Sessions::Cluster(kv) => {
                kv.prune_cache(Duration::from_millis(self.session_ttl_ms), self.recent.cap().get());
                // A record is written only on create and migration: refresh those held
                // here before the bucket's age limit (twice the TTL) can reach them.
                let stale: Vec<SessionRecord> = self
                    .live
                    .values()
                    .filter(|l| l.record.updated_at_ms.saturating_add(self.session_ttl_ms / 2) <= now)
                    .map(|l| l.record.clone())
                    .collect();
                for record in stale {
                    let session = record.session.clone();
                    let refreshed = SessionRecord { updated_at_ms: now, ..record.clone() };
                    match self.write(Some(record.version), refreshed).await {
                        Ok(_) => {}
                        Err(WriteError::Stale(stale)) => {
                            // Written meanwhile (by a migration here, or another node): the
                            // next sweep refreshes it from what is stored, if still ours.
                            tracing::info!(session, %stale, "session record changed; refreshed next sweep");
                            if let Ok(Some(current)) = self.sessions.session(&session).await {
                                if let Some(live) = self.live.get_mut(&session).filter(|_| current.owner == self.node) {
                                    live.record = current;
                                }
                            }
                        }
                        Err(WriteError::Failed(error)) => {
                            tracing::warn!(session, %error, "could not refresh the session record");
                            return (0, false);
                        }
                    }
                }
                (0, false)
            }
        }
    }

    fn counts(&self) -> DirectoryCounts {
        DirectoryCounts {
            live: self.live.len(),
            cached: self.recent.len(),
            stored: match &self.sessions {
                Sessions::Local(store) => Some(store.sessions_stored()),
                Sessions::Cluster(_) => None,
            },
        }
    }

    /// Move every session of `user` owned elsewhere to this node: one budget charge.
    /// Returns the asked session's record as it stands after the move.
    async fn migrate_user(&mut self, user: &str, asked: &SessionRecord, now: u64) -> Result<SessionRecord, DirectoryError> {
        let last = self.sessions.last_migration(user).await?;
        if let Err(refusal) = check_migration_budget(last, now, self.migration_window_ms) {
            self.metrics.migration_refusals.inc();
            tracing::info!(user, %refusal, "migration refused");
            return Err(refusal.into());
        }
        let mut records = self.sessions.sessions_of_user(user).await?;
        if !records.iter().any(|r| r.session == asked.session) {
            records.push(asked.clone());
        }
        let mut asked_now = asked.clone();
        for record in records {
            if record.owner == self.node {
                continue;
            }
            let from = record.owner.clone();
            let moved = SessionRecord { owner: self.node.clone(), updated_at_ms: now, ..record.clone() };
            match self.write(Some(record.version), moved).await {
                Ok(written) => {
                    tracing::info!(user, session = %written.session, from = %from, to = %self.node, version = written.version, "session migrated");
                    if written.session == asked.session {
                        asked_now = written;
                    }
                }
                Err(WriteError::Stale(stale)) => {
                    tracing::info!(user, session = %record.session, %stale, "migration lost a race; keeping the newer record");
                    if record.session == asked.session {
                        asked_now = self.sessions.session(&asked.session).await?.unwrap_or(asked_now);
                    }
                }
                Err(WriteError::Failed(e)) => return Err(e),
            }
        }
        self.sessions.set_last_migration(user, now).await?;
        self.metrics.migrations.inc();
        Ok(asked_now)
    }

    async fn create(&mut self, user: &str, now: u64) -> Result<SessionRecord, DirectoryError> {
        let record = SessionRecord {
            session: random_hex(12),
            user: user.to_string(),
            owner: self.node.clone(),
            version: 0,
            updated_at_ms: now,
        };
        match self.write(None, record).await {
            Ok(written) => Ok(written),
            Err(WriteError::Stale(stale)) => Err(DirectoryError::Store(format!("a fresh session id was taken: {stale}"))),
            Err(WriteError::Failed(e)) => Err(e),
        }
    }

    /// The session a handshake gets, held by one more lease (returned as the session id;
    /// the caller wraps it in a [`SessionLease`]).
    async fn open(&mut self, msg: OpenSession) -> Result<(String, bool, bool), DirectoryError> {
        let now = now_ms();
        let warmup = self.in_warmup();
        let asked = match msg.asked.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(session) => self.lookup(session, warmup).await?,
        };
        let view = asked.as_ref().map(|r| SessionView { user: &r.user, owner: &r.owner, version: r.version });
        let plan = plan_session(view, &msg.user, &self.node);
        let (record, migrated) = match (plan, asked) {
            (SessionPlan::Reuse, Some(record)) => (record, false),
            (SessionPlan::Migrate { .. }, Some(record)) => (self.migrate_user(&msg.user, &record, now).await?, true),
            _ => (self.create(&msg.user, now).await?, false),
        };
        let session = record.session.clone();
        self.hold(record)?;
        if warmup && msg.asked.as_deref() == Some(session.as_str()) {
            self.metrics.warmup_reconnect_successes.inc();
        }
        Ok((session, warmup, migrated))
    }

    async fn reconcile(&mut self) -> Result<(usize, usize), DirectoryError> {
        // This node holds no connection yet: records it owned wait for their clients to
        // reconnect (here or elsewhere); nothing is rewritten in bulk.
        if let Sessions::Local(store) = &self.sessions {
            let orphans = store.release_orphaned_sessions(now_ms(), self.incarnation)?;
            if orphans > 0 {
                tracing::info!(sessions = orphans, "sessions left connected by the previous run count as closed now");
            }
        }
        let (sessions, owned) = self.sessions.count(&self.node).await?;
        if sessions > 0 && !self.warmup.is_zero() {
            self.warmup_until = Some(Instant::now() + self.warmup);
            self.metrics.warmup_active.set(1);
        }
        tracing::info!(sessions, owned_here = owned, warmup_secs = self.warmup.as_secs(), warmup = sessions > 0, "directory reconciled");
        Ok((sessions, owned))
    }
}

impl Actor for Directory {
    type Context = Context<Self>;
}

impl Handler<OpenSession> for Directory {
    type Result = ResponseFuture<Result<SessionGrant, DirectoryError>>;

    fn handle(&mut self, msg: OpenSession, ctx: &mut Self::Context) -> Self::Result {
        let state = self.state.clone();
        let directory = ctx.address();
        Box::pin(async move {
            let (session, warmup, migrated) = state.lock().await.open(msg).await?;
            let lease = SessionLease { session: session.clone(), directory };
            Ok(SessionGrant { session, warmup, migrated, lease })
        })
    }
}

impl Handler<ReleaseSession> for Directory {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: ReleaseSession, _ctx: &mut Self::Context) -> Self::Result {
        let state = self.state.clone();
        Box::pin(async move { state.lock().await.release(&msg.session) })
    }
}

impl Handler<ExpireSessions> for Directory {
    type Result = ResponseFuture<usize>;

    fn handle(&mut self, _msg: ExpireSessions, _ctx: &mut Self::Context) -> Self::Result {
        let state = self.state.clone();
        Box::pin(async move {
            let mut deleted = 0;
            // In batches, so handshakes are served between them.
            loop {
                let (batch, more) = state.lock().await.expire_batch(now_ms()).await;
                deleted += batch;
                if !more {
                    return deleted;
                }
                tokio::task::yield_now().await;
            }
        })
    }
}

impl Handler<CountSessions> for Directory {
    type Result = ResponseFuture<DirectoryCounts>;

    fn handle(&mut self, _msg: CountSessions, _ctx: &mut Self::Context) -> Self::Result {
        let state = self.state.clone();
        Box::pin(async move { state.lock().await.counts() })
    }
}

impl Handler<Reconcile> for Directory {
    type Result = ResponseFuture<Result<(usize, usize), DirectoryError>>;

    fn handle(&mut self, _msg: Reconcile, ctx: &mut Self::Context) -> Self::Result {
        let state = self.state.clone();
        let warmup = state.try_lock().map(|s| s.warmup).unwrap_or_default();
        // End the window on time even if no handshake asks.
        let later = state.clone();
        ctx.run_later(warmup + Duration::from_millis(10), move |_, _| {
            actix::spawn(async move {
                later.lock().await.in_warmup();
            });
        });
        Box::pin(async move { state.lock().await.reconcile().await })
    }
}

impl Handler<InWarmup> for Directory {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, _msg: InWarmup, _ctx: &mut Self::Context) -> Self::Result {
        let state = self.state.clone();
        Box::pin(async move { state.lock().await.in_warmup() })
    }
}
