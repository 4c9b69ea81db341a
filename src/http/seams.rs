//! What the handlers need of the other nodes, as a trait the wiring picks once at
//! start-up: how a kick reaches the user's connections on other nodes, a rebalance its
//! nodes and a promotion its cell ([`OtherNodes`]). Single node: no other nodes
//! ([`NoOtherNodes`]); cluster mode: NATS ([`ClusterNodes`]). The credential records are
//! behind their own seam, `store::credentials::CredentialStore`.

use std::sync::Arc;

use futures_util::future::{ready, LocalBoxFuture};

use crate::actors::liveness::Router;
use crate::actors::rooms::Rooms;
use crate::cluster::bus::OrderError;
use crate::cluster::promotion::{Promotion, PromotionError};
use crate::cluster::{Cluster, ClusterError};
use crate::core::nodes::rebalance::Order;

/// Closes a user's connections held by other nodes.
pub trait OtherNodes: Send + Sync + 'static {
    /// Connections of `user` (of `device` only, when given) closed elsewhere, for a kick
    /// made at `at_ms`.
    fn kick<'a>(
        &'a self,
        user: &'a str,
        device: Option<&'a str>,
        at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<usize, ClusterError>>;
    /// Give `node` its part of a rebalance; `Err` with why when it did not acknowledge.
    /// `to_url`: the target's URL as this node knows it, for nodes of earlier builds (this
    /// build's nodes take it from their own view of the cluster).
    fn rebalance<'a>(
        &'a self,
        node: &'a str,
        order: &'a Order,
        to_url: &'a str,
    ) -> LocalBoxFuture<'a, Result<(), OrderNotTaken>>;
    /// Promote `cell`'s rooms into this node's cell (cell domains: see
    /// `cluster::promotion`), once no node of `cell` is heard; this node's subscribers of
    /// the moved rooms resume them where they moved.
    fn promote<'a>(
        &'a self,
        cell: &'a str,
    ) -> LocalBoxFuture<'a, Result<Promotion, PromoteRefused>>;
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
    Refused(#[from] crate::core::nodes::rebalance::OrderRefused),
    /// This node's own rebalancer is gone (it is shutting down).
    #[error("this node's rebalancer is gone: {0}")]
    Stopped(#[from] actix::MailboxError),
}

/// A single node: there is nobody else to ask.
pub struct NoOtherNodes;

impl OtherNodes for NoOtherNodes {
    fn kick<'a>(
        &'a self,
        _user: &'a str,
        _device: Option<&'a str>,
        _at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<usize, ClusterError>> {
        Box::pin(ready(Ok(0)))
    }

    fn rebalance<'a>(
        &'a self,
        node: &'a str,
        _order: &'a Order,
        _to_url: &'a str,
    ) -> LocalBoxFuture<'a, Result<(), OrderNotTaken>> {
        Box::pin(ready(Err(OrderNotTaken::UnknownNode(node.to_string()))))
    }

    fn promote<'a>(
        &'a self,
        _cell: &'a str,
    ) -> LocalBoxFuture<'a, Result<Promotion, PromoteRefused>> {
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
    fn kick<'a>(
        &'a self,
        user: &'a str,
        device: Option<&'a str>,
        at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<usize, ClusterError>> {
        let alive = || async { self.router.peers_heard() };
        Box::pin(async move {
            crate::cluster::bus::kick_remote(&self.cluster, alive, user, device, at_ms).await
        })
    }

    fn rebalance<'a>(
        &'a self,
        node: &'a str,
        order: &'a Order,
        to_url: &'a str,
    ) -> LocalBoxFuture<'a, Result<(), OrderNotTaken>> {
        Box::pin(async move {
            Ok(crate::cluster::bus::send_order(&self.cluster, node, order, to_url).await?)
        })
    }

    fn promote<'a>(
        &'a self,
        cell: &'a str,
    ) -> LocalBoxFuture<'a, Result<Promotion, PromoteRefused>> {
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
