//! `kill -9` of the real binary at a random moment of a steady publish stream, ten times
//! in a row on the same data dir (issue 4 "Crash"): after every restart each acknowledged
//! seq is in history with the id it was acknowledged for, the history is 1..=head without
//! holes, head ≥ the highest acknowledged seq, the next publish gets head + 1, and every
//! room keeps its epoch. Seeded (`LIVEGATE_TEST_SEED`): the kill moments replay.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::{full_history, ServeProcess};
use common::*;
use serde_json::{json, Value};

const KILLS: usize = 10;
const ROOMS: usize = 5;
const PUBLISHERS: usize = 4;
/// The kill comes this long (ms, uniform) after the publishers start.
const KILL_AFTER_MS: (u64, u64) = (300, 1800);

fn room_name(r: usize) -> String {
    format!("crash:{r}")
}

struct Acked {
    room: usize,
    seq: u64,
    id: String,
    epoch: Value,
}

#[test]
fn kill_9_ten_times_during_a_publish_stream_loses_no_acknowledged_event() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut rng = Rng::new(test_seed(0x6b69_6c6c_2d39));
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    // Keep every event so every acknowledged one can be looked up.
    let keep_all = [
        "--history-size",
        "1000000",
        "--drain-wait-secs",
        "0",
        "--drain-spread-secs",
        "0",
        "--drain-grace-secs",
        "2",
    ];

    let mut acked: Vec<Vec<(u64, String)>> = vec![Vec::new(); ROOMS];
    let mut epochs: Vec<Option<Value>> = vec![None; ROOMS];
    let mut failures: Vec<String> = Vec::new();
    let mut lost = 0usize;
    let mut total_acked = 0usize;
    let mut in_history_unacked = 0u64;

    for round in 0..=KILLS {
        let log = root.path().join(format!("serve-{round}.log"));
        let mut server = ServeProcess::start(&data, &log, &keep_all);
        let http = server.http();

        // Everything acknowledged before the previous kills is there, unchanged.
        for r in 0..ROOMS {
            let room = room_name(r);
            let (events, epoch, head) = full_history(&http, &room, 0);
            if seqs(&events) != (1..=head).collect::<Vec<_>>() {
                failures.push(format!(
                    "round {round}: history of {room} is not 1..={head} without holes"
                ));
            }
            if let Some(known) = &epochs[r] {
                if &epoch != known {
                    failures.push(format!(
                        "round {round}: {room} epoch changed from {known} to {epoch}"
                    ));
                }
            }
            let max_acked = acked[r].iter().map(|a| a.0).max().unwrap_or(0);
            if head < max_acked {
                failures.push(format!("round {round}: {room} head {head} is below the highest acknowledged seq {max_acked}"));
            }
            for (seq, id) in &acked[r] {
                match events.get((*seq as usize).wrapping_sub(1)) {
                    Some(e) if e["id"] == id.as_str() && seq_of(e) == *seq => {}
                    other => {
                        lost += 1;
                        if lost <= 10 {
                            failures.push(format!("round {round}: acknowledged {id} ({room} seq {seq}) lost: history has {other:?}"));
                        }
                    }
                }
            }
            if round == KILLS {
                in_history_unacked += head - acked[r].len() as u64;
            }
            // The sequence goes on right after the head, in the same epoch.
            let probe_id = format!("probe-{round}-{r}");
            let reply = http.publish_ok(&room, Some(&probe_id), json!({"probe": round}));
            if reply["seq"] != head + 1 {
                failures.push(format!("round {round}: first publish to {room} after restart got seq {}, head was {head}", reply["seq"]));
            }
            let known = epochs[r].get_or_insert_with(|| reply["epoch"].clone());
            if reply["epoch"] != *known {
                failures.push(format!(
                    "round {round}: publish to {room} answered epoch {}, expected {known}",
                    reply["epoch"]
                ));
            }
            if let Some(seq) = reply["seq"].as_u64() {
                acked[r].push((seq, probe_id));
                total_acked += 1;
            }
        }
        if round == KILLS {
            server.signal("TERM");
            if !server.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()) {
                failures.push("the last server did not exit 0 after SIGTERM".into());
            }
            break;
        }

        // Four publishers over five rooms, until the server disappears under them.
        let stop = Arc::new(AtomicBool::new(false));
        let publishers: Vec<_> = (0..PUBLISHERS)
            .map(|t| {
                let http = http.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut got: Vec<Acked> = Vec::new();
                    let mut i = 0usize;
                    while !stop.load(Ordering::SeqCst) {
                        let room = (t + i) % ROOMS;
                        let id = format!("r{round}-t{t}-{i}");
                        let body =
                            Body::Json(json!({"id": id, "data": {"round": round, "t": t, "i": i}}));
                        match http.try_request(
                            "POST",
                            &format!("/v1/rooms/{}/events", room_name(room)),
                            Auth::Key,
                            body,
                        ) {
                            Ok((201, reply)) => got.push(Acked {
                                room,
                                seq: reply["seq"].as_u64().expect("seq in a 201"),
                                id,
                                epoch: reply["epoch"].clone(),
                            }),
                            Ok((status, reply)) => {
                                panic!("publish {id} answered {status}: {reply}")
                            }
                            Err(_) => break, // killed
                        }
                        i += 1;
                    }
                    got
                })
            })
            .collect();
        let kill_after = Duration::from_millis(rng.range(KILL_AFTER_MS.0, KILL_AFTER_MS.1));
        common::pace(kill_after, "publishers run until a random moment of the kill");
        server.kill9();
        // Bound the publishers even if one did not notice the kill.
        let joined = Instant::now();
        let mut this_round = 0;
        for p in publishers {
            if !common::wait_until(Duration::from_secs(30).saturating_sub(joined.elapsed()), || {
                p.is_finished()
            }) {
                stop.store(true, Ordering::SeqCst);
            }
            for a in p.join().expect("publisher") {
                if Some(&a.epoch) != epochs[a.room].as_ref() {
                    failures.push(format!(
                        "round {round}: {} acknowledged in epoch {}, room epoch {:?}",
                        a.id, a.epoch, epochs[a.room]
                    ));
                }
                acked[a.room].push((a.seq, a.id));
                this_round += 1;
            }
        }
        total_acked += this_round;
        eprintln!("round {round}: kill -9 {kill_after:?} into the stream, {this_round} publishes acknowledged");
        if this_round == 0 {
            failures.push(format!("round {round}: no publish acknowledged before the kill"));
        }
    }

    for (r, room_acks) in acked.iter().enumerate() {
        let mut s: Vec<u64> = room_acks.iter().map(|a| a.0).collect();
        s.sort();
        let n = s.len();
        s.dedup();
        if s.len() != n {
            failures.push(format!(
                "{}: one seq acknowledged for two different publishes",
                room_name(r)
            ));
        }
    }
    eprintln!(
        "{KILLS} × kill -9: {total_acked} events acknowledged, {lost} lost, {in_history_unacked} in history without an ack \
         (in flight at a kill); {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}
