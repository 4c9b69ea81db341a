//! The Server-Sent Events transport (issue 18): `GET /v1/sse` against a real
//! server, read by a real HTTP/1.1 client on a TCP socket (chunked body, SSE lines), and
//! once by the real `curl -N`. A stream is a connection like any other: batched windows
//! in seq order, exact recovery from its cursor (`Last-Event-ID` or `since`), the same
//! handshake refusals that leave the credential usable, drain (1012) and kicks (4502)
//! as `event: close`, resume credentials shared with WebSockets, the connection limits,
//! CORS, heartbeats, and release when the client goes away.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::process::ServeProcess;
use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ---------------------------------------------------------------------------------------
// A small SSE client: HTTP/1.1 over a TCP socket, the chunked body decoded as it comes
// ---------------------------------------------------------------------------------------

/// One SSE message (or comment), as a reader assembles it.
#[derive(Debug, Clone, Default)]
struct Message {
    event: Option<String>,
    id: Option<String>,
    /// The `data:` lines joined with `\n`, as the SSE rules say.
    data: Option<String>,
    comment: Option<String>,
}

impl Message {
    fn json(&self) -> Value {
        let data = self.data.as_deref().unwrap_or_else(|| panic!("message without data: {self:?}"));
        serde_json::from_str(data).unwrap_or_else(|e| {
            let end = data.len().min(300);
            panic!(
                "data is not JSON ({e}): {:?}… ({} bytes), ends {:?}",
                &data[..end],
                data.len(),
                &data[data.len().saturating_sub(120)..]
            )
        })
    }
}

/// A refused request: status, headers (lower-case names) and the JSON body.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    pub(crate) body: Value,
}

impl Refused {
    pub(crate) fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

enum Next {
    Message(Message),
    /// The response ended (the last chunk, or the socket closed).
    End,
    Timeout,
}

pub(crate) struct Sse {
    stream: TcpStream,
    /// Raw bytes read and not yet decoded.
    raw: Vec<u8>,
    /// Decoded body bytes not yet parsed into messages.
    body: Vec<u8>,
    ended: bool,
    headers: Vec<(String, String)>,
    pub(crate) welcome: Value,
    /// `events` messages read while waiting for `subscribed` ones (a room's replay
    /// follows its own `subscribed`, maybe before another room's).
    stash: std::collections::VecDeque<Message>,
}

impl Sse {
    /// `GET path` with `extra` headers; a 200 is read up to its `welcome`.
    pub(crate) async fn open(
        addr: SocketAddr,
        path: &str,
        extra: &[(&str, &str)],
    ) -> Result<Sse, Refused> {
        Sse::open_on(TcpStream::connect(addr).await.expect("connect"), addr, path, extra).await
    }

    async fn open_on(
        mut stream: TcpStream,
        addr: SocketAddr,
        path: &str,
        extra: &[(&str, &str)],
    ) -> Result<Sse, Refused> {
        let mut request =
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
        for (name, value) in extra {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await.expect("write request");
        let mut raw = Vec::new();
        let head_end = loop {
            if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
                .await
                .expect("response head in time")
                .expect("read");
            assert!(
                n > 0,
                "server closed before a response head: {:?}",
                String::from_utf8_lossy(&raw)
            );
            raw.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8(raw[..head_end].to_vec()).expect("head is text");
        let rest = raw[head_end + 4..].to_vec();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut sse = Sse {
            stream,
            raw: rest,
            body: Vec::new(),
            ended: false,
            headers,
            welcome: Value::Null,
            stash: Default::default(),
        };
        if status != 200 {
            let body = sse.read_whole_body().await;
            let body = serde_json::from_slice(&body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
            return Err(Refused { status, headers: sse.headers, body });
        }
        assert_eq!(
            header(&sse.headers, "content-type"),
            Some("text/event-stream"),
            "{:?}",
            sse.headers
        );
        assert_eq!(header(&sse.headers, "cache-control"), Some("no-cache"));
        assert_eq!(header(&sse.headers, "x-accel-buffering"), Some("no"));
        let welcome = sse.expect("welcome").await;
        assert_eq!(welcome["op"], "welcome", "{welcome}");
        sse.welcome = welcome;
        Ok(sse)
    }

    pub(crate) async fn connect(addr: SocketAddr, query: &str) -> Sse {
        Sse::open(addr, &format!("/v1/sse?{query}"), &[])
            .await
            .unwrap_or_else(|r| panic!("GET /v1/sse?{query}: {r:?}"))
    }

    fn resume(&self) -> String {
        self.welcome["resume"]
            .as_str()
            .unwrap_or_else(|| panic!("welcome without resume: {}", self.welcome))
            .to_string()
    }

    async fn read_whole_body(&mut self) -> Vec<u8> {
        let length = header(&self.headers, "content-length").and_then(|l| l.parse::<usize>().ok());
        let chunked = header(&self.headers, "transfer-encoding") == Some("chunked");
        loop {
            if let Some(length) = length.filter(|l| self.raw.len() >= *l) {
                return self.raw[..length].to_vec();
            }
            if chunked {
                self.decode();
                if self.ended {
                    return std::mem::take(&mut self.body);
                }
            }
            if !self.fill(WAIT).await {
                return std::mem::take(&mut self.raw);
            }
        }
    }

    /// Read more raw bytes; false once the socket ended (or failed).
    async fn fill(&mut self, within: Duration) -> bool {
        let mut buf = [0u8; 16 * 1024];
        match tokio::time::timeout(within, self.stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                self.raw.extend_from_slice(&buf[..n]);
                true
            }
            Ok(_) => false,
            Err(_) => true,
        }
    }

    /// Move whole chunks from `raw` to `body`.
    fn decode(&mut self) {
        loop {
            let Some(line_end) = self.raw.windows(2).position(|w| w == b"\r\n") else { return };
            let size_text = String::from_utf8_lossy(&self.raw[..line_end]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
                .unwrap_or_else(|_| panic!("bad chunk size line {size_text:?}"));
            let start = line_end + 2;
            if self.raw.len() < start + size + 2 {
                return;
            }
            self.body.extend_from_slice(&self.raw[start..start + size]);
            assert_eq!(
                &self.raw[start + size..start + size + 2],
                b"\r\n",
                "chunk not ended by CRLF"
            );
            self.raw.drain(..start + size + 2);
            if size == 0 {
                self.ended = true;
                return;
            }
        }
    }

    /// A whole message from `body`, if there is one.
    fn parse_message(&mut self) -> Option<Message> {
        let end = self.body.windows(2).position(|w| w == b"\n\n")?;
        let text = String::from_utf8(self.body[..end].to_vec()).expect("SSE is UTF-8");
        self.body.drain(..end + 2);
        let mut message = Message::default();
        for line in text.split('\n') {
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "" => message.comment = Some(value.to_string()),
                "event" => message.event = Some(value.to_string()),
                "id" => message.id = Some(value.to_string()),
                "data" => {
                    message.data = Some(match message.data.take() {
                        Some(before) => format!("{before}\n{value}"),
                        None => value.to_string(),
                    })
                }
                other => panic!("unknown SSE field {other:?} in {text:?}"),
            }
        }
        Some(message)
    }

    async fn next_within(&mut self, within: Duration) -> Next {
        let deadline = Instant::now() + within;
        loop {
            self.decode();
            if let Some(message) = self.parse_message() {
                return Next::Message(message);
            }
            if self.ended {
                return Next::End;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Next::Timeout;
            }
            if !self.fill(left).await {
                self.ended = true;
            }
        }
    }

    /// The next message that is not a `: ping` comment.
    async fn next_message(&mut self, within: Duration) -> Next {
        let deadline = Instant::now() + within;
        loop {
            match self.next_within(deadline.saturating_duration_since(Instant::now())).await {
                Next::Message(m) if m.comment.as_deref() == Some("ping") => continue,
                other => return other,
            }
        }
    }

    /// The next message, which must be `event: name`; its data.
    async fn expect(&mut self, name: &str) -> Value {
        self.expect_message(name).await.json()
    }

    async fn expect_message(&mut self, name: &str) -> Message {
        if name == "events" {
            if let Some(stashed) = self.stash.pop_front() {
                return stashed;
            }
        }
        match self.next_message(WAIT).await {
            Next::Message(m) => {
                assert_eq!(m.event.as_deref(), Some(name), "expected event: {name}, got {m:?}");
                m
            }
            Next::End => panic!("stream ended while waiting for event: {name}"),
            Next::Timeout => panic!("no event: {name} within {WAIT:?}"),
        }
    }

    /// `subscribed` for the automatic inbox, then one per room, in any order: room → data.
    pub(crate) async fn expect_subscribed(
        &mut self,
        rooms: &[&str],
    ) -> std::collections::HashMap<String, Value> {
        let mut got = std::collections::HashMap::new();
        while got.len() < rooms.len() {
            let message = match self.next_message(WAIT).await {
                Next::Message(m) => m,
                _ => panic!("no subscribed for all of {rooms:?}; got {got:?}"),
            };
            if message.event.as_deref() == Some("events") {
                self.stash.push_back(message);
                continue;
            }
            assert_eq!(message.event.as_deref(), Some("subscribed"), "{message:?}");
            let data = message.json();
            let room = data["room"].as_str().expect("room").to_string();
            if data.get("epoch").is_none() {
                assert!(
                    room.starts_with("user:"),
                    "only the automatic inbox comes without an epoch: {data}"
                );
                continue;
            }
            assert!(rooms.contains(&room.as_str()), "subscribed to an unexpected room: {data}");
            got.insert(room, data);
        }
        got
    }

    /// `events` messages until `n` events arrived: (every event, the messages' ids).
    pub(crate) async fn events(&mut self, n: usize) -> (Vec<Value>, Vec<String>) {
        let (mut events, mut ids) = (Vec::new(), Vec::new());
        while events.len() < n {
            let message = self.expect_message("events").await;
            let data = message.json();
            assert_eq!(data["op"], "events", "{data}");
            events.extend(data["events"].as_array().expect("events array").iter().cloned());
            ids.push(
                message.id.clone().unwrap_or_else(|| panic!("events without id: {message:?}")),
            );
        }
        (events, ids)
    }

    /// The stream's `event: close`, then its end: the close data.
    async fn expect_close(&mut self) -> Value {
        let close = self.expect("close").await;
        match self.next_message(WAIT).await {
            Next::End => close,
            Next::Message(m) => panic!("a message after close: {m:?}"),
            Next::Timeout => panic!("the stream did not end after its close"),
        }
    }

    async fn assert_quiet(&mut self, within: Duration) {
        assert!(self.stash.is_empty(), "events not taken: {:?}", self.stash);
        match self.next_message(within).await {
            Next::Timeout => {}
            Next::Message(m) => panic!("expected nothing, got {m:?}"),
            Next::End => panic!("expected nothing, the stream ended"),
        }
    }
}

fn token_query(http: &Http, user: &str, rooms: &str) -> String {
    format!("token={}&rooms={rooms}", http.mint_token(user, "web"))
}

fn mint_with_rooms(http: &Http, user: &str, patterns: Value) -> String {
    let (status, body) =
        http.mint_token_raw(json!({"user": user, "device": "web", "rooms": patterns}));
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().unwrap().to_string()
}

fn sse_metric(http: &Http) -> f64 {
    http.metric("livegate_connections_by_transport{transport=\"sse\"}").unwrap_or(-1.0)
}

/// The `seq` of every event, checked to be of `room`.
fn seqs_of(events: &[Value], room: &str) -> Vec<u64> {
    events
        .iter()
        .map(|e| {
            assert_eq!(e["room"], room, "{e}");
            seq_of(e)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn events_arrive_batched_in_seq_order_with_a_cursor() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.batch_window_ms = 300);
    let http = server.http();
    let mut sse = Sse::connect(server.addr, &token_query(&http, "u1", "match:1")).await;
    assert!(
        sse.welcome["session"].is_string() && sse.welcome["resume_expires_at_ms"].is_u64(),
        "{}",
        sse.welcome
    );
    let subscribed = sse.expect_subscribed(&["match:1"]).await;
    let epoch = subscribed["match:1"]["epoch"].as_str().unwrap().to_string();
    assert_eq!(subscribed["match:1"]["seq"], 0);

    let publisher = std::thread::spawn(move || {
        for i in 1..=40 {
            http.publish_ok("match:1", Some(&format!("e{i}")), json!({ "i": i }));
        }
    });
    let (events, ids) = sse.events(40).await;
    publisher.join().unwrap();
    assert_eq!(
        seqs_of(&events, "match:1"),
        (1..=40).collect::<Vec<_>>(),
        "every seq once, ascending"
    );
    assert!(ids.len() < 40, "events are batched per window: {} messages for 40 events", ids.len());
    assert_eq!(
        ids.last().unwrap(),
        &format!("match:1:{epoch}:40"),
        "the id is the cursor after the message"
    );
    sse.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn last_event_id_and_since_replay_exactly_what_was_missed() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut first = Sse::connect(server.addr, &token_query(&http, "u1", "match:1,match:2")).await;
    first.expect_subscribed(&["match:1", "match:2"]).await;
    for i in 1..=3 {
        http.publish_ok("match:1", Some(&format!("a{i}")), json!({ "i": i }));
    }
    let (message, _) = http.request(
        "POST",
        "/v1/users/u1/messages",
        Auth::Key,
        Body::Json(json!({"data": {"m": 1}})),
    );
    assert_eq!(message, 201);
    let mut last_id = String::new();
    let mut seen = 0;
    while seen < 4 {
        let m = first.expect_message("events").await;
        seen += m.json()["events"].as_array().unwrap().len();
        last_id = m.id.unwrap();
    }
    assert!(
        last_id.contains("user:u1:"),
        "the inbox is in the cursor once its epoch is known: {last_id}"
    );
    let resume = first.resume();
    drop(first);

    // Missed while away: two in match:1, one in match:2, one inbox message.
    for i in 4..=5 {
        http.publish_ok("match:1", Some(&format!("a{i}")), json!({ "i": i }));
    }
    http.publish_ok("match:2", Some("b1"), json!({ "b": 1 }));
    let (status, _) = http.request(
        "POST",
        "/v1/users/u1/messages",
        Auth::Key,
        Body::Json(json!({"data": {"m": 2}})),
    );
    assert_eq!(status, 201);

    let path = format!("/v1/sse?resume={resume}&rooms=match:1,match:2&since=match:1:bogus:0");
    let mut again = Sse::open(server.addr, &path, &[("Last-Event-ID", &last_id)])
        .await
        .expect("resume with Last-Event-ID");
    let subscribed = again.expect_subscribed(&["match:1", "match:2", "user:u1"]).await;
    for room in ["match:1", "match:2", "user:u1"] {
        assert_eq!(subscribed[room]["recovered"], true, "{room}: {}", subscribed[room]);
    }
    let (events, _) = again.events(4).await;
    let mut by_room: Vec<(String, u64)> =
        events.iter().map(|e| (e["room"].as_str().unwrap().to_string(), seq_of(e))).collect();
    by_room.sort();
    assert_eq!(
        by_room,
        vec![
            ("match:1".into(), 4),
            ("match:1".into(), 5),
            ("match:2".into(), 1),
            ("user:u1".into(), 2)
        ],
        "exactly what was missed (the header wins over since)"
    );
    again.assert_quiet(QUIET).await;
    let cursor = {
        http.publish_ok("match:1", Some("a6"), json!({ "i": 6 }));
        let m = again.expect_message("events").await;
        m.id.unwrap()
    };
    let resume = again.resume();
    drop(again);

    // The same with since= (no header), after two more.
    http.publish_ok("match:1", Some("a7"), json!({ "i": 7 }));
    http.publish_ok("match:1", Some("a8"), json!({ "i": 8 }));
    let mut third =
        Sse::connect(server.addr, &format!("resume={resume}&rooms=match:1,match:2&since={cursor}"))
            .await;
    third.expect_subscribed(&["match:1", "match:2", "user:u1"]).await;
    let (events, _) = third.events(2).await;
    assert_eq!(seqs_of(&events, "match:1"), vec![7, 8]);
    third.assert_quiet(QUIET).await;

    // A cursor of another epoch is not recovered: recovered:false and nothing replayed.
    let stale = format!("match:1:{}:2", "0000");
    let mut fourth = Sse::connect(
        server.addr,
        &format!("{}&since={stale}", token_query(&http, "u1", "match:1")),
    )
    .await;
    let subscribed = fourth.expect_subscribed(&["match:1"]).await;
    assert_eq!(subscribed["match:1"]["recovered"], false, "{}", subscribed["match:1"]);
    fourth.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn refused_requests_leave_the_token_usable() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_subscriptions = 2);
    let http = server.http();
    let token = mint_with_rooms(&http, "u1", json!(["match:*"]));
    // The last column: the room the refusal names in `error.room` (a client matches on it).
    let cases: &[(&str, &[(&str, &str)], u16, &str, Option<&str>)] = &[
        ("rooms=match:1&since=match:1:E", &[], 400, "bad_request", None),
        ("rooms=match:1&since=match:1:E:x", &[], 400, "bad_request", None),
        ("rooms=match:1", &[("Last-Event-ID", "nonsense")], 400, "bad_request", None),
        ("rooms=match:1,bad/room", &[], 400, "bad_room", Some("bad/room")),
        ("rooms=match:1,match:2,match:3", &[], 429, "too_many_subscriptions", None),
        ("rooms=match:1,secret:1", &[], 403, "forbidden", Some("secret:1")),
        ("rooms=user:u2", &[], 403, "forbidden", Some("user:u2")),
    ];
    for (query, headers, status, code, room) in cases {
        let refused =
            Sse::open(server.addr, &format!("/v1/sse?token={token}&{query}"), headers).await;
        let refused = refused.err().unwrap_or_else(|| panic!("{query} must be refused"));
        assert_eq!(
            (refused.status, refused.code()),
            (*status, *code),
            "{query}: {:?}",
            refused.body
        );
        assert!(
            refused.body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{:?}",
            refused.body
        );
        assert_eq!(refused.body["error"]["room"].as_str(), *room, "{query}: {:?}", refused.body);
    }
    assert_eq!(http.metric("livegate_handshake_rejections_total{reason=\"forbidden\"}"), Some(2.0));
    // Still unspent: it opens a stream now, once.
    let mut sse = Sse::connect(server.addr, &format!("token={token}&rooms=match:1")).await;
    sse.expect_subscribed(&["match:1"]).await;
    let replay = Sse::open(server.addr, &format!("/v1/sse?token={token}&rooms=match:1"), &[]).await;
    assert_eq!(
        replay.err().map(|r| (r.status, r.code().to_string())),
        Some((401, "token_replayed".into()))
    );
    let missing =
        Sse::open(server.addr, "/v1/sse?rooms=match:1", &[]).await.err().expect("no credential");
    assert_eq!((missing.status, missing.code()), (401, "missing_token"));
    let bad_resume =
        Sse::open(server.addr, "/v1/sse?resume=garbage", &[]).await.err().expect("bad resume");
    assert_eq!((bad_resume.status, bad_resume.code()), (401, "resume_invalid"));
}

#[tokio::test]
async fn a_kick_closes_the_stream_with_4502_and_voids_its_resume() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut sse = Sse::connect(server.addr, &token_query(&http, "u1", "match:1")).await;
    sse.expect_subscribed(&["match:1"]).await;
    let resume = sse.resume();
    let (status, body) = http.request("DELETE", "/v1/users/u1/connections", Auth::Key, Body::None);
    assert_eq!((status, &body["closed"]), (200, &json!(1)), "{body}");
    let close = sse.expect_close().await;
    assert_eq!(close["code"], 4502, "{close}");
    assert!(close["reason"].is_string(), "{close}");
    let refused = Sse::open(server.addr, &format!("/v1/sse?resume={resume}"), &[])
        .await
        .err()
        .expect("the resume is void");
    assert_eq!((refused.status, refused.code()), (401, "resume_invalid"), "{:?}", refused.body);
    let ws =
        WsClient::try_connect_url(&format!("ws://{}/v1/ws?resume={resume}", server.addr)).await;
    assert_eq!(ws.err().map(|r| r.status), Some(401));
    assert!(wait_until(WAIT, || sse_metric(&http) == 0.0), "the kicked stream is released");
}

#[tokio::test]
async fn a_newer_connection_of_an_exclusive_device_replaces_the_stream_with_4501() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let token = http.mint_token("u1", "phone");
    let mut sse = Sse::connect(server.addr, &format!("token={token}&rooms=match:1")).await;
    sse.expect_subscribed(&["match:1"]).await;
    let resume = sse.resume();
    let mut newer = WsClient::connect(server.addr, &http.mint_token("u1", "phone"), None).await;
    let close = sse.expect_close().await;
    assert_eq!(close["code"], 4501, "{close}");
    let refused = Sse::open(server.addr, &format!("/v1/sse?resume={resume}"), &[])
        .await
        .err()
        .expect("replaced: void");
    assert_eq!((refused.status, refused.code()), (401, "resume_invalid"));
    newer.assert_alive().await;
}

#[tokio::test]
async fn resume_credentials_cross_between_websocket_and_sse() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let sse = Sse::connect(server.addr, &token_query(&http, "u1", "")).await;
    let session = sse.welcome["session"].as_str().unwrap().to_string();
    let resume = sse.resume();
    drop(sse);
    // SSE → WebSocket: same user and session.
    let mut ws = WsClient::try_connect_url(&format!("ws://{}/v1/ws?resume={resume}", server.addr))
        .await
        .expect("resume on /v1/ws");
    assert_eq!(ws.session(), session);
    ws.subscribe_ok("match:1").await;
    let next = ws.welcome["resume"].as_str().unwrap().to_string();
    ws.close().await;
    // WebSocket → SSE.
    let mut sse = Sse::connect(server.addr, &format!("resume={next}&rooms=match:1")).await;
    assert_eq!(sse.welcome["session"], session.as_str());
    sse.expect_subscribed(&["match:1"]).await;
    let (status, _) = http.request(
        "POST",
        "/v1/users/u1/messages",
        Auth::Key,
        Body::Json(json!({"data": {"to": "u1"}})),
    );
    assert_eq!(status, 201);
    let (events, _) = sse.events(1).await;
    assert_eq!(events[0]["data"]["to"], "u1", "the resumed stream is u1's: {}", events[0]);
    assert_eq!(http.metric("livegate_handshakes_total{credential=\"resume\"}"), Some(2.0));
}

#[tokio::test]
async fn a_stream_counts_against_the_connection_limits_and_is_released_on_disconnect() {
    let _gate = crate::common::gate!();
    // The default heartbeat (30 s): the release must not wait for a failed ping.
    let server = TestServer::start(|c| c.max_connections_per_ip = 1);
    let http = server.http();
    let sse = Sse::connect(server.addr, &token_query(&http, "u1", "match:1")).await;
    assert_eq!(sse_metric(&http), 1.0);
    let token = http.mint_token("u2", "web");
    let refused = Sse::open(server.addr, &format!("/v1/sse?token={token}"), &[])
        .await
        .err()
        .expect("over the per-IP limit");
    assert_eq!((refused.status, refused.code()), (429, "too_many_connections"));
    let ws = WsClient::try_connect(server.addr, Some(&token), None).await;
    assert_eq!(ws.err().map(|r| r.status), Some(429), "a WebSocket counts with the stream");

    // The client goes away: the stream's connection ends (registry, gauges, permit).
    drop(sse);
    assert!(
        wait_until(Duration::from_secs(5), || sse_metric(&http) == 0.0),
        "the stream is released at once after its client left"
    );
    let (status, body) = http.request("GET", "/v1/admin/status", Auth::Key, Body::None);
    assert_eq!((status, &body["connections"]), (200, &json!(0)), "{body}");
    assert_eq!(http.metric("livegate_connections_open{device=\"web\"}"), Some(0.0));
    let mut again = Sse::connect(server.addr, &format!("token={token}&rooms=match:1")).await;
    again.expect_subscribed(&["match:1"]).await;
}

#[tokio::test]
async fn the_node_limit_counts_streams_too() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_connections = 1);
    let http = server.http();
    let _sse = Sse::connect(server.addr, &token_query(&http, "u1", "")).await;
    let refused = Sse::open(server.addr, &format!("/v1/sse?{}", token_query(&http, "u2", "")), &[])
        .await
        .err()
        .expect("node full");
    assert_eq!((refused.status, refused.code()), (503, "too_many_connections"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_is_not_read_is_closed_as_a_slow_consumer() {
    let _gate = crate::common::gate!();
    // The default max_outbox_bytes (1 MiB).
    let server = TestServer::start(|_| {});
    let http = server.http();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(server.addr).await.expect("connect");
    let path = format!("/v1/sse?{}", token_query(&http, "stalled", "flood"));
    let mut stalled = Sse::open_on(stream, server.addr, &path, &[]).await.expect("stream");
    stalled.expect_subscribed(&["flood"]).await;

    // About 8 MB while the client reads nothing: far more than the socket buffers hold,
    // paced at about 4 MB/s so that no single window passes the bound by itself: what
    // waits for the socket in the stream's own queue does.
    let blob = "x".repeat(8 * 1024);
    let publishers: Vec<_> = (0..4)
        .map(|t| {
            let (http, blob) = (http.clone(), blob.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                for i in 0..250 {
                    common::pace_until(started + Duration::from_millis(8 * i), "about 4 MB/s");
                    http.publish_ok("flood", None, json!({"t": t, "i": i, "blob": blob}));
                }
            })
        })
        .collect();
    for p in publishers {
        p.join().expect("publisher");
    }
    assert!(
        wait_until(WAIT, || http.metric("livegate_slow_consumer_closes_total").unwrap_or(0.0)
            >= 1.0),
        "the stalled stream is evicted"
    );
    // It reads now: what the buffers held (whole messages, in seq order), then the close.
    let (mut last, mut received) = (0, 0);
    let close = loop {
        match stalled.next_message(Duration::from_secs(20)).await {
            Next::Message(m) if m.event.as_deref() == Some("events") => {
                for event in m.json()["events"].as_array().unwrap() {
                    assert!(seq_of(event) > last, "seqs ascend: {} after {last}", seq_of(event));
                    last = seq_of(event);
                    received += 1;
                }
            }
            Next::Message(m) if m.event.as_deref() == Some("close") => break m.json(),
            Next::Message(m) => panic!("unexpected {m:?}"),
            Next::End => panic!("the stream ended without a close after {received} events"),
            Next::Timeout => panic!("no close within 20 s after {received} events"),
        }
    };
    assert_eq!(close["code"], 4009, "{close}");
    assert!(received < 1000, "the stalled stream was cut off, not sent everything");
    assert!(
        matches!(stalled.next_message(WAIT).await, Next::End),
        "the stream ends after its close"
    );
    assert!(wait_until(WAIT, || sse_metric(&http) == 0.0), "the evicted stream is released");
}

#[tokio::test]
async fn raw_newlines_in_event_data_arrive_as_valid_json() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut sse = Sse::connect(server.addr, &token_query(&http, "u1", "match:1")).await;
    sse.expect_subscribed(&["match:1"]).await;
    let body = "{\"id\":\"nl\",\"data\":{\"a\":\n1,\r\n\"b\":\r[\"x\",\n\"y\"]}}";
    let (status, reply) =
        http.request("POST", "/v1/rooms/match:1/events", Auth::Key, Body::Raw(body));
    assert_eq!(status, 201, "{reply}");
    let message = sse.expect_message("events").await;
    assert!(
        message.data.as_deref().unwrap().contains('\n'),
        "the data came as several lines: {message:?}"
    );
    let data = message.json();
    assert_eq!(data["events"][0]["data"], json!({"a": 1, "b": ["x", "y"]}), "{data}");
}

#[tokio::test]
async fn cors_for_allowed_origins_and_403_for_others() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.allowed_origins = vec!["https://app.example".into()]);
    let http = server.http();
    let query = token_query(&http, "u1", "match:1");
    let origin = [("Origin", "https://app.example")];
    let mut sse =
        Sse::open(server.addr, &format!("/v1/sse?{query}"), &origin).await.expect("allowed origin");
    assert_eq!(header(&sse.headers, "access-control-allow-origin"), Some("https://app.example"));
    assert_eq!(header(&sse.headers, "vary"), Some("Origin"));
    sse.expect_subscribed(&["match:1"]).await;
    // Error answers carry it too, so a page can read why it was refused.
    let refused = Sse::open(server.addr, &format!("/v1/sse?{query}"), &origin)
        .await
        .err()
        .expect("replayed token");
    assert_eq!((refused.status, refused.code()), (401, "token_replayed"));
    assert_eq!(
        header(&refused.headers, "access-control-allow-origin"),
        Some("https://app.example")
    );
    let other = Sse::open(
        server.addr,
        &format!("/v1/sse?{}", token_query(&http, "u2", "")),
        &[("Origin", "https://evil.example")],
    )
    .await;
    let other = other.err().expect("a disallowed origin is refused");
    assert_eq!((other.status, other.code()), (403, "forbidden_origin"));
    assert_eq!(header(&other.headers, "access-control-allow-origin"), None);
    // livegate.js reads /readyz after a failed handshake: a page on another origin must
    // see its status (a draining node's 503 is not a refused credential).
    let readyz = |origin: &'static str| async move {
        let mut stream = TcpStream::connect(server.addr).await.expect("connect");
        let request = format!(
            "GET /readyz HTTP/1.1\r\nHost: x\r\nOrigin: {origin}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
            .await
            .expect("in time")
            .expect("read");
        String::from_utf8_lossy(&raw).to_ascii_lowercase()
    };
    let allowed = readyz("https://app.example").await;
    assert!(
        allowed.starts_with("http/1.1 200")
            && allowed.contains("access-control-allow-origin: https://app.example"),
        "{allowed}"
    );
    let refused = readyz("https://evil.example").await;
    assert!(!refused.contains("access-control-allow-origin"), "{refused}");
}

#[tokio::test]
async fn pings_arrive_every_heartbeat_and_silence_is_no_timeout() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.heartbeat_secs = 1);
    let http = server.http();
    let mut sse = Sse::connect(server.addr, &token_query(&http, "u1", "")).await;
    sse.expect("subscribed").await;
    let mut pings = 0;
    let started = Instant::now();
    // Four heartbeats without a word from the client: a WebSocket would be closed (4008)
    // after three; a stream is not.
    while started.elapsed() < Duration::from_millis(4500) {
        match sse.next_within(Duration::from_secs(2)).await {
            Next::Message(m) => {
                assert_eq!(
                    m.comment.as_deref(),
                    Some("ping"),
                    "only pings on an idle stream: {m:?}"
                );
                pings += 1;
            }
            Next::End => panic!("the idle stream was closed"),
            Next::Timeout => panic!("no ping within 2 s (heartbeat 1 s)"),
        }
    }
    assert!(pings >= 3, "{pings} pings in 4.5 s");
}

#[test]
fn a_drain_ends_the_stream_with_close_1012() {
    let _gate = crate::common::gate!();
    let dir = tempfile::Builder::new().prefix("livegate-sse-drain-").tempdir().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");
    let mut process =
        ServeProcess::start(&data, &log, &["--drain-wait-secs", "0", "--drain-spread-secs", "0"]);
    let http = process.http();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let query = token_query(&http, "u1", "match:1");
    let mut sse = runtime.block_on(async {
        let mut sse = Sse::connect(process.addr, &query).await;
        sse.expect_subscribed(&["match:1"]).await;
        sse
    });
    http.publish_ok("match:1", Some("before"), json!({"last": true}));
    process.signal("TERM");
    let close = runtime.block_on(async {
        let (events, _) = sse.events(1).await;
        assert_eq!(events[0]["data"]["last"], true, "the pending event goes out before the close");
        sse.expect_close().await
    });
    assert_eq!(close["code"], 1012, "{close}");
    assert!(close["reason"].as_str().unwrap_or("").contains("reconnect"), "{close}");
    let status = process
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no exit; log:\n{}", process.log_text()));
    assert!(status.success(), "{status}; log:\n{}", process.log_text());
}

#[test]
fn curl_n_prints_the_stream() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let url = format!("http://{}/v1/sse?{}", server.addr, token_query(&http, "u1", "match:1"));
    let mut curl = std::process::Command::new("curl")
        .args(["-N", "-s", &url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run curl (tests/it/sse.rs needs /usr/bin/curl)");
    let stdout = curl.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let wait_for = |prefix: &str, lines: &mut Vec<String>| loop {
        let line = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("curl printed no {prefix:?} line; so far {lines:?}"));
        lines.push(line.clone());
        if line.starts_with(prefix) {
            return line;
        }
    };
    wait_for("event: welcome", &mut lines);
    let subscribed = loop {
        let line = wait_for("data: {", &mut lines);
        if line.contains("\"epoch\"") {
            break line;
        }
    };
    assert!(subscribed.contains("\"room\":\"match:1\""), "{subscribed}");
    http.publish_ok("match:1", Some("curl-1"), json!({"via": "curl"}));
    wait_for("event: events", &mut lines);
    let id = wait_for("id: ", &mut lines);
    assert!(id.starts_with("id: match:1:") && id.ends_with(":1"), "{id}");
    let data = wait_for("data: ", &mut lines);
    let events: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(events["events"][0]["data"]["via"], "curl", "{events}");
    let _ = curl.kill();
    let _ = curl.wait();
    assert!(
        wait_until(Duration::from_secs(5), || sse_metric(&http) == 0.0),
        "curl's stream is released once curl is gone"
    );
}

/// `state=1`: every room of the stream is subscribed with `state:true`; its
/// `subscribed` message carries the state (or `null`), then the events after it come.
#[tokio::test]
async fn state_1_brings_each_rooms_state_and_the_events_after_it() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    for i in 1..=5 {
        let mut body = json!({"id": format!("e{i}"), "data": {"i": i}});
        if i == 3 {
            body["state"] = json!({"upto": 3});
        }
        let (status, reply) =
            http.request("POST", "/v1/rooms/match:1/events", Auth::Key, Body::Json(body));
        assert_eq!(status, 201, "{reply}");
    }
    http.publish_ok("match:2", None, json!({"plain": true}));
    let query = format!("{}&state=1", token_query(&http, "u1", "match:1,match:2"));
    let mut sse = Sse::connect(server.addr, &query).await;
    let subscribed = sse.expect_subscribed(&["match:1", "match:2"]).await;
    assert_eq!(
        subscribed["match:1"]["state"],
        json!({"seq": 3, "data": {"upto": 3}}),
        "{:?}",
        subscribed
    );
    assert_eq!(
        subscribed["match:2"]["state"],
        Value::Null,
        "a room without a state: {:?}",
        subscribed
    );
    let (events, _) = sse.events(3).await;
    let mut got: Vec<(String, u64)> = events
        .iter()
        .map(|e| (e["room"].as_str().unwrap().to_string(), e["seq"].as_u64().unwrap()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [("match:1".to_string(), 4), ("match:1".to_string(), 5), ("match:2".to_string(), 1)]
    );
    sse.assert_quiet(QUIET).await;

    // Without the flag, no state; a flag that is not one is refused before the token is spent.
    let mut plain = Sse::connect(server.addr, &token_query(&http, "u2", "match:1")).await;
    assert_eq!(plain.expect_subscribed(&["match:1"]).await["match:1"].get("state"), None);
    let token = http.mint_token("u3", "web");
    let refused =
        Sse::open(server.addr, &format!("/v1/sse?token={token}&rooms=match:1&state=yes"), &[])
            .await;
    assert_eq!(refused.err().map(|r| r.status), Some(400));
    Sse::connect(server.addr, &format!("token={token}&rooms=match:1")).await;
}
