//! Bad input never breaks the gateway: WebSocket mistakes get an `error` frame with a
//! code and the connection stays open; oversized frames close with 1009; bad HTTP
//! requests get 400/401/413 JSON errors; duplicate publishes are recognised. After all
//! of it the server still serves. A refusal of a request that named a room names it in
//! its `room` field, over WebSocket and HTTP.

use crate::common;

use common::*;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data as OpData, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::Message;

/// Sends `text` and expects an `error` frame with `code` (and the request's ref if it had
/// one), then checks the connection is still served.
async fn expect_ws_error(client: &mut WsClient, text: &str, code: &str) -> Value {
    client.send_text(text.to_string()).await;
    let reply = client.recv_json().await;
    assert_eq!(reply["op"], "error", "{text} -> {reply}");
    assert_eq!(reply["code"], code, "{text} -> {reply}");
    assert!(reply["message"].as_str().is_some_and(|m| !m.is_empty()), "{text} -> {reply}");
    if let Ok(req) = serde_json::from_str::<Value>(text) {
        if let Some(r) = req.get("ref").filter(|r| r.is_u64()) {
            assert_eq!(&reply["ref"], r, "the error echoes the ref: {text} -> {reply}");
        }
    }
    client.assert_alive().await;
    reply
}

#[tokio::test]
async fn ws_mistakes_get_error_frames_and_the_connection_stays_open() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let mut c = server.client("alice").await;

    expect_ws_error(&mut c, r#"{"op":"subscribe","room":"#, "bad_request").await;
    expect_ws_error(&mut c, "not json at all", "bad_request").await;
    expect_ws_error(&mut c, "[1,2,3]", "bad_request").await;
    expect_ws_error(&mut c, r#"{"op":"dance","ref":3}"#, "unknown_op").await;
    expect_ws_error(&mut c, r#"{"op":"subscribe","room":"bad room!","ref":4}"#, "bad_room").await;
    expect_ws_error(&mut c, r#"{"op":"subscribe","room":"","ref":5}"#, "bad_room").await;
    let long = "x".repeat(129);
    expect_ws_error(
        &mut c,
        &json!({"op": "subscribe", "room": long, "ref": 6}).to_string(),
        "bad_room",
    )
    .await;
    expect_ws_error(
        &mut c,
        r#"{"op":"history","room":"a/b","since":0,"limit":10,"ref":7}"#,
        "bad_room",
    )
    .await;
    expect_ws_error(&mut c, r#"{"op":"unsubscribe","room":"é","ref":8}"#, "bad_room").await;
    expect_ws_error(&mut c, r#"{"op":"subscribe","ref":9}"#, "bad_request").await;
    expect_ws_error(&mut c, r#"{"op":"history","ref":10}"#, "bad_request").await;
    expect_ws_error(
        &mut c,
        r#"{"op":"subscribe","room":"ok","since":"ten","epoch":"e","ref":11}"#,
        "bad_request",
    )
    .await;

    // No op at all: a missing field (bad_request) or an unknown op, but an error either way.
    c.send_text(r#"{"room":"x","ref":13}"#.into()).await;
    let reply = c.recv_json().await;
    assert_eq!(reply["op"], "error", "{reply}");
    assert!(reply["code"] == "bad_request" || reply["code"] == "unknown_op", "{reply}");
    c.assert_alive().await;

    // A room name at the limit is fine.
    let max_room = "r".repeat(128);
    c.subscribe_ok(&max_room).await;
    // And the connection still does its job.
    c.subscribe_ok("ok").await;
    server.http().publish_ok("ok", None, json!("still here"));
    assert_eq!(c.next_events(1).await[0]["data"], "still here");
}

#[tokio::test]
async fn too_many_subscriptions_is_an_error_and_unsubscribing_frees_a_slot() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_subscriptions = 3);
    let mut c = server.client("alice").await;
    for room in ["a", "b", "c"] {
        c.subscribe_ok(room).await;
    }
    let reply = c.subscribe("d").await;
    assert_eq!(reply["op"], "error", "{reply}");
    assert_eq!(reply["code"], "too_many_subscriptions", "{reply}");
    c.assert_alive().await;

    // The refused room is not subscribed.
    server.http().publish_ok("d", None, json!(1));
    c.assert_quiet(QUIET).await;

    let reply = c.unsubscribe("a").await;
    assert_eq!(reply["op"], "unsubscribed", "{reply}");
    c.subscribe_ok("d").await;
    server.http().publish_ok("d", None, json!(2));
    assert_eq!(c.next_events(1).await[0]["data"], 2);
}

#[tokio::test]
async fn text_frame_over_64_kib_closes_with_1009() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});

    // Just under the limit: answered (pong or an error about the extra field), not closed.
    let mut c = server.client("alice").await;
    let near = json!({"op": "ping", "ref": 1, "pad": "p".repeat(60 * 1024)}).to_string();
    assert!(near.len() < 64 * 1024);
    c.send_text(near).await;
    let reply = c.recv_json().await;
    assert!(reply["op"] == "pong" || reply["op"] == "error", "{reply}");
    c.assert_alive().await;

    let big = json!({"op": "ping", "pad": "p".repeat(70 * 1024)}).to_string();
    c.send_text(big).await;
    assert_eq!(c.close_code().await, Some(1009), "a frame over 64 KiB closes with 1009");

    // The server is fine and serves new connections.
    let mut c = server.client("alice").await;
    c.assert_alive().await;
}

#[tokio::test]
async fn fragmented_messages_are_assembled_and_capped() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let mut c = server.client("alice").await;

    // A small message in two fragments is one request.
    let text = r#"{"op":"ping","ref":77}"#.as_bytes();
    let (a, b) = text.split_at(9);
    c.send_message(Message::Frame(Frame::message(a.to_vec(), OpCode::Data(OpData::Text), false)))
        .await;
    c.send_message(Message::Frame(Frame::message(
        b.to_vec(),
        OpCode::Data(OpData::Continue),
        true,
    )))
    .await;
    let reply = c.recv_json().await;
    assert_eq!(reply, json!({"op": "pong", "ref": 77}), "fragments are reassembled");

    // Fragments each under the limit, together over it: 1009.
    let chunk = vec![b' '; 40 * 1024];
    c.send_message(Message::Frame(Frame::message(
        b"{\"op\":\"ping\",\"x\":\"".to_vec(),
        OpCode::Data(OpData::Text),
        false,
    )))
    .await;
    c.send_message(Message::Frame(Frame::message(
        chunk.clone(),
        OpCode::Data(OpData::Continue),
        false,
    )))
    .await;
    c.send_message(Message::Frame(Frame::message(chunk, OpCode::Data(OpData::Continue), true)))
        .await;
    assert_eq!(
        c.close_code().await,
        Some(1009),
        "an assembled message over 64 KiB closes with 1009"
    );
}

#[tokio::test]
async fn garbage_frames_under_the_abuse_threshold_keep_the_connection() {
    let _gate = crate::common::gate!();
    let seed = test_seed(0xBAD_1A7E);
    let mut rng = Rng::new(seed);
    // Below max_bad_messages a broken client is answered, not closed (tests/it/limits.rs
    // covers the close with 1008 past it).
    let server = TestServer::start(|c| c.max_bad_messages = 1000);
    let mut c = server.client("alice").await;
    let templates = [
        r#"{"op":"subscribe","room":"g","since":3,"epoch":"x"}"#,
        r#"{"op":"history","room":"g","since":0,"limit":10}"#,
        r#"{"op":"unsubscribe","room":"g"}"#,
        r#"{"op":"ping"}"#,
        r#"{"op":"subscribe","room":"g"}"#,
    ];
    let alphabet = br#"{}[]":,0123456789-.eE aopsubcrmlinthy\ufdx"#;
    for i in 0..150 {
        let mut bytes = templates[i % templates.len()].as_bytes().to_vec();
        for _ in 0..rng.range(1, 4) {
            let at = rng.range(0, bytes.len() as u64) as usize;
            bytes[at] = alphabet[rng.range(0, alphabet.len() as u64) as usize];
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        c.send_text(text).await;
    }
    // Whatever each garbage frame earned, the connection answers a ping afterwards.
    c.assert_alive().await;
    let mut c2 = server.client("bob").await;
    c2.assert_alive().await;
}

#[tokio::test]
async fn oversized_event_is_413_and_not_stored() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_event_bytes = 1024);
    let http = server.http();
    let mut c = server.client("alice").await;
    c.subscribe_ok("big").await;

    // data = a JSON string whose text is exactly 1024 bytes: accepted.
    let at_limit = json!("a".repeat(1022));
    assert_eq!(at_limit.to_string().len(), 1024);
    let (status, body) = http.publish("big", None, at_limit.clone());
    assert_eq!(status, 201, "data of exactly max_event_bytes: {body}");

    let over = json!("a".repeat(1023));
    let (status, body) = http.publish("big", None, over);
    assert_eq!(status, 413, "{body}");
    assert_eq!(error_code(&body), "payload_too_large", "{body}");

    let (status, body) = http.publish("big", None, json!({"blob": "z".repeat(100_000)}));
    assert_eq!(status, 413, "{body}");

    let events = c.next_events(1).await;
    assert_eq!(events[0]["data"], at_limit);
    c.assert_quiet(QUIET).await;
    let h = http.history_ok("big", Some(0), None);
    assert_eq!(h["head"], 1, "refused events take no seq: {h}");
}

#[tokio::test]
async fn bad_http_requests_get_json_errors() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let publish = |path: &str, auth: Auth, body: Body| http.request("POST", path, auth, body);
    let ok = || Body::Json(json!({"data": 1}));

    for room in ["bad%20room", "r%21", "%C3%A9"] {
        let (status, body) = publish(&format!("/v1/rooms/{room}/events"), Auth::Key, ok());
        assert_eq!((status, error_code(&body)), (400, "bad_room"), "publish to {room}: {body}");
        let (status, body) =
            http.request("GET", &format!("/v1/rooms/{room}/events"), Auth::Key, Body::None);
        assert_eq!((status, error_code(&body)), (400, "bad_room"), "history of {room}: {body}");
    }
    let long = "x".repeat(129);
    let (status, body) = publish(&format!("/v1/rooms/{long}/events"), Auth::Key, ok());
    assert_eq!((status, error_code(&body)), (400, "bad_room"), "129-char room: {body}");

    let path = "/v1/rooms/fine/events";
    for raw in [r#"{"data": "#, "", "[1]", r#"{"id":"x"}"#] {
        let (status, body) = publish(path, Auth::Key, Body::Raw(raw));
        assert_eq!(
            (status, error_code(&body)),
            (400, "bad_request"),
            "publish body {raw:?}: {body}"
        );
    }

    for auth in [
        Auth::None,
        Auth::Header("Bearer wrong-key"),
        Auth::Header(&format!("Basic {API_KEY}")),
        Auth::Header(API_KEY),
    ] {
        let (status, body) = publish(path, auth, ok());
        assert_eq!((status, error_code(&body)), (401, "unauthorized"), "{body}");
    }

    let (status, body) =
        http.request("GET", "/v1/rooms/fine/events?since=abc", Auth::Key, Body::None);
    assert_eq!((status, error_code(&body)), (400, "bad_request"), "since=abc: {body}");

    // Nothing of the above was stored.
    let h = http.history_ok("fine", Some(0), None);
    assert_eq!(h["head"], 0, "{h}");

    // And the server still serves.
    let (status, _) = http.request("GET", "/healthz", Auth::None, Body::None);
    assert_eq!(status, 200);
    let mut c = server.client("alice").await;
    c.subscribe_ok("fine").await;
    http.publish_ok("fine", None, json!("works"));
    assert_eq!(c.next_events(1).await[0]["data"], "works");
}

#[tokio::test]
async fn http_history_needs_the_api_key() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    http.publish_ok("secret", None, json!("s"));
    let (status, body) = http.request("GET", "/v1/rooms/secret/events", Auth::None, Body::None);
    assert_eq!((status, error_code(&body)), (401, "unauthorized"), "{body}");
    let (status, body) =
        http.request("GET", "/v1/rooms/secret/events", Auth::Header("Bearer nope"), Body::None);
    assert_eq!((status, error_code(&body)), (401, "unauthorized"), "{body}");
}

#[tokio::test]
async fn duplicate_publish_returns_the_first_seq_and_is_delivered_once() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut c = server.client("alice").await;
    c.subscribe_ok("idem").await;

    let (status, first) = http.publish("idem", Some("e-1"), json!({"v": 1}));
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["duplicate"], false);
    let (status, again) = http.publish("idem", Some("e-1"), json!({"v": 1}));
    assert_eq!(status, 200, "a repeated id is 200: {again}");
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["seq"], first["seq"], "{again}");
    assert_eq!(again["epoch"], first["epoch"], "{again}");
    // Different data under the same id is still the same event.
    let (status, third) = http.publish("idem", Some("e-1"), json!({"v": "changed"}));
    assert_eq!(
        (status, &third["seq"], &third["duplicate"]),
        (200, &first["seq"], &json!(true)),
        "{third}"
    );

    let (status, next) = http.publish("idem", Some("e-2"), json!({"v": 2}));
    assert_eq!(status, 201, "{next}");
    assert_eq!(seq_of(&next), seq_of(&first) + 1, "a duplicate takes no seq");
    // The same id in another room is another event.
    let (status, other) = http.publish("idem-other", Some("e-1"), json!({"v": 1}));
    assert_eq!((status, &other["duplicate"]), (201, &json!(false)), "{other}");

    let events = c.next_events(2).await;
    assert_eq!(seqs(&events), vec![1, 2]);
    assert_eq!(events[0]["data"], json!({"v": 1}), "the first publish wins");
    c.assert_quiet(QUIET).await;
    let h = http.history_ok("idem", Some(0), None);
    assert_eq!(h["events"].as_array().unwrap(), &events);
}

#[tokio::test]
async fn concurrent_publishes_of_one_id_make_one_event() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut c = server.client("alice").await;
    c.subscribe_ok("race").await;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let http = http.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                http.publish("race", Some("retry-storm"), json!("once"))
            })
        })
        .collect();
    let replies: Vec<(u16, Value)> =
        handles.into_iter().map(|h| h.join().expect("publisher")).collect();
    let created = replies.iter().filter(|(s, _)| *s == 201).count();
    let dups = replies.iter().filter(|(s, b)| *s == 200 && b["duplicate"] == true).count();
    assert_eq!((created, dups), (1, 7), "one 201 and seven 200 duplicates: {replies:?}");
    assert!(replies.iter().all(|(_, b)| b["seq"] == 1), "all name seq 1: {replies:?}");
    assert_eq!(seqs(&c.next_events(1).await), vec![1]);
    c.assert_quiet(QUIET).await;
    assert_eq!(http.history_ok("race", Some(0), None)["head"], 1);
}

#[tokio::test]
async fn duplicate_publish_is_recognised_after_restart() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let first = server.http().publish_ok("idem", Some("retry-me"), json!("once"));
    let dir = server.stop();
    let server = TestServer::start_in(dir, |_| {});
    let (status, again) = server.publish("idem", Some("retry-me"), json!("once"));
    assert_eq!(
        status, 200,
        "a backend retrying across a restart must not create a second event: {again}"
    );
    assert_eq!(again["seq"], first["seq"], "{again}");
    assert_eq!(again["duplicate"], true, "{again}");
    let h = server.http().history_ok("idem", Some(0), None);
    assert_eq!(h["head"], 1, "{h}");
}

#[tokio::test]
async fn ws_refusals_name_the_room_the_request_named() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_history_limit = 10);
    let http = server.http();
    let (status, body) =
        http.mint_token_raw(json!({"user": "alice", "rooms": ["match:*"], "publish": ["chat:*"]}));
    assert_eq!(status, 201, "{body}");
    let mut c = WsClient::connect(server.addr, body["token"].as_str().unwrap(), None).await;
    let cases = [
        (json!({"op": "subscribe", "room": "secret:1", "ref": 1}), "forbidden", Some("secret:1")),
        (json!({"op": "subscribe", "room": "bad room", "ref": 2}), "bad_room", Some("bad room")),
        (
            json!({"op": "subscribe", "room": "match:1", "since": "ten", "ref": 3}),
            "bad_request",
            Some("match:1"),
        ),
        (json!({"op": "unsubscribe", "room": "é", "ref": 4}), "bad_room", Some("é")),
        (
            json!({"op": "history", "room": "match:2", "since": 0, "limit": 11, "ref": 5}),
            "bad_request",
            Some("match:2"),
        ),
        (
            json!({"op": "history", "room": "secret:2", "since": 0, "ref": 6}),
            "forbidden",
            Some("secret:2"),
        ),
        (json!({"op": "presence", "room": "secret:3", "ref": 7}), "forbidden", Some("secret:3")),
        (
            json!({"op": "publish", "room": "match:1", "data": 1, "ref": 8}),
            "forbidden",
            Some("match:1"),
        ),
        (json!({"op": "ping", "extra": 1, "ref": 9}), "bad_request", None),
        (json!({"op": "dance", "room": "match:1", "ref": 10}), "unknown_op", None),
    ];
    for (request, code, room) in cases {
        let reply = expect_ws_error(&mut c, &request.to_string(), code).await;
        assert_eq!(reply["room"].as_str(), room, "{request} -> {reply}");
    }
}

#[tokio::test]
async fn http_refusals_of_a_rooms_route_name_the_room() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_history_limit = 10);
    let http = server.http();
    let cases = [
        (
            "GET",
            "/v1/rooms/match:1/events?limit=11",
            Auth::Key,
            Body::None,
            400,
            "bad_request",
            Some("match:1"),
        ),
        (
            "POST",
            "/v1/rooms/match:2/events",
            Auth::Key,
            Body::Raw("{"),
            400,
            "bad_request",
            Some("match:2"),
        ),
        (
            "POST",
            "/v1/rooms/match:3/events",
            Auth::None,
            Body::Json(json!({"data": 1})),
            401,
            "unauthorized",
            Some("match:3"),
        ),
        (
            "GET",
            "/v1/rooms/user:u1/state",
            Auth::Key,
            Body::None,
            400,
            "bad_request",
            Some("user:u1"),
        ),
        (
            "PUT",
            "/v1/rooms/match:4/state",
            Auth::Key,
            Body::Json(json!({})),
            400,
            "bad_request",
            Some("match:4"),
        ),
        (
            "GET",
            "/v1/rooms/bad%20room/presence",
            Auth::Key,
            Body::None,
            400,
            "bad_room",
            Some("bad room"),
        ),
        ("POST", "/v1/tokens", Auth::Key, Body::Json(json!({})), 400, "bad_request", None),
    ];
    for (method, path, auth, body, status, code, room) in cases {
        let (got, answer) = http.request(method, path, auth, body);
        assert_eq!((got, error_code(&answer)), (status, code), "{method} {path}: {answer}");
        assert_eq!(answer["error"]["room"].as_str(), room, "{method} {path}: {answer}");
    }
}
