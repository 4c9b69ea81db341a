//! Hostile clients at the HTTP layer, most of them without any token: a keep-alive
//! connection that sends one byte of its second request and then nothing (slowloris past
//! the first request), a crowd of plain HTTP sockets against the node's open-file budget,
//! an SSE request that asks for a WebSocket upgrade, a session id that is a novel, many
//! addresses of one IPv6 /64, and a flood of `/healthz`. Raw TCP sockets where a client
//! library would be too polite.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: livegate\r\n\r\n";

fn ip(text: &str) -> IpAddr {
    text.parse().expect("ip")
}

/// A TCP connection to `addr` from the local address `from`.
async fn connect_from(addr: SocketAddr, from: IpAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(from, 0)).unwrap_or_else(|e| panic!("bind {from}: {e}"));
    socket.connect(addr).await.unwrap_or_else(|e| panic!("connect to {addr} from {from}: {e}"))
}

/// Reads one whole HTTP answer with a `Content-Length` body: its status and body.
async fn read_answer(stream: &mut TcpStream, within: Duration) -> Option<(u16, Vec<u8>)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().expect("content-length"));
                if got.len() >= end + 4 + length {
                    let status =
                        head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
                    return Some((status, got[end + 4..end + 4 + length].to_vec()));
                }
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// How long until the server closes `stream` (reads end), at most `within`; `None` when
/// it is still open then.
async fn closed_within(
    stream: &mut (impl AsyncRead + Unpin),
    within: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// A keep-alive connection that was answered once and then sent `second` (part of a next
/// request head), ready to be watched.
async fn answered_then_partial(addr: SocketAddr, from: IpAddr, second: &[u8]) -> TcpStream {
    let mut stream = connect_from(addr, from).await;
    stream.write_all(HEALTHZ).await.expect("first request");
    let (status, _) = read_answer(&mut stream, Duration::from_secs(5))
        .await
        .expect("an answer to the first request");
    assert_eq!(status, 200);
    stream.write_all(second).await.expect("part of a second request");
    stream
}

/// Issue 29 item 2: actix-http times only a connection's first request head; a client
/// that completed one request and sent a byte of the next held its socket for ever. Every
/// head after an answer is now due within `handshake_timeout_ms`, however the client
/// trickles it.
#[tokio::test]
async fn a_half_sent_second_request_on_a_keep_alive_connection_is_cut_off() {
    let _gate = crate::common::gate!();
    const TIMEOUT: Duration = Duration::from_millis(1000);
    let server = TestServer::start(|c| c.handshake_timeout_ms = TIMEOUT.as_millis() as u64);
    let mut held = Vec::new();
    for i in 0..10u8 {
        held.push(
            answered_then_partial(server.addr, ip(&format!("127.0.0.{}", 2 + i % 3)), b"G").await,
        );
    }
    // One that keeps trickling: a byte every 200 ms, never a whole head.
    let trickler = answered_then_partial(server.addr, ip("127.0.0.5"), b"G").await;
    let (mut read, mut write) = trickler.into_split();
    let trickle = tokio::spawn(async move {
        for b in b"ET /healthz HTTP/1.1\r\nHost: livegate\r\nX-Slow: ".iter().cycle() {
            if write.write_all(&[*b]).await.is_err() {
                return;
            }
            pace_async(Duration::from_millis(200), "the trickler sends a byte every 200 ms").await;
        }
    });
    let started = Instant::now();

    // Meanwhile an honest client is served.
    let mut client = server.client("honest").await;
    client.subscribe_ok("during").await;
    server.http().publish_ok("during", None, json!("served"));
    assert_eq!(client.next_events(1).await[0]["data"], "served");

    let mut cut_after = Vec::new();
    for stream in &mut held {
        let after = closed_within(stream, Duration::from_secs(6)).await;
        cut_after.push(after.map(|_| started.elapsed()));
    }
    let trickled =
        closed_within(&mut read, Duration::from_secs(6)).await.map(|_| started.elapsed());
    trickle.abort();
    eprintln!(
        "half-sent second requests cut after {cut_after:?}; the trickling one after {trickled:?}"
    );
    for after in cut_after.iter().chain([&trickled]) {
        let after = after.unwrap_or_else(|| {
            panic!(
                "a half-sent second request kept its socket for 6 s: {cut_after:?} / {trickled:?}"
            )
        });
        assert!(after <= TIMEOUT + Duration::from_millis(1500), "cut only after {after:?}");
        assert!(
            after >= TIMEOUT - Duration::from_millis(250),
            "cut after {after:?}, before the timeout"
        );
    }
    let cuts = server
        .http()
        .metric("livegate_limit_hits_total{limit=\"handshake_timeout\"}")
        .unwrap_or(0.0);
    assert!(cuts >= 11.0, "each cut counted as a handshake_timeout limit hit: {cuts}");
    // A keep-alive client that sends whole requests is not disturbed: several requests
    // on one connection, each answered, with pauses shorter than the timeout.
    let mut steady = connect_from(server.addr, ip("127.0.0.6")).await;
    for _ in 0..3 {
        steady.write_all(HEALTHZ).await.expect("request");
        assert_eq!(read_answer(&mut steady, Duration::from_secs(5)).await.map(|a| a.0), Some(200));
        let_time_pass_async(TIMEOUT / 2, "an idle keep-alive pause shorter than the head timeout")
            .await;
    }
    client.assert_alive().await;
}

/// Issue 29 item 2: plain HTTP sockets hold places in the node's open-file budget
/// (`max_http_connections`, taken before `max_connections`). More sockets than places:
/// the rest are closed at once; a socket that becomes a WebSocket gives its place back,
/// so WebSockets are never counted against the plain places and keep theirs while a
/// crowd of idle sockets holds every plain place; once the crowd is cut off (its heads
/// are late), an honest client connects again.
#[tokio::test]
async fn plain_http_sockets_are_bounded_and_websockets_keep_their_place() {
    let _gate = crate::common::gate!();
    const PLACES: usize = 16;
    const TIMEOUT: Duration = Duration::from_millis(1500);
    let server = TestServer::start(|c| {
        c.max_http_connections = PLACES;
        c.handshake_timeout_ms = TIMEOUT.as_millis() as u64;
    });
    // More WebSockets than plain places: upgraded sockets do not hold plain places.
    let mut streams = Vec::new();
    for i in 0..(PLACES + 4) {
        let mut c = server.client(&format!("ws-{i}")).await;
        c.subscribe_ok("held").await;
        streams.push(c);
    }

    // The crowd: sockets that connect and send one byte of a head, from one address.
    let crowd_size = 3 * PLACES;
    let mut crowd = Vec::new();
    for _ in 0..crowd_size {
        let mut s = connect_from(server.addr, ip("127.0.0.7")).await;
        let _ = s.write_all(b"G").await;
        crowd.push(s);
    }
    // Each crowd socket watched at once: how long until the server closed it.
    let started = Instant::now();
    let watchers: Vec<_> = crowd
        .into_iter()
        .map(|mut s| {
            tokio::spawn(
                async move { closed_within(&mut s, TIMEOUT + Duration::from_secs(3)).await },
            )
        })
        .collect();
    // While the crowd holds every plain place, the WebSockets keep theirs: a ping
    // through each is answered.
    // Nothing to poll: /metrics would need one of the plain places the crowd holds.
    let_time_pass_async(
        Duration::from_millis(300),
        "the crowd's sockets are accepted and hold every plain place",
    )
    .await;
    for c in &mut streams {
        c.assert_alive().await;
    }
    let mut closed_after = Vec::new();
    for watcher in watchers {
        let after = watcher.await.expect("watcher");
        closed_after.push(
            after.unwrap_or_else(|| panic!("a crowd socket held its place past the head timeout")),
        );
    }
    let at_once = closed_after.iter().filter(|d| **d < Duration::from_millis(500)).count();
    let held: Vec<&Duration> =
        closed_after.iter().filter(|d| **d >= Duration::from_millis(500)).collect();
    eprintln!(
        "{crowd_size} idle sockets: {} held a plain place (closed after {:?} to {:?}), {at_once} closed at once; all gone after {:?}",
        held.len(),
        held.iter().min(),
        held.iter().max(),
        started.elapsed()
    );
    assert!(
        held.len() <= PLACES,
        "{} plain sockets held at once, over the {PLACES} places",
        held.len()
    );
    assert!(!held.is_empty(), "no crowd socket got a place at all");
    assert!(at_once >= crowd_size - PLACES, "only {at_once} of {crowd_size} refused at once");
    assert!(
        held.iter().all(|d| **d <= TIMEOUT + Duration::from_secs(1)),
        "held sockets cut late: {held:?}"
    );
    // An honest client gets in, and everything held is served.
    server.http().publish_ok("held", None, json!("after the crowd"));
    for c in &mut streams {
        assert_eq!(c.next_events(1).await[0]["data"], "after the crowd");
    }
    let mut late = server.client("late").await;
    late.subscribe_ok("held").await;
    let refused = server
        .http()
        .metric("livegate_limit_hits_total{limit=\"http_connections\"}")
        .unwrap_or(0.0);
    assert!(refused >= (crowd_size - PLACES) as f64, "refused sockets counted: {refused}");
    let open =
        server.http().metric("livegate_http_connections").expect("livegate_http_connections");
    assert!(open <= 3.0, "plain HTTP sockets open after the crowd: {open}");
    for c in streams.drain(..) {
        c.close().await;
    }
}

/// Issue 29 item 7: `GET /v1/sse` with `Upgrade: websocket` went to the upgrade hook,
/// which ran the SSE handler (the token spent, the connection registered) and then
/// buffered its endless body: a ghost connection. The hook now refuses any upgrade that
/// is not a WebSocket handshake on a WebSocket route, before the app sees it.
#[tokio::test]
async fn an_sse_request_asking_for_an_upgrade_is_refused_and_spends_nothing() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let token = server.mint_token("ghost", "web");
    let mut stream = connect_from(server.addr, ip("127.0.0.2")).await;
    let request = format!(
        "GET /v1/sse?token={token}&rooms=ghostroom HTTP/1.1\r\nHost: livegate\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("request");
    let answer = read_answer(&mut stream, Duration::from_secs(3)).await;
    let (status, body) = answer.unwrap_or_else(|| {
        panic!("no answer within 3 s to an SSE request with Upgrade: websocket")
    });
    let body: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {body:?}"));
    assert_eq!((status, error_code(&body)), (400, "bad_request"), "{body}");
    assert!(
        closed_within(&mut stream, Duration::from_secs(2)).await.is_some(),
        "the refused socket is closed"
    );

    // Nothing was registered, and the token was not spent.
    let (status, overview) =
        server.http().request("GET", "/v1/admin/status", Auth::Key, Body::None);
    assert_eq!(status, 200, "{overview}");
    assert_eq!(overview["connections"], 0, "a refused upgrade registered a connection: {overview}");
    let mut c = WsClient::connect(server.addr, &token, None).await;
    c.subscribe_ok("ghostroom").await;
    // An ordinary WebSocket upgrade still works, and so does a plain SSE request.
    let mut other = server.client("other").await;
    other.assert_alive().await;
}

/// Issue 29 item 10: `session=` became a store key and, in cluster mode, a NATS subject,
/// with no bound on its length or characters. A bad session id is now refused with 400
/// before anything is spent, on both transports.
#[tokio::test]
async fn a_bad_session_id_is_refused_before_the_token_is_spent() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let token = server.mint_token("sess", "web");
    let long = "s".repeat(10_000);
    for session in [long.as_str(), "a.*", "has>wildcard"] {
        let refused = WsClient::try_connect(server.addr, Some(&token), Some(session)).await.err();
        let refused = refused
            .unwrap_or_else(|| panic!("a session id of {} bytes was accepted", session.len()));
        assert_eq!(
            (refused.status, error_code(&refused.body)),
            (400, "bad_request"),
            "{}",
            refused.body
        );
        assert!(
            refused.body["error"]["message"].as_str().is_some_and(|m| m.contains("session")),
            "{}",
            refused.body
        );
        // The SSE handshake refuses it the same way.
        let path = format!("/v1/sse?token={token}&session={}", &session[..session.len().min(100)]);
        let (status, body) = server.http().request("GET", &path, Auth::None, Body::None);
        assert_eq!((status, error_code(&body)), (400, "bad_request"), "{body}");
    }
    // The token was never spent; an ordinary session id works.
    let c = WsClient::connect(server.addr, &token, Some("0123456789abcdef01234567")).await;
    assert!(!c.session().is_empty());
}

/// Issue 29 item 10: the per-IP limits keyed a whole IPv6 address, so one subscriber's
/// /64 (2^64 addresses) rotated past them. Seen through a trusted proxy, every address of
/// a /64 now counts as one.
#[tokio::test]
async fn the_addresses_of_one_ipv6_64_share_their_per_ip_limit() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| {
        c.trusted_proxies = vec!["127.0.0.1".into()];
        c.max_connections_per_ip = 2;
    });
    let from = Some(ip("127.0.0.1"));
    let open = |xff: &'static str| {
        let token = server.mint_token("v6", "web");
        async move {
            WsClient::try_connect_custom(
                server.addr,
                Some(&token),
                from,
                &[("X-Forwarded-For", xff)],
            )
            .await
        }
    };
    let _a = open("2001:db8:1:2::1").await.expect("first of the /64");
    let _b = open("2001:db8:1:2::2").await.expect("second of the /64");
    let third = open("2001:db8:1:2:ffff:1:2:3")
        .await
        .err()
        .map(|r| (r.status, error_code(&r.body).to_string()));
    assert_eq!(
        third,
        Some((429, "too_many_connections".into())),
        "a third address of the same /64"
    );
    let _c = open("2001:db8:1:3::1").await.expect("the next /64 is another address");
}

/// Issue 29 item 10: `/healthz` wrote to the store on every call, without a key. A flood
/// now costs at most one store probe per second.
#[tokio::test]
async fn a_flood_of_healthz_costs_no_store_writes() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let probes =
        || http.metric("livegate_store_probes_total").expect("livegate_store_probes_total");
    let before = probes();
    let size_before = http.metric("livegate_store_size_bytes").unwrap_or(0.0);
    let started = Instant::now();
    let calls = 2_000;
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..calls / 4 {
                    let (status, body) = http.request("GET", "/healthz", Auth::None, Body::None);
                    assert_eq!(status, 200, "{body}");
                }
            });
        }
    });
    let elapsed = started.elapsed();
    let probed = probes() - before;
    let size_after = http.metric("livegate_store_size_bytes").unwrap_or(0.0);
    eprintln!("{calls} /healthz in {elapsed:?}: {probed} store probes; store {size_before} -> {size_after} bytes");
    assert!(
        probed <= elapsed.as_secs_f64().ceil() + 1.0,
        "{probed} store probes (writes) for {calls} calls in {elapsed:?}"
    );
}
