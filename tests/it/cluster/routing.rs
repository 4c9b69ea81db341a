//! `/v1/route` and the peers' view of a node: drains announced at once, killed and
//! draining nodes no longer named.

use super::*;

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
    let flags = [
        "--cluster-heartbeat-ms",
        "10000",
        "--probe-up-after",
        "1",
        "--drain-wait-secs",
        "5",
        "--drain-spread-secs",
        "1",
        "--drain-grace-secs",
        "5",
    ];
    let cluster = Cluster::start(2, &flags);
    let phase_of_a_on_b = || {
        let (status, body) =
            cluster.http(1).request("GET", "/v1/admin/overview", Auth::Key, Body::None);
        assert_eq!(status, 200, "overview on b: {body}");
        let nodes = body["nodes"].as_array().cloned().unwrap_or_default();
        nodes
            .iter()
            .find(|n| n["node"] == "a")
            .map(|n| n["phase"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(phase_of_a_on_b().as_deref(), Some("ready"), "b hears a before the drain");
    let term = Instant::now();
    cluster.node(0).signal("TERM");
    let seen =
        wait_until(Duration::from_secs(1), || phase_of_a_on_b().as_deref() == Some("draining"));
    assert!(
        seen,
        "1 s after a's SIGTERM b still shows a as {:?} (the heartbeat period is 10 s)",
        phase_of_a_on_b()
    );
    eprintln!("b showed a as draining {:?} after a's SIGTERM", term.elapsed());
}

/// A node says it is ready only once its peers route to it (issue 48): the moment a
/// third node's `/readyz` first answers 200, both older nodes already show it `ready` in
/// their overview, a routing candidate. Before, a new node turned ready as soon as its
/// start-up was done, while its peers still counted its heartbeats (`probe_up_after`, 3,
/// of a 2 s period here), so a balancer that added it then, and a release that drained
/// the next node soon after, sent clients to nodes that did not route to it.
#[test]
fn a_new_node_is_ready_only_once_every_peer_routes_to_it() {
    let _gate = crate::common::gate!();
    let mut cluster = Cluster::start(2, &["--cluster-heartbeat-ms", "2000"]);
    let started = Instant::now();
    // Returns at the first 200 of c's /readyz (polled every few ms).
    let c = cluster.add_node();
    let ready_after = started.elapsed();
    let phase_of_c_on = |on: usize| {
        let (status, body) =
            cluster.http(on).request("GET", "/v1/admin/overview", Auth::Key, Body::None);
        assert_eq!(status, 200, "overview on {}: {body}", Cluster::name(on));
        let nodes = body["nodes"].as_array().cloned().unwrap_or_default();
        nodes
            .iter()
            .find(|n| n["node"] == Cluster::name(c))
            .map(|n| n["phase"].as_str().unwrap_or("").to_string())
    };
    let seen: Vec<Option<String>> = [0, 1].iter().map(|&on| phase_of_c_on(on)).collect();
    assert_eq!(
        seen,
        vec![Some("ready".to_string()); 2],
        "a and b's view of c when c first said ready ({ready_after:?} after its start)"
    );
    eprintln!("c ready {ready_after:?} after its start, and a and b route to it");
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
fn route_stays_without(
    cluster: &Cluster,
    nodes: &[usize],
    queries: &[String],
    gone: &str,
    during: Duration,
) -> Vec<String> {
    let mut bad = Vec::new();
    common::let_time_pass_checking(
        during,
        Duration::from_millis(50),
        "a node that left stays unrouted",
        || {
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
        },
    );
    bad
}

#[test]
fn route_stops_naming_a_killed_node_and_a_draining_node() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    // b's drain waits 3 s before closing anything, so it answers while draining.
    let mut cluster = Cluster::start(
        3,
        &["--drain-wait-secs", "3", "--drain-spread-secs", "0", "--drain-grace-secs", "2"],
    );
    let rt = runtime();
    let mut failures = Vec::new();
    // A session recorded on each node.
    let sessions: Vec<String> = (0..3)
        .map(|i| {
            let ws = rt.block_on(WsClient::connect(
                cluster.addr(i),
                &cluster.http(i).mint_token(&format!("route-u{i}"), "web"),
                None,
            ));
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
                (0..3).all(|s| {
                    route(&cluster.http(i), &format!("session={}", sessions[s])).as_deref()
                        == Ok(Cluster::name(s))
                }) && route(&cluster.http(i), &user_q) == user_node
            })
    });
    if !ok {
        let answers: Vec<String> = (0..3)
            .flat_map(|i| {
                let mut qs: Vec<String> = sessions.iter().map(|s| format!("session={s}")).collect();
                qs.push(user_q.clone());
                let http = cluster.http(i);
                qs.into_iter()
                    .map(move |q| format!("{} {q}: {:?}", Cluster::name(i), route(&http, &q)))
                    .collect::<Vec<_>>()
            })
            .collect();
        failures.push(format!("before: sessions should route to their owners and a user to one node on every node; answers {answers:?}"));
    }

    // kill -9 a: b and c stop naming it once its heartbeats are missed (3 periods of 1 s).
    let queries = vec![user_q.clone(), format!("session={}", sessions[0])];
    let killed_at = Instant::now();
    cluster.take_node(0).kill9();
    let after_kill =
        match wait_route_without(&cluster, &[1, 2], &queries, "a", Duration::from_secs(10)) {
            Ok(took) => {
                failures.extend(route_stays_without(
                    &cluster,
                    &[1, 2],
                    &queries,
                    "a",
                    Duration::from_secs(1),
                ));
                if took > Duration::from_secs(6) {
                    failures.push(format!(
                    "a left the route answers {took:?} after kill -9 (heartbeat timeout is ~3 s)"
                ));
                }
                Some(took)
            }
            Err(last) => {
                failures.push(format!(
                    "10 s after kill -9 of a, routes still name it (or fail): {last:?}"
                ));
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
        Err(last) => {
            failures.push(format!("draining b still names itself 1 s after SIGTERM: {last:?}"))
        }
    }
    match &peer {
        Ok(_) => failures.extend(route_stays_without(
            &cluster,
            &[2],
            &queries,
            "b",
            Duration::from_millis(500),
        )),
        Err(last) => {
            failures.push(format!("c still names draining b 3 s after its SIGTERM: {last:?}"))
        }
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
