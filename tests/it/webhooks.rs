//! Webhooks against a real local HTTP receiver and the real binary: every
//! webhook arrives at least once, signed, in order per room (occupied before the room's
//! client publishes before vacated), also when the receiver fails the first attempts and
//! when livegate is stopped (SIGTERM, then kill -9) with webhooks still queued; the queue
//! bound drops new webhooks and counts them on /metrics; a 4xx makes one webhook a dead
//! letter and its room goes on; a webhook out of attempts is a dead letter, listed through
//! the admin API, kept over a restart and replayed exactly once; the dead-letter list's
//! bound drops the oldest; a bad webhook config stops the start with a clear error.
//!
//! The receiver is a small HTTP/1.1 server on a std `TcpListener` (keep-alive, one thread
//! per connection) that checks every request's signature and records every attempt with
//! the status it answered, from a policy the test sets and changes.

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cluster::cells::livegate_cli;
use common::process::{metric, ServeProcess};
use common::*;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

const SECRET: &str = "webhook-test-secret";
/// How long every webhook may take to arrive once the receiver takes them (retries wait
/// up to 0.5 s, 1 s, 2 s, ... with full jitter).
const ARRIVE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// The receiver
// ---------------------------------------------------------------------------------------

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Attempt {
    id_header: String,
    body: Value,
    raw: String,
    signature_ok: bool,
    user_agent: String,
    content_type: String,
    status: u16,
    /// When the receiver read it (ms since the epoch).
    at_ms: u64,
}

/// What to answer: given the body and how many attempts of its id came before.
type Policy = Box<dyn Fn(&Value, usize) -> u16 + Send>;

struct Shared {
    policy: Policy,
    attempts: Vec<Attempt>,
    per_id: HashMap<String, usize>,
}

struct Receiver {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
}

impl Receiver {
    fn start(policy: Policy) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let addr = listener.local_addr().unwrap();
        let shared =
            Arc::new(Mutex::new(Shared { policy, attempts: Vec::new(), per_id: HashMap::new() }));
        let accepting = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let shared = accepting.clone();
                std::thread::spawn(move || serve_connection(stream, shared));
            }
        });
        Receiver { addr, shared }
    }

    fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    fn set_policy(&self, policy: Policy) {
        self.shared.lock().unwrap().policy = policy;
    }

    fn attempts(&self) -> Vec<Attempt> {
        self.shared.lock().unwrap().attempts.clone()
    }

    /// The attempts answered 2xx.
    fn delivered(&self) -> Vec<Attempt> {
        self.attempts().into_iter().filter(|a| (200..300).contains(&a.status)).collect()
    }

    /// Waits until `done` holds for the delivered attempts; panics after `within`.
    fn wait_delivered(
        &self,
        within: Duration,
        what: &str,
        done: impl Fn(&[Attempt]) -> bool,
    ) -> Vec<Attempt> {
        wait_for_every(within, Duration::from_millis(20), || {
            Some(self.delivered()).filter(|d| done(d))
        })
        .unwrap_or_else(|| {
            panic!(
                "{what} not delivered within {within:?}; attempts: {:#?}",
                summary(&self.attempts())
            )
        })
    }
}

fn summary(attempts: &[Attempt]) -> Vec<String> {
    attempts
        .iter()
        .map(|a| format!("{} {} {} {}", a.status, a.body["room"], a.body["type"], a.body["id"]))
        .collect()
}

fn sign(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// HTTP/1.1 with keep-alive: requests with a Content-Length body, answered with an empty
/// body, until the client closes.
fn serve_connection(stream: TcpStream, shared: Arc<Mutex<Shared>>) {
    let mut writer = stream.try_clone().expect("clone the receiver's stream");
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = HashMap::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        let length: usize = headers.get("content-length").and_then(|n| n.parse().ok()).unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let raw = String::from_utf8_lossy(&body).to_string();
        let parsed: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
        let header = |name: &str| headers.get(name).cloned().unwrap_or_default();
        let status = {
            let mut shared = shared.lock().unwrap();
            let id = parsed["id"].as_str().unwrap_or("").to_string();
            let before = *shared.per_id.get(&id).unwrap_or(&0);
            shared.per_id.insert(id, before + 1);
            let status = if line.starts_with("POST /hooks ") {
                (shared.policy)(&parsed, before)
            } else {
                404
            };
            shared.attempts.push(Attempt {
                id_header: header("x-livegate-id"),
                signature_ok: header("x-livegate-signature") == sign(&body),
                user_agent: header("user-agent"),
                content_type: header("content-type"),
                body: parsed,
                raw,
                status,
                at_ms: now_ms(),
            });
            status
        };
        let answer = format!(
            "HTTP/1.1 {status} Whatever\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
        );
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Answer 500 to the first `n` attempts of every webhook, then 200.
fn fail_first(n: usize) -> Policy {
    Box::new(move |_, before| if before < n { 500 } else { 200 })
}

fn always(status: u16) -> Policy {
    Box::new(move |_, _| status)
}

// ---------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------

/// What a test expects of a room: each webhook's type (and for a client publish its seq).
fn expect(list: &[(&str, &str)]) -> BTreeMap<String, Vec<String>> {
    let mut rooms: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (room, what) in list {
        rooms.entry(room.to_string()).or_default().push(what.to_string());
    }
    rooms
}

/// A webhook as the expectation names it: its type, `client_published:SEQ` for a publish.
fn label(body: &Value) -> String {
    match body["type"].as_str() {
        Some("client_published") => format!("client_published:{}", body["seq"]),
        Some(kind) => kind.to_string(),
        None => format!("{body}"),
    }
}

/// Each room's webhooks in the order of their first delivery, one entry per id.
fn first_deliveries(delivered: &[Attempt]) -> BTreeMap<String, Vec<String>> {
    let mut seen = HashSet::new();
    let mut rooms: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for attempt in delivered {
        if seen.insert(attempt.body["id"].as_str().unwrap_or("").to_string()) {
            rooms
                .entry(attempt.body["room"].as_str().unwrap_or("?").to_string())
                .or_default()
                .push(label(&attempt.body));
        }
    }
    rooms
}

/// Every attempt was signed and well formed, and no room's webhook was attempted before
/// the room's earlier ones were delivered (or given up, listed in `given_up`).
fn check_attempts(attempts: &[Attempt], given_up: &[String]) {
    let mut delivered: HashSet<String> = given_up.iter().cloned().collect();
    let mut seen_by_room: HashMap<String, Vec<String>> = HashMap::new();
    for attempt in attempts {
        let body = &attempt.body;
        assert!(attempt.signature_ok, "bad signature on {}", attempt.raw);
        let id =
            body["id"].as_str().unwrap_or_else(|| panic!("no id: {}", attempt.raw)).to_string();
        assert_eq!(attempt.id_header, id, "X-Livegate-Id is the body's id: {}", attempt.raw);
        assert!(attempt.user_agent.starts_with("livegate/"), "user agent {:?}", attempt.user_agent);
        assert_eq!(attempt.content_type, "application/json");
        assert_eq!(body["node"], NODE, "{}", attempt.raw);
        assert!(body["ts_ms"].as_u64().is_some_and(|ts| ts > 1_700_000_000_000), "{}", attempt.raw);
        let room = body["room"].as_str().unwrap_or("").to_string();
        assert!(
            !room.starts_with("user:"),
            "an inbox never has occupancy webhooks: {}",
            attempt.raw
        );
        let earlier = seen_by_room.entry(room.clone()).or_default();
        if !earlier.contains(&id) {
            for before in earlier.iter() {
                assert!(
                    delivered.contains(before),
                    "room {room}: {id} attempted before {before} was delivered; attempts: {:#?}",
                    summary(attempts)
                );
            }
            earlier.push(id.clone());
        }
        if (200..300).contains(&attempt.status) {
            delivered.insert(id);
        }
    }
}

// ---------------------------------------------------------------------------------------
// livegate
// ---------------------------------------------------------------------------------------

fn serve(root: &std::path::Path, log: &str, receiver: &Receiver, extra: &[&str]) -> ServeProcess {
    let url = receiver.url();
    let mut flags = vec![
        "--webhook-url",
        url.as_str(),
        "--webhook-secret",
        SECRET,
        // A quick SIGTERM: no drain wait, one second of grace.
        "--drain-wait-secs",
        "0",
        "--drain-spread-secs",
        "0",
        "--drain-grace-secs",
        "1",
    ];
    flags.extend_from_slice(extra);
    ServeProcess::start(&root.join("data"), &root.join(log), &flags)
}

/// A connection of `user` whose token may publish to `chat:*`.
async fn chatter(addr: SocketAddr, user: &str) -> WsClient {
    let (status, body) =
        Http::new(addr).mint_token_raw(json!({"user": user, "publish": ["chat:*"]}));
    assert_eq!(status, 201, "{body}");
    WsClient::connect(addr, body["token"].as_str().unwrap(), None).await
}

async fn publish(client: &mut WsClient, room: &str, id: Option<&str>, data: Value) -> u64 {
    let mut op = json!({"op": "publish", "room": room, "data": data});
    if let Some(id) = id {
        op["id"] = json!(id);
    }
    let reply = client.request(op).await;
    assert_eq!(reply["op"], "published", "{reply}");
    reply["seq"].as_u64().unwrap()
}

fn wait_metric(http: &Http, name: &str, want: f64, serve: &ServeProcess) {
    let mut got = None;
    let reached = wait_until_every(WAIT, Duration::from_millis(20), || {
        got = metric(http, name);
        got == Some(want)
    });
    assert!(reached, "{name} is {got:?}, not {want}, after {WAIT:?}; log:\n{}", serve.log_text());
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn every_webhook_arrives_signed_and_in_order_per_room_through_failures() {
    let _gate = crate::common::gate!();
    let receiver = Receiver::start(fail_first(2));
    let root = tempfile::tempdir().unwrap();
    let serve = serve(root.path(), "serve.log", &receiver, &[]);
    let http = serve.http();

    let mut alice = chatter(serve.addr, "alice").await;
    for room in ["chat:a", "chat:b", "lobby"] {
        alice.subscribe_ok(room).await;
    }
    let s1 = publish(&mut alice, "chat:a", Some("e-1"), json!({"text": "hi", "n": [1, 2]})).await;
    let s2 = publish(&mut alice, "chat:a", None, json!("second")).await;
    let s3 = publish(&mut alice, "chat:b", Some("e-3"), json!({"b": true})).await;
    // A publish by a connection not subscribed to the room (bob only publishes).
    let mut bob = chatter(serve.addr, "bob").await;
    let s4 = publish(&mut bob, "chat:b", None, json!(4)).await;
    // A duplicate is the same event: no second webhook.
    let reply =
        alice.request(json!({"op": "publish", "room": "chat:a", "id": "e-1", "data": {}})).await;
    assert_eq!(reply["duplicate"], true, "{reply}");
    let unsubscribed = alice.unsubscribe("chat:a").await;
    assert_eq!(unsubscribed["op"], "unsubscribed", "{unsubscribed}");
    // Closing the connection vacates the rest.
    alice.close().await;
    bob.close().await;

    let want = expect(&[
        ("chat:a", "room_occupied"),
        ("chat:a", &format!("client_published:{s1}")),
        ("chat:a", &format!("client_published:{s2}")),
        ("chat:a", "room_vacated"),
        ("chat:b", "room_occupied"),
        ("chat:b", &format!("client_published:{s3}")),
        ("chat:b", &format!("client_published:{s4}")),
        ("chat:b", "room_vacated"),
        ("lobby", "room_occupied"),
        ("lobby", "room_vacated"),
    ]);
    let delivered =
        receiver.wait_delivered(ARRIVE, "every webhook", |d| first_deliveries(d) == want);
    assert_eq!(first_deliveries(&delivered), want);
    let attempts = receiver.attempts();
    check_attempts(&attempts, &[]);
    assert_eq!(
        attempts.len(),
        delivered.len() * 3,
        "each answered 500 twice, then 200: {:#?}",
        summary(&attempts)
    );

    // The client publishes carry who, from where, which event and its data.
    let published: Vec<&Value> =
        delivered.iter().map(|a| &a.body).filter(|b| b["type"] == "client_published").collect();
    let by_seq = |room: &str, seq: u64| {
        *published.iter().find(|b| b["room"] == room && b["seq"] == seq).expect("published webhook")
    };
    let first = by_seq("chat:a", s1);
    assert_eq!(
        (&first["user"], &first["device"], &first["event_id"], &first["data"]),
        (&json!("alice"), &json!("web"), &json!("e-1"), &json!({"text": "hi", "n": [1, 2]})),
        "{first}"
    );
    let second = by_seq("chat:a", s2);
    assert_eq!(
        (second.get("event_id"), &second["data"]),
        (None, &json!("second")),
        "no event_id when the client gave none: {second}"
    );
    assert_eq!(by_seq("chat:b", s4)["user"], "bob");
    let occupied = delivered.iter().find(|a| a.body["type"] == "room_occupied").unwrap();
    let keys: Vec<&String> = occupied.body.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 5, "id, type, room, ts_ms, node: {}", occupied.raw);

    // Every body is what the served OpenAPI document's `webhooks` says of its type: each
    // required field there, no field it does not name.
    let (status, document) = http.request("GET", "/openapi.json", Auth::None, Body::None);
    assert_eq!(status, 200);
    for attempt in &delivered {
        let schema = match attempt.body["type"].as_str() {
            Some("room_occupied") => "RoomOccupiedWebhook",
            Some("room_vacated") => "RoomVacatedWebhook",
            Some("client_published") => "ClientPublishedWebhook",
            other => panic!("undocumented webhook type {other:?}: {}", attempt.raw),
        };
        let schema = &document["components"]["schemas"][schema];
        let documented =
            schema["properties"].as_object().unwrap_or_else(|| panic!("no schema {schema}"));
        let fields = attempt.body.as_object().unwrap();
        for required in schema["required"].as_array().unwrap() {
            assert!(
                fields.contains_key(required.as_str().unwrap()),
                "{required} missing from {}",
                attempt.raw
            );
        }
        for field in fields.keys() {
            assert!(
                documented.contains_key(field),
                "{field} is not in the OpenAPI document's webhook: {}",
                attempt.raw
            );
        }
    }

    wait_metric(&http, "livegate_webhooks_queued", 0.0, &serve);
    assert_eq!(metric(&http, "livegate_webhooks_delivered_total"), Some(10.0));
    assert_eq!(metric(&http, "livegate_webhook_attempts_failed_total"), Some(20.0));
    assert_eq!(metric(&http, "livegate_webhooks_dropped_total"), Some(0.0));
}

#[tokio::test]
async fn webhooks_queued_while_the_receiver_fails_arrive_after_sigterm_and_kill_9() {
    let _gate = crate::common::gate!();
    let receiver = Receiver::start(always(503));
    let root = tempfile::tempdir().unwrap();

    // First run: webhooks pile up, then SIGTERM; the drain vacates the rooms still
    // subscribed, and those webhooks are queued too.
    let mut serve1 = serve(root.path(), "serve-1.log", &receiver, &[]);
    let mut alice = chatter(serve1.addr, "alice").await;
    alice.subscribe_ok("chat:one").await;
    alice.subscribe_ok("chat:two").await;
    let a1 = publish(&mut alice, "chat:one", Some("one-1"), json!(1)).await;
    let b1 = publish(&mut alice, "chat:two", None, json!(2)).await;
    alice.unsubscribe("chat:one").await;
    wait_metric(&serve1.http(), "livegate_webhooks_queued", 5.0, &serve1);
    serve1.signal("TERM");
    let _ = alice.close_code().await;
    assert!(
        serve1.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()),
        "SIGTERM ends the process; log:\n{}",
        serve1.log_text()
    );
    assert!(receiver.delivered().is_empty());

    // Second run: the queue is read back (6: chat:two was vacated by the drain); more
    // webhooks join it; then kill -9.
    let serve2 = serve(root.path(), "serve-2.log", &receiver, &[]);
    wait_metric(&serve2.http(), "livegate_webhooks_queued", 6.0, &serve2);
    let mut alice = chatter(serve2.addr, "alice").await;
    alice.subscribe_ok("chat:two").await;
    let b2 = publish(&mut alice, "chat:two", Some("two-2"), json!({"again": true})).await;
    alice.subscribe_ok("chat:three").await;
    let c1 = publish(&mut alice, "chat:three", None, json!(3)).await;
    wait_metric(&serve2.http(), "livegate_webhooks_queued", 10.0, &serve2);
    // Let the group flush asked for by the last enqueue finish (nothing tells which flush
    // made a given enqueue durable).
    let_time_pass(Duration::from_millis(500), "the group flush after the last webhook enqueue");
    serve2.kill9();
    drop(alice);

    // Third run, and the receiver takes webhooks again: everything arrives, in order per
    // room, each room's earlier runs first; the rooms the kill left occupied are vacated
    // (nobody can be subscribed to them at start), so every occupied has its vacated.
    receiver.set_policy(always(200));
    let serve3 = serve(root.path(), "serve-3.log", &receiver, &[]);
    let want = expect(&[
        ("chat:one", "room_occupied"),
        ("chat:one", &format!("client_published:{a1}")),
        ("chat:one", "room_vacated"),
        ("chat:two", "room_occupied"),
        ("chat:two", &format!("client_published:{b1}")),
        ("chat:two", "room_vacated"),
        ("chat:two", "room_occupied"),
        ("chat:two", &format!("client_published:{b2}")),
        ("chat:two", "room_vacated"),
        ("chat:three", "room_occupied"),
        ("chat:three", &format!("client_published:{c1}")),
        ("chat:three", "room_vacated"),
    ]);
    let delivered =
        receiver.wait_delivered(ARRIVE, "the queued webhooks", |d| first_deliveries(d) == want);
    assert_eq!(first_deliveries(&delivered), want);
    check_attempts(&receiver.attempts(), &[]);
    wait_metric(&serve3.http(), "livegate_webhooks_queued", 0.0, &serve3);
    assert!(serve3.log_text().contains("webhooks resumed from the store"), "{}", serve3.log_text());
    assert!(serve3.log_text().contains("a previous run left occupied"), "{}", serve3.log_text());
    // Once vacated, they are not vacated again at the next start.
    drop(serve3);
    let serve4 = serve(root.path(), "serve-4.log", &receiver, &[]);
    let_time_pass(
        Duration::from_millis(500),
        "nothing is queued for the rooms after a clean restart",
    );
    assert_eq!(
        metric(&serve4.http(), "livegate_webhooks_queued"),
        Some(0.0),
        "{}",
        serve4.log_text()
    );
    assert_eq!(first_deliveries(&receiver.delivered()), want, "nothing new after a clean restart");
}

#[tokio::test]
async fn a_full_queue_drops_new_webhooks_and_counts_them() {
    let _gate = crate::common::gate!();
    let receiver = Receiver::start(always(500));
    let root = tempfile::tempdir().unwrap();
    let serve = serve(root.path(), "serve.log", &receiver, &["--webhook-queue-max", "3"]);
    let http = serve.http();
    let mut alice = chatter(serve.addr, "alice").await;
    for room in ["r1", "r2", "r3", "r4", "r5"] {
        alice.subscribe_ok(room).await;
    }
    wait_metric(&http, r#"livegate_webhooks_dropped_total{reason="queue_full"}"#, 2.0, &serve);
    assert_eq!(metric(&http, "livegate_webhooks_queued"), Some(3.0));
    let log = serve.log_text();
    assert!(
        log.contains("webhook queue full") && log.contains("r4") && log.contains("r5"),
        "a warning names the dropped ones:\n{log}"
    );

    // The receiver recovers: the three queued ones arrive, the dropped ones never do.
    receiver.set_policy(always(200));
    let want = expect(&[("r1", "room_occupied"), ("r2", "room_occupied"), ("r3", "room_occupied")]);
    receiver.wait_delivered(ARRIVE, "the queued webhooks", |d| first_deliveries(d) == want);
    wait_metric(&http, "livegate_webhooks_queued", 0.0, &serve);
    let_time_pass(QUIET, "nothing arrives for the dropped r4 and r5");
    assert_eq!(first_deliveries(&receiver.delivered()), want, "nothing for r4 and r5");
    // With room again, new webhooks are queued.
    alice.unsubscribe("r4").await;
    let want = expect(&[
        ("r1", "room_occupied"),
        ("r2", "room_occupied"),
        ("r3", "room_occupied"),
        ("r4", "room_vacated"),
    ]);
    receiver.wait_delivered(ARRIVE, "r4's vacated", |d| first_deliveries(d) == want);
    check_attempts(&receiver.attempts(), &[]);
}

#[tokio::test]
async fn a_4xx_dead_letters_that_webhook_and_its_room_goes_on() {
    let _gate = crate::common::gate!();
    // Every client publish is refused for good (410); occupancy webhooks are taken.
    let receiver =
        Receiver::start(Box::new(
            |body, _| if body["type"] == "client_published" { 410 } else { 200 },
        ));
    let root = tempfile::tempdir().unwrap();
    let serve = serve(root.path(), "serve.log", &receiver, &[]);
    let http = serve.http();
    let mut alice = chatter(serve.addr, "alice").await;
    alice.subscribe_ok("chat:x").await;
    let seq = publish(&mut alice, "chat:x", None, json!(1)).await;
    alice.unsubscribe("chat:x").await;
    let want = expect(&[("chat:x", "room_occupied"), ("chat:x", "room_vacated")]);
    receiver.wait_delivered(ARRIVE, "occupied and vacated", |d| first_deliveries(d) == want);
    let attempts = receiver.attempts();
    let refused: Vec<&Attempt> = attempts.iter().filter(|a| a.status == 410).collect();
    assert_eq!(refused.len(), 1, "a 4xx is not retried: {:#?}", summary(&attempts));
    assert_eq!(refused[0].body["seq"], seq);
    check_attempts(&attempts, &[refused[0].body["id"].as_str().unwrap().to_string()]);
    wait_metric(&http, r#"livegate_webhooks_dead_lettered_total{reason="rejected"}"#, 1.0, &serve);
    assert!(
        serve.log_text().contains("webhook given up: kept as a dead letter"),
        "{}",
        serve.log_text()
    );
    // Refused once, never retried: a dead letter after its one attempt.
    let listed = dead_letters(&http, None);
    let letters = listed["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len(), 1, "{listed}");
    let letter = &letters[0];
    assert_eq!(
        (
            &letter["id"],
            &letter["type"],
            &letter["room"],
            &letter["attempts"],
            &letter["reason"],
            &letter["last_error"]
        ),
        (
            &refused[0].body["id"],
            &json!("client_published"),
            &json!("chat:x"),
            &json!(1),
            &json!("rejected"),
            &json!("HTTP 410")
        ),
        "{letter}"
    );
    assert_eq!(
        metric(&http, r#"livegate_webhooks_dropped_total"#),
        Some(0.0),
        "a dead letter is not a dropped webhook"
    );
}

#[tokio::test]
async fn a_publish_from_a_connection_that_closes_at_once_still_has_its_webhook() {
    let _gate = crate::common::gate!();
    let receiver = Receiver::start(always(200));
    let root = tempfile::tempdir().unwrap();
    let serve = serve(root.path(), "serve.log", &receiver, &[]);
    let http = serve.http();
    let mut alice = chatter(serve.addr, "alice").await;
    // No subscription, no answer awaited: the publish op, then the socket is gone.
    alice
        .send_json(&json!({"op": "publish", "room": "chat:gone", "id": "g-1", "data": {"bye": 1}}))
        .await;
    drop(alice);
    let stored = wait_until_every(WAIT, Duration::from_millis(20), || {
        http.history_ok("chat:gone", Some(0), Some(10))["head"] == 1
    });
    assert!(stored, "a publish op read before the close is stored; log:\n{}", serve.log_text());
    let want = expect(&[("chat:gone", "client_published:1")]);
    let delivered = receiver
        .wait_delivered(ARRIVE, "the closed connection's publish", |d| first_deliveries(d) == want);
    assert_eq!(delivered[0].body["event_id"], "g-1");
}

/// The occupancy webhooks of `room` delivered so far, in order (one per id).
fn occupancy_of(receiver: &Receiver, room: &str) -> Vec<String> {
    first_deliveries(&receiver.delivered()).remove(room).unwrap_or_default()
}

#[tokio::test]
async fn a_subscribe_loop_and_a_reload_make_one_occupied_and_one_vacated() {
    let _gate = crate::common::gate!();
    let receiver = Receiver::start(always(200));
    let root = tempfile::tempdir().unwrap();
    let serve = serve(root.path(), "serve.log", &receiver, &[]);
    let (occupied, vacated) = ("room_occupied".to_string(), "room_vacated".to_string());

    // 50 subscribe/unsubscribe pairs: one room_occupied, and one room_vacated once the
    // room has stayed empty for `webhook_vacated_delay_ms` (3 s by default).
    let mut alice = chatter(serve.addr, "alice").await;
    for _ in 0..50 {
        alice.subscribe_ok("chat:loop").await;
        alice.unsubscribe("chat:loop").await;
    }
    receiver.wait_delivered(ARRIVE, "the loop's room_occupied", |_| {
        !occupancy_of(&receiver, "chat:loop").is_empty()
    });
    let_time_pass(Duration::from_secs(1), "within the 3 s vacated delay nothing else is sent");
    assert_eq!(
        occupancy_of(&receiver, "chat:loop"),
        std::slice::from_ref(&occupied),
        "nothing else within the delay"
    );
    receiver.wait_delivered(ARRIVE, "the loop's room_vacated", |_| {
        occupancy_of(&receiver, "chat:loop").len() >= 2
    });
    let_time_pass(QUIET, "no second room_vacated follows");
    assert_eq!(
        occupancy_of(&receiver, "chat:loop"),
        [occupied.clone(), vacated.clone()],
        "{}",
        serve.log_text()
    );

    // A reload: the page's connection closes and a new one subscribes again within the
    // delay. Past the delay, neither hook was sent.
    let mut page = chatter(serve.addr, "bob").await;
    page.subscribe_ok("chat:reload").await;
    receiver.wait_delivered(ARRIVE, "the reload room's room_occupied", |_| {
        !occupancy_of(&receiver, "chat:reload").is_empty()
    });
    page.close().await;
    let mut page = chatter(serve.addr, "bob").await;
    page.subscribe_ok("chat:reload").await;
    let_time_pass(
        Duration::from_millis(3500),
        "past the 3 s vacated delay, a reload sent no webhook",
    );
    assert_eq!(
        occupancy_of(&receiver, "chat:reload"),
        std::slice::from_ref(&occupied),
        "a reload sends no webhook"
    );
    let left = now_ms();
    page.close().await;
    receiver.wait_delivered(ARRIVE, "the reload room's room_vacated", |_| {
        occupancy_of(&receiver, "chat:reload").len() >= 2
    });
    assert_eq!(occupancy_of(&receiver, "chat:reload"), [occupied, vacated]);
    // The room_vacated tells when the room was left, not when the delay ran out.
    let told = receiver
        .delivered()
        .iter()
        .find(|a| a.body["room"] == "chat:reload" && a.body["type"] == "room_vacated")
        .unwrap()
        .body
        .clone();
    let ts = told["ts_ms"].as_u64().unwrap();
    assert!(ts >= left && ts < left + 1000, "room_vacated ts_ms {ts}, left at {left}");
    check_attempts(&receiver.attempts(), &[]);
    assert_eq!(metric(&serve.http(), "livegate_webhooks_dropped_total"), Some(0.0));
}

#[tokio::test]
async fn a_client_published_webhook_carries_the_data_as_the_client_sent_it() {
    let _gate = crate::common::gate!();
    let receiver = Receiver::start(always(200));
    let root = tempfile::tempdir().unwrap();
    let serve = serve(root.path(), "serve.log", &receiver, &[]);
    let mut alice = chatter(serve.addr, "alice").await;
    let data = r#"{"b":1,"a":18446744073709551616000}"#;
    alice.send_text(format!(r#"{{"op":"publish","room":"chat:raw","ref":1,"data":{data}}}"#)).await;
    let reply = alice.wait_for_ref(1, &json!("publish")).await;
    assert_eq!(reply["op"], "published", "{reply}");
    let delivered = receiver.wait_delivered(ARRIVE, "the publish's webhook", |d| {
        d.iter().any(|a| a.body["room"] == "chat:raw")
    });
    let raw = &delivered.iter().find(|a| a.body["room"] == "chat:raw").unwrap().raw;
    assert!(raw.contains(&format!(r#""data":{data}"#)), "the data as the client sent it: {raw}");
}

#[test]
fn a_bad_webhook_config_stops_the_start_with_a_clear_error() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--webhook-url", "http://127.0.0.1:9/hooks"],
            "webhook_secret must be set when webhook_url is",
        ),
        (
            &["--webhook-url", "ftp://127.0.0.1:9/hooks", "--webhook-secret", "s"],
            "webhook_url must be an http:// or https:// URL",
        ),
        (
            &["--webhook-url", "127.0.0.1:9/hooks", "--webhook-secret", "s"],
            "webhook_url must be an http:// or https:// URL",
        ),
        (
            &[
                "--webhook-url",
                "http://127.0.0.1:9/hooks",
                "--webhook-secret",
                "s",
                "--webhook-queue-max",
                "0",
            ],
            "webhook_queue_max must be at least 1",
        ),
    ];
    for (flags, message) in cases {
        let mut cmd = Command::new(crate::common::livegate_bin());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("LIVEGATE_") {
                cmd.env_remove(name);
            }
        }
        let ran = cmd
            .args(["serve", "--listen", "127.0.0.1:0", "--api-key", API_KEY, "--data-dir"])
            .arg(root.path().join("data"))
            .args(flags)
            .stdin(Stdio::null())
            .output()
            .expect("run livegate serve");
        let stderr = String::from_utf8_lossy(&ran.stderr);
        assert!(!ran.status.success(), "{flags:?} must not start: {stderr}");
        assert!(stderr.contains(message), "{flags:?}: the error says {message:?}: {stderr}");
        assert!(!stderr.contains("ftp://127"), "the URL is not echoed: {stderr}");
    }
}

// ---------------------------------------------------------------------------------------
// Dead letters
// ---------------------------------------------------------------------------------------

/// `GET /v1/admin/webhooks/dead` (with `?limit=N`), answered 200.
fn dead_letters(http: &Http, limit: Option<usize>) -> Value {
    let path = match limit {
        Some(limit) => format!("/v1/admin/webhooks/dead?limit={limit}"),
        None => "/v1/admin/webhooks/dead".to_string(),
    };
    let (status, body) = http.request("GET", &path, Auth::Key, Body::None);
    assert_eq!(status, 200, "{body}");
    body
}

/// The attempts of webhook `id`, as the receiver got them.
fn attempts_of(receiver: &Receiver, id: &str) -> Vec<Attempt> {
    receiver.attempts().into_iter().filter(|a| a.body["id"] == id).collect()
}

/// A short schedule: 4 attempts, retries waiting at most 50, 100, 200 ms (full jitter).
const SHORT_RETRIES: &[&str] = &[
    "--webhook-max-attempts",
    "4",
    "--webhook-retry-first-ms",
    "50",
    "--webhook-retry-max-ms",
    "200",
];

#[tokio::test]
async fn a_webhook_out_of_attempts_is_a_dead_letter_kept_over_a_restart_and_replayed_once() {
    let _gate = crate::common::gate!();
    let receiver = Receiver::start(always(500));
    let root = tempfile::tempdir().unwrap();
    let mut serve1 = serve(root.path(), "serve-1.log", &receiver, SHORT_RETRIES);
    let http = serve1.http();

    // bob publishes without subscribing: one webhook, client_published, and nothing else.
    let mut bob = chatter(serve1.addr, "bob").await;
    let seq = publish(&mut bob, "chat:dead", Some("d-1"), json!({"text": "never taken"})).await;
    let listed = wait_for_every(ARRIVE, Duration::from_millis(20), || {
        let listed = dead_letters(&http, None);
        (listed["count"] == 1).then_some(listed)
    })
    .unwrap_or_else(|| {
        panic!(
            "no dead letter within {ARRIVE:?}; attempts {:#?}; log:\n{}",
            summary(&receiver.attempts()),
            serve1.log_text()
        )
    });
    let letter = listed["dead_letters"][0].clone();
    let id = letter["id"].as_str().unwrap().to_string();
    let attempts = attempts_of(&receiver, &id);
    assert_eq!(
        attempts.len(),
        4,
        "webhook_max_attempts attempts, no more: {:#?}",
        summary(&receiver.attempts())
    );
    assert!(attempts.iter().all(|a| a.status == 500 && a.signature_ok));
    let first = attempts[0].body.clone();
    assert_eq!(
        (&first["type"], &first["room"], &first["seq"], &first["event_id"]),
        (&json!("client_published"), &json!("chat:dead"), &json!(seq), &json!("d-1"))
    );
    // The dead letter says what it is, where it went, how often and how it failed.
    assert_eq!((&listed["node"], &listed["max"]), (&json!(NODE), &json!(1000)), "{listed}");
    assert_eq!(
        (
            &letter["type"],
            &letter["room"],
            &letter["url"],
            &letter["attempts"],
            &letter["reason"],
            &letter["last_error"]
        ),
        (
            &json!("client_published"),
            &json!("chat:dead"),
            &json!(receiver.url()),
            &json!(4),
            &json!("attempts"),
            &json!("HTTP 500")
        ),
        "{letter}"
    );
    assert_eq!(letter["body"], first, "the body as sent");
    let (first_ms, last_ms) =
        (letter["first_attempt_ms"].as_u64().unwrap(), letter["last_attempt_ms"].as_u64().unwrap());
    let (seen_first, seen_last) = (attempts[0].at_ms, attempts[3].at_ms);
    assert!(
        first_ms <= seen_first && seen_first <= first_ms + 1000,
        "first attempt at {first_ms}, received at {seen_first}"
    );
    assert!(
        seen_last <= last_ms && last_ms <= seen_last + 1000,
        "last attempt ended at {last_ms}, received at {seen_last}"
    );
    let dead_at_ms = last_ms;
    wait_metric(&http, "livegate_webhooks_queued", 0.0, &serve1);
    assert_eq!(metric(&http, "livegate_webhook_dead_letters"), Some(1.0));
    assert_eq!(
        metric(&http, r#"livegate_webhooks_dead_lettered_total{reason="attempts"}"#),
        Some(1.0)
    );
    assert_eq!(
        metric(&http, "livegate_webhook_attempts_failed_total"),
        Some(3.0),
        "the three retried; the fourth was the last"
    );
    assert_eq!(metric(&http, "livegate_webhooks_delivered_total"), Some(0.0));
    let log = serve1.log_text();
    assert!(log.contains("webhook given up: kept as a dead letter") && log.contains(&id), "{log}");
    // Nothing more is attempted.
    let_time_pass(QUIET, "no attempt after the last one");
    assert_eq!(attempts_of(&receiver, &id).len(), 4);

    // The admin API needs the key; an unknown id is a 404 with its code.
    let (status, body) = http.request("GET", "/v1/admin/webhooks/dead", Auth::None, Body::None);
    assert_eq!((status, &body["error"]["code"]), (401, &json!("unauthorized")), "{body}");
    let (status, body) =
        http.request("POST", "/v1/admin/webhooks/dead/nope/replay", Auth::Key, Body::None);
    assert_eq!((status, &body["error"]["code"]), (404, &json!("dead_letter_not_found")), "{body}");

    // A clean restart on the same data dir: still listed, as it was.
    drop(bob);
    serve1.signal("TERM");
    assert!(
        serve1.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()),
        "SIGTERM ends the process; log:\n{}",
        serve1.log_text()
    );
    let serve2 = serve(root.path(), "serve-2.log", &receiver, SHORT_RETRIES);
    let http = serve2.http();
    let listed = dead_letters(&http, None);
    assert_eq!(
        (&listed["count"], &listed["dead_letters"][0]),
        (&json!(1), &letter),
        "kept over the restart: {listed}"
    );
    assert_eq!(metric(&http, "livegate_webhook_dead_letters"), Some(1.0));
    assert!(
        serve2.log_text().contains("webhook dead letters kept in the store"),
        "{}",
        serve2.log_text()
    );

    // What an operator sees: `livegate webhooks --dead`.
    let url = format!("http://{}", serve2.addr);
    let (ok, out, err) = livegate_cli(&["webhooks", "--dead", "--url", &url, "--api-key", API_KEY]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("node {NODE}: 1 dead letter (at most 1000)"), "{out}");
    assert!(
        lines[1].starts_with(&format!("{id}  client_published  chat:dead  4 attempts, last "))
            && lines[1].contains(": HTTP 500 (attempts); first "),
        "{out}"
    );

    // Replayed while the receiver still fails, from the command line: it fails, saying why.
    let (ok, out, err) =
        livegate_cli(&["webhooks", "--replay", &id, "--url", &url, "--api-key", API_KEY]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("server answered 502 replay_failed") && err.contains("HTTP 500"), "{err}");

    // Replayed while the receiver still fails: 502, kept with one attempt more each time.
    let (status, body) = http.request(
        "POST",
        &format!("/v1/admin/webhooks/dead/{id}/replay"),
        Auth::Key,
        Body::None,
    );
    assert_eq!((status, &body["error"]["code"]), (502, &json!("replay_failed")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("HTTP 500"), "{body}");
    let kept = dead_letters(&http, None)["dead_letters"][0].clone();
    assert_eq!((&kept["attempts"], &kept["last_error"]), (&json!(6), &json!("HTTP 500")), "{kept}");
    assert_eq!(metric(&http, r#"livegate_webhook_replays_total{outcome="failed"}"#), Some(2.0));

    // The receiver takes webhooks again: the replay delivers it, once, and it leaves the list.
    receiver.set_policy(always(200));
    let replay_at_ms = now_ms();
    let (status, body) = http.request(
        "POST",
        &format!("/v1/admin/webhooks/dead/{id}/replay"),
        Auth::Key,
        Body::None,
    );
    assert_eq!(
        (status, &body),
        (200, &json!({"id": id, "outcome": "delivered", "attempts": 7})),
        "{body}"
    );
    let delivered: Vec<Attempt> =
        attempts_of(&receiver, &id).into_iter().filter(|a| a.status == 200).collect();
    assert_eq!(delivered.len(), 1, "exactly once: {:#?}", summary(&receiver.attempts()));
    assert_eq!(delivered[0].raw, attempts[0].raw, "the same body, byte for byte");
    assert_eq!(
        delivered[0].id_header, id,
        "the same X-Livegate-Id, so a receiver can tell it again"
    );
    assert!(delivered[0].signature_ok);
    let listed = dead_letters(&http, None);
    assert_eq!((&listed["count"], &listed["dead_letters"]), (&json!(0), &json!([])), "{listed}");
    let (status, body) = http.request(
        "POST",
        &format!("/v1/admin/webhooks/dead/{id}/replay"),
        Auth::Key,
        Body::None,
    );
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("dead_letter_not_found")),
        "replayed: gone: {body}"
    );
    assert_eq!(metric(&http, "livegate_webhook_dead_letters"), Some(0.0));
    assert_eq!(metric(&http, r#"livegate_webhook_replays_total{outcome="delivered"}"#), Some(1.0));
    let_time_pass(QUIET, "nothing else arrives for the replayed webhook");
    assert_eq!(attempts_of(&receiver, &id).iter().filter(|a| a.status == 200).count(), 1);

    let offsets: Vec<u64> = attempts.iter().map(|a| a.at_ms - attempts[0].at_ms).collect();
    println!(
        "FIGURE dead-letter path (webhook_max_attempts 4, retries up to 50/100/200 ms, full jitter): attempts at +{offsets:?} ms, \
         dead-lettered by +{} ms (HTTP 500 x4); after a restart: replays 1 and 2 -> 502 replay_failed (attempts 5, 6), \
         replay 3 -> delivered once in {} ms (attempts 7), list empty",
        dead_at_ms - attempts[0].at_ms,
        delivered[0].at_ms - replay_at_ms,
    );
}

#[tokio::test]
async fn the_dead_letter_bound_drops_the_oldest_and_counts_them() {
    let _gate = crate::common::gate!();
    // Every webhook refused for good: each is a dead letter after its one attempt.
    let receiver = Receiver::start(always(410));
    let root = tempfile::tempdir().unwrap();
    let serve = serve(root.path(), "serve.log", &receiver, &["--webhook-dead-letters-max", "3"]);
    let http = serve.http();
    let mut bob = chatter(serve.addr, "bob").await;
    let mut seqs = Vec::new();
    for n in 1..=5 {
        seqs.push(publish(&mut bob, "chat:bound", None, json!(n)).await);
    }
    wait_metric(&http, r#"livegate_webhooks_dead_lettered_total{reason="rejected"}"#, 5.0, &serve);
    assert_eq!(metric(&http, "livegate_webhook_dead_letters"), Some(3.0));
    assert_eq!(metric(&http, "livegate_webhook_dead_letters_dropped_total"), Some(2.0));
    // The newest three, newest first (one room: its webhooks went, and died, in order).
    let listed = dead_letters(&http, None);
    let kept: Vec<&Value> =
        listed["dead_letters"].as_array().unwrap().iter().map(|l| &l["body"]["seq"]).collect();
    assert_eq!(kept, [&json!(seqs[4]), &json!(seqs[3]), &json!(seqs[2])], "{listed}");
    assert_eq!((&listed["count"], &listed["max"]), (&json!(3), &json!(3)));
    let log = serve.log_text();
    assert!(log.contains("dead-letter list full: the oldest dropped"), "{log}");
    // A limit shows the newest only; a bad one is a 400.
    let newest = dead_letters(&http, Some(1));
    assert_eq!(
        (
            newest["dead_letters"].as_array().unwrap().len(),
            &newest["dead_letters"][0]["body"]["seq"]
        ),
        (1, &json!(seqs[4]))
    );
    let (status, body) =
        http.request("GET", "/v1/admin/webhooks/dead?limit=0", Auth::Key, Body::None);
    assert_eq!((status, &body["error"]["code"]), (400, &json!("bad_request")), "{body}");
    // Deleted one by one, then all.
    let id = newest["dead_letters"][0]["id"].as_str().unwrap().to_string();
    let (status, body) =
        http.request("DELETE", &format!("/v1/admin/webhooks/dead/{id}"), Auth::Key, Body::None);
    assert_eq!((status, &body), (200, &json!({"deleted": 1})), "{body}");
    let (status, body) =
        http.request("DELETE", &format!("/v1/admin/webhooks/dead/{id}"), Auth::Key, Body::None);
    assert_eq!((status, &body["error"]["code"]), (404, &json!("dead_letter_not_found")), "{body}");
    let (status, body) = http.request("DELETE", "/v1/admin/webhooks/dead", Auth::Key, Body::None);
    assert_eq!((status, &body), (200, &json!({"deleted": 2})), "{body}");
    assert_eq!(dead_letters(&http, None)["count"], 0);
    assert_eq!(metric(&http, "livegate_webhook_dead_letters"), Some(0.0));
    println!("FIGURE dead-letter bound 3: 5 refused webhooks -> 3 kept (seqs {:?}), 2 dropped and counted", &seqs[2..]);
}
