//! The command line. `serve` (the default) runs the gateway; `token`, `publish` and
//! `subscribe` are small clients of a running server's public HTTP and WebSocket API,
//! for trying livegate out and for scripts. Clients read the server address (`listen`)
//! and the API key (`api_key`, else `data_dir/api_key`) from the same configuration
//! layers as the server, so the same flags, environment and config file work for both.
//!
//! `main.rs` only calls [`main`]. Output convention: results go to stdout (a token, a
//! publish reply, one JSON line per event), everything else to stderr; errors are one
//! line `livegate: <error>`, exit code 2 for bad configuration or arguments, 1 otherwise.

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{self, protocol::CloseFrame, Message};

use crate::config::{Config, ConfigError, ConfigFlags, ENV_LOG_FORMAT};
use crate::protocol::{close_meaning, CloseCode};

const ABOUT: &str = "Real-time push gateway: WebSocket subscribers, HTTP publishers, durable per-room event logs";

const LONG_ABOUT: &str = "\
Real-time push gateway: WebSocket subscribers, HTTP publishers, durable per-room event logs.

Clients hold WebSocket connections and subscribe to rooms; backends publish events to a
room over HTTP. Every event gets the room's next sequence number, is stored on disk, and
reaches every subscriber in order. A client that reconnects names the last sequence it saw
and gets exactly what it missed.

`livegate` alone (or `livegate serve`) starts a server. `token`, `publish` and `subscribe`
talk to a running server; they find its address (listen) and API key (api_key, or the key
file the server generated in data_dir) in the same configuration as the server, so give
them the same flags, LIVEGATE_* variables or config file.";

const EXAMPLES: &str = "\
Examples:
  livegate                                    serve on 127.0.0.1:7070, data in ./data
  livegate serve --listen 0.0.0.0:7070 --data-dir /var/lib/livegate
  livegate subscribe match:1                  print the events of room match:1, one JSON line each
  livegate publish match:1 '{\"goal\":1}'       publish an event (in another terminal)
  T=$(livegate token u1 --device phone)       mint a WebSocket token for user u1";

/// `livegate [CONFIG FLAGS] [COMMAND]`.
#[derive(Debug, Parser)]
#[command(name = "livegate", version, about = ABOUT, long_about = LONG_ABOUT, after_help = EXAMPLES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub config: ConfigFlags,
    /// Format of the log lines on stderr (also LIVEGATE_LOG_FORMAT); RUST_LOG sets the
    /// level [default: pretty]
    #[arg(long, value_enum, global = true, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event
    Pretty,
    /// One JSON object per line, for log collectors
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (the default when no command is given)
    #[command(long_about = "\
Run the gateway until SIGTERM or Ctrl-C, then drain: report not-ready, ask clients to
reconnect elsewhere, flush the store and exit.

When no API key is configured, one is generated on first start and stored in
DATA_DIR/api_key (mode 0600); backends send it as `Authorization: Bearer KEY`.
Once listening, prints one line: `livegate VERSION listening on http://ADDR (...)`.
With --demo, also serves a live score page at / fed by a built-in match simulator.")]
    Serve(ServeArgs),
    /// Mint a one-time WebSocket token for a user and print only the token
    #[command(after_help = "Example:\n  T=$(livegate token u1 --device phone --ttl 30)\n  # then connect to ws://127.0.0.1:7070/v1/ws?token=$T")]
    Token(TokenArgs),
    /// Publish one event to a room and print the server's reply (room, seq, epoch, duplicate)
    #[command(after_help = "Example:\n  livegate publish match:1 '{\"goal\":1}' --id goal-1\n  # publishing the same --id again is answered with the first seq and \"duplicate\":true")]
    Publish(PublishArgs),
    /// Follow rooms as a WebSocket client: print each event as one JSON line
    #[command(long_about = "\
Follow rooms as a WebSocket client: print each event as one compact JSON line on stdout
({\"room\",\"seq\",\"id\",\"ts_ms\",\"data\"}), notices on stderr.

When the connection drops, reconnects (backoff 0.5 s, 1 s, 2 s, 4 s, then every 5 s) and
resumes after the last event it printed, so no event is printed twice or missed while the
server's history covers the gap; otherwise it says `recovery failed for ROOM: reload state`.
Runs until Ctrl-C, or until the server closes the connection for good (codes 4500-4999).")]
    Subscribe(SubscribeArgs),
    /// Route sessions offline with the same pure function the server uses; one line each
    #[command(long_about = "\
Route sessions offline with the same pure function the server uses, and print one line per
session: `SESSION NODE`, or `SESSION error: REASON`.

--nodes FILE: one node per line, `NAME` (alive) or `NAME down`.
--sessions FILE: one session per line, `SESSION` or `SESSION RECORDED_OWNER`.
Blank lines and lines starting with # are skipped. The answer depends only on the input,
never on its order: two runs (on any machine) print the same bytes.")]
    Route(RouteArgs),
    /// Check the configuration and print the effective values, secrets masked
    #[command(long_about = "\
Load the configuration exactly as `serve` would (file, LIVEGATE_* variables, flags), check
every value, and print the effective configuration as TOML with the API key masked.
Exits 0 when it is valid, 2 with one line naming the bad key and where it was set.")]
    CheckConfig,
    /// Ask a running server for its status (node, version, uptime, phase, counts)
    Status {
        #[command(flatten)]
        server: ServerUrl,
    },
}

#[derive(Debug, Clone, Args)]
pub struct RouteArgs {
    /// File listing the nodes, one per line: NAME [down]
    #[arg(long, value_name = "FILE")]
    pub nodes: std::path::PathBuf,
    /// File listing the sessions, one per line: SESSION [RECORDED_OWNER]
    #[arg(long, value_name = "FILE")]
    pub sessions: std::path::PathBuf,
}

#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// Demo mode: a match simulator publishes into match:1..4 and / serves a live score page
    #[arg(long)]
    pub demo: bool,
}

/// Where the client commands find the server.
#[derive(Debug, Clone, Args)]
pub struct ServerUrl {
    /// Server to talk to, such as http://127.0.0.1:7070 [default: http:// + the listen
    /// address, with 127.0.0.1 for 0.0.0.0]
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct TokenArgs {
    /// User the token is for
    pub user: String,
    /// Device kind of the connection; exclusive devices (phone, pc) keep one connection per user
    #[arg(long, default_value = "web", value_name = "DEVICE")]
    pub device: String,
    /// Seconds the token stays usable (it is good for one connection)
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub ttl: u64,
    #[command(flatten)]
    pub server: ServerUrl,
}

#[derive(Debug, Clone, Args)]
pub struct PublishArgs {
    /// Room to publish to, such as match:1
    pub room: String,
    /// Event data: any JSON value (quote it for the shell: '{"goal":1}')
    #[arg(value_name = "JSON")]
    pub data: String,
    /// Idempotency id: publishing the same id again does not create a second event
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    #[command(flatten)]
    pub server: ServerUrl,
}

#[derive(Debug, Clone, Args)]
pub struct SubscribeArgs {
    /// Rooms to follow
    #[arg(required = true, value_name = "ROOM")]
    pub rooms: Vec<String>,
    /// Start by replaying the events after this sequence number (needs --epoch)
    #[arg(long, value_name = "SEQ")]
    pub since: Option<u64>,
    /// Epoch the --since sequence belongs to (from an earlier `subscribed` notice)
    #[arg(long, value_name = "EPOCH")]
    pub epoch: Option<String>,
    /// User to connect as
    #[arg(long, default_value = "cli", value_name = "USER")]
    pub user: String,
    /// Device kind to connect as
    #[arg(long, default_value = "cli", value_name = "DEVICE")]
    pub device: String,
    #[command(flatten)]
    pub server: ServerUrl,
}

/// Why a command failed; `Display` is the one line printed after `livegate: `.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A bad argument, found before doing anything.
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Config(_) | CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}

fn failed(message: impl Into<String>) -> CliError {
    CliError::Failed(message.into())
}

/// Parses the command line and runs the command; what `main.rs` calls.
pub fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("livegate: {e}");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<(), CliError> {
    let format = log_format(cli.log_format)?;
    match cli.command.unwrap_or(Command::Serve(ServeArgs::default())) {
        Command::Serve(args) => {
            init_tracing(format, "info");
            serve(&cli.config, args.demo)
        }
        Command::Token(args) => {
            init_tracing(format, "warn");
            let token = Client::from_config(&cli.config, &args.server)?.mint_token(&args.user, &args.device, args.ttl)?;
            print_line(&token)
        }
        Command::Publish(args) => {
            // Check the argument before reading any configuration or sending anything.
            let data: Value = serde_json::from_str(&args.data).map_err(|e| {
                CliError::Usage(format!(
                    "event data is not valid JSON ({e}); pass one JSON value, quoted for the shell, such as '{{\"goal\":1}}'"
                ))
            })?;
            init_tracing(format, "warn");
            let client = Client::from_config(&cli.config, &args.server)?;
            let mut body = serde_json::Map::new();
            if let Some(id) = args.id {
                body.insert("id".into(), id.into());
            }
            body.insert("data".into(), data);
            let reply = client.post(&format!("/v1/rooms/{}/events", encode(&args.room)), &Value::Object(body))?;
            print_line(reply.trim())
        }
        Command::Route(args) => route_offline(&args),
        Command::CheckConfig => check_config(&cli.config),
        Command::Status { server } => {
            init_tracing(format, "warn");
            let reply = Client::from_config(&cli.config, &server)?.get("/v1/admin/status")?;
            print_line(reply.trim())
        }
        Command::Subscribe(args) => {
            init_tracing(format, "warn");
            let client = Client::from_config(&cli.config, &args.server)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| failed(format!("cannot start the async runtime: {e}")))?;
            let result = runtime.block_on(Subscriber::new(client, args).run());
            // Do not wait for a token request still in flight after Ctrl-C.
            runtime.shutdown_background();
            result
        }
    }
}

/// `livegate check-config`: the effective configuration, validated, secrets masked.
fn check_config(flags: &ConfigFlags) -> Result<(), CliError> {
    let mut config = Config::load_from_process(flags)?;
    let key_note = match &config.api_key {
        Some(_) => "api_key is set (masked below)".to_string(),
        None => format!("api_key is not set: serve uses or generates {}", config.api_key_path().display()),
    };
    if config.api_key.is_some() {
        config.api_key = Some("********".into());
    }
    let text = toml::to_string(&config).map_err(|e| failed(format!("cannot print the configuration: {e}")))?;
    print_line(&format!("# configuration is valid; {key_note}\n{}", text.trim_end()))
}

/// `livegate route`: the pure session routing over files, for checking determinism.
fn route_offline(args: &RouteArgs) -> Result<(), CliError> {
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))
    };
    let lines = |text: &str| -> Vec<Vec<String>> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    };
    let nodes = lines(&read(&args.nodes)?);
    let mut owners: Vec<&str> = Vec::new();
    let mut alive: Vec<&str> = Vec::new();
    for fields in &nodes {
        match fields.as_slice() {
            [name] => {
                owners.push(name);
                alive.push(name);
            }
            [name, state] if state == "down" => owners.push(name),
            _ => return Err(CliError::Usage(format!("bad node line {:?}: expected NAME or NAME down", fields.join(" ")))),
        }
    }
    let mut out = String::new();
    for fields in lines(&read(&args.sessions)?) {
        let (session, recorded) = match fields.as_slice() {
            [session] => (session.as_str(), None),
            [session, owner] => (session.as_str(), Some(owner.as_str())),
            _ => return Err(CliError::Usage(format!("bad session line {:?}: expected SESSION [OWNER]", fields.join(" ")))),
        };
        match crate::core::routing::route_session(session, recorded, &owners, &alive) {
            Ok(node) => out.push_str(&format!("{session} {node}\n")),
            Err(e) => out.push_str(&format!("{session} error: {e}\n")),
        }
    }
    use std::io::Write;
    std::io::stdout().lock().write_all(out.as_bytes()).map_err(|e| failed(format!("cannot write output: {e}")))
}

fn log_format(flag: Option<LogFormat>) -> Result<LogFormat, CliError> {
    if let Some(format) = flag {
        return Ok(format);
    }
    match std::env::var(ENV_LOG_FORMAT) {
        Ok(text) if !text.is_empty() => LogFormat::from_str(&text, true)
            .map_err(|_| CliError::Usage(format!("{ENV_LOG_FORMAT}: expected pretty or json, got {text:?}"))),
        _ => Ok(LogFormat::Pretty),
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `default_level`).
fn init_tracing(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // try_init: a second initialisation (tests calling `run` twice) is not an error.
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Prints one line on stdout and flushes it, so a reading process sees it at once.
fn print_line(line: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| failed(format!("cannot write to stdout: {e}")))
}

// ---------------------------------------------------------------------------------------
// serve
// ---------------------------------------------------------------------------------------

fn serve(flags: &ConfigFlags, demo: bool) -> Result<(), CliError> {
    let mut config = Config::load_from_process(flags)?;
    let resolved = config.resolve_api_key()?;
    if let Some(path) = &resolved.generated_at {
        print_line(&format!("api key generated and stored in {} (mode 0600)", path.display()))?;
    }
    config.api_key = Some(resolved.key);

    let open_files = crate::server::raise_open_files_limit();
    tracing::debug!(open_files, "open-file limit");
    // A node that cannot load its certificate must fail before it announces a listener.
    let scheme = match crate::server::tls_config(&config).map_err(|e| failed(e.to_string()))? {
        Some(_) => "https",
        None => "http",
    };
    let listener = std::net::TcpListener::bind(config.listen)
        .map_err(|e| failed(format!("cannot listen on {}: {e}", config.listen)))?;
    let addr = listener.local_addr().map_err(|e| failed(format!("cannot read the bound address: {e}")))?;

    let system = actix_web::rt::System::new();
    // Install the signal handlers before announcing the address: a SIGTERM sent as soon
    // as the line is read must start a drain, not kill the process.
    let (signals, reloads) = system
        .block_on(async { Ok::<_, std::io::Error>((shutdown_signals()?, reload_signals()?)) })
        .map_err(|e| failed(format!("cannot install signal handlers: {e}")))?;
    print_line(&format!(
        "livegate {} listening on {scheme}://{addr} (node {}, data {})",
        env!("CARGO_PKG_VERSION"),
        config.node,
        config.data_dir.display()
    ))?;
    if demo {
        print_line(&format!("demo: open {scheme}://{addr}/ for the live score page"))?;
    }
    let reload_flags = flags.clone();
    let control = crate::server::Control {
        shutdown: Box::pin(signals),
        reload: Box::pin(reloads),
        reload_config: Some(Box::new(move || Config::load_from_process(&reload_flags))),
        demo,
    };
    system.block_on(crate::server::run_controlled(listener, config, control)).map_err(|e| failed(e.to_string()))
}

/// Every SIGTERM or SIGINT, as a stream: the first starts a drain, a second forces it.
/// Must be called inside a tokio runtime; the handlers are installed by the call, not by
/// the first poll.
fn shutdown_signals() -> std::io::Result<impl futures_util::Stream<Item = ()> + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let terminate = signal(SignalKind::terminate())?;
    let interrupt = signal(SignalKind::interrupt())?;
    Ok(futures_util::stream::unfold((terminate, interrupt), |(mut terminate, mut interrupt)| async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!("{name} received");
        Some(((), (terminate, interrupt)))
    }))
}

/// Every SIGHUP, as a stream: each reloads the API keys and allowed origins.
fn reload_signals() -> std::io::Result<impl futures_util::Stream<Item = ()> + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let hangup = signal(SignalKind::hangup())?;
    Ok(futures_util::stream::unfold(hangup, |mut hangup| async move {
        hangup.recv().await?;
        tracing::info!("SIGHUP received: reloading API keys and allowed origins");
        Some(((), hangup))
    }))
}

// ---------------------------------------------------------------------------------------
// HTTP client
// ---------------------------------------------------------------------------------------

/// A server's address and API key, and an HTTP agent for it.
struct Client {
    /// `http://host:port`, no trailing slash.
    base: String,
    key: String,
    agent: ureq::Agent,
}

impl Client {
    fn from_config(flags: &ConfigFlags, server: &ServerUrl) -> Result<Client, CliError> {
        let config = Config::load_from_process(flags)?;
        let base = match &server.url {
            Some(url) => normalize_url(url)?,
            None if config.listen.port() == 0 => {
                return Err(CliError::Usage(format!(
                    "listen is {} (any free port), so the server's port is unknown: pass --url with the address it printed",
                    config.listen
                )))
            }
            None => format!("http://{}", connect_address(config.listen)),
        };
        let key = config.existing_api_key()?.ok_or_else(|| {
            failed(format!(
                "no API key: start the server once or set api_key (no key file at {})",
                config.api_key_path().display()
            ))
        })?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build();
        Ok(Client { base, key, agent })
    }

    /// `ws://host:port`.
    fn ws_base(&self) -> String {
        format!("ws://{}", self.base.trim_start_matches("http://"))
    }

    /// POSTs JSON with the API key; the reply body on a 2xx status, else an error naming
    /// the status and the server's error code and message.
    fn post(&self, path: &str, body: &Value) -> Result<String, CliError> {
        let request = self.agent.post(&format!("{}{path}", self.base)).set("Authorization", &format!("Bearer {}", self.key));
        self.reply("POST", path, request.send_json(body))
    }

    fn get(&self, path: &str) -> Result<String, CliError> {
        let request = self.agent.get(&format!("{}{path}", self.base)).set("Authorization", &format!("Bearer {}", self.key));
        self.reply("GET", path, request.call())
    }

    fn reply(&self, method: &str, path: &str, reply: Result<ureq::Response, ureq::Error>) -> Result<String, CliError> {
        match reply {
            Ok(response) => {
                response.into_string().map_err(|e| failed(format!("{method} {path}: cannot read the reply: {e}")))
            }
            Err(ureq::Error::Status(status, response)) => Err(failed(format!(
                "{method} {path}: {}",
                status_error(status, &response.into_string().unwrap_or_default())
            ))),
            Err(ureq::Error::Transport(transport)) => Err(failed(format!(
                "cannot reach livegate at {}: {}",
                self.base,
                transport_reason(&transport)
            ))),
        }
    }

    fn mint_token(&self, user: &str, device: &str, ttl_secs: u64) -> Result<String, CliError> {
        let body = serde_json::json!({ "user": user, "device": device, "ttl_secs": ttl_secs });
        let reply = self.post("/v1/tokens", &body)?;
        #[derive(Deserialize)]
        struct Minted {
            token: String,
        }
        serde_json::from_str::<Minted>(&reply)
            .map(|m| m.token)
            .map_err(|_| failed(format!("POST /v1/tokens: unexpected reply {reply:?}")))
    }
}

/// The address a client connects to for a listen address: loopback for "any".
fn connect_address(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port()),
        _ => listen,
    }
}

/// `--url`: `http://host:port` (a bare `host:port` is taken as http); no TLS in this build.
fn normalize_url(url: &str) -> Result<String, CliError> {
    let url = url.trim();
    let rest = match url.split_once("://") {
        None => url.trim_end_matches('/'),
        Some(("http", rest)) => rest.trim_end_matches('/'),
        Some((scheme, _)) => {
            return Err(CliError::Usage(format!("--url: only http:// URLs are supported, got a {scheme}:// URL")))
        }
    };
    if rest.is_empty() || rest.contains('/') {
        return Err(CliError::Usage(format!("--url: expected http://HOST:PORT, got {url:?}")));
    }
    Ok(format!("http://{rest}"))
}

/// One line for a non-2xx reply: `401 unauthorized: invalid API key`.
fn status_error(status: u16, body: &str) -> String {
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
    let mut line = match serde_json::from_str::<ErrorBody>(body) {
        Ok(ErrorBody { error }) if error.message.is_empty() => format!("server answered {status} {}", error.code),
        Ok(ErrorBody { error }) => format!("server answered {status} {}: {}", error.code, error.message),
        Err(_) => {
            let text: String = body.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(200).collect();
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
fn transport_reason(transport: &ureq::Transport) -> String {
    match (std::error::Error::source(transport), transport.message()) {
        (Some(source), _) => source.to_string(),
        (None, Some(message)) => format!("{}: {message}", transport.kind()),
        (None, None) => transport.kind().to_string(),
    }
}

/// Percent-encodes everything but `[A-Za-z0-9_.:~-]`, for a path segment or query value.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'~' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// subscribe
// ---------------------------------------------------------------------------------------

/// Interval of the client's `{"op":"ping"}`.
const PING_EVERY: Duration = Duration::from_secs(20);
/// Limit for each of: opening the WebSocket, receiving `welcome`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that delivers nothing (not even a pong) for this long is dropped and
/// redialled; at least 3 server heartbeats.
const MIN_IDLE_LIMIT: Duration = Duration::from_secs(60);
/// Lifetime of the token minted for each connection attempt.
const TOKEN_TTL_SECS: u64 = 60;
/// Longest server-suggested reconnect delay honoured.
const MAX_HINT: Duration = Duration::from_secs(60);

type WebSocket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What the client knows about one room across connections.
#[derive(Debug, Default)]
struct RoomState {
    epoch: Option<String>,
    /// Highest seq printed (or the head at a live subscription): events at or below it
    /// are never printed again, and a reconnect resumes after it.
    last_seq: Option<u64>,
    /// The `since` of the subscribe request waiting for its reply.
    asked_since: Option<u64>,
}

/// How one connection attempt ended.
enum Ended {
    /// Ctrl-C: end the command successfully.
    Interrupted,
    /// Stdout is gone (for example `| head`): end quietly.
    OutputClosed,
    /// The server said not to reconnect (close codes 4500-4999).
    Final(String),
    /// Dial again after `hint` (from the server) or the backoff. `welcomed`: this attempt
    /// got as far as the server's `welcome`.
    Retry { reason: String, hint: Option<Duration>, welcomed: bool },
}

fn retry(reason: impl Into<String>, welcomed: bool) -> Ended {
    Ended::Retry { reason: reason.into(), hint: None, welcomed }
}

/// Reconnect delays: 0.5 s, 1 s, 2 s, 4 s, then 5 s; back to the start after a
/// connection got its `welcome`.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(5);

    fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }
}

#[derive(Deserialize)]
struct FrameHead {
    op: String,
    #[serde(rename = "ref", default)]
    reference: Option<i64>,
}

#[derive(Deserialize)]
struct Welcome {
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    heartbeat_ms: Option<u64>,
}

#[derive(Deserialize)]
struct EventsFrame<'a> {
    #[serde(borrow)]
    events: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
struct EventHead {
    room: String,
    seq: u64,
}

#[derive(Deserialize)]
struct Subscribed {
    room: String,
    epoch: String,
    seq: u64,
    #[serde(default)]
    recovered: Option<bool>,
}

#[derive(Deserialize)]
struct ErrorFrame {
    #[serde(rename = "ref", default)]
    reference: Option<i64>,
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

struct Subscriber {
    client: Arc<Client>,
    user: String,
    device: String,
    /// The rooms asked for, in order; request `ref` i+1 is `rooms[i]`.
    rooms: Vec<String>,
    state: HashMap<String, RoomState>,
    /// The session from the last `welcome`, offered again on reconnect.
    session: Option<String>,
    interrupted: Pin<Box<dyn Future<Output = std::io::Result<()>>>>,
    /// Where events are printed: stdout, or a buffer in tests.
    out: Box<dyn Write>,
}

impl Subscriber {
    fn new(client: Client, args: SubscribeArgs) -> Self {
        let mut rooms: Vec<String> = vec![];
        for room in args.rooms {
            if !rooms.contains(&room) {
                rooms.push(room);
            }
        }
        let state = rooms
            .iter()
            .map(|room| {
                let state = RoomState { epoch: args.epoch.clone(), last_seq: args.since, asked_since: None };
                (room.clone(), state)
            })
            .collect();
        Subscriber {
            client: Arc::new(client),
            user: args.user,
            device: args.device,
            rooms,
            state,
            session: None,
            interrupted: Box::pin(tokio::signal::ctrl_c()),
            out: Box::new(std::io::stdout()),
        }
    }

    async fn run(mut self) -> Result<(), CliError> {
        let mut backoff = Backoff::new();
        let mut ever_welcomed = false;
        loop {
            let (reason, hint) = match self.connect_once().await {
                Ended::Interrupted | Ended::OutputClosed => return Ok(()),
                Ended::Final(message) => return Err(failed(message)),
                Ended::Retry { reason, welcomed: false, .. } if !ever_welcomed => return Err(failed(reason)),
                Ended::Retry { reason, hint, welcomed } => {
                    if welcomed {
                        ever_welcomed = true;
                        backoff.reset();
                    }
                    (reason, hint)
                }
            };
            let delay = hint.unwrap_or_else(|| backoff.next_delay());
            eprintln!("{reason}; reconnecting in {:.1} s", delay.as_secs_f64());
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = &mut self.interrupted => return Ok(()),
            }
        }
    }

    /// One connection: mint a token, open the socket, wait for `welcome`, subscribe, then
    /// print events until the connection ends.
    async fn connect_once(&mut self) -> Ended {
        let client = Arc::clone(&self.client);
        let (user, device) = (self.user.clone(), self.device.clone());
        let minting = tokio::task::spawn_blocking(move || client.mint_token(&user, &device, TOKEN_TTL_SECS));
        let token = tokio::select! {
            minted = minting => match minted {
                Ok(Ok(token)) => token,
                Ok(Err(e)) => return retry(e.to_string(), false),
                Err(e) => return retry(format!("minting a token failed: {e}"), false),
            },
            _ = &mut self.interrupted => return Ended::Interrupted,
        };

        let mut url = format!("{}/v1/ws?token={}", self.client.ws_base(), encode(&token));
        if let Some(session) = &self.session {
            url.push_str(&format!("&session={}", encode(session)));
        }
        let connecting = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(url));
        let mut ws = tokio::select! {
            connected = connecting => match connected {
                Ok(Ok((ws, _response))) => ws,
                Ok(Err(tungstenite::Error::Http(response))) => {
                    let body = response.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
                    return retry(format!("WebSocket handshake refused: {}", status_error(response.status().as_u16(), &body)), false);
                }
                Ok(Err(e)) => return retry(format!("cannot open a WebSocket to {}: {e}", self.client.ws_base()), false),
                Err(_) => return retry(format!("no WebSocket handshake from {} within {CONNECT_TIMEOUT:?}", self.client.ws_base()), false),
            },
            _ = &mut self.interrupted => return Ended::Interrupted,
        };

        let heartbeat = match self.await_welcome(&mut ws).await {
            Ok(heartbeat) => heartbeat,
            Err(ended) => return ended,
        };
        for (i, room) in self.rooms.iter().enumerate() {
            let state = self.state.entry(room.clone()).or_default();
            let mut request = serde_json::json!({ "op": "subscribe", "room": room, "ref": i + 1 });
            if let Some(since) = state.last_seq {
                request["since"] = since.into();
            }
            if let Some(epoch) = &state.epoch {
                request["epoch"] = epoch.as_str().into();
            }
            state.asked_since = state.last_seq;
            if let Err(e) = ws.send(Message::text(request.to_string())).await {
                return retry(format!("connection lost while subscribing: {e}"), true);
            }
        }
        self.follow(&mut ws, heartbeat).await
    }

    /// Waits for `welcome`; returns the server's heartbeat interval.
    async fn await_welcome(&mut self, ws: &mut WebSocket) -> Result<Duration, Ended> {
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            let message = tokio::select! {
                message = ws.next() => message,
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(retry(format!("no welcome from the server within {CONNECT_TIMEOUT:?}"), false));
                }
                _ = &mut self.interrupted => return Err(Ended::Interrupted),
            };
            let text = match message {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Close(frame))) => return Err(closed(ws, frame, false).await),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(retry(format!("connection lost before welcome: {e}"), false)),
                None => return Err(retry("connection closed before welcome", false)),
            };
            if !matches!(serde_json::from_str::<FrameHead>(&text), Ok(head) if head.op == "welcome") {
                tracing::debug!("ignoring a frame before welcome: {text}");
                continue;
            }
            let welcome: Welcome = serde_json::from_str(&text).unwrap_or(Welcome { session: None, node: None, heartbeat_ms: None });
            let node = welcome.node.as_deref().unwrap_or("?");
            match (&self.session, &welcome.session) {
                (Some(old), Some(new)) if old != new => {
                    eprintln!("connected to node {node}: new session {new} (session {old} was not kept)")
                }
                (_, Some(new)) => eprintln!("connected to node {node} (session {new})"),
                (_, None) => eprintln!("connected to node {node}"),
            }
            if welcome.session.is_some() {
                self.session = welcome.session;
            }
            return Ok(Duration::from_millis(welcome.heartbeat_ms.unwrap_or(30_000)));
        }
    }

    /// Reads frames until the connection ends, pinging every [`PING_EVERY`].
    async fn follow(&mut self, ws: &mut WebSocket, heartbeat: Duration) -> Ended {
        let idle_limit = (heartbeat * 3).max(MIN_IDLE_LIMIT);
        let mut deadline = Instant::now() + idle_limit;
        let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        loop {
            tokio::select! {
                message = ws.next() => {
                    deadline = Instant::now() + idle_limit;
                    match message {
                        Some(Ok(Message::Text(text))) => {
                            if let Some(ended) = self.handle_frame(&text) {
                                return ended;
                            }
                        }
                        Some(Ok(Message::Close(frame))) => return closed(ws, frame, true).await,
                        Some(Ok(_)) => {} // pings are answered by tungstenite while we read
                        Some(Err(e)) => return retry(format!("connection lost: {e}"), true),
                        None => return retry("connection closed", true),
                    }
                }
                _ = ping.tick() => {
                    if let Err(e) = ws.send(Message::text(r#"{"op":"ping"}"#)).await {
                        return retry(format!("connection lost: {e}"), true);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return retry(format!("nothing heard from the server for {} s", idle_limit.as_secs()), true);
                }
                _ = &mut self.interrupted => {
                    let bye = CloseFrame { code: tungstenite::protocol::frame::coding::CloseCode::Normal, reason: "".into() };
                    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(Some(bye))).await;
                    return Ended::Interrupted;
                }
            }
        }
    }

    /// Handles one text frame; `Some` when the command must stop.
    fn handle_frame(&mut self, text: &str) -> Option<Ended> {
        let Ok(head) = serde_json::from_str::<FrameHead>(text) else {
            eprintln!("ignoring a frame that is not a JSON object with an op: {text}");
            return None;
        };
        match head.op.as_str() {
            "events" => match serde_json::from_str::<EventsFrame>(text) {
                Ok(frame) => return self.print_events(&frame.events),
                Err(e) => eprintln!("ignoring a malformed events frame ({e}): {text}"),
            },
            // The automatic inbox notice names the room only; the inbox's events print
            // like any other room's.
            "subscribed" if head.reference.is_none() => {}
            "subscribed" => match serde_json::from_str::<Subscribed>(text) {
                Ok(reply) => self.subscribed(reply),
                Err(e) => eprintln!("ignoring a malformed subscribed reply ({e}): {text}"),
            },
            "error" => {
                let error: ErrorFrame =
                    serde_json::from_str(text).unwrap_or(ErrorFrame { reference: None, code: String::new(), message: text.into() });
                let room = error
                    .reference
                    .and_then(|r| usize::try_from(r).ok())
                    .and_then(|r| r.checked_sub(1))
                    .and_then(|i| self.rooms.get(i));
                match room {
                    Some(room) => {
                        if let Some(state) = self.state.get_mut(room) {
                            state.asked_since = None;
                        }
                        eprintln!("error: subscribe {room} refused: {}: {}", error.code, error.message)
                    }
                    None => eprintln!("error from server: {}: {}", error.code, error.message),
                }
            }
            "pong" | "welcome" | "unsubscribed" => {}
            other => tracing::debug!("ignoring a frame with op {other:?}"),
        }
        None
    }

    /// Prints each event not printed before, as the server wrote it (one JSON line).
    fn print_events(&mut self, events: &[&RawValue]) -> Option<Ended> {
        let out = &mut self.out;
        for raw in events {
            let Ok(event) = serde_json::from_str::<EventHead>(raw.get()) else {
                eprintln!("ignoring an event without room and seq: {}", raw.get());
                continue;
            };
            let state = self.state.entry(event.room).or_default();
            if state.last_seq.is_some_and(|last| event.seq <= last) {
                continue;
            }
            state.last_seq = Some(event.seq);
            let line = if raw.get().contains('\n') {
                // Compact it: one event, one line.
                serde_json::to_string(&serde_json::from_str::<Value>(raw.get()).unwrap_or(Value::Null)).unwrap_or_default()
            } else {
                raw.get().to_string()
            };
            if writeln!(out, "{line}").is_err() {
                return Some(Ended::OutputClosed);
            }
        }
        if out.flush().is_err() {
            return Some(Ended::OutputClosed);
        }
        None
    }

    fn subscribed(&mut self, reply: Subscribed) {
        let state = self.state.entry(reply.room.clone()).or_default();
        let epoch_changed = state.epoch.as_ref().is_some_and(|epoch| *epoch != reply.epoch);
        let room = &reply.room;
        match (state.asked_since.take(), reply.recovered) {
            (Some(since), Some(true)) => {
                eprintln!("recovered {room} from seq {since}");
                state.last_seq = Some(state.last_seq.unwrap_or(since).max(since));
            }
            (Some(_), Some(false)) => {
                eprintln!("recovery failed for {room}: reload state");
                // Missed events stay missed; follow from the head of the (maybe new) epoch.
                state.last_seq = Some(reply.seq);
            }
            _ => {
                eprintln!("subscribed to {room} (epoch {}, head seq {})", reply.epoch, reply.seq);
                state.last_seq = Some(match state.last_seq {
                    Some(last) if !epoch_changed => last.max(reply.seq),
                    _ => reply.seq,
                });
            }
        }
        state.epoch = Some(reply.epoch);
    }
}

/// The server closed the connection: finish the closing handshake, then decide.
async fn closed(ws: &mut WebSocket, frame: Option<CloseFrame<'static>>, welcomed: bool) -> Ended {
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
    let Some(frame) = frame else {
        return retry("server closed the connection", welcomed);
    };
    let code = u16::from(frame.code);
    let reason = frame.reason.trim();
    let mut what = format!("server closed the connection with {code} ({})", close_meaning(code));
    if !reason.is_empty() {
        what.push_str(&format!(": {reason}"));
    }
    if (4500..=4999).contains(&code) {
        return Ended::Final(format!("{what}; not reconnecting"));
    }
    let hint = match code {
        c if c == CloseCode::ServiceRestart.code() => first_number(reason).map(Duration::from_millis),
        c if c == CloseCode::MigrationBudget.code() => first_number(reason).map(Duration::from_secs),
        _ => None,
    }
    .map(|hint| hint.min(MAX_HINT));
    Ended::Retry { reason: what, hint, welcomed }
}


/// The first token of `text` that is a whole number: a delay suggested in a close reason.
fn first_number(text: &str) -> Option<u64> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '=' | ':' | ',' | ';'))
        .find_map(|token| token.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_seconds() {
        let mut backoff = Backoff::new();
        let delays: Vec<u64> = (0..7).map(|_| backoff.next_delay().as_millis() as u64).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 5000, 5000, 5000]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(500));
    }

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
    }

    #[test]
    fn encoding_and_hints() {
        assert_eq!(encode("match:1"), "match:1");
        assert_eq!(encode("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(first_number("1500"), Some(1500));
        assert_eq!(first_number("retry after 30 s"), Some(30));
        assert_eq!(first_number("retry_after=12"), Some(12));
        assert_eq!(first_number("node-2 draining"), None);
    }

    fn subscriber(rooms: &[&str], since: Option<u64>, epoch: Option<&str>) -> Subscriber {
        let client = Client {
            base: "http://127.0.0.1:1".into(),
            key: "k".repeat(16),
            agent: ureq::AgentBuilder::new().build(),
        };
        let args = SubscribeArgs {
            rooms: rooms.iter().map(|r| r.to_string()).collect(),
            since,
            epoch: epoch.map(String::from),
            user: "cli".into(),
            device: "cli".into(),
            server: ServerUrl { url: None },
        };
        Subscriber::new(client, args)
    }

    /// A writer whose bytes the test can read afterwards.
    #[derive(Clone, Default)]
    struct Captured(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn take(&self) -> String {
            String::from_utf8(std::mem::take(&mut *self.0.borrow_mut())).unwrap()
        }
    }

    #[test]
    fn room_state_follows_replies_and_drops_duplicates() {
        let mut s = subscriber(&["r"], None, None);
        let out = Captured::default();
        s.out = Box::new(out.clone());
        s.subscribed(Subscribed { room: "r".into(), epoch: "E".into(), seq: 5, recovered: None });
        assert_eq!(s.state["r"].last_seq, Some(5), "live subscription starts at the head");
        let frame = r#"{"op":"events","events":[{"room":"r","seq":5,"data":1},{"room":"r","seq":6,"data":{"b":1,"a":2}}]}"#;
        assert!(s.handle_frame(frame).is_none());
        assert_eq!(out.take(), "{\"room\":\"r\",\"seq\":6,\"data\":{\"b\":1,\"a\":2}}\n", "seq 5 dropped, 6 printed as sent");
        assert!(s.handle_frame(frame).is_none());
        assert_eq!(out.take(), "", "a replayed frame prints nothing");
        let pretty = "{\"op\":\"events\",\"events\":[{\n \"room\": \"r\",\n \"seq\": 7}]}";
        assert!(s.handle_frame(pretty).is_none());
        assert_eq!(out.take(), "{\"room\":\"r\",\"seq\":7}\n", "one event, one line");
        s.state.get_mut("r").unwrap().last_seq = Some(6);

        // Reconnect: recovery asked from 6 and granted keeps the position.
        s.state.get_mut("r").unwrap().asked_since = Some(6);
        s.subscribed(Subscribed { room: "r".into(), epoch: "E".into(), seq: 9, recovered: Some(true) });
        assert_eq!((s.state["r"].last_seq, s.state["r"].epoch.as_deref()), (Some(6), Some("E")));

        // Recovery refused after an epoch change: follow from the new head.
        s.state.get_mut("r").unwrap().asked_since = Some(6);
        s.subscribed(Subscribed { room: "r".into(), epoch: "F".into(), seq: 2, recovered: Some(false) });
        assert_eq!((s.state["r"].last_seq, s.state["r"].epoch.as_deref()), (Some(2), Some("F")));
    }
}
