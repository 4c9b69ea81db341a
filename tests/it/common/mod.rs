//! Shared harness for the integration tests: a real livegate server on `127.0.0.1:0`
//! with a temporary sled directory, a blocking HTTP client for the backend API, and a
//! WebSocket client (tokio-tungstenite) for the wire protocol.
//!
//! Every wait is bounded: a helper that waits takes or uses a timeout and panics with
//! what it was waiting for, so a misbehaving server fails a test instead of hanging it.
//!
//! Every test enters `concurrency`'s gate first (`let _gate = crate::common::gate!();`):
//! tests of different modules never run at the same time, as when each module was a
//! test binary of its own; the rule and why are in `concurrency.rs`.

#![allow(dead_code)]

pub mod balancer;
pub mod cells;
pub mod clock;
pub mod concurrency;
pub mod link;
pub mod nats;
pub mod process;
pub mod swarm;

pub use clock::*;
pub(crate) use concurrency::gate;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use livegate::config::Config;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The repository's root: the integration tests are the package in `tests/it`.
pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The `livegate` binary under test: the build beside this test binary
/// (`target/release/livegate`). `cargo test` builds it with the tests, for the root
/// package's `tests/binary.rs`.
pub fn livegate_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/release/deps/it-HASH
    let bin =
        exe.parent().and_then(Path::parent).map(|dir| dir.join("livegate")).expect("target dir");
    assert!(
        bin.exists(),
        "{} not found: build it with `cargo build --release` (cargo test builds it)",
        bin.display()
    );
    bin
}

/// The API key every test server is started with.
pub const API_KEY: &str = "test-api-key-0123456789";
/// The node name every test server reports.
pub const NODE: &str = "test-node";
/// Default bound for anything that should happen "soon" (a reply, an event).
pub const WAIT: Duration = Duration::from_secs(10);
/// How long a test listens to conclude that nothing more arrives.
pub const QUIET: Duration = Duration::from_millis(400);

// ---------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------

/// A livegate server running on its own thread inside its own actix system.
pub struct TestServer {
    pub addr: SocketAddr,
    pub config: Config,
    dir: Option<TempDir>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl TestServer {
    /// Starts a server on a fresh temporary data dir. `tweak` adjusts the test defaults.
    pub fn start(tweak: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::Builder::new().prefix("livegate-test-").tempdir().expect("tempdir");
        TestServer::start_in(dir, tweak)
    }

    /// Starts a server on an existing data dir (for example one returned by [`stop`]).
    pub fn start_in(dir: TempDir, tweak: impl FnOnce(&mut Config)) -> TestServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        TestServer::start_on_listener(listener, dir, tweak)
    }

    /// Starts a server on `dir` listening on the given address (for example the address
    /// of a server stopped a moment ago), retrying the bind for up to 10 s.
    pub fn start_at(addr: SocketAddr, dir: TempDir, tweak: impl FnOnce(&mut Config)) -> TestServer {
        let listener = wait_for(Duration::from_secs(10), || std::net::TcpListener::bind(addr).ok())
            .unwrap_or_else(|| {
                panic!(
                    "could not bind {addr} again within 10 s: {:?}",
                    std::net::TcpListener::bind(addr).err()
                )
            });
        TestServer::start_on_listener(listener, dir, tweak)
    }

    fn start_on_listener(
        listener: std::net::TcpListener,
        dir: TempDir,
        tweak: impl FnOnce(&mut Config),
    ) -> TestServer {
        TestServer::start_on_listener_probed(listener, dir, tweak, true)
    }

    /// Starts a server on a fresh temporary data dir without waiting for `GET /readyz`
    /// over plain HTTP (for a TLS listener: the caller probes it its own way).
    pub fn start_unprobed(tweak: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::Builder::new().prefix("livegate-test-").tempdir().expect("tempdir");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        TestServer::start_on_listener_probed(listener, dir, tweak, false)
    }

    /// Whether the server thread has ended (it failed to start or stopped).
    pub fn thread_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    fn start_on_listener_probed(
        listener: std::net::TcpListener,
        dir: TempDir,
        tweak: impl FnOnce(&mut Config),
        probe: bool,
    ) -> TestServer {
        let addr = listener.local_addr().expect("local addr");
        let mut config = test_config(dir.path(), addr);
        tweak(&mut config);
        config.validate().unwrap_or_else(|e| panic!("test config is invalid: {e:?}"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let run_config = config.clone();
        let thread = std::thread::Builder::new()
            .name(format!("livegate-server-{}", addr.port()))
            .spawn(move || {
                actix_web::rt::System::new()
                    .block_on(livegate::server::run(listener, run_config, async move {
                        let _ = rx.await;
                    }))
                    .map_err(|e| format!("{e:?}"))
            })
            .expect("spawn server thread");
        let mut server =
            TestServer { addr, config, dir: Some(dir), shutdown: Some(tx), thread: Some(thread) };
        if probe {
            server.wait_ready();
        }
        server
    }

    fn wait_ready(&mut self) {
        let http = self.http();
        let ready = wait_until(Duration::from_secs(20), || {
            self.thread_finished()
                || matches!(
                    http.try_request("GET", "/readyz", Auth::None, Body::None),
                    Ok((200, _))
                )
        });
        if self.thread_finished() {
            let result = self.thread.take().map(|t| t.join());
            panic!("server exited before it became ready: {result:?}");
        }
        assert!(ready, "server on {} not ready (GET /readyz != 200) within 20 s", self.addr);
    }

    /// Signals shutdown, waits (bounded) for `run` to return, and hands back the data dir
    /// so a new server can be started on it.
    pub fn stop(mut self) -> TempDir {
        self.shutdown_and_join(Duration::from_secs(30));
        self.dir.take().expect("data dir")
    }

    fn shutdown_and_join(&mut self, limit: Duration) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            assert!(
                wait_until(limit, || thread.is_finished()),
                "server on {} did not stop within {limit:?} after shutdown",
                self.addr
            );
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("server::run returned an error: {e}"),
                Err(_) => panic!("server thread panicked"),
            }
        }
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.as_ref().expect("data dir").path()
    }

    pub fn http(&self) -> Http {
        Http::new(self.addr)
    }

    /// Mints a token (asserting 201) for `user` on `device`.
    pub fn mint_token(&self, user: &str, device: &str) -> String {
        self.http().mint_token(user, device)
    }

    pub fn publish(&self, room: &str, id: Option<&str>, data: Value) -> (u16, Value) {
        self.http().publish(room, id, data)
    }

    pub fn history(&self, room: &str, since: Option<u64>, limit: Option<u64>) -> (u16, Value) {
        self.http().history(room, since, limit)
    }

    /// Mints a token for `user` (device "web") and connects with it.
    pub async fn client(&self, user: &str) -> WsClient {
        let token = self.mint_token(user, "web");
        WsClient::connect(self.addr, &token, None).await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Do not turn a failing assertion into a hang: signal and leave.
            if let Some(tx) = self.shutdown.take() {
                let _ = tx.send(());
            }
            return;
        }
        self.shutdown_and_join(Duration::from_secs(30));
    }
}

/// The server still does its whole job for a newcomer: a fresh connection subscribes,
/// an event published over HTTP reaches it, `/healthz` is 200.
pub async fn assert_serves(server: &TestServer, user: &str, room: &str) {
    let (status, body) = server.http().request("GET", "/healthz", Auth::None, Body::None);
    assert_eq!(status, 200, "/healthz: {body}");
    let mut c = server.client(user).await;
    c.subscribe_ok(room).await;
    server.http().publish_ok(room, None, json!({"still": "serving"}));
    let events = c.next_events(1).await;
    assert_eq!(events[0]["data"], json!({"still": "serving"}), "{events:?}");
    c.close().await;
}

/// The configuration tests start from: port 0, temp dir, fixed key and node name, fast
/// drain so `stop()` is quick. Everything else is the product default.
pub fn test_config(dir: &Path, addr: SocketAddr) -> Config {
    Config {
        listen: addr,
        data_dir: dir.to_path_buf(),
        api_key: Some(API_KEY.to_string()),
        node: NODE.to_string(),
        batch_window_ms: 100,
        drain_wait_secs: 0,
        drain_spread_secs: 0,
        drain_grace_secs: 1,
        ..Config::default()
    }
}

// ---------------------------------------------------------------------------------------
// HTTP (blocking; call from sync code or directly from a test body)
// ---------------------------------------------------------------------------------------

pub enum Auth<'a> {
    None,
    Key,
    Header(&'a str),
}

pub enum Body<'a> {
    None,
    Json(Value),
    Raw(&'a str),
}

#[derive(Clone)]
pub struct Http {
    pub addr: SocketAddr,
    agent: ureq::Agent,
}

impl Http {
    pub fn new(addr: SocketAddr) -> Http {
        Http::with_timeout(addr, Duration::from_secs(20))
    }

    /// An [`Http`] whose requests give up after `timeout` (a client that retries
    /// elsewhere when a node does not answer).
    pub fn with_timeout(addr: SocketAddr, timeout: Duration) -> Http {
        let agent = ureq::AgentBuilder::new().timeout(timeout).build();
        Http { addr, agent }
    }

    /// Sends one request; returns the status and the body parsed as JSON (a body that is
    /// not JSON comes back as a JSON string, an empty body as `null`).
    pub fn request(&self, method: &str, path: &str, auth: Auth, body: Body) -> (u16, Value) {
        self.try_request(method, path, auth, body)
            .unwrap_or_else(|e| panic!("{method} {path}: transport error: {e}"))
    }

    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        auth: Auth,
        body: Body,
    ) -> Result<(u16, Value), String> {
        let url = format!("http://{}{}", self.addr, path);
        let mut req = self.agent.request(method, &url);
        match auth {
            Auth::None => {}
            Auth::Key => req = req.set("Authorization", &format!("Bearer {API_KEY}")),
            Auth::Header(h) => req = req.set("Authorization", h),
        }
        let result = match body {
            Body::None => req.call(),
            Body::Json(v) => req.send_json(v),
            Body::Raw(s) => req.set("Content-Type", "application/json").send_string(s),
        };
        let resp = match result {
            Ok(resp) => resp,
            Err(ureq::Error::Status(_, resp)) => resp,
            Err(e) => return Err(e.to_string()),
        };
        let status = resp.status();
        let text = resp.into_string().map_err(|e| e.to_string())?;
        let value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, value))
    }

    pub fn mint_token_raw(&self, body: Value) -> (u16, Value) {
        self.request("POST", "/v1/tokens", Auth::Key, Body::Json(body))
    }

    pub fn mint_token(&self, user: &str, device: &str) -> String {
        let (status, body) = self.mint_token_raw(json!({"user": user, "device": device}));
        assert_eq!(status, 201, "POST /v1/tokens for {user}/{device}: {body}");
        body["token"].as_str().unwrap_or_else(|| panic!("no token in {body}")).to_string()
    }

    pub fn publish(&self, room: &str, id: Option<&str>, data: Value) -> (u16, Value) {
        let mut body = json!({ "data": data });
        if let Some(id) = id {
            body["id"] = json!(id);
        }
        self.request("POST", &format!("/v1/rooms/{room}/events"), Auth::Key, Body::Json(body))
    }

    /// Publishes and asserts 201; returns the reply.
    pub fn publish_ok(&self, room: &str, id: Option<&str>, data: Value) -> Value {
        let (status, body) = self.publish(room, id, data);
        assert_eq!(status, 201, "publish to {room}: {body}");
        body
    }

    pub fn history(&self, room: &str, since: Option<u64>, limit: Option<u64>) -> (u16, Value) {
        let mut query = Vec::new();
        if let Some(s) = since {
            query.push(format!("since={s}"));
        }
        if let Some(l) = limit {
            query.push(format!("limit={l}"));
        }
        let q = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
        self.request("GET", &format!("/v1/rooms/{room}/events{q}"), Auth::Key, Body::None)
    }

    /// GET history, asserting 200; returns the body.
    /// The `/metrics` text (asserting 200).
    pub fn metrics_text(&self) -> String {
        let (status, body) = self.request("GET", "/metrics", Auth::None, Body::None);
        assert_eq!(status, 200, "GET /metrics: {body}");
        match body {
            Value::String(s) => s,
            other => panic!("/metrics is not text: {other}"),
        }
    }

    /// The value of one series of `/metrics`, named exactly as exposed (for example
    /// `livegate_directory_writes_total{result="ok"}`); `None` when the series is absent.
    pub fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.metrics_text(), series)
    }

    /// Polls `/metrics` until metric `name`, summed over its labels as in
    /// [`Http::metric_total`], reads `want`; panics after `within` with the exposition.
    pub fn wait_metric_total(&self, name: &str, want: f64, within: Duration) {
        let reached =
            wait_until_every(within, Duration::from_millis(20), || self.metric_total(name) == want);
        assert!(reached, "{name} is not {want} within {within:?}:\n{}", self.metrics_text());
    }

    /// The sum of all series of metric `name`, whatever their labels; 0 when absent.
    pub fn metric_total(&self, name: &str) -> f64 {
        metric_sum(&self.metrics_text(), name).unwrap_or(0.0)
    }

    pub fn history_ok(&self, room: &str, since: Option<u64>, limit: Option<u64>) -> Value {
        let (status, body) = self.history(room, since, limit);
        assert_eq!(status, 200, "GET history of {room}: {body}");
        body
    }
}

/// The value of `series` (metric name plus its exact label set, if any) in a
/// Prometheus/OpenMetrics text exposition; `None` when absent.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (name, rest) = line.split_at(line.find(' ')?);
        if name != series {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The sum of every series of metric `name` whatever its labels (`name` alone or
/// `name{...}`); `None` when there is none.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, rest) = line.split_at(line.find(' ')?);
            let matches =
                series == name || series.strip_prefix(name).is_some_and(|r| r.starts_with('{'));
            if !matches {
                return None;
            }
            rest.split_whitespace().next()?.parse().ok()
        })
        .collect();
    if values.is_empty() {
        None
    } else {
        Some(values.iter().sum())
    }
}

/// `body["error"]["code"]` as a str ("" when absent).
pub fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

pub fn seq_of(event: &Value) -> u64 {
    event["seq"].as_u64().unwrap_or_else(|| panic!("event without numeric seq: {event}"))
}

pub fn seqs(events: &[Value]) -> Vec<u64> {
    events.iter().map(seq_of).collect()
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis()
        as u64
}

// ---------------------------------------------------------------------------------------
// WebSocket client
// ---------------------------------------------------------------------------------------

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What one read from the socket gave.
#[derive(Debug)]
pub enum Incoming {
    Json(Value),
    /// A Close frame with its code (if any) and reason.
    Close(Option<u16>, String),
    /// The stream ended or failed without a Close frame.
    Ended(String),
    Timeout,
}

/// The server refused the handshake.
#[derive(Debug)]
pub struct Rejected {
    pub status: u16,
    pub body: Value,
}

/// The server refused the handshake; with the response headers (names lower-cased).
#[derive(Debug)]
pub struct RejectedWithHeaders {
    pub status: u16,
    pub body: Value,
    pub headers: Vec<(String, String)>,
}

impl RejectedWithHeaders {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

pub struct WsClient {
    pub ws: Ws,
    pub welcome: Value,
    /// Frames read while waiting for something else, handed out first.
    backlog: VecDeque<Value>,
    /// The unsolicited `subscribed` notice for the user's own inbox room (`user:<id>`),
    /// kept apart so tests about other rooms need not expect it.
    pub inbox_subscribed: Option<Value>,
    /// Events already read out of a frame but not yet handed out.
    pending_events: VecDeque<Value>,
    next_ref: u64,
    /// When the server was last heard from (any frame, pings included): a client tells a
    /// dead connection from a quiet one by it, as livegate.js does.
    pub last_heard: Instant,
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn ws_url(addr: SocketAddr, token: Option<&str>, session: Option<&str>) -> String {
    let mut q = Vec::new();
    if let Some(t) = token {
        q.push(format!("token={}", percent_encode(t)));
    }
    if let Some(s) = session {
        q.push(format!("session={}", percent_encode(s)));
    }
    let q = if q.is_empty() { String::new() } else { format!("?{}", q.join("&")) };
    format!("ws://{addr}/v1/ws{q}")
}

impl WsClient {
    /// Connects and reads the `welcome` frame; panics if either fails.
    pub async fn connect(addr: SocketAddr, token: &str, session: Option<&str>) -> WsClient {
        match WsClient::try_connect_url(&ws_url(addr, Some(token), session)).await {
            Ok(c) => c,
            Err(r) => panic!("handshake rejected: {} {}", r.status, r.body),
        }
    }

    pub async fn try_connect(
        addr: SocketAddr,
        token: Option<&str>,
        session: Option<&str>,
    ) -> Result<WsClient, Rejected> {
        WsClient::try_connect_url(&ws_url(addr, token, session)).await
    }

    pub async fn try_connect_url(url: &str) -> Result<WsClient, Rejected> {
        WsClient::try_connect_url_with_headers(url)
            .await
            .map_err(|r| Rejected { status: r.status, body: r.body })
    }

    /// Like [`WsClient::try_connect`], but a refusal keeps the response headers.
    pub async fn try_connect_with_headers(
        addr: SocketAddr,
        token: Option<&str>,
        session: Option<&str>,
    ) -> Result<WsClient, RejectedWithHeaders> {
        WsClient::try_connect_url_with_headers(&ws_url(addr, token, session)).await
    }

    pub async fn try_connect_url_with_headers(url: &str) -> Result<WsClient, RejectedWithHeaders> {
        let connected = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
            .await
            .unwrap_or_else(|_| panic!("WebSocket handshake to {url} timed out"));
        WsClient::after_handshake(connected, url).await
    }

    /// A handshake to `addr` with `token`, from the local address `from` (for example
    /// 127.0.0.2; `None`: the system's choice) and with extra request `headers` (for
    /// example `Origin`). A refusal keeps the response headers.
    pub async fn try_connect_custom(
        addr: SocketAddr,
        token: Option<&str>,
        from: Option<std::net::IpAddr>,
        headers: &[(&str, &str)],
    ) -> Result<WsClient, RejectedWithHeaders> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = ws_url(addr, token, None);
        let mut request = url.as_str().into_client_request().expect("client request");
        for (name, value) in headers {
            let name =
                tungstenite::http::HeaderName::from_bytes(name.as_bytes()).expect("header name");
            request.headers_mut().insert(name, value.parse().expect("header value"));
        }
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }
        .expect("socket");
        if let Some(ip) = from {
            socket.bind(SocketAddr::new(ip, 0)).unwrap_or_else(|e| panic!("bind {ip}:0: {e}"));
        }
        let connected = tokio::time::timeout(WAIT, async {
            let stream =
                socket.connect(addr).await.unwrap_or_else(|e| panic!("TCP connect to {addr}: {e}"));
            tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(stream)).await
        })
        .await
        .unwrap_or_else(|_| panic!("WebSocket handshake to {url} timed out"));
        WsClient::after_handshake(connected, &url).await
    }

    /// [`WsClient::try_connect_custom`], panicking on a refusal.
    pub async fn connect_custom(
        addr: SocketAddr,
        token: &str,
        from: Option<std::net::IpAddr>,
        headers: &[(&str, &str)],
    ) -> WsClient {
        match WsClient::try_connect_custom(addr, Some(token), from, headers).await {
            Ok(c) => c,
            Err(r) => panic!("handshake rejected: {} {}", r.status, r.body),
        }
    }

    async fn after_handshake(
        connected: Result<(Ws, tungstenite::handshake::client::Response), tungstenite::Error>,
        url: &str,
    ) -> Result<WsClient, RejectedWithHeaders> {
        let ws = match connected {
            Ok((ws, _resp)) => ws,
            Err(tungstenite::Error::Http(resp)) => {
                let status = resp.status().as_u16();
                let headers = resp
                    .headers()
                    .iter()
                    .map(|(n, v)| {
                        (
                            n.as_str().to_ascii_lowercase(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect();
                let body = resp
                    .body()
                    .as_ref()
                    .map(|b| {
                        serde_json::from_slice(b)
                            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b).into()))
                    })
                    .unwrap_or(Value::Null);
                return Err(RejectedWithHeaders { status, body, headers });
            }
            Err(e) => panic!("WebSocket handshake to {url} failed: {e}"),
        };
        let mut client = WsClient {
            ws,
            welcome: Value::Null,
            backlog: VecDeque::new(),
            inbox_subscribed: None,
            pending_events: VecDeque::new(),
            next_ref: 1,
            last_heard: Instant::now(),
        };
        let welcome = client.recv_json().await;
        if welcome["op"] == "error" {
            return Err(client.refused_after_upgrade(welcome).await);
        }
        assert_eq!(welcome["op"], "welcome", "first frame must be welcome, got {welcome}");
        client.welcome = welcome;
        Ok(client)
    }

    /// A refusal the server sends on an accepted socket (browsers cannot read a refused
    /// upgrade): an `error` frame, then close 4421 (wrong node) or 4029 (migration
    /// budget). Reported as its HTTP twin (421, or 429 with `retry-after` from the close
    /// reason) with the frame as the error body and the close as `close-code`/`close-reason`.
    async fn refused_after_upgrade(mut self, frame: Value) -> RejectedWithHeaders {
        let (code, reason) = match self.read_incoming(WAIT).await {
            Incoming::Close(Some(code), reason) => (code, reason),
            other => panic!("an error frame before welcome must be followed by a close, got {other:?} after {frame}"),
        };
        let status = match code {
            4421 => 421,
            4029 => 429,
            other => panic!("error frame {frame} before welcome, then close {other} {reason:?}"),
        };
        let mut headers = vec![
            ("close-code".to_string(), code.to_string()),
            ("close-reason".to_string(), reason.clone()),
        ];
        if code == 4029 {
            headers.push(("retry-after".to_string(), reason));
        }
        let mut error = frame;
        if let Some(object) = error.as_object_mut() {
            object.remove("op");
        }
        RejectedWithHeaders { status, body: serde_json::json!({ "error": error }), headers }
    }

    /// Connects with `token` (and `session`) through `addr`, following one wrong-node
    /// refusal to the node it names, as livegate.js does; returns the client and the
    /// node it was sent to, if any.
    pub async fn connect_following(
        addr: SocketAddr,
        token: &str,
        session: Option<&str>,
    ) -> (WsClient, Option<String>) {
        match WsClient::try_connect(addr, Some(token), session).await {
            Ok(client) => (client, None),
            Err(r) if r.status == 421 => {
                let url = r.body["error"]["url"]
                    .as_str()
                    .unwrap_or_else(|| panic!("421 without url: {}", r.body));
                let node = r.body["error"]["node"].as_str().unwrap_or_default().to_string();
                let to: SocketAddr = url
                    .trim_start_matches("http://")
                    .trim_end_matches('/')
                    .parse()
                    .expect("node URL host:port");
                match WsClient::try_connect(to, Some(token), session).await {
                    Ok(client) => (client, Some(node)),
                    Err(r) => {
                        panic!("sent to {node} ({url}), refused there: {} {}", r.status, r.body)
                    }
                }
            }
            Err(r) => panic!("handshake rejected: {} {}", r.status, r.body),
        }
    }

    pub fn session(&self) -> &str {
        self.welcome["session"].as_str().unwrap_or("")
    }

    /// Reads one thing from the socket (not the backlog), skipping ping/pong frames
    /// (tungstenite queues the pong answers itself and flushes them on the next read).
    pub async fn read_incoming(&mut self, within: Duration) -> Incoming {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let next = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return Incoming::Timeout,
                Ok(n) => n,
            };
            if matches!(next, Some(Ok(_))) {
                self.last_heard = Instant::now();
            }
            match next {
                None => return Incoming::Ended("stream ended".into()),
                Some(Err(e)) => return Incoming::Ended(e.to_string()),
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t)
                        .unwrap_or_else(|e| panic!("server sent non-JSON text ({e}): {t}"));
                    let inbox_notice = v["op"] == "subscribed"
                        && v.get("ref").is_none()
                        && v["room"].as_str().is_some_and(|r| r.starts_with("user:"));
                    if inbox_notice {
                        self.inbox_subscribed = Some(v);
                        continue;
                    }
                    return Incoming::Json(v);
                }
                Some(Ok(Message::Binary(b))) => {
                    panic!("server sent a binary frame ({} bytes)", b.len())
                }
                Some(Ok(Message::Close(frame))) => {
                    return match frame {
                        Some(f) => Incoming::Close(Some(u16::from(f.code)), f.reason.to_string()),
                        None => Incoming::Close(None, String::new()),
                    }
                }
                Some(Ok(_)) => continue, // Ping, Pong, raw Frame
            }
        }
    }

    /// The next thing from the connection, frames kept in the backlog first; unlike
    /// [`recv_within`](Self::recv_within) a Close or an end is returned, not a panic.
    pub async fn next_incoming(&mut self, within: Duration) -> Incoming {
        match self.backlog.pop_front() {
            Some(v) => Incoming::Json(v),
            None => self.read_incoming(within).await,
        }
    }

    /// The next JSON frame (backlog first) within `within`; `None` on timeout. Panics if
    /// the connection closes.
    pub async fn recv_within(&mut self, within: Duration) -> Option<Value> {
        if let Some(v) = self.backlog.pop_front() {
            return Some(v);
        }
        match self.read_incoming(within).await {
            Incoming::Json(v) => Some(v),
            Incoming::Timeout => None,
            other => panic!("connection closed while waiting for a frame: {other:?}"),
        }
    }

    /// The next JSON frame; panics after [`WAIT`].
    pub async fn recv_json(&mut self) -> Value {
        match self.recv_within(WAIT).await {
            Some(v) => v,
            None => panic!("no frame from the server within {WAIT:?}"),
        }
    }

    pub async fn send_json(&mut self, v: &Value) {
        self.send_text(v.to_string()).await;
    }

    pub async fn send_text(&mut self, text: String) {
        self.send_message(Message::Text(text)).await;
    }

    pub async fn send_message(&mut self, msg: Message) {
        tokio::time::timeout(WAIT, self.ws.send(msg))
            .await
            .expect("send timed out")
            .expect("send failed");
    }

    /// Sends `req` with a fresh `ref` and waits for the frame echoing that ref; frames
    /// that arrive in between are kept for later reads.
    pub async fn request(&mut self, mut req: Value) -> Value {
        let r = self.next_ref;
        self.next_ref += 1;
        req["ref"] = json!(r);
        self.send_json(&req).await;
        self.wait_for_ref(r, &req).await
    }

    pub async fn wait_for_ref(&mut self, r: u64, what: &Value) -> Value {
        let deadline = Instant::now() + WAIT;
        let mut skipped = Vec::new();
        let found = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_incoming(left).await {
                Incoming::Json(v) if v["ref"].as_u64() == Some(r) => break v,
                Incoming::Json(v) => skipped.push(v),
                Incoming::Timeout => panic!(
                    "no reply with ref {r} to {what} within {WAIT:?}; other frames: {skipped:?}"
                ),
                other => {
                    panic!("connection closed while waiting for the reply to {what}: {other:?}")
                }
            }
        };
        self.backlog.extend(skipped);
        found
    }

    pub async fn subscribe(&mut self, room: &str) -> Value {
        self.request(json!({"op": "subscribe", "room": room})).await
    }

    pub async fn subscribe_since(&mut self, room: &str, since: u64, epoch: &Value) -> Value {
        self.request(json!({"op": "subscribe", "room": room, "since": since, "epoch": epoch})).await
    }

    /// Subscribes and asserts the reply is `subscribed` for `room`.
    pub async fn subscribe_ok(&mut self, room: &str) -> Value {
        let reply = self.subscribe(room).await;
        assert_eq!(reply["op"], "subscribed", "subscribe {room}: {reply}");
        assert_eq!(reply["room"], room, "subscribe {room}: {reply}");
        reply
    }

    pub async fn unsubscribe(&mut self, room: &str) -> Value {
        self.request(json!({"op": "unsubscribe", "room": room})).await
    }

    pub async fn history_op(&mut self, room: &str, since: u64, limit: u64) -> Value {
        self.request(json!({"op": "history", "room": room, "since": since, "limit": limit})).await
    }

    /// Reads `events` frames until `n` events have been collected; returns them per
    /// frame. Extra events in the last frame are kept for the next call. Panics on a
    /// frame that is not `events`, on close, or after `within`.
    pub async fn next_event_frames_within(
        &mut self,
        n: usize,
        within: Duration,
    ) -> Vec<Vec<Value>> {
        let deadline = Instant::now() + within;
        let mut frames: Vec<Vec<Value>> = Vec::new();
        let mut got = 0;
        if !self.pending_events.is_empty() {
            let take = n.min(self.pending_events.len());
            frames.push(self.pending_events.drain(..take).collect());
            got += take;
        }
        while got < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = match self.recv_within(left).await {
                Some(f) => f,
                None => panic!(
                    "waited {within:?} for {n} events, got {got}: {:?}",
                    frames
                        .iter()
                        .flatten()
                        .map(|e| (e["room"].clone(), e["seq"].clone()))
                        .collect::<Vec<_>>()
                ),
            };
            assert_eq!(frame["op"], "events", "expected an events frame, got {frame}");
            let events = frame["events"]
                .as_array()
                .unwrap_or_else(|| panic!("events frame without array: {frame}"))
                .clone();
            assert!(!events.is_empty(), "empty events frame: {frame}");
            let need = n - got;
            if events.len() > need {
                self.pending_events.extend(events[need..].iter().cloned());
                frames.push(events[..need].to_vec());
                got = n;
            } else {
                got += events.len();
                frames.push(events);
            }
        }
        frames
    }

    /// The next `n` events within `within`, or `None` when they do not all come (the
    /// events that did come are dropped).
    pub async fn next_events_within_or_none(
        &mut self,
        n: usize,
        within: Duration,
    ) -> Option<Vec<Value>> {
        let deadline = Instant::now() + within;
        let mut got: Vec<Value> = self.pending_events.drain(..).collect();
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = self.recv_within(left).await?;
            assert_eq!(frame["op"], "events", "expected an events frame, got {frame}");
            got.extend(frame["events"].as_array().cloned().unwrap_or_default());
        }
        self.pending_events.extend(got.split_off(n));
        Some(got)
    }

    pub async fn next_event_frames(&mut self, n: usize) -> Vec<Vec<Value>> {
        self.next_event_frames_within(n, WAIT).await
    }

    /// The next `n` events, across as many `events` frames as they come in.
    pub async fn next_events(&mut self, n: usize) -> Vec<Value> {
        self.next_event_frames(n).await.into_iter().flatten().collect()
    }

    /// Asserts that nothing (no event, no reply) arrives within `d`.
    pub async fn assert_quiet(&mut self, d: Duration) {
        assert!(
            self.pending_events.is_empty(),
            "unexpected extra events: {:?}",
            self.pending_events
        );
        if let Some(v) = self.recv_within(d).await {
            panic!("expected nothing more, got {v}");
        }
    }

    /// Waits (up to `within`) for the automatic `subscribed` notice of the user's inbox
    /// room and returns it; frames read meanwhile are kept for later reads.
    pub async fn wait_inbox_subscribed(&mut self, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        // `read_incoming` sets the notice aside and reads on, so read in short slices.
        while self.inbox_subscribed.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_incoming(left.min(Duration::from_millis(20))).await {
                Incoming::Json(v) => self.backlog.push_back(v),
                Incoming::Timeout if self.inbox_subscribed.is_none() && left.is_zero() => {
                    panic!("no inbox `subscribed` notice within {within:?}")
                }
                Incoming::Timeout => {}
                other => panic!("connection closed while waiting for the inbox notice: {other:?}"),
            }
        }
        self.inbox_subscribed.clone().expect("set above")
    }

    /// Sends `ping` and expects `pong` with the same ref: the connection is open and served.
    pub async fn assert_alive(&mut self) {
        let reply = self.request(json!({"op": "ping"})).await;
        assert_eq!(reply["op"], "pong", "ping answered with {reply}");
    }

    /// Waits (up to `within`) for the server's Close frame, ignoring other frames, and
    /// returns its code (`None` if the stream ended without a Close frame or the frame
    /// had no code).
    pub async fn close_code_within(&mut self, within: Duration) -> Option<u16> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_incoming(left).await {
                Incoming::Json(_) => continue,
                Incoming::Close(code, _) => return code,
                Incoming::Ended(_) => return None,
                Incoming::Timeout => panic!("no Close frame within {within:?}"),
            }
        }
    }

    pub async fn close_code(&mut self) -> Option<u16> {
        self.close_code_within(WAIT).await
    }

    /// Closes politely (Close 1000) and drops the socket.
    pub async fn close(mut self) {
        let frame = CloseFrame { code: CloseCode::Normal, reason: "bye".into() };
        let _ = tokio::time::timeout(Duration::from_secs(2), self.ws.close(Some(frame))).await;
    }
}

// ---------------------------------------------------------------------------------------
// Seeded randomness (xorshift64*): failures replay with the same seed.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Avoid the all-zero state and spread small seeds.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `lo..hi` (hi exclusive, hi > lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }
}

/// The seed for a randomised test: `LIVEGATE_TEST_SEED` if set, else `default`. Printed so
/// a failure can be replayed.
pub fn test_seed(default: u64) -> u64 {
    let seed =
        std::env::var("LIVEGATE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    eprintln!("seed = {seed} (replay with LIVEGATE_TEST_SEED={seed})");
    seed
}

/// Takes the events of an `events` frame for `room` (inbox events are ignored), noting
/// anything else, a gap or a duplicate in `errors`.
pub fn take_events(
    frame: &Value,
    room: &str,
    last: &mut u64,
    into: &mut Vec<(u64, String)>,
    errors: &mut Vec<String>,
) {
    if frame["op"] != "events" {
        errors.push(format!("unexpected frame {frame}"));
        return;
    }
    for e in frame["events"].as_array().cloned().unwrap_or_default() {
        let r = e["room"].as_str().unwrap_or("");
        if r.starts_with("user:") {
            continue;
        }
        if r != room {
            errors.push(format!("event of a room not subscribed: {e}"));
            continue;
        }
        let seq = e["seq"].as_u64().unwrap_or(0);
        if seq != *last + 1 {
            errors.push(format!(
                "{room}: seq {seq} after {last} ({})",
                if seq <= *last { "duplicate" } else { "gap" }
            ));
        }
        *last = (*last).max(seq);
        into.push((seq, e["id"].as_str().unwrap_or("").to_string()));
    }
}
