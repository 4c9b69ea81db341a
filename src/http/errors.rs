//! The error answer of every handler: [`ApiError`], a JSON body
//! `{"error":{"code","message"}}` with the status of its code
//! ([`ErrorCode::http_status`]), built by [`api_error`], and the conversions from the
//! actors' refusals.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::actors::liveness::Unroutable;
use crate::actors::publish::SubmitError;
use crate::actors::rooms::RoomError;
use crate::protocol::{self, ErrorCode};

/// An error answered as JSON.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub(super) status: StatusCode,
    pub(super) code: ErrorCode,
    pub(super) message: String,
    pub(super) retry_after_secs: Option<u64>,
    /// `wrong_node`: the node that serves the session, and its URL.
    pub(super) elsewhere: Option<Box<(String, String)>>,
    /// The room the refused request named (in its path, or an SSE request's `rooms`).
    pub(super) room: Option<String>,
}

/// The error answer for `code`, with the code's HTTP status.
pub fn api_error(code: ErrorCode, message: impl Into<String>) -> ApiError {
    let status = StatusCode::from_u16(code.http_status())
        .expect("ErrorCode::http_status names valid statuses");
    ApiError {
        status,
        code,
        message: message.into(),
        retry_after_secs: None,
        elsewhere: None,
        room: None,
    }
}

/// A handshake on a node that does not serve its session: 421 naming the node that does.
pub(super) fn wrong_node(node: String, url: String) -> ApiError {
    let message = format!("this session is served by node {node}: connect to {url}");
    ApiError { elsewhere: Some(Box::new((node, url))), ..api_error(ErrorCode::WrongNode, message) }
}

impl ApiError {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        api_error(ErrorCode::BadRequest, message)
    }
    /// Answer with `Retry-After`.
    pub(super) fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }
    /// Name `room` in the answer: the refused request named it.
    pub(crate) fn about(mut self, room: &str) -> Self {
        self.room = Some(room.to_string());
        self
    }
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

pub(super) fn internal(e: impl std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "internal error");
    api_error(ErrorCode::Internal, "internal error; see the server log")
}

/// The router's refusal: 503 `no_healthy_cell` when cells are known and none is healthy,
/// else 503 `no_alive_node`.
pub(super) fn unroutable(why: &Unroutable) -> ApiError {
    let code = match why {
        Unroutable::NoHealthyCell { .. } => ErrorCode::NoHealthyCell,
        Unroutable::NoAliveNode(_) => ErrorCode::NoAliveNode,
    };
    api_error(code, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_web::test]
    async fn an_error_answers_its_codes_status_and_json_body() {
        let answer = |e: ApiError| async move {
            let response = e.error_response();
            let retry =
                response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
            let body = actix_web::body::to_bytes(response.into_body()).await.unwrap();
            (retry, serde_json::from_slice::<serde_json::Value>(&body).unwrap())
        };
        let refused = api_error(ErrorCode::BadRoom, "no such name").about("r 1");
        assert_eq!(refused.status_code().as_u16(), ErrorCode::BadRoom.http_status());
        let (retry, body) = answer(refused).await;
        assert_eq!(retry, None);
        assert_eq!(
            body,
            serde_json::json!({"error": {"code": "bad_room", "message": "no such name", "room": "r 1"}})
        );
        let (retry, _) = answer(api_error(ErrorCode::MigrationBudget, "wait").retry_after(7)).await;
        assert_eq!(retry.as_deref(), Some("7"));
        let elsewhere = wrong_node("n2".into(), "http://n2".into());
        assert_eq!(elsewhere.status_code().as_u16(), 421);
        let (_, body) = answer(elsewhere).await;
        assert_eq!(
            (&body["error"]["node"], &body["error"]["url"]),
            (&"n2".into(), &"http://n2".into())
        );
    }

    #[test]
    fn the_router_refusals_name_why() {
        let none = unroutable(&Unroutable::NoHealthyCell { home: Some("eu".into()) });
        assert_eq!((none.code, none.status.as_u16()), (ErrorCode::NoHealthyCell, 503));
        assert!(none.message.contains("eu"), "{}", none.message);
    }
}
