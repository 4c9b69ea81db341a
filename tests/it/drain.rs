//! Graceful drain of the real binary (issue 4): on SIGTERM `/readyz` turns
//! 503 at once and new upgrades are refused, then after `drain_wait` every connection gets
//! its pending events followed by Close 1012 — spread over `drain_spread`, each with its
//! own suggested reconnect delay — and the process exits 0 as soon as the clients have
//! gone. A new process on the same data dir takes over: the clients reconnect with their
//! session (warm-up), resubscribe with `since` + `epoch`, and end with every acknowledged
//! event of their room exactly once and in order. A second SIGTERM cuts a long drain short.
//!
//! The tests start `livegate serve` as a child process (`common::process`), run their
//! WebSocket clients on a tokio runtime of their own and drive the processes from the
//! test thread. Every wait is bounded. The two tests take a file-wide lock so their
//! timing checks do not compete for the CPU.

use crate::common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::process::{full_history, ServeProcess};
use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::watch;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The delay in a 1012 reason `service restart: reconnect in <N> ms`.
fn reconnect_hint_ms(reason: &str) -> Option<u64> {
    let rest = &reason[reason.find("reconnect in ")? + "reconnect in ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if !rest[digits.len()..].trim_start().starts_with("ms") {
        return None;
    }
    digits.parse().ok()
}

/// After a Close frame from the server: keep polling so tungstenite writes its Close
/// reply, until the server ends the TCP connection. Returns how the socket ended.
async fn finish_close_handshake(ws: &mut WsClient) -> String {
    let end = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match ws.ws.next().await {
                None => return "clean".to_string(),
                Some(Err(e)) => return format!("error after Close: {e}"),
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    end.unwrap_or_else(|_| "server kept the socket open 3 s after its Close".into())
}

// ---------------------------------------------------------------------------------------
// Publisher: one thread at a steady rate, retrying each id until it is acknowledged
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Ack {
    room: usize,
    seq: u64,
    id: String,
    epoch: Value,
    at: Instant,
    /// Which server acknowledged it: 0 = the drained one, 1 = its successor.
    server: usize,
}

#[derive(Default)]
struct PublisherReport {
    acks: Vec<Ack>,
    /// Attempts answered with something else than 2xx, by status (0: transport error).
    refusals: HashMap<u16, usize>,
    errors: Vec<String>,
}

struct Publisher {
    target: Arc<Mutex<(Http, usize)>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<PublisherReport>,
}

impl Publisher {
    /// Publishes `{"n": n}` with id `p-n` to room `n % rooms` every `every`.
    fn start(
        http: Http,
        room_name: fn(usize) -> String,
        rooms: usize,
        every: Duration,
    ) -> Publisher {
        let target = Arc::new(Mutex::new((http, 0usize)));
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (target.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut report = PublisherReport::default();
            let mut pacer = Pacer::new(every);
            let mut n = 0usize;
            while !s.load(Ordering::SeqCst) {
                pacer.wait();
                let room = n % rooms;
                let id = format!("p-{n}");
                let path = format!("/v1/rooms/{}/events", room_name(room));
                let body = json!({"id": id, "data": {"n": n, "room": room}});
                let mut stopped_at: Option<Instant> = None;
                loop {
                    let (http, server) = t.lock().unwrap().clone();
                    match http.try_request("POST", &path, Auth::Key, Body::Json(body.clone())) {
                        Ok((200 | 201, reply)) => {
                            let seq = reply["seq"].as_u64().unwrap_or(0);
                            if seq == 0 {
                                report.errors.push(format!("{id}: 2xx without seq: {reply}"));
                            }
                            report.acks.push(Ack {
                                room,
                                seq,
                                id: id.clone(),
                                epoch: reply["epoch"].clone(),
                                at: Instant::now(),
                                server,
                            });
                            break;
                        }
                        Ok((status, reply)) => {
                            *report.refusals.entry(status).or_default() += 1;
                            if ![429, 503].contains(&status) && report.errors.len() < 20 {
                                report.errors.push(format!("{id} answered {status}: {reply}"));
                            }
                        }
                        Err(_) => *report.refusals.entry(0).or_default() += 1,
                    }
                    if s.load(Ordering::SeqCst) {
                        let since = *stopped_at.get_or_insert_with(Instant::now);
                        if since.elapsed() > Duration::from_secs(10) {
                            report
                                .errors
                                .push(format!("{id} still not acknowledged 10 s after the stop"));
                            break;
                        }
                    }
                    common::pace(Duration::from_millis(25), "a refused publish is retried at 40/s");
                }
                n += 1;
            }
            report
        });
        Publisher { target, stop, thread }
    }

    fn retarget(&self, http: Http, server: usize) {
        *self.target.lock().unwrap() = (http, server);
    }

    fn stop(self) -> PublisherReport {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("publisher thread")
    }
}

// ---------------------------------------------------------------------------------------
// (a) 200 clients, SIGTERM, restart on the same data dir
// ---------------------------------------------------------------------------------------

const CLIENTS: usize = 200;
const ROOMS: usize = 10;
const DRAIN_WAIT: Duration = Duration::from_secs(1);
const DRAIN_SPREAD: Duration = Duration::from_secs(2);
const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// 50 publishes per second, round-robin over the rooms.
const PUBLISH_EVERY: Duration = Duration::from_millis(20);
/// A suggested reconnect delay is honoured up to this long.
const HINT_CAP: Duration = Duration::from_secs(3);
/// Bound on each client's phases (waiting for the close, then for the successor's events).
const CLIENT_PHASE_LIMIT: Duration = Duration::from_secs(90);

fn room_name(r: usize) -> String {
    format!("drain:{r}")
}

#[derive(Debug, Clone)]
enum Ending {
    Close(Option<u16>, String),
    /// The stream ended or failed without a Close frame: what a client sees as 1006.
    Abnormal(String),
    NoClose,
}

struct Shared {
    signal_at: OnceLock<Instant>,
    ready: AtomicUsize,
    closed: AtomicUsize,
    resubscribed: AtomicUsize,
    successor: watch::Receiver<Option<SocketAddr>>,
    /// Final head per room, once the publisher has stopped.
    targets: watch::Receiver<Option<Vec<u64>>>,
}

#[derive(Debug)]
struct ClientReport {
    id: usize,
    room: usize,
    session: String,
    first_head: u64,
    epoch: Value,
    ending: Ending,
    closed_at: Option<Instant>,
    /// How the socket ended after the server's Close.
    after_close: String,
    hint_ms: Option<u64>,
    before_close: Vec<(u64, String)>,
    after_restart: Vec<(u64, String)>,
    welcome_again: Value,
    resubscribed: Value,
    reconnect_took: Option<Duration>,
    errors: Vec<String>,
}

async fn drained_client(
    id: usize,
    first: SocketAddr,
    token: String,
    shared: Arc<Shared>,
) -> ClientReport {
    let room = room_name(id % ROOMS);
    let user = format!("drain-u{id}");
    let mut ws = WsClient::connect(first, &token, None).await;
    let session = ws.session().to_string();
    let sub = ws.subscribe_ok(&room).await;
    let epoch = sub["epoch"].clone();
    let first_head = sub["seq"].as_u64().unwrap_or_else(|| panic!("subscribed without seq: {sub}"));
    let mut report = ClientReport {
        id,
        room: id % ROOMS,
        session: session.clone(),
        first_head,
        epoch: epoch.clone(),
        ending: Ending::NoClose,
        closed_at: None,
        after_close: String::new(),
        hint_ms: None,
        before_close: Vec::new(),
        after_restart: Vec::new(),
        welcome_again: Value::Null,
        resubscribed: Value::Null,
        reconnect_took: None,
        errors: Vec::new(),
    };
    shared.ready.fetch_add(1, Ordering::SeqCst);

    // Phase 1: live events until the server says goodbye.
    let mut last = first_head;
    let deadline = Instant::now() + CLIENT_PHASE_LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ws.next_incoming(left).await {
            Incoming::Json(frame) => {
                take_events(&frame, &room, &mut last, &mut report.before_close, &mut report.errors)
            }
            Incoming::Close(code, reason) => {
                report.closed_at = Some(Instant::now());
                report.hint_ms = reconnect_hint_ms(&reason);
                report.ending = Ending::Close(code, reason);
                report.after_close = finish_close_handshake(&mut ws).await;
                break;
            }
            Incoming::Ended(e) => {
                report.closed_at = Some(Instant::now());
                report.ending = Ending::Abnormal(e);
                break;
            }
            Incoming::Timeout => break,
        }
    }
    shared.closed.fetch_add(1, Ordering::SeqCst);
    drop(ws);
    let closed_at = report.closed_at.unwrap_or_else(Instant::now);

    // Phase 2: honour the suggested delay (capped), then reconnect to the successor with
    // the session and resubscribe from the last seq held.
    let hint = Duration::from_millis(report.hint_ms.unwrap_or(0)).min(HINT_CAP);
    tokio::time::sleep_until((closed_at + hint).into()).await;
    let mut successor = shared.successor.clone();
    let next =
        match tokio::time::timeout(CLIENT_PHASE_LIMIT, successor.wait_for(Option::is_some)).await {
            Ok(Ok(addr)) => addr.expect("some"),
            _ => {
                report.errors.push("no successor server to reconnect to".into());
                return report;
            }
        };
    let token = {
        let user = user.clone();
        tokio::task::spawn_blocking(move || Http::new(next).mint_token(&user, "web"))
            .await
            .expect("mint")
    };
    let mut ws = match WsClient::try_connect(next, Some(&token), Some(&session)).await {
        Ok(ws) => ws,
        Err(r) => {
            report.errors.push(format!("reconnect refused: {} {}", r.status, r.body));
            return report;
        }
    };
    report.welcome_again = ws.welcome.clone();
    report.resubscribed = ws.subscribe_since(&room, last, &epoch).await;
    report.reconnect_took = Some(closed_at.elapsed());
    shared.resubscribed.fetch_add(1, Ordering::SeqCst);

    let mut targets = shared.targets.clone();
    let deadline = Instant::now() + CLIENT_PHASE_LIMIT;
    loop {
        let target = targets.borrow_and_update().as_ref().map(|t| t[id % ROOMS]);
        if target.is_some_and(|t| last >= t) {
            break;
        }
        if Instant::now() > deadline {
            report.errors.push(format!(
                "after {CLIENT_PHASE_LIMIT:?} on the successor: last seq {last}, target {target:?}"
            ));
            break;
        }
        match ws.next_incoming(Duration::from_millis(200)).await {
            Incoming::Json(frame) => {
                take_events(&frame, &room, &mut last, &mut report.after_restart, &mut report.errors)
            }
            Incoming::Timeout => {}
            other => {
                report.errors.push(format!("successor ended the connection: {other:?}"));
                return report;
            }
        }
    }
    ws.close().await;
    report
}

#[test]
fn sigterm_drains_200_clients_with_1012_and_the_successor_loses_nothing() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let (wait, spread, grace) = (
        DRAIN_WAIT.as_secs().to_string(),
        DRAIN_SPREAD.as_secs().to_string(),
        DRAIN_GRACE.as_secs().to_string(),
    );
    let flags = [
        "--drain-wait-secs",
        &wait,
        "--drain-spread-secs",
        &spread,
        "--drain-grace-secs",
        &grace,
        "--history-size",
        "1000000",
    ];
    let mut old = ServeProcess::start(&data, &root.path().join("first.log"), &flags);
    let old_http = old.http();
    let rt = runtime();
    let mut failures: Vec<String> = Vec::new();

    // 200 clients, 20 per room, tokens minted over HTTP.
    let tokens: Vec<String> =
        (0..CLIENTS).map(|i| old_http.mint_token(&format!("drain-u{i}"), "web")).collect();
    let late_token = old_http.mint_token("late-comer", "web");
    let (successor_tx, successor_rx) = watch::channel(None);
    let (targets_tx, targets_rx) = watch::channel(None);
    let shared = Arc::new(Shared {
        signal_at: OnceLock::new(),
        ready: AtomicUsize::new(0),
        closed: AtomicUsize::new(0),
        resubscribed: AtomicUsize::new(0),
        successor: successor_rx,
        targets: targets_rx,
    });
    let clients: Vec<_> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| rt.spawn(drained_client(i, old.addr, t, shared.clone())))
        .collect();
    let all_ready = wait_until(Duration::from_secs(60), || {
        shared.ready.load(Ordering::SeqCst) == CLIENTS || clients.iter().any(|c| c.is_finished())
    });
    assert!(
        all_ready && shared.ready.load(Ordering::SeqCst) == CLIENTS,
        "only {} of {CLIENTS} clients connected and subscribed",
        shared.ready.load(Ordering::SeqCst)
    );

    // A steady publish stream, then SIGTERM while it runs.
    let publisher = Publisher::start(old_http.clone(), room_name, ROOMS, PUBLISH_EVERY);
    common::pace(Duration::from_secs(3), "the publish stream runs before the SIGTERM");
    let signal_at = Instant::now();
    shared.signal_at.set(signal_at).expect("signal time set once");
    old.signal("TERM");

    // 1. Not ready at once, and new upgrades refused, while drain_wait runs.
    let not_ready = wait_until(Duration::from_millis(500), || {
        matches!(old_http.try_request("GET", "/readyz", Auth::None, Body::None), Ok((503, _)))
    });
    let not_ready_after = signal_at.elapsed();
    if !not_ready {
        failures.push(format!(
            "/readyz did not answer 503 within 500 ms of SIGTERM ({not_ready_after:?})"
        ));
    }
    let upgrade = rt.block_on(WsClient::try_connect(old.addr, Some(&late_token), None));
    let upgrade_after = signal_at.elapsed();
    match upgrade {
        Ok(_) => failures
            .push(format!("an upgrade {upgrade_after:?} after SIGTERM was accepted; expected 503")),
        Err(r) if r.status == 503 && error_code(&r.body) == "unavailable" => {}
        Err(r) => failures.push(format!(
            "upgrade during drain_wait: expected 503 unavailable, got {} {}",
            r.status, r.body
        )),
    }
    if upgrade_after >= DRAIN_WAIT {
        failures.push(format!(
            "the upgrade check ran {upgrade_after:?} after SIGTERM, not within drain_wait"
        ));
    }

    // 2.–7. The process exits 0, well before the grace since every client closes at once.
    let limit = DRAIN_WAIT + DRAIN_SPREAD + DRAIN_GRACE + Duration::from_secs(10);
    let status = old.wait_exit(limit);
    let drain_time = signal_at.elapsed();
    let closed_by_exit = shared.closed.load(Ordering::SeqCst);
    let first_log = old.log_text();
    match status {
        None => panic!("livegate did not exit within {limit:?} of SIGTERM; log:\n{first_log}"),
        Some(s) if !s.success() => failures.push(format!("exit status after the drain: {s}")),
        Some(_) => {}
    }
    let fast_enough = DRAIN_WAIT + DRAIN_SPREAD + Duration::from_secs(5);
    if drain_time >= fast_enough {
        failures.push(format!("drain took {drain_time:?} although every client closed promptly (bound {fast_enough:?})"));
    }
    eprintln!(
        "drain with {CLIENTS} clients: SIGTERM -> exit {:.3} s (wait {} s, spread {} s, grace {} s); /readyz 503 after {:?}; \
         {closed_by_exit} clients had their close by the exit",
        secs(drain_time),
        DRAIN_WAIT.as_secs(),
        DRAIN_SPREAD.as_secs(),
        DRAIN_GRACE.as_secs(),
        not_ready_after
    );
    eprintln!("drain log lines of the first server:");
    for line in first_log.lines().filter(|l| {
        l.to_lowercase().contains("drain") || l.contains("SIGTERM") || l.contains("flushed")
    }) {
        eprintln!("  {line}");
    }

    // The successor on the same data dir; clients and publisher move over to it.
    let quick_stop = [
        "--drain-wait-secs",
        "0",
        "--drain-spread-secs",
        "0",
        "--drain-grace-secs",
        "3",
        "--history-size",
        "1000000",
    ];
    let mut new = ServeProcess::start(&data, &root.path().join("second.log"), &quick_stop);
    let new_http = new.http();
    publisher.retarget(new_http.clone(), 1);
    successor_tx.send(Some(new.addr)).expect("clients listen");
    let all_back = wait_until(Duration::from_secs(60), || {
        shared.resubscribed.load(Ordering::SeqCst) == CLIENTS
            || clients.iter().all(|c| c.is_finished())
    });
    if !all_back {
        failures.push(format!(
            "only {} of {CLIENTS} clients resubscribed within 60 s",
            shared.resubscribed.load(Ordering::SeqCst)
        ));
    }
    common::pace(Duration::from_secs(2), "live publishes on the successor");
    let published = publisher.stop();

    // What the successor holds is the reference: every client must end with exactly it.
    let histories: Vec<(Vec<Value>, Value, u64)> =
        (0..ROOMS).map(|r| full_history(&new_http, &room_name(r), 0)).collect();
    targets_tx.send(Some(histories.iter().map(|h| h.2).collect())).expect("clients listen");
    let reports: Vec<ClientReport> = rt.block_on(async {
        let mut out = Vec::new();
        for (i, c) in clients.into_iter().enumerate() {
            match tokio::time::timeout(Duration::from_secs(120), c).await {
                Ok(Ok(r)) => out.push(r),
                Ok(Err(e)) => panic!("client {i} failed: {e}"),
                Err(_) => panic!("client {i} did not finish"),
            }
        }
        out
    });

    // --- Acknowledged publishes: all in history, with their seq, once, same epoch. ---
    let mut lost = 0;
    let mut acked_ids: HashMap<&str, u64> = HashMap::new();
    for a in &published.acks {
        let (events, epoch, _) = &histories[a.room];
        if let Some(prev) = acked_ids.insert(&a.id, a.seq) {
            failures.push(format!("{} acknowledged twice, seqs {prev} and {}", a.id, a.seq));
        }
        if &a.epoch != epoch {
            failures.push(format!(
                "{} acknowledged in epoch {}, the successor has {epoch}",
                a.id, a.epoch
            ));
        }
        match events.get((a.seq as usize).wrapping_sub(1)) {
            Some(e) if e["id"] == a.id.as_str() && seq_of(e) == a.seq => {}
            other => {
                lost += 1;
                if lost <= 10 {
                    failures.push(format!(
                        "acknowledged {} (room {}, seq {}) not in history: {other:?}",
                        a.id, a.room, a.seq
                    ));
                }
            }
        }
    }
    for (r, (events, _, head)) in histories.iter().enumerate() {
        if seqs(events) != (1..=*head).collect::<Vec<_>>() {
            failures.push(format!("history of {} is not 1..={head} without holes", room_name(r)));
        }
        let ids: HashSet<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
        if ids.len() != events.len() {
            failures.push(format!("history of {} holds an id twice", room_name(r)));
        }
    }
    if !published.errors.is_empty() {
        failures.push(format!("publisher errors: {:?}", published.errors));
    }
    let acked_old = published.acks.iter().filter(|a| a.server == 0).count();
    let acked_during_drain =
        published.acks.iter().filter(|a| a.server == 0 && a.at > signal_at).count();
    eprintln!(
        "publisher: {} acknowledged ({acked_old} by the first server, {acked_during_drain} of them after SIGTERM), \
         refusals by status {:?}; lost {lost}",
        published.acks.len(),
        published.refusals
    );

    // --- How each connection ended: Close 1012 with a delay, never abnormal. ---
    let mut abnormal = 0;
    let mut codes: HashMap<String, usize> = HashMap::new();
    let mut hints = Vec::new();
    let mut close_offsets = Vec::new();
    for r in &reports {
        let key = match &r.ending {
            Ending::Close(code, _) => format!("{code:?}"),
            Ending::Abnormal(_) => "abnormal".into(),
            Ending::NoClose => "none".into(),
        };
        *codes.entry(key).or_default() += 1;
        match &r.ending {
            Ending::Close(Some(1012), reason) => match r.hint_ms {
                Some(h) => hints.push(h),
                None => failures
                    .push(format!("client {}: 1012 reason without a delay: {reason:?}", r.id)),
            },
            Ending::Close(code, reason) => {
                failures.push(format!("client {}: closed with {code:?} {reason:?}, not 1012", r.id))
            }
            Ending::Abnormal(e) => {
                abnormal += 1;
                failures.push(format!(
                    "client {}: connection ended without a Close frame (1006): {e}",
                    r.id
                ));
            }
            Ending::NoClose => {
                failures.push(format!("client {}: no Close within {CLIENT_PHASE_LIMIT:?}", r.id))
            }
        }
        if let Some(at) = r.closed_at {
            close_offsets.push(at.saturating_duration_since(signal_at));
        }
        if matches!(r.ending, Ending::Close(..)) && r.after_close != "clean" {
            eprintln!("client {}: after the Close: {}", r.id, r.after_close);
        }
    }
    let distinct: BTreeSet<u64> = hints.iter().copied().collect();
    let hint_bound = DRAIN_SPREAD.max(Duration::from_secs(1)).as_millis() as u64;
    if let Some(max) = hints.iter().max().filter(|m| **m >= hint_bound) {
        failures.push(format!(
            "suggested delay {max} ms is not below max(spread, 1 s) = {hint_bound} ms"
        ));
    }
    if hints.len() >= 20 && distinct.len() < 10 {
        failures.push(format!(
            "suggested delays hardly differ: {} distinct values among {}",
            distinct.len(),
            hints.len()
        ));
    }
    close_offsets.sort();
    let (first_close, last_close) = (close_offsets.first().copied(), close_offsets.last().copied());
    if let Some(first) = first_close.filter(|f| *f + Duration::from_millis(100) < DRAIN_WAIT) {
        failures.push(format!("a connection was closed {first:?} after SIGTERM, before drain_wait ({DRAIN_WAIT:?}) was over"));
    }
    if let (Some(first), Some(last)) = (first_close, last_close) {
        if last - first < DRAIN_SPREAD / 4 {
            failures.push(format!(
                "closes came within {:?}, not spread over {DRAIN_SPREAD:?}",
                last - first
            ));
        }
        if last > DRAIN_WAIT + DRAIN_SPREAD + Duration::from_secs(2) {
            failures.push(format!("last Close {last:?} after SIGTERM, beyond wait + spread + 2 s"));
        }
    }
    eprintln!(
        "closes: {codes:?}; abnormal {abnormal}; received {:?}..{:?} after SIGTERM; suggested delays {} distinct of {}, {:?}..{:?} ms",
        first_close,
        last_close,
        distinct.len(),
        hints.len(),
        distinct.first(),
        distinct.last()
    );

    // --- Events accepted before a connection's close were written before its 1012. ---
    let mut late = 0;
    for r in &reports {
        let Some(closed_at) = r.closed_at else { continue };
        let got: HashSet<u64> = r.before_close.iter().map(|e| e.0).collect();
        for a in published
            .acks
            .iter()
            .filter(|a| a.room == r.room && a.server == 0 && a.seq > r.first_head)
        {
            if a.at + Duration::from_secs(1) < closed_at && !got.contains(&a.seq) {
                late += 1;
                if late <= 5 {
                    failures.push(format!(
                        "client {}: {} (seq {}) acknowledged {:?} before its 1012 was not written before it",
                        r.id,
                        a.id,
                        a.seq,
                        closed_at - a.at
                    ));
                }
            }
        }
    }

    // --- Back on the successor: warm-up, same session, recovered, exactly once in order. ---
    let mut warm = 0;
    let mut kept = 0;
    let mut incomplete = 0;
    let mut reconnects: Vec<Duration> = Vec::new();
    for r in &reports {
        for e in r.errors.iter().take(3) {
            failures.push(format!("client {}: {e}", r.id));
        }
        if r.welcome_again["warmup"] == true {
            warm += 1;
        }
        if r.welcome_again["session"] == r.session.as_str() {
            kept += 1;
        }
        if !r.welcome_again.is_null() && r.resubscribed["recovered"] != true {
            failures.push(format!(
                "client {}: resubscribe since {} did not recover: {}",
                r.id,
                r.before_close.last().map_or(r.first_head, |e| e.0),
                r.resubscribed
            ));
        }
        if !r.welcome_again.is_null() && r.resubscribed["epoch"] != r.epoch {
            failures.push(format!(
                "client {}: epoch changed across the restart: {} -> {}",
                r.id, r.epoch, r.resubscribed["epoch"]
            ));
        }
        reconnects.extend(r.reconnect_took);
        let (events, _, _) = &histories[r.room];
        let expected: Vec<(u64, String)> = events
            .iter()
            .filter(|e| seq_of(e) > r.first_head)
            .map(|e| (seq_of(e), e["id"].as_str().unwrap_or("").to_string()))
            .collect();
        let got: Vec<(u64, String)> =
            r.before_close.iter().chain(&r.after_restart).cloned().collect();
        if got != expected {
            incomplete += 1;
            if incomplete <= 5 {
                failures.push(format!(
                    "client {} ({}): holds {} events (seqs {:?}..{:?}), history after seq {} has {}",
                    r.id,
                    room_name(r.room),
                    got.len(),
                    got.first().map(|e| e.0),
                    got.last().map(|e| e.0),
                    r.first_head,
                    expected.len()
                ));
            }
        }
    }
    if warm != CLIENTS {
        failures.push(format!("{warm} of {CLIENTS} reconnects were welcomed with warmup:true"));
    }
    if kept != CLIENTS {
        failures.push(format!("{kept} of {CLIENTS} reconnects kept their session"));
    }
    reconnects.sort();
    let per_client: Vec<usize> =
        reports.iter().map(|r| r.before_close.len() + r.after_restart.len()).collect();
    eprintln!(
        "successor: warm-up {warm}/{CLIENTS}, sessions kept {kept}/{CLIENTS}; close -> resubscribed {:?}..{:?}; \
         events per client {:?}..{:?}; clients not matching history {incomplete}; not written before 1012 {late}",
        reconnects.first(),
        reconnects.last(),
        per_client.iter().min(),
        per_client.iter().max()
    );
    let second_log = new.log_text();
    for line in second_log.lines().filter(|l| l.to_lowercase().contains("warm")) {
        eprintln!("  successor: {line}");
    }

    // The successor drains too (nobody connected): exit 0.
    new.signal("TERM");
    match new.wait_exit(Duration::from_secs(15)) {
        Some(s) if s.success() => {}
        other => failures.push(format!("the successor's exit after SIGTERM: {other:?}")),
    }
    drop(rt);
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}

// ---------------------------------------------------------------------------------------
// (b) A second SIGTERM during a long drain_wait
// ---------------------------------------------------------------------------------------

async fn waiting_client(
    addr: SocketAddr,
    token: String,
    room: String,
    ready: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
) -> (Ending, String) {
    let mut ws = WsClient::connect(addr, &token, None).await;
    ws.subscribe_ok(&room).await;
    ready.fetch_add(1, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(90);
    let ending = loop {
        match ws.next_incoming(deadline.saturating_duration_since(Instant::now())).await {
            Incoming::Json(_) => continue,
            Incoming::Close(code, reason) => break Ending::Close(code, reason),
            Incoming::Ended(e) => break Ending::Abnormal(e),
            Incoming::Timeout => break Ending::NoClose,
        }
    };
    closed.fetch_add(1, Ordering::SeqCst);
    let after = if matches!(ending, Ending::Close(..)) {
        finish_close_handshake(&mut ws).await
    } else {
        String::new()
    };
    (ending, after)
}

fn start_long_drain(root: &Path) -> ServeProcess {
    let flags = ["--drain-wait-secs", "30", "--drain-spread-secs", "5", "--drain-grace-secs", "30"];
    ServeProcess::start(&root.join("data"), &root.join("serve.log"), &flags)
}

#[test]
fn a_second_sigterm_during_a_long_drain_wait_closes_with_1012_and_exits_at_once() {
    let _gate = crate::common::gate!();
    let _serial = serial();
    const N: usize = 20;
    let root = tempfile::tempdir().expect("tempdir");
    let mut server = start_long_drain(root.path());
    let http = server.http();
    let rt = runtime();
    let ready = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..N)
        .map(|i| {
            let token = http.mint_token(&format!("second-u{i}"), "web");
            rt.spawn(waiting_client(
                server.addr,
                token,
                format!("second:{}", i % 2),
                ready.clone(),
                closed.clone(),
            ))
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(30), || ready.load(Ordering::SeqCst) == N),
        "clients did not all subscribe"
    );
    http.publish_ok("second:0", Some("before-drain"), json!(1));

    server.signal("TERM");
    let first = Instant::now();
    assert!(
        wait_until(Duration::from_millis(500), || matches!(
            http.try_request("GET", "/readyz", Auth::None, Body::None),
            Ok((503, _))
        )),
        "/readyz not 503 within 500 ms of SIGTERM"
    );
    common::let_time_pass(
        Duration::from_secs(1),
        "a second of the 30 s drain_wait: nothing closes, the server runs",
    );
    let mut failures = Vec::new();
    if !server.running() {
        failures.push(format!(
            "the server exited {:?} after the first SIGTERM, inside a 30 s drain_wait",
            first.elapsed()
        ));
    }
    let closed_early = closed.load(Ordering::SeqCst);
    if closed_early != 0 {
        failures.push(format!(
            "{closed_early} connections closed during drain_wait, before the second signal"
        ));
    }

    server.signal("TERM");
    let second = Instant::now();
    let status = server.wait_exit(Duration::from_secs(20));
    let took = second.elapsed();
    let log = server.log_text();
    match status {
        None => failures.push("still running 20 s after the second SIGTERM".into()),
        Some(s) if !s.success() => {
            failures.push(format!("exit status after the second SIGTERM: {s}"))
        }
        Some(_) => {}
    }
    if took > Duration::from_secs(5) {
        failures.push(format!("exit took {took:?} after the second SIGTERM (bound 5 s)"));
    }
    let endings: Vec<(Ending, String)> = rt.block_on(async {
        let mut out = Vec::new();
        for c in clients {
            out.push(
                tokio::time::timeout(Duration::from_secs(30), c)
                    .await
                    .expect("client bounded")
                    .expect("client task"),
            );
        }
        out
    });
    let mut codes: HashMap<String, usize> = HashMap::new();
    for (i, (ending, after)) in endings.iter().enumerate() {
        match ending {
            Ending::Close(Some(1012), _) => *codes.entry("1012".into()).or_default() += 1,
            other => {
                *codes.entry(format!("{other:?}")).or_default() += 1;
                failures
                    .push(format!("client {i}: {other:?} (then {after:?}), expected Close 1012"));
            }
        }
    }
    eprintln!("second SIGTERM -> exit {:.3} s; endings {codes:?}", secs(took));
    for line in log.lines().filter(|l| l.to_lowercase().contains("drain") || l.contains("SIGTERM"))
    {
        eprintln!("  {line}");
    }
    drop(rt);
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}\nlog:\n{log}",
        failures.len(),
        failures.join("\n")
    );
}
