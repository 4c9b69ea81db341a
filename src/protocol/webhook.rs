//! Webhook bodies: one JSON object per request, and the event data a
//! `client_published` one carries.

use serde::Serialize;
use serde_json::value::RawValue;

use super::{to_json, EventData};

/// A webhook's body, one JSON object per request; `user`, `device`, `seq`,
/// `event_id` and `data` only on `client_published` (`device` and `event_id` when known).
#[derive(Debug, Serialize)]
pub struct WebhookBody<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub room: &'a str,
    pub ts_ms: u64,
    pub node: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<&'a RawValue>,
}

pub fn webhook_body(body: &WebhookBody<'_>) -> String {
    to_json(body)
}

/// The `type` of a webhook body as rendered by [`webhook_body`] (`None`: not one).
pub fn webhook_kind(body: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Kind {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_str::<Kind>(body).ok().map(|k| k.kind)
}

/// Event data given as JSON text (a client's publish op), as the webhook body carries it;
/// `None` if it is not JSON.
pub fn event_data(text: String) -> Option<Box<EventData>> {
    RawValue::from_string(text).ok()
}
