//! Chaos with real processes (issue 33): a replicated NATS as users deploy it (three
//! current nats-servers in one JetStream cluster, `common::nats::NatsCluster`, every
//! stream and bucket with three replicas) under three livegate nodes, with subscribers
//! and publishers on every node, while nats-servers are killed with SIGKILL. Publishers
//! retry with the same id after a refusal or no answer, as the README tells users to;
//! every acknowledged publish must reach every subscriber once, in order, nothing
//! missing (`load::LoadOutcome::check`).

use super::load::Load;
use super::*;
use common::nats::NatsCluster;

/// The streams and buckets livegate creates (webhooks off: no occupancy bucket).
const STREAMS: [&str; 5] = ["LG_ROOMS", "LG_STATE", "KV_lg_sessions", "KV_lg_nonces", "KV_lg_meta"];
/// How long the cluster may take to publish again on every node after a kill.
const BACK_LIMIT: Duration = Duration::from_secs(20);

/// `stream`'s replicas and the NATS server leading it, as JetStream reports them now.
async fn stream_state(probe: &livegate::cluster::Cluster, stream: &str) -> Result<(usize, Option<String>, Vec<(String, bool)>), String> {
    let found = tokio::time::timeout(Duration::from_secs(3), probe.js.get_stream(stream)).await;
    let stream = match found {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(format!("stream info of {stream}: {e}")),
        Err(_) => return Err(format!("stream info of {stream}: no answer within 3 s")),
    };
    let info = stream.cached_info();
    let cluster = info.cluster.as_ref();
    let peers = cluster.map(|c| c.replicas.iter().map(|p| (p.name.clone(), p.current && !p.offline)).collect()).unwrap_or_default();
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
fn every_node_publishes<N: Nats>(cluster: &Cluster<N>, since: Instant, failures: &mut Vec<String>) -> Duration {
    for i in 0..cluster.len() {
        let http = cluster.http(i);
        let path = format!("/v1/rooms/chaos:probe-{i}/events");
        let ok = wait_until(BACK_LIMIT, || {
            matches!(http.try_request("POST", &path, Auth::Key, Body::Json(json!({"data": 1}))), Ok((200 | 201, _)))
        });
        if !ok {
            failures.push(format!("node {} did not publish within {BACK_LIMIT:?} of the kill", Cluster::name(i)));
        }
    }
    since.elapsed()
}

#[test]
fn killing_the_room_streams_leading_nats_server_then_another_loses_and_repeats_nothing_acknowledged() {
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
            failures.push(format!("client {} on {}: its connection ended although only NATS servers died: {:?}", c.id, Cluster::name(c.home), c.endings));
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
        eprintln!("NATS logs:\n{}", cluster.nats.logs().lines().filter(|l| l.contains("[WRN]") || l.contains("[ERR]")).take(60).collect::<Vec<_>>().join("\n"));
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
    let limits = |replicas| StreamLimits { history_size: 1000, nonce_ttl: day, session_ttl: day, replicas: Some(replicas) };
    let replicas_now = |probe: &livegate::cluster::Cluster| -> Vec<(&str, Result<usize, String>)> {
        STREAMS.iter().map(|&s| (s, rt.block_on(stream_state(probe, s)).map(|(n, _, _)| n.max(1)))).collect()
    };
    let mut failures = Vec::new();
    let one = rt.block_on(livegate::cluster::Cluster::connect_with(&nats.urls(), "old", limits(1))).unwrap_or_else(|e| panic!("connect with R1: {e}"));
    for (stream, got) in replicas_now(&one) {
        if got != Ok(1) {
            failures.push(format!("{stream} made with cluster_replicas 1: {got:?}"));
        }
    }
    let three = rt.block_on(livegate::cluster::Cluster::connect_with(&nats.urls(), "new", limits(3))).unwrap_or_else(|e| panic!("connect with R3: {e}"));
    for (stream, got) in replicas_now(&three) {
        if got != Ok(3) {
            failures.push(format!("{stream} after a node with cluster_replicas 3: {got:?}, expected raised to 3"));
        }
    }
    let again = rt.block_on(livegate::cluster::Cluster::connect_with(&nats.urls(), "old-again", limits(1))).unwrap_or_else(|e| panic!("connect with R1 again: {e}"));
    for (stream, got) in replicas_now(&again) {
        if got != Ok(3) {
            failures.push(format!("{stream} after a node with cluster_replicas 1 again: {got:?}, expected left at 3"));
        }
    }
    eprintln!("R1 streams raised to R3: test took {:.1} s", started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{}\nNATS logs:\n{}", failures.join("\n"), nats.logs());
}
