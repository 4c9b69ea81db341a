//! A big room's frame handed out over every core (`actors::room::fanout`): with more
//! subscribers than the room's thread hands out alone, the real binary splits each frame
//! over its writer threads, and every subscriber still gets every event once, in order.

use crate::common;

use std::time::Duration;

use common::process::ServeProcess;
use common::*;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

/// Above the room's own-thread limit (1024), so the frames are split.
const SUBSCRIBERS: usize = 1200;
const PUBLISHERS: usize = 4;
const PER_PUBLISHER: usize = 40;
const ROOM: &str = "stadium";

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

/// Read until `last` arrives; the seqs seen out of order or twice, as errors.
async fn read_all(mut ws: WsClient, after: u64, last: u64) -> Result<(), String> {
    let mut seen = after;
    while seen < last {
        let message = tokio::time::timeout(Duration::from_secs(60), ws.ws.next())
            .await
            .map_err(|_| format!("timed out at seq {seen} of {last}"))?;
        let text = match message {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(frame))) => return Err(format!("closed at {seen}: {frame:?}")),
            Some(Ok(_)) => continue,
            other => return Err(format!("stream ended at {seen}: {other:?}")),
        };
        let frame: Frame = serde_json::from_str(&text).map_err(|e| format!("bad frame: {e}"))?;
        for event in frame.events.iter().filter(|e| frame.op == "events" && e.room == ROOM) {
            if event.seq != seen + 1 {
                return Err(format!("seq {} after {seen}", event.seq));
            }
            seen = event.seq;
        }
    }
    ws.close().await;
    Ok(())
}

#[test]
fn a_big_rooms_frames_reach_every_subscriber_once_and_in_order_over_every_core() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    // One client address for every subscriber: its per-address limits lifted (0: none).
    let server = ServeProcess::start_with_env(
        &root.path().join("data"),
        &root.path().join("serve.log"),
        &[],
        &[("LIVEGATE_MAX_CONNECTIONS_PER_IP", "0"), ("LIVEGATE_HANDSHAKES_PER_IP_PER_SEC", "0")],
    );
    let http = server.http();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut readers = Vec::new();
    let mut head = 0;
    for i in 0..SUBSCRIBERS {
        let token = http.mint_token(&format!("fan-u{i}"), "web");
        let mut ws = rt.block_on(WsClient::connect(server.addr, &token, None));
        head = rt.block_on(ws.subscribe_ok(ROOM))["seq"].as_u64().expect("head");
        assert_eq!(head, 0, "nothing published yet");
        readers.push(ws);
    }
    let last = (PUBLISHERS * PER_PUBLISHER) as u64;
    let readers: Vec<_> =
        readers.into_iter().map(|ws| rt.spawn(read_all(ws, head, last))).collect();
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|t| {
            let http = http.clone();
            std::thread::spawn(move || {
                for i in 0..PER_PUBLISHER {
                    http.publish_ok(ROOM, Some(&format!("p{t}-{i}")), json!({"t": t, "i": i}));
                }
            })
        })
        .collect();
    for publisher in publishers {
        publisher.join().expect("publisher");
    }
    let failed: Vec<String> = readers
        .into_iter()
        .enumerate()
        .filter_map(|(n, reader)| {
            rt.block_on(reader).expect("reader").err().map(|e| format!("{n}: {e}"))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {SUBSCRIBERS} subscribers: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    // On a machine with more than one core the frames went through the writer threads.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let writers = std::fs::read_dir(format!("/proc/{}/task", server.pid()))
        .expect("the server's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("livegate-fanout"))
        .count();
    assert_eq!(writers, cores - 1, "one writer thread per core but the room's own");
}
