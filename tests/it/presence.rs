//! Presence on one node, against a real server and real WebSocket and SSE
//! clients: counts and members by distinct (user, device), several tabs counted once,
//! leaving, the frames of subscribers that asked (at most once per interval, none when
//! nothing changed, count only above `presence_members_max`), `GET
//! /v1/rooms/{room}/presence` and the `presence` op with the token's read rights.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const INTERVAL_MS: u64 = 300;

fn start(members_max: usize) -> TestServer {
    TestServer::start(|c| {
        c.presence_interval_ms = INTERVAL_MS;
        c.presence_members_max = members_max;
    })
}

async fn connect(server: &TestServer, user: &str, device: &str) -> WsClient {
    WsClient::connect(server.addr, &server.mint_token(user, device), None).await
}

/// Subscribe with `presence: true`; returns the first presence frame (the room as of
/// its last frame).
async fn watch(client: &mut WsClient, room: &str) -> Value {
    let reply = client.request(json!({"op": "subscribe", "room": room, "presence": true})).await;
    assert_eq!(reply["op"], "subscribed", "{reply}");
    next_presence(client, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("no presence snapshot after subscribing to {room}"))
}

/// The next presence frame within `within` (other frames are skipped).
async fn next_presence(client: &mut WsClient, within: Duration) -> Option<Value> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = client.recv_within(left).await?;
        if frame["op"] == "presence" {
            return Some(frame);
        }
    }
}

/// Presence frames until one has `count` (panics after `within`).
async fn until_count(client: &mut WsClient, count: u64, within: Duration) -> Vec<Value> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_presence(client, left).await {
            Some(frame) => {
                let done = frame["count"] == count;
                seen.push(frame);
                if done {
                    return seen;
                }
            }
            None => panic!("no presence frame with count {count} within {within:?}; saw {seen:?}"),
        }
    }
}

fn member(user: &str, device: &str) -> Value {
    json!({"user": user, "device": device})
}

fn get_presence(http: &Http, room: &str) -> (u16, Value) {
    http.request("GET", &format!("/v1/rooms/{room}/presence"), Auth::Key, Body::None)
}

#[tokio::test]
async fn counts_members_once_per_user_and_device_and_follows_who_leaves() {
    let _gate = crate::common::gate!();
    let server = start(1000);
    let http = server.http();
    let mut ann = connect(&server, "ann", "web").await;
    let first = watch(&mut ann, "lobby:1").await;
    assert_eq!(
        first,
        json!({"op": "presence", "room": "lobby:1", "count": 0, "joined": [], "left": []}),
        "nothing sent yet"
    );
    let joined = next_presence(&mut ann, WAIT).await.expect("ann's own join");
    assert_eq!(
        joined,
        json!({"op": "presence", "room": "lobby:1", "count": 1, "joined": [member("ann", "web")], "left": []})
    );

    // Bob in two tabs (one user and device) and on his phone: two more members.
    let mut bob_tab1 = connect(&server, "bob", "web").await;
    bob_tab1.subscribe_ok("lobby:1").await;
    let mut bob_tab2 = connect(&server, "bob", "web").await;
    bob_tab2.subscribe_ok("lobby:1").await;
    let mut bob_phone = connect(&server, "bob", "phone").await;
    bob_phone.subscribe_ok("lobby:1").await;
    let frames = until_count(&mut ann, 3, WAIT).await;
    let mut joined: Vec<Value> =
        frames.iter().flat_map(|f| f["joined"].as_array().unwrap().clone()).collect();
    joined.sort_by_key(|m| m.to_string());
    assert_eq!(joined, vec![member("bob", "phone"), member("bob", "web")], "{frames:?}");

    let (status, body) = get_presence(&http, "lobby:1");
    assert_eq!(status, 200, "{body}");
    let want = json!({"room": "lobby:1", "count": 3,
        "members": [member("ann", "web"), member("bob", "phone"), member("bob", "web")]});
    assert_eq!(body, want);
    let reply = bob_phone.request(json!({"op": "presence", "room": "lobby:1"})).await;
    assert_eq!(reply["op"], "presence", "{reply}");
    assert_eq!((&reply["count"], &reply["members"]), (&want["count"], &want["members"]), "{reply}");

    // One of bob's tabs goes: bob on the web is still there, nothing changed.
    bob_tab1.close().await;
    assert_eq!(
        next_presence(&mut ann, Duration::from_millis(INTERVAL_MS * 3)).await,
        None,
        "a tab leaving is no change"
    );
    assert_eq!(get_presence(&http, "lobby:1").1["count"], 3);
    // The other tab unsubscribes: now bob on the web left.
    let reply = bob_tab2.unsubscribe("lobby:1").await;
    assert_eq!(reply["op"], "unsubscribed", "{reply}");
    let left = next_presence(&mut ann, WAIT).await.expect("bob's web leaving");
    assert_eq!(
        left,
        json!({"op": "presence", "room": "lobby:1", "count": 2, "joined": [], "left": [member("bob", "web")]})
    );
    bob_phone.close().await;
    let left = next_presence(&mut ann, WAIT).await.expect("bob's phone leaving");
    assert_eq!(
        (&left["count"], &left["left"]),
        (&json!(1), &json!([member("bob", "phone")])),
        "{left}"
    );

    // A subscriber without presence gets no presence frames; a late watcher gets the
    // room as of its last frame.
    let mut cy = connect(&server, "cy", "web").await;
    cy.subscribe_ok("lobby:1").await;
    let mut dee = connect(&server, "dee", "web").await;
    let snapshot = watch(&mut dee, "lobby:1").await;
    assert!(snapshot["count"].as_u64().unwrap() >= 1, "{snapshot}");
    let frames = until_count(&mut dee, 3, WAIT).await;
    let last = frames.last().unwrap();
    assert_eq!(last["count"], 3, "{frames:?}");
    assert_eq!(
        next_presence(&mut cy, Duration::from_millis(INTERVAL_MS * 2)).await,
        None,
        "cy did not ask for presence"
    );
}

#[tokio::test]
async fn frames_come_at_most_once_per_interval_and_only_on_change() {
    let _gate = crate::common::gate!();
    let server = start(1000);
    let mut watcher = connect(&server, "watcher", "web").await;
    watch(&mut watcher, "busy:1").await;
    let _ = until_count(&mut watcher, 1, WAIT).await;

    // Churn for ~6 intervals: clients come and go every 30 ms.
    let started = Instant::now();
    let churn = Duration::from_millis(INTERVAL_MS * 6);
    let addr = server.addr;
    let tokens: Vec<String> =
        (0..40).map(|i| server.mint_token(&format!("churn-{i}"), "web")).collect();
    let churner = tokio::spawn(async move {
        let mut open: Vec<WsClient> = Vec::new();
        for (i, token) in tokens.into_iter().enumerate() {
            if started.elapsed() >= churn {
                break;
            }
            let mut client = WsClient::connect(addr, &token, None).await;
            client.subscribe_ok("busy:1").await;
            open.push(client);
            if i % 3 == 2 {
                open.remove(0).close().await;
            }
            common::pace_async(Duration::from_millis(30), "a client comes or goes every 30 ms")
                .await;
        }
        open
    });
    let mut frames: Vec<(Instant, Value)> = Vec::new();
    while started.elapsed() < churn + Duration::from_millis(INTERVAL_MS * 2) {
        if let Some(frame) = next_presence(&mut watcher, Duration::from_millis(50)).await {
            frames.push((Instant::now(), frame));
        }
    }
    let open = churner.await.expect("churner");
    let elapsed = started.elapsed().as_millis() as u64;
    // One frame per interval at most (plus the one that may open the period).
    let most = elapsed / INTERVAL_MS + 1;
    assert!(frames.len() >= 2, "churn made frames: {frames:?}");
    assert!(
        frames.len() as u64 <= most,
        "{} frames in {elapsed} ms with a {INTERVAL_MS} ms interval (at most {most})",
        frames.len()
    );
    // The frames add up to the room as it is.
    let count = frames.last().unwrap().1["count"].as_u64().unwrap();
    assert_eq!(count, open.len() as u64 + 1, "last frame {:?}", frames.last());
    // Nothing changes: nothing is sent.
    assert_eq!(next_presence(&mut watcher, Duration::from_millis(INTERVAL_MS * 4)).await, None);
    drop(open);
}

#[tokio::test]
async fn above_members_max_only_counts_are_sent() {
    let _gate = crate::common::gate!();
    let server = start(2);
    let http = server.http();
    let mut ann = connect(&server, "ann", "web").await;
    watch(&mut ann, "big:1").await;
    until_count(&mut ann, 1, WAIT).await;
    let mut bob = connect(&server, "bob", "web").await;
    bob.subscribe_ok("big:1").await;
    until_count(&mut ann, 2, WAIT).await;
    let mut cy = connect(&server, "cy", "web").await;
    cy.subscribe_ok("big:1").await;
    let frames = until_count(&mut ann, 3, WAIT).await;
    assert_eq!(
        frames.last().unwrap(),
        &json!({"op": "presence", "room": "big:1", "count": 3, "joined": null, "left": null})
    );
    assert_eq!(
        get_presence(&http, "big:1").1,
        json!({"room": "big:1", "count": 3, "members": null})
    );
    let reply = bob.request(json!({"op": "presence", "room": "big:1"})).await;
    assert_eq!((&reply["count"], &reply["members"]), (&json!(3), &Value::Null), "{reply}");
    // A watcher arriving now gets the count alone.
    let mut dee = connect(&server, "dee", "web").await;
    let snapshot = watch(&mut dee, "big:1").await;
    assert_eq!((&snapshot["count"], &snapshot["joined"]), (&json!(3), &Value::Null), "{snapshot}");
    until_count(&mut ann, 4, WAIT).await;
    // Back under the bound: the lists come back, every member in joined.
    cy.close().await;
    dee.close().await;
    let frames = until_count(&mut ann, 2, WAIT).await;
    let last = frames.last().unwrap();
    assert_eq!(
        (&last["joined"], &last["left"]),
        (&json!([member("ann", "web"), member("bob", "web")]), &json!([])),
        "{frames:?}"
    );
}

#[tokio::test]
async fn the_http_answer_and_the_op_follow_the_rules_of_reading() {
    let _gate = crate::common::gate!();
    let server = start(1000);
    let http = server.http();
    // An empty room, no actor: nobody.
    assert_eq!(
        get_presence(&http, "empty:1"),
        (200, json!({"room": "empty:1", "count": 0, "members": []}))
    );
    let (status, body) = http.request("GET", "/v1/rooms/empty:1/presence", Auth::None, Body::None);
    assert_eq!((status, error_code(&body)), (401, "unauthorized"), "{body}");
    let (status, body) = get_presence(&http, "bad%20room");
    assert_eq!((status, error_code(&body)), (400, "bad_room"), "{body}");
    // Inboxes keep no presence, and the automatic inbox subscription is nobody.
    let mut ann = connect(&server, "ann", "web").await;
    let (status, body) = get_presence(&http, "user:ann");
    assert_eq!((status, error_code(&body)), (404, "presence_off"), "{body}");
    let reply = ann.request(json!({"op": "presence", "room": "user:ann"})).await;
    assert_eq!(
        (&reply["op"], &reply["code"]),
        (&json!("error"), &json!("presence_off")),
        "{reply}"
    );

    // The op needs the right to read the room.
    let (status, token) = http.mint_token_raw(json!({"user": "limited", "rooms": ["public:*"]}));
    assert_eq!(status, 201, "{token}");
    let mut limited = WsClient::connect(server.addr, token["token"].as_str().unwrap(), None).await;
    let reply = limited.request(json!({"op": "presence", "room": "secret:1"})).await;
    assert_eq!((&reply["op"], &reply["code"]), (&json!("error"), &json!("forbidden")), "{reply}");
    let reply = limited.request(json!({"op": "presence", "room": "user:ann"})).await;
    assert_eq!(reply["code"], "forbidden", "another user's inbox: {reply}");
    limited.subscribe_ok("public:1").await;
    let reply = limited.request(json!({"op": "presence", "room": "public:1"})).await;
    assert_eq!(
        (&reply["op"], &reply["room"], &reply["count"]),
        (&json!("presence"), &json!("public:1"), &json!(1)),
        "{reply}"
    );
    assert_eq!(reply["members"], json!([member("limited", "web")]));
    let reply = limited.request(json!({"op": "presence"})).await;
    assert_eq!(reply["code"], "bad_request", "{reply}");
    limited.assert_alive().await;
}

// ---- SSE ----

/// A minimal SSE reader: the chunked body as text, messages split on blank lines.
struct SseStream {
    stream: tokio::net::TcpStream,
    raw: Vec<u8>,
    body: String,
}

impl SseStream {
    async fn open(addr: SocketAddr, query: &str) -> SseStream {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!(
            "GET /v1/sse?{query} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut sse = SseStream { stream, raw: Vec::new(), body: String::new() };
        loop {
            if let Some(at) = sse.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&sse.raw[..at]).to_string();
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                sse.raw.drain(..at + 4);
                return sse;
            }
            sse.fill(WAIT).await;
        }
    }

    async fn fill(&mut self, within: Duration) -> bool {
        let mut buf = [0u8; 16 * 1024];
        match tokio::time::timeout(within, self.stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                self.raw.extend_from_slice(&buf[..n]);
                true
            }
            Ok(_) => panic!("SSE stream ended"),
            Err(_) => false,
        }
    }

    fn decode(&mut self) {
        while let Some(end) = self.raw.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(String::from_utf8_lossy(&self.raw[..end]).trim(), 16)
                .expect("chunk size");
            if self.raw.len() < end + 2 + size + 2 {
                return;
            }
            self.body
                .push_str(std::str::from_utf8(&self.raw[end + 2..end + 2 + size]).expect("UTF-8"));
            self.raw.drain(..end + 2 + size + 2);
        }
    }

    /// The data of the next message named `event` within `within`.
    async fn next_event(&mut self, event: &str, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            self.decode();
            while let Some(end) = self.body.find("\n\n") {
                let message: String = self.body.drain(..end + 2).collect();
                let named = message.lines().any(|l| l == format!("event: {event}"));
                let data: Vec<&str> =
                    message.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                if named {
                    return Some(serde_json::from_str(&data.join("\n")).expect("JSON data"));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.fill(left).await && Instant::now() >= deadline {
                return None;
            }
        }
    }
}

#[tokio::test]
async fn sse_streams_get_presence_messages_with_presence_1() {
    let _gate = crate::common::gate!();
    let server = start(1000);
    let token = server.mint_token("sse-user", "tv");
    let mut sse =
        SseStream::open(server.addr, &format!("token={token}&rooms=show:1&presence=1")).await;
    let snapshot = sse.next_event("presence", WAIT).await.expect("the snapshot");
    assert_eq!(snapshot["room"], "show:1", "{snapshot}");
    let mut ws = connect(&server, "ws-user", "web").await;
    ws.subscribe_ok("show:1").await;
    let deadline = Instant::now() + WAIT;
    loop {
        let frame = sse
            .next_event("presence", deadline.saturating_duration_since(Instant::now()))
            .await
            .expect("a presence message with both members");
        if frame["count"] == 2 {
            break;
        }
    }
    // The member list holds the SSE stream's user too: it is a subscriber like any other.
    let (_, body) = get_presence(&server.http(), "show:1");
    assert_eq!(
        body["members"],
        json!([member("sse-user", "tv"), member("ws-user", "web")]),
        "{body}"
    );
    // Without presence=1, none.
    let token = server.mint_token("quiet", "web");
    let mut quiet = SseStream::open(server.addr, &format!("token={token}&rooms=show:1")).await;
    assert_eq!(quiet.next_event("presence", Duration::from_millis(INTERVAL_MS * 3)).await, None);
    let (status, body) = server.http().request(
        "GET",
        &format!("/v1/sse?token={}&rooms=show:1&presence=yes", server.mint_token("x", "web")),
        Auth::None,
        Body::None,
    );
    assert_eq!((status, error_code(&body)), (400, "bad_request"), "{body}");
}
