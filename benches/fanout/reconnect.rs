//! The reconnect-wave scenario (issue 18): one livegate node with N clients
//! that behave like livegate.js, drained with SIGTERM and started again on the same port
//! and data dir. It counts the calls that reach the customer's auth backend during the
//! wave and times SIGTERM → every client reconnected and resubscribed, with resume
//! credentials (mode on) and without (mode off: a fresh token for every attempt).
//!
//! The backend is a stand-in token endpoint served here (`GET /token?user=U`): it counts
//! every call and mints through livegate's `POST /v1/tokens`. Clients follow livegate.js:
//! after a close 1012 they wait the delay its reason suggests (`reconnect in N ms`) plus
//! up to [`HINT_JITTER_MS`]; after a failed attempt they back off in livegate.js's tiers
//! with full jitter; a `401` to a resume credential drops it at once.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_tungstenite::tungstenite::Message;

use crate::http::HttpClient;
use crate::servers::{Paths, API_KEY, SERVER_CPU};

/// livegate.js's backoff tiers after a failed attempt (`DEFAULT_TIMINGS.backoffMs`): the
/// k-th failure in a row waits random() × tier k.
const BACKOFF_MS: [u64; 5] = [0, 2000, 5000, 10000, 30000];
/// Added at random to the delay a 1012 close suggests.
pub const HINT_JITTER_MS: u64 = 250;
/// The drain's spread: closes (and their suggested delays) over this many seconds.
const DRAIN_SPREAD_SECS: u64 = 2;
/// Longest wait for every client to be back after the SIGTERM.
const WAVE_LIMIT: Duration = Duration::from_secs(180);
/// Handshakes in flight at once while the clients first connect.
const FIRST_CONNECTS: usize = 128;

/// What one wave measured.
pub struct Wave {
    pub clients: usize,
    /// Calls to the token endpoint from the SIGTERM until every client was back.
    pub backend_calls: u64,
    /// SIGTERM → the last client's `subscribed` on the restarted node.
    pub all_back: Duration,
    /// The median client: SIGTERM → its `subscribed` on the restarted node.
    pub median_back: Duration,
    /// The drain itself: SIGTERM → the old process exited.
    pub drain: Duration,
    /// SIGTERM → the restarted node answering `/readyz` 200.
    pub ready_again: Duration,
    /// Connection attempts that failed during the wave (refused, 503, 401...).
    pub failed_attempts: u64,
    /// Handshakes the restarted node accepted, by credential.
    pub resume_handshakes: f64,
    pub token_handshakes: f64,
}

/// A livegate process pinned to the servers' CPU, on a fixed address and data dir.
struct Node {
    child: Child,
}

impl Node {
    async fn start(
        paths: &Paths,
        addr: SocketAddr,
        data_dir: &Path,
        logs: &Path,
    ) -> Result<Node, String> {
        // The same port right after the old process left: retry while it is still held.
        for attempt in 0..40 {
            let mut cmd = Command::new("taskset");
            for var in [
                "LIVEGATE_MAX_CONNECTIONS",
                "LIVEGATE_MAX_CONNECTIONS_PER_IP",
                "LIVEGATE_HANDSHAKES_PER_IP_PER_SEC",
            ] {
                cmd.env(var, "0");
            }
            let log = |name: &str| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(logs.join(name))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null())
            };
            cmd.arg("-c")
                .arg(SERVER_CPU.to_string())
                .arg(&paths.livegate_bin)
                .arg("serve")
                .args(["--listen", &addr.to_string()])
                .arg("--data-dir")
                .arg(data_dir)
                .args(["--api-key", API_KEY])
                .args([
                    "--drain-wait-secs",
                    "0",
                    "--drain-spread-secs",
                    &DRAIN_SPREAD_SECS.to_string(),
                ])
                .args(["--drain-grace-secs", "5", "--log-format", "json"])
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(log("stdout.log"))
                .stderr(log("stderr.log"));
            let mut child = cmd.spawn().map_err(|e| format!("spawn livegate: {e}"))?;
            let started = Instant::now();
            let mut http = HttpClient::new(addr, None);
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    if attempt < 39 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        break;
                    }
                    return Err(format!(
                        "livegate exited at start ({status}); see {}",
                        logs.join("stderr.log").display()
                    ));
                }
                if matches!(http.get("/readyz").await, Ok(r) if r.status == 200) {
                    return Ok(Node { child });
                }
                if started.elapsed() > Duration::from_secs(30) {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("livegate not ready after 30 s".into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Err("livegate could not listen on its port again".into())
    }

    /// SIGTERM; resolves when the process has exited (the drain is over).
    async fn terminate(&mut self) -> Result<(), String> {
        // SAFETY: signalling our own child, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("the drained node did not exit within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The stand-in for the customer's token endpoint: counts calls, mints through livegate.
async fn token_endpoint(livegate: SocketAddr, calls: Rc<Cell<u64>>) -> Result<SocketAddr, String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("token endpoint: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::task::spawn_local(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { continue };
            let calls = calls.clone();
            tokio::task::spawn_local(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                calls.set(calls.get() + 1);
                let text = String::from_utf8_lossy(&head);
                let user = text
                    .split_whitespace()
                    .nth(1)
                    .and_then(|p| p.split_once("user="))
                    .map(|(_, u)| u.to_string());
                let (status, body) = match user {
                    Some(user) => mint(livegate, &user).await,
                    None => ("400 Bad Request", "no user".to_string()),
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(addr)
}

async fn mint(livegate: SocketAddr, user: &str) -> (&'static str, String) {
    let body = format!(r#"{{"user":"{user}","device":"web","ttl_secs":600}}"#);
    match HttpClient::new(livegate, Some(API_KEY)).post("/v1/tokens", body.as_bytes()).await {
        Ok(r) if r.status == 201 => {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            match v["token"].as_str() {
                Some(token) => ("200 OK", token.to_string()),
                None => ("502 Bad Gateway", "no token".into()),
            }
        }
        Ok(r) => ("502 Bad Gateway", format!("livegate answered {}", r.status)),
        Err(e) => ("502 Bad Gateway", format!("livegate unreachable: {e}")),
    }
}

/// What all clients share: when each was last subscribed, failures, the clock of the wave.
struct Shared {
    /// Clients subscribed since the wave started (before it: since the start).
    back: Cell<usize>,
    /// Per client: when it was subscribed since the wave started.
    counted: RefCell<Vec<Option<Instant>>>,
    last_back: Cell<Option<Instant>>,
    failed: Cell<u64>,
    first_connects: Semaphore,
}

impl Shared {
    fn subscribed(&self, i: usize) {
        let mut counted = self.counted.borrow_mut();
        if counted[i].is_none() {
            let now = Instant::now();
            counted[i] = Some(now);
            self.back.set(self.back.get() + 1);
            self.last_back.set(Some(now));
        }
    }

    /// From now on count the clients subscribed again.
    fn start_wave(&self) {
        self.counted.borrow_mut().iter_mut().for_each(|c| *c = None);
        self.back.set(0);
        self.failed.set(0);
    }
}

/// A small xorshift: full jitter without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if n == 0 {
            0
        } else {
            self.0 % n
        }
    }
}

/// The delay in ms a close reason suggests (`... reconnect in 1234 ms`), as livegate.js reads it.
fn suggested_ms(reason: &str) -> Option<u64> {
    let at = reason.find(" ms")?;
    reason[..at].rsplit(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// How one connection ended.
enum Outcome {
    /// Closed by the server with 1012 (or 1001): wait the suggested delay.
    Restart(Option<u64>),
    /// Failed or lost: back off.
    Failed,
    /// The bench is over.
    Stop,
}

/// One client like livegate.js: its own user, one room, reconnects until `stop`.
#[allow(clippy::too_many_arguments)]
async fn client(
    i: usize,
    room: String,
    livegate: SocketAddr,
    tokens: SocketAddr,
    resume_mode: bool,
    shared: Rc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let user = format!("w{i}");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut resume: Option<String> = None;
    let mut session: Option<String> = None;
    let mut failures = 0usize;
    let mut first = Some(shared.first_connects.acquire().await.expect("semaphore"));
    loop {
        if *stop.borrow() {
            return;
        }
        let outcome = tokio::select! {
            o = attempt(i, &user, &room, livegate, tokens, resume_mode, &mut resume, &mut session, &shared, &mut first) => o,
            _ = stop.changed() => Outcome::Stop,
        };
        // The first attempt's turn among the first connects is over, whatever came of it.
        first = None;
        let delay = match outcome {
            Outcome::Stop => return,
            Outcome::Restart(hint) => {
                failures = 0;
                hint.unwrap_or_else(|| rng.below(3000)) + rng.below(HINT_JITTER_MS)
            }
            Outcome::Failed => {
                shared.failed.set(shared.failed.get() + 1);
                let tier = BACKOFF_MS[failures.min(BACKOFF_MS.len() - 1)];
                failures += 1;
                rng.below(tier)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One connection attempt and, when it opens, the connection until it ends.
#[allow(clippy::too_many_arguments)]
async fn attempt(
    i: usize,
    user: &str,
    room: &str,
    livegate: SocketAddr,
    tokens: SocketAddr,
    resume_mode: bool,
    resume: &mut Option<String>,
    session: &mut Option<String>,
    shared: &Shared,
    first: &mut Option<tokio::sync::SemaphorePermit<'_>>,
) -> Outcome {
    let url = match resume.as_deref() {
        Some(r) if resume_mode => format!("ws://{livegate}/v1/ws?resume={r}"),
        _ => {
            let reply = HttpClient::new(tokens, None).get(&format!("/token?user={user}")).await;
            let token = match reply {
                Ok(r) if r.status == 200 => String::from_utf8_lossy(&r.body).into_owned(),
                _ => return Outcome::Failed,
            };
            match session.as_deref() {
                Some(s) => format!("ws://{livegate}/v1/ws?token={token}&session={s}"),
                None => format!("ws://{livegate}/v1/ws?token={token}"),
            }
        }
    };
    let mut ws = match crate::load::connect(livegate, &url, false).await {
        Ok(ws) => ws,
        Err(e) => {
            if resume_mode && resume.is_some() && e.contains("HTTP error: 401") {
                // resume_invalid: a fresh token at once, as livegate.js over SSE.
                *resume = None;
                return Outcome::Restart(Some(0));
            }
            return Outcome::Failed;
        }
    };
    let mut subscribed = false;
    loop {
        let message = match tokio::time::timeout(Duration::from_secs(60), ws.next()).await {
            Ok(m) => m,
            Err(_) => return Outcome::Failed,
        };
        match message {
            Some(Ok(Message::Text(text))) => {
                if !subscribed && text.contains(r#""op":"welcome""#) {
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                    *session = v["session"].as_str().map(str::to_string);
                    *resume =
                        if resume_mode { v["resume"].as_str().map(str::to_string) } else { None };
                    let subscribe = format!(r#"{{"op":"subscribe","room":"{room}","ref":1}}"#);
                    if ws.send(Message::Text(subscribe)).await.is_err() {
                        return Outcome::Failed;
                    }
                } else if !subscribed
                    && text.contains(r#""op":"subscribed""#)
                    && text.contains(r#""ref":1"#)
                {
                    subscribed = true;
                    shared.subscribed(i);
                    first.take();
                }
            }
            Some(Ok(Message::Close(frame))) => {
                let _ = ws.close(None).await;
                return match frame {
                    Some(f) if matches!(u16::from(f.code), 1012 | 1001) => {
                        Outcome::Restart(suggested_ms(&f.reason))
                    }
                    _ => Outcome::Failed,
                };
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return Outcome::Failed,
        }
    }
}

/// The value of `series` in livegate's `/metrics`.
async fn metric(addr: SocketAddr, series: &str) -> f64 {
    let Ok(r) = HttpClient::new(addr, None).get("/metrics").await else { return f64::NAN };
    String::from_utf8_lossy(&r.body)
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// One wave: start a node, connect `clients` clients over `rooms` rooms, SIGTERM, start it
/// again on the same port and data dir, wait until every client is subscribed again.
pub async fn wave(
    paths: &Paths,
    clients: usize,
    rooms: usize,
    resume_mode: bool,
    status: &dyn Fn(String),
) -> Result<Wave, String> {
    std::fs::create_dir_all(&paths.scratch).map_err(|e| e.to_string())?;
    let dir = tempfile::Builder::new()
        .prefix("reconnect-")
        .disable_cleanup(std::env::var_os("FANOUT_KEEP_SCRATCH").is_some())
        .tempdir_in(&paths.scratch)
        .map_err(|e| e.to_string())?;
    let data_dir: PathBuf = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut node = Node::start(paths, addr, &data_dir, dir.path()).await?;
    let calls = Rc::new(Cell::new(0u64));
    let tokens = token_endpoint(addr, calls.clone()).await?;
    let shared = Rc::new(Shared {
        back: Cell::new(0),
        counted: RefCell::new(vec![None; clients]),
        last_back: Cell::new(None),
        failed: Cell::new(0),
        first_connects: Semaphore::new(FIRST_CONNECTS),
    });
    let (stop_tx, stop) = watch::channel(false);
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let room = format!("r{}", i % rooms.max(1));
            tokio::task::spawn_local(client(
                i,
                room,
                addr,
                tokens,
                resume_mode,
                shared.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let wait_all = |what: &'static str| {
        let shared = shared.clone();
        async move {
            let deadline = Instant::now() + WAVE_LIMIT;
            while shared.back.get() < clients {
                if Instant::now() > deadline {
                    return Err(format!(
                        "{what}: only {} of {clients} clients subscribed within {WAVE_LIMIT:?}",
                        shared.back.get()
                    ));
                }
                status(format!("{what}: {}/{clients} subscribed", shared.back.get()));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(())
        }
    };
    let result = async {
        wait_all("connecting").await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let calls_before = calls.get();
        shared.start_wave();
        let sigterm = Instant::now();
        node.terminate().await?;
        let drain = sigterm.elapsed();
        node = Node::start(paths, addr, &data_dir, dir.path()).await?;
        let ready_again = sigterm.elapsed();
        wait_all("reconnect wave").await?;
        let all_back = shared.last_back.get().map_or(Duration::ZERO, |t| t.duration_since(sigterm));
        let mut back: Vec<Duration> =
            shared.counted.borrow().iter().flatten().map(|t| t.duration_since(sigterm)).collect();
        back.sort_unstable();
        let median_back = back.get(back.len() / 2).copied().unwrap_or_default();
        Ok::<_, String>(Wave {
            clients,
            backend_calls: calls.get() - calls_before,
            all_back,
            median_back,
            drain,
            ready_again,
            failed_attempts: shared.failed.get(),
            resume_handshakes: metric(addr, "livegate_handshakes_total{credential=\"resume\"}")
                .await,
            token_handshakes: metric(addr, "livegate_handshakes_total{credential=\"token\"}").await,
        })
    }
    .await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    drop(node);
    result
}
