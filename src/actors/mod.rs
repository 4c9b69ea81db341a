//! The actors: thin shells that own state, pass `now` into the pure core and carry out
//! what it decides. They talk only through the message types in [`messages`].

pub mod connection;
pub mod directory;
pub mod echo;
pub mod link;
pub mod liveness;
pub mod messages;
pub mod publish;
pub mod rebalance;
pub mod registry;
pub mod room;
pub mod rooms;
pub mod socket;
pub mod sse;
pub mod supervisor;
pub mod transport;
pub mod webhooks;
pub mod wsio;
