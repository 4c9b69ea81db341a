//! What every API handler does with its request before its own work: the API key
//! ([`ApiKey`], [`authorize`]), the room of a room's path ([`ApiRoom`]: authorised,
//! checked, and named in every refusal), the names a request carries, the body read
//! within a limit; and the JSON answer.

use std::future::Future;

use actix_web::http::StatusCode;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use futures_util::future::{ready, Ready};
use futures_util::StreamExt;
use serde::Deserialize;

use super::errors::{api_error, internal, ApiError};
use super::limits::SharedAccess;
use super::state::AppState;
use crate::core::rules::names;
use crate::protocol::ErrorCode;

/// Largest body of a request other than a publish, a message or a state.
pub(crate) const SMALL_BODY_LIMIT: usize = 16 * 1024;

/// A JSON answer.
pub(super) fn json(status: StatusCode, body: String) -> HttpResponse {
    HttpResponse::build(status).content_type("application/json").body(body)
}

/// Check `Authorization: Bearer <api_key>` against every valid key, in constant time.
pub(super) fn authorize(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    check_key(req, &state.access)
}

fn check_key(req: &HttpRequest, access: &SharedAccess) -> Result<(), ApiError> {
    let presented = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            api_error(ErrorCode::Unauthorized, "missing Authorization: Bearer <api_key>")
        })?;
    if access.read().accepts_key(presented) {
        Ok(())
    } else {
        tracing::debug!(path = req.path(), "request refused: invalid API key");
        Err(api_error(ErrorCode::Unauthorized, "invalid API key"))
    }
}

pub(crate) async fn read_body(
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("could not read body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(api_error(
                ErrorCode::PayloadTooLarge,
                format!("body is larger than {limit} bytes"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

pub(super) fn check_user(user: &str) -> Result<(), ApiError> {
    names::check_user(user).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A session id a client names (`session=`; empty: none); it becomes a store key and a
/// NATS subject, so a bad one is refused before anything is spent.
pub(super) fn check_session(session: Option<&str>) -> Result<(), ApiError> {
    match session.filter(|s| !s.is_empty()) {
        Some(session) => {
            names::check_session(session).map_err(|e| ApiError::bad_request(e.to_string()))
        }
        None => Ok(()),
    }
}

pub(super) fn check_room(room: &str) -> Result<(), ApiError> {
    names::check_room(room).map_err(|e| api_error(ErrorCode::BadRoom, e.to_string()))
}

/// A cell named by a request: one of the configured cells (`cells`).
pub(super) fn check_cell(state: &AppState, cell: &str) -> Result<(), ApiError> {
    if state.router.knows_cell(cell) {
        return Ok(());
    }
    let shown: String = cell.chars().take(64).collect();
    Err(api_error(
        ErrorCode::UnknownCell,
        format!("cell {shown:?} is not one of the configured cells"),
    ))
}

/// A file embedded in the binary, served as it is; `no-cache` so an upgrade is seen at
/// once.
pub(crate) fn embedded(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("Cache-Control", "no-cache"))
        .body(body)
}

/// A caller with the API key: the extractor of every handler behind it (the refusal is
/// 401 `unauthorized`). Taken after the extractors a request is first checked by (its
/// query), as the handlers' arguments are extracted in order.
pub struct ApiKey;

impl FromRequest for ApiKey {
    type Error = ApiError;
    type Future = Ready<Result<ApiKey, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        ready(app_state(req).and_then(|state| authorize(req, state)).map(|()| ApiKey))
    }
}

/// A request to a room's path (`/v1/rooms/{room}/…`) by a caller with the API key: the
/// shared preamble of the room handlers. The key is checked first, then the room's name
/// (400 `bad_room`); either refusal names the room, and so does every refusal the
/// handler answers through [`ApiRoom::answer`].
pub struct ApiRoom {
    pub room: String,
}

#[derive(Deserialize)]
struct RoomPath {
    room: String,
}

impl FromRequest for ApiRoom {
    type Error = ApiError;
    type Future = Ready<Result<ApiRoom, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        ready(app_state(req).and_then(|state| ApiRoom::checked(req, &state.access)))
    }
}

impl ApiRoom {
    /// The key, then the room's name (decoded as `web::Path` decodes it).
    fn checked(req: &HttpRequest, access: &SharedAccess) -> Result<ApiRoom, ApiError> {
        let room = match req.match_info().load::<RoomPath>() {
            Ok(path) => path.room,
            Err(e) => return Err(ApiError::bad_request(e.to_string())),
        };
        match check_key(req, access).and_then(|()| check_room(&room)) {
            Ok(()) => Ok(ApiRoom { room }),
            Err(refusal) => Err(refusal.about(&room)),
        }
    }

    /// The handler's answer, any refusal in it naming the room.
    pub async fn answer<T>(
        &self,
        work: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        work.await.map_err(|refusal| refusal.about(&self.room))
    }
}

/// The app's state (every app the server builds carries it).
fn app_state(req: &HttpRequest) -> Result<&AppState, ApiError> {
    req.app_data::<web::Data<AppState>>()
        .map(|state| &***state)
        .ok_or_else(|| internal("an app without its AppState"))
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;
    use parking_lot::RwLock;

    use super::*;
    use crate::config::Config;
    use crate::http::limits::AccessList;

    const KEY: &str = "kkkkkkkkkkkkkkkk";

    fn access() -> SharedAccess {
        RwLock::new(AccessList::new(KEY.into(), &Config::default()))
    }

    fn request(room: &str, key: Option<&str>) -> HttpRequest {
        let mut request = TestRequest::default().param("room", room.to_string());
        if let Some(key) = key {
            request = request.insert_header(("authorization", format!("Bearer {key}")));
        }
        request.to_http_request()
    }

    fn refusal(room: &str, key: Option<&str>) -> (ErrorCode, Option<String>) {
        let refused = ApiRoom::checked(&request(room, key), &access()).err().expect("refused");
        (refused.code, refused.room)
    }

    #[test]
    fn a_room_request_needs_the_key_then_a_room_name_and_names_the_room() {
        assert_eq!(
            ApiRoom::checked(&request("match:1", Some(KEY)), &access()).map(|r| r.room).ok(),
            Some("match:1".into())
        );
        assert_eq!(refusal("match:1", None), (ErrorCode::Unauthorized, Some("match:1".into())));
        assert_eq!(
            refusal("match:1", Some("not-the-key-at-all")),
            (ErrorCode::Unauthorized, Some("match:1".into()))
        );
        // The key first: a caller without it learns nothing of the name.
        assert_eq!(refusal("bad room", None), (ErrorCode::Unauthorized, Some("bad room".into())));
        assert_eq!(refusal("bad room", Some(KEY)), (ErrorCode::BadRoom, Some("bad room".into())));
    }

    #[actix_web::test]
    async fn the_handlers_refusals_name_the_room() {
        let call = ApiRoom { room: "r".into() };
        let refused = call
            .answer(async { Err::<(), _>(ApiError::bad_request("no")) })
            .await
            .expect_err("refused");
        assert_eq!((refused.code, refused.room.as_deref()), (ErrorCode::BadRequest, Some("r")));
    }
}
