//! The seed's incident as a test (issue 30): three nodes in cluster mode (a real
//! nats-server) behind a round-robin TCP balancer of the test's own
//! (`common::balancer`), 200 livegate.js clients in one Node process
//! (`tests/js/support/swarm.mjs`: each its own user with a token minted for it, a session,
//! two rooms), and a publisher that publishes to every room through the balancer at a
//! steady rate. Then two releases:
//!
//! 1. with new names, the way `data/k8s/deployment.yaml` rolls (`maxSurge: 1`,
//!    `maxUnavailable: 0`): for each old node in turn a new node joins and becomes ready
//!    (every node counts it alive), it is added to the balancer, then the old one is taken
//!    out of the balancer and drained with SIGTERM. Asserted: every client connected at
//!    the end, no session moved more than once, no handshake refused for the migration
//!    budget (no close 4029, no HTTP 429), every acknowledged event delivered to each
//!    subscriber of its room once and in order, nothing missing;
//! 2. in place (same names: SIGTERM, restart with release `r3`, next): no refusal,
//!    everyone back, nothing lost; how many moves each session made is reported as a
//!    histogram.
//!
//! For both, the time from the first SIGTERM to every client back is printed.
//!
//! Release 1's nodes carry release labels as the manifest gives them (`LIVEGATE_RELEASE`:
//! `r1` for the first three, `r2` for the new ones), so a drained node's sessions go to
//! the new nodes. The migration window is 10 s instead of 600: the budget it sets refuses
//! a second unchosen move within those 10 s, well inside a release step. Per-IP handshake
//! limits are off: every client comes from 127.0.0.1 through the balancer, so a 429 can
//! only be the budget.
//!
//! Then the manifest's release as a new user runs it (issue 48; the last test): the
//! default migration window, nothing waiting for the nodes to count each other but
//! `/readyz`, 10 s and 3 s between a new node's readiness and the next drain.
//!
//! Needs `node` (Node 20+) and `/usr/sbin/nats-server` (`.ci/test` installs both); a
//! missing one fails the test, never skips it. Every wait is bounded; on failure the
//! node logs and the swarm's stderr are kept (the path is printed).

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::balancer::Balancer;
use common::nats::Cluster;
use common::process::full_history;
use common::swarm::{ClientState, Swarm, SwarmSpec, SwarmState};
use common::*;
use serde_json::{json, Value};

const CLIENTS: usize = 200;
const ROOMS: usize = 8;
const ROOMS_PER_CLIENT: usize = 2;
/// One publish every this long, to the rooms in turn.
const PUBLISH_EVERY: Duration = Duration::from_millis(40);
/// How long after a drained node's exit every client must be back.
const BACK_LIMIT: Duration = Duration::from_secs(20);

/// Short drains (a SIGTERM'd node is gone in a second or two), a short migration window,
/// and no per-IP limits (see the top of the file).
const FLAGS: [&str; 12] = [
    "--drain-wait-secs",
    "0",
    "--drain-spread-secs",
    "1",
    "--drain-grace-secs",
    "5",
    "--migration-window-secs",
    "10",
    "--handshakes-per-ip-per-sec",
    "0",
    "--max-connections-per-ip",
    "0",
];

fn room(k: usize) -> String {
    format!("roll:{k}")
}

/// Whether client `c` is connected to a live node: welcomed since its last loss, and
/// not last welcomed by a node that has since exited (`gone`: (name, exited at)).
fn back(c: &ClientState, gone: &[(String, Instant)]) -> bool {
    c.connected
        && c.welcomes
            .last()
            .is_some_and(|w| !gone.iter().any(|(name, exited)| *name == w.node && w.at < *exited))
}

/// Moves per session among the welcomes at or after `from` (and before `to`): a move is
/// a welcome of the same session on another node than its previous welcome (the last
/// one before `from` counts as where it was).
fn moves(c: &ClientState, from: Instant, to: Instant) -> BTreeMap<String, usize> {
    let mut last: HashMap<&str, &str> = HashMap::new();
    let mut out: BTreeMap<String, usize> = BTreeMap::new();
    for w in c.welcomes.iter().filter(|w| w.at < to) {
        if w.at >= from {
            let n = out.entry(w.session.clone()).or_default();
            if last.get(w.session.as_str()).is_some_and(|prev| *prev != w.node) {
                *n += 1;
            }
        }
        last.insert(&w.session, &w.node);
    }
    out
}

// ---------------------------------------------------------------------------------------
// The publisher: every room, through the balancer, a steady rate
// ---------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Published {
    /// (room, seq, id) of every acknowledged publish.
    acks: Vec<(String, u64, String)>,
    /// Failed attempts by status (0: transport error).
    refusals: BTreeMap<u16, usize>,
    errors: Vec<String>,
}

struct Publisher {
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<Published>>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Publishes `{"n": n}` with id `p-n` to room `n % ROOMS` every `PUBLISH_EVERY`
    /// through `addr`, a new TCP connection for each request (so the balancer spreads
    /// them); a failed attempt is tried again with the same id.
    fn start(addr: SocketAddr) -> Publisher {
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new(Published::default()));
        let (s, r) = (stop.clone(), report.clone());
        let thread = std::thread::spawn(move || {
            let agent = ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(5))
                .max_idle_connections(0)
                .build();
            let mut pacer = Pacer::new(PUBLISH_EVERY);
            let mut n = 0usize;
            while !s.load(Ordering::SeqCst) {
                pacer.wait();
                let room = room(n % ROOMS);
                let id = format!("p-{n}");
                let url = format!("http://{addr}/v1/rooms/{room}/events");
                let first = Instant::now();
                loop {
                    let reply = agent
                        .post(&url)
                        .set("Authorization", &format!("Bearer {API_KEY}"))
                        .send_json(json!({"id": id, "data": {"n": n}}));
                    let (status, body) = match reply {
                        Ok(resp) => {
                            (resp.status(), resp.into_json::<Value>().unwrap_or(Value::Null))
                        }
                        Err(ureq::Error::Status(status, resp)) => {
                            (status, resp.into_json::<Value>().unwrap_or(Value::Null))
                        }
                        Err(_) => (0, Value::Null),
                    };
                    if status == 200 || status == 201 {
                        match body["seq"].as_u64() {
                            Some(seq) => {
                                r.lock().unwrap().acks.push((room.clone(), seq, id.clone()))
                            }
                            None => r
                                .lock()
                                .unwrap()
                                .errors
                                .push(format!("{id}: {status} without seq: {body}")),
                        }
                        break;
                    }
                    *r.lock().unwrap().refusals.entry(status).or_default() += 1;
                    if first.elapsed() > Duration::from_secs(30) {
                        r.lock().unwrap().errors.push(format!(
                            "{id} not acknowledged within 30 s (last: {status} {body})"
                        ));
                        break;
                    }
                    common::pace(Duration::from_millis(50), "a refused publish is retried at 20/s");
                }
                n += 1;
            }
        });
        Publisher { stop, report, thread: Some(thread) }
    }

    /// The highest acknowledged seq of each room so far.
    fn heads(&self) -> HashMap<String, u64> {
        let mut heads = HashMap::new();
        for (room, seq, _) in &self.report.lock().unwrap().acks {
            let head = heads.entry(room.clone()).or_insert(0);
            *head = (*head).max(*seq);
        }
        heads
    }

    fn stop(mut self) -> Published {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("publisher thread");
        }
        std::mem::take(&mut *self.report.lock().unwrap())
    }
}

// ---------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------

/// Every client's rooms, as swarm.mjs picks them.
fn rooms_of(c: usize) -> Vec<String> {
    (0..ROOMS_PER_CLIENT).map(|k| room((c + k) % ROOMS)).collect()
}

/// Waits (bounded) until every subscriber of each room got up to `heads[room]`, then
/// checks that each got exactly 1..=head of its rooms (every client subscribed before
/// the first publish), once each and in order.
fn check_delivery(
    swarm: &mut Swarm,
    heads: &HashMap<String, u64>,
    stage: &str,
    failures: &mut Vec<String>,
) {
    let caught_up = |s: &SwarmState| {
        s.clients.iter().enumerate().all(|(c, client)| {
            rooms_of(c).iter().all(|r| {
                let head = heads.get(r).copied().unwrap_or(0);
                head == 0
                    || client.events.get(r).is_some_and(|got| got.iter().any(|&seq| seq >= head))
            })
        })
    };
    let waited = swarm.wait(Duration::from_secs(20), caught_up);
    swarm.with(|s| {
        let (mut missing, mut extra, mut bad) = (0usize, 0usize, 0usize);
        for (c, client) in s.clients.iter().enumerate() {
            for r in rooms_of(c) {
                let head = heads.get(&r).copied().unwrap_or(0);
                let got: Vec<u64> = client.events.get(&r).map(|g| g.iter().copied().filter(|&s| s <= head).collect()).unwrap_or_default();
                let expected: Vec<u64> = (1..=head).collect();
                if got != expected {
                    bad += 1;
                    let distinct: HashSet<u64> = got.iter().copied().collect();
                    missing += expected.iter().filter(|s| !distinct.contains(s)).count();
                    extra += got.len() - distinct.len();
                    if bad <= 10 {
                        let missing_here: Vec<u64> = expected.iter().copied().filter(|s| !distinct.contains(s)).take(10).collect();
                        failures.push(format!(
                            "{stage}: client {c} in {r}: got {} events ({} distinct), expected 1..={head} in order; first missing {missing_here:?}",
                            got.len(),
                            distinct.len()
                        ));
                    }
                }
            }
        }
        if bad > 0 || !waited {
            failures.push(format!(
                "{stage}: {bad} (client, room) streams wrong ({missing} events missing, {extra} delivered twice); caught up: {waited}"
            ));
        }
    });
}

/// Between `from` and `to`: closes 4029 and HTTP 429 refusals (the migration budget),
/// session changes (a client given a new session instead of keeping its own) and
/// recovery failures; one line each, with the first few clients.
fn check_refusals(
    swarm: &Swarm,
    stage: &str,
    from: Instant,
    to: Instant,
    failures: &mut Vec<String>,
) {
    swarm.with(|s| {
        let (mut budget, mut too_many, mut changed, mut unrecovered) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (c, client) in s.clients.iter().enumerate() {
            let within = |at: &Instant| *at >= from && *at < to;
            let closes =
                client.closes.iter().filter(|(at, code, _, _)| within(at) && *code == 4029).count();
            if closes > 0 {
                budget.push(format!("client {c}: {closes}"));
            }
            let refused = client
                .refusals
                .iter()
                .filter(|(at, status, _)| within(at) && *status == 429)
                .count();
            if refused > 0 {
                too_many.push(format!("client {c}: {refused}"));
            }
            let new_sessions: Vec<(&str, &str)> = client
                .welcomes
                .windows(2)
                .filter(|w| within(&w[1].at) && w[0].session != w[1].session)
                .map(|w| (w[0].session.as_str(), w[1].session.as_str()))
                .collect();
            if !new_sessions.is_empty() {
                changed.push(format!("client {c}: {new_sessions:?}"));
            }
            let rooms: Vec<&str> = client
                .recovery_failed
                .iter()
                .filter(|(at, _)| within(at))
                .map(|(_, r)| r.as_str())
                .collect();
            if !rooms.is_empty() {
                unrecovered.push(format!("client {c}: {rooms:?}"));
            }
        }
        let mut report = |what: &str, list: &[String]| {
            if !list.is_empty() {
                failures.push(format!(
                    "{stage}: {} client(s) {what}: {:?}",
                    list.len(),
                    &list[..list.len().min(8)]
                ));
            }
        };
        report("closed with 4029 (migration budget)", &budget);
        report("refused with HTTP 429", &too_many);
        report("changed session", &changed);
        report("got recovery_failed", &unrecovered);
    });
}

/// Moves per session between `from` and `to`, as a histogram {moves: sessions}.
fn histogram(swarm: &Swarm, from: Instant, to: Instant) -> (BTreeMap<usize, usize>, Vec<String>) {
    swarm.with(|s| {
        let mut hist: BTreeMap<usize, usize> = BTreeMap::new();
        let mut over = Vec::new();
        for (c, client) in s.clients.iter().enumerate() {
            for (session, n) in moves(client, from, to) {
                *hist.entry(n).or_default() += 1;
                if n > 1 {
                    let path: Vec<&str> = client
                        .welcomes
                        .iter()
                        .filter(|w| w.session == session)
                        .map(|w| w.node.as_str())
                        .collect();
                    over.push(format!(
                        "client {c} session {session}: {n} moves, welcomes on {path:?}"
                    ));
                }
            }
        }
        (hist, over)
    })
}

/// Counts over every client: closes by code, refusals by status.
fn tallies(swarm: &Swarm) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    swarm.with(|s| {
        let mut closes: BTreeMap<String, usize> = BTreeMap::new();
        let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
        for client in &s.clients {
            for (_, code, _, via) in &client.closes {
                *closes.entry(format!("{code} via {via}")).or_default() += 1;
            }
            for (_, status, via) in &client.refusals {
                *refusals.entry(format!("{status} via {via}")).or_default() += 1;
            }
        }
        (closes, refusals)
    })
}

fn welcomes_by_node(swarm: &Swarm) -> BTreeMap<String, usize> {
    swarm.with(|s| {
        let mut out = BTreeMap::new();
        for client in &s.clients {
            if let Some(w) = client.welcomes.last() {
                *out.entry(w.node.clone()).or_default() += 1;
            }
        }
        out
    })
}

/// Waits until every client is back on a live node; returns when, or `None` after
/// `BACK_LIMIT` (then a failure says how many were not).
fn wait_back(
    swarm: &mut Swarm,
    gone: &[(String, Instant)],
    stage: &str,
    failures: &mut Vec<String>,
) -> Option<Instant> {
    if swarm.wait(BACK_LIMIT, |s| s.clients.iter().all(|c| back(c, gone))) {
        return Some(Instant::now());
    }
    let out: Vec<String> = swarm.with(|s| {
        s.clients
            .iter()
            .enumerate()
            .filter(|(_, c)| !back(c, gone))
            .map(|(i, c)| {
                let closes: Vec<_> = c
                    .closes
                    .iter()
                    .rev()
                    .take(3)
                    .map(|(_, code, reason, via)| (code, reason, via))
                    .collect();
                let refusals: Vec<_> =
                    c.refusals.iter().rev().take(3).map(|(_, status, via)| (status, via)).collect();
                format!(
                    "{i} (last welcome {:?}, last closes {closes:?}, last refusals {refusals:?})",
                    c.welcomes.last().map(|w| &w.node)
                )
            })
            .collect()
    });
    failures.push(format!(
        "{stage}: {} client(s) not back {BACK_LIMIT:?} after the drained node exited: {:?}",
        out.len(),
        &out[..out.len().min(10)]
    ));
    None
}

fn fail_with_logs(cluster: &Cluster, failures: &[String]) {
    if failures.is_empty() {
        return;
    }
    let lines = cluster.log_lines(&["WARN", "ERROR", "drain", "migrat", "route"]);
    let shown: Vec<&String> =
        lines.iter().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
    panic!(
        "rolling release: {} failure(s):\n  {}\nnode log lines (last {} of {}):\n  {}",
        failures.len(),
        failures.iter().take(60).cloned().collect::<Vec<_>>().join("\n  "),
        shown.len(),
        lines.len(),
        shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------

#[test]
fn a_rolling_release_behind_a_round_robin_balancer_moves_each_session_once_and_refuses_nobody() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut cluster = Cluster::start_with_env(3, &FLAGS, |_| release_env("r1"));
    let balancer = Balancer::start(&[cluster.addr(0), cluster.addr(1), cluster.addr(2)]);
    let rooms: Vec<String> = (0..ROOMS).map(room).collect();
    let spec = SwarmSpec {
        clients: CLIENTS,
        rooms: &rooms,
        rooms_per_client: ROOMS_PER_CLIENT,
        user_prefix: "roll-u",
    };
    let mut swarm = Swarm::start(&balancer.url(), &spec, &cluster.root().join("swarm.log"));
    let mut failures: Vec<String> = Vec::new();

    // Everyone connected and subscribed before the first publish, so every subscriber
    // of a room must get all of it.
    let all_in = swarm.wait(Duration::from_secs(60), |s| {
        s.ready
            && s.clients.iter().enumerate().all(|(c, st)| {
                st.connected && rooms_of(c).iter().all(|r| st.subscribed.contains(r))
            })
    });
    if !all_in {
        let (connected, subscribed) = swarm.with(|s| {
            (
                s.clients.iter().filter(|c| c.connected).count(),
                s.clients.iter().filter(|c| c.subscribed.len() == ROOMS_PER_CLIENT).count(),
            )
        });
        panic!("only {connected} of {CLIENTS} clients connected and {subscribed} subscribed within 60 s; logs kept in {}", cluster.root().display());
    }
    let at_start = welcomes_by_node(&swarm);
    let publisher = Publisher::start(balancer.addr);

    // ---- Release 1: new names, one at a time, surge first (data/k8s/deployment.yaml).
    let release1 = Instant::now();
    let mut gone: Vec<(String, Instant)> = Vec::new();
    let mut steps1 = Vec::new();
    let mut first_term1 = None;
    let mut back1 = None;
    for old in 0..3 {
        let new = cluster.add_node_with_env(release_env("r2"));
        // Ready, and counted alive by every node.
        cluster.wait_peers(Duration::from_secs(20));
        balancer.add(cluster.addr(new));
        balancer.remove(cluster.addr(old));
        let term = Instant::now();
        first_term1.get_or_insert(term);
        let exited = cluster.drain_node(old, &mut failures);
        gone.push((Cluster::name(old).to_string(), exited));
        let stage = format!("release 1, {} -> {}", Cluster::name(old), Cluster::name(new));
        back1 = wait_back(&mut swarm, &gone, &stage, &mut failures);
        let Some(back_at) = back1 else { break };
        steps1.push((stage, exited - term, back_at - term));
    }
    let end1 = Instant::now();
    let (hist1, over1) = histogram(&swarm, release1, end1);
    failures.extend(over1.iter().take(20).map(|o| format!("release 1: {o}")));
    if !over1.is_empty() {
        failures.push(format!("release 1: {} session(s) moved more than once", over1.len()));
    }
    let cut = Instant::now();
    check_refusals(&swarm, "start and release 1", started, cut, &mut failures);
    let heads1 = publisher.heads();
    check_delivery(&mut swarm, &heads1, "release 1", &mut failures);
    let after1 = welcomes_by_node(&swarm);
    let (closes1, refusals1) = tallies(&swarm);
    eprintln!(
        "release 1 (new names): {CLIENTS} clients, at start {at_start:?}, after {after1:?}; moves per session {hist1:?}; \
         closes {closes1:?}; refused upgrades {refusals1:?}; (step, SIGTERM->exit, SIGTERM->all back) {steps1:?}; \
         first SIGTERM -> every client back: {:?}",
        back1.zip(first_term1).map(|(b, t)| b - t)
    );
    if back1.is_none() {
        // Not everyone came back: the rest would only wait out more limits.
        fail_with_logs(&cluster, &failures);
    }

    // ---- Release 2: in place, same names: SIGTERM, restart, next.
    let release2 = Instant::now();
    let mut steps2 = Vec::new();
    let mut first_term2 = None;
    let mut back2 = None;
    for i in cluster.running() {
        balancer.remove(cluster.addr(i));
        let term = Instant::now();
        first_term2.get_or_insert(term);
        let exited = cluster.drain_node(i, &mut failures);
        gone.push((Cluster::name(i).to_string(), exited));
        // A rollout in place (a StatefulSet's) gives the restarted pod a new label too.
        cluster.set_node_env(i, release_env("r3"));
        cluster.start_node(i);
        cluster.wait_peers(Duration::from_secs(20));
        balancer.add(cluster.addr(i));
        let stage = format!("release 2, {} in place", Cluster::name(i));
        back2 = wait_back(&mut swarm, &gone, &stage, &mut failures);
        let Some(back_at) = back2 else { break };
        steps2.push((stage, exited - term, back_at - term));
    }
    let end2 = Instant::now();
    let (hist2, over2) = histogram(&swarm, release2, end2);

    // ---- The end: stop publishing, everything acknowledged delivered, and stored.
    common::pace(Duration::from_secs(1), "publishes go on after the second release");
    let published = publisher.stop();
    let mut heads: HashMap<String, u64> = HashMap::new();
    for (room, seq, _) in &published.acks {
        let head = heads.entry(room.clone()).or_insert(0);
        *head = (*head).max(*seq);
    }
    check_refusals(&swarm, "release 2", cut, Instant::now(), &mut failures);
    check_delivery(&mut swarm, &heads, "release 2", &mut failures);
    failures.extend(published.errors.iter().take(10).map(|e| format!("publisher: {e}")));
    let reader = cluster.http(cluster.running()[0]);
    for k in 0..ROOMS {
        let r = room(k);
        let (events, _, head) = full_history(&reader, &r, 0);
        let ids: HashMap<u64, String> = events
            .iter()
            .map(|e| (seq_of(e), e["id"].as_str().unwrap_or("").to_string()))
            .collect();
        for (_, seq, id) in published.acks.iter().filter(|(room, _, _)| *room == r) {
            if ids.get(seq) != Some(id) {
                failures.push(format!(
                    "{r}: acknowledged {id} at seq {seq}, history (head {head}) has {:?}",
                    ids.get(seq)
                ));
            }
        }
    }
    let after2 = welcomes_by_node(&swarm);
    let (closes, refusals) = tallies(&swarm);
    let (welcomes, redirects, errors): (usize, usize, Vec<String>) = swarm.with(|s| {
        (
            s.clients.iter().map(|c| c.welcomes.len()).sum(),
            s.clients.iter().map(|c| c.redirects.len()).sum(),
            s.clients.iter().flat_map(|c| c.errors.iter().cloned()).take(10).collect(),
        )
    });
    eprintln!(
        "release 2 (in place): clients after {after2:?}; moves per session {hist2:?} ({} session(s) moved more than once); \
         (step, SIGTERM->exit, SIGTERM->all back) {steps2:?}; first SIGTERM -> every client back: {:?}",
        over2.len(),
        back2.zip(first_term2).map(|(b, t)| b - t)
    );
    eprintln!(
        "both releases: {} acks ({:?} per room), publish refusals {:?}; {welcomes} welcomes, {redirects} redirects followed; closes {closes:?}; refused upgrades \
         {refusals:?}; balancer (accepted, unrouted) {:?}; first client errors {errors:?}; test took {:.1} s",
        published.acks.len(),
        heads,
        published.refusals,
        balancer.counts(),
        started.elapsed().as_secs_f64()
    );
    swarm.finish();
    fail_with_logs(&cluster, &failures);
}

// ---------------------------------------------------------------------------------------
// The manifest's release, as data/k8s/deployment.yaml runs it (issue 48)
// ---------------------------------------------------------------------------------------

const MANIFEST_CLIENTS: usize = 120;

/// The default migration window (the manifest sets none); short drains so the file stays
/// quick (the balancer takes the node out at SIGTERM, so `drain_wait_secs` has nothing
/// to wait out here); no per-IP limits (see the top of the file).
const MANIFEST_FLAGS: [&str; 10] = [
    "--drain-wait-secs",
    "1",
    "--drain-spread-secs",
    "2",
    "--drain-grace-secs",
    "5",
    "--handshakes-per-ip-per-sec",
    "0",
    "--max-connections-per-ip",
    "0",
];

/// A pod's `LIVEGATE_RELEASE`, as the manifest sets it from its `pod-template-hash`.
fn release_env(label: &str) -> Vec<(String, String)> {
    vec![("LIVEGATE_RELEASE".to_string(), label.to_string())]
}

/// The manifest's rollout (`maxSurge: 1`, `maxUnavailable: 0`), step by step as
/// Kubernetes takes it: a new pod starts; once its `/readyz` answers 200 it joins the
/// balancer's endpoints; `gap` later (`minReadySeconds`) the oldest old pod leaves the
/// endpoints and gets SIGTERM at about the same time, and the next new pod starts while
/// it drains. Nothing waits for the nodes to count each other: `/readyz` is all
/// Kubernetes reads. Returns when every old node has exited and every client is back.
fn manifest_release(
    cluster: &mut Cluster,
    balancer: &Balancer,
    swarm: &mut Swarm,
    label: &str,
    gap: Duration,
    gone: &mut Vec<(String, Instant)>,
    failures: &mut Vec<String>,
) {
    let olds = cluster.running();
    let mut draining: Vec<(usize, common::process::ServeProcess)> = Vec::new();
    for old in olds {
        let new = cluster.add_node_with_env(release_env(label));
        balancer.add(cluster.addr(new));
        common::let_time_pass(
            gap,
            "the manifest's minReadySeconds between a new pod's readiness and the next drain",
        );
        // Pods drained in earlier steps have had `gap` to finish; reap them.
        reap(&mut draining, gone, failures);
        balancer.remove(cluster.addr(old));
        cluster.node(old).signal("TERM");
        draining.push((old, cluster.take_node(old)));
    }
    reap(&mut draining, gone, failures);
    let stage = format!("release {label}, gap {gap:?}");
    wait_back(swarm, gone, &stage, failures);
}

/// Waits (20 s at most each) for the SIGTERM'd nodes to exit and records when.
fn reap(
    draining: &mut Vec<(usize, common::process::ServeProcess)>,
    gone: &mut Vec<(String, Instant)>,
    failures: &mut Vec<String>,
) {
    for (i, mut process) in draining.drain(..) {
        match process.wait_exit(Duration::from_secs(20)) {
            Some(status) if status.success() => {}
            Some(status) => failures
                .push(format!("node {} exited with {status} after SIGTERM", Cluster::name(i))),
            None => {
                failures.push(format!("node {} still running 20 s after SIGTERM", Cluster::name(i)))
            }
        }
        gone.push((Cluster::name(i).to_string(), Instant::now()));
    }
}

/// The release as a new user runs it from `data/k8s/deployment.yaml` (issue 48): three
/// nodes (release `r1`) behind the round-robin balancer, 120 livegate.js clients each
/// keeping its session, rooms publishing throughout, the default migration window;
/// then the manifest's rollout twice, with 10 s (`r2`) and then 3 s (`r3`) between a new
/// node's readiness and the next drain. Every session moves at most once per release,
/// no event is lost, nobody is refused for the migration budget (4029, 429). The
/// histograms of moves per session are printed as `FIGURE` lines.
#[test]
fn the_manifests_release_moves_each_session_at_most_once_with_10_s_or_3_s_between_ready_and_drain()
{
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut cluster = Cluster::start_with_env(3, &MANIFEST_FLAGS, |_| release_env("r1"));
    let balancer = Balancer::start(&[cluster.addr(0), cluster.addr(1), cluster.addr(2)]);
    let rooms: Vec<String> = (0..ROOMS).map(room).collect();
    let spec = SwarmSpec {
        clients: MANIFEST_CLIENTS,
        rooms: &rooms,
        rooms_per_client: ROOMS_PER_CLIENT,
        user_prefix: "manifest-u",
    };
    let mut swarm = Swarm::start(&balancer.url(), &spec, &cluster.root().join("swarm.log"));
    let mut failures: Vec<String> = Vec::new();
    let all_in = swarm.wait(Duration::from_secs(60), |s| {
        s.ready
            && s.clients.iter().enumerate().all(|(c, st)| {
                st.connected && rooms_of(c).iter().all(|r| st.subscribed.contains(r))
            })
    });
    assert!(
        all_in,
        "not every client connected and subscribed within 60 s; logs kept in {}",
        cluster.root().display()
    );
    let publisher = Publisher::start(balancer.addr);
    let mut gone: Vec<(String, Instant)> = Vec::new();
    let mut figures = Vec::new();
    for (label, gap) in [("r2", Duration::from_secs(10)), ("r3", Duration::from_secs(3))] {
        let from = Instant::now();
        manifest_release(&mut cluster, &balancer, &mut swarm, label, gap, &mut gone, &mut failures);
        let (hist, over) = histogram(&swarm, from, Instant::now());
        let twice = over.len();
        eprintln!(
            "FIGURE manifest release (gap {} s between ready and drain): moves per session {hist:?}, {twice} of {MANIFEST_CLIENTS} moved more than once; took {:.1} s",
            gap.as_secs(),
            from.elapsed().as_secs_f64()
        );
        failures
            .extend(over.iter().take(10).map(|o| format!("release {label} (gap {gap:?}): {o}")));
        if twice > 0 {
            failures.push(format!(
                "release {label} (gap {gap:?}): {twice} session(s) moved more than once: {hist:?}"
            ));
        }
        figures.push((gap, hist));
    }
    common::pace(Duration::from_secs(1), "publishes go on after the releases");
    let published = publisher.stop();
    let mut heads: HashMap<String, u64> = HashMap::new();
    for (room, seq, _) in &published.acks {
        let head = heads.entry(room.clone()).or_insert(0);
        *head = (*head).max(*seq);
    }
    check_refusals(&swarm, "the manifest's releases", started, Instant::now(), &mut failures);
    check_delivery(&mut swarm, &heads, "the manifest's releases", &mut failures);
    failures.extend(published.errors.iter().take(10).map(|e| format!("publisher: {e}")));
    let (closes, refusals) = tallies(&swarm);
    eprintln!(
        "manifest releases: {figures:?}; {} acks, publish refusals {:?}; closes {closes:?}; refused upgrades {refusals:?}; clients end on {:?}; test took {:.1} s",
        published.acks.len(),
        published.refusals,
        welcomes_by_node(&swarm),
        started.elapsed().as_secs_f64()
    );
    swarm.finish();
    fail_with_logs(&cluster, &failures);
}
