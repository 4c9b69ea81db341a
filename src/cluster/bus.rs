//! The node's NATS listeners, each a task that turns messages into calls of
//! [`NodeEvents`]: heartbeats and goodbyes, exclusive-device
//! announcements, kick requests (answered with the count) and publishes forwarded to this
//! node as a room's writer (at most [`MAX_FORWARDS_RUNNING`] at once). A maintenance
//! loop reports NATS coming back and replays queued directory writes. Every task is
//! owned by the [`Tasks`] `listen` returns. The wiring implements [`NodeEvents`] over the
//! actors; this module knows none of them.

use std::collections::HashSet;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;

use super::kv::KvSessions;
use super::{decode_node, Cluster, ClusterError, HEARTBEAT_SUBJECT, KICK_SUBJECT, LEAVE_SUBJECT, REPLACE_SUBJECT};
use crate::core::heartbeats::NodeInfo;
use crate::core::rebalance::Order;
use crate::tasks::Tasks;

/// What this node does with what the other nodes send it. Rooms' live events are not
/// here: each room watches its own ([`super::roomlog::watch`]).
pub trait NodeEvents: Clone + 'static {
    fn peer_heard(&self, peer: NodeInfo);
    fn peer_left(&self, node: String);
    /// Another node connected `user` on exclusive `device` at `at_ms`.
    fn replaced(&self, user: String, device: String, at_ms: u64);
    /// Close `user`'s connections here (on `device` when named); yields how many closed.
    /// `at_ms`: when the kick was made on the node that asked.
    fn kick(&self, user: String, device: Option<String>, at_ms: u64) -> LocalBoxFuture<'static, usize>;
    /// Append a publish forwarded to this node as the room's writer. An error is sent
    /// back as its text (the forwarding node reads it as a [`WriterRefusal`]).
    fn publish(&self, publish: ForwardedPublish) -> LocalBoxFuture<'static, Result<Appended, Box<dyn std::error::Error>>>;
    /// NATS is back after an outage: rooms re-read their streams.
    fn reconnected(&self);
    /// Another node planned a rebalance in which this node hands connections over.
    fn rebalance(&self, order: Order);
}

/// A publish another node forwarded to this one, the room's writer.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardedPublish {
    pub room: String,
    pub id: String,
    pub data: String,
    pub devices: Option<Vec<String>>,
    /// The publishing connection's user (client publish).
    pub from: Option<String>,
    /// The room's state as of the event (DESIGN §9).
    pub state: Option<String>,
    /// Not an event but a `PUT` of the room's state (`data`), as of the writer's head.
    pub put_state: bool,
}

/// An event to forward to the room's writer ([`forward_publish`]).
#[derive(Debug, Clone, Copy)]
pub struct ForwardEvent<'a> {
    pub id: &'a str,
    pub data: &'a str,
    pub devices: Option<&'a [String]>,
    pub from: Option<&'a str>,
    pub state: Option<&'a str>,
}

/// The writer's answer to a forwarded publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Appended {
    pub seq: u64,
    pub epoch: String,
    pub duplicate: bool,
}

/// How often the maintenance loop looks at the connection and the directory queue.
const MAINTENANCE_EVERY: Duration = Duration::from_millis(500);
/// Longest a forwarded publish waits for the writer's answer.
const FORWARD_WAIT: Duration = Duration::from_secs(5);
/// Longest a kick waits for the other nodes' counts (each waits up to 10 s for its closes).
const KICK_ANSWER_WAIT: Duration = Duration::from_secs(12);
/// How often a kick waiting for answers asks which peers are still alive.
const KICK_LIVENESS_RECHECK: Duration = Duration::from_millis(250);
/// Publishes forwarded to this node appended at once; more wait in the subscription's
/// queue (async-nats holds 65,536, then drops and counts a slow consumer; the forwarding
/// node then appends itself after [`FORWARD_WAIT`]).
pub const MAX_FORWARDS_RUNNING: usize = 256;
/// Other nodes' kicks carried out at once (each waits up to 10 s for its closes); more
/// wait in the subscription's queue, as forwarded publishes do.
pub const MAX_KICKS_RUNNING: usize = 64;

/// Subscribe to everything this node listens to and spawn the listening tasks on the
/// current (actix) runtime, owned by the returned [`Tasks`]. Subscriptions are made
/// before returning, so nothing published after `listen` returns is missed. On the
/// owner's stop, forwarded publishes and kicks already taken are still answered.
pub async fn listen(cluster: &Cluster, events: impl NodeEvents, sessions: KvSessions) -> Result<Tasks, ClusterError> {
    let client = &cluster.client;
    let mut tasks = Tasks::default();
    let mut beats = client.subscribe(HEARTBEAT_SUBJECT).await?;
    let mut leaves = client.subscribe(LEAVE_SUBJECT).await?;
    let mut replaces = client.subscribe(REPLACE_SUBJECT).await?;
    let kicks = client.subscribe(KICK_SUBJECT).await?;
    let forwarded = client.subscribe(publish_subject(&cluster.node)).await?;
    let mut orders = client.subscribe(rebalance_subject(&cluster.node)).await?;
    let (order_events, order_client) = (events.clone(), client.clone());
    tasks.spawn(async move {
        while let Some(message) = orders.next().await {
            let order = decode_order(&message.payload);
            let answer = if order.is_some() { "ok" } else { "malformed" };
            if let Some(order) = order {
                order_events.rebalance(order);
            }
            if let Some(reply) = message.reply {
                let _ = order_client.publish(reply, answer.into()).await;
            }
        }
    });
    let (publish_events, publish_client) = (events.clone(), client.clone());
    tasks.spawn_with_stop(|stop| {
        forwarded.take_until(stop.requested()).for_each_concurrent(MAX_FORWARDS_RUNNING, move |message| {
            let (events, client) = (publish_events.clone(), publish_client.clone());
            async move {
                let Some(reply) = message.reply.clone() else { return };
                let answer = match decode_forward(&message) {
                    Some(publish) => events.publish(publish).await,
                    None => Err(MalformedForward.into()),
                };
                let _ = client.publish_with_headers(reply, encode_answer(&answer), Vec::<u8>::new().into()).await;
            }
        })
    });
    let beat_events = events.clone();
    tasks.spawn(async move {
        while let Some(message) = beats.next().await {
            if let Some(mut info) = decode_node(&message.payload) {
                info.connections = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(super::CONNECTIONS_HEADER))
                    .and_then(|v| v.as_str().parse().ok());
                beat_events.peer_heard(info);
            }
        }
    });
    let leave_events = events.clone();
    tasks.spawn(async move {
        while let Some(message) = leaves.next().await {
            leave_events.peer_left(String::from_utf8_lossy(&message.payload).into_owned());
        }
    });
    let (me, replace_events) = (cluster.node.clone(), events.clone());
    tasks.spawn(async move {
        while let Some(message) = replaces.next().await {
            if let Some((user, device, at_ms)) = decode_replace(&message.payload, &me) {
                replace_events.replaced(user, device, at_ms);
            }
        }
    });
    let (me, kick_client, kick_events) = (cluster.node.clone(), client.clone(), events.clone());
    tasks.spawn_with_stop(|stop| {
        kicks.take_until(stop.requested()).for_each_concurrent(MAX_KICKS_RUNNING, move |message| {
            let (events, client, me) = (kick_events.clone(), kick_client.clone(), me.clone());
            async move {
                let Some((node, user, device, at_ms)) = decode_user_command(&message.payload) else { return };
                let Some(reply) = message.reply else { return };
                if node == me {
                    return;
                }
                let device = (!device.is_empty()).then_some(device);
                // A node of a build before kicks carried their time sends none: now is
                // the nearest to it.
                let at_ms = at_ms.parse().unwrap_or_else(|_| crate::world::now_ms());
                let closed = events.kick(user, device, at_ms).await;
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
                tracing::info!("NATS is back: rooms re-read their streams, queued directory writes replay");
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
    format!("lg.node.{}.rebalance", super::room_token(node))
}

/// Longest a rebalance order waits for the shedding node's acknowledgement.
const ORDER_WAIT: Duration = Duration::from_secs(2);

/// `id\nto\nto_url\nconnections\nper_second` (names, ids and URLs hold no newline).
fn encode_order(order: &Order) -> String {
    format!("{}\n{}\n{}\n{}\n{}", order.id, order.to, order.to_url, order.connections, order.per_second)
}

fn decode_order(body: &[u8]) -> Option<Order> {
    let text = std::str::from_utf8(body).ok()?;
    let mut parts = text.split('\n');
    let order = Order {
        id: parts.next()?.into(),
        to: parts.next()?.into(),
        to_url: parts.next()?.into(),
        connections: parts.next()?.parse().ok()?,
        per_second: parts.next()?.parse().ok()?,
    };
    (parts.next().is_none() && !order.to.is_empty()).then_some(order)
}

/// Give `node` its part of a rebalance; `Ok` once it acknowledged the order.
pub async fn send_order(cluster: &Cluster, node: &str, order: &Order) -> Result<(), ForwardError> {
    let request = async_nats::Request::new().payload(encode_order(order).into()).timeout(Some(ORDER_WAIT));
    let answer = cluster.client.send_request(rebalance_subject(node), request).await?;
    match &answer.payload[..] {
        b"ok" => Ok(()),
        _ => Err(ForwardError::Malformed("ok")),
    }
}

/// Where a node takes publishes forwarded to it as a room's writer.
fn publish_subject(node: &str) -> String {
    format!("lg.node.{}.publish", super::room_token(node))
}

fn decode_forward(message: &async_nats::Message) -> Option<ForwardedPublish> {
    let headers = message.headers.as_ref()?;
    let text = |name: &str| headers.get(name).map(|v| v.as_str().to_string());
    let devices = text("Lg-Devices").map(|d| d.split(',').map(str::to_string).collect());
    // As on the stream: a state rides after the event's JSON, `Lg-State-Len` bytes long.
    let payload = String::from_utf8(message.payload.to_vec()).ok()?;
    let (data, state) = match text("Lg-State-Len") {
        Some(len) => {
            let at = payload.len().checked_sub(len.parse().ok()?)?;
            (payload.get(..at)?.to_string(), Some(payload.get(at..)?.to_string()))
        }
        None => (payload, None),
    };
    let put_state = text("Lg-Put-State").as_deref() == Some("1");
    let id = if put_state { String::new() } else { text("Lg-Id")? };
    Some(ForwardedPublish { room: text("Lg-Room")?, id, data, devices, from: text("Lg-From"), state, put_state })
}

/// A forwarded publish this node could not read (not from a livegate node).
#[derive(Debug, thiserror::Error)]
#[error("malformed forwarded publish")]
struct MalformedForward;

fn encode_answer(answer: &Result<Appended, Box<dyn std::error::Error>>) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    match answer {
        Ok(published) => {
            headers.insert("Lg-Seq", published.seq.to_string().as_str());
            headers.insert("Lg-Epoch", &*published.epoch);
            headers.insert("Lg-Duplicate", if published.duplicate { "1" } else { "0" });
        }
        Err(error) => headers.insert("Lg-Error", error.to_string().replace(['\r', '\n'], " ").as_str()),
    }
    headers
}

/// Why a forwarded publish did not happen on the writer.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The writer could not be reached (gone, or NATS is away): publish here instead.
    #[error("room writer unreachable: {0}")]
    Unreachable(#[from] async_nats::RequestError),
    /// An answer without the named header is no livegate writer's: as unreachable.
    #[error("room writer unreachable: answer without {0}")]
    Malformed(&'static str),
    /// The writer tried and failed.
    #[error("room writer refused: {0}")]
    Refused(#[source] WriterRefusal),
}

/// A room writer's reason for failing a forwarded publish, as it sent it: the error
/// was typed on the writer and crosses NATS as its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WriterRefusal(pub String);

/// Have `writer` publish the event, as the one node that appends to `room`.
pub async fn forward_publish(cluster: &Cluster, writer: &str, room: &str, event: ForwardEvent<'_>) -> Result<Appended, ForwardError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Lg-Room", room);
    headers.insert("Lg-Id", event.id);
    if let Some(from) = event.from {
        headers.insert("Lg-From", from);
    }
    if let Some(devices) = event.devices {
        headers.insert("Lg-Devices", devices.join(",").as_str());
    }
    let payload = match event.state {
        Some(state) => {
            headers.insert("Lg-State-Len", state.len().to_string().as_str());
            [event.data, state].concat()
        }
        None => event.data.to_string(),
    };
    request_writer(cluster, writer, headers, payload).await
}

/// Have `writer` set the room's state as of its head (`PUT /v1/rooms/{room}/state`).
pub async fn forward_put_state(cluster: &Cluster, writer: &str, room: &str, data: &str) -> Result<Appended, ForwardError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Lg-Room", room);
    headers.insert("Lg-Put-State", "1");
    request_writer(cluster, writer, headers, data.to_string()).await
}

async fn request_writer(
    cluster: &Cluster,
    writer: &str,
    headers: async_nats::HeaderMap,
    payload: String,
) -> Result<Appended, ForwardError> {
    let request = async_nats::Request::new().headers(headers).payload(payload.into()).timeout(Some(FORWARD_WAIT));
    let answer = cluster.client.send_request(publish_subject(writer), request).await?;
    let headers = answer.headers.ok_or(ForwardError::Malformed("headers"))?;
    let text = |name: &str| headers.get(name).map(|v| v.as_str().to_string());
    if let Some(error) = text("Lg-Error") {
        return Err(ForwardError::Refused(WriterRefusal(error)));
    }
    let seq = text("Lg-Seq").and_then(|s| s.parse().ok()).ok_or(ForwardError::Malformed("seq"))?;
    let epoch = text("Lg-Epoch").ok_or(ForwardError::Malformed("epoch"))?;
    Ok(Appended { seq, epoch, duplicate: text("Lg-Duplicate").as_deref() == Some("1") })
}

/// `node\nuser\ndevice\nextra`: user and device names hold no newline.
fn encode_user_command(node: &str, user: &str, device: &str, extra: &str) -> String {
    format!("{node}\n{user}\n{device}\n{extra}")
}

fn decode_user_command(body: &[u8]) -> Option<(String, String, String, String)> {
    let text = std::str::from_utf8(body).ok()?;
    let mut parts = text.splitn(4, '\n');
    Some((parts.next()?.into(), parts.next()?.into(), parts.next()?.into(), parts.next()?.into()))
}

/// Another node's replacement announcement: `(user, device, at_ms)`, or `None` for this
/// node's own and for one that does not decode. A malformed time is ignored with a
/// warning: read as "always", it would replace every connection of the device.
fn decode_replace(body: &[u8], me: &str) -> Option<(String, String, u64)> {
    let (node, user, device, at_ms) = decode_user_command(body)?;
    if node == me {
        return None;
    }
    match at_ms.parse() {
        Ok(at_ms) => Some((user, device, at_ms)),
        Err(_) => {
            tracing::warn!(node, user, device, at_ms, "ignoring a replacement with a malformed time");
            None
        }
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
    let mut closed = 0;
    let deadline = actix_web::rt::time::sleep(KICK_ANSWER_WAIT);
    tokio::pin!(deadline);
    // The peers were just read: the first recheck is one period away, not at once.
    let first_recheck = actix_web::rt::time::Instant::now() + KICK_LIVENESS_RECHECK;
    let mut recheck = actix_web::rt::time::interval_at(first_recheck, KICK_LIVENESS_RECHECK);
    while !waiting_for.is_empty() {
        tokio::select! {
            answer = answers.next() => match answer.as_ref().and_then(|m| decode_kick_answer(&m.payload)) {
                Some((node, count)) => {
                    waiting_for.remove(&node);
                    closed += count;
                }
                None if answer.is_none() => break,
                None => tracing::debug!(user, "kick: ignoring a malformed answer"),
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

fn decode_kick_answer(payload: &[u8]) -> Option<(String, usize)> {
    let (node, closed) = std::str::from_utf8(payload).ok()?.split_once('\n')?;
    Some((node.to_string(), closed.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebalance_orders_round_trip() {
        let order = Order { id: "r1".into(), to: "c".into(), to_url: "http://c:7070".into(), connections: 12, per_second: 5 };
        assert_eq!(decode_order(encode_order(&order).as_bytes()), Some(order));
        for junk in ["", "r1\nc\nu\n12", "r1\nc\nu\nx\n5", "r1\n\nu\n1\n5", "r1\nc\nu\n1\n5\nmore"] {
            assert_eq!(decode_order(junk.as_bytes()), None, "{junk:?}");
        }
    }

    #[test]
    fn user_commands_round_trip() {
        let body = encode_user_command("a", "u@x", "phone", "17");
        assert_eq!(decode_user_command(body.as_bytes()), Some(("a".into(), "u@x".into(), "phone".into(), "17".into())));
        assert_eq!(decode_user_command(b"a\nb"), None);
        assert_eq!(decode_kick_answer(encode_kick_answer("b", 3).as_bytes()), Some(("b".into(), 3)));
        assert_eq!(decode_kick_answer(b"3"), None);
    }

    #[test]
    fn a_replacement_with_a_malformed_time_is_ignored_not_read_as_always() {
        let at = |extra: &str| decode_replace(encode_user_command("a", "u", "phone", extra).as_bytes(), "b");
        assert_eq!(at("17"), Some(("u".into(), "phone".into(), 17)));
        for malformed in ["", "soon", "-1", "18446744073709551616", "1.5"] {
            assert_eq!(at(malformed), None, "{malformed:?}");
        }
        let own = encode_user_command("b", "u", "phone", "17");
        assert_eq!(decode_replace(own.as_bytes(), "b"), None, "this node's own announcement");
    }
}
