//! Client publish: a token's `publish` patterns let its connection publish
//! with the `publish` op. The event goes through the HTTP API's append path, is answered
//! `published` only once durable (it survives kill -9), and carries `from`, the
//! connection's user, set by the server. Rooms outside the patterns, inboxes, tokens
//! without patterns, bad rooms, big data and the message rate are refused with an error
//! frame while the connection stays open; a resumed connection keeps its publish rights.

use crate::common;

use common::process::ServeProcess;
use common::*;
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// A connection of `user` whose token carries `publish` (and reads any room).
async fn publisher(
    server_addr: std::net::SocketAddr,
    http: &Http,
    user: &str,
    publish: Value,
) -> WsClient {
    let (status, body) = http.mint_token_raw(json!({"user": user, "publish": publish}));
    assert_eq!(status, 201, "{body}");
    WsClient::connect(server_addr, body["token"].as_str().unwrap(), None).await
}

async fn publish(client: &mut WsClient, room: &str, id: Option<&str>, data: Value) -> Value {
    let mut op = json!({"op": "publish", "room": room, "data": data});
    if let Some(id) = id {
        op["id"] = json!(id);
    }
    client.request(op).await
}

fn head_of(http: &Http, room: &str) -> u64 {
    http.history_ok(room, Some(0), Some(1000))["head"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn an_allowed_publish_is_durable_delivered_with_from_and_in_history() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut reader = server.client("bob").await;
    reader.subscribe_ok("chat:1").await;
    let mut alice = publisher(server.addr, &http, "alice", json!(["chat:*"])).await;

    let reply = publish(&mut alice, "chat:1", Some("c-1"), json!({"text": "hi"})).await;
    assert_eq!(reply["op"], "published", "{reply}");
    assert_eq!(
        (&reply["room"], &reply["seq"], &reply["duplicate"]),
        (&json!("chat:1"), &json!(1), &json!(false)),
        "{reply}"
    );

    let events = reader.next_events(1).await;
    assert_eq!(events[0]["from"], "alice", "{}", events[0]);
    assert_eq!(
        (&events[0]["seq"], &events[0]["id"], &events[0]["data"]),
        (&json!(1), &json!("c-1"), &json!({"text": "hi"}))
    );

    let history = http.history_ok("chat:1", Some(0), Some(10));
    let stored = &history["events"][0];
    assert_eq!(
        (&stored["from"], &stored["seq"]),
        (&json!("alice"), &json!(1)),
        "history keeps from: {history}"
    );
    // The history op over the socket shows it too.
    let page = reader.history_op("chat:1", 0, 10).await;
    assert_eq!(page["events"][0]["from"], "alice", "{page}");

    // A backend's publish names no user.
    let backend = http.publish_ok("chat:1", None, json!({"text": "from the backend"}));
    let events = reader.next_events(1).await;
    assert_eq!(events[0]["seq"], backend["seq"]);
    assert_eq!(events[0].get("from"), None, "an HTTP publish carries no from: {}", events[0]);

    let metrics = http.metrics_text();
    assert_eq!(
        metric_value(&metrics, r#"livegate_client_publishes_total{outcome="published"}"#),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn from_cannot_be_forged_by_the_op_or_the_data() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut reader = server.client("bob").await;
    reader.subscribe_ok("chat:1").await;
    let mut mallory = publisher(server.addr, &http, "mallory", json!(["chat:*"])).await;

    // A `from` field in the op is not part of the protocol: refused, nothing appended.
    let refused = mallory
        .request(json!({"op": "publish", "room": "chat:1", "data": {}, "from": "admin"}))
        .await;
    assert_eq!(
        (&refused["op"], &refused["code"]),
        (&json!("error"), &json!("bad_request")),
        "{refused}"
    );
    assert_eq!(head_of(&http, "chat:1"), 0, "a refused publish appends nothing");

    // A `from` inside data stays inside data; the event's own `from` is the user's.
    let reply =
        publish(&mut mallory, "chat:1", None, json!({"from": "admin", "text": "trust me"})).await;
    assert_eq!(reply["op"], "published", "{reply}");
    let events = reader.next_events(1).await;
    assert_eq!(events[0]["from"], "mallory", "{}", events[0]);
    assert_eq!(events[0]["data"]["from"], "admin", "{}", events[0]);
    let raw = events[0].to_string();
    assert_eq!(raw.matches("\"from\":\"mallory\"").count(), 1, "{raw}");
}

#[tokio::test]
async fn rooms_outside_the_patterns_inboxes_and_tokens_without_publish_are_forbidden() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut alice =
        publisher(server.addr, &http, "alice", json!(["chat:*", "user:alice", "user:*"])).await;

    let cases = [
        ("news", "a room outside the patterns"),
        ("user:alice", "the own inbox, though a pattern names it"),
        ("user:bob", "another user's inbox"),
    ];
    for (room, why) in cases {
        let reply = publish(&mut alice, room, None, json!({"x": 1})).await;
        assert_eq!(
            (&reply["op"], &reply["code"]),
            (&json!("error"), &json!("forbidden")),
            "{why}: {reply}"
        );
        assert_eq!(head_of(&http, room), 0, "{why}: nothing appended");
    }
    let bad = publish(&mut alice, "bad room", None, json!({"x": 1})).await;
    assert_eq!(bad["code"], "bad_room", "{bad}");

    // The connection stays open and may still publish where it is allowed.
    let reply = publish(&mut alice, "chat:2", None, json!({"x": 2})).await;
    assert_eq!((&reply["op"], &reply["seq"]), (&json!("published"), &json!(1)), "{reply}");

    // A token without `publish` may not publish anywhere (it may read any room).
    let mut reader = server.client("carol").await;
    reader.subscribe_ok("chat:2").await;
    let reply = publish(&mut reader, "chat:2", None, json!({"x": 3})).await;
    assert_eq!(reply["code"], "forbidden", "{reply}");
    assert_eq!(head_of(&http, "chat:2"), 1);

    let metrics = http.metrics_text();
    assert_eq!(
        metric_value(&metrics, r#"livegate_client_publishes_total{outcome="forbidden"}"#),
        Some(4.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, r#"livegate_client_publishes_total{outcome="bad_room"}"#),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn patterns_are_validated_when_the_token_is_minted() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    for publish in [json!(["bad room"]), json!(["*"]), json!("chat:*"), json!([1])] {
        let (status, body) = http.mint_token_raw(json!({"user": "alice", "publish": publish}));
        assert_eq!((status, error_code(&body)), (400, "bad_request"), "publish {publish}: {body}");
    }
    let (status, body) =
        http.mint_token_raw(json!({"user": "alice", "publish": ["chat:*", "lobby"]}));
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn a_repeated_id_answers_duplicate_with_the_first_seq() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut alice = publisher(server.addr, &http, "alice", json!(["chat:*"])).await;
    let first = publish(&mut alice, "chat:1", Some("c-1"), json!({"n": 1})).await;
    publish(&mut alice, "chat:1", Some("c-2"), json!({"n": 2})).await;
    let again = publish(&mut alice, "chat:1", Some("c-1"), json!({"n": 1})).await;
    assert_eq!(
        (&again["op"], &again["seq"], &again["duplicate"]),
        (&json!("published"), &first["seq"], &json!(true)),
        "{again}"
    );
    assert_eq!(head_of(&http, "chat:1"), 2, "the duplicate appended nothing");
    // A client's ids are its user's (issue 29): a backend's publish with one is an event
    // of its own, never swallowed as the client's duplicate; its retry is its own.
    let (status, reply) = http.publish("chat:1", Some("c-2"), json!({"n": 2}));
    assert_eq!(
        (status, &reply["duplicate"], &reply["seq"]),
        (201, &json!(false), &json!(3)),
        "{reply}"
    );
    let (status, reply) = http.publish("chat:1", Some("c-2"), json!({"n": 2}));
    assert_eq!(
        (status, &reply["duplicate"], &reply["seq"]),
        (200, &json!(true), &json!(3)),
        "{reply}"
    );
}

#[tokio::test]
async fn data_over_max_event_bytes_is_refused_like_the_http_publish() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_event_bytes = 100);
    let http = server.http();
    let big = json!({"text": "x".repeat(200)});
    let (status, body) = http.publish("chat:1", None, big.clone());
    assert_eq!(status, 413, "{body}");
    let mut alice = publisher(server.addr, &http, "alice", json!(["chat:*"])).await;
    let reply = publish(&mut alice, "chat:1", None, big).await;
    assert_eq!(reply["code"], body["error"]["code"], "the HTTP publish's error: {reply} vs {body}");
    assert_eq!(reply["message"], body["error"]["message"], "{reply} vs {body}");
    assert_eq!(head_of(&http, "chat:1"), 0);
    let reply = publish(&mut alice, "chat:1", Some("has space"), json!(1)).await;
    assert_eq!(reply["code"], "bad_request", "a bad id: {reply}");
}

#[tokio::test]
async fn publishes_count_against_the_message_rate() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_messages_per_sec = 2);
    let http = server.http();
    let mut alice = publisher(server.addr, &http, "alice", json!(["chat:*"])).await;
    // Burst: twice the rate. Send more than that at once.
    for i in 0..8 {
        alice
            .send_json(
                &json!({"op": "publish", "room": "chat:1", "data": {"i": i}, "ref": 100 + i}),
            )
            .await;
    }
    let mut replies = Vec::new();
    while replies.len() < 8 {
        let frame = alice.recv_json().await;
        if frame.get("ref").is_some() {
            replies.push(frame);
        }
    }
    let published = replies.iter().filter(|r| r["op"] == "published").count();
    let limited = replies.iter().filter(|r| r["code"] == "rate_limited").count();
    assert!(limited >= 1, "some publishes were rate limited: {replies:?}");
    assert_eq!(published + limited, 8, "{replies:?}");
    assert_eq!(head_of(&http, "chat:1"), published as u64, "only the published ones were appended");
    let metrics = http.metrics_text();
    assert_eq!(
        metric_value(&metrics, r#"livegate_client_publishes_total{outcome="rate_limited"}"#),
        Some(limited as f64),
        "{metrics}"
    );
}

#[tokio::test]
async fn publishes_waiting_to_be_stored_are_bounded_even_without_a_message_rate() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_messages_per_sec = 0);
    let http = server.http();
    let mut alice = publisher(server.addr, &http, "alice", json!(["chat:*"])).await;
    // All in one write: the connection reads them far faster than the store takes them.
    const SENT: i64 = 1000;
    for i in 0..SENT {
        let op = json!({"op": "publish", "room": "chat:1", "data": {"i": i}, "ref": i});
        alice.ws.feed(Message::Text(op.to_string())).await.expect("queue a frame");
    }
    alice.ws.flush().await.expect("send the frames");
    let mut answered = std::collections::BTreeSet::new();
    let (mut published, mut limited) = (0, 0);
    while answered.len() < SENT as usize {
        let frame = alice.recv_json().await;
        let Some(reference) = frame["ref"].as_i64() else { continue };
        assert!(answered.insert(reference), "one answer per publish: {frame}");
        match (frame["op"].as_str(), frame["code"].as_str()) {
            (Some("published"), _) => published += 1,
            (Some("error"), Some("rate_limited")) => limited += 1,
            _ => panic!("unexpected answer {frame}"),
        }
    }
    assert!(limited > 0, "more than 64 publishes waited at once and none was refused");
    assert!(published >= 64, "{published} published");
    assert_eq!(head_of(&http, "chat:1"), published, "exactly the published ones were appended");
    // The connection stays usable: with nothing waiting, a publish goes through.
    let reply = publish(&mut alice, "chat:1", None, json!({"after": true})).await;
    assert_eq!(reply["op"], "published", "{reply}");
}

#[tokio::test]
async fn a_resumed_connection_keeps_its_publish_rights() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let first = publisher(server.addr, &http, "alice", json!(["chat:*"])).await;
    let resume = first.welcome["resume"].as_str().expect("resume credential").to_string();
    drop(first);
    let mut again =
        WsClient::try_connect_url(&format!("ws://{}/v1/ws?resume={resume}", server.addr))
            .await
            .expect("resume");
    let reply = publish(&mut again, "chat:1", None, json!({"after": "resume"})).await;
    assert_eq!((&reply["op"], &reply["seq"]), (&json!("published"), &json!(1)), "{reply}");
    let refused = publish(&mut again, "news", None, json!({})).await;
    assert_eq!(refused["code"], "forbidden", "the same patterns, no more: {refused}");
    assert_eq!(http.history_ok("chat:1", Some(0), Some(10))["events"][0]["from"], "alice");

    // A resumed connection of a token without publish rights still has none.
    let plain = server.client("bob").await;
    let resume = plain.welcome["resume"].as_str().expect("resume credential").to_string();
    drop(plain);
    let mut again =
        WsClient::try_connect_url(&format!("ws://{}/v1/ws?resume={resume}", server.addr))
            .await
            .expect("resume");
    assert_eq!(publish(&mut again, "chat:1", None, json!({})).await["code"], "forbidden");
}

#[tokio::test]
async fn a_published_event_survives_kill_9_right_after_the_reply() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let serve = ServeProcess::start(&data, &root.path().join("serve-1.log"), &[]);
    let http = Http::new(serve.addr);
    let mut alice = publisher(serve.addr, &http, "alice", json!(["chat:*"])).await;
    let mut acked = Vec::new();
    for i in 0..20 {
        let reply = publish(&mut alice, "chat:1", Some(&format!("c-{i}")), json!({"i": i})).await;
        assert_eq!(reply["op"], "published", "{reply}");
        acked.push(reply["seq"].as_u64().unwrap());
    }
    // No shutdown, no flush: SIGKILL right after the last `published`.
    serve.kill9();

    let serve = ServeProcess::start(&data, &root.path().join("serve-2.log"), &[]);
    let http = Http::new(serve.addr);
    let history = http.history_ok("chat:1", Some(0), Some(100));
    let events = history["events"].as_array().expect("events");
    assert_eq!(
        seqs(events),
        acked,
        "every acknowledged client publish survives kill -9: {history}"
    );
    assert!(events.iter().all(|e| e["from"] == "alice"), "with its from: {history}");
}
