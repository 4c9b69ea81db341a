//! Presence across nodes, on NATS core subjects (not JetStream: a table is
//! only worth its latest copy, and a node that missed one asks again). Each node sends
//! its own members of a room on `lg.presence.room.<room>` whenever they changed (the
//! room throttles that to once per `presence_interval_ms`), the whole table each time,
//! or only the count above `presence_members_max`; a count of 0 says "none here any
//! more". A starting node (and one whose NATS connection came back) says hello on
//! `lg.presence.hello`; every other node drops what it had of that node (it restarted
//! or missed messages) and sends all its tables again, so counts converge within two
//! intervals.
//!
//! Body: `node\ncount\n` then one `user device` line per member, or `-` alone when the
//! members are not listed (user ids and device names hold no space or newline).

use std::sync::Arc;

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::errors::ClusterError;
use super::names::{room_from_token, room_token};
use super::Cluster;
use crate::core::delivery::presence::{Member, NodeTable};
use crate::tasks::Tasks;

pub const ROOM_SUBJECTS: &str = "lg.presence.room.*";
pub const HELLO_SUBJECT: &str = "lg.presence.hello";

fn room_subject(room: &str) -> String {
    format!("lg.presence.room.{}", room_token(room))
}

/// What the other nodes send about presence.
pub trait PresenceEvents: Clone + 'static {
    /// `node`'s members of `room` now (count 0: none).
    fn table(&self, node: String, room: String, table: NodeTable);
    /// `node` started (or reconnected): it has none of our tables.
    fn hello(&self, node: String);
}

pub fn encode(node: &str, table: &NodeTable) -> String {
    let mut out = format!("{node}\n{}\n", table.count);
    match &table.members {
        Some(members) => {
            for m in members {
                out.push_str(&m.user);
                out.push(' ');
                out.push_str(&m.device);
                out.push('\n');
            }
        }
        None => out.push_str("-\n"),
    }
    out
}

pub fn decode(body: &[u8]) -> Option<(String, NodeTable)> {
    let text = std::str::from_utf8(body).ok()?;
    let mut lines = text.lines();
    let node = lines.next()?.to_string();
    let count = lines.next()?.parse().ok()?;
    let mut rest = lines.peekable();
    if rest.peek() == Some(&"-") {
        return Some((node, NodeTable { count, members: None }));
    }
    let members = rest
        .map(|line| line.split_once(' ').map(|(user, device)| Member::new(user, device)))
        .collect::<Option<Vec<Member>>>()?;
    (members.len() == count).then_some((node, NodeTable { count, members: Some(members) }))
}

/// What a node sends, in the order it was asked (one task sends them all, so a newer
/// table of a room never overtakes an older one).
enum Outgoing {
    Table(Arc<str>, NodeTable),
    Hello,
}

/// This node's side of presence on NATS: tables and hellos go out in order from one task.
#[derive(Clone)]
pub struct PresenceSender {
    queue: mpsc::UnboundedSender<Outgoing>,
}

impl PresenceSender {
    /// Start the sending task on the current (actix) runtime, owned by the [`Tasks`]
    /// returned (what is queued when it stops is not sent: the node's goodbye drops its
    /// tables on every other node anyway).
    pub fn start(cluster: &Cluster) -> (PresenceSender, Tasks) {
        let (queue, mut next) = mpsc::unbounded_channel();
        let cluster = cluster.clone();
        let mut tasks = Tasks::default();
        tasks.spawn(async move {
            while let Some(out) = next.recv().await {
                let (subject, body) = match out {
                    Outgoing::Table(room, table) => {
                        (room_subject(&room), encode(&cluster.node, &table))
                    }
                    Outgoing::Hello => (HELLO_SUBJECT.to_string(), cluster.node.clone()),
                };
                if let Err(error) = cluster.client.publish(subject, body.into()).await {
                    tracing::debug!(%error, "presence not sent");
                }
            }
        });
        (PresenceSender { queue }, tasks)
    }

    /// This node's members of `room` (count 0: none any more).
    pub fn table(&self, room: Arc<str>, table: NodeTable) {
        let _ = self.queue.send(Outgoing::Table(room, table));
    }

    /// Ask every other node for its tables.
    pub fn hello(&self) {
        let _ = self.queue.send(Outgoing::Hello);
    }
}

/// Listen to the other nodes' tables and hellos (this node's own are skipped), in tasks
/// owned by the [`Tasks`] returned. Subscribed before returning.
pub async fn listen(cluster: &Cluster, events: impl PresenceEvents) -> Result<Tasks, ClusterError> {
    let mut tables = cluster.client.subscribe(ROOM_SUBJECTS).await?;
    let mut hellos = cluster.client.subscribe(HELLO_SUBJECT).await?;
    let (me, table_events) = (cluster.node.clone(), events.clone());
    let mut tasks = Tasks::default();
    tasks.spawn(async move {
        while let Some(message) = tables.next().await {
            let room = message.subject.as_str().rsplit('.').next().and_then(room_from_token);
            match (room, decode(&message.payload)) {
                (Some(room), Some((node, table))) if node != me => table_events.table(node, room, table),
                (Some(_), Some(_)) => {}
                _ => tracing::debug!(subject = %message.subject, "ignoring a malformed presence table"),
            }
        }
    });
    let me = cluster.node.clone();
    tasks.spawn(async move {
        while let Some(message) = hellos.next().await {
            let node = String::from_utf8_lossy(&message.payload).into_owned();
            if node != me {
                events.hello(node);
            }
        }
    });
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_round_trip() {
        let listed = NodeTable {
            count: 2,
            members: Some(vec![Member::new("a@x:1", "web"), Member::new("b", "phone")]),
        };
        let counted = NodeTable { count: 7000, members: None };
        let empty = NodeTable { count: 0, members: Some(vec![]) };
        for table in [listed, counted, empty] {
            assert_eq!(decode(encode("n-1", &table).as_bytes()), Some(("n-1".to_string(), table)));
        }
        assert_eq!(decode(b"n\n2\na web\n"), None, "count and list disagree");
        assert_eq!(decode(b"n\nx\n-\n"), None);
        assert_eq!(decode(b"n\n1\nnospace\n"), None);
    }
}
