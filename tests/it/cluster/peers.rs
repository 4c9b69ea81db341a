//! Peer input is validated like client input (issue 46, holes 2 and 3): anything that can
//! publish on the cluster's NATS subjects can claim to be a node, so what it says costs
//! no more than an honest node's message and steers no client. A forger here is a bare
//! NATS connection (`common::nats::RawNats`) publishing what a node would.

use super::*;

use common::nats::RawNats;
use common::process::metric;
use std::io::{Read, Write};

/// A forged peer: heartbeats on `lg.node.heartbeat` every 200 ms, well-formed but for the
/// load it claims in `Lg-Connections`, and no node behind them (its URL is a closed port).
struct FakePeer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakePeer {
    fn start(nats_url: &str, name: &str, claim: &str) -> FakePeer {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, url, name, claim) =
            (stop.clone(), nats_url.to_string(), name.to_string(), claim.to_string());
        let thread = std::thread::spawn(move || {
            let mut nats = RawNats::connect(&url);
            while !s.load(Ordering::SeqCst) {
                let body = format!("{name}\ndefault\nhttp://127.0.0.1:9\n0\n{}", now_ms());
                nats.publish(
                    "lg.node.heartbeat",
                    None,
                    &[("Lg-Connections", &claim)],
                    body.as_bytes(),
                );
                nats.flush();
                common::pace(Duration::from_millis(200), "a peer's heartbeats");
            }
        });
        FakePeer { stop, thread: Some(thread) }
    }
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `GET /healthz` on a fresh TCP connection every 100 ms; each answer's time, or `None`
/// when it did not answer within 2 s.
struct HealthProbe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Option<Duration>>>>,
}

impl HealthProbe {
    fn start(addr: SocketAddr) -> HealthProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut took = Vec::new();
            while !s.load(Ordering::SeqCst) {
                took.push(healthz_once(addr, Duration::from_secs(2)));
                common::pace(Duration::from_millis(100), "the health probe's rate");
            }
            took
        });
        HealthProbe { stop, thread: Some(thread) }
    }

    fn stop(mut self) -> Vec<Option<Duration>> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().expect("thread").join().expect("health probe")
    }
}

fn healthz_once(addr: SocketAddr, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut stream = std::net::TcpStream::connect_timeout(&addr, within).ok()?;
    stream.set_read_timeout(Some(within)).ok()?;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: livegate\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    (head.starts_with(b"HTTP/1.1 200") && start.elapsed() < within).then(|| start.elapsed())
}

/// The loads a node hears (`GET /v1/admin/rebalance`).
fn loads(http: &Http) -> Vec<Value> {
    let (status, body) = http.request("GET", "/v1/admin/rebalance", Auth::Key, Body::None);
    assert_eq!(status, 200, "{body}");
    body["loads"].as_array().cloned().unwrap_or_default()
}

/// Hole 2: a peer's heartbeat claims 10^15 connections, then u64::MAX. The node clamps
/// the claim (to 10^7), `/healthz` on fresh connections answers within 1 s throughout,
/// and `POST /v1/admin/rebalance` towards the node itself answers 202 within 2 s. Before,
/// the planner looped once per claimed connection on the HTTP worker: the POST never
/// answered and half the health checks timed out.
#[test]
fn a_peer_claiming_absurd_loads_stalls_no_worker() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(1, &["--probe-up-after", "1"]);
    let a = cluster.http(0);
    let mut failures = Vec::new();
    for (name, claim) in
        [("forged-e15", "1000000000000000"), ("forged-max", "18446744073709551615")]
    {
        let _peer = FakePeer::start(&cluster.nats.url(), name, claim);
        let heard =
            wait_until(Duration::from_secs(10), || loads(&a).iter().any(|l| l["node"] == name));
        assert!(heard, "a never heard {name}: {:?}", loads(&a));
        let claimed =
            loads(&a).iter().find(|l| l["node"] == name).and_then(|l| l["connections"].as_u64());
        if claimed.is_none_or(|c| c > 10_000_000) {
            failures.push(format!(
                "{name} claims {claim}: a believes {claimed:?} connections (cap 10^7)"
            ));
        }
        let probe = HealthProbe::start(cluster.addr(0));
        let started = Instant::now();
        let answer = Http::with_timeout(cluster.addr(0), Duration::from_secs(10)).try_request(
            "POST",
            "/v1/admin/rebalance",
            Auth::Key,
            Body::Json(json!({"to": "a"})),
        );
        let took = started.elapsed();
        // The health checks go on for a second after the answer (or the give-up).
        common::let_time_pass_checking(
            Duration::from_secs(1),
            Duration::from_millis(100),
            "health checked after the rebalance",
            || {},
        );
        let probes = probe.stop();
        let slow = probes.iter().filter(|p| p.is_none_or(|t| t > Duration::from_secs(1))).count();
        let worst =
            probes.iter().map(|p| p.unwrap_or(Duration::from_secs(2))).max().unwrap_or_default();
        println!("{name} claims {claim}: POST /v1/admin/rebalance {answer:?} after {took:?}; /healthz {slow} of {} slower than 1 s or unanswered, worst {worst:?}", probes.len());
        match &answer {
            Ok((202, _)) if took < Duration::from_secs(2) => {}
            _ => failures.push(format!("{name}: POST /v1/admin/rebalance answered {answer:?} after {took:?} (want 202 within 2 s)")),
        }
        if slow > 0 {
            failures.push(format!("{name}: {slow} of {} /healthz checks slower than 1 s or unanswered (worst {worst:?})", probes.len()));
        }
    }
    if metric(&a, "livegate_peer_claims_clamped_total{kind=\"heartbeat\"}").unwrap_or(0.0) < 1.0 {
        failures.push(
            "livegate_peer_claims_clamped_total{kind=\"heartbeat\"} did not count the claims"
                .to_string(),
        );
    }
    // A heartbeat that does not parse is dropped and counted, and the node stays well.
    let mut nats = RawNats::connect(&cluster.nats.url());
    for junk in [
        "a b\ndefault\nhttp://x\n0\n1",
        "mallory\ndefault\nhttp://attacker.example/ x\n0\n1",
        "x".repeat(5000).as_str(),
    ] {
        nats.publish("lg.node.heartbeat", None, &[("Lg-Connections", "5")], junk.as_bytes());
    }
    nats.publish(
        "lg.node.heartbeat",
        None,
        &[("Lg-Connections", "lots")],
        b"mallory\ndefault\nhttp://x\n0\n1",
    );
    nats.flush();
    let counted = wait_until(Duration::from_secs(5), || {
        metric(&a, "livegate_peer_messages_dropped_total{kind=\"heartbeat\"}").unwrap_or(0.0) >= 4.0
    });
    if !counted {
        failures.push(format!(
            "malformed heartbeats not counted: {:?}",
            metric(&a, "livegate_peer_messages_dropped_total{kind=\"heartbeat\"}")
        ));
    }
    if loads(&a).iter().any(|l| l["node"] == "mallory") {
        failures.push("a malformed heartbeat made mallory a node".to_string());
    }
    fail_with_logs(
        &cluster,
        "a_peer_claiming_absurd_loads_stalls_no_worker",
        &failures,
        &["WARN", "ERROR", "rebalance", "peer"],
    );
}

/// Hole 3: rebalance orders published straight on node a's rebalance subject, each with
/// `to_url: http://attacker.example:8080`. One naming a itself and one naming a node
/// nobody hears are refused (answered `refused: …`, counted) and a's three clients stay
/// connected; one naming b, a real node, hands the clients over to b at b's URL as a's
/// router knows it: no client is ever sent to the order's URL. Before, the first order
/// closed every client with 4421 and the reason `http://attacker.example:8080`.
#[test]
fn a_forged_order_sends_no_client_to_its_url() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(2, &[]);
    let rt = runtime();
    let a = cluster.http(0);
    let mut clients: Vec<WsClient> = (0..3)
        .map(|k| {
            rt.block_on(WsClient::connect(
                cluster.addr(0),
                &a.mint_token(&format!("forged-order-{k}"), "web"),
                None,
            ))
        })
        .collect();
    let (status, overview) = a.request("GET", "/v1/admin/overview", Auth::Key, Body::None);
    assert_eq!(status, 200, "{overview}");
    let b_url = overview["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == "b"))
        .and_then(|n| n["url"].as_str())
        .expect("a knows b's URL")
        .to_string();
    let mut nats = RawNats::connect(&cluster.nats.url());
    let subject = format!("lg.node.{}.rebalance", hex::encode("a"));
    let order = |id: &str, to: &str| format!("{id}\n{to}\nhttp://attacker.example:8080\n3\n1000");
    let mut failures = Vec::new();

    for (to, reason) in [("a", "itself"), ("mallory", "unknown_target")] {
        let answer = nats.request(
            &subject,
            order(&format!("forged-{reason}"), to).as_bytes(),
            Duration::from_secs(5),
        );
        let answer = answer.map(|a| String::from_utf8_lossy(&a).into_owned());
        if !answer.as_deref().is_some_and(|a| a.starts_with("refused: ")) {
            failures.push(format!("an order to {to} was answered {answer:?}, not refused"));
        }
        let series = format!("livegate_rebalance_orders_refused_total{{reason=\"{reason}\"}}");
        if !wait_until(Duration::from_secs(2), || metric(&a, &series) == Some(1.0)) {
            failures.push(format!("{series} = {:?}, want 1", metric(&a, &series)));
        }
    }
    // Nobody was closed: no Close for a second and a half, then a ping answered.
    for (k, client) in clients.iter_mut().enumerate() {
        let deadline = Instant::now() + Duration::from_millis(1500);
        let closed = loop {
            match rt
                .block_on(client.read_incoming(deadline.saturating_duration_since(Instant::now())))
            {
                Incoming::Json(_) => continue,
                Incoming::Timeout => break None,
                other => break Some(other),
            }
        };
        match closed {
            None => rt.block_on(client.assert_alive()),
            Some(other) => failures.push(format!("client {k} after the refused orders: {other:?}")),
        }
    }

    // An order naming a real node moves the clients there, at that node's own URL.
    let answer = nats.request(&subject, order("forged-b", "b").as_bytes(), Duration::from_secs(5));
    let answer = answer.map(|a| String::from_utf8_lossy(&a).into_owned());
    if answer.as_deref() != Some("ok") {
        failures.push(format!("an order to b was answered {answer:?}, not ok"));
    }
    for (k, client) in clients.iter_mut().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let closed = loop {
            match rt
                .block_on(client.read_incoming(deadline.saturating_duration_since(Instant::now())))
            {
                Incoming::Json(_) => continue,
                other => break other,
            }
        };
        match closed {
            Incoming::Close(Some(4421), reason) if reason == b_url => {}
            other => {
                failures.push(format!("client {k}: want close 4421 naming {b_url}, got {other:?}"))
            }
        }
    }
    println!("refused: {:?}", cluster.log_lines(&["order refused"]));
    fail_with_logs(
        &cluster,
        "a_forged_order_sends_no_client_to_its_url",
        &failures,
        &["WARN", "ERROR", "rebalance"],
    );
}
