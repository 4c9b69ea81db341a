//! `POST /v1/tokens`: a backend (or, in development mode, a page of a listed origin)
//! mints a one-time connection token for a user and device.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};

use super::cors;
use super::errors::ApiError;
use super::request::{authorize, check_cell, check_user, json, read_body, SMALL_BODY_LIMIT};
use super::state::AppState;
use crate::core::credentials::token;
use crate::core::rules::names;
use crate::protocol::{self, TokenReply};
use crate::world::{now_ms, random_bytes};

/// `POST /v1/tokens`, with the CORS headers of an allowed origin on every answer (a page
/// reads the token, or why it was refused).
pub(super) async fn mint_token(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let mut response = match mint_token_checked(&req, payload, &state).await {
        Ok(response) => response,
        Err(refusal) => refusal.error_response(),
    };
    cors::with_cors(&req, &state, &mut response);
    response
}

pub(super) async fn mint_token_checked(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<HttpResponse, ApiError> {
    authorize_token_request(req, state)?;
    let body = read_body(payload, SMALL_BODY_LIMIT).await?;
    let request =
        protocol::parse_token_request(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
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
pub(super) fn authorize_token_request(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    if state.dev && !req.headers().contains_key("authorization") {
        if let Some(origin) = cors::listed_origin(req, state) {
            tracing::debug!(%origin, "token minted without the API key (development mode)");
            return Ok(());
        }
    }
    authorize(req, state)
}

/// A token's room patterns: each a room name, optionally ending in `*`; at most 255
/// (what the token's format holds).
pub(super) fn check_patterns(field: &str, patterns: &[String]) -> Result<(), ApiError> {
    if patterns.len() > MAX_PATTERNS {
        return Err(ApiError::bad_request(format!(
            "{field} may hold at most {MAX_PATTERNS} patterns"
        )));
    }
    for pattern in patterns {
        names::check_room(pattern.strip_suffix('*').filter(|p| !p.is_empty()).unwrap_or(pattern))
            .map_err(|_| {
            ApiError::bad_request(format!(
                "{field}: room pattern {pattern:?} is not a room name, optionally ending in *"
            ))
        })?;
    }
    Ok(())
}

/// Patterns per list a token holds.
pub(super) const MAX_PATTERNS: usize = 255;

/// What a token lets its connection do: read `rooms` (empty: any), publish to `publish`
/// (empty: nowhere); and the user's home `cell` it claims, if any.
pub(super) struct Grants {
    pub(super) rooms: Vec<String>,
    pub(super) publish: Vec<String>,
    pub(super) cell: Option<String>,
}

/// Sign a fresh one-time token (a new nonce) and answer it as 201 `{"token","expires_at_ms"}`.
pub(super) fn issue_token(
    state: &AppState,
    user: String,
    device: String,
    ttl_secs: u64,
    grants: Grants,
) -> HttpResponse {
    let issued_at_ms = now_ms();
    let expires_at_ms = issued_at_ms + ttl_secs * 1000;
    let Grants { rooms, publish, cell } = grants;
    let claims = token::Claims {
        user,
        device,
        issued_at_ms: Some(issued_at_ms),
        expires_at_ms,
        nonce: random_bytes(),
        rooms,
        publish,
        cell,
    };
    let reply = TokenReply { token: token::sign(&state.token_secret, &claims), expires_at_ms };
    state.metrics.tokens_minted.inc();
    json(StatusCode::CREATED, protocol::to_json(&reply))
}
