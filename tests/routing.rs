//! `GET /v1/route` over a real liveness table (DESIGN.md §4 "Routing", "Liveness table";
//! issue 3): the node itself is always a candidate; a peer is marked down after one failed
//! probe and up only after `probe_up_after` successful probes in a row.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn route(http: &Http, query: &str) -> (u16, Value) {
    http.request("GET", &format!("/v1/route?{query}"), Auth::Key, Body::None)
}

/// The node `/v1/route?user=u1` answers (asserting 200).
fn routed_node(http: &Http) -> String {
    let (status, body) = route(http, "user=u1");
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
    let server = TestServer::start(|c| c.node = "solo".into());
    let http = server.http();
    for query in ["user=u1", "session=nosuch", "session=nosuch&user=u1"] {
        let (status, body) = route(&http, query);
        assert_eq!(status, 200, "{query}: {body}");
        assert_eq!(body["node"], "solo", "{query}: {body}");
        let url = body["url"].as_str().unwrap_or_else(|| panic!("{query}: no url in {body}"));
        assert!(url.contains(&format!(":{}", server.addr.port())), "{query}: url {url} must carry port {}", server.addr.port());
    }
    let (status, body) = route(&http, "");
    assert_eq!(status, 400, "neither session nor user: {body}");
    let (status, body) = http.request("GET", "/v1/route?user=u1", Auth::None, Body::None);
    assert_eq!(status, 401, "the API key is required: {body}");
}

#[test]
fn route_with_every_peer_down_still_answers_self() {
    let (d1, d2) = (dead_addr(), dead_addr());
    let server = TestServer::start(|c| {
        c.node = "node-z".into();
        c.peers = vec![format!("node-a=http://{d1}"), format!("node-0@other=http://{d2}")];
        c.probe_interval_ms = 50;
        c.probe_up_after = 1;
    });
    let http = server.http();
    let until = Instant::now() + Duration::from_millis(600);
    while Instant::now() < until {
        let (status, body) = route(&http, "user=u1");
        assert_eq!(status, 200, "self is always a candidate: {body}");
        assert_eq!(body["node"], "node-z", "{body}");
        assert!(body["url"].as_str().is_some_and(|u| u.contains(&format!(":{}", server.addr.port()))), "{body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn peer_goes_down_after_one_failed_probe_and_comes_back_after_several() {
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

    // P comes up: node-a sorts before node-b, so it is the answer once up.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = route(&http, "user=u1");
        assert_eq!(status, 200, "{body}");
        if body["node"] == "node-a" {
            assert_eq!(body["url"], format!("http://{p_addr}"), "the peer's configured URL: {body}");
            break;
        }
        assert_eq!(body["node"], "node-b", "{body}");
        assert!(Instant::now() < deadline, "route never answered node-a within 5 s");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Down fast: one failed probe.
    let dir = p.stop();
    let stopped = Instant::now();
    while routed_node(&http) != "node-b" {
        assert!(stopped.elapsed() <= Duration::from_secs(1), "peer still routed to 1 s after it stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    let down_after = stopped.elapsed();
    // And it stays down while P is away.
    let until = Instant::now() + 3 * INTERVAL;
    while Instant::now() < until {
        assert_eq!(routed_node(&http), "node-b", "a stopped peer must stay down");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Up carefully: P is back on the same port; the answer stays node-b for at least one
    // probe interval after P's /healthz answers, then becomes node-a within 3 s.
    let restarter = std::thread::spawn(move || TestServer::start_at(p_addr, dir, peer_tweak));
    let p_http = Http::new(p_addr);
    let restart_began = Instant::now();
    let mut health_at: Option<Instant> = None;
    let flipped_at = loop {
        if health_at.is_none() && matches!(p_http.try_request("GET", "/healthz", Auth::None, Body::None), Ok((200, _))) {
            health_at = Some(Instant::now());
        }
        let node = routed_node(&http);
        if node == "node-a" {
            let now = Instant::now();
            assert!(health_at.is_some(), "route answered node-a before P's /healthz answered");
            break now;
        }
        assert_eq!(node, "node-b");
        if let Some(h) = health_at {
            assert!(h.elapsed() <= Duration::from_secs(3), "peer not routed to 3 s after its /healthz answered");
        }
        assert!(restart_began.elapsed() <= Duration::from_secs(20), "P did not come back within 20 s");
        std::thread::sleep(Duration::from_millis(5));
    };
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
