//! Typed configuration: defaults, then a TOML file, then `LIVEGATE_*` environment
//! variables, then command-line flags (later wins). Validated once at start and passed
//! explicitly; nothing else reads the environment.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Every key of the configuration. Durations are whole numbers in the unit their name ends with.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the HTTP and WebSocket server listens on.
    pub listen: SocketAddr,
    /// Directory of the embedded sled store (and the generated API key file).
    pub data_dir: PathBuf,
    /// Key backends present as `Authorization: Bearer <api_key>`; generated and stored
    /// under `data_dir` when absent.
    pub api_key: Option<String>,
    /// This node's name, reported in `welcome` and `/v1/route`.
    pub node: String,
    /// Per-room batching window: durable events leave as one frame per window; 0 sends
    /// each flush at once.
    pub batch_window_ms: u64,
    /// Server ping interval; a connection silent for 3 intervals is closed with 4008.
    pub heartbeat_secs: u64,
    /// Events kept per room.
    pub history_size: usize,
    /// Events older than this are trimmed from history.
    pub history_ttl_secs: u64,
    /// Reverse proxies (addresses or blocks such as `10.0.0.0/8`) whose `X-Forwarded-For`
    /// names the client address the per-IP limits count.
    pub trusted_proxies: Vec<String>,
    /// Largest page cache of the embedded store, in MiB.
    pub store_cache_mb: u64,
    /// A room nobody subscribes to (an inbox followed only by its users' automatic
    /// subscriptions) stops its actor after this long without activity.
    pub room_idle_secs: u64,
    /// A recovery needing more events than this answers `recovered:false`.
    pub recovery_max_events: u64,
    /// Largest accepted event `data`, in bytes of JSON text.
    pub max_event_bytes: usize,
    /// Rooms one connection may subscribe to (the inbox room not counted).
    pub max_subscriptions: usize,
    /// Longest token lifetime `POST /v1/tokens` grants.
    pub token_ttl_max_secs: u64,
    /// Device kinds that keep one connection per user (newest wins).
    pub exclusive_devices: Vec<String>,
    pub migration_window_secs: u64,
    pub warmup_secs: u64,
    /// A session with no connection for this long is forgotten (its id then gets a new one).
    pub session_ttl_secs: u64,
    /// Disconnected sessions kept in memory for fast reconnects; older ones are read back
    /// from the store.
    pub session_cache_max: usize,
    pub drain_wait_secs: u64,
    pub drain_spread_secs: u64,
    pub drain_grace_secs: u64,
    /// Bytes a connection may have queued but unwritten before it is closed with 4009.
    pub max_outbox_bytes: usize,
    /// This node's cell (a group of nodes, e.g. a region).
    pub cell: String,
    /// URL clients use to reach this node (`/v1/route` answers it); default `http://<listen>`.
    pub public_url: Option<String>,
    /// Peer nodes, each `NAME=URL` or `NAME@CELL=URL` (cell defaults to this node's).
    pub peers: Vec<String>,
    /// How often each peer's `/healthz` is probed.
    pub probe_interval_ms: u64,
    /// Successful probes in a row before a peer counts as up again (one failure: down).
    pub probe_up_after: u64,
    /// API keys still accepted besides `api_key`, for rotation; reloaded on SIGHUP.
    pub previous_api_keys: Vec<String>,
    /// Browser origins allowed to open WebSockets (empty: any). Requests without an
    /// `Origin` header (not from a browser) are always allowed.
    pub allowed_origins: Vec<String>,
    /// PEM certificate chain and private key: when both are set, the node serves HTTPS and WSS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Largest WebSocket frame a client may send.
    pub max_frame_bytes: usize,
    /// Largest client message, assembled from continuation frames.
    pub max_message_bytes: usize,
    /// WebSocket connections this node holds at most (0: no limit).
    pub max_connections: usize,
    /// WebSocket connections one client IP address may hold (0: no limit).
    pub max_connections_per_ip: usize,
    /// WebSocket handshakes per second one IP address may attempt, with a burst of twice that (0: no limit).
    pub handshakes_per_ip_per_sec: u64,
    /// Messages per second a connection may send, with a burst of twice that (0: no limit).
    pub max_messages_per_sec: u64,
    /// Refused client messages (malformed, over the rate) per minute before a close with 1008.
    pub max_bad_messages: u64,
    /// Largest `limit` of a history read.
    pub max_history_limit: usize,
    /// A connection that has not subscribed to any room this long after connecting is
    /// closed with 1008 (0: never).
    pub subscribe_timeout_secs: u64,
    /// Time a client has to send a complete request head (and so a WebSocket upgrade).
    pub handshake_timeout_ms: u64,
    /// Test-only: `/v1/echo` echoes WebSocket messages without a token (for conformance suites).
    pub ws_echo: bool,
    /// Cluster mode: the NATS server (with JetStream) that joins the nodes. `None`: single node.
    pub cluster_nats_url: Option<String>,
    /// Cluster mode: after the directory (NATS) has been unreachable this long, new sessions
    /// are refused instead of being queued.
    pub directory_outage_secs: u64,
    /// Cluster mode: how often this node announces itself; a peer not heard for three
    /// periods is down.
    pub cluster_heartbeat_ms: u64,
}

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
    let bad = || invalid("peers", format!("entries are NAME=URL or NAME@CELL=URL with an http:// URL, got {entry:?}"));
    let (who, url) = entry.split_once('=').ok_or_else(bad)?;
    let (name, cell) = who.split_once('@').unwrap_or((who, own_cell));
    if !is_name(name, 64) || !is_name(cell, 64) || !url.starts_with("http://") || url.len() <= "http://".len() {
        return Err(bad());
    }
    Ok(Peer { name: name.to_string(), cell: cell.to_string(), url: url.trim_end_matches('/').to_string() })
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:7070".parse().expect("valid default address"),
            data_dir: PathBuf::from("./data"),
            api_key: None,
            node: default_node_name(),
            batch_window_ms: 100,
            heartbeat_secs: 30,
            history_size: 1000,
            history_ttl_secs: 86_400,
            room_idle_secs: 120,
            store_cache_mb: 64,
            trusted_proxies: Vec::new(),
            recovery_max_events: 1000,
            max_event_bytes: 65_536,
            max_subscriptions: 128,
            token_ttl_max_secs: 86_400,
            exclusive_devices: vec!["phone".into(), "pc".into()],
            migration_window_secs: 600,
            warmup_secs: 120,
            session_ttl_secs: 86_400,
            session_cache_max: 10_000,
            drain_wait_secs: 15,
            drain_spread_secs: 5,
            drain_grace_secs: 30,
            max_outbox_bytes: 1_048_576,
            cell: "default".into(),
            public_url: None,
            peers: Vec::new(),
            probe_interval_ms: 1000,
            probe_up_after: 3,
            previous_api_keys: Vec::new(),
            allowed_origins: Vec::new(),
            tls_cert: None,
            tls_key: None,
            max_frame_bytes: 65_536,
            max_message_bytes: 65_536,
            max_connections: 15_000,
            max_connections_per_ip: 1_000,
            handshakes_per_ip_per_sec: 100,
            max_messages_per_sec: 100,
            max_bad_messages: 100,
            max_history_limit: 1_000,
            subscribe_timeout_secs: 0,
            handshake_timeout_ms: 5_000,
            ws_echo: false,
            cluster_nats_url: None,
            directory_outage_secs: 30,
            cluster_heartbeat_ms: 1000,
        }
    }
}

fn default_node_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "livegate".to_string())
}

// ---------------------------------------------------------------------------------------
// The keys: one table drives the file, the environment, the flags and their help texts.
// ---------------------------------------------------------------------------------------

/// How a key's value is written, and so how a text value (environment, flag) is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole number; the text names the unit for error messages
    /// ("a whole number of milliseconds").
    Number(&'static str),
    /// An IP address and port.
    Address,
    /// A filesystem path.
    Path,
    /// Free text.
    Text,
    /// A list of names; comma-separated in the environment and on the command line.
    List,
    /// `true` or `false`.
    Bool,
}

impl Kind {
    /// The expected form, as error messages say it.
    pub fn expected(self) -> &'static str {
        match self {
            Kind::Number(form) => form,
            Kind::Address => "an IP address and port such as 127.0.0.1:7070",
            Kind::Path => "a directory path",
            Kind::Text => "text",
            Kind::List => "a comma-separated list such as phone,pc",
            Kind::Bool => "true or false",
        }
    }
}

/// One configuration key: its name in the file, its flag, its kind and its help text.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// The name in the TOML file and, upper-cased after `LIVEGATE_`, in the environment.
    pub name: &'static str,
    /// The command-line flag without its leading dashes (`name` with `-` for `_`).
    pub flag: &'static str,
    pub kind: Kind,
    /// Placeholder in `--help` (`--listen <ADDR>`).
    pub value_name: &'static str,
    pub help: &'static str,
}

impl Key {
    /// The environment variable that sets this key: `LIVEGATE_` + the name in upper case.
    pub fn env_var(&self) -> String {
        format!("{ENV_PREFIX}{}", self.name.to_ascii_uppercase())
    }
}

const MS: Kind = Kind::Number("a whole number of milliseconds");
const SECS: Kind = Kind::Number("a whole number of seconds");
const COUNT: Kind = Kind::Number("a whole number");
const BYTES: Kind = Kind::Number("a whole number of bytes");

/// Every configuration key, in `Config` field order. The one list: the TOML loader,
/// the environment reader, the command-line flags and their help all come from here,
/// and a unit test checks it against the fields of [`Config`].
pub const KEYS: &[Key] = &[
    Key { name: "listen", flag: "listen", kind: Kind::Address, value_name: "ADDR",
        help: "Address to listen on for HTTP and WebSocket [default: 127.0.0.1:7070]" },
    Key { name: "data_dir", flag: "data-dir", kind: Kind::Path, value_name: "DIR",
        help: "Directory of the embedded store and the generated API key [default: ./data]" },
    Key { name: "api_key", flag: "api-key", kind: Kind::Text, value_name: "KEY",
        help: "Key backends send as `Authorization: Bearer KEY` (16+ characters) [default: generated into DATA_DIR/api_key]" },
    Key { name: "node", flag: "node", kind: Kind::Text, value_name: "NAME",
        help: "This node's name [default: the host name]" },
    Key { name: "batch_window_ms", flag: "batch-window-ms", kind: MS, value_name: "MS",
        help: "Collect a room's events for this long before sending them as one frame; 0 sends at once [default: 100]" },
    Key { name: "heartbeat_secs", flag: "heartbeat-secs", kind: SECS, value_name: "SECS",
        help: "Server ping interval; a connection silent for 3 intervals is closed [default: 30]" },
    Key { name: "history_size", flag: "history-size", kind: COUNT, value_name: "N",
        help: "Events kept per room for recovery and history [default: 1000]" },
    Key { name: "history_ttl_secs", flag: "history-ttl-secs", kind: SECS, value_name: "SECS",
        help: "Events older than this are trimmed from history [default: 86400]" },
    Key { name: "trusted_proxies", flag: "trusted-proxies", kind: Kind::List, value_name: "LIST",
        help: "Reverse proxies (addresses or blocks like 10.0.0.0/8) whose X-Forwarded-For names the client for per-IP limits [default: none]" },
    Key { name: "store_cache_mb", flag: "store-cache-mb", kind: COUNT, value_name: "MIB",
        help: "Largest page cache of the embedded store, in MiB [default: 64]" },
    Key { name: "room_idle_secs", flag: "room-idle-secs", kind: SECS, value_name: "SECS",
        help: "A room nobody subscribes to frees its memory after this long idle; its history stays stored [default: 120]" },
    Key { name: "recovery_max_events", flag: "recovery-max-events", kind: COUNT, value_name: "N",
        help: "A reconnecting client missing more events than this must reload its state [default: 1000]" },
    Key { name: "max_event_bytes", flag: "max-event-bytes", kind: BYTES, value_name: "BYTES",
        help: "Largest accepted event data, in bytes of JSON [default: 65536]" },
    Key { name: "max_subscriptions", flag: "max-subscriptions", kind: COUNT, value_name: "N",
        help: "Rooms one connection may subscribe to [default: 128]" },
    Key { name: "token_ttl_max_secs", flag: "token-ttl-max-secs", kind: SECS, value_name: "SECS",
        help: "Longest lifetime a minted token may ask for [default: 86400]" },
    Key { name: "exclusive_devices", flag: "exclusive-devices", kind: Kind::List, value_name: "LIST",
        help: "Device kinds limited to one connection per user, newest wins [default: phone,pc]" },
    Key { name: "migration_window_secs", flag: "migration-window-secs", kind: SECS, value_name: "SECS",
        help: "A user's sessions move between nodes at most once per window [default: 600]" },
    Key { name: "warmup_secs", flag: "warmup-secs", kind: SECS, value_name: "SECS",
        help: "After a restart that finds sessions, validate reconnects against the store this long [default: 120]" },
    Key { name: "session_ttl_secs", flag: "session-ttl-secs", kind: SECS, value_name: "SECS",
        help: "A session with no connection for this long is deleted; reconnecting sooner keeps it [default: 86400]" },
    Key { name: "session_cache_max", flag: "session-cache-max", kind: COUNT, value_name: "N",
        help: "Disconnected sessions kept in memory; the rest are read from the store on reconnect [default: 10000]" },
    Key { name: "drain_wait_secs", flag: "drain-wait-secs", kind: SECS, value_name: "SECS",
        help: "On SIGTERM, report not-ready this long before closing connections [default: 15]" },
    Key { name: "drain_spread_secs", flag: "drain-spread-secs", kind: SECS, value_name: "SECS",
        help: "Spread the drain's reconnect requests over this long [default: 5]" },
    Key { name: "drain_grace_secs", flag: "drain-grace-secs", kind: SECS, value_name: "SECS",
        help: "Wait this long for clients to leave before closing them forcibly [default: 30]" },
    Key { name: "max_outbox_bytes", flag: "max-outbox-bytes", kind: BYTES, value_name: "BYTES",
        help: "Bytes a connection may have queued before it is closed as too slow [default: 1048576]" },
    Key { name: "cell", flag: "cell", kind: Kind::Text, value_name: "CELL",
        help: "This node's cell, a group of nodes such as a region [default: default]" },
    Key { name: "public_url", flag: "public-url", kind: Kind::Text, value_name: "URL",
        help: "URL clients use to reach this node, answered by /v1/route [default: http://LISTEN]" },
    Key { name: "peers", flag: "peers", kind: Kind::List, value_name: "LIST",
        help: "Peer nodes, each NAME=URL or NAME@CELL=URL, comma-separated [default: none]" },
    Key { name: "probe_interval_ms", flag: "probe-interval-ms", kind: MS, value_name: "MS",
        help: "How often each peer's /healthz is probed [default: 1000]" },
    Key { name: "probe_up_after", flag: "probe-up-after", kind: COUNT, value_name: "N",
        help: "Successful probes in a row before a down peer counts as up [default: 3]" },
    Key { name: "previous_api_keys", flag: "previous-api-keys", kind: Kind::List, value_name: "LIST",
        help: "API keys still accepted besides api_key, while backends move to the new one; reloaded on SIGHUP [default: none]" },
    Key { name: "allowed_origins", flag: "allowed-origins", kind: Kind::List, value_name: "LIST",
        help: "Browser origins (scheme://host[:port]) allowed to open WebSockets; reloaded on SIGHUP [default: any]" },
    Key { name: "tls_cert", flag: "tls-cert", kind: Kind::Path, value_name: "PEM",
        help: "Certificate chain (PEM); with tls_key the node serves HTTPS and WSS [default: plain HTTP]" },
    Key { name: "tls_key", flag: "tls-key", kind: Kind::Path, value_name: "PEM",
        help: "Private key (PEM) of tls_cert [default: none]" },
    Key { name: "max_frame_bytes", flag: "max-frame-bytes", kind: BYTES, value_name: "BYTES",
        help: "Largest WebSocket frame a client may send; larger closes with 1009 [default: 65536]" },
    Key { name: "max_message_bytes", flag: "max-message-bytes", kind: BYTES, value_name: "BYTES",
        help: "Largest client message assembled from fragments; larger closes with 1009 [default: 65536]" },
    Key { name: "max_connections", flag: "max-connections", kind: COUNT, value_name: "N",
        help: "WebSocket connections this node holds, at most (open-file limit - 256) / 2; more are refused with 503; 0: only that bound [default: 15000]" },
    Key { name: "max_connections_per_ip", flag: "max-connections-per-ip", kind: COUNT, value_name: "N",
        help: "WebSocket connections per client IP; more are refused with 429; 0: no limit [default: 1000]" },
    Key { name: "handshakes_per_ip_per_sec", flag: "handshakes-per-ip-per-sec", kind: COUNT, value_name: "N",
        help: "WebSocket handshakes per second per IP (burst: twice that); more get 429; 0: no limit [default: 100]" },
    Key { name: "max_messages_per_sec", flag: "max-messages-per-sec", kind: COUNT, value_name: "N",
        help: "Messages per second a connection may send (burst: twice that); more get error rate_limited; 0: no limit [default: 100]" },
    Key { name: "max_bad_messages", flag: "max-bad-messages", kind: COUNT, value_name: "N",
        help: "Refused messages (malformed or over the rate) per minute before the connection is closed with 1008 [default: 100]" },
    Key { name: "max_history_limit", flag: "max-history-limit", kind: COUNT, value_name: "N",
        help: "Largest limit a history read may ask for [default: 1000]" },
    Key { name: "subscribe_timeout_secs", flag: "subscribe-timeout-secs", kind: SECS, value_name: "SECS",
        help: "Close connections that subscribed to no room this long after connecting with 1008; 0: never [default: 0]" },
    Key { name: "handshake_timeout_ms", flag: "handshake-timeout-ms", kind: MS, value_name: "MS",
        help: "Time a client has to send a complete request head, e.g. the WebSocket upgrade [default: 5000]" },
    Key { name: "ws_echo", flag: "ws-echo", kind: Kind::Bool, value_name: "BOOL",
        help: "Test only: /v1/echo echoes WebSocket messages without a token, for conformance suites [default: false]" },
    Key { name: "cluster_nats_url", flag: "cluster-nats-url", kind: Kind::Text, value_name: "URL",
        help: "Cluster mode: nats://HOST:PORT of a NATS server with JetStream shared by every node [default: single node]" },
    Key { name: "directory_outage_secs", flag: "directory-outage-secs", kind: SECS, value_name: "SECS",
        help: "Cluster mode: while NATS is unreachable, new sessions are queued this long, then refused [default: 30]" },
    Key { name: "cluster_heartbeat_ms", flag: "cluster-heartbeat-ms", kind: MS, value_name: "MS",
        help: "Cluster mode: heartbeat period; a peer not heard for 3 periods is down [default: 1000]" },
];

/// Prefix of every environment variable livegate reads.
pub const ENV_PREFIX: &str = "LIVEGATE_";
/// Environment variable naming the config file (same as `--config`).
pub const ENV_CONFIG_FILE: &str = "LIVEGATE_CONFIG";
/// Environment variable choosing the log format (same as `--log-format`).
pub const ENV_LOG_FORMAT: &str = "LIVEGATE_LOG_FORMAT";
/// `LIVEGATE_*` variables that are not configuration keys but are still known.
const ENV_NOT_KEYS: &[&str] = &[ENV_CONFIG_FILE, ENV_LOG_FORMAT];

fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// Where a configuration value came from; error messages name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    File { path: PathBuf, key: &'static str },
    Env { var: String },
    Flag { flag: &'static str },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, key } => write!(f, "{key} in {}", path.display()),
            Origin::Env { var } => f.write_str(var),
            Origin::Flag { flag } => write!(f, "--{flag}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {reason}")]
    ReadFile { path: PathBuf, reason: String },
    #[error("config file {path} is not valid TOML: {reason}")]
    ParseFile { path: PathBuf, reason: String },
    #[error("config file {path}: unknown key `{key}` (known keys: {})", known_keys())]
    UnknownKey { path: PathBuf, key: String },
    #[error("{origin}: expected {expected}, got {got}")]
    BadValue { origin: Origin, expected: &'static str, got: String },
    #[error("{key} {problem}{}", set_by(origin))]
    Invalid { key: &'static str, problem: String, origin: Option<Origin> },
    #[error("API key file {path}: {reason}")]
    ApiKeyFile { path: PathBuf, reason: String },
    #[error("cannot generate an API key: no randomness available: {0}")]
    Random(String),
}

fn known_keys() -> String {
    KEYS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

fn set_by(origin: &Option<Origin>) -> String {
    match origin {
        Some(origin) => format!(" (set by {origin})"),
        None => String::new(),
    }
}

// ---------------------------------------------------------------------------------------
// Command-line flags
// ---------------------------------------------------------------------------------------

/// The configuration flags: `--config PATH` and one optional `--key-with-dashes VALUE`
/// per entry of [`KEYS`]. Values stay text here and are parsed by [`Config::load`], so a
/// bad flag gets the same message as a bad environment variable. The flags are global:
/// they may come before or after a subcommand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFlags {
    /// `--config PATH` (when absent, `LIVEGATE_CONFIG` may name the file).
    pub config: Option<PathBuf>,
    values: BTreeMap<&'static str, String>,
}

const HELP_HEADING: &str = "Configuration (flags win over LIVEGATE_<KEY> variables, which win over the config file)";

impl ConfigFlags {
    /// Sets a key as if its flag were given; panics on a name that is not in [`KEYS`]
    /// (a programming error, not a user's).
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Self {
        let key = key(name).unwrap_or_else(|| panic!("no configuration key named {name:?}"));
        self.values.insert(key.name, value.into());
        self
    }

    /// The value given for a key, as text.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The config file to read: `--config`, else `LIVEGATE_CONFIG`, else none.
    pub fn config_file<'a>(&self, env: impl IntoIterator<Item = &'a (String, String)>) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            env.into_iter()
                .find(|(name, value)| name == ENV_CONFIG_FILE && !value.is_empty())
                .map(|(_, value)| PathBuf::from(value))
        })
    }
}

impl clap::FromArgMatches for ConfigFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = ConfigFlags::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        if let Some(path) = matches.get_one::<PathBuf>("config") {
            self.config = Some(path.clone());
        }
        for key in KEYS {
            if let Some(value) = matches.get_one::<String>(key.name) {
                self.values.insert(key.name, value.clone());
            }
        }
        Ok(())
    }
}

impl clap::Args for ConfigFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let config = clap::Arg::new("config")
            .long("config")
            .value_name("PATH")
            .value_parser(clap::value_parser!(PathBuf))
            .global(true)
            .help_heading(HELP_HEADING)
            .help("TOML file with configuration keys (also LIVEGATE_CONFIG)");
        KEYS.iter().fold(cmd.arg(config), |cmd, key| {
            cmd.arg(
                clap::Arg::new(key.name)
                    .long(key.flag)
                    .value_name(key.value_name)
                    .value_parser(clap::value_parser!(String))
                    .global(true)
                    .help_heading(HELP_HEADING)
                    .help(key.help),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

/// The API key to use, and where it was written when it was generated just now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedApiKey {
    pub key: String,
    /// `Some(path)` when no key existed and a new one was generated and stored there.
    pub generated_at: Option<PathBuf>,
}

/// Shortest API key accepted, configured or read from the key file.
pub const API_KEY_MIN_CHARS: usize = 16;

impl Config {
    /// Builds the configuration from its layers, later winning: defaults, the TOML `file`,
    /// `LIVEGATE_<KEY>` variables from `env`, then `flags`; then validates it.
    /// `file` is read as given (see [`ConfigFlags::config_file`] for choosing it).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &ConfigFlags,
    ) -> Result<Config, ConfigError> {
        let mut layers = Layers::default();
        if let Some(path) = file {
            layers.add_file(path)?;
        }
        layers.add_env(env)?;
        layers.add_flags(flags)?;
        layers.finish()
    }

    /// [`Config::load`] with this process's environment and the file named by
    /// `--config` or `LIVEGATE_CONFIG`.
    pub fn load_from_process(flags: &ConfigFlags) -> Result<Config, ConfigError> {
        let env = process_env();
        let file = flags.config_file(&env);
        Config::load(file.as_deref(), env, flags)
    }

    /// Checks every value; the first problem found is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        at_most("batch_window_ms", self.batch_window_ms, 10_000, "10000 (10 seconds)")?;
        at_least("heartbeat_secs", self.heartbeat_secs, 1)?;
        at_least("history_size", self.history_size as u64, 1)?;
        at_most("history_size", self.history_size as u64, 1_000_000, "1000000")?;
        at_least("recovery_max_events", self.recovery_max_events, 1)?;
        at_least("room_idle_secs", self.room_idle_secs, 1)?;
        at_least("session_ttl_secs", self.session_ttl_secs, 1)?;
        at_least("session_cache_max", self.session_cache_max as u64, 1)?;
        at_least("store_cache_mb", self.store_cache_mb, 1)?;
        for block in &self.trusted_proxies {
            if block.parse::<crate::core::proxies::Cidr>().is_err() {
                let problem = format!("entries are addresses or blocks such as 10.0.0.0/8 or ::1/128, got {block:?}");
                return Err(invalid("trusted_proxies", problem));
            }
        }
        at_most("store_cache_mb", self.store_cache_mb, 1 << 20, "1048576 (1 TiB)")?;
        at_least("max_event_bytes", self.max_event_bytes as u64, 16)?;
        at_most("max_event_bytes", self.max_event_bytes as u64, MAX_EVENT_BYTES_LIMIT, "16777216 (16 MiB)")?;
        at_least("max_subscriptions", self.max_subscriptions as u64, 1)?;
        at_least("token_ttl_max_secs", self.token_ttl_max_secs, 1)?;
        at_least("max_outbox_bytes", self.max_outbox_bytes as u64, 4096)?;
        if !is_name(&self.node, 64) {
            return Err(invalid(
                "node",
                format!("must be 1 to 64 characters from A-Z a-z 0-9 _ . -, got {:?}", self.node),
            ));
        }
        if let Some(api_key) = &self.api_key {
            let chars = api_key.chars().count();
            if chars < API_KEY_MIN_CHARS {
                // Never echo the key itself.
                return Err(invalid(
                    "api_key",
                    format!("must be at least {API_KEY_MIN_CHARS} characters long, got {chars}"),
                ));
            }
        }
        if !is_name(&self.cell, 64) {
            return Err(invalid("cell", format!("must be 1 to 64 characters from A-Z a-z 0-9 _ . -, got {:?}", self.cell)));
        }
        at_least("probe_interval_ms", self.probe_interval_ms, 50)?;
        for (key, value) in [("max_frame_bytes", self.max_frame_bytes), ("max_message_bytes", self.max_message_bytes)] {
            at_least(key, value as u64, 1024)?;
            at_most(key, value as u64, MAX_CLIENT_MESSAGE_LIMIT, "67108864 (64 MiB)")?;
        }
        at_least("max_history_limit", self.max_history_limit as u64, 1)?;
        at_least("handshake_timeout_ms", self.handshake_timeout_ms, 100)?;
        for key in &self.previous_api_keys {
            if key.chars().count() < API_KEY_MIN_CHARS {
                // Never echo a key.
                return Err(invalid("previous_api_keys", format!("entries must be at least {API_KEY_MIN_CHARS} characters long")));
            }
        }
        for origin in &self.allowed_origins {
            if !(origin.starts_with("http://") || origin.starts_with("https://")) || origin.ends_with('/') {
                return Err(invalid("allowed_origins", format!("entries are scheme://host[:port] without a path, got {origin:?}")));
            }
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(invalid("tls_cert", "and tls_key must be set together".to_string()));
        }
        at_least("probe_up_after", self.probe_up_after, 1)?;
        at_least("cluster_heartbeat_ms", self.cluster_heartbeat_ms, 50)?;
        if let Some(url) = &self.cluster_nats_url {
            let bare = url.strip_prefix("nats://").or_else(|| url.strip_prefix("tls://"));
            if bare.is_none_or(|rest| rest.is_empty() || rest.contains('/')) {
                // Not echoed: the URL may carry credentials.
                return Err(invalid("cluster_nats_url", "must be nats://HOST:PORT or tls://HOST:PORT".to_string()));
            }
            if !self.peers.is_empty() {
                return Err(invalid("peers", "must be empty in cluster mode: nodes find each other by heartbeats".to_string()));
            }
        }
        for peer in self.peer_nodes()? {
            if peer.name == self.node {
                return Err(invalid("peers", format!("lists this node ({}) itself", self.node)));
            }
        }
        for device in &self.exclusive_devices {
            if !is_name(device, 32) {
                return Err(invalid(
                    "exclusive_devices",
                    format!("entries must be 1 to 32 characters from A-Z a-z 0-9 _ . -, got {device:?}"),
                ));
            }
        }
        Ok(())
    }

    /// Where the API key is stored when it is not configured: `data_dir/api_key`.
    pub fn api_key_path(&self) -> PathBuf {
        self.data_dir.join("api_key")
    }

    /// The API key without generating one: the configured key, else the trimmed contents
    /// of [`Config::api_key_path`] when that file exists, else `None`.
    /// Client commands use this: they must never invent a key the server does not know.
    pub fn existing_api_key(&self) -> Result<Option<String>, ConfigError> {
        if let Some(key) = &self.api_key {
            return Ok(Some(key.clone()));
        }
        let path = self.api_key_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => check_stored_key(&path, text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ConfigError::ApiKeyFile { path, reason: e.to_string() }),
        }
    }

    /// The API key the server uses: [`Config::existing_api_key`], else a new random key
    /// (32 bytes, base64url without padding) written to [`Config::api_key_path`] with mode
    /// 0600, creating `data_dir` if needed.
    pub fn resolve_api_key(&self) -> Result<ResolvedApiKey, ConfigError> {
        if let Some(key) = self.existing_api_key()? {
            return Ok(ResolvedApiKey { key, generated_at: None });
        }
        let path = self.api_key_path();
        let file_error = |e: std::io::Error| ConfigError::ApiKeyFile { path: path.clone(), reason: e.to_string() };
        std::fs::create_dir_all(&self.data_dir).map_err(|e| ConfigError::ApiKeyFile {
            path: path.clone(),
            reason: format!("cannot create {}: {e}", self.data_dir.display()),
        })?;
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes).map_err(|e| ConfigError::Random(e.to_string()))?;
        let key = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, bytes);

        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // create_new: if another process wrote a key in the meantime, use that one.
        let mut file = match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(&path).map_err(file_error)?;
                let key = check_stored_key(&path, text)?;
                return Ok(ResolvedApiKey { key, generated_at: None });
            }
            Err(e) => return Err(file_error(e)),
        };
        file.write_all(format!("{key}\n").as_bytes()).map_err(file_error)?;
        file.sync_all().map_err(file_error)?;
        Ok(ResolvedApiKey { key, generated_at: Some(path) })
    }
}

/// Upper bound of `max_event_bytes`: 16 MiB.
const MAX_EVENT_BYTES_LIMIT: u64 = 16 * 1024 * 1024;
const MAX_CLIENT_MESSAGE_LIMIT: u64 = 64 * 1024 * 1024;

fn check_stored_key(path: &Path, text: String) -> Result<String, ConfigError> {
    let key = text.trim();
    let problem = if key.is_empty() {
        "is empty"
    } else if key.chars().count() < API_KEY_MIN_CHARS {
        "holds a key shorter than 16 characters"
    } else {
        return Ok(key.to_string());
    };
    Err(ConfigError::ApiKeyFile {
        path: path.to_path_buf(),
        reason: format!("{problem}: delete it to have a new key generated, or set api_key"),
    })
}

fn invalid(key: &'static str, problem: String) -> ConfigError {
    ConfigError::Invalid { key, problem, origin: None }
}

fn at_least(key: &'static str, value: u64, min: u64) -> Result<(), ConfigError> {
    if value < min {
        return Err(invalid(key, format!("must be at least {min}, got {value}")));
    }
    Ok(())
}

fn at_most(key: &'static str, value: u64, max: u64, max_text: &str) -> Result<(), ConfigError> {
    if value > max {
        return Err(invalid(key, format!("must be at most {max_text}, got {value}")));
    }
    Ok(())
}

/// `[A-Za-z0-9_.-]{1,max}`.
fn is_name(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// This process's environment as text pairs; variables that are not valid UTF-8 are
/// skipped (with a warning when they look like ours).
fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => Some((name, value)),
            (Ok(name), Err(_)) => {
                if name.starts_with(ENV_PREFIX) {
                    tracing::warn!("ignoring environment variable {name}: its value is not valid UTF-8");
                }
                None
            }
            _ => None,
        })
        .collect()
}

/// The layers seen so far: each key's value (as TOML, already checked against its kind)
/// and where the winning value came from.
#[derive(Default)]
struct Layers {
    values: toml::Table,
    origins: BTreeMap<&'static str, Origin>,
}

impl Layers {
    fn set(&mut self, key: &'static Key, value: toml::Value, origin: Origin) {
        self.values.insert(key.name.to_string(), value);
        self.origins.insert(key.name, origin);
    }

    fn add_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::ReadFile { path: path.to_path_buf(), reason: e.to_string() })?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            // Name the line: "invalid basic string" alone does not say where.
            let line = e.span().map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
            let reason = match line {
                Some(line) => format!("{} (line {line})", e.message()),
                None => e.message().to_string(),
            };
            ConfigError::ParseFile { path: path.to_path_buf(), reason }
        })?;
        for (name, value) in table {
            let Some(key) = key(&name) else {
                return Err(ConfigError::UnknownKey { path: path.to_path_buf(), key: name });
            };
            let origin = Origin::File { path: path.to_path_buf(), key: key.name };
            let value = from_toml(key, value, &origin)?;
            self.set(key, value, origin);
        }
        Ok(())
    }

    fn add_env(&mut self, env: impl IntoIterator<Item = (String, String)>) -> Result<(), ConfigError> {
        for (var, text) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else { continue };
            if ENV_NOT_KEYS.contains(&var.as_str()) {
                continue;
            }
            let Some(key) = KEYS.iter().find(|k| k.env_var() == var) else {
                tracing::warn!(
                    "ignoring unknown environment variable {var}: livegate has no configuration key {:?}",
                    rest.to_ascii_lowercase()
                );
                continue;
            };
            let origin = Origin::Env { var };
            let value = from_text(key, &text, &origin)?;
            self.set(key, value, origin);
        }
        Ok(())
    }

    fn add_flags(&mut self, flags: &ConfigFlags) -> Result<(), ConfigError> {
        for key in KEYS {
            if let Some(text) = flags.get(key.name) {
                let origin = Origin::Flag { flag: key.flag };
                let value = from_text(key, text, &origin)?;
                self.set(key, value, origin);
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Config, ConfigError> {
        let Layers { values, origins } = self;
        // Every value was checked against its key's kind, so this only fails on a bug;
        // the message still says what went wrong.
        let config: Config = toml::Value::Table(values)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Invalid {
                key: "config",
                problem: format!("could not be assembled: {}", e.message()),
                origin: None,
            })?;
        config.validate().map_err(|e| match e {
            ConfigError::Invalid { key, problem, origin: None } => {
                ConfigError::Invalid { key, problem, origin: origins.get(key).cloned() }
            }
            other => other,
        })?;
        Ok(config)
    }
}

/// Keys whose values are secrets: error messages never repeat them.
const SECRET_KEYS: &[&str] = &["api_key", "previous_api_keys"];

/// A value as an error message may show it.
fn shown(key: &Key, value: &str) -> String {
    if SECRET_KEYS.contains(&key.name) {
        "a value that is not shown (a secret)".to_string()
    } else {
        value.to_string()
    }
}

/// Parses a text value (environment variable or flag) according to the key's kind.
fn from_text(key: &Key, text: &str, origin: &Origin) -> Result<toml::Value, ConfigError> {
    let bad =
        || ConfigError::BadValue { origin: origin.clone(), expected: key.kind.expected(), got: shown(key, &format!("{text:?}")) };
    Ok(match key.kind {
        Kind::Number(_) => {
            let n: u64 = text.trim().parse().map_err(|_| bad())?;
            toml::Value::Integer(i64::try_from(n).map_err(|_| bad())?)
        }
        Kind::Address => {
            let addr: SocketAddr = text.trim().parse().map_err(|_| bad())?;
            toml::Value::String(addr.to_string())
        }
        Kind::Path => {
            if text.is_empty() {
                return Err(bad());
            }
            toml::Value::String(text.to_string())
        }
        Kind::Text => toml::Value::String(text.to_string()),
        Kind::Bool => match text.trim() {
            "true" => toml::Value::Boolean(true),
            "false" => toml::Value::Boolean(false),
            _ => return Err(bad()),
        },
        Kind::List => toml::Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_string()))
                .collect(),
        ),
    })
}

/// Checks a value from the TOML file against the key's kind. A list may also be written
/// as one comma-separated string, as in the environment.
fn from_toml(key: &Key, value: toml::Value, origin: &Origin) -> Result<toml::Value, ConfigError> {
    let bad = |value: &toml::Value| ConfigError::BadValue {
        origin: origin.clone(),
        expected: key.kind.expected(),
        got: shown(key, &value.to_string()),
    };
    match (key.kind, &value) {
        (Kind::Number(_), toml::Value::Integer(n)) if *n >= 0 => Ok(value),
        (Kind::Address, toml::Value::String(s)) => match s.trim().parse::<SocketAddr>() {
            Ok(addr) => Ok(toml::Value::String(addr.to_string())),
            Err(_) => Err(bad(&value)),
        },
        (Kind::Path, toml::Value::String(s)) if !s.is_empty() => Ok(value),
        (Kind::Text, toml::Value::String(_)) => Ok(value),
        (Kind::Bool, toml::Value::Boolean(_)) => Ok(value),
        (Kind::List, toml::Value::String(s)) => from_text(key, s, origin),
        (Kind::List, toml::Value::Array(items)) if items.iter().all(toml::Value::is_str) => Ok(value),
        _ => Err(bad(&value)),
    }
}

#[cfg(test)]
mod tests;
