//! Chaos with real processes (issue 33): a replicated NATS as users deploy it (three
//! current nats-servers in one JetStream cluster, `common::nats::NatsCluster`, every
//! stream and bucket with three replicas) under three livegate nodes, with subscribers
//! and publishers on every node, while something breaks:
//!
//! - nats-servers are killed with SIGKILL (the rooms stream's leader, then another);
//! - node a is cut off from NATS and from its clients for 10 s, then healed (and from
//!   NATS only, its clients still connected to it);
//! - node a's links get 200 ms more latency each way and 2 % loss for 10 s;
//! - every node is restarted in turn (SIGTERM, start again, ready, next).
//!
//! Publishers retry with the same id after a refusal or no answer, as the book tells
//! users to (docs/src/cluster.md, docs/src/troubleshooting.md); every acknowledged publish must reach every subscriber once, in order,
//! nothing missing (`load::LoadOutcome::check`). Where connections are lost, clients move
//! to a live node by themselves (`load::Reach`: they give up a connection silent for 2.5
//! ping intervals, as livegate.js does) and each test prints how long it was until every
//! client was receiving again.
//!
//! The cut and the degraded link are a `common::link::Link` (TCP proxies the test
//! controls) rather than network namespaces and `tc netem`: it needs no root and leaves
//! nothing behind on the machine when a test dies, it touches only node a's sockets while
//! other tests run beside on the same loopback, and the processes run unchanged. Node a's
//! NATS seeds are the link's proxies in front of the three servers, which advertise no
//! other address (`--no_advertise`), so every reconnect of a goes through the link too.
//! What the link does instead of dropping packets (it holds bytes; a "lost" segment costs
//! a retransmission timeout and blocks what follows) is described in `common::link`.

use super::load::{Ending, Load, LoadOutcome, Reach};
use super::*;
use common::link::{Condition, Link};
use common::nats::NatsCluster;

/// The streams and buckets livegate creates (webhooks off: no occupancy bucket).
const STREAMS: [&str; 5] = ["LG_ROOMS", "LG_STATE", "KV_lg_sessions", "KV_lg_nonces", "KV_lg_meta"];
/// How long the cluster may take to publish again on every node after a kill.
const BACK_LIMIT: Duration = Duration::from_secs(20);

/// `stream`'s replicas and the NATS server leading it, as JetStream reports them now.
async fn stream_state(
    probe: &livegate::cluster::Cluster,
    stream: &str,
) -> Result<(usize, Option<String>, Vec<(String, bool)>), String> {
    let found = tokio::time::timeout(Duration::from_secs(3), probe.js.get_stream(stream)).await;
    let stream = match found {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(format!("stream info of {stream}: {e}")),
        Err(_) => return Err(format!("stream info of {stream}: no answer within 3 s")),
    };
    let info = stream.cached_info();
    let cluster = info.cluster.as_ref();
    let peers = cluster
        .map(|c| c.replicas.iter().map(|p| (p.name.clone(), p.current && !p.offline)).collect())
        .unwrap_or_default();
    Ok((info.config.num_replicas, cluster.and_then(|c| c.leader.clone()), peers))
}

/// The index of the NATS server leading the rooms stream, once one leads it.
fn rooms_leader(rt: &tokio::runtime::Runtime, probe: &livegate::cluster::Cluster) -> usize {
    let found = common::wait_for_every(BACK_LIMIT, Duration::from_millis(100), || {
        let leader = rt.block_on(stream_state(probe, "LG_ROOMS")).ok()?.1?;
        (0..3).find(|&k| NatsCluster::name(k) == leader)
    });
    found.unwrap_or_else(|| panic!("the rooms stream had no leader within {BACK_LIMIT:?}"))
}

/// Waits until every node acknowledges a publish (to a probe room of its own); returns
/// how long after `since` the last one did, or a failure.
fn every_node_publishes<N: Nats>(
    cluster: &Cluster<N>,
    since: Instant,
    failures: &mut Vec<String>,
) -> Duration {
    for i in 0..cluster.len() {
        let http = cluster.http(i);
        let path = format!("/v1/rooms/chaos:probe-{i}/events");
        let ok = wait_until(BACK_LIMIT, || {
            matches!(
                http.try_request("POST", &path, Auth::Key, Body::Json(json!({"data": 1}))),
                Ok((200 | 201, _))
            )
        });
        if !ok {
            failures.push(format!(
                "node {} did not publish within {BACK_LIMIT:?} of the kill",
                Cluster::name(i)
            ));
        }
    }
    since.elapsed()
}

/// Publishing pauses 4 to 9 s after each kill, and that is NATS's Raft, not livegate:
/// the surviving servers wait out a randomised election timeout (nats-server's
/// `minElectionTimeout`..`maxElectionTimeout`, 4..9 s, compiled in, no option) before the
/// rooms stream gets a new leader. Meanwhile every append is refused at once (no
/// responders: 503 within milliseconds, not after `REQUEST_TIMEOUT`) and each node sees
/// the lost connection within milliseconds, so the nodes publish again as soon as the new
/// leader exists. A server stopped with SIGTERM hands its leaderships over before it exits
/// (measured: publishing again 0.1 s after the signal).
#[test]
fn killing_the_room_streams_leading_nats_server_then_another_loses_and_repeats_nothing_acknowledged(
) {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut flags = SHORT_DRAIN.to_vec();
    flags.extend(["--cluster-replicas", "3"]);
    let mut cluster = Cluster::start_replicated(3, &flags);
    let formed = started.elapsed();
    let rt = runtime();
    let mut failures = Vec::new();
    let probe = rt
        .block_on(livegate::cluster::Cluster::connect(&cluster.nats.urls(), "chaos-probe"))
        .unwrap_or_else(|e| panic!("connect to the NATS cluster: {e}"));
    assert_eq!(probe.replicas, 3, "three JetStream servers: the default replicas are 3");
    for stream in STREAMS {
        match rt.block_on(stream_state(&probe, stream)) {
            Ok((3, _, _)) => {}
            other => failures.push(format!("{stream}: expected 3 replicas, got {other:?}")),
        }
    }

    let load = Load::start_everywhere(&rt, &cluster, "chaos", 3, 18, Duration::from_millis(30));
    common::pace(Duration::from_millis(1500), "load on every node with every NATS server up");

    // The rooms stream's leader goes first: its appends in flight get no answer.
    let first = rooms_leader(&rt, &probe);
    let first_at = Instant::now();
    cluster.nats.servers[first].kill9();
    let first_back = every_node_publishes(&cluster, first_at, &mut failures);
    common::pace(Duration::from_secs(2), "load with two of three NATS servers");
    cluster.nats.servers[first].restart();
    let restarted_at = Instant::now();
    // Back in the stream's group, caught up, before the next kill.
    let caught_up = common::wait_until_every(BACK_LIMIT, Duration::from_millis(200), || {
        rt.block_on(stream_state(&probe, "LG_ROOMS")).is_ok_and(|(_, leader, peers)| {
            leader.is_some() && peers.len() == 2 && peers.iter().all(|(_, current)| *current)
        })
    });
    if !caught_up {
        failures.push(format!(
            "{} did not catch up on the rooms stream within {BACK_LIMIT:?}: {:?}",
            NatsCluster::name(first),
            rt.block_on(stream_state(&probe, "LG_ROOMS"))
        ));
    }
    let caught_up_after = restarted_at.elapsed();
    common::pace(Duration::from_secs(1), "load with every NATS server up again");

    // Then another one: the leader now, unless the restarted server leads again.
    let leader = rooms_leader(&rt, &probe);
    let second = if leader == first { (first + 1) % 3 } else { leader };
    let second_at = Instant::now();
    cluster.nats.servers[second].kill9();
    let second_back = every_node_publishes(&cluster, second_at, &mut failures);
    common::pace(Duration::from_secs(2), "load with two of three NATS servers");

    let outcome = load.finish(&rt, &cluster.http(0));
    outcome.check(&mut failures);
    for c in &outcome.clients {
        if !c.endings.is_empty() {
            failures.push(format!(
                "client {} on {}: its connection ended although only NATS servers died: {:?}",
                c.id,
                Cluster::name(c.home),
                c.endings
            ));
        }
    }
    let delivered: usize = outcome.clients.iter().map(|c| c.got.len()).sum();
    eprintln!(
        "chaos, kill -9 of the rooms stream's leader ({}), restart, then of {}: {} published, {} acked, {delivered} delivered \
         to {} subscribers; {}; every node publishing again {:.1} s and {:.1} s after the kills; restarted server caught up \
         in {:.1} s; cluster formed in {:.1} s; test took {:.1} s",
        NatsCluster::name(first),
        NatsCluster::name(second),
        outcome.published.published,
        outcome.published.acks.len(),
        outcome.clients.len(),
        outcome.summary(),
        first_back.as_secs_f64(),
        second_back.as_secs_f64(),
        caught_up_after.as_secs_f64(),
        formed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        eprintln!(
            "NATS logs:\n{}",
            cluster
                .nats
                .logs()
                .lines()
                .filter(|l| l.contains("[WRN]") || l.contains("[ERR]"))
                .take(60)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    fail_with_logs(&cluster, "chaos: NATS servers killed", &failures, &LOG_NEEDLES);
}

/// Streams and buckets made with one replica (before the NATS cluster grew, or by an
/// earlier build) are raised to three by the next node that starts with three, never
/// left at one; the node that asks for one leaves them at three.
#[test]
fn streams_made_with_one_replica_are_raised_to_three() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let dir = tempfile::Builder::new().prefix("livegate-replicas-").tempdir().expect("tempdir");
    let nats = NatsCluster::start_in(dir.path());
    let rt = runtime();
    let day = Duration::from_secs(86_400);
    let limits = |replicas| StreamLimits {
        history_size: 1000,
        nonce_ttl: day,
        session_ttl: day,
        replicas: Some(replicas),
    };
    let replicas_now = |probe: &livegate::cluster::Cluster| -> Vec<(&str, Result<usize, String>)> {
        STREAMS
            .iter()
            .map(|&s| (s, rt.block_on(stream_state(probe, s)).map(|(n, _, _)| n.max(1))))
            .collect()
    };
    let mut failures = Vec::new();
    let one = rt
        .block_on(livegate::cluster::Cluster::connect_with(&nats.urls(), "old", limits(1)))
        .unwrap_or_else(|e| panic!("connect with R1: {e}"));
    for (stream, got) in replicas_now(&one) {
        if got != Ok(1) {
            failures.push(format!("{stream} made with cluster_replicas 1: {got:?}"));
        }
    }
    let three = rt
        .block_on(livegate::cluster::Cluster::connect_with(&nats.urls(), "new", limits(3)))
        .unwrap_or_else(|e| panic!("connect with R3: {e}"));
    for (stream, got) in replicas_now(&three) {
        if got != Ok(3) {
            failures.push(format!(
                "{stream} after a node with cluster_replicas 3: {got:?}, expected raised to 3"
            ));
        }
    }
    let again = rt
        .block_on(livegate::cluster::Cluster::connect_with(&nats.urls(), "old-again", limits(1)))
        .unwrap_or_else(|e| panic!("connect with R1 again: {e}"));
    for (stream, got) in replicas_now(&again) {
        if got != Ok(3) {
            failures.push(format!(
                "{stream} after a node with cluster_replicas 1 again: {got:?}, expected left at 3"
            ));
        }
    }
    eprintln!("R1 streams raised to R3: test took {:.1} s", started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{}\nNATS logs:\n{}", failures.join("\n"), nats.logs());
}

/// The server's ping interval in the tests below (`--heartbeat-secs`), so that a client
/// tells a dead connection in seconds.
const PING_SECS: &str = "1";
/// A connection silent this long is given up: 2.5 ping intervals, as livegate.js does.
const SILENCE_LIMIT: Duration = Duration::from_millis(2500);
/// How long a publisher or a client waits for an answer before it tries another node.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);
/// How long node a is cut off, or its links degraded.
const TROUBLE_FOR: Duration = Duration::from_secs(10);

/// The flags of the nodes below: short drains and a ping every [`PING_SECS`].
fn chaos_flags() -> Vec<&'static str> {
    let mut flags = SHORT_DRAIN.to_vec();
    flags.extend(["--heartbeat-secs", PING_SECS]);
    flags
}

/// Three nodes on three replicated nats-servers, node a behind two links: its NATS seeds
/// are `nats`'s proxies in front of the servers (which advertise no other address), and
/// the load reaches it through `clients`.
fn cluster_with_a_behind(nats: &Link, clients: &Link) -> (Cluster<NatsCluster>, Reach) {
    let cluster =
        Cluster::start_replicated_with(3, &chaos_flags(), &["--no_advertise"], |i, servers| {
            (i == 0).then(|| nats.proxy_urls(&servers.urls()))
        });
    let mut reach = Reach::direct(&cluster);
    reach.addrs[0] = clients.proxy(cluster.addr(0));
    reach.answer_within = ANSWER_WITHIN;
    reach.silence_limit = Some(SILENCE_LIMIT);
    (cluster, reach)
}

/// How long after `since` every client was receiving again, as printed; a failure when
/// some client never was.
fn every_client_back(
    outcome: &LoadOutcome,
    since: Instant,
    until: Instant,
    what: &str,
    failures: &mut Vec<String>,
) -> (Option<Duration>, String) {
    match outcome.every_client_back(since, until) {
        Ok(back) => (Some(back), format!("{:.1} s", back.as_secs_f64())),
        Err(never) => {
            failures.push(format!("clients {never:?} received nothing after {what}"));
            (None, format!("never for clients {never:?}"))
        }
    }
}

/// What every test below prints: published, acknowledged, delivered, and how long it was
/// until every client was receiving again (`back`).
fn figures(outcome: &LoadOutcome, back: &str) -> String {
    format!(
        "{} published, {} acknowledged, {} delivered to {} subscribers, every client back after {back}",
        outcome.published.published,
        outcome.published.acks.len(),
        outcome.delivered(),
        outcome.clients.len()
    )
}

/// `trouble` on node a's link to NATS (and, when `clients_too`, on its link to its
/// clients) for [`TROUBLE_FOR`] under load, then healed: nothing acknowledged is lost or
/// repeated, every node publishes again, and when a's clients were cut off too, every one
/// of them has moved to another node by itself.
fn node_a_in_trouble(name: &str, trouble: Condition, clients_too: bool) {
    let started = Instant::now();
    let (nats_link, clients_link) = (Link::start(), Link::start());
    let (cluster, reach) = cluster_with_a_behind(&nats_link, &clients_link);
    let troubled: Vec<&Link> =
        if clients_too { vec![&nats_link, &clients_link] } else { vec![&nats_link] };
    let formed = started.elapsed();
    let rt = runtime();
    let mut failures = Vec::new();
    let load = Load::start_everywhere_via(
        &rt,
        &cluster,
        &reach,
        "chaos",
        3,
        18,
        Duration::from_millis(30),
    );
    common::pace(Duration::from_millis(1500), "load on every node before the trouble");

    let trouble_at = Instant::now();
    troubled.iter().for_each(|link| link.set(trouble));
    common::pace(TROUBLE_FOR, "node a's trouble lasts 10 s under load");
    troubled.iter().for_each(|link| link.set(Condition::Up));
    let healed_at = Instant::now();
    // Through the link: a publishes again by itself, and so do the others.
    let a = Http::with_timeout(reach.addrs[0], ANSWER_WITHIN);
    if !wait_until(BACK_LIMIT, || {
        matches!(
            a.try_request(
                "POST",
                "/v1/rooms/chaos:probe-a/events",
                Auth::Key,
                Body::Json(json!({"data": 1}))
            ),
            Ok((200 | 201, _))
        )
    }) {
        failures
            .push(format!("node a did not publish through the healed link within {BACK_LIMIT:?}"));
    }
    let a_back = healed_at.elapsed();
    every_node_publishes(&cluster, healed_at, &mut failures);
    common::pace(Duration::from_secs(2), "load on every node after the heal");

    let outcome = load.finish(&rt, &cluster.http(1));
    outcome.check(&mut failures);
    let mut endings: BTreeMap<String, usize> = BTreeMap::new();
    for c in &outcome.clients {
        for (node, ending) in &c.endings {
            let kind = match ending {
                Ending::Close(code, _) => format!("close {code:?}"),
                Ending::Abnormal(_) => "abnormal".into(),
                Ending::Silent(_) => "silent".into(),
            };
            *endings.entry(format!("{} {kind}", Cluster::name(*node))).or_default() += 1;
        }
        if clients_too
            && trouble == Condition::Cut
            && c.home == 0
            && !c.nodes.iter().any(|&n| n != 0)
        {
            failures
                .push(format!("client {} of a never moved to another node: {:?}", c.id, c.endings));
        }
    }
    // A client the trouble cannot move (its link is fine) is back after the heal at best.
    let (since, what) = if clients_too {
        (trouble_at, "the start of the trouble")
    } else {
        (healed_at, "the heal")
    };
    let (_, back) = every_client_back(&outcome, since, Instant::now(), what, &mut failures);
    let figures = figures(&outcome, &format!("{back} (counted from {what})"));
    eprintln!(
        "chaos, {name}: {figures}; a publishing through the link {:.1} s after the heal; endings {endings:?}; {}; \
         cluster formed in {:.1} s; test took {:.1} s",
        a_back.as_secs_f64(),
        outcome.summary(),
        formed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, &format!("chaos: {name}"), &failures, &LOG_NEEDLES);
}

#[test]
fn node_cut_off_from_nats_and_its_clients_for_10_s_loses_and_repeats_nothing_acknowledged() {
    let _gate = crate::common::gate!();
    node_a_in_trouble("node a cut off from NATS and its clients for 10 s", Condition::Cut, true);
}

/// The split the cut above does not make: a's clients still reach it, but a reaches no
/// NATS server. Its publishes are refused (never acknowledged unstored), its clients stay
/// and get what they missed once the link is back.
#[test]
fn node_cut_off_from_nats_only_for_10_s_loses_and_repeats_nothing_acknowledged() {
    let _gate = crate::common::gate!();
    node_a_in_trouble("node a cut off from NATS only for 10 s", Condition::Cut, false);
}

#[test]
fn node_with_200_ms_more_latency_and_2_percent_loss_loses_and_repeats_nothing_acknowledged() {
    let _gate = crate::common::gate!();
    let degraded = Condition::Degraded { one_way: Duration::from_millis(200), loss: 0.02 };
    node_a_in_trouble(
        "node a with 200 ms more latency each way and 2 % loss for 10 s",
        degraded,
        true,
    );
}

#[test]
fn rolling_restart_on_replicated_nats_loses_and_repeats_nothing_acknowledged() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut cluster = Cluster::start_replicated(3, &chaos_flags());
    let formed = started.elapsed();
    let rt = runtime();
    let mut failures = Vec::new();
    let mut reach = Reach::direct(&cluster);
    reach.answer_within = ANSWER_WITHIN;
    reach.silence_limit = Some(SILENCE_LIMIT);
    let load = Load::start_everywhere_via(
        &rt,
        &cluster,
        &reach,
        "chaos",
        3,
        18,
        Duration::from_millis(30),
    );
    common::pace(Duration::from_secs(1), "load on every node before the restarts");
    // (node, SIGTERM sent, exited, ready again)
    let mut steps = Vec::new();
    for i in 0..cluster.len() {
        // A balancer stops sending to a node told to stop.
        load.node_down(i);
        let signal_at = Instant::now();
        let exited = cluster.drain_node(i, &mut failures);
        cluster.start_node(i);
        load.node_up(i, cluster.addr(i));
        cluster.wait_peers(common::nats::PEERS_LIMIT);
        steps.push((i, signal_at, exited, Instant::now()));
        common::pace(Duration::from_secs(1), "load on every node between restarts");
    }
    let outcome = load.finish(&rt, &cluster.http(0));
    outcome.check(&mut failures);
    for c in &outcome.clients {
        for (node, ending) in &c.endings {
            if !matches!(ending, Ending::Close(Some(1012), _)) {
                failures.push(format!(
                    "client {} on {}: ending {ending:?}, expected a 1012 close",
                    c.id,
                    Cluster::name(*node)
                ));
            }
        }
    }
    let ends: Vec<Instant> = steps.iter().skip(1).map(|s| s.1).chain([Instant::now()]).collect();
    let mut longest = Some(Duration::ZERO);
    let per_step: Vec<String> = steps
        .iter()
        .zip(&ends)
        .map(|(&(i, signal_at, exited, ready), &until)| {
            let what = format!("{}'s SIGTERM", Cluster::name(i));
            let (took, back) = every_client_back(&outcome, signal_at, until, &what, &mut failures);
            longest = longest.zip(took).map(|(a, b)| a.max(b));
            format!(
                "{}: exited {:.1} s after SIGTERM, ready {:.1} s after, every client back after {back}",
                Cluster::name(i),
                (exited - signal_at).as_secs_f64(),
                (ready - signal_at).as_secs_f64()
            )
        })
        .collect();
    let longest = longest
        .map_or("never".to_string(), |d| format!("{:.1} s at most per restart", d.as_secs_f64()));
    let figures = figures(&outcome, &longest);
    eprintln!(
        "chaos, rolling restart of a, b, c on three replicated nats-servers: {figures}; {}; {}; cluster formed in {:.1} s; test took {:.1} s",
        per_step.join("; "),
        outcome.summary(),
        formed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "chaos: rolling restart", &failures, &LOG_NEEDLES);
}
