//! The real binary as an operator runs it: `livegate serve` killed with SIGKILL right
//! after its last acknowledged publish, then started again on the same data dir. Every
//! acknowledged event is still there (a publish is acknowledged only once durable), with
//! the same epoch and head, the sequence goes on, and a token used before the kill stays
//! used.

use crate::common;

use std::time::Duration;

use common::process::ServeProcess;
use common::*;
use serde_json::{json, Value};

#[tokio::test]
async fn acknowledged_events_and_used_tokens_survive_kill_9() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let serve = ServeProcess::start(&data, &root.path().join("serve-1.log"), &[]);
    let http = Http::new(serve.addr);

    let used = http.mint_token("alice", "web");
    let client = WsClient::connect(serve.addr, &used, None).await;
    drop(client);

    // 4 concurrent publishers × 25 events; remember what each ack said.
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let http = http.clone();
            std::thread::spawn(move || {
                (0..25)
                    .map(|i| {
                        let id = format!("t{t}-{i}");
                        let data = json!({"t": t, "i": i});
                        let reply = http.publish_ok("durable", Some(&id), data.clone());
                        (id, data, reply)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let acked: Vec<(String, Value, Value)> =
        handles.into_iter().flat_map(|h| h.join().expect("publisher")).collect();
    let epoch = acked[0].2["epoch"].clone();
    let before = http.history_ok("durable", Some(0), Some(1000));
    assert_eq!(before["head"], 100);

    // No shutdown, no flush: SIGKILL right after the last acknowledgement.
    serve.kill9();

    let serve = ServeProcess::start(&data, &root.path().join("serve-2.log"), &[]);
    let http = Http::new(serve.addr);
    let after = http.history_ok("durable", Some(0), Some(1000));
    assert_eq!(after["epoch"], epoch, "epoch after kill -9: {after}");
    assert_eq!(after["head"], 100, "head after kill -9");
    let events = after["events"].as_array().expect("events");
    assert_eq!(events.len(), 100, "every acknowledged event survives kill -9");
    for (id, data, reply) in &acked {
        let e = events
            .iter()
            .find(|e| e["id"] == id.as_str())
            .unwrap_or_else(|| panic!("acknowledged {id} lost"));
        assert_eq!(e["seq"], reply["seq"], "{id} keeps its acknowledged seq");
        assert_eq!(&e["data"], data, "{id} keeps its data");
    }
    assert_eq!(after, before, "history after kill -9 equals history before it");

    // A retried publish is still recognised, and new ones continue the sequence.
    let (status, again) = http.publish("durable", Some("t0-0"), json!({"t": 0, "i": 0}));
    assert_eq!((status, &again["duplicate"]), (200, &json!(true)), "{again}");
    let next = http.publish_ok("durable", None, json!("next"));
    assert_eq!((&next["seq"], &next["epoch"]), (&json!(101), &epoch), "{next}");

    match WsClient::try_connect(serve.addr, Some(&used), None).await {
        Ok(_) => panic!("a token used before kill -9 must stay used"),
        Err(r) => {
            assert_eq!((r.status, error_code(&r.body)), (401, "token_replayed"), "{}", r.body)
        }
    }
}

#[tokio::test]
async fn events_acknowledged_before_a_kill_9_mid_stream_survive_with_their_seqs() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    // Keep everything, so every acknowledged event can be looked up afterwards.
    let keep_all = ["--history-size", "1000000"];
    let serve = ServeProcess::start(&data, &root.path().join("serve-1.log"), &keep_all);
    let http = Http::new(serve.addr);

    // Publishers run flat out until the server disappears under them.
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let http = http.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0.. {
                    let id = format!("t{t}-{i}");
                    let body = Body::Json(json!({"id": id, "data": {"t": t, "i": i}}));
                    match http.try_request("POST", "/v1/rooms/stream/events", Auth::Key, body) {
                        Ok((201, reply)) => acked.push((
                            id,
                            reply["seq"].as_u64().expect("seq"),
                            reply["epoch"].clone(),
                        )),
                        _ => break,
                    }
                }
                acked
            })
        })
        .collect();
    common::pace(
        Duration::from_millis(500),
        "publishers run flat out, so the kill lands among publishes in flight",
    );
    serve.kill9();
    let acked: Vec<(String, u64, Value)> =
        handles.into_iter().flat_map(|h| h.join().expect("publisher")).collect();
    assert!(acked.len() >= 10, "publishers got only {} acks before the kill", acked.len());

    let serve = ServeProcess::start(&data, &root.path().join("serve-2.log"), &keep_all);
    let http = Http::new(serve.addr);
    let mut events: Vec<Value> = Vec::new();
    let (epoch, head) = loop {
        let page = http.history_ok("stream", Some(events.len() as u64), Some(1000));
        let got = page["events"].as_array().expect("events").clone();
        let head = page["head"].as_u64().expect("head");
        let done = got.is_empty() || events.len() as u64 + got.len() as u64 >= head;
        events.extend(got);
        if done {
            break (page["epoch"].clone(), head);
        }
    };
    assert_eq!(
        seqs(&events),
        (1..=head).collect::<Vec<_>>(),
        "history after kill -9 is 1..=head without holes"
    );
    let max_acked = acked.iter().map(|a| a.1).max().expect("acks");
    assert!(
        head >= max_acked,
        "head {head} after restart is below the highest acknowledged seq {max_acked}"
    );
    for (id, seq, acked_epoch) in &acked {
        assert_eq!(&epoch, acked_epoch, "epoch of acknowledged {id}");
        let e = &events[(*seq - 1) as usize];
        assert_eq!(e["id"], id.as_str(), "seq {seq} was acknowledged for {id}, history has {e}");
    }
    eprintln!("{} acknowledged before kill -9; head {head} after restart", acked.len());
}

/// `/v1/admin/status` of `http` until `sessions_stored` is `stored`; the status then.
fn wait_stored(http: &Http, stored: u64, within: Duration) -> Value {
    let mut last = Value::Null;
    common::wait_for_every(within, Duration::from_millis(50), || {
        let (code, status) = http.request("GET", "/v1/admin/status", Auth::Key, Body::None);
        assert_eq!(code, 200, "{status}");
        last = status;
        (last["sessions_stored"] == stored).then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("expected {stored} stored sessions within {within:?}: {last}"))
}

#[tokio::test]
async fn a_session_connected_at_a_kill_9_expires_a_ttl_after_the_restart_not_before() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let flags = ["--session-ttl-secs", "4", "--warmup-secs", "30"];
    let serve = ServeProcess::start(&data, &root.path().join("serve-1.log"), &flags);
    let http = Http::new(serve.addr);
    let connected = WsClient::connect(serve.addr, &http.mint_token("u1", "web"), None).await;
    let left = WsClient::connect(serve.addr, &http.mint_token("u2", "web"), None).await;
    let (s1, s2) = (connected.session().to_string(), left.session().to_string());
    left.close().await;
    let status = wait_stored(&http, 2, Duration::from_secs(5));
    assert_eq!(status["sessions_live"], 1, "{status}");
    common::let_time_pass(
        Duration::from_millis(2500),
        "u2's 4 s session TTL runs 2.5 s before the kill",
    );
    serve.kill9();
    drop(connected);

    let serve = ServeProcess::start(&data, &root.path().join("serve-2.log"), &flags);
    let restarted = std::time::Instant::now();
    let http = Http::new(serve.addr);
    // u2 left 2.5 s before the kill: gone 1.5 s after the restart. u1 was connected when
    // the process died: its TTL counts from the restart.
    wait_stored(&http, 1, Duration::from_secs(8));
    let back = WsClient::connect(serve.addr, &http.mint_token("u1", "web"), Some(&s1)).await;
    assert!(
        restarted.elapsed() < Duration::from_millis(3500),
        "the reconnect must come within the TTL; test machine too slow"
    );
    assert_eq!(
        back.session(),
        s1,
        "connected at the kill, so kept for a TTL after the restart: {}",
        back.welcome
    );
    let late = WsClient::connect(serve.addr, &http.mint_token("u2", "web"), Some(&s2)).await;
    assert_ne!(late.session(), s2, "expired: {}", late.welcome);
    back.close().await;
    late.close().await;
    wait_stored(&http, 0, Duration::from_secs(10));
}

/// Reconcile before traffic, single node: a process killed with two sessions connected
/// starts again on the same data dir; resume handshakes sent from its listening line on
/// are refused (503 `unavailable`, the token unspent) until `/readyz` is 200, the first
/// one admitted resumes its session, the killed run's sessions count as closed (stored,
/// not live), and the other one resumes too.
#[tokio::test]
async fn a_restart_after_kill_9_admits_no_handshake_before_ready_and_counts_the_killed_runs_sessions_closed(
) {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let flags = ["--warmup-secs", "30"];
    let serve = ServeProcess::start(&data, &root.path().join("serve-1.log"), &flags);
    let http = Http::new(serve.addr);
    let one = WsClient::connect(serve.addr, &http.mint_token("u1", "web"), None).await;
    let two = WsClient::connect(serve.addr, &http.mint_token("u2", "web"), None).await;
    let (s1, s2) = (one.session().to_string(), two.session().to_string());
    let (back1, back2) = (http.mint_token("u1", "web"), http.mint_token("u2", "web"));
    let status = wait_stored(&http, 2, Duration::from_secs(5));
    assert_eq!(status["sessions_live"], 2, "{status}");
    serve.kill9();
    drop((one, two));

    let mut serve = ServeProcess::start_named_listening(
        &data,
        &root.path().join("serve-2.log"),
        NODE,
        &flags,
        &[],
    );
    let start =
        common::process::handshakes_through_start(serve.addr, &back1, &s1, Duration::from_secs(20))
            .await;
    serve.wait_ready();
    assert!(start.failures.is_empty(), "{:?}\nlog:\n{}", start.failures, serve.log_text());
    // (A single node's start takes well under a millisecond here, so the first handshake
    // usually finds it ready; cluster::sessions has the start that a handshake meets.)
    eprintln!("handshakes refused while starting: {}", start.refused_unready);
    let resumed = start.admitted.expect("admitted");
    assert_eq!(resumed.session(), s1, "the killed run's session resumes: {}", resumed.welcome);
    let http = Http::new(serve.addr);
    let status = wait_stored(&http, 2, Duration::from_secs(5));
    assert_eq!(status["sessions_live"], 1, "only the resumed session is connected: {status}");
    let other = WsClient::connect(serve.addr, &back2, Some(&s2)).await;
    assert_eq!(other.session(), s2, "{}", other.welcome);
}
