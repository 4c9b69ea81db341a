//! The terminal subscriber behind `livegate subscribe`: follows rooms over a WebSocket
//! and prints each event once, as one JSON line, across reconnects. A reconnect presents
//! the resume credential of the last `welcome` and mints a token only when it
//! has none, it expired, or the server refused it; it resumes each room after the last
//! event it printed, honours the server's close codes and reconnect hints, and prints
//! notices on stderr.
//!
//! Where it connects follows the server's routing (issue 30): a handshake on a node that
//! does not serve the session is closed with 4421 naming the node and URL that does, and
//! the subscriber dials that node at once with the same credential (at most
//! [`MAX_FOLLOWS`] times in a row without a welcome). It keeps dialling the session's
//! node from then on; when that node cannot be reached it goes back through the address
//! it was given, with `avoid=NODE`.

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{self, protocol::CloseFrame, Message};

use super::http::{encode, error_code, status_error};
use super::{Client, ClientError};
use crate::core::rules::backoff::{Backoff, BackoffPolicy, Jitter};
use crate::protocol::{
    close_meaning, CloseCode, ErrorFrame, EventHead, Events, FrameHead, ServerOp, Subscribed,
    Welcome,
};

/// What to follow, and as whom.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Rooms to follow, in the order asked (duplicates are dropped).
    pub rooms: Vec<String>,
    /// Resume every room after this seq of `epoch`, instead of at its head.
    pub since: Option<u64>,
    pub epoch: Option<String>,
    pub user: String,
    pub device: String,
}

/// Interval of the client's `{"op":"ping"}`.
const PING_EVERY: Duration = Duration::from_secs(20);
/// Limit for each of: opening the WebSocket, receiving `welcome`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that delivers nothing (not even a pong) for this long is dropped and
/// redialled; at least 3 server heartbeats.
const MIN_IDLE_LIMIT: Duration = Duration::from_secs(60);
/// The server's heartbeat interval when its `welcome` cannot be read.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);
/// Lifetime of a token minted for a connection attempt (one without a resume credential).
const TOKEN_TTL_SECS: u64 = 60;
/// A resume credential this close to its expiry is not presented (clock skew, the time
/// the handshake takes): a token is minted instead.
const RESUME_MARGIN_MS: u64 = 10_000;
/// Redirects (close 4421) followed in a row without a welcome before backing off.
const MAX_FOLLOWS: u32 = 3;
/// Longest server-suggested reconnect delay honoured.
const MAX_HINT: Duration = Duration::from_secs(60);
/// Reconnect delays, when the server suggested none: at random below 0.5 s, 1 s, 2 s, 4 s,
/// then 5 s (full jitter, so subscribers dropped together do not return together); from
/// the start again after a connection got its `welcome`.
const RECONNECT: BackoffPolicy = BackoffPolicy {
    first: Duration::from_millis(500),
    max: Duration::from_secs(5),
    jitter: Jitter::Full,
};

type WebSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What the client knows about one room across connections.
#[derive(Debug, Default)]
struct RoomState {
    epoch: Option<String>,
    /// Highest seq printed (or the head at a live subscription): events at or below it
    /// are never printed again, and a reconnect resumes after it.
    last_seq: Option<u64>,
    /// The `since` of the subscribe request waiting for its reply.
    asked_since: Option<u64>,
}

/// A one-time credential from a `welcome`, and when it expires (server clock).
#[derive(Debug, Clone)]
struct ResumeCredential {
    credential: String,
    expires_at_ms: u64,
}

/// How one connection attempt ended.
enum Ended {
    /// Ctrl-C: end the command successfully.
    Interrupted,
    /// Stdout is gone (for example `| head`): end quietly.
    OutputClosed,
    /// The server said not to reconnect (close codes 4500-4999).
    Final(String),
    /// Dial again after `hint` (from the server) or the backoff. `welcomed`: this attempt
    /// got as far as the server's `welcome`.
    Retry { reason: String, hint: Option<Duration>, welcomed: bool },
    /// The session is served by `node` at `url` (close 4421): dial it at once.
    Moved { node: String, url: String },
    /// The session's node (`node`) could not be reached: dial the given address at once,
    /// asking it to avoid that node.
    Unreachable { node: String, reason: String },
}

/// Why a dial did not open a WebSocket.
enum Refused {
    /// The server refused the resume credential (401 resume_invalid): `reason`.
    Resume(String),
    Ended(Ended),
}

fn retry(reason: impl Into<String>, welcomed: bool) -> Ended {
    Ended::Retry { reason: reason.into(), hint: None, welcomed }
}

pub struct Subscriber {
    client: Arc<Client>,
    user: String,
    device: String,
    /// The rooms asked for, in order; request `ref` i+1 is `rooms[i]`.
    rooms: Vec<String>,
    state: HashMap<String, RoomState>,
    /// The session from the last `welcome`, offered again on reconnect.
    session: Option<String>,
    /// The resume credential from the last `welcome`: the next connection attempt's
    /// credential while it has not expired and the server did not refuse it.
    resume: Option<ResumeCredential>,
    /// The node that serves the session and its WebSocket base URL, once a redirect named
    /// it: dialled instead of the given address.
    home: Option<(String, String)>,
    /// A node the next handshake asks the server to avoid (it could not be reached).
    avoid: Option<String>,
    interrupted: Pin<Box<dyn Future<Output = std::io::Result<()>>>>,
    /// Where events are printed: stdout, or a buffer in tests.
    out: Box<dyn Write>,
}

impl Subscriber {
    pub fn new(client: Client, args: Subscription) -> Self {
        let mut rooms: Vec<String> = vec![];
        for room in args.rooms {
            if !rooms.contains(&room) {
                rooms.push(room);
            }
        }
        let state = rooms
            .iter()
            .map(|room| {
                let state = RoomState {
                    epoch: args.epoch.clone(),
                    last_seq: args.since,
                    asked_since: None,
                };
                (room.clone(), state)
            })
            .collect();
        Subscriber {
            client: Arc::new(client),
            user: args.user,
            device: args.device,
            rooms,
            state,
            session: None,
            resume: None,
            home: None,
            avoid: None,
            interrupted: Box::pin(tokio::signal::ctrl_c()),
            out: Box::new(std::io::stdout()),
        }
    }

    /// Follows the rooms on a runtime of its own until Ctrl-C, a closed stdout or a
    /// close that says not to reconnect.
    pub fn run_blocking(self) -> Result<(), ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ClientError::Runtime)?;
        let result = runtime.block_on(self.run());
        // Do not wait for a token request still in flight after Ctrl-C.
        runtime.shutdown_background();
        result
    }

    pub async fn run(mut self) -> Result<(), ClientError> {
        let mut backoff = Backoff::new(RECONNECT);
        let mut ever_welcomed = false;
        let mut follows = 0;
        loop {
            let (reason, hint) = match self.connect_once().await {
                Ended::Interrupted | Ended::OutputClosed => return Ok(()),
                Ended::Final(message) => return Err(ClientError::Disconnected(message)),
                Ended::Moved { node, url } if follows < MAX_FOLLOWS => {
                    follows += 1;
                    eprintln!("the session is served by node {node}: connecting to {url}");
                    self.home = Some((node, ws_base_of(&url)));
                    continue;
                }
                Ended::Moved { node, url } => {
                    self.home = Some((node.clone(), ws_base_of(&url)));
                    (format!("sent to node {node} {follows} times in a row"), None)
                }
                Ended::Unreachable { node, reason } => {
                    eprintln!("{reason}; connecting through {} instead", self.client.ws_base());
                    self.home = None;
                    self.avoid = Some(node);
                    continue;
                }
                Ended::Retry { reason, welcomed: false, .. } if !ever_welcomed => {
                    return Err(ClientError::Disconnected(reason))
                }
                Ended::Retry { reason, hint, welcomed } => {
                    if welcomed {
                        ever_welcomed = true;
                        follows = 0;
                        backoff.reset();
                    }
                    (reason, hint)
                }
            };
            let delay = hint.unwrap_or_else(|| backoff.next_delay(crate::world::random_u64()));
            eprintln!("{reason}; reconnecting in {:.1} s", delay.as_secs_f64());
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = &mut self.interrupted => return Ok(()),
            }
        }
    }

    /// One connection: open the socket (with the resume credential, else a new token),
    /// wait for `welcome`, subscribe, then print events until the connection ends.
    async fn connect_once(&mut self) -> Ended {
        let mut ws = loop {
            let resuming = self.usable_resume(crate::world::now_ms());
            let mut url = match resuming {
                Some(resume) => {
                    format!("{}/v1/ws?resume={}", self.base(), encode(&resume.credential))
                }
                None => match self.token_url().await {
                    Ok(url) => url,
                    Err(ended) => return ended,
                },
            };
            if let Some(node) = self.avoid.take() {
                url.push_str(&format!("&avoid={}", encode(&node)));
            }
            match self.dial(url).await {
                Ok(ws) => break ws,
                // Spent, revoked (a kick), or signed with another secret: a new token at once.
                Err(Refused::Resume(refusal)) => {
                    self.resume = None;
                    eprintln!("resume credential refused ({refusal}); connecting with a new token");
                }
                // Anything else keeps the credential for the next attempt.
                Err(Refused::Ended(ended)) => return ended,
            }
        };
        let heartbeat = match self.await_welcome(&mut ws).await {
            Ok(heartbeat) => heartbeat,
            Err(ended) => return ended,
        };
        for (i, room) in self.rooms.iter().enumerate() {
            let state = self.state.entry(room.clone()).or_default();
            let mut request = serde_json::json!({ "op": "subscribe", "room": room, "ref": i + 1 });
            if let Some(since) = state.last_seq {
                request["since"] = since.into();
            }
            if let Some(epoch) = &state.epoch {
                request["epoch"] = epoch.as_str().into();
            }
            state.asked_since = state.last_seq;
            if let Err(e) = ws.send(Message::text(request.to_string())).await {
                return retry(format!("connection lost while subscribing: {e}"), true);
            }
        }
        self.follow(&mut ws, heartbeat).await
    }

    /// The last welcome's resume credential, unless it expires within [`RESUME_MARGIN_MS`].
    fn usable_resume(&mut self, now_ms: u64) -> Option<ResumeCredential> {
        if self
            .resume
            .as_ref()
            .is_some_and(|r| r.expires_at_ms <= now_ms.saturating_add(RESUME_MARGIN_MS))
        {
            self.resume = None;
        }
        self.resume.clone()
    }

    /// Mints a token for one connection; the WebSocket URL that presents it.
    async fn token_url(&mut self) -> Result<String, Ended> {
        let client = Arc::clone(&self.client);
        let (user, device) = (self.user.clone(), self.device.clone());
        let minting =
            tokio::task::spawn_blocking(move || client.mint_token(&user, &device, TOKEN_TTL_SECS));
        let token = tokio::select! {
            minted = minting => match minted {
                Ok(Ok(token)) => token,
                Ok(Err(e)) => return Err(retry(e.to_string(), false)),
                Err(e) => return Err(retry(format!("minting a token failed: {e}"), false)),
            },
            _ = &mut self.interrupted => return Err(Ended::Interrupted),
        };
        let mut url = format!("{}/v1/ws?token={}", self.base(), encode(&token));
        if let Some(session) = &self.session {
            url.push_str(&format!("&session={}", encode(session)));
        }
        Ok(url)
    }

    /// Where to dial: the session's node once known, else the address given.
    fn base(&self) -> String {
        self.home.as_ref().map_or_else(|| self.client.ws_base(), |(_, base)| base.clone())
    }

    /// Opens the WebSocket at `url`.
    async fn dial(&mut self, url: String) -> Result<WebSocket, Refused> {
        let resuming = url.contains("?resume=");
        let connecting =
            tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(url));
        let base = self.base();
        // The session's node, unreachable: back through the given address, avoiding it.
        let unreachable = |home: &Option<(String, String)>, reason: String| match home {
            Some((node, _)) => Refused::Ended(Ended::Unreachable { node: node.clone(), reason }),
            None => Refused::Ended(retry(reason, false)),
        };
        tokio::select! {
            connected = connecting => match connected {
                Ok(Ok((ws, _response))) => Ok(ws),
                Ok(Err(tungstenite::Error::Http(response))) => {
                    let body = response.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
                    let status = response.status().as_u16();
                    let refusal = status_error(status, &body);
                    if resuming && status == 401 && error_code(&body).as_deref() == Some("resume_invalid") {
                        return Err(Refused::Resume(refusal));
                    }
                    Err(Refused::Ended(retry(format!("WebSocket handshake refused: {refusal}"), false)))
                }
                Ok(Err(e)) => Err(unreachable(&self.home, format!("cannot open a WebSocket to {base}: {e}"))),
                Err(_) => Err(unreachable(&self.home, format!("no WebSocket handshake from {base} within {CONNECT_TIMEOUT:?}"))),
            },
            _ = &mut self.interrupted => Err(Refused::Ended(Ended::Interrupted)),
        }
    }

    /// Waits for `welcome`; returns the server's heartbeat interval.
    async fn await_welcome(&mut self, ws: &mut WebSocket) -> Result<Duration, Ended> {
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            let message = tokio::select! {
                message = ws.next() => message,
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(retry(format!("no welcome from the server within {CONNECT_TIMEOUT:?}"), false));
                }
                _ = &mut self.interrupted => return Err(Ended::Interrupted),
            };
            let text = match message {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Close(frame))) => return Err(closed(ws, frame, false).await),
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    return Err(retry(format!("connection lost before welcome: {e}"), false))
                }
                None => return Err(retry("connection closed before welcome", false)),
            };
            match serde_json::from_str::<FrameHead>(&text) {
                Ok(head) if head.op == ServerOp::Welcome => {}
                Ok(head) if head.op == ServerOp::Error => {
                    // Sent to the session's node: its close 4421 follows; go at once.
                    if let Ok(ErrorFrame { node: Some(node), url: Some(url), .. }) =
                        serde_json::from_str::<ErrorFrame>(&text)
                    {
                        let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
                        return Err(Ended::Moved {
                            node: node.into_owned(),
                            url: url.into_owned(),
                        });
                    }
                    eprintln!("error before welcome: {text}");
                    continue;
                }
                _ => {
                    tracing::debug!("ignoring a frame before welcome: {text}");
                    continue;
                }
            }
            // A welcome it cannot read still opens the connection.
            let welcome = serde_json::from_str::<Welcome>(&text).ok();
            let node = welcome.as_ref().map_or("?", |w| &w.node);
            match (&self.session, welcome.as_ref().map(|w| &w.session)) {
                (Some(old), Some(new)) if old != new => {
                    eprintln!(
                        "connected to node {node}: new session {new} (session {old} was not kept)"
                    )
                }
                (_, Some(new)) => eprintln!("connected to node {node} (session {new})"),
                (_, None) => eprintln!("connected to node {node}"),
            }
            let Some(welcome) = welcome else { return Ok(DEFAULT_HEARTBEAT) };
            // A server without resume credentials: tokens from now on.
            self.resume = match (welcome.resume, welcome.resume_expires_at_ms) {
                (Some(credential), Some(expires_at_ms)) => {
                    Some(ResumeCredential { credential: credential.into_owned(), expires_at_ms })
                }
                _ => None,
            };
            self.session = Some(welcome.session.into_owned());
            return Ok(Duration::from_millis(welcome.heartbeat_ms));
        }
    }

    /// Reads frames until the connection ends, pinging every [`PING_EVERY`].
    async fn follow(&mut self, ws: &mut WebSocket, heartbeat: Duration) -> Ended {
        let idle_limit = (heartbeat * 3).max(MIN_IDLE_LIMIT);
        let mut deadline = Instant::now() + idle_limit;
        let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        loop {
            tokio::select! {
                message = ws.next() => {
                    deadline = Instant::now() + idle_limit;
                    match message {
                        Some(Ok(Message::Text(text))) => {
                            if let Some(ended) = self.handle_frame(&text) {
                                return ended;
                            }
                        }
                        Some(Ok(Message::Close(frame))) => return closed(ws, frame, true).await,
                        Some(Ok(_)) => {} // pings are answered by tungstenite while we read
                        Some(Err(e)) => return retry(format!("connection lost: {e}"), true),
                        None => return retry("connection closed", true),
                    }
                }
                _ = ping.tick() => {
                    if let Err(e) = ws.send(Message::text(r#"{"op":"ping"}"#)).await {
                        return retry(format!("connection lost: {e}"), true);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return retry(format!("nothing heard from the server for {} s", idle_limit.as_secs()), true);
                }
                _ = &mut self.interrupted => {
                    let bye = CloseFrame { code: tungstenite::protocol::frame::coding::CloseCode::Normal, reason: "".into() };
                    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(Some(bye))).await;
                    return Ended::Interrupted;
                }
            }
        }
    }

    /// Handles one text frame; `Some` when the command must stop.
    fn handle_frame(&mut self, text: &str) -> Option<Ended> {
        let Ok(head) = serde_json::from_str::<FrameHead>(text) else {
            eprintln!("ignoring a frame that is not a JSON object with an op: {text}");
            return None;
        };
        match head.op {
            ServerOp::Events => match serde_json::from_str::<Events>(text) {
                Ok(frame) => return self.print_events(&frame.events),
                Err(e) => eprintln!("ignoring a malformed events frame ({e}): {text}"),
            },
            // The automatic inbox notice names the room only; the inbox's events print
            // like any other room's.
            ServerOp::Subscribed if head.reference.is_none() => {}
            ServerOp::Subscribed => match serde_json::from_str::<Subscribed>(text) {
                Ok(reply) => self.subscribed(reply),
                Err(e) => eprintln!("ignoring a malformed subscribed reply ({e}): {text}"),
            },
            ServerOp::Error => {
                let error: ErrorFrame = serde_json::from_str(text).unwrap_or(ErrorFrame {
                    reference: None,
                    code: "".into(),
                    message: text.into(),
                    room: None,
                    node: None,
                    url: None,
                });
                let room = error
                    .reference
                    .and_then(|r| usize::try_from(r).ok())
                    .and_then(|r| r.checked_sub(1))
                    .and_then(|i| self.rooms.get(i));
                match room {
                    Some(room) => {
                        if let Some(state) = self.state.get_mut(room) {
                            state.asked_since = None;
                        }
                        eprintln!(
                            "error: subscribe {room} refused: {}: {}",
                            error.code, error.message
                        )
                    }
                    None => eprintln!("error from server: {}: {}", error.code, error.message),
                }
            }
            ServerOp::Pong | ServerOp::Welcome | ServerOp::Unsubscribed => {}
            ServerOp::History | ServerOp::Published | ServerOp::Presence | ServerOp::Unknown => {
                tracing::debug!("ignoring a frame it does not follow: {text}")
            }
        }
        None
    }

    /// Prints each event not printed before, as the server wrote it (one JSON line).
    fn print_events(&mut self, events: &[&RawValue]) -> Option<Ended> {
        let out = &mut self.out;
        for raw in events {
            let Ok(event) = serde_json::from_str::<EventHead>(raw.get()) else {
                eprintln!("ignoring an event without room and seq: {}", raw.get());
                continue;
            };
            let state = self.state.entry(event.room.into_owned()).or_default();
            if state.last_seq.is_some_and(|last| event.seq <= last) {
                continue;
            }
            state.last_seq = Some(event.seq);
            let line = if raw.get().contains('\n') {
                // Compact it: one event, one line.
                serde_json::to_string(
                    &serde_json::from_str::<Value>(raw.get()).unwrap_or(Value::Null),
                )
                .unwrap_or_default()
            } else {
                raw.get().to_string()
            };
            if writeln!(out, "{line}").is_err() {
                return Some(Ended::OutputClosed);
            }
        }
        if out.flush().is_err() {
            return Some(Ended::OutputClosed);
        }
        None
    }

    fn subscribed(&mut self, reply: Subscribed) {
        let state = self.state.entry(reply.room.to_string()).or_default();
        let epoch_changed = state.epoch.as_ref().is_some_and(|epoch| *epoch != reply.epoch);
        let room = &reply.room;
        match (state.asked_since.take(), reply.recovered) {
            (Some(since), Some(true)) => {
                eprintln!("recovered {room} from seq {since}");
                state.last_seq = Some(state.last_seq.unwrap_or(since).max(since));
            }
            (Some(_), Some(false)) => {
                eprintln!("recovery failed for {room}: reload state");
                // Missed events stay missed; follow from the head of the (maybe new) epoch.
                state.last_seq = Some(reply.seq);
            }
            _ => {
                eprintln!("subscribed to {room} (epoch {}, head seq {})", reply.epoch, reply.seq);
                state.last_seq = Some(match state.last_seq {
                    Some(last) if !epoch_changed => last.max(reply.seq),
                    _ => reply.seq,
                });
            }
        }
        state.epoch = Some(reply.epoch.into_owned());
    }
}

/// The server closed the connection: finish the closing handshake, then decide.
async fn closed(ws: &mut WebSocket, frame: Option<CloseFrame<'static>>, welcomed: bool) -> Ended {
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
    let Some(frame) = frame else {
        return retry("server closed the connection", welcomed);
    };
    let code = u16::from(frame.code);
    let reason = frame.reason.trim();
    let mut what = format!("server closed the connection with {code} ({})", close_meaning(code));
    if !reason.is_empty() {
        what.push_str(&format!(": {reason}"));
    }
    if (4500..=4999).contains(&code) {
        return Ended::Final(format!("{what}; not reconnecting"));
    }
    if code == CloseCode::WrongNode.code() && !reason.is_empty() {
        return Ended::Moved { node: "?".into(), url: reason.to_string() };
    }
    let hint = match code {
        c if c == CloseCode::ServiceRestart.code() => {
            first_number(reason).map(Duration::from_millis)
        }
        c if c == CloseCode::MigrationBudget.code() => {
            first_number(reason).map(Duration::from_secs)
        }
        _ => None,
    }
    .map(|hint| hint.min(MAX_HINT));
    Ended::Retry { reason: what, hint, welcomed }
}

/// `ws://…` or `wss://…` for a node's base URL as the server names it (`http(s)://…`).
fn ws_base_of(url: &str) -> String {
    let url = url.trim_end_matches('/');
    if let Some(rest) = url.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = url.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        url.to_string()
    }
}

/// The first token of `text` that is a whole number: a delay suggested in a close reason.
fn first_number(text: &str) -> Option<u64> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '=' | ':' | ',' | ';'))
        .find_map(|token| token.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_seconds() {
        // The highest roll gives each delay's ceiling; any other roll, less.
        let mut backoff = Backoff::new(RECONNECT);
        let delays: Vec<u64> =
            (0..7).map(|_| backoff.next_delay(u64::MAX).as_millis() as u64).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 5000, 5000, 5000]);
        backoff.reset();
        assert_eq!(backoff.next_delay(u64::MAX), Duration::from_millis(500));
    }

    #[test]
    fn hints() {
        assert_eq!(first_number("1500"), Some(1500));
        assert_eq!(first_number("retry after 30 s"), Some(30));
        assert_eq!(first_number("retry_after=12"), Some(12));
        assert_eq!(first_number("node-2 draining"), None);
    }

    fn subscriber(rooms: &[&str], since: Option<u64>, epoch: Option<&str>) -> Subscriber {
        let client = Client::new("http://127.0.0.1:1".into(), "k".repeat(16));
        let args = Subscription {
            rooms: rooms.iter().map(|r| r.to_string()).collect(),
            since,
            epoch: epoch.map(String::from),
            user: "cli".into(),
            device: "cli".into(),
        };
        Subscriber::new(client, args)
    }

    /// A writer whose bytes the test can read afterwards.
    #[derive(Clone, Default)]
    struct Captured(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn take(&self) -> String {
            String::from_utf8(std::mem::take(&mut *self.0.borrow_mut())).unwrap()
        }
    }

    fn reply(
        room: &'static str,
        epoch: &'static str,
        seq: u64,
        recovered: Option<bool>,
    ) -> Subscribed<'static> {
        Subscribed {
            room: room.into(),
            epoch: epoch.into(),
            seq,
            recovered,
            reference: Some(1),
            state: None,
        }
    }

    #[test]
    fn room_state_follows_replies_and_drops_duplicates() {
        let mut s = subscriber(&["r"], None, None);
        let out = Captured::default();
        s.out = Box::new(out.clone());
        s.subscribed(reply("r", "E", 5, None));
        assert_eq!(s.state["r"].last_seq, Some(5), "live subscription starts at the head");
        let frame = r#"{"op":"events","events":[{"room":"r","seq":5,"data":1},{"room":"r","seq":6,"data":{"b":1,"a":2}}]}"#;
        assert!(s.handle_frame(frame).is_none());
        assert_eq!(
            out.take(),
            "{\"room\":\"r\",\"seq\":6,\"data\":{\"b\":1,\"a\":2}}\n",
            "seq 5 dropped, 6 printed as sent"
        );
        assert!(s.handle_frame(frame).is_none());
        assert_eq!(out.take(), "", "a replayed frame prints nothing");
        let pretty = "{\"op\":\"events\",\"events\":[{\n \"room\": \"r\",\n \"seq\": 7}]}";
        assert!(s.handle_frame(pretty).is_none());
        assert_eq!(out.take(), "{\"room\":\"r\",\"seq\":7}\n", "one event, one line");
        s.state.get_mut("r").unwrap().last_seq = Some(6);

        // Reconnect: recovery asked from 6 and granted keeps the position.
        s.state.get_mut("r").unwrap().asked_since = Some(6);
        s.subscribed(reply("r", "E", 9, Some(true)));
        assert_eq!((s.state["r"].last_seq, s.state["r"].epoch.as_deref()), (Some(6), Some("E")));

        // Recovery refused after an epoch change: follow from the new head.
        s.state.get_mut("r").unwrap().asked_since = Some(6);
        s.subscribed(reply("r", "F", 2, Some(false)));
        assert_eq!((s.state["r"].last_seq, s.state["r"].epoch.as_deref()), (Some(2), Some("F")));
    }

    #[test]
    fn a_resume_credential_is_presented_until_near_its_expiry() {
        let mut s = subscriber(&["r"], None, None);
        assert!(s.usable_resume(1_000).is_none(), "none before a welcome");
        s.resume = Some(ResumeCredential { credential: "R".into(), expires_at_ms: 100_000 });
        let cases = [
            (0, true),
            (100_000 - RESUME_MARGIN_MS - 1, true),
            (100_000 - RESUME_MARGIN_MS, false),
            (200_000, false),
        ];
        for (now, usable) in cases {
            assert_eq!(
                s.usable_resume(now).map(|r| r.credential).as_deref(),
                usable.then_some("R"),
                "at {now}"
            );
        }
        s.resume = Some(ResumeCredential { credential: "R".into(), expires_at_ms: 100_000 });
        s.usable_resume(200_000);
        assert!(s.resume.is_none(), "an expired credential is dropped");
    }

    #[test]
    fn reads_the_frames_the_server_renders() {
        use crate::protocol::{self, ErrorCode};
        let mut s = subscriber(&["a", "b"], None, None);
        let out = Captured::default();
        s.out = Box::new(out.clone());
        let frames = [
            protocol::inbox_notice_frame("inbox:cli"),
            protocol::subscribed_frame("a", "E", 3, None, Some(1)),
            protocol::pong_frame(Some(7)),
            protocol::unsubscribed_frame("a", Some(8)),
        ];
        for frame in &frames {
            assert!(s.handle_frame(frame).is_none(), "{frame}");
        }
        assert_eq!((s.state["a"].last_seq, s.state["a"].epoch.as_deref()), (Some(3), Some("E")));
        assert!(!s.state.contains_key("inbox:cli"), "the inbox notice is not a subscription reply");

        s.state.get_mut("b").unwrap().asked_since = Some(4);
        assert!(s
            .handle_frame(&protocol::error_frame(Some(2), None, ErrorCode::Forbidden, "no"))
            .is_none());
        assert_eq!(s.state["b"].asked_since, None, "a refused subscribe waits for no reply");

        let event =
            protocol::render_event("a", 4, "id-4", 1_700_000_000_000, None, r#"{"goal": 1}"#);
        assert!(s.handle_frame(&protocol::events_frame([event.as_str()], 0)).is_none());
        assert_eq!(
            out.take(),
            format!("{event}\n"),
            "the event line is the server's rendering, byte for byte"
        );
    }
}
