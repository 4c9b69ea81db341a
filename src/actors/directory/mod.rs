//! The session directory actor: decides which session a handshake gets and records
//! session ownership in the store with version checks. It writes only when a session is
//! created or migrates (never on heartbeats), and during warm-up after a restart
//! validates sessions from the store instead of from memory.
//!
//! Where a session is served is the [`Router`](crate::actors::liveness::Router)'s answer, never this node's wish: a
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
mod handshake;
mod kv;
mod seam;
mod shared;

pub use handover::{HandOver, HandedOver};
pub use handshake::OpenSession;
pub use seam::{DirectoryError, Expired, ExpiryPass, SessionStore, UserMoves, WriteError};
pub use shared::{Directory, DirectoryCounts, DirectorySettings};

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::world::now_ms;
use shared::Shared;

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
    /// Shared by every lease (each clone of an actix address is two allocations).
    directory: Arc<Addr<Directory>>,
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

/// Count the directory and start warm-up when it holds sessions; replies with
/// (sessions, sessions owned by this node).
#[derive(Message)]
#[rtype(result = "Result<(usize, usize), DirectoryError>")]
pub struct Reconcile;

/// Whether the node is in warm-up now.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct InWarmup;

impl Directory {
    /// Start the actor, and return with its address the [`SessionOpener`] that handshakes
    /// open their sessions with.
    pub fn start_with_opener(self) -> (Addr<Directory>, SessionOpener) {
        let shared = self.shared.clone();
        let directory = self.start();
        (directory.clone(), SessionOpener { shared, directory: Arc::new(directory) })
    }
}

/// Opens a handshake's session on the handshake's own thread, with the directory's shared
/// decisions and locks, without the two hand-offs between threads (and their wake-ups) of
/// a round trip through the actor's mailbox. The lease it grants still
/// tells the actor when the connection is gone.
#[derive(Clone)]
pub struct SessionOpener {
    shared: Arc<Shared>,
    directory: Arc<Addr<Directory>>,
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
