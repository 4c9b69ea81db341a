//! The session directory actor: decides which session a handshake gets and records
//! session ownership in the store with version checks. It writes only when a session is
//! created or migrates (never on heartbeats), charges every owner change to the user's
//! migration budget, and during warm-up after a restart validates sessions from the store
//! instead of from memory. The records live in sled on a single node and in a NATS KV
//! bucket in cluster mode ([`Sessions`] is that seam); the decisions are the same.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::cluster::kv::KvSessions;
use crate::cluster::ClusterError;
use crate::core::sessions::{check_migration_budget, plan_session, BudgetError, SessionPlan, SessionView};
use crate::metrics::Metrics;
use crate::store::{SessionRecord, Store, StoreError};
use crate::world::{now_ms, random_hex};

/// Open a session for a handshake of `user`, which asked for `asked`.
#[derive(Message)]
#[rtype(result = "Result<SessionGrant, DirectoryError>")]
pub struct OpenSession {
    pub user: String,
    pub asked: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionGrant {
    pub session: String,
    /// The node is in warm-up (reported in `welcome`).
    pub warmup: bool,
    pub migrated: bool,
}

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
            ClusterError::Unavailable(why) => DirectoryError::Unavailable(why),
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

struct State {
    sessions: Sessions,
    node: String,
    migration_window_ms: u64,
    warmup: Duration,
    warmup_until: Option<Instant>,
    /// Sessions this process created, migrated or validated.
    known: HashMap<String, SessionRecord>,
    metrics: Arc<Metrics>,
}

impl Directory {
    pub fn new(sessions: Sessions, node: String, migration_window: Duration, warmup: Duration, metrics: Arc<Metrics>) -> Self {
        let state = State {
            sessions,
            node,
            migration_window_ms: migration_window.as_millis() as u64,
            warmup,
            warmup_until: None,
            known: HashMap::new(),
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
        self.known.insert(written.session.clone(), written.clone());
        Ok(written)
    }

    /// Move every session of `user` owned elsewhere to this node: one budget charge.
    async fn migrate_user(&mut self, user: &str, now: u64) -> Result<(), DirectoryError> {
        let last = self.sessions.last_migration(user).await?;
        if let Err(refusal) = check_migration_budget(last, now, self.migration_window_ms) {
            self.metrics.migration_refusals.inc();
            tracing::info!(user, %refusal, "migration refused");
            return Err(refusal.into());
        }
        for record in self.sessions.sessions_of_user(user).await? {
            if record.owner == self.node {
                continue;
            }
            let from = record.owner.clone();
            let moved = SessionRecord { owner: self.node.clone(), updated_at_ms: now, ..record.clone() };
            match self.write(Some(record.version), moved).await {
                Ok(written) => tracing::info!(user, session = %written.session, from = %from, to = %self.node, version = written.version, "session migrated"),
                Err(WriteError::Stale(stale)) => tracing::info!(user, session = %record.session, %stale, "migration lost a race; keeping the newer record"),
                Err(WriteError::Failed(e)) => return Err(e),
            }
        }
        self.sessions.set_last_migration(user, now).await?;
        self.metrics.migrations.inc();
        Ok(())
    }

    async fn create(&mut self, user: &str, now: u64) -> Result<String, DirectoryError> {
        let record = SessionRecord {
            session: random_hex(12),
            user: user.to_string(),
            owner: self.node.clone(),
            version: 0,
            updated_at_ms: now,
        };
        match self.write(None, record).await {
            Ok(written) => Ok(written.session),
            Err(WriteError::Stale(stale)) => Err(DirectoryError::Store(format!("a fresh session id was taken: {stale}"))),
            Err(WriteError::Failed(e)) => Err(e),
        }
    }

    async fn open(&mut self, msg: OpenSession) -> Result<SessionGrant, DirectoryError> {
        let now = now_ms();
        let warmup = self.in_warmup();
        let asked = match msg.asked.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(session) => match self.known.get(session) {
                // In cluster mode another node may have moved the session meanwhile: read it.
                Some(record) if matches!(self.sessions, Sessions::Local(_)) => Some(record.clone()),
                Some(_) => self.sessions.session(session).await?,
                None if warmup || matches!(self.sessions, Sessions::Cluster(_)) => {
                    if warmup {
                        self.metrics.warmup_reconnect_attempts.inc();
                    }
                    self.sessions.session(session).await?
                }
                None => None,
            },
        };
        let view = asked.as_ref().map(|r| SessionView { user: &r.user, owner: &r.owner, version: r.version });
        let plan = plan_session(view, &msg.user, &self.node);
        let (session, migrated) = match (plan, asked) {
            (SessionPlan::Reuse, Some(record)) => {
                self.known.insert(record.session.clone(), record.clone());
                (record.session, false)
            }
            (SessionPlan::Migrate { .. }, Some(record)) => {
                self.migrate_user(&msg.user, now).await?;
                (record.session, true)
            }
            _ => (self.create(&msg.user, now).await?, false),
        };
        if warmup && msg.asked.as_deref() == Some(session.as_str()) {
            self.metrics.warmup_reconnect_successes.inc();
        }
        Ok(SessionGrant { session, warmup, migrated })
    }

    async fn reconcile(&mut self) -> Result<(usize, usize), DirectoryError> {
        // This node holds no connection yet: records it owned wait for their clients to
        // reconnect (here or elsewhere); nothing is rewritten in bulk.
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

    fn handle(&mut self, msg: OpenSession, _ctx: &mut Self::Context) -> Self::Result {
        let state = self.state.clone();
        Box::pin(async move { state.lock().await.open(msg).await })
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
