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
//! store, data dirs and ports, and spends its time waiting on the wall clock (heartbeats,
//! drains, TTLs, outages), not the CPU: the gate runs six of them at once
//! (`common::concurrency::WIDER`). Every wait is bounded; on failure the node logs are kept (the
//! path is printed).
//!
//! The areas, one module each: [`cells`] (home cells: configuration or a claim, never
//! health; the fallback to the first healthy cell by name), [`cell_nats`] (the
//! nats-server facts cells rely on: two JetStream domains over a leaf), [`two_cells`]
//! (the two-cell harness, `common::cells`, proving itself), [`cell_drill`] (the book's cells
//! drill, run as written), [`fanout`], [`handshake_floods`] (floods of handshakes
//! that must cost other users nothing: a slow peer avoided, spent credentials replayed),
//! [`interest`] (a node takes only its rooms'
//! events), [`lag`] (a node whose NATS link is slowed shows its lag, which returns to 0),
//! [`load`] (kills, outages and restarts under
//! load), [`sessions`], [`routing`], [`state`] (room state and presence), [`occupancy`]
//! (webhooks from the room's writer), [`peers`] (what a forged peer's heartbeats and
//! orders can do: nothing), [`room_reads`] (a read ahead of the head or a feed retake
//! holds no room's mailbox), [`placement`] (a full node takes no new session; new ones
//! fill the emptiest nodes), [`permissions`] (the book's NATS account, in one NATS and in two cells) and
//! [`rolling_release`] (the seed's incident: 200
//! livegate.js clients behind a balancer).

mod cell_drill;
mod cell_failures;
mod cell_nats;
pub(crate) mod cells;
mod chaos;
mod fanout;
mod handshake_floods;
mod interest;
mod lag;
mod load;
mod occupancy;
mod peers;
mod permissions;
mod placement;
mod rolling_release;
mod room_reads;
mod routing;
mod sessions;
mod state;
mod two_cells;

use crate::common;

use livegate::core::nodes::routing::RESTART_GRACE_MS;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::nats::{Cluster, Nats, NatsServer};
use common::process::full_history;
use common::*;
use futures_util::{SinkExt, StreamExt};
use livegate::cluster::kv::KvSessions;
use livegate::cluster::{ClusterError, StreamLimits};
use livegate::store::SessionRecord;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Short drains, so a SIGTERM'd node is gone in a second or two.
const SHORT_DRAIN: [&str; 6] =
    ["--drain-wait-secs", "0", "--drain-spread-secs", "1", "--drain-grace-secs", "5"];

fn fail_with_logs<N: Nats>(
    cluster: &Cluster<N>,
    test: &str,
    failures: &[String],
    needles: &[&str],
) {
    if failures.is_empty() {
        return;
    }
    let lines = cluster.log_lines(needles);
    let shown: Vec<&String> =
        lines.iter().rev().take(80).collect::<Vec<_>>().into_iter().rev().collect();
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
    try_mint_within(addr, user, device, Duration::from_secs(20))
}

/// [`try_mint`], giving up when `addr` does not answer `within`.
fn try_mint_within(
    addr: SocketAddr,
    user: &str,
    device: &str,
    within: Duration,
) -> Result<String, String> {
    match Http::with_timeout(addr, within).try_request(
        "POST",
        "/v1/tokens",
        Auth::Key,
        Body::Json(json!({"user": user, "device": device})),
    ) {
        Ok((201, body)) => {
            body["token"].as_str().map(str::to_string).ok_or_else(|| format!("no token in {body}"))
        }
        Ok((status, body)) => Err(format!("POST /v1/tokens on {addr}: {status} {body}")),
        Err(e) => Err(format!("POST /v1/tokens on {addr}: {e}")),
    }
}

/// A WebSocket handshake that reports every failure (refusal, refused TCP connection)
/// as an error instead of a panic.
async fn try_ws(
    addr: SocketAddr,
    token: String,
    session: Option<String>,
) -> Result<WsClient, String> {
    let attempt =
        tokio::spawn(
            async move { WsClient::try_connect(addr, Some(&token), session.as_deref()).await },
        );
    match attempt.await {
        Ok(Ok(ws)) => Ok(ws),
        Ok(Err(r)) => Err(format!("handshake on {addr} refused: {} {}", r.status, r.body)),
        Err(e) => Err(format!("handshake on {addr} failed: {e}")),
    }
}

/// A handshake through `addr` that says it cannot reach `avoid`, following one
/// wrong-node refusal (keeping `avoid`) as livegate.js does.
async fn connect_avoiding(
    addr: SocketAddr,
    token: &str,
    session: &str,
    avoid: &str,
) -> Result<WsClient, RejectedWithHeaders> {
    let url =
        |addr: SocketAddr| format!("{}&avoid={avoid}", ws_url(addr, Some(token), Some(session)));
    match WsClient::try_connect_url_with_headers(&url(addr)).await {
        Err(r) if r.status == 421 => {
            let to = r.body["error"]["url"]
                .as_str()
                .unwrap_or_default()
                .trim_start_matches("http://")
                .to_string();
            let to: SocketAddr =
                to.parse().unwrap_or_else(|e| panic!("421 names no host:port ({e}): {}", r.body));
            WsClient::try_connect_url_with_headers(&url(to)).await
        }
        other => other,
    }
}

/// `GET /v1/route?<query>` on `http`: the node named, or what came instead.
fn route(http: &Http, query: &str) -> Result<String, String> {
    match http.try_request("GET", &format!("/v1/route?{query}"), Auth::Key, Body::None) {
        Ok((200, body)) => body["node"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("200 without node: {body}")),
        Ok((status, body)) => Err(format!("{status} {body}")),
        Err(e) => Err(e),
    }
}

// ---------------------------------------------------------------------------------------
// (a) fan-out across nodes
// ---------------------------------------------------------------------------------------

/// Reads events of `room` until `n` have come or `within` passed; returns them and what
/// else arrived.
async fn collect_events(
    ws: &mut WsClient,
    room: &str,
    n: usize,
    within: Duration,
) -> (Vec<Value>, Vec<String>) {
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
