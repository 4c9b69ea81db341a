//! The admin page (DESIGN §10): `GET /admin` serves the self-contained page
//! (`src/web/admin.html`, no auth: it asks for the API key and keeps it in the tab's
//! sessionStorage), and `GET /v1/admin/overview` answers what the page polls, behind the
//! API key: this node and its phase, the nodes it knows, connections, subscriptions,
//! live rooms, the busiest rooms with their heads, and the node's monotonic counters
//! (the page turns them into rates). Every part is read from memory: the registry's
//! count, the rooms' load slots, the liveness actor's table, the metrics.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use actix_web::http::header::{HeaderValue, CONTENT_SECURITY_POLICY, REFERRER_POLICY};
use super::{authorize, embedded, internal, json, ApiError, AppState};
use crate::actors::messages::CountConnections;
use crate::protocol::{self, OverviewCounters, OverviewNode, OverviewReply, OverviewRoom};
use crate::world::now_ms;

/// `GET /admin`: the page; it holds no data until the key is entered.
pub async fn page() -> HttpResponse {
    let mut page = embedded("text/html; charset=utf-8", include_str!("../web/admin.html"));
    let headers = page.headers_mut();
    // The page talks only to this origin and loads nothing from elsewhere.
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"),
    );
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    page
}

/// `GET /v1/admin/overview`.
pub async fn overview(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let connections = state.registry.send(CountConnections).await.map_err(internal)?;
    let phase = state.lifecycle.phase().name();
    let nodes = state.router.overview();
    let nodes = nodes
        .into_iter()
        .map(|n| OverviewNode { itself: n.phase.is_none(), phase: n.phase.unwrap_or(phase), node: n.name, url: n.url })
        .collect();
    let rooms = state
        .rooms
        .busiest()
        .iter()
        .map(|r| OverviewRoom { room: r.room.to_string(), subscribers: r.subscribers, head: r.head })
        .collect();
    let metrics = &state.metrics;
    let reply = OverviewReply {
        node: state.config.node.clone(),
        version: env!("CARGO_PKG_VERSION"),
        phase,
        ts_ms: now_ms(),
        uptime_secs: state.started.elapsed().as_secs(),
        nodes,
        connections,
        subscriptions: metrics.subscriptions.get().max(0) as u64,
        rooms_live: state.rooms.live_count(),
        rooms,
        counters: OverviewCounters {
            publishes: metrics.events_published.get(),
            deliveries: metrics.events_delivered.get(),
            slow_consumers: metrics.slow_consumer_closes.get(),
            migrations: metrics.migrations.get(),
        },
    };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}
