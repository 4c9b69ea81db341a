//! Scale-out's controlled entry (issue 30): sticky sessions never move by themselves, so
//! a node that joins stays idle until an operator asks for a rebalance.
//!
//! Two nodes in cluster mode (a real nats-server) behind the tests' round-robin balancer,
//! 60 livegate.js clients in one Node process (`tests/js/support/swarm.mjs`: each its own
//! user, two of four rooms) and a publisher on every room. A third node joins and is
//! asked `POST /v1/admin/rebalance {"per_second": 5}`. Asserted: the plan moves a third
//! of the clients (the mean), the new node ends with exactly the plan's total and the old
//! ones at the mean; no client refused (no close 4029, no HTTP 429), each moved user
//! moved once and kept its session, every client connected at the end with every
//! acknowledged event delivered once and in order; the handovers (the clients' 4421
//! closes after a welcome, by the clients' clocks) never exceed `per_second` plus one per
//! shedding node in any second; `/metrics` and `GET /v1/admin/rebalance` show the moves;
//! bad requests get their JSON errors (400, 409).
//!
//! Needs `node` (Node 20+) and `/usr/sbin/nats-server`; a missing one fails the test.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::balancer::Balancer;
use common::nats::Cluster;
use common::process::metric;
use common::swarm::{Swarm, SwarmSpec, SwarmState};
use common::*;
use serde_json::{json, Value};

const CLIENTS: usize = 60;
const ROOMS: usize = 4;
const ROOMS_PER_CLIENT: usize = 2;
const PER_SECOND: u64 = 5;
const PUBLISH_EVERY: Duration = Duration::from_millis(50);

const FLAGS: [&str; 4] = ["--handshakes-per-ip-per-sec", "0", "--max-connections-per-ip", "0"];

fn room(k: usize) -> String {
    format!("scale:{k}")
}

fn rooms_of(c: usize) -> Vec<String> {
    (0..ROOMS_PER_CLIENT).map(|k| room((c + k) % ROOMS)).collect()
}

/// Publishes `{"n": n}` with id `p-n` to room `n % ROOMS` every `PUBLISH_EVERY` through
/// `http`; a failed attempt is retried with the same id. Returns (room, seq) acknowledged.
struct Publisher {
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<(String, u64)>>>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    fn start(http: Http) -> Publisher {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let (s, a) = (stop.clone(), acks.clone());
        let thread = std::thread::spawn(move || {
            let mut n = 0usize;
            while !s.load(Ordering::SeqCst) {
                common::pace(PUBLISH_EVERY, "the publisher's rate");
                let room = room(n % ROOMS);
                let id = format!("p-{n}");
                let first = Instant::now();
                loop {
                    let (status, body) = http.publish(&room, Some(&id), json!({"n": n}));
                    if let (200 | 201, Some(seq)) = (status, body["seq"].as_u64()) {
                        a.lock().unwrap().push((room.clone(), seq));
                        break;
                    }
                    assert!(
                        first.elapsed() < Duration::from_secs(20),
                        "{id} not acknowledged: {status} {body}"
                    );
                    common::pace(Duration::from_millis(50), "a refused publish is retried at 20/s");
                }
                n += 1;
            }
        });
        Publisher { stop, acks, thread: Some(thread) }
    }

    fn stop(mut self) -> HashMap<String, u64> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().expect("thread").join().expect("publisher");
        let mut heads = HashMap::new();
        for (room, seq) in self.acks.lock().unwrap().iter() {
            let head = heads.entry(room.clone()).or_insert(0);
            *head = (*head).max(*seq);
        }
        heads
    }
}

fn rebalance_status(http: &Http) -> Value {
    let (status, body) = http.request("GET", "/v1/admin/rebalance", Auth::Key, Body::None);
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn a_new_node_gets_its_share_at_the_asked_rate() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut cluster = Cluster::start(2, &FLAGS);
    let balancer = Balancer::start(&[cluster.addr(0), cluster.addr(1)]);
    let log = cluster.root().join("swarm.log");
    let rooms: Vec<String> = (0..ROOMS).map(room).collect();
    let spec = SwarmSpec {
        clients: CLIENTS,
        rooms: &rooms,
        rooms_per_client: ROOMS_PER_CLIENT,
        user_prefix: "scale-u",
    };
    let mut swarm = Swarm::start(&balancer.url(), &spec, &log);
    let all_in = |s: &SwarmState| {
        s.ready
            && s.clients.iter().enumerate().all(|(c, client)| {
                client.connected && rooms_of(c).iter().all(|r| client.subscribed.contains(r))
            })
    };
    assert!(
        swarm.wait(Duration::from_secs(30), all_in),
        "every client connected and subscribed; swarm log {}",
        log.display()
    );
    let publisher = Publisher::start(cluster.http(0));
    let before = swarm.distribution();
    println!("before: {before:?}");

    // Bad input is refused with a JSON error.
    let (a, b) = (cluster.http(0), cluster.http(1));
    let (status, body) =
        a.request("POST", "/v1/admin/rebalance", Auth::Key, Body::Json(json!({"per_second": 0})));
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("bad_request")), "{body}");
    let (status, body) =
        a.request("POST", "/v1/admin/rebalance", Auth::Key, Body::Json(json!({"to": "nobody"})));
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("conflict")), "{body}");
    let (status, body) =
        a.request("POST", "/v1/admin/rebalance", Auth::Key, Body::Json(json!({"per_sec": 3})));
    assert_eq!(status, 400, "unknown fields are refused: {body}");
    let (status, _) = a.request("POST", "/v1/admin/rebalance", Auth::None, Body::Json(json!({})));
    assert_eq!(status, 401);

    // The new node joins: sticky sessions leave it idle.
    let c = cluster.add_node();
    cluster.wait_peers(Duration::from_secs(20));
    let new = cluster.http(c);
    let name = Cluster::name(c);
    // It hears the others' loads in their heartbeats.
    let mut loads = Value::Null;
    let heard_all =
        common::wait_until_every(Duration::from_secs(10), Duration::from_millis(100), || {
            loads = rebalance_status(&new)["loads"].clone();
            let heard: u64 =
                loads.as_array().unwrap().iter().filter_map(|l| l["connections"].as_u64()).sum();
            heard == CLIENTS as u64 && loads.as_array().unwrap().len() == 3
        });
    assert!(heard_all, "the new node hears every load: {loads}");
    assert_eq!(swarm.distribution().get(name), None, "nobody moved by itself");

    let asked_at = Instant::now();
    let (status, plan) = new.request(
        "POST",
        "/v1/admin/rebalance",
        Auth::Key,
        Body::Json(json!({"per_second": PER_SECOND})),
    );
    assert_eq!(status, 202, "{plan}");
    println!("plan: {plan}");
    let mean = (CLIENTS / 3) as u64;
    assert_eq!(
        (plan["to"].as_str(), plan["mean"].as_u64(), plan["total"].as_u64()),
        (Some(name), Some(mean), Some(mean)),
        "{plan}"
    );
    let shares = plan["shares"].as_array().unwrap();
    assert!(shares.iter().all(|s| s["accepted"] == true), "{plan}");
    let shedders = shares.len() as u64;

    let total = mean as usize;
    let moved = |s: &SwarmState| {
        s.clients
            .iter()
            .filter(|c| c.connected && c.welcomes.last().is_some_and(|w| w.node == name))
            .count()
            >= total
    };
    assert!(
        swarm.wait(Duration::from_secs(30), moved),
        "the new node gets {total} clients: {:?}",
        swarm.distribution()
    );
    // Every shedding node says it is done.
    let deadline = Instant::now() + Duration::from_secs(10);
    for http in [&a, &b] {
        let mut status = Value::Null;
        let done = common::wait_until_every(
            deadline.saturating_duration_since(Instant::now()),
            Duration::from_millis(100),
            || {
                status = rebalance_status(http);
                status["shedding"]["state"] == "done" || status["shedding"].is_null()
            },
        );
        assert!(done, "the shedding finishes: {status}");
    }
    let took = asked_at.elapsed();
    common::pace(Duration::from_millis(1500), "publishes go on after the moves");
    let heads = publisher.stop();
    let all_back = |s: &SwarmState| s.clients.iter().all(|c| c.connected);
    assert!(swarm.wait(Duration::from_secs(10), all_back), "every client connected at the end");
    let caught_up = |s: &SwarmState| {
        s.clients.iter().enumerate().all(|(c, client)| {
            rooms_of(c).iter().all(|r| {
                let head = heads.get(r).copied().unwrap_or(0);
                head == 0 || client.events.get(r).is_some_and(|got| got.contains(&head))
            })
        })
    };
    let delivered = swarm.wait(Duration::from_secs(20), caught_up);
    let after = swarm.distribution();
    println!("after: {after:?} in {took:?}");

    let mut failures = Vec::new();
    if !delivered {
        failures.push("not every subscriber caught up with its rooms' heads".to_string());
    }
    // The distribution: the new node has the plan's total, the others the mean.
    if after.get(name).copied() != Some(total) || after.values().any(|&n| n.abs_diff(total) > 1) {
        failures.push(format!("distribution after: {after:?}, wanted {total} on each"));
    }
    swarm.with(|s| {
        let mut times = Vec::new();
        for (i, client) in s.clients.iter().enumerate() {
            let closes: Vec<u16> = client.closes.iter().map(|(_, code, _, _)| *code).collect();
            let refusals: Vec<u16> = client.refusals.iter().map(|(_, status, _)| *status).collect();
            if closes.contains(&4029) || refusals.contains(&429) {
                failures.push(format!(
                    "client {i} refused for the budget: closes {closes:?} refusals {refusals:?}"
                ));
            }
            if !client.recovery_failed.is_empty() {
                failures.push(format!("client {i}: recovery failed"));
            }
            let sessions: HashSet<&str> =
                client.welcomes.iter().map(|w| w.session.as_str()).collect();
            if sessions.len() != 1 {
                failures.push(format!("client {i} changed session: {:?}", client.welcomes));
            }
            let nodes: Vec<&str> = client.welcomes.iter().map(|w| w.node.as_str()).collect();
            let moves = nodes.windows(2).filter(|w| w[0] != w[1]).count();
            let handed: Vec<u64> = client
                .losses
                .iter()
                .filter(|l| l.welcomed && l.code == 4421)
                .map(|l| l.client_ms)
                .collect();
            if moves > 1 || handed.len() > 1 || handed.len() != moves {
                failures.push(format!(
                    "client {i}: {moves} moves, {} handovers: {nodes:?}",
                    handed.len()
                ));
            }
            times.extend(handed);
            // Every event of its rooms up to the head, once and in order.
            for r in rooms_of(i) {
                let head = heads.get(&r).copied().unwrap_or(0);
                let got: Vec<u64> = client
                    .events
                    .get(&r)
                    .map(|g| g.iter().copied().filter(|&s| s <= head).collect())
                    .unwrap_or_default();
                if got != (1..=head).collect::<Vec<u64>>() {
                    failures.push(format!(
                        "client {i} in {r}: {} events, wanted 1..={head} once in order",
                        got.len()
                    ));
                }
            }
        }
        times.sort_unstable();
        // The rate, by the clients' clocks: no second holds more than the asked rate
        // plus one per shedding node (each node's pacer lets one through at its start).
        let worst = times
            .iter()
            .enumerate()
            .map(|(i, t)| times[i..].iter().take_while(|u| **u < t + 1000).count())
            .max()
            .unwrap_or(0);
        let span = times.last().zip(times.first()).map_or(0, |(l, f)| l - f);
        println!(
            "handovers: {} over {span} ms, at most {worst} in any second (asked {PER_SECOND}/s)",
            times.len()
        );
        if times.len() != total || worst as u64 > PER_SECOND + shedders {
            failures.push(format!(
                "{} handovers, at most {worst} in a second (allowed {})",
                times.len(),
                PER_SECOND + shedders
            ));
        }
    });
    // /metrics on the shedding nodes counts the moves; the status says what was done.
    let moves: f64 =
        [&a, &b].iter().map(|h| metric(h, "livegate_rebalance_moves_total").unwrap_or(0.0)).sum();
    let closed: f64 = [&a, &b]
        .iter()
        .map(|h| metric(h, "livegate_rebalance_connections_moved_total").unwrap_or(0.0))
        .sum();
    let pending: f64 =
        [&a, &b].iter().map(|h| metric(h, "livegate_rebalance_pending").unwrap_or(-1.0)).sum();
    if (moves, closed, pending) != (total as f64, total as f64, 0.0) {
        failures.push(format!("metrics: moves {moves}, connections moved {closed}, pending {pending}; wanted {total}, {total}, 0"));
    }
    let issued = rebalance_status(&new)["issued"].clone();
    if issued["id"] != plan["id"] {
        failures.push(format!("GET on the planning node shows the plan: {issued}"));
    }
    println!("progress on {}: {}", Cluster::name(0), rebalance_status(&a));
    let moved_users: u64 = [&a, &b]
        .iter()
        .map(|h| rebalance_status(h)["shedding"]["users"].as_u64().unwrap_or(0))
        .sum();
    if moved_users != total as u64 {
        failures.push(format!("the shedding nodes report {moved_users} users moved"));
    }
    println!("wall time {:?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}\nlogs in {}",
        failures.len(),
        failures.join("\n"),
        cluster.root().display()
    );
}
