//! Access control (issue 8): token room patterns and other users' inboxes; every
//! API-key endpoint refuses a missing or wrong key with 401 and does nothing; API keys
//! rotate without a restart on the real binary (SIGHUP and `POST /v1/admin/reload`) while
//! connected clients stay connected; the Origin allow-list; error bodies that never echo a
//! presented key or token, nor another user's data.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::process::ServeProcess;
use common::*;
use serde_json::{json, Value};

/// Mints a token with a room restriction (asserting 201).
fn mint_with_rooms(http: &Http, user: &str, rooms: &[&str]) -> String {
    let (status, body) =
        http.mint_token_raw(json!({"user": user, "device": "web", "rooms": rooms}));
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().expect("token").to_string()
}

fn assert_error(reply: &Value, code: &str, what: &str) {
    assert_eq!(reply["op"], "error", "{what}: {reply}");
    assert_eq!(reply["code"], code, "{what}: {reply}");
}

#[tokio::test]
async fn room_patterns_limit_what_a_token_reads_and_other_inboxes_are_always_forbidden() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    http.publish_ok("match:1", None, json!("m1"));
    http.publish_ok("news:1", None, json!("n1"));
    // Bob's private inbox content, which must never reach alice, not even in an error.
    let secret = "bob-private-7f3a9c";
    let (status, body) = http.request(
        "POST",
        "/v1/users/bob/messages",
        Auth::Key,
        Body::Json(json!({"data": {"secret": secret}})),
    );
    assert_eq!(status, 201, "{body}");

    let token = mint_with_rooms(&http, "alice", &["match:*"]);
    let mut c = WsClient::connect(server.addr, &token, None).await;
    let notice = c.wait_inbox_subscribed(WAIT).await;
    assert_eq!(notice["room"], "user:alice", "the own inbox is always readable: {notice}");

    c.subscribe_ok("match:1").await;
    c.subscribe_ok("match:final").await;
    let h = c.history_op("match:1", 0, 10).await;
    assert_eq!(h["op"], "history", "{h}");
    assert_eq!(h["events"][0]["data"], "m1", "{h}");
    for room in ["news:1", "match", "matches:1", "xmatch:1", "user:bob"] {
        let reply = c.subscribe(room).await;
        assert_error(&reply, "forbidden", &format!("subscribe {room} with rooms [match:*]"));
        let reply = c.history_op(room, 0, 10).await;
        assert_error(&reply, "forbidden", &format!("history of {room} with rooms [match:*]"));
        assert!(!reply.to_string().contains(secret), "{reply}");
    }
    c.subscribe_ok("user:alice").await;
    c.assert_alive().await;

    // Only the allowed room's events arrive.
    http.publish_ok("news:1", None, json!("n2"));
    http.publish_ok("match:1", None, json!("m2"));
    let events = c.next_events(1).await;
    assert_eq!(
        (events[0]["room"].as_str(), &events[0]["data"]),
        (Some("match:1"), &json!("m2")),
        "{events:?}"
    );
    c.assert_quiet(QUIET).await;

    // An exact name (no `*`) allows that room only.
    let token = mint_with_rooms(&http, "carol", &["lobby", "match:*"]);
    let mut exact = WsClient::connect(server.addr, &token, None).await;
    exact.subscribe_ok("lobby").await;
    assert_error(&exact.subscribe("lobby2").await, "forbidden", "lobby2 with rooms [lobby]");
    assert_error(&exact.subscribe("lobb").await, "forbidden", "lobb with rooms [lobby]");

    // Without a restriction every room is readable except another user's inbox.
    let mut open = server.client("dave").await;
    open.subscribe_ok("news:1").await;
    let reply = open.subscribe("user:bob").await;
    assert_error(&reply, "forbidden", "another user's inbox");
    assert!(!reply.to_string().contains(secret), "{reply}");
    let reply = open.history_op("user:bob", 0, 100).await;
    assert_error(&reply, "forbidden", "history of another user's inbox");
    assert!(!reply.to_string().contains(secret), "{reply}");
    // Refused subscribes leave nothing behind: bob's next message reaches nobody here.
    let (status, body) = http.request(
        "POST",
        "/v1/users/bob/messages",
        Auth::Key,
        Body::Json(json!({"data": secret})),
    );
    assert_eq!(status, 201, "{body}");
    open.assert_quiet(QUIET).await;
    c.assert_quiet(Duration::from_millis(50)).await;
}

/// Every endpoint that needs the API key: method, path, body, and the status it answers
/// with the right key.
fn keyed_endpoints() -> Vec<(&'static str, &'static str, Option<Value>, u16)> {
    vec![
        ("POST", "/v1/tokens", Some(json!({"user": "u1"})), 201),
        ("POST", "/v1/rooms/guarded/events", Some(json!({"data": "x"})), 201),
        ("GET", "/v1/rooms/guarded/events?since=0", None, 200),
        ("POST", "/v1/users/u1/messages", Some(json!({"data": "x"})), 201),
        ("DELETE", "/v1/users/u1/connections", None, 200),
        ("GET", "/v1/route?user=u1", None, 200),
        ("GET", "/v1/admin/status", None, 200),
        ("GET", "/v1/admin/overview", None, 200),
        ("POST", "/v1/admin/reload", None, 200),
    ]
}

fn call(http: &Http, method: &str, path: &str, auth: Auth, body: &Option<Value>) -> (u16, Value) {
    let body = match body {
        Some(v) => Body::Json(v.clone()),
        None => Body::None,
    };
    http.request(method, path, auth, body)
}

#[tokio::test]
async fn every_api_key_endpoint_refuses_a_missing_or_wrong_key_with_401_and_does_nothing() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    // A connection that a refused kick must not touch.
    let mut victim = server.client("u1").await;
    victim.subscribe_ok("guarded").await;

    let wrong = "wrong-key-d41d8cd98f00b204";
    let near = format!("{API_KEY}x");
    let bad_auths: Vec<(String, String)> = vec![
        ("no Authorization".into(), String::new()),
        ("wrong key".into(), format!("Bearer {wrong}")),
        ("the key plus one character".into(), format!("Bearer {near}")),
        ("the key minus one character".into(), format!("Bearer {}", &API_KEY[..API_KEY.len() - 1])),
        ("Basic scheme".into(), format!("Basic {API_KEY}")),
        ("no scheme".into(), API_KEY.to_string()),
        ("lower-case bearer with a wrong key".into(), format!("bearer {wrong}")),
        ("empty bearer".into(), "Bearer ".into()),
    ];
    for (method, path, body, _) in keyed_endpoints() {
        for (what, header) in &bad_auths {
            let auth = if header.is_empty() { Auth::None } else { Auth::Header(header) };
            let (status, reply) = call(&http, method, path, auth, &body);
            assert_eq!(
                (status, error_code(&reply)),
                (401, "unauthorized"),
                "{method} {path} with {what}: {reply}"
            );
            let text = reply.to_string();
            for secret in [wrong, near.as_str(), API_KEY] {
                assert!(
                    !text.contains(secret),
                    "{method} {path} with {what}: the body echoes a key: {text}"
                );
            }
        }
    }
    // Nothing happened: no event stored or delivered, nobody kicked.
    assert_eq!(http.history_ok("guarded", Some(0), None)["head"], 0);
    victim.assert_quiet(QUIET).await;
    victim.assert_alive().await;

    // With the key each one works.
    for (method, path, body, expected) in keyed_endpoints() {
        let (status, reply) = call(&http, method, path, Auth::Key, &body);
        assert_eq!(status, expected, "{method} {path} with the key: {reply}");
        if method == "POST" && path == "/v1/rooms/guarded/events" {
            assert_eq!(
                victim.next_events(1).await[0]["data"],
                "x",
                "the authorised publish is delivered"
            );
        }
        if method == "DELETE" {
            assert_eq!(reply["closed"], 1, "the authorised kick closes the connection: {reply}");
            assert_eq!(victim.close_code().await, Some(4502));
        }
    }
}

/// `token` or a long piece of it appears in `text`.
fn echoes(text: &str, token: &str) -> bool {
    let piece = 12.min(token.len());
    (0..=token.len() - piece).any(|i| text.contains(&token[i..i + piece]))
}

#[tokio::test]
async fn refused_handshakes_never_echo_the_presented_token() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let token = server.mint_token("alice", "web");
    // Tampered.
    let mut bytes = token.as_bytes().to_vec();
    let at = bytes.len() / 2;
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(bytes).expect("ascii");
    let garbage = "not-a-token-but-a-secret-9b1d";
    for (what, presented) in [("tampered", tampered.as_str()), ("garbage", garbage)] {
        let r = WsClient::try_connect_with_headers(server.addr, Some(presented), None)
            .await
            .err()
            .expect("refused");
        assert_eq!(r.status, 401, "{what}: {}", r.body);
        assert!(!echoes(&r.body.to_string(), presented), "{what} token echoed: {}", r.body);
    }
    // Replayed.
    let first = WsClient::connect(server.addr, &token, None).await;
    let r = WsClient::try_connect_with_headers(server.addr, Some(&token), None)
        .await
        .err()
        .expect("refused");
    assert_eq!((r.status, error_code(&r.body)), (401, "token_replayed"), "{}", r.body);
    assert!(!echoes(&r.body.to_string(), &token), "replayed token echoed: {}", r.body);
    assert!(
        !r.headers.iter().any(|(_, v)| echoes(v, &token)),
        "a header echoes the token: {:?}",
        r.headers
    );
    // Expired.
    let (status, body) = server.http().mint_token_raw(json!({"user": "bob", "ttl_secs": 1}));
    assert_eq!(status, 201, "{body}");
    let short = body["token"].as_str().expect("token").to_string();
    let left = body["expires_at_ms"].as_u64().unwrap().saturating_sub(now_ms()) + 1100;
    let_time_pass_async(Duration::from_millis(left), "the 1 s token's expiry").await;
    let r = WsClient::try_connect_with_headers(server.addr, Some(&short), None)
        .await
        .err()
        .expect("refused");
    assert_eq!((r.status, error_code(&r.body)), (401, "token_expired"), "{}", r.body);
    assert!(!echoes(&r.body.to_string(), &short), "expired token echoed: {}", r.body);
    // A token of alice's presented to the API as a key is not echoed either.
    let (status, reply) = server.http().request(
        "GET",
        "/v1/admin/status",
        Auth::Header(&format!("Bearer {token}")),
        Body::None,
    );
    assert_eq!(status, 401, "{reply}");
    assert!(!echoes(&reply.to_string(), &token), "{reply}");
    first.close().await;
}

#[tokio::test]
async fn origin_allow_list_refuses_other_pages_with_403_and_keeps_their_token() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| {
        c.allowed_origins = vec!["https://app.example".into(), "http://localhost:3000".into()]
    });
    let token = server.mint_token("alice", "web");
    let origins_refused = [
        "https://evil.example",
        "http://app.example",
        "https://app.example.evil.example",
        "https://app.example:8443",
        "null",
    ];
    for (i, origin) in origins_refused.iter().enumerate() {
        let r =
            WsClient::try_connect_custom(server.addr, Some(&token), None, &[("Origin", origin)])
                .await
                .err();
        let r = r.unwrap_or_else(|| panic!("Origin {origin} was accepted"));
        assert_eq!(
            (r.status, error_code(&r.body)),
            (403, "forbidden_origin"),
            "Origin {origin}: {}",
            r.body
        );
        assert!(!echoes(&r.body.to_string(), &token), "{}", r.body);
        let counted = server.http().metric("livegate_limit_hits_total{limit=\"origin\"}");
        assert_eq!(counted, Some((i + 1) as f64), "origin refusals counted");
    }
    // The refusals did not spend the token: an allowed page connects with it.
    let mut c =
        WsClient::connect_custom(server.addr, &token, None, &[("Origin", "https://app.example")])
            .await;
    c.subscribe_ok("o").await;
    let mut other = WsClient::connect_custom(
        server.addr,
        &server.mint_token("bob", "web"),
        None,
        &[("Origin", "http://localhost:3000")],
    )
    .await;
    // No Origin (a backend or an app): allowed.
    let mut app =
        WsClient::connect_custom(server.addr, &server.mint_token("carol", "web"), None, &[]).await;
    app.subscribe_ok("o").await;
    server.http().publish_ok("o", None, json!("hi"));
    assert_eq!(c.next_events(1).await[0]["data"], "hi");
    assert_eq!(app.next_events(1).await[0]["data"], "hi");
    other.assert_alive().await;

    // Without an allow-list any page may connect.
    let open = TestServer::start(|_| {});
    let mut any = WsClient::connect_custom(
        open.addr,
        &open.mint_token("eve", "web"),
        None,
        &[("Origin", "https://whatever.example")],
    )
    .await;
    any.assert_alive().await;
}

// ---------------------------------------------------------------------------------------
// Key rotation on the real binary
// ---------------------------------------------------------------------------------------

const KEY_A: &str = "rotation-key-AAAA-0123456789";
const KEY_B: &str = "rotation-key-BBBB-9876543210";

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn write_config(path: &Path, text: &str) {
    // Write then rename: the server never reads a half-written file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write config");
    std::fs::rename(&tmp, path).expect("rename config");
}

/// `GET /v1/admin/status` with `key`: its status.
fn status_with(http: &Http, key: &str) -> u16 {
    http.request("GET", "/v1/admin/status", Auth::Header(&bearer(key)), Body::None).0
}

fn wait_for(within: Duration, what: &str, cond: impl FnMut() -> bool) {
    assert!(wait_until_every(within, Duration::from_millis(20), cond), "{what} within {within:?}");
}

/// Sends SIGHUP to a node whose config file is broken and waits until it logged the
/// failed reload.
fn hup_failing(node: &ServeProcess) {
    let failures =
        || node.log_text().matches("reload failed; the access list is unchanged").count();
    let before = failures();
    node.signal("HUP");
    wait_for(Duration::from_secs(5), "a failed reload logged after SIGHUP", || failures() > before);
}

fn publish_with(http: &Http, key: &str, room: &str, data: Value) -> (u16, Value) {
    http.request(
        "POST",
        &format!("/v1/rooms/{room}/events"),
        Auth::Header(&bearer(key)),
        Body::Json(json!({"data": data})),
    )
}

#[tokio::test]
async fn api_keys_rotate_by_sighup_and_admin_reload_while_clients_stay_connected() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let config = dir.path().join("livegate.toml");
    write_config(&config, &format!("api_key = \"{KEY_A}\"\n"));
    let mut node = ServeProcess::start_without_key(
        &data,
        &dir.path().join("log"),
        &["--config", config.to_str().unwrap()],
    );
    let http = node.http();
    assert_eq!(status_with(&http, KEY_A), 200, "the configured key works");
    assert_eq!(status_with(&http, KEY_B), 401, "the next key does not work yet");

    // A client connected before any rotation.
    let (status, body) = http.request(
        "POST",
        "/v1/tokens",
        Auth::Header(&bearer(KEY_A)),
        Body::Json(json!({"user": "steady", "ttl_secs": 60})),
    );
    assert_eq!(status, 201, "{body}");
    let mut steady = WsClient::connect(node.addr, body["token"].as_str().unwrap(), None).await;
    steady.subscribe_ok("rot").await;

    // Step 1: B is the key, A stays valid; SIGHUP.
    write_config(&config, &format!("api_key = \"{KEY_B}\"\nprevious_api_keys = [\"{KEY_A}\"]\n"));
    node.signal("HUP");
    wait_for(Duration::from_secs(5), "the new key works after SIGHUP", || {
        status_with(&http, KEY_B) == 200
    });
    assert_eq!(status_with(&http, KEY_A), 200, "the previous key still works");
    assert!(node.running(), "SIGHUP does not stop the node");
    assert_eq!(publish_with(&http, KEY_A, "rot", json!("with A")).0, 201);
    assert_eq!(publish_with(&http, KEY_B, "rot", json!("with B")).0, 201);
    let events = steady.next_events(2).await;
    assert_eq!(
        events.iter().map(|e| e["data"].clone()).collect::<Vec<_>>(),
        vec![json!("with A"), json!("with B")]
    );
    // Either key may ask for a reload; both are counted.
    let (status, reply) =
        http.request("POST", "/v1/admin/reload", Auth::Header(&bearer(KEY_A)), Body::None);
    assert_eq!(
        (status, reply.clone()),
        (200, json!({"api_keys": 2, "allowed_origins": 0})),
        "{reply}"
    );

    // Step 2: only B (and an Origin allow-list); reloaded over HTTP with B.
    write_config(
        &config,
        &format!("api_key = \"{KEY_B}\"\nallowed_origins = [\"https://app.example\"]\n"),
    );
    let (status, reply) =
        http.request("POST", "/v1/admin/reload", Auth::Header(&bearer(KEY_B)), Body::None);
    assert_eq!(
        (status, reply.clone()),
        (200, json!({"api_keys": 1, "allowed_origins": 1})),
        "{reply}"
    );
    for (method, path, body, _) in keyed_endpoints() {
        let (status, reply) = call(&http, method, path, Auth::Header(&bearer(KEY_A)), &body);
        assert_eq!(
            (status, error_code(&reply)),
            (401, "unauthorized"),
            "{method} {path} with the retired key: {reply}"
        );
        assert!(!reply.to_string().contains(KEY_A), "{reply}");
    }
    assert_eq!(status_with(&http, KEY_B), 200);
    // The reloaded origins apply to new upgrades.
    let (status, body) = http.request(
        "POST",
        "/v1/tokens",
        Auth::Header(&bearer(KEY_B)),
        Body::Json(json!({"user": "browser"})),
    );
    assert_eq!(status, 201, "{body}");
    let browser_token = body["token"].as_str().unwrap().to_string();
    let r = WsClient::try_connect_custom(
        node.addr,
        Some(&browser_token),
        None,
        &[("Origin", "https://evil.example")],
    )
    .await;
    let r = r.err().expect("an origin outside the reloaded allow-list is refused");
    assert_eq!((r.status, error_code(&r.body)), (403, "forbidden_origin"), "{}", r.body);
    let browser = WsClient::connect_custom(
        node.addr,
        &browser_token,
        None,
        &[("Origin", "https://app.example")],
    )
    .await;

    // Step 3: a broken file changes nothing, whether by HTTP or by SIGHUP.
    write_config(&config, &format!("api_key = \"{KEY_A}\"\nthis line is not TOML\n"));
    let (status, reply) =
        http.request("POST", "/v1/admin/reload", Auth::Header(&bearer(KEY_B)), Body::None);
    assert_eq!(status, 400, "a bad file on reload: {reply}");
    assert!(reply["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{reply}");
    assert_eq!(status_with(&http, KEY_B), 200, "keys unchanged after a failed reload");
    assert_eq!(status_with(&http, KEY_A), 401, "keys unchanged after a failed reload");
    hup_failing(&node);
    assert!(node.running(), "a bad file on SIGHUP does not stop the node");
    assert_eq!(status_with(&http, KEY_B), 200, "keys unchanged after a failed SIGHUP reload");
    assert_eq!(status_with(&http, KEY_A), 401, "keys unchanged after a failed SIGHUP reload");
    // The retired key cannot ask for a reload either.
    let (status, _) =
        http.request("POST", "/v1/admin/reload", Auth::Header(&bearer(KEY_A)), Body::None);
    assert_eq!(status, 401);

    // The client connected at the start never noticed.
    steady.assert_alive().await;
    assert_eq!(publish_with(&http, KEY_B, "rot", json!("after all that")).0, 201);
    assert_eq!(steady.next_events(1).await[0]["data"], "after all that");
    browser.close().await;
    let log = node.log_text();
    for key in [KEY_A, KEY_B] {
        assert!(!log.contains(key), "the log contains an API key:\n{log}");
    }
}

#[tokio::test]
async fn a_failed_reload_never_echoes_the_keys_in_the_file() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let config = dir.path().join("livegate.toml");
    write_config(&config, &format!("api_key = \"{KEY_B}\"\n"));
    let mut node = ServeProcess::start_without_key(
        &data,
        &dir.path().join("log"),
        &["--config", config.to_str().unwrap()],
    );
    let http = node.http();
    // Files that are wrong next to (or in) a secret.
    let broken = [
        format!("api_key = \"{KEY_B}\"\nprevious_api_keys = [\"{KEY_A}\", 7]\n"),
        format!("api_key = \"{KEY_B}\"\nprevious_api_keys = [\"{KEY_A}\", \"short\"]\n"),
        format!("api_key = [\"{KEY_A}\"]\n"),
        format!("api_key = \"{KEY_B}\"\nprevious_api_keys = \"{KEY_A}\"\nunknown_key = 1\n"),
        format!("api_key = \"{KEY_A}\n"),
    ];
    // Every leak is collected first, so one run names them all.
    let mut leaks = Vec::new();
    for text in &broken {
        write_config(&config, text);
        let (status, reply) =
            http.request("POST", "/v1/admin/reload", Auth::Header(&bearer(KEY_B)), Body::None);
        assert_eq!(status, 400, "file {text:?}: {reply}");
        if reply.to_string().contains(KEY_A) || reply.to_string().contains(KEY_B) {
            leaks.push(format!("file {text:?} -> body {reply}"));
        }
        assert_eq!(status_with(&http, KEY_A), 401, "nothing changed after file {text:?}");
        assert_eq!(status_with(&http, KEY_B), 200, "nothing changed after file {text:?}");
        hup_failing(&node);
    }
    assert!(node.running());
    assert_eq!(status_with(&http, KEY_B), 200, "nothing changed after the SIGHUPs");
    assert_eq!(status_with(&http, KEY_A), 401, "nothing changed after the SIGHUPs");
    let log = node.log_text();
    for line in log.lines().filter(|l| l.contains(KEY_A) || l.contains(KEY_B)) {
        leaks.push(format!("log line: {line}"));
    }
    assert!(leaks.is_empty(), "failed reloads echo API keys:\n{}", leaks.join("\n"));
}
