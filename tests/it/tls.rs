//! Optional TLS (issue 8): with `tls_cert`/`tls_key` the node serves HTTPS and WSS on its
//! one listener. The test makes a self-signed certificate with rcgen, starts the server
//! with it, and talks to it only through a rustls client that trusts exactly that
//! certificate: a token minted over HTTPS, a WSS subscriber, a publish over HTTPS, the
//! event delivered. Plain HTTP on the TLS port gets no HTTP answer.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, API_KEY, WAIT};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::Message;

/// A self-signed certificate for `localhost` and 127.0.0.1, written as PEM files.
struct SelfSigned {
    _dir: tempfile::TempDir,
    cert_pem: PathBuf,
    key_pem: PathBuf,
    der: rustls::pki_types::CertificateDer<'static>,
}

fn self_signed() -> SelfSigned {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("rcgen");
    let dir = tempfile::tempdir().expect("tempdir");
    let cert_pem = dir.path().join("cert.pem");
    let key_pem = dir.path().join("key.pem");
    std::fs::write(&cert_pem, cert.pem()).expect("write cert");
    std::fs::write(&key_pem, signing_key.serialize_pem()).expect("write key");
    SelfSigned { _dir: dir, cert_pem, key_pem, der: cert.der().clone() }
}

/// A TLS client (ring provider) that trusts only `cert`.
fn connector(cert: &rustls::pki_types::CertificateDer<'static>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).expect("add root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

async fn tls_stream(
    addr: SocketAddr,
    tls: &TlsConnector,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tls.connect(ServerName::try_from("localhost").expect("server name"), tcp).await
}

/// One HTTP/1.1 request over TLS (`Connection: close`); the status and the body as JSON
/// (text that is not JSON as a JSON string).
async fn https(
    addr: SocketAddr,
    tls: &TlsConnector,
    method: &str,
    path: &str,
    key: bool,
    body: Option<Value>,
) -> (u16, Value) {
    tokio::time::timeout(WAIT, async {
        let mut stream =
            tls_stream(addr, tls).await.unwrap_or_else(|e| panic!("TLS connect to {addr}: {e}"));
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost:{}\r\nConnection: close\r\n",
            addr.port()
        );
        if key {
            head.push_str(&format!("Authorization: Bearer {API_KEY}\r\n"));
        }
        if !body.is_empty() {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await.expect("write request head");
        stream.write_all(body.as_bytes()).await.expect("write request body");
        stream.flush().await.expect("flush");
        let mut raw = Vec::new();
        // The server may end without close_notify; what was read is what counts.
        let _ = stream.read_to_end(&mut raw).await;
        parse_response(&raw).unwrap_or_else(|| {
            panic!("{method} {path}: not an HTTP response: {:?}", String::from_utf8_lossy(&raw))
        })
    })
    .await
    .unwrap_or_else(|_| panic!("{method} {path} over TLS took longer than {WAIT:?}"))
}

fn parse_response(raw: &[u8]) -> Option<(u16, Value)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked")) {
        body = dechunk(&body)?;
    } else if let Some((_, len)) = headers.iter().find(|(n, _)| n == "content-length") {
        body.truncate(len.parse().ok()?);
    }
    let text = String::from_utf8_lossy(&body).into_owned();
    let value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Some((status, value))
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(
            std::str::from_utf8(&data[..line_end]).ok()?.split(';').next()?.trim(),
            16,
        )
        .ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// Waits until `GET /readyz` over HTTPS answers 200.
async fn wait_ready_tls(server: &TestServer, tls: &TlsConnector) {
    let ready = common::wait_until_every_async(
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            assert!(!server.thread_finished(), "the TLS server stopped before it became ready");
            let probe = tokio::time::timeout(Duration::from_secs(2), async {
                let mut s = tls_stream(server.addr, tls).await.ok()?;
                let req = "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
                s.write_all(req.as_bytes()).await.ok()?;
                let mut raw = Vec::new();
                let _ = s.read_to_end(&mut raw).await;
                parse_response(&raw)
            })
            .await;
            matches!(probe, Ok(Some((200, _))))
        },
    )
    .await;
    assert!(ready, "the TLS server was not ready (GET /readyz over HTTPS) within 20 s");
}

type Wss = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// The next JSON text frame, skipping the inbox notice; panics on anything else.
async fn next_json(ws: &mut Wss) -> Value {
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .unwrap_or_else(|_| panic!("no frame over WSS within {WAIT:?}"))
            .expect("WSS stream ended")
            .expect("WSS read");
        match msg {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(&t).expect("JSON frame");
                let inbox_notice = v["op"] == "subscribed" && v.get("ref").is_none();
                if !inbox_notice {
                    return v;
                }
            }
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected frame over WSS: {other:?}"),
        }
    }
}

#[tokio::test]
async fn https_and_wss_with_a_self_signed_certificate_mint_subscribe_publish_receive() {
    let _gate = crate::common::gate!();
    let (server, tls, _cert) = tls_server().await;
    let addr = server.addr;

    // Mint a token over HTTPS.
    let (status, body) =
        https(addr, &tls, "POST", "/v1/tokens", true, Some(json!({"user": "alice"}))).await;
    assert_eq!(status, 201, "POST /v1/tokens over HTTPS: {body}");
    let token = body["token"].as_str().expect("token").to_string();
    // The API key is still required over HTTPS.
    let (status, body) =
        https(addr, &tls, "POST", "/v1/tokens", false, Some(json!({"user": "alice"}))).await;
    assert_eq!(status, 401, "{body}");

    // WSS: the upgrade over the TLS stream.
    let stream = tls_stream(addr, &tls).await.expect("TLS handshake for WSS");
    let url = format!("wss://localhost:{}/v1/ws?token={token}", addr.port());
    let (mut ws, response) =
        tokio::time::timeout(WAIT, tokio_tungstenite::client_async(url, stream))
            .await
            .expect("WSS handshake timed out")
            .expect("WSS handshake");
    assert_eq!(response.status().as_u16(), 101);
    let welcome = next_json(&mut ws).await;
    assert_eq!(welcome["op"], "welcome", "{welcome}");
    ws.send(Message::Text(json!({"op": "subscribe", "room": "secure", "ref": 1}).to_string()))
        .await
        .expect("send");
    let reply = next_json(&mut ws).await;
    assert_eq!(
        (reply["op"].as_str(), reply["ref"].as_u64()),
        (Some("subscribed"), Some(1)),
        "{reply}"
    );

    // Publish over HTTPS; the event arrives over WSS.
    let (status, body) = https(
        addr,
        &tls,
        "POST",
        "/v1/rooms/secure/events",
        true,
        Some(json!({"id": "s-1", "data": {"over": "tls"}})),
    )
    .await;
    assert_eq!(status, 201, "publish over HTTPS: {body}");
    let frame = next_json(&mut ws).await;
    assert_eq!(frame["op"], "events", "{frame}");
    assert_eq!(frame["events"][0]["data"], json!({"over": "tls"}), "{frame}");
    assert_eq!(frame["events"][0]["id"], "s-1", "{frame}");
    let (status, body) =
        https(addr, &tls, "GET", "/v1/rooms/secure/events?since=0", true, None).await;
    assert_eq!((status, &body["head"]), (200, &json!(1)), "{body}");

    ws.send(Message::Text(json!({"op": "ping", "ref": 2}).to_string())).await.expect("send");
    assert_eq!(next_json(&mut ws).await, json!({"op": "pong", "ref": 2}));
    let _ = ws.close(None).await;
}

#[tokio::test]
async fn plain_http_and_ws_on_the_tls_port_get_no_normal_answer() {
    let _gate = crate::common::gate!();
    let (server, tls, _cert) = tls_server().await;

    // Plain HTTP: whatever comes back (a TLS alert, or nothing) is not an HTTP response,
    // and the socket is closed.
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut reply = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut reply)).await;
    assert!(read.is_ok(), "plain HTTP on the TLS port: the socket stayed open for 5 s");
    assert!(
        !reply.starts_with(b"HTTP/"),
        "plain HTTP got an HTTP answer: {:?}",
        String::from_utf8_lossy(&reply)
    );

    // A plain ws:// upgrade fails.
    let url = format!("ws://{}/v1/ws?token=whatever", server.addr);
    let attempt =
        tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(url)).await;
    assert!(
        matches!(attempt, Ok(Err(_))),
        "a plain ws:// upgrade on the TLS port must fail: {:?}",
        attempt.map(|r| r.map(|_| ()))
    );

    // A client that does not trust the certificate is refused by its own TLS layer
    // (the server does not hand out a trusted identity it does not have).
    let other = self_signed();
    let distrusting = connector(&other.der);
    assert!(
        tls_stream(server.addr, &distrusting).await.is_err(),
        "a certificate the client does not trust"
    );

    // The server still serves HTTPS.
    let (status, body) = https(server.addr, &tls, "GET", "/healthz", false, None).await;
    assert_eq!(status, 200, "{body}");
}

/// Starts a TLS server with a fresh self-signed certificate; returns it with a client
/// connector that trusts it, once `/readyz` answers over HTTPS.
async fn tls_server() -> (TestServer, TlsConnector, SelfSigned) {
    let cert = self_signed();
    let (cert_pem, key_pem) = (cert.cert_pem.clone(), cert.key_pem.clone());
    let server = TestServer::start_unprobed(move |c| {
        c.tls_cert = Some(cert_pem);
        c.tls_key = Some(key_pem);
    });
    let tls = connector(&cert.der);
    wait_ready_tls(&server, &tls).await;
    (server, tls, cert)
}

/// Clients ask `/v1/route` where to connect; on a node that only speaks TLS the default
/// answer (no `public_url` configured) must be an `https://` URL.
#[tokio::test]
async fn route_names_an_https_url_for_a_tls_node() {
    let _gate = crate::common::gate!();
    let (server, tls, _cert) = tls_server().await;
    let (status, body) = https(server.addr, &tls, "GET", "/v1/route?user=alice", true, None).await;
    assert_eq!(status, 200, "{body}");
    let url = body["url"].as_str().unwrap_or_else(|| panic!("route without url: {body}"));
    assert!(
        url.starts_with("https://"),
        "a TLS node routes clients to {url:?}, where plain HTTP gets no answer"
    );
}

/// `livegate serve` with certificate files it cannot read, as a child process; returns
/// its exit status, stdout and stderr (bounded: killed after 15 s).
fn serve_with_missing_certificate() -> (std::process::ExitStatus, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-cert.pem");
    let mut child = std::process::Command::new(crate::common::livegate_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--api-key", API_KEY])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--tls-cert")
        .arg(&missing)
        .arg("--tls-key")
        .arg(&missing)
        .env_remove("LIVEGATE_CONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run livegate serve");
    if !common::wait_until(Duration::from_secs(15), || {
        child.try_wait().expect("try_wait").is_some()
    }) {
        let _ = child.kill();
        let output = child.wait_with_output().expect("output");
        panic!(
            "serve with a missing certificate was still running after 15 s; stdout {} stderr {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let output = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status, stdout, stderr)
}

#[test]
fn unreadable_certificate_files_fail_the_start_and_name_the_file() {
    let _gate = crate::common::gate!();
    let (status, stdout, stderr) = serve_with_missing_certificate();
    assert!(
        !status.success(),
        "serve with a missing certificate must fail; stdout {stdout} stderr {stderr}"
    );
    assert!(
        stderr.contains("no-such-cert.pem") || stdout.contains("no-such-cert.pem"),
        "the error names the file: stdout {stdout} stderr {stderr}"
    );
}

/// The `listening on` line tells operators and scripts (and tests/it/common/process.rs) that
/// the node serves: it must not be printed by a node about to fail on its certificate.
#[test]
fn a_node_that_cannot_load_its_certificate_never_announces_a_listener() {
    let _gate = crate::common::gate!();
    let (status, stdout, stderr) = serve_with_missing_certificate();
    assert!(!status.success(), "stdout {stdout} stderr {stderr}");
    assert!(
        !stdout.contains("listening on"),
        "announced a listener, then failed: stdout {stdout:?} stderr {stderr:?}"
    );
}
