//! The one way into a room's sequence: [`Publisher::publish`]. On a single node it appends
//! through the rooms table; in cluster mode it first forwards the event to the room's
//! writer (the node routing names for the room), and appends here only when the writer
//! is this node or cannot be reached (the append guard keeps the sequence contiguous
//! either way). The HTTP API, clients' `publish` op and the demo's simulator all publish
//! through it; [`Publisher::submit`] is the checked entry of the first two (size, id).

use std::sync::Arc;

use actix::Addr;

use super::liveness::{LivenessActor, RoomWriter};
use super::messages::Published;
use super::rooms::{RoomError, Rooms};
use crate::cluster::bus::{forward_publish, ForwardError};
use crate::cluster::Cluster;
use crate::core::names;
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
}

/// Why a submitted event was not published.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("event data is larger than max_event_bytes ({max})")]
    TooLarge { max: usize },
    #[error(transparent)]
    BadId(names::NameError),
    #[error(transparent)]
    Room(#[from] RoomError),
}

impl SubmitError {
    /// The error code an HTTP answer or an `error` frame carries.
    pub fn code(&self) -> ErrorCode {
        match self {
            SubmitError::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            SubmitError::BadId(_) => ErrorCode::BadRequest,
            SubmitError::Room(_) => ErrorCode::Unavailable,
        }
    }
}

/// Cheap to clone; every clone publishes the same way.
#[derive(Clone)]
pub struct Publisher {
    rooms: Rooms,
    writers: Option<Writers>,
}

/// Cluster mode: how to find and reach a room's writer.
#[derive(Clone)]
struct Writers {
    cluster: Cluster,
    liveness: Addr<LivenessActor>,
}

impl Publisher {
    pub fn local(rooms: Rooms) -> Publisher {
        Publisher { rooms, writers: None }
    }

    pub fn clustered(rooms: Rooms, cluster: Cluster, liveness: Addr<LivenessActor>) -> Publisher {
        Publisher { rooms, writers: Some(Writers { cluster, liveness }) }
    }

    /// The largest event data `room` takes: its namespace's `max_event_bytes`.
    pub fn max_event_bytes(&self, room: &str) -> usize {
        self.rooms.options(room).max_event_bytes
    }

    /// Check an event's size (at most the room's `max_event_bytes`) and id (or make one
    /// up), then publish it: the one path of the HTTP API and of clients' `publish` op.
    pub async fn submit(&self, room: &str, event: Submission) -> Result<Published, SubmitError> {
        let max_event_bytes = self.max_event_bytes(room);
        if event.data.len() > max_event_bytes {
            return Err(SubmitError::TooLarge { max: max_event_bytes });
        }
        let id = match event.id {
            Some(id) => {
                names::check_event_id(&id).map_err(SubmitError::BadId)?;
                id
            }
            None => format!("lg-{}", crate::world::random_hex(12)),
        };
        Ok(self.publish(room, id.into(), event.data, event.devices, event.from).await?)
    }

    /// Append one event (already size- and id-checked) to `room`; the reply names its seq.
    pub async fn publish(
        &self,
        room: &str,
        id: Arc<str>,
        data: Arc<str>,
        devices: Option<Vec<String>>,
        from: Option<String>,
    ) -> Result<Published, RoomError> {
        if let Some(Writers { cluster, liveness }) = &self.writers {
            let writer = liveness.send(RoomWriter { room: room.to_string() }).await.ok().flatten();
            if let Some(writer) = writer.filter(|w| *w != cluster.node) {
                match forward_publish(cluster, &writer, room, &id, &data, devices.as_deref(), from.as_deref()).await {
                    Ok(appended) => {
                        return Ok(Published { seq: appended.seq, epoch: appended.epoch.into(), duplicate: appended.duplicate })
                    }
                    Err(ForwardError::Refused(refusal)) => return Err(RoomError::Writer(refusal)),
                    Err(error @ (ForwardError::Unreachable(_) | ForwardError::Malformed(_))) => {
                        tracing::debug!(room, writer, %error, "appending here");
                    }
                }
            }
        }
        self.rooms.publish(room, id, data, devices, from).await
    }
}
