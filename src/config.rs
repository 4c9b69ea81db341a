//! Typed configuration: defaults, then a TOML file, then `LIVEGATE_*` environment
//! variables, then command-line flags (later wins). Validated once at start and passed
//! explicitly; nothing else reads the environment.
//!
//! Each key is declared once, in the `config_keys!` list below: name, type, default, value
//! name, help and any details. The [`Config`] struct and its `Default`, the clap-derived
//! [`ConfigFlags`], [`KEYS`], [`KEY_DOCS`] (what `livegate reference config` prints) and
//! the by-name setter the layers use all come from that list; the numeric keys' bounds are
//! the one table [`BOUNDS`], which validation enforces and the reference prints. Flags and
//! variables stay text until [`Config::load`] parses them with the same rules as the file's
//! values, so whichever layer holds a bad value, the message names it (`--heartbeat-secs`,
//! `LIVEGATE_HEARTBEAT_SECS`, `heartbeat_secs in FILE`), and validation says which layer
//! set the value it refuses. Secrets (`api_key`, `previous_api_keys`) are never echoed.
//!
//! `value` holds how each type is written (text and TOML); `api_key` the key file that
//! `serve` generates under `data_dir` when no key is configured.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod api_key;
mod namespaces;
#[cfg(test)]
mod tests;
mod value;

pub use api_key::ResolvedApiKey;
pub use namespaces::{NamespaceTable, ROOM_KEYS};
use value::{parse, Raw};

use crate::core::rules::names::{is_plain_name, MAX_DEVICE_LEN, MAX_NODE_NAME_LEN};

/// The text `--help` shows after `[default: `: the default as written, unless given.
macro_rules! shown {
    ($default:expr) => {
        stringify!($default)
    };
    ($default:expr => $shown:literal) => {
        $shown
    };
}

/// Declares the keys (see the invocation below for the syntax).
macro_rules! config_keys {
    ($($name:ident: $ty:ty = $default:expr $(=> $shown:literal)?, $value_name:literal, $help:literal $(, $details:literal)?;)*) => {
        /// Every key of the configuration. Durations are whole numbers in the unit their name
        /// ends with; accessors such as [`Config::heartbeat`] give them as [`Duration`]s.
        #[derive(Debug, Clone, PartialEq, serde::Serialize)]
        pub struct Config {
            $(#[doc = $help] pub $name: $ty,)*
            /// `[[namespace]]` tables (config file only), in file order: per-prefix room options.
            #[serde(rename = "namespace", skip_serializing_if = "Vec::is_empty")]
            pub namespaces: Vec<NamespaceTable>,
        }

        impl Default for Config {
            fn default() -> Self {
                Config { $($name: $default,)* namespaces: Vec::new() }
            }
        }

        /// The configuration flags: `--config PATH` and one optional `--key-with-dashes VALUE`
        /// per key, kept as text for [`Config::load`]. The flags are global: they may come
        /// before or after a subcommand.
        #[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
        #[group(skip)]
        pub struct ConfigFlags {
            // `--config PATH` (when absent, `LIVEGATE_CONFIG` may name the file).
            #[arg(long, global = true, help_heading = HELP_HEADING, value_name = "PATH", help = "TOML file with configuration keys (also LIVEGATE_CONFIG)")]
            pub config: Option<PathBuf>,
            $(#[arg(long, global = true, help_heading = HELP_HEADING, value_name = $value_name,
                help = concat!($help, " [default: ", shown!($default $(=> $shown)?), "]"))]
            $name: Option<String>,)*
        }

        /// Every key's name, in [`Config`] field order.
        pub const KEYS: &[&str] = &[$(stringify!($name)),*];

        /// Every key as the reference describes it, in [`KEYS`] order.
        pub const KEY_DOCS: &[KeyDoc] = &[$(KeyDoc {
            name: stringify!($name),
            form: <$ty as value::Setting>::FORM,
            default: shown!($default $(=> $shown)?),
            value_name: $value_name,
            help: $help,
            details: concat!("" $(, $details)?),
        }),*];

        impl Config {
            /// Sets `key` from `raw`, checked against the key's type.
            fn set(&mut self, key: &'static str, raw: Raw<'_>, origin: &Origin) -> Result<(), ConfigError> {
                match key {
                    $(stringify!($name) => self.$name = parse(key, raw, origin)?,)*
                    _ => unreachable!("{key} is not in KEYS"),
                }
                Ok(())
            }
        }

        impl ConfigFlags {
            fn slot(&mut self, name: &str) -> Option<&mut Option<String>> {
                match name {
                    $(stringify!($name) => Some(&mut self.$name),)*
                    _ => None,
                }
            }

            /// The keys given as flags, with their text, in [`KEYS`] order.
            fn given(&self) -> impl Iterator<Item = (&'static str, &str)> {
                [$((stringify!($name), self.$name.as_deref())),*].into_iter().filter_map(|(key, text)| Some((key, text?)))
            }
        }
    };
}

// `name: Type = default, "VALUE_NAME", "help"[, "details"];` — the help (one line, for
// `--help`) gets ` [default: default]` appended; `default => "text"` shows `text` instead.
// Details, if any, follow the help in the reference (`livegate reference config`) only.
config_keys! {
    listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 7070)) => "127.0.0.1:7070", "ADDR",
        "Address to listen on for HTTP and WebSocket";
    data_dir: PathBuf = "./data".into() => "./data", "DIR",
        "Directory of the embedded store and the generated API key";
    api_key: Option<String> = None => "generated into DATA_DIR/api_key", "KEY",
        "Key backends send as `Authorization: Bearer KEY` (16+ characters)";
    node: String = default_node_name() => "the host name", "NAME",
        "This node's name";
    release: String = String::new() => "the binary's version", "LABEL",
        "The release this node belongs to; during a rolling release, sessions that must move go to the newest release's nodes first",
        "Each rollout must give its nodes a new label: the Kubernetes manifest sets it from the pod's `pod-template-hash` label, which every rollout (`kubectl rollout restart` included) changes. The newest release is the label whose earliest-started node started latest; when every node carries the same label, nodes started within the last three minutes rank first instead. Carried in heartbeats (cluster mode) and in `/healthz` (peers).";
    batch_window_ms: u64 = 100, "MS",
        "Collect a room's events for this long before sending them as one frame; 0 sends at once";
    heartbeat_secs: u64 = 30, "SECS",
        "Server ping interval; a connection silent for 3 intervals is closed with 4008";
    history_size: usize = 1000, "N",
        "Events kept per room for recovery and history";
    history_ttl_secs: u64 = 86400, "SECS",
        "Events older than this are trimmed from history";
    trusted_proxies: Vec<String> = Vec::new() => "none", "LIST",
        "Reverse proxies (addresses or blocks like 10.0.0.0/8) whose X-Forwarded-For names the client for per-IP limits",
        "A request from one of them counts against the per-IP limits as the right-most untrusted address of `X-Forwarded-For` (or `X-Real-IP`).";
    store_cache_mb: u64 = 64, "MIB",
        "Largest page cache of the embedded store, in MiB",
        "The store's own default would be 1 GiB.";
    room_idle_secs: u64 = 120, "SECS",
        "A room nobody subscribes to frees its memory after this long idle; its history stays stored",
        "An inbox followed only by its users' automatic subscriptions counts as idle.";
    recovery_max_events: u64 = 1000, "N",
        "A reconnecting client missing more events than this must reload its state";
    max_event_bytes: usize = 65536, "BYTES",
        "Largest accepted event data, in bytes of JSON";
    max_state_bytes: usize = 65536, "BYTES",
        "Largest room state a publish or PUT may carry, in bytes of JSON";
    max_subscriptions: usize = 128, "N",
        "Rooms one connection may subscribe to, its inbox not counted";
    resume_ttl_secs: u64 = 600, "SECS",
        "A resume credential (handed out in every welcome) reconnects without a new token for this long, once";
    token_ttl_max_secs: u64 = 86400, "SECS",
        "Longest lifetime a minted token may ask for, and a JWT may have (exp - now)";
    jwt_hmac_secret: Option<String> = None => "none", "SECRET",
        "Accept JWTs your backend signs with HS256 and this secret (at least 32 bytes) as connection tokens",
        "Never logged; `check-config` masks it. The Security chapter's \"Tokens your backend signs\" lists the claims.";
    jwt_public_key_file: Option<PathBuf> = None => "none", "PEM",
        "Accept JWTs signed with the private half of this PEM public key: RSA (RS256), EC P-256 (ES256) or Ed25519 (EdDSA)",
        "The algorithm follows the key, never the token's header. Read at start.";
    jwt_jwks_file: Option<PathBuf> = None => "none", "PATH",
        "Accept JWTs signed with a key of this JWK Set (JSON), picked by the token's kid",
        "Each key's kty (and crv) fixes its algorithm: RSA (RS256), EC P-256 (ES256), OKP Ed25519 (EdDSA); keys with use enc are skipped. Read at start.";
    jwt_issuer: Option<String> = None => "any", "ISS",
        "When set, a JWT's iss claim must be this";
    jwt_audience: Option<String> = None => "any", "AUD",
        "When set, a JWT's aud claim must name this";
    exclusive_devices: Vec<String> = vec!["phone".into(), "pc".into()] => "phone,pc", "LIST",
        "Device kinds limited to one connection per user, newest wins";
    migration_window_secs: u64 = 600, "SECS",
        "A user's sessions move between nodes at most once per window";
    warmup_secs: u64 = 120, "SECS",
        "After a restart that finds sessions, validate reconnects against the store this long";
    session_ttl_secs: u64 = 86400, "SECS",
        "A session with no connection for this long is deleted; reconnecting sooner keeps it",
        "Cluster mode: deleted within one to two TTLs; every node must use the same value.";
    session_cache_max: usize = 10000, "N",
        "Disconnected sessions kept in memory; the rest are read from the store on reconnect";
    drain_wait_secs: u64 = 15, "SECS",
        "On SIGTERM, report not-ready this long before closing connections";
    drain_spread_secs: u64 = 5, "SECS",
        "Spread the drain's reconnect requests over this long";
    drain_grace_secs: u64 = 30, "SECS",
        "Wait this long for clients to leave before closing them forcibly";
    max_outbox_bytes: usize = 1048576, "BYTES",
        "Bytes a connection may have queued before it is closed as too slow",
        "Everything held for one connection counts (events, replays, replies, pongs). Over it the socket is not read, and a connection still over it 5 s later is closed with 4009 (see [Close codes](close-codes.md)).";
    cell: String = "default".into() => "default", "CELL",
        "This node's cell, a group of nodes such as a region";
    cells: Vec<String> = Vec::new() => "this node's cell and the peers' cells", "LIST",
        "Every cell of the deployment, comma-separated; users are homed over this list, never over the cells alive",
        "A user's home cell is the token's `cell` claim, else a rendezvous hash of the user over these cells: it never changes when nodes or cells go down (the route falls back to the first healthy cell by name instead). Every node must list the same cells, its own `cell` among them; at most 64. Empty: this node's `cell` and the cells of its `peers`; in cluster mode (`cluster_nats_url`) empty means no list: users are homed over the cells of the nodes heard, and `cell` claims are refused (`unknown_cell`) until `cells` is set.";
    public_url: Option<String> = None => "http://LISTEN", "URL",
        "URL clients use to reach this node, answered by /v1/route";
    peers: Vec<String> = Vec::new() => "none", "LIST",
        "Peer nodes, each NAME=URL or NAME@CELL=URL, comma-separated";
    probe_interval_ms: u64 = 1000, "MS",
        "How often each peer's /healthz is probed";
    probe_up_after: u64 = 3, "N",
        "Successful probes in a row before a down peer counts as up";
    placement_high_water_percent: u64 = 90, "PERCENT",
        "Cluster mode: a node with this share of its connection limit in use takes no new or moving sessions (it keeps its own); the others take them in proportion to their headroom. 0: no mark";
    previous_api_keys: Vec<String> = Vec::new() => "none", "LIST",
        "API keys still accepted besides api_key, while backends move to the new one; reloaded on SIGHUP";
    allowed_origins: Vec<String> = Vec::new() => "any", "LIST",
        "Browser origins (scheme://host[:port], the port may be *) allowed to open WebSockets and SSE streams, read the client library and mint tokens from a page; reloaded on SIGHUP",
        "Empty means any origin. An entry is an exact origin (`https://app.example`) or one with any port (`http://localhost:*`); no other wildcard. Answers to an allowed origin carry `Access-Control-Allow-Origin`: `/livegate.js` and the other client files, `/v1/sse`, `/readyz` and `POST /v1/tokens` with its preflight. `livegate serve --dev` defaults it to `http://localhost:*`, `http://127.0.0.1:*` and `http://[::1]:*`.";
    tls_cert: Option<PathBuf> = None => "plain HTTP", "PEM",
        "Certificate chain (PEM); with tls_key the node serves HTTPS and WSS";
    tls_key: Option<PathBuf> = None => "none", "PEM",
        "Private key (PEM) of tls_cert";
    max_frame_bytes: usize = 65536, "BYTES",
        "Largest WebSocket frame a client may send; larger closes with 1009";
    max_message_bytes: usize = 65536, "BYTES",
        "Largest client message assembled from fragments; larger closes with 1009";
    max_connections: usize = 0, "N",
        "WebSocket and SSE connections this node holds; more are refused with 503. 0 (the default): as many as the open-file limit allows (limit - 256 - max_http_connections); a larger value is bounded by that too";
    max_http_connections: usize = 1024, "N",
        "Plain HTTP sockets (requests, keep-alive, handshakes not yet upgraded) this node holds, at most half the open-file limit - 256; more are closed at once";
    max_connections_per_ip: usize = 1000, "N",
        "WebSocket and SSE connections per client IP; more are refused with 429; 0: no limit",
        "An IPv6 address counts by its /64.";
    handshakes_per_ip_per_sec: u64 = 100, "N",
        "WebSocket handshakes per second per IP (burst: twice that); more get 429; 0: no limit";
    max_messages_per_sec: u64 = 100, "N",
        "Messages per second a connection may send (burst: twice that); more get error rate_limited; 0: no limit";
    max_room_starts_per_sec: u64 = 10, "N",
        "Rooms without a live actor on this node one connection may subscribe to or read per second (burst: twice that, at least max_subscriptions); more get error rate_limited; 0: no limit";
    max_bad_messages: u64 = 100, "N",
        "Refused messages (malformed or over the rate) per minute before the connection is closed with 1008";
    max_history_limit: usize = 1000, "N",
        "Largest limit a history read may ask for; more is refused with bad_request";
    presence_interval_ms: u64 = 1000, "MS",
        "A room's presence frames (who joined and left) go out at most this often, only when something changed",
        "In a cluster, a node's table of a room's members goes to the other nodes at this pace too.";
    presence_members_max: usize = 1000, "N",
        "Rooms with more members than this report only their count (members and joined/left are null)";
    subscribe_timeout_secs: u64 = 0, "SECS",
        "Close connections that subscribed to no room this long after connecting with 1008; 0: never";
    handshake_timeout_ms: u64 = 5000, "MS",
        "Time a client has to send a complete request head: the first from the connection's start, each later one from the end of the previous answer";
    ws_echo: bool = false, "BOOL",
        "Test only: /v1/echo echoes WebSocket messages without a token, for conformance suites";
    cluster_nats_url: Option<String> = None => "single node", "URLS",
        "Cluster mode: nats://HOST:PORT of the NATS servers (with JetStream) every node joins through, comma-separated: the seeds to connect and reconnect to";
    cluster_nats_user: Option<String> = None => "none", "USER",
        "Cluster mode: the NATS user every node logs in as, with cluster_nats_password",
        "The Cluster chapter's NATS permissions section gives an account for it with only the subjects and streams livegate uses. Anyone holding these credentials can read the token secret (and so mint tokens), every room's events and every session, and send kicks and rebalance orders: guard them like the API key.";
    cluster_nats_password: Option<String> = None => "none", "PASSWORD",
        "Cluster mode: cluster_nats_user's password",
        "Never logged; `check-config` masks it. Credentials in `cluster_nats_url` (`nats://USER:PASS@HOST`) are refused: the NATS client would not send them.";
    cluster_nats_token: Option<String> = None => "none", "TOKEN",
        "Cluster mode: a token to log in to NATS with, instead of a user and password",
        "Never logged; `check-config` masks it.";
    cluster_replicas: Option<u64> = None => "3 when NATS has three or more JetStream servers, else 1", "N",
        "Cluster mode: replicas (1 or 3) of every stream and KV bucket livegate creates; an existing one with fewer is raised";
    directory_outage_secs: u64 = 30, "SECS",
        "Cluster mode: while NATS is unreachable, new sessions are queued this long, then refused with 503";
    cluster_cell_domains: bool = false, "BOOL",
        "Cluster mode: each cell runs its own NATS, whose JetStream domain is the cell's name, joined to the other cells' NATS by leaf node connections",
        "Sessions, token spend records, the cell probe and the rooms homed in the cell stay in the cell's NATS; a room homed in another cell is read through that cell's domain and its publishes are forwarded to that cell's writer, never written here. Needs `cells` (every cell's name is a domain: 1 to 64 characters from A-Z a-z 0-9 _ -) and `cluster_token_secret`. The Cells chapter gives the NATS settings.";
    cluster_token_secret: Option<String> = None => "made by the first node, kept in NATS", "SECRET",
        "Cluster mode: the key every node signs and checks connection tokens and resume credentials with, at least 32 characters; required with cluster_cell_domains, where each cell's NATS is separate and a token minted in one cell must open a connection in every cell",
        "Never logged; `check-config` masks it. Without it, the first node to join makes a random key and keeps it in NATS (`lg_meta`).";
    cluster_heartbeat_ms: u64 = 1000, "MS",
        "Cluster mode: heartbeat period; a peer not heard for 3 periods is down";
    webhook_url: String = String::new() => "off", "URL",
        "POST room_occupied, room_vacated and client_published webhooks to this http:// or https:// URL; empty: no webhooks";
    webhook_secret: String = String::new() => "none", "SECRET",
        "Key of each webhook's X-Livegate-Signature (HMAC-SHA256 of the body); required with webhook_url",
        "`check-config` masks it.";
    webhook_queue_max: usize = 10000, "N",
        "Webhooks queued in the store at most; a new one when full is dropped (counted and logged)";
    webhook_timeout_ms: u64 = 5000, "MS",
        "Time one webhook attempt may take; then it is retried";
    webhook_max_attempts: u64 = 12, "N",
        "Attempts of one webhook at most; after the last one fails (or at once when the receiver refuses it with a 4xx other than 408 and 429) it goes to the dead-letter list",
        "With the default schedule the 11 retries wait at most 0.5, 1, 2, 4, 8, 16, 32, 60, 60, 60 and 60 s (303.5 s in all, about 2.5 minutes on average: each wait is a random part of its ceiling), plus up to webhook_timeout_ms per attempt. The Webhooks chapter shows the schedule.";
    webhook_retry_first_ms: u64 = 500, "MS",
        "Longest wait before a webhook's first retry; each further retry's ceiling doubles, up to webhook_retry_max_ms; each wait is a random part of its ceiling";
    webhook_retry_max_ms: u64 = 60000, "MS",
        "Longest wait before any webhook retry (also when webhook_retry_first_ms is larger)";
    webhook_dead_letters_max: usize = 1000, "N",
        "Dead letters kept in the store at most (webhooks out of attempts or refused); when full, the oldest is dropped (counted and logged) for a new one";
    webhook_vacated_delay_ms: u64 = 3000, "MS",
        "A room's room_vacated waits this long; a room joined again meanwhile (a page reload) sends neither room_vacated nor room_occupied; 0: at once";
}

/// Largest `presence_members_max`: a node's member list of a room crosses NATS as one
/// message (at most about 160 bytes a member, under NATS's 1 MiB payload).
pub const PRESENCE_MEMBERS_MAX: u64 = 5000;

/// One key as `livegate reference config` describes it; [`KEY_DOCS`] holds every key's,
/// taken from the `config_keys!` list.
#[derive(Debug, Clone, Copy)]
pub struct KeyDoc {
    pub name: &'static str,
    /// How a value of the key's type is written, as error messages say it.
    form: &'static str,
    /// The default as `--help` shows it.
    pub default: &'static str,
    pub value_name: &'static str,
    /// The one line `--help` shows.
    pub help: &'static str,
    /// More than `--help` says; empty when nothing.
    pub details: &'static str,
}

impl KeyDoc {
    /// How a value is written ("a whole number of seconds", "true or false", ...).
    pub fn form(&self) -> &'static str {
        value::expected(self.form, self.name)
    }

    /// The environment variable: `LIVEGATE_<KEY>`.
    pub fn env_var(&self) -> String {
        format!("{ENV_PREFIX}{}", self.name.to_ascii_uppercase())
    }

    /// The command-line flag: `--key-with-dashes`.
    pub fn flag(&self) -> String {
        format!("--{}", self.name.replace('_', "-"))
    }

    /// The key's bounds from [`BOUNDS`] as text ("1 to 10000 (10 seconds)", "at least 1"),
    /// or the rule a value that is not a number must follow.
    pub fn bounds(&self) -> Option<String> {
        let range = bounds_of(self.name).map(|(min, max)| match max {
            Some((max, note)) => format!("{min} to {max}{note}"),
            None => format!("at least {min}"),
        });
        range.or_else(|| rule_of(self.name))
    }
}

/// A duration key as a [`Duration`], for the code that waits or ticks by it.
macro_rules! durations {
    ($($accessor:ident: $key:ident in $unit:ident,)*) => {
        impl Config {
            $(#[doc = concat!("`", stringify!($key), "` as a [`Duration`].")]
            pub fn $accessor(&self) -> Duration {
                Duration::$unit(self.$key)
            })*
        }

        #[cfg(test)]
        const DURATIONS: &[(&str, fn(&Config) -> Duration)] = &[$((stringify!($key), Config::$accessor)),*];
    };
}

durations! {
    batch_window: batch_window_ms in from_millis, heartbeat: heartbeat_secs in from_secs,
    room_idle: room_idle_secs in from_secs, token_ttl_max: token_ttl_max_secs in from_secs,
    resume_ttl: resume_ttl_secs in from_secs,
    migration_window: migration_window_secs in from_secs, warmup: warmup_secs in from_secs,
    session_ttl: session_ttl_secs in from_secs, drain_wait: drain_wait_secs in from_secs,
    drain_spread: drain_spread_secs in from_secs, drain_grace: drain_grace_secs in from_secs,
    probe_interval: probe_interval_ms in from_millis, presence_interval: presence_interval_ms in from_millis, handshake_timeout: handshake_timeout_ms in from_millis,
    directory_outage: directory_outage_secs in from_secs, cluster_heartbeat: cluster_heartbeat_ms in from_millis,
    webhook_timeout: webhook_timeout_ms in from_millis, webhook_vacated_delay: webhook_vacated_delay_ms in from_millis,
    webhook_retry_first: webhook_retry_first_ms in from_millis, webhook_retry_max: webhook_retry_max_ms in from_millis,
}

/// The seed URLs of a `cluster_nats_url`: its comma-separated entries, trimmed, empty
/// ones left out (one URL is a list of one).
pub fn nats_seeds(urls: &str) -> Vec<&str> {
    urls.split(',').map(str::trim).filter(|url| !url.is_empty()).collect()
}

fn default_node_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "livegate".to_string())
}

const HELP_HEADING: &str =
    "Configuration (flags win over LIVEGATE_<KEY> variables, which win over the config file)";
/// Prefix of every environment variable livegate reads.
pub const ENV_PREFIX: &str = "LIVEGATE_";
/// Environment variable naming the config file (same as `--config`).
pub const ENV_CONFIG_FILE: &str = "LIVEGATE_CONFIG";
/// Environment variable choosing the log format (same as `--log-format`).
pub const ENV_LOG_FORMAT: &str = "LIVEGATE_LOG_FORMAT";
/// `LIVEGATE_*` variables that are not configuration keys but are still known.
const ENV_NOT_KEYS: &[&str] = &[ENV_CONFIG_FILE, ENV_LOG_FORMAT];
/// Keys whose values are secrets: error messages never repeat them.
const SECRET_KEYS: &[&str] = &[
    "api_key",
    "previous_api_keys",
    "webhook_secret",
    "cluster_nats_password",
    "cluster_nats_token",
    "cluster_token_secret",
    "jwt_hmac_secret",
];
/// Shortest API key accepted, configured or read from the key file.
pub const API_KEY_MIN_CHARS: usize = 16;

/// A peer node, parsed from its `peers` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub cell: String,
    pub url: String,
}

impl Config {
    /// The configured peers, parsed (validated by [`Config::validate`]).
    pub fn peer_nodes(&self) -> Result<Vec<Peer>, ConfigError> {
        self.peers.iter().map(|entry| parse_peer(entry, &self.cell)).collect()
    }
}

fn parse_peer(entry: &str, own_cell: &str) -> Result<Peer, ConfigError> {
    let bad = || {
        invalid(
            "peers",
            format!("entries are NAME=URL or NAME@CELL=URL with an http:// URL, got {entry:?}"),
        )
    };
    let (who, url) = entry.split_once('=').ok_or_else(bad)?;
    let (name, cell) = who.split_once('@').unwrap_or((who, own_cell));
    if !is_plain_name(name, MAX_NODE_NAME_LEN)
        || !is_plain_name(cell, MAX_NODE_NAME_LEN)
        || !url.starts_with("http://")
        || url.len() <= "http://".len()
    {
        return Err(bad());
    }
    Ok(Peer {
        name: name.to_string(),
        cell: cell.to_string(),
        url: url.trim_end_matches('/').to_string(),
    })
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// Where a configuration value came from; error messages name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    File { path: PathBuf, key: &'static str },
    Env { var: String },
    Flag { key: &'static str },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, key } => write!(f, "{key} in {}", path.display()),
            Origin::Env { var } => f.write_str(var),
            Origin::Flag { key } => write!(f, "--{}", key.replace('_', "-")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid TOML: {}{}", source.message(), line.map(|n| format!(" (line {n})")).unwrap_or_default())]
    ParseFile { path: PathBuf, line: Option<usize>, source: Box<toml::de::Error> },
    #[error("config file {path}: unknown key `{key}` (known keys: {})", known_keys())]
    UnknownKey { path: PathBuf, key: String },
    #[error("{origin}: expected {expected}, got {got}")]
    BadValue { origin: Origin, expected: &'static str, got: String },
    #[error("{key} {problem}{}", origin.as_ref().map(|o| format!(" (set by {o})")).unwrap_or_default())]
    Invalid { key: &'static str, problem: String, origin: Option<Origin> },
    #[error("{}{table}: {problem}", path.as_ref().map(|p| format!("config file {}: ", p.display())).unwrap_or_default())]
    Namespace { path: Option<PathBuf>, table: String, problem: String },
    #[error("API key file {path}: {source}")]
    ApiKeyFile { path: PathBuf, source: std::io::Error },
    #[error("API key file {path}: cannot create {dir}: {source}")]
    DataDir { path: PathBuf, dir: PathBuf, source: std::io::Error },
    #[error(
        "API key file {path}: {problem}: delete it to have a new key generated, or set api_key"
    )]
    StoredApiKey { path: PathBuf, problem: &'static str },
    #[error("cannot generate an API key: no randomness available: {0}")]
    Random(getrandom::Error),
}

fn known_keys() -> String {
    KEYS.join(", ")
}

fn invalid(key: &'static str, problem: String) -> ConfigError {
    ConfigError::Invalid { key, problem, origin: None }
}

impl ConfigError {
    /// A `[[namespace]]` error, naming the file it is in.
    fn in_file(self, file: &Path) -> ConfigError {
        match self {
            ConfigError::Namespace { path: None, table, problem } => {
                ConfigError::Namespace { path: Some(file.to_path_buf()), table, problem }
            }
            other => other,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

impl ConfigFlags {
    /// Sets a key as if its flag were given; panics on a name that is not in [`KEYS`]
    /// (a programming error, not a user's).
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Self {
        let slot = self.slot(name).unwrap_or_else(|| panic!("no configuration key named {name:?}"));
        *slot = Some(value.into());
        self
    }

    /// The value given for a key, as text.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.given().find(|(key, _)| *key == name).map(|(_, text)| text)
    }

    /// The config file to read: `--config`, else `LIVEGATE_CONFIG`, else none.
    pub fn config_file<'a>(
        &self,
        env: impl IntoIterator<Item = &'a (String, String)>,
    ) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            env.into_iter()
                .find(|(name, value)| name == ENV_CONFIG_FILE && !value.is_empty())
                .map(|(_, value)| PathBuf::from(value))
        })
    }
}

impl Config {
    /// Builds the configuration from its layers, later winning: defaults, the TOML `file`,
    /// `LIVEGATE_<KEY>` variables from `env`, then `flags`; then validates it.
    /// `file` is read as given (see [`ConfigFlags::config_file`] for choosing it).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &ConfigFlags,
    ) -> Result<Config, ConfigError> {
        Config::load_over(Config::default(), file, env, flags)
    }

    /// [`Config::load`] with `defaults` in place of [`Config::default`]: what a mode such
    /// as `serve --dev` changes, each value still overridden by any layer that sets it.
    pub fn load_over(
        defaults: Config,
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &ConfigFlags,
    ) -> Result<Config, ConfigError> {
        let mut config = defaults;
        let mut tables = Vec::new();
        // Which layer set each key last, for validation messages.
        let mut origins = BTreeMap::new();
        let mut set = |key: &'static str, raw: Raw<'_>, origin: Origin| {
            config.set(key, raw, &origin)?;
            origins.insert(key, origin);
            Ok::<_, ConfigError>(())
        };
        if let Some(path) = file {
            for (name, value) in &read_file(path)? {
                if name == "namespace" {
                    tables = namespaces::read(path, value)?;
                    continue;
                }
                let Some(key) = KEYS.iter().find(|key| *key == name) else {
                    return Err(ConfigError::UnknownKey {
                        path: path.to_path_buf(),
                        key: name.clone(),
                    });
                };
                set(key, Raw::Toml(value), Origin::File { path: path.to_path_buf(), key })?;
            }
        }
        for (var, text) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else { continue };
            if ENV_NOT_KEYS.contains(&var.as_str()) {
                continue;
            }
            let Some(key) = KEYS.iter().find(|key| key.to_ascii_uppercase() == rest) else {
                tracing::warn!(
                    "ignoring unknown environment variable {var}: livegate has no configuration key {:?}",
                    rest.to_ascii_lowercase()
                );
                continue;
            };
            set(key, Raw::Text(&text), Origin::Env { var })?;
        }
        for (key, text) in flags.given() {
            set(key, Raw::Text(text), Origin::Flag { key })?;
        }
        config.namespaces = tables;
        config.validate().map_err(|e| match e {
            ConfigError::Invalid { key, problem, origin: None } => {
                ConfigError::Invalid { key, problem, origin: origins.remove(key) }
            }
            other => match file {
                Some(path) => other.in_file(path),
                None => other,
            },
        })?;
        Ok(config)
    }

    /// [`Config::load`] with this process's environment and the file named by
    /// `--config` or `LIVEGATE_CONFIG`.
    pub fn load_from_process(flags: &ConfigFlags) -> Result<Config, ConfigError> {
        Config::load_from_process_over(Config::default(), flags)
    }

    /// [`Config::load_from_process`] over `defaults` (see [`Config::load_over`]).
    pub fn load_from_process_over(
        defaults: Config,
        flags: &ConfigFlags,
    ) -> Result<Config, ConfigError> {
        let env = process_env();
        let file = flags.config_file(&env);
        Config::load_over(defaults, file.as_deref(), env, flags)
    }

    /// The defaults of `livegate serve --dev`, for a laptop: a drain of
    /// [`DEV_DRAIN_WAIT_SECS`] spread over [`DEV_DRAIN_SPREAD_SECS`] (Ctrl-C stops in
    /// about two seconds, where the defaults take twenty) and pages from this machine on any
    /// port allowed ([`crate::core::rules::origins::DEV_ORIGINS`]). A key set in any layer wins.
    pub fn dev_defaults() -> Config {
        Config {
            drain_wait_secs: DEV_DRAIN_WAIT_SECS,
            drain_spread_secs: DEV_DRAIN_SPREAD_SECS,
            allowed_origins: crate::core::rules::origins::DEV_ORIGINS
                .iter()
                .map(|o| o.to_string())
                .collect(),
            ..Config::default()
        }
    }

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
}

/// `drain_wait_secs` under `serve --dev`, unless set.
pub const DEV_DRAIN_WAIT_SECS: u64 = 1;
/// `drain_spread_secs` under `serve --dev`, unless set.
pub const DEV_DRAIN_SPREAD_SECS: u64 = 1;

/// Shortest `cluster_token_secret`.
pub const TOKEN_SECRET_MIN_CHARS: usize = 32;

/// Most cells `cells` may list.
pub const MAX_CELLS: usize = 64;

impl Config {
    /// `release`, else the binary's version.
    pub fn release(&self) -> String {
        if self.release.is_empty() {
            env!("CARGO_PKG_VERSION").to_string()
        } else {
            self.release.clone()
        }
    }

    /// The configured cells, sorted and without duplicates: `cells`, or when it is empty
    /// this node's `cell` and its peers' cells (a peer entry that does not parse adds
    /// nothing; validation refuses it). In cluster mode (`cluster_nats_url`) with `cells`
    /// empty there is no list: each node hears of the others' cells only while they beat,
    /// so a list made of its own cell would home every user in the cell of the node asked.
    /// The route then homes users over the cells it hears, as before `cells` existed.
    pub fn configured_cells(&self) -> Vec<String> {
        if self.cells.is_empty() && self.cluster_nats_url.is_some() {
            return Vec::new();
        }
        let mut cells: Vec<String> = if self.cells.is_empty() {
            let peers = self
                .peers
                .iter()
                .filter_map(|entry| parse_peer(entry, &self.cell).ok())
                .map(|peer| peer.cell);
            std::iter::once(self.cell.clone()).chain(peers).collect()
        } else {
            self.cells.clone()
        };
        cells.sort();
        cells.dedup();
        cells
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

    /// Whether webhooks are on (`webhook_url` set).
    pub fn webhooks_enabled(&self) -> bool {
        !self.webhook_url.is_empty()
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
fn bound_problem(value: u64, min: u64, max: UpperBound<'_>) -> Option<String> {
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
const NAME_KEYS: &[(&str, usize)] = &[
    ("node", MAX_NODE_NAME_LEN),
    ("release", MAX_NODE_NAME_LEN),
    ("cell", MAX_NODE_NAME_LEN),
    ("exclusive_devices", MAX_DEVICE_LEN),
];

/// The replica counts `cluster_replicas` may ask for.
const CLUSTER_REPLICAS: [u64; 2] = [1, 3];

/// The rule of a key that is not a number in a range ([`BOUNDS`]), as the reference
/// states it: names ([`NAME_KEYS`]), API keys ([`API_KEY_MIN_CHARS`]), replicas.
fn rule_of(key: &str) -> Option<String> {
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

/// The config file as a TOML table.
fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::ReadFile { path: path.to_path_buf(), source })?;
    text.parse().map_err(|source: toml::de::Error| {
        // Name the line: "invalid basic string" alone does not say where.
        let line =
            source.span().map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        ConfigError::ParseFile { path: path.to_path_buf(), line, source: Box::new(source) }
    })
}

/// This process's environment as text pairs; variables that are not valid UTF-8 are
/// skipped (with a warning when they look like ours).
fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => Some((name, value)),
            (Ok(name), Err(_)) => {
                if name.starts_with(ENV_PREFIX) {
                    tracing::warn!(
                        "ignoring environment variable {name}: its value is not valid UTF-8"
                    );
                }
                None
            }
            _ => None,
        })
        .collect()
}
