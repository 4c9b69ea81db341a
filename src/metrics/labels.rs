//! The label sets of the metrics, and the fixed lists that bound their values (close
//! codes, credentials, limits).

use prometheus_client::encoding::EncodeLabelSet;

use crate::protocol::CloseCode;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// A cluster-wide occupancy decision: `occupied` or `vacated`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EdgeLabel {
    pub edge: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabel {
    pub device: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabel {
    pub transport: &'static str,
}

/// The transports a connection may use (`actors::transport::Transport::name`).
pub(super) const TRANSPORTS: &[&str] = &["websocket", "sse"];
/// Why a rebalance skips a user (`livegate_rebalance_skipped_total{reason=…}`).
pub const REBALANCE_SKIP_REASONS: &[&str] = &["budget", "gone", "error"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// What a client's `publish` op came to: appended, a duplicate id, or the error code it
/// was refused with.
pub const CLIENT_PUBLISH_OUTCOMES: &[&str] = &[
    "published",
    "duplicate",
    "forbidden",
    "bad_room",
    "payload_too_large",
    "bad_request",
    "rate_limited",
    "unavailable",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CellLabel {
    pub cell: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CellTransitionLabel {
    pub cell: String,
    pub to: &'static str,
}

/// A cell breaker's state as `livegate_cell_breaker_state` shows it.
pub fn breaker_state_value(state: crate::core::nodes::breaker::State) -> i64 {
    use crate::core::nodes::breaker::State;
    match state {
        State::Closed { .. } => 0,
        State::HalfOpen { .. } => 1,
        State::Open { .. } => 2,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabel {
    pub peer: String,
}

/// Codes a peer may close with that livegate never sends, reported as themselves: 1001
/// (a browser leaving the page), 1005 (no code), 1006 (dropped); any other code outside
/// [`CloseCode::ALL`] is `other`.
const PEER_CLOSE_CODES: [u16; 3] = [1001, 1005, 1006];

/// Each reported close code with its label text (made once, kept for the process).
pub(super) fn close_code_labels() -> &'static [(u16, &'static str)] {
    static LABELS: std::sync::OnceLock<Vec<(u16, &'static str)>> = std::sync::OnceLock::new();
    LABELS.get_or_init(|| {
        let codes = CloseCode::ALL.iter().map(|c| c.code()).chain(PEER_CLOSE_CODES);
        codes.map(|code| (code, &*Box::leak(code.to_string().into_boxed_str()))).collect()
    })
}

/// Why handshakes are refused: the JSON error codes of the upgrade handler.
pub(super) const HANDSHAKE_REASONS: &[&str] = &[
    "missing_token",
    "invalid_token",
    "token_expired",
    "token_replayed",
    "unavailable",
    "migration_budget",
    "wrong_node",
    "bad_request",
    "internal",
    "too_many_connections",
    "rate_limited",
    "forbidden_origin",
    "directory_unavailable",
    "resume_invalid",
    // Only an SSE request names its rooms up front.
    "bad_room",
    "too_many_subscriptions",
    "forbidden",
];

/// Labels whose values are not a fixed list, with how the reference describes them:
/// the others' series are all created at start (`with_known_series`).
pub const OPEN_LABELS: &[(&str, &str)] = &[
    ("device", "each of `exclusive_devices`, `web` and `other`"),
    ("peer", "each peer of `peers`"),
    ("cell", "each cell of `cells` (cluster mode)"),
    ("code", "each close code livegate sends (see [Close codes](close-codes.md)), `1005`, `1006` (the socket just ended) and `other`"),
];

/// Why a webhook is given up (`livegate_webhooks_dropped_total{reason=…}`).
pub const WEBHOOK_DROP_REASONS: &[&str] = &["queue_full"];

/// How a replay of a dead letter ended (`livegate_webhook_replays_total{outcome=…}`).
pub const WEBHOOK_REPLAY_OUTCOMES: &[&str] = &["delivered", "failed"];

/// The credentials a handshake may present.
pub(super) const CREDENTIALS: &[&str] = &["token", "jwt", "resume"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CredentialLabel {
    pub credential: &'static str,
}

/// The abuse limits, as `livegate_limit_hits_total{limit=…}` names them.
pub const LIMITS: &[&str] = &[
    "connections",
    "connections_per_ip",
    "handshake_rate",
    "message_rate",
    "bad_messages",
    "subscriptions",
    "history_limit",
    "subscribe_timeout",
    "frame_size",
    "message_size",
    "origin",
    "handshake_timeout",
    "room_starts",
    "http_connections",
];
