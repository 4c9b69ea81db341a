//! Slow consumers against the real binary (issue 4 "Slow consumers and stuck sockets"):
//! 100 clients on one room, 1 % of them (one client) stop reading while the room streams
//! about 12 MiB. The stalled client is gone within 30 s (Close 4009, or its socket ended),
//! the server process's resident memory (`/proc/<pid>/status` VmRSS) grows by less than a
//! generous bound, and each of the 99 reading clients receives every event, in order.
//! Eviction time is read off the server's `/metrics` (`slow_consumer_closes`, and
//! `connections_open` dropping to 99 while the readers still read).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::{metric, ServeProcess};
use common::*;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

const CLIENTS: usize = 100;
const STALLED: usize = 1;
const PUBLISHERS: usize = 4;
const PER_PUBLISHER: usize = 375;
const EVENT_BYTES: usize = 8 * 1024;
/// Each publisher sends one event per period: 4 × 47.6/s × 8 KiB ≈ 1.5 MiB/s to each
/// client, ≈ 150 MiB/s in all over loopback: 1500 events, ≈ 12 MiB, in about 8 s. The
/// stalled client's socket buffers and its 1 MiB bound overflow after about 5 MiB.
const PERIOD: Duration = Duration::from_millis(21);
const EVICTED_WITHIN: Duration = Duration::from_secs(30);
const RSS_GROWTH_BOUND_KIB: u64 = 200 * 1024;
const ROOM: &str = "flood";

/// Only what the readers check; the 8 KiB payload is skipped, not built into a Value.
#[derive(Deserialize)]
struct Frame {
    op: String,
    #[serde(default)]
    events: Vec<Event>,
}

#[derive(Deserialize)]
struct Event {
    room: String,
    seq: u64,
}

struct ReaderReport {
    got: u64,
    last: u64,
    errors: Vec<String>,
}

async fn reader(
    mut ws: WsClient,
    first_head: u64,
    total: u64,
    done: Arc<AtomicUsize>,
) -> ReaderReport {
    let mut report = ReaderReport { got: 0, last: first_head, errors: Vec::new() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while report.last < first_head + total {
        let msg = match tokio::time::timeout_at(deadline, ws.ws.next()).await {
            Err(_) => {
                report.errors.push(format!(
                    "timed out at seq {} of {}",
                    report.last,
                    first_head + total
                ));
                break;
            }
            Ok(None) => {
                report.errors.push(format!("stream ended at seq {}", report.last));
                break;
            }
            Ok(Some(Err(e))) => {
                report.errors.push(format!("read failed at seq {}: {e}", report.last));
                break;
            }
            Ok(Some(Ok(m))) => m,
        };
        let text = match msg {
            Message::Text(t) => t,
            Message::Close(f) => {
                report.errors.push(format!("closed at seq {}: {f:?}", report.last));
                break;
            }
            _ => continue,
        };
        let frame: Frame = match serde_json::from_str(&text) {
            Ok(f) => f,
            Err(e) => {
                report.errors.push(format!("bad frame ({e}): {}", &text[..text.len().min(200)]));
                continue;
            }
        };
        if frame.op != "events" {
            continue; // the inbox notice and the like
        }
        for e in frame.events {
            if e.room != ROOM {
                continue;
            }
            if e.seq != report.last + 1 && report.errors.len() < 5 {
                report.errors.push(format!("seq {} after {}", e.seq, report.last));
            }
            report.last = report.last.max(e.seq);
            report.got += 1;
        }
    }
    done.fetch_add(1, Ordering::SeqCst);
    ws.close().await;
    report
}

#[test]
fn one_percent_of_100_clients_stop_reading_they_are_evicted_and_memory_stays_bounded() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    // Default max_outbox_bytes (1 MiB) and batching window; a short history.
    let server = ServeProcess::start(
        &root.path().join("data"),
        &root.path().join("serve.log"),
        &["--history-size", "10"],
    );
    let http = server.http();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    // Connect everyone; the first STALLED clients never read again after subscribing.
    let mut stalled: Vec<WsClient> = Vec::new();
    let mut readers = Vec::new();
    let done = Arc::new(AtomicUsize::new(0));
    let total = (PUBLISHERS * PER_PUBLISHER) as u64;
    let mut first_head = 0;
    for i in 0..CLIENTS {
        let token = http.mint_token(&format!("flood-u{i}"), "web");
        let mut ws = rt.block_on(WsClient::connect(server.addr, &token, None));
        let sub = rt.block_on(ws.subscribe_ok(ROOM));
        first_head = sub["seq"].as_u64().expect("head");
        if i < STALLED {
            stalled.push(ws);
        } else {
            readers.push(rt.spawn(reader(ws, first_head, total, done.clone())));
        }
    }
    http.wait_metric_total("livegate_connections_open", CLIENTS as f64, common::WAIT);
    let rss_before = server.rss_kib();
    let open_before = metric(&http, "livegate_connections_open");

    let started = Instant::now();
    let blob = "x".repeat(EVENT_BYTES);
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|t| {
            let http = http.clone();
            let blob = blob.clone();
            std::thread::spawn(move || {
                let began = Instant::now();
                for i in 0..PER_PUBLISHER {
                    common::pace_until(began + PERIOD * i as u32, "each publisher's steady rate");
                    http.publish_ok(
                        ROOM,
                        Some(&format!("t{t}-{i}")),
                        json!({"t": t, "i": i, "blob": blob}),
                    );
                }
            })
        })
        .collect();

    // Watch the server: when it evicts (counter) and when the connection is gone (gauge).
    let mut evicted_at: Option<Duration> = None;
    let mut logged_at: Option<Duration> = None;
    let mut gone_at: Option<Duration> = None;
    let mut peak_open = 0.0f64;
    let readers_count = CLIENTS - STALLED;
    let stream_deadline = started + Duration::from_secs(120);
    common::wait_until_every(
        stream_deadline.saturating_duration_since(Instant::now()),
        Duration::from_millis(100),
        || {
            let elapsed = started.elapsed();
            if evicted_at.is_none()
                && metric(&http, "livegate_slow_consumer_closes_total")
                    .is_some_and(|n| n >= STALLED as f64)
            {
                evicted_at = Some(elapsed);
            }
            if logged_at.is_none() && server.log_text().contains("slow consumer evicted") {
                logged_at = Some(elapsed);
            }
            if let Some(open) = metric(&http, "livegate_connections_open") {
                peak_open = peak_open.max(open);
                // Readers close themselves once they have everything; count only while they read.
                if gone_at.is_none()
                    && done.load(Ordering::SeqCst) == 0
                    && open <= readers_count as f64
                {
                    gone_at = Some(elapsed);
                }
            }
            let publishing = publishers.iter().any(|p| !p.is_finished());
            let reading = done.load(Ordering::SeqCst) < readers_count;
            let waiting_eviction = gone_at.is_none()
                && evicted_at.is_none()
                && logged_at.is_none()
                && elapsed < EVICTED_WITHIN + Duration::from_secs(5);
            !publishing && !reading && !waiting_eviction
        },
    );
    for p in publishers {
        p.join().expect("publisher");
    }
    let stream_time = started.elapsed();
    let reports: Vec<ReaderReport> = rt
        .block_on(async { futures_util::future::join_all(readers).await })
        .into_iter()
        .map(|r| r.expect("reader"))
        .collect();
    // Every connection gone (readers closed, stalled ones evicted) before the RSS reading.
    common::wait_until(Duration::from_secs(5), || {
        http.metric_total("livegate_connections_open") == 0.0
    });
    let rss_after = server.rss_kib();
    let rss_peak = server.vm_kib("VmHWM");

    // What the stalled client can still read: whatever the socket buffers held, then the end.
    let mut drained = 0usize;
    let mut outcome = Vec::new();
    for ws in &mut stalled {
        let end = rt.block_on(async {
            loop {
                match ws.read_incoming(Duration::from_secs(5)).await {
                    Incoming::Json(frame) => {
                        drained += frame["events"].as_array().map_or(0, Vec::len)
                    }
                    other => break other,
                }
            }
        });
        outcome.push(end);
    }

    let mut failures = Vec::new();
    let complete = reports
        .iter()
        .filter(|r| r.got == total && r.last == first_head + total && r.errors.is_empty())
        .count();
    if complete != readers_count {
        failures.push(format!(
            "{complete} of {readers_count} reading clients got all {total} events in order"
        ));
        for (i, r) in reports.iter().enumerate().filter(|(_, r)| !r.errors.is_empty()).take(5) {
            failures
                .push(format!("reader {i}: got {} (last seq {}): {:?}", r.got, r.last, r.errors));
        }
    }
    for end in &outcome {
        match end {
            Incoming::Close(Some(4009), _) | Incoming::Ended(_) => {}
            other => failures.push(format!(
                "the stalled client was not cut off: after draining {drained} events it saw {other:?}"
            )),
        }
    }
    if drained as u64 >= total {
        failures.push(
            "the stalled client was sent every event: nothing bounded what was held for it".into(),
        );
    }
    let gone = gone_at.or(evicted_at).or(logged_at);
    match gone {
        Some(t) if t <= EVICTED_WITHIN => {}
        _ => failures.push(format!(
            "the stalled client was not gone within {EVICTED_WITHIN:?} of the stream's start (4009 counted {evicted_at:?}, \
             eviction logged {logged_at:?}, connection gone {gone_at:?})"
        )),
    }
    let growth = rss_after.saturating_sub(rss_before);
    if growth >= RSS_GROWTH_BOUND_KIB {
        failures.push(format!(
            "server RSS grew by {} MiB (bound {} MiB)",
            growth / 1024,
            RSS_GROWTH_BOUND_KIB / 1024
        ));
    }
    eprintln!(
        "{CLIENTS} clients, {STALLED} stalled, {total} events × {} KiB in {:.1} s: eviction logged after {logged_at:?}, \
         4009 counted after {:?}, connection gone after {:?} (open before {open_before:?}, peak {peak_open}); stalled client drained {drained} events then {outcome:?}; \
         server RSS {} MiB -> {} MiB (growth {} MiB, peak VmHWM {} MiB); {complete}/{readers_count} readers complete",
        EVENT_BYTES / 1024,
        stream_time.as_secs_f64(),
        evicted_at,
        gone_at,
        rss_before / 1024,
        rss_after / 1024,
        growth / 1024,
        rss_peak / 1024
    );
    drop(stalled);
    drop(rt);
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}
