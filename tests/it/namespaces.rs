//! Namespaces: `[[namespace]]` tables in a real config file give the rooms
//! under a prefix their own history size and age, batching window and largest event;
//! the longest matching prefix wins and other rooms keep the global keys. Checked on the
//! real `livegate serve` binary with real HTTP and WebSocket clients:
//!
//! - history size per prefix: GET events shows each room's bound, and a recovery from
//!   `since=0` is refused in the small namespace and served in a larger one (also for
//!   `chat:` against `chat:vip:`, and for inboxes under `user:`);
//! - history age per prefix: a 1 s TTL empties one namespace's history, not another's;
//! - the batching window per prefix: a calm room of a 500 ms namespace sends its event at
//!   once and holds what follows for the window, packing events into fewer frames than a
//!   0 ms namespace, one frame per publish;
//! - `max_event_bytes` per prefix: 413 in one namespace, 201 in another, over HTTP and
//!   the client `publish` op;
//! - bad tables (duplicate prefix, unknown key, out of range, no prefix) stop both
//!   `check-config` and `serve` with exit 2 and one line naming the table;
//! - `check-config` prints every namespace with its effective options.
//!
//! - the presence switch: under `presence = false` GET presence and the `presence` op
//!   answer `presence_off` and a `presence:true` subscriber gets no presence frames,
//!   while a room of another namespace counts its members.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::process::ServeProcess;
use common::*;
use serde_json::{json, Value};

/// Global keys and one namespace per behaviour under test.
const CONFIG: &str = r#"
history_size = 20
batch_window_ms = 0
max_event_bytes = 1024

[[namespace]]
prefix = "small:"
history_size = 3

[[namespace]]
prefix = "chat:"
history_size = 5

[[namespace]]
prefix = "chat:vip:"
history_size = 50

[[namespace]]
prefix = "brief:"
history_ttl_secs = 1

[[namespace]]
prefix = "batched:"
batch_window_ms = 500

[[namespace]]
prefix = "tiny:"
max_event_bytes = 64

[[namespace]]
prefix = "big:"
max_event_bytes = 8192
presence = false

[[namespace]]
prefix = "user:"
history_size = 2
"#;

struct Node {
    _dir: tempfile::TempDir,
    server: ServeProcess,
}

/// A server started with `config` written to a file in its temp dir.
fn serve(config: &str) -> Node {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("livegate.toml");
    std::fs::write(&path, config).expect("write config");
    let data = dir.path().join("data");
    let server = ServeProcess::start(
        &data,
        &dir.path().join("serve.log"),
        &["--config", &path.display().to_string()],
    );
    Node { _dir: dir, server }
}

fn publish_n(http: &Http, room: &str, n: usize) {
    for i in 1..=n {
        http.publish_ok(room, Some(&format!("{room}-{i}")), json!({"i": i}));
    }
}

/// The seqs GET events holds for `room`, and its head.
fn held(http: &Http, room: &str) -> (Vec<u64>, u64) {
    let page = http.history_ok(room, Some(0), Some(1000));
    let events = page["events"].as_array().cloned().unwrap_or_default();
    (seqs(&events), page["head"].as_u64().unwrap_or(0))
}

/// Subscribes with `since=0` and the room's epoch: `recovered`, and the replayed seqs.
async fn recover_from_zero(ws: &mut WsClient, http: &Http, room: &str) -> (bool, Vec<u64>) {
    let epoch = http.history_ok(room, Some(0), Some(1))["epoch"].clone();
    let reply = ws.subscribe_since(room, 0, &epoch).await;
    assert_eq!(reply["op"], "subscribed", "{room}: {reply}");
    let recovered =
        reply["recovered"].as_bool().unwrap_or_else(|| panic!("{room}: no recovered in {reply}"));
    let head = reply["seq"].as_u64().unwrap_or(0) as usize;
    let replay = if recovered { seqs(&ws.next_events(head).await) } else { Vec::new() };
    (recovered, replay)
}

#[tokio::test]
async fn history_size_follows_the_longest_matching_prefix() {
    let _gate = crate::common::gate!();
    let node = serve(CONFIG);
    let http = node.server.http();
    // (room, events published, seqs kept)
    let rooms: [(&str, usize, Vec<u64>); 5] = [
        ("small:a", 10, (8..=10).collect()),
        ("lobby", 10, (1..=10).collect()),
        ("chat:general", 12, (8..=12).collect()),
        ("chat:vip:1", 12, (1..=12).collect()),
        // Longer than chat: but not under chat:vip:.
        ("chat:vipx", 12, (8..=12).collect()),
    ];
    for (room, n, _) in &rooms {
        publish_n(&http, room, *n);
    }
    for (room, n, kept) in &rooms {
        assert_eq!(held(&http, room), (kept.clone(), *n as u64), "GET events of {room}");
    }
    let mut ws = WsClient::connect(node.server.addr, &http.mint_token("reader", "web"), None).await;
    for (room, n, kept) in &rooms {
        let all_kept = kept.len() == *n;
        let want = if all_kept { (true, kept.clone()) } else { (false, vec![]) };
        assert_eq!(
            recover_from_zero(&mut ws, &http, room).await,
            want,
            "recovery of {room} from 0"
        );
    }
    // Inboxes are rooms too: user: keeps 2.
    for i in 1..=4 {
        let (status, body) = http.request(
            "POST",
            "/v1/users/u1/messages",
            Auth::Key,
            Body::Json(json!({"id": format!("m{i}"), "data": {"i": i}})),
        );
        assert_eq!(status, 201, "{body}");
    }
    assert_eq!(held(&http, "user:u1"), (vec![3, 4], 4), "the inbox follows the user: namespace");
}

#[tokio::test]
async fn history_age_follows_the_namespace() {
    let _gate = crate::common::gate!();
    let node = serve(CONFIG);
    let http = node.server.http();
    publish_n(&http, "brief:a", 3);
    publish_n(&http, "lasting:a", 3);
    wait_until_every(Duration::from_secs(10), Duration::from_millis(100), || {
        held(&http, "brief:a").0.is_empty()
    });
    assert_eq!(held(&http, "brief:a"), (vec![], 3), "brief: keeps events 1 s");
    assert_eq!(held(&http, "lasting:a"), (vec![1, 2, 3], 3), "the global TTL is a day");
    let mut ws = WsClient::connect(node.server.addr, &http.mint_token("reader", "web"), None).await;
    assert_eq!(recover_from_zero(&mut ws, &http, "brief:a").await, (false, vec![]));
    assert_eq!(recover_from_zero(&mut ws, &http, "lasting:a").await, (true, vec![1, 2, 3]));
}

/// Frames of `room` until `n` events came; panics after [`WAIT`].
async fn frames_of(ws: &mut WsClient, n: usize) -> Vec<usize> {
    ws.next_event_frames(n).await.iter().map(Vec::len).collect()
}

#[tokio::test]
async fn the_batching_window_follows_the_namespace() {
    let _gate = crate::common::gate!();
    let node = serve(CONFIG);
    let http = node.server.http();
    let token = http.mint_token("reader", "web");
    let mut slow = WsClient::connect(node.server.addr, &token, None).await;
    slow.subscribe_ok("batched:1").await;
    let mut fast =
        WsClient::connect(node.server.addr, &http.mint_token("reader2", "web"), None).await;
    fast.subscribe_ok("now:1").await;

    // A calm room sends at once (the window opens with the event); what follows waits for
    // the window, 500 ms from the first (lower bound: the timer).
    let published = Instant::now();
    http.publish_ok("batched:1", None, json!({"first": true}));
    let first = slow.next_event_frames(1).await;
    let first_took = published.elapsed();
    assert!(first_took < Duration::from_millis(500), "the first event took {first_took:?}");
    assert_eq!(first.len(), 1, "alone in its frame");
    assert_eq!(first[0][0]["data"]["first"], true);
    http.publish_ok("batched:1", None, json!({"second": true}));
    let second = slow.next_events(1).await;
    let second_took = published.elapsed();
    assert!(second_took >= Duration::from_millis(500), "the second came after {second_took:?}");
    assert_eq!(second[0]["data"]["second"], true);

    // Ten publishes one after the other: window 0 sends each in its own frame (a publish
    // is answered after its event left); the 500 ms window packs them.
    publish_n(&http, "now:1", 10);
    publish_n(&http, "batched:1", 10);
    assert_eq!(frames_of(&mut fast, 10).await, vec![1; 10], "window 0: one frame per publish");
    let packed = frames_of(&mut slow, 10).await;
    assert!(
        packed.len() < 10 && packed.iter().any(|&n| n > 1),
        "500 ms window: events share frames, got {packed:?}"
    );
}

#[tokio::test]
async fn max_event_bytes_follows_the_namespace_over_http_and_the_publish_op() {
    let _gate = crate::common::gate!();
    let node = serve(CONFIG);
    let http = node.server.http();
    let text = |n: usize| json!("x".repeat(n));
    // (room, data bytes, status)
    let cases = [
        ("tiny:1", 40, 201),
        ("tiny:1", 200, 413),
        ("lobby", 200, 201),
        ("lobby", 4000, 413),
        ("big:1", 4000, 201),
        ("big:1", 9000, 413),
    ];
    for (room, bytes, want) in cases {
        let (status, body) = http.publish(room, None, text(bytes));
        assert_eq!(status, want, "{bytes} bytes to {room}: {body}");
        if want == 413 {
            assert_eq!(error_code(&body), "payload_too_large", "{body}");
        }
    }
    let (status, body) =
        http.mint_token_raw(json!({"user": "alice", "publish": ["tiny:*", "big:*"]}));
    assert_eq!(status, 201, "{body}");
    let mut alice =
        WsClient::connect(node.server.addr, body["token"].as_str().unwrap(), None).await;
    let reply = alice.request(json!({"op": "publish", "room": "tiny:1", "data": text(200)})).await;
    assert_eq!(
        (&reply["op"], &reply["code"]),
        (&json!("error"), &json!("payload_too_large")),
        "{reply}"
    );
    let reply = alice.request(json!({"op": "publish", "room": "big:1", "data": text(4000)})).await;
    assert_eq!(reply["op"], "published", "{reply}");
}

// ---------------------------------------------------------------------------------------
// check-config and bad tables
// ---------------------------------------------------------------------------------------

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the binary with `args` (no `LIVEGATE_*` variables) for at most 20 s.
fn livegate(args: &[&str], cwd: &Path) -> Ran {
    let mut cmd = Command::new(crate::common::livegate_bin());
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("LIVEGATE_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    let child = cmd.spawn().expect("spawn livegate");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(out)) => Ran {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("livegate {args:?}: {e}"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("livegate {args:?} did not finish within 20 s");
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    path
}

#[test]
fn check_config_prints_each_namespace_with_its_effective_options() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "ok.toml", CONFIG);
    let ran = livegate(
        &["check-config", "--config", &path.display().to_string(), "--history-ttl-secs", "600"],
        dir.path(),
    );
    assert_eq!(ran.code, Some(0), "stderr: {}", ran.stderr);
    let table: toml::Table =
        ran.stdout.parse().unwrap_or_else(|e| panic!("not TOML ({e}):\n{}", ran.stdout));
    let namespaces = table["namespace"].as_array().expect("namespace tables");
    let prefixes: Vec<&str> = namespaces.iter().map(|n| n["prefix"].as_str().unwrap()).collect();
    assert_eq!(
        prefixes,
        ["small:", "chat:", "chat:vip:", "brief:", "batched:", "tiny:", "big:", "user:"],
        "in file order"
    );
    let effective = |prefix: &str| {
        let n = namespaces.iter().find(|n| n["prefix"].as_str() == Some(prefix)).unwrap();
        let int =
            |key: &str| n[key].as_integer().unwrap_or_else(|| panic!("{prefix}: no {key} in {n}"));
        (
            int("history_size"),
            int("history_ttl_secs"),
            int("batch_window_ms"),
            n["presence"].as_bool().unwrap(),
            int("max_event_bytes"),
        )
    };
    // Overrides, else the global keys, whichever layer set them (the TTL is a flag here).
    assert_eq!(effective("small:"), (3, 600, 0, true, 1024));
    assert_eq!(effective("brief:"), (20, 1, 0, true, 1024));
    assert_eq!(effective("batched:"), (20, 600, 500, true, 1024));
    assert_eq!(effective("big:"), (20, 600, 0, false, 8192));
    assert!(
        ran.stdout.contains("# Namespaces: a room takes the options of the longest prefix"),
        "{}",
        ran.stdout
    );
    // What it prints is a configuration that loads again, to the same namespaces.
    let printed = write(
        dir.path(),
        "printed.toml",
        ran.stdout.replace("api_key = \"********\"", "").as_str(),
    );
    let again = livegate(&["check-config", "--config", &printed.display().to_string()], dir.path());
    assert_eq!(again.code, Some(0), "stderr: {}", again.stderr);
    let again: toml::Table = again.stdout.parse().unwrap();
    assert_eq!(again["namespace"], table["namespace"]);
}

/// The example file's namespaces (commented out there) are a valid configuration.
#[test]
fn the_example_namespaces_are_valid() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("tempdir");
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../data/livegate.example.toml"
    ))
    .unwrap();
    let (_, section) =
        example.split_once("# Namespaces:").expect("a Namespaces section in the example");
    let uncommented: String = section
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| {
            l.starts_with("[[namespace]]")
                || l.split_once(" = ").is_some_and(|(k, _)| !k.contains(' '))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let path = write(dir.path(), "example-namespaces.toml", &uncommented);
    let ran = livegate(&["check-config", "--config", &path.display().to_string()], dir.path());
    assert_eq!(ran.code, Some(0), "{uncommented}\nstderr: {}", ran.stderr);
    let table: toml::Table = ran.stdout.parse().unwrap();
    let prefixes: Vec<&str> = table["namespace"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["prefix"].as_str().unwrap())
        .collect();
    assert_eq!(prefixes, ["chat:", "scores:", "user:"], "{uncommented}");
}

#[test]
fn a_bad_namespace_table_stops_check_config_and_serve_with_a_clear_message() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "duplicate",
            "[[namespace]]\nprefix = \"chat:\"\n[[namespace]]\nprefix = \"chat:\"\nhistory_size = 3\n",
            "[[namespace]] number 2 (prefix \"chat:\"): prefix \"chat:\" is already the prefix of namespace 1",
        ),
        (
            "unknown key",
            "[[namespace]]\nprefix = \"chat:\"\nhistory = 3\n",
            "[[namespace]] number 1 (prefix \"chat:\"): unknown key `history` (known keys: prefix, history_size,",
        ),
        (
            "out of range",
            "[[namespace]]\nprefix = \"a:\"\n[[namespace]]\nprefix = \"b:\"\nbatch_window_ms = 20000\n",
            "[[namespace]] number 2 (prefix \"b:\"): batch_window_ms must be at most 10000 (10 seconds), got 20000",
        ),
        (
            "wrong type",
            "[[namespace]]\nprefix = \"chat:\"\npresence = \"off\"\n",
            "[[namespace]] number 1 (prefix \"chat:\"): presence: expected true or false, got \"off\"",
        ),
        ("no prefix", "[[namespace]]\nhistory_size = 3\n", "[[namespace]] number 1: prefix is required"),
    ];
    for (what, text, want) in cases {
        let path = write(dir.path(), &format!("{}.toml", what.replace(' ', "-")), text);
        let path = path.display().to_string();
        let data = dir.path().join(format!("data-{}", what.replace(' ', "-")));
        let data = data.display().to_string();
        let runs = [
            ("check-config", livegate(&["check-config", "--config", &path], dir.path())),
            (
                "serve",
                livegate(
                    &[
                        "serve",
                        "--config",
                        &path,
                        "--listen",
                        "127.0.0.1:0",
                        "--data-dir",
                        &data,
                        "--api-key",
                        API_KEY,
                    ],
                    dir.path(),
                ),
            ),
        ];
        for (command, ran) in runs {
            assert_eq!(
                ran.code,
                Some(2),
                "{command} with {what}: stdout {} stderr {}",
                ran.stdout,
                ran.stderr
            );
            let line = ran.stderr.trim_end();
            assert!(!line.contains('\n'), "{command} with {what}: one line, got:\n{}", ran.stderr);
            let prefix = format!("livegate: config file {path}: {want}");
            assert!(
                line.starts_with(&prefix),
                "{command} with {what}:\n got: {line}\nwant: {prefix}…"
            );
            assert!(
                ran.stdout.is_empty() || command == "serve",
                "{command} with {what}: {}",
                ran.stdout
            );
        }
    }
}

/// The next frame with `op` within `within` (other frames are skipped).
async fn next_op(ws: &mut WsClient, op: &str, within: Duration) -> Option<Value> {
    let deadline = Instant::now() + within;
    loop {
        let frame = ws.recv_within(deadline.saturating_duration_since(Instant::now())).await?;
        if frame["op"] == op {
            return Some(frame);
        }
    }
}

#[tokio::test]
async fn the_presence_switch_follows_the_namespace() {
    let _gate = crate::common::gate!();
    let node = serve(&format!("presence_interval_ms = 200\n{CONFIG}"));
    let http = node.server.http();
    let mut ws = WsClient::connect(node.server.addr, &http.mint_token("viewer", "web"), None).await;
    for room in ["big:1", "lobby"] {
        let reply = ws.request(json!({"op": "subscribe", "room": room, "presence": true})).await;
        assert_eq!(
            reply["op"], "subscribed",
            "a presence:true subscribe to {room} works either way: {reply}"
        );
    }
    // The room that keeps presence counts its member and tells the subscriber; the other
    // sends nothing, not even the first frame a presence subscriber gets.
    let mut frames = Vec::new();
    while !frames.iter().any(|f: &Value| f["room"] == "lobby" && f["count"] == 1) {
        match next_op(&mut ws, "presence", Duration::from_secs(5)).await {
            Some(frame) => frames.push(frame),
            None => panic!("no presence frame counting the lobby's member; saw {frames:?}"),
        }
    }
    assert!(frames.iter().all(|f| f["room"] == "lobby"), "only lobby keeps presence: {frames:?}");
    let (status, body) = http.request("GET", "/v1/rooms/lobby/presence", Auth::Key, Body::None);
    assert_eq!((status, body["count"].clone()), (200, json!(1)), "{body}");
    // Under presence = false: 404 presence_off over HTTP and as an op, and no frames.
    let (status, body) = http.request("GET", "/v1/rooms/big:1/presence", Auth::Key, Body::None);
    assert_eq!((status, body["error"]["code"].clone()), (404, json!("presence_off")), "{body}");
    let reply = ws.request(json!({"op": "presence", "room": "big:1"})).await;
    assert_eq!(
        (reply["op"].clone(), reply["code"].clone()),
        (json!("error"), json!("presence_off")),
        "{reply}"
    );
    let mut second =
        WsClient::connect(node.server.addr, &http.mint_token("second", "web"), None).await;
    let reply = second.request(json!({"op": "subscribe", "room": "big:1", "presence": true})).await;
    assert_eq!(reply["op"], "subscribed", "{reply}");
    let stray = next_op(&mut ws, "presence", Duration::from_millis(1000)).await;
    assert!(
        stray.is_none(),
        "no presence frames from a room whose namespace keeps none: {stray:?}"
    );
}
