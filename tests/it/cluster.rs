//! Cluster mode (issue 9): three `livegate serve` processes joined through one real
//! `nats-server -js` on loopback (`common::nats`), driven with real clients, real signals
//! and real kills.
//!
//! - fan-out: publish on A, subscribers on A, B and C get every event in order, once;
//! - a client moving from A to C recovers exactly what it missed with `since` + epoch;
//! - two nodes publishing to one room at once give one contiguous sequence, and an id
//!   published again on the other node is a duplicate with the first seq;
//! - a stale session-directory write (library API, two connections) loses;
//! - `kill -9` of a node, a restart of nats-server, and a rolling restart of every node,
//!   each under a steady publish load with subscribers that reconnect with `since`:
//!   nothing acknowledged is lost, nothing is delivered twice;
//! - exclusive devices (4501) and kicks (4502, with the count) across nodes;
//! - a resume credential from one node opens the same session on another, once, and a
//!   kick through either node voids it on both, also when the user was connected nowhere
//!   (and the tokens minted before it);
//! - `/v1/route` stops naming a killed node, and a draining one, in time;
//! - a client's publish on one node to a room another node writes reaches every node's
//!   subscribers with its `from`.
//!
//! nats-server must be installed (`/usr/sbin/nats-server`; `.ci/test` installs it): a
//! missing server fails the tests, it never skips them. Each test has its own NATS server,
//! store and ports; they take a file-wide lock so the timing-sensitive ones (heartbeats,
//! drains) do not compete for the CPU. Every wait is bounded; on failure the node logs are
//! kept (the path is printed).

use crate::common;

use livegate::core::routing::RESTART_GRACE_MS;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::nats::{Cluster, NatsServer};
use common::process::full_history;
use common::*;
use futures_util::{SinkExt, StreamExt};
use livegate::cluster::kv::KvSessions;
use livegate::cluster::{ClusterError, StreamLimits};
use livegate::store::SessionRecord;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// Short drains, so a SIGTERM'd node is gone in a second or two.
const SHORT_DRAIN: [&str; 6] = ["--drain-wait-secs", "0", "--drain-spread-secs", "1", "--drain-grace-secs", "5"];

fn fail_with_logs(cluster: &Cluster, test: &str, failures: &[String], needles: &[&str]) {
    if failures.is_empty() {
        return;
    }
    let lines = cluster.log_lines(needles);
    let shown: Vec<&String> = lines.iter().rev().take(80).collect::<Vec<_>>().into_iter().rev().collect();
    panic!(
        "{test}: {} failure(s):\n  {}\nrelevant node log lines (last {} of {}):\n  {}",
        failures.len(),
        failures.join("\n  "),
        shown.len(),
        lines.len(),
        shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  ")
    );
}

const LOG_NEEDLES: [&str; 6] = ["WARN", "ERROR", "nats", "peer", "drain", "directory"];

/// A token for `user`/`device` minted on `addr`, or why not.
fn try_mint(addr: SocketAddr, user: &str, device: &str) -> Result<String, String> {
    match Http::new(addr).try_request("POST", "/v1/tokens", Auth::Key, Body::Json(json!({"user": user, "device": device}))) {
        Ok((201, body)) => body["token"].as_str().map(str::to_string).ok_or_else(|| format!("no token in {body}")),
        Ok((status, body)) => Err(format!("POST /v1/tokens on {addr}: {status} {body}")),
        Err(e) => Err(format!("POST /v1/tokens on {addr}: {e}")),
    }
}

/// A WebSocket handshake that reports every failure (refusal, refused TCP connection)
/// as an error instead of a panic.
async fn try_ws(addr: SocketAddr, token: String, session: Option<String>) -> Result<WsClient, String> {
    let attempt = tokio::spawn(async move { WsClient::try_connect(addr, Some(&token), session.as_deref()).await });
    match attempt.await {
        Ok(Ok(ws)) => Ok(ws),
        Ok(Err(r)) => Err(format!("handshake on {addr} refused: {} {}", r.status, r.body)),
        Err(e) => Err(format!("handshake on {addr} failed: {e}")),
    }
}

/// A handshake through `addr` that says it cannot reach `avoid`, following one
/// wrong-node refusal (keeping `avoid`) as livegate.js does.
async fn connect_avoiding(addr: SocketAddr, token: &str, session: &str, avoid: &str) -> Result<WsClient, RejectedWithHeaders> {
    let url = |addr: SocketAddr| format!("{}&avoid={avoid}", ws_url(addr, Some(token), Some(session)));
    match WsClient::try_connect_url_with_headers(&url(addr)).await {
        Err(r) if r.status == 421 => {
            let to = r.body["error"]["url"].as_str().unwrap_or_default().trim_start_matches("http://").to_string();
            let to: SocketAddr = to.parse().unwrap_or_else(|e| panic!("421 names no host:port ({e}): {}", r.body));
            WsClient::try_connect_url_with_headers(&url(to)).await
        }
        other => other,
    }
}

/// `GET /v1/route?<query>` on `http`: the node named, or what came instead.
fn route(http: &Http, query: &str) -> Result<String, String> {
    match http.try_request("GET", &format!("/v1/route?{query}"), Auth::Key, Body::None) {
        Ok((200, body)) => body["node"].as_str().map(str::to_string).ok_or_else(|| format!("200 without node: {body}")),
        Ok((status, body)) => Err(format!("{status} {body}")),
        Err(e) => Err(e),
    }
}

// ---------------------------------------------------------------------------------------
// (a) fan-out across nodes
// ---------------------------------------------------------------------------------------

/// Reads events of `room` until `n` have come or `within` passed; returns them and what
/// else arrived.
async fn collect_events(ws: &mut WsClient, room: &str, n: usize, within: Duration) -> (Vec<Value>, Vec<String>) {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut other = Vec::new();
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            other.push(format!("only {} of {n} events within {within:?}", got.len()));
            break;
        }
        match ws.next_incoming(left).await {
            Incoming::Json(frame) if frame["op"] == "events" => {
                for e in frame["events"].as_array().cloned().unwrap_or_default() {
                    if e["room"] == room {
                        got.push(e);
                    } else if !e["room"].as_str().unwrap_or("").starts_with("user:") {
                        other.push(format!("event of another room: {e}"));
                    }
                }
            }
            Incoming::Json(frame) => other.push(format!("unexpected frame {frame}")),
            Incoming::Timeout => {}
            ending => {
                other.push(format!("connection ended: {ending:?}"));
                break;
            }
        }
    }
    (got, other)
}

#[test]
fn publish_on_a_reaches_subscribers_on_a_b_and_c_in_order_exactly_once() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    const EVENTS: usize = 300;
    let room = "fan:1";
    // One subscriber on A, four on B, four on C.
    let placement = [0usize, 1, 1, 1, 1, 2, 2, 2, 2];
    let mut failures = Vec::new();
    let mut subscribers = Vec::new();
    let mut epochs = Vec::new();
    for (i, &node) in placement.iter().enumerate() {
        let token = cluster.http(node).mint_token(&format!("fan-u{i}"), "web");
        let addr = cluster.addr(node);
        let (ws, sub) = rt.block_on(async move {
            let mut ws = WsClient::connect(addr, &token, None).await;
            let sub = ws.subscribe_ok(room).await;
            (ws, sub)
        });
        if sub["seq"] != 0 {
            failures.push(format!("subscriber {i} on {}: fresh room has head {}", Cluster::name(node), sub["seq"]));
        }
        assert_eq!(ws.welcome["node"], Cluster::name(node), "welcome names the node: {}", ws.welcome);
        epochs.push(sub["epoch"].clone());
        subscribers.push((i, node, ws));
    }
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|(i, node, mut ws)| {
            rt.spawn(async move {
                let (got, mut other) = collect_events(&mut ws, room, EVENTS, Duration::from_secs(20)).await;
                if other.is_empty() {
                    if let Some(extra) = ws.recv_within(QUIET).await {
                        other.push(format!("something after the {EVENTS} events: {extra}"));
                    }
                }
                (i, node, got, other)
            })
        })
        .collect();

    let a = cluster.http(0);
    let publish_started = Instant::now();
    let mut acks = Vec::new();
    for n in 0..EVENTS {
        let id = format!("fan-{n}");
        let (status, reply) = a.publish(room, Some(&id), json!({"n": n}));
        if status != 201 || reply["duplicate"] != false {
            failures.push(format!("publish {id} on a: {status} {reply}"));
        }
        acks.push((id, reply["seq"].as_u64().unwrap_or(0), reply["epoch"].clone()));
    }
    let publish_took = publish_started.elapsed();
    if acks.iter().map(|a| a.1).collect::<Vec<_>>() != (1..=EVENTS as u64).collect::<Vec<_>>() {
        failures.push(format!("acknowledged seqs are not 1..={EVENTS}: first ones {:?}", &acks[..acks.len().min(10)]));
    }
    for (i, e) in epochs.iter().enumerate() {
        if e.is_null() || *e != acks[0].2 {
            failures.push(format!("subscriber {i} was told epoch {e}, the publish replies carry {}", acks[0].2));
        }
    }
    let results = rt.block_on(async {
        let mut out = Vec::new();
        for r in readers {
            out.push(tokio::time::timeout(Duration::from_secs(40), r).await.expect("reader finished").expect("reader"));
        }
        out
    });
    for (i, node, got, other) in results {
        let who = format!("subscriber {i} on {}", Cluster::name(node));
        let seqs = seqs(&got);
        if seqs != (1..=EVENTS as u64).collect::<Vec<_>>() {
            let dup = seqs.len() - seqs.iter().collect::<HashSet<_>>().len();
            failures.push(format!("{who}: {} events, {dup} duplicate seqs, not 1..={EVENTS} in order", seqs.len()));
        }
        for e in &got {
            let s = seq_of(e) as usize;
            if s >= 1 && s <= EVENTS && e["id"] != acks[s - 1].0.as_str() {
                failures.push(format!("{who}: seq {s} carries id {} instead of {}", e["id"], acks[s - 1].0));
                break;
            }
        }
        failures.extend(other.into_iter().map(|o| format!("{who}: {o}")));
    }
    eprintln!(
        "fan-out: {EVENTS} events published on a in {:.2} s, {} subscribers on a/b/c; test took {:.1} s",
        publish_took.as_secs_f64(),
        placement.len(),
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "fan-out", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (b) a client moves from A to C and recovers exactly what it missed
// ---------------------------------------------------------------------------------------

#[test]
fn a_client_that_cannot_reach_its_owner_moves_once_and_recovers_exactly_the_missed_events() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let cluster = Cluster::start(3, &SHORT_DRAIN);
    let cluster_ready = Instant::now();
    let rt = runtime();
    let room = "move:1";
    let b = cluster.http(1);
    let mut failures = Vec::new();

    let token = cluster.http(0).mint_token("mover", "web");
    let mut ws = rt.block_on(WsClient::connect(cluster.addr(0), &token, None));
    let session = ws.session().to_string();
    let sub = rt.block_on(ws.subscribe_ok(room));
    let epoch = sub["epoch"].clone();
    let mut ids = Vec::new();
    for n in 0..50 {
        let id = format!("mv-{n}");
        let reply = b.publish_ok(room, Some(&id), json!({"n": n}));
        assert_eq!(reply["seq"], n + 1, "publish {id}: {reply}");
        ids.push(id);
    }
    let before = rt.block_on(ws.next_events(50));
    assert_eq!(seqs(&before), (1..=50).collect::<Vec<_>>(), "live events on a");
    rt.block_on(ws.close());

    // Published while the client is away.
    for n in 50..80 {
        let id = format!("mv-{n}");
        let reply = b.publish_ok(room, Some(&id), json!({"n": n}));
        assert_eq!(reply["seq"], n + 1, "publish {id}: {reply}");
        ids.push(id);
    }

    // Through c, with the same session: a is alive and owns it, so c sends the client
    // there (4421 naming a), spending nothing. The client says it cannot reach a
    // (`avoid=a`), and the session moves to the route's choice among b and c: a move the
    // route did not choose, charged to the budget.
    // A client that says it cannot reach a node started moments ago is believed without
    // charge (it was restarting): wait until the nodes are older than that grace.
    common::let_time_pass_until(cluster_ready + Duration::from_millis(RESTART_GRACE_MS + 500), "the nodes outlive the restart grace");
    let token = cluster.http(2).mint_token("mover", "web");
    match rt.block_on(WsClient::try_connect(cluster.addr(2), Some(&token), Some(&session))) {
        Err(r) if r.status == 421 && r.body["error"]["node"] == "a" => {}
        Err(r) => failures.push(format!("reconnect on c with a's session: expected 4421 naming a, got {} {}", r.status, r.body)),
        Ok(ws) => failures.push(format!("reconnect on c with a's session was accepted although a is alive: {}", ws.welcome)),
    }
    let mut ws = match rt.block_on(connect_avoiding(cluster.addr(2), &token, &session, "a")) {
        Ok(ws) => ws,
        Err(r) => panic!("reconnect through c with session {session} avoiding a (same token, still unspent): {} {}", r.status, r.body),
    };
    // The route's choice among b and c: the client may have been sent on once more.
    let here = ws.welcome["node"].as_str().unwrap_or_default().to_string();
    if !["b", "c"].contains(&here.as_str()) {
        failures.push(format!("avoiding a, the session must land on b or c: {}", ws.welcome));
    }
    if ws.session() != session {
        failures.push(format!("session {session} (recorded on a) was not kept on {here}: welcome {}", ws.welcome));
    }
    let resub = rt.block_on(ws.subscribe_since(room, 50, &epoch));
    if resub["op"] != "subscribed" || resub["recovered"] != true || resub["epoch"] != epoch {
        failures.push(format!("resubscribe on c with since 50, epoch {epoch}: {resub}"));
    }
    let (missed, other) = rt.block_on(collect_events(&mut ws, room, 30, WAIT));
    failures.extend(other);
    if seqs(&missed) != (51..=80).collect::<Vec<_>>() {
        failures.push(format!("recovered on c: seqs {:?}, expected 51..=80", seqs(&missed)));
    }
    for e in &missed {
        let s = seq_of(e) as usize;
        if (51..=80).contains(&s) && e["id"] != ids[s - 1].as_str() {
            failures.push(format!("recovered seq {s} has id {}, expected {}", e["id"], ids[s - 1]));
        }
    }
    if let Some(extra) = rt.block_on(ws.recv_within(QUIET)) {
        failures.push(format!("more than the missed events after recovery: {extra}"));
    }
    // And live again, published on A this time.
    let reply = cluster.http(0).publish_ok(room, Some("mv-live"), json!({"live": true}));
    assert_eq!(reply["seq"], 81, "{reply}");
    let (live, other) = rt.block_on(collect_events(&mut ws, room, 1, WAIT));
    failures.extend(other);
    if seqs(&live) != vec![81] || live.first().map(|e| &e["id"]) != Some(&json!("mv-live")) {
        failures.push(format!("live event after the move: {live:?}"));
    }
    // Away from its new node again, through a: a second move the route did not choose
    // inside the migration window is refused with 4029 (retry-after seconds in the
    // reason), and the token stays unspent.
    rt.block_on(ws.close());
    let token = cluster.http(0).mint_token("mover", "web");
    match rt.block_on(connect_avoiding(cluster.addr(0), &token, &session, &here)) {
        Err(r) if r.status == 429 && r.header("close-code") == Some("4029") => {
            let secs: u64 = r.header("retry-after").and_then(|s| s.parse().ok()).unwrap_or(0);
            if !(1..=600).contains(&secs) {
                failures.push(format!("4029's reason must be the seconds to wait (1..=600), got {:?}", r.header("retry-after")));
            }
        }
        Err(r) => failures.push(format!("second avoided move: expected close 4029, got {} {} {:?}", r.status, r.body, r.headers)),
        Ok(ws) => failures.push(format!("a second avoided move inside the window was allowed: {}", ws.welcome)),
    }
    let (back, sent_to) = rt.block_on(WsClient::connect_following(cluster.addr(0), &token, Some(&session)));
    if back.session() != session || back.welcome["node"] != here.as_str() || sent_to.as_deref() != Some(here.as_str()) {
        failures.push(format!("the refused token, used again through a, must be sent to {here} and keep the session: sent to {sent_to:?}, {}", back.welcome));
    }
    eprintln!("move away from a: test took {:.1} s", started.elapsed().as_secs_f64());
    fail_with_logs(&cluster, "move away from a", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (c) two nodes publish to one room at once
// ---------------------------------------------------------------------------------------

#[test]
fn two_nodes_publishing_to_one_room_at_once_make_one_contiguous_sequence() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let cluster = Cluster::start(3, &SHORT_DRAIN);
    const EACH: usize = 200;
    let room = "race:1";
    let mut failures = Vec::new();
    let go = Arc::new(std::sync::Barrier::new(2));
    let results: Vec<(usize, Vec<(String, u16, Value)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|node| {
                let http = cluster.http(node);
                let go = go.clone();
                s.spawn(move || {
                    go.wait();
                    let mut out = Vec::new();
                    for n in 0..EACH {
                        let id = format!("{}-{n}", Cluster::name(node));
                        let (status, reply) = http.publish(room, Some(&id), json!({"n": n}));
                        out.push((id, status, reply));
                    }
                    (node, out)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("publisher thread")).collect()
    });
    let mut acked: HashMap<String, u64> = HashMap::new();
    let mut epochs = HashSet::new();
    for (node, out) in &results {
        for (id, status, reply) in out {
            match (status, reply["seq"].as_u64()) {
                (201, Some(seq)) if reply["duplicate"] == false => {
                    acked.insert(id.clone(), seq);
                    epochs.insert(reply["epoch"].to_string());
                }
                _ => failures.push(format!("publish {id} on {}: {status} {reply}", Cluster::name(*node))),
            }
        }
    }
    let mut seqs_acked: Vec<u64> = acked.values().copied().collect();
    seqs_acked.sort_unstable();
    if seqs_acked != (1..=(2 * EACH) as u64).collect::<Vec<_>>() {
        let distinct = seqs_acked.iter().collect::<HashSet<_>>().len();
        failures.push(format!(
            "acknowledged seqs are not a permutation of 1..={}: {} acks, {distinct} distinct, max {:?}",
            2 * EACH,
            seqs_acked.len(),
            seqs_acked.last()
        ));
    }
    if epochs.len() != 1 {
        failures.push(format!("the two nodes acknowledged with different epochs: {epochs:?}"));
    }
    // The history, read on the third node.
    let (events, _epoch, head) = full_history(&cluster.http(2), room, 0);
    if head != (2 * EACH) as u64 || seqs(&events) != (1..=head).collect::<Vec<_>>() {
        failures.push(format!("history on c: head {head}, {} events, not 1..={}", events.len(), 2 * EACH));
    }
    let mut seen = HashSet::new();
    for e in &events {
        let id = e["id"].as_str().unwrap_or("").to_string();
        if !seen.insert(id.clone()) {
            failures.push(format!("id {id} twice in history"));
        }
        if let Some(&seq) = acked.get(&id) {
            if seq != seq_of(e) {
                failures.push(format!("{id} acknowledged with seq {seq}, history has it at {}", seq_of(e)));
            }
        }
    }
    // The same id again on the other node: a duplicate with the first seq.
    for (id, node) in [("a-7", 1usize), ("b-13", 0usize)] {
        let (status, reply) = cluster.http(node).publish(room, Some(id), json!({"again": true}));
        let first = acked.get(id).copied();
        if status != 200 || reply["duplicate"] != true || reply["seq"].as_u64() != first {
            failures.push(format!("{id} again on {}: {status} {reply}, expected 200 duplicate with seq {first:?}", Cluster::name(node)));
        }
    }
    let (_, _, head_after) = full_history(&cluster.http(0), room, 0);
    if head_after != (2 * EACH) as u64 {
        failures.push(format!("head after the duplicates is {head_after}, expected {}", 2 * EACH));
    }
    eprintln!(
        "concurrent publish: 2 x {EACH} events from a and b; test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "concurrent publish", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (d) stale directory write (library API, two connections)
// ---------------------------------------------------------------------------------------

/// A quiet room whose events are all older than `history_ttl_secs` keeps its head on every
/// node: the stream keeps its newest event, so a node that never held the room reads the
/// same head, expired events are not served, and the next event continues the sequence.
#[test]
fn a_room_whose_history_expired_keeps_its_head_on_every_node() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let cluster = Cluster::start(3, &["--history-ttl-secs", "1"]);
    let room = "ttl:1";
    for i in 1..=3 {
        cluster.http(0).publish_ok(room, Some(&format!("ttl-{i}")), json!({"i": i}));
    }
    // No node but the writer may read the room before it expires: nothing to poll.
    common::let_time_pass(Duration::from_millis(2500), "the 1 s history TTL runs out");
    // Only the room's writer holds it in memory; the other nodes read the stream now.
    for node in 0..3 {
        let page = cluster.http(node).history_ok(room, None, None);
        assert_eq!(page["head"], 3, "head on {}: {page}", Cluster::name(node));
        assert_eq!(page["events"].as_array().map(Vec::len), Some(0), "expired events served on {}: {page}", Cluster::name(node));
    }
    let next = cluster.http(1).publish_ok(room, Some("ttl-4"), json!({"i": 4}));
    assert_eq!(next["seq"], 4, "{next}");
}

/// Namespaces in cluster mode (DESIGN §9): the rooms stream keeps the largest
/// namespace's history per room, not just the global `history_size`, and each room
/// keeps its own namespace's size, on its writer and on a node that reads the stream.
#[test]
fn a_namespace_history_size_applies_on_every_node() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("namespaces.toml");
    let text = "history_size = 4\n[[namespace]]\nprefix = \"long:\"\nhistory_size = 30\n[[namespace]]\nprefix = \"short:\"\nhistory_size = 2\n";
    std::fs::write(&config, text).expect("write config");
    let cluster = Cluster::start(2, &["--config", &config.display().to_string()]);
    let rt = runtime();
    // (room, seqs kept of 12)
    let rooms: [(&str, Vec<u64>); 3] = [("long:1", (1..=12).collect()), ("short:1", vec![11, 12]), ("other:1", (9..=12).collect())];
    for (room, _) in &rooms {
        for i in 1..=12 {
            cluster.http(0).publish_ok(room, Some(&format!("{room}-{i}")), json!({"i": i}));
        }
    }
    let mut failures = Vec::new();
    for node in 0..2 {
        let http = cluster.http(node);
        let token = http.mint_token("reader", "web");
        let mut ws = rt.block_on(WsClient::connect(cluster.addr(node), &token, None));
        for (room, kept) in &rooms {
            let page = http.history_ok(room, Some(0), Some(100));
            let got = seqs(page["events"].as_array().map(Vec::as_slice).unwrap_or_default());
            if (&got, &page["head"]) != (kept, &json!(12)) {
                failures.push(format!("{room} on {}: kept {got:?} (head {}), want {kept:?}", Cluster::name(node), page["head"]));
            }
            let reply = rt.block_on(ws.subscribe_since(room, 0, &page["epoch"]));
            if reply["recovered"] != json!(kept.len() == 12) {
                failures.push(format!("{room} on {}: recovery from 0 answered {reply}", Cluster::name(node)));
            }
            if reply["recovered"] == json!(true) {
                let replayed = seqs(&rt.block_on(ws.next_events(12)));
                if &replayed != kept {
                    failures.push(format!("{room} on {}: replayed {replayed:?}", Cluster::name(node)));
                }
            }
        }
    }
    fail_with_logs(&cluster, "namespace history in a cluster", &failures, &LOG_NEEDLES);
}

/// Client publish in a cluster (DESIGN §9): a client on B publishes to a room whose
/// writer is A. The event is forwarded to A (with its `from`), appended to the stream
/// and answered `published` on B once stored; A's and C's subscribers get it with
/// `from`, and every node's history has it; a backend's later publish with the client's
/// id is an event of its own.
#[test]
fn a_client_publish_on_b_to_a_room_written_by_a_reaches_a_with_from() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let cluster = Cluster::start(3, &[]);
    let rt = runtime();
    let names: Vec<&str> = (0..3).map(Cluster::name).collect();
    let room = (0..1000)
        .map(|i| format!("chat:{i}"))
        .find(|room| livegate::core::routing::room_writer(room, &names) == Some(Cluster::name(0)))
        .expect("some room is written by a");
    let mut failures = Vec::new();
    rt.block_on(async {
        let mut on_a = WsClient::connect(cluster.addr(0), &cluster.http(0).mint_token("reader-a", "web"), None).await;
        let mut on_c = WsClient::connect(cluster.addr(2), &cluster.http(2).mint_token("reader-c", "web"), None).await;
        on_a.subscribe_ok(&room).await;
        on_c.subscribe_ok(&room).await;
        let (status, body) = cluster.http(1).mint_token_raw(json!({"user": "writer-b", "publish": ["chat:*"]}));
        assert_eq!(status, 201, "{body}");
        let mut on_b = WsClient::connect(cluster.addr(1), body["token"].as_str().unwrap(), None).await;
        let reply = on_b.request(json!({"op": "publish", "room": room, "id": "c-1", "data": {"text": "hi"}})).await;
        if reply["op"] != "published" || reply["seq"] != 1 || reply["duplicate"] != false {
            failures.push(format!("publish on b: {reply}"));
        }
        let again = on_b.request(json!({"op": "publish", "room": room, "id": "c-1", "data": {"text": "hi"}})).await;
        if again["duplicate"] != true || again["seq"] != 1 {
            failures.push(format!("the same id again on b: {again}, expected duplicate with seq 1"));
        }
        let refused = on_b.request(json!({"op": "publish", "room": "news:1", "data": {}})).await;
        if refused["code"] != "forbidden" {
            failures.push(format!("a room outside the patterns on b: {refused}"));
        }
        // A backend's publish with the client's id (through c, so forwarded to a) is a
        // new event: a client's ids are its user's (issue 29), on the stream too.
        let (status, backend) = cluster.http(2).publish(&room, Some("c-1"), json!({"text": "backend"}));
        if status != 201 || backend["seq"] != 2 || backend["duplicate"] != false {
            failures.push(format!("a backend publish with the client's id: {status} {backend}"));
        }
        for (name, ws) in [("a", &mut on_a), ("c", &mut on_c)] {
            let (events, other) = collect_events(ws, &room, 2, Duration::from_secs(10)).await;
            let seen: Vec<(&Value, &Value, Option<&Value>)> = events.iter().map(|e| (&e["seq"], &e["id"], e.get("from"))).collect();
            if seen != [(&json!(1), &json!("c-1"), Some(&json!("writer-b"))), (&json!(2), &json!("c-1"), None)] || events[0]["data"]["text"] != "hi" {
                failures.push(format!("subscriber on {name}: {events:?}, also {other:?}"));
            }
        }
    });
    for node in 0..3 {
        let page = cluster.http(node).history_ok(&room, Some(0), Some(10));
        if page["head"] != 2 || page["events"][0]["from"] != "writer-b" || page["events"][1]["id"] != "c-1" {
            failures.push(format!("history on {}: {page}", Cluster::name(node)));
        }
    }
    fail_with_logs(&cluster, "cluster client publish", &failures, &LOG_NEEDLES);
}

/// Tokens are signed with a secret every node shares, and spent cluster-wide: a token
/// minted on A opens a connection on B, and the same token is then refused on A.
#[test]
fn a_token_minted_on_one_node_works_once_on_any_node() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let cluster = Cluster::start(2, &[]);
    let rt = runtime();
    let token = cluster.http(0).mint_token("once-user", "web");
    let (on_b, again_on_a) = rt.block_on(async {
        let on_b = WsClient::try_connect(cluster.addr(1), Some(&token), None).await;
        let again_on_a = WsClient::try_connect(cluster.addr(0), Some(&token), None).await;
        (on_b, again_on_a)
    });
    assert!(on_b.is_ok(), "a token minted on a must open a connection on b: {:?}", on_b.err().map(|r| (r.status, r.body)));
    match again_on_a {
        Ok(_) => panic!("a spent token opened a second connection on another node"),
        Err(refused) => {
            assert_eq!(refused.status, 401, "{}", refused.body);
            assert_eq!(error_code(&refused.body), "token_replayed", "{}", refused.body);
        }
    }
}

#[test]
fn a_stale_directory_write_from_one_node_loses_to_the_other() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let nats = NatsServer::start();
    let url = nats.url();
    let rt = runtime();
    rt.block_on(async {
        let a = livegate::cluster::Cluster::connect(&url, "a").await.unwrap_or_else(|e| panic!("connect a: {e:?}"));
        let b = livegate::cluster::Cluster::connect(&url, "b").await.unwrap_or_else(|e| panic!("connect b: {e:?}"));
        let kv_a = KvSessions::open(&a).await.unwrap_or_else(|e| panic!("open kv on a: {e:?}"));
        let kv_b = KvSessions::open(&b).await.unwrap_or_else(|e| panic!("open kv on b: {e:?}"));
        let kvs = [("a", &kv_a), ("b", &kv_b)];
        let session = "stale-session-1";
        let record = |owner: &str| SessionRecord {
            session: session.into(),
            user: "stale-user".into(),
            owner: owner.into(),
            version: 0,
            updated_at_ms: now_ms(),
        };

        // Both create the same new session at once: one creates it, the other is stale.
        let (rec_a, rec_b) = (record("a"), record("b"));
        let (ra, rb) = tokio::join!(kv_a.write_session(None, &rec_a), kv_b.write_session(None, &rec_b));
        let creator = match (&ra, &rb) {
            (Ok(w), Err(ClusterError::Stale(_))) | (Err(ClusterError::Stale(_)), Ok(w)) => {
                assert_eq!(w.version, 1, "the created record has version 1: {w:?}");
                w.owner.clone()
            }
            other => panic!("racing creates: expected exactly one Ok and one Stale, got {other:?}"),
        };
        let (stored, _) = kv_b.entry(session).await.expect("entry").expect("record exists");
        assert_eq!((stored.version, stored.owner.as_str()), (1, creator.as_str()), "{stored:?}");

        for round in 0..10 {
            // Both read the same version ...
            let (seen_a, rev_a) = kv_a.entry(session).await.expect("entry on a").expect("record");
            let (seen_b, rev_b) = kv_b.entry(session).await.expect("entry on b").expect("record");
            assert_eq!((seen_a.version, rev_a), (seen_b.version, rev_b), "round {round}: both read the same record");
            let read = seen_a.version;
            // ... and race a write from it; alternate who is polled first.
            let (first, second) = if round % 2 == 0 { (kvs[0], kvs[1]) } else { (kvs[1], kvs[0]) };
            let (rec1, rec2) = (record(first.0), record(second.0));
            let (r1, r2) = tokio::join!(first.1.write_session(Some(read), &rec1), second.1.write_session(Some(read), &rec2));
            let (winner, loser, written) = match (r1, r2) {
                (Ok(w), Err(ClusterError::Stale(_))) => (first, second, w),
                (Err(ClusterError::Stale(_)), Ok(w)) => (second, first, w),
                other => panic!("round {round}: racing writes from version {read}: expected one Ok and one Stale, got {other:?}"),
            };
            assert_eq!(written.version, read + 1, "round {round}: the winner's record: {written:?}");
            let (after, rev_after) = loser.1.entry(session).await.expect("entry").expect("record");
            assert_eq!(after.version, read + 1, "round {round}: version advanced by exactly one: {after:?}");
            assert_eq!(after.owner, winner.0, "round {round}: the winner's write is stored: {after:?}");
            // The loser retrying from its stale read loses again and changes nothing.
            match loser.1.write_session(Some(read), &record(loser.0)).await {
                Err(ClusterError::Stale(_)) => {}
                other => panic!("round {round}: stale retry by {}: expected Stale, got {other:?}", loser.0),
            }
            let (unchanged, rev_unchanged) = winner.1.entry(session).await.expect("entry").expect("record");
            assert_eq!((unchanged, rev_unchanged), (after, rev_after), "round {round}: a stale write changed the record");
        }
    });
    eprintln!("stale directory write: test took {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------
// Load: a publisher and subscribers that reconnect with `since`
// ---------------------------------------------------------------------------------------

/// Where each node takes clients and publishes now (`None`: killed, draining, restarting).
type Addrs = Arc<Mutex<Vec<Option<SocketAddr>>>>;

#[derive(Clone, Debug)]
struct Ack {
    room: String,
    id: String,
    seq: u64,
    epoch: Value,
    node: usize,
    duplicate: bool,
}

#[derive(Default, Debug)]
struct PublisherReport {
    acks: Vec<Ack>,
    /// Failed attempts by "node status" (status 0: transport error).
    refusals: BTreeMap<String, usize>,
    errors: Vec<String>,
    /// How long it was before an attempt got an ack again, per outage (longest first).
    stalls: Vec<Duration>,
}

struct Publisher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<PublisherReport>,
}

impl Publisher {
    /// Publishes `{"n": n}` with id `p-n` to `rooms[n % len]` every `every`, on the nodes
    /// of `addrs` in turn; a failed attempt is retried (same id) on the next node.
    fn start(addrs: Addrs, rooms: Vec<String>, every: Duration) -> Publisher {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut report = PublisherReport::default();
            let mut https: HashMap<SocketAddr, Http> = HashMap::new();
            let mut cursor = 0usize;
            let mut pacer = Pacer::new(every);
            let mut n = 0usize;
            while !s.load(Ordering::SeqCst) {
                pacer.wait();
                let room = rooms[n % rooms.len()].clone();
                let id = format!("p-{n}");
                let body = json!({"id": id, "data": {"n": n}});
                let path = format!("/v1/rooms/{room}/events");
                let first_try = Instant::now();
                loop {
                    let target = {
                        let addrs = addrs.lock().unwrap();
                        let len = addrs.len();
                        (0..len).map(|k| (cursor + k) % len).find_map(|i| addrs[i].map(|a| (i, a)))
                    };
                    if let Some((node, addr)) = target {
                        let http = https.entry(addr).or_insert_with(|| Http::new(addr));
                        match http.try_request("POST", &path, Auth::Key, Body::Json(body.clone())) {
                            Ok((status @ (200 | 201), reply)) => {
                                let seq = reply["seq"].as_u64().unwrap_or(0);
                                if seq == 0 || (status == 200) != (reply["duplicate"] == true) {
                                    report.errors.push(format!("{id} on {}: {status} {reply}", Cluster::name(node)));
                                }
                                report.acks.push(Ack {
                                    room: room.clone(),
                                    id: id.clone(),
                                    seq,
                                    epoch: reply["epoch"].clone(),
                                    node,
                                    duplicate: reply["duplicate"] == true,
                                });
                                let stalled = first_try.elapsed();
                                if stalled > Duration::from_millis(500) {
                                    report.stalls.push(stalled);
                                }
                                cursor = node + 1;
                                break;
                            }
                            Ok((status, reply)) => {
                                *report.refusals.entry(format!("{} {status}", Cluster::name(node))).or_default() += 1;
                                if ![429, 503].contains(&status) && report.errors.len() < 20 {
                                    report.errors.push(format!("{id} on {}: {status} {reply}", Cluster::name(node)));
                                }
                            }
                            Err(_) => *report.refusals.entry(format!("{} 0", Cluster::name(node))).or_default() += 1,
                        }
                        cursor = node + 1;
                    }
                    if first_try.elapsed() > Duration::from_secs(30) {
                        report.errors.push(format!("{id} not acknowledged by any node within 30 s"));
                        break;
                    }
                    common::pace(Duration::from_millis(20), "a refused publish is retried at 50/s");
                }
                n += 1;
            }
            report.stalls.sort_unstable_by(|a, b| b.cmp(a));
            report
        });
        Publisher { stop, thread }
    }

    fn stop(self) -> PublisherReport {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("publisher thread")
    }
}

struct LoadShared {
    addrs: Addrs,
    ready: AtomicUsize,
    /// Every room's final head, once the publisher has stopped.
    targets: watch::Receiver<Option<HashMap<String, u64>>>,
}

#[derive(Debug, Clone)]
#[allow(dead_code)] // the fields are for the failure messages
enum Ending {
    Close(Option<u16>, String),
    /// The stream ended or failed without a Close frame (1006 to a client).
    Abnormal(String),
}

#[derive(Debug)]
struct ClientReport {
    id: usize,
    room: String,
    home: usize,
    /// (seq, id) of every event of the room, in arrival order.
    got: Vec<(u64, String)>,
    /// How each connection ended, with the node it was on.
    endings: Vec<(usize, Ending)>,
    /// The nodes connected to, in order.
    nodes: Vec<usize>,
    errors: Vec<String>,
}

const LOAD_CLIENT_LIMIT: Duration = Duration::from_secs(90);

/// Handshake on `node` (a fresh token minted there), then subscribe to `room` (with
/// `since` and `epoch` after the first time). Returns the socket, the `subscribed` reply
/// and the frames that came before it.
async fn attach(
    addr: SocketAddr,
    user: &str,
    room: &str,
    since: Option<(u64, Value)>,
) -> Result<(WsClient, Value, Vec<Value>), String> {
    let token = {
        let user = user.to_string();
        tokio::task::spawn_blocking(move || try_mint(addr, &user, "web")).await.map_err(|e| e.to_string())??
    };
    let mut ws = try_ws(addr, token, None).await?;
    let mut req = json!({"op": "subscribe", "room": room, "ref": 1});
    if let Some((s, epoch)) = &since {
        req["since"] = json!(s);
        if !epoch.is_null() {
            req["epoch"] = epoch.clone();
        }
    }
    match tokio::time::timeout(WAIT, ws.ws.send(Message::Text(req.to_string()))).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("send {req}: {e}")),
        Err(_) => return Err(format!("send {req}: timed out")),
    }
    let mut before = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ws.next_incoming(left).await {
            Incoming::Json(v) if v["ref"] == 1 => return Ok((ws, v, before)),
            Incoming::Json(v) => before.push(v),
            Incoming::Timeout => return Err(format!("no reply to {req} within {WAIT:?}")),
            other => return Err(format!("connection ended before the reply to {req}: {other:?}")),
        }
    }
}

/// A subscriber of `room` that starts on node `home` and, whenever its connection ends,
/// reconnects to another node taking clients and resubscribes with `since` + epoch,
/// until it holds the room's final head.
async fn load_client(id: usize, user: String, room: String, home: usize, shared: Arc<LoadShared>) -> ClientReport {
    let mut report = ClientReport { id, room: room.clone(), home, got: Vec::new(), endings: Vec::new(), nodes: Vec::new(), errors: Vec::new() };
    let deadline = Instant::now() + LOAD_CLIENT_LIMIT;
    let mut last = 0u64;
    let mut epoch = Value::Null;
    let mut node = home;
    let mut first = true;
    'connections: loop {
        // Connect: the home node first, then any other node taking clients.
        let mut attempt = 0usize;
        let (mut ws, reply, before) = loop {
            let candidate = {
                let addrs = shared.addrs.lock().unwrap();
                let len = addrs.len();
                let start = if first { node } else { node + 1 + attempt };
                (0..len).map(|k| (start + k) % len).find(|&i| (first || i != node || len == 1) && addrs[i].is_some()).map(|i| (i, addrs[i].unwrap()))
            };
            attempt += 1;
            if let Some((i, addr)) = candidate {
                let since = if first { None } else { Some((last, epoch.clone())) };
                match attach(addr, &user, &room, since).await {
                    Ok(ok) => {
                        node = i;
                        break ok;
                    }
                    Err(e) if first => {
                        report.errors.push(format!("first connection on {}: {e}", Cluster::name(i)));
                        return report;
                    }
                    Err(_) => {}
                }
            }
            if Instant::now() > deadline {
                report.errors.push(format!("could not reconnect within {LOAD_CLIENT_LIMIT:?} (last seq {last})"));
                return report;
            }
            common::pace_async(Duration::from_millis(100), "a client that found no node retries at 10/s").await;
        };
        report.nodes.push(node);
        if reply["op"] != "subscribed" {
            report.errors.push(format!("subscribe on {}: {reply}", Cluster::name(node)));
            return report;
        }
        if first {
            epoch = reply["epoch"].clone();
            last = reply["seq"].as_u64().unwrap_or(0);
            if last != 0 {
                report.errors.push(format!("first subscribe: head {last}, expected a fresh room"));
            }
            first = false;
            shared.ready.fetch_add(1, Ordering::SeqCst);
        } else {
            if reply["recovered"] != true {
                report.errors.push(format!("resubscribe on {} since {last}: {reply}", Cluster::name(node)));
            }
            if !epoch.is_null() && reply["epoch"] != epoch {
                report.errors.push(format!("epoch changed from {epoch} to {} on {}", reply["epoch"], Cluster::name(node)));
            }
            if epoch.is_null() {
                epoch = reply["epoch"].clone();
            }
        }
        for frame in before {
            if frame["op"] == "events" {
                take_events(&frame, &room, &mut last, &mut report.got, &mut report.errors);
            }
        }
        let mut targets = shared.targets.clone();
        loop {
            let target = targets.borrow_and_update().as_ref().and_then(|t| t.get(&room).copied());
            if target.is_some_and(|t| last >= t) {
                ws.close().await;
                return report;
            }
            if Instant::now() > deadline {
                report.errors.push(format!("after {LOAD_CLIENT_LIMIT:?}: last seq {last}, target {target:?}"));
                return report;
            }
            match ws.next_incoming(Duration::from_millis(200)).await {
                Incoming::Json(frame) => take_events(&frame, &room, &mut last, &mut report.got, &mut report.errors),
                Incoming::Timeout => {}
                Incoming::Close(code, reason) => {
                    report.endings.push((node, Ending::Close(code, reason)));
                    // Let tungstenite answer the Close, then leave.
                    let _ = tokio::time::timeout(Duration::from_secs(1), async { while ws.ws.next().await.is_some() {} }).await;
                    continue 'connections;
                }
                Incoming::Ended(e) => {
                    report.endings.push((node, Ending::Abnormal(e)));
                    continue 'connections;
                }
            }
        }
    }
}

/// What a load run ends with: the final histories (read on `reader`), the publisher's
/// report and every client's report, checked against each other.
struct LoadOutcome {
    histories: HashMap<String, (Vec<Value>, Value, u64)>,
    published: PublisherReport,
    clients: Vec<ClientReport>,
}

struct Load {
    rooms: Vec<String>,
    addrs: Addrs,
    shared: Arc<LoadShared>,
    targets_tx: watch::Sender<Option<HashMap<String, u64>>>,
    clients: Vec<tokio::task::JoinHandle<ClientReport>>,
    publisher: Option<Publisher>,
}

impl Load {
    /// `clients` subscribers spread over the nodes and rooms, all subscribed before the
    /// publisher starts.
    fn start(rt: &tokio::runtime::Runtime, cluster: &Cluster, prefix: &str, rooms: usize, clients: usize, every: Duration) -> Load {
        let rooms: Vec<String> = (0..rooms).map(|r| format!("{prefix}:{r}")).collect();
        let addrs: Addrs = Arc::new(Mutex::new((0..cluster.len()).map(|i| Some(cluster.addr(i))).collect()));
        let (targets_tx, targets_rx) = watch::channel(None);
        let shared = Arc::new(LoadShared { addrs: addrs.clone(), ready: AtomicUsize::new(0), targets: targets_rx });
        let handles: Vec<_> = (0..clients)
            .map(|i| {
                let (user, room, home) = (format!("{prefix}-u{i}"), rooms[i % rooms.len()].clone(), i % cluster.len());
                rt.spawn(load_client(i, user, room, home, shared.clone()))
            })
            .collect();
        let all = wait_until(Duration::from_secs(30), || {
            shared.ready.load(Ordering::SeqCst) == clients || handles.iter().any(|h| h.is_finished())
        });
        if !all || shared.ready.load(Ordering::SeqCst) != clients {
            let finished: Vec<ClientReport> =
                handles.into_iter().filter(|h| h.is_finished()).filter_map(|h| rt.block_on(h).ok()).collect();
            panic!(
                "only {} of {clients} load clients subscribed; finished early: {:?}; logs:\n{}",
                shared.ready.load(Ordering::SeqCst),
                finished.iter().map(|r| (r.id, &r.errors)).collect::<Vec<_>>(),
                cluster.logs()
            );
        }
        let publisher = Publisher::start(addrs.clone(), rooms.clone(), every);
        Load { rooms, addrs, shared, targets_tx, clients: handles, publisher: Some(publisher) }
    }

    /// Node `i` takes no clients and publishes (set before killing or draining it).
    fn node_down(&self, i: usize) {
        self.addrs.lock().unwrap()[i] = None;
    }

    fn node_up(&self, i: usize, addr: SocketAddr) {
        self.addrs.lock().unwrap()[i] = Some(addr);
    }

    /// Stops the publisher, reads the final histories on `reader`, lets the clients catch
    /// up to them and collects everything.
    fn finish(mut self, rt: &tokio::runtime::Runtime, reader: &Http) -> LoadOutcome {
        let published = self.publisher.take().expect("publisher").stop();
        let histories: HashMap<String, (Vec<Value>, Value, u64)> =
            self.rooms.iter().map(|r| (r.clone(), full_history(reader, r, 0))).collect();
        let targets = histories.iter().map(|(r, h)| (r.clone(), h.2)).collect();
        self.targets_tx.send(Some(targets)).expect("clients listen");
        let clients = rt.block_on(async {
            let mut out = Vec::new();
            for (i, c) in std::mem::take(&mut self.clients).into_iter().enumerate() {
                match tokio::time::timeout(LOAD_CLIENT_LIMIT + Duration::from_secs(10), c).await {
                    Ok(Ok(r)) => out.push(r),
                    Ok(Err(e)) => panic!("load client {i} failed: {e}"),
                    Err(_) => panic!("load client {i} did not finish"),
                }
            }
            out
        });
        let _ = &self.shared;
        LoadOutcome { histories, published, clients }
    }
}

impl LoadOutcome {
    /// Nothing acknowledged lost, histories contiguous without a repeated id, every
    /// client holding exactly 1..=head of its room with the history's ids, in order.
    fn check(&self, failures: &mut Vec<String>) {
        let mut lost = 0usize;
        let mut acked: HashMap<&str, u64> = HashMap::new();
        for a in &self.published.acks {
            if let Some(prev) = acked.insert(&a.id, a.seq) {
                if prev != a.seq {
                    failures.push(format!("{} acknowledged twice with different seqs {prev} and {}", a.id, a.seq));
                }
            }
            let (events, epoch, _) = &self.histories[&a.room];
            if &a.epoch != epoch {
                failures.push(format!("{} acknowledged in epoch {}, the history has {epoch}", a.id, a.epoch));
            }
            match events.get((a.seq as usize).wrapping_sub(1)) {
                Some(e) if e["id"] == a.id.as_str() && seq_of(e) == a.seq => {}
                other => {
                    lost += 1;
                    if lost <= 10 {
                        failures.push(format!("acknowledged {} ({} seq {}, by {}) not in history: {other:?}", a.id, a.room, a.seq, Cluster::name(a.node)));
                    }
                }
            }
        }
        if lost > 0 {
            failures.push(format!("{lost} acknowledged events lost"));
        }
        for (room, (events, _, head)) in &self.histories {
            if seqs(events) != (1..=*head).collect::<Vec<_>>() {
                failures.push(format!("history of {room} is not 1..={head} without holes ({} events)", events.len()));
            }
            let ids: HashSet<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
            if ids.len() != events.len() {
                failures.push(format!("history of {room} holds an id twice"));
            }
        }
        if !self.published.errors.is_empty() {
            failures.push(format!("publisher errors: {:?}", self.published.errors));
        }
        let (mut missing, mut duplicated) = (0usize, 0usize);
        for c in &self.clients {
            let who = format!("client {} ({} from {}, via {:?})", c.id, c.room, Cluster::name(c.home), c.nodes.iter().map(|&n| Cluster::name(n)).collect::<Vec<_>>());
            for e in c.errors.iter().take(5) {
                failures.push(format!("{who}: {e}"));
            }
            let (events, _, head) = &self.histories[&c.room];
            let got: Vec<u64> = c.got.iter().map(|g| g.0).collect();
            let distinct: HashSet<u64> = got.iter().copied().collect();
            duplicated += got.len() - distinct.len();
            missing += (1..=*head).filter(|s| !distinct.contains(s)).count();
            if got != (1..=*head).collect::<Vec<_>>() {
                failures.push(format!("{who}: received {} events ({} distinct), expected exactly 1..={head} in order", got.len(), distinct.len()));
            }
            for (seq, id) in &c.got {
                if let Some(e) = events.get((*seq as usize).wrapping_sub(1)) {
                    if e["id"] != id.as_str() {
                        failures.push(format!("{who}: seq {seq} delivered with id {id}, history has {}", e["id"]));
                        break;
                    }
                }
            }
        }
        if missing + duplicated > 0 {
            failures.push(format!("over all clients: {missing} events missing, {duplicated} delivered twice"));
        }
    }

    fn summary(&self) -> String {
        let heads: BTreeMap<&String, u64> = self.histories.iter().map(|(r, h)| (r, h.2)).collect();
        let reconnects: usize = self.clients.iter().map(|c| c.endings.len()).sum();
        format!(
            "{} acks ({} duplicate replies), heads {heads:?}, refusals {:?}, longest stalls {:?}, {} clients, {reconnects} reconnects",
            self.published.acks.len(),
            self.published.acks.iter().filter(|a| a.duplicate).count(),
            self.published.refusals,
            &self.published.stalls[..self.published.stalls.len().min(3)],
            self.clients.len()
        )
    }
}

// ---------------------------------------------------------------------------------------
// (e) kill -9 of a node under load
// ---------------------------------------------------------------------------------------

#[test]
fn kill_9_of_a_node_under_load_loses_nothing_acknowledged() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let mut cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    let load = Load::start(&rt, &cluster, "kill", 3, 30, Duration::from_millis(10));
    common::pace(Duration::from_millis(1500), "load runs on all three nodes");
    // Killed with publishes in flight on it; then no client or publisher picks it again.
    let killed_at = Instant::now();
    cluster.take_node(0).kill9();
    load.node_down(0);
    common::pace(Duration::from_secs(4), "load goes on without a, across its detection");
    let outcome = load.finish(&rt, &cluster.http(1));
    let mut failures = Vec::new();
    outcome.check(&mut failures);
    for c in &outcome.clients {
        let on_killed = c.home == 0;
        match (on_killed, c.endings.as_slice()) {
            (true, [(0, _)]) | (false, []) => {}
            (_, endings) => failures.push(format!(
                "client {} from {}: connection endings {endings:?} (expected {})",
                c.id,
                Cluster::name(c.home),
                if on_killed { "exactly one, on a" } else { "none" }
            )),
        }
    }
    let acked_after_kill = outcome.published.acks.iter().filter(|a| a.node != 0).count();
    eprintln!(
        "kill -9 of a under load: {}; {acked_after_kill} acks by b/c; kill {:.1} s into the test; test took {:.1} s",
        outcome.summary(),
        (killed_at - started).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "kill -9 under load", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (f) nats-server restarted under load
// ---------------------------------------------------------------------------------------

#[test]
fn nats_server_restarted_under_load_loses_nothing_and_queued_directory_writes_replay() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    // New sessions are accepted for 1 s of outage (writes queued), refused after that.
    let mut flags = SHORT_DRAIN.to_vec();
    flags.extend(["--directory-outage-secs", "1"]);
    let mut cluster = Cluster::start(3, &flags);
    let rt = runtime();
    let load = Load::start(&rt, &cluster, "natsdown", 3, 9, Duration::from_millis(10));
    common::pace(Duration::from_millis(1500), "load with NATS up");
    let mut failures = Vec::new();

    let down_at = Instant::now();
    cluster.nats.kill9();

    // A new session on b while NATS is down: the handshake works, its directory write waits.
    let b = cluster.addr(1);
    // No node tells whether it has noticed (its /readyz stays 200): nothing to poll.
    common::let_time_pass(Duration::from_millis(300), "b notices the lost NATS connection");
    let outage_client = match try_mint(b, "outage-user", "web") {
        Ok(token) => match rt.block_on(try_ws(b, token, None)) {
            Ok(mut ws) => {
                rt.block_on(ws.assert_alive());
                Some(ws)
            }
            Err(e) => {
                failures.push(format!("handshake on b during the NATS outage: {e}"));
                None
            }
        },
        Err(e) => {
            failures.push(format!("token on b during the NATS outage: {e}"));
            None
        }
    };
    let outage_session = outage_client.as_ref().map(|ws| ws.session().to_string());
    // Publishing is refused while NATS is down (nothing is acknowledged that is not stored).
    match cluster.http(2).try_request("POST", "/v1/rooms/natsdown:probe/events", Auth::Key, Body::Json(json!({"data": 1}))) {
        Ok((503, _)) => {}
        other => failures.push(format!("publish on c with NATS down: expected 503, got {other:?}")),
    }
    // Past directory_outage_secs, a new session is refused instead of guessed.
    common::let_time_pass_until(down_at + Duration::from_millis(2500), "past directory_outage_secs (1 s)");
    match try_mint(b, "late-outage-user", "web") {
        Ok(token) => match rt.block_on(try_ws(b, token, None)) {
            Ok(ws) => failures.push(format!(
                "a new session on b {:?} into the NATS outage (directory_outage_secs 1) was accepted: {}",
                down_at.elapsed(),
                ws.welcome
            )),
            Err(e) if e.contains(" 503 ") && e.contains("directory_unavailable") => {}
            Err(e) => failures.push(format!("new session on b after directory_outage_secs: expected 503 directory_unavailable, got {e}")),
        },
        Err(e) => failures.push(format!("token on b during the NATS outage: {e}")),
    }
    common::pace(Duration::from_secs(3).saturating_sub(down_at.elapsed()), "the outage lasts 3 s under load");
    cluster.nats.restart();
    let up_at = Instant::now();

    // Every node publishes again by itself.
    let mut back_after = Vec::new();
    for i in 0..3 {
        let http = cluster.http(i);
        let room = format!("natsdown:probe-{i}");
        let ok = wait_until(Duration::from_secs(20), || {
            matches!(http.try_request("POST", &format!("/v1/rooms/{room}/events"), Auth::Key, Body::Json(json!({"data": 1}))), Ok((201 | 200, _)))
        });
        if !ok {
            failures.push(format!("node {} did not publish again within 20 s of the NATS restart", Cluster::name(i)));
        }
        back_after.push(up_at.elapsed());
    }
    common::pace(Duration::from_secs(2), "load with NATS back");
    let outcome = load.finish(&rt, &cluster.http(0));
    outcome.check(&mut failures);
    for c in &outcome.clients {
        if !c.endings.is_empty() {
            failures.push(format!(
                "client {} on {}: its connection ended although only NATS restarted: {:?}",
                c.id,
                Cluster::name(c.home),
                c.endings
            ));
        }
    }

    // The outage session: its queued directory write reached the directory ...
    if let (Some(mut ws), Some(session)) = (outage_client, outage_session) {
        let url = cluster.nats.url();
        let recorded = rt.block_on(async {
            let probe = livegate::cluster::Cluster::connect(&url, "probe").await.map_err(|e| format!("connect: {e:?}"))?;
            let kv = KvSessions::open(&probe).await.map_err(|e| format!("open kv: {e:?}"))?;
            let (kv, session) = (&kv, &session);
            common::wait_for_every_async(Duration::from_secs(15), Duration::from_millis(100), || async move {
                match kv.entry(session).await {
                    Ok(Some((record, _))) => Some(Ok(record)),
                    Ok(None) => None,
                    Err(e) => Some(Err(format!("read {session}: {e:?}"))),
                }
            })
            .await
            .unwrap_or_else(|| Err(format!("no directory record for {session} 15 s after NATS came back")))
        });
        match recorded {
            Ok(record) if record.owner == "b" && record.user == "outage-user" => {}
            Ok(record) => failures.push(format!("directory record of the outage session: {record:?}, expected owner b")),
            Err(e) => failures.push(format!("queued directory write not replayed: {e}")),
        }
        // ... routing knows it (once c counts b up again: heartbeats in a row after NATS
        // came back) ...
        let query = format!("session={session}");
        if !wait_until(Duration::from_secs(10), || route(&cluster.http(2), &query).as_deref() == Ok("b")) {
            failures.push(format!("/v1/route?{query} on c: {:?}, expected b", route(&cluster.http(2), &query)));
        }
        // ... and the connection made during the outage is usable: its inbox ...
        let inbox = "user:outage-user";
        let body = json!({"id": "inbox-after-1", "data": {"after": true}});
        let (status, reply) = cluster.http(0).request("POST", "/v1/users/outage-user/messages", Auth::Key, Body::Json(body));
        if status != 201 {
            failures.push(format!("message to outage-user on a after NATS came back: {status} {reply}"));
        } else {
            let (got, other) = rt.block_on(collect_events(&mut ws, inbox, 1, WAIT));
            failures.extend(other.into_iter().map(|o| format!("outage connection, inbox: {o}")));
            if got.first().map(|e| &e["id"]) != Some(&json!("inbox-after-1")) {
                failures.push(format!(
                    "the connection opened during the outage did not get its inbox message after NATS came back \
                     (got {got:?}); inbox notice: {:?}",
                    ws.inbox_subscribed
                ));
            }
        }
        // ... and a room.
        let room = "natsdown:after";
        let sub = rt.block_on(ws.subscribe(room));
        if sub["op"] != "subscribed" {
            failures.push(format!("subscribe on the outage connection: {sub}"));
        } else {
            let reply = cluster.http(0).publish_ok(room, Some("after-1"), json!({"after": true}));
            let (got, other) = rt.block_on(collect_events(&mut ws, room, 1, WAIT));
            failures.extend(other.into_iter().map(|o| format!("outage connection: {o}")));
            if got.first().map(|e| (&e["id"], &e["seq"])) != Some((&json!("after-1"), &reply["seq"])) {
                failures.push(format!("outage connection received {got:?} after publishing {reply}"));
            }
        }
    }
    eprintln!(
        "nats-server kill -9 + restart under load: {}; outage {:.1} s; nodes publishing again {:?} after the restart; test took {:.1} s",
        outcome.summary(),
        (up_at - down_at).as_secs_f64(),
        back_after,
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "nats-server restart under load", &failures, &LOG_NEEDLES);
}

/// A move charged to a user's migration budget while NATS is down is not dropped: the
/// node that made it keeps the charge in its store, writes it to the directory when NATS
/// is back, and from then on every node refuses the user's next unchosen move inside the
/// window (4029). Heartbeats every 2 s keep the peers alive through the 3 s outage, so the
/// move is one the route did not choose (its owner alive and ready), not a forced one.
#[test]
fn a_move_charged_during_a_nats_outage_reaches_the_directory_and_every_node_refuses_the_next() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let mut flags = SHORT_DRAIN.to_vec();
    flags.extend(["--cluster-heartbeat-ms", "2000", "--probe-up-after", "1"]);
    let mut cluster = Cluster::start(3, &flags);
    let cluster_ready = Instant::now();
    let rt = runtime();
    let mut failures = Vec::new();

    let token = cluster.http(0).mint_token("outage-mover", "web");
    let ws = rt.block_on(WsClient::connect(cluster.addr(0), &token, None));
    let session = ws.session().to_string();
    rt.block_on(ws.close());
    // b and c read the session's record (and so can route it from their cache while NATS
    // is down): each sends the client to a, spending nothing.
    for i in [1, 2] {
        let token = cluster.http(i).mint_token("outage-mover", "web");
        if let Ok(ws) = rt.block_on(WsClient::try_connect(cluster.addr(i), Some(&token), Some(&session))) {
            panic!("{} accepted a session owned by a, which is alive: {}", Cluster::name(i), ws.welcome);
        }
    }
    // Past the restart grace: an avoid= of a is charged, not believed as a restart.
    common::let_time_pass_until(cluster_ready + Duration::from_millis(RESTART_GRACE_MS + 500), "the nodes outlive the restart grace");

    let token = cluster.http(1).mint_token("outage-mover", "web");
    cluster.nats.kill9();
    // No node tells whether it has noticed (its /readyz stays 200): nothing to poll.
    common::let_time_pass(Duration::from_millis(300), "the nodes notice the lost NATS connection");
    let here = match rt.block_on(connect_avoiding(cluster.addr(1), &token, &session, "a")) {
        Ok(ws) => {
            let here = ws.welcome["node"].as_str().unwrap_or_default().to_string();
            if ws.session() != session || !["b", "c"].contains(&here.as_str()) {
                failures.push(format!("avoiding a during the outage, the session must move to b or c: {}", ws.welcome));
            }
            rt.block_on(ws.close());
            here
        }
        Err(r) => panic!("an avoided move during the NATS outage (the first inside the window) was refused: {} {}", r.status, r.body),
    };
    cluster.nats.restart();
    // The node that made the move writes its charge when NATS is back.
    if !common::wait_until_every(Duration::from_secs(20), Duration::from_millis(100), || !cluster.log_lines(&["charges=1"]).is_empty()) {
        fail_with_logs(&cluster, "charge during outage", &["the charge was not replayed within 20 s".into()], &LOG_NEEDLES);
    }
    cluster.wait_peers(Duration::from_secs(20));

    // Away from its new node, through a: a second unchosen move inside the window,
    // refused wherever it is decided, with the credential unspent.
    let token = cluster.http(0).mint_token("outage-mover", "web");
    match rt.block_on(connect_avoiding(cluster.addr(0), &token, &session, &here)) {
        Err(r) if r.status == 429 && r.header("close-code") == Some("4029") => {}
        Err(r) => failures.push(format!("second avoided move after the outage: expected close 4029, got {} {}", r.status, r.body)),
        Ok(ws) => failures.push(format!("the charge made during the outage was lost: a second avoided move was allowed: {}", ws.welcome)),
    }
    eprintln!("charge during outage: moved to {here}; test took {:.1} s", started.elapsed().as_secs_f64());
    fail_with_logs(&cluster, "charge during outage", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (g) rolling restart of all three nodes under load
// ---------------------------------------------------------------------------------------

#[test]
fn rolling_restart_of_all_nodes_under_load_has_no_abnormal_close_no_loss_no_duplicate() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let mut cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    let load = Load::start(&rt, &cluster, "roll", 3, 30, Duration::from_millis(10));
    common::pace(Duration::from_secs(1), "load on the whole cluster");
    let mut failures = Vec::new();
    let mut drains = Vec::new();
    for i in 0..3 {
        load.node_down(i);
        let signal_at = Instant::now();
        let drained = cluster.drain_node(i, &mut failures) - signal_at;
        cluster.start_node(i);
        load.node_up(i, cluster.addr(i));
        cluster.wait_peers(Duration::from_secs(20));
        drains.push((Cluster::name(i), drained, signal_at.elapsed()));
        common::pace(Duration::from_secs(1), "load on the whole cluster again");
    }
    let outcome = load.finish(&rt, &cluster.http(0));
    outcome.check(&mut failures);
    let mut closes: BTreeMap<String, usize> = BTreeMap::new();
    for c in &outcome.clients {
        for (node, ending) in &c.endings {
            let key = match ending {
                Ending::Close(Some(1012), _) => "1012".to_string(),
                other => {
                    failures.push(format!("client {} on {}: abnormal ending {other:?}", c.id, Cluster::name(*node)));
                    format!("{other:?}")
                }
            };
            *closes.entry(key).or_default() += 1;
        }
    }
    eprintln!(
        "rolling restart under load: {}; closes {closes:?}; (node, SIGTERM->exit, SIGTERM->rejoined) {drains:?}; test took {:.1} s",
        outcome.summary(),
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "rolling restart under load", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (h) exclusive device across nodes, (i) kick across nodes
// ---------------------------------------------------------------------------------------

#[test]
fn a_newer_phone_on_b_replaces_the_older_phone_on_a_with_4501() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    let user = "phone-user";
    let mut old_phone = rt.block_on(WsClient::connect(cluster.addr(0), &cluster.http(0).mint_token(user, "phone"), None));
    let mut tab = rt.block_on(WsClient::connect(cluster.addr(2), &cluster.http(2).mint_token(user, "web"), None));
    let mut other = rt.block_on(WsClient::connect(cluster.addr(0), &cluster.http(0).mint_token("phone-other", "phone"), None));
    let mut new_phone = rt.block_on(WsClient::connect(cluster.addr(1), &cluster.http(1).mint_token(user, "phone"), None));
    let replaced_at = Instant::now();
    let code = rt.block_on(old_phone.close_code_within(WAIT));
    let took = replaced_at.elapsed();
    let mut failures = Vec::new();
    if code != Some(4501) {
        failures.push(format!("the older phone on a ended with {code:?}, expected 4501"));
    }
    rt.block_on(async {
        new_phone.assert_alive().await;
        tab.assert_alive().await;
        other.assert_alive().await;
    });
    eprintln!("exclusive device across nodes: 4501 after {took:?}; test took {:.1} s", started.elapsed().as_secs_f64());
    fail_with_logs(&cluster, "exclusive device", &failures, &LOG_NEEDLES);
}

#[test]
fn a_kick_on_b_closes_the_users_connections_on_every_node_and_counts_them() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let mut cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    let user = "kick-user";
    let mut victims: Vec<(usize, WsClient)> = (0..3)
        .map(|i| (i, rt.block_on(WsClient::connect(cluster.addr(i), &cluster.http(i).mint_token(user, "web"), None))))
        .collect();
    let mut bystander = rt.block_on(WsClient::connect(cluster.addr(0), &cluster.http(0).mint_token("kick-bystander", "web"), None));
    // The victims read (and answer the Close) while the kick runs, as real clients do.
    let readers: Vec<_> = victims
        .drain(..)
        .map(|(i, mut ws)| {
            rt.spawn(async move {
                let code = ws.close_code_within(WAIT).await;
                let _ = tokio::time::timeout(Duration::from_secs(3), async { while ws.ws.next().await.is_some() {} }).await;
                (i, code)
            })
        })
        .collect();
    let kicked_at = Instant::now();
    let (status, reply) = cluster.http(1).request("DELETE", &format!("/v1/users/{user}/connections"), Auth::Key, Body::None);
    let replied = kicked_at.elapsed();
    let mut failures = Vec::new();
    if status != 200 || reply["closed"] != 3 {
        failures.push(format!("kick on b: {status} {reply}, expected 200 with closed 3"));
    }
    if replied > Duration::from_secs(3) {
        failures.push(format!("the kick reply took {replied:?} although every client answered its Close at once"));
    }
    for reader in readers {
        let (i, code) = rt.block_on(reader).expect("victim reader");
        if code != Some(4502) {
            failures.push(format!("{user}'s connection on {} ended with {code:?}, expected 4502", Cluster::name(i)));
        }
    }
    rt.block_on(bystander.assert_alive());
    // Nobody left: a second kick counts nothing.
    let (status, reply) = cluster.http(2).request("DELETE", &format!("/v1/users/{user}/connections"), Auth::Key, Body::None);
    if status != 200 || reply["closed"] != 0 {
        failures.push(format!("second kick on c: {status} {reply}, expected 200 with closed 0"));
    }
    // A node killed just before a kick: the kick answers with what the live nodes closed
    // once the dead node's heartbeats time out (3 s), not after the 12 s answer wait.
    let mut victim = rt.block_on(WsClient::connect(cluster.addr(0), &cluster.http(0).mint_token(user, "web"), None));
    let reader = rt.spawn(async move { victim.close_code_within(WAIT).await });
    cluster.take_node(2).kill9();
    let kicked_at = Instant::now();
    let (status, reply) = cluster.http(1).request("DELETE", &format!("/v1/users/{user}/connections"), Auth::Key, Body::None);
    let after_death = kicked_at.elapsed();
    if status != 200 || reply["closed"] != 1 {
        failures.push(format!("kick on b with c dead: {status} {reply}, expected 200 with closed 1 (the connection on a)"));
    }
    if after_death >= Duration::from_secs(8) {
        failures.push(format!("the kick with c dead took {after_death:?}: it waited for the dead node's answer"));
    }
    match rt.block_on(reader).expect("victim reader") {
        Some(4502) => {}
        code => failures.push(format!("{user}'s connection on a ended with {code:?} during the kick with c dead")),
    }
    eprintln!(
        "kick across nodes: reply after {replied:?}, {after_death:?} right after a node died; test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "kick", &failures, &LOG_NEEDLES);
}

/// The resume credential of `ws`'s welcome.
fn resume_of(ws: &WsClient) -> String {
    ws.welcome["resume"].as_str().unwrap_or_else(|| panic!("welcome without resume: {}", ws.welcome)).to_string()
}

/// A handshake on `addr` with resume credential `resume`.
async fn try_resume(addr: SocketAddr, resume: &str) -> Result<WsClient, Rejected> {
    WsClient::try_connect_url(&format!("ws://{addr}/v1/ws?resume={resume}")).await
}

/// `Err` unless the handshake was refused with 401 resume_invalid.
fn refused_as_invalid(what: &str, attempt: Result<WsClient, Rejected>) -> Result<(), String> {
    match attempt {
        Ok(ws) => Err(format!("{what}: opened a connection: {}", ws.welcome)),
        Err(r) if (r.status, error_code(&r.body)) == (401, "resume_invalid") => Ok(()),
        Err(r) => Err(format!("{what}: {} {}, expected 401 resume_invalid", r.status, r.body)),
    }
}

#[test]
fn a_resume_credential_from_a_works_once_on_b_and_a_kick_through_a_voids_it_on_both() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let cluster = Cluster::start(2, &SHORT_DRAIN);
    let rt = runtime();
    let (a, b) = (cluster.addr(0), cluster.addr(1));
    let user = "roamer";
    let (status, body) = cluster.http(0).mint_token_raw(json!({"user": user, "device": "web", "rooms": ["match:*"]}));
    assert_eq!(status, 201, "{body}");
    let first = rt.block_on(WsClient::connect(a, body["token"].as_str().unwrap(), None));
    let session = first.session().to_string();
    let from_a = resume_of(&first);
    rt.block_on(first.close());
    cluster.http(0).wait_metric_total("livegate_connections_open", 0.0, WAIT);
    cluster.http(0).wait_metric_total("livegate_sessions_live", 0.0, WAIT);

    let mut failures = Vec::new();
    // a is alive and owns the session, so b would send the client there (4421); this
    // client says it cannot reach a, and b takes the session with a's credential.
    let avoiding_a = format!("ws://{b}/v1/ws?resume={from_a}&avoid=a");
    let mut on_b = rt.block_on(WsClient::try_connect_url(&avoiding_a)).unwrap_or_else(|r| panic!("a's credential on b: {} {}", r.status, r.body));
    if (on_b.session(), on_b.welcome["node"].as_str()) != (session.as_str(), Some(Cluster::name(1))) {
        failures.push(format!("the credential from a must open session {session} on b: {}", on_b.welcome));
    }
    let (subscribed, refused) = rt.block_on(async { (on_b.subscribe("match:1").await, on_b.subscribe("news").await) });
    if subscribed["op"] != "subscribed" || refused["code"] != "forbidden" {
        failures.push(format!("the room patterns must travel with the credential: match:1 {subscribed}, news {refused}"));
    }
    let (status, reply) =
        cluster.http(1).request("POST", &format!("/v1/users/{user}/messages"), Auth::Key, Body::Json(json!({"data": "hi"})));
    assert_eq!(status, 201, "{reply}");
    let inbox = rt.block_on(on_b.recv_json());
    if !inbox.to_string().contains("\"hi\"") {
        failures.push(format!("the user's inbox must reach the resumed connection: {inbox}"));
    }
    if let Err(e) = refused_as_invalid("a's credential again on a after b spent it", rt.block_on(try_resume(a, &from_a))) {
        failures.push(e);
    }

    // A kick through a of the session now on b: b revokes, and answers a only once the
    // revocation is in NATS, so a refuses b's latest credential as soon as the kick answers.
    let latest = resume_of(&on_b);
    let reader = rt.spawn(async move {
        let code = on_b.close_code_within(WAIT).await;
        let _ = tokio::time::timeout(Duration::from_secs(3), async { while on_b.ws.next().await.is_some() {} }).await;
        code
    });
    let (status, reply) = cluster.http(0).request("DELETE", &format!("/v1/users/{user}/connections"), Auth::Key, Body::None);
    if status != 200 || reply["closed"] != 1 {
        failures.push(format!("kick on a: {status} {reply}, expected 200 with closed 1"));
    }
    let code = rt.block_on(reader).expect("reader");
    if code != Some(4502) {
        failures.push(format!("the kicked connection ended with {code:?}, expected 4502"));
    }
    if let Err(e) = refused_as_invalid("the kicked session's credential on a", rt.block_on(try_resume(a, &latest))) {
        failures.push(e);
    }
    if let Err(e) = refused_as_invalid("the kicked session's credential on b", rt.block_on(try_resume(b, &latest))) {
        failures.push(e);
    }
    fail_with_logs(&cluster, "resume across nodes", &failures, &LOG_NEEDLES);
}

#[test]
fn a_kick_on_a_voids_on_b_the_credentials_of_a_user_connected_nowhere() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let cluster = Cluster::start(2, &SHORT_DRAIN);
    let rt = runtime();
    let (a, b) = (cluster.addr(0), cluster.addr(1));
    let user = "leaver";
    let first = rt.block_on(WsClient::connect(a, &try_mint(a, user, "web").expect("token"), None));
    let kept = resume_of(&first);
    rt.block_on(first.close());
    let saved_token = try_mint(a, user, "web").expect("token");
    let gone = wait_until(WAIT, || cluster.http(0).metric_total("livegate_connections_open") == 0.0);
    assert!(gone, "the client's connection on a must be gone before the kick");

    let mut failures = Vec::new();
    let (status, reply) = cluster.http(0).request("DELETE", &format!("/v1/users/{user}/connections"), Auth::Key, Body::None);
    if status != 200 || reply["closed"] != 0 {
        failures.push(format!("kick on a: {status} {reply}, expected 200 with closed 0"));
    }
    if let Err(e) = refused_as_invalid("a's resume credential on b after the kick on a", rt.block_on(try_resume(b, &kept))) {
        failures.push(e);
    }
    match rt.block_on(try_ws(b, saved_token, None)) {
        Err(e) if e.contains("401") && e.contains("invalid_token") => {}
        Err(e) => failures.push(format!("a token minted before the kick, on b: {e}, expected 401 invalid_token")),
        Ok(ws) => failures.push(format!("a token minted before the kick opened a connection on b: {}", ws.welcome)),
    }
    match try_mint(b, user, "web") {
        Ok(token) => {
            if let Err(e) = rt.block_on(try_ws(b, token, None)) {
                failures.push(format!("a token minted after the kick: {e}"));
            }
        }
        Err(e) => failures.push(e),
    }
    fail_with_logs(&cluster, "kick of a user connected nowhere", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (j) routing leaves killed and draining nodes
// ---------------------------------------------------------------------------------------

/// A node tells its peers it drains at once, not at its next heartbeat: with a period of
/// 10 s, b shows a as draining within a second of a's SIGTERM (a's drain waits 5 s before
/// it closes anything). Clients a drain lets go reach the other nodes within
/// milliseconds, and those must already count a as draining (issue 30: the in-place
/// release's 4029s came from that gap).
#[test]
fn a_node_announces_its_drain_to_its_peers_at_once_not_at_its_next_heartbeat() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let flags = ["--cluster-heartbeat-ms", "10000", "--probe-up-after", "1", "--drain-wait-secs", "5", "--drain-spread-secs", "1", "--drain-grace-secs", "5"];
    let cluster = Cluster::start(2, &flags);
    let phase_of_a_on_b = || {
        let (status, body) = cluster.http(1).request("GET", "/v1/admin/overview", Auth::Key, Body::None);
        assert_eq!(status, 200, "overview on b: {body}");
        let nodes = body["nodes"].as_array().cloned().unwrap_or_default();
        nodes.iter().find(|n| n["node"] == "a").map(|n| n["phase"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(phase_of_a_on_b().as_deref(), Some("ready"), "b hears a before the drain");
    let term = Instant::now();
    cluster.node(0).signal("TERM");
    let seen = wait_until(Duration::from_secs(1), || phase_of_a_on_b().as_deref() == Some("draining"));
    assert!(seen, "1 s after a's SIGTERM b still shows a as {:?} (the heartbeat period is 10 s)", phase_of_a_on_b());
    eprintln!("b showed a as draining {:?} after a's SIGTERM", term.elapsed());
}

/// Polls `/v1/route` for each query on each node until no answer names `gone` (and every
/// request answers); returns how long it took, or the last answers.
fn wait_route_without(
    cluster: &Cluster,
    nodes: &[usize],
    queries: &[String],
    gone: &str,
    within: Duration,
) -> Result<Duration, Vec<String>> {
    let start = Instant::now();
    let mut last = Vec::new();
    let ok = wait_until(within, || {
        last.clear();
        for &i in nodes {
            for q in queries {
                let answer = route(&cluster.http(i), q);
                if answer.as_deref().map_or(true, |n| n == gone) {
                    last.push(format!("{} {q}: {answer:?}", Cluster::name(i)));
                }
            }
        }
        last.is_empty()
    });
    if ok {
        Ok(start.elapsed())
    } else {
        Err(last)
    }
}

/// Asserts that for `during`, no answer on `nodes` names `gone`.
fn route_stays_without(cluster: &Cluster, nodes: &[usize], queries: &[String], gone: &str, during: Duration) -> Vec<String> {
    let mut bad = Vec::new();
    common::let_time_pass_checking(during, Duration::from_millis(50), "a node that left stays unrouted", || {
        if !bad.is_empty() {
            return;
        }
        for &i in nodes {
            for q in queries {
                let answer = route(&cluster.http(i), q);
                if answer.as_deref().map_or(true, |n| n == gone) {
                    bad.push(format!("{} {q}: {answer:?} after it had left", Cluster::name(i)));
                }
            }
        }
    });
    bad
}

#[test]
fn route_stops_naming_a_killed_node_and_a_draining_node() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    // b's drain waits 3 s before closing anything, so it answers while draining.
    let mut cluster = Cluster::start(3, &["--drain-wait-secs", "3", "--drain-spread-secs", "0", "--drain-grace-secs", "2"]);
    let rt = runtime();
    let mut failures = Vec::new();
    // A session recorded on each node.
    let sessions: Vec<String> = (0..3)
        .map(|i| {
            let ws = rt.block_on(WsClient::connect(cluster.addr(i), &cluster.http(i).mint_token(&format!("route-u{i}"), "web"), None));
            let s = ws.session().to_string();
            rt.block_on(ws.close());
            s
        })
        .collect();
    let user_q = "user=route-nobody".to_string();
    // A user without a session goes to its rendezvous node: the same answer on every node.
    let ok = wait_until(Duration::from_secs(5), || {
        let user_node = route(&cluster.http(0), &user_q);
        user_node.is_ok()
            && (0..3).all(|i| {
                (0..3).all(|s| route(&cluster.http(i), &format!("session={}", sessions[s])).as_deref() == Ok(Cluster::name(s)))
                    && route(&cluster.http(i), &user_q) == user_node
            })
    });
    if !ok {
        let answers: Vec<String> = (0..3)
            .flat_map(|i| {
                let mut qs: Vec<String> = sessions.iter().map(|s| format!("session={s}")).collect();
                qs.push(user_q.clone());
                let http = cluster.http(i);
                qs.into_iter().map(move |q| format!("{} {q}: {:?}", Cluster::name(i), route(&http, &q))).collect::<Vec<_>>()
            })
            .collect();
        failures.push(format!("before: sessions should route to their owners and a user to one node on every node; answers {answers:?}"));
    }

    // kill -9 a: b and c stop naming it once its heartbeats are missed (3 periods of 1 s).
    let queries = vec![user_q.clone(), format!("session={}", sessions[0])];
    let killed_at = Instant::now();
    cluster.take_node(0).kill9();
    let after_kill = match wait_route_without(&cluster, &[1, 2], &queries, "a", Duration::from_secs(10)) {
        Ok(took) => {
            failures.extend(route_stays_without(&cluster, &[1, 2], &queries, "a", Duration::from_secs(1)));
            if took > Duration::from_secs(6) {
                failures.push(format!("a left the route answers {took:?} after kill -9 (heartbeat timeout is ~3 s)"));
            }
            Some(took)
        }
        Err(last) => {
            failures.push(format!("10 s after kill -9 of a, routes still name it (or fail): {last:?}"));
            None
        }
    };
    let _ = killed_at;

    // SIGTERM b: its own answers leave it at once, c's within about one heartbeat.
    let queries = vec![user_q.clone(), format!("session={}", sessions[1])];
    let signal_at = Instant::now();
    cluster.node(1).signal("TERM");
    let own = wait_route_without(&cluster, &[1], &queries, "b", Duration::from_millis(1000));
    let own_took = signal_at.elapsed();
    let peer = wait_route_without(&cluster, &[2], &queries, "b", Duration::from_secs(3));
    let peer_took = signal_at.elapsed();
    match &own {
        Ok(_) => {}
        Err(last) => failures.push(format!("draining b still names itself 1 s after SIGTERM: {last:?}")),
    }
    match &peer {
        Ok(_) => failures.extend(route_stays_without(&cluster, &[2], &queries, "b", Duration::from_millis(500))),
        Err(last) => failures.push(format!("c still names draining b 3 s after its SIGTERM: {last:?}")),
    }
    for q in &queries {
        match route(&cluster.http(2), q) {
            Ok(n) if n == "c" => {}
            other => failures.push(format!("c {q}: {other:?}, expected c (the only node left)")),
        }
    }
    let mut b = cluster.take_node(1);
    match b.wait_exit(Duration::from_secs(15)) {
        Some(status) if status.success() => {}
        other => failures.push(format!("b after SIGTERM: {other:?}, expected exit 0")),
    }
    eprintln!(
        "route: a left b's and c's answers {after_kill:?} after kill -9; draining b left its own answers within {own_took:?} \
         and c's within {peer_took:?} of SIGTERM; test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "route", &failures, &LOG_NEEDLES);
}

#[test]
fn session_records_leave_the_kv_bucket_after_the_ttl_unless_their_node_keeps_them_connected() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let cluster = Cluster::start(2, &["--session-ttl-secs", "2"]);
    let rt = runtime();
    let (addr, home) = (cluster.addr(1), cluster.addr(0));
    let mut failures = Vec::new();
    rt.block_on(async {
        // The same limits as the node, or connecting would set the bucket's age limit back.
        let day = Duration::from_secs(86_400);
        let limits = StreamLimits { history_size: 1000, nonce_ttl: day, session_ttl: Duration::from_secs(2) };
        let probe = livegate::cluster::Cluster::connect_with(&cluster.nats.url(), "probe", limits)
            .await
            .unwrap_or_else(|e| panic!("connect: {e:?}"));
        let kv = KvSessions::open(&probe).await.unwrap_or_else(|e| panic!("open kv: {e:?}"));
        // "kept" starts on a and moves to b, so b refreshes a record it got by migration.
        let first = WsClient::connect(home, &cluster.http(0).mint_token("kept", "web"), None).await;
        let kept_session = first.session().to_string();
        first.close().await;
        // (a is alive and owns it: the client says it cannot reach a, so b takes it.)
        let token = cluster.http(1).mint_token("kept", "web");
        let avoiding_a = format!("{}&avoid=a", ws_url(addr, Some(&token), Some(&kept_session)));
        let mut kept = WsClient::try_connect_url(&avoiding_a).await.unwrap_or_else(|r| panic!("kept on b: {} {}", r.status, r.body));
        if kept.session() != kept_session {
            failures.push(format!("the session did not move from a to b: {}", kept.welcome));
        }
        let gone = WsClient::connect(addr, &cluster.http(1).mint_token("gone", "web"), None).await;
        let gone_session = gone.session().to_string();
        gone.close().await;
        let closed = Instant::now();
        // The bucket's age limit is twice the TTL: the record goes 2 to 4 s after the close
        // (nats-server expires entries about once a second).
        let (kv, gone_session) = (&kv, &gone_session);
        let vanished = common::wait_for_every_async(Duration::from_secs(10), Duration::from_millis(100), || async move {
            kv.entry(gone_session).await.expect("read the bucket").is_none().then(|| closed.elapsed())
        })
        .await;
        match vanished {
            None => failures.push("a disconnected session's record was still in the bucket 10 s after a 2 s TTL".to_string()),
            Some(at) if at < Duration::from_millis(1900) => failures.push(format!("the record went {at:?} after the close, before the TTL")),
            Some(_) => {}
        }
        // Older than the age limit by now, yet refreshed by its node while connected.
        common::let_time_pass_async(Duration::from_secs(3), "past the bucket's age limit").await;
        match kv.entry(&kept_session).await.expect("read the bucket") {
            None => failures.push(format!("the connected session's record left the bucket after {:?}", closed.elapsed())),
            Some((record, _)) if record.owner != Cluster::name(1) => failures.push(format!("the record names owner {}", record.owner)),
            Some(_) => {}
        }
        kept.assert_alive().await;
        let tab = WsClient::connect(addr, &cluster.http(1).mint_token("kept", "web"), Some(&kept_session)).await;
        if tab.session() != kept_session {
            failures.push(format!("a second tab of the connected session got another id: {}", tab.welcome));
        }
        let late = WsClient::connect(addr, &cluster.http(1).mint_token("gone", "web"), Some(&gone_session)).await;
        if late.session() == gone_session {
            failures.push(format!("an expired session was reused: {}", late.welcome));
        }
    });
    fail_with_logs(&cluster, "session expiry in cluster mode", &failures, &LOG_NEEDLES);
}

#[test]
fn the_session_bucket_takes_the_age_limit_of_the_last_node_to_open_it() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let nats = NatsServer::start();
    let rt = runtime();
    rt.block_on(async {
        let day = Duration::from_secs(86_400);
        let mut max_ages = Vec::new();
        for session_ttl in [Duration::from_secs(5), Duration::from_secs(30)] {
            let limits = StreamLimits { history_size: 1000, nonce_ttl: day, session_ttl };
            let node = livegate::cluster::Cluster::connect_with(&nats.url(), "a", limits).await.unwrap_or_else(|e| panic!("connect: {e:?}"));
            let mut bucket = node.js.get_stream("KV_lg_sessions").await.expect("the session bucket exists");
            max_ages.push(bucket.info().await.expect("bucket info").config.max_age);
        }
        assert_eq!(max_ages, [Duration::from_secs(10), Duration::from_secs(60)], "twice session_ttl_secs, updated on open");
    });
}

// ---------------------------------------------------------------------------------------
// Room state (DESIGN §9)
// ---------------------------------------------------------------------------------------

fn publish_state(http: &Http, room: &str, id: &str, state: Option<Value>) -> Value {
    let mut body = json!({"id": id, "data": {"id": id}});
    if let Some(state) = state {
        body["state"] = state;
    }
    let (status, reply) = http.request("POST", &format!("/v1/rooms/{room}/events"), Auth::Key, Body::Json(body));
    assert_eq!(status, 201, "publish {id} to {room}: {reply}");
    reply
}

fn state_of(http: &Http, room: &str) -> Value {
    let (status, body) = http.request("GET", &format!("/v1/rooms/{room}/state"), Auth::Key, Body::None);
    assert_eq!(status, 200, "GET state of {room}: {body}");
    body
}

/// The state rides in its event's JetStream message: every node serves it, a subscriber
/// with `state:true` on any node gets it and exactly the retained events after it; the
/// latest-state record keeps it once the stream's history dropped its event (a restarted
/// node loads it from there); a `PUT` on a node that is not the writer is written by the
/// writer and reaches the other nodes; a kill -9 of the writer loses no acknowledged state.
#[test]
fn room_state_travels_with_its_event_outlives_trimming_and_a_killed_writer() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let mut cluster = Cluster::start(3, &["--history-size", "20"]);
    cluster.wait_peers(Duration::from_secs(20));
    let rt = runtime();
    let names: Vec<&str> = (0..3).map(Cluster::name).collect();
    let room = (0..1000)
        .map(|i| format!("score:{i}"))
        .find(|room| livegate::core::routing::room_writer(room, &names) == Some(Cluster::name(0)))
        .expect("some room is written by a");
    let mut failures = Vec::new();

    // Published on B (forwarded to A, the writer); every tenth event carries the state.
    for i in 1..=60 {
        let id = format!("e-{i}");
        let state = (i % 10 == 0).then(|| json!({"last_id": id}));
        let reply = publish_state(&cluster.http(1), &room, &id, state);
        assert_eq!(reply["seq"], i, "{reply}");
    }
    for i in 61..=65 {
        publish_state(&cluster.http(1), &room, &format!("e-{i}"), None);
    }
    for node in 0..3 {
        let got = state_of(&cluster.http(node), &room);
        if got["seq"] != 60 || got["data"] != json!({"last_id": "e-60"}) {
            failures.push(format!("state on {}: {got}", Cluster::name(node)));
        }
    }
    rt.block_on(async {
        for node in 0..3 {
            let token = cluster.http(node).mint_token(&format!("late-{node}"), "web");
            let mut ws = WsClient::connect(cluster.addr(node), &token, None).await;
            let reply = ws.request(json!({"op": "subscribe", "room": room, "state": true})).await;
            if reply["state"] != json!({"seq": 60, "data": {"last_id": "e-60"}}) || reply["seq"] != 65 {
                failures.push(format!("subscribe with state on {}: {reply}", Cluster::name(node)));
            }
            let (events, other) = collect_events(&mut ws, &room, 5, WAIT).await;
            failures.extend(other);
            if seqs(&events) != (61..=65).collect::<Vec<_>>() {
                failures.push(format!("events after the state on {}: {:?}", Cluster::name(node), seqs(&events)));
            }
            if let Some(extra) = ws.recv_within(QUIET).await {
                failures.push(format!("more than the events after the state on {}: {extra}", Cluster::name(node)));
            }
        }
    });

    // 30 more without a state: the stream keeps 20 (76..=95), the state's event is gone.
    for i in 66..=95 {
        publish_state(&cluster.http(2), &room, &format!("e-{i}"), None);
    }
    cluster.take_node(2).kill9();
    cluster.start_node(2);
    let got = state_of(&cluster.http(2), &room);
    if got["seq"] != 60 || got["data"] != json!({"last_id": "e-60"}) {
        failures.push(format!("state on c restarted after the history dropped its event: {got}"));
    }
    rt.block_on(async {
        let token = cluster.http(2).mint_token("after-trim", "web");
        let mut ws = WsClient::connect(cluster.addr(2), &token, None).await;
        let reply = ws.request(json!({"op": "subscribe", "room": room, "state": true})).await;
        if reply["state"]["seq"] != 60 {
            failures.push(format!("subscribe with state on c after the trim: {reply}"));
        }
        let (events, other) = collect_events(&mut ws, &room, 20, WAIT).await;
        failures.extend(other);
        if seqs(&events) != (76..=95).collect::<Vec<_>>() {
            failures.push(format!("retained events after the state on c: {:?}", seqs(&events)));
        }
    });

    // PUT on C: the writer (A) sets it as of the head; every node serves it.
    let (status, put) = cluster.http(2).request("PUT", &format!("/v1/rooms/{room}/state"), Auth::Key, Body::Json(json!({"data": {"put": 1}})));
    if status != 200 || put["seq"] != 95 {
        failures.push(format!("PUT on c: {status} {put}"));
    }
    for node in 0..3 {
        let http = cluster.http(node);
        let seen = wait_until(Duration::from_secs(5), || state_of(&http, &room)["data"] == json!({"put": 1}));
        if !seen {
            failures.push(format!("PUT state on {}: {}", Cluster::name(node), state_of(&http, &room)));
        }
    }

    // One more state from B, acknowledged, then the writer dies hard.
    let reply = publish_state(&cluster.http(1), &room, "e-96", Some(json!({"last_id": "e-96"})));
    assert_eq!(reply["seq"], 96, "{reply}");
    cluster.take_node(0).kill9();
    let b = cluster.http(1);
    if !wait_until(Duration::from_secs(5), || state_of(&b, &room)["data"] == json!({"last_id": "e-96"})) {
        failures.push(format!("state on b after a's kill -9: {}", state_of(&b, &room)));
    }
    let reply = publish_state(&b, &room, "e-97", Some(json!({"last_id": "e-97"})));
    let c = cluster.http(2);
    let want = json!({"seq": 97, "data": {"last_id": "e-97"}});
    let seen = wait_until(Duration::from_secs(5), || {
        let got = state_of(&c, &room);
        json!({"seq": got["seq"], "data": got["data"]}) == want
    });
    if reply["seq"] != 97 || !seen {
        failures.push(format!("a state published without a: {reply}, state on c: {}", state_of(&c, &room)));
    }
    fail_with_logs(&cluster, "cluster room state", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// Presence across nodes (DESIGN §9)
// ---------------------------------------------------------------------------------------

const PRESENCE_INTERVAL_MS: u64 = 300;

/// `GET /v1/rooms/{room}/presence` on node `i`: the count and the members.
fn presence_on(cluster: &Cluster, i: usize, room: &str) -> (Value, Value) {
    let (status, body) = cluster.http(i).request("GET", &format!("/v1/rooms/{room}/presence"), Auth::Key, Body::None);
    assert_eq!(status, 200, "presence on {}: {body}", Cluster::name(i));
    (body["count"].clone(), body["members"].clone())
}

/// Presence frames on `ws` until one has `count`; `None` after `within`.
async fn presence_until(ws: &mut WsClient, count: u64, within: Duration) -> Option<Value> {
    let deadline = Instant::now() + within;
    loop {
        let frame = ws.recv_within(deadline.saturating_duration_since(Instant::now())).await?;
        if frame["op"] == "presence" && frame["count"] == count {
            return Some(frame);
        }
    }
}

#[test]
fn presence_counts_converge_across_three_nodes_and_a_killed_nodes_members_leave() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let started = Instant::now();
    let mut flags = SHORT_DRAIN.to_vec();
    let interval = PRESENCE_INTERVAL_MS.to_string();
    flags.extend(["--presence-interval-ms", &interval]);
    let mut cluster = Cluster::start(3, &flags);
    let rt = runtime();
    let room = "stage:1";
    let member = |user: &str, device: &str| json!({"user": user, "device": device});
    let mut failures = Vec::new();
    // ann's web on a (watching) and again on b (one member), bob on b, cy twice on c.
    let placement = [(0, "ann", "web", true), (1, "ann", "web", false), (1, "bob", "web", false), (2, "cy", "web", false), (2, "cy", "phone", false)];
    let mut clients: Vec<(usize, WsClient)> = Vec::new();
    for (node, user, device, presence) in placement {
        let token = cluster.http(node).mint_token(user, device);
        let addr = cluster.addr(node);
        let ws = rt.block_on(async move {
            let mut ws = WsClient::connect(addr, &token, None).await;
            let reply = ws.request(json!({"op": "subscribe", "room": room, "presence": presence})).await;
            assert_eq!(reply["op"], "subscribed", "{reply}");
            ws
        });
        clients.push((node, ws));
    }
    let everyone = json!([member("ann", "web"), member("bob", "web"), member("cy", "phone"), member("cy", "web")]);
    let joined_at = Instant::now();
    for i in 0..3 {
        let converged = wait_until(Duration::from_secs(10), || presence_on(&cluster, i, room) == (json!(4), everyone.clone()));
        if !converged {
            failures.push(format!("presence on {}: {:?}, expected 4 members {everyone}", Cluster::name(i), presence_on(&cluster, i, room)));
        }
    }
    let converged_after = joined_at.elapsed();
    let watcher = &mut clients[0].1;
    if rt.block_on(presence_until(watcher, 4, Duration::from_secs(5))).is_none() {
        failures.push("the watcher on a got no presence frame with count 4".into());
    }

    // kill -9 of c: its members leave within its heartbeat timeout (3 periods of 1 s).
    clients.retain(|(node, _)| *node != 2);
    cluster.take_node(2).kill9();
    let killed_at = Instant::now();
    let two = json!([member("ann", "web"), member("bob", "web")]);
    let left = wait_until(Duration::from_secs(8), || {
        presence_on(&cluster, 0, room) == (json!(2), two.clone()) && presence_on(&cluster, 1, room) == (json!(2), two.clone())
    });
    let left_after = killed_at.elapsed();
    if !left {
        failures.push(format!("after kill -9 of c: a {:?}, b {:?}", presence_on(&cluster, 0, room), presence_on(&cluster, 1, room)));
    } else if left_after > Duration::from_secs(5) {
        failures.push(format!("c's members left {left_after:?} after its kill, later than its heartbeat timeout (3 s) and a period"));
    }
    let watcher = &mut clients[0].1;
    match rt.block_on(presence_until(watcher, 2, Duration::from_secs(5))) {
        Some(frame) => {
            if frame["left"] != json!([member("cy", "phone"), member("cy", "web")]) {
                failures.push(format!("the watcher's frame after c died: {frame}"));
            }
        }
        None => failures.push("the watcher on a got no frame with count 2 after c died".into()),
    }

    // c comes back empty: it says hello and learns a's and b's members at once.
    cluster.start_node(2);
    let restarted_at = Instant::now();
    let learned = wait_until(Duration::from_secs(5), || presence_on(&cluster, 2, room) == (json!(2), two.clone()));
    let learned_after = restarted_at.elapsed();
    if !learned {
        failures.push(format!("restarted c: {:?}, expected {two}", presence_on(&cluster, 2, room)));
    }
    eprintln!(
        "presence across nodes: converged after {converged_after:?}; a killed node's members left after {left_after:?}; \
         a restarted node learned the others' after {learned_after:?}; test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "presence", &failures, &LOG_NEEDLES);
}
