//! The node's NATS listeners, each a task that turns messages into calls of
//! [`NodeEvents`]: heartbeats and goodbyes, exclusive-device
//! announcements, users whose sessions another node took, kick requests (answered with the count) and publishes forwarded to this
//! node as a room's writer (at most [`MAX_FORWARDS_RUNNING`] at once; their wire is
//! [`super::forward`]'s). A maintenance
//! loop reports NATS coming back and replays queued directory writes. Every task is
//! owned by the [`Tasks`] `listen` returns. The wiring implements [`NodeEvents`] over the
//! actors; this module knows none of them.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;

use super::errors::ClusterError;
use super::forward::{
    decode_forward, encode_answer, publish_subject, Appended, ForwardedPublish, MalformedForward,
};
use super::heartbeat::{
    decode_capacity, decode_connections, decode_epoch, decode_node, decode_probe, decode_release,
    decode_routes, decode_usage, CAPACITY_HEADER, CELL_PROBE_HEADER, CONNECTIONS_HEADER,
    EPOCH_HEADER, MOVES_HEADER, RELEASE_HEADER, ROOMS_HEAD_HEADER, ROUTES_HEADER, USAGE_HEADER,
};
use super::kv::KvSessions;
use super::names::{
    room_token, HEARTBEAT_SUBJECT, KICK_SUBJECT, LEAVE_SUBJECT, MOVED_SUBJECT, REPLACE_SUBJECT,
};
use super::promotion::{decode_moves, decode_rooms_head};
use super::Cluster;
use crate::core::nodes::heartbeats::NodeInfo;
use crate::core::nodes::peer_input::{self, PeerInputError};
use crate::core::nodes::rebalance::{self, Order, OrderRefused};
use crate::tasks::Tasks;

/// What this node does with what the other nodes send it. Rooms' live events are not
/// here: each room watches its own ([`super::roomlog::watch`]).
pub trait NodeEvents: Clone + 'static {
    fn peer_heard(&self, peer: NodeInfo);
    fn peer_left(&self, node: String);
    /// Another node connected `user` on exclusive `device` at `at_ms`.
    fn replaced(&self, user: String, device: String, at_ms: u64);
    /// Node `to` took `user`'s sessions at `at_ms`: the user's connections here made
    /// before then go there.
    fn user_moved(&self, user: String, to: String, at_ms: u64);
    /// Close `user`'s connections here (on `device` when named); yields how many closed.
    /// `at_ms`: when the kick was made on the node that asked.
    fn kick(
        &self,
        user: String,
        device: Option<String>,
        at_ms: u64,
    ) -> LocalBoxFuture<'static, usize>;
    /// Append a publish forwarded to this node as the room's writer. An error is sent
    /// back as its text (the forwarding node reads it as a [`WriterRefusal`]).
    fn publish(
        &self,
        publish: ForwardedPublish,
    ) -> LocalBoxFuture<'static, Result<Appended, Box<dyn std::error::Error>>>;
    /// NATS is back after an outage: rooms re-read their streams.
    fn reconnected(&self);
    /// Another node planned a rebalance in which this node hands connections over;
    /// yields whether this node took it.
    fn rebalance(&self, order: Order) -> LocalBoxFuture<'static, Result<(), OrderRefused>>;
    /// A promotion moved the rooms `moved` names to cell `to` (a peer announced it, or
    /// this node made it): their subscribers here resume them there.
    fn rooms_moved(&self, moved: Box<dyn Fn(&str) -> bool>, to: String);
    /// A peer's message of `kind` (a `peer_input::MESSAGE_KINDS` name) was dropped: it did not
    /// parse ([`PeerInputError`]).
    fn dropped(&self, kind: &'static str);
    /// A peer's message of `kind` claimed a count above its cap, and was taken clamped.
    fn clamped(&self, kind: &'static str);
}

/// How often at most a listener logs the peer messages it dropped (each one is counted).
const DROP_WARN_EVERY: Duration = Duration::from_secs(1);

/// A listener's dropped peer messages: every one counted ([`NodeEvents::dropped`]), one
/// warning per [`DROP_WARN_EVERY`] with how many since the last, so a flood of junk does
/// not flood the log.
struct Drops<E> {
    events: E,
    kind: &'static str,
    warned: Option<Instant>,
    since: u64,
}

impl<E: NodeEvents> Drops<E> {
    fn new(events: E, kind: &'static str) -> Self {
        Drops { events, kind, warned: None, since: 0 }
    }

    fn dropped(&mut self, error: &PeerInputError) {
        self.events.dropped(self.kind);
        self.since += 1;
        let now = Instant::now();
        if self.warned.is_none_or(|at| now.duration_since(at) >= DROP_WARN_EVERY) {
            tracing::warn!(kind = self.kind, %error, dropped = self.since, "dropped a malformed message from a peer");
            self.warned = Some(now);
            self.since = 0;
        }
    }

    fn clamped(&mut self, what: &'static str) {
        self.events.clamped(self.kind);
        tracing::debug!(kind = self.kind, what, "a peer claimed more than the cap: clamped");
    }
}

/// How often the maintenance loop looks at the connection and the directory queue.
const MAINTENANCE_EVERY: Duration = Duration::from_millis(500);
/// Longest a kick waits for the other nodes' counts (each waits up to 10 s for its closes).
const KICK_ANSWER_WAIT: Duration = Duration::from_secs(12);
/// How often a kick waiting for answers asks which peers are still alive.
const KICK_LIVENESS_RECHECK: Duration = Duration::from_millis(250);
/// Publishes forwarded to this node appended at once; more wait in the subscription's
/// queue (async-nats holds 65,536, then drops and counts a slow consumer; the forwarding
/// node then appends itself after [`super::forward::FORWARD_WAIT`]).
pub const MAX_FORWARDS_RUNNING: usize = 256;
/// Other nodes' kicks carried out at once (each waits up to 10 s for its closes); more
/// wait in the subscription's queue, as forwarded publishes do.
pub const MAX_KICKS_RUNNING: usize = 64;

/// Subscribe to everything this node listens to and spawn the listening tasks on the
/// current (actix) runtime, owned by the returned [`Tasks`]. Subscriptions are made
/// before returning, so nothing published after `listen` returns is missed. On the
/// owner's stop, forwarded publishes and kicks already taken are still answered.
pub async fn listen(
    cluster: &Cluster,
    events: impl NodeEvents,
    sessions: KvSessions,
) -> Result<Tasks, ClusterError> {
    let client = &cluster.client;
    let mut tasks = Tasks::default();
    let mut beats = client.subscribe(HEARTBEAT_SUBJECT).await?;
    let mut leaves = client.subscribe(LEAVE_SUBJECT).await?;
    let mut replaces = client.subscribe(REPLACE_SUBJECT).await?;
    let mut moves = client.subscribe(MOVED_SUBJECT).await?;
    let kicks = client.subscribe(KICK_SUBJECT).await?;
    let forwarded = client.subscribe(publish_subject(&cluster.node)).await?;
    let mut orders = client.subscribe(rebalance_subject(&cluster.node)).await?;
    let (order_events, order_client) = (events.clone(), client.clone());
    let mut order_drops = Drops::new(events.clone(), "order");
    tasks.spawn(async move {
        while let Some(message) = orders.next().await {
            let answer = match decode_order(&message.payload) {
                Ok((order, clamped)) => {
                    if clamped {
                        order_drops.clamped("connections");
                    }
                    match order_events.rebalance(order).await {
                        Ok(()) => "ok".to_string(),
                        Err(refused) => format!("refused: {refused}"),
                    }
                }
                Err(error) => {
                    order_drops.dropped(&error);
                    "malformed".to_string()
                }
            };
            if let Some(reply) = message.reply {
                let _ = order_client.publish(reply, answer.into()).await;
            }
        }
    });
    let (publish_events, publish_client) = (events.clone(), client.clone());
    tasks.spawn_with_stop(|stop| {
        forwarded.take_until(stop.requested()).for_each_concurrent(
            MAX_FORWARDS_RUNNING,
            move |message| {
                let (events, client) = (publish_events.clone(), publish_client.clone());
                async move {
                    let Some(reply) = message.reply.clone() else { return };
                    let answer = match decode_forward(&message) {
                        Some(publish) => events.publish(publish).await,
                        None => Err(MalformedForward.into()),
                    };
                    let _ = client
                        .publish_with_headers(
                            reply,
                            encode_answer(&answer),
                            Vec::<u8>::new().into(),
                        )
                        .await;
                }
            },
        )
    });
    let beat_events = events.clone();
    let beat_cluster = cluster.clone();
    let mut beat_drops = Drops::new(events.clone(), "heartbeat");
    tasks.spawn(async move {
        while let Some(message) = beats.next().await {
            let header = |name: &str| {
                message.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().as_bytes())
            };
            let (connections, probe) = (header(CONNECTIONS_HEADER), header(CELL_PROBE_HEADER));
            let (epoch, head, moves) =
                (header(EPOCH_HEADER), header(ROOMS_HEAD_HEADER), header(MOVES_HEADER));
            let (release, routes) = (header(RELEASE_HEADER), header(ROUTES_HEADER));
            let (capacity, usage) = (header(CAPACITY_HEADER), header(USAGE_HEADER));
            let decoded = decode_node(&message.payload).and_then(|mut info| {
                let cells = (decode_epoch(epoch)?, decode_rooms_head(head)?, decode_moves(moves)?);
                (info.release, info.routes_to) = (decode_release(release)?, decode_routes(routes)?);
                let load = (
                    decode_connections(connections)?,
                    decode_capacity(capacity)?,
                    decode_usage(usage)?,
                );
                Ok((info, load, decode_probe(probe)?, cells))
            });
            match decoded {
                Ok((mut info, (connections, capacity, usage), probe, (epoch, head, moves))) => {
                    if let Some(epoch) = epoch {
                        beat_cluster.learn_epoch(&info.cell, epoch);
                    }
                    if let Some(head) = head {
                        beat_cluster.learn_head(&info.cell, head);
                    }
                    if !moves.is_empty() {
                        for (from, to) in beat_cluster.learn_moves(moves).await {
                            beat_events.rooms_moved(beat_cluster.rooms_of(from), to);
                        }
                    }
                    info.probe = probe;
                    if connections.is_some_and(|c| c.clamped) {
                        beat_drops.clamped("connections");
                    }
                    if capacity.is_some_and(|c| c.clamped) {
                        beat_drops.clamped("capacity");
                    }
                    info.connections = connections.map(|c| c.value);
                    info.capacity = capacity.map(|c| c.value);
                    info.usage = usage;
                    beat_events.peer_heard(info);
                }
                Err(error) => beat_drops.dropped(&error),
            }
        }
    });
    let leave_events = events.clone();
    let mut leave_drops = Drops::new(events.clone(), "leave");
    tasks.spawn(async move {
        while let Some(message) = leaves.next().await {
            let node = peer_input::text("leave", &message.payload, peer_input::MAX_NODE_NAME_LEN)
                .and_then(|text| peer_input::node_name("leave", text));
            match node {
                Ok(node) => leave_events.peer_left(node.to_string()),
                Err(error) => leave_drops.dropped(&error),
            }
        }
    });
    let (me, replace_events) = (cluster.node.clone(), events.clone());
    let mut replace_drops = Drops::new(events.clone(), "replace");
    tasks.spawn(async move {
        while let Some(message) = replaces.next().await {
            match decode_replace(&message.payload, &me) {
                Ok(Some((user, device, at_ms))) => replace_events.replaced(user, device, at_ms),
                Ok(None) => {}
                Err(error) => replace_drops.dropped(&error),
            }
        }
    });
    let (me, moved_events) = (cluster.node.clone(), events.clone());
    let mut moved_drops = Drops::new(events.clone(), "moved");
    tasks.spawn(async move {
        while let Some(message) = moves.next().await {
            match decode_moved(&message.payload, &me) {
                Ok(Some((user, to, at_ms))) => moved_events.user_moved(user, to, at_ms),
                Ok(None) => {}
                Err(error) => moved_drops.dropped(&error),
            }
        }
    });
    let (me, kick_client, kick_events) = (cluster.node.clone(), client.clone(), events.clone());
    let kick_drops = Rc::new(RefCell::new(Drops::new(events.clone(), "kick")));
    tasks.spawn_with_stop(|stop| {
        kicks.take_until(stop.requested()).for_each_concurrent(MAX_KICKS_RUNNING, move |message| {
            let (events, client, me, drops) =
                (kick_events.clone(), kick_client.clone(), me.clone(), kick_drops.clone());
            async move {
                let command = match decode_user_command(&message.payload) {
                    Ok(command) => command,
                    Err(error) => return drops.borrow_mut().dropped(&error),
                };
                let Some(reply) = message.reply else { return };
                if command.node == me {
                    return;
                }
                let device = (!command.device.is_empty()).then_some(command.device);
                // A node of a build before kicks carried their time sends none: now is
                // the nearest to it. A time far ahead of this node's clock is cut back.
                let now = crate::world::now_ms();
                let at_ms = peer_input::peer_time(
                    peer_input::number("kick time", &command.extra).unwrap_or(now),
                    now,
                );
                let closed = events.kick(command.user, device, at_ms).await;
                let _ = client.publish(reply, encode_kick_answer(&me, closed).into()).await;
            }
        })
    });
    let maintenance = cluster.clone();
    tasks.spawn(async move {
        let mut was_connected = true;
        loop {
            actix_web::rt::time::sleep(MAINTENANCE_EVERY).await;
            let connected = maintenance.connected();
            if connected && !was_connected {
                tracing::info!(
                    "NATS is back: rooms re-read their streams, queued directory writes replay"
                );
                events.reconnected();
            }
            if connected {
                if let Err(error) = sessions.replay_queue().await {
                    tracing::warn!(%error, "replaying queued directory writes failed; will retry");
                }
            }
            was_connected = connected;
        }
    });
    Ok(tasks)
}

/// Where a node takes its part of a rebalance ([`send_order`]).
fn rebalance_subject(node: &str) -> String {
    format!("lg.node.{}.rebalance", room_token(node))
}

/// Longest a rebalance order waits for the shedding node's acknowledgement.
const ORDER_WAIT: Duration = Duration::from_secs(2);

/// `id\nto\nto_url\nconnections\nper_second` (names, ids and URLs hold no newline).
/// `to_url` is the target's URL as the planning node sees it, written for nodes of
/// earlier builds, which send their clients there; this build never reads it
/// ([`decode_order`]): the shedding node takes the URL from its own view of the cluster.
fn encode_order(order: &Order, to_url: &str) -> String {
    format!("{}\n{}\n{}\n{}\n{}", order.id, order.to, to_url, order.connections, order.per_second)
}

/// An order, read as client input is: at most [`peer_input::MAX_ORDER_BYTES`], five
/// fields, an id and a target by the node-name rule, connections clamped to
/// [`peer_input::MAX_NODE_CONNECTIONS`] and `per_second` to 1..=[`rebalance::MAX_PER_SECOND`]
/// (the bool: something was clamped). The third field (the URL an earlier build reads)
/// is skipped unread.
fn decode_order(body: &[u8]) -> Result<(Order, bool), PeerInputError> {
    let text = peer_input::text("order", body, peer_input::MAX_ORDER_BYTES)?;
    let fields = peer_input::fields("order", text, 5, 5, "5")?;
    let connections =
        peer_input::count("order connections", fields[3], peer_input::MAX_NODE_CONNECTIONS)?;
    let per_second =
        peer_input::count("order per_second", fields[4], u64::from(rebalance::MAX_PER_SECOND))?;
    let order = Order {
        id: peer_input::node_name("order id", fields[0])?.into(),
        to: peer_input::node_name("order target", fields[1])?.into(),
        connections: connections.value,
        per_second: (per_second.value as u32).max(1),
    };
    Ok((order, connections.clamped || per_second.clamped || per_second.value == 0))
}

/// Give `node` its part of a rebalance towards `to_url` (for nodes of earlier builds);
/// `Ok` once it acknowledged the order.
pub async fn send_order(
    cluster: &Cluster,
    node: &str,
    order: &Order,
    to_url: &str,
) -> Result<(), OrderError> {
    let request = async_nats::Request::new()
        .payload(encode_order(order, to_url).into())
        .timeout(Some(ORDER_WAIT));
    let answer = cluster.client.send_request(rebalance_subject(node), request).await?;
    match &answer.payload[..] {
        b"ok" => Ok(()),
        refused if refused.starts_with(b"refused: ") => {
            Err(OrderError::Refused(String::from_utf8_lossy(&refused[9..]).into_owned()))
        }
        _ => Err(OrderError::Malformed),
    }
}

/// Why a node did not acknowledge its part of a rebalance ([`send_order`]).
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("node unreachable: {0}")]
    Unreachable(#[from] async_nats::RequestError),
    /// The node refused it (`core::nodes::rebalance::OrderRefused`, as its text).
    #[error("order refused: {0}")]
    Refused(String),
    /// An answer neither `ok` nor a refusal: not a livegate node's.
    #[error("the node answered neither ok nor a refusal")]
    Malformed,
}

/// `node\nuser\ndevice\nextra`: user and device names hold no newline.
fn encode_user_command(node: &str, user: &str, device: &str, extra: &str) -> String {
    format!("{node}\n{user}\n{device}\n{extra}")
}

/// A user command ([`encode_user_command`]) as another node sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UserCommand {
    node: String,
    user: String,
    /// Empty: every device.
    device: String,
    extra: String,
}

/// A user command, read as client input is: at most
/// [`peer_input::MAX_USER_COMMAND_BYTES`], a node name, a user and a device by the
/// clients' rules; `extra` is read by the command.
fn decode_user_command(body: &[u8]) -> Result<UserCommand, PeerInputError> {
    let text = peer_input::text("user command", body, peer_input::MAX_USER_COMMAND_BYTES)?;
    let fields = peer_input::fields("user command", text, 4, 4, "4")?;
    Ok(UserCommand {
        node: peer_input::node_name("user command node", fields[0])?.into(),
        user: peer_input::user("user command user", fields[1])?.into(),
        device: peer_input::device("user command device", fields[2])?.into(),
        extra: fields[3].into(),
    })
}

/// Another node's replacement announcement: `(user, device, at_ms)`, or `None` for this
/// node's own. A malformed time is refused: read as "always", it would replace every
/// connection of the device; a time far ahead of now is read as now.
fn decode_replace(body: &[u8], me: &str) -> Result<Option<(String, String, u64)>, PeerInputError> {
    let command = decode_user_command(body)?;
    if command.node == me {
        return Ok(None);
    }
    let at_ms = peer_input::number("replacement time", &command.extra)?;
    Ok(Some((command.user, command.device, peer_input::peer_time(at_ms, crate::world::now_ms()))))
}

/// Another node's move announcement: `(user, the node that took the sessions, at_ms)`,
/// or `None` for this node's own. The taking node is the sender (its name is the
/// command's node); the device field is empty. A malformed time is refused (read as
/// "always", it would send the user's later connections away too); a time far ahead
/// of now is read as now.
fn decode_moved(body: &[u8], me: &str) -> Result<Option<(String, String, u64)>, PeerInputError> {
    let command = decode_user_command(body)?;
    if command.node == me {
        return Ok(None);
    }
    let at_ms = peer_input::number("move time", &command.extra)?;
    Ok(Some((command.user, command.node, peer_input::peer_time(at_ms, crate::world::now_ms()))))
}

/// Tell the other nodes that this node took `user`'s sessions at `at_ms`.
pub async fn announce_moved(cluster: &Cluster, user: &str, at_ms: u64) {
    let body = encode_user_command(&cluster.node, user, "", &at_ms.to_string());
    if let Err(error) = cluster.client.publish(MOVED_SUBJECT, body.into()).await {
        tracing::warn!(%error, user, "could not announce the user's move to other nodes");
    }
}

/// Tell the other nodes that `user` connected on exclusive `device` at `at_ms`.
pub async fn announce_replace(cluster: &Cluster, user: &str, device: &str, at_ms: u64) {
    let body = encode_user_command(&cluster.node, user, device, &at_ms.to_string());
    if let Err(error) = cluster.client.publish(REPLACE_SUBJECT, body.into()).await {
        tracing::warn!(%error, user, device, "could not announce the new connection to other nodes");
    }
}

/// Kick `user` (on `device`) on the other nodes and return how many connections they
/// closed. Waits for an answer from every peer alive, asking the liveness table again
/// while it waits, so a node that died just before or during the kick is waited for
/// only until its heartbeats time out (or the deadline).
pub async fn kick_remote<Alive: std::future::Future<Output = Vec<String>>>(
    cluster: &Cluster,
    alive: impl Fn() -> Alive,
    user: &str,
    device: Option<&str>,
    at_ms: u64,
) -> Result<usize, ClusterError> {
    let mut waiting_for: HashSet<String> = alive().await.into_iter().collect();
    if waiting_for.is_empty() {
        return Ok(0);
    }
    let inbox = cluster.client.new_inbox();
    let mut answers = cluster.client.subscribe(inbox.clone()).await?;
    let body = encode_user_command(&cluster.node, user, device.unwrap_or(""), &at_ms.to_string());
    cluster.client.publish_with_reply(KICK_SUBJECT, inbox, body.into()).await?;
    let mut closed: usize = 0;
    let mut answered: HashSet<String> = HashSet::new();
    let deadline = actix_web::rt::time::sleep(KICK_ANSWER_WAIT);
    tokio::pin!(deadline);
    // The peers were just read: the first recheck is one period away, not at once.
    let first_recheck = actix_web::rt::time::Instant::now() + KICK_LIVENESS_RECHECK;
    let mut recheck = actix_web::rt::time::interval_at(first_recheck, KICK_LIVENESS_RECHECK);
    while !waiting_for.is_empty() {
        tokio::select! {
            answer = answers.next() => match answer.as_ref().map(|m| decode_kick_answer(&m.payload)) {
                // One answer per node counts (a peer repeating itself adds nothing).
                Some(Ok((node, count))) => {
                    waiting_for.remove(&node);
                    if answered.insert(node) {
                        closed = closed.saturating_add(count);
                    }
                }
                None => break,
                Some(Err(error)) => tracing::debug!(user, %error, "kick: ignoring a malformed answer"),
            },
            _ = recheck.tick() => {
                let alive: HashSet<String> = alive().await.into_iter().collect();
                waiting_for.retain(|node| alive.contains(node));
            }
            _ = &mut deadline => {
                tracing::warn!(user, missing = ?waiting_for, "kick: not every node answered in time");
                break;
            }
        }
    }
    Ok(closed)
}

/// A node's answer to a kick: its name and how many connections it closed.
fn encode_kick_answer(node: &str, closed: usize) -> String {
    format!("{node}\n{closed}")
}

/// A kick answer, read as client input is: a node name and a count clamped to
/// [`peer_input::MAX_NODE_CONNECTIONS`].
fn decode_kick_answer(payload: &[u8]) -> Result<(String, usize), PeerInputError> {
    let text = peer_input::text("kick answer", payload, peer_input::MAX_USER_COMMAND_BYTES)?;
    let fields = peer_input::fields("kick answer", text, 2, 2, "2")?;
    let node = peer_input::node_name("kick answer node", fields[0])?;
    let closed =
        peer_input::count("kick answer count", fields[1], peer_input::MAX_NODE_CONNECTIONS)?;
    Ok((node.to_string(), closed.value as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::nodes::peer_input::MAX_NODE_CONNECTIONS;

    #[test]
    fn rebalance_orders_round_trip_without_their_url() {
        let order = Order { id: "a1b2".into(), to: "c".into(), connections: 12, per_second: 5 };
        let body = encode_order(&order, "http://c:7070");
        assert_eq!(body, "a1b2\nc\nhttp://c:7070\n12\n5", "the format earlier builds read");
        assert_eq!(decode_order(body.as_bytes()), Ok((order.clone(), false)));
        // The URL in an order is never read: whatever it says, the order is the same.
        assert_eq!(
            decode_order(b"a1b2\nc\nhttp://attacker.example:8080\n12\n5"),
            Ok((order, false))
        );
        // Absurd numbers are clamped, not obeyed.
        let (order, clamped) = decode_order(b"r\nc\nu\n18446744073709551615\n4000000000").unwrap();
        assert!(clamped);
        assert_eq!(
            (order.connections, order.per_second),
            (MAX_NODE_CONNECTIONS, rebalance::MAX_PER_SECOND)
        );
        assert_eq!(decode_order(b"r\nc\nu\n1\n0").map(|(o, c)| (o.per_second, c)), Ok((1, true)));
        let huge = format!("r\nc\n{}\n1\n5", "u".repeat(2000));
        let cases: &[(&str, PeerInputError)] = &[
            ("", PeerInputError::Fields { what: "order", got: 1, expected: "5" }),
            ("r1\nc\nu\n12", PeerInputError::Fields { what: "order", got: 4, expected: "5" }),
            (
                "r1\nc\nu\n1\n5\nmore",
                PeerInputError::Fields { what: "order", got: 6, expected: "5" },
            ),
            ("r1\nc\nu\nx\n5", PeerInputError::BadNumber("order connections")),
            ("r1\nc\nu\n-1\n5", PeerInputError::BadNumber("order connections")),
            ("r1\n\nu\n1\n5", PeerInputError::BadName("order target")),
            ("r 1\nc\nu\n1\n5", PeerInputError::BadName("order id")),
            (
                huge.as_str(),
                PeerInputError::TooLarge {
                    what: "order",
                    len: huge.len(),
                    max: peer_input::MAX_ORDER_BYTES,
                },
            ),
        ];
        for (junk, error) in cases {
            assert_eq!(decode_order(junk.as_bytes()).as_ref().map(|_| ()), Err(error), "{junk:?}");
        }
    }

    #[test]
    fn user_commands_round_trip() {
        let body = encode_user_command("a", "u@x", "phone", "17");
        let command = UserCommand {
            node: "a".into(),
            user: "u@x".into(),
            device: "phone".into(),
            extra: "17".into(),
        };
        assert_eq!(decode_user_command(body.as_bytes()), Ok(command));
        assert!(
            decode_user_command(encode_user_command("a", "u", "", "").as_bytes()).is_ok(),
            "every device"
        );
        for junk in [
            "a\nb",
            "a\nu\nd\n1\nmore",
            "a b\nu\nd\n1",
            "a\n\nd\n1",
            "a\nu u\nd\n1",
            "a\nu\nd:x\n1",
        ] {
            assert!(decode_user_command(junk.as_bytes()).is_err(), "{junk:?}");
        }
        let long = encode_user_command("a", &"u".repeat(600), "d", "1");
        assert!(matches!(
            decode_user_command(long.as_bytes()),
            Err(PeerInputError::TooLarge { .. })
        ));
        assert_eq!(decode_kick_answer(encode_kick_answer("b", 3).as_bytes()), Ok(("b".into(), 3)));
        assert_eq!(
            decode_kick_answer(b"b\n18446744073709551615"),
            Ok(("b".into(), MAX_NODE_CONNECTIONS as usize))
        );
        for junk in ["3", "b\n-3", "b\n3\n4", "\n3"] {
            assert!(decode_kick_answer(junk.as_bytes()).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn a_replacement_with_a_malformed_time_is_ignored_not_read_as_always() {
        let at = |extra: &str| {
            decode_replace(encode_user_command("a", "u", "phone", extra).as_bytes(), "b")
        };
        assert_eq!(at("17"), Ok(Some(("u".into(), "phone".into(), 17))));
        for malformed in ["", "soon", "-1", "18446744073709551616", "1.5"] {
            assert_eq!(
                at(malformed),
                Err(PeerInputError::BadNumber("replacement time")),
                "{malformed:?}"
            );
        }
        // A time in the far future is cut back to about now.
        let (_, _, at_ms) = at("18446744073709551615").unwrap().unwrap();
        assert!(at_ms <= crate::world::now_ms() + peer_input::MAX_PEER_CLOCK_AHEAD_MS);
        let own = encode_user_command("b", "u", "phone", "17");
        assert_eq!(decode_replace(own.as_bytes(), "b"), Ok(None), "this node's own announcement");
    }

    #[test]
    fn a_move_names_its_sender_as_the_taking_node_and_refuses_a_malformed_time() {
        let at =
            |extra: &str| decode_moved(encode_user_command("a", "u", "", extra).as_bytes(), "b");
        assert_eq!(at("17"), Ok(Some(("u".into(), "a".into(), 17))));
        for malformed in ["", "soon", "-1", "1.5"] {
            assert_eq!(at(malformed), Err(PeerInputError::BadNumber("move time")), "{malformed:?}");
        }
        let (_, _, at_ms) = at("18446744073709551615").unwrap().unwrap();
        assert!(at_ms <= crate::world::now_ms() + peer_input::MAX_PEER_CLOCK_AHEAD_MS);
        assert_eq!(
            decode_moved(encode_user_command("b", "u", "", "17").as_bytes(), "b"),
            Ok(None),
            "this node's own"
        );
        assert!(
            decode_moved(encode_user_command("a b", "u", "", "17").as_bytes(), "b").is_err(),
            "a bad node name"
        );
    }
}
