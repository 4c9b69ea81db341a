//! Cluster-wide room occupancy (issue 20): three `livegate serve` processes
//! on one real `nats-server -js` (`common::nats`), each configured with a webhook URL
//! that points at a real local HTTP receiver in this test.
//!
//! - subscribers join the same rooms on different nodes and leave again: each room gets
//!   exactly one `room_occupied` (when its first subscriber anywhere arrived) and one
//!   `room_vacated` (when its last one anywhere left), in that order, both from the same
//!   node (the room's writer decides and queues them), and nothing while other nodes
//!   still hold subscribers;
//! - `kill -9` of the only node left with a room's subscribers: the survivors remove the
//!   dead node from the room's record once its heartbeats stop, and the room is vacated
//!   once;
//! - a drain (SIGTERM) takes the node out of its rooms' records: a room it shared keeps
//!   its `occupied`, a room only it held is vacated once;
//! - NATS killed while a room's last subscriber leaves: nothing is decided meanwhile, and
//!   the room is vacated once NATS is back;
//! - a subscribe/unsubscribe loop, and a reload that moves to another node within
//!   `webhook_vacated_delay_ms`, make no webhook beyond the room's one `room_occupied`;
//! - `livegate_occupancy_edges_total{edge}` across the nodes counts the same decisions.
//!
//! nats-server must be installed (a missing one fails the test). Every wait is bounded;
//! on failure the node logs are kept (the path is printed).

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::nats::Cluster;
use common::*;
use serde_json::{json, Value};

const SECRET: &str = "occupancy-test-secret";

/// A real HTTP server on loopback that answers 200 to every POST and keeps the bodies
/// (with their signature header) in arrival order.
pub(super) struct Receiver {
    pub(super) url: String,
    got: Arc<Mutex<Vec<(Value, Option<String>)>>>,
}

impl Receiver {
    pub(super) fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook receiver");
        let url = format!("http://{}/hooks", listener.local_addr().expect("addr"));
        let got: Arc<Mutex<Vec<(Value, Option<String>)>>> = Arc::default();
        let kept = got.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &kept);
                });
            }
        });
        Receiver { url, got }
    }

    pub(super) fn webhooks(&self) -> Vec<Value> {
        self.got.lock().unwrap().iter().map(|(body, _)| body.clone()).collect()
    }

    /// The occupancy webhooks of `room`, as (type, node), in arrival order.
    pub(super) fn of_room(&self, room: &str) -> Vec<(String, String)> {
        self.webhooks()
            .iter()
            .filter(|w| {
                w["room"] == room && w["type"].as_str().is_some_and(|t| t.starts_with("room_"))
            })
            .map(|w| {
                (
                    w["type"].as_str().unwrap_or("").to_string(),
                    w["node"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }
}

/// One connection: requests until the client closes (keep-alive), each answered 200.
fn serve(
    stream: std::net::TcpStream,
    kept: &Mutex<Vec<(Value, Option<String>)>>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let (mut length, mut signature) = (0usize, None);
        loop {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "x-livegate-signature" => signature = Some(value.trim().to_string()),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        kept.lock().unwrap().push((body, signature));
        out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")?;
        out.flush()?;
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// `livegate_occupancy_edges_total{edge}` summed over the running nodes.
fn edges_counted(cluster: &Cluster, edge: &str) -> f64 {
    let series = format!("livegate_occupancy_edges_total{{edge=\"{edge}\"}}");
    cluster.running().iter().map(|&i| cluster.http(i).metric(&series).unwrap_or(0.0)).sum()
}

/// A client on node a (index 0) subscribed to `room`.
fn on_a(
    cluster: &Cluster,
    rt: &tokio::runtime::Runtime,
    user: &str,
    room: &'static str,
) -> WsClient {
    let token = cluster.http(0).mint_token(user, "web");
    let addr = cluster.addr(0);
    rt.block_on(async move {
        let mut ws = WsClient::connect(addr, &token, None).await;
        ws.subscribe_ok(room).await;
        ws
    })
}

const OCCUPIED: &str = "room_occupied";
const VACATED: &str = "room_vacated";
/// `webhook_vacated_delay_ms`'s default: a room's `room_vacated` waits this long.
const VACATE_DELAY: Duration = Duration::from_secs(3);

#[test]
fn one_occupied_and_one_vacated_per_room_across_three_nodes() {
    let _gate = crate::common::gate!();
    let receiver = Receiver::start();
    let flags = [
        "--drain-wait-secs",
        "0",
        "--drain-spread-secs",
        "1",
        "--drain-grace-secs",
        "5",
        "--webhook-url",
        &receiver.url,
        "--webhook-secret",
        SECRET,
    ];
    let mut cluster = Cluster::start(3, &flags);
    let rt = runtime();
    let mut failures: Vec<String> = Vec::new();
    let rooms = ["match:1", "match:2", "match:3"];
    // Who subscribes where: every room on at least two nodes, match:1 on all three.
    let placement: [(usize, &[&str]); 3] =
        [(0, &["match:1", "match:2"]), (1, &["match:1", "match:3"]), (2, &rooms)];
    let mut clients = Vec::new();
    for (node, subscribed) in placement {
        let token = cluster.http(node).mint_token(&format!("viewer-{node}"), "web");
        let addr = cluster.addr(node);
        let ws = rt.block_on(async move {
            let mut ws = WsClient::connect(addr, &token, None).await;
            for room in subscribed {
                ws.subscribe_ok(room).await;
            }
            ws
        });
        clients.push(ws);
    }
    let occupied = wait_until(WAIT, || rooms.iter().all(|r| !receiver.of_room(r).is_empty()));
    // Late duplicates (a second node deciding the same edge) would come within this.
    common::let_time_pass(Duration::from_secs(2), "no second room_occupied from another node");
    for room in rooms {
        let got = receiver.of_room(room);
        if !occupied || got.len() != 1 || got[0].0 != OCCUPIED {
            failures.push(format!(
                "{room} after subscribers on several nodes: {got:?}, expected one {OCCUPIED}"
            ));
        }
    }

    // a and b leave: every room still has c's subscriber, so nothing is vacated.
    let (ws_c, ws_b, ws_a) =
        (clients.pop().unwrap(), clients.pop().unwrap(), clients.pop().unwrap());
    rt.block_on(async move {
        ws_a.close().await;
        ws_b.close().await;
    });
    common::let_time_pass(Duration::from_secs(2), "nothing vacated while c keeps its subscriber");
    for room in rooms {
        let got = receiver.of_room(room);
        if got.iter().any(|(kind, _)| kind == VACATED) {
            failures.push(format!("{room} vacated while c still had a subscriber: {got:?}"));
        }
    }
    // c unsubscribes match:1, then goes: every room is vacated, once.
    let mut ws_c = ws_c;
    rt.block_on(async {
        let reply = ws_c.unsubscribe("match:1").await;
        assert_eq!(reply["op"], "unsubscribed", "{reply}");
    });
    let vacated_one = wait_until(WAIT, || receiver.of_room("match:1").len() >= 2);
    if !vacated_one {
        failures.push(format!(
            "match:1 after its last subscriber unsubscribed: {:?}",
            receiver.of_room("match:1")
        ));
    }
    rt.block_on(ws_c.close());
    let vacated = wait_until(WAIT, || rooms.iter().all(|r| receiver.of_room(r).len() >= 2));
    common::let_time_pass(Duration::from_secs(2), "no second room_vacated from another node");
    for room in rooms {
        let got = receiver.of_room(room);
        let kinds: Vec<&str> = got.iter().map(|(kind, _)| kind.as_str()).collect();
        if !vacated || kinds != [OCCUPIED, VACATED] {
            failures.push(format!("{room}: {got:?}, expected one {OCCUPIED} then one {VACATED}"));
        } else if got[0].1 != got[1].1 {
            failures.push(format!("{room}: decided on two nodes {got:?}: one room's webhooks should queue on its writer"));
        }
    }

    // A subscribe/unsubscribe loop on a, then a reload that moves to b (a's connection
    // closes, b's subscribes within webhook_vacated_delay_ms): one occupied and nothing
    // else, not even while the delay runs out; the leave from b is the one vacated.
    let mut looping = on_a(&cluster, &rt, "viewer-6", "match:6");
    rt.block_on(async {
        for _ in 0..20 {
            looping.unsubscribe("match:6").await;
            looping.subscribe_ok("match:6").await;
        }
        looping.close().await;
    });
    let token = cluster.http(1).mint_token("viewer-6", "web");
    let addr = cluster.addr(1);
    let reloaded = rt.block_on(async move {
        let mut ws = WsClient::connect(addr, &token, None).await;
        ws.subscribe_ok("match:6").await;
        ws
    });
    common::let_time_pass(
        VACATE_DELAY + Duration::from_secs(2),
        "past the vacated delay, a reload sent nothing",
    );
    let kinds_of =
        |room: &str| receiver.of_room(room).into_iter().map(|(kind, _)| kind).collect::<Vec<_>>();
    if kinds_of("match:6") != [OCCUPIED] {
        failures.push(format!(
            "match:6 after a loop on a and a reload onto b: {:?}, expected one {OCCUPIED}",
            receiver.of_room("match:6")
        ));
    }
    rt.block_on(reloaded.close());
    if !wait_until(WAIT, || receiver.of_room("match:6").len() >= 2)
        || kinds_of("match:6") != [OCCUPIED, VACATED]
    {
        failures.push(format!(
            "match:6 after its last subscriber left b: {:?}",
            receiver.of_room("match:6")
        ));
    }

    // kill -9 of the only node left in match:9: the survivors vacate it once c's
    // heartbeats stop (3 periods of 1 s), and never before.
    let token = cluster.http(2).mint_token("viewer-9", "web");
    let addr = cluster.addr(2);
    let ws_dead = rt.block_on(async move {
        let mut ws = WsClient::connect(addr, &token, None).await;
        ws.subscribe_ok("match:9").await;
        ws
    });
    if !wait_until(WAIT, || receiver.of_room("match:9").len() == 1) {
        failures.push(format!("match:9 with a subscriber on c: {:?}", receiver.of_room("match:9")));
    }
    cluster.take_node(2).kill9();
    let killed_at = Instant::now();
    let cleaned = wait_until(Duration::from_secs(20), || receiver.of_room("match:9").len() >= 2);
    let cleaned_after = killed_at.elapsed();
    drop(ws_dead);
    common::let_time_pass(
        Duration::from_secs(2),
        "no second room_vacated for the dead node's room",
    );
    let got = receiver.of_room("match:9");
    let kinds: Vec<&str> = got.iter().map(|(kind, _)| kind.as_str()).collect();
    if !cleaned || kinds != [OCCUPIED, VACATED] {
        failures.push(format!(
            "match:9 after kill -9 of its only node: {got:?} ({cleaned_after:?} after the kill)"
        ));
    } else if got[1].1 == "c" {
        failures.push(format!("match:9 vacated by the dead node itself: {got:?}"));
    }

    // A drain of b: b's subscribers go with it and b leaves its records. match:7 keeps
    // a's subscriber (nothing happens), match:8 had only b's (vacated once).
    let on = |node: usize, user: &str, subscribed: &'static [&'static str]| {
        let token = cluster.http(node).mint_token(user, "web");
        let addr = cluster.addr(node);
        rt.block_on(async move {
            let mut ws = WsClient::connect(addr, &token, None).await;
            for room in subscribed {
                ws.subscribe_ok(room).await;
            }
            ws
        })
    };
    let ws_a7 = on(0, "viewer-a7", &["match:7"]);
    let _ws_b = on(1, "viewer-b78", &["match:7", "match:8"]);
    if !wait_until(WAIT, || {
        receiver.of_room("match:7").len() == 1 && receiver.of_room("match:8").len() == 1
    }) {
        failures.push(format!(
            "before b's drain: match:7 {:?}, match:8 {:?}",
            receiver.of_room("match:7"),
            receiver.of_room("match:8")
        ));
    }
    let mut b = cluster.take_node(1);
    b.signal("TERM");
    if b.wait_exit(Duration::from_secs(20)).is_none() {
        failures.push("b did not finish its drain within 20 s".into());
    }
    let drained = wait_until(WAIT, || receiver.of_room("match:8").len() >= 2);
    common::let_time_pass(
        Duration::from_secs(2),
        "nothing for match:7, which keeps a's subscriber",
    );
    let (seven, eight) = (receiver.of_room("match:7"), receiver.of_room("match:8"));
    let kinds =
        |got: &[(String, String)]| got.iter().map(|(kind, _)| kind.clone()).collect::<Vec<_>>();
    if seven.len() != 1 {
        failures.push(format!(
            "match:7 after b drained, a still subscribed: {seven:?}, expected only the {OCCUPIED}"
        ));
    }
    if !drained || kinds(&eight) != [OCCUPIED, VACATED] {
        failures.push(format!("match:8 after its only node drained: {eight:?}"));
    }
    rt.block_on(ws_a7.close());
    if !wait_until(WAIT, || receiver.of_room("match:7").len() >= 2)
        || kinds(&receiver.of_room("match:7")) != [OCCUPIED, VACATED]
    {
        failures.push(format!(
            "match:7 after a's subscriber left too: {:?}",
            receiver.of_room("match:7")
        ));
    }

    // NATS away: a's last subscriber of match:5 leaves meanwhile; the decision waits in
    // a's queue and is made once NATS is back.
    let ws_a5 = on_a(&cluster, &rt, "viewer-a5", "match:5");
    if !wait_until(WAIT, || receiver.of_room("match:5").len() == 1) {
        failures.push(format!("match:5 with a subscriber on a: {:?}", receiver.of_room("match:5")));
    }
    cluster.nats.kill9();
    rt.block_on(ws_a5.close());
    // Past the vacated delay: a's edge is due while NATS is still away.
    common::let_time_pass(
        VACATE_DELAY + Duration::from_secs(2),
        "a's vacated edge falls due while NATS is away",
    );
    if receiver.of_room("match:5").len() != 1 {
        failures.push(format!(
            "match:5 decided while NATS was away: {:?}",
            receiver.of_room("match:5")
        ));
    }
    cluster.nats.restart();
    let back_at = Instant::now();
    let replayed = wait_until(Duration::from_secs(20), || receiver.of_room("match:5").len() >= 2);
    let replayed_after = back_at.elapsed();
    if !replayed || kinds(&receiver.of_room("match:5")) != [OCCUPIED, VACATED] {
        failures.push(format!(
            "match:5 after NATS came back: {:?} ({replayed_after:?})",
            receiver.of_room("match:5")
        ));
    }

    // Signed, and counted on the nodes that decided (the stopped nodes' counts went
    // with them).
    let unsigned = receiver
        .got
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, s)| !s.as_deref().is_some_and(|s| s.starts_with("sha256=")))
        .count();
    if unsigned > 0 {
        failures.push(format!("{unsigned} webhook(s) without an X-Livegate-Signature"));
    }
    let running: Vec<&str> = cluster.running().into_iter().map(Cluster::name).collect();
    let decided_by_survivors = |kind: &str| {
        receiver
            .webhooks()
            .iter()
            .filter(|w| w["type"] == kind && running.iter().any(|n| w["node"] == *n))
            .count() as f64
    };
    for (edge, kind) in [("occupied", OCCUPIED), ("vacated", VACATED)] {
        let counted = edges_counted(&cluster, edge);
        if counted != decided_by_survivors(kind) {
            failures.push(format!("livegate_occupancy_edges_total{{edge={edge}}} on {running:?}: {counted}, webhooks from them: {}", decided_by_survivors(kind)));
        }
    }
    eprintln!(
        "occupancy: {} webhooks; a killed node's room vacated {cleaned_after:?} after the kill; \
         a decision held through a NATS outage made {replayed_after:?} after NATS was back",
        receiver.webhooks().len()
    );
    if !failures.is_empty() {
        let lines = cluster.log_lines(&["occupancy", "webhook", "panic"]);
        panic!(
            "{} failure(s):\n  {}\nwebhooks: {}\nlog lines:\n  {}",
            failures.len(),
            failures.join("\n  "),
            json!(receiver.webhooks()),
            lines.join("\n  ")
        );
    }
}
