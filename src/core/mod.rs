//! The pure core: decisions without I/O. Nothing here imports actix, sled or serde_json,
//! and nothing reads the clock: time is always a parameter (`lifecycle` holds its phase in
//! a tokio watch channel, which is no I/O either). Actors call into it with `now`
//! and carry out what it returns.

pub mod append;
pub mod backlog;
pub mod backoff;
pub mod batch;
pub mod breaker;
pub mod connection;
pub mod busiest;
pub mod credentials;
pub mod drain;
pub mod group_commit;
pub mod heartbeats;
pub mod holds;
pub mod interest;
pub mod lag;
pub mod lifecycle;
pub mod limits;
pub mod liveness;
pub mod names;
pub mod outbox;
pub mod placement;
pub mod peer_input;
pub mod occupancy;
pub mod origins;
pub mod presence;
pub mod probes;
pub mod room;
pub mod namespaces;
pub mod proxies;
pub mod rebalance;
pub mod redact;
pub mod routing;
pub mod sent;
pub mod seqlog;
pub mod sessions;
#[cfg(test)]
mod sim;
pub mod sse;
pub mod subscriptions;
pub mod webhooks;
