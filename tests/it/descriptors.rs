//! What a connection costs in open files, counted in the real binary's /proc/PID/fd: a
//! WebSocket holds exactly its socket (the open-file limit is the connection limit), an
//! idle HTTP keep-alive connection nothing beyond its socket, and a closed WebSocket gives
//! its descriptor back.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::process::ServeProcess;
use common::*;

const SOCKETS: usize = 40;
/// Past actix-http's keep-alive (5 s): an idle HTTP connection is closed by then.
const KEEP_ALIVE_EXPIRED: Duration = Duration::from_millis(5_500);

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).expect("read /proc/PID/fd").count()
}

/// Waits (bounded: past the keep-alive and 10 s more) until the process holds `want`
/// descriptors; returns what it holds.
async fn settle(pid: u32, want: usize) -> usize {
    wait_until_every_async(
        KEEP_ALIVE_EXPIRED + Duration::from_secs(10),
        Duration::from_millis(50),
        || async move { open_fds(pid) == want },
    )
    .await;
    open_fds(pid)
}

#[tokio::test]
async fn one_descriptor_per_websocket_and_none_extra_for_http() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let serve = ServeProcess::start(&root.path().join("data"), &root.path().join("serve.log"), &[]);
    let http = Http::new(serve.addr);
    let pid = serve.pid();
    // Requests first, so whatever the server opens lazily is open; then the HTTP client's
    // pooled keep-alive connection is let expire (the server closes it after 5 s).
    http.publish_ok("fd:room", None, serde_json::json!(0));
    let tokens: Vec<String> =
        (0..SOCKETS).map(|i| http.mint_token(&format!("fd-user-{i}"), "web")).collect();
    let_time_pass_async(
        KEEP_ALIVE_EXPIRED,
        "the server closes the idle keep-alive connection after 5 s",
    )
    .await;
    let before = open_fds(pid);

    let mut clients = Vec::new();
    for token in &tokens {
        let mut client = WsClient::connect(serve.addr, token, None).await;
        client.subscribe_ok("fd:room").await;
        clients.push(client);
    }
    let with_sockets = settle(pid, before + SOCKETS).await;
    assert_eq!(
        with_sockets - before,
        SOCKETS,
        "{SOCKETS} WebSockets hold {} descriptors",
        with_sockets - before
    );

    // Subscribed connections are served: one publish reaches every one of them. The
    // publish opens one pooled HTTP connection again.
    http.publish_ok("fd:room", None, serde_json::json!("to all"));
    for client in &mut clients {
        let events = client.next_events(1).await;
        assert_eq!(events[0]["data"], "to all");
    }
    let with_sockets = settle(pid, with_sockets + 1).await;

    // Idle HTTP keep-alive connections: one descriptor each, their socket.
    let mut plain: Vec<TcpStream> = (0..SOCKETS)
        .map(|_| {
            let mut stream = TcpStream::connect(serve.addr).expect("connect");
            stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
            write!(stream, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").expect("request");
            let mut reply = [0u8; 512];
            let n = stream.read(&mut reply).expect("response");
            assert!(
                reply[..n].starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&reply[..n])
            );
            stream
        })
        .collect();
    let with_http = settle(pid, with_sockets + SOCKETS).await;
    assert_eq!(
        with_http - with_sockets,
        SOCKETS,
        "{SOCKETS} keep-alive connections hold {} descriptors",
        with_http - with_sockets
    );
    plain.clear();

    // Closed WebSockets give their descriptors back.
    for client in clients {
        client.close().await;
    }
    let after = settle(pid, before).await;
    assert_eq!(after, before, "descriptors after every connection closed");
}
