//! Consumer lag (issue 48): a node whose NATS link is slowed applies its rooms' live
//! copies late, and says so on `/metrics` (`livegate_consumer_lag_events`, the worst
//! room's events behind its stream; `livegate_consumer_lag_seconds`, the oldest age of
//! an event when applied); once the link is well again, both come back to 0.
//!
//! Two nodes on one nats-server; node b reaches it through a `common::link` proxy, a on
//! plain loopback. A room written by a gets a steady 30 events a second (about 600 bytes
//! each) through a's HTTP API, and a subscriber on b keeps b's live feed of it. Then b's
//! link is slowed to 300 ms each way and 8 KB/s (below the ~20 KB/s the copies need, so
//! they queue at the bottleneck), and the lag must rise on b while a stays at 0; then the
//! link is restored and b's lag must return to 0. While slowed, b's admin overview names
//! the room. The subscriber must still get every event, in order, once. `FIGURE` lines
//! give the readings.
//!
//! With cells that run their own NATS, each node also reads its cell's mirror of every
//! other cell's rooms stream (`livegate_cell_mirror_lag_events{cell}`): caught up, 0.
//!
//! Why a proxy and not `tc netem` on a network namespace's link: this machine's kernel
//! has no netem qdisc (`tc qdisc add … netem` answers "Specified qdisc kind is unknown"),
//! and `common::link` explains why the suite shapes links in a proxy anyway (no root, no
//! clean-up, only the one node's sockets). `Condition::Slowed` does what netem's delay
//! with a rate does to a TCP stream: the bytes arrive late, and later still as the queue
//! before the bottleneck grows.

use super::*;
use common::link::{Condition, Link};

const LAG_EVENTS: &str = "livegate_consumer_lag_events";
const LAG_SECONDS: &str = "livegate_consumer_lag_seconds";
/// The publisher's pace: 30 events a second.
const EVERY: Duration = Duration::from_millis(33);
/// Node b's link while slowed.
const SLOWED: Condition =
    Condition::Slowed { one_way: Duration::from_millis(300), bytes_per_sec: 8_000 };

/// A room node a writes, so b only takes live copies of it.
fn room_of_a(names: &[&str]) -> String {
    (0..)
        .map(|k| format!("lag:{k}"))
        .find(|room| livegate::core::nodes::routing::room_writer(room, names) == Some(names[0]))
        .expect("some room is a's")
}

/// (events, seconds) on a node's `/metrics`; a lag metric it does not export fails.
fn lag_of(http: &Http) -> (f64, f64) {
    let text = http.metrics_text();
    let read =
        |name: &str| metric_value(&text, name).unwrap_or_else(|| panic!("no {name} on /metrics"));
    (read(LAG_EVENTS), read(LAG_SECONDS))
}

#[test]
fn a_slowed_nats_link_shows_as_lag_that_returns_to_zero() {
    let _gate = crate::common::gate!();
    let link = Link::start();
    let mut extra: Vec<&str> = SHORT_DRAIN.to_vec();
    // The subscriber reads its events at the end.
    extra.extend(["--max-outbox-bytes", "33554432"]);
    let cluster = Cluster::start_one_linked(2, &extra, &link, 1);
    let rt = runtime();
    let mut failures = Vec::new();
    let names: Vec<&str> = (0..2).map(Cluster::name).collect();
    let room = room_of_a(&names);
    let (a, b) = (cluster.http(0), cluster.http(1));

    let token = b.mint_token("lag-watcher", "web");
    let mut watcher = rt.block_on(WsClient::connect(cluster.addr(1), &token, None));
    rt.block_on(watcher.subscribe_ok(&room));

    // The publisher: 30 events a second through a until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicUsize::new(0));
    let publisher = {
        let (stop, published, room, a) =
            (stop.clone(), published.clone(), room.clone(), cluster.http(0));
        std::thread::spawn(move || {
            let mut pacer = Pacer::new(EVERY);
            let filler = "x".repeat(500);
            let mut refused = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                pacer.wait();
                let n = published.load(Ordering::Relaxed) + 1;
                let (status, reply) = a.publish(
                    &room,
                    Some(&format!("lag-{n}")),
                    json!({ "n": n, "filler": filler }),
                );
                if status == 201 && reply["seq"] == n as u64 {
                    published.store(n, Ordering::Relaxed);
                } else {
                    refused.push(format!("publish {n}: {status} {reply}"));
                    break;
                }
            }
            refused
        })
    };

    // Up: b keeps up with the stream.
    let flowing = wait_until(WAIT, || published.load(Ordering::Relaxed) >= 60);
    assert!(flowing, "the publisher got only {} events through", published.load(Ordering::Relaxed));
    let before = wait_for(WAIT, || {
        Some(lag_of(&b)).filter(|(events, seconds)| *events == 0.0 && *seconds < 0.25)
    });
    let before =
        before.unwrap_or_else(|| panic!("b is behind before its link is slowed: {:?}", lag_of(&b)));
    println!("FIGURE lag before: b {} events, {:.3} s; a {:?}", before.0, before.1, lag_of(&a));

    // Slowed: the copies queue before b's bottleneck.
    link.set(SLOWED);
    let slowed_at = Instant::now();
    let mut worst = (0.0f64, 0.0f64);
    let mut a_worst = (0.0f64, 0.0f64);
    let behind = wait_until_every(Duration::from_secs(40), Duration::from_millis(500), || {
        let (events, seconds) = lag_of(&b);
        let on_a = lag_of(&a);
        worst = (worst.0.max(events), worst.1.max(seconds));
        a_worst = (a_worst.0.max(on_a.0), a_worst.1.max(on_a.1));
        events >= 50.0 && seconds >= 2.0
    });
    println!(
        "FIGURE lag while slowed (300 ms each way, 8 KB/s; {:.1} s in): b up to {} events, {:.3} s; a up to {} events, {:.3} s",
        slowed_at.elapsed().as_secs_f64(),
        worst.0,
        worst.1,
        a_worst.0,
        a_worst.1
    );
    if !behind {
        failures.push(format!(
            "b's lag did not rise to 50 events and 2 s with its link slowed: at most {worst:?}"
        ));
    }
    // The admin overview names the room behind (and only there: /metrics has no room label).
    let (status, overview) = b.request("GET", "/v1/admin/overview", Auth::Key, Body::None);
    println!("FIGURE lag on b's admin overview while slowed: {}", overview["lag"]);
    if status != 200
        || overview["lag"]["room"] != room.as_str()
        || overview["lag"]["events"].as_u64().unwrap_or(0) == 0
    {
        failures.push(format!(
            "b's overview does not name {room} as behind: {status} {}",
            overview["lag"]
        ));
    }
    if a_worst.0 > 0.0 {
        failures.push(format!("a, the writer on a plain link, read {} events behind", a_worst.0));
    }

    // Restored: the queue drains and b is current again.
    link.set(Condition::Up);
    let restored_at = Instant::now();
    let mut last = (f64::NAN, f64::NAN);
    let caught_up = wait_until_every(Duration::from_secs(60), Duration::from_millis(500), || {
        last = lag_of(&b);
        last.0 == 0.0 && last.1 < 0.25
    });
    println!(
        "FIGURE lag after the link is restored ({:.1} s later): b {} events, {:.3} s",
        restored_at.elapsed().as_secs_f64(),
        last.0,
        last.1
    );
    if !caught_up {
        failures.push(format!(
            "b's lag did not return to 0 within 60 s of the link's restoration: {last:?}"
        ));
    }

    stop.store(true, Ordering::Relaxed);
    failures.extend(publisher.join().expect("publisher thread"));
    let total = published.load(Ordering::Relaxed);
    // Every event reached b's subscriber, in order, once.
    let (got, other) =
        rt.block_on(collect_events(&mut watcher, &room, total, Duration::from_secs(30)));
    let want: Vec<u64> = (1..=total as u64).collect();
    if seqs(&got) != want {
        failures.push(format!("b's subscriber got {} events, not 1..={total} in order", got.len()));
    }
    failures.extend(other);
    println!("FIGURE lag: {total} events published at 30/s, all delivered on b in order");
    fail_with_logs(
        &cluster,
        "a_slowed_nats_link_shows_as_lag_that_returns_to_zero",
        &failures,
        &["lag", "WARN", "ERROR"],
    );
}

/// Cells with their own NATS: every node reads, every 10 s, how many messages its cell's
/// mirror of the other cell's rooms stream lacks, as JetStream reports it
/// (`livegate_cell_mirror_lag_events{cell}`), and its admin overview lists it. Events
/// published in cell a reach cell b's mirror, and b's nodes read it caught up (0); a's
/// nodes read their mirror of b the same way.
#[test]
fn each_node_reads_its_cells_mirror_lag() {
    let _gate = crate::common::gate!();
    use common::cells::{Cells, CELL_NAMES};
    use common::nats::CellNatsConfig;
    let cells = Cells::start(&["--cluster-heartbeat-ms", "250", "--probe-up-after", "1"], |_| {
        CellNatsConfig::default()
    });
    let mut failures = Vec::new();
    let room = (0..10_000)
        .map(|i| format!("mirrored{i}"))
        .find(|r| livegate::core::nodes::routing::room_home_cell(r, &CELL_NAMES) == Some("a"))
        .expect("a room homed in a");
    for n in 1..=20u64 {
        let (status, reply) =
            cells.http(0).publish(&room, Some(&format!("m-{n}")), json!({ "n": n }));
        if status != 201 || reply["seq"] != n {
            failures.push(format!("publish {n} in cell a: {status} {reply}"));
        }
    }
    for i in cells.running() {
        let other = if Cells::cell_of(i) == "a" { "b" } else { "a" };
        let series = format!("livegate_cell_mirror_lag_events{{cell=\"{other}\"}}");
        let http = cells.http(i);
        let read = wait_for_every(Duration::from_secs(30), Duration::from_millis(250), || {
            http.metric(&series).filter(|lag| *lag == 0.0)
        });
        println!(
            "FIGURE mirror lag on {} (its mirror of cell {other}): {:?}",
            Cells::name(i),
            http.metric(&series)
        );
        if read.is_none() {
            failures.push(format!(
                "{}: {series} never read 0 within 30 s: {:?}",
                Cells::name(i),
                http.metric(&series)
            ));
        }
        let (status, overview) = http.request("GET", "/v1/admin/overview", Auth::Key, Body::None);
        if status != 200 || overview["mirrors"] != json!([{ "cell": other, "lag_events": 0 }]) {
            failures.push(format!(
                "{}'s overview: {status} mirrors {}",
                Cells::name(i),
                overview["mirrors"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}\nlogs under {}", failures.join("\n"), cells.root().display());
}
