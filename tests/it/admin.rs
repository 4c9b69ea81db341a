//! The admin overview (issue 20) from the outside: `GET /v1/admin/overview`
//! behind the API key, against a real server and real WebSocket subscribers.
//!
//! - No key, a wrong key, or a key in the wrong scheme: 401 with the JSON error body.
//! - The fields the admin page reads are there, with their types; on one node the nodes
//!   list is this node alone, `self`, with its phase.
//! - A subscribed room is listed with its subscriber count and its head seq, which move
//!   as subscribers come and go and events are published; the counters move with them.
//!   A connection's automatic inbox is never listed.
//! - More than 20 rooms: the 20 busiest, busiest first.
//! - `GET /admin` serves the page without a key, and the page holds no node data.
//!
//! Every wait is bounded.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn overview(server: &TestServer) -> Value {
    let (status, body) = server.http().request("GET", "/v1/admin/overview", Auth::Key, Body::None);
    assert_eq!(status, 200, "GET /v1/admin/overview: {body}");
    body
}

/// Polls the overview until `ok` holds (the rooms' answer is reused for up to 0.5 s).
fn overview_until(server: &TestServer, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    wait_for_every(WAIT, Duration::from_millis(50), || {
        last = overview(server);
        ok(&last).then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("timed out waiting for {what}; the last overview: {last:#}"))
}

fn room<'a>(body: &'a Value, name: &str) -> Option<&'a Value> {
    body["rooms"].as_array().expect("rooms is an array").iter().find(|r| r["room"] == name)
}

fn listed(body: &Value, name: &str, subscribers: u64, head: u64) -> bool {
    room(body, name).is_some_and(|r| r["subscribers"] == subscribers && r["head"] == head)
}

#[test]
fn the_overview_needs_the_api_key() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    for (auth, why) in [
        (Auth::None, "no Authorization header"),
        (Auth::Header("Bearer not-the-key"), "a wrong key"),
        (Auth::Header(&format!("Basic {API_KEY}")), "the key in another scheme"),
    ] {
        let (status, body) = http.request("GET", "/v1/admin/overview", auth, Body::None);
        assert_eq!(status, 401, "{why}: {body}");
        assert_eq!(error_code(&body), "unauthorized", "{why}: {body}");
        assert!(
            body.get("rooms").is_none() && body.get("counters").is_none(),
            "{why}: no data in a refusal: {body}"
        );
    }
}

#[test]
fn the_overview_has_every_field_the_page_reads() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let body = overview(&server);
    assert_eq!(body["node"], NODE);
    assert_eq!(body["phase"], "ready");
    assert!(body["version"].is_string(), "{body}");
    let now = now_ms();
    let ts = body["ts_ms"].as_u64().expect("ts_ms");
    assert!(ts.abs_diff(now) < 60_000, "ts_ms {ts} is the server's clock (now {now})");
    assert!(body["uptime_secs"].as_u64().is_some(), "{body}");
    for field in ["connections", "subscriptions", "rooms_live"] {
        assert_eq!(body[field], 0, "{field} on an idle node: {body}");
    }
    assert_eq!(body["rooms"], json!([]), "no live room yet: {body}");
    let url = format!("http://{}", server.addr);
    // One node, itself, with its load: nothing open of the limit in force.
    let capacity = body["nodes"][0]["capacity"]
        .as_u64()
        .filter(|c| *c > 0)
        .unwrap_or_else(|| panic!("no capacity: {body}"));
    assert_eq!(
        body["nodes"],
        json!([{"node": NODE, "url": url, "phase": "ready", "self": true, "cell": "default", "connections": 0, "capacity": capacity, "headroom": capacity, "full": false}]),
        "one node: itself"
    );
    for counter in ["publishes", "deliveries", "slow_consumers", "migrations"] {
        assert_eq!(body["counters"][counter], 0, "{counter} on an idle node: {body}");
    }
    // A single node takes no live copies: no lag, no mirror.
    assert_eq!(body["lag"], json!({"events": 0, "seconds": 0.0, "rooms_behind": 0}), "{body}");
    assert_eq!(body["mirrors"], json!([]), "{body}");
}

#[tokio::test]
async fn a_subscribed_room_is_listed_with_its_subscribers_and_head() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let mut alice = server.client("alice").await;
    alice.subscribe_ok("lobby").await;
    let body =
        overview_until(&server, "lobby with 1 subscriber at head 0", |b| listed(b, "lobby", 1, 0));
    assert_eq!(body["connections"], 1, "{body}");
    assert!(body["subscriptions"].as_u64().unwrap() >= 1, "{body}");
    assert!(body["rooms_live"].as_u64().unwrap() >= 1, "{body}");

    // Events move the head and the counters.
    for i in 1..=3 {
        let (status, reply) = server.publish("lobby", None, json!({ "n": i }));
        assert_eq!(status, 201, "{reply}");
    }
    let events = alice.next_events(3).await;
    assert_eq!(seqs(&events), vec![1, 2, 3]);
    let body = overview_until(&server, "lobby at head 3", |b| listed(b, "lobby", 1, 3));
    assert_eq!(body["counters"]["publishes"], 3, "{body}");
    assert_eq!(body["counters"]["deliveries"], 3, "{body}");

    // A second subscriber ranks the room above a room with one; the inbox is not listed.
    let mut bob = server.client("bob").await;
    bob.subscribe_ok("lobby").await;
    bob.subscribe_ok("quiet").await;
    let body = overview_until(&server, "lobby with 2, quiet with 1", |b| {
        listed(b, "lobby", 2, 3) && listed(b, "quiet", 1, 0)
    });
    let names: Vec<&str> =
        body["rooms"].as_array().unwrap().iter().map(|r| r["room"].as_str().unwrap()).collect();
    assert_eq!(names, ["lobby", "quiet"], "busiest first, and no user: inbox: {body}");

    // Subscribers leaving are counted down.
    bob.unsubscribe("lobby").await;
    overview_until(&server, "lobby back to 1", |b| listed(b, "lobby", 1, 3));
    bob.close().await;
    alice.close().await;
    let body = overview_until(&server, "no connection and lobby at 0", |b| {
        b["connections"] == 0 && listed(b, "lobby", 0, 3)
    });
    assert!(listed(&body, "quiet", 0, 0), "{body}");
}

#[tokio::test]
async fn at_most_the_twenty_busiest_rooms_are_listed() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    // Room r{i} gets i subscribers (1..=25), from 25 connections.
    let mut clients = Vec::new();
    for c in 1..=25 {
        let mut client = server.client(&format!("user{c}")).await;
        for i in c..=25 {
            client.subscribe_ok(&format!("r{i:02}")).await;
        }
        clients.push(client);
    }
    let body = overview_until(&server, "r25 with 25 subscribers", |b| listed(b, "r25", 25, 0));
    let rooms = body["rooms"].as_array().unwrap();
    let got: Vec<(String, u64)> = rooms
        .iter()
        .map(|r| (r["room"].as_str().unwrap().to_string(), r["subscribers"].as_u64().unwrap()))
        .collect();
    let expected: Vec<(String, u64)> = (6..=25).rev().map(|i| (format!("r{i:02}"), i)).collect();
    assert_eq!(got, expected, "the 20 busiest, busiest first");
    assert!(body["rooms_live"].as_u64().unwrap() >= 25, "{body}");
    for client in clients {
        client.close().await;
    }
}

#[test]
fn the_admin_page_is_served_without_a_key_and_holds_no_data() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let url = format!("http://{}/admin", server.addr);
    let response = ureq::get(&url).call().expect("GET /admin");
    assert_eq!(response.status(), 200);
    assert_eq!(response.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = response.header("content-security-policy").expect("a CSP header").to_string();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
    let page = response.into_string().expect("page text");
    assert!(page.contains("<title>Admin · livegate</title>"), "the admin page");
    assert!(
        !page.contains(NODE) && !page.contains(API_KEY),
        "the page itself carries no node data"
    );
    assert!(!page.contains("localStorage"), "the key is never put in localStorage");
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"), "no external assets");
}
