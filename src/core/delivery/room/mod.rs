//! A room's decisions about its subscribers, apart from where its events are kept: how a
//! subscribe is answered from the room's [`SeqLog`] ([`answer_subscribe`]), which
//! generation of a connection's subscription is current ([`Members`]), and the durable
//! events waiting for the batching window ([`Outgoing`]). The room actor drives these
//! with its log, its mailbox and its timers; `S` is what it keeps per subscriber (where to
//! send, the connection's backlog) and `T` an event as subscribers get it.
//!
//! What holds (checked with the connection's machine by the simulation in `core::delivery::sim`):
//! - an answer's replay is every durable event after the subscriber's `since`, up to the
//!   head it names, or the answer says `recovered:false` and replays nothing (but a
//!   requested state and the events after it);
//! - a subscriber gets the windows after the head its answer named, and only the
//!   generation that subscribed last gets them;
//! - an event made durable while nobody is subscribed is not queued: a later subscriber
//!   starts after it or finds it in its replay.

pub mod answer;
pub mod io;
pub mod machine;
pub mod members;

pub use self::answer::{answer_subscribe, seen_beyond_head, Ask, SubscribeAnswer};
pub use self::io::{Action, Input, Limits, LogInput, Published, StateAt, Subscribe, Timer, Wire};
pub use self::machine::RoomMachine;
pub use self::members::{Joined, Member, Members, Outgoing};
