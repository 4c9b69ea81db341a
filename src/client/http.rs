//! The HTTP client of the command line: a server's address and API key, and the requests
//! `token`, `publish`, `status`, `state`, `presence`, `cells` and `webhooks` send (on ureq, blocking). Replies
//! come back as the server's text; failures as one-line [`ClientError`]s naming the
//! status and the server's error code and message.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use serde_json::Value;

use super::ClientError;
use crate::config::Config;

/// A server's address and API key, and an HTTP agent for it.
pub struct Client {
    /// `http://host:port`, no trailing slash.
    base: String,
    key: String,
    agent: ureq::Agent,
}

impl Client {
    /// `base` is `http://host:port`.
    pub fn new(base: String, key: String) -> Client {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build();
        Client { base, key, agent }
    }

    /// The server at `url` (`--url`), else at the configured listen address, with the
    /// configured API key or the key file the server generated.
    pub fn from_config(config: &Config, url: Option<&str>) -> Result<Client, ClientError> {
        let base = match url {
            Some(url) => normalize_url(url)?,
            None if config.listen.port() == 0 => {
                return Err(ClientError::Usage(format!(
                    "listen is {} (any free port), so the server's port is unknown: pass --url with the address it printed",
                    config.listen
                )))
            }
            None => format!("http://{}", connect_address(config.listen)),
        };
        let key = config
            .existing_api_key()?
            .ok_or_else(|| ClientError::NoApiKey { key_file: config.api_key_path() })?;
        Ok(Client::new(base, key))
    }

    /// `http://host:port`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `ws://host:port`.
    pub fn ws_base(&self) -> String {
        format!("ws://{}", self.base.trim_start_matches("http://"))
    }

    /// POSTs JSON with the API key; the reply body on a 2xx status, else an error naming
    /// the status and the server's error code and message.
    pub fn post(&self, path: &str, body: &Value) -> Result<String, ClientError> {
        let request = self
            .agent
            .post(&format!("{}{path}", self.base))
            .set("Authorization", &format!("Bearer {}", self.key));
        self.reply("POST", path, request.send_json(body))
    }

    pub fn get(&self, path: &str) -> Result<String, ClientError> {
        let request = self
            .agent
            .get(&format!("{}{path}", self.base))
            .set("Authorization", &format!("Bearer {}", self.key));
        self.reply("GET", path, request.call())
    }

    fn reply(
        &self,
        method: &str,
        path: &str,
        reply: Result<ureq::Response, ureq::Error>,
    ) -> Result<String, ClientError> {
        let request = || format!("{method} {path}");
        match reply {
            Ok(response) => response
                .into_string()
                .map_err(|source| ClientError::ReadReply { request: request(), source }),
            Err(ureq::Error::Status(status, response)) => Err(ClientError::Refused {
                request: request(),
                status,
                body: response.into_string().unwrap_or_default(),
            }),
            Err(ureq::Error::Transport(transport)) => Err(ClientError::Unreachable {
                base: self.base.clone(),
                transport: Box::new(transport),
            }),
        }
    }

    /// `POST /v1/tokens`: a one-time WebSocket token for `user` on `device`.
    pub fn mint_token(
        &self,
        user: &str,
        device: &str,
        ttl_secs: u64,
    ) -> Result<String, ClientError> {
        let body = serde_json::json!({ "user": user, "device": device, "ttl_secs": ttl_secs });
        let reply = self.post("/v1/tokens", &body)?;
        #[derive(Deserialize)]
        struct Minted {
            token: String,
        }
        serde_json::from_str::<Minted>(&reply).map(|m| m.token).map_err(|_| {
            ClientError::UnexpectedReply { request: "POST /v1/tokens".into(), body: reply }
        })
    }

    /// `GET /v1/admin/status`: the server's reply (node, version, uptime, phase, counts).
    pub fn status(&self) -> Result<String, ClientError> {
        self.get("/v1/admin/status")
    }

    /// `GET /v1/admin/cells`: each configured cell's breaker and probe history (cluster
    /// mode; 409 `conflict` otherwise).
    pub fn cells(&self) -> Result<crate::protocol::CellsReply, ClientError> {
        const PATH: &str = "/v1/admin/cells";
        let body = self.get(PATH)?;
        serde_json::from_str(&body)
            .map_err(|_| ClientError::UnexpectedReply { request: format!("GET {PATH}"), body })
    }

    /// `POST /v1/admin/cells/{cell}/promote`: move the lost `cell`'s rooms into the
    /// node's cell (cell domains), and what it did.
    pub fn promote_cell(&self, cell: &str) -> Result<crate::protocol::PromoteReply, ClientError> {
        let path = format!("/v1/admin/cells/{}/promote", encode(cell));
        let body = self.post(&path, &Value::Object(Default::default()))?;
        serde_json::from_str(&body)
            .map_err(|_| ClientError::UnexpectedReply { request: format!("POST {path}"), body })
    }

    /// `GET /v1/admin/webhooks/dead?limit=N`: the node's dead letters, newest first.
    pub fn dead_letters(
        &self,
        limit: usize,
    ) -> Result<crate::protocol::DeadLettersReply, ClientError> {
        let path = format!("/v1/admin/webhooks/dead?limit={limit}");
        let body = self.get(&path)?;
        serde_json::from_str(&body)
            .map_err(|_| ClientError::UnexpectedReply { request: format!("GET {path}"), body })
    }

    /// `POST /v1/admin/webhooks/dead/{id}/replay`: one attempt of dead letter `id` now;
    /// an error (502 `replay_failed`) when it was not delivered.
    pub fn replay_dead_letter(
        &self,
        id: &str,
    ) -> Result<crate::protocol::ReplayReply, ClientError> {
        let path = format!("/v1/admin/webhooks/dead/{}/replay", encode(id));
        let body = self.post(&path, &Value::Object(Default::default()))?;
        serde_json::from_str(&body)
            .map_err(|_| ClientError::UnexpectedReply { request: format!("POST {path}"), body })
    }

    /// `DELETE /v1/admin/webhooks/dead/{id}`, or every dead letter without an id: the
    /// server's reply (`{"deleted":N}`).
    pub fn delete_dead_letters(&self, id: Option<&str>) -> Result<String, ClientError> {
        let path = match id {
            Some(id) => format!("/v1/admin/webhooks/dead/{}", encode(id)),
            None => "/v1/admin/webhooks/dead".to_string(),
        };
        let request = self
            .agent
            .delete(&format!("{}{path}", self.base))
            .set("Authorization", &format!("Bearer {}", self.key));
        self.reply("DELETE", &path, request.call())
    }

    /// `GET /v1/rooms/{room}/state`: the server's reply (room, epoch, seq, data).
    pub fn room_state(&self, room: &str) -> Result<String, ClientError> {
        self.get(&format!("/v1/rooms/{}/state", encode(room)))
    }

    /// `GET /v1/rooms/{room}/presence`: the server's reply (room, count, members).
    pub fn room_presence(&self, room: &str) -> Result<String, ClientError> {
        self.get(&format!("/v1/rooms/{}/presence", encode(room)))
    }

    /// `POST /v1/rooms/{room}/events`: the server's reply (room, seq, epoch, duplicate).
    pub fn publish(
        &self,
        room: &str,
        id: Option<String>,
        data: Value,
    ) -> Result<String, ClientError> {
        let mut body = serde_json::Map::new();
        if let Some(id) = id {
            body.insert("id".into(), id.into());
        }
        body.insert("data".into(), data);
        self.post(&format!("/v1/rooms/{}/events", encode(room)), &Value::Object(body))
    }
}

/// The address a client connects to for a listen address: loopback for "any".
fn connect_address(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port())
        }
        _ => listen,
    }
}

/// `--url`: `http://host:port` (a bare `host:port` is taken as http); no TLS in this build.
fn normalize_url(url: &str) -> Result<String, ClientError> {
    let url = url.trim();
    let rest = match url.split_once("://") {
        None => url.trim_end_matches('/'),
        Some(("http", rest)) => rest.trim_end_matches('/'),
        Some((scheme, _)) => {
            return Err(ClientError::Usage(format!(
                "--url: only http:// URLs are supported, got a {scheme}:// URL"
            )))
        }
    };
    if rest.is_empty() || rest.contains('/') {
        return Err(ClientError::Usage(format!("--url: expected http://HOST:PORT, got {url:?}")));
    }
    Ok(format!("http://{rest}"))
}

/// The server's JSON error body: `{"error":{"code":"...","message":"..."}}`.
#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    #[serde(default)]
    message: String,
}

/// The error code of a non-2xx reply's body (`resume_invalid`), when it has one.
pub(super) fn error_code(body: &str) -> Option<String> {
    serde_json::from_str::<ErrorBody>(body).ok().map(|b| b.error.code)
}

/// One line for a non-2xx reply: `401 unauthorized: invalid API key`.
pub(super) fn status_error(status: u16, body: &str) -> String {
    let mut line = match serde_json::from_str::<ErrorBody>(body) {
        Ok(ErrorBody { error }) if error.message.is_empty() => {
            format!("server answered {status} {}", error.code)
        }
        Ok(ErrorBody { error }) => {
            format!("server answered {status} {}: {}", error.code, error.message)
        }
        Err(_) => {
            let text: String =
                body.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(200).collect();
            if text.is_empty() {
                format!("server answered {status}")
            } else {
                format!("server answered {status}: {text}")
            }
        }
    };
    if status == 401 {
        line.push_str(" (the API key must match the server's: --api-key, LIVEGATE_API_KEY or DATA_DIR/api_key)");
    }
    line
}

/// The most specific cause ureq gives ("Connection refused (os error 111)").
pub(super) fn transport_reason(transport: &ureq::Transport) -> String {
    match (std::error::Error::source(transport), transport.message()) {
        (Some(source), _) => source.to_string(),
        (None, Some(message)) => format!("{}: {message}", transport.kind()),
        (None, None) => transport.kind().to_string(),
    }
}

/// Bytes that are percent-encoded: all but `[A-Za-z0-9_.:~-]`.
const ENCODED: &AsciiSet =
    &NON_ALPHANUMERIC.remove(b'_').remove(b'.').remove(b':').remove(b'~').remove(b'-');

/// Percent-encodes a path segment or query value.
pub(super) fn encode(text: &str) -> String {
    utf8_percent_encode(text, ENCODED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let cases = [
            ("http://127.0.0.1:7070", Ok("http://127.0.0.1:7070")),
            ("http://127.0.0.1:7070/", Ok("http://127.0.0.1:7070")),
            ("localhost:7070", Ok("http://localhost:7070")),
            ("https://example.com", Err(())),
            ("http://host:1/v1", Err(())),
            ("http://", Err(())),
        ];
        for (input, want) in cases {
            let got = normalize_url(input).map_err(|_| ());
            assert_eq!(got.as_deref(), want.as_deref().map_err(|_| &()), "{input}");
        }
        assert_eq!(connect_address("0.0.0.0:7070".parse().unwrap()).to_string(), "127.0.0.1:7070");
        assert_eq!(connect_address("[::]:7070".parse().unwrap()).to_string(), "[::1]:7070");
        assert_eq!(connect_address("10.1.2.3:1".parse().unwrap()).to_string(), "10.1.2.3:1");
    }

    #[test]
    fn status_lines() {
        let cases = [
            (401, r#"{"error":{"code":"unauthorized","message":"bad key"}}"#,
                "server answered 401 unauthorized: bad key (the API key must match the server's: --api-key, LIVEGATE_API_KEY or DATA_DIR/api_key)"),
            (404, r#"{"error":{"code":"not_found"}}"#, "server answered 404 not_found"),
            (502, "<html>\n bad gateway </html>", "server answered 502: <html> bad gateway </html>"),
            (500, "", "server answered 500"),
        ];
        for (status, body, want) in cases {
            assert_eq!(status_error(status, body), want);
        }
        assert_eq!(
            error_code(r#"{"error":{"code":"resume_invalid","message":"spent"}}"#).as_deref(),
            Some("resume_invalid")
        );
        assert_eq!(error_code("<html>"), None);
    }

    #[test]
    fn encoding() {
        assert_eq!(encode("match:1"), "match:1");
        assert_eq!(encode("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(encode("_.~-é+%"), "_.~-%C3%A9%2B%25");
    }
}
