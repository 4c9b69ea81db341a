//! Heartbeat with a 1 s interval from config: a client that neither sends nor answers
//! for 3 intervals is closed with 4008; a client that answers the server's pings, or
//! sends `ping` ops, stays connected; WebSocket pings from the client are answered.

use crate::common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

fn one_second_heartbeat() -> TestServer {
    TestServer::start(|c| c.heartbeat_secs = 1)
}

/// A WebSocket client that never writes a byte after the handshake, so it never answers
/// a ping: the model of a client that went away without closing. (tungstenite answers
/// pings whenever it reads, so it cannot play this part.)
struct DeadClient {
    tcp: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl DeadClient {
    async fn connect(server: &TestServer) -> DeadClient {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let token = server.mint_token("alice", "web");
        let mut tcp = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
        let request = format!(
            "GET /v1/ws?token={token} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
            server.addr
        );
        tcp.write_all(request.as_bytes()).await.expect("write handshake");
        let mut buf = Vec::new();
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(WAIT, tcp.read(&mut chunk))
                .await
                .expect("handshake timeout")
                .expect("read");
            assert!(n > 0, "connection closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        assert!(head.starts_with("HTTP/1.1 101"), "handshake answer: {head}");
        DeadClient { tcp, buf: buf[end..].to_vec() }
    }

    /// The next frame (opcode, payload) within `within`; `None` when the server closed
    /// the TCP connection.
    async fn frame(&mut self, within: std::time::Duration) -> Option<(u8, Vec<u8>)> {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some((opcode, payload, used)) = parse_frame(&self.buf) {
                self.buf.drain(..used);
                return Some((opcode, payload));
            }
            let mut chunk = [0u8; 65536];
            let n = match tokio::time::timeout_at(deadline, self.tcp.read(&mut chunk)).await {
                Err(_) => panic!("no frame within {within:?}"),
                Ok(Ok(n)) => n,
                Ok(Err(_)) => 0,
            };
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// One complete unmasked server frame at the start of `buf`: (opcode, payload, bytes used).
fn parse_frame(buf: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    if buf.len() < 2 {
        return None;
    }
    let opcode = buf[0] & 0x0f;
    assert_eq!(buf[1] & 0x80, 0, "server frames are not masked");
    let (len, at) = match buf[1] & 0x7f {
        126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
        127 if buf.len() >= 10 => (u64::from_be_bytes(buf[2..10].try_into().unwrap()) as usize, 10),
        126 | 127 => return None,
        n => (n as usize, 2),
    };
    if buf.len() < at + len {
        return None;
    }
    Some((opcode, buf[at..at + len].to_vec(), at + len))
}

#[tokio::test]
async fn silent_client_is_closed_with_4008_after_three_intervals() {
    let _gate = crate::common::gate!();
    let server = one_second_heartbeat();
    let mut dead = DeadClient::connect(&server).await;
    let started = std::time::Instant::now();
    let (opcode, welcome) = dead.frame(WAIT).await.expect("welcome");
    assert_eq!(opcode, 1, "text frame");
    let welcome: serde_json::Value = serde_json::from_slice(&welcome).expect("welcome JSON");
    assert_eq!(
        (&welcome["op"], &welcome["heartbeat_ms"]),
        (&json!("welcome"), &json!(1000)),
        "{welcome}"
    );

    let mut pings = 0;
    let code = loop {
        match dead.frame(Duration::from_secs(10)).await {
            Some((0x9, _)) => pings += 1,
            Some((0x8, payload)) => {
                break (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]))
            }
            Some((1, _)) => {} // unsolicited notices
            Some((op, _)) => panic!("unexpected frame opcode {op}"),
            None => panic!("TCP closed without a Close frame after {:?}", started.elapsed()),
        }
    };
    let after = started.elapsed();
    assert_eq!(code, Some(4008), "heartbeat timeout closes with 4008");
    assert!(
        after >= Duration::from_millis(2900) && after <= Duration::from_millis(5500),
        "closed after {after:?}; expected about 3 to 4 intervals of 1 s"
    );
    assert!(pings >= 2, "the server pings every interval; got {pings} pings in {after:?}");

    // The server goes on serving others.
    let mut other = server.client("bob").await;
    other.assert_alive().await;
}

#[tokio::test]
async fn client_answering_pings_stays_connected() {
    let _gate = crate::common::gate!();
    let server = one_second_heartbeat();
    let mut c = server.client("alice").await;
    // Keep reading (tungstenite answers each server ping) for 5 intervals.
    if let Some(frame) = c.recv_within(Duration::from_secs(5)).await {
        panic!("expected only pings, got {frame}");
    }
    c.assert_alive().await;
}

#[tokio::test]
async fn client_sending_ping_ops_stays_connected_without_reading() {
    let _gate = crate::common::gate!();
    let server = one_second_heartbeat();
    let mut c = server.client("alice").await;
    for i in 0..10 {
        c.send_json(&json!({"op": "ping", "ref": 1000 + i})).await;
        common::pace_async(
            Duration::from_millis(500),
            "a ping op every half heartbeat, over five heartbeats",
        )
        .await;
    }
    for i in 0..10 {
        let reply = c.recv_json().await;
        assert_eq!(reply, json!({"op": "pong", "ref": 1000 + i}));
    }
    c.assert_alive().await;
}

#[tokio::test]
async fn websocket_ping_from_the_client_is_answered_with_pong() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let mut c = server.client("alice").await;
    c.send_message(Message::Ping(b"are-you-there".to_vec())).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let msg = tokio::time::timeout_at(deadline, c.ws.next())
            .await
            .expect("no pong within the wait")
            .expect("stream ended")
            .expect("read error");
        match msg {
            Message::Pong(payload) => {
                assert_eq!(payload, b"are-you-there".to_vec(), "pong echoes the ping payload");
                break;
            }
            // Server pings, and unsolicited notices such as the inbox `subscribed`.
            Message::Ping(_) | Message::Text(_) => continue,
            other => panic!("expected a pong, got {other:?}"),
        }
    }
    c.assert_alive().await;
}
