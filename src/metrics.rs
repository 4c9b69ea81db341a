//! Process metrics, exposed at `GET /metrics` in the Prometheus/OpenMetrics text format.
//! Cardinality is bounded: labels name outcomes and close codes, never users or rooms.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// Every metric livegate keeps; one instance per server, shared by reference.
#[derive(Default)]
pub struct Metrics {
    pub connections_open: Gauge,
    pub directory_writes: Family<ResultLabel, Counter>,
    pub migrations: Counter,
    pub migration_refusals: Counter,
    pub warmup_active: Gauge,
    pub warmup_reconnect_attempts: Counter,
    pub warmup_reconnect_successes: Counter,
    pub events_published: Counter,
    pub duplicates_rejected: Counter,
    pub slow_consumer_closes: Counter,
    pub drain_phase: Gauge,
    pub drain_connections_left: Gauge,
}

impl Metrics {
    /// Count a directory write by outcome: `ok`, `stale` or `error`.
    pub fn directory_write(&self, result: &'static str) {
        self.directory_writes.get_or_create(&ResultLabel { result }).inc();
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut registry = Registry::with_prefix("livegate");
        registry.register("connections_open", "WebSocket connections open", self.connections_open.clone());
        registry.register("directory_writes", "Session directory writes by result", self.directory_writes.clone());
        registry.register("migrations", "Session owner changes", self.migrations.clone());
        registry.register("migration_refusals", "Handshakes refused: migration budget spent", self.migration_refusals.clone());
        registry.register("warmup_active", "1 while the node is in warm-up", self.warmup_active.clone());
        registry.register(
            "warmup_reconnect_attempts",
            "Reconnects naming a session during warm-up",
            self.warmup_reconnect_attempts.clone(),
        );
        registry.register(
            "warmup_reconnect_successes",
            "Warm-up reconnects that kept their session",
            self.warmup_reconnect_successes.clone(),
        );
        registry.register("events_published", "Events appended to rooms", self.events_published.clone());
        registry.register("duplicates_rejected", "Publishes answered as duplicates", self.duplicates_rejected.clone());
        registry.register("slow_consumer_closes", "Connections closed with 4009", self.slow_consumer_closes.clone());
        registry.register(
            "drain_phase",
            "0 serving, 1 not ready, 2 closing, 3 forced, 4 done",
            self.drain_phase.clone(),
        );
        registry.register("drain_connections_left", "Connections open during a drain", self.drain_connections_left.clone());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}
