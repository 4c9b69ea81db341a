//! What the handlers need of the rest of the deployment, as traits the wiring picks once
//! at start-up: where a credential's nonce is marked used (and given back), a session's
//! resume credentials are revoked and a user's kicks are recorded ([`Nonces`], with the
//! connections' [`ResumeRevocations`]),
//! and how a kick reaches the user's connections on other nodes ([`OtherNodes`]).
//! Single node: the embedded store, and no other nodes. Cluster mode: NATS, falling back
//! to this node's store.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{ready, LocalBoxFuture};

use crate::actors::liveness::Router;
use crate::cluster::bus::OrderError;
use crate::actors::rooms::Rooms;
use crate::cluster::promotion::{Promotion, PromotionError};
use crate::cluster::{Cluster, ClusterError};
use crate::core::rebalance::Order;
use crate::store::credentials::ResumeRevocations;
use crate::store::{Store, StoreError};

/// Where a nonce was marked used, so that giving it back undoes exactly that mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpentIn {
    /// This node's store (one node, or NATS was away).
    Store,
    /// NATS (cluster mode).
    Nats,
}

/// Marks token and resume nonces used, so a credential opens one connection only, and
/// says when a session's resume credentials were revoked and when a user was kicked.
pub trait Nonces: ResumeRevocations + 'static {
    /// Where `nonce` was marked, the first time it is used (`None`: used before); it is
    /// remembered until `expires_at_ms`.
    fn use_nonce<'a>(&'a self, nonce: &'a [u8; 16], expires_at_ms: u64) -> LocalBoxFuture<'a, Result<Option<SpentIn>, StoreError>>;
    /// Give back a nonce this handshake just marked used where it was marked, because the
    /// handshake was refused before anything opened (a refusal the client is told to
    /// retry). While it was marked nobody else could use it, so it still opens at most
    /// one connection.
    fn unuse_nonce<'a>(&'a self, nonce: &'a [u8; 16], spent: SpentIn) -> LocalBoxFuture<'a, Result<(), StoreError>>;
    /// Record that `user` (on `device` only, when given) was kicked at `at_ms`: every
    /// credential issued to them at or before then is void. Resolves once that is
    /// durable (the store flushed; in cluster mode NATS acknowledged, or failed and the
    /// kick holds on this node only).
    fn kick_user<'a>(&'a self, user: &'a str, device: Option<&'a str>, at_ms: u64) -> LocalBoxFuture<'a, Result<(), StoreError>>;
    /// When `user` was last kicked on every device or on `device`, whichever is later.
    fn kicked_at<'a>(&'a self, user: &'a str, device: &'a str) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>>;
    /// When `session`'s resume credentials were last revoked (a kick or a replace).
    fn resumes_revoked_at<'a>(&'a self, session: &'a str) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>>;
    /// Resolves once every revocation asked for before the call is durable: the store
    /// flushed and, in cluster mode, each NATS write acknowledged (or failed, when the
    /// revocation holds on this node only). A kick answers only after this.
    fn revocations_durable(&self) -> LocalBoxFuture<'_, Result<(), StoreError>>;
}

/// Single node: the embedded store; revocations are kept for `resume_ttl`, kicks for
/// `credential_ttl`.
pub struct StoreNonces {
    pub store: Store,
    pub resume_ttl: Duration,
    /// The longest a credential lives (`token_ttl_max` or `resume_ttl`): how long a kick
    /// has something to void.
    pub credential_ttl: Duration,
}

impl StoreNonces {
    pub fn new(store: &Store, config: &crate::config::Config) -> Self {
        let credential_ttl = config.token_ttl_max().max(config.resume_ttl());
        StoreNonces { store: store.clone(), resume_ttl: config.resume_ttl(), credential_ttl }
    }

    fn record_kick(&self, user: &str, device: Option<&str>, at_ms: u64) -> Result<(), StoreError> {
        let keep_until = at_ms.saturating_add(self.credential_ttl.as_millis() as u64);
        self.store.kicks().record(user, device, at_ms, keep_until)
    }
}

impl Nonces for StoreNonces {
    fn use_nonce<'a>(&'a self, nonce: &'a [u8; 16], expires_at_ms: u64) -> LocalBoxFuture<'a, Result<Option<SpentIn>, StoreError>> {
        Box::pin(ready(self.store.credentials().use_nonce(nonce, expires_at_ms).map(|fresh| fresh.then_some(SpentIn::Store))))
    }

    fn unuse_nonce<'a>(&'a self, nonce: &'a [u8; 16], _spent: SpentIn) -> LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(ready(self.store.credentials().unuse_nonce(nonce)))
    }

    fn kick_user<'a>(&'a self, user: &'a str, device: Option<&'a str>, at_ms: u64) -> LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.record_kick(user, device, at_ms)?;
            self.store.flush_soon().await
        })
    }

    fn kicked_at<'a>(&'a self, user: &'a str, device: &'a str) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(ready(self.store.kicks().kicked_at(user, device)))
    }

    fn resumes_revoked_at<'a>(&'a self, session: &'a str) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(ready(self.store.credentials().resumes_revoked_at(session)))
    }

    fn revocations_durable(&self) -> LocalBoxFuture<'_, Result<(), StoreError>> {
        // Revocations are written to the store at once; a flush makes them durable.
        Box::pin(self.store.flush_soon())
    }
}

impl ResumeRevocations for StoreNonces {
    fn revoke(&self, session: &str, at_ms: u64) {
        let keep_until = at_ms.saturating_add(self.resume_ttl.as_millis() as u64);
        if let Err(error) = self.store.credentials().revoke_resumes(session, at_ms, keep_until) {
            tracing::warn!(session, %error, "could not revoke the session's resume credentials");
        }
    }
}

/// Cluster mode: nonces are marked in NATS so a credential is single-use across nodes;
/// while NATS is unreachable, in this node's store (single-use on this node at least).
/// Revocations go to both, so this node honours them even while NATS is away.
pub struct ClusterNonces {
    pub cluster: Cluster,
    pub local: StoreNonces,
    /// Revocations on their way to NATS.
    pub sending: Arc<InFlight>,
}

impl ResumeRevocations for ClusterNonces {
    fn revoke(&self, session: &str, at_ms: u64) {
        self.local.revoke(session, at_ms);
        let (cluster, session) = (self.cluster.clone(), session.to_string());
        let sent = InFlight::start(&self.sending);
        actix::spawn(async move {
            if let Err(error) = cluster.revoke_resumes(&session, at_ms).await {
                tracing::warn!(session, %error, "resume credentials revoked on this node only");
            }
            drop(sent);
        });
    }
}

/// Writes started and not yet finished, so a caller can wait for those started before
/// it. Bounded by the writes in flight (each ends with its NATS request's timeout).
#[derive(Default)]
pub struct InFlight {
    /// The next write's number, and the numbers of those still running.
    running: parking_lot::Mutex<(u64, BTreeSet<u64>)>,
    finished: tokio::sync::Notify,
}

/// One write in flight; finished when dropped (also when its task is cancelled).
pub struct Sending {
    to: Arc<InFlight>,
    id: u64,
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.to.running.lock().1.remove(&self.id);
        self.to.finished.notify_waiters();
    }
}

impl InFlight {
    pub fn start(this: &Arc<InFlight>) -> Sending {
        let mut running = this.running.lock();
        let id = running.0;
        running.0 += 1;
        running.1.insert(id);
        Sending { to: Arc::clone(this), id }
    }

    /// Resolves once every write started before the call has finished.
    pub async fn settled(&self) {
        let before = self.running.lock().0;
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            if self.running.lock().1.range(..before).next().is_none() {
                return;
            }
            finished.await;
        }
    }
}

impl Nonces for ClusterNonces {
    fn revocations_durable(&self) -> LocalBoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.sending.settled().await;
            self.local.revocations_durable().await
        })
    }

    fn resumes_revoked_at<'a>(&'a self, session: &'a str) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let here = self.local.store.credentials().resumes_revoked_at(session)?;
            match self.cluster.resumes_revoked_at(session).await {
                Ok(there) => Ok(here.max(there)),
                Err(error) => {
                    tracing::warn!(%error, "resume revocations checked on this node only");
                    Ok(here)
                }
            }
        })
    }

    fn use_nonce<'a>(&'a self, nonce: &'a [u8; 16], expires_at_ms: u64) -> LocalBoxFuture<'a, Result<Option<SpentIn>, StoreError>> {
        Box::pin(async move {
            match self.cluster.use_nonce(nonce).await {
                Ok(fresh) => Ok(fresh.then_some(SpentIn::Nats)),
                Err(error) => {
                    tracing::warn!(%error, "token nonce checked on this node only");
                    self.local.use_nonce(nonce, expires_at_ms).await
                }
            }
        })
    }

    fn unuse_nonce<'a>(&'a self, nonce: &'a [u8; 16], spent: SpentIn) -> LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            match spent {
                SpentIn::Store => self.local.store.credentials().unuse_nonce(nonce),
                SpentIn::Nats => {
                    if let Err(error) = self.cluster.unuse_nonce(nonce).await {
                        // It stays spent: the client gets a new credential, as before.
                        tracing::warn!(%error, "a refused handshake's nonce could not be given back");
                    }
                    Ok(())
                }
            }
        })
    }

    fn kick_user<'a>(&'a self, user: &'a str, device: Option<&'a str>, at_ms: u64) -> LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.local.record_kick(user, device, at_ms)?;
            if let Err(error) = self.cluster.record_kick(user, device, at_ms).await {
                tracing::warn!(user, %error, "kick recorded on this node only");
            }
            self.local.store.flush_soon().await
        })
    }

    fn kicked_at<'a>(&'a self, user: &'a str, device: &'a str) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let here = self.local.store.kicks().kicked_at(user, device)?;
            match self.cluster.kicked_at(user, device).await {
                Ok(there) => Ok(here.max(there)),
                Err(error) => {
                    tracing::warn!(%error, "kicks checked on this node only");
                    Ok(here)
                }
            }
        })
    }
}

/// Closes a user's connections held by other nodes.
pub trait OtherNodes: Send + Sync + 'static {
    /// Connections of `user` (of `device` only, when given) closed elsewhere, for a kick
    /// made at `at_ms`.
    fn kick<'a>(&'a self, user: &'a str, device: Option<&'a str>, at_ms: u64) -> LocalBoxFuture<'a, Result<usize, ClusterError>>;
    /// Give `node` its part of a rebalance; `Err` with why when it did not acknowledge.
    /// `to_url`: the target's URL as this node knows it, for nodes of earlier builds (this
    /// build's nodes take it from their own view of the cluster).
    fn rebalance<'a>(&'a self, node: &'a str, order: &'a Order, to_url: &'a str) -> LocalBoxFuture<'a, Result<(), OrderNotTaken>>;
    /// Promote `cell`'s rooms into this node's cell (cell domains: see
    /// `cluster::promotion`), once no node of `cell` is heard; this node's subscribers of
    /// the moved rooms resume them where they moved.
    fn promote<'a>(&'a self, cell: &'a str) -> LocalBoxFuture<'a, Result<Promotion, PromoteRefused>>;
}

/// Why a promotion was not made.
#[derive(Debug, thiserror::Error)]
pub enum PromoteRefused {
    #[error("cell {cell:?} is not lost: its nodes {nodes:?} are heard (promote only a cell that is gone for good)")]
    Alive { cell: String, nodes: Vec<String> },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// Why a node did not take its part of a rebalance (the plan's `shares[].error`).
#[derive(Debug, thiserror::Error)]
pub enum OrderNotTaken {
    /// A single node has nobody else to give a share to.
    #[error("no other node: {0} is unknown")]
    UnknownNode(String),
    /// The order did not reach the node over NATS, or the node refused it.
    #[error(transparent)]
    Cluster(#[from] OrderError),
    /// This node refused its own part (the target is itself, or not alive and taking).
    #[error(transparent)]
    Refused(#[from] crate::core::rebalance::OrderRefused),
    /// This node's own rebalancer is gone (it is shutting down).
    #[error("this node's rebalancer is gone: {0}")]
    Stopped(#[from] actix::MailboxError),
}

/// A single node: there is nobody else to ask.
pub struct NoOtherNodes;

impl OtherNodes for NoOtherNodes {
    fn kick<'a>(&'a self, _user: &'a str, _device: Option<&'a str>, _at_ms: u64) -> LocalBoxFuture<'a, Result<usize, ClusterError>> {
        Box::pin(ready(Ok(0)))
    }

    fn rebalance<'a>(&'a self, node: &'a str, _order: &'a Order, _to_url: &'a str) -> LocalBoxFuture<'a, Result<(), OrderNotTaken>> {
        Box::pin(ready(Err(OrderNotTaken::UnknownNode(node.to_string()))))
    }

    fn promote<'a>(&'a self, _cell: &'a str) -> LocalBoxFuture<'a, Result<Promotion, PromoteRefused>> {
        Box::pin(ready(Err(ClusterError::from(PromotionError::NoCellDomains).into())))
    }
}

/// Cluster mode: the kick goes over NATS and waits for the nodes alive now.
pub struct ClusterNodes {
    pub cluster: Cluster,
    pub router: Arc<Router>,
    /// This node's rooms, reset when a promotion moves them.
    pub rooms: Rooms,
}

impl OtherNodes for ClusterNodes {
    fn kick<'a>(&'a self, user: &'a str, device: Option<&'a str>, at_ms: u64) -> LocalBoxFuture<'a, Result<usize, ClusterError>> {
        let alive = || async { self.router.peers_heard() };
        Box::pin(async move { crate::cluster::bus::kick_remote(&self.cluster, alive, user, device, at_ms).await })
    }

    fn rebalance<'a>(&'a self, node: &'a str, order: &'a Order, to_url: &'a str) -> LocalBoxFuture<'a, Result<(), OrderNotTaken>> {
        Box::pin(async move { Ok(crate::cluster::bus::send_order(&self.cluster, node, order, to_url).await?) })
    }

    fn promote<'a>(&'a self, cell: &'a str) -> LocalBoxFuture<'a, Result<Promotion, PromoteRefused>> {
        Box::pin(async move {
            let nodes = self.router.alive_in(cell);
            if !nodes.is_empty() {
                return Err(PromoteRefused::Alive { cell: cell.to_string(), nodes });
            }
            let promotion = self.cluster.promote(cell).await?;
            self.rooms.moved(self.cluster.rooms_of(cell.to_string()), &promotion.to);
            Ok(promotion)
        })
    }
}
