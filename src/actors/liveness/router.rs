//! The [`Router`]: the routing view every decision reads. It holds the liveness tables
//! (the pure [`Liveness`] table of probed peers, or the [`Heartbeats`] table in cluster
//! mode) and the configured cells behind a short lock and answers every routing question
//! with the one pure function, [`route`], over the user's home cell ([`home_cell`]: a
//! claim, else the configured cells, never who is alive): `/v1/route`, the directory's
//! handshake decisions and the room writers all read it, so they cannot disagree. A
//! draining node (this one included) stops being a candidate at once.
//!
//! In peers mode each node keeps its own directory, so no record says who owns a
//! session: its owner is the rendezvous choice among all configured nodes (this one
//! included), and a node mints only session ids whose choice is itself. Any two nodes
//! that see the same peers alive give the same answer.
//!
//! The liveness actor (`super`) keeps the tables current and feeds the cells' breakers
//! ([`CellBreakers`]).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::Peer;
use crate::core::nodes::breaker::{
    CellBreakers, CellView, Report, State as BreakerState, Transition,
};
use crate::core::nodes::heartbeats::{Heartbeats, Usage};
use crate::core::nodes::lifecycle::Lifecycle;
use crate::core::nodes::liveness::Liveness;
use crate::core::nodes::placement::{self, Load, NewSession, Usable};
use crate::core::nodes::probes::{Ask, ReadyProbes};
use crate::core::nodes::routing::{
    home_cell, rendezvous, room_writer, route, Candidate, Reason, RouteError, RouteQuestion,
};
use crate::world::now_ms;

/// How long [`Router::answers_ready`] waits for a node's `/readyz`.
const READY_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Where a session is served, as [`Router::route`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteAnswer {
    pub node: String,
    pub url: String,
    /// The node's cell.
    pub cell: String,
    /// The user's home cell; `cell` differs only while the home has no node to serve.
    pub home: String,
    pub reason: Reason,
}

/// Why [`Router::route`] has no node to answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unroutable {
    /// Cells are known but none is healthy (no node of it may serve, or its breaker is
    /// not closed); names the user's home cell when there is one, never an empty name.
    #[error("no healthy cell{}", .home.as_deref().map(|home| format!(" (the user's home cell is {home})")).unwrap_or_default())]
    NoHealthyCell { home: Option<String> },
    /// No node may serve: none is alive, or every one is avoided.
    #[error(transparent)]
    NoAliveNode(RouteError),
}

impl From<RouteError> for Unroutable {
    fn from(error: RouteError) -> Self {
        match error {
            RouteError::NoHealthyCell { home } => {
                Unroutable::NoHealthyCell { home: Some(home).filter(|h| !h.is_empty()) }
            }
            other => Unroutable::NoAliveNode(other),
        }
    }
}

/// How the router learns about peers.
pub(super) enum Peers {
    /// `peers` in the configuration, probed over HTTP (none: a single node).
    Probed {
        peers: Vec<Peer>,
        table: Liveness,
        draining: std::collections::BTreeSet<String>,
        /// Each peer's release and start as its last `/healthz` answer said.
        releases: std::collections::BTreeMap<String, (String, u64)>,
    },
    /// Cluster mode: heartbeats on NATS.
    Heard(Heartbeats),
}

/// The routing view every decision reads; see the module doc.
pub struct Router {
    pub(super) me: Peer,
    pub(super) started_at_ms: u64,
    pub(super) lifecycle: Arc<Lifecycle>,
    release_window_ms: u64,
    /// This node's `release` (`Config::release`).
    pub(super) release: String,
    /// Heartbeats (or probes) in a row before a peer counts as up.
    up_after: u32,
    /// Whether `peers` is `Peers::Probed`, fixed at construction: read without the lock,
    /// so a routing question takes the lock once.
    probed: bool,
    /// The configured cells, sorted (`Config::configured_cells`): users are homed over
    /// them, never over the cells alive.
    cells: Vec<String>,
    /// `cluster_cell_domains`: where each room is homed (`core::nodes::routing::RoomHomes`); it is
    /// written by a node of that cell.
    room_homes: Option<crate::cluster::SharedHomes>,
    pub(super) peers: Mutex<Peers>,
    /// Peers' readiness as probes answered it, and the probes in flight (at most one per
    /// known node).
    ready: Mutex<ReadyProbes<tokio::sync::watch::Receiver<Option<bool>>>>,
    /// Cluster mode: one breaker per configured cell, fed by the probes' reports.
    breakers: Mutex<CellBreakers>,
    /// Cluster mode: this node's last probe of its own cell (`None`: none finished yet).
    pub(super) own_probe: Mutex<Option<bool>>,
    /// This node's load, read at each question (`None`: not said, as before placement).
    own_load: Option<OwnLoad>,
    /// This node's usage as its last heartbeat measured it.
    pub(super) own_usage: Mutex<Option<Usage>>,
    /// `placement_high_water_percent`, in thousandths.
    high_water_permille: u64,
}

/// Where this node's load is read: its open connections (the metrics) against its limit
/// in force.
pub struct OwnLoad {
    pub metrics: Arc<crate::metrics::Metrics>,
    pub capacity: u64,
}

impl OwnLoad {
    fn now(&self) -> Load {
        Load { connections: self.metrics.connections_now(), capacity: self.capacity }
    }
}

/// A node as the router sees it now.
struct NodeNow {
    peer: Peer,
    alive: bool,
    draining: bool,
    started_at_ms: u64,
    /// Its open connections as its heartbeats say (`None`: not said).
    connections: Option<u64>,
    /// Its release (empty: not said).
    release: String,
    /// The connections it admits (`None`: not said).
    capacity: Option<u64>,
    /// Its use of its machine (`None`: not said).
    usage: Option<Usage>,
}

impl NodeNow {
    fn load(&self) -> Option<Load> {
        Some(Load { connections: self.connections?, capacity: self.capacity? })
    }
}

/// A node as a rebalance sees it ([`Router::loads`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLoad {
    pub name: String,
    pub url: String,
    /// Draining or still starting: takes no connections.
    pub draining: bool,
    /// Connections open on it (`None`: an earlier build that does not say).
    pub connections: Option<u64>,
    /// The connections it admits (`None`: not said).
    pub capacity: Option<u64>,
    /// Its use of its machine (`None`: not said, or this node, whose own figures are the
    /// process metrics).
    pub usage: Option<Usage>,
    /// Over the high-water mark: no new or moving session goes to it.
    pub full: bool,
}

impl Router {
    /// Peers from the configuration, probed; up after `up_after` successes in a row.
    pub fn probed(
        me: Peer,
        peers: Vec<Peer>,
        up_after: u32,
        lifecycle: Arc<Lifecycle>,
        release_window: Duration,
    ) -> Router {
        let table = Liveness::new(peers.iter().map(|p| p.name.clone()), up_after);
        let peers = Peers::Probed {
            peers,
            table,
            draining: Default::default(),
            releases: Default::default(),
        };
        Router::new(me, peers, up_after, lifecycle, release_window)
    }

    /// Cluster mode: peers from heartbeats, down after `timeout`, up after `up_after` in a row.
    pub fn clustered(
        me: Peer,
        timeout: Duration,
        up_after: u32,
        lifecycle: Arc<Lifecycle>,
        release_window: Duration,
    ) -> Router {
        Router::new(
            me,
            Peers::Heard(Heartbeats::new(timeout.as_millis() as u64, up_after)),
            up_after,
            lifecycle,
            release_window,
        )
    }

    fn new(
        me: Peer,
        peers: Peers,
        up_after: u32,
        lifecycle: Arc<Lifecycle>,
        release_window: Duration,
    ) -> Router {
        let release_window_ms = release_window.as_millis() as u64;
        let probed = matches!(peers, Peers::Probed { .. });
        let cells = vec![me.cell.clone()];
        let started_at_ms = now_ms();
        let breakers =
            Mutex::new(CellBreakers::new(cells.iter().map(String::as_str), started_at_ms));
        Router {
            me,
            started_at_ms,
            lifecycle,
            release_window_ms,
            release: String::new(),
            up_after,
            probed,
            cells,
            room_homes: None,
            peers: Mutex::new(peers),
            ready: Mutex::default(),
            breakers,
            own_probe: Mutex::new(None),
            own_load: None,
            own_usage: Mutex::new(None),
            high_water_permille: 0,
        }
    }

    /// This node's release (`Config::release`).
    pub fn with_release(mut self, release: String) -> Router {
        self.release = release;
        self
    }

    pub fn release(&self) -> &str {
        &self.release
    }

    /// Heartbeats (or probes) in a row before a peer counts as up.
    pub fn up_after(&self) -> u32 {
        self.up_after
    }

    /// When this node started (ms since the epoch), as its heartbeats and `/healthz` say.
    pub fn started_at_ms(&self) -> u64 {
        self.started_at_ms
    }

    /// Placement by load: this node's load is read from `own`, and a node over
    /// `high_water_percent` of its capacity takes no new or moving sessions.
    pub fn with_load(mut self, own: OwnLoad, high_water_percent: u64) -> Router {
        self.own_load = Some(own);
        self.high_water_permille = high_water_percent.saturating_mul(10);
        self
    }

    /// This node's load now (`None` without [`Router::with_load`]).
    pub fn own_load(&self) -> Option<Load> {
        self.own_load.as_ref().map(OwnLoad::now)
    }

    /// The configured cells (the default: this node's cell alone).
    pub fn with_cells(mut self, cells: Vec<String>) -> Router {
        self.breakers =
            Mutex::new(CellBreakers::new(cells.iter().map(String::as_str), self.started_at_ms));
        self.cells = cells;
        self
    }

    /// Cells run their own NATS (`cluster_cell_domains`): rooms are written in their home
    /// cells, as `homes` places them.
    pub fn with_room_homes(mut self, homes: crate::cluster::SharedHomes) -> Router {
        self.room_homes = Some(homes);
        self
    }

    /// With rooms homed in cells, `room`'s home cell; `None` otherwise.
    pub fn room_home(&self, room: &str) -> Option<String> {
        self.room_homes.as_ref()?.read().home(room).map(str::to_string)
    }

    /// Each configured cell's breaker, by name.
    pub fn breaker_states(&self) -> Vec<(String, BreakerState)> {
        self.breakers.lock().states().map(|(cell, state)| (cell.to_string(), state)).collect()
    }

    /// Each configured cell's breaker with its recent rounds and transitions, by name.
    pub fn cell_views(&self) -> Vec<CellView> {
        self.breakers.lock().views()
    }

    /// One round of the cells' breakers at `now`: this node's last probe and those its
    /// live peers reported, AND-merged per cell.
    pub(super) fn cell_round(&self, now: u64) -> Vec<Transition> {
        let own = *self.own_probe.lock();
        // (cell, node, passed)
        let mut reports: Vec<(String, String, bool)> = own
            .map(|passed| (self.me.cell.clone(), self.me.name.clone(), passed))
            .into_iter()
            .collect();
        if let Peers::Heard(table) = &*self.peers.lock() {
            reports.extend(table.alive(now).filter_map(|info| {
                info.probe.map(|passed| (info.cell.clone(), info.name.clone(), passed))
            }));
        }
        let reports =
            reports.iter().map(|(cell, node, passed)| Report { cell, node, passed: *passed });
        self.breakers.lock().round(reports, now)
    }

    /// Whether `cell` is one of the configured cells.
    pub fn knows_cell(&self, cell: &str) -> bool {
        self.cells.iter().any(|c| c == cell)
    }

    pub fn me(&self) -> &Peer {
        &self.me
    }

    /// This node takes no new connections: it drains, or it is still starting (so a
    /// restarted node is no candidate, and sends no client its way, before it is ready).
    pub(super) fn draining(&self) -> bool {
        !self.lifecycle.phase().accepts_connections()
    }

    /// This node and its peers (known, up or not) as seen at `now`.
    fn nodes_now(&self, now: u64) -> Vec<NodeNow> {
        let own = self.own_load();
        let me = NodeNow {
            peer: self.me.clone(),
            alive: true,
            draining: self.draining(),
            started_at_ms: self.started_at_ms,
            connections: own.map(|l| l.connections),
            capacity: own.map(|l| l.capacity),
            usage: None,
            release: self.release.clone(),
        };
        let mut nodes = vec![me];
        match &*self.peers.lock() {
            Peers::Probed { peers, table, draining, releases } => {
                nodes.extend(peers.iter().map(|peer| {
                    let (release, started_at_ms) =
                        releases.get(&peer.name).cloned().unwrap_or_default();
                    NodeNow {
                        peer: peer.clone(),
                        alive: table.is_alive(&peer.name),
                        draining: draining.contains(&peer.name),
                        started_at_ms,
                        connections: None,
                        capacity: None,
                        usage: None,
                        release,
                    }
                }))
            }
            Peers::Heard(table) => nodes.extend(
                table.alive(now).filter(|info| info.name != self.me.name).map(|info| NodeNow {
                    peer: Peer {
                        name: info.name.clone(),
                        cell: info.cell.clone(),
                        url: info.url.clone(),
                    },
                    alive: true,
                    draining: info.draining,
                    started_at_ms: info.started_at_ms,
                    connections: info.connections,
                    release: info.release.clone(),
                    capacity: info.capacity,
                    usage: info.usage,
                }),
            ),
        }
        nodes
    }

    /// Peers mode: the node that owns `session` (there is no shared record of it).
    fn placement<'a>(&self, session: &str, nodes: &'a [NodeNow]) -> Option<&'a str> {
        rendezvous(session, nodes.iter().map(|n| n.peer.name.as_str()))
    }

    fn probed_mode(&self) -> bool {
        self.probed
    }

    /// Whether a session's node follows from its id alone (peers mode and a single
    /// node), rather than from a directory record (cluster mode).
    pub fn placement_decides(&self) -> bool {
        self.probed_mode()
    }

    /// Whether a new session with this id would be routed here: always in cluster mode
    /// (the record names its owner), in peers mode when the id's placement is this node.
    pub fn places_here(&self, session: &str) -> bool {
        if !self.probed_mode() {
            return true;
        }
        let nodes = self.nodes_now(now_ms());
        self.placement(session, &nodes) == Some(self.me.name.as_str())
    }

    /// Which node serves `session` of `user`, whose home cell is `claim` (a token's `cell`)
    /// or else the rendezvous choice over the configured cells, recorded on
    /// `recorded_owner` (cluster mode; ignored in peers mode, where the placement is the
    /// owner); `avoid` names a node the client could not reach.
    pub fn route(
        &self,
        session: &str,
        user: &str,
        claim: Option<&str>,
        recorded_owner: Option<&str>,
        avoid: Option<&str>,
    ) -> Result<RouteAnswer, Unroutable> {
        let now = now_ms();
        let nodes = self.nodes_now(now);
        let owner =
            if self.probed_mode() { self.placement(session, &nodes) } else { recorded_owner };
        let candidates: Vec<Candidate> = nodes
            .iter()
            .map(|n| Candidate {
                name: &n.peer.name,
                cell: &n.peer.cell,
                alive: n.alive,
                draining: n.draining,
                started_at_ms: n.started_at_ms,
                release: &n.release,
                load: n.load(),
            })
            .collect();
        let cells: Vec<&str> = self.cells.iter().map(String::as_str).collect();
        let home = home_cell(user, claim, &cells);
        let breakers = self.breakers.lock();
        let broken = breakers.broken();
        let question = RouteQuestion {
            session,
            user,
            recorded_owner: owner,
            avoid,
            now_ms: now,
            release_window_ms: self.release_window_ms,
            home,
            cells: &cells,
            broken: &broken,
            high_water_permille: self.high_water_permille,
        };
        let routed = route(&question, &candidates).map_err(Unroutable::from);
        drop(breakers);
        let routed = routed?;
        if routed.cell != home && !home.is_empty() {
            tracing::debug!(
                user,
                home,
                cell = routed.cell,
                "the user's home cell has no node to serve: the first healthy cell by name"
            );
        }
        let node =
            nodes.iter().find(|n| n.peer.name == routed.node).expect("routed among the nodes");
        Ok(RouteAnswer {
            node: node.peer.name.clone(),
            url: node.peer.url.clone(),
            cell: routed.cell.to_string(),
            home: home.to_string(),
            reason: routed.reason,
        })
    }

    /// Cluster mode: where a new session keyed `key` that reached this node goes, when not
    /// here (`core::nodes::placement::place_new` over the usable nodes of this node's cell): this
    /// node over the high-water mark, or much fuller than the emptiest one, sends it to a
    /// node with room. `None`: it stays (also in peers mode, where a session's id places it,
    /// and whenever a load is not known).
    pub fn new_session_elsewhere(&self, key: &str) -> Option<(String, String)> {
        if self.probed_mode() || self.own_load.is_none() {
            return None;
        }
        let nodes = self.nodes_now(now_ms());
        let usable: Vec<Usable> = nodes
            .iter()
            .filter(|n| n.alive && !n.draining && n.peer.cell == self.me.cell)
            .map(|n| Usable { name: &n.peer.name, load: n.load() })
            .collect();
        match placement::place_new(&self.me.name, key, &usable, self.high_water_permille) {
            NewSession::Here => None,
            NewSession::There(node) => nodes
                .iter()
                .find(|n| n.peer.name == node)
                .map(|n| (n.peer.name.clone(), n.peer.url.clone())),
        }
    }

    /// `node`'s readiness as a probe answered it within the last second
    /// ([`crate::core::nodes::probes`]), without asking it: `None` when no answer is that fresh.
    pub fn ready_known(&self, node: &str) -> Option<bool> {
        self.ready.lock().known(node, now_ms())
    }

    /// Whether `node` answers its own `/readyz` with 200 now. Asked before a move is
    /// charged to a user's budget: a client that could not reach its owner may have seen
    /// the owner's readiness go off before the owner's heartbeat said so here, and a
    /// move away from a node that is not ready is forced, never charged. A node this one
    /// cannot reach either counts as not ready. The probe is shared: at most one per node
    /// in flight, joined by every caller meanwhile, and its answer serves everyone for a
    /// second ([`crate::core::nodes::probes`]). It runs on a task of its own, so a caller that
    /// gives up leaves it to finish and answer the others. Never awaited with a lock held
    /// (the directory asks before it takes a user's stripe).
    pub async fn answers_ready(self: &Arc<Self>, node: &str) -> bool {
        let url = self
            .nodes_now(now_ms())
            .into_iter()
            .find(|n| n.peer.name == node)
            .map(|n| format!("{}/readyz", n.peer.url));
        let Some(url) = url else { return false };
        let mut sender = None;
        let asked = self.ready.lock().ask(node, now_ms(), || {
            let (tx, rx) = tokio::sync::watch::channel(None);
            sender = Some(tx);
            rx
        });
        let mut answer = match asked {
            Ask::Known(ready) => return ready,
            Ask::Join(answer) => answer,
            Ask::Start(answer) => {
                let (router, node, tx) = (
                    Arc::clone(self),
                    node.to_string(),
                    sender.expect("a new probe made its waiter"),
                );
                tokio::task::spawn_blocking(move || {
                    let agent = ureq::AgentBuilder::new().timeout(READY_PROBE_TIMEOUT).build();
                    let ready =
                        agent.get(&url).call().is_ok_and(|response| response.status() == 200);
                    router.ready.lock().answered(&node, ready, now_ms());
                    tracing::debug!(peer = %node, ready, "readiness probed");
                    tx.send_replace(Some(ready));
                });
                answer
            }
        };
        // A probe whose task ended without answering (it panicked) counts as not ready.
        let ready = answer
            .wait_for(Option::is_some)
            .await
            .map(|ready| ready.unwrap_or(false))
            .unwrap_or(false);
        ready
    }

    /// Cluster mode: which node appends `room`'s events now (one writer per room); with
    /// rooms homed in cells, a node of the room's home cell (`None` while none is alive).
    pub fn room_writer(&self, room: &str) -> Option<String> {
        if self.probed_mode() {
            return None;
        }
        let mut nodes = self.nodes_now(now_ms());
        if let Some(home) = self.room_home(room) {
            nodes.retain(|n| n.peer.cell == home);
        }
        let taking: Vec<&str> =
            nodes.iter().filter(|n| n.alive && !n.draining).map(|n| n.peer.name.as_str()).collect();
        let alive: Vec<&str> =
            nodes.iter().filter(|n| n.alive).map(|n| n.peer.name.as_str()).collect();
        room_writer(room, if taking.is_empty() { &alive } else { &taking }).map(str::to_string)
    }

    /// Cluster mode: this node (with `own_connections`) and the peers up now, with the
    /// loads their heartbeats announce; `None` outside cluster mode, where no node knows
    /// the others' loads.
    pub fn loads(&self, own_connections: u64) -> Option<Vec<NodeLoad>> {
        if self.probed_mode() {
            return None;
        }
        let nodes = self.nodes_now(now_ms());
        Some(
            nodes
                .into_iter()
                .enumerate()
                .map(|(i, n)| {
                    let connections = if i == 0 { Some(own_connections) } else { n.connections };
                    let full =
                        connections.zip(n.capacity).is_some_and(|(connections, capacity)| {
                            placement::over_high_water(
                                Load { connections, capacity },
                                self.high_water_permille,
                            )
                        });
                    NodeLoad {
                        name: n.peer.name,
                        url: n.peer.url,
                        draining: n.draining,
                        connections,
                        capacity: n.capacity,
                        usage: n.usage,
                        full,
                    }
                })
                .collect(),
        )
    }

    /// Cluster mode: the nodes of `cell` alive now (this one included when it is there).
    pub fn alive_in(&self, cell: &str) -> Vec<String> {
        self.nodes_now(now_ms())
            .into_iter()
            .filter(|n| n.alive && n.peer.cell == cell)
            .map(|n| n.peer.name)
            .collect()
    }

    /// Cluster mode: the names of the peers heard now (draining ones and those not yet up
    /// included).
    pub fn peers_heard(&self) -> Vec<String> {
        match &*self.peers.lock() {
            Peers::Heard(table) => table.recent(now_ms()).map(|info| info.name.clone()).collect(),
            Peers::Probed { .. } => Vec::new(),
        }
    }

    /// The nodes as this node sees them, itself first (the admin overview): in cluster
    /// mode the peers up now, with peers configured by `peers` the probed ones (down
    /// included), on a single node just itself.
    pub fn overview(&self) -> Vec<NodeView> {
        let nodes = self.nodes_now(now_ms());
        nodes
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                let load = n.load();
                let full = load
                    .is_some_and(|load| placement::over_high_water(load, self.high_water_permille));
                let usage = if i == 0 { self.own_usage() } else { n.usage };
                NodeView {
                    load: crate::protocol::admin::NodeLoadView {
                        connections: n.connections,
                        capacity: n.capacity,
                        headroom: load.and_then(Load::headroom),
                        full,
                        cpu_permille: usage.map(|u| u.cpu_permille),
                        resident_bytes: usage.map(|u| u.resident_bytes),
                        deliveries_per_sec: usage.map(|u| u.deliveries_per_sec),
                    },
                    name: n.peer.name,
                    url: n.peer.url,
                    cell: n.peer.cell,
                    phase: (i > 0).then_some(match (n.alive, n.draining) {
                        (false, _) => "down",
                        (true, true) => "draining",
                        (true, false) => "ready",
                    }),
                }
            })
            .collect()
    }

    /// This node's usage as its last heartbeat reported it (cluster mode).
    fn own_usage(&self) -> Option<Usage> {
        *self.own_usage.lock()
    }
}

/// A node in the admin overview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub url: String,
    pub cell: String,
    pub load: crate::protocol::admin::NodeLoadView,
    /// `ready`, `draining` or `down` for a peer; `None` for this node (whose phase the
    /// caller reads from its lifecycle).
    pub phase: Option<&'static str>,
}
