//! The admin page: `GET /admin` serves the self-contained page
//! (`src/web/admin.html`, no auth: it asks for the API key and keeps it in the tab's
//! sessionStorage), and `GET /v1/admin/overview` answers what the page polls, behind the
//! API key: this node and its phase, the nodes it knows, connections, subscriptions,
//! live rooms, the busiest rooms with their heads, the node's monotonic counters
//! (the page turns them into rates), and in cluster mode its lag behind the rooms'
//! streams (the worst room named) and, with cells, each mirror's lag. Every part is read
//! from memory: the registry's count, the rooms' load slots, the liveness actor's table,
//! the metrics.
//!
//! `GET /v1/admin/cells` (cluster mode) answers each configured cell's breaker with its
//! recent probe rounds and transitions, as the liveness router keeps them
//! (`core::nodes::breaker::CellBreakers::views`); `livegate cells` prints it for an operator.
//! `POST /v1/admin/cells/{cell}/promote` moves a lost cell's rooms into this node's cell
//! (`cluster::promotion`) and answers what it did; `livegate cells --promote` asks it.
//!
//! `POST /v1/admin/rebalance` (issue 30, scale-out's controlled entry) plans a rebalance
//! towards a node over the loads the heartbeats carry (`core::nodes::rebalance::plan`) and gives
//! each shedding node its order (this node directly, the others through
//! [`super::seams::OtherNodes`]); `GET` shows the last plan made here, this node's part
//! of the last one it was given, and the loads it hears.
//!
//! `/v1/admin/webhooks/dead` lists this node's dead letters (webhooks given up, kept in
//! its store: `actors::webhooks::DeadLetters`), newest first; `POST …/{id}/replay` sends
//! one again now; `DELETE` forgets one or all. `livegate webhooks` asks them.

use super::errors::{api_error, internal, ApiError};
use super::request::{embedded, json, read_body, ApiKey, SMALL_BODY_LIMIT};
use super::seams::{OrderNotTaken, PromoteRefused};
use super::state::AppState;
use crate::actors::messages::CountConnections;
use crate::actors::rebalance::Shed;
use crate::actors::webhooks::{ReplayError, Replayed};
use crate::cluster::promotion::Promotion;
use crate::cluster::ClusterError;
use crate::core::nodes::rebalance::{self, Load, Order};
use crate::protocol::{
    self, ErrorCode, OverviewCell, OverviewCounters, OverviewLag, OverviewMirror, OverviewNode,
    OverviewReply, OverviewRoom,
};
use crate::protocol::{CellProbe, CellStatus, CellTransition, CellsReply, PromoteReply};
use crate::protocol::{DeadDeletedReply, DeadLetterView, DeadLettersReply, ReplayReply};
use crate::protocol::{RebalanceLoad, RebalancePlanReply, RebalanceShare, RebalanceStatusReply};
use crate::store::DeadLetterRecord;
use crate::world::{now_ms, random_hex};
use actix_web::http::header::{HeaderValue, CONTENT_SECURITY_POLICY, REFERRER_POLICY};
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde_json::value::RawValue;

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
pub async fn overview(_key: ApiKey, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let connections = state.registry.send(CountConnections).await.map_err(internal)?;
    let phase = state.lifecycle.phase().name();
    let nodes = state.router.overview();
    let nodes = nodes
        .into_iter()
        .map(|n| OverviewNode {
            itself: n.phase.is_none(),
            phase: n.phase.unwrap_or(phase),
            node: n.name,
            url: n.url,
            cell: n.cell,
            load: n.load,
        })
        .collect();
    let rooms = state
        .rooms
        .busiest()
        .iter()
        .map(|r| OverviewRoom {
            room: r.room.to_string(),
            subscribers: r.subscribers,
            head: r.head,
        })
        .collect();
    let cells =
        if state.router.placement_decides() { Vec::new() } else { state.router.breaker_states() };
    let cells = cells
        .into_iter()
        .map(|(cell, breaker)| OverviewCell { cell, breaker: breaker.name() })
        .collect();
    let metrics = &state.metrics;
    let lag = state.rooms.lag(now_ms());
    let lag = OverviewLag {
        events: lag.events,
        room: lag.room.as_ref().map(|room| room.to_string()),
        seconds: lag.millis as f64 / 1000.0,
        rooms_behind: lag.rooms_behind,
    };
    let mirrors = metrics
        .cell_mirror_lags
        .lock()
        .iter()
        .map(|(cell, &lag_events)| OverviewMirror { cell: cell.clone(), lag_events })
        .collect();
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
        cells,
        lag,
        mirrors,
    };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

/// `GET /v1/admin/cells`: the cells' breakers and their recent past; 409 `conflict`
/// outside cluster mode, where no cell is probed.
pub async fn cells(_key: ApiKey, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if state.router.placement_decides() {
        return Err(api_error(ErrorCode::Conflict, "cells need cluster mode (cluster_nats_url): without it no cell is probed and no breaker kept"));
    }
    let cells = state
        .router
        .cell_views()
        .into_iter()
        .map(|view| CellStatus {
            cell: view.cell,
            breaker: view.state.name().to_string(),
            since_ms: view.since_ms,
            probes: view
                .rounds
                .into_iter()
                .map(|r| CellProbe {
                    at_ms: r.at_ms,
                    passed: r.passed,
                    reports: r.reports,
                    failures: r.failures,
                    failed: r.failed,
                })
                .collect(),
            transitions: view
                .changes
                .into_iter()
                .map(|c| CellTransition {
                    at_ms: c.at_ms,
                    from: c.from.to_string(),
                    to: c.to.to_string(),
                })
                .collect(),
        })
        .collect();
    let me = state.router.me();
    let reply = CellsReply { node: me.name.clone(), cell: me.cell.clone(), ts_ms: now_ms(), cells };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

/// `POST /v1/admin/cells/{cell}/promote`: move `cell`'s rooms into this node's cell (cell
/// domains), once none of its nodes is heard. 400 `unknown_cell`; 409 `conflict` when
/// the cell is alive, the move contradicts a known one, or cells share one NATS; 503
/// `unavailable` when this cell's NATS did not answer (nothing moved: try again).
pub async fn promote(
    _key: ApiKey,
    cell: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let cell = cell.into_inner();
    if !state.router.knows_cell(&cell) {
        return Err(api_error(
            ErrorCode::UnknownCell,
            format!("cell {cell:?} is not one of the configured cells"),
        ));
    }
    let promotion = state.other_nodes.promote(&cell).await.map_err(|refused| match refused {
        PromoteRefused::Alive { .. } | PromoteRefused::Cluster(ClusterError::Promotion(_)) => {
            api_error(ErrorCode::Conflict, refused.to_string())
        }
        PromoteRefused::Cluster(error) => api_error(
            ErrorCode::Unavailable,
            format!("the promotion did not complete: {error}; try again"),
        ),
    })?;
    let Promotion { from, to, epoch, rooms, mirror_head, origin_head_seen, missing } = promotion;
    let reply =
        PromoteReply { cell: from, to, epoch, rooms, mirror_head, origin_head_seen, missing };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

/// `POST /v1/admin/rebalance`: plan, hand out the orders, answer 202 with the plan.
pub async fn rebalance(
    _key: ApiKey,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, SMALL_BODY_LIMIT).await?;
    let request = protocol::parse_rebalance_request(&body)
        .map_err(|e| api_error(ErrorCode::BadRequest, e.to_string()))?;
    let per_second = rebalance::per_second(request.per_second)
        .map_err(|e| api_error(ErrorCode::BadRequest, e.to_string()))?;
    let Some(loads) = state.router.loads(state.metrics.connections_now()) else {
        return Err(api_error(
            ErrorCode::Conflict,
            "rebalance needs cluster mode (cluster_nats_url): sessions have no shared owner here",
        ));
    };
    let to = request.to.unwrap_or_else(|| state.config.node.clone());
    let target = loads.iter().find(|n| n.name == to);
    let Some(target) = target.filter(|n| !n.draining) else {
        let why = if target.is_some() {
            "is draining or starting"
        } else {
            "is not an alive node this node hears"
        };
        return Err(api_error(
            ErrorCode::Conflict,
            format!("cannot rebalance towards {to}: it {why}"),
        ));
    };
    let to_url = target.url.clone();
    let taking: Vec<Load> = loads
        .iter()
        .filter(|n| !n.draining)
        .map(|n| Load { node: &n.name, connections: n.connections.unwrap_or(0) })
        .collect();
    let plan = rebalance::plan(&taking, &to, request.limit)
        .map_err(|e| api_error(ErrorCode::Conflict, e.to_string()))?;
    let id = random_hex(8);
    let mut shares = Vec::with_capacity(plan.shares.len());
    for (share, rate) in plan.shares.iter().zip(plan.rates(per_second)) {
        let order = Order {
            id: id.clone(),
            to: to.clone(),
            connections: share.connections,
            per_second: rate,
        };
        let given = if share.node == state.config.node {
            match state.rebalance.actor.send(Shed(order)).await {
                Ok(taken) => taken.map_err(OrderNotTaken::from),
                Err(stopped) => Err(OrderNotTaken::from(stopped)),
            }
        } else {
            state.other_nodes.rebalance(&share.node, &order, &to_url).await
        };
        if let Err(error) = &given {
            tracing::warn!(node = %share.node, %error, "rebalance: a node did not take its order");
        }
        shares.push(RebalanceShare {
            node: share.node.clone(),
            connections: share.connections,
            per_second: rate,
            accepted: given.is_ok(),
            error: given.err().map(|error| error.to_string()),
        });
    }
    tracing::info!(id, to, per_second, total = plan.total(), mean = plan.mean, "rebalance planned");
    let reply = RebalancePlanReply {
        id,
        to,
        per_second,
        mean: plan.mean,
        total: plan.total(),
        at_ms: now_ms(),
        shares,
    };
    state.rebalance.status.lock().issued = Some(reply.clone());
    Ok(json(StatusCode::ACCEPTED, protocol::to_json(&reply)))
}

/// `GET /v1/admin/rebalance`: the last plan made here, this node's part, the loads heard.
pub async fn rebalance_status(
    _key: ApiKey,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let status = state.rebalance.status.lock().clone();
    let loads = state.router.loads(state.metrics.connections_now()).unwrap_or_default();
    let reply = RebalanceStatusReply {
        node: state.config.node.clone(),
        issued: status.issued,
        shedding: status.shedding,
        loads: loads
            .into_iter()
            .map(|n| RebalanceLoad {
                node: n.name,
                connections: n.connections,
                draining: n.draining,
            })
            .collect(),
    };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

/// Dead letters listed when the request names no `limit`.
const DEAD_LIST_DEFAULT: usize = 100;
/// The largest `limit` of a dead-letter list.
const DEAD_LIST_MAX: usize = 10_000;

#[derive(Debug, serde::Deserialize)]
pub struct DeadQuery {
    limit: Option<usize>,
}

/// `GET /v1/admin/webhooks/dead?limit=N`: this node's dead letters, newest first (at most
/// `limit`, 100 unless asked, up to 10,000), with how many are kept and the bound.
pub async fn dead_letters(
    _key: ApiKey,
    query: web::Query<DeadQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(DEAD_LIST_DEFAULT);
    if !(1..=DEAD_LIST_MAX).contains(&limit) {
        return Err(api_error(
            ErrorCode::BadRequest,
            format!("limit must be 1 to {DEAD_LIST_MAX}"),
        ));
    }
    let dead = state.dead_letters.clone();
    let letters =
        web::block(move || dead.list(limit)).await.map_err(internal)?.map_err(internal)?;
    let reply = DeadLettersReply {
        node: state.config.node.clone(),
        ts_ms: now_ms(),
        count: state.dead_letters.count(),
        max: state.dead_letters.max(),
        dead_letters: letters.into_iter().map(dead_letter_view).collect(),
    };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

fn dead_letter_view(letter: DeadLetterRecord) -> DeadLetterView {
    // The body was rendered as JSON by this server; anything else is shown as a string.
    let body = RawValue::from_string(letter.body.clone()).unwrap_or_else(|_| {
        RawValue::from_string(serde_json::Value::String(letter.body).to_string())
            .expect("a JSON string")
    });
    DeadLetterView {
        id: letter.id,
        kind: letter.kind,
        room: letter.room,
        url: letter.url,
        attempts: letter.attempts,
        first_attempt_ms: letter.first_attempt_ms,
        last_attempt_ms: letter.last_attempt_ms,
        last_error: letter.last_error,
        reason: letter.reason,
        body,
    }
}

/// `POST /v1/admin/webhooks/dead/{id}/replay`: one attempt now, to `webhook_url` as
/// configured now. Delivered: 200, and the dead letter leaves the list. Not delivered:
/// 502 `replay_failed` naming the error, and it stays with the attempt counted.
pub async fn replay_dead_letter(
    _key: ApiKey,
    id: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let Some(webhooks) = state.webhooks.clone() else {
        return Err(api_error(
            ErrorCode::WebhooksOff,
            "webhooks are off (webhook_url is empty): set it to replay dead letters",
        ));
    };
    let asked = id.clone();
    let replayed =
        web::block(move || webhooks.replay(&asked)).await.map_err(internal)?.map_err(|error| {
            match error {
                ReplayError::NotFound(_) => {
                    api_error(ErrorCode::DeadLetterNotFound, error.to_string())
                }
                ReplayError::InProgress(_) => api_error(ErrorCode::Conflict, error.to_string()),
                ReplayError::Store(store) => internal(store),
            }
        })?;
    let Replayed { delivered, letter } = replayed;
    if !delivered {
        let message = format!(
            "dead letter {id} not delivered ({}); it stays, {} attempts made",
            letter.last_error, letter.attempts
        );
        return Err(api_error(ErrorCode::ReplayFailed, message));
    }
    let reply = ReplayReply { id, outcome: "delivered".to_string(), attempts: letter.attempts };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

/// `DELETE /v1/admin/webhooks/dead/{id}`: forget one dead letter (404 when it is not kept).
pub async fn delete_dead_letter(
    _key: ApiKey,
    id: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let dead = state.dead_letters.clone();
    let asked = id.clone();
    if !web::block(move || dead.delete(&asked)).await.map_err(internal)?.map_err(internal)? {
        return Err(api_error(ErrorCode::DeadLetterNotFound, format!("no dead letter {id}")));
    }
    Ok(json(StatusCode::OK, protocol::to_json(&DeadDeletedReply { deleted: 1 })))
}

/// `DELETE /v1/admin/webhooks/dead`: forget every dead letter of this node.
pub async fn clear_dead_letters(
    _key: ApiKey,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let dead = state.dead_letters.clone();
    let deleted = web::block(move || dead.clear()).await.map_err(internal)?.map_err(internal)?;
    Ok(json(StatusCode::OK, protocol::to_json(&DeadDeletedReply { deleted })))
}
