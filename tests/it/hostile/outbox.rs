//! Hostile clients: a client with a valid token that never reads its socket and keeps
//! asking for replies (issue 29, item 1). Every byte the node holds for a connection —
//! room windows, replays, replies, pongs, errors, the Close — counts against the one
//! `max_outbox_bytes` bound; over it the connection is not read from (the kernel's
//! buffers fill and TCP pushes back on the client) and after the grace it is closed
//! with 4009. Each case runs the real binary (`ServeProcess`), so the RSS sampled from
//! `/proc` is the server's own, with a raw TCP client (a small `SO_RCVBUF`, no reads)
//! flooding it, and an honest subscriber that must get every event meanwhile, in order.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::process::ServeProcess;
use crate::common::{pace, Http, WsClient, WAIT};

/// The server's `max_outbox_bytes` in these tests (the default, 1 MiB).
const OUTBOX: u64 = 1024 * 1024;
/// What the server's RSS may grow by while one client floods it: the outbox itself, a
/// history page being rendered, the kernel-side buffers it does not own, and the
/// allocator's slack (freed frames it keeps). Without the bound it grows by tens of MiB
/// within seconds.
const SLACK_KIB: u64 = 24 * 1024;
/// Events in the room the hostile client reads history from (one full page).
const ROOM_EVENTS: usize = 1000;
/// Events published to the honest subscriber's room during a flood.
const LIVE_EVENTS: u64 = 200;
/// How long a flood may last: past the grace (5 s) and the close handshake.
const FLOOD_FOR: Duration = Duration::from_secs(14);

/// A WebSocket client on a raw TCP socket with a small receive buffer that reads
/// nothing after the handshake's answer: the model of a client that stops reading.
struct StalledClient {
    tcp: TcpStream,
}

impl StalledClient {
    fn connect(addr: SocketAddr, token: &str) -> StalledClient {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        socket.connect(&addr.into()).expect("connect");
        let mut tcp: TcpStream = socket.into();
        let request = format!(
            "GET /v1/ws?token={token} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        tcp.write_all(request.as_bytes()).expect("write handshake");
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // Read the answer's head one byte at a time: nothing after it is taken.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            assert_eq!(
                tcp.read(&mut byte).expect("read the handshake's answer"),
                1,
                "closed during the handshake"
            );
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "handshake answer: {head}");
        tcp.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
        StalledClient { tcp }
    }

    /// Write what the client has waiting (`pending`), one write call: `Ok(false)` when
    /// the write timed out (the server stopped reading and the buffers between are full),
    /// `Err` when the server closed. A frame partly written stays at the front of
    /// `pending`, so the stream of frames is never cut.
    fn write_pending(&mut self, pending: &mut Vec<u8>) -> Result<bool, ()> {
        match self.tcp.write(pending) {
            Ok(0) => Err(()),
            Ok(n) => {
                pending.drain(..n);
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(false)
            }
            Err(_) => Err(()),
        }
    }

    /// Read what the server sent until it ends the connection (or `within` passes) and
    /// return the close code of its Close frame, if one came.
    fn close_code(mut self, within: Duration) -> Option<u16> {
        let deadline = Instant::now() + within;
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut code = None;
        loop {
            while let Some((opcode, payload, used)) = parse_frame(&buf) {
                buf.drain(..used);
                if opcode == 0x8 {
                    code =
                        (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || code.is_some() {
                return code;
            }
            self.tcp.set_read_timeout(Some(left.min(Duration::from_millis(500)))).unwrap();
            match self.tcp.read(&mut chunk) {
                Ok(0) => return code,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return code,
            }
        }
    }
}

/// A client frame (FIN, masked with an all-zero key, so the payload goes as it is).
fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n if n <= 0xffff => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(payload);
    frame
}

/// One whole server frame at the front of `buf`: (opcode, payload, bytes used).
fn parse_frame(buf: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    if buf.len() < 2 {
        return None;
    }
    let (len, header) = match buf[1] & 0x7f {
        126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
        127 if buf.len() >= 10 => (u64::from_be_bytes(buf[2..10].try_into().unwrap()) as usize, 10),
        126 | 127 => return None,
        n => (n as usize, 2),
    };
    (buf.len() >= header + len)
        .then(|| (buf[0] & 0x0f, buf[header..header + len].to_vec(), header + len))
}

/// The server's RSS, sampled every 20 ms while the flood runs; `peak()` is the most seen.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Acquire) {
                if let Some(rss) = rss_kib(pid) {
                    peak = peak.max(rss);
                }
                pace(Duration::from_millis(20), "RSS sampled every 20 ms");
            }
            peak
        });
        RssSampler { stop, thread }
    }

    fn peak(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.thread.join().expect("sampler")
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()
}

/// A server (the real binary) with `max_outbox_bytes` and `max_messages_per_sec` at
/// their defaults.
fn serve(dir: &tempfile::TempDir) -> ServeProcess {
    ServeProcess::start(&dir.path().join("data"), &dir.path().join("server.log"), &[])
}

/// `n` events of about 100 bytes of data each in `room`, published by 8 threads.
fn fill_room(http: &Http, room: &str, n: usize) {
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (http, room) = (http.clone(), room.to_string());
            std::thread::spawn(move || {
                for i in (t..n).step_by(8) {
                    http.publish_ok(&room, None, json!({"i": i, "pad": "p".repeat(100)}));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("publisher");
    }
}

/// An honest subscriber of `live` while `flood` runs: every event published there during
/// the flood arrives, in order. Returns what `flood` returned.
async fn with_honest_subscriber<T: Send + 'static>(
    server: &ServeProcess,
    flood: impl FnOnce() -> T + Send + 'static,
) -> T {
    let http = server.http();
    let mut honest = WsClient::connect(server.addr, &http.mint_token("honest", "web"), None).await;
    honest.subscribe_ok("live").await;
    let flooding = std::thread::spawn(flood);
    let publisher = std::thread::spawn(move || {
        for i in 1..=LIVE_EVENTS {
            http.publish_ok("live", None, json!({"n": i}));
            pace(Duration::from_millis(20), "the live room gets an event every 20 ms");
        }
    });
    let events = honest
        .next_events_within_or_none(LIVE_EVENTS as usize, FLOOD_FOR + Duration::from_secs(10))
        .await;
    publisher.join().expect("publisher");
    let result =
        tokio::task::spawn_blocking(move || flooding.join().expect("flood")).await.unwrap();
    let events = events.expect("the honest subscriber got every event during the flood");
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=LIVE_EVENTS).collect::<Vec<_>>(),
        "the honest subscriber's events, in order"
    );
    result
}

/// What one flood measured.
#[derive(Debug)]
struct Flood {
    /// Peak RSS during the flood minus the RSS before it, KiB.
    growth_kib: u64,
    /// Bytes of requests the client wrote.
    written: u64,
    /// Whether a write stalled (the server stopped reading).
    stalled: bool,
    /// Seconds from the start until the server counted a slow-consumer close.
    closed_after: Option<f64>,
}

/// Run `next` (the next batch of frames to write, `None`: done) against a stalled client
/// until the server closes it as a slow consumer or [`FLOOD_FOR`] passes, sampling RSS.
fn flood(
    addr: SocketAddr,
    pid: u32,
    token: String,
    mut next: impl FnMut(Duration) -> Option<Vec<u8>>,
) -> (Flood, Option<u16>) {
    let http = Http::new(addr);
    let open_before = http.metric_total("livegate_connections_open");
    let mut client = StalledClient::connect(addr, &token);
    http.wait_metric_total("livegate_connections_open", open_before + 1.0, WAIT);
    let baseline = rss_kib(pid).expect("server RSS");
    let sampler = RssSampler::start(pid);
    let started = Instant::now();
    let (mut written, mut stalled, mut closed_after) = (0u64, false, None);
    let mut last_check = Instant::now();
    let mut pending = Vec::new();
    while started.elapsed() < FLOOD_FOR {
        if last_check.elapsed() >= Duration::from_millis(250) {
            last_check = Instant::now();
            if http.metric_total("livegate_slow_consumer_closes_total") >= 1.0 {
                closed_after = Some(started.elapsed().as_secs_f64());
                break;
            }
            // Far past the bound already: the test has failed, spare the machine.
            if rss_kib(pid).unwrap_or(0).saturating_sub(baseline) > 4 * bound_kib() {
                break;
            }
        }
        if pending.is_empty() {
            let Some(batch) = next(started.elapsed()) else { continue };
            pending = batch;
        }
        let before = pending.len();
        match client.write_pending(&mut pending) {
            Ok(true) => written += (before - pending.len()) as u64,
            Ok(false) => stalled = true,
            Err(()) => break,
        }
    }
    let peak = sampler.peak();
    if closed_after.is_none() && http.metric_total("livegate_slow_consumer_closes_total") >= 1.0 {
        closed_after = Some(started.elapsed().as_secs_f64());
    }
    let code = client.close_code(Duration::from_secs(10));
    (Flood { growth_kib: peak.saturating_sub(baseline), written, stalled, closed_after }, code)
}

/// How much the server's RSS may grow during a flood, KiB.
fn bound_kib() -> u64 {
    OUTBOX / 1024 + SLACK_KIB
}

fn check(what: &str, flood: &Flood, code: Option<u16>) {
    eprintln!(
        "{what}: peak RSS growth {} KiB, {} bytes of requests written, writes stalled: {}, closed 4009 after {:?} s, close code {code:?}",
        flood.growth_kib, flood.written, flood.stalled, flood.closed_after
    );
    let bound = bound_kib();
    assert!(
        flood.growth_kib <= bound,
        "{what}: the server's RSS grew by {} KiB while one client did not read (bound {bound} KiB): {flood:?}",
        flood.growth_kib
    );
    assert!(
        flood.closed_after.is_some(),
        "{what}: the client was never closed as a slow consumer: {flood:?}"
    );
    assert!(
        matches!(code, Some(4009) | None),
        "{what}: the connection ended with {code:?}, not 4009"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_requests_from_a_client_that_does_not_read_stay_within_the_outbox() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().unwrap();
    let server = serve(&dir);
    let http = server.http();
    fill_room(&http, "big", ROOM_EVENTS);
    let (addr, pid, token) = (server.addr, server.pid(), http.mint_token("hostile", "web"));
    // At the default max_messages_per_sec (100, burst 200): one request every 10 ms.
    let request = client_frame(0x1, br#"{"op":"history","room":"big","since":0,"limit":1000}"#);
    let mut sent = 0u32;
    let (result, code) = with_honest_subscriber(&server, move || {
        flood(addr, pid, token, move |elapsed| {
            let due = (elapsed.as_millis() / 10) as u32;
            if sent >= due {
                pace(Duration::from_millis(2), "history requests at one per 10 ms");
                return None;
            }
            sent += 1;
            Some(request.clone())
        })
    })
    .await;
    check("history flood", &result, code);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_at_line_rate_from_a_client_that_does_not_read_stay_within_the_outbox() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().unwrap();
    let server = serve(&dir);
    let http = server.http();
    let (addr, pid, token) = (server.addr, server.pid(), http.mint_token("hostile", "web"));
    // 512 Pings of 125 bytes per write, as fast as the socket takes them, at most 64 MiB.
    let batch: Vec<u8> = (0..512).flat_map(|_| client_frame(0x9, &[b'p'; 125])).collect();
    let mut budget: u64 = 64 * 1024 * 1024;
    let (result, code) = with_honest_subscriber(&server, move || {
        flood(addr, pid, token, move |_| {
            if budget < batch.len() as u64 {
                pace(Duration::from_millis(5), "the ping budget is spent");
                return None;
            }
            budget -= batch.len() as u64;
            Some(batch.clone())
        })
    })
    .await;
    check("ping flood", &result, code);
    assert!(result.stalled, "the server kept reading Pings it could not answer: {result:?}");
}

#[tokio::test]
async fn a_history_page_is_cut_to_the_outbox_and_paging_on_reads_everything() {
    let _gate = crate::common::gate!();
    let server = crate::common::TestServer::start(|c| c.max_outbox_bytes = 16 * 1024);
    let http = server.http();
    fill_room(&http, "paged", 300);
    let mut client = server.client("reader").await;
    let (mut since, mut seqs, mut pages) = (0, Vec::new(), 0);
    loop {
        let page = client.history_op("paged", since, 1000).await;
        assert_eq!(page["op"], "history", "{page}");
        let events = page["events"].as_array().expect("events").clone();
        assert!(!events.is_empty(), "a page makes progress: {page}");
        let frame_bytes = page.to_string().len() as u64;
        assert!(frame_bytes <= 16 * 1024 + 512, "a page of {frame_bytes} bytes, over the outbox");
        seqs.extend(events.iter().map(|e| e["seq"].as_u64().unwrap()));
        since = *seqs.last().unwrap();
        pages += 1;
        if page["complete"] == true {
            break;
        }
        assert!(pages < 100, "paging does not end");
    }
    assert!(pages > 1, "300 events of ~200 bytes do not fit in one 16 KiB page");
    assert_eq!(seqs, (1..=300).collect::<Vec<_>>());
}
