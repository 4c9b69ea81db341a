//! A room's events on their way to its subscribers: the sequence log and the append pipeline, the
//! batching window, the room and connection machines, subscriptions, outbox and backlog, presence
//! and occupancy, and the simulation that checks them together.

pub mod append;
pub mod backlog;
pub mod batch;
pub mod connection;
pub mod group_commit;
pub mod holds;
pub mod interest;
pub mod occupancy;
pub mod outbox;
pub mod presence;
pub mod room;
pub mod sent;
pub mod seqlog;
#[cfg(test)]
mod sim;
pub mod sse;
pub mod subscriptions;
#[cfg(test)]
mod testing;
