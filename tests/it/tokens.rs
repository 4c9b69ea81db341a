//! One-time connection tokens: replayed, expired, tampered and missing tokens are refused
//! with HTTP 401 and a JSON error before any WebSocket upgrade; a used token stays used
//! across a restart; minting needs the API key and respects the TTL bound.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::json;

/// Connects with `token` and asserts a 401 refusal with error `code`.
async fn assert_rejected(server: &TestServer, token: Option<&str>, code: &str) {
    match WsClient::try_connect(server.addr, token, None).await {
        Ok(c) => {
            panic!("handshake with {token:?} must be refused ({code}), got welcome {}", c.welcome)
        }
        Err(Rejected { status, body }) => {
            assert_eq!(status, 401, "status for {token:?}: {body}");
            assert_eq!(error_code(&body), code, "error code for {token:?}: {body}");
            assert!(
                body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
                "message: {body}"
            );
        }
    }
}

/// The token with one character replaced at byte position `at` (by another character
/// of the same URL-safe alphabet).
fn flip(token: &str, at: usize) -> String {
    let mut bytes = token.as_bytes().to_vec();
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).expect("ascii token")
}

#[tokio::test]
async fn replayed_token_is_refused_before_upgrade() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let token = server.mint_token("alice", "web");
    let mut first = WsClient::connect(server.addr, &token, None).await;
    assert_rejected(&server, Some(&token), "token_replayed").await;
    // The refusal did not disturb the legitimate connection.
    first.assert_alive().await;
    drop(first);
    // Nor does closing the first connection free the token again.
    server.http().wait_metric_total("livegate_connections_open", 0.0, WAIT);
    assert_rejected(&server, Some(&token), "token_replayed").await;
}

#[tokio::test]
async fn expired_token_is_refused() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let (status, body) =
        server.http().mint_token_raw(json!({"user": "alice", "device": "web", "ttl_secs": 1}));
    assert_eq!(status, 201, "{body}");
    let token = body["token"].as_str().expect("token").to_string();
    let expires = body["expires_at_ms"].as_u64().expect("expires_at_ms");
    let wait = expires.saturating_sub(now_ms()) + 1_100;
    assert!(wait <= 2_500, "a 1 s token expires within about 1 s: {body}");
    let_time_pass_async(Duration::from_millis(wait), "the 1 s token's expiry").await;
    assert_rejected(&server, Some(&token), "token_expired").await;
}

#[tokio::test]
async fn tampered_token_is_refused() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let token = server.mint_token("alice", "web");
    assert!(token.len() > 16, "token looks too short to carry a signature: {token}");

    // A change at the end (the signature, in any layout that appends it) and one at the
    // start (the claims) must both be caught. Neither token is ever used genuinely.
    let near_end = flip(&token, token.len() - 5);
    let near_start = flip(&token, 2);
    assert_rejected(&server, Some(&near_end), "invalid_token").await;
    assert_rejected(&server, Some(&near_start), "invalid_token").await;
    assert_rejected(&server, Some("not-a-token"), "invalid_token").await;
    assert_rejected(&server, Some(&token[..token.len() / 2]), "invalid_token").await;

    // The untouched token still works: the tampered attempts did not burn it.
    let client = WsClient::connect(server.addr, &token, None).await;
    assert_eq!(client.welcome["op"], "welcome");
}

#[tokio::test]
async fn missing_token_is_refused() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    assert_rejected(&server, None, "missing_token").await;
}

#[tokio::test]
async fn used_token_stays_refused_after_restart_and_unused_one_still_works() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let used = server.mint_token("alice", "web");
    let unused = server.mint_token("bob", "web");
    let client = WsClient::connect(server.addr, &used, None).await;
    drop(client);

    let dir = server.stop();
    let server = TestServer::start_in(dir, |_| {});
    assert_rejected(&server, Some(&used), "token_replayed").await;
    let client = WsClient::connect(server.addr, &unused, None).await;
    assert_eq!(
        client.welcome["op"], "welcome",
        "a token minted before a restart and not yet used is valid"
    );
}

#[tokio::test]
async fn minting_needs_the_api_key_and_respects_the_ttl_bound() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.token_ttl_max_secs = 300);
    let http = server.http();
    let body = json!({"user": "alice"});

    let (status, reply) = http.request("POST", "/v1/tokens", Auth::None, Body::Json(body.clone()));
    assert_eq!((status, error_code(&reply)), (401, "unauthorized"), "no key: {reply}");
    let (status, reply) = http.request(
        "POST",
        "/v1/tokens",
        Auth::Header("Bearer wrong-key"),
        Body::Json(body.clone()),
    );
    assert_eq!((status, error_code(&reply)), (401, "unauthorized"), "wrong key: {reply}");

    let (status, reply) = http.mint_token_raw(json!({"user": "alice", "ttl_secs": 300}));
    assert_eq!(status, 201, "ttl at the bound: {reply}");
    let (status, reply) = http.mint_token_raw(json!({"user": "alice", "ttl_secs": 301}));
    assert_eq!(status, 400, "ttl over token_ttl_max_secs: {reply}");
    assert!(!error_code(&reply).is_empty(), "a JSON error: {reply}");

    let (status, reply) = http.mint_token_raw(json!({"device": "web"}));
    assert_eq!(status, 400, "missing user: {reply}");
}
