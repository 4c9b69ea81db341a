//! What an operator and a page load ask of the node, beside the API: health (`/healthz`),
//! readiness (`/readyz`), metrics, the status and a reload of the access list, the files
//! embedded in the binary (the client library, the OpenAPI description) and the demo's
//! page and tokens.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};

use super::cors;
use super::errors::{api_error, internal, ApiError};
use super::limits::AccessList;
use super::request::{embedded, json, ApiKey};
use super::state::AppState;
use super::tokens::{issue_token, Grants};
use crate::core::nodes::lifecycle::Phase;
use crate::protocol::{self, ErrorCode};
use crate::world::{now_ms, random_hex};

pub(super) async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(api_error(ErrorCode::NotFound, format!("no route for {} {}", req.method(), req.path())))
}

/// Read the API keys and allowed origins again (as SIGHUP does).
pub(super) async fn reload(
    _: ApiKey,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let access = reload_access(&state)
        .map_err(|e| ApiError::bad_request(format!("reload failed, nothing changed: {e}")))?;
    let reply = protocol::ReloadReply {
        api_keys: access.key_count(),
        allowed_origins: access.origin_count(),
    };
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
    tracing::info!(
        api_keys = reloaded.key_count(),
        allowed_origins = reloaded.origin_count(),
        "access list reloaded"
    );
    Ok(reloaded)
}

pub(super) fn not_in_demo_mode() -> ApiError {
    api_error(ErrorCode::NotFound, "the demo runs with `livegate serve --demo`")
}

pub(super) async fn demo_page(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if !state.demo {
        return Err(not_in_demo_mode());
    }
    Ok(embedded("text/html; charset=utf-8", include_str!("../web/demo.html")))
}

/// A one-time token for a random demo viewer, limited to the match rooms. Demo mode
/// only: it needs no API key.
pub(super) async fn demo_token(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if !state.demo {
        return Err(not_in_demo_mode());
    }
    let user = format!("viewer-{}", random_hex(6));
    Ok(issue_token(
        &state,
        user,
        "web".into(),
        60,
        Grants { rooms: vec!["match:*".into()], publish: Vec::new(), cell: None },
    ))
}

/// `GET /livegate.js`: the browser and Node client library as one minified ES module,
/// the npm package's `dist/livegate.min.js` (clients/js/, built from the modules under
/// `/livegate/` and checked against them by the test suite), so what the server hands out
/// and what npm installs never differ, and a page loads one file.
pub(super) async fn client_library() -> HttpResponse {
    embedded(
        "text/javascript; charset=utf-8",
        include_str!("../../clients/js/dist/livegate.min.js"),
    )
}

/// `GET /livegate.iife.js`: the same client as a minified classic script that defines the
/// global `Livegate` (the npm package's `dist/livegate.iife.js`), for a page without
/// modules: a `<script src>` from another origin needs no CORS.
pub(super) async fn client_script() -> HttpResponse {
    embedded(
        "text/javascript; charset=utf-8",
        include_str!("../../clients/js/dist/livegate.iife.js"),
    )
}

/// `GET /livegate.d.ts`: the TypeScript declarations for `/livegate.js`.
pub(super) async fn client_types() -> HttpResponse {
    embedded(
        "application/typescript; charset=utf-8",
        include_str!("../../clients/js/livegate.d.ts"),
    )
}

/// The modules of the client library (`./livegate/{file}`, what the package's readable
/// entry `livegate.js` imports), by file name: only these are served.
pub const CLIENT_MODULES: &[(&str, &str)] = &[
    ("attempts.js", include_str!("../../clients/js/livegate/attempts.js")),
    ("client.js", include_str!("../../clients/js/livegate/client.js")),
    ("clock.js", include_str!("../../clients/js/livegate/clock.js")),
    ("connection.js", include_str!("../../clients/js/livegate/connection.js")),
    ("credentials.js", include_str!("../../clients/js/livegate/credentials.js")),
    ("emitter.js", include_str!("../../clients/js/livegate/emitter.js")),
    ("errors.js", include_str!("../../clients/js/livegate/errors.js")),
    ("event-stream.js", include_str!("../../clients/js/livegate/event-stream.js")),
    ("events.js", include_str!("../../clients/js/livegate/events.js")),
    ("feed.js", include_str!("../../clients/js/livegate/feed.js")),
    ("link.js", include_str!("../../clients/js/livegate/link.js")),
    ("requests.js", include_str!("../../clients/js/livegate/requests.js")),
    ("rooms.js", include_str!("../../clients/js/livegate/rooms.js")),
    ("subscriptions.js", include_str!("../../clients/js/livegate/subscriptions.js")),
    ("transport-sse.js", include_str!("../../clients/js/livegate/transport-sse.js")),
    ("transport-websocket.js", include_str!("../../clients/js/livegate/transport-websocket.js")),
    ("urls.js", include_str!("../../clients/js/livegate/urls.js")),
];

/// `GET /livegate/{file}`: one module of the client library; 404 for any other name.
pub(super) async fn client_module(file: web::Path<String>) -> Result<HttpResponse, ApiError> {
    match CLIENT_MODULES.iter().find(|(name, _)| *name == file.as_str()) {
        Some((_, body)) => Ok(embedded("text/javascript; charset=utf-8", body)),
        None => Err(api_error(ErrorCode::NotFound, "no such module of the client library")),
    }
}

/// `GET /openapi.json`: the OpenAPI 3.1 description of every route in [`ROUTES`]
/// (tests/it/openapi.rs checks the two against each other and against a validator).
pub(super) async fn openapi() -> HttpResponse {
    embedded("application/json", include_str!("../web/openapi.json"))
}

/// `GET /v1/admin/status`: what an operator asks first.
pub(super) async fn status(
    _: ApiKey,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let connections =
        state.registry.send(crate::actors::messages::CountConnections).await.map_err(internal)?;
    let warmup =
        state.directory.send(crate::actors::directory::InWarmup).await.map_err(internal)?;
    let sessions =
        state.directory.send(crate::actors::directory::CountSessions).await.map_err(internal)?;
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

pub(super) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
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
pub(super) async fn healthz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if !state.health.check(&state.store, &state.metrics, now_ms()) {
        return Err(api_error(ErrorCode::Internal, "the store probe failed; see the server log"));
    }
    // Peers read `draining` to stop routing here, and `release` and `started_at_ms` to
    // send the sessions a release moves to its newest nodes (see `actors::liveness`).
    let draining = if state.lifecycle.phase().is_draining() { r#","draining":true"# } else { "" };
    let (release, started_at_ms) = (state.router.release(), state.router.started_at_ms());
    let body = format!(
        r#"{{"status":"ok"{draining},"release":"{release}","started_at_ms":{started_at_ms}}}"#
    );
    Ok(json(StatusCode::OK, body))
}

/// Readiness, also read by livegate.js after a failed handshake (with CORS headers, so a
/// page on another origin can tell a draining node from a refused credential).
pub(super) async fn readyz(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let mut response = match state.lifecycle.phase() {
        Phase::Ready => json(StatusCode::OK, r#"{"status":"ready"}"#.into()),
        // Reconciled and taking connections, not yet routed to by every peer.
        Phase::Joining => api_error(
            ErrorCode::Unavailable,
            "starting: joining, until the peers route to this node",
        )
        .error_response(),
        other => api_error(ErrorCode::Unavailable, other.name()).error_response(),
    };
    cors::with_cors(&req, &state, &mut response);
    response
}
