//! Hostile clients and rooms (issue 29, items 4, 6 and 9):
//!
//! - a client that subscribes to (and reads the history of) rooms nobody ever published
//!   to leaves no record in the store, and their actors go within seconds, not after
//!   `room_idle_secs`; the epoch it was told for an empty room still recovers across a
//!   restart, also once the room got its first events;
//! - a connection starting room actors as fast as it may send is refused past its budget
//!   (`rate_limited`, counted as `room_starts`), and the node keeps serving others;
//! - a client's idempotency id never takes a backend's: the backend's later publish with
//!   the same id is a new event, and each side's retry is still its own duplicate, also
//!   after a restart;
//! - a client's published `data` reaches subscribers byte for byte (key order, integers
//!   beyond 2^64), and `max_event_bytes` counts those bytes.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use livegate::store::Store;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::common::*;

/// `livegate_rooms_live`, the room actors alive on the node.
fn rooms_live(http: &Http) -> f64 {
    http.metric("livegate_rooms_live").expect("livegate_rooms_live is exposed")
}

/// A connection of `user` whose token may publish to `chat:*`.
async fn chatter(server: &TestServer, user: &str) -> WsClient {
    let (status, body) = server.http().mint_token_raw(json!({"user": user, "publish": ["chat:*"]}));
    assert_eq!(status, 201, "{body}");
    WsClient::connect(server.addr, body["token"].as_str().unwrap(), None).await
}

#[tokio::test]
async fn rooms_never_published_to_leave_nothing_stored_and_their_actors_go_soon() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_messages_per_sec = 0);
    let http = server.http();
    let mut attacker = server.client("mallory").await;
    // 60 subscribes and unsubscribes and 40 history reads of rooms nobody publishes to.
    let cold: Vec<String> = (0..60).map(|n| format!("cold:{n}")).collect();
    let read: Vec<String> = (0..40).map(|n| format!("read:{n}")).collect();
    for room in &cold {
        attacker.subscribe_ok(room).await;
        attacker.unsubscribe(room).await;
    }
    for room in &read {
        let page = attacker.history_op(room, 0, 10).await;
        assert_eq!(page["op"], "history", "{page}");
    }
    // An honest client: one room stays empty, one gets its first events after the
    // subscribe. Both answers name the epoch the client will recover with.
    let mut honest = server.client("alice").await;
    let quiet = honest.subscribe_ok("quiet").await;
    let later = honest.subscribe_ok("later").await;
    assert_eq!(later["seq"], 0, "{later}");
    for n in 1..=2 {
        let published = http.publish_ok("later", Some(&format!("l-{n}")), json!(n));
        assert_eq!(
            published["epoch"], later["epoch"],
            "the first publish keeps the epoch the empty room answered"
        );
    }
    assert_eq!(seqs(&honest.next_events(2).await), [1, 2]);

    // The 100 empty rooms' actors go within seconds; the honest client's two (and the
    // inboxes) stay.
    let started = Instant::now();
    let gone = wait_until(Duration::from_secs(8), || rooms_live(&http) <= 4.0);
    let took = started.elapsed();
    assert!(
        gone,
        "empty rooms' actors still live after {took:?}: {} rooms live",
        rooms_live(&http)
    );
    eprintln!("empty rooms' actors gone {:.1} s after the last request", took.as_secs_f64());
    attacker.close().await;
    honest.close().await;

    // Nothing was written for the rooms never published to.
    let dir = server.stop();
    {
        let store = Store::open(dir.path()).expect("open the stopped server's store");
        let stored: Vec<&String> = cold
            .iter()
            .chain(&read)
            .filter(|room| store.rooms().load(room, 1).unwrap().is_some())
            .collect();
        assert!(
            stored.is_empty(),
            "{} rooms never published to have a record: {stored:?}",
            stored.len()
        );
        assert!(store.rooms().load("later", 10).unwrap().is_some(), "a published room is stored");
    }

    // After a restart the epochs answered before still recover: the empty room with
    // nothing to replay, the one published since with exactly its events.
    let server = TestServer::start_in(dir, |_| {});
    let mut back = server.client("alice").await;
    let again = back.subscribe_since("quiet", 0, &quiet["epoch"]).await;
    assert_eq!(
        (&again["recovered"], &again["epoch"], &again["seq"]),
        (&json!(true), &quiet["epoch"], &json!(0)),
        "{again}"
    );
    let again = back.subscribe_since("later", 0, &later["epoch"]).await;
    assert_eq!((&again["recovered"], &again["seq"]), (&json!(true), &json!(2)), "{again}");
    assert_eq!(seqs(&back.next_events(2).await), [1, 2]);
    assert_serves(&server, "bob", "after").await;
}

#[tokio::test]
async fn a_connection_starting_rooms_fast_is_refused_past_its_budget() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut attacker = server.client("mallory").await;
    // History reads of 180 distinct rooms as fast as the socket takes them (under the
    // message rate's burst of 200): each would start a room actor.
    let sent = 180;
    let started = Instant::now();
    for n in 0..sent {
        attacker
            .send_json(
                &json!({"op": "history", "room": format!("spray:{n}"), "limit": 1, "ref": n}),
            )
            .await;
    }
    let (mut answered, mut refused, mut other) = (0, 0, Vec::new());
    while answered + refused + other.len() < sent {
        let frame = attacker.recv_json().await;
        match (frame["op"].as_str(), frame["code"].as_str()) {
            (Some("history"), _) => answered += 1,
            (Some("error"), Some("rate_limited")) => refused += 1,
            _ => other.push(frame),
        }
    }
    let took = started.elapsed();
    eprintln!(
        "room starts: {answered} answered, {refused} refused of {sent} in {:.2} s",
        took.as_secs_f64()
    );
    assert!(other.is_empty(), "unexpected frames: {other:?}");
    // The budget: a burst of max_subscriptions (128), then max_room_starts_per_sec (10).
    let budget = 128 + (10.0 * took.as_secs_f64()).ceil() as usize;
    assert!(
        refused > 0 && answered <= budget,
        "{answered} room starts answered in {took:?}, budget {budget}; {refused} refused"
    );
    let hits = http.metric(r#"livegate_limit_hits_total{limit="room_starts"}"#).unwrap_or(0.0);
    assert_eq!(hits, refused as f64, "each refusal counted");
    // The refusals are the client's to read, not a close: it is still connected.
    attacker.assert_alive().await;
    assert_serves(&server, "alice", "lobby").await;
}

/// A client's `publish` op to `chat:ids`; its reply.
async fn publish(client: &mut WsClient, id: &str, data: Value) -> Value {
    client.request(json!({"op": "publish", "room": "chat:ids", "id": id, "data": data})).await
}

#[tokio::test]
async fn a_clients_idempotency_id_never_takes_a_backends() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut watcher = server.client("watcher").await;
    watcher.subscribe_ok("chat:ids").await;
    let mut mallory = chatter(&server, "mallory").await;
    let mut eve = chatter(&server, "eve").await;

    let squat = publish(&mut mallory, "sys-42", json!("mallory's")).await;
    assert_eq!(
        (&squat["op"], &squat["seq"], &squat["duplicate"]),
        (&json!("published"), &json!(1), &json!(false)),
        "{squat}"
    );
    // The backend's event with that id is a new event, not the client's.
    let (status, backend) = http.publish("chat:ids", Some("sys-42"), json!("backend's"));
    assert_eq!(
        (status, &backend["seq"], &backend["duplicate"]),
        (201, &json!(2), &json!(false)),
        "{backend}"
    );
    // Another client's id is its own too.
    let other = publish(&mut eve, "sys-42", json!("eve's")).await;
    assert_eq!((&other["seq"], &other["duplicate"]), (&json!(3), &json!(false)), "{other}");
    // Each one's retry is still its own duplicate.
    let retry = publish(&mut mallory, "sys-42", json!("mallory's again")).await;
    assert_eq!((&retry["seq"], &retry["duplicate"]), (&json!(1), &json!(true)), "{retry}");
    let (status, again) = http.publish("chat:ids", Some("sys-42"), json!("backend's again"));
    assert_eq!(
        (status, &again["seq"], &again["duplicate"]),
        (200, &json!(2), &json!(true)),
        "{again}"
    );

    // Subscribers see all three, each with the id as published and its author.
    let events = watcher.next_events(3).await;
    let seen: Vec<(u64, &Value, &Value, Option<&Value>)> =
        events.iter().map(|e| (seq_of(e), &e["id"], &e["data"], e.get("from"))).collect();
    assert_eq!(
        seen,
        [
            (1, &json!("sys-42"), &json!("mallory's"), Some(&json!("mallory"))),
            (2, &json!("sys-42"), &json!("backend's"), None),
            (3, &json!("sys-42"), &json!("eve's"), Some(&json!("eve"))),
        ]
    );
    watcher.close().await;
    mallory.close().await;
    eve.close().await;

    // The stored events keep the rule after a restart.
    let server = TestServer::start_in(server.stop(), |_| {});
    let http = server.http();
    let (status, again) =
        http.publish("chat:ids", Some("sys-42"), json!("backend's, after a restart"));
    assert_eq!(
        (status, &again["seq"], &again["duplicate"]),
        (200, &json!(2), &json!(true)),
        "{again}"
    );
    let mut mallory = chatter(&server, "mallory").await;
    let retry = mallory
        .request(json!({"op": "publish", "room": "chat:ids", "id": "sys-42", "data": 0}))
        .await;
    assert_eq!((&retry["seq"], &retry["duplicate"]), (&json!(1), &json!(true)), "{retry}");
    assert_eq!(http.history_ok("chat:ids", Some(0), None)["head"], 3);
}

/// The next `events` frame on `client`'s socket, as the text the server sent.
async fn raw_events_frame(client: &mut WsClient) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, client.ws.next()).await {
            Ok(Some(Ok(Message::Text(text)))) if text.contains(r#""op":"events""#) => return text,
            Ok(Some(Ok(_))) => continue,
            other => panic!("no events frame within {WAIT:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_clients_published_data_reaches_subscribers_byte_for_byte() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_event_bytes = 64);
    let mut watcher = server.client("watcher").await;
    watcher.subscribe_ok("chat:raw").await;
    let mut author = chatter(&server, "author").await;
    let data = r#"{"b":1,"a":18446744073709551616000}"#;
    author
        .send_text(format!(r#"{{"op":"publish","room":"chat:raw","ref":1,"data":{data}}}"#))
        .await;
    let reply = author.wait_for_ref(1, &json!("publish")).await;
    assert_eq!(reply["op"], "published", "{reply}");
    let frame = raw_events_frame(&mut watcher).await;
    assert!(
        frame.contains(&format!(r#""data":{data}"#)),
        "the data as the client sent it: {frame}"
    );

    // `max_event_bytes` (64 here) counts the bytes sent, whitespace included: data that
    // would fit once re-encoded compactly is too large as sent.
    let padded = format!("{{\"text\": {:?}{}}}", "x".repeat(40), " ".repeat(20));
    assert!(
        padded.len() > 64
            && serde_json::from_str::<Value>(&padded).unwrap().to_string().len() <= 64
    );
    author
        .send_text(format!(r#"{{"op":"publish","room":"chat:raw","ref":2,"data":{padded}}}"#))
        .await;
    let reply = author.wait_for_ref(2, &json!("padded publish")).await;
    assert_eq!(
        (&reply["op"], &reply["code"]),
        (&json!("error"), &json!("payload_too_large")),
        "{reply}"
    );
    watcher.assert_quiet(QUIET).await;
}
