//! The one way into a room's sequence: [`Publisher::publish`]. On a single node it appends
//! through the rooms table; in cluster mode it first forwards the event to the room's
//! writer (the node routing names for the room), and appends here only when the writer
//! is this node or cannot be reached (the append guard keeps the sequence contiguous
//! either way). With cells that run their own NATS, a room homed in another cell is
//! never appended here: its publish goes to a writer of its home cell within
//! [`CROSS_CELL_TIMEOUT`], or fails with [`RoomError::HomeUnavailable`]. The HTTP API, clients' `publish` op and the demo's simulator all publish
//! through it; [`Publisher::submit`] is the checked entry of the first two (size, id).

use std::sync::Arc;

use super::liveness::Router;
use super::messages::{NewEvent, Published, StateView};
use super::rooms::{RoomError, Rooms};
use crate::cluster::forward::{forward_publish, forward_put_state, ForwardError, ForwardEvent};
use crate::cluster::{Cluster, CROSS_CELL_TIMEOUT, FORWARD_WAIT};
use crate::core::rules::names;
use crate::protocol::ErrorCode;

/// An event as a backend or a client hands it in, before its checks.
pub struct Submission {
    /// The idempotency id; `None`: one is made up.
    pub id: Option<String>,
    /// The event's JSON text.
    pub data: Arc<str>,
    /// Devices an inbox message is for (`None`: every device).
    pub devices: Option<Vec<String>>,
    /// The publishing connection's user (client publish); `None`: a backend.
    pub from: Option<String>,
    /// The room's state as of this event (JSON text), stored atomically with
    /// it. Never for an inbox.
    pub state: Option<Arc<str>>,
}

/// Why a submitted event was not published.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("event data is larger than max_event_bytes ({max})")]
    TooLarge { max: usize },
    #[error("state is larger than max_state_bytes ({max})")]
    StateTooLarge { max: usize },
    #[error("inbox rooms have no state")]
    StateOnInbox,
    #[error(transparent)]
    BadId(names::NameError),
    #[error(transparent)]
    Room(#[from] RoomError),
}

impl SubmitError {
    /// The error code an HTTP answer or an `error` frame carries.
    pub fn code(&self) -> ErrorCode {
        match self {
            SubmitError::TooLarge { .. } | SubmitError::StateTooLarge { .. } => {
                ErrorCode::PayloadTooLarge
            }
            SubmitError::BadId(_) | SubmitError::StateOnInbox => ErrorCode::BadRequest,
            SubmitError::Room(error) => error.code(),
        }
    }
}

/// Cheap to clone; every clone publishes the same way.
#[derive(Clone)]
pub struct Publisher {
    rooms: Rooms,
    mode: Mode,
    /// Largest state a publish or a `PUT` may carry (`max_state_bytes`).
    max_state_bytes: usize,
}

/// `max_state_bytes` unless configured.
pub const DEFAULT_MAX_STATE_BYTES: usize = 65536;

/// Where a room's events are appended.
#[derive(Clone)]
enum Mode {
    /// On this node, always.
    Local,
    /// By the room's writer: the router names it, the cluster reaches it.
    Clustered { cluster: Box<Cluster>, router: Arc<Router> },
}

impl Publisher {
    pub fn local(rooms: Rooms) -> Publisher {
        Publisher { rooms, mode: Mode::Local, max_state_bytes: DEFAULT_MAX_STATE_BYTES }
    }

    pub fn clustered(rooms: Rooms, cluster: Cluster, router: Arc<Router>) -> Publisher {
        Publisher {
            rooms,
            mode: Mode::Clustered { cluster: Box::new(cluster), router },
            max_state_bytes: DEFAULT_MAX_STATE_BYTES,
        }
    }

    /// The largest state a publish or a `PUT` may carry (`max_state_bytes`).
    pub fn with_max_state_bytes(mut self, max: usize) -> Publisher {
        self.max_state_bytes = max;
        self
    }

    /// The largest event data `room` takes: its namespace's `max_event_bytes`.
    pub fn max_event_bytes(&self, room: &str) -> usize {
        self.rooms.options(room).max_event_bytes
    }

    /// The largest state a publish or a `PUT` may carry.
    pub fn max_state_bytes(&self) -> usize {
        self.max_state_bytes
    }

    /// Check an event's size (at most the room's `max_event_bytes`), its state's (at most
    /// `max_state_bytes`, never on an inbox) and id (or make one up), then publish it: the
    /// one path of the HTTP API and of clients' `publish` op.
    pub async fn submit(&self, room: &str, event: Submission) -> Result<Published, SubmitError> {
        let max_event_bytes = self.max_event_bytes(room);
        if event.data.len() > max_event_bytes {
            return Err(SubmitError::TooLarge { max: max_event_bytes });
        }
        check_state(room, event.state.as_deref(), self.max_state_bytes)?;
        let id = match event.id {
            Some(id) => {
                names::check_event_id(&id).map_err(SubmitError::BadId)?;
                id
            }
            None => format!("lg-{}", crate::world::random_hex(12)),
        };
        let Submission { data, devices, from, state, .. } = event;
        Ok(self.publish(room, NewEvent { id: id.into(), data, devices, from, state }).await?)
    }

    /// Set `room`'s state as of its head (`PUT /v1/rooms/{room}/state`): checked like a
    /// publish's state, then, in cluster mode, written by the room's writer.
    pub async fn put_state(&self, room: &str, data: Arc<str>) -> Result<Published, SubmitError> {
        check_state(room, Some(&data), self.max_state_bytes)?;
        if let Some(writer) = self.remote_writer(room)? {
            match forward_put_state(writer.cluster, &writer.node, room, &data, writer.wait).await {
                Ok(appended) => {
                    return Ok(Published {
                        seq: appended.seq,
                        epoch: appended.epoch.into(),
                        duplicate: appended.duplicate,
                    })
                }
                Err(ForwardError::Refused(refusal)) => {
                    return Err(RoomError::Writer(refusal).into())
                }
                Err(error) => writer.unreachable(room, &error)?,
            }
        }
        Ok(self.rooms.put_state(room, data).await?)
    }

    /// `room`'s state, from the room on this node.
    pub async fn state(&self, room: &str) -> Result<StateView, RoomError> {
        self.rooms.state(room).await
    }

    /// Cluster mode: the room's writer, when it is another node, and how to reach it.
    /// A room homed in another cell whose writer is not known alive there is refused.
    fn remote_writer(&self, room: &str) -> Result<Option<RemoteWriter<'_>>, RoomError> {
        let Mode::Clustered { cluster, router } = &self.mode else { return Ok(None) };
        let elsewhere =
            cluster.room_home(room).filter(|home| Some(home.as_str()) != cluster.own_cell());
        let writer = router.room_writer(room);
        match (writer, elsewhere) {
            (None, Some(home)) => {
                Err(RoomError::HomeUnavailable { room: room.to_string(), cell: home.to_string() })
            }
            (Some(node), _) if node == cluster.node => Ok(None),
            (None, None) => Ok(None),
            (Some(node), home) => {
                let wait = if home.is_some() { CROSS_CELL_TIMEOUT } else { FORWARD_WAIT };
                Ok(Some(RemoteWriter { cluster, node, home, wait }))
            }
        }
    }

    /// Append one event (already size- and id-checked) to `room`; the reply names its seq.
    pub async fn publish(&self, room: &str, event: NewEvent) -> Result<Published, RoomError> {
        if let Some(writer) = self.remote_writer(room)? {
            let forward = ForwardEvent {
                id: &event.id,
                data: &event.data,
                devices: event.devices.as_deref(),
                from: event.from.as_deref(),
                state: event.state.as_deref(),
            };
            match forward_publish(writer.cluster, &writer.node, room, forward, writer.wait).await {
                Ok(appended) => {
                    return Ok(Published {
                        seq: appended.seq,
                        epoch: appended.epoch.into(),
                        duplicate: appended.duplicate,
                    })
                }
                Err(ForwardError::Refused(refusal)) => return Err(RoomError::Writer(refusal)),
                Err(error) => writer.unreachable(room, &error)?,
            }
        }
        self.rooms.publish(room, event).await
    }
}

/// Another node that appends a room's events.
struct RemoteWriter<'a> {
    cluster: &'a Cluster,
    node: String,
    /// The room's home cell, when it is not this node's: nothing is appended here.
    home: Option<String>,
    /// How long its answer may take.
    wait: std::time::Duration,
}

impl RemoteWriter<'_> {
    /// The writer did not answer: append here (the append guard keeps the sequence
    /// contiguous), unless the room is homed in another cell.
    fn unreachable(&self, room: &str, error: &ForwardError) -> Result<(), RoomError> {
        match &self.home {
            Some(cell) => {
                tracing::warn!(room, writer = %self.node, cell, %error, "the room's home cell did not answer: not written");
                Err(RoomError::HomeUnavailable { room: room.to_string(), cell: cell.clone() })
            }
            None => {
                tracing::debug!(room, writer = %self.node, %error, "appending here");
                Ok(())
            }
        }
    }
}

/// A state is at most `max` bytes of JSON and never an inbox's.
fn check_state(room: &str, state: Option<&str>, max: usize) -> Result<(), SubmitError> {
    let Some(state) = state else { return Ok(()) };
    if names::inbox_owner(room).is_some() {
        return Err(SubmitError::StateOnInbox);
    }
    if state.len() > max {
        return Err(SubmitError::StateTooLarge { max });
    }
    Ok(())
}
