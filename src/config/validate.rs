//! Validation: every value checked once at start against the one table of bounds
//! ([`BOUNDS`]) and the rules of names, cells, NATS logins, JWT keys and webhooks.

use super::*;

/// Shortest `cluster_token_secret`.
pub const TOKEN_SECRET_MIN_CHARS: usize = 32;

/// Most cells `cells` may list.
pub const MAX_CELLS: usize = 64;

impl Config {
    /// Checks every value; the first problem found is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        within(&[
            bounded("batch_window_ms", self.batch_window_ms),
            bounded("heartbeat_secs", self.heartbeat_secs),
            bounded("history_size", self.history_size as u64),
            bounded("recovery_max_events", self.recovery_max_events),
            bounded("room_idle_secs", self.room_idle_secs),
            bounded("session_ttl_secs", self.session_ttl_secs),
            bounded("session_cache_max", self.session_cache_max as u64),
            bounded("store_cache_mb", self.store_cache_mb),
        ])?;
        if let Some(block) = self
            .trusted_proxies
            .iter()
            .find(|b| b.parse::<crate::core::rules::proxies::Cidr>().is_err())
        {
            let problem = format!(
                "entries are addresses or blocks such as 10.0.0.0/8 or ::1/128, got {block:?}"
            );
            return Err(invalid("trusted_proxies", problem));
        }
        within(&[
            bounded("max_event_bytes", self.max_event_bytes as u64),
            bounded("max_state_bytes", self.max_state_bytes as u64),
            bounded("max_subscriptions", self.max_subscriptions as u64),
            bounded("token_ttl_max_secs", self.token_ttl_max_secs),
            bounded("resume_ttl_secs", self.resume_ttl_secs),
            bounded("max_outbox_bytes", self.max_outbox_bytes as u64),
        ])?;
        name_rule("node", "must", &self.node)?;
        if let Some(chars) =
            self.api_key.as_ref().map(|key| key.chars().count()).filter(|&n| n < API_KEY_MIN_CHARS)
        {
            // Never echo the key itself.
            return Err(invalid(
                "api_key",
                format!("must be at least {API_KEY_MIN_CHARS} characters long, got {chars}"),
            ));
        }
        name_rule("cell", "must", &self.cell)?;
        if !self.release.is_empty() {
            name_rule("release", "must", &self.release)?;
        }
        self.validate_cells()?;
        within(&[
            bounded("probe_interval_ms", self.probe_interval_ms),
            bounded("max_frame_bytes", self.max_frame_bytes as u64),
            bounded("max_message_bytes", self.max_message_bytes as u64),
            bounded("max_history_limit", self.max_history_limit as u64),
            bounded("handshake_timeout_ms", self.handshake_timeout_ms),
            bounded("max_http_connections", self.max_http_connections as u64),
            bounded("presence_interval_ms", self.presence_interval_ms),
            bounded("presence_members_max", self.presence_members_max as u64),
        ])?;
        if self.previous_api_keys.iter().any(|key| key.chars().count() < API_KEY_MIN_CHARS) {
            // Never echo a key.
            return Err(invalid(
                "previous_api_keys",
                format!("entries must be at least {API_KEY_MIN_CHARS} characters long"),
            ));
        }
        if let Some(problem) = self
            .allowed_origins
            .iter()
            .find_map(|o| crate::core::rules::origins::check_entry(o).err())
        {
            return Err(invalid("allowed_origins", problem.to_string()));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(invalid("tls_cert", "and tls_key must be set together".to_string()));
        }
        within(&[
            bounded("probe_up_after", self.probe_up_after),
            bounded("placement_high_water_percent", self.placement_high_water_percent),
            bounded("cluster_heartbeat_ms", self.cluster_heartbeat_ms),
        ])?;
        if let Some(replicas) = self.cluster_replicas.filter(|r| !CLUSTER_REPLICAS.contains(r)) {
            return Err(invalid("cluster_replicas", format!("must be 1 or 3, got {replicas}")));
        }
        if let Some(urls) = &self.cluster_nats_url {
            let seeds = nats_seeds(urls);
            let bad = |url: &&str| {
                let bare = url.strip_prefix("nats://").or_else(|| url.strip_prefix("tls://"));
                bare.is_none_or(|rest| rest.is_empty() || rest.contains('/'))
            };
            if seeds.is_empty() || seeds.iter().any(bad) {
                // Not echoed: the URLs may carry credentials.
                return Err(invalid(
                    "cluster_nats_url",
                    "must be nats://HOST:PORT or tls://HOST:PORT, or several of them separated by commas".to_string(),
                ));
            }
            if seeds.iter().any(|url| url.contains('@')) {
                // Not echoed, and refused: the NATS client ignores a URL's userinfo.
                return Err(invalid(
                    "cluster_nats_url",
                    "must not carry credentials (USER:PASSWORD@): set cluster_nats_user and cluster_nats_password, or cluster_nats_token".to_string(),
                ));
            }
            if !self.peers.is_empty() {
                return Err(invalid(
                    "peers",
                    "must be empty in cluster mode: nodes find each other by heartbeats"
                        .to_string(),
                ));
            }
        }
        self.validate_nats_login()?;
        self.validate_cell_domains()?;
        self.check_home_cells()?;
        if self.peer_nodes()?.iter().any(|peer| peer.name == self.node) {
            return Err(invalid("peers", format!("lists this node ({}) itself", self.node)));
        }
        self.exclusive_devices
            .iter()
            .try_for_each(|device| name_rule("exclusive_devices", "entries must", device))?;
        self.validate_webhooks()?;
        self.validate_jwt()?;
        namespaces::check(&self.namespaces)
    }

    /// `cells`: names, no duplicate, at most [`MAX_CELLS`], this node's `cell` and every
    /// peer's among them.
    fn validate_cells(&self) -> Result<(), ConfigError> {
        if self.cells.is_empty() {
            return Ok(());
        }
        if let Some(bad) = self.cells.iter().find(|cell| !is_plain_name(cell, MAX_NODE_NAME_LEN)) {
            return Err(invalid("cells", format!("entries must be 1 to {MAX_NODE_NAME_LEN} characters from A-Z a-z 0-9 _ . -, got {bad:?}")));
        }
        if self.cells.len() > MAX_CELLS {
            return Err(invalid(
                "cells",
                format!("may list at most {MAX_CELLS} cells, got {}", self.cells.len()),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = self.cells.iter().find(|cell| !seen.insert(cell.as_str())) {
            return Err(invalid("cells", format!("lists {twice:?} twice")));
        }
        if !self.cells.contains(&self.cell) {
            return Err(invalid(
                "cells",
                format!(
                    "must list this node's cell {:?} (cell), got {}",
                    self.cell,
                    self.cells.join(",")
                ),
            ));
        }
        let peers = self.peer_nodes()?;
        if let Some(peer) = peers.iter().find(|peer| !self.cells.contains(&peer.cell)) {
            return Err(invalid(
                "cells",
                format!(
                    "must list peer {}'s cell {:?}, got {}",
                    peer.name,
                    peer.cell,
                    self.cells.join(",")
                ),
            ));
        }
        Ok(())
    }

    /// The NATS login keys: a user with its password, or a token, and only in cluster mode.
    /// Values are never echoed.
    fn validate_nats_login(&self) -> Result<(), ConfigError> {
        let login = [
            ("cluster_nats_user", &self.cluster_nats_user),
            ("cluster_nats_password", &self.cluster_nats_password),
            ("cluster_nats_token", &self.cluster_nats_token),
        ];
        if let Some(&(key, _)) =
            login.iter().find(|(_, value)| value.as_ref().is_some_and(|v| v.is_empty()))
        {
            return Err(invalid(key, "must not be empty".to_string()));
        }
        if let Some(&(key, _)) = login
            .iter()
            .find(|(_, value)| value.is_some())
            .filter(|_| self.cluster_nats_url.is_none())
        {
            return Err(invalid(
                key,
                "needs cluster_nats_url: only cluster mode logs in to NATS".to_string(),
            ));
        }
        if self.cluster_nats_user.is_some() != self.cluster_nats_password.is_some() {
            return Err(invalid(
                "cluster_nats_user",
                "and cluster_nats_password must be set together".to_string(),
            ));
        }
        if self.cluster_nats_token.is_some() && self.cluster_nats_user.is_some() {
            return Err(invalid(
                "cluster_nats_token",
                "and cluster_nats_user are two ways to log in: set one".to_string(),
            ));
        }
        Ok(())
    }

    /// `cluster_cell_domains` needs cluster mode, a `cells` list of domain names and a
    /// shared `cluster_token_secret`; the secret is never echoed.
    fn validate_cell_domains(&self) -> Result<(), ConfigError> {
        if let Some(chars) = self
            .cluster_token_secret
            .as_ref()
            .map(|s| s.chars().count())
            .filter(|&n| n < TOKEN_SECRET_MIN_CHARS)
        {
            return Err(invalid(
                "cluster_token_secret",
                format!("must be at least {TOKEN_SECRET_MIN_CHARS} characters long, got {chars}"),
            ));
        }
        if self.cluster_token_secret.is_some() && self.cluster_nats_url.is_none() {
            return Err(invalid(
                "cluster_token_secret",
                "needs cluster_nats_url: a single node keeps its key in its store".to_string(),
            ));
        }
        if !self.cluster_cell_domains {
            return Ok(());
        }
        if self.cluster_nats_url.is_none() {
            return Err(invalid(
                "cluster_cell_domains",
                "needs cluster_nats_url: cells are a cluster's".to_string(),
            ));
        }
        if self.cells.is_empty() {
            return Err(invalid(
                "cluster_cell_domains",
                "needs cells: every node must know every cell, whose NATS it reads rooms from"
                    .to_string(),
            ));
        }
        if let Some(bad) = self.cells.iter().find(|cell| cell.contains('.')) {
            return Err(invalid(
                "cells",
                format!(
                    "entries name JetStream domains with cluster_cell_domains: no '.', got {bad:?}"
                ),
            ));
        }
        if self.cluster_token_secret.is_none() {
            return Err(invalid(
                "cluster_token_secret",
                "must be set with cluster_cell_domains: each cell's NATS is separate, and a token minted in one cell must open a connection in every cell".to_string(),
            ));
        }
        Ok(())
    }

    /// The JWT keys' settings; the key files themselves are read at start (`http::jwt`).
    fn validate_jwt(&self) -> Result<(), ConfigError> {
        if let Some(bytes) = self
            .jwt_hmac_secret
            .as_ref()
            .map(String::len)
            .filter(|&n| n < crate::core::credentials::jwt::HMAC_SECRET_MIN_BYTES)
        {
            // Never echo the secret.
            let min = crate::core::credentials::jwt::HMAC_SECRET_MIN_BYTES;
            return Err(invalid("jwt_hmac_secret", format!("must be at least {min} bytes long (HS256 needs a key as long as its hash), got {bytes}")));
        }
        for (key, value) in [("jwt_issuer", &self.jwt_issuer), ("jwt_audience", &self.jwt_audience)]
        {
            if value.as_deref() == Some("") {
                return Err(invalid(key, "must not be empty when set".to_string()));
            }
        }
        Ok(())
    }

    fn validate_webhooks(&self) -> Result<(), ConfigError> {
        within(&[
            bounded("webhook_queue_max", self.webhook_queue_max as u64),
            bounded("webhook_timeout_ms", self.webhook_timeout_ms),
            bounded("webhook_vacated_delay_ms", self.webhook_vacated_delay_ms),
            bounded("webhook_max_attempts", self.webhook_max_attempts),
            bounded("webhook_retry_first_ms", self.webhook_retry_first_ms),
            bounded("webhook_retry_max_ms", self.webhook_retry_max_ms),
            bounded("webhook_dead_letters_max", self.webhook_dead_letters_max as u64),
        ])?;

        if !self.webhooks_enabled() {
            return Ok(());
        }
        let url = &self.webhook_url;
        let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        if rest.is_none_or(|rest| {
            rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace)
        }) {
            // Not echoed: the URL may carry a token.
            return Err(invalid("webhook_url", "must be an http:// or https:// URL with a host, such as https://backend.example/hooks".to_string()));
        }
        if self.webhook_secret.is_empty() {
            return Err(invalid(
                "webhook_secret",
                "must be set when webhook_url is: every webhook is signed with it".to_string(),
            ));
        }
        Ok(())
    }
}

/// An upper bound with its note for messages (" (16 MiB)"), if any.
pub type UpperBound<'a> = Option<(u64, &'a str)>;

/// The numeric keys' bounds: key, least value, and the largest with its note for
/// messages (" (16 MiB)"), if any. [`Config::validate`] checks them (and the namespaces'
/// overrides of the same keys) and the reference (`livegate reference config`) prints
/// them, so this table is the one place a bound is written.
pub const BOUNDS: &[(&str, u64, UpperBound<'static>)] = &[
    ("batch_window_ms", 0, Some((10_000, " (10 seconds)"))),
    ("heartbeat_secs", 1, None),
    ("history_size", 1, Some((1_000_000, ""))),
    ("store_cache_mb", 1, Some((1 << 20, " (1 TiB)"))),
    ("room_idle_secs", 1, None),
    ("recovery_max_events", 1, None),
    ("max_event_bytes", 16, Some((16 << 20, " (16 MiB)"))),
    ("max_state_bytes", 16, Some((16 << 20, " (16 MiB)"))),
    ("max_subscriptions", 1, None),
    ("resume_ttl_secs", 1, None),
    ("token_ttl_max_secs", 1, None),
    ("session_ttl_secs", 1, None),
    ("session_cache_max", 1, None),
    ("max_outbox_bytes", 4096, None),
    ("probe_interval_ms", 50, None),
    ("probe_up_after", 1, None),
    ("placement_high_water_percent", 0, Some((100, ""))),
    ("max_frame_bytes", 1024, Some((64 << 20, " (64 MiB)"))),
    ("max_message_bytes", 1024, Some((64 << 20, " (64 MiB)"))),
    ("max_http_connections", 1, None),
    ("max_history_limit", 1, None),
    ("presence_interval_ms", 50, Some((60_000, " (1 minute)"))),
    ("presence_members_max", 0, Some((PRESENCE_MEMBERS_MAX, ""))),
    ("handshake_timeout_ms", 100, None),
    ("cluster_heartbeat_ms", 50, None),
    ("webhook_queue_max", 1, Some((10_000_000, ""))),
    ("webhook_timeout_ms", 100, Some((600_000, " (10 minutes)"))),
    ("webhook_vacated_delay_ms", 0, Some((600_000, " (10 minutes)"))),
    ("webhook_max_attempts", 1, Some((1000, ""))),
    ("webhook_retry_first_ms", 1, Some((3_600_000, " (1 hour)"))),
    ("webhook_retry_max_ms", 1, Some((86_400_000, " (1 day)"))),
    ("webhook_dead_letters_max", 1, Some((1_000_000, ""))),
];

/// The bounds of `key` in [`BOUNDS`], if it has any.
pub fn bounds_of(key: &str) -> Option<(u64, UpperBound<'static>)> {
    BOUNDS.iter().find(|(k, ..)| *k == key).map(|&(_, min, max)| (min, max))
}

/// `(key, value, min, max)` for [`within`], the bounds from [`BOUNDS`].
fn bounded(key: &'static str, value: u64) -> (&'static str, u64, u64, UpperBound<'static>) {
    let (min, max) = bounds_of(key).unwrap_or_else(|| panic!("{key} has no entry in BOUNDS"));
    (key, value, min, max)
}

/// What is wrong with `value` against `min` and `max` ("must be at least 1, got 0").
pub(super) fn bound_problem(value: u64, min: u64, max: UpperBound<'_>) -> Option<String> {
    if value < min {
        return Some(format!("must be at least {min}, got {value}"));
    }
    max.filter(|&(max, _)| value > max)
        .map(|(max, note)| format!("must be at most {max}{note}, got {value}"))
}

/// Each `(key, value, min, max)`: `value` is at least `min` and, when there is a `max`,
/// at most that (with its note for the message, such as " (16 MiB)").
fn within(bounds: &[(&'static str, u64, u64, Option<(u64, &str)>)]) -> Result<(), ConfigError> {
    for &(key, value, min, max) in bounds {
        if let Some(problem) = bound_problem(value, min, max) {
            return Err(invalid(key, problem));
        }
    }
    Ok(())
}

/// The keys whose values (or, for lists, entries) are names: key and longest name.
pub(super) const NAME_KEYS: &[(&str, usize)] = &[
    ("node", MAX_NODE_NAME_LEN),
    ("release", MAX_NODE_NAME_LEN),
    ("cell", MAX_NODE_NAME_LEN),
    ("exclusive_devices", MAX_DEVICE_LEN),
];

/// The replica counts `cluster_replicas` may ask for.
const CLUSTER_REPLICAS: [u64; 2] = [1, 3];

/// The rule of a key that is not a number in a range ([`BOUNDS`]), as the reference
/// states it: names ([`NAME_KEYS`]), API keys ([`API_KEY_MIN_CHARS`]), replicas.
pub(super) fn rule_of(key: &str) -> Option<String> {
    if let Some(&(_, max)) = NAME_KEYS.iter().find(|(k, _)| *k == key) {
        let each = if key == "exclusive_devices" { "each " } else { "" };
        return Some(format!("{each}1 to {max} characters from A-Z a-z 0-9 _ . -"));
    }
    match key {
        "api_key" => Some(format!("at least {API_KEY_MIN_CHARS} characters")),
        "previous_api_keys" => Some(format!("each at least {API_KEY_MIN_CHARS} characters")),
        "jwt_hmac_secret" => {
            Some(format!("at least {} bytes", crate::core::credentials::jwt::HMAC_SECRET_MIN_BYTES))
        }
        "cluster_replicas" => Some(format!("{} or {}", CLUSTER_REPLICAS[0], CLUSTER_REPLICAS[1])),
        "cells" => Some(format!(
            "at most {MAX_CELLS}, each a `cell` name, no duplicates, this node's `cell` among them"
        )),
        _ => None,
    }
}

/// `value` is a name of at most the key's length in [`NAME_KEYS`] (see [`is_plain_name`]);
/// `must` starts the problem.
fn name_rule(key: &'static str, must: &str, value: &str) -> Result<(), ConfigError> {
    let max = NAME_KEYS
        .iter()
        .find(|(k, _)| *k == key)
        .map_or_else(|| panic!("{key} is not in NAME_KEYS"), |&(_, max)| max);
    if is_plain_name(value, max) {
        return Ok(());
    }
    Err(invalid(
        key,
        format!("{must} be 1 to {max} characters from A-Z a-z 0-9 _ . -, got {value:?}"),
    ))
}
