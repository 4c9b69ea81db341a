//! The liveness actor: probes each peer's `/healthz` (which does a real store read and
//! write) every `probe_interval`, feeds the outcomes to the pure [`Liveness`] table, and
//! answers routing questions with the pure routing functions over the nodes alive now.
//! This node is always a candidate.

use std::time::Duration;

use actix::prelude::*;

use crate::config::Peer;
use crate::metrics::PeerLabel;
use crate::core::liveness::{Change, Liveness};
use crate::core::routing::{route_cell, route_session, CellReport};

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
        LivenessActor { metrics, me, peers, table, interval }
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

    fn node(&self, name: &str) -> Option<&Peer> {
        std::iter::once(&self.me).chain(&self.peers).find(|n| n.name == name)
    }

    fn is_alive(&self, name: &str) -> bool {
        name == self.me.name || self.table.is_alive(name)
    }
}

impl Actor for LivenessActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if !self.peers.is_empty() {
            self.probe_all(ctx);
            ctx.run_interval(self.interval, |actor, ctx| actor.probe_all(ctx));
        }
    }
}

impl Handler<Route> for LivenessActor {
    type Result = Result<RouteAnswer, NoAliveNode>;

    fn handle(&mut self, msg: Route, _ctx: &mut Self::Context) -> Self::Result {
        let nodes: Vec<&Peer> = std::iter::once(&self.me).chain(&self.peers).collect();
        // One report per cell: healthy while any of its nodes is alive.
        let mut cells: Vec<CellReport> = Vec::new();
        for node in &nodes {
            cells.push(CellReport { name: &node.cell, healthy: nodes.iter().any(|n| n.cell == node.cell && self.is_alive(&n.name)) });
        }
        let home = msg.recorded_owner.as_deref().and_then(|o| self.node(o)).map_or(self.me.cell.as_str(), |n| &n.cell);
        let cell = route_cell(&msg.user, home, &cells).map_err(|e| NoAliveNode(e.to_string()))?;
        let owners: Vec<&str> = nodes.iter().filter(|n| n.cell == cell).map(|n| n.name.as_str()).collect();
        let alive: Vec<&str> = owners.iter().copied().filter(|n| self.is_alive(n)).collect();
        let chosen = route_session(&msg.session, msg.recorded_owner.as_deref(), &owners, &alive)
            .map_err(|e| NoAliveNode(e.to_string()))?;
        let node = self.node(chosen).expect("chosen among the nodes");
        Ok(RouteAnswer { node: node.name.clone(), url: node.url.clone() })
    }
}
