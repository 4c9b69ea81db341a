//! The JSON wire format, and the only module that knows it. An event is rendered once,
//! when it is published, and the rendered text is shared by every subscriber's outbox and
//! by history replies.
//!
//! - [`codes`]: the WebSocket close codes and the error codes, each with its HTTP status.
//! - [`client`]: client frames parsed into typed requests.
//! - [`server`]: server frames as types that the server renders and the terminal client
//!   (`client::subscriber`) reads back; the rendered event.
//! - [`http`]: the public HTTP API's request and reply bodies, and the error body.
//! - [`admin`]: the admin API's bodies (status, overview, rebalance, reload).
//! - [`webhook`]: webhook bodies.
//!
//! Callers name everything through this module (`protocol::error_frame`), not its parts.

pub mod admin;
pub mod client;
pub mod codes;
pub mod http;
pub mod server;
pub mod webhook;

pub use admin::*;
pub use client::*;
pub use codes::*;
pub use http::*;
pub use server::*;
pub use webhook::*;

use serde::Serialize;
use serde_json::value::RawValue;

/// Event `data` as the JSON text that was sent, validated but not re-encoded.
pub type EventData = RawValue;

/// A reply body as JSON text.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("reply bodies always serialise")
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("strings always serialise")
}

/// `[e1,e2,...]` from already-rendered events.
fn join_events<'a>(out: &mut String, events: impl IntoIterator<Item = &'a str>) {
    out.push('[');
    for (i, event) in events.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(event);
    }
    out.push(']');
}
