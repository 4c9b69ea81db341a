//! What the handlers need of the rest of the deployment, as traits the wiring picks once
//! at start-up: where a token's nonce is marked used ([`Nonces`]) and how a kick reaches
//! the user's connections on other nodes ([`OtherNodes`]). Single node: the embedded
//! store, and no other nodes. Cluster mode: NATS, falling back to this node's store.

use actix::Addr;
use futures_util::future::{ready, LocalBoxFuture};

use crate::actors::liveness::{AlivePeers, LivenessActor};
use crate::cluster::{Cluster, ClusterError};
use crate::store::{Store, StoreError};

/// Marks token nonces used, so a token opens one connection only.
pub trait Nonces: Send + Sync + 'static {
    /// `true` the first time `nonce` is used; it is remembered until `expires_at_ms`.
    fn use_nonce<'a>(&'a self, nonce: &'a [u8; 16], expires_at_ms: u64) -> LocalBoxFuture<'a, Result<bool, StoreError>>;
}

impl Nonces for Store {
    fn use_nonce<'a>(&'a self, nonce: &'a [u8; 16], expires_at_ms: u64) -> LocalBoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(ready(Store::use_nonce(self, nonce, expires_at_ms)))
    }
}

/// Cluster mode: nonces are marked in NATS so a token is single-use across nodes; while
/// NATS is unreachable, in this node's store (single-use on this node at least).
pub struct ClusterNonces {
    pub cluster: Cluster,
    pub store: Store,
}

impl Nonces for ClusterNonces {
    fn use_nonce<'a>(&'a self, nonce: &'a [u8; 16], expires_at_ms: u64) -> LocalBoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            match self.cluster.use_nonce(nonce).await {
                Ok(fresh) => Ok(fresh),
                Err(error) => {
                    tracing::warn!(%error, "token nonce checked on this node only");
                    self.store.use_nonce(nonce, expires_at_ms)
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
