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
//! `load` reads the layers; `validate` checks the values (with [`BOUNDS`]); `value` holds
//! how each type is written (text and TOML); `api_key` the key file that `serve`
//! generates under `data_dir` when no key is configured.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod api_key;
mod load;
mod namespaces;
#[cfg(test)]
mod tests;
mod validate;
mod value;

pub use api_key::ResolvedApiKey;
pub use load::{DEV_DRAIN_SPREAD_SECS, DEV_DRAIN_WAIT_SECS};
pub use namespaces::{NamespaceTable, ROOM_KEYS};
use validate::rule_of;
pub use validate::{bounds_of, UpperBound, BOUNDS, MAX_CELLS, TOKEN_SECRET_MIN_CHARS};
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
        "A room sends at most one frame per window this long: an event that finds the room calm leaves at once, the window opens once that frame is written to every subscriber, and what follows waits for it to close; 0 sends every flush at once";
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
    fanout_threads: usize = 0, "N",
        "Threads that hand out one frame of a room with more than 1,024 subscribers, the room's own included; 0: one per core",
        "A big room's frame is cut in pieces of 128 subscribers that the room's thread and the writer threads take in turn, so it is written over every core; the room's next frame waits until this one is handed out (a connection's events stay in order). 1 writes every frame on the room's thread. See the Benchmarks chapter for what it gains where clients are on other machines, and what it costs when the clients share the server's cores.";
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

    /// Whether webhooks are on (`webhook_url` set).
    pub fn webhooks_enabled(&self) -> bool {
        !self.webhook_url.is_empty()
    }
}
