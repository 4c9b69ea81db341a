//! Process metrics, exposed at `GET /metrics` in the Prometheus/OpenMetrics text format.
//! Cardinality is bounded: labels name outcomes, close codes from a fixed list, device
//! kinds folded to the configured ones, and configured peers — never users or rooms.
//! The process's own figures (CPU time, resident memory, open files against the limit
//! that bounds connections, threads) are read from the operating system at each scrape
//! ([`ProcessGauges`]). Cluster mode's lag is the worst room's, never one series per
//! room (`core::nodes::lag`), and each cell mirror's (one series per configured cell).

use std::collections::HashSet;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::protocol::CloseCode;

mod labels;
mod process;

pub use labels::*;
use labels::{close_code_labels, CREDENTIALS, HANDSHAKE_REASONS, TRANSPORTS};
pub use process::{process_cpu_seconds, process_resident_bytes, ProcessGauges};

fn latency_histogram() -> Histogram {
    // 0.5 ms … ~16 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 12))
}

/// Every metric livegate keeps; one instance per server, shared by reference.
pub struct Metrics {
    device_kinds: HashSet<String>,
    /// The process's CPU, memory and open files, read at each scrape.
    pub process: ProcessGauges,
    /// Every metric registered under its name, built at the first scrape (the metrics
    /// are shared handles, so one registry serves every scrape after it).
    registry: std::sync::OnceLock<Registry>,
    pub connections_open: Family<DeviceLabel, Gauge>,
    pub connections_by_transport: Family<TransportLabel, Gauge>,
    pub connects: Counter,
    /// Tokens signed by `POST /v1/tokens` (and the demo's token endpoint).
    pub tokens_minted: Counter,
    pub disconnects: Family<CodeLabel, Counter>,
    pub handshake_rejections: Family<ReasonLabel, Counter>,
    pub handshakes: Family<CredentialLabel, Counter>,
    pub limit_hits: Family<LimitLabel, Counter>,
    pub subscriptions: Gauge,
    pub rooms_live: Gauge,
    pub rooms_parked: Gauge,
    pub events_published: Counter,
    pub events_delivered: Counter,
    pub duplicates_rejected: Counter,
    /// Clients' `publish` ops, by outcome ([`CLIENT_PUBLISH_OUTCOMES`]).
    pub client_publishes: Family<OutcomeLabel, Counter>,
    pub delivery_latency: Histogram,
    pub batch_events: Histogram,
    pub frames_written: Counter,
    pub outbox_high_water: Gauge,
    pub slow_consumer_closes: Counter,
    pub history_trimmed: Counter,
    /// Store reads of a room's state (one per room load at most).
    pub state_reads: Counter,
    pub recoveries: Family<ResultLabel, Counter>,
    pub directory_writes: Family<ResultLabel, Counter>,
    pub migrations: Counter,
    /// Handshakes sent to the node that serves their session (421 or close 4421).
    pub handshakes_redirected: Counter,
    pub sessions_expired: Counter,
    /// Sessions with a connection here / disconnected ones in the memory cache / records
    /// in the store (single node), as of the last scrape.
    pub sessions_live: Gauge,
    pub sessions_cached: Gauge,
    /// Cluster mode: rooms' cluster-wide occupancy decisions this node reported.
    pub occupancy_edges: Family<EdgeLabel, Counter>,
    pub sessions_stored: Gauge,
    /// Cluster mode: appends refused because another node appended to the room first.
    pub cluster_append_conflicts: Counter,
    /// Cluster mode: peers alive by heartbeat.
    pub cluster_peers_alive: Gauge,
    /// Cluster mode: live copies (events and state records) rooms here took from NATS.
    pub cluster_live_copies: Counter,
    /// Cluster mode: 1 while this node's NATS connection is up, as of its last heartbeat.
    pub cluster_nats_connected: Gauge,
    /// Cluster mode: how far behind their streams the rooms here applied their events
    /// lately (`core::nodes::lag`): the worst room's events, the oldest event's age, the rooms
    /// behind; set at each scrape from the rooms' load slots.
    pub consumer_lag_events: Gauge,
    pub consumer_lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub consumer_lag_rooms: Gauge,
    /// Cells with their own NATS: the messages each mirror of another cell's rooms stream
    /// lacks, as JetStream last reported it (`cluster::Cluster::mirror_lags`).
    pub cell_mirror_lag_events: Family<CellLabel, Gauge>,
    /// The same figures by cell, for the admin overview (at most `MAX_CELLS - 1`).
    pub cell_mirror_lags: parking_lot::Mutex<std::collections::BTreeMap<String, u64>>,
    /// The connections this node takes at most (`max_connections` in force, after the
    /// open-file budget), set at start.
    pub connection_capacity: Gauge,
    pub migration_refusals: Counter,
    /// Rebalance (issue 30): users handed over to another node, their connections closed
    /// with 4421, users skipped by reason, and connections this node still has to hand over.
    pub rebalance_moves: Counter,
    pub rebalance_connections_moved: Counter,
    pub rebalance_skipped: Family<ReasonLabel, Counter>,
    pub rebalance_pending: Gauge,
    /// Rebalance orders this node refused (their target is itself, unknown or draining).
    pub rebalance_orders_refused: Family<ReasonLabel, Counter>,
    /// Cluster mode: peers' messages dropped unparsed, and claims clamped, by kind
    /// (`core::nodes::peer_input::MESSAGE_KINDS`).
    pub peer_messages_dropped: Family<KindLabel, Counter>,
    pub peer_claims_clamped: Family<KindLabel, Counter>,
    pub peer_up: Family<PeerLabel, Gauge>,
    /// Cluster mode: each configured cell's breaker (0 closed, 1 half-open, 2 open), its
    /// transitions by the state entered, and this node's probes of its own cell.
    pub cell_breaker_state: Family<CellLabel, Gauge>,
    pub cell_breaker_transitions: Family<CellTransitionLabel, Counter>,
    pub cell_probes: Family<OutcomeLabel, Counter>,
    pub warmup_active: Gauge,
    pub warmup_reconnect_attempts: Counter,
    pub warmup_reconnect_successes: Counter,
    pub drain_phase: Gauge,
    pub drain_connections_left: Gauge,
    pub store_flush_latency: Histogram,
    pub store_bytes: Gauge,
    /// Plain HTTP sockets open (not WebSocket or SSE streams), as of the last scrape.
    pub http_connections: Gauge,
    /// Liveness probes of the store (a read and an idempotent write) made for `/healthz`.
    pub store_probes: Counter,
    /// Webhooks waiting in the store's queue (in flight included).
    pub webhooks_queued: Gauge,
    pub webhooks_delivered: Counter,
    /// Webhook attempts that will be retried (timeout, no connection, 408, 429, 5xx).
    pub webhook_attempts_failed: Counter,
    /// Webhooks not queued: `queue_full`.
    pub webhooks_dropped: Family<ReasonLabel, Counter>,
    /// Dead letters kept in the store.
    pub webhook_dead_letters: Gauge,
    /// Webhooks given up into the dead letters, by `core::rules::webhooks::DeadReason`.
    pub webhooks_dead_lettered: Family<ReasonLabel, Counter>,
    /// The oldest dead letters dropped for newer ones (`webhook_dead_letters_max`).
    pub webhook_dead_letters_dropped: Counter,
    /// Replays of dead letters, by outcome.
    pub webhook_replays: Family<OutcomeLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(["web".to_string()])
    }
}

impl Metrics {
    /// `device_kinds`: the device names reported as themselves (others are `other`).
    pub fn new(device_kinds: impl IntoIterator<Item = String>) -> Self {
        Metrics {
            device_kinds: device_kinds.into_iter().collect(),
            process: ProcessGauges::default(),
            registry: std::sync::OnceLock::new(),
            connections_open: Family::default(),
            connections_by_transport: Family::default(),
            connects: Counter::default(),
            tokens_minted: Counter::default(),
            disconnects: Family::default(),
            handshake_rejections: Family::default(),
            handshakes: Family::default(),
            limit_hits: Family::default(),
            subscriptions: Gauge::default(),
            rooms_live: Gauge::default(),
            rooms_parked: Gauge::default(),
            events_published: Counter::default(),
            events_delivered: Counter::default(),
            duplicates_rejected: Counter::default(),
            client_publishes: Family::default(),
            delivery_latency: latency_histogram(),
            batch_events: batch_histogram(),
            frames_written: Counter::default(),
            outbox_high_water: Gauge::default(),
            slow_consumer_closes: Counter::default(),
            history_trimmed: Counter::default(),
            state_reads: Counter::default(),
            recoveries: Family::default(),
            directory_writes: Family::default(),
            migrations: Counter::default(),
            handshakes_redirected: Counter::default(),
            sessions_expired: Counter::default(),
            sessions_live: Gauge::default(),
            sessions_cached: Gauge::default(),
            occupancy_edges: Family::default(),
            sessions_stored: Gauge::default(),
            cluster_append_conflicts: Counter::default(),
            cluster_peers_alive: Gauge::default(),
            cluster_live_copies: Counter::default(),
            cluster_nats_connected: Gauge::default(),
            consumer_lag_events: Gauge::default(),
            consumer_lag_seconds: Gauge::default(),
            consumer_lag_rooms: Gauge::default(),
            cell_mirror_lag_events: Family::default(),
            cell_mirror_lags: Default::default(),
            connection_capacity: Gauge::default(),
            migration_refusals: Counter::default(),
            rebalance_moves: Counter::default(),
            rebalance_connections_moved: Counter::default(),
            rebalance_skipped: Family::default(),
            rebalance_pending: Gauge::default(),
            rebalance_orders_refused: Family::default(),
            peer_messages_dropped: Family::default(),
            peer_claims_clamped: Family::default(),
            peer_up: Family::default(),
            cell_breaker_state: Family::default(),
            cell_breaker_transitions: Family::default(),
            cell_probes: Family::default(),
            warmup_active: Gauge::default(),
            warmup_reconnect_attempts: Counter::default(),
            warmup_reconnect_successes: Counter::default(),
            drain_phase: Gauge::default(),
            drain_connections_left: Gauge::default(),
            store_flush_latency: latency_histogram(),
            store_bytes: Gauge::default(),
            store_probes: Counter::default(),
            http_connections: Gauge::default(),
            webhooks_queued: Gauge::default(),
            webhooks_delivered: Counter::default(),
            webhook_attempts_failed: Counter::default(),
            webhooks_dropped: Family::default(),
            webhook_dead_letters: Gauge::default(),
            webhooks_dead_lettered: Family::default(),
            webhook_dead_letters_dropped: Counter::default(),
            webhook_replays: Family::default(),
        }
        .with_known_series()
    }

    /// Create the series of every known label value at zero, so dashboards and alert
    /// ratios see 0 rather than no data before the first event.
    fn with_known_series(self) -> Self {
        for device in self.device_kinds.iter().cloned().chain(["other".to_string()]) {
            drop(self.connections_open.get_or_create(&DeviceLabel { device }));
        }
        for transport in TRANSPORTS {
            drop(self.connections_by_transport.get_or_create(&TransportLabel { transport }));
        }
        for result in ["ok", "stale", "error"] {
            drop(self.directory_writes.get_or_create(&ResultLabel { result }));
        }
        for edge in ["occupied", "vacated"] {
            drop(self.occupancy_edges.get_or_create(&EdgeLabel { edge }));
        }
        for result in ["recovered", "not_recovered"] {
            drop(self.recoveries.get_or_create(&ResultLabel { result }));
        }
        for reason in HANDSHAKE_REASONS {
            drop(self.handshake_rejections.get_or_create(&ReasonLabel { reason }));
        }
        for limit in LIMITS {
            drop(self.limit_hits.get_or_create(&LimitLabel { limit }));
        }
        for outcome in CLIENT_PUBLISH_OUTCOMES {
            drop(self.client_publishes.get_or_create(&OutcomeLabel { outcome }));
        }
        for reason in WEBHOOK_DROP_REASONS {
            drop(self.webhooks_dropped.get_or_create(&ReasonLabel { reason }));
        }
        for reason in crate::core::rules::webhooks::DeadReason::ALL
            .map(crate::core::rules::webhooks::DeadReason::as_str)
        {
            drop(self.webhooks_dead_lettered.get_or_create(&ReasonLabel { reason }));
        }
        for outcome in WEBHOOK_REPLAY_OUTCOMES {
            drop(self.webhook_replays.get_or_create(&OutcomeLabel { outcome }));
        }
        for reason in REBALANCE_SKIP_REASONS {
            drop(self.rebalance_skipped.get_or_create(&ReasonLabel { reason }));
        }
        for reason in crate::core::nodes::rebalance::ORDER_REFUSED_REASONS {
            drop(self.rebalance_orders_refused.get_or_create(&ReasonLabel { reason }));
        }
        for outcome in ["passed", "failed"] {
            drop(self.cell_probes.get_or_create(&OutcomeLabel { outcome }));
        }
        for kind in crate::core::nodes::peer_input::MESSAGE_KINDS {
            drop(self.peer_messages_dropped.get_or_create(&KindLabel { kind }));
            drop(self.peer_claims_clamped.get_or_create(&KindLabel { kind }));
        }
        for credential in CREDENTIALS {
            drop(self.handshakes.get_or_create(&CredentialLabel { credential }));
        }
        use CloseCode::*;
        // 1001: a browser leaving the page.
        for code in [Normal, ServiceRestart, HeartbeatTimeout, SlowConsumer, Replaced, Kicked]
            .map(CloseCode::code)
            .into_iter()
            .chain([1001, 1006])
        {
            drop(self.disconnects.get_or_create(&Metrics::close_code(code)));
        }
        self
    }

    /// Connections open now (WebSocket and SSE): the load a heartbeat announces.
    pub fn connections_now(&self) -> u64 {
        TRANSPORTS
            .iter()
            .map(|&transport| {
                self.connections_by_transport
                    .get_or_create(&TransportLabel { transport })
                    .get()
                    .max(0) as u64
            })
            .sum()
    }

    /// The label a device name is reported under.
    pub fn device(&self, device: &str) -> DeviceLabel {
        let known = self.device_kinds.contains(device);
        DeviceLabel { device: if known { device.to_string() } else { "other".to_string() } }
    }

    pub fn close_code(code: u16) -> CodeLabel {
        CodeLabel {
            code: close_code_labels()
                .iter()
                .find(|(c, _)| *c == code)
                .map_or("other", |(_, label)| *label),
        }
    }

    /// Count a directory write by outcome: `ok`, `stale` or `error`.
    pub fn directory_write(&self, result: &'static str) {
        self.directory_writes.get_or_create(&ResultLabel { result }).inc();
    }

    /// Count an answered publish: a new event, or a duplicate of one (the HTTP API and
    /// clients' `publish` op alike).
    pub fn publish_answered(&self, duplicate: bool) {
        let counter = if duplicate { &self.duplicates_rejected } else { &self.events_published };
        counter.inc();
    }

    /// Count a handshake whose credential (a name from [`CREDENTIALS`]) was accepted.
    pub fn handshake_credential(&self, credential: &'static str) {
        debug_assert!(CREDENTIALS.contains(&credential), "unknown credential {credential}");
        self.handshakes.get_or_create(&CredentialLabel { credential }).inc();
    }

    pub fn handshake_rejected(&self, reason: &'static str) {
        self.handshake_rejections.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Count one hit of an abuse limit (a name from [`LIMITS`]).
    pub fn limit_hit(&self, limit: &'static str) {
        debug_assert!(LIMITS.contains(&limit), "unknown limit {limit}");
        self.limit_hits.get_or_create(&LimitLabel { limit }).inc();
    }

    /// Count a client's `publish` op by its outcome (a name from [`CLIENT_PUBLISH_OUTCOMES`]).
    pub fn client_publish(&self, outcome: &'static str) {
        debug_assert!(CLIENT_PUBLISH_OUTCOMES.contains(&outcome), "unknown outcome {outcome}");
        self.client_publishes.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Count a user a rebalance skipped (a reason from [`REBALANCE_SKIP_REASONS`]).
    pub fn rebalance_skipped(&self, reason: &'static str) {
        debug_assert!(REBALANCE_SKIP_REASONS.contains(&reason), "unknown reason {reason}");
        self.rebalance_skipped.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Count a rebalance order refused (a reason from `core::nodes::rebalance::ORDER_REFUSED_REASONS`).
    pub fn rebalance_order_refused(&self, reason: &'static str) {
        debug_assert!(
            crate::core::nodes::rebalance::ORDER_REFUSED_REASONS.contains(&reason),
            "unknown reason {reason}"
        );
        self.rebalance_orders_refused.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Count a peer's message dropped unparsed (a kind from `core::nodes::peer_input::MESSAGE_KINDS`).
    pub fn peer_message_dropped(&self, kind: &'static str) {
        debug_assert!(
            crate::core::nodes::peer_input::MESSAGE_KINDS.contains(&kind),
            "unknown kind {kind}"
        );
        self.peer_messages_dropped.get_or_create(&KindLabel { kind }).inc();
    }

    /// Count a peer's claim clamped to its cap (a kind from `core::nodes::peer_input::MESSAGE_KINDS`).
    pub fn peer_claim_clamped(&self, kind: &'static str) {
        self.peer_claims_clamped.get_or_create(&KindLabel { kind }).inc();
    }

    /// Count a webhook given up into the dead letters.
    pub fn webhook_dead_lettered(&self, reason: crate::core::rules::webhooks::DeadReason) {
        self.webhooks_dead_lettered.get_or_create(&ReasonLabel { reason: reason.as_str() }).inc();
    }

    /// Count a replay of a dead letter (an outcome from [`WEBHOOK_REPLAY_OUTCOMES`]).
    pub fn webhook_replay(&self, outcome: &'static str) {
        debug_assert!(WEBHOOK_REPLAY_OUTCOMES.contains(&outcome), "unknown outcome {outcome}");
        self.webhook_replays.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Count a webhook not queued (a reason from [`WEBHOOK_DROP_REASONS`]).
    pub fn webhook_dropped(&self, reason: &'static str) {
        debug_assert!(WEBHOOK_DROP_REASONS.contains(&reason), "unknown reason {reason}");
        self.webhooks_dropped.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub fn recovery(&self, recovered: bool) {
        let result = if recovered { "recovered" } else { "not_recovered" };
        self.recoveries.get_or_create(&ResultLabel { result }).inc();
    }

    /// One `events` frame carrying `events` events was written to a connection.
    pub fn frame_written(&self, events: usize) {
        self.frames_written.inc();
        self.events_delivered.inc_by(events as u64);
    }

    /// Raise the outbox high-water mark to `bytes` if it is higher.
    pub fn outbox_seen(&self, bytes: usize) {
        let bytes = bytes as i64;
        if bytes > self.outbox_high_water.get() {
            self.outbox_high_water.set(bytes);
        }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let registry = self.registry.get_or_init(|| self.register_all());
        self.process.refresh();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry)
            .expect("writing to a String cannot fail");
        out
    }

    fn register_all(&self) -> Registry {
        let mut r = Registry::with_prefix("livegate");
        let process = &self.process;
        r.register_with_unit(
            "process_cpu",
            "CPU time the process has used, user and system",
            Unit::Seconds,
            process.cpu_seconds.clone(),
        );
        r.register_with_unit(
            "process_resident_memory",
            "Resident memory of the process (Linux)",
            Unit::Bytes,
            process.resident_bytes.clone(),
        );
        r.register(
            "process_open_files",
            "Files (sockets included) the process has open (Linux)",
            process.open_files.clone(),
        );
        r.register(
            "process_max_open_files",
            "The process's open-file limit (soft RLIMIT_NOFILE), which bounds max_connections",
            process.max_open_files.clone(),
        );
        r.register("process_threads", "Threads of the process (Linux)", process.threads.clone());
        r.register(
            "connection_capacity",
            "The connections (WebSocket and SSE) this node takes at most: max_connections in force (0 configured: what the open-file limit leaves)",
            self.connection_capacity.clone(),
        );
        r.register(
            "connections_open",
            "Connections open (WebSocket and SSE), by device kind",
            self.connections_open.clone(),
        );
        r.register(
            "connections_by_transport",
            "Connections open, by transport (websocket, sse)",
            self.connections_by_transport.clone(),
        );
        r.register("connects", "Connections accepted (WebSocket and SSE)", self.connects.clone());
        r.register("disconnects", "Connections ended, by close code", self.disconnects.clone());
        r.register(
            "tokens_minted",
            "Connection tokens signed (POST /v1/tokens, the demo's token endpoint)",
            self.tokens_minted.clone(),
        );
        r.register(
            "handshake_rejections",
            "WebSocket upgrades and SSE requests refused, by reason",
            self.handshake_rejections.clone(),
        );
        r.register("handshakes", "Handshakes (WebSocket and SSE) whose credential was accepted, by credential (token: minted; jwt: signed by a backend; resume)", self.handshakes.clone());
        r.register(
            "limit_hits",
            "Requests, handshakes or connections refused by an abuse limit",
            self.limit_hits.clone(),
        );
        r.register(
            "subscriptions",
            "Room subscriptions held by connections",
            self.subscriptions.clone(),
        );
        r.register("rooms_live", "Rooms with a live actor", self.rooms_live.clone());
        r.register(
            "rooms_parked",
            "Inbox rooms whose automatic subscribers wait without an actor",
            self.rooms_parked.clone(),
        );
        r.register(
            "events_published",
            "Events appended to rooms (HTTP and client publishes)",
            self.events_published.clone(),
        );
        r.register(
            "events_delivered",
            "Events written to client sockets",
            self.events_delivered.clone(),
        );
        r.register(
            "duplicates_rejected",
            "Publishes answered as duplicates",
            self.duplicates_rejected.clone(),
        );
        r.register(
            "client_publishes",
            "Clients' publish ops over WebSocket, by outcome (published, duplicate, or the error code)",
            self.client_publishes.clone(),
        );
        r.register_with_unit(
            "delivery_latency",
            "Publish to the room window leaving for its subscribers, of each window's oldest event (so it includes the flush and the whole window)",
            Unit::Seconds,
            self.delivery_latency.clone(),
        );
        r.register("batch_events", "Events per room window", self.batch_events.clone());
        r.register("frames_written", "Events frames written", self.frames_written.clone());
        r.register_with_unit(
            "outbox_high_water",
            "Most bytes sent to one connection and not yet written",
            Unit::Bytes,
            self.outbox_high_water.clone(),
        );
        r.register(
            "slow_consumer_closes",
            "Connections closed with 4009",
            self.slow_consumer_closes.clone(),
        );
        r.register(
            "history_trimmed",
            "Events dropped from history by size or age",
            self.history_trimmed.clone(),
        );
        r.register(
            "state_reads",
            "Store reads of a room's state (at most one per room load)",
            self.state_reads.clone(),
        );
        r.register("recoveries", "Subscribes with since, by outcome", self.recoveries.clone());
        r.register(
            "directory_writes",
            "Session directory writes, by result",
            self.directory_writes.clone(),
        );
        r.register("migrations", "Session owner changes", self.migrations.clone());
        r.register(
            "handshakes_redirected",
            "Handshakes sent to the node that serves their session (HTTP 421 or close 4421)",
            self.handshakes_redirected.clone(),
        );
        r.register(
            "sessions_expired",
            "Sessions deleted after session_ttl_secs without a connection",
            self.sessions_expired.clone(),
        );
        r.register(
            "sessions_live",
            "Sessions with a connection on this node",
            self.sessions_live.clone(),
        );
        r.register(
            "sessions_cached",
            "Disconnected sessions kept in memory (at most session_cache_max)",
            self.sessions_cached.clone(),
        );
        r.register("occupancy_edges", "Cluster mode with webhooks: rooms' cluster-wide occupancy decisions this node made, by edge (each becomes a room_occupied or room_vacated webhook)", self.occupancy_edges.clone());
        r.register(
            "sessions_stored",
            "Session records in the embedded store (single node)",
            self.sessions_stored.clone(),
        );
        r.register(
            "cluster_append_conflicts",
            "Cluster mode: room appends that lost to another node's and were retried",
            self.cluster_append_conflicts.clone(),
        );
        r.register(
            "cluster_peers_alive",
            "Cluster mode: peer nodes heard within the heartbeat timeout",
            self.cluster_peers_alive.clone(),
        );
        r.register(
            "cluster_live_copies",
            "Cluster mode: rooms' live events and state records this node received from NATS (only rooms with subscribers here, and a few seconds after the last left)",
            self.cluster_live_copies.clone(),
        );
        r.register(
            "cluster_nats_connected",
            "Cluster mode: 1 while this node is connected to NATS, 0 while it reconnects (checked every cluster_heartbeat_ms; 0 outside cluster mode)",
            self.cluster_nats_connected.clone(),
        );
        r.register(
            "consumer_lag_events",
            "Cluster mode: the most events any room here was behind its stream when it applied its last event (events published before that one and not yet applied here; rooms that applied an event in the last 15 s)",
            self.consumer_lag_events.clone(),
        );
        r.register_with_unit(
            "consumer_lag",
            "Cluster mode: the oldest age, publish to applied here, of the last event each room applied (rooms that applied an event in the last 15 s)",
            Unit::Seconds,
            self.consumer_lag_seconds.clone(),
        );
        r.register("consumer_lag_rooms", "Cluster mode: rooms here whose last event came behind its stream by at least one event (in the last 15 s)", self.consumer_lag_rooms.clone());
        r.register(
            "cell_mirror_lag_events",
            "Cells with their own NATS: messages this cell's mirror of each other cell's rooms stream lacks, as JetStream reports it (read every 10 s)",
            self.cell_mirror_lag_events.clone(),
        );
        r.register(
            "migration_refusals",
            "Handshakes refused: migration budget spent",
            self.migration_refusals.clone(),
        );
        r.register(
            "rebalance_moves",
            "Rebalance: users handed over to another node",
            self.rebalance_moves.clone(),
        );
        r.register(
            "rebalance_connections_moved",
            "Rebalance: connections closed with 4421 towards the node their users were handed to",
            self.rebalance_connections_moved.clone(),
        );
        r.register("rebalance_skipped", "Rebalance: users not moved (budget: migration budget spent; gone: no session here any more; error: the directory failed)", self.rebalance_skipped.clone());
        r.register(
            "rebalance_pending",
            "Rebalance: connections this node still has to hand over",
            self.rebalance_pending.clone(),
        );
        r.register(
            "rebalance_orders_refused",
            "Rebalance orders refused (itself: the target is this node; unknown_target: not a node this node hears alive; target_draining: draining or starting)",
            self.rebalance_orders_refused.clone(),
        );
        r.register(
            "peer_messages_dropped",
            "Cluster mode: messages from peers dropped because they did not parse (too large, malformed, a bad name, URL or number), by kind",
            self.peer_messages_dropped.clone(),
        );
        r.register(
            "peer_claims_clamped",
            "Cluster mode: messages from peers taken with a count clamped to its cap (a node's connections at most 10,000,000), by kind",
            self.peer_claims_clamped.clone(),
        );
        r.register(
            "cell_breaker_state",
            "Cluster mode: each configured cell's breaker as this node sees it: 0 closed (the route may send users there), 1 half-open (on trial), 2 open (the cell's probes fail: users go to the next healthy cell)",
            self.cell_breaker_state.clone(),
        );
        r.register("cell_breaker_transitions", "Cluster mode: cell breakers' changes of state, by cell and the state entered (open, half_open, closed)", self.cell_breaker_transitions.clone());
        r.register("cell_probes", "Cluster mode: this node's probes of its own cell (a JetStream write and read of its key in lg_meta), by outcome", self.cell_probes.clone());
        r.register(
            "peer_up",
            "1 while a configured peer (peers) passes its probes",
            self.peer_up.clone(),
        );
        r.register("warmup_active", "1 while the node is in warm-up", self.warmup_active.clone());
        r.register(
            "warmup_reconnect_attempts",
            "Reconnects naming a session during warm-up",
            self.warmup_reconnect_attempts.clone(),
        );
        r.register(
            "warmup_reconnect_successes",
            "Warm-up reconnects that kept their session",
            self.warmup_reconnect_successes.clone(),
        );
        r.register(
            "drain_phase",
            "0 serving, 1 not ready, 2 closing, 3 forced, 4 done",
            self.drain_phase.clone(),
        );
        r.register(
            "drain_connections_left",
            "Connections open during a drain",
            self.drain_connections_left.clone(),
        );
        r.register_with_unit(
            "store_flush_latency",
            "Grouped store flush, request to durable",
            Unit::Seconds,
            self.store_flush_latency.clone(),
        );
        r.register_with_unit(
            "store_size",
            "Store size on disk",
            Unit::Bytes,
            self.store_bytes.clone(),
        );
        r.register("http_connections", "Plain HTTP sockets open (requests, keep-alive, handshakes not yet upgraded), at most max_http_connections", self.http_connections.clone());
        r.register("store_probes", "Liveness probes of the store (a read and an idempotent write) made for /healthz, at most one a second", self.store_probes.clone());
        r.register(
            "webhooks_queued",
            "Webhooks waiting in the store's queue, in flight included",
            self.webhooks_queued.clone(),
        );
        r.register(
            "webhooks_delivered",
            "Webhooks answered with 2xx",
            self.webhooks_delivered.clone(),
        );
        r.register(
            "webhook_attempts_failed",
            "Webhook attempts to be retried (timeout, no connection, 408, 429, 5xx)",
            self.webhook_attempts_failed.clone(),
        );
        r.register(
            "webhooks_dropped",
            "Webhooks not queued: queue_full (webhook_queue_max reached)",
            self.webhooks_dropped.clone(),
        );
        r.register(
            "webhook_dead_letters",
            "Dead letters kept in the store (webhooks given up), at most webhook_dead_letters_max",
            self.webhook_dead_letters.clone(),
        );
        r.register(
            "webhooks_dead_lettered",
            "Webhooks given up into the dead letters: attempts (webhook_max_attempts failed) or rejected (a 4xx other than 408 and 429)",
            self.webhooks_dead_lettered.clone(),
        );
        r.register(
            "webhook_dead_letters_dropped",
            "The oldest dead letters dropped to make room for newer ones (webhook_dead_letters_max)",
            self.webhook_dead_letters_dropped.clone(),
        );
        r.register(
            "webhook_replays",
            "Replays of dead letters (POST /v1/admin/webhooks/dead/{id}/replay), by outcome",
            self.webhook_replays.clone(),
        );
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_stay_bounded() {
        let metrics = Metrics::new(["phone".to_string(), "web".to_string()]);
        assert_eq!(metrics.device("phone").device, "phone");
        assert_eq!(metrics.device("toaster-9000").device, "other");
        assert_eq!(Metrics::close_code(4501).code, "4501");
        assert_eq!(Metrics::close_code(4321).code, "other");
        metrics.outbox_seen(10);
        metrics.outbox_seen(5);
        assert_eq!(metrics.outbox_high_water.get(), 10);
        let text = metrics.encode();
        assert!(text.contains("livegate_outbox_high_water_bytes 10"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        // The registry built at the first scrape shows later changes.
        metrics.outbox_seen(12);
        metrics.connects.inc();
        let text = metrics.encode();
        assert!(text.contains("livegate_outbox_high_water_bytes 12"), "{text}");
        assert!(text.contains("livegate_connects_total 1"), "{text}");
    }

    #[test]
    fn the_process_figures_are_read_at_each_scrape() {
        let metrics = Metrics::new([]);
        let value = |text: &str, name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
                .unwrap_or_else(|| panic!("{name} in {text}"));
            line[name.len()..].trim().parse().expect("a number")
        };
        let text = metrics.encode();
        let (cpu, rss) = (
            value(&text, "livegate_process_cpu_seconds"),
            value(&text, "livegate_process_resident_memory_bytes"),
        );
        let (open, max) = (
            value(&text, "livegate_process_open_files"),
            value(&text, "livegate_process_max_open_files"),
        );
        assert!(
            cpu > 0.0 && rss > 1e6 && open >= 3.0 && max >= open,
            "cpu {cpu} rss {rss} open {open} max {max}"
        );
        let threads = value(&text, "livegate_process_threads");
        assert!(threads >= 1.0, "threads {threads}");
    }
}
