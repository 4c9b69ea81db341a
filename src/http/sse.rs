//! `GET /v1/sse`: a connection over Server-Sent Events, for clients whose
//! path breaks the WebSocket upgrade, and for `curl -N`. The request names its rooms
//! (`rooms=R1,R2`) and optionally where it left off (`Last-Event-ID`, or `since=`, a
//! cursor); it runs the same handshake checks as `/v1/ws` ([`super::handshake::handshake`]), and the
//! stream is then an ordinary connection actor on the SSE transport
//! ([`crate::actors::sse`]). Every answer, the stream and the refusals, carries CORS
//! headers when the request's `Origin` is allowed.

use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use serde::Deserialize;

use super::cors::with_cors;
use super::errors::{api_error, ApiError};
use super::handshake::{handshake, refused, start_connection, CredentialQuery};
use super::state::AppState;
use crate::actors::connection::InitialSubscription;
use crate::actors::sse;
use crate::actors::transport::Transport;
use crate::core::credentials::Grant;
use crate::core::delivery::sse::{parse_cursor, parse_flag, parse_rooms, CursorEntry, RoomsError};
use crate::core::rules::names;
use crate::protocol::ErrorCode;

#[derive(Deserialize)]
struct SseQuery {
    token: Option<String>,
    resume: Option<String>,
    session: Option<String>,
    /// A node the client could not reach (see the WebSocket handshake).
    avoid: Option<String>,
    /// Comma-separated room names; absent or empty: the inbox only.
    rooms: Option<String>,
    /// A cursor, when the client cannot send `Last-Event-ID`.
    since: Option<String>,
    /// `state=1`: every room is subscribed with `state:true`.
    state: Option<String>,
    /// `1`: presence frames (`event: presence`) for every room of the stream.
    presence: Option<String>,
}

/// What the request asks for, checked before any credential is looked at.
struct Request {
    rooms: Vec<String>,
    cursor: Vec<CursorEntry>,
    state: bool,
    presence: bool,
}

pub async fn stream(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let mut response = match open(&req, &state).await {
        Ok(response) => response,
        Err(refusal) => {
            refused(&state, &refusal);
            refusal.error_response()
        }
    };
    with_cors(&req, &state, &mut response);
    response
}

async fn open(req: &HttpRequest, state: &AppState) -> Result<HttpResponse, ApiError> {
    let query = web::Query::<SseQuery>::from_query(req.query_string())
        .map_err(|e| ApiError::bad_request(e.to_string()))?
        .into_inner();
    let credential = CredentialQuery {
        token: query.token,
        resume: query.resume,
        session: query.session,
        avoid: query.avoid,
    };
    let (rooms, since, presence) = (query.rooms, query.since, query.presence);
    let with_state = parse_flag(query.state.as_deref())
        .map_err(|e| ApiError::bad_request(format!("state: {e}")))?;
    let with_presence = parse_flag(presence.as_deref())
        .map_err(|e| ApiError::bad_request(format!("presence: {e}")))?;
    let shape =
        || parse_request(req, state, rooms.as_deref(), since.as_deref(), with_state, with_presence);
    let (request, admitted) = handshake(req, state, credential, shape, authorise).await?;
    let initial = initial_subscriptions(request, &admitted.identity.user);
    let (io, body) = sse::stream();
    start_connection(state, admitted, Transport::Sse(io), initial);
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body))
}

/// The rooms and the cursor: `Last-Event-ID` wins over `since` (an `EventSource`
/// reconnects with its first URL and a newer `Last-Event-ID`).
fn parse_request(
    req: &HttpRequest,
    state: &AppState,
    rooms: Option<&str>,
    since: Option<&str>,
    with_state: bool,
    presence: bool,
) -> Result<Request, ApiError> {
    let max = state.config.max_subscriptions;
    let rooms = parse_rooms(rooms, max).map_err(|e| match e {
        RoomsError::BadRoom(ref room) => api_error(ErrorCode::BadRoom, e.to_string()).about(room),
        RoomsError::TooMany { .. } => {
            state.metrics.limit_hit("subscriptions");
            api_error(ErrorCode::TooManySubscriptions, e.to_string())
        }
    })?;
    let header = match req.headers().get("last-event-id") {
        Some(value) => {
            Some(value.to_str().map_err(|_| ApiError::bad_request("Last-Event-ID is not text"))?)
        }
        None => None,
    };
    let text = header.filter(|h| !h.is_empty()).or(since).unwrap_or("");
    // A cursor names at most every subscribed room and the inbox.
    let cursor = parse_cursor(text, max + 1)
        .map_err(|e| ApiError::bad_request(format!("bad cursor: {e}")))?;
    Ok(Request { rooms, cursor, state: with_state, presence })
}

/// Every requested room must be readable with this credential (as a WebSocket
/// subscribe checks it); checked before the credential is spent.
fn authorise(request: &Request, who: &Grant) -> Result<(), ApiError> {
    match request.rooms.iter().find(|room| !names::may_read(&who.user, &who.rooms, room)) {
        Some(room) => Err(api_error(
            ErrorCode::Forbidden,
            format!("this credential may not read room {room}"),
        )
        .about(room)),
        None => Ok(()),
    }
}

/// The rooms to subscribe after `welcome`, each at its cursor position when the cursor
/// names it; the user's inbox too when the cursor names it (it is subscribed
/// automatically anyway, and recovered like any room from there).
fn initial_subscriptions(request: Request, user: &str) -> Vec<InitialSubscription> {
    let Request { rooms, mut cursor, state, presence } = request;
    let mut position = |room: &str| match cursor.iter().position(|e| e.room == room) {
        Some(i) => {
            let entry = cursor.swap_remove(i);
            (Some(entry.seq), Some(entry.epoch))
        }
        None => (None, None),
    };
    let inbox = names::inbox_room(user);
    let mut initial: Vec<InitialSubscription> = rooms
        .into_iter()
        .map(|room| {
            let (since, epoch) = position(&room);
            InitialSubscription { room, since, epoch, state, presence }
        })
        .collect();
    if !initial.iter().any(|s| s.room == inbox) {
        if let (Some(since), epoch) = position(&inbox) {
            initial.push(InitialSubscription {
                room: inbox,
                since: Some(since),
                epoch,
                state: false,
                presence: false,
            });
        }
    }
    initial
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(room: &str, epoch: &str, seq: u64) -> CursorEntry {
        CursorEntry { room: room.into(), epoch: epoch.into(), seq }
    }

    fn sub(room: &str, at: Option<(&str, u64)>) -> InitialSubscription {
        InitialSubscription {
            room: room.into(),
            since: at.map(|a| a.1),
            epoch: at.map(|a| a.0.to_string()),
            state: false,
            presence: false,
        }
    }

    #[test]
    fn cursor_positions_go_to_their_rooms() {
        let request = Request {
            rooms: vec!["a".into(), "b".into()],
            cursor: vec![entry("b", "E", 4), entry("elsewhere", "E", 9), entry("user:u1", "F", 2)],
            state: false,
            presence: false,
        };
        let got = initial_subscriptions(request, "u1");
        assert_eq!(
            got,
            vec![sub("a", None), sub("b", Some(("E", 4))), sub("user:u1", Some(("F", 2)))]
        );
        let request = Request {
            rooms: vec!["user:u1".into()],
            cursor: vec![entry("user:u1", "F", 2)],
            state: false,
            presence: false,
        };
        assert_eq!(initial_subscriptions(request, "u1"), vec![sub("user:u1", Some(("F", 2)))]);
        let request = Request {
            rooms: vec![],
            cursor: vec![entry("user:u2", "F", 2)],
            state: false,
            presence: false,
        };
        assert_eq!(initial_subscriptions(request, "u1"), vec![]);
        // state=1: every named room with its state; the inbox (no state) without.
        let request = Request {
            rooms: vec!["a".into()],
            cursor: vec![entry("user:u1", "F", 2)],
            state: true,
            presence: false,
        };
        let with_state = InitialSubscription { state: true, ..sub("a", None) };
        assert_eq!(
            initial_subscriptions(request, "u1"),
            vec![with_state, sub("user:u1", Some(("F", 2)))]
        );
    }
}
