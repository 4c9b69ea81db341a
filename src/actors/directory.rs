//! The session directory actor: decides which session a handshake gets and records
//! session ownership in the store with version checks. It writes only when a session is
//! created or migrates (never on heartbeats), charges every owner change to the user's
//! migration budget, and during warm-up after a restart validates sessions from the store
//! instead of from memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::world::{now_ms, random_hex};
use crate::core::sessions::{check_migration_budget, plan_session, BudgetError, SessionPlan, SessionView};
use crate::metrics::Metrics;
use crate::store::{SessionRecord, Store, StoreError};

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
    #[error("session directory: {0}")]
    Store(String),
}

impl From<StoreError> for DirectoryError {
    fn from(e: StoreError) -> Self {
        DirectoryError::Store(e.to_string())
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

pub struct Directory {
    store: Store,
    node: String,
    migration_window_ms: u64,
    warmup: Duration,
    warmup_until: Option<Instant>,
    /// Sessions this process created, migrated or validated.
    known: HashMap<String, SessionRecord>,
    metrics: Arc<Metrics>,
}

impl Directory {
    pub fn new(store: Store, node: String, migration_window: Duration, warmup: Duration, metrics: Arc<Metrics>) -> Self {
        Directory {
            store,
            node,
            migration_window_ms: migration_window.as_millis() as u64,
            warmup,
            warmup_until: None,
            known: HashMap::new(),
            metrics,
        }
    }

    fn in_warmup(&mut self) -> bool {
        let active = self.warmup_until.is_some_and(|until| Instant::now() < until);
        if !active && self.warmup_until.take().is_some() {
            tracing::info!("warm-up over: sessions validated from memory only");
            self.metrics.warmup_active.set(0);
        }
        active
    }

    /// A counted directory write.
    fn write(&mut self, read_version: Option<u64>, record: SessionRecord) -> Result<SessionRecord, StoreError> {
        let result = self.store.write_session(read_version, &record);
        self.metrics.directory_write(match &result {
            Ok(_) => "ok",
            Err(StoreError::Stale(_)) => "stale",
            Err(_) => "error",
        });
        let written = result?;
        self.known.insert(written.session.clone(), written.clone());
        Ok(written)
    }

    /// Move every session of `user` owned elsewhere to this node: one budget charge.
    fn migrate_user(&mut self, user: &str, now: u64) -> Result<(), DirectoryError> {
        let last = self.store.last_migration(user)?;
        if let Err(refusal) = check_migration_budget(last, now, self.migration_window_ms) {
            self.metrics.migration_refusals.inc();
            tracing::info!(user, %refusal, "migration refused");
            return Err(refusal.into());
        }
        for record in self.store.sessions_of_user(user)? {
            if record.owner == self.node {
                continue;
            }
            let from = record.owner.clone();
            let moved = SessionRecord { owner: self.node.clone(), updated_at_ms: now, ..record.clone() };
            match self.write(Some(record.version), moved) {
                Ok(written) => tracing::info!(user, session = %written.session, from = %from, to = %self.node, version = written.version, "session migrated"),
                Err(StoreError::Stale(stale)) => tracing::info!(user, session = %record.session, %stale, "migration lost a race; keeping the newer record"),
                Err(e) => return Err(e.into()),
            }
        }
        self.store.set_last_migration(user, now)?;
        self.metrics.migrations.inc();
        Ok(())
    }

    fn create(&mut self, user: &str, now: u64) -> Result<String, DirectoryError> {
        let record = SessionRecord {
            session: random_hex(12),
            user: user.to_string(),
            owner: self.node.clone(),
            version: 0,
            updated_at_ms: now,
        };
        Ok(self.write(None, record)?.session)
    }
}

impl Actor for Directory {
    type Context = Context<Self>;
}

impl Handler<OpenSession> for Directory {
    type Result = Result<SessionGrant, DirectoryError>;

    fn handle(&mut self, msg: OpenSession, _ctx: &mut Self::Context) -> Self::Result {
        let now = now_ms();
        let warmup = self.in_warmup();
        let asked = match msg.asked.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(session) => match self.known.get(session) {
                Some(record) => Some(record.clone()),
                None if warmup => {
                    self.metrics.warmup_reconnect_attempts.inc();
                    self.store.session(session)?
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
                self.migrate_user(&msg.user, now)?;
                (record.session, true)
            }
            _ => (self.create(&msg.user, now)?, false),
        };
        if warmup && msg.asked.as_deref() == Some(session.as_str()) {
            self.metrics.warmup_reconnect_successes.inc();
        }
        Ok(SessionGrant { session, warmup, migrated })
    }
}

impl Handler<Reconcile> for Directory {
    type Result = Result<(usize, usize), DirectoryError>;

    fn handle(&mut self, _msg: Reconcile, ctx: &mut Self::Context) -> Self::Result {
        // This node holds no connection yet: records it owned wait for their clients to
        // reconnect (here or elsewhere); nothing is rewritten in bulk.
        let (sessions, owned) = self.store.count_sessions(&self.node)?;
        if sessions > 0 && !self.warmup.is_zero() {
            self.warmup_until = Some(Instant::now() + self.warmup);
            self.metrics.warmup_active.set(1);
            // End the window on time even if no handshake asks.
            ctx.run_later(self.warmup + Duration::from_millis(10), |dir, _| {
                dir.in_warmup();
            });
        }
        tracing::info!(sessions, owned_here = owned, warmup_secs = self.warmup.as_secs(), warmup = sessions > 0, "directory reconciled");
        Ok((sessions, owned))
    }
}

impl Handler<InWarmup> for Directory {
    type Result = bool;

    fn handle(&mut self, _msg: InWarmup, _ctx: &mut Self::Context) -> bool {
        self.in_warmup()
    }
}
