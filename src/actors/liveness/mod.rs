//! The liveness actor and the [`Router`] it keeps current. The actor probes each peer's
//! `/healthz` (which does a real store read and write, and says whether the peer is
//! draining) every `probe_interval` and feeds the outcomes to the pure
//! [`Liveness`](crate::core::nodes::liveness::Liveness) table; in cluster mode there is no peer list: nodes announce themselves by heartbeats
//! on NATS (the pure [`Heartbeats`](crate::core::nodes::heartbeats::Heartbeats) table), a peer is up after `probe_up_after`
//! heartbeats in a row and down when not heard for three periods.
//!
//! The [`Router`] (`router`) holds those tables and the configured cells and answers
//! every routing question; the probe of a peer's `/healthz` is `probe`.
//!
//! Joining (cluster mode): after its start-up reconcile a node takes connections but is
//! not ready (`Phase::Joining`); at every heartbeat heard and every period the actor asks
//! whether every live peer of its cell lists it among the nodes it routes to
//! ([`Heartbeats::not_routing_to`](crate::core::nodes::heartbeats::Heartbeats::not_routing_to), [`readiness`]) and turns it ready when they do, or
//! when [`join_limit`] is over (logged with the peers that did not). A node beats early
//! (at most once every [`EARLY_BEAT_GAP`]) when it hears a peer for the first time or a peer
//! comes up or changes its draining: a new node learns that its peers route to it within
//! moments rather than a period. Peers mode has no such wait: a node
//! there is ready after its reconcile.
//!
//! Cell health (cluster mode): every heartbeat period the actor probes this node's cell
//! (`Cluster::probe_cell`, a JetStream write and read), sends the last outcome with its
//! heartbeat, and feeds each configured cell's breaker with the AND of the reports of that
//! cell's nodes heard now, this one's included ([`CellBreakers`](crate::core::nodes::breaker::CellBreakers)). The route counts a cell
//! whose breaker is not closed as unhealthy.

mod probe;
mod router;

pub use router::{NodeLoad, NodeView, OwnLoad, RouteAnswer, Router, Unroutable};

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::cluster::Cluster;
use crate::core::nodes::breaker::{State as BreakerState, Transition};
use crate::core::nodes::heartbeats::{readiness, NodeInfo, Readiness, Seen, Usage};
use crate::core::nodes::lifecycle::Phase;
use crate::core::nodes::liveness::Change;
use crate::metrics::{CellLabel, CellTransitionLabel, OutcomeLabel, PeerLabel};
use crate::world::now_ms;
use probe::probe;
use router::Peers;

/// Early heartbeats (see the module doc) are at least this far apart, or a quarter
/// period if shorter: peers that come and go cost a node at most four more a second.
const EARLY_BEAT_GAP: Duration = Duration::from_millis(250);

/// How long a joining node waits for its peers to route to it before it turns ready
/// anyway: a peer counts it up after `up_after` heartbeats in a row and lists it in its
/// next one, so `up_after + 5` periods leave room for a lost heartbeat or two; at least
/// 10 s. A peer that never lists it (a bug, a partition that lets its heartbeats through
/// one way) delays its readiness by this much, never for ever.
pub fn join_limit(period: Duration, up_after: u32) -> Duration {
    (period * up_after.saturating_add(5)).max(Duration::from_secs(10))
}

/// Cluster mode: a peer's heartbeat.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Heard(pub NodeInfo);

/// Cluster mode: a peer said goodbye.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Left(pub String);

/// The node is stopping: no heartbeat or probe after this one (the actor stops, and its
/// timers and futures with it).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Cluster mode: this node's heartbeats, sent by the actor.
pub struct ClusterPeers {
    pub cluster: Cluster,
    /// A dead peer's members leave every room's presence.
    pub presence: Arc<super::room::PresenceHub>,
}

pub struct LivenessActor {
    metrics: Arc<crate::metrics::Metrics>,
    router: Arc<Router>,
    interval: Duration,
    /// Cluster mode: how long a joining node waits for its peers ([`join_limit`]).
    join_limit: Duration,
    /// When this node began joining (ms), while it does.
    joining_since: Option<u64>,
    /// When this node last sent a heartbeat (ms): an early one waits [`EARLY_BEAT_GAP`].
    last_beat_ms: u64,
    cluster: Option<ClusterPeers>,
    /// A probe of this node's cell is in flight: the next period does not start another.
    probing_cell: bool,
    /// What the last heartbeat's usage was measured from.
    usage_meter: UsageMeter,
}

/// This node's use of its machine between two heartbeats: CPU time and events delivered
/// then and now, over the wall time between.
#[derive(Default)]
struct UsageMeter {
    last: Option<(std::time::Instant, f64, u64)>,
}

impl UsageMeter {
    /// The usage since the last reading (`None` at the first one).
    fn read(&mut self, metrics: &crate::metrics::Metrics) -> Option<Usage> {
        let now = (
            std::time::Instant::now(),
            crate::metrics::process_cpu_seconds()?,
            metrics.events_delivered.get(),
        );
        let last = self.last.replace(now)?;
        let wall = now.0.duration_since(last.0).as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        Some(Usage {
            cpu_permille: ((now.1 - last.1).max(0.0) / wall * 1000.0) as u64,
            resident_bytes: crate::metrics::process_resident_bytes().unwrap_or(0),
            deliveries_per_sec: (now.2.saturating_sub(last.2) as f64 / wall) as u64,
        })
    }
}

impl LivenessActor {
    /// Probes the router's configured peers every `interval` (none: a single node).
    pub fn probing(
        router: Arc<Router>,
        interval: Duration,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        if let Peers::Probed { peers, .. } = &*router.peers.lock() {
            for peer in peers {
                metrics.peer_up.get_or_create(&PeerLabel { peer: peer.name.clone() }).set(0);
            }
        }
        LivenessActor {
            metrics,
            router,
            interval,
            join_limit: Duration::ZERO,
            joining_since: None,
            last_beat_ms: 0,
            cluster: None,
            probing_cell: false,
            usage_meter: UsageMeter::default(),
        }
    }

    /// Cluster mode: heartbeats every `interval`.
    pub fn clustered(
        router: Arc<Router>,
        interval: Duration,
        peers: ClusterPeers,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        for (cell, state) in router.breaker_states() {
            for to in crate::core::nodes::breaker::STATE_NAMES {
                drop(
                    metrics
                        .cell_breaker_transitions
                        .get_or_create(&CellTransitionLabel { cell: cell.clone(), to }),
                );
            }
            metrics
                .cell_breaker_state
                .get_or_create(&CellLabel { cell })
                .set(crate::metrics::breaker_state_value(state));
        }
        let join_limit = join_limit(interval, router.up_after());
        LivenessActor {
            metrics,
            router,
            interval,
            join_limit,
            joining_since: None,
            last_beat_ms: 0,
            cluster: Some(peers),
            probing_cell: false,
            usage_meter: UsageMeter::default(),
        }
    }

    fn beat(&mut self, ctx: &mut Context<Self>) {
        let Some(peers) = &self.cluster else { return };
        let now = now_ms();
        self.last_beat_ms = now;
        let me_cell = self.router.me().cell.clone();
        let (gone, alive, recent, timeout_ms, routes_to) = match &mut *self.router.peers.lock() {
            Peers::Heard(table) => {
                let gone = table.expire(now);
                let recent: Vec<String> = table.recent(now).map(|info| info.name.clone()).collect();
                (
                    gone,
                    table.alive(now).count(),
                    recent,
                    table.timeout_ms(),
                    table.routes_to(&me_cell, now),
                )
            }
            Peers::Probed { .. } => return,
        };
        for gone in gone {
            tracing::warn!(peer = %gone, "peer down: no heartbeat");
            peers.presence.node_gone(&gone);
        }
        peers.presence.sweep(|node| recent.iter().any(|name| name == node), timeout_ms);
        self.metrics.cluster_peers_alive.set(alive as i64);
        self.metrics.cluster_nats_connected.set(i64::from(peers.cluster.connected()));
        let me = self.router.me();
        let info = NodeInfo {
            name: me.name.clone(),
            cell: me.cell.clone(),
            url: me.url.clone(),
            draining: self.router.draining(),
            started_at_ms: self.router.started_at_ms,
            connections: Some(self.metrics.connections_now()),
            capacity: self.router.own_load().map(|load| load.capacity),
            usage: self.usage_meter.read(&self.metrics),
            probe: *self.router.own_probe.lock(),
            release: self.router.release.clone(),
            routes_to: Some(routes_to),
        };
        if info.usage.is_some() {
            *self.router.own_usage.lock() = info.usage;
        }
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

    /// A heartbeat period: the cells' breakers take a round, this node probes its cell
    /// (at most one probe in flight, bounded by the period), then beats.
    fn period(&mut self, ctx: &mut Context<Self>) {
        let Some(peers) = &self.cluster else { return };
        let now = now_ms();
        for Transition { cell, from, to } in self.router.cell_round(now) {
            match to {
                BreakerState::Open { .. } => {
                    tracing::warn!(%cell, from, to = to.name(), "cell breaker opened: its probes fail, the route sends its users to the next healthy cell")
                }
                _ => tracing::info!(%cell, from, to = to.name(), "cell breaker changed"),
            }
            self.metrics
                .cell_breaker_transitions
                .get_or_create(&CellTransitionLabel { cell, to: to.name() })
                .inc();
        }
        for (cell, state) in self.router.breaker_states() {
            self.metrics
                .cell_breaker_state
                .get_or_create(&CellLabel { cell })
                .set(crate::metrics::breaker_state_value(state));
        }
        if !self.probing_cell {
            self.probing_cell = true;
            let (cluster, timeout) =
                (peers.cluster.clone(), self.interval.max(Duration::from_millis(200)));
            ctx.spawn(async move { cluster.probe_cell(now, timeout).await }.into_actor(self).map(
                |outcome, actor, _| {
                    actor.probing_cell = false;
                    if let Err(error) = &outcome {
                        tracing::debug!(%error, "cell probe failed");
                    }
                    let passed = outcome.is_ok();
                    *actor.router.own_probe.lock() = Some(passed);
                    let outcome = if passed { "passed" } else { "failed" };
                    actor.metrics.cell_probes.get_or_create(&OutcomeLabel { outcome }).inc();
                },
            ));
        }
        self.beat(ctx);
        self.check_joined();
    }

    /// Joining: ready once every live peer of this node's cell routes here, or once
    /// [`join_limit`] is over (see the module doc).
    fn check_joined(&mut self) {
        let router = &self.router;
        if router.lifecycle.phase() != Phase::Joining {
            self.joining_since = None;
            return;
        }
        let now = now_ms();
        let since = *self.joining_since.get_or_insert(now);
        let missing = match &*router.peers.lock() {
            Peers::Heard(table) => table.not_routing_to(&router.me.name, &router.me.cell, now),
            Peers::Probed { .. } => Vec::new(),
        };
        // Every live peer beats once a period: after one and a half, this node heard them
        // all (its first heartbeat may go out before it listens, so their early answers
        // to it do not count).
        let listen_ms = (self.interval + self.interval / 2).as_millis() as u64;
        let limit_ms = self.join_limit.as_millis() as u64;
        let listened = now.saturating_sub(router.started_at_ms);
        let waited_ms = now.saturating_sub(since);
        match readiness(missing.len(), listened, listen_ms, waited_ms, limit_ms) {
            Readiness::Waiting => {}
            Readiness::Ready => {
                if router.lifecycle.advance(Phase::Joining, Phase::Ready) {
                    tracing::info!(waited_ms, "ready: every live peer of this cell routes here");
                }
            }
            Readiness::TimedOut => {
                if router.lifecycle.advance(Phase::Joining, Phase::Ready) {
                    tracing::warn!(waited_ms, peers = ?missing, "ready although these peers do not route here yet: the wait for them is over");
                }
            }
        }
    }

    fn probe_all(&mut self, ctx: &mut Context<Self>) {
        let timeout = self.interval.max(Duration::from_millis(200));
        let peers = match &*self.router.peers.lock() {
            Peers::Probed { peers, .. } => peers.clone(),
            Peers::Heard(_) => return,
        };
        for peer in peers {
            let url = format!("{}/healthz", peer.url);
            let probe = actix_web::rt::task::spawn_blocking(move || probe(&url, timeout));
            ctx.spawn(probe.into_actor(self).map(move |outcome, actor, _| {
                let outcome = outcome.unwrap_or(None);
                let mut guard = actor.router.peers.lock();
                let Peers::Probed { table, draining, releases, .. } = &mut *guard else { return };
                match &outcome {
                    Some(health) if health.draining => draining.insert(peer.name.clone()),
                    _ => draining.remove(&peer.name),
                };
                if let Some(health) = &outcome {
                    releases
                        .insert(peer.name.clone(), (health.release.clone(), health.started_at_ms));
                }
                let change = table.on_probe(&peer.name, outcome.is_some());
                let up = i64::from(table.is_alive(&peer.name));
                drop(guard);
                match change {
                    Some(Change::WentDown) => tracing::warn!(peer = %peer.name, "peer down"),
                    Some(Change::CameUp) => tracing::info!(peer = %peer.name, "peer up"),
                    None => {}
                }
                actor.metrics.peer_up.get_or_create(&PeerLabel { peer: peer.name.clone() }).set(up);
            }));
        }
    }
}

impl Actor for LivenessActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if self.cluster.is_some() {
            self.period(ctx);
            ctx.run_interval(self.interval, |actor, ctx| actor.period(ctx));
            // Readiness on or off is told at once, not at the next beat: a drain's clients
            // reconnect elsewhere within milliseconds, and the node they reach must already
            // count this one draining. The watch is the actor's own future: it ends with it.
            let mut phases = self.router.lifecycle.watch();
            let me = ctx.address();
            ctx.spawn(
                async move {
                    while phases.changed().await.is_ok() {
                        me.do_send(PhaseChanged);
                    }
                }
                .into_actor(self),
            );
        } else if matches!(&*self.router.peers.lock(), Peers::Probed { peers, .. } if !peers.is_empty())
        {
            self.probe_all(ctx);
            ctx.run_interval(self.interval, |actor, ctx| actor.probe_all(ctx));
        }
    }
}

/// This node's lifecycle phase changed: beat now.
#[derive(Message)]
#[rtype(result = "()")]
struct PhaseChanged;

impl Handler<PhaseChanged> for LivenessActor {
    type Result = ();

    fn handle(&mut self, _: PhaseChanged, ctx: &mut Self::Context) {
        self.beat(ctx);
        self.check_joined();
    }
}

impl Handler<Stop> for LivenessActor {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<Heard> for LivenessActor {
    type Result = ();

    fn handle(&mut self, msg: Heard, ctx: &mut Self::Context) {
        if msg.0.name == self.router.me().name {
            return;
        }
        let (name, draining) = (msg.0.name.clone(), msg.0.draining);
        let now = now_ms();
        let (seen, first) = match &mut *self.router.peers.lock() {
            Peers::Heard(table) => {
                let first = !table.recent(now).any(|info| info.name == name);
                (table.heard(msg.0, now), first)
            }
            Peers::Probed { .. } => return,
        };
        // A new peer hears this node at once, and a peer that came up or changed its
        // draining learns at once whether this node routes to it (bounded: at most one
        // early heartbeat per `EARLY_BEAT_GAP`, or quarter period if shorter).
        let early = first || seen != Seen::Unchanged;
        let gap = (self.interval / 4).min(EARLY_BEAT_GAP).as_millis() as u64;
        if early && now.saturating_sub(self.last_beat_ms) >= gap {
            self.beat(ctx);
        }
        match seen {
            Seen::Joined => tracing::info!(peer = %name, draining, "peer up"),
            Seen::DrainingChanged => {
                tracing::info!(peer = %name, draining, "peer draining changed")
            }
            Seen::Unchanged => {}
        }
        self.check_joined();
    }
}

impl Handler<Left> for LivenessActor {
    type Result = ();

    fn handle(&mut self, msg: Left, _ctx: &mut Self::Context) {
        let left = match &mut *self.router.peers.lock() {
            Peers::Heard(table) => table.left(&msg.0),
            Peers::Probed { .. } => false,
        };
        if left {
            tracing::info!(peer = %msg.0, "peer left");
        }
    }
}
