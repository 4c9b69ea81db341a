//! The session directory seen from outside (the book's sessions and
//! cluster chapters: directory, warm-up after failover; issue 3): forced moves across restarts under another node
//! name (never refused), sessions refused for another user's token (in memory and during warm-up),
//! the warm-up flag and its window, and directory writes not caused by heartbeats.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use livegate::config::Config;
use serde_json::Value;

const WRITES_OK: &str = r#"livegate_directory_writes_total{result="ok"}"#;

fn node_named(
    node: &'static str,
    warmup_secs: u64,
    migration_window_secs: u64,
) -> impl FnOnce(&mut Config) {
    move |c| {
        c.node = node.to_string();
        c.warmup_secs = warmup_secs;
        c.migration_window_secs = migration_window_secs;
    }
}

/// Mints a token for `user` on `device` and connects naming `session`.
async fn reconnect(
    server: &TestServer,
    user: &str,
    device: &str,
    session: Option<&str>,
) -> WsClient {
    let token = server.mint_token(user, device);
    WsClient::connect(server.addr, &token, session).await
}

fn metric_or_zero(server: &TestServer, series: &str) -> f64 {
    server.http().metric(series).unwrap_or(0.0)
}

/// node-a → node-b (migration 1) → node-a (migration 2) on one data dir. Returns the
/// session of u1 and the third server, after asserting the first migration.
async fn two_owner_changes(window_secs: u64) -> (String, TestServer) {
    // node-a: u1 gets a session; u9 gets two.
    let a = TestServer::start(node_named("node-a", 30, window_secs));
    let c = reconnect(&a, "u1", "web", None).await;
    assert_eq!(c.welcome["node"], "node-a", "{}", c.welcome);
    let session = c.session().to_string();
    assert!(!session.is_empty(), "{}", c.welcome);
    let u9_first = reconnect(&a, "u9", "web", None).await;
    let u9_second = reconnect(&a, "u9", "web", None).await;
    let (s9a, s9b) = (u9_first.session().to_string(), u9_second.session().to_string());
    assert_ne!(s9a, s9b);
    c.close().await;
    u9_first.close().await;
    u9_second.close().await;
    let dir = a.stop();

    // Same data dir as node-b: the records name node-a, so u1's reconnect is a migration.
    let b = TestServer::start_in(dir, node_named("node-b", 30, window_secs));
    let c = reconnect(&b, "u1", "web", Some(&session)).await;
    assert_eq!(c.session(), session, "a migrating session is kept: {}", c.welcome);
    assert_eq!(c.welcome["node"], "node-b", "{}", c.welcome);
    assert_eq!(
        b.http().metric("livegate_migrations_total"),
        Some(1.0),
        "one migration so far:\n{}",
        b.http().metrics_text()
    );
    assert_eq!(metric_or_zero(&b, "livegate_migration_refusals_total"), 0.0);
    // A user's sessions migrate together: u9's second session, after its first migrated,
    // is already this node's and must not be a second (refused) migration.
    let c9 = reconnect(&b, "u9", "web", Some(&s9a)).await;
    assert_eq!(c9.session(), s9a, "{}", c9.welcome);
    match WsClient::try_connect_with_headers(b.addr, Some(&b.mint_token("u9", "web")), Some(&s9b))
        .await
    {
        Ok(c) => assert_eq!(
            c.session(),
            s9b,
            "the user's other session moved with the first: {}",
            c.welcome
        ),
        Err(r) => panic!(
            "u9's second session must have migrated together with the first, got {} {}",
            r.status, r.body
        ),
    }
    assert_eq!(metric_or_zero(&b, "livegate_migration_refusals_total"), 0.0);
    c.close().await;
    c9.close().await;
    let dir = b.stop();

    let a2 = TestServer::start_in(dir, node_named("node-a", 30, window_secs));
    (session, a2)
}

/// A move the owner's loss forces is never refused, however recent the last one (issue
/// 30): node-a is gone when node-b takes its sessions, and node-b is gone when node-a
/// takes them back, well inside the 600 s window. Before routing decided, the second move
/// was refused with 429 for ten minutes. (The budget, which only charges moves the route
/// did not choose, is tested in tests/it/cluster/ with `avoid`.)
#[tokio::test]
async fn moves_forced_by_a_gone_owner_are_never_refused_inside_the_window() {
    let _gate = crate::common::gate!();
    let (session, a2) = two_owner_changes(600).await;
    let c = reconnect(&a2, "u1", "web", Some(&session)).await;
    assert_eq!(c.session(), session, "the second forced move keeps the session: {}", c.welcome);
    assert_eq!(c.welcome["node"], "node-a", "{}", c.welcome);
    assert_eq!(
        a2.http().metric("livegate_migrations_total"),
        Some(1.0),
        "{}",
        a2.http().metrics_text()
    );
    assert_eq!(metric_or_zero(&a2, "livegate_migration_refusals_total"), 0.0);
}

#[tokio::test]
async fn another_users_token_never_gets_the_session_in_memory_or_during_warmup() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.warmup_secs = 30);
    let c1 = reconnect(&server, "u1", "web", None).await;
    let session = c1.session().to_string();
    c1.close().await;

    let c2 = reconnect(&server, "u2", "web", Some(&session)).await;
    assert!(!c2.session().is_empty(), "{}", c2.welcome);
    assert_ne!(c2.session(), session, "u2 must not get u1's session: {}", c2.welcome);
    c2.close().await;
    let back = reconnect(&server, "u1", "web", Some(&session)).await;
    assert_eq!(
        back.session(),
        session,
        "u1 keeps its session after u2's attempt: {}",
        back.welcome
    );
    back.close().await;
    let dir = server.stop();

    // After a restart the session is validated from the store (warm-up): same rules.
    let server = TestServer::start_in(dir, |c| c.warmup_secs = 30);
    let c2 = reconnect(&server, "u2", "web", Some(&session)).await;
    assert_eq!(c2.welcome["warmup"], true, "{}", c2.welcome);
    assert!(!c2.session().is_empty(), "{}", c2.welcome);
    assert_ne!(
        c2.session(),
        session,
        "during warm-up u2 must not get u1's session either: {}",
        c2.welcome
    );
    let back = reconnect(&server, "u1", "web", Some(&session)).await;
    assert_eq!(
        back.session(),
        session,
        "u1 keeps its session during warm-up after u2's attempt: {}",
        back.welcome
    );
    assert_eq!(
        metric_or_zero(&server, "livegate_migrations_total"),
        0.0,
        "same node name: no migration"
    );
}

#[tokio::test]
async fn warmup_flag_true_after_a_restart_with_sessions_and_false_after_the_window() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.warmup_secs = 2);
    let c1 = reconnect(&server, "u1", "web", None).await;
    assert_eq!(
        c1.welcome["warmup"], false,
        "a start with an empty directory has no warm-up: {}",
        c1.welcome
    );
    assert_eq!(
        server.http().metric("livegate_warmup_active"),
        Some(0.0),
        "{}",
        server.http().metrics_text()
    );
    let c2 = reconnect(&server, "u2", "web", None).await;
    let (s1, s2) = (c1.session().to_string(), c2.session().to_string());
    c1.close().await;
    c2.close().await;
    let dir = server.stop();

    let started = Instant::now();
    let server = TestServer::start_in(dir, |c| c.warmup_secs = 2);
    assert_eq!(
        server.http().metric("livegate_warmup_active"),
        Some(1.0),
        "{}",
        server.http().metrics_text()
    );
    let c1 = reconnect(&server, "u1", "web", Some(&s1)).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the reconnect must fall inside the 2 s window; test machine too slow"
    );
    assert_eq!(c1.welcome["warmup"], true, "{}", c1.welcome);
    assert_eq!(
        c1.session(),
        s1,
        "a session from before the restart is validated from the store: {}",
        c1.welcome
    );
    let attempts = metric_or_zero(&server, "livegate_warmup_reconnect_attempts_total");
    let successes = metric_or_zero(&server, "livegate_warmup_reconnect_successes_total");
    assert!(attempts >= 1.0 && successes >= 1.0, "attempts {attempts}, successes {successes}");
    c1.close().await;

    // The window ends 2 s after the start; the gauge must say so without any handshake
    // (checked at the end, so the handshake checks below run either way).
    let deadline = started + Duration::from_millis(3500);
    let mut gauge = None;
    wait_until_every(
        deadline.saturating_duration_since(Instant::now()),
        Duration::from_millis(50),
        || {
            gauge = server.http().metric("livegate_warmup_active");
            gauge == Some(0.0)
        },
    );
    let fresh = reconnect(&server, "u3", "web", None).await;
    assert_eq!(fresh.welcome["warmup"], false, "after the window: {}", fresh.welcome);
    // After the window only sessions this process has seen are known.
    let again = reconnect(&server, "u1", "web", Some(&s1)).await;
    assert_eq!(again.welcome["warmup"], false, "{}", again.welcome);
    assert_eq!(again.session(), s1, "u1's session was seen during warm-up: {}", again.welcome);
    let late = reconnect(&server, "u2", "web", Some(&s2)).await;
    assert_ne!(
        late.session(),
        s2,
        "a pre-restart session not seen during warm-up gets a new id: {}",
        late.welcome
    );
    assert!(!late.session().is_empty());
    assert_eq!(
        gauge,
        Some(0.0),
        "livegate_warmup_active still {gauge:?} 3.5 s after a start with warmup_secs = 2 (no handshake in between)"
    );
    assert_eq!(server.http().metric("livegate_warmup_active"), Some(0.0));
}

#[tokio::test]
async fn heartbeats_and_same_node_reconnects_do_not_write_the_directory() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.heartbeat_secs = 1);
    let mut clients = Vec::new();
    for i in 0..5 {
        let mut c = reconnect(&server, &format!("hb{i}"), "web", None).await;
        c.assert_alive().await;
        clients.push(c);
    }
    let before = server.http().metric(WRITES_OK).unwrap_or(0.0);
    assert!(before >= 5.0, "five new sessions must have been written, counter says {before}");

    // ~4 heartbeat periods; every client keeps reading (so answers pings) and gets nothing.
    let reads = clients.iter_mut().map(|c| c.recv_within(Duration::from_secs(4)));
    for (i, got) in futures_util::future::join_all(reads).await.into_iter().enumerate() {
        assert!(got.is_none(), "client {i} got an unexpected frame: {got:?}");
    }
    for c in clients.iter_mut() {
        c.assert_alive().await;
    }
    let after = server.http().metric(WRITES_OK).unwrap_or(0.0);
    assert_eq!(after, before, "heartbeats must not write the directory");
    assert_eq!(server.http().metric_total("livegate_connections_open"), 5.0);

    // Reconnecting with the same session on the same node writes nothing either.
    let c0 = clients.remove(0);
    let s0 = c0.session().to_string();
    c0.close().await;
    let after_close = server.http().metric(WRITES_OK).unwrap_or(0.0);
    let back = reconnect(&server, "hb0", "web", Some(&s0)).await;
    assert_eq!(back.session(), s0, "{}", back.welcome);
    let after_reconnect = server.http().metric(WRITES_OK).unwrap_or(0.0);
    assert_eq!(
        (after_close, after_reconnect),
        (before, before),
        "(after the close, after the reconnect) must both equal the count before ({before})"
    );
}

/// Reads `/v1/admin/status` until its session counts are as expected.
fn wait_sessions(server: &TestServer, live: u64, cached: u64, stored: u64, what: &str) {
    let mut s = Value::Null;
    let reached = wait_until_every(Duration::from_secs(10), Duration::from_millis(50), || {
        let (status, body) =
            server.http().request("GET", "/v1/admin/status", Auth::Key, Body::None);
        assert_eq!(status, 200, "{body}");
        s = body;
        s["sessions_live"] == live
            && s["sessions_cached"] == cached
            && s["sessions_stored"] == stored
    });
    assert!(
        reached,
        "{what}: expected {live} live, {cached} cached, {stored} stored sessions: {s}"
    );
}

#[tokio::test]
async fn sessions_expire_a_ttl_after_their_last_connection_and_never_while_connected() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| {
        c.session_ttl_secs = 2;
        c.session_cache_max = 2;
    });
    let mut kept = reconnect(&server, "u1", "web", None).await;
    let s1 = kept.session().to_string();
    let mut gone = Vec::new();
    for user in ["u2", "u3", "u4"] {
        let c = reconnect(&server, user, "web", None).await;
        gone.push(c.session().to_string());
        c.close().await;
        // In order, so the cache's oldest entry is u2's.
        wait_sessions(
            &server,
            1,
            gone.len().min(2) as u64,
            4.min(gone.len() as u64 + 1),
            "after a close",
        );
    }
    // u2's session left the memory cache but is kept: the store knows this process saw it.
    let back = reconnect(&server, "u2", "web", Some(&gone[0])).await;
    assert_eq!(
        back.session(),
        gone[0],
        "a reconnect within the TTL keeps the session: {}",
        back.welcome
    );
    back.close().await;
    wait_sessions(&server, 1, 2, 4, "u2 closed again");

    // Past the TTL every disconnected session is deleted; the connected one stays however long.
    let closed = Instant::now();
    wait_sessions(&server, 1, 0, 1, "after the TTL");
    assert!(
        closed.elapsed() >= Duration::from_millis(1500),
        "deleted {:?} after the close, before the 2 s TTL",
        closed.elapsed()
    );
    assert!(
        metric_or_zero(&server, "livegate_sessions_expired_total") >= 3.0,
        "{}",
        server.http().metrics_text()
    );
    let_time_pass_async(
        Duration::from_secs(1),
        "past the TTL, a connected session is still not expired",
    )
    .await;
    kept.assert_alive().await;
    let tab = reconnect(&server, "u1", "web", Some(&s1)).await;
    assert_eq!(
        tab.session(),
        s1,
        "a session with a live connection never expires: {}",
        tab.welcome
    );
    for (user, session) in ["u2", "u3", "u4"].iter().zip(&gone) {
        let late = reconnect(&server, user, "web", Some(session)).await;
        assert_ne!(late.session(), session, "an expired session gets a new id: {}", late.welcome);
        late.close().await;
    }
    tab.close().await;
    kept.close().await;
    wait_sessions(&server, 0, 2, 4, "all closed");
    wait_sessions(&server, 0, 0, 0, "nothing left a TTL later");
}
