//! Cross-origin answers: which responses a page on another origin may read. An answer
//! carries `Access-Control-Allow-Origin` (the request's `Origin`, echoed, with
//! `Vary: Origin`) exactly when the access list allows that origin (`allowed_origins`;
//! empty: any): the client files (`/livegate.js` and every other `/livegate*` path, by
//! [`client_files`]), `/v1/sse`, `/readyz` and `POST /v1/tokens`, whose preflight
//! (`OPTIONS /v1/tokens`) is [`token_preflight`]. An origin that is not allowed gets no
//! such header, so the browser keeps the answer from the page.

use std::future::Future;

use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{
    HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_MAX_AGE, VARY,
};
use actix_web::{web, HttpRequest, HttpResponse};

use super::errors::api_error;
use super::state::AppState;
use crate::protocol::ErrorCode;

/// The path prefix of the client files (`/livegate.js`, `/livegate.d.ts`, `/livegate/…`
/// and any other build of the library the server adds under it).
pub const CLIENT_FILES_PREFIX: &str = "/livegate";

/// What a page may send to `POST /v1/tokens`, as its preflight answers.
const TOKEN_METHODS: &str = "POST, OPTIONS";
const TOKEN_HEADERS: &str = "authorization, content-type";
/// How long a browser may reuse a preflight's answer (seconds).
const PREFLIGHT_MAX_AGE: &str = "600";

/// Echo the request's `Origin` when the access list allows it: a page on another origin
/// reads an answer (the stream, a refusal, `/readyz`, a token) only with it.
pub fn with_cors(req: &HttpRequest, state: &AppState, response: &mut HttpResponse) {
    if let Some(origin) = allowed_origin(req, state) {
        allow(response.headers_mut(), origin);
    }
}

fn allow(headers: &mut actix_web::http::header::HeaderMap, origin: HeaderValue) {
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(VARY, HeaderValue::from_static("Origin"));
}

/// The request's `Origin`, when the access list allows it.
pub fn allowed_origin(req: &HttpRequest, state: &AppState) -> Option<HeaderValue> {
    let origin = req.headers().get("origin")?;
    state.access.read().allows_origin(Some(origin.to_str().ok()?)).then(|| origin.clone())
}

/// The request's `Origin` as text, when it is one an entry of `allowed_origins` names
/// (not merely allowed by an empty list): who may mint a token without the API key in
/// development mode.
pub fn listed_origin(req: &HttpRequest, state: &AppState) -> Option<String> {
    let origin = req.headers().get("origin")?.to_str().ok()?;
    state.access.read().lists_origin(origin).then(|| origin.to_string())
}

/// `OPTIONS /v1/tokens`: the preflight of a page's `fetch` with a JSON body or an
/// `Authorization` header. 204 with the methods and headers a page may use when its
/// origin is allowed; 403 `forbidden_origin` when it is not; 204 without CORS headers for
/// a request that names no origin (not a browser's preflight).
pub async fn token_preflight(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let Some(origin) = req.headers().get("origin") else {
        return HttpResponse::NoContent().finish();
    };
    let Some(origin) = allowed_origin(&req, &state) else {
        tracing::debug!(?origin, "token preflight refused: origin not allowed");
        return actix_web::ResponseError::error_response(&api_error(
            ErrorCode::ForbiddenOrigin,
            "this origin may not mint tokens here",
        ));
    };
    let mut response = HttpResponse::NoContent()
        .insert_header((ACCESS_CONTROL_ALLOW_METHODS, TOKEN_METHODS))
        .insert_header((ACCESS_CONTROL_ALLOW_HEADERS, TOKEN_HEADERS))
        .insert_header((ACCESS_CONTROL_MAX_AGE, PREFLIGHT_MAX_AGE))
        .finish();
    allow(response.headers_mut(), origin);
    response
}

/// Middleware for the client files: every answer under [`CLIENT_FILES_PREFIX`] gets the
/// CORS headers of an allowed origin, so `import … from "http://HOST/livegate.js"` works
/// from a page on another origin, whatever files the library is built into.
pub fn client_files<S>(
    req: ServiceRequest,
    service: &S,
) -> impl Future<Output = Result<ServiceResponse, actix_web::Error>>
where
    S: Service<ServiceRequest, Response = ServiceResponse, Error = actix_web::Error>,
{
    let origin = match (
        req.path().starts_with(CLIENT_FILES_PREFIX),
        req.app_data::<web::Data<AppState>>(),
    ) {
        (true, Some(state)) => allowed_origin(req.request(), state),
        _ => None,
    };
    let answer = service.call(req);
    async move {
        let mut response = answer.await?;
        if let Some(origin) = origin {
            allow(response.headers_mut(), origin);
        }
        Ok(response)
    }
}
