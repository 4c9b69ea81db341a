//! The single-node spine, step by step as a user walks it (issue 2, "What a user must be
//! able to do"): mint a token, connect, subscribe, receive published events in seq order
//! in batched frames; drop and recover with `since` + `epoch`; the `recovered:false`
//! cases; restart on the same data dir; HTTP history and the `history` op equal to what
//! the live stream delivered; `batch_window_ms = 0`.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// Publishes `n` events to `room` one after the other (ids `{prefix}-{i}`), asserting
/// 201 and consecutive seqs; returns the replies.
fn publish_n(http: &Http, room: &str, prefix: &str, n: usize) -> Vec<Value> {
    let mut replies: Vec<Value> = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        let reply = http.publish_ok(room, Some(&id), json!({"n": i, "prefix": prefix}));
        assert_eq!(reply["room"], room, "{reply}");
        assert_eq!(reply["duplicate"], false, "{reply}");
        if let Some(prev) = replies.last() {
            assert_eq!(
                seq_of(&reply),
                seq_of(prev) + 1,
                "seqs of consecutive publishes: {prev} then {reply}"
            );
            assert_eq!(reply["epoch"], prev["epoch"], "epoch changed between publishes");
        }
        replies.push(reply);
    }
    replies
}

#[tokio::test]
async fn minted_token_connects_and_welcome_names_session_node_and_heartbeat() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let before = now_ms();
    let (status, body) =
        server.http().mint_token_raw(json!({"user": "alice", "device": "web", "ttl_secs": 60}));
    assert_eq!(status, 201, "{body}");
    let token = body["token"].as_str().expect("token is a string");
    assert!(!token.is_empty());
    let expires = body["expires_at_ms"].as_u64().expect("expires_at_ms is a number");
    assert!(
        expires >= before + 59_000 && expires <= now_ms() + 61_000,
        "expires_at_ms {expires} is not about 60 s after {before}"
    );

    let client = WsClient::connect(server.addr, token, None).await;
    let w = &client.welcome;
    assert_eq!(w["op"], "welcome");
    assert!(w["session"].as_str().is_some_and(|s| !s.is_empty()), "welcome without session: {w}");
    assert_eq!(w["node"], NODE, "{w}");
    assert_eq!(w["heartbeat_ms"], 30_000, "{w}");
    assert_eq!(w["warmup"], false, "{w}");

    // Device defaults to "web" and ttl to 60 s.
    let (status, body) = server.http().mint_token_raw(json!({"user": "alice"}));
    assert_eq!(status, 201, "{body}");
    let expires = body["expires_at_ms"].as_u64().expect("expires_at_ms");
    assert!(
        expires >= before + 59_000 && expires <= now_ms() + 61_000,
        "default ttl is not 60 s: {body}"
    );
}

#[tokio::test]
async fn subscriber_receives_a_burst_in_seq_order_in_batched_frames() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut client = server.client("alice").await;
    let reply = client.subscribe_ok("match:1").await;
    assert_eq!(reply["seq"], 0, "a fresh room has head 0: {reply}");
    assert!(reply.get("recovered").is_none(), "no `recovered` without `since`: {reply}");

    // A burst from four concurrent publishers.
    let per_thread = 10;
    let burst_started = Instant::now();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let http = http.clone();
            std::thread::spawn(move || {
                (0..per_thread)
                    .map(|i| {
                        http.publish_ok(
                            "match:1",
                            Some(&format!("t{t}-{i}")),
                            json!({"t": t, "i": i}),
                        )
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let per_thread_replies: Vec<Vec<Value>> =
        handles.into_iter().map(|h| h.join().expect("publisher")).collect();
    let burst_ms = burst_started.elapsed().as_millis() as usize;
    // id -> seq from the publish replies
    let mut seq_of_id = std::collections::HashMap::new();
    for (t, rs) in per_thread_replies.iter().enumerate() {
        for (i, r) in rs.iter().enumerate() {
            seq_of_id.insert(format!("t{t}-{i}"), seq_of(r));
        }
    }
    let replies: Vec<Value> = per_thread_replies.into_iter().flatten().collect();
    let total = replies.len();
    let mut published_seqs: Vec<u64> = replies.iter().map(seq_of).collect();
    published_seqs.sort_unstable();
    assert_eq!(
        published_seqs,
        (1..=total as u64).collect::<Vec<_>>(),
        "publish seqs must be 1..={total}, each once"
    );
    let epoch = replies[0]["epoch"].clone();
    assert!(!epoch.is_null(), "publish reply without epoch: {}", replies[0]);
    assert!(replies.iter().all(|r| r["epoch"] == epoch), "one epoch for all publishes");

    let frames = client.next_event_frames(total).await;
    let events: Vec<Value> = frames.iter().flatten().cloned().collect();
    assert_eq!(
        seqs(&events),
        (1..=total as u64).collect::<Vec<_>>(),
        "live events in seq order, each once"
    );
    for e in &events {
        assert_eq!(e["room"], "match:1");
        let id = e["id"].as_str().expect("event id");
        assert_eq!(
            seq_of_id.get(id),
            Some(&seq_of(e)),
            "event {e} has the seq its publish was acknowledged with"
        );
        let (t, i) = id[1..].split_once('-').expect("id t{t}-{i}");
        assert_eq!(
            e["data"],
            json!({"t": t.parse::<u64>().unwrap(), "i": i.parse::<u64>().unwrap()}),
            "{e}"
        );
        assert!(e["ts_ms"].as_u64().is_some_and(|ts| ts > 1_600_000_000_000), "ts_ms: {e}");
    }
    let sizes: Vec<usize> = frames.iter().map(Vec::len).collect();
    assert!(
        frames.len() < total && sizes.iter().any(|&n| n > 1),
        "a burst must be batched; frame sizes: {sizes:?}"
    );
    // One frame per window: publishing took burst_ms, so about burst_ms / 100 windows.
    assert!(
        frames.len() <= burst_ms / 100 + 3,
        "{} frames for a {burst_ms} ms burst with a 100 ms window; frame sizes: {sizes:?}",
        frames.len()
    );
    client.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn one_frame_per_room_per_window() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.batch_window_ms = 300);
    let http = server.http();
    let mut client = server.client("alice").await;
    client.subscribe_ok("a").await;
    client.subscribe_ok("b").await;
    let started = Instant::now();
    let handles: Vec<_> = ["a", "b", "a", "b"]
        .into_iter()
        .enumerate()
        .map(|(t, room)| {
            let http = http.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    http.publish_ok(room, None, json!([t, i]));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("publisher");
    }
    let burst_ms = started.elapsed().as_millis() as usize;
    let frames = client.next_event_frames(40).await;
    let sizes: Vec<usize> = frames.iter().map(Vec::len).collect();
    let events: Vec<Value> = frames.iter().flatten().cloned().collect();
    for room in ["a", "b"] {
        let of_room: Vec<Value> = events.iter().filter(|e| e["room"] == room).cloned().collect();
        assert_eq!(seqs(&of_room), (1..=20).collect::<Vec<_>>(), "room {room} in seq order");
    }
    // Each room renders its window's frame once for every subscriber: one frame per room
    // per window.
    assert!(
        frames.len() <= 2 * (burst_ms / 300 + 3),
        "{} frames for a {burst_ms} ms burst over 2 rooms with a 300 ms window (one frame per room per window); sizes {sizes:?}",
        frames.len()
    );
    assert!(
        frames.iter().all(|f| f.iter().all(|e| e["room"] == f[0]["room"])),
        "a window's frame carries the events of one room; sizes {sizes:?}"
    );
    assert!(frames.iter().any(|f| f.len() > 1), "a window batches several events; sizes {sizes:?}");
    client.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn batch_window_zero_sends_each_event_at_once() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.batch_window_ms = 0);
    let http = server.http();
    let mut client = server.client("alice").await;
    client.subscribe_ok("room-0").await;
    for i in 0..5u64 {
        let reply = http.publish_ok("room-0", None, json!(i));
        let started = std::time::Instant::now();
        let frames = client.next_event_frames(1).await;
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].len(), 1);
        assert_eq!(frames[0][0]["seq"], reply["seq"]);
        assert_eq!(frames[0][0]["data"], json!(i));
        // The publish reply comes after fan-out was started; with no window, the event
        // must not be held back for anything like a batching window.
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "event {i} took {:?} after the ack",
            started.elapsed()
        );
    }
    client.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn two_subscribers_get_the_same_events_and_other_rooms_stay_out() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut a = server.client("alice").await;
    let mut b = server.client("bob").await;
    a.subscribe_ok("news").await;
    b.subscribe_ok("news").await;
    b.subscribe_ok("sports").await;

    publish_n(&http, "news", "n", 3);
    publish_n(&http, "sports", "s", 2);

    let a_events = a.next_events(3).await;
    assert!(a_events.iter().all(|e| e["room"] == "news"), "{a_events:?}");
    assert_eq!(seqs(&a_events), vec![1, 2, 3]);
    a.assert_quiet(QUIET).await;

    let b_events = b.next_events(5).await;
    let news: Vec<Value> = b_events.iter().filter(|e| e["room"] == "news").cloned().collect();
    let sports: Vec<Value> = b_events.iter().filter(|e| e["room"] == "sports").cloned().collect();
    assert_eq!(news, a_events, "both subscribers see identical events");
    assert_eq!(seqs(&sports), vec![1, 2], "each room has its own sequence");
    b.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn unsubscribe_stops_delivery_and_refs_are_echoed() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut client = server.client("alice").await;

    client.send_json(&json!({"op": "ping", "ref": 41})).await;
    let pong = client.recv_json().await;
    assert_eq!(pong, json!({"op": "pong", "ref": 41}));

    client.send_json(&json!({"op": "subscribe", "room": "r1", "ref": 42})).await;
    let reply = client.recv_json().await;
    assert_eq!(reply["op"], "subscribed", "{reply}");
    assert_eq!(reply["ref"], 42, "{reply}");

    http.publish_ok("r1", None, json!("first"));
    assert_eq!(client.next_events(1).await[0]["data"], "first");

    client.send_json(&json!({"op": "unsubscribe", "room": "r1", "ref": 43})).await;
    let reply = client.recv_json().await;
    assert_eq!(reply["op"], "unsubscribed", "{reply}");
    assert_eq!(reply["room"], "r1", "{reply}");
    assert_eq!(reply["ref"], 43, "{reply}");

    http.publish_ok("r1", None, json!("after unsubscribe"));
    client.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn live_only_subscribe_gets_no_history() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    publish_n(&http, "old-news", "a", 3);
    let mut client = server.client("alice").await;
    let reply = client.subscribe_ok("old-news").await;
    assert_eq!(reply["seq"], 3, "subscribed carries the head: {reply}");
    client.assert_quiet(QUIET).await;
    http.publish_ok("old-news", None, json!("fresh"));
    let got = client.next_events(1).await;
    assert_eq!((&got[0]["seq"], &got[0]["data"]), (&json!(4), &json!("fresh")));
}

#[tokio::test]
async fn epoch_from_subscribing_to_a_fresh_room_is_good_for_recovery() {
    let _gate = crate::common::gate!();
    // A client learns the epoch only from `subscribed` (events do not carry it), so the
    // epoch announced for a room nobody has published to yet must be the one its events
    // get.
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut client = server.client("alice").await;
    let reply = client.subscribe_ok("fresh").await;
    let epoch = reply["epoch"].clone();
    assert!(
        epoch.is_string(),
        "subscribed must name the epoch even before the first event: {reply}"
    );
    let first = publish_n(&http, "fresh", "a", 2);
    assert_eq!(first[0]["epoch"], epoch, "the first publish keeps the announced epoch");
    assert_eq!(seqs(&client.next_events(2).await), vec![1, 2]);
    drop(client);

    http.publish_ok("fresh", None, json!("missed"));
    let mut client = server.client("alice").await;
    let reply = client.subscribe_since("fresh", 2, &epoch).await;
    assert_eq!(reply["recovered"], true, "{reply}");
    let missed = client.next_events(1).await;
    assert_eq!((&missed[0]["seq"], &missed[0]["data"]), (&json!(3), &json!("missed")));
}

#[tokio::test]
async fn resubscribe_with_since_and_epoch_gets_exactly_the_missed_events_then_live() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut client = server.client("alice").await;
    client.subscribe_ok("match:1").await;
    let first = publish_n(&http, "match:1", "a", 5);
    let seen = client.next_events(5).await;
    assert_eq!(seqs(&seen), vec![1, 2, 3, 4, 5]);
    let epoch = first[0]["epoch"].clone();
    drop(client); // the socket just goes away

    let missed = publish_n(&http, "match:1", "b", 7);
    assert_eq!(seq_of(&missed[6]), 12);

    let mut client = server.client("alice").await;
    let reply = client.subscribe_since("match:1", 5, &epoch).await;
    assert_eq!(reply["op"], "subscribed", "{reply}");
    assert_eq!(reply["recovered"], true, "{reply}");
    assert_eq!(reply["epoch"], epoch, "{reply}");
    assert_eq!(reply["seq"], 12, "subscribed carries the head: {reply}");

    let replayed = client.next_events(7).await;
    assert_eq!(seqs(&replayed), (6..=12).collect::<Vec<_>>());
    for (i, e) in replayed.iter().enumerate() {
        assert_eq!(e["id"], format!("b-{i}"), "{e}");
        assert_eq!(e["data"], json!({"n": i, "prefix": "b"}), "{e}");
    }

    publish_n(&http, "match:1", "c", 3);
    let live = client.next_events(3).await;
    assert_eq!(seqs(&live), vec![13, 14, 15], "live continues right after the replay");
    client.assert_quiet(QUIET).await;

    // Recovering with since = head replays nothing and reports recovered:true.
    let mut client = server.client("alice").await;
    let reply = client.subscribe_since("match:1", 15, &epoch).await;
    assert_eq!(reply["recovered"], true, "{reply}");
    assert_eq!(reply["seq"], 15, "{reply}");
    client.assert_quiet(QUIET).await;
}

/// Subscribes a new client with `since`/`epoch`; asserts `recovered:false`, no replay,
/// and that a following live event is delivered.
async fn assert_not_recovered(
    server: &TestServer,
    room: &str,
    since: u64,
    epoch: &Value,
    head: u64,
) {
    let mut client = server.client("alice").await;
    let reply = client.subscribe_since(room, since, epoch).await;
    assert_eq!(reply["op"], "subscribed", "since {since}: {reply}");
    assert_eq!(reply["recovered"], false, "since {since}, epoch {epoch}: {reply}");
    assert_eq!(reply["seq"], head, "since {since}: {reply}");
    client.assert_quiet(QUIET).await; // never a partial replay
    let live = server.http().publish_ok(room, None, json!("live"));
    let got = client.next_events(1).await;
    assert_eq!(got[0]["seq"], live["seq"], "live events flow after recovered:false");
    client.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn not_recovered_when_the_epoch_differs() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let replies = publish_n(&server.http(), "r", "e", 3);
    assert_ne!(replies[0]["epoch"], json!("some-other-epoch"));
    assert_not_recovered(&server, "r", 1, &json!("some-other-epoch"), 3).await;
}

#[tokio::test]
async fn not_recovered_when_history_was_trimmed_past_since() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.history_size = 5);
    let http = server.http();
    let replies = publish_n(&http, "r", "e", 20);
    let epoch = replies[0]["epoch"].clone();

    // History keeps exactly the last 5.
    let h = http.history_ok("r", Some(0), None);
    assert_eq!(seqs(h["events"].as_array().expect("events")), vec![16, 17, 18, 19, 20], "{h}");
    assert_eq!(h["head"], 20);

    // since 15 still covered: everything after it is kept.
    let mut client = server.client("alice").await;
    let reply = client.subscribe_since("r", 15, &epoch).await;
    assert_eq!(reply["recovered"], true, "since 15 with history 16..=20: {reply}");
    assert_eq!(seqs(&client.next_events(5).await), vec![16, 17, 18, 19, 20]);
    client.assert_quiet(QUIET).await;
    drop(client);

    // since 2 and since 14 are not: 3..=15 are gone.
    assert_not_recovered(&server, "r", 2, &epoch, 20).await;
    assert_not_recovered(&server, "r", 14, &epoch, 21).await;
}

#[tokio::test]
async fn not_recovered_when_more_than_recovery_max_events_are_missing() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.recovery_max_events = 5);
    let replies = publish_n(&server.http(), "r", "e", 12);
    let epoch = replies[0]["epoch"].clone();

    // Exactly 5 missing: recovered.
    let mut client = server.client("alice").await;
    let reply = client.subscribe_since("r", 7, &epoch).await;
    assert_eq!(reply["recovered"], true, "5 missing with recovery_max_events 5: {reply}");
    assert_eq!(seqs(&client.next_events(5).await), vec![8, 9, 10, 11, 12]);
    client.assert_quiet(QUIET).await;
    drop(client);

    // 6 missing: not recovered, nothing replayed.
    assert_not_recovered(&server, "r", 6, &epoch, 12).await;
}

#[tokio::test]
async fn not_recovered_when_since_is_ahead_of_head() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let replies = publish_n(&server.http(), "r", "e", 3);
    let epoch = replies[0]["epoch"].clone();
    assert_not_recovered(&server, "r", 10, &epoch, 3).await;
}

#[tokio::test]
async fn restart_keeps_head_epoch_history_and_recovery() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let replies = publish_n(&http, "match:1", "a", 10);
    let epoch = replies[0]["epoch"].clone();
    let before = http.history_ok("match:1", Some(0), Some(1000));
    assert_eq!(before["head"], 10);
    assert_eq!(before["epoch"], epoch);
    assert_eq!(before["events"].as_array().map(Vec::len), Some(10));

    let dir = server.stop();
    let server = TestServer::start_in(dir, |_| {});
    let http = server.http();

    let after = http.history_ok("match:1", Some(0), Some(1000));
    assert_eq!(after, before, "history after restart must equal history before it");

    // A client that saw up to 7 recovers exactly 8..=10, then live 11 in the same epoch.
    let mut client = server.client("alice").await;
    let reply = client.subscribe_since("match:1", 7, &epoch).await;
    assert_eq!(reply["recovered"], true, "{reply}");
    assert_eq!(reply["epoch"], epoch, "{reply}");
    assert_eq!(reply["seq"], 10, "{reply}");
    let replayed = client.next_events(3).await;
    assert_eq!(
        replayed,
        before["events"].as_array().unwrap()[7..10].to_vec(),
        "replay after restart"
    );

    let next = http.publish_ok("match:1", None, json!("after restart"));
    assert_eq!(next["seq"], 11, "the sequence continues after restart: {next}");
    assert_eq!(next["epoch"], epoch, "the epoch survives a restart: {next}");
    assert_eq!(seqs(&client.next_events(1).await), vec![11]);
    client.assert_quiet(QUIET).await;
    drop(client);

    // And once more: a second restart keeps the event published after the first one.
    let dir = server.stop();
    let server = TestServer::start_in(dir, |_| {});
    let again = server.http().history_ok("match:1", Some(9), None);
    assert_eq!(again["head"], 11);
    assert_eq!(again["epoch"], epoch);
    assert_eq!(seqs(again["events"].as_array().unwrap()), vec![10, 11]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connected_client_is_told_1012_on_shutdown_and_recovers_after_restart() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let mut client = server.client("alice").await;
    client.subscribe_ok("live").await;
    let replies = publish_n(&server.http(), "live", "a", 4);
    let epoch = replies[0]["epoch"].clone();
    assert_eq!(seqs(&client.next_events(4).await), vec![1, 2, 3, 4]);

    // Stop while the client is connected and reading: it is asked to reconnect (1012),
    // never dropped without a Close frame.
    let stopping = tokio::task::spawn_blocking(move || server.stop());
    assert_eq!(client.close_code().await, Some(1012), "shutdown closes connections with 1012");
    let dir = stopping.await.expect("stop");
    drop(client);

    let server = TestServer::start_in(dir, |_| {});
    let after = server.http().publish_ok("live", Some("b"), json!("after restart"));
    assert_eq!((&after["seq"], &after["epoch"]), (&json!(5), &epoch), "{after}");
    let mut client = server.client("alice").await;
    let reply = client.subscribe_since("live", 4, &epoch).await;
    assert_eq!(reply["recovered"], true, "{reply}");
    assert_eq!(reply["seq"], 5, "{reply}");
    let missed = client.next_events(1).await;
    assert_eq!(missed[0]["seq"], 5);
    assert_eq!(missed[0]["data"], "after restart");
    client.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn events_older_than_history_ttl_leave_history() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.history_ttl_secs = 1);
    let http = server.http();
    let replies = publish_n(&http, "ttl", "old", 3);
    let epoch = replies[0]["epoch"].clone();

    // Retention by age may run on a housekeeping timer: poll, bounded.
    let limit = Duration::from_secs(20);
    let started = Instant::now();
    let mut h = Value::Null;
    let trimmed = common::wait_until_every(limit, Duration::from_millis(250), || {
        h = http.history_ok("ttl", Some(0), None);
        h["events"] == json!([])
    });
    assert!(trimmed, "events older than history_ttl_secs = 1 still served after {limit:?}: {h}");
    assert_eq!(h["head"], 3, "trimming keeps the head: {h}");
    assert_eq!(h["epoch"], epoch, "trimming keeps the epoch: {h}");
    eprintln!("expired events left history after {:?}", started.elapsed());
    // What was trimmed cannot be recovered; the sequence goes on from the head.
    assert_not_recovered(&server, "ttl", 0, &epoch, 3).await;
}

#[tokio::test]
async fn http_history_and_history_op_equal_the_live_stream() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut client = server.client("alice").await;
    client.subscribe_ok("mixed").await;

    let datas = [
        json!({"score": [1, 2], "nested": {"deep": true}}),
        json!("a string with \"quotes\" and ünïcödé ✓"),
        json!(42),
        json!(-3.5),
        json!(null),
        json!([]),
        json!({}),
        json!(true),
    ];
    let n = 30;
    for i in 0..n {
        let id = (i % 3 != 0).then(|| format!("id-{i}"));
        http.publish_ok("mixed", id.as_deref(), datas[i % datas.len()].clone());
    }
    let live = client.next_events(n).await;
    assert_eq!(seqs(&live), (1..=n as u64).collect::<Vec<_>>());
    for (i, e) in live.iter().enumerate() {
        assert_eq!(e["data"], datas[i % datas.len()], "data survives the wire unchanged: {e}");
        if i % 3 != 0 {
            assert_eq!(e["id"], format!("id-{i}"), "{e}");
        }
    }

    let all = http.history_ok("mixed", Some(0), Some(100));
    assert_eq!(all["room"], "mixed");
    assert_eq!(all["head"], n);
    assert!(!all["epoch"].is_null());
    assert_eq!(all["events"].as_array().unwrap(), &live, "GET history equals the live stream");

    let page = http.history_ok("mixed", Some(10), Some(5));
    assert_eq!(page["events"].as_array().unwrap(), &live[10..15].to_vec(), "since=10&limit=5");
    assert_eq!(page["head"], n);

    let op = client.history_op("mixed", 0, 100).await;
    assert_eq!(op["op"], "history", "{op}");
    assert_eq!(op["room"], "mixed");
    assert_eq!(op["epoch"], all["epoch"]);
    assert_eq!(op["head"], n);
    assert_eq!(op["complete"], true, "{op}");
    assert_eq!(op["events"].as_array().unwrap(), &live, "history op equals the live stream");

    let op = client.history_op("mixed", 25, 100).await;
    assert_eq!(op["events"].as_array().unwrap(), &live[25..].to_vec());

    let beyond = http.history_ok("mixed", Some(999), None);
    assert_eq!(
        (&beyond["events"], &beyond["head"]),
        (&json!([]), &json!(n)),
        "since past the head: {beyond}"
    );
    let op = client.history_op("never-published", 0, 10).await;
    assert_eq!(op["op"], "history", "{op}");
    assert_eq!((&op["head"], &op["events"]), (&json!(0), &json!([])), "{op}");
}

#[tokio::test]
async fn subscribing_twice_does_not_duplicate_delivery() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut client = server.client("alice").await;
    client.subscribe_ok("twice").await;
    client.subscribe_ok("twice").await;
    http.publish_ok("twice", None, json!(1));
    http.publish_ok("twice", None, json!(2));
    assert_eq!(seqs(&client.next_events(2).await), vec![1, 2]);
    client.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn http_history_limit_defaults_to_100_and_unknown_room_is_empty() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let http = http.clone();
            std::thread::spawn(move || {
                for i in 0..30 {
                    http.publish_ok("long", None, json!([t, i]));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("publisher");
    }
    let first = http.history_ok("long", None, None);
    assert_eq!(first["head"], 120);
    assert_eq!(
        seqs(first["events"].as_array().unwrap()),
        (1..=100).collect::<Vec<_>>(),
        "default limit 100"
    );
    let rest = http.history_ok("long", Some(100), None);
    assert_eq!(seqs(rest["events"].as_array().unwrap()), (101..=120).collect::<Vec<_>>());
    let none = http.history_ok("long", Some(120), None);
    assert_eq!(none["events"], json!([]));

    let (status, empty) = http.history("never-published", Some(0), None);
    assert_eq!(status, 200, "unknown room is not a 404: {empty}");
    assert_eq!(empty["head"], 0, "{empty}");
    assert_eq!(empty["events"], json!([]), "{empty}");
    assert_eq!(empty["room"], "never-published", "{empty}");
    // An empty room answers the epoch its first publish keeps, and stores nothing before.
    let first = http.publish_ok("never-published", None, json!(1));
    assert_eq!(first["epoch"], empty["epoch"], "{first} after {empty}");
}
