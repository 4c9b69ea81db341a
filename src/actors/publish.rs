//! The one way into a room's sequence: [`Publisher::publish`]. On a single node it appends
//! through the rooms table; in cluster mode it first forwards the event to the room's
//! writer (the node routing names for the room), and appends here only when the writer
//! is this node or cannot be reached (the append guard keeps the sequence contiguous
//! either way). The HTTP API and the demo's simulator both publish through it.

use std::sync::Arc;

use actix::Addr;

use super::liveness::{LivenessActor, RoomWriter};
use super::messages::Published;
use super::rooms::{RoomError, Rooms};
use crate::cluster::bus::{forward_publish, ForwardError};
use crate::cluster::Cluster;

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

    /// Append one event (already size- and id-checked) to `room`; the reply names its seq.
    pub async fn publish(&self, room: &str, id: Arc<str>, data: Arc<str>, devices: Option<Vec<String>>) -> Result<Published, RoomError> {
        if let Some(Writers { cluster, liveness }) = &self.writers {
            let writer = liveness.send(RoomWriter { room: room.to_string() }).await.ok().flatten();
            if let Some(writer) = writer.filter(|w| *w != cluster.node) {
                match forward_publish(cluster, &writer, room, &id, &data, devices.as_deref()).await {
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
        self.rooms.publish(room, id, data, devices).await
    }
}
