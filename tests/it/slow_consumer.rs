//! A client that stops reading must not make the server buffer without bound (slow
//! consumers are closed with 4009 instead of growing memory): once what it has not taken passes `max_outbox_bytes` the server ends the
//! connection (4009, or a TCP shutdown when even the Close frame cannot be written),
//! and subscribers that do read are unaffected.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_stops_reading_is_cut_off_and_readers_are_not() {
    let _gate = crate::common::gate!();
    // Default max_outbox_bytes (1 MiB) and batching window (100 ms).
    let server = TestServer::start(|c| c.history_size = 10);
    let http = server.http();
    let mut stalled = server.client("stalled").await;
    stalled.subscribe_ok("flood").await;
    let mut reader = server.client("reader").await;
    reader.subscribe_ok("flood").await;

    // 2000 events of 8 KiB (about 16 MB, far more than the socket buffers of both ends),
    // paced at about 4 MB/s so a reading client never has more than a few hundred KiB
    // waiting in one 100 ms window.
    let threads = 4;
    let per_thread = 500;
    let blob = "x".repeat(8 * 1024);
    let publishers: Vec<_> = (0..threads)
        .map(|t| {
            let http = http.clone();
            let blob = blob.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                for i in 0..per_thread {
                    // thread t sends event i no earlier than i × 8 ms after it started
                    common::pace_until(
                        started + Duration::from_millis(8 * i as u64),
                        "about 4 MB/s",
                    );
                    http.publish_ok("flood", None, json!({"t": t, "i": i, "blob": blob}));
                }
            })
        })
        .collect();
    let total = threads * per_thread;
    let got = reader.next_event_frames_within(total, Duration::from_secs(60)).await;
    assert_eq!(got.iter().map(Vec::len).sum::<usize>(), total);
    for p in publishers {
        p.join().expect("publisher");
    }
    reader.assert_alive().await;

    // The stalled client can drain what the socket buffers held, then the connection
    // must be over: a Close 4009, or the server shut the stuck socket down.
    let mut drained = 0usize;
    let outcome = loop {
        match stalled.read_incoming(Duration::from_secs(5)).await {
            Incoming::Json(frame) => drained += frame["events"].as_array().map_or(0, Vec::len),
            other => break other,
        }
    };
    eprintln!("stalled client drained {drained} of {total} events, then {outcome:?}");
    match outcome {
        Incoming::Close(code, _) => assert_eq!(code, Some(4009), "closed, but not as a slow consumer"),
        Incoming::Ended(_) => {}
        other => panic!(
            "a client that stopped reading was never closed: it could still drain {drained} of {total} events \
             (about {} MiB the server held for it), then {other:?}",
            drained * 8 / 1024
        ),
    }
    assert!(
        drained < total,
        "the stalled client was sent every event: nothing bounded what was held for it"
    );
}
