//! The codes livegate answers with: the WebSocket close codes (with what each means to a
//! client) and the error codes of `error` frames and HTTP error bodies (with their HTTP
//! status).

/// The WebSocket close codes livegate sends (and no other: a code it never sends is not
/// listed here but in [`OTHER_CLOSE_CODES`]), with what each means to a client: 4000–4499
/// ask it to reconnect, 4500–4999 not to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseCode {
    Normal,
    ProtocolError,
    InvalidPayload,
    Policy,
    TooBig,
    ServiceRestart,
    HeartbeatTimeout,
    SlowConsumer,
    MigrationBudget,
    /// The session is served by another node: reconnect to the URL in the reason.
    WrongNode,
    Replaced,
    Kicked,
}

impl CloseCode {
    pub const ALL: [CloseCode; 12] = [
        CloseCode::Normal,
        CloseCode::ProtocolError,
        CloseCode::InvalidPayload,
        CloseCode::Policy,
        CloseCode::TooBig,
        CloseCode::ServiceRestart,
        CloseCode::HeartbeatTimeout,
        CloseCode::SlowConsumer,
        CloseCode::MigrationBudget,
        CloseCode::WrongNode,
        CloseCode::Replaced,
        CloseCode::Kicked,
    ];

    pub const fn code(self) -> u16 {
        match self {
            CloseCode::Normal => 1000,
            CloseCode::ProtocolError => 1002,
            CloseCode::InvalidPayload => 1007,
            CloseCode::Policy => 1008,
            CloseCode::TooBig => 1009,
            CloseCode::ServiceRestart => 1012,
            CloseCode::HeartbeatTimeout => 4008,
            CloseCode::SlowConsumer => 4009,
            CloseCode::MigrationBudget => 4029,
            CloseCode::WrongNode => 4421,
            CloseCode::Replaced => 4501,
            CloseCode::Kicked => 4502,
        }
    }

    /// Whether a client should reconnect after this close: every code but 4500–4999
    /// (the rule `close_meaning` and the client library follow).
    pub const fn reconnect(self) -> bool {
        !matches!(self.code(), 4500..=4999)
    }

    pub fn from_code(code: u16) -> Option<CloseCode> {
        CloseCode::ALL.into_iter().find(|c| c.code() == code)
    }

    pub const fn meaning(self) -> &'static str {
        match self {
            CloseCode::Normal => "normal close",
            CloseCode::ProtocolError => "WebSocket protocol error",
            CloseCode::InvalidPayload => "text is not valid UTF-8",
            CloseCode::Policy => "protocol violation",
            CloseCode::TooBig => "frame too big",
            CloseCode::ServiceRestart => "server restarting",
            CloseCode::HeartbeatTimeout => "heartbeat timeout",
            CloseCode::SlowConsumer => "too slow reading events",
            CloseCode::MigrationBudget => "migration budget spent",
            CloseCode::WrongNode => "served by another node: reconnect to the URL in the reason",
            CloseCode::Replaced => "replaced by a newer connection of the same user and device",
            CloseCode::Kicked => "kicked by an operator",
        }
    }
}

impl CloseCode {
    /// When the server sends the code and what its reason carries, beyond [`CloseCode::meaning`];
    /// empty when the meaning says it all.
    pub const fn detail(self) -> &'static str {
        match self {
            CloseCode::Policy => "Too many refused messages (max_bad_messages a minute), or no subscribe within subscribe_timeout_secs.",
            CloseCode::TooBig => "A frame over max_frame_bytes or a message over max_message_bytes.",
            CloseCode::ServiceRestart => "The node is draining, or a promotion moved a room of the connection to another cell (the reason names both): reconnect now (after the delay the reason suggests, if any) and resume with `since`; a moved room answers `recovered:false` (a new epoch).",
            CloseCode::HeartbeatTimeout => "Nothing (frames, pings or pongs) arrived from the client for three heartbeat_secs intervals.",
            CloseCode::SlowConsumer => "More than max_outbox_bytes waited for the connection for longer than the grace.",
            CloseCode::MigrationBudget => "The reason is the seconds to wait before reconnecting.",
            CloseCode::WrongNode => "The reason is the URL of the node that serves the session: connect there with the same credential. After a welcome: a rebalance handed the session over, or another session of the user moved to that node and this one follows it.",
            CloseCode::Replaced => "Only for exclusive_devices: a newer connection of the user on the same device kind.",
            CloseCode::Kicked => "`DELETE /v1/users/{user}/connections`; the credentials issued to the user before it are void.",
            _ => "",
        }
    }
}

impl CloseCode {
    /// What a client does after the close (the client library does it).
    pub const fn advice(self) -> &'static str {
        match self {
            CloseCode::Normal => "Nothing: the client closed, the server answered.",
            CloseCode::ProtocolError | CloseCode::InvalidPayload => "A client bug: fix the client.",
            CloseCode::Policy => "Read the error frames sent before the close.",
            CloseCode::TooBig => "Send smaller messages.",
            CloseCode::ServiceRestart => "Reconnect after the suggested delay (or a random 0–3 s) with the resume credential, and resubscribe with `since` and `epoch`: nothing is lost (see [Operations](../operations.md#what-clients-must-do)).",
            CloseCode::HeartbeatTimeout => "Answer pings; a proxy's read timeout must be longer than heartbeat_secs.",
            CloseCode::SlowConsumer => "The client reads too slowly (a background tab, a slow network); it reconnects and recovers (see [Slow consumers](../operations.md#slow-consumers)).",
            CloseCode::MigrationBudget => "Wait that many seconds, then reconnect.",
            CloseCode::WrongNode => "Connect to that URL with the same credential.",
            CloseCode::Replaced => "Do not reconnect: the newer connection wins (two tabs with device `phone` replace each other; use `web` for tabs).",
            CloseCode::Kicked => "Do not reconnect with the old credentials.",
        }
    }
}

/// Codes livegate never sends that a client still sees, with what they mean and what the
/// client does: from a proxy or load balancer in front of livegate, or from the client's
/// own WebSocket when the connection dropped.
pub const OTHER_CLOSE_CODES: [(u16, &str, &str); 2] = [
    (
        1001,
        "going away: a proxy or load balancer in front of livegate stopping (livegate itself sends 1012 when it stops)",
        "Reconnect as after 1012: after the suggested delay, if any, or a random 0–3 s.",
    ),
    (
        1006,
        "the connection dropped without a close frame (the network, a killed process); reported by the client's WebSocket, never sent",
        "Reconnect with backoff and resubscribe with `since` and `epoch`.",
    ),
];

/// What a close code received means, livegate's own or any other.
pub fn close_meaning(code: u16) -> &'static str {
    if let Some(known) = CloseCode::from_code(code) {
        return known.meaning();
    }
    if let Some((_, meaning, _)) = OTHER_CLOSE_CODES.iter().find(|(c, _, _)| *c == code) {
        return meaning;
    }
    match code {
        4000..=4499 => "reconnect",
        4500..=4999 => "do not reconnect",
        _ => "unknown code",
    }
}

/// Error codes sent in `error` frames and HTTP error bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadRequest,
    UnknownOp,
    BadRoom,
    Forbidden,
    TooManySubscriptions,
    PayloadTooLarge,
    Unauthorized,
    MissingToken,
    InvalidToken,
    TokenExpired,
    TokenReplayed,
    /// A resume credential that is malformed, spent, expired or revoked.
    ResumeInvalid,
    MigrationBudget,
    /// The session is served by another node, named with its URL (issue 30).
    WrongNode,
    NoAliveNode,
    NotFound,
    Unavailable,
    Internal,
    RateLimited,
    TooManyConnections,
    ForbiddenOrigin,
    DirectoryUnavailable,
    /// The room's namespace keeps no presence.
    PresenceOff,
    /// The request cannot be done in the cluster's present state (a rebalance towards a
    /// node that is not alive and taking connections, or a cluster-only admin request
    /// outside cluster mode).
    Conflict,
    /// A cell the configuration does not list (`cells`), named by a token's claim or a
    /// route question.
    UnknownCell,
    /// Cells with their own NATS: the room's home cell did not answer a publish.
    RoomHomeUnavailable,
    /// Cluster mode: no configured cell is healthy (each has no node that may serve, or
    /// its breaker is not closed); the message names the user's home cell.
    NoHealthyCell,
    /// No dead letter (a webhook given up) with this id on this node.
    DeadLetterNotFound,
    /// A dead letter's replay was not delivered: the receiver failed or refused it again;
    /// it stays in the list with the attempt counted.
    ReplayFailed,
    /// A replay while webhooks are off (`webhook_url` empty).
    WebhooksOff,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 30] = [
        ErrorCode::BadRequest,
        ErrorCode::UnknownOp,
        ErrorCode::BadRoom,
        ErrorCode::Forbidden,
        ErrorCode::TooManySubscriptions,
        ErrorCode::PayloadTooLarge,
        ErrorCode::Unauthorized,
        ErrorCode::MissingToken,
        ErrorCode::InvalidToken,
        ErrorCode::TokenExpired,
        ErrorCode::TokenReplayed,
        ErrorCode::ResumeInvalid,
        ErrorCode::MigrationBudget,
        ErrorCode::WrongNode,
        ErrorCode::NoAliveNode,
        ErrorCode::NotFound,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
        ErrorCode::RateLimited,
        ErrorCode::TooManyConnections,
        ErrorCode::ForbiddenOrigin,
        ErrorCode::DirectoryUnavailable,
        ErrorCode::PresenceOff,
        ErrorCode::Conflict,
        ErrorCode::UnknownCell,
        ErrorCode::RoomHomeUnavailable,
        ErrorCode::NoHealthyCell,
        ErrorCode::DeadLetterNotFound,
        ErrorCode::ReplayFailed,
        ErrorCode::WebhooksOff,
    ];

    /// What the code tells a client or backend, in one line (the reference's text).
    pub const fn meaning(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "The request is malformed: not JSON, a field missing or of the wrong type, or a value out of range (such as a history limit above max_history_limit).",
            ErrorCode::UnknownOp => "A WebSocket message names an op the server does not know.",
            ErrorCode::BadRoom => "The room name is not valid (`[A-Za-z0-9_.:-]{1,128}`, an inbox `user:<id>`), or names a room the request does not apply to.",
            ErrorCode::Forbidden => "The connection's token does not allow this room: it is outside the token's `rooms` (read) or `publish` patterns.",
            ErrorCode::TooManySubscriptions => "The connection already holds max_subscriptions rooms.",
            ErrorCode::PayloadTooLarge => "Event data over max_event_bytes, or a state over max_state_bytes.",
            ErrorCode::Unauthorized => "The API key is missing or wrong (`Authorization: Bearer KEY`).",
            ErrorCode::MissingToken => "A WebSocket or SSE handshake without a token or resume credential.",
            ErrorCode::InvalidToken => "The token is malformed, not signed by this cluster, or was minted before a kick of its user: mint a new one.",
            ErrorCode::TokenExpired => "The token's lifetime has passed: mint a new one.",
            ErrorCode::TokenReplayed => "The token was already used for a connection (tokens are good for one): mint a new one.",
            ErrorCode::ResumeInvalid => "The resume credential is malformed, spent, expired or voided by a kick: connect with a new token.",
            ErrorCode::MigrationBudget => "The user's sessions already changed node within migration_window_secs: retry after the seconds the answer names, with the same credential.",
            ErrorCode::WrongNode => "The session is served by another node: connect to the URL the answer names, with the same credential.",
            ErrorCode::NoAliveNode => "No node is alive to serve the session (`GET /v1/route`).",
            ErrorCode::NotFound => "No such route, or the thing asked for is off (the echo socket, the demo).",
            ErrorCode::Unavailable => "The node cannot do it now (starting, draining, or its store or the cluster failed): retry, on another node if it is draining.",
            ErrorCode::Internal => "An unexpected server error; the server's log says more.",
            ErrorCode::RateLimited => "Over a rate: handshakes per IP, messages per connection or room starts per connection; slow down.",
            ErrorCode::TooManyConnections => "The node holds max_connections connections (503), or the client's address holds max_connections_per_ip (429).",
            ErrorCode::ForbiddenOrigin => "The browser's `Origin` is not one of allowed_origins.",
            ErrorCode::DirectoryUnavailable => "Cluster mode: the session directory (NATS) has been unreachable for directory_outage_secs; retry with the same credential.",
            ErrorCode::PresenceOff => "The room keeps no presence: an inbox, or a room whose namespace sets `presence = false`.",
            ErrorCode::Conflict => "Not possible in the cluster's present state: a rebalance towards a node that is not alive and taking connections, or a cluster-only admin request (rebalance, cells) outside cluster mode.",
            ErrorCode::UnknownCell => "The `cell` of a token request or a route question is not one of the configured cells (`cells`).",
            ErrorCode::RoomHomeUnavailable => "Cells with their own NATS (cluster_cell_domains): the room is homed in another cell (named in the message), which did not answer within a second; nothing was written. Retry with the same id.",
            ErrorCode::NoHealthyCell => "Cluster mode: no configured cell is healthy (none has a node that may serve, or its breaker is open): `GET /v1/route` and new sessions are refused until one is; the message names the user's home cell.",
            ErrorCode::DeadLetterNotFound => "No dead letter with this id on this node (`GET /v1/admin/webhooks/dead` lists them): replayed, deleted, or dropped for newer ones.",
            ErrorCode::ReplayFailed => "A dead letter's replay was not delivered: the receiver failed or refused it again (the message says how). It stays in the list, its attempts counted.",
            ErrorCode::WebhooksOff => "Webhooks are off (webhook_url is empty), so a dead letter cannot be replayed; it can still be listed and deleted.",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::BadRoom => "bad_room",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::TooManySubscriptions => "too_many_subscriptions",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::MissingToken => "missing_token",
            ErrorCode::InvalidToken => "invalid_token",
            ErrorCode::TokenExpired => "token_expired",
            ErrorCode::TokenReplayed => "token_replayed",
            ErrorCode::ResumeInvalid => "resume_invalid",
            ErrorCode::MigrationBudget => "migration_budget",
            ErrorCode::WrongNode => "wrong_node",
            ErrorCode::NoAliveNode => "no_alive_node",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::ForbiddenOrigin => "forbidden_origin",
            ErrorCode::DirectoryUnavailable => "directory_unavailable",
            ErrorCode::PresenceOff => "presence_off",
            ErrorCode::Conflict => "conflict",
            ErrorCode::UnknownCell => "unknown_cell",
            ErrorCode::RoomHomeUnavailable => "room_home_unavailable",
            ErrorCode::NoHealthyCell => "no_healthy_cell",
            ErrorCode::DeadLetterNotFound => "dead_letter_not_found",
            ErrorCode::ReplayFailed => "replay_failed",
            ErrorCode::WebhooksOff => "webhooks_off",
        }
    }

    /// The HTTP status an error answer with this code has (codes only sent in `error`
    /// frames have one too, so the table is total). One exception is made by the handler:
    /// `too_many_connections` for one address is 429 (see `http::handshake::admit`).
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest
            | ErrorCode::UnknownOp
            | ErrorCode::BadRoom
            | ErrorCode::UnknownCell => 400,
            ErrorCode::Unauthorized
            | ErrorCode::MissingToken
            | ErrorCode::InvalidToken
            | ErrorCode::TokenExpired
            | ErrorCode::TokenReplayed
            | ErrorCode::ResumeInvalid => 401,
            ErrorCode::Forbidden | ErrorCode::ForbiddenOrigin => 403,
            ErrorCode::NotFound | ErrorCode::PresenceOff | ErrorCode::DeadLetterNotFound => 404,
            ErrorCode::Conflict | ErrorCode::WebhooksOff => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::WrongNode => 421,
            ErrorCode::TooManySubscriptions
            | ErrorCode::MigrationBudget
            | ErrorCode::RateLimited => 429,
            ErrorCode::Internal => 500,
            ErrorCode::ReplayFailed => 502,
            ErrorCode::Unavailable
            | ErrorCode::NoAliveNode
            | ErrorCode::NoHealthyCell
            | ErrorCode::TooManyConnections
            | ErrorCode::DirectoryUnavailable
            | ErrorCode::RoomHomeUnavailable => 503,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_listed_once() {
        let names: std::collections::BTreeSet<&str> =
            ErrorCode::ALL.iter().map(|code| code.as_str()).collect();
        assert_eq!(names.len(), ErrorCode::ALL.len());
        let codes: std::collections::BTreeSet<u16> =
            CloseCode::ALL.iter().map(|code| code.code()).collect();
        assert_eq!(codes.len(), CloseCode::ALL.len());
        assert!(CloseCode::SlowConsumer.reconnect() && !CloseCode::Kicked.reconnect());
    }

    /// The statuses the HTTP API promises for its codes (docs/src/http-api.md).
    #[test]
    fn error_codes_carry_the_documented_status() {
        let documented = [
            (ErrorCode::BadRequest, 400),
            (ErrorCode::BadRoom, 400),
            (ErrorCode::UnknownCell, 400),
            (ErrorCode::Unauthorized, 401),
            (ErrorCode::MissingToken, 401),
            (ErrorCode::InvalidToken, 401),
            (ErrorCode::TokenExpired, 401),
            (ErrorCode::TokenReplayed, 401),
            (ErrorCode::ResumeInvalid, 401),
            (ErrorCode::ForbiddenOrigin, 403),
            (ErrorCode::NotFound, 404),
            (ErrorCode::PresenceOff, 404),
            (ErrorCode::Conflict, 409),
            (ErrorCode::PayloadTooLarge, 413),
            (ErrorCode::MigrationBudget, 429),
            (ErrorCode::RateLimited, 429),
            (ErrorCode::Internal, 500),
            (ErrorCode::DeadLetterNotFound, 404),
            (ErrorCode::WebhooksOff, 409),
            (ErrorCode::ReplayFailed, 502),
            (ErrorCode::Unavailable, 503),
            (ErrorCode::NoAliveNode, 503),
            (ErrorCode::NoHealthyCell, 503),
            (ErrorCode::TooManyConnections, 503),
            (ErrorCode::DirectoryUnavailable, 503),
        ];
        for (code, status) in documented {
            assert_eq!(code.http_status(), status, "{}", code.as_str());
        }
    }
}
