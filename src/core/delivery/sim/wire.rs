//! What the simulated room and connections send each other, and the room's world as the
//! simulation makes it.

use std::sync::Arc;

use crate::core::delivery::backlog::Backlog;
use crate::core::delivery::room::Wire;
use crate::core::delivery::testing::Ev;

/// Bytes of one event on the wire.
pub const EVENT_BYTES: usize = 100;
/// The one room of the simulation.
pub const ROOM: &str = "room";
pub const EPOCH: &str = "e1";

/// The room's world as the simulation makes it: windows of at most `window_events`.
pub struct SimWire {
    pub window_events: usize,
}

impl Wire for SimWire {
    type Event = Ev;
    type Window = Vec<Ev>;
    /// The connection and its backlog.
    type Sink = (u64, Arc<Backlog>);
    type Ticket = ();
    /// The publish's number.
    type Reply = u64;
    type Error = String;
    type Failed = String;

    fn cut(&self, _epoch: &Arc<str>, events: Vec<Ev>) -> Vec<Vec<Ev>> {
        events.chunks(self.window_events).map(<[Ev]>::to_vec).collect()
    }
    fn bytes(window: &Vec<Ev>) -> usize {
        window.len() * EVENT_BYTES
    }
    fn backlog(sink: &(u64, Arc<Backlog>)) -> &Backlog {
        &sink.1
    }
    fn not_loaded() -> String {
        "not loaded".into()
    }
}

/// What a room posts to a connection's mailbox.
pub enum Update {
    Subscribed { generation: u64, head: u64, recovered: Option<bool>, replay: Vec<Ev> },
    Window(Vec<Ev>),
    SlowConsumer,
}

/// What a connection sends the room.
pub enum Request {
    Subscribe { conn: u64, generation: u64, since: Option<u64>, backlog: Arc<Backlog> },
    Unsubscribe { conn: u64, generation: u64 },
}
