//! Thin actix-web handlers: parse, authorise, send one actor message, map the reply to
//! HTTP. Error bodies are `{"error":{"code","message"}}` with the status of their code
//! ([`ErrorCode::http_status`]), built by [`api_error`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::{Actor, Addr};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use futures_util::StreamExt;
use serde::Deserialize;

use crate::actors::transport::Transport;
use crate::actors::wsio::{Accepted, WsIo};
use crate::actors::connection::{Connection, ConnectionSettings, Identity, InitialSubscription, ResumeGrant, HISTORY_DEFAULT_LIMIT};
use crate::actors::messages::CredentialTimes;
use crate::core::lifecycle::{Lifecycle, Phase};
use crate::actors::directory::{Directory, DirectoryError, OpenSession, SessionOpener, SessionStore};
use crate::actors::liveness::{LivenessActor, Router, Unroutable};
use crate::actors::publish::{Publisher, SubmitError, Submission};
use crate::actors::messages::Kick;
use crate::actors::registry::Registry;
use crate::world::{now_ms, random_bytes, random_hex};
use crate::actors::rooms::{RoomError, Rooms};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::core::spent::{SpentNonces, Void};
use crate::core::{names, token};
use crate::protocol::{self, CloseCode, ErrorCode, PublishReply, TokenReply};
use crate::store::Store;

pub mod admin;
pub mod cors;
pub mod durable;
pub mod jwt;
pub mod limits;
pub mod seams;
pub mod sockets;
pub mod sse;
pub mod upgrade;
use limits::{AccessList, ConnectionLimits, SharedAccess};

/// Loads the configuration again (file, environment, flags) for a reload.
pub type ReloadConfig = Box<dyn Fn() -> Result<Config, crate::config::ConfigError> + Send + Sync>;

/// Bytes a publish body may carry beyond `max_event_bytes` (id, field names).
const PUBLISH_BODY_OVERHEAD: usize = 1024;
/// Largest body of any other request.
pub(crate) const SMALL_BODY_LIMIT: usize = 16 * 1024;


/// Everything a handler needs, shared by all workers.
pub struct AppState {
    pub config: Arc<Config>,
    /// API keys and allowed origins; replaced by a reload.
    pub access: SharedAccess,
    /// Where a reload reads the configuration; `None` keeps the one the node started with.
    pub reload: Option<ReloadConfig>,
    pub limits: Arc<ConnectionLimits>,
    /// Plain HTTP sockets' places in the open-file budget (`max_http_connections`).
    pub sockets: Arc<sockets::SocketBudget>,
    pub store: Store,
    pub rooms: Rooms,
    pub registry: Addr<Registry>,
    pub directory: Addr<Directory>,
    /// Handshakes open their sessions through it, on their own thread.
    pub session_opener: SessionOpener,
    /// Handshakes wait here for their spent nonce and session to be durable (group commit).
    pub handshake_flushes: Arc<durable::HandshakeFlushes>,
    /// Session records (sled, or the KV bucket in cluster mode), for routing questions.
    pub sessions: Arc<dyn SessionStore>,
    /// Where token nonces are marked used (the store, or NATS in cluster mode).
    pub nonces: Arc<dyn seams::Nonces>,
    /// Nonces this node knows are void, checked before `nonces` is asked anything.
    pub spent: Arc<parking_lot::Mutex<SpentNonces>>,
    /// Kicks reach other nodes' connections through it (cluster mode).
    pub other_nodes: Arc<dyn seams::OtherNodes>,
    pub liveness: Addr<LivenessActor>,
    /// Where sessions are served: `/v1/route` and the handshakes ask it.
    pub router: Arc<Router>,
    /// This node's part of rebalances, and what it planned (`/v1/admin/rebalance`).
    pub rebalance: crate::actors::rebalance::Rebalance,
    /// Every publish goes through it (forwarded to the room's writer in cluster mode).
    pub publisher: Publisher,
    /// The webhooks' queue and senders (`None`: webhooks off); replays go through it.
    pub webhooks: Option<crate::actors::webhooks::Webhooks>,
    /// The webhooks given up (`/v1/admin/webhooks/dead`).
    pub dead_letters: crate::actors::webhooks::DeadLetters,
    pub metrics: Arc<Metrics>,
    pub token_secret: Vec<u8>,
    /// The keys JWTs a backend signs are checked with (none: JWTs are refused).
    pub jwt: Arc<jwt::JwtKeys>,
    pub connection: Arc<ConnectionSettings>,
    pub lifecycle: Arc<Lifecycle>,
    pub next_conn: AtomicU64,
    pub started: std::time::Instant,
    /// The last store probe behind `/healthz`.
    pub health: HealthProbe,
    /// Demo mode: the score page at `/` and unauthenticated demo tokens.
    pub demo: bool,
    /// Development mode (`serve --dev`): `POST /v1/tokens` from a page of a listed origin
    /// needs no API key.
    pub dev: bool,
}

/// An error answered as JSON.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
    retry_after_secs: Option<u64>,
    /// `wrong_node`: the node that serves the session, and its URL.
    elsewhere: Option<Box<(String, String)>>,
    /// The room the refused request named (in its path, or an SSE request's `rooms`).
    room: Option<String>,
}

/// The error answer for `code`, with the code's HTTP status.
pub fn api_error(code: ErrorCode, message: impl Into<String>) -> ApiError {
    let status = StatusCode::from_u16(code.http_status()).expect("ErrorCode::http_status names valid statuses");
    ApiError { status, code, message: message.into(), retry_after_secs: None, elsewhere: None, room: None }
}

/// A handshake on a node that does not serve its session: 421 naming the node that does.
fn wrong_node(node: String, url: String) -> ApiError {
    let message = format!("this session is served by node {node}: connect to {url}");
    ApiError { elsewhere: Some(Box::new((node, url))), ..api_error(ErrorCode::WrongNode, message) }
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> Self {
        api_error(ErrorCode::BadRequest, message)
    }
    /// Answer with `Retry-After`.
    fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }
    /// Name `room` in the answer: the refused request named it.
    pub(crate) fn about(mut self, room: &str) -> Self {
        self.room = Some(room.to_string());
        self
    }
}

/// `result`, its error naming `room` (a request to a room's path).
fn in_room<T>(room: &str, result: Result<T, ApiError>) -> Result<T, ApiError> {
    result.map_err(|e| e.about(room))
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }
    fn error_response(&self) -> HttpResponse {
        let mut reply = HttpResponse::build(self.status);
        if let Some(secs) = self.retry_after_secs {
            reply.insert_header(("Retry-After", secs.to_string()));
        }
        let body = match &self.elsewhere {
            Some(elsewhere) => protocol::wrong_node_body(&self.message, &elsewhere.0, &elsewhere.1),
            None => protocol::error_body(self.code, &self.message, self.room.as_deref()),
        };
        reply.content_type("application/json").body(body)
    }
}

impl From<RoomError> for ApiError {
    fn from(e: RoomError) -> Self {
        api_error(e.code(), e.to_string())
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        api_error(e.code(), e.to_string())
    }
}

fn json(status: StatusCode, body: String) -> HttpResponse {
    HttpResponse::build(status).content_type("application/json").body(body)
}

/// A socket with data unacknowledged this long is dropped by the kernel: the backstop for
/// peers that vanished or stopped reading.
const TCP_USER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Notes whether a TCP connection ever completed a request head; one that ends without
/// one after the handshake timeout was cut off by it (a slowloris, or a client that gave up).
pub struct RequestWatch {
    opened: std::time::Instant,
    seen: std::sync::atomic::AtomicBool,
    timeout: std::time::Duration,
    metrics: Arc<Metrics>,
}

impl RequestWatch {
    /// Mark that a complete request head arrived on this connection.
    pub fn seen(&self) {
        self.seen.store(true, Ordering::Relaxed);
    }
}

impl Drop for RequestWatch {
    fn drop(&mut self) {
        // actix answers 408 when the timeout fires; allow for timer granularity.
        if !self.seen.load(Ordering::Relaxed) && self.opened.elapsed() >= self.timeout.mul_f32(0.9) {
            self.metrics.limit_hit("handshake_timeout");
        }
    }
}

/// The hook called for every accepted connection (see [`prepare_connection`]).
pub fn on_connect(
    metrics: Arc<Metrics>,
    handshake_timeout: std::time::Duration,
) -> impl Fn(&dyn std::any::Any, &mut actix_web::dev::Extensions) + Send + Sync + 'static {
    move |conn, data| {
        let watch = RequestWatch {
            opened: std::time::Instant::now(),
            seen: Default::default(),
            timeout: handshake_timeout,
            metrics: metrics.clone(),
        };
        data.insert(Arc::new(watch));
        prepare_connection(conn, data);
    }
}

/// Hand the socket's place and head deadline ([`sockets::SocketState`]) to its requests,
/// and bound how long unacknowledged data may wait: the kernel's backstop for a peer that
/// vanished (the connection's own timers handle one that stopped reading).
fn prepare_connection(conn: &dyn std::any::Any, data: &mut actix_web::dev::Extensions) {
    use actix_tls::accept::rustls_0_23::TlsStream;
    use actix_web::rt::net::TcpStream;
    let timed = match conn.downcast_ref::<sockets::Timed<TcpStream>>() {
        Some(plain) => plain,
        None => match conn.downcast_ref::<TlsStream<sockets::Timed<TcpStream>>>() {
            Some(tls) => tls.get_ref().0,
            None => return,
        },
    };
    if let Some(state) = timed.state() {
        data.insert(state.clone());
    }
    let socket = socket2::SockRef::from(timed.get_ref());
    if let Err(error) = socket.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT)) {
        tracing::debug!(%error, "could not set TCP_USER_TIMEOUT");
    }
}

/// The route table: each line registers one route in [`configure`] and is one entry of
/// [`ROUTES`], so the list `/openapi.json` is checked against is what actix serves.
macro_rules! routes {
    ($($method:ident $path:literal => $handler:path,)*) => {
        /// Every `(method, path)` the server registers, in registration order (paths as
        /// actix templates, `{room}`); `GET /openapi.json` documents exactly these.
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        fn register_routes(cfg: &mut web::ServiceConfig) {
            $(cfg.route($path, route_method!($method).to($handler));)*
        }
    };
}

/// The actix route guard of a method named in [`routes!`].
macro_rules! route_method {
    (GET) => { web::get() };
    (POST) => { web::post() };
    (PUT) => { web::put() };
    (DELETE) => { web::delete() };
    (HEAD) => { web::head() };
    (OPTIONS) => { web::route().method(actix_web::http::Method::OPTIONS) };
}

routes! {
    POST "/v1/tokens" => mint_token,
    OPTIONS "/v1/tokens" => cors::token_preflight,
    POST "/v1/rooms/{room}/events" => publish,
    GET "/v1/rooms/{room}/events" => read_history,
    PUT "/v1/rooms/{room}/state" => put_state,
    GET "/v1/rooms/{room}/state" => read_state,
    GET "/v1/rooms/{room}/presence" => read_presence,
    POST "/v1/users/{user}/messages" => message_user,
    DELETE "/v1/users/{user}/connections" => kick,
    GET "/v1/route" => route,
    GET "/v1/ws" => upgrade,
    GET "/v1/sse" => sse::stream,
    GET "/healthz" => healthz,
    HEAD "/healthz" => healthz,
    GET "/readyz" => readyz,
    HEAD "/readyz" => readyz,
    GET "/metrics" => metrics,
    GET "/livegate.js" => client_library,
    GET "/livegate.iife.js" => client_script,
    GET "/livegate.d.ts" => client_types,
    GET "/livegate/{file}" => client_module,
    GET "/openapi.json" => openapi,
    GET "/" => demo_page,
    GET "/demo/token" => demo_token,
    GET "/v1/admin/status" => status,
    POST "/v1/admin/reload" => reload,
    GET "/v1/admin/overview" => admin::overview,
    GET "/v1/admin/cells" => admin::cells,
    POST "/v1/admin/cells/{cell}/promote" => admin::promote,
    POST "/v1/admin/rebalance" => admin::rebalance,
    GET "/v1/admin/rebalance" => admin::rebalance_status,
    GET "/v1/admin/webhooks/dead" => admin::dead_letters,
    DELETE "/v1/admin/webhooks/dead" => admin::clear_dead_letters,
    POST "/v1/admin/webhooks/dead/{id}/replay" => admin::replay_dead_letter,
    DELETE "/v1/admin/webhooks/dead/{id}" => admin::delete_dead_letter,
    GET "/admin" => admin::page,
    GET "/v1/echo" => echo,
}

/// The routes that answer with a WebSocket: the only ones an upgrade request reaches
/// (`upgrade`).
pub const WEBSOCKET_ROUTES: &[&str] = &["/v1/ws", "/v1/echo"];

/// Register every route on an app.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::QueryConfig::default().error_handler(|err, _req| ApiError::bad_request(err.to_string()).into()))
        .app_data(web::PathConfig::default().error_handler(|err, _req| ApiError::bad_request(err.to_string()).into()));
    register_routes(cfg);
    cfg.default_service(web::to(not_found));
}

async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(api_error(ErrorCode::NotFound, format!("no route for {} {}", req.method(), req.path())))
}

/// Check `Authorization: Bearer <api_key>` against every valid key, in constant time.
fn authorize(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    let presented = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| api_error(ErrorCode::Unauthorized, "missing Authorization: Bearer <api_key>"))?;
    if state.access.read().accepts_key(presented) {
        Ok(())
    } else {
        tracing::debug!(path = req.path(), "request refused: invalid API key");
        Err(api_error(ErrorCode::Unauthorized, "invalid API key"))
    }
}

pub(crate) async fn read_body(mut payload: web::Payload, limit: usize) -> Result<web::Bytes, ApiError> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("could not read body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(api_error(ErrorCode::PayloadTooLarge, format!("body is larger than {limit} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

fn check_user(user: &str) -> Result<(), ApiError> {
    names::check_user(user).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A session id a client names (`session=`; empty: none); it becomes a store key and a
/// NATS subject, so a bad one is refused before anything is spent.
fn check_session(session: Option<&str>) -> Result<(), ApiError> {
    match session.filter(|s| !s.is_empty()) {
        Some(session) => names::check_session(session).map_err(|e| ApiError::bad_request(e.to_string())),
        None => Ok(()),
    }
}

fn check_room(room: &str) -> Result<(), ApiError> {
    names::check_room(room).map_err(|e| api_error(ErrorCode::BadRoom, e.to_string()))
}

/// `POST /v1/tokens`, with the CORS headers of an allowed origin on every answer (a page
/// reads the token, or why it was refused).
async fn mint_token(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    let mut response = match mint_token_checked(&req, payload, &state).await {
        Ok(response) => response,
        Err(refusal) => refusal.error_response(),
    };
    cors::with_cors(&req, &state, &mut response);
    response
}

async fn mint_token_checked(req: &HttpRequest, payload: web::Payload, state: &AppState) -> Result<HttpResponse, ApiError> {
    authorize_token_request(req, state)?;
    let body = read_body(payload, SMALL_BODY_LIMIT).await?;
    let request = protocol::parse_token_request(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    check_user(&request.user)?;
    names::check_device(&request.device).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let max_ttl = state.config.token_ttl_max_secs;
    if request.ttl_secs == 0 || request.ttl_secs > max_ttl {
        return Err(ApiError::bad_request(format!("ttl_secs must be between 1 and {max_ttl}")));
    }
    check_patterns("rooms", &request.rooms)?;
    check_patterns("publish", &request.publish)?;
    if let Some(cell) = &request.cell {
        check_cell(state, cell)?;
    }
    let grants = Grants { rooms: request.rooms, publish: request.publish, cell: request.cell };
    Ok(issue_token(state, request.user, request.device, request.ttl_secs, grants))
}

/// Who may mint a token: a caller with the API key; in development mode (`serve --dev`)
/// also a page whose `Origin` an entry of `allowed_origins` names, without a key, so a
/// first page needs no backend. A request that carries a key must carry a valid one.
fn authorize_token_request(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    if state.dev && !req.headers().contains_key("authorization") {
        if let Some(origin) = cors::listed_origin(req, state) {
            tracing::debug!(%origin, "token minted without the API key (development mode)");
            return Ok(());
        }
    }
    authorize(req, state)
}

/// A cell named by a request: one of the configured cells (`cells`).
fn check_cell(state: &AppState, cell: &str) -> Result<(), ApiError> {
    if state.router.knows_cell(cell) {
        return Ok(());
    }
    let shown: String = cell.chars().take(64).collect();
    Err(api_error(ErrorCode::UnknownCell, format!("cell {shown:?} is not one of the configured cells")))
}

/// A token's room patterns: each a room name, optionally ending in `*`; at most 255
/// (what the token's format holds).
fn check_patterns(field: &str, patterns: &[String]) -> Result<(), ApiError> {
    if patterns.len() > MAX_PATTERNS {
        return Err(ApiError::bad_request(format!("{field} may hold at most {MAX_PATTERNS} patterns")));
    }
    for pattern in patterns {
        names::check_room(pattern.strip_suffix('*').filter(|p| !p.is_empty()).unwrap_or(pattern)).map_err(|_| {
            ApiError::bad_request(format!("{field}: room pattern {pattern:?} is not a room name, optionally ending in *"))
        })?;
    }
    Ok(())
}

/// Patterns per list a token holds.
const MAX_PATTERNS: usize = 255;

/// What a token lets its connection do: read `rooms` (empty: any), publish to `publish`
/// (empty: nowhere); and the user's home `cell` it claims, if any.
struct Grants {
    rooms: Vec<String>,
    publish: Vec<String>,
    cell: Option<String>,
}

/// Sign a fresh one-time token (a new nonce) and answer it as 201 `{"token","expires_at_ms"}`.
fn issue_token(state: &AppState, user: String, device: String, ttl_secs: u64, grants: Grants) -> HttpResponse {
    let issued_at_ms = now_ms();
    let expires_at_ms = issued_at_ms + ttl_secs * 1000;
    let Grants { rooms, publish, cell } = grants;
    let claims =
        token::Claims { user, device, issued_at_ms: Some(issued_at_ms), expires_at_ms, nonce: random_bytes(), rooms, publish, cell };
    let reply = TokenReply { token: token::sign(&state.token_secret, &claims), expires_at_ms };
    state.metrics.tokens_minted.inc();
    json(StatusCode::CREATED, protocol::to_json(&reply))
}

async fn publish(
    req: HttpRequest,
    room: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let room = room.into_inner();
    let answer = async {
        authorize(&req, &state)?;
        check_room(&room)?;
        let limit = state.publisher.max_event_bytes(&room) + state.publisher.max_state_bytes() + PUBLISH_BODY_OVERHEAD;
        let body = read_body(payload, limit).await?;
        let request = protocol::parse_publish_request(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let room_state = request.state.map(|s| s.get().into());
        append(&state, room.clone(), request.id, &request.data, None, room_state).await
    };
    in_room(&room, answer.await)
}

/// `PUT /v1/rooms/{room}/state`: the room's state as of its head, answered
/// once durable with the seq it is as of.
async fn put_state(
    req: HttpRequest,
    room: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let room = room.into_inner();
    let answer = async {
        authorize(&req, &state)?;
        check_room(&room)?;
        let body = read_body(payload, state.publisher.max_state_bytes() + PUBLISH_BODY_OVERHEAD).await?;
        let request = protocol::parse_put_state_request(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok(state.publisher.put_state(&room, request.data.get().into()).await?)
    };
    let put = in_room(&room, answer.await)?;
    let reply = protocol::PutStateReply { room, epoch: put.epoch.to_string(), seq: put.seq };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

/// `GET /v1/rooms/{room}/state`: the room's state from its memory.
async fn read_state(req: HttpRequest, room: web::Path<String>, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let room = room.into_inner();
    let answer = async {
        authorize(&req, &state)?;
        check_room(&room)?;
        if names::inbox_owner(&room).is_some() {
            return Err(ApiError::bad_request("inbox rooms have no state"));
        }
        let view = state.rooms.state(&room).await?;
        Ok(json(StatusCode::OK, protocol::state_body(&room, view.epoch.as_deref(), view.seq, view.data.as_deref())))
    };
    in_room(&room, answer.await)
}

async fn message_user(
    req: HttpRequest,
    user: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let user = user.into_inner();
    check_user(&user)?;
    let inbox = names::inbox_room(&user);
    let body = read_body(payload, state.publisher.max_event_bytes(&inbox) + PUBLISH_BODY_OVERHEAD).await?;
    let request = protocol::parse_user_message_request(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    for device in request.devices.iter().flatten() {
        names::check_device(device).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    append(&state, inbox, request.id, &request.data, request.devices, None).await
}


/// Publish one event (size-checked, id checked or generated, by `Publisher::submit`) and
/// answer 201, or 200 for a duplicate id.
async fn append(
    state: &AppState,
    room: String,
    id: Option<String>,
    data: &protocol::EventData,
    devices: Option<Vec<String>>,
    room_state: Option<Arc<str>>,
) -> Result<HttpResponse, ApiError> {
    let event = Submission { id, data: data.get().into(), devices, from: None, state: room_state };
    let published = state.publisher.submit(&room, event).await?;
    state.metrics.publish_answered(published.duplicate);
    let status = if published.duplicate { StatusCode::OK } else { StatusCode::CREATED };
    let reply = PublishReply { room, seq: published.seq, epoch: published.epoch.to_string(), duplicate: published.duplicate };
    Ok(json(status, protocol::to_json(&reply)))
}

#[derive(Deserialize)]
struct KickQuery {
    device: Option<String>,
}

async fn kick(
    req: HttpRequest,
    user: web::Path<String>,
    query: web::Query<KickQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let user = user.into_inner();
    check_user(&user)?;
    let device = query.into_inner().device;
    if let Some(device) = &device {
        names::check_device(device).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    // The door first: every credential issued to the user up to now is void once this is
    // durable, connected or not, on every node. Only then are the connections looked
    // for, so a handshake that checked before the record was there is either registered
    // by then (and closed below) or registers later and meets the registry's memory of
    // this kick (`core::kicks`).
    let at_ms = now_ms();
    state.nonces.kick_user(&user, device.as_deref(), at_ms).await.map_err(internal)?;
    let here = state.registry.send(Kick { user: user.clone(), device: device.clone(), at_ms });
    let elsewhere = state.other_nodes.kick(&user, device.as_deref(), at_ms);
    let (here, elsewhere) = futures_util::future::join(here, elsewhere).await;
    let closed = here.map_err(internal)? + elsewhere.map_err(internal)?;
    // The kicked connections revoked their sessions' resume credentials before they
    // stopped (other nodes before they answered): the answer waits until that is durable,
    // so a crash right after it cannot bring the credentials back.
    state.nonces.revocations_durable().await.map_err(internal)?;
    // A token minted after this answer must be issued after the kick (the rule is "at or
    // before"): never answer within the kick's own millisecond.
    while now_ms() <= at_ms {
        actix_web::rt::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    Ok(json(StatusCode::OK, protocol::to_json(&protocol::KickReply { closed })))
}

#[derive(Deserialize)]
struct HistoryQuery {
    #[serde(default)]
    since: u64,
    limit: Option<usize>,
}

async fn read_history(
    req: HttpRequest,
    room: web::Path<String>,
    query: web::Query<HistoryQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let room = room.into_inner();
    let answer = async {
        authorize(&req, &state)?;
        check_room(&room)?;
        let max = state.config.max_history_limit;
        let limit = query.limit.unwrap_or(HISTORY_DEFAULT_LIMIT.min(max));
        if limit > max {
            state.metrics.limit_hit("history_limit");
            return Err(ApiError::bad_request(format!("limit must be at most {max}")));
        }
        let page = state.rooms.history(&room, query.since, limit).await?;
        let body = protocol::history_body(&room, page.epoch.as_deref(), page.head, page.events.iter().map(|e| &*e.json));
        Ok(json(StatusCode::OK, body))
    };
    in_room(&room, answer.await)
}

/// `GET /v1/rooms/{room}/presence`: the room's distinct members across the cluster
/// (`members` null above `presence_members_max`); 404 `presence_off` where the room keeps
/// none.
async fn read_presence(req: HttpRequest, room: web::Path<String>, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let room = room.into_inner();
    let answer = async {
        authorize(&req, &state)?;
        check_room(&room)?;
        match state.rooms.presence(&room).await? {
            Ok(view) => Ok(json(StatusCode::OK, protocol::presence_body(&room, &view))),
            Err(off) => Err(api_error(ErrorCode::PresenceOff, off.to_string())),
        }
    };
    in_room(&room, answer.await)
}

/// The credential a connection presents: a token (optionally naming the session to
/// resume) or a resume credential.
#[derive(Deserialize)]
struct CredentialQuery {
    token: Option<String>,
    /// A resume credential from an earlier `welcome`, instead of a token.
    resume: Option<String>,
    session: Option<String>,
    /// A node the client could not reach when it was sent there (issue 30): not a
    /// candidate for this handshake.
    avoid: Option<String>,
}

/// Who a handshake's credential says the client is.
struct Credentialed {
    user: String,
    device: String,
    rooms: Vec<String>,
    publish: Vec<String>,
    /// The session to resume (a resume credential names it; a token may ask for one).
    session: Option<String>,
    /// The user's home cell as the token claimed it (a resume credential carries it on).
    cell: Option<String>,
}

/// A credential whose signature, expiry and revocation were checked; its nonce is not
/// spent yet, so a request refused now leaves it usable.
struct Verified {
    who: Credentialed,
    nonce: [u8; 16],
    expires_at_ms: u64,
    kind: CredentialKind,
    times: CredentialTimes,
}

/// A spent credential: who it names, and where its nonce was marked, to give it back if
/// the handshake is refused with something the client is told to retry.
struct Spent {
    who: Credentialed,
    nonce: [u8; 16],
    spent_in: seams::SpentIn,
    expires_at_ms: u64,
    kind: CredentialKind,
    times: CredentialTimes,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CredentialKind {
    /// A token minted by `POST /v1/tokens`.
    Token,
    /// A JWT a backend signed (`jwt_*` keys).
    Jwt,
    Resume,
}

impl CredentialKind {
    /// The credential's label in `livegate_handshakes_total`.
    fn label(self) -> &'static str {
        match self {
            CredentialKind::Token => "token",
            CredentialKind::Jwt => "jwt",
            CredentialKind::Resume => "resume",
        }
    }
}

fn resume_invalid(why: &str) -> ApiError {
    api_error(ErrorCode::ResumeInvalid, format!("resume credential {why}; connect with a new token"))
}

/// Verify the handshake's credential without spending it: a resume credential when
/// given, else the token.
async fn verify_credential(query: CredentialQuery, state: &AppState) -> Result<Verified, ApiError> {
    // Read before the revocations are: a kick this check misses was durable only after
    // it, which is what the registry's memory of kicks is judged by (`core::kicks`).
    let now = now_ms();
    if let Some(credential) = query.resume.as_deref() {
        let resume = token::verify_resume(&state.token_secret, credential, now).map_err(|e| {
            resume_invalid(match e {
                token::TokenError::Malformed => "is malformed",
                token::TokenError::BadSignature => "has an invalid signature",
                token::TokenError::Expired => "has expired",
            })
        })?;
        known_void(state, &resume.nonce, now, CredentialKind::Resume)?;
        let (revoked_at, kicked_at) = futures_util::future::join(
            state.nonces.resumes_revoked_at(&resume.session),
            state.nonces.kicked_at(&resume.user, &resume.device),
        )
        .await;
        let void = if resume.revoked_by(revoked_at.map_err(internal)?) {
            Some(Void::Revoked)
        } else if token::voided_by_kick(resume.issued_at_ms, kicked_at.map_err(internal)?) {
            Some(Void::Kicked)
        } else {
            None
        };
        if let Some(why) = void {
            state.spent.lock().remember(resume.nonce, resume.expires_at_ms, why, now);
            return Err(void_refusal(CredentialKind::Resume, why));
        }
        let times = CredentialTimes { issued_at_ms: resume.issued_at_ms, checked_at_ms: now };
        let who = Credentialed {
            user: resume.user,
            device: resume.device,
            rooms: resume.rooms,
            publish: resume.publish,
            session: Some(resume.session),
            cell: resume.cell,
        };
        return Ok(Verified { who, nonce: resume.nonce, expires_at_ms: resume.expires_at_ms, kind: CredentialKind::Resume, times });
    }
    let token = query.token.as_deref().ok_or_else(|| api_error(ErrorCode::MissingToken, "missing token query parameter"))?;
    // A JWT a backend signed, or a minted token: what either grants is a minted
    // token's claims, spent and checked against kicks the same way from here.
    let (claims, kind) = if crate::core::jwt::looks_like_jwt(token) {
        let claims = state.jwt.verify(token, now, |cell| state.router.knows_cell(cell)).map_err(|e| {
            let code = if e == crate::core::jwt::JwtError::Expired { ErrorCode::TokenExpired } else { ErrorCode::InvalidToken };
            api_error(code, e.to_string())
        })?;
        (claims, CredentialKind::Jwt)
    } else {
        let claims = token::verify(&state.token_secret, token, now).map_err(|e| {
            let code = match e {
                token::TokenError::Expired => ErrorCode::TokenExpired,
                token::TokenError::Malformed | token::TokenError::BadSignature => ErrorCode::InvalidToken,
            };
            api_error(code, e.to_string())
        })?;
        (claims, CredentialKind::Token)
    };
    known_void(state, &claims.nonce, now, kind)?;
    let issued_at_ms = claims.issued_at_or_earliest(state.config.token_ttl_max().as_millis() as u64);
    if token::voided_by_kick(issued_at_ms, state.nonces.kicked_at(&claims.user, &claims.device).await.map_err(internal)?) {
        state.spent.lock().remember(claims.nonce, claims.expires_at_ms, Void::Kicked, now);
        return Err(void_refusal(kind, Void::Kicked));
    }
    let times = CredentialTimes { issued_at_ms, checked_at_ms: now };
    let who = Credentialed {
        user: claims.user,
        device: claims.device,
        rooms: claims.rooms,
        publish: claims.publish,
        session: query.session,
        cell: claims.cell,
    };
    Ok(Verified { who, nonce: claims.nonce, expires_at_ms: claims.expires_at_ms, kind, times })
}

/// Spend a verified credential's nonce: from here it opens nothing else, unless it is
/// given back ([`give_back`]).
async fn spend_credential(verified: Verified, state: &AppState) -> Result<Spent, ApiError> {
    let Verified { who, nonce, expires_at_ms, kind, times } = verified;
    let Some(spent_in) = state.nonces.use_nonce(&nonce, expires_at_ms).await.map_err(internal)? else {
        state.spent.lock().remember(nonce, expires_at_ms, Void::Used, now_ms());
        return Err(void_refusal(kind, Void::Used));
    };
    Ok(Spent { who, nonce, spent_in, expires_at_ms, kind, times })
}

/// Refuse a credential this node already knows is void (`core::spent`), before the
/// revocation and kick records or the nonce store are read: a replay costs no read.
fn known_void(state: &AppState, nonce: &[u8; 16], now: u64, kind: CredentialKind) -> Result<(), ApiError> {
    match state.spent.lock().check(nonce, now) {
        Some(why) => Err(void_refusal(kind, why)),
        None => Ok(()),
    }
}

/// The refusal of a credential void for `why`.
fn void_refusal(kind: CredentialKind, why: Void) -> ApiError {
    match (kind, why) {
        (CredentialKind::Resume, Void::Used) => resume_invalid("was already used"),
        (CredentialKind::Resume, Void::Revoked) => resume_invalid("was revoked (its session was kicked or replaced)"),
        (CredentialKind::Resume, Void::Kicked) => resume_invalid("was revoked (its user was kicked)"),
        (CredentialKind::Token, Void::Used) => api_error(ErrorCode::TokenReplayed, "token was already used"),
        (CredentialKind::Jwt, Void::Used) => api_error(ErrorCode::TokenReplayed, "JWT was already used (its jti is spent)"),
        (CredentialKind::Token | CredentialKind::Jwt, Void::Revoked | Void::Kicked) => {
            api_error(ErrorCode::InvalidToken, "token was revoked: its user was kicked after it was minted")
        }
    }
}

/// A refusal the client is told to retry (`migration_budget`, `directory_unavailable`)
/// leaves its credential usable: the nonce this handshake marked is given back. Nothing
/// was opened with it, and while it was marked no other handshake could spend it, so a
/// credential still opens at most one connection.
async fn give_back(state: &AppState, spent: &Spent) {
    match state.nonces.unuse_nonce(&spent.nonce, spent.spent_in).await {
        // A replay that found it marked meanwhile remembered it: usable again here too.
        Ok(()) => state.spent.lock().forget(&spent.nonce),
        Err(error) => tracing::warn!(%error, "a refused handshake's credential stays spent"),
    }
}

/// The directory's refusals of a session, as answers; `true` when the client is told to
/// retry (the credential is given back).
fn directory_refusal(error: DirectoryError) -> (ApiError, bool) {
    match error {
        DirectoryError::Budget(refusal) => {
            let crate::core::sessions::BudgetError::Spent { retry_after_secs } = refusal;
            (api_error(ErrorCode::MigrationBudget, refusal.to_string()).retry_after(retry_after_secs), true)
        }
        DirectoryError::Unavailable(why) => (api_error(ErrorCode::DirectoryUnavailable, why.to_string()), true),
        DirectoryError::Elsewhere { node, url } => (wrong_node(node, url), true),
        DirectoryError::Unroutable(why) => (unroutable(&why), true),
        other => (internal(other), false),
    }
}

/// A fresh one-time resume credential for the connection being opened.
fn mint_resume(state: &AppState, who: &Credentialed, session: &str) -> ResumeGrant {
    let now = now_ms();
    let expires_at_ms = now.saturating_add(state.config.resume_ttl().as_millis() as u64);
    let resume = token::Resume {
        user: who.user.clone(),
        device: who.device.clone(),
        session: session.to_string(),
        rooms: who.rooms.clone(),
        publish: who.publish.clone(),
        issued_at_ms: now,
        expires_at_ms,
        nonce: random_bytes(),
        cell: who.cell.clone(),
    };
    ResumeGrant { credential: token::sign_resume(&state.token_secret, &resume), issued_at_ms: now, expires_at_ms }
}

/// The WebSocket upgrade; refusals are counted by their error code. A browser cannot
/// read a refused upgrade, so the refusals a client must act on (go to another node,
/// wait before moving) accept the socket and close it at once with a close code:
/// 4421 whose reason is the URL to use (after an `error` frame naming node and URL, for
/// URLs longer than a close reason), 4029 whose reason is the seconds to wait.
async fn upgrade(
    req: HttpRequest,
    query: web::Query<CredentialQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let refusal = match upgrade_checked(req.clone(), query, state.clone()).await {
        Ok(accepted) => return Ok(accepted),
        Err(refusal) => refusal,
    };
    refused(&state, &refusal);
    let closing = match (refusal.code, &refusal.elsewhere, refusal.retry_after_secs) {
        (ErrorCode::WrongNode, Some(elsewhere), _) => {
            let (node, url) = &**elsewhere;
            let reason = if url.len() <= MAX_CLOSE_REASON { url.clone() } else { String::new() };
            Some((protocol::wrong_node_frame(&refusal.message, node, url), CloseCode::WrongNode, reason))
        }
        (ErrorCode::MigrationBudget, _, Some(secs)) => {
            Some((protocol::error_frame(None, None, refusal.code, &refusal.message), CloseCode::MigrationBudget, secs.to_string()))
        }
        _ => None,
    };
    let (Some((frame, code, reason)), Ok(switching)) = (closing, switching_protocols(&req)) else { return Err(refusal) };
    Ok(accept(switching, state.config.max_frame_bytes, move |mut io| {
        io.text(&frame);
        io.close(Some(actix_http::ws::CloseReason { code: code.code().into(), description: Some(reason) }));
        io.finish(REFUSAL_CLOSE_WITHIN);
    }))
}

/// The longest close reason a WebSocket close frame carries (125 bytes less the code).
const MAX_CLOSE_REASON: usize = 123;
/// How long an accepted-and-refused socket may take to read its close.
const REFUSAL_CLOSE_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// A node name given by a client (`avoid`): at most 255 bytes of printable ASCII.
fn check_node_name(node: Option<&str>) -> Result<(), ApiError> {
    match node {
        Some(name) if name.len() > 255 || !name.bytes().all(|b| b.is_ascii_graphic()) => {
            Err(ApiError::bad_request("avoid must name a node: at most 255 printable ASCII characters"))
        }
        _ => Ok(()),
    }
}

/// Count and log a refused handshake (WebSocket or SSE).
fn refused(state: &AppState, refusal: &ApiError) {
    tracing::debug!(reason = refusal.code.as_str(), status = refusal.status.as_u16(), "handshake refused");
    state.metrics.handshake_rejected(refusal.code.as_str());
}

/// A connection the handshake admitted, ready for its actor.
struct Admitted {
    id: crate::actors::messages::ConnId,
    identity: Identity,
    /// Its place under the limits and its session lease, held until the connection ends.
    permit: Box<dyn Send>,
}

/// The checks every connection's handshake makes (WebSocket and SSE), in one order,
/// cheapest first, so that nothing a refusal could have avoided is spent:
/// the node's phase (503 while draining); `shape`, the request itself (a WebSocket
/// upgrade; an SSE request's rooms and cursor); the origin; the connection limits (a
/// permit); the credential's signature, expiry and revocation; `authorise`, what the
/// verified credential may do (an SSE request's rooms); only then the nonce is spent,
/// the session opened in the directory and both flushed, and a resume credential minted.
/// A directory refusal the client is told to retry gives the nonce back.
async fn handshake<S>(
    req: &HttpRequest,
    state: &AppState,
    query: CredentialQuery,
    shape: impl FnOnce() -> Result<S, ApiError>,
    authorise: impl FnOnce(&S, &Credentialed) -> Result<(), ApiError>,
) -> Result<(S, Admitted), ApiError> {
    if !state.lifecycle.phase().accepts_connections() {
        return Err(api_error(ErrorCode::Unavailable, "node is not accepting connections"));
    }
    // A request that is malformed, or that a limit refuses, must not spend a token.
    check_session(query.session.as_deref())?;
    check_node_name(query.avoid.as_deref())?;
    let avoid = query.avoid.clone().filter(|node| !node.is_empty());
    let shaped = shape()?;
    check_origin(req, state)?;
    let permit = admit(req, state)?;
    let verified = verify_credential(query, state).await?;
    authorise(&shaped, &verified.who)?;
    let spent = spend_credential(verified, state).await?;
    let open = OpenSession { user: spent.who.user.clone(), asked: spent.who.session.clone(), avoid, cell: spent.who.cell.clone() };
    // Spent for good unless given back: a replay here is then refused before anything
    // is read.
    let spent_for_good = || state.spent.lock().remember(spent.nonce, spent.expires_at_ms, Void::Used, now_ms());
    let grant = match state.session_opener.open(open).await {
        Ok(grant) => grant,
        Err(error) => {
            let (refusal, retry) = directory_refusal(error);
            if retry {
                give_back(state, &spent).await;
            } else {
                spent_for_good();
            }
            return Err(refusal);
        }
    };
    spent_for_good();
    state.metrics.handshake_credential(spent.kind.label());
    let Spent { who, times, .. } = spent;
    // The nonce (and any session record) must survive a crash, or a restart would reopen
    // a replay window. Concurrent handshakes share the flush (`durable`).
    state.handshake_flushes.durable().await.map_err(internal)?;
    let resume = mint_resume(state, &who, &grant.session);
    let identity = Identity {
        user: who.user.into(),
        device: who.device.into(),
        session: grant.session,
        rooms: who.rooms,
        publish: who.publish,
        warmup: grant.warmup,
        resume: Some(resume),
        credential: times,
    };
    let id = state.next_conn.fetch_add(1, Ordering::Relaxed);
    Ok((shaped, Admitted { id, identity, permit: Box::new((permit, grant.lease)) }))
}

/// Start a connection's actor on `io`.
fn start_connection(state: &AppState, admitted: Admitted, io: Transport, rooms: Vec<InitialSubscription>) {
    let Admitted { id, identity, permit } = admitted;
    let (settings, registry) = (state.connection.clone(), state.registry.clone());
    let rooms_table = state.rooms.clone();
    Connection::create(move |ctx: &mut actix::Context<Connection>| {
        use actix::AsyncContext;
        Connection::new(id, identity, settings, rooms_table, registry, io, ctx.address().recipient())
            .holding(permit)
            .subscribing(rooms)
    });
}

/// The credential is verified and spent before anything is upgraded.
async fn upgrade_checked(
    req: HttpRequest,
    query: web::Query<CredentialQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (switching, admitted) = handshake(&req, &state, query.into_inner(), || switching_protocols(&req), |_, _| Ok(())).await?;
    let started = state.clone();
    Ok(accept(switching, state.config.max_frame_bytes, move |io| {
        start_connection(&started, admitted, Transport::Ws(io), Vec::new());
    }))
}

/// The 101 answer to a valid WebSocket handshake (not sent until the handler accepts).
fn switching_protocols(req: &HttpRequest) -> Result<HttpResponse, ApiError> {
    let response = actix_http::ws::handshake(req.head())
        .map_err(|e| ApiError::bad_request(format!("not a WebSocket upgrade: {e}")))?
        .finish();
    Ok(HttpResponse::from(response.map_into_boxed_body()))
}

/// Accept the upgrade: `start` runs the connection's actor once the 101 is written
/// (`upgrade`).
fn accept(mut switching: HttpResponse, max_frame_bytes: usize, start: impl FnOnce(WsIo) + 'static) -> HttpResponse {
    switching.extensions_mut().insert(Accepted::new(max_frame_bytes, start));
    switching
}

/// Browser pages may connect only from an allowed origin.
fn check_origin(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    let origin = req.headers().get("origin").map(|v| v.to_str().unwrap_or("(not text)"));
    if state.access.read().allows_origin(origin) {
        return Ok(());
    }
    state.metrics.limit_hit("origin");
    Err(api_error(ErrorCode::ForbiddenOrigin, "this origin may not connect here"))
}

/// A place for one more connection from this client address, within the node's limits.
fn admit(req: &HttpRequest, state: &AppState) -> Result<limits::ConnectionPermit, ApiError> {
    let peer = req.peer_addr().map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip());
    let ip = state.limits.client_ip(peer, req.headers());
    state.limits.admit(ip, now_ms()).map_err(|refusal| {
        state.metrics.limit_hit(refusal.limit());
        tracing::info!(client = %ip, %peer, limit = refusal.limit(), "connection refused by a limit");
        match refusal {
            limits::LimitRefusal::Node(_) => api_error(ErrorCode::TooManyConnections, refusal.to_string()),
            // The one status that is not its code's. The HTTP API documents one code for
            // both connection limits, `too_many_connections`: 503 when the node is full
            // (try another node), 429 when this address holds too many (docs/src/security.md,
            // the limits table); the handshake-refusal metric is labelled by that code. Splitting it
            // would change what clients and dashboards see, so the status is set here.
            limits::LimitRefusal::PerIp(_) => {
                let mut error = api_error(ErrorCode::TooManyConnections, refusal.to_string());
                error.status = StatusCode::TOO_MANY_REQUESTS;
                error
            }
            limits::LimitRefusal::HandshakeRate { retry_after_ms, .. } => {
                api_error(ErrorCode::RateLimited, refusal.to_string()).retry_after(retry_after_ms.div_ceil(1000))
            }
        }
    })
}

/// Test-only echo socket for WebSocket conformance suites (config `ws_echo`).
async fn echo(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if !state.config.ws_echo {
        return Err(api_error(ErrorCode::NotFound, "the echo socket is off (config ws_echo)"));
    }
    let switching = switching_protocols(&req)?;
    let permit: Box<dyn Send> = Box::new(admit(&req, &state)?);
    let max_message_bytes = state.config.max_message_bytes;
    Ok(accept(switching, state.config.max_frame_bytes, move |io| {
        crate::actors::echo::EchoSocket::new(io, max_message_bytes, permit).start();
    }))
}

/// Read the API keys and allowed origins again (as SIGHUP does).
async fn reload(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let access = reload_access(&state).map_err(|e| ApiError::bad_request(format!("reload failed, nothing changed: {e}")))?;
    let reply = protocol::ReloadReply { api_keys: access.key_count(), allowed_origins: access.origin_count() };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

/// Load the configuration again and swap in its access list; on error nothing changes.
pub fn reload_access(state: &AppState) -> Result<AccessList, crate::config::ConfigError> {
    let config = match &state.reload {
        Some(load) => load()?,
        None => (*state.config).clone(),
    };
    let mut access = state.access.write();
    let reloaded = AccessList::reloaded(&config, &access)?;
    *access = reloaded.clone();
    tracing::info!(api_keys = reloaded.key_count(), allowed_origins = reloaded.origin_count(), "access list reloaded");
    Ok(reloaded)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "internal error");
    api_error(ErrorCode::Internal, "internal error; see the server log")
}

#[derive(Deserialize)]
struct RouteQuery {
    session: Option<String>,
    user: Option<String>,
    /// The user's home cell as its token claims it (one of the configured cells).
    cell: Option<String>,
    /// `nodes=true` (with the API key): list every node with its load.
    #[serde(default)]
    nodes: bool,
}

/// Which node a client should connect to: the router's answer over the nodes alive now,
/// with the node's cell and the user's home cell (`cell`, else the configured cells'
/// rendezvous choice). A client may ask for its own session without the API key (the
/// answer names a node and its public URL, nothing of the session); asking by user needs
/// the key.
async fn route(req: HttpRequest, query: web::Query<RouteQuery>, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if query.user.as_deref().is_some_and(|u| !u.is_empty()) || query.session.as_deref().is_none_or(str::is_empty) {
        authorize(&req, &state)?;
    }
    let RouteQuery { session, user, cell, nodes: list_nodes } = query.into_inner();
    check_session(session.as_deref())?;
    let cell = cell.filter(|c| !c.is_empty());
    if let Some(cell) = &cell {
        check_cell(&state, cell)?;
    }
    let session = session.filter(|s| !s.is_empty());
    let user = user.filter(|u| !u.is_empty());
    if session.is_none() && user.is_none() {
        return Err(ApiError::bad_request("give session, user or both"));
    }
    let recorded = match &session {
        Some(s) => state.sessions.session(s).await.map_err(internal)?,
        None => None,
    };
    let user = user.or_else(|| recorded.as_ref().map(|r| r.user.clone())).unwrap_or_default();
    // A client without a session is routed by its user id.
    let session = session.unwrap_or_else(|| names::inbox_room(&user));
    match state.router.route(&session, &user, cell.as_deref(), recorded.as_ref().map(|r| r.owner.as_str()), None) {
        Ok(answer) => {
            // Asked for, with the API key: the nodes and their loads (what the answer weighed).
            let nodes = (list_nodes && authorize(&req, &state).is_ok()).then(|| {
                let phase = state.lifecycle.phase().name();
                let view = state.router.overview().into_iter();
                view.map(|n| protocol::RouteNode { phase: n.phase.unwrap_or(phase), node: n.name, cell: n.cell, load: n.load }).collect()
            });
            let reply = protocol::RouteReply { node: answer.node, url: answer.url, cell: answer.cell, home: answer.home, nodes };
            Ok(json(StatusCode::OK, protocol::to_json(&reply)))
        }
        Err(none) => Err(unroutable(&none)),
    }
}

/// The router's refusal: 503 `no_healthy_cell` when cells are known and none is healthy,
/// else 503 `no_alive_node`.
fn unroutable(why: &Unroutable) -> ApiError {
    let code = match why {
        Unroutable::NoHealthyCell { .. } => ErrorCode::NoHealthyCell,
        Unroutable::NoAliveNode(_) => ErrorCode::NoAliveNode,
    };
    api_error(code, why.to_string())
}

fn not_in_demo_mode() -> ApiError {
    api_error(ErrorCode::NotFound, "the demo runs with `livegate serve --demo`")
}

async fn demo_page(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if !state.demo {
        return Err(not_in_demo_mode());
    }
    Ok(embedded("text/html; charset=utf-8", include_str!("../web/demo.html")))
}

/// A one-time token for a random demo viewer, limited to the match rooms. Demo mode
/// only: it needs no API key.
async fn demo_token(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if !state.demo {
        return Err(not_in_demo_mode());
    }
    let user = format!("viewer-{}", random_hex(6));
    Ok(issue_token(&state, user, "web".into(), 60, Grants { rooms: vec!["match:*".into()], publish: Vec::new(), cell: None }))
}

/// A file embedded in the binary, served as it is; `no-cache` so an upgrade is seen at
/// once.
pub(crate) fn embedded(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok().content_type(content_type).insert_header(("Cache-Control", "no-cache")).body(body)
}

/// `GET /livegate.js`: the browser and Node client library as one minified ES module,
/// the npm package's `dist/livegate.min.js` (clients/js/, built from the modules under
/// `/livegate/` and checked against them by the test suite), so what the server hands out
/// and what npm installs never differ, and a page loads one file.
async fn client_library() -> HttpResponse {
    embedded("text/javascript; charset=utf-8", include_str!("../../clients/js/dist/livegate.min.js"))
}

/// `GET /livegate.iife.js`: the same client as a minified classic script that defines the
/// global `Livegate` (the npm package's `dist/livegate.iife.js`), for a page without
/// modules: a `<script src>` from another origin needs no CORS.
async fn client_script() -> HttpResponse {
    embedded("text/javascript; charset=utf-8", include_str!("../../clients/js/dist/livegate.iife.js"))
}

/// `GET /livegate.d.ts`: the TypeScript declarations for `/livegate.js`.
async fn client_types() -> HttpResponse {
    embedded("application/typescript; charset=utf-8", include_str!("../../clients/js/livegate.d.ts"))
}

/// The modules of the client library (`./livegate/{file}`, what the package's readable
/// entry `livegate.js` imports), by file name: only these are served.
pub const CLIENT_MODULES: &[(&str, &str)] = &[
    ("client.js", include_str!("../../clients/js/livegate/client.js")),
    ("clock.js", include_str!("../../clients/js/livegate/clock.js")),
    ("connection.js", include_str!("../../clients/js/livegate/connection.js")),
    ("credentials.js", include_str!("../../clients/js/livegate/credentials.js")),
    ("emitter.js", include_str!("../../clients/js/livegate/emitter.js")),
    ("errors.js", include_str!("../../clients/js/livegate/errors.js")),
    ("event-stream.js", include_str!("../../clients/js/livegate/event-stream.js")),
    ("feed.js", include_str!("../../clients/js/livegate/feed.js")),
    ("subscriptions.js", include_str!("../../clients/js/livegate/subscriptions.js")),
    ("transport-sse.js", include_str!("../../clients/js/livegate/transport-sse.js")),
    ("transport-websocket.js", include_str!("../../clients/js/livegate/transport-websocket.js")),
    ("urls.js", include_str!("../../clients/js/livegate/urls.js")),
];

/// `GET /livegate/{file}`: one module of the client library; 404 for any other name.
async fn client_module(file: web::Path<String>) -> Result<HttpResponse, ApiError> {
    match CLIENT_MODULES.iter().find(|(name, _)| *name == file.as_str()) {
        Some((_, body)) => Ok(embedded("text/javascript; charset=utf-8", body)),
        None => Err(api_error(ErrorCode::NotFound, "no such module of the client library")),
    }
}

/// `GET /openapi.json`: the OpenAPI 3.1 description of every route in [`ROUTES`]
/// (tests/it/openapi.rs checks the two against each other and against a validator).
async fn openapi() -> HttpResponse {
    embedded("application/json", include_str!("../web/openapi.json"))
}

/// `GET /v1/admin/status`: what an operator asks first.
async fn status(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let connections = state.registry.send(crate::actors::messages::CountConnections).await.map_err(internal)?;
    let warmup = state.directory.send(crate::actors::directory::InWarmup).await.map_err(internal)?;
    let sessions = state.directory.send(crate::actors::directory::CountSessions).await.map_err(internal)?;
    let phase = state.lifecycle.phase().name();
    let reply = protocol::StatusReply {
        node: state.config.node.clone(),
        version: env!("CARGO_PKG_VERSION"),
        uptime_secs: state.started.elapsed().as_secs(),
        phase,
        warmup,
        connections,
        subscriptions: state.metrics.subscriptions.get().max(0) as u64,
        rooms_live: state.rooms.live_count(),
        rooms_parked: state.rooms.parked_count(),
        sessions_live: sessions.live,
        sessions_cached: sessions.cached,
        sessions_stored: sessions.stored,
        store_bytes: state.store.size_on_disk().map_err(internal)?,
    };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    state.metrics.rooms_live.set(state.rooms.live_count() as i64);
    state.metrics.rooms_parked.set(state.rooms.parked_count() as i64);
    if let Ok(sessions) = state.directory.send(crate::actors::directory::CountSessions).await {
        state.metrics.sessions_live.set(sessions.live as i64);
        state.metrics.sessions_cached.set(sessions.cached as i64);
        state.metrics.sessions_stored.set(sessions.stored.unwrap_or(0) as i64);
    }
    if let Ok(bytes) = state.store.size_on_disk() {
        state.metrics.store_bytes.set(bytes as i64);
    }
    state.metrics.http_connections.set(state.sockets.open() as i64);
    let lag = state.rooms.lag(now_ms());
    state.metrics.consumer_lag_events.set(lag.events.min(i64::MAX as u64) as i64);
    state.metrics.consumer_lag_seconds.set(lag.millis as f64 / 1000.0);
    state.metrics.consumer_lag_rooms.set(lag.rooms_behind.min(i64::MAX as u64) as i64);
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(state.metrics.encode())
}

/// Liveness: a real store read and an idempotent write, so a peer probing this node
/// learns whether it can serve, not only whether the port is open. At most one probe per
/// [`HEALTH_PROBE_EVERY_MS`]: a flood of unauthenticated calls costs no store writes.
async fn healthz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if !state.health.check(&state.store, &state.metrics, now_ms()) {
        return Err(api_error(ErrorCode::Internal, "the store probe failed; see the server log"));
    }
    // Peers read `draining` to stop routing here, and `release` and `started_at_ms` to
    // send the sessions a release moves to its newest nodes (see `actors::liveness`).
    let draining = if state.lifecycle.phase().is_draining() { r#","draining":true"# } else { "" };
    let (release, started_at_ms) = (state.router.release(), state.router.started_at_ms());
    let body = format!(r#"{{"status":"ok"{draining},"release":"{release}","started_at_ms":{started_at_ms}}}"#);
    Ok(json(StatusCode::OK, body))
}

/// How often `/healthz` really probes the store; the answers in between repeat the last
/// probe's outcome.
const HEALTH_PROBE_EVERY_MS: u64 = 1000;

/// The last store probe behind `/healthz`: when (ms) and whether it succeeded.
#[derive(Default)]
pub struct HealthProbe(parking_lot::Mutex<Option<(u64, bool)>>);

impl HealthProbe {
    /// Whether the store can serve: the last probe's outcome while it is recent, else a
    /// new probe (callers meanwhile wait for it and share its outcome).
    fn check(&self, store: &Store, metrics: &Metrics, now_ms: u64) -> bool {
        let mut last = self.0.lock();
        if let Some((at, healthy)) = *last {
            if (at..at + HEALTH_PROBE_EVERY_MS).contains(&now_ms) {
                return healthy;
            }
        }
        metrics.store_probes.inc();
        let healthy = match store.probe() {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, "store probe failed");
                false
            }
        };
        *last = Some((now_ms, healthy));
        healthy
    }
}

/// Readiness, also read by livegate.js after a failed handshake (with CORS headers, so a
/// page on another origin can tell a draining node from a refused credential).
async fn readyz(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let mut response = match state.lifecycle.phase() {
        Phase::Ready => json(StatusCode::OK, r#"{"status":"ready"}"#.into()),
        // Reconciled and taking connections, not yet routed to by every peer.
        Phase::Joining => api_error(ErrorCode::Unavailable, "starting: joining, until the peers route to this node").error_response(),
        other => api_error(ErrorCode::Unavailable, other.name()).error_response(),
    };
    cors::with_cors(&req, &state, &mut response);
    response
}
