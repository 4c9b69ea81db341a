//! Which node serves what and how nodes see each other: routing and placement, heartbeats and
//! liveness, probes, sessions, rebalancing, the drain, the node's lifecycle, lag, peer input, the
//! breaker. Uses `rules`; `delivery` uses it.

pub mod breaker;
pub mod busiest;
pub mod drain;
pub mod heartbeats;
pub mod lag;
pub mod lifecycle;
pub mod liveness;
pub mod peer_input;
pub mod placement;
pub mod probes;
pub mod rebalance;
pub mod routing;
pub mod sessions;
