//! Per-IP limits behind a real nginx (issue 16, `trusted_proxies`): connections through
//! the proxy count under the client's own address from `X-Forwarded-For`, a client
//! cannot pick its address with a header of its own (neither directly nor through the
//! proxy), and without `trusted_proxies` everything behind the proxy is one address.
//! The nginx that runs is the book's load-balancing configuration (docs/src/operations.md).

use crate::common;

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// The nginx configuration of the book's Operations chapter (docs/src/operations.md, its
/// first `nginx` block: load balancing with the drain's timings), as the test runs it:
/// nginx in the foreground with its files under `dir`, listening on `listen`, the
/// book's upstream servers replaced by `upstream` alone. Everything else is the book's
/// text, so a snippet that stops working fails this file's tests.
fn book_nginx_conf(dir: &str, listen: SocketAddr, upstream: SocketAddr) -> String {
    let book = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/src/operations.md"
    ))
    .expect("read docs/src/operations.md");
    let snippet = book
        .split("```nginx\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("an nginx block in docs/src/operations.md");
    let mut conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {dir}/error.log info;\npid {dir}/nginx.pid;\n"
    );
    let mut servers = 0;
    for line in snippet.lines() {
        let code = line.split('#').next().unwrap_or_default().trim();
        if code.starts_with("server ") && code.ends_with(';') {
            // The book's upstream servers: the first becomes the test's, the rest go.
            servers += 1;
            if servers == 1 {
                let options = code
                    .trim_end_matches(';')
                    .split_whitespace()
                    .skip(2)
                    .collect::<Vec<_>>()
                    .join(" ");
                conf.push_str(&format!("        server {upstream} {options};\n"));
            }
            continue;
        }
        if code == "listen 80;" {
            conf.push_str(&format!("        listen {listen};\n"));
            continue;
        }
        conf.push_str(line);
        conf.push('\n');
        if code == "http {" {
            conf.push_str(&format!(
                "    access_log off;\n    client_body_temp_path {dir}/body;\n    proxy_temp_path {dir}/proxy;\n    \
                 fastcgi_temp_path {dir}/fastcgi;\n    uwsgi_temp_path {dir}/uwsgi;\n    scgi_temp_path {dir}/scgi;\n"
            ));
        }
    }
    assert!(
        servers >= 2 && conf.contains(&format!("listen {listen};")),
        "the book's nginx block changed shape:\n{snippet}"
    );
    conf
}

/// nginx in the foreground (one process) in front of `upstream`, with the book's
/// load-balancing and WebSocket proxy settings ([`book_nginx_conf`]).
struct Nginx {
    addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    fn start(upstream: SocketAddr) -> Nginx {
        let binary = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("nginx not found: the test command (.ci/test) installs Debian's nginx");
        // A port picked by binding port 0 and letting it go can be taken by another test's
        // server before nginx binds it; then nginx exits and the probe below reaches the
        // other server. So the probe asks for nginx by name, and a lost port is picked again.
        for _ in 0..5 {
            if let Some(nginx) = Nginx::try_start(binary, upstream) {
                return nginx;
            }
        }
        panic!("nginx did not start on a free port in 5 attempts");
    }

    /// nginx on a fresh port in front of `upstream`, or `None` when the port was lost.
    fn try_start(binary: &str, upstream: SocketAddr) -> Option<Nginx> {
        let dir = tempfile::Builder::new().prefix("livegate-nginx-").tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let d = dir.path().display();
        let conf = book_nginx_conf(&d.to_string(), addr, upstream);
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("write nginx.conf");
        let mut child = Command::new(binary)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nginx");
        let exited = common::wait_for(Duration::from_secs(10), || {
            if answers_as_nginx(addr) {
                return Some(None);
            }
            child.try_wait().expect("nginx status").map(Some)
        })
        .unwrap_or_else(|| panic!("nginx did not listen on {addr} within 10 s"));
        if let Some(status) = exited {
            let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
            if log.contains("Address already in use") {
                return None;
            }
            panic!("nginx exited with {status}: {log}");
        }
        Some(Nginx { addr, child, _dir: dir })
    }
}

/// Whether what listens on `addr` is nginx (its `Server` header), not some other server.
fn answers_as_nginx(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(addr) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /nginx-probe HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).to_ascii_lowercase().contains("server: nginx")
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn open(
    to: SocketAddr,
    server: &TestServer,
    from: &str,
    headers: &[(&str, &str)],
) -> Result<WsClient, (u16, String)> {
    let token = server.mint_token("proxied", "web");
    WsClient::try_connect_custom(to, Some(&token), Some(ip(from)), headers)
        .await
        .map_err(|r| (r.status, error_code(&r.body).to_string()))
}

#[tokio::test]
async fn behind_a_trusted_nginx_each_client_address_has_its_own_limit() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| {
        c.trusted_proxies = vec!["127.0.0.1".into()];
        c.max_connections_per_ip = 2;
    });
    let nginx = Nginx::start(server.addr);
    let via = nginx.addr;

    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(open(via, &server, "127.0.0.2", &[]).await.expect("127.0.0.2 within its limit"));
    }
    let third = open(via, &server, "127.0.0.2", &[]).await.err();
    assert_eq!(
        third,
        Some((429, "too_many_connections".into())),
        "127.0.0.2's third connection through nginx"
    );
    // Another client behind the same proxy has a limit of its own.
    held.push(open(via, &server, "127.0.0.3", &[]).await.expect("127.0.0.3 behind the same nginx"));
    // A header the client wrote itself is to the left of what nginx appends: ignored.
    let forged = open(via, &server, "127.0.0.2", &[("X-Forwarded-For", "127.0.0.9")]).await.err();
    assert_eq!(
        forged,
        Some((429, "too_many_connections".into())),
        "a forged X-Forwarded-For through nginx"
    );
    // A peer that is not a trusted proxy cannot name an address at all.
    held.push(
        open(server.addr, &server, "127.0.0.4", &[("X-Forwarded-For", "127.0.0.3")])
            .await
            .expect("direct from 127.0.0.4"),
    );
    held.push(
        open(server.addr, &server, "127.0.0.4", &[("X-Real-IP", "127.0.0.2")])
            .await
            .expect("direct from 127.0.0.4 again"),
    );
    let direct =
        open(server.addr, &server, "127.0.0.4", &[("X-Forwarded-For", "127.0.0.5")]).await.err();
    assert_eq!(
        direct,
        Some((429, "too_many_connections".into())),
        "127.0.0.4 counted under its own address"
    );

    // A connection that ends gives its address's place back.
    for c in held.iter_mut() {
        c.assert_alive().await;
    }
    held.remove(0).close().await;
    let refused = std::cell::RefCell::new(None);
    let last_refusal = &refused;
    let back =
        common::wait_for_every_async(Duration::from_secs(5), Duration::from_millis(50), || {
            let attempt = open(via, &server, "127.0.0.2", &[]);
            async move { attempt.await.map_err(|r| *last_refusal.borrow_mut() = Some(r)).ok() }
        })
        .await;
    held.push(
        back.unwrap_or_else(|| panic!("127.0.0.2's place never came back: {:?}", refused.borrow())),
    );
}

#[tokio::test]
async fn without_trusted_proxies_everything_behind_nginx_is_one_address() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_connections_per_ip = 2);
    let nginx = Nginx::start(server.addr);
    let _a = open(nginx.addr, &server, "127.0.0.2", &[]).await.expect("first");
    let _b = open(nginx.addr, &server, "127.0.0.3", &[]).await.expect("second");
    let third = open(nginx.addr, &server, "127.0.0.6", &[]).await.err();
    assert_eq!(
        third,
        Some((429, "too_many_connections".into())),
        "all three come from nginx's 127.0.0.1"
    );
}

/// A WebSocket handshake written by hand from `from` to `to`, with `extra` header lines
/// (raw bytes: a header need not be text); the answer's status, and the socket (open
/// while the connection is).
fn raw_handshake(to: SocketAddr, from: &str, token: &str, extra: &[u8]) -> (u16, TcpStream) {
    use std::io::{Read, Write};
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.bind(&SocketAddr::new(ip(from), 0).into()).expect("bind");
    socket.connect(&to.into()).expect("connect");
    let mut stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut request = format!(
        "GET /v1/ws?token={token} HTTP/1.1\r\nHost: livegate\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    )
    .into_bytes();
    request.extend_from_slice(extra);
    request.extend_from_slice(b"\r\n");
    stream.write_all(&request).expect("write the handshake");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => panic!(
                "handshake answer cut short ({other:?}): {:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    let status = String::from_utf8_lossy(&head)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, stream)
}

/// Issue 29 item 5: an `X-Forwarded-For` value that is not ASCII was dropped as if there
/// were none, and the client's own `X-Real-IP` (which nginx passes through) named the
/// address instead: a client could dodge its per-IP limits and spend another address's.
/// Now such a header is garbage in the list: nginx's own entry to its right still names
/// the client, and `X-Real-IP` is not read when `X-Forwarded-For` is there.
#[tokio::test]
async fn x_forwarded_for_that_is_not_text_does_not_let_x_real_ip_pick_the_address() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| {
        c.trusted_proxies = vec!["127.0.0.1".into()];
        c.max_connections_per_ip = 1;
    });
    let nginx = Nginx::start(server.addr);
    // The attacker (127.0.0.2) names the victim (127.0.0.9) in X-Real-IP, with an
    // X-Forwarded-For of bytes that are not text.
    let forged = b"X-Forwarded-For: \xff\xfe\xc3\r\nX-Real-IP: 127.0.0.9\r\n";
    let (status, _attacker) =
        raw_handshake(nginx.addr, "127.0.0.2", &server.mint_token("attacker", "web"), forged);
    assert_eq!(status, 101, "the attacker's own first connection");
    // Counted under the attacker's own address: its second is over its limit...
    let (status, _) = raw_handshake(
        nginx.addr,
        "127.0.0.2",
        &server.mint_token("attacker", "web"),
        b"X-Real-IP: 127.0.0.8\r\n",
    );
    assert_eq!(status, 429, "the attacker's second connection, with another forged X-Real-IP");
    // ...and the victim's place is untouched.
    let (status, _victim) =
        raw_handshake(nginx.addr, "127.0.0.9", &server.mint_token("victim", "web"), b"");
    assert_eq!(status, 101, "the victim's address was charged for the attacker's connection");
}
