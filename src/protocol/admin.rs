//! The bodies of the admin API (`/v1/admin/*`): the node's status, the overview the
//! admin page polls, a rebalance's request and its progress, the reload's answer, and the
//! webhooks' dead letters with a replay's answer.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// `GET /v1/admin/status`
#[derive(Debug, Serialize)]
pub struct StatusReply {
    pub node: String,
    pub version: &'static str,
    pub uptime_secs: u64,
    /// `starting`, `ready` or `draining`.
    pub phase: &'static str,
    pub warmup: bool,
    pub connections: usize,
    pub subscriptions: u64,
    pub rooms_live: usize,
    pub rooms_parked: usize,
    /// Sessions with a connection here.
    pub sessions_live: usize,
    /// Disconnected sessions kept in memory (at most `session_cache_max`).
    pub sessions_cached: usize,
    /// Session records in the embedded store; absent in cluster mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions_stored: Option<u64>,
    pub store_bytes: u64,
}

/// `GET /v1/admin/overview`: what the admin page polls.
#[derive(Debug, Serialize)]
pub struct OverviewReply {
    pub node: String,
    pub version: &'static str,
    /// `starting`, `ready` or `draining`.
    pub phase: &'static str,
    pub ts_ms: u64,
    pub uptime_secs: u64,
    /// This node first, then the peers it knows.
    pub nodes: Vec<OverviewNode>,
    pub connections: usize,
    pub subscriptions: u64,
    pub rooms_live: usize,
    /// The busiest live rooms here (at most 20), busiest first.
    pub rooms: Vec<OverviewRoom>,
    pub counters: OverviewCounters,
    /// Cluster mode: each configured cell's breaker as this node sees it (empty otherwise).
    pub cells: Vec<OverviewCell>,
    /// Cluster mode: how far behind their streams the rooms here applied their events
    /// lately (all 0 on a single node).
    pub lag: OverviewLag,
    /// Cells with their own NATS: this cell's mirror of each other cell's rooms stream
    /// and the messages it lacks, as last read (empty otherwise).
    pub mirrors: Vec<OverviewMirror>,
}

/// The node's lag behind its rooms' streams, as `/metrics` shows it, with the worst
/// room's name (only here: a per-room label would have no bound).
#[derive(Debug, Serialize)]
pub struct OverviewLag {
    /// The most events a room was behind when it applied its last event.
    pub events: u64,
    /// That room, when one is behind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub room: Option<String>,
    /// The oldest age, publish to applied here, of the rooms' last events.
    pub seconds: f64,
    /// Rooms behind by at least one event.
    pub rooms_behind: u64,
}

#[derive(Debug, Serialize)]
pub struct OverviewMirror {
    /// The cell whose rooms stream this cell mirrors.
    pub cell: String,
    pub lag_events: u64,
}

#[derive(Debug, Serialize)]
pub struct OverviewCell {
    pub cell: String,
    /// `closed` (serves), `half_open` or `open`.
    pub breaker: &'static str,
}

/// `GET /v1/admin/cells` (cluster mode): each configured cell's breaker as this node
/// sees it, with its recent probe rounds and transitions. Read back by `livegate cells`.
#[derive(Debug, Serialize, Deserialize)]
pub struct CellsReply {
    pub node: String,
    /// This node's cell.
    pub cell: String,
    /// This node's clock when it answered: the times below are on it.
    pub ts_ms: u64,
    pub cells: Vec<CellStatus>,
}

/// `POST /v1/admin/cells/{cell}/promote` (cell domains): what the promotion of `cell`'s
/// rooms into this node's cell did. Read back by `livegate cells promote`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PromoteReply {
    /// The promoted cell, whose rooms moved.
    pub cell: String,
    /// Where they moved: this node's cell.
    pub to: String,
    /// The moved rooms' new epoch: a client resuming with the old one gets
    /// `recovered:false`.
    pub epoch: String,
    /// The rooms the mirror held events of.
    pub rooms: u64,
    /// The last stream sequence the mirror had received.
    pub mirror_head: u64,
    /// The last stream sequence of the lost cell its heartbeats announced (0: none heard).
    pub origin_head_seen: u64,
    /// Events the lost cell stored that the mirror never received, lost with it.
    pub missing: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CellStatus {
    pub cell: String,
    /// `closed` (serves), `half_open` or `open`.
    pub breaker: String,
    /// When the breaker entered that state (its last transition, else this node's start).
    pub since_ms: u64,
    /// The rounds that fed the breaker, oldest first (at most 20).
    pub probes: Vec<CellProbe>,
    /// The breaker's transitions, oldest first (at most 10).
    pub transitions: Vec<CellTransition>,
}

/// One round of a cell's probe reports: what its breaker was fed.
#[derive(Debug, Serialize, Deserialize)]
pub struct CellProbe {
    pub at_ms: u64,
    /// Every node that reported passed.
    pub passed: bool,
    /// Nodes that reported.
    pub reports: u32,
    /// Nodes whose probe failed.
    pub failures: u32,
    /// The first 8 of them by name.
    pub failed: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CellTransition {
    pub at_ms: u64,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Serialize)]
pub struct OverviewNode {
    pub node: String,
    pub url: String,
    /// `starting`, `ready` or `draining`; a probed peer may be `down`.
    pub phase: &'static str,
    #[serde(rename = "self")]
    pub itself: bool,
    pub cell: String,
    /// Its load as reported (absent: not said): what placement weighs.
    #[serde(flatten)]
    pub load: NodeLoadView,
}

/// A node's load and headroom, as the admin overview and `/v1/route` show them.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NodeLoadView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// The connections it admits (its limit in force).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// `capacity - connections`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headroom: Option<u64>,
    /// Over the high-water mark: takes no new or moving sessions.
    pub full: bool,
    /// CPU over its last heartbeat period, in thousandths of one core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_permille: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resident_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries_per_sec: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct OverviewRoom {
    pub room: String,
    /// Explicit subscribers on this node.
    pub subscribers: u64,
    /// The room's durable head seq.
    pub head: u64,
}

/// The node's monotonic totals since it started.
#[derive(Debug, Serialize)]
pub struct OverviewCounters {
    pub publishes: u64,
    pub deliveries: u64,
    pub slow_consumers: u64,
    pub migrations: u64,
}
/// `POST /v1/admin/rebalance` (an empty body: all defaults).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebalanceRequest {
    /// The node to fill (default: the node answering).
    pub to: Option<String>,
    pub per_second: Option<u32>,
    /// Connections to move at most, in all.
    pub limit: Option<u64>,
}

pub fn parse_rebalance_request(body: &[u8]) -> Result<RebalanceRequest, serde_json::Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(RebalanceRequest::default());
    }
    serde_json::from_slice(body)
}

/// A rebalance as its planning node issued it (the 202 of `POST /v1/admin/rebalance`,
/// and `issued` in `GET`).
#[derive(Debug, Clone, Serialize)]
pub struct RebalancePlanReply {
    pub id: String,
    pub to: String,
    pub per_second: u32,
    /// The mean load the plan levels towards.
    pub mean: u64,
    /// Connections to move in all.
    pub total: u64,
    pub at_ms: u64,
    pub shares: Vec<RebalanceShare>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RebalanceShare {
    pub node: String,
    /// Connections it hands over.
    pub connections: u64,
    /// Its part of the operation's rate (by share, at least 1).
    pub per_second: u32,
    /// It acknowledged its order.
    pub accepted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// This node's part of the last rebalance it was given.
#[derive(Debug, Clone, Serialize)]
pub struct RebalanceShedding {
    pub id: String,
    pub to: String,
    pub per_second: u32,
    pub planned: u64,
    pub moved: u64,
    pub users: u64,
    pub skipped_budget: u64,
    pub skipped_gone: u64,
    pub errors: u64,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    /// `running`, `done`, `no_more_users`, `target_gone`, `draining` or `replaced`.
    pub state: &'static str,
}

/// A node's load as this node hears it.
#[derive(Debug, Serialize)]
pub struct RebalanceLoad {
    pub node: String,
    /// `null`: a node of an earlier build that does not say.
    pub connections: Option<u64>,
    pub draining: bool,
}

/// `GET /v1/admin/rebalance`
#[derive(Debug, Serialize)]
pub struct RebalanceStatusReply {
    pub node: String,
    pub issued: Option<RebalancePlanReply>,
    pub shedding: Option<RebalanceShedding>,
    /// Every node this one hears, itself first (empty outside cluster mode).
    pub loads: Vec<RebalanceLoad>,
}

/// Answer of `POST /v1/admin/reload`: how many API keys and allowed origins are in force.
#[derive(Debug, Serialize)]
pub struct ReloadReply {
    pub api_keys: usize,
    pub allowed_origins: usize,
}

/// `GET /v1/admin/webhooks/dead`: this node's dead letters, newest first.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadLettersReply {
    pub node: String,
    /// The node's clock when it answered.
    pub ts_ms: u64,
    /// Dead letters kept (the list may show fewer: `limit`).
    pub count: usize,
    /// `webhook_dead_letters_max`.
    pub max: usize,
    pub dead_letters: Vec<DeadLetterView>,
}

/// One dead letter: a webhook given up.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadLetterView {
    /// The webhook's id (its body's `id`, its `X-Livegate-Id`).
    pub id: String,
    /// The body's `type`.
    #[serde(rename = "type")]
    pub kind: String,
    pub room: String,
    /// The URL it was sent to, without userinfo, query or fragment.
    pub url: String,
    /// Attempts made, replays included.
    pub attempts: u64,
    pub first_attempt_ms: u64,
    pub last_attempt_ms: u64,
    /// How the last attempt failed: `HTTP 500`, `timeout`, `unreachable: …`.
    pub last_error: String,
    /// `attempts` (webhook_max_attempts failed) or `rejected` (a 4xx other than 408, 429).
    pub reason: String,
    /// The webhook's JSON body, as sent.
    pub body: Box<RawValue>,
}

/// `POST /v1/admin/webhooks/dead/{id}/replay`, delivered (a failed replay is an error
/// answer, `replay_failed`).
#[derive(Debug, Serialize, Deserialize)]
pub struct ReplayReply {
    pub id: String,
    /// `delivered`.
    pub outcome: String,
    /// Attempts made, this one included.
    pub attempts: u64,
}

/// `DELETE /v1/admin/webhooks/dead[/{id}]`: how many dead letters were deleted.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadDeletedReply {
    pub deleted: usize,
}
