//! Protocol adapters, one per server: credentials (livegate tokens), the WebSocket URL,
//! the subscribe handshake after the upgrade, the publish request, and finding each
//! event's bench sequence number and send time in a received frame.
//!
//! Every payload is `{"bs":SEQ,"bt":NS,"pad":"…"}`: `bs` counts publishes per room from
//! 1, `bt` is the intended send time in ns since the bench started. All three servers
//! pass the JSON through with its key order, so one scanner reads every server's frames.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::http::HttpClient;
use crate::servers::{Kind, API_KEY};

pub type Ws = WebSocketStream<TcpStream>;

const STEP_TIMEOUT: Duration = Duration::from_secs(15);

pub fn room_name(i: usize) -> String {
    format!("r{i}")
}

/// Mints one livegate token per connection with `parallel` keep-alive clients; peers
/// need none (their entries are `None`).
/// Lifetime of the tokens [`credentials`] mints (the churn scenario shortens it, so
/// their nonces expire within the run).
pub static TOKEN_TTL_SECS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(900);

pub async fn credentials(
    kind: Kind,
    addr: SocketAddr,
    n: usize,
    first_user: usize,
    parallel: usize,
) -> Result<Vec<Option<String>>, String> {
    credentials_in(kind, addr, n, first_user, parallel, None).await
}

/// [`credentials`] whose tokens claim `cell` as their users' home cell (none: no claim,
/// the configured cells' rendezvous choice).
pub async fn credentials_in(
    kind: Kind,
    addr: SocketAddr,
    n: usize,
    first_user: usize,
    parallel: usize,
    cell: Option<&str>,
) -> Result<Vec<Option<String>>, String> {
    if !kind.is_livegate() {
        return Ok(vec![None; n]);
    }
    let next = std::rc::Rc::new(std::cell::Cell::new(0usize));
    let mut tasks = Vec::new();
    let claim = cell.map(|c| format!(r#","cell":"{c}""#)).unwrap_or_default();
    for _ in 0..parallel.max(1) {
        let (next, claim) = (next.clone(), claim.clone());
        tasks.push(tokio::task::spawn_local(async move {
            let mut http = HttpClient::new(addr, Some(API_KEY));
            let mut out = Vec::new();
            loop {
                let i = next.get();
                if i >= n {
                    return Ok::<_, String>(out);
                }
                next.set(i + 1);
                let ttl = TOKEN_TTL_SECS.load(std::sync::atomic::Ordering::Relaxed);
                let body = format!(
                    r#"{{"user":"u{}","device":"web","ttl_secs":{ttl}{claim}}}"#,
                    first_user + i
                );
                let r = http
                    .post("/v1/tokens", body.as_bytes())
                    .await
                    .map_err(|e| format!("mint token: {e}"))?;
                if r.status != 201 {
                    return Err(format!(
                        "mint token: HTTP {} {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    ));
                }
                let v: serde_json::Value =
                    serde_json::from_slice(&r.body).map_err(|e| format!("token reply: {e}"))?;
                let token = v["token"].as_str().ok_or("token reply without token")?.to_string();
                out.push((i, token));
            }
        }));
    }
    let mut tokens = vec![None; n];
    for t in tasks {
        for (i, tok) in t.await.map_err(|e| e.to_string())?? {
            tokens[i] = Some(tok);
        }
    }
    Ok(tokens)
}

pub fn ws_url(kind: Kind, addr: SocketAddr, room: &str, token: Option<&str>) -> String {
    match kind {
        Kind::Livegate | Kind::LivegateBase => {
            format!("ws://{addr}/v1/ws?token={}", token.unwrap_or(""))
        }
        Kind::Nchan => format!("ws://{addr}/sub/{room}"),
        Kind::SocketIo => format!("ws://{addr}/socket.io/?EIO=4&transport=websocket"),
    }
}

async fn next_text(ws: &mut Ws) -> Result<String, String> {
    loop {
        let m = tokio::time::timeout(STEP_TIMEOUT, ws.next())
            .await
            .map_err(|_| "timed out waiting for a frame".to_string())?;
        match m {
            Some(Ok(Message::Text(t))) => return Ok(t),
            Some(Ok(Message::Close(f))) => return Err(format!("closed during subscribe: {f:?}")),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("socket ended during subscribe".into()),
        }
    }
}

async fn send(ws: &mut Ws, text: &str) -> Result<(), String> {
    ws.send(Message::Text(text.to_string())).await.map_err(|e| e.to_string())
}

/// livegate: reads the `welcome`, subscribes to `room` and waits for its `subscribed`;
/// returns the welcome frame (its `resume` credential reopens the connection).
pub async fn subscribe_welcomed(ws: &mut Ws, room: &str) -> Result<String, String> {
    let welcome = next_text(ws).await?;
    if !welcome.contains(r#""op":"welcome""#) {
        return Err(format!("expected welcome, got {welcome}"));
    }
    send(ws, &format!(r#"{{"op":"subscribe","room":"{room}","ref":1}}"#)).await?;
    // The inbox's own `subscribed` (without ref) may come first.
    loop {
        let t = next_text(ws).await?;
        if t.contains(r#""op":"subscribed""#) && t.contains(r#""ref":1"#) {
            return Ok(welcome);
        }
        if t.contains(r#""op":"error""#) {
            return Err(format!("subscribe refused: {t}"));
        }
    }
}

/// Completes the server's own subscribe handshake on an upgraded socket.
pub async fn subscribe(kind: Kind, ws: &mut Ws, room: &str) -> Result<(), String> {
    match kind {
        Kind::Livegate | Kind::LivegateBase => subscribe_welcomed(ws, room).await.map(drop),
        // The upgrade itself subscribes.
        Kind::Nchan => Ok(()),
        Kind::SocketIo => {
            let open = next_text(ws).await?;
            if !open.starts_with('0') {
                return Err(format!("expected engine.io open, got {open}"));
            }
            send(ws, "40").await?;
            loop {
                let t = next_text(ws).await?;
                if t.starts_with("40") {
                    break;
                }
                if t.starts_with("44") {
                    return Err(format!("namespace connect refused: {t}"));
                }
            }
            send(ws, &format!(r#"421["join","{room}"]"#)).await?;
            loop {
                let t = next_text(ws).await?;
                if t.starts_with("431") {
                    return Ok(());
                }
                if t == "2" {
                    send(ws, "3").await?;
                }
            }
        }
    }
}

/// The payload of one publish.
pub fn payload(seq: u64, sent_ns: u64, pad: &str) -> String {
    if pad.is_empty() {
        format!(r#"{{"bs":{seq},"bt":{sent_ns}}}"#)
    } else {
        format!(r#"{{"bs":{seq},"bt":{sent_ns},"pad":"{pad}"}}"#)
    }
}

/// Path and body of a publish of `data` into `room`.
pub fn publish_request(kind: Kind, room: &str, data: &str) -> (String, String) {
    match kind {
        Kind::Livegate | Kind::LivegateBase => {
            (format!("/v1/rooms/{room}/events"), format!(r#"{{"data":{data}}}"#))
        }
        Kind::Nchan | Kind::SocketIo => (format!("/pub/{room}"), data.to_string()),
    }
}

/// Path and body of a livegate publish of `data` into `room` with an idempotency `id`.
pub fn publish_request_with_id(room: &str, id: &str, data: &str) -> (String, String) {
    (format!("/v1/rooms/{room}/events"), format!(r#"{{"id":"{id}","data":{data}}}"#))
}

pub fn publish_ok(kind: Kind, status: u16) -> bool {
    match kind {
        Kind::Livegate | Kind::LivegateBase => status == 201,
        Kind::Nchan => status == 201 || status == 202,
        Kind::SocketIo => status == 200,
    }
}

/// Engine.io ping that the client must answer with `"3"`.
pub fn is_engine_ping(kind: Kind, text: &str) -> bool {
    kind == Kind::SocketIo && text == "2"
}

/// Calls `f(seq, sent_ns)` for every event in a frame.
pub fn scan_events(text: &[u8], mut f: impl FnMut(u64, u64)) {
    let mut pos = 0;
    while let Some(i) = memchr::memmem::find(&text[pos..], b"\"bs\":") {
        let (seq, after) = parse_u64(text, pos + i + 5);
        let Some(j) = memchr::memmem::find(&text[after..], b"\"bt\":") else { return };
        let (sent, after) = parse_u64(text, after + j + 5);
        f(seq, sent);
        pos = after;
    }
}

/// Calls `f(seq)` for every event of a livegate `events` frame, with its room `seq`
/// (the bench payload has no `seq` key, so every `"seq":` there is an event's).
pub fn scan_room_seqs(text: &[u8], mut f: impl FnMut(u64)) {
    if !text.starts_with(br#"{"op":"events""#) {
        return;
    }
    let mut pos = 0;
    while let Some(i) = memchr::memmem::find(&text[pos..], b"\"seq\":") {
        let (seq, after) = parse_u64(text, pos + i + 6);
        f(seq);
        pos = after;
    }
}

fn parse_u64(text: &[u8], mut i: usize) -> (u64, usize) {
    let mut v = 0u64;
    while i < text.len() && text[i].is_ascii_digit() {
        v = v * 10 + (text[i] - b'0') as u64;
        i += 1;
    }
    (v, i)
}

#[cfg(test)]
mod tests {
    #[test]
    fn scans_batches() {
        let mut got = Vec::new();
        let frame = br#"{"op":"events","events":[{"room":"r1","seq":9,"data":{"bs":1,"bt":22,"pad":"x"}},{"room":"r1","seq":10,"data":{"bs":2,"bt":33}}]}"#;
        super::scan_events(frame, |a, b| got.push((a, b)));
        assert_eq!(got, vec![(1, 22), (2, 33)]);
        let mut seqs = Vec::new();
        super::scan_room_seqs(frame, |s| seqs.push(s));
        assert_eq!(seqs, vec![9, 10]);
    }
}
