//! What the handlers need of the rest of the deployment, as traits the wiring picks once
//! at start-up: where a credential's nonce is marked used and a session's resume
//! credentials are revoked ([`Nonces`], with the connections' [`ResumeRevocations`]),
//! and how a kick reaches the user's connections on other nodes ([`OtherNodes`]).
//! Single node: the embedded store, and no other nodes. Cluster mode: NATS, falling back
//! to this node's store.

use std::time::Duration;

use actix::Addr;
use futures_util::future::{ready, LocalBoxFuture};

use crate::actors::connection::ResumeRevocations;
use crate::actors::liveness::{AlivePeers, LivenessActor};
use crate::cluster::{Cluster, ClusterError};
use crate::store::{Store, StoreError};

/// Marks token and resume nonces used, so a credential opens one connection only, and
/// says when a session's resume credentials were revoked.
pub trait Nonces: ResumeRevocations + 'static {
    /// `true` the first time `nonce` is used; it is remembered until `expires_at_ms`.
    fn use_nonce<'a>(&'a self, nonce: &'a [u8; 16], expires_at_ms: u64) -> LocalBoxFuture<'a, Result<bool, StoreError>>;
    /// When `session`'s resume credentials were last revoked (a kick or a replace).
    fn resumes_revoked_at<'a>(&'a self, session: &'a str) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>>;
}

/// Single node: the embedded store; revocations are kept for `resume_ttl`.
pub struct StoreNonces {
    pub store: Store,
    pub resume_ttl: Duration,
}

impl Nonces for StoreNonces {
    fn use_nonce<'a>(&'a self, nonce: &'a [u8; 16], expires_at_ms: u64) -> LocalBoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(ready(self.store.use_nonce(nonce, expires_at_ms)))
    }

    fn resumes_revoked_at<'a>(&'a self, session: &'a str) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(ready(self.store.resumes_revoked_at(session)))
    }
}

impl ResumeRevocations for StoreNonces {
    fn revoke(&self, session: &str, at_ms: u64) {
        let keep_until = at_ms.saturating_add(self.resume_ttl.as_millis() as u64);
        if let Err(error) = self.store.revoke_resumes(session, at_ms, keep_until) {
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
}

impl ResumeRevocations for ClusterNonces {
    fn revoke(&self, session: &str, at_ms: u64) {
        self.local.revoke(session, at_ms);
        let (cluster, session) = (self.cluster.clone(), session.to_string());
        actix::spawn(async move {
            if let Err(error) = cluster.revoke_resumes(&session, at_ms).await {
                tracing::warn!(session, %error, "resume credentials revoked on this node only");
            }
        });
    }
}

impl Nonces for ClusterNonces {
    fn resumes_revoked_at<'a>(&'a self, session: &'a str) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let here = self.local.store.resumes_revoked_at(session)?;
            match self.cluster.resumes_revoked_at(session).await {
                Ok(there) => Ok(here.max(there)),
                Err(error) => {
                    tracing::warn!(%error, "resume revocations checked on this node only");
                    Ok(here)
                }
            }
        })
    }

    fn use_nonce<'a>(&'a self, nonce: &'a [u8; 16], expires_at_ms: u64) -> LocalBoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            match self.cluster.use_nonce(nonce).await {
                Ok(fresh) => Ok(fresh),
                Err(error) => {
                    tracing::warn!(%error, "token nonce checked on this node only");
                    self.local.store.use_nonce(nonce, expires_at_ms)
                }
            }
        })
    }
}

/// Closes a user's connections held by other nodes.
pub trait OtherNodes: Send + Sync + 'static {
    /// Connections of `user` (of `device` only, when given) closed elsewhere.
    fn kick<'a>(&'a self, user: &'a str, device: Option<&'a str>) -> LocalBoxFuture<'a, Result<usize, ClusterError>>;
}

/// A single node: there is nobody else to ask.
pub struct NoOtherNodes;

impl OtherNodes for NoOtherNodes {
    fn kick<'a>(&'a self, _user: &'a str, _device: Option<&'a str>) -> LocalBoxFuture<'a, Result<usize, ClusterError>> {
        Box::pin(ready(Ok(0)))
    }
}

/// Cluster mode: the kick goes over NATS and waits for the nodes alive now.
pub struct ClusterNodes {
    pub cluster: Cluster,
    pub liveness: Addr<LivenessActor>,
}

impl OtherNodes for ClusterNodes {
    fn kick<'a>(&'a self, user: &'a str, device: Option<&'a str>) -> LocalBoxFuture<'a, Result<usize, ClusterError>> {
        let alive = || async { self.liveness.send(AlivePeers).await.unwrap_or_default() };
        Box::pin(async move { crate::cluster::bus::kick_remote(&self.cluster, alive, user, device).await })
    }
}
