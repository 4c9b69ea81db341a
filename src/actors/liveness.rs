//! The liveness actor: probes each peer's `/healthz` (which does a real store read and
//! write) every `probe_interval`, feeds the outcomes to the pure [`Liveness`] table, and
//! answers routing questions with the pure routing functions over the nodes alive now.
//! This node is always a candidate.
//!
//! In cluster mode there is no peer list: nodes announce themselves by heartbeats on NATS
//! (the pure [`Heartbeats`] table), a peer not heard for three periods is down, and a
//! draining node (this one included) stops being a candidate at once.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::cluster::Cluster;
use crate::config::Peer;
use crate::core::heartbeats::{Heartbeats, NodeInfo, Seen};
use crate::core::liveness::{Change, Liveness};
use crate::core::routing::{room_writer, route_cell, route_session, CellReport};
use crate::core::lifecycle::Lifecycle;
use crate::metrics::PeerLabel;
use crate::world::now_ms;

/// Cluster mode: a peer's heartbeat.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Heard(pub NodeInfo);

/// Cluster mode: a peer said goodbye.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Left(pub String);

/// Cluster mode: which node appends `room`'s events now (one writer per room).
#[derive(Message)]
#[rtype(result = "Option<String>")]
pub struct RoomWriter {
    pub room: String,
}

/// Cluster mode: the names of the peers alive now (draining ones included).
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct AlivePeers;

/// Cluster mode: this node's heartbeats and the table of its peers' heartbeats.
pub struct ClusterPeers {
    pub cluster: Cluster,
    pub lifecycle: Arc<Lifecycle>,
    pub table: Heartbeats,
    /// A dead peer's members leave every room's presence.
    pub presence: Arc<super::room::PresenceHub>,
}

/// Which node should serve `session` (recorded on `recorded_owner`, if known) of `user`.
#[derive(Message)]
#[rtype(result = "Result<RouteAnswer, NoAliveNode>")]
pub struct Route {
    pub session: String,
    pub user: String,
    pub recorded_owner: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteAnswer {
    pub node: String,
    pub url: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoAliveNode(pub String);

pub struct LivenessActor {
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    me: Peer,
    peers: Vec<Peer>,
    table: Liveness,
    interval: Duration,
    cluster: Option<ClusterPeers>,
}

impl LivenessActor {
    pub fn new(
        me: Peer,
        peers: Vec<Peer>,
        interval: Duration,
        up_after: u32,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> Self {
        let table = Liveness::new(peers.iter().map(|p| p.name.clone()), up_after);
        for peer in &peers {
            metrics.peer_up.get_or_create(&PeerLabel { peer: peer.name.clone() }).set(0);
        }
        LivenessActor { metrics, me, peers, table, interval, cluster: None }
    }

    /// Cluster mode: peers come from heartbeats every `interval`, down after three missed.
    pub fn clustered(me: Peer, interval: Duration, peers: ClusterPeers, metrics: Arc<crate::metrics::Metrics>) -> Self {
        LivenessActor { metrics, me, peers: Vec::new(), table: Liveness::new([], 1), interval, cluster: Some(peers) }
    }

    fn beat(&mut self, ctx: &mut Context<Self>) {
        let Some(peers) = &mut self.cluster else { return };
        let now = now_ms();
        for gone in peers.table.expire(now) {
            tracing::warn!(peer = %gone, "peer down: no heartbeat");
            peers.presence.node_gone(&gone);
        }
        let table = &peers.table;
        peers.presence.sweep(|node| table.alive(now).any(|info| info.name == node), table.timeout_ms());
        self.metrics.cluster_peers_alive.set(peers.table.alive(now).count() as i64);
        let info = NodeInfo {
            name: self.me.name.clone(),
            cell: self.me.cell.clone(),
            url: self.me.url.clone(),
            draining: peers.lifecycle.phase().is_draining(),
        };
        let cluster = peers.cluster.clone();
        ctx.spawn(
            async move {
                if let Err(error) = cluster.heartbeat(&info).await {
                    tracing::debug!(%error, "heartbeat not sent");
                }
            }
            .into_actor(self),
        );
    }

    /// The nodes routing may choose among, and which of them take new connections.
    fn candidates(&self) -> (Vec<Peer>, Vec<String>) {
        let Some(peers) = &self.cluster else {
            let nodes: Vec<Peer> = std::iter::once(&self.me).chain(&self.peers).cloned().collect();
            let alive = nodes.iter().filter(|n| self.is_alive(&n.name)).map(|n| n.name.clone()).collect();
            return (nodes, alive);
        };
        let now = now_ms();
        let mut nodes = vec![self.me.clone()];
        let mut alive = Vec::new();
        for info in peers.table.alive(now) {
            nodes.push(Peer { name: info.name.clone(), cell: info.cell.clone(), url: info.url.clone() });
            if !info.draining {
                alive.push(info.name.clone());
            }
        }
        // A draining node sends new clients elsewhere, unless nobody else is left.
        if !peers.lifecycle.phase().is_draining() || alive.is_empty() {
            alive.push(self.me.name.clone());
        }
        (nodes, alive)
    }

    fn probe_all(&mut self, ctx: &mut Context<Self>) {
        let timeout = self.interval.max(Duration::from_millis(200));
        for peer in self.peers.clone() {
            let url = format!("{}/healthz", peer.url);
            let probe = actix_web::rt::task::spawn_blocking(move || {
                let agent = ureq::AgentBuilder::new().timeout(timeout).build();
                agent.get(&url).call().is_ok()
            });
            ctx.spawn(probe.into_actor(self).map(move |ok, actor, _| {
                let ok = ok.unwrap_or(false);
                let change = actor.table.on_probe(&peer.name, ok);
                match change {
                    Some(Change::WentDown) => tracing::warn!(peer = %peer.name, "peer down"),
                    Some(Change::CameUp) => tracing::info!(peer = %peer.name, "peer up"),
                    None => {}
                }
                let up = i64::from(actor.table.is_alive(&peer.name));
                actor.metrics.peer_up.get_or_create(&PeerLabel { peer: peer.name.clone() }).set(up);
            }));
        }
    }

    fn is_alive(&self, name: &str) -> bool {
        name == self.me.name || self.table.is_alive(name)
    }
}

impl Actor for LivenessActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if self.cluster.is_some() {
            self.beat(ctx);
            ctx.run_interval(self.interval, |actor, ctx| actor.beat(ctx));
        }
        if !self.peers.is_empty() {
            self.probe_all(ctx);
            ctx.run_interval(self.interval, |actor, ctx| actor.probe_all(ctx));
        }
    }
}

impl Handler<Route> for LivenessActor {
    type Result = Result<RouteAnswer, NoAliveNode>;

    fn handle(&mut self, msg: Route, _ctx: &mut Self::Context) -> Self::Result {
        let (nodes, alive_names) = self.candidates();
        let is_alive = |name: &str| alive_names.iter().any(|n| n == name);
        // One report per cell: healthy while any of its nodes is alive.
        let mut cells: Vec<CellReport> = Vec::new();
        for node in &nodes {
            cells.push(CellReport { name: &node.cell, healthy: nodes.iter().any(|n| n.cell == node.cell && is_alive(&n.name)) });
        }
        let find = |name: &str| nodes.iter().find(|n| n.name == name);
        let home = msg.recorded_owner.as_deref().and_then(find).map_or(self.me.cell.as_str(), |n| &n.cell);
        let cell = route_cell(&msg.user, home, &cells).map_err(|e| NoAliveNode(e.to_string()))?;
        let owners: Vec<&str> = nodes.iter().filter(|n| n.cell == cell).map(|n| n.name.as_str()).collect();
        let alive: Vec<&str> = owners.iter().copied().filter(|n| is_alive(n)).collect();
        let chosen = route_session(&msg.session, msg.recorded_owner.as_deref(), &owners, &alive)
            .map_err(|e| NoAliveNode(e.to_string()))?;
        let node = find(chosen).expect("chosen among the nodes");
        Ok(RouteAnswer { node: node.name.clone(), url: node.url.clone() })
    }
}

impl Handler<Heard> for LivenessActor {
    type Result = ();

    fn handle(&mut self, msg: Heard, _ctx: &mut Self::Context) {
        let Some(peers) = &mut self.cluster else { return };
        if msg.0.name == self.me.name {
            return;
        }
        let (name, draining) = (msg.0.name.clone(), msg.0.draining);
        match peers.table.heard(msg.0, now_ms()) {
            Seen::Joined => tracing::info!(peer = %name, draining, "peer up"),
            Seen::DrainingChanged => tracing::info!(peer = %name, draining, "peer draining changed"),
            Seen::Unchanged => {}
        }
    }
}

impl Handler<Left> for LivenessActor {
    type Result = ();

    fn handle(&mut self, msg: Left, _ctx: &mut Self::Context) {
        if let Some(peers) = &mut self.cluster {
            if peers.table.left(&msg.0) {
                tracing::info!(peer = %msg.0, "peer left");
            }
        }
    }
}

impl Handler<RoomWriter> for LivenessActor {
    type Result = Option<String>;

    fn handle(&mut self, msg: RoomWriter, _ctx: &mut Self::Context) -> Option<String> {
        self.cluster.as_ref()?;
        let (_, alive) = self.candidates();
        let alive: Vec<&str> = alive.iter().map(String::as_str).collect();
        room_writer(&msg.room, &alive).map(str::to_string)
    }
}

impl Handler<AlivePeers> for LivenessActor {
    type Result = Vec<String>;

    fn handle(&mut self, _msg: AlivePeers, _ctx: &mut Self::Context) -> Vec<String> {
        self.cluster.as_ref().map_or_else(Vec::new, |p| p.table.alive(now_ms()).map(|info| info.name.clone()).collect())
    }
}

/// The nodes as this node sees them, itself first (the admin overview): in cluster mode
/// the peers heard within the heartbeat timeout, with peers configured by `peers` the
/// probed ones (down included), on a single node just itself.
#[derive(Message)]
#[rtype(result = "Vec<NodeView>")]
pub struct Nodes;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub url: String,
    /// `ready`, `draining` or `down` for a peer; `None` for this node (whose phase the
    /// caller reads from its lifecycle).
    pub phase: Option<&'static str>,
}

impl Handler<Nodes> for LivenessActor {
    type Result = Vec<NodeView>;

    fn handle(&mut self, _msg: Nodes, _ctx: &mut Self::Context) -> Vec<NodeView> {
        let me = NodeView { name: self.me.name.clone(), url: self.me.url.clone(), phase: None };
        let peers: Vec<NodeView> = match &self.cluster {
            Some(peers) => peers
                .table
                .alive(now_ms())
                .filter(|info| info.name != self.me.name)
                .map(|info| NodeView {
                    name: info.name.clone(),
                    url: info.url.clone(),
                    phase: Some(if info.draining { "draining" } else { "ready" }),
                })
                .collect(),
            None => self
                .peers
                .iter()
                .map(|peer| NodeView {
                    name: peer.name.clone(),
                    url: peer.url.clone(),
                    phase: Some(if self.table.is_alive(&peer.name) { "ready" } else { "down" }),
                })
                .collect(),
        };
        std::iter::once(me).chain(peers).collect()
    }
}
