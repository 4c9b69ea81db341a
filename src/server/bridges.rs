//! The cluster's seams implemented over this node's actors: what other nodes send
//! (`cluster::bus::NodeEvents`, presence tables and hellos), the registry's
//! announcements, and the peers cluster occupancy asks about. `cluster` knows none of
//! the actors; this is where the two meet.

use std::sync::Arc;

use actix::Addr;
use futures_util::future::LocalBoxFuture;

use crate::actors::directory::UserMoves;
use crate::actors::liveness::{Heard, Left, LivenessActor, Router};
use crate::actors::messages::{Kick, NewEvent};
use crate::actors::rebalance::{Rebalancer, Shed};
use crate::actors::registry::{Registry, RemoteMoved, RemoteReplace, UserBus};
use crate::actors::room::{Occupancy, PresenceHub};
use crate::actors::rooms::Rooms;
use crate::cluster::bus::NodeEvents;
use crate::cluster::forward::{Appended, ForwardedPublish};
use crate::cluster::occupancy::ClusterOccupancy;
use crate::cluster::Cluster;
use crate::core::nodes::heartbeats::NodeInfo;
use crate::core::nodes::rebalance::{target_url, Known, Order, OrderRefused};
use crate::store::credentials::CredentialStore;

/// The registry's announcements over the cluster's NATS subjects.
pub(super) struct ClusterUserBus(pub(super) Cluster);

impl UserBus for ClusterUserBus {
    fn announce_replace(&self, user: &str, device: &str, at_ms: u64) {
        let (cluster, user, device) = (self.0.clone(), user.to_string(), device.to_string());
        actix::spawn(async move {
            crate::cluster::bus::announce_replace(&cluster, &user, &device, at_ms).await
        });
    }
}

/// The directory's announcements of a user's move, on NATS.
impl UserMoves for ClusterUserBus {
    fn moved(&self, user: &str, at_ms: u64) {
        let (cluster, user) = (self.0.clone(), user.to_string());
        actix::spawn(
            async move { crate::cluster::bus::announce_moved(&cluster, &user, at_ms).await },
        );
    }
}

/// What the other nodes send, handed to the actors that act on it.
#[derive(Clone)]
pub(super) struct NodeActors {
    pub(super) rooms: Rooms,
    pub(super) registry: Addr<Registry>,
    pub(super) liveness: Addr<LivenessActor>,
    /// A kick from another node is answered once its revocations are durable.
    pub(super) nonces: Arc<dyn CredentialStore>,
    pub(super) presence: Arc<PresenceHub>,
    pub(super) rebalance: Addr<Rebalancer>,
    /// Where a node that took a user's sessions is (its URL as this node knows it).
    pub(super) router: Arc<Router>,
    pub(super) metrics: Arc<crate::metrics::Metrics>,
}

impl NodeEvents for NodeActors {
    fn peer_heard(&self, peer: NodeInfo) {
        self.liveness.do_send(Heard(peer));
    }

    fn peer_left(&self, node: String) {
        self.presence.node_gone(&node);
        self.liveness.do_send(Left(node));
    }

    fn replaced(&self, user: String, device: String, at_ms: u64) {
        self.registry.do_send(RemoteReplace { user, device, at_ms });
    }

    /// The URL is the one this node knows for `to` (never one a message carries); a node
    /// it does not hear alive and taking connections is not where anyone is sent.
    fn user_moved(&self, user: String, to: String, at_ms: u64) {
        let nodes = self.router.loads(0).unwrap_or_default();
        let known: Vec<Known> = nodes
            .iter()
            .map(|n| Known { name: &n.name, url: &n.url, draining: n.draining })
            .collect();
        let url = match target_url(&to, &self.router.me().name, &known) {
            Ok(url) => url.to_string(),
            Err(refused) => {
                tracing::info!(user, to, %refused, "a move to a node this one cannot send clients to: the user's connections here stay");
                return;
            }
        };
        let registry = self.registry.clone();
        actix::spawn(async move {
            let closed =
                registry.send(RemoteMoved { user: user.clone(), url, at_ms }).await.unwrap_or(0);
            if closed > 0 {
                tracing::info!(
                    user,
                    to,
                    closed,
                    "the user's sessions moved to another node: its connections here follow"
                );
            }
        });
    }

    fn kick(
        &self,
        user: String,
        device: Option<String>,
        at_ms: u64,
    ) -> LocalBoxFuture<'static, usize> {
        let (registry, nonces) = (self.registry.clone(), self.nonces.clone());
        Box::pin(async move {
            // The asking node recorded the kick in NATS before it asked; this node's store
            // gets it too, so it holds here while NATS is away.
            if let Err(error) = nonces.kick_user(&user, device.as_deref(), at_ms).await {
                tracing::warn!(%error, user, "kick: not recorded in this node's store");
            }
            let closed = registry.send(Kick { user, device, at_ms }).await.unwrap_or(0);
            if let Err(error) = nonces.revocations_durable().await {
                tracing::warn!(%error, "kick: the revocations are not flushed");
            }
            closed
        })
    }

    fn publish(
        &self,
        publish: ForwardedPublish,
    ) -> LocalBoxFuture<'static, Result<Appended, Box<dyn std::error::Error>>> {
        let rooms = self.rooms.clone();
        Box::pin(async move {
            let ForwardedPublish { room, id, data, devices, from, state, put_state } = publish;
            let done = if put_state {
                rooms.put_state(&room, data.into()).await
            } else {
                rooms
                    .publish(
                        &room,
                        NewEvent {
                            id: id.into(),
                            data: data.into(),
                            devices,
                            from,
                            state: state.map(Into::into),
                        },
                    )
                    .await
            };
            match done {
                Ok(published) => Ok(Appended {
                    seq: published.seq,
                    epoch: published.epoch.to_string(),
                    duplicate: published.duplicate,
                }),
                Err(error) => Err(error.into()),
            }
        })
    }

    fn reconnected(&self) {
        self.rooms.resync_all();
        self.presence.reconnected();
    }

    fn rebalance(&self, order: Order) -> LocalBoxFuture<'static, Result<(), OrderRefused>> {
        let rebalance = self.rebalance.clone();
        // A rebalancer gone (the node stops) takes no order: as if it were not there.
        Box::pin(async move {
            rebalance.send(Shed(order)).await.unwrap_or(Err(OrderRefused::UnknownTarget))
        })
    }

    fn rooms_moved(&self, moved: Box<dyn Fn(&str) -> bool>, to: String) {
        self.rooms.moved(moved, &to);
    }

    fn dropped(&self, kind: &'static str) {
        self.metrics.peer_message_dropped(kind);
    }

    fn clamped(&self, kind: &'static str) {
        self.metrics.peer_claim_clamped(kind);
    }
}

impl Occupancy for ClusterOccupancy {
    fn changed(&self, room: &str, occupied: bool, now_ms: u64) {
        self.local_edge(room, occupied, now_ms);
    }
}

/// Rooms' writers and the peers alive, for cluster occupancy, from the router.
pub(super) struct OccupancyPeers(pub(super) Arc<Router>);

impl crate::cluster::occupancy::Peers for OccupancyPeers {
    fn writer(&self, room: &str) -> LocalBoxFuture<'static, Option<String>> {
        Box::pin(std::future::ready(self.0.room_writer(room)))
    }

    fn alive(&self) -> LocalBoxFuture<'static, Vec<String>> {
        Box::pin(std::future::ready(self.0.peers_heard()))
    }
}

/// The other nodes' presence tables and hellos, into the node's presence hub.
#[derive(Clone)]
pub(super) struct PresenceNodes(pub(super) Arc<PresenceHub>);

impl crate::cluster::presence::PresenceEvents for PresenceNodes {
    fn table(&self, node: String, room: String, table: crate::core::delivery::presence::NodeTable) {
        self.0.remote_table(&node, &room, table);
    }

    fn hello(&self, node: String) {
        self.0.hello(&node);
    }
}
