//! The session directory actor: decides which session a handshake gets and records
//! session ownership in the store with version checks. It writes only when a session is
//! created or migrates (never on heartbeats), and during warm-up after a restart
//! validates sessions from the store instead of from memory.
//!
//! Where a session is served is the [`Router`]'s answer, never this node's wish: a
//! handshake for a session the router places on another live node is refused with that
//! node's name and URL ([`DirectoryError::Elsewhere`]); a move the router forces (the
//! owner drains or is gone) is made and never refused; a move it did not choose (the
//! client could not reach the owner and said so with `avoid`) is charged to the user's
//! migration budget. New session ids are drawn until the router places them here.
//!
//! Where the records live is the [`SessionStore`] seam, chosen once at start-up: the
//! embedded store on a single node ([`embedded`]), the NATS KV bucket in cluster mode
//! ([`kv`]); the decisions are the same.
//!
//! The user is the unit of migration: a move takes every session of the user (one charge
//! to its budget, whatever the number), and in cluster mode it is announced
//! ([`UserMoves`]) so the user's live connections on other nodes follow at once instead
//! of staying where their records no longer point.
//!
//! Handshakes of one user are served one at a time, in arrival order (a lock stripe per
//! user hash, held across the store's I/O); handshakes of other users go on meanwhile.
//! What the directory holds in memory sits behind a short lock never held across I/O
//! that waits on the network.
//!
//! In memory a session exists while a connection (or a handshake) holds a
//! [`SessionLease`] on it, and then in a cache of at most `session_cache_max` entries;
//! past that it is read back from the store, which remembers which process saw it. A
//! session with no connection for `session_ttl_secs` is deleted by [`ExpireSessions`]
//! (single node) or left to the KV bucket's age limit after its owner stops refreshing
//! it (cluster mode).

mod embedded;
mod handover;
mod kv;

pub use handover::{HandOver, HandedOver};

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::future::LocalBoxFuture;
use lru::LruCache;
use parking_lot::Mutex;

use super::liveness::{Router, Unroutable};
use crate::cluster::ClusterError;
use crate::core::nodes::sessions::{
    check_migration_budget, plan_session, BudgetError, SessionPlan, SessionView, VersionError,
};
use crate::metrics::Metrics;
use crate::store::{SessionRecord, StoreError};
use crate::world::{now_ms, random_hex, random_u64};

/// Open a session for a handshake of `user`, which asked for `asked` ([`SessionOpener`]).
pub struct OpenSession {
    pub user: String,
    pub asked: Option<String>,
    /// A node the client could not reach (the handshake's `avoid`).
    pub avoid: Option<String>,
    /// The user's home cell as the credential claims it (none: the configured cells'
    /// rendezvous choice).
    pub cell: Option<String>,
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

/// Lock stripes serialising the handshakes of users whose ids hash alike.
const USER_STRIPES: usize = 64;
/// A handshake lets its stripe go for a readiness probe at most this many times; the
/// pass after decides without one ([`Shared::open`]).
const PROBE_PASSES: usize = 2;

/// The leased-sessions table is shrunk when its capacity is this many times its size...
const SPARSE_FACTOR: usize = 4;
/// ...and above this many entries' worth (small tables are not worth a rehash).
const SHRINK_ABOVE: usize = 1024;

/// What the route makes of a handshake's asked session.
enum Move {
    /// Nothing to charge: no move, a forced one, or a new session.
    Free,
    /// The client avoided `owner`, which this node counts ready: a charged move if the
    /// owner still says it is ready.
    Avoided { owner: Option<String> },
}

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
/// store ([`embedded`]) and by the cluster's KV bucket ([`kv`]); a third backend is one
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
    /// A session's first connection here opened.
    fn connected(&self, _session: &str, _incarnation: u64) -> Result<(), DirectoryError> {
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

/// Count the directory and start warm-up when it holds sessions; replies with
/// (sessions, sessions owned by this node).
#[derive(Message)]
#[rtype(result = "Result<(usize, usize), DirectoryError>")]
pub struct Reconcile;

/// Whether the node is in warm-up now.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct InWarmup;

/// The actor; its handlers run on [`Shared`].
pub struct Directory {
    shared: Arc<Shared>,
}

/// How long sessions and their records live; see the module doc.
#[derive(Debug, Clone, Copy)]
pub struct DirectorySettings {
    pub migration_window: Duration,
    pub warmup: Duration,
    pub session_ttl: Duration,
    pub session_cache_max: usize,
}

struct Shared {
    sessions: Arc<dyn SessionStore>,
    router: Arc<Router>,
    node: String,
    migration_window_ms: u64,
    session_ttl_ms: u64,
    warmup: Duration,
    /// This server start, as recorded with the sessions it has seen (a random id).
    incarnation: u64,
    /// Held across a handshake's reads and writes, one stripe per user hash.
    users: Vec<tokio::sync::Mutex<()>>,
    /// The stripes' hash, keyed at random at start: which users share a stripe cannot be
    /// computed from outside, so nobody can pick a user whose handshakes queue behind
    /// another's.
    stripes: RandomState,
    memory: Mutex<Memory>,
    metrics: Arc<Metrics>,
    /// Cluster mode: where a move is announced.
    moves: Option<Arc<dyn UserMoves>>,
}

/// What the directory holds in memory; locked only for moments, never across a network wait.
struct Memory {
    warmup_until: Option<Instant>,
    /// Sessions leased by a connection or a handshake here.
    live: HashMap<String, Live>,
    /// Sessions this process has seen whose last connection here closed, least recently
    /// used first out (only where memory is current: single node).
    recent: LruCache<String, SessionRecord>,
}

struct Live {
    record: SessionRecord,
    leases: u32,
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
    fn user_lock(&self, user: &str) -> &tokio::sync::Mutex<()> {
        let hash = self.stripes.hash_one(user);
        &self.users[(hash % USER_STRIPES as u64) as usize]
    }

    fn in_warmup(&self) -> bool {
        let mut memory = self.memory.lock();
        let active = memory.warmup_until.is_some_and(|until| Instant::now() < until);
        if !active && memory.warmup_until.take().is_some() {
            tracing::info!("warm-up over: sessions validated from memory only");
            self.metrics.warmup_active.set(0);
        }
        active
    }

    /// A counted directory write.
    async fn write(
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
    async fn lookup(
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
    /// crash leaves the session marked connected rather than expiring under a client.
    fn hold(&self, record: SessionRecord) -> Result<(), DirectoryError> {
        let mut memory = self.memory.lock();
        memory.recent.pop(&record.session);
        match memory.live.entry(record.session.clone()) {
            Entry::Occupied(mut held) => {
                held.get_mut().leases += 1;
                held.get_mut().record = record;
            }
            Entry::Vacant(free) => {
                self.sessions.connected(&record.session, self.incarnation)?;
                free.insert(Live { record, leases: 1 });
            }
        }
        Ok(())
    }

    fn release(&self, session: &str) {
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
    fn expire_batch(&self, now: u64) -> (usize, bool) {
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
    async fn refresh_held(&self, now: u64) {
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

    fn counts(&self) -> DirectoryCounts {
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
    async fn migrate_user(
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

    async fn create(&self, user: &str, now: u64) -> Result<SessionRecord, DirectoryError> {
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

    /// The session a handshake gets, held by one more lease (returned as the session id;
    /// the caller wraps it in a [`SessionLease`]).
    ///
    /// Nothing here waits on a peer while the user's stripe is held: a move that would be
    /// charged asks whether the avoided owner still answers `/readyz`, and when no answer
    /// of the last second is known ([`Router::ready_known`]) the stripe is let go, the
    /// shared probe awaited, and the decision made again from the top with its answer.
    /// The budget is checked before any probe, so a refused handshake costs none; and a
    /// handshake with `avoid` is first decided from reads alone, before the stripe is
    /// taken, so a credential looping on its given-back refusal holds no stripe at all.
    async fn open(&self, msg: OpenSession) -> Result<(String, bool, bool), DirectoryError> {
        if msg.avoid.is_some() {
            self.refuse_early(&msg).await?;
        }
        let mut probed: Option<(String, bool)> = None;
        for pass in 0..=PROBE_PASSES {
            let _user = self.user_lock(&msg.user).lock().await;
            let now = now_ms();
            let warmup = self.in_warmup();
            let asked = match msg.asked.as_deref().filter(|s| !s.is_empty()) {
                None => None,
                Some(session) => self.lookup(session, warmup, true).await?,
            };
            let view = asked.as_ref().map(|r| SessionView {
                user: &r.user,
                owner: &r.owner,
                version: r.version,
            });
            let plan = plan_session(view, &msg.user, &self.node);
            let charged = match self.routed_move(&msg, asked.as_ref(), &plan)? {
                Move::Free => false,
                Move::Avoided { owner } => {
                    self.check_budget(&msg.user, now).await?;
                    let answered = probed
                        .as_ref()
                        .filter(|(node, _)| Some(node.as_str()) == owner.as_deref())
                        .map(|(_, ready)| *ready);
                    let ready = match owner.as_deref() {
                        // No owner to ask (peers mode, a session no node placed): not ready.
                        None => false,
                        Some(owner) => match answered.or_else(|| self.router.ready_known(owner)) {
                            Some(ready) => ready,
                            // The record changed under every probe: the move is one the
                            // route did not choose, as far as this node can tell.
                            None if pass == PROBE_PASSES => true,
                            None => {
                                drop(_user);
                                let ready = self.router.answers_ready(owner).await;
                                probed = Some((owner.to_string(), ready));
                                continue;
                            }
                        },
                    };
                    if ready {
                        tracing::info!(user = %msg.user, owner = ?owner, "move charged to the budget: the client could not reach its ready owner");
                    } else {
                        tracing::debug!(user = %msg.user, owner = ?owner, "the owner the client avoided is not ready: a forced move");
                    }
                    ready
                }
            };
            let (record, migrated) = match (plan, asked) {
                (SessionPlan::Reuse, Some(record)) => (record, false),
                (SessionPlan::Migrate { .. }, Some(record)) => {
                    (self.migrate_user(&msg.user, &record, now, charged).await?, true)
                }
                _ => (self.create(&msg.user, now).await?, false),
            };
            let session = record.session.clone();
            self.hold(record)?;
            if warmup && msg.asked.as_deref() == Some(session.as_str()) {
                self.metrics.warmup_reconnect_successes.inc();
            }
            return Ok((session, warmup, migrated));
        }
        unreachable!("the last pass decides without a probe")
    }

    /// Before the stripe: the refusals that reads alone decide for a handshake with
    /// `avoid` (the session is served elsewhere; the move would be charged to a spent
    /// budget). Both are refusals the client retries, so one made from a read that a
    /// concurrent handshake of the user overtook costs a retry, nothing more; a handshake
    /// that passes is decided again under the stripe.
    async fn refuse_early(&self, msg: &OpenSession) -> Result<(), DirectoryError> {
        let Some(session) = msg.asked.as_deref().filter(|s| !s.is_empty()) else { return Ok(()) };
        let asked = self.lookup(session, self.in_warmup(), false).await?;
        let view = asked.as_ref().map(|r| SessionView {
            user: &r.user,
            owner: &r.owner,
            version: r.version,
        });
        let plan = plan_session(view, &msg.user, &self.node);
        if let Move::Avoided { .. } = self.routed_move(msg, asked.as_ref(), &plan)? {
            self.check_budget(&msg.user, now_ms()).await?;
        }
        Ok(())
    }

    /// Where the asked session is served: the router's answer for a session of this user
    /// that a node owns, and (peers mode, where no record names owners across nodes) for
    /// any asked session, known here or not. Served elsewhere: refused with that node.
    fn routed_move(
        &self,
        msg: &OpenSession,
        asked: Option<&SessionRecord>,
        plan: &SessionPlan,
    ) -> Result<Move, DirectoryError> {
        let Some(session) = msg.asked.as_deref().filter(|s| !s.is_empty()) else {
            return self.home_cell_move(msg);
        };
        let owned = matches!(plan, SessionPlan::Reuse | SessionPlan::Migrate { .. });
        if !(owned || (asked.is_none() && self.router.placement_decides())) {
            return self.home_cell_move(msg);
        }
        let owner = asked.map(|r| r.owner.as_str());
        let routed = self
            .router
            .route(session, &msg.user, msg.cell.as_deref(), owner, msg.avoid.as_deref())
            .map_err(DirectoryError::Unroutable)?;
        if routed.node != self.node {
            self.metrics.handshakes_redirected.inc();
            tracing::debug!(session, user = %msg.user, to = %routed.node, "handshake sent to the session's node");
            return Err(DirectoryError::Elsewhere { node: routed.node, url: routed.url });
        }
        // The client could not reach an owner this node counts ready: charged only if the
        // owner says so itself (its readiness goes off before its heartbeat tells the
        // others that it drains).
        Ok(if routed.reason.charged() {
            Move::Avoided { owner: owner.map(str::to_string) }
        } else {
            Move::Free
        })
    }

    /// Cluster mode: a new session opens in the cell the user's route answers (its home
    /// cell, a claim or the configured cells' choice, while a node there can serve; else
    /// the first healthy cell by name). A handshake in another cell is refused with the
    /// routed node, as for a session served elsewhere. In peers mode a session's node is
    /// the placement of its id, which this does not override.
    fn home_cell_move(&self, msg: &OpenSession) -> Result<Move, DirectoryError> {
        if self.router.placement_decides() {
            return Ok(Move::Free);
        }
        let inbox = crate::core::rules::names::inbox_room(&msg.user);
        let routed = match self.router.route(
            &inbox,
            &msg.user,
            msg.cell.as_deref(),
            None,
            msg.avoid.as_deref(),
        ) {
            Ok(routed) => routed,
            // No cell is healthy, this node's included: refused, as the route answers.
            Err(refusal @ Unroutable::NoHealthyCell { .. }) => {
                return Err(DirectoryError::Unroutable(refusal))
            }
            // No node (every one avoided, say): this node serves rather than nobody.
            Err(Unroutable::NoAliveNode(_)) => return Ok(Move::Free),
        };
        if routed.cell == self.router.me().cell {
            // In its cell: it stays here unless this node is full, or much fuller than
            // another (`core::nodes::placement::place_new`).
            return match self.router.new_session_elsewhere(&inbox) {
                None => Ok(Move::Free),
                Some((node, url)) => {
                    self.metrics.handshakes_redirected.inc();
                    tracing::debug!(user = %msg.user, to = %node, "new session sent to a node with more room");
                    Err(DirectoryError::Elsewhere { node, url })
                }
            };
        }
        self.metrics.handshakes_redirected.inc();
        tracing::debug!(user = %msg.user, home = %routed.home, cell = %routed.cell, to = %routed.node, "new session sent to the user's cell");
        Err(DirectoryError::Elsewhere { node: routed.node, url: routed.url })
    }

    /// The user's migration budget allows one more charged move at `now`.
    async fn check_budget(&self, user: &str, now: u64) -> Result<(), DirectoryError> {
        let last = self.sessions.last_migration(user).await?;
        check_migration_budget(last, now, self.migration_window_ms).map_err(|refusal| {
            self.metrics.migration_refusals.inc();
            tracing::info!(user, %refusal, "migration refused");
            refusal.into()
        })
    }

    async fn reconcile(&self) -> Result<(usize, usize), DirectoryError> {
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

impl Directory {
    /// Start the actor, and return with its address the [`SessionOpener`] that handshakes
    /// open their sessions with.
    pub fn start_with_opener(self) -> (Addr<Directory>, SessionOpener) {
        let shared = self.shared.clone();
        let directory = self.start();
        (directory.clone(), SessionOpener { shared, directory })
    }
}

/// Opens a handshake's session on the handshake's own thread, with the directory's shared
/// decisions and locks, without the two hand-offs between threads (and their wake-ups) of
/// a round trip through the actor's mailbox. The lease it grants still
/// tells the actor when the connection is gone.
#[derive(Clone)]
pub struct SessionOpener {
    shared: Arc<Shared>,
    directory: Addr<Directory>,
}

impl SessionOpener {
    pub async fn open(&self, msg: OpenSession) -> Result<SessionGrant, DirectoryError> {
        let (session, warmup, migrated) = self.shared.open(msg).await?;
        let lease = SessionLease { session: session.clone(), directory: self.directory.clone() };
        Ok(SessionGrant { session, warmup, migrated, lease })
    }
}

impl Handler<ReleaseSession> for Directory {
    type Result = ();

    fn handle(&mut self, msg: ReleaseSession, _ctx: &mut Self::Context) {
        self.shared.release(&msg.session);
    }
}

impl Handler<ExpireSessions> for Directory {
    type Result = ResponseFuture<usize>;

    fn handle(&mut self, _msg: ExpireSessions, _ctx: &mut Self::Context) -> Self::Result {
        let shared = self.shared.clone();
        Box::pin(async move {
            shared.refresh_held(now_ms()).await;
            let mut deleted = 0;
            // In batches, so handshakes are served between them.
            loop {
                let (batch, more) = shared.expire_batch(now_ms());
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
    type Result = MessageResult<CountSessions>;

    fn handle(&mut self, _msg: CountSessions, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.shared.counts())
    }
}

impl Handler<Reconcile> for Directory {
    type Result = ResponseFuture<Result<(usize, usize), DirectoryError>>;

    fn handle(&mut self, _msg: Reconcile, ctx: &mut Self::Context) -> Self::Result {
        let shared = self.shared.clone();
        // End the window on time even if no handshake asks.
        ctx.run_later(shared.warmup + Duration::from_millis(10), |directory, _| {
            directory.shared.in_warmup();
        });
        Box::pin(async move { shared.reconcile().await })
    }
}

impl Handler<InWarmup> for Directory {
    type Result = bool;

    fn handle(&mut self, _msg: InWarmup, _ctx: &mut Self::Context) -> Self::Result {
        self.shared.in_warmup()
    }
}
