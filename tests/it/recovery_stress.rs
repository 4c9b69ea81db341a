//! 20 clients × 5 rooms × 200 events, published concurrently while the clients randomly
//! drop their connections and resubscribe with `since` + `epoch`. At the end every client
//! must hold every event of its rooms exactly once, in seq order, identical to what
//! `GET /v1/rooms/{room}/events` returns.
//!
//! Seeded (`LIVEGATE_TEST_SEED`), so a failing schedule can be replayed.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const CLIENTS: usize = 20;
const ROOMS: usize = 5;
const EVENTS: u64 = 200;
const MAX_DROPS_PER_CLIENT: usize = 6;
/// A client that gets nothing for this long while it still misses events has stalled.
const STALL: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(90);

/// True while the publishers run; reconnects that happen then are counted, so the test
/// proves it exercised replay racing live publishes, not only replay of a finished log.
static PUBLISHING: AtomicBool = AtomicBool::new(false);
static RESUBSCRIBES_WHILE_PUBLISHING: AtomicUsize = AtomicUsize::new(0);

struct Report {
    id: usize,
    received: Vec<Vec<Value>>,
    drops: usize,
    errors: Vec<String>,
}

fn room_name(r: usize) -> String {
    format!("stress:{r}")
}

async fn run_client(
    id: usize,
    addr: SocketAddr,
    http: Http,
    epochs: Vec<Value>,
    mut rng: Rng,
) -> Report {
    let mut last = [0u64; ROOMS];
    let mut received: Vec<Vec<Value>> = vec![Vec::new(); ROOMS];
    let mut errors: Vec<String> = Vec::new();
    let mut drops = 0;
    let started = Instant::now();
    let done = |last: &[u64; ROOMS]| last.iter().all(|&s| s == EVENTS);

    'connection: while !done(&last) {
        if started.elapsed() > DEADLINE {
            errors.push(format!("not complete after {DEADLINE:?}; last seqs {last:?}"));
            break;
        }
        let token = {
            let http = http.clone();
            tokio::task::spawn_blocking(move || {
                http.mint_token(&format!("stress-user-{id}"), "web")
            })
            .await
            .expect("mint")
        };
        let mut ws = WsClient::connect(addr, &token, None).await;
        if drops > 0 && PUBLISHING.load(Ordering::SeqCst) {
            RESUBSCRIBES_WHILE_PUBLISHING.fetch_add(1, Ordering::SeqCst);
        }
        // All five subscribes at once, each naming what this client already holds.
        for (r, epoch) in epochs.iter().enumerate() {
            let req = json!({"op": "subscribe", "room": room_name(r), "since": last[r], "epoch": epoch, "ref": r});
            ws.send_json(&req).await;
        }
        let drop_after =
            (drops < MAX_DROPS_PER_CLIENT && rng.chance(85)).then(|| rng.range(0, 150));
        let mut seen_here = 0u64;
        loop {
            if done(&last) {
                ws.close().await;
                break 'connection;
            }
            if drop_after.is_some_and(|n| seen_here >= n) {
                if rng.chance(50) {
                    ws.close().await;
                } else {
                    drop(ws); // abrupt: no Close frame
                }
                drops += 1;
                common::pace_async(
                    Duration::from_millis(rng.range(0, 30)),
                    "a dropped client reconnects after a random pause",
                )
                .await;
                continue 'connection;
            }
            let frame = match ws.read_incoming(STALL).await {
                Incoming::Json(v) => v,
                Incoming::Timeout => {
                    errors.push(format!("stalled: nothing for {STALL:?}, last seqs {last:?}"));
                    break 'connection;
                }
                other => {
                    errors.push(format!(
                        "server closed the connection: {other:?}; last seqs {last:?}"
                    ));
                    break 'connection;
                }
            };
            match frame["op"].as_str() {
                Some("subscribed") => {
                    let r = frame["ref"].as_u64().unwrap_or(u64::MAX) as usize;
                    if r >= ROOMS || frame["room"] != room_name(r) {
                        errors.push(format!("subscribed reply with unexpected ref/room: {frame}"));
                    } else if frame["recovered"] != true || frame["epoch"] != epochs[r] {
                        errors.push(format!("resubscribe since {} must recover: {frame}", last[r]));
                    }
                }
                Some("events") => {
                    for e in frame["events"].as_array().cloned().unwrap_or_default() {
                        let Some(r) = (0..ROOMS).find(|&r| e["room"] == room_name(r)) else {
                            errors.push(format!("event of a room not subscribed: {e}"));
                            continue;
                        };
                        let seq = e["seq"].as_u64().unwrap_or(0);
                        if seq == last[r] + 1 {
                            last[r] = seq;
                            received[r].push(e);
                            seen_here += 1;
                        } else if seq <= last[r] {
                            errors.push(format!(
                                "duplicate: {} seq {seq} after {}",
                                room_name(r),
                                last[r]
                            ));
                        } else {
                            errors.push(format!(
                                "gap: {} seq {seq} after {}",
                                room_name(r),
                                last[r]
                            ));
                            last[r] = seq;
                        }
                    }
                }
                _ => errors.push(format!("unexpected frame: {frame}")),
            }
            if errors.len() > 20 {
                break 'connection;
            }
        }
    }
    Report { id, received, drops, errors }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_gets_every_event_once_in_order_across_random_reconnects() {
    let _gate = crate::common::gate!();
    let seed = test_seed(0x11FE_6A7E);
    let server = TestServer::start(|_| {});
    let http = server.http();
    let started = Instant::now();

    // Event 1 of each room fixes the epoch the clients start from (since 0).
    let epochs: Vec<Value> = (0..ROOMS)
        .map(|r| {
            let reply = http.publish_ok(&room_name(r), Some("e-0"), json!({"room": r, "i": 0}));
            assert_eq!(reply["seq"], 1, "{reply}");
            reply["epoch"].clone()
        })
        .collect();

    PUBLISHING.store(true, Ordering::SeqCst);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let rng = Rng::new(seed.wrapping_add(1 + c as u64));
            tokio::spawn(run_client(c, server.addr, http.clone(), epochs.clone(), rng))
        })
        .collect();

    // One publisher per room, concurrent with the clients, with small random pauses.
    let publishers: Vec<_> = (0..ROOMS)
        .map(|r| {
            let http = http.clone();
            let mut rng = Rng::new(seed ^ (0xABCD_0000 + r as u64));
            std::thread::spawn(move || {
                let mut acked = vec![1u64];
                for i in 1..EVENTS {
                    // Pace the publishers (about 2 s in all) so clients drop and
                    // resubscribe while events are still being published.
                    common::pace(
                        Duration::from_millis(rng.range(0, 20)),
                        "publishers spread over about 2 s",
                    );
                    let reply = http.publish_ok(
                        &room_name(r),
                        Some(&format!("e-{i}")),
                        json!({"room": r, "i": i}),
                    );
                    acked.push(seq_of(&reply));
                }
                acked
            })
        })
        .collect();

    let publishers = tokio::task::spawn_blocking(move || {
        let acked: Vec<Vec<u64>> =
            publishers.into_iter().map(|p| p.join().expect("publisher panicked")).collect();
        PUBLISHING.store(false, Ordering::SeqCst);
        acked
    });
    let mut reports = Vec::new();
    for c in clients {
        reports.push(c.await.expect("client task panicked"));
    }
    for (r, acked) in publishers.await.expect("publishers").into_iter().enumerate() {
        assert_eq!(acked, (1..=EVENTS).collect::<Vec<_>>(), "publish acks of {}", room_name(r));
    }

    let history: Vec<Vec<Value>> = (0..ROOMS)
        .map(|r| {
            let h = http.history_ok(&room_name(r), Some(0), Some(1000));
            assert_eq!(h["head"], EVENTS, "{}", room_name(r));
            let events = h["events"].as_array().expect("events").clone();
            assert_eq!(
                seqs(&events),
                (1..=EVENTS).collect::<Vec<_>>(),
                "history of {}",
                room_name(r)
            );
            events
        })
        .collect();

    let mut failures = Vec::new();
    for rep in &reports {
        for e in rep.errors.iter().take(5) {
            failures.push(format!("client {}: {e}", rep.id));
        }
        for (r, room_history) in history.iter().enumerate() {
            if &rep.received[r] != room_history {
                let first_diff = rep.received[r].iter().zip(room_history).position(|(a, b)| a != b);
                failures.push(format!(
                    "client {}: {} got {} events, history has {}; first difference at index {:?}",
                    rep.id,
                    room_name(r),
                    rep.received[r].len(),
                    room_history.len(),
                    first_diff
                ));
            }
        }
    }
    let drops: usize = reports.iter().map(|r| r.drops).sum();
    let racing = RESUBSCRIBES_WHILE_PUBLISHING.load(Ordering::SeqCst);
    eprintln!(
        "{CLIENTS} clients, {drops} disconnects, {racing} resubscribes while publishing, {:?}",
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "seed {seed}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        racing >= CLIENTS,
        "the schedule must resubscribe clients while publishing (got {racing} of {drops} drops)"
    );
}
