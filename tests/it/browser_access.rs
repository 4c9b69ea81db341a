//! A page from another origin (issue 49): `allowed_origins` governs the CORS headers of
//! the client files, `POST /v1/tokens` and its preflight (as it did `/v1/sse`), with any
//! port allowed by `http://host:*`; `livegate serve --dev` on the real binary (the key
//! printed, localhost pages mint tokens without it, a short drain) and a plain `serve`
//! that stays as strict as ever; `HEAD` on the health routes. Every request is a real
//! HTTP request carrying `Origin`, as a browser sends it.

use crate::common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::process::ServeProcess;
use common::*;
use serde_json::{json, Value};

/// One request: its status, the headers (names lowercased) and the body text.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// `method path` with `headers` and an optional JSON body, whatever the status.
fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    let mut request = ureq::request(method, &format!("http://{addr}{path}")).timeout(WAIT);
    for (name, value) in headers {
        request = request.set(name, value);
    }
    let result = match body {
        Some(body) => request.send_json(body),
        None => request.call(),
    };
    let response = match result {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .map(|name| {
            let value = response.header(&name).unwrap_or("").to_string();
            (name.to_ascii_lowercase(), value)
        })
        .collect();
    Answer { status, headers, body: response.into_string().unwrap_or_default() }
}

const PAGE: &str = "http://localhost:5173";
const EVIL: &str = "https://evil.example";

#[test]
fn allowed_origins_govern_cors_for_the_client_files_the_token_route_and_its_preflight() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| {
        c.allowed_origins = vec!["http://localhost:*".into(), "https://app.example".into()]
    });
    let addr = server.addr;

    // The client files: the entry module, its types and its modules, from any port of
    // localhost and from the exact origin; nothing for another page.
    for path in ["/livegate.js", "/livegate.d.ts", "/livegate/client.js"] {
        for origin in [PAGE, "http://localhost:8080", "http://localhost", "https://app.example"] {
            let answer = send(addr, "GET", path, &[("Origin", origin)], None);
            assert_eq!(answer.status, 200, "GET {path} from {origin}");
            assert_eq!(
                answer.header("access-control-allow-origin"),
                Some(origin),
                "GET {path} from {origin}"
            );
            assert_eq!(answer.header("vary"), Some("Origin"), "GET {path} from {origin}");
        }
        for origin in [
            EVIL,
            "https://localhost:5173",
            "http://localhost.evil.example:80",
            "https://app.example:444",
        ] {
            let answer = send(addr, "GET", path, &[("Origin", origin)], None);
            assert_eq!(answer.status, 200, "the file is served; only the header is missing");
            assert_eq!(
                answer.header("access-control-allow-origin"),
                None,
                "GET {path} from {origin}"
            );
        }
    }
    // A file that does not exist is refused all the same, readable by an allowed page.
    let missing = send(addr, "GET", "/livegate/nothing.js", &[("Origin", PAGE)], None);
    assert_eq!((missing.status, missing.header("access-control-allow-origin")), (404, Some(PAGE)));
    // Other routes are no client files: no CORS header.
    let metrics = send(addr, "GET", "/metrics", &[("Origin", PAGE)], None);
    assert_eq!(metrics.header("access-control-allow-origin"), None);

    // The preflight of a page's fetch with a JSON body and a key.
    let preflight_headers = |origin| {
        [
            ("Origin", origin),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "content-type,authorization"),
        ]
    };
    let allowed = send(addr, "OPTIONS", "/v1/tokens", &preflight_headers(PAGE), None);
    assert_eq!(allowed.status, 204, "{}", allowed.body);
    assert_eq!(allowed.header("access-control-allow-origin"), Some(PAGE));
    let methods =
        allowed.header("access-control-allow-methods").unwrap_or_default().to_ascii_lowercase();
    assert!(methods.contains("post"), "{methods}");
    let headers =
        allowed.header("access-control-allow-headers").unwrap_or_default().to_ascii_lowercase();
    assert!(headers.contains("content-type") && headers.contains("authorization"), "{headers}");
    assert!(allowed.body.is_empty(), "{}", allowed.body);
    let refused = send(addr, "OPTIONS", "/v1/tokens", &preflight_headers(EVIL), None);
    assert_eq!(
        (refused.status, error_code(&refused.json())),
        (403, "forbidden_origin"),
        "{}",
        refused.body
    );
    assert_eq!(refused.header("access-control-allow-origin"), None);
    assert_eq!(refused.header("access-control-allow-methods"), None);

    // The token itself: readable by an allowed page, still minted for anyone with the key
    // (a backend sends no Origin), but never readable by another page.
    let key = format!("Bearer {API_KEY}");
    let body = json!({"user": "u1", "ttl_secs": 60});
    let minted = send(
        addr,
        "POST",
        "/v1/tokens",
        &[("Origin", PAGE), ("Authorization", &key)],
        Some(body.clone()),
    );
    assert_eq!(minted.status, 201, "{}", minted.body);
    assert_eq!(minted.header("access-control-allow-origin"), Some(PAGE));
    assert!(minted.json()["token"].is_string(), "{}", minted.body);
    let elsewhere = send(
        addr,
        "POST",
        "/v1/tokens",
        &[("Origin", EVIL), ("Authorization", &key)],
        Some(body.clone()),
    );
    assert_eq!((elsewhere.status, elsewhere.header("access-control-allow-origin")), (201, None));
    // Without the key (not development mode): 401, which the page can read.
    let no_key = send(addr, "POST", "/v1/tokens", &[("Origin", PAGE)], Some(body));
    assert_eq!(
        (no_key.status, error_code(&no_key.json())),
        (401, "unauthorized"),
        "{}",
        no_key.body
    );
    assert_eq!(no_key.header("access-control-allow-origin"), Some(PAGE));
}

#[test]
fn an_empty_allowed_origins_lets_any_page_read_the_client_files_and_tokens() {
    let _gate = crate::common::gate!();
    // The default: `allowed_origins` empty means any origin, for CORS as for upgrades.
    let server = TestServer::start(|_| {});
    for path in ["/livegate.js", "/livegate/connection.js"] {
        let answer = send(server.addr, "GET", path, &[("Origin", EVIL)], None);
        assert_eq!(
            (answer.status, answer.header("access-control-allow-origin")),
            (200, Some(EVIL)),
            "GET {path}"
        );
    }
    let preflight = send(
        server.addr,
        "OPTIONS",
        "/v1/tokens",
        &[("Origin", EVIL), ("Access-Control-Request-Method", "POST")],
        None,
    );
    assert_eq!(
        (preflight.status, preflight.header("access-control-allow-origin")),
        (204, Some(EVIL))
    );
    // Any origin is allowed but none is listed: a token still needs the key.
    let no_key =
        send(server.addr, "POST", "/v1/tokens", &[("Origin", EVIL)], Some(json!({"user": "u1"})));
    assert_eq!(no_key.status, 401, "{}", no_key.body);
    // Without an Origin (curl, a backend): no CORS headers at all.
    let plain = send(server.addr, "GET", "/livegate.js", &[], None);
    assert_eq!((plain.status, plain.header("access-control-allow-origin")), (200, None));
}

/// The raw bytes of `method path` over a fresh TCP connection that the server closes.
fn raw(addr: SocketAddr, method: &str, path: &str) -> (u16, String, Vec<u8>) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).expect("read the answer to its end");
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete head") + 4;
    let head = String::from_utf8_lossy(&bytes[..end]).to_string();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    (status, head, bytes[end..].to_vec())
}

#[test]
fn head_on_the_health_routes_answers_the_status_without_a_body() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    for path in ["/healthz", "/readyz"] {
        let (get_status, _, get_body) = raw(server.addr, "GET", path);
        assert_eq!(get_status, 200, "GET {path}");
        assert!(!get_body.is_empty(), "GET {path} has a body");
        let (status, head, body) = raw(server.addr, "HEAD", path);
        assert_eq!(status, get_status, "HEAD {path}: {head}");
        assert!(body.is_empty(), "HEAD {path} sent a body: {:?}", String::from_utf8_lossy(&body));
    }
    // A route without HEAD stays the router's 404.
    let (status, _, _) = raw(server.addr, "HEAD", "/v1/route");
    assert_eq!(status, 404);
}

/// The `dev mode` line a `serve --dev` printed after its listening line.
fn dev_line(serve: &ServeProcess) -> Option<String> {
    serve.stdout_lines().into_iter().find(|line| line.starts_with("dev mode"))
}

#[test]
fn plain_serve_is_not_development_mode() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let serve = ServeProcess::start(&data, &dir.path().join("log"), &[]);
    assert_eq!(dev_line(&serve), None, "no dev line without --dev");
    // A page from localhost gets no token without the key, and the key is not printed.
    let no_key =
        send(serve.addr, "POST", "/v1/tokens", &[("Origin", PAGE)], Some(json!({"user": "u1"})));
    assert_eq!(
        (no_key.status, error_code(&no_key.json())),
        (401, "unauthorized"),
        "{}",
        no_key.body
    );
    assert!(
        serve.stdout_lines().iter().all(|line| !line.contains(API_KEY)),
        "{:?}",
        serve.stdout_lines()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_dev_prints_the_key_lets_localhost_pages_mint_tokens_and_stops_fast() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // No key configured: the generated one is printed, as a laptop user needs it.
    let mut serve = ServeProcess::start_without_key(&data, &dir.path().join("log"), &["--dev"]);
    let key = std::fs::read_to_string(data.join("api_key"))
        .expect("the generated key file")
        .trim()
        .to_string();
    let line = dev_line(&serve).expect("a dev mode line on stdout");
    assert!(line.contains(&format!("API key {key}")), "{line}");
    assert!(
        line.contains("NOT FOR PRODUCTION")
            && line.contains("WITHOUT the key")
            && line.contains("http://localhost:*"),
        "{line}"
    );

    // A page from localhost (any port), 127.0.0.1 or [::1] mints a token without the key.
    for origin in [PAGE, "http://127.0.0.1:8000", "http://[::1]:3000"] {
        let minted = send(
            serve.addr,
            "POST",
            "/v1/tokens",
            &[("Origin", origin)],
            Some(json!({"user": "dev-user"})),
        );
        assert_eq!(minted.status, 201, "from {origin}: {}", minted.body);
        assert_eq!(minted.header("access-control-allow-origin"), Some(origin));
    }
    let token = send(
        serve.addr,
        "POST",
        "/v1/tokens",
        &[("Origin", PAGE)],
        Some(json!({"user": "dev-user"})),
    )
    .json()["token"]
        .as_str()
        .expect("a token")
        .to_string();
    // The token is a real one: it connects and receives what the backend publishes.
    let mut client = WsClient::connect_custom(serve.addr, &token, None, &[("Origin", PAGE)]).await;
    client.subscribe_ok("lobby").await;
    let http = Http::new(serve.addr);
    let (status, body) = http.request(
        "POST",
        "/v1/rooms/lobby/events",
        Auth::Header(&format!("Bearer {key}")),
        Body::Json(json!({"data": "hi"})),
    );
    assert_eq!(status, 201, "{body}");
    let events = client.next_events(1).await;
    assert_eq!(events[0]["data"], "hi", "{events:?}");

    // Everyone else still needs the key: another page, a request without Origin, a wrong key.
    for (what, headers) in [
        ("another origin", vec![("Origin", EVIL)]),
        ("https on localhost", vec![("Origin", "https://localhost:5173")]),
        ("no Origin", vec![]),
        (
            "a wrong key from localhost",
            vec![("Origin", PAGE), ("Authorization", "Bearer not-the-key-0123456789")],
        ),
    ] {
        let refused = send(serve.addr, "POST", "/v1/tokens", &headers, Some(json!({"user": "u1"})));
        assert_eq!(
            (refused.status, error_code(&refused.json())),
            (401, "unauthorized"),
            "{what}: {}",
            refused.body
        );
    }
    // The other API routes are untouched by dev mode.
    let publish = send(
        serve.addr,
        "POST",
        "/v1/rooms/lobby/events",
        &[("Origin", PAGE)],
        Some(json!({"data": 1})),
    );
    assert_eq!(publish.status, 401, "{}", publish.body);
    // Pages from elsewhere may not connect at all.
    let fresh =
        send(serve.addr, "POST", "/v1/tokens", &[("Origin", PAGE)], Some(json!({"user": "u2"})))
            .json();
    let refused = WsClient::try_connect_custom(
        serve.addr,
        fresh["token"].as_str(),
        None,
        &[("Origin", EVIL)],
    )
    .await
    .err();
    let refused = refused.expect("an origin outside the dev defaults is refused");
    assert_eq!(
        (refused.status, error_code(&refused.body)),
        (403, "forbidden_origin"),
        "{}",
        refused.body
    );

    // Ctrl-C on a laptop: the drain waits about a second, not fifteen.
    drop(client);
    let asked = Instant::now();
    serve.signal("INT");
    let status =
        serve.wait_exit(Duration::from_secs(10)).expect("serve --dev exits within 10 s of Ctrl-C");
    let took = asked.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(5), "serve --dev took {took:?} to stop");
    eprintln!("serve --dev stopped {took:?} after SIGINT");
}

#[test]
fn settings_given_explicitly_win_over_the_dev_defaults() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let serve = ServeProcess::start(
        &data,
        &dir.path().join("log"),
        &["--dev", "--allowed-origins", "https://app.example"],
    );
    let line = dev_line(&serve).expect("a dev mode line");
    assert!(line.contains("https://app.example") && !line.contains("localhost"), "{line}");
    let localhost =
        send(serve.addr, "POST", "/v1/tokens", &[("Origin", PAGE)], Some(json!({"user": "u1"})));
    assert_eq!(localhost.status, 401, "localhost is no longer listed: {}", localhost.body);
    let app = send(
        serve.addr,
        "POST",
        "/v1/tokens",
        &[("Origin", "https://app.example")],
        Some(json!({"user": "u1"})),
    );
    assert_eq!(
        (app.status, app.header("access-control-allow-origin")),
        (201, Some("https://app.example")),
        "{}",
        app.body
    );
}
