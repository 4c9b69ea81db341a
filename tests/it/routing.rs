//! `GET /v1/route` over a real liveness table (routing and the liveness
//! table, docs/src/cluster.md; issue 3): the node itself is always a candidate; a peer is marked down after one failed
//! probe and up only after `probe_up_after` successful probes in a row.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn route(http: &Http, query: &str) -> (u16, Value) {
    http.request("GET", &format!("/v1/route?{query}"), Auth::Key, Body::None)
}

/// A session id whose placement among node-a and node-b is node-a: in peers mode a
/// session's node is the rendezvous choice of its id, so this one routes to node-a while
/// node-a is up, and to the only other node while it is down.
fn session_placed_on_node_a() -> String {
    (0..)
        .map(|i| format!("s{i}"))
        .find(|s| {
            livegate::core::nodes::routing::rendezvous(s, ["node-a", "node-b"]) == Some("node-a")
        })
        .expect("some id lands on node-a")
}

/// The node `/v1/route?session=<placed on node-a>` answers (asserting 200).
fn routed_node(http: &Http) -> String {
    let (status, body) = route(http, &format!("session={}", session_placed_on_node_a()));
    assert_eq!(status, 200, "route: {body}");
    body["node"].as_str().unwrap_or_else(|| panic!("no node in {body}")).to_string()
}

/// An address nothing listens on.
fn dead_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

#[test]
fn route_without_peers_answers_the_node_itself() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.node = "solo".into());
    let http = server.http();
    for query in ["user=u1", "session=nosuch", "session=nosuch&user=u1"] {
        let (status, body) = route(&http, query);
        assert_eq!(status, 200, "{query}: {body}");
        assert_eq!(body["node"], "solo", "{query}: {body}");
        let url = body["url"].as_str().unwrap_or_else(|| panic!("{query}: no url in {body}"));
        assert!(
            url.contains(&format!(":{}", server.addr.port())),
            "{query}: url {url} must carry port {}",
            server.addr.port()
        );
    }
    let (status, body) = route(&http, "");
    assert_eq!(status, 400, "neither session nor user: {body}");
    let (status, body) = http.request("GET", "/v1/route?user=u1", Auth::None, Body::None);
    assert_eq!(status, 401, "the API key is required to ask by user: {body}");
    let (status, body) = http.request("GET", "/v1/route?session=nosuch", Auth::None, Body::None);
    assert_eq!(
        (status, body["node"].as_str()),
        (200, Some("solo")),
        "a client may ask for its session without the key: {body}"
    );
}

#[test]
fn route_with_every_peer_down_still_answers_self() {
    let _gate = crate::common::gate!();
    let (d1, d2) = (dead_addr(), dead_addr());
    let server = TestServer::start(|c| {
        c.node = "node-z".into();
        c.peers = vec![format!("node-a=http://{d1}"), format!("node-0@other=http://{d2}")];
        c.probe_interval_ms = 50;
        c.probe_up_after = 1;
    });
    let http = server.http();
    common::let_time_pass_checking(
        Duration::from_millis(600),
        Duration::from_millis(50),
        "probes of dead peers",
        || {
            let (status, body) = route(&http, "user=u1");
            assert_eq!(status, 200, "self is always a candidate: {body}");
            assert_eq!(body["node"], "node-z", "{body}");
            assert!(
                body["url"]
                    .as_str()
                    .is_some_and(|u| u.contains(&format!(":{}", server.addr.port()))),
                "{body}"
            );
        },
    );
}

#[test]
fn peer_goes_down_after_one_failed_probe_and_comes_back_after_several() {
    let _gate = crate::common::gate!();
    const INTERVAL: Duration = Duration::from_millis(100);
    let peer_tweak = |c: &mut livegate::config::Config| c.node = "node-a".into();
    let p = TestServer::start(peer_tweak);
    let p_addr = p.addr;
    let a = TestServer::start(|c| {
        c.node = "node-b".into();
        c.peers = vec![format!("node-a=http://{p_addr}")];
        c.probe_interval_ms = 100;
        c.probe_up_after = 3;
    });
    let http = a.http();

    // P comes up: the session is placed on node-a, so node-a is the answer once up.
    let up = common::wait_until_every(Duration::from_secs(5), Duration::from_millis(20), || {
        let (status, body) = route(&http, &format!("session={}", session_placed_on_node_a()));
        assert_eq!(status, 200, "{body}");
        if body["node"] == "node-a" {
            assert_eq!(
                body["url"],
                format!("http://{p_addr}"),
                "the peer's configured URL: {body}"
            );
            return true;
        }
        assert_eq!(body["node"], "node-b", "{body}");
        false
    });
    assert!(up, "route never answered node-a within 5 s");

    // Down fast: one failed probe.
    let dir = p.stop();
    let stopped = Instant::now();
    let down = common::wait_until(Duration::from_secs(1), || routed_node(&http) == "node-b");
    assert!(
        down && stopped.elapsed() <= Duration::from_secs(1),
        "peer still routed to 1 s after it stopped"
    );
    let down_after = stopped.elapsed();
    // And it stays down while P is away.
    common::let_time_pass_checking(
        3 * INTERVAL,
        Duration::from_millis(20),
        "three probe intervals with P away",
        || {
            assert_eq!(routed_node(&http), "node-b", "a stopped peer must stay down");
        },
    );

    // Up carefully: P is back on the same port; the answer stays node-b for at least one
    // probe interval after P's /healthz answers, then becomes node-a within 3 s.
    let restarter = std::thread::spawn(move || TestServer::start_at(p_addr, dir, peer_tweak));
    let p_http = Http::new(p_addr);
    let restart_began = Instant::now();
    let mut health_at: Option<Instant> = None;
    let flipped_at =
        common::wait_for_every(Duration::from_secs(30), Duration::from_millis(5), || {
            if health_at.is_none()
                && matches!(
                    p_http.try_request("GET", "/healthz", Auth::None, Body::None),
                    Ok((200, _))
                )
            {
                health_at = Some(Instant::now());
            }
            let node = routed_node(&http);
            if node == "node-a" {
                let now = Instant::now();
                assert!(health_at.is_some(), "route answered node-a before P's /healthz answered");
                return Some(now);
            }
            assert_eq!(node, "node-b");
            if let Some(h) = health_at {
                assert!(
                    h.elapsed() <= Duration::from_secs(3),
                    "peer not routed to 3 s after its /healthz answered"
                );
            }
            assert!(
                restart_began.elapsed() <= Duration::from_secs(20),
                "P did not come back within 20 s"
            );
            None
        })
        .expect("P came back");
    let healthy_at = health_at.expect("health seen");
    let up_after = flipped_at.duration_since(healthy_at);
    eprintln!("down after {down_after:?}; up {up_after:?} after P's /healthz first answered");
    assert!(
        up_after >= INTERVAL,
        "with probe_up_after = 3 and 100 ms probes the peer must stay down for at least one interval after it \
         answers again; it was routed to {up_after:?} after its /healthz answered"
    );
    let p2 = restarter.join().expect("restart thread");
    drop(p2);
}

/// Peers mode (issue 30): two nodes that list each other, no shared directory. A session
/// made on node-a is placed on node-a (its id is drawn until the rendezvous choice is
/// node-a), so a reconnect through node-b is sent there: a WebSocket is accepted and
/// closed with 4421 naming node-a and its URL, SSE gets 421 with the same, and neither
/// spends the token, which then opens the session on node-a. Before, node-b answered with
/// a new session of its own, and the two nodes disagreed about where the session lived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_send_a_reconnect_to_the_node_that_made_its_session() {
    let _gate = crate::common::gate!();
    let b_addr = dead_addr();
    let a = TestServer::start(|c| {
        c.node = "node-a".into();
        c.peers = vec![format!("node-b=http://{b_addr}")];
        c.probe_interval_ms = 50;
        c.probe_up_after = 1;
    });
    let a_addr = a.addr;
    let b = TestServer::start_at(b_addr, tempfile::tempdir().expect("tempdir"), |c| {
        c.node = "node-b".into();
        c.peers = vec![format!("node-a=http://{a_addr}")];
        c.probe_interval_ms = 50;
        c.probe_up_after = 1;
    });
    let up = |http: &Http, peer: &str| {
        http.metric(&format!("livegate_peer_up{{peer=\"{peer}\"}}")) == Some(1.0)
    };
    assert!(
        wait_until(Duration::from_secs(5), || up(&a.http(), "node-b") && up(&b.http(), "node-a")),
        "peers never up"
    );

    let first = WsClient::connect(a.addr, &a.mint_token("u1", "web"), None).await;
    let session = first.session().to_string();
    first.close().await;
    // Both nodes answer node-a for it, without an API key.
    for node in [&a, &b] {
        let (status, body) = node.http().request(
            "GET",
            &format!("/v1/route?session={session}"),
            Auth::None,
            Body::None,
        );
        assert_eq!((status, body["node"].as_str()), (200, Some("node-a")), "{body}");
    }

    let token = b.mint_token("u1", "web");
    match WsClient::try_connect_with_headers(b.addr, Some(&token), Some(&session)).await {
        Err(r) => {
            assert_eq!(
                (r.status, r.header("close-code")),
                (421, Some("4421")),
                "{} {:?}",
                r.body,
                r.headers
            );
            assert_eq!(r.body["error"]["code"], "wrong_node", "{}", r.body);
            assert_eq!(r.body["error"]["node"], "node-a", "{}", r.body);
            assert_eq!(r.body["error"]["url"], format!("http://{a_addr}"), "{}", r.body);
            assert_eq!(
                r.header("close-reason"),
                Some(format!("http://{a_addr}").as_str()),
                "the close reason is the URL"
            );
        }
        Ok(c) => panic!("node-b accepted node-a's session: {}", c.welcome),
    }
    let (status, body) = b.http().request(
        "GET",
        &format!("/v1/sse?token={token}&session={session}"),
        Auth::None,
        Body::None,
    );
    assert_eq!(
        (status, body["error"]["code"].as_str(), body["error"]["node"].as_str()),
        (421, Some("wrong_node"), Some("node-a")),
        "{body}"
    );
    assert_eq!(
        b.http().metric("livegate_handshakes_redirected_total"),
        Some(2.0),
        "{}",
        b.http().metrics_text()
    );
    // In peers mode each node signs its own tokens: the client opens the session on
    // node-a with a token of node-a's.
    let there = WsClient::connect(a.addr, &a.mint_token("u1", "web"), Some(&session)).await;
    assert_eq!(
        (there.session(), there.welcome["node"].as_str()),
        (session.as_str(), Some("node-a")),
        "{}",
        there.welcome
    );
    there.close().await;
    // node-b's token was not spent by its two refusals: with node-a gone, it opens on b.
    let a_dir = tokio::task::spawn_blocking(move || a.stop()).await.unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || !up(&b.http(), "node-a")),
        "node-a still up on b"
    );
    let on_b = WsClient::try_connect(b.addr, Some(&token), Some(&session)).await;
    let on_b = on_b.unwrap_or_else(|r| {
        panic!(
            "the token refused twice with wrong_node, once node-a is gone: {} {}",
            r.status, r.body
        )
    });
    assert_eq!(on_b.welcome["node"], "node-b", "{}", on_b.welcome);
    drop(a_dir);
}

/// Peers mode (issue 48, seed `000`: a draining node leaves the candidates, in peers mode
/// too). Three `livegate serve` processes list each other (probed every 100 ms); node-c
/// gets SIGTERM with a 6 s drain wait. While node-c still answers `/healthz` (draining,
/// not down), every node's `/v1/route` sends none of 200 session ids to it (a third of
/// them are node-c's by placement), a handshake through node-a for a session of node-c
/// lands on another node, and one on node-c is refused with 503; node-c's own
/// connections keep answering until its wait is over, then get 1012, and it exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_peer_leaves_the_route_of_every_peers_mode_node_and_keeps_its_own_connections_until_drained(
) {
    let _gate = crate::common::gate!();
    const WAIT: Duration = Duration::from_secs(6);
    let root = tempfile::tempdir().expect("tempdir");
    let names = ["node-a", "node-b", "node-c"];
    let addrs: Vec<SocketAddr> = names.iter().map(|_| dead_addr()).collect();
    let wait_secs = WAIT.as_secs().to_string();
    let mut nodes: Vec<common::process::ServeProcess> = (0..3)
        .map(|i| {
            let peers: Vec<String> = (0..3)
                .filter(|&j| j != i)
                .map(|j| format!("{}=http://{}", names[j], addrs[j]))
                .collect();
            let peers = peers.join(",");
            let flags = [
                "--peers",
                &peers,
                "--probe-interval-ms",
                "100",
                "--probe-up-after",
                "1",
                "--drain-wait-secs",
                &wait_secs,
                "--drain-spread-secs",
                "1",
                "--drain-grace-secs",
                "5",
            ];
            let data = root.path().join(names[i]);
            common::process::ServeProcess::start_named_at(
                &data,
                &root.path().join(format!("{}.log", names[i])),
                names[i],
                addrs[i],
                &flags,
            )
        })
        .collect();
    let https: Vec<Http> = addrs.iter().map(|&addr| Http::new(addr)).collect();
    let up = |http: &Http, peer: &str| {
        http.metric(&format!("livegate_peer_up{{peer=\"{peer}\"}}")) == Some(1.0)
    };
    let formed = wait_until(Duration::from_secs(10), || {
        (0..3).all(|i| (0..3).filter(|&j| j != i).all(|j| up(&https[i], names[j])))
    });
    assert!(formed, "the three nodes never counted each other up");

    let ids: Vec<String> = (0..200).map(|i| format!("drain-{i}")).collect();
    let placed_on_c: Vec<&String> = ids
        .iter()
        .filter(|id| livegate::core::nodes::routing::rendezvous(id, names) == Some("node-c"))
        .collect();
    assert!(placed_on_c.len() > 30, "node-c's share of the ids: {}", placed_on_c.len());
    let routed = |http: &Http, id: &str| {
        let (status, body) = route(http, &format!("session={id}"));
        assert_eq!(status, 200, "route {id}: {body}");
        body["node"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(
        routed(&https[0], placed_on_c[0]),
        "node-c",
        "before the drain node-c takes its share"
    );

    let mut own = Vec::new();
    for user in ["c1", "c2", "c3"] {
        let ws = WsClient::connect(addrs[2], &https[2].mint_token(user, "web"), None).await;
        assert_eq!(ws.welcome["node"], "node-c", "{}", ws.welcome);
        own.push(ws);
    }
    let c1_session = own[0].session().to_string();

    nodes[2].signal("TERM");
    let termed = Instant::now();
    let left = wait_until_every(Duration::from_secs(2), Duration::from_millis(20), || {
        (0..3).all(|i| routed(&https[i], placed_on_c[0]) != "node-c")
    });
    assert!(left, "node-c still routed to 2 s after its SIGTERM");
    let left_after = termed.elapsed();
    let mut to_c = Vec::new();
    let mut spread: HashMap<String, usize> = HashMap::new();
    for id in &ids {
        for (i, http) in https.iter().enumerate() {
            let node = routed(http, id);
            if node == "node-c" {
                to_c.push(format!("{id} via {}", names[i]));
            }
            *spread.entry(node).or_default() += 1;
        }
    }
    assert!(to_c.is_empty(), "routed to the draining node-c: {to_c:?}");
    // Draining, not down: node-c still answers its probes.
    let (status, health) = https[2].request("GET", "/healthz", Auth::None, Body::None);
    assert_eq!((status, health["draining"].as_bool()), (200, Some(true)), "{health}");

    // A new handshake for node-c's session through node-a lands where the route says.
    let through_a = WsClient::try_connect_with_headers(
        addrs[0],
        Some(&https[0].mint_token("c1", "web")),
        Some(&c1_session),
    )
    .await;
    let landed = match through_a {
        Ok(ws) => ws,
        Err(r) => {
            assert_eq!(r.status, 421, "{} {:?}", r.body, r.headers);
            let node = r.body["error"]["node"].as_str().unwrap_or_default().to_string();
            assert_ne!(node, "node-c", "sent to the draining node: {}", r.body);
            let i = names
                .iter()
                .position(|n| *n == node)
                .unwrap_or_else(|| panic!("unknown node in {}", r.body));
            WsClient::connect(addrs[i], &https[i].mint_token("c1", "web"), Some(&c1_session)).await
        }
    };
    assert_ne!(landed.welcome["node"], "node-c", "{}", landed.welcome);
    let fresh = WsClient::connect(addrs[1], &https[1].mint_token("new", "web"), None).await;
    assert_eq!(fresh.welcome["node"], "node-b", "{}", fresh.welcome);
    match WsClient::try_connect(addrs[2], Some(&https[2].mint_token("late", "web")), None).await {
        Err(r) => assert_eq!((r.status, error_code(&r.body)), (503, "unavailable"), "{}", r.body),
        Ok(ws) => panic!("the draining node-c admitted a handshake: {}", ws.welcome),
    }
    // node-c's own connections are served until its wait is over.
    for ws in &mut own {
        ws.assert_alive().await;
    }
    let checked_after = termed.elapsed();
    assert!(checked_after < WAIT, "the checks ran {checked_after:?} after the SIGTERM, past the {WAIT:?} drain wait: test machine too slow");
    for ws in &mut own {
        let code = ws.close_code_within(WAIT + Duration::from_secs(5)).await;
        assert_eq!(code, Some(1012), "node-c's client after its drain");
    }
    assert!(termed.elapsed() >= WAIT, "closed before the drain wait was over");
    let status = nodes[2].wait_exit(Duration::from_secs(15)).expect("node-c exits after its drain");
    assert!(status.success(), "node-c exited with {status}");
    eprintln!("route left node-c {left_after:?} after SIGTERM; {} ids × 3 nodes routed {spread:?}; checks done {checked_after:?} after", ids.len());
}
