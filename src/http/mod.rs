//! The HTTP layer: thin actix-web handlers that parse, authorise, send one actor message
//! and map the reply to HTTP. This file only declares the modules and routes requests;
//! each concern has its module, and they import what they share from [`state`],
//! [`errors`] and [`request`], never from here:
//!
//! - [`state`]: `AppState`, what every handler shares; [`errors`]: `ApiError`, the JSON
//!   error answer; [`request`]: the API key, the room preamble (`ApiRoom`), bodies, JSON.
//! - [`handshake`]: the connection handshake and its credential flow (`/v1/ws`, and the
//!   checks [`sse`] shares); [`tokens`]: `POST /v1/tokens`.
//! - [`rooms`]: the REST API of rooms and users; [`admin`]: the operator's API and page;
//!   [`operations`]: health, readiness, metrics, status, reload, embedded files, demo.
//! - Beside them: [`cors`], [`limits`] (connection limits, access list), [`sockets`]
//!   (socket budget, deadlines, the connect hook), [`upgrade`] (actix-http's upgrade
//!   hook), [`durable`] (handshake flushes), [`jwt`] (JWT keys), [`seams`] (deployment
//!   traits).

use actix_web::web;

pub mod admin;
pub mod cors;
pub mod durable;
pub mod errors;
pub mod handshake;
pub mod jwt;
pub mod limits;
pub mod operations;
pub mod request;
pub mod rooms;
pub mod seams;
pub mod sockets;
pub mod sse;
pub mod state;
pub mod tokens;
pub mod upgrade;

pub use errors::{api_error, ApiError};
pub use operations::{reload_access, CLIENT_MODULES};
pub use sockets::{on_connect, RequestWatch};
pub use state::{AppState, ReloadConfig};
pub use upgrade::WEBSOCKET_ROUTES;

use handshake::{echo, upgrade};
use operations::{
    client_library, client_module, client_script, client_types, demo_page, demo_token, healthz,
    metrics, not_found, openapi, readyz, reload, status,
};
use rooms::{
    kick, message_user, publish, put_state, read_history, read_presence, read_state, route,
};
use tokens::mint_token;

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
    (GET) => {
        web::get()
    };
    (POST) => {
        web::post()
    };
    (PUT) => {
        web::put()
    };
    (DELETE) => {
        web::delete()
    };
    (HEAD) => {
        web::head()
    };
    (OPTIONS) => {
        web::route().method(actix_web::http::Method::OPTIONS)
    };
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

/// Register every route on an app.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let bad_query = |err: actix_web::error::QueryPayloadError, _: &actix_web::HttpRequest| {
        ApiError::bad_request(err.to_string()).into()
    };
    let bad_path = |err: actix_web::error::PathError, _: &actix_web::HttpRequest| {
        ApiError::bad_request(err.to_string()).into()
    };
    cfg.app_data(web::QueryConfig::default().error_handler(bad_query))
        .app_data(web::PathConfig::default().error_handler(bad_path));
    register_routes(cfg);
    cfg.default_service(web::to(not_found));
}
