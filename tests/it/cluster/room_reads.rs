//! A room's reads of its stream run beside its mailbox (issue 46, hole 1): while a room
//! reads what it needs (its live feed again, what a subscriber ahead of it missed), it
//! holds only the requests that wait for that read and goes on serving the others. Each
//! test puts a latency between the node and its nats-server (`common::link`) and measures
//! a victim beside the request that makes the room read:
//!
//! - a flood of subscribes whose `since` is far beyond the head (a client may send one
//!   as often as its message rate allows) costs the room no read at all: a backend's
//!   sequential publishes to the same room keep their rate and their p99;
//! - a subscriber coming back to a room whose live feed was dropped makes it subscribe
//!   and read again (three round trips): a publish and a presence read of the same room
//!   meanwhile are answered in their own time, not after the read.

use super::*;
use common::link::{Condition, Link};
use livegate::core::delivery::interest::FEED_LINGER;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A victim's sequential publishes for `span`: how many were acknowledged, and their p99.
struct Rate {
    acknowledged: usize,
    p99: Duration,
}

fn publish_for(http: &Http, room: &str, span: Duration, failures: &mut Vec<String>) -> Rate {
    let (start, mut latencies) = (Instant::now(), Vec::new());
    while start.elapsed() < span {
        let sent = Instant::now();
        let (status, reply) = http.publish(room, None, json!({ "victim": true }));
        if status != 201 {
            failures.push(format!("a victim's publish: {status} {reply}"));
            break;
        }
        latencies.push(sent.elapsed());
    }
    latencies.sort();
    let p99 =
        latencies.get(latencies.len().saturating_sub(1) * 99 / 100).copied().unwrap_or_default();
    Rate { acknowledged: latencies.len(), p99 }
}

/// `connections` clients of one user each send `{"op":"subscribe","room":room,"since":
/// 10^12}` 80 times a second (under the per-connection message rate) until `stop`;
/// `sent` counts the subscribes.
fn flood(
    addr: SocketAddr,
    tokens: Vec<String>,
    room: String,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let mut tasks = Vec::new();
            for token in tokens {
                let (room, stop, sent) = (room.clone(), stop.clone(), sent.clone());
                tasks.push(tokio::spawn(async move {
                    let mut ws = WsClient::connect(addr, &token, None).await;
                    let mut tick = tokio::time::interval(Duration::from_micros(12_500));
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        ws.send_json(&json!({ "op": "subscribe", "room": room, "since": 1_000_000_000_000u64 })).await;
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
            for task in tasks {
                let _ = task.await;
            }
        })
    })
}

/// The attack of the issue: 20 connections subscribe with `since` 10^12 to the room a
/// backend publishes to, over a NATS hop of 0.5 ms each way. Before the fix every such
/// subscribe read the stream with the room's mailbox held: the victim's publishes fell
/// from about 700 in 3 s to 1 (p99 8 s). Now such a subscriber is held, not the room,
/// and nothing is read for it: the rate stays within 50 % and the p99 within 10× of the
/// same victim's without the flood.
#[test]
fn a_flood_of_subscribes_beyond_the_head_leaves_the_rooms_publishes_alone() {
    let _gate = crate::common::gate!();
    let link = Link::start();
    let cluster = Cluster::start_linked(1, &SHORT_DRAIN, &link);
    link.set(Condition::Degraded { one_way: Duration::from_micros(500), loss: 0.0 });
    let rt = runtime();
    let mut failures = Vec::new();
    let (http, room) = (cluster.http(0), "reads:flood".to_string());
    let mut watcher = rt.block_on(WsClient::connect(
        cluster.addr(0),
        &http.mint_token("reads-watcher", "web"),
        None,
    ));
    rt.block_on(watcher.subscribe_ok(&room));
    let span = Duration::from_secs(3);
    let calm_before = publish_for(&http, &room, span, &mut failures);

    let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let tokens = (0..20).map(|i| http.mint_token(&format!("reads-attacker-{i}"), "web")).collect();
    let attack = flood(cluster.addr(0), tokens, room.clone(), stop.clone(), sent.clone());
    // The flood is on once every connection sends.
    if !wait_until(Duration::from_secs(10), || sent.load(Ordering::Relaxed) >= 200) {
        failures.push("the flood did not start".into());
    }
    let from = sent.load(Ordering::Relaxed);
    let flooded = publish_for(&http, &room, span, &mut failures);
    let during = sent.load(Ordering::Relaxed) - from;
    stop.store(true, Ordering::Relaxed);
    attack.join().expect("the flood's thread");
    let calm_after = publish_for(&http, &room, span, &mut failures);

    let calm = Rate {
        acknowledged: (calm_before.acknowledged + calm_after.acknowledged) / 2,
        p99: calm_before.p99.max(calm_after.p99),
    };
    println!(
        "victim's publishes in {span:?}: {} calm (p99 {:?}), {} under {during} subscribes beyond the head (p99 {:?})",
        calm.acknowledged, calm.p99, flooded.acknowledged, flooded.p99
    );
    if during < 1_000 {
        failures
            .push(format!("the flood sent only {during} subscribes while the victim published"));
    }
    if flooded.acknowledged * 2 < calm.acknowledged {
        failures.push(format!(
            "the victim's rate fell from {} to {} under the flood",
            calm.acknowledged, flooded.acknowledged
        ));
    }
    if flooded.p99 > (calm.p99 * 10).max(Duration::from_millis(50)) {
        failures.push(format!(
            "the victim's p99 rose from {:?} to {:?} under the flood",
            calm.p99, flooded.p99
        ));
    }
    // Nothing was lost to the watcher: every publish arrived, in order.
    let total = (calm_before.acknowledged + flooded.acknowledged + calm_after.acknowledged) as u64;
    let (got, other) =
        rt.block_on(collect_events(&mut watcher, &room, total as usize, Duration::from_secs(20)));
    if seqs(&got) != (1..=total).collect::<Vec<_>>() {
        failures.push(format!("the watcher got {} events, not 1..={total} in order", got.len()));
    }
    failures.extend(other);
    fail_with_logs(
        &cluster,
        "a flood of subscribes beyond the head",
        &failures,
        &["WARN", "ERROR"],
    );
}

/// A room whose feed was dropped (no subscriber for [`FEED_LINGER`]) takes it again when
/// a subscriber comes: subscribe, read what it missed, read its state record, three
/// round trips of 300 ms over this link. Before the fix the room's mailbox was held
/// meanwhile: a publish to it took 910 ms and a presence read 608 ms. Now they are
/// served beside the read: the presence read at once, the publish in its own round trip.
#[test]
fn a_room_taking_its_feed_again_still_answers_its_publishes_and_reads() {
    let _gate = crate::common::gate!();
    let link = Link::start();
    let cluster = Cluster::start_linked(1, &SHORT_DRAIN, &link);
    let rt = runtime();
    let mut failures = Vec::new();
    let (http, room) = (cluster.http(0), "reads:refeed".to_string());
    let mut first = rt.block_on(WsClient::connect(
        cluster.addr(0),
        &http.mint_token("refeed-first", "web"),
        None,
    ));
    let epoch = rt.block_on(first.subscribe_ok(&room))["epoch"].clone();
    http.publish_ok(&room, Some("refeed-1"), json!({ "n": 1 }));
    let _ = rt.block_on(first.unsubscribe(&room));
    drop(first);
    // The second subscriber connects now: its handshake writes the session directory,
    // which would take round trips over the slow link.
    let mut second = rt.block_on(WsClient::connect(
        cluster.addr(0),
        &http.mint_token("refeed-second", "web"),
        None,
    ));
    // The room drops its feed once it has had no subscriber for the linger: a publish
    // then reaches the room's writer with no live copy of it coming back.
    let_time_pass(FEED_LINGER + Duration::from_secs(2), "the room's live feed linger");
    let copies = || http.metric_total("livegate_cluster_live_copies_total");
    let before = copies();
    http.publish_ok(&room, Some("refeed-2"), json!({ "n": 2 }));
    if wait_until(Duration::from_secs(1), || copies() > before) {
        failures.push("the room still takes its live copies after the linger".into());
    }
    link.set(Condition::Degraded { one_way: Duration::from_millis(150), loss: 0.0 });

    let subscriber = rt.spawn(async move {
        let sent = Instant::now();
        let reply = second.subscribe_since("reads:refeed", 1, &epoch).await;
        (sent.elapsed(), reply)
    });
    // The subscribe reaches the room first, then a presence read and a publish of the
    // same room while the room reads.
    pace(
        Duration::from_millis(50),
        "the subscribe reaches the room before the requests beside its read",
    );
    let sent = Instant::now();
    let (status, presence) =
        http.request("GET", &format!("/v1/rooms/{room}/presence"), Auth::Key, Body::None);
    let presence_took = sent.elapsed();
    let sent = Instant::now();
    let (status_publish, published) =
        http.publish(&room, Some("refeed-beside"), json!({ "n": "beside" }));
    let publish_took = sent.elapsed();
    let (subscribe_took, reply) = rt.block_on(subscriber).expect("the subscriber's task");
    println!("over 150 ms each way: subscribe answered after {subscribe_took:?}, presence read {presence_took:?}, publish {publish_took:?}");
    if status != 200 {
        failures.push(format!("presence read: {status} {presence}"));
    }
    if status_publish != 201 {
        failures.push(format!("publish beside the read: {status_publish} {published}"));
    }
    if reply["op"] != "subscribed" || reply["recovered"] != true {
        failures.push(format!(
            "the subscriber that made the room read again: {reply}, expected a recovery"
        ));
    }
    if subscribe_took < Duration::from_millis(600) {
        failures.push(format!("the subscribe was answered in {subscribe_took:?}: the room did not read again (the test proves nothing)"));
    }
    if presence_took > Duration::from_millis(150) {
        failures.push(format!("a presence read waited {presence_took:?} for the room's read"));
    }
    // One append round trip (300 ms here) and its state-less ack, not the read's three.
    if publish_took > Duration::from_millis(600) {
        failures.push(format!("a publish waited {publish_took:?} for the room's read"));
    }
    link.set(Condition::Up);
    fail_with_logs(&cluster, "a room taking its feed again", &failures, &["WARN", "ERROR"]);
}
