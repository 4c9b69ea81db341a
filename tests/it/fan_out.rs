//! A big room's frame handed out over every core (`actors::room::fanout`): with more
//! subscribers than the room's thread hands out alone, the real binary splits each frame
//! over its writer threads, and every subscriber still gets every event once, in order.

use crate::common;

use std::time::Duration;

use common::process::ServeProcess;
use common::*;
use serde_json::json;

/// Above the room's own-thread limit (1024), so the frames are split.
const SUBSCRIBERS: usize = 1200;
const PUBLISHERS: usize = 4;
const PER_PUBLISHER: usize = 40;
const ROOM: &str = "stadium";

/// Read until `last` arrives; what came out of order, twice, or not at all, as errors.
async fn read_all(mut ws: WsClient, last: u64) -> Vec<String> {
    let (mut seen, mut events, mut errors) = (0, Vec::new(), Vec::new());
    while seen < last && errors.is_empty() {
        match ws.recv_within(Duration::from_secs(60)).await {
            Some(frame) => take_events(&frame, ROOM, &mut seen, &mut events, &mut errors),
            None => errors.push(format!("nothing within 60 s at seq {seen} of {last}")),
        }
    }
    ws.close().await;
    errors
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
    for i in 0..SUBSCRIBERS {
        let token = http.mint_token(&format!("fan-u{i}"), "web");
        let mut ws = rt.block_on(WsClient::connect(server.addr, &token, None));
        let head = &rt.block_on(ws.subscribe_ok(ROOM))["seq"];
        assert_eq!(head, 0, "nothing published yet");
        readers.push(ws);
    }
    let last = (PUBLISHERS * PER_PUBLISHER) as u64;
    let readers: Vec<_> = readers.into_iter().map(|ws| rt.spawn(read_all(ws, last))).collect();
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
            let errors = rt.block_on(reader).expect("reader");
            (!errors.is_empty()).then(|| format!("{n}: {errors:?}"))
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
