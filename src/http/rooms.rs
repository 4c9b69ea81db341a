//! The REST API behind the API key: a room's events (publish, history), state and
//! presence; a user's messages and kicks; and where a session or user is served
//! (`/v1/route`).

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::errors::{api_error, internal, unroutable, ApiError};
use super::request::{
    authorize, check_cell, check_session, check_user, json, read_body, ApiKey, ApiRoom,
};
use super::state::AppState;
use crate::actors::connection::HISTORY_DEFAULT_LIMIT;
use crate::actors::messages::Kick;
use crate::actors::publish::Submission;
use crate::core::{rules::limits, rules::names};
use crate::protocol::{self, ErrorCode, PublishReply};
use crate::world::now_ms;

/// Bytes a publish body may carry beyond `max_event_bytes` (id, field names).
pub(super) const PUBLISH_BODY_OVERHEAD: usize = 1024;

/// `POST /v1/rooms/{room}/events`: one event, with the room's state when given.
pub(super) async fn publish(
    call: ApiRoom,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    call.answer(async {
        let room = &call.room;
        let limit = state.publisher.max_event_bytes(room)
            + state.publisher.max_state_bytes()
            + PUBLISH_BODY_OVERHEAD;
        let body = read_body(payload, limit).await?;
        let request = protocol::parse_publish_request(&body)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let room_state = request.state.map(|s| s.get().into());
        append(&state, room.clone(), request.id, &request.data, None, room_state).await
    })
    .await
}

/// `PUT /v1/rooms/{room}/state`: the room's state as of its head, answered
/// once durable with the seq it is as of.
pub(super) async fn put_state(
    call: ApiRoom,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let put = call
        .answer(async {
            let body =
                read_body(payload, state.publisher.max_state_bytes() + PUBLISH_BODY_OVERHEAD)
                    .await?;
            let request = protocol::parse_put_state_request(&body)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            Ok(state.publisher.put_state(&call.room, request.data.get().into()).await?)
        })
        .await?;
    let reply =
        protocol::PutStateReply { room: call.room, epoch: put.epoch.to_string(), seq: put.seq };
    Ok(json(StatusCode::OK, protocol::to_json(&reply)))
}

/// `GET /v1/rooms/{room}/state`: the room's state from its memory.
pub(super) async fn read_state(
    call: ApiRoom,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    call.answer(async {
        let room = &call.room;
        if names::inbox_owner(room).is_some() {
            return Err(ApiError::bad_request("inbox rooms have no state"));
        }
        let view = state.rooms.state(room).await?;
        Ok(json(
            StatusCode::OK,
            protocol::state_body(room, view.epoch.as_deref(), view.seq, view.data.as_deref()),
        ))
    })
    .await
}

/// `POST /v1/users/{user}/messages`: an event in the user's inbox, for some of their
/// devices or all.
pub(super) async fn message_user(
    user: web::Path<String>,
    _: ApiKey,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let user = user.into_inner();
    check_user(&user)?;
    let inbox = names::inbox_room(&user);
    let body =
        read_body(payload, state.publisher.max_event_bytes(&inbox) + PUBLISH_BODY_OVERHEAD).await?;
    let request = protocol::parse_user_message_request(&body)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    for device in request.devices.iter().flatten() {
        names::check_device(device).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    append(&state, inbox, request.id, &request.data, request.devices, None).await
}

/// Publish one event (size-checked, id checked or generated, by `Publisher::submit`) and
/// answer 201, or 200 for a duplicate id.
pub(super) async fn append(
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
    let reply = PublishReply {
        room,
        seq: published.seq,
        epoch: published.epoch.to_string(),
        duplicate: published.duplicate,
    };
    Ok(json(status, protocol::to_json(&reply)))
}

#[derive(Deserialize)]
pub(super) struct KickQuery {
    device: Option<String>,
}

/// `DELETE /v1/users/{user}/connections`: void the user's credentials (of one device,
/// when given) and close their connections on every node.
pub(super) async fn kick(
    user: web::Path<String>,
    query: web::Query<KickQuery>,
    _: ApiKey,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
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
    // this kick (`core::credentials::kicks`).
    let at_ms = now_ms();
    state.credentials.kick_user(&user, device.as_deref(), at_ms).await.map_err(internal)?;
    let here = state.registry.send(Kick { user: user.clone(), device: device.clone(), at_ms });
    let elsewhere = state.other_nodes.kick(&user, device.as_deref(), at_ms);
    let (here, elsewhere) = futures_util::future::join(here, elsewhere).await;
    let closed = here.map_err(internal)? + elsewhere.map_err(internal)?;
    // The kicked connections revoked their sessions' resume credentials before they
    // stopped (other nodes before they answered): the answer waits until that is durable,
    // so a crash right after it cannot bring the credentials back.
    state.credentials.revocations_durable().await.map_err(internal)?;
    // A token minted after this answer must be issued after the kick (the rule is "at or
    // before"): never answer within the kick's own millisecond.
    while now_ms() <= at_ms {
        actix_web::rt::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    Ok(json(StatusCode::OK, protocol::to_json(&protocol::KickReply { closed })))
}

#[derive(Deserialize)]
pub(super) struct HistoryQuery {
    #[serde(default)]
    since: u64,
    limit: Option<usize>,
}

/// `GET /v1/rooms/{room}/events`: the room's durable events after `since`, at most
/// `limit` (the connection's default, never above `max_history_limit`; a larger limit is
/// refused).
pub(super) async fn read_history(
    query: web::Query<HistoryQuery>,
    call: ApiRoom,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    call.answer(async {
        let room = &call.room;
        let limit = limits::history_limit(
            query.limit,
            HISTORY_DEFAULT_LIMIT,
            state.config.max_history_limit,
        )
        .map_err(|e| {
            state.metrics.limit_hit("history_limit");
            ApiError::bad_request(e.to_string())
        })?;
        let page = state.rooms.history(room, query.since, limit).await?;
        let body = protocol::history_body(
            room,
            page.epoch.as_deref(),
            page.head,
            page.events.iter().map(|e| &*e.json),
        );
        Ok(json(StatusCode::OK, body))
    })
    .await
}

/// `GET /v1/rooms/{room}/presence`: the room's distinct members across the cluster
/// (`members` null above `presence_members_max`); 404 `presence_off` where the room keeps
/// none.
pub(super) async fn read_presence(
    call: ApiRoom,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    call.answer(async {
        match state.rooms.presence(&call.room).await? {
            Ok(view) => Ok(json(StatusCode::OK, protocol::presence_body(&call.room, &view))),
            Err(off) => Err(api_error(ErrorCode::PresenceOff, off.to_string())),
        }
    })
    .await
}

#[derive(Deserialize)]
pub(super) struct RouteQuery {
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
pub(super) async fn route(
    req: HttpRequest,
    query: web::Query<RouteQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if query.user.as_deref().is_some_and(|u| !u.is_empty())
        || query.session.as_deref().is_none_or(str::is_empty)
    {
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
    match state.router.route(
        &session,
        &user,
        cell.as_deref(),
        recorded.as_ref().map(|r| r.owner.as_str()),
        None,
    ) {
        Ok(answer) => {
            // Asked for, with the API key: the nodes and their loads (what the answer weighed).
            let nodes = (list_nodes && authorize(&req, &state).is_ok()).then(|| {
                let phase = state.lifecycle.phase().name();
                let view = state.router.overview().into_iter();
                view.map(|n| protocol::RouteNode {
                    phase: n.phase.unwrap_or(phase),
                    node: n.name,
                    cell: n.cell,
                    load: n.load,
                })
                .collect()
            });
            let reply = protocol::RouteReply {
                node: answer.node,
                url: answer.url,
                cell: answer.cell,
                home: answer.home,
                nodes,
            };
            Ok(json(StatusCode::OK, protocol::to_json(&reply)))
        }
        Err(none) => Err(unroutable(&none)),
    }
}
