//! Interest-based fan-out (issue 33): a node takes a room's live events from NATS only
//! while it has subscribers in the room (and a few seconds after the last one left), as
//! `livegate_cluster_live_copies_total` counts on each node. Measured here on three nodes:
//!
//! 1. subscribers on the room's writer only, publishes through the two other nodes: those
//!    two receive none of the room's events;
//! 2. a subscriber joins on a second node, recovering with `since`: that node takes the
//!    events from then on, the third still none;
//! 3. every subscriber leaves: after the linger no node takes any copy, not even the
//!    writer (which appends the events itself);
//! 4. a subscriber comes back to the node whose room dropped its feed, with `since` from
//!    before what it missed: the room takes its feed again and reads what it missed
//!    first, so the replay and the history are complete, and live events follow.
//!
//! And a room that has its feed can still be behind a client: the live copy of an event
//! may be on its way to the node while the client, which got it elsewhere, subscribes
//! there with that event's seq. The room reads what the stream holds before answering.

use super::*;
use common::link::{Condition, Link};
use livegate::core::delivery::interest::FEED_LINGER;

const COPIES: &str = "livegate_cluster_live_copies_total";

/// Each node's live copies so far.
fn copies<N: Nats>(cluster: &Cluster<N>) -> Vec<f64> {
    (0..cluster.len()).map(|i| cluster.http(i).metric_total(COPIES)).collect()
}

/// Publishes events `from..=to` through the nodes `via`, in turn; each must be
/// acknowledged with its seq.
fn publish_range<N: Nats>(
    cluster: &Cluster<N>,
    room: &str,
    from: u64,
    to: u64,
    via: &[usize],
    failures: &mut Vec<String>,
) {
    for n in from..=to {
        let node = via[n as usize % via.len()];
        let (status, reply) =
            cluster.http(node).publish(room, Some(&format!("interest-{n}")), json!({ "n": n }));
        if status != 201 || reply["seq"] != n {
            failures.push(format!("publish {n} through {}: {status} {reply}", Cluster::name(node)));
        }
    }
}

/// A room node a writes (named `prefix:k`), so the other nodes only forward its publishes.
fn room_of_a(prefix: &str, names: &[&str]) -> String {
    (0..)
        .map(|k| format!("{prefix}:{k}"))
        .find(|room| livegate::core::nodes::routing::room_writer(room, names) == Some(names[0]))
        .expect("some room is a's")
}

/// A WebSocket client of `user` on node `node`.
fn connect<N: Nats>(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster<N>,
    node: usize,
    user: &str,
) -> WsClient {
    let (token, addr) = (cluster.http(node).mint_token(user, "web"), cluster.addr(node));
    rt.block_on(WsClient::connect(addr, &token, None))
}

/// Checks that `ws` gets exactly events `from..=to` of `room`, in order.
fn expect_events(
    rt: &tokio::runtime::Runtime,
    ws: &mut WsClient,
    who: &str,
    room: &str,
    from: u64,
    to: u64,
    failures: &mut Vec<String>,
) {
    let want: Vec<u64> = (from..=to).collect();
    let (got, other) = rt.block_on(collect_events(ws, room, want.len(), Duration::from_secs(15)));
    if seqs(&got) != want {
        failures.push(format!("{who}: expected seqs {from}..={to}, got {:?}", seqs(&got)));
    }
    failures.extend(other.into_iter().map(|o| format!("{who}: {o}")));
}

#[test]
fn a_node_takes_a_rooms_events_only_while_it_has_subscribers_there() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    let mut failures = Vec::new();
    let names: Vec<&str> = (0..3).map(Cluster::name).collect();
    let room = room_of_a("interest", &names);
    let subscriber = |node: usize, user: &str| connect(&rt, &cluster, node, user);

    // 1. Subscribers on the writer only.
    let mut on_a = subscriber(0, "interest-a");
    let epoch = rt.block_on(on_a.subscribe_ok(&room))["epoch"].clone();
    let before = copies(&cluster);
    publish_range(&cluster, &room, 1, 100, &[1, 2], &mut failures);
    expect_events(&rt, &mut on_a, "the subscriber on a", &room, 1, 100, &mut failures);
    let after_one = copies(&cluster);
    for node in [1, 2] {
        if after_one[node] != before[node] {
            failures.push(format!(
                "{} has no subscriber in {room} and took {} live copies",
                names[node],
                after_one[node] - before[node]
            ));
        }
    }
    if after_one[0] - before[0] < 100.0 {
        failures.push(format!(
            "a has the subscribers and counted {} live copies of 100 events",
            after_one[0] - before[0]
        ));
    }

    // 2. A subscriber on b, recovering from 100.
    let mut on_b = subscriber(1, "interest-b");
    let reply = rt.block_on(on_b.subscribe_since(&room, 100, &epoch));
    if reply["op"] != "subscribed" || reply["recovered"] != true {
        failures.push(format!("b's subscribe since 100: {reply}"));
    }
    publish_range(&cluster, &room, 101, 120, &[2], &mut failures);
    expect_events(&rt, &mut on_a, "the subscriber on a", &room, 101, 120, &mut failures);
    expect_events(&rt, &mut on_b, "the subscriber on b", &room, 101, 120, &mut failures);
    let after_two = copies(&cluster);
    if after_two[2] != before[2] {
        failures.push(format!(
            "c has no subscriber in {room} and took {} live copies",
            after_two[2] - before[2]
        ));
    }
    if after_two[1] - after_one[1] < 20.0 {
        failures.push(format!(
            "b subscribed and counted {} live copies of 20 events",
            after_two[1] - after_one[1]
        ));
    }

    // 3. Everyone leaves; after the linger nobody takes a copy.
    for (ws, who) in [(&mut on_a, "a"), (&mut on_b, "b")] {
        let reply = rt.block_on(ws.unsubscribe(&room));
        if reply["op"] != "unsubscribed" {
            failures.push(format!("unsubscribe on {who}: {reply}"));
        }
    }
    common::pace(FEED_LINGER + Duration::from_secs(1), "every room's feed lingers, then goes");
    let idle = copies(&cluster);
    publish_range(&cluster, &room, 121, 150, &[1, 2], &mut failures);
    let after_three = copies(&cluster);
    for node in 0..3 {
        if after_three[node] != idle[node] {
            failures.push(format!(
                "{} took {} live copies of {room} with no subscriber there for {FEED_LINGER:?}",
                names[node],
                after_three[node] - idle[node]
            ));
        }
    }

    // 4. Back on b (whose room actor is still live, without its feed), from 120.
    let reply = rt.block_on(on_b.subscribe_since(&room, 120, &epoch));
    if reply["op"] != "subscribed" || reply["recovered"] != true {
        failures.push(format!("b's subscribe since 120 after the feed went: {reply}"));
    }
    expect_events(&rt, &mut on_b, "the subscriber back on b", &room, 121, 150, &mut failures);
    let page = cluster.http(1).history_ok(&room, Some(140), None);
    let history: Vec<u64> = page["events"]
        .as_array()
        .map(|events| events.iter().map(seq_of).collect())
        .unwrap_or_default();
    if history != (141..=150).collect::<Vec<_>>() || page["head"] != 150 {
        failures.push(format!(
            "history of {room} on b since 140: head {}, seqs {history:?}",
            page["head"]
        ));
    }
    publish_range(&cluster, &room, 151, 155, &[2], &mut failures);
    expect_events(&rt, &mut on_b, "the subscriber back on b", &room, 151, 155, &mut failures);
    let last = copies(&cluster);
    eprintln!(
        "interest: live copies per node (a, b, c) taken for 155 events of a room a writes: {:?}; \
         with subscribers on a only: b {} and c {}; with no subscriber anywhere: {:?}",
        (0..3).map(|i| last[i] - before[i]).collect::<Vec<_>>(),
        after_one[1] - before[1],
        after_one[2] - before[2],
        (0..3).map(|i| after_three[i] - idle[i]).collect::<Vec<_>>(),
    );
    fail_with_logs(&cluster, "interest-based fan-out", &failures, &["WARN", "ERROR"]);
}

/// A user's inbox on a node that only parks it (no actor, no feed until something comes):
/// messages published through another node reach the user, also after the inbox's actor
/// went idle and parked the user again (its watch starts from the actor's head).
#[test]
fn a_parked_inbox_on_one_node_gets_messages_published_through_another() {
    let _gate = crate::common::gate!();
    let mut flags = SHORT_DRAIN.to_vec();
    flags.extend(["--room-idle-secs", "1"]);
    let cluster = Cluster::start(3, &flags);
    let rt = runtime();
    let mut failures = Vec::new();
    let names: Vec<&str> = (0..3).map(Cluster::name).collect();
    // A user whose inbox a writes, connected to c.
    let user = (0..)
        .map(|k| format!("parked-{k}"))
        .find(|user| {
            livegate::core::nodes::routing::room_writer(&format!("user:{user}"), &names)
                == Some(names[0])
        })
        .expect("some inbox is a's");
    let inbox = format!("user:{user}");
    let token = cluster.http(2).mint_token(&user, "web");
    let mut on_c = rt.block_on(WsClient::connect(cluster.addr(2), &token, None));
    rt.block_on(on_c.wait_inbox_subscribed(Duration::from_secs(5)));
    let message = |n: u64, via: usize, failures: &mut Vec<String>| {
        let body = json!({ "id": format!("parked-{n}"), "data": { "n": n } });
        let (status, reply) = cluster.http(via).request(
            "POST",
            &format!("/v1/rooms/{inbox}/events"),
            Auth::Key,
            Body::Json(body),
        );
        if status != 201 || reply["seq"] != n {
            failures.push(format!("message {n} through {}: {status} {reply}", names[via]));
        }
    };
    for n in 1..=3 {
        message(n, 1, &mut failures);
    }
    expect_events(&rt, &mut on_c, "the parked user on c", &inbox, 1, 3, &mut failures);
    // The inbox's actor on c stops idle after a second and parks the user again.
    let mut status = Value::Null;
    let parked =
        common::wait_until_every(Duration::from_secs(15), Duration::from_millis(100), || {
            status = cluster.http(2).request("GET", "/v1/admin/status", Auth::Key, Body::None).1;
            status["rooms_live"] == 0 && status["rooms_parked"] == 1
        });
    if !parked {
        failures.push(format!("c did not park the inbox again within 15 s: {status}"));
    }
    for n in 4..=5 {
        message(n, 1, &mut failures);
    }
    expect_events(&rt, &mut on_c, "the user parked again on c", &inbox, 4, 5, &mut failures);
    fail_with_logs(&cluster, "a parked inbox across nodes", &failures, &["WARN", "ERROR"]);
}

/// Node b's link to NATS carries 300 ms more each way, so its room learns each event 300
/// ms after a, the room's writer, stored it. A client that got event 6 on a and subscribes
/// on b with `since` 6 meanwhile is answered `recovered:true` at head 6 (b read the stream
/// first), and never gets event 6 a second time when b's live copy arrives; b's own
/// subscriber gets every event once.
#[test]
fn a_subscriber_ahead_of_a_rooms_live_copies_is_answered_after_the_room_reads_the_stream() {
    let _gate = crate::common::gate!();
    let link = Link::start();
    let cluster =
        Cluster::start_replicated_with(3, &SHORT_DRAIN, &["--no_advertise"], |i, servers| {
            (i == 1).then(|| link.proxy_urls(&servers.urls()))
        });
    let rt = runtime();
    let mut failures = Vec::new();
    let names: Vec<&str> = (0..3).map(Cluster::name).collect();
    let room = room_of_a("ahead", &names);
    let subscriber = |node: usize, user: &str| connect(&rt, &cluster, node, user);
    let mut watcher = subscriber(1, "ahead-watcher");
    let epoch = rt.block_on(watcher.subscribe_ok(&room))["epoch"].clone();
    publish_range(&cluster, &room, 1, 5, &[0], &mut failures);
    expect_events(&rt, &mut watcher, "b's subscriber", &room, 1, 5, &mut failures);

    // Connected before the link slows down: its handshake writes the session directory.
    let mut mover = subscriber(1, "ahead-mover");
    link.set(Condition::Degraded { one_way: Duration::from_millis(300), loss: 0.0 });
    publish_range(&cluster, &room, 6, 6, &[0], &mut failures);
    let reply = rt.block_on(mover.subscribe_since(&room, 6, &epoch));
    if reply["op"] != "subscribed" || reply["recovered"] != true || reply["seq"] != 6 {
        failures.push(format!("subscribe on b since 6 while b's copy of 6 was on its way: {reply}, expected recovered at seq 6"));
    }
    link.set(Condition::Up);
    publish_range(&cluster, &room, 7, 8, &[0], &mut failures);
    expect_events(&rt, &mut mover, "the client that had 6 already", &room, 7, 8, &mut failures);
    expect_events(&rt, &mut watcher, "b's subscriber", &room, 6, 8, &mut failures);
    fail_with_logs(
        &cluster,
        "a subscriber ahead of the room's live copies",
        &failures,
        &LOG_NEEDLES,
    );
}
