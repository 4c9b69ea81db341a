//! The command line. `serve` (the default) runs the gateway; `token`, `publish`,
//! `subscribe`, `status`, `cells`, `webhooks`, `state` and `presence` are small clients of a running server's public HTTP and WebSocket API,
//! for trying livegate out and for scripts. Clients read the server address (`listen`)
//! and the API key (`api_key`, else `data_dir/api_key`) from the same configuration
//! layers as the server, so the same flags, environment and config file work for both.
//! The clients themselves are [`crate::client`]; this module is the command line, `serve`
//! (signals, tracing) and the offline `route`, `check-config` and `reference` (the
//! Markdown references of [`crate::reference`]).
//!
//! `main.rs` only calls [`main`]. Output convention: results go to stdout (a token, a
//! publish reply, one JSON line per event), everything else to stderr; errors are one
//! line `livegate: <error>`, exit code 2 for bad configuration or arguments, 1 otherwise.

use std::io::Write;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;

use crate::client::{Client, ClientError, Subscriber, Subscription};
use crate::config::{Config, ConfigError, ConfigFlags, ENV_LOG_FORMAT};
use crate::reference::Reference;

const ABOUT: &str =
    "Real-time push gateway: WebSocket subscribers, HTTP publishers, durable per-room event logs";

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
  livegate serve --dev                        development on a laptop: prints the API key, localhost pages mint tokens
  livegate serve --listen 0.0.0.0:7070 --data-dir /var/lib/livegate
  livegate subscribe match:1                  print the events of room match:1, one JSON line each
  livegate publish match:1 '{\"goal\":1}'       publish an event (in another terminal)
  livegate state match:1                      print the room's state; `presence match:1`: who is in it
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
With --demo, also serves a live score page at / fed by a built-in match simulator.

With --dev (development on a laptop; never in production): the API key is printed on
start; allowed_origins defaults to http://localhost:*, http://127.0.0.1:* and
http://[::1]:* (any port); a page from one of the listed origins may POST /v1/tokens
without the API key, so a first page needs no backend; drain_wait_secs and
drain_spread_secs default to 1, so Ctrl-C stops in about two seconds. A key set in the
config file, a LIVEGATE_* variable or a flag still wins over these defaults.")]
    Serve(ServeArgs),
    /// Mint a one-time WebSocket token for a user and print only the token
    #[command(
        after_help = "Example:\n  T=$(livegate token u1 --device phone --ttl 30)\n  # then connect to ws://127.0.0.1:7070/v1/ws?token=$T"
    )]
    Token(TokenArgs),
    /// Publish one event to a room and print the server's reply (room, seq, epoch, duplicate)
    #[command(
        after_help = "Example:\n  livegate publish match:1 '{\"goal\":1}' --id goal-1\n  # publishing the same --id again is answered with the first seq and \"duplicate\":true"
    )]
    Publish(PublishArgs),
    /// Follow rooms as a WebSocket client: print each event as one JSON line
    #[command(long_about = "\
Follow rooms as a WebSocket client: print each event as one compact JSON line on stdout
({\"room\",\"seq\",\"id\",\"ts_ms\",\"data\"}; a client's publish also \"from\"), notices on stderr.

When the connection drops, reconnects (after the delay the server suggests, else a random
one below 0.5 s, 1 s, 2 s, 4 s, then 5 s) and resumes after the last event it printed, so
no event is printed twice or missed while the server's history covers the gap; otherwise it says `recovery failed for ROOM: reload state`.
A reconnect presents the resume credential of the last welcome, so it needs no new token;
it mints one only when it has none, it expired, or the server refused it.
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
every value, and print the effective configuration as TOML with the API key masked; each
[[namespace]] table is printed with every room option in effect for its rooms.
Exits 0 when it is valid, 2 with one line naming the bad key and where it was set.")]
    CheckConfig,
    /// Print a reference as Markdown, generated from the code: config, metrics, errors, close-codes
    #[command(long_about = "\
Print a reference as Markdown, generated from the one definition in the code: every
configuration key (type, default, bounds, variable, flag), every metric /metrics exports,
the error codes with their HTTP statuses, or the WebSocket close codes. The book's pages
docs/src/reference/*.md are exactly this output.")]
    Reference {
        #[arg(value_enum)]
        which: Reference,
    },
    /// Ask a running server for its status (node, version, uptime, phase, counts)
    Status {
        #[command(flatten)]
        server: ServerUrl,
    },
    /// Print each cell's breaker and probe history as a node sees them (cluster mode)
    #[command(
        long_about = "\
Ask a node of a cluster (GET /v1/admin/cells, with the API key) how it sees the configured
cells, and print one block per cell: the breaker's state (closed, half_open, open) and how
long it has held it, the last probe rounds that fed it as a line of marks (✓ passed,
✗ failed, oldest first) with the nodes that failed the last one, and its recent
transitions. Times are relative to the node's clock. Outside cluster mode the node
answers 409 conflict.

With --promote CELL (cells with their own NATS, cluster_cell_domains): CELL is lost for
good, so move its rooms into the node's own cell. The node's mirror of CELL's rooms
becomes their origin under a new epoch; it prints how many events CELL had stored that the
mirror never received (lost), and clients resuming those rooms get recovered:false.
Refused (409) while a node of CELL is heard.",
        after_help = "Examples:\n  livegate cells --url http://10.0.0.5:7070 --api-key $KEY\n  livegate cells --promote b --url http://10.0.0.5:7070 --api-key $KEY"
    )]
    Cells {
        #[command(flatten)]
        server: ServerUrl,
        /// Promote CELL, lost for good: move its rooms into the node's own cell
        /// (POST /v1/admin/cells/CELL/promote; cells with their own NATS only). Refused
        /// while a node of CELL is heard.
        #[arg(long, value_name = "CELL")]
        promote: Option<String>,
    },
    /// List, replay or delete the node's webhook dead letters (webhooks given up)
    #[command(
        long_about = "\
A webhook that failed webhook_max_attempts times, or that the receiver refused with a 4xx
other than 408 and 429, is kept as a dead letter in the node's store (at most
webhook_dead_letters_max, the oldest dropped).

--dead prints them, newest first, one line each: id, type, room, attempts, how the last one
failed and why it was given up (attempts or rejected), and when (GET /v1/admin/webhooks/dead).
--replay ID sends one again now, to webhook_url as configured now: delivered, it leaves the
list; otherwise the command fails with the receiver's answer and it stays, one attempt more.
--delete ID forgets one; --delete-all forgets every one.",
        after_help = "Examples:\n  livegate webhooks --dead --url http://10.0.0.5:7070 --api-key $KEY\n  livegate webhooks --replay 3f2a9c0d5e7b41a8b6c4d2e0f1a3b5c7"
    )]
    Webhooks(WebhooksArgs),
    /// Print a room's state (GET /v1/rooms/ROOM/state: room, epoch, seq, data)
    #[command(
        after_help = "Example:\n  livegate state match:1\n  # {\"room\":\"match:1\",\"epoch\":\"...\",\"seq\":42,\"data\":{\"score\":[1,0]}}; seq 0 and data null when the room has none"
    )]
    State(RoomArgs),
    /// Print who is in a room (GET /v1/rooms/ROOM/presence: room, count, members)
    #[command(
        after_help = "Example:\n  livegate presence match:1\n  # {\"room\":\"match:1\",\"count\":2,\"members\":[{\"user\":\"u1\",\"device\":\"web\"},...]}; members null above presence_members_max"
    )]
    Presence(RoomArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RoomArgs {
    /// Room to ask about, such as match:1
    pub room: String,
    #[command(flatten)]
    pub server: ServerUrl,
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
    /// Development mode, for a laptop and never for production: prints the API key, allows
    /// pages from localhost on any port, lets them mint tokens without the key, and drains
    /// in about a second
    #[arg(long)]
    pub dev: bool,
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
#[group(id = "webhooks_action", required = true, multiple = false, args = ["dead", "replay", "delete", "delete_all"])]
pub struct WebhooksArgs {
    /// Print the dead letters, newest first
    #[arg(long)]
    pub dead: bool,
    /// With --dead: print at most N (1 to 10000)
    #[arg(long, value_name = "N", default_value_t = 100, requires = "dead")]
    pub limit: usize,
    /// Send dead letter ID again now
    #[arg(long, value_name = "ID")]
    pub replay: Option<String>,
    /// Forget dead letter ID
    #[arg(long, value_name = "ID")]
    pub delete: Option<String>,
    /// Forget every dead letter
    #[arg(long)]
    pub delete_all: bool,
    #[command(flatten)]
    pub server: ServerUrl,
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
    #[error(transparent)]
    Client(#[from] ClientError),
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
            CliError::Client(ClientError::Config(_) | ClientError::Usage(_)) => 2,
            CliError::Client(_) | CliError::Failed(_) => 1,
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
            serve(&cli.config, args)
        }
        Command::Token(args) => {
            init_tracing(format, "warn");
            let token = client(&cli.config, &args.server)?.mint_token(
                &args.user,
                &args.device,
                args.ttl,
            )?;
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
            let reply = client(&cli.config, &args.server)?.publish(&args.room, args.id, data)?;
            print_line(reply.trim())
        }
        Command::Route(args) => route_offline(&args),
        Command::CheckConfig => check_config(&cli.config),
        Command::Reference { which } => print_line(which.markdown().trim_end()),
        Command::Status { server } => {
            init_tracing(format, "warn");
            let reply = client(&cli.config, &server)?.status()?;
            print_line(reply.trim())
        }
        Command::Cells { server, promote: None } => {
            init_tracing(format, "warn");
            let reply = client(&cli.config, &server)?.cells()?;
            print_line(crate::client::cells::render(&reply).trim_end())
        }
        Command::Cells { server, promote: Some(cell) } => {
            init_tracing(format, "warn");
            let reply = client(&cli.config, &server)?.promote_cell(&cell)?;
            print_line(crate::client::cells::render_promotion(&reply).trim_end())
        }
        Command::Webhooks(args) => {
            init_tracing(format, "warn");
            let client = client(&cli.config, &args.server)?;
            if let Some(id) = &args.replay {
                return print_line(&crate::client::webhooks::render_replay(
                    &client.replay_dead_letter(id)?,
                ));
            }
            if args.delete.is_some() || args.delete_all {
                return print_line(client.delete_dead_letters(args.delete.as_deref())?.trim());
            }
            print_line(
                crate::client::webhooks::render_dead(&client.dead_letters(args.limit)?).trim_end(),
            )
        }
        Command::State(args) => {
            init_tracing(format, "warn");
            let reply = client(&cli.config, &args.server)?.room_state(&args.room)?;
            print_line(reply.trim())
        }
        Command::Presence(args) => {
            init_tracing(format, "warn");
            let reply = client(&cli.config, &args.server)?.room_presence(&args.room)?;
            print_line(reply.trim())
        }
        Command::Subscribe(args) => {
            init_tracing(format, "warn");
            let client = client(&cli.config, &args.server)?;
            let SubscribeArgs { rooms, since, epoch, user, device, server: _ } = args;
            Ok(Subscriber::new(client, Subscription { rooms, since, epoch, user, device })
                .run_blocking()?)
        }
    }
}

/// The client of the server the configuration (or `--url`) names.
fn client(flags: &ConfigFlags, server: &ServerUrl) -> Result<Client, CliError> {
    let config = Config::load_from_process(flags)?;
    Ok(Client::from_config(&config, server.url.as_deref())?)
}

/// Printed before the first `[[namespace]]` table by check-config.
const NAMESPACES_NOTE: &str = "# Namespaces: a room takes the options of the longest prefix its name starts with (else\n\
# the keys above); each table shows every option in effect, its own or the global one.\n[[namespace]]";

/// `livegate check-config`: the effective configuration, validated, secrets masked.
fn check_config(flags: &ConfigFlags) -> Result<(), CliError> {
    let mut config = Config::load_from_process(flags)?;
    let mut key_note = match &config.api_key {
        Some(_) => "api_key is set (masked below)".to_string(),
        None => format!(
            "api_key is not set: serve uses or generates {}",
            config.api_key_path().display()
        ),
    };
    // The JWT key files are read as serve reads them: one it could not use is an error here.
    let jwt_keys = crate::http::jwt::JwtKeys::load(&config)
        .map_err(|e| CliError::Usage(e.to_string()))?
        .describe();
    if !jwt_keys.is_empty() {
        key_note.push_str(&format!("; JWTs are verified with {}", jwt_keys.join(", ")));
    }
    if config.api_key.is_some() {
        config.api_key = Some("********".into());
    }
    if !config.webhook_secret.is_empty() {
        config.webhook_secret = "********".into();
    }
    for secret in [
        &mut config.cluster_nats_password,
        &mut config.cluster_nats_token,
        &mut config.jwt_hmac_secret,
    ]
    .into_iter()
    .flatten()
    {
        *secret = "********".into();
    }
    // URLs may carry credentials in their userinfo or query.
    config.webhook_url = crate::core::rules::redact::url_for_log(&config.webhook_url);
    config.cluster_nats_url =
        config.cluster_nats_url.as_deref().map(crate::core::rules::redact::url_for_log);
    // Each namespace with its effective options: its overrides, else the global keys.
    config.namespaces = config.effective_namespaces()?;
    let text = toml::to_string(&config)
        .map_err(|e| failed(format!("cannot print the configuration: {e}")))?;
    let text = text.replacen("[[namespace]]", NAMESPACES_NOTE, 1);
    print_line(&format!("# configuration is valid; {key_note}\n{}", text.trim_end()))
}

/// `livegate route`: the pure session routing over files, for checking determinism.
fn route_offline(args: &RouteArgs) -> Result<(), CliError> {
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path)
            .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))
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
            _ => {
                return Err(CliError::Usage(format!(
                    "bad node line {:?}: expected NAME or NAME down",
                    fields.join(" ")
                )))
            }
        }
    }
    let mut out = String::new();
    for fields in lines(&read(&args.sessions)?) {
        let (session, recorded) = match fields.as_slice() {
            [session] => (session.as_str(), None),
            [session, owner] => (session.as_str(), Some(owner.as_str())),
            _ => {
                return Err(CliError::Usage(format!(
                    "bad session line {:?}: expected SESSION [OWNER]",
                    fields.join(" ")
                )))
            }
        };
        match crate::core::nodes::routing::route_session(session, recorded, &owners, &alive) {
            Ok(node) => out.push_str(&format!("{session} {node}\n")),
            Err(e) => out.push_str(&format!("{session} error: {e}\n")),
        }
    }
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .map_err(|e| failed(format!("cannot write output: {e}")))
}

fn log_format(flag: Option<LogFormat>) -> Result<LogFormat, CliError> {
    if let Some(format) = flag {
        return Ok(format);
    }
    match std::env::var(ENV_LOG_FORMAT) {
        Ok(text) if !text.is_empty() => LogFormat::from_str(&text, true).map_err(|_| {
            CliError::Usage(format!("{ENV_LOG_FORMAT}: expected pretty or json, got {text:?}"))
        }),
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

fn serve(flags: &ConfigFlags, args: ServeArgs) -> Result<(), CliError> {
    let ServeArgs { demo, dev } = args;
    let defaults = move || if dev { Config::dev_defaults() } else { Config::default() };
    let mut config = Config::load_from_process_over(defaults(), flags)?;
    let resolved = config.resolve_api_key()?;
    if let Some(path) = &resolved.generated_at {
        print_line(&format!("api key generated and stored in {} (mode 0600)", path.display()))?;
    }
    let dev_line = dev.then(|| dev_line(&resolved.key, &config.allowed_origins));
    config.api_key = Some(resolved.key);

    let open_files = crate::server::raise_open_files_limit();
    tracing::debug!(open_files, "open-file limit");
    // A node that cannot load its certificate must fail before it announces a listener.
    let scheme = match crate::server::tls_config(&config).map_err(|e| failed(e.to_string()))? {
        Some(_) => "https",
        None => "http",
    };
    // So must one that cannot use its JWT key files (a configuration error: exit 2).
    crate::http::jwt::JwtKeys::load(&config).map_err(|e| CliError::Usage(e.to_string()))?;
    let listener = std::net::TcpListener::bind(config.listen)
        .map_err(|e| failed(format!("cannot listen on {}: {e}", config.listen)))?;
    let addr =
        listener.local_addr().map_err(|e| failed(format!("cannot read the bound address: {e}")))?;

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
    if let Some(line) = dev_line {
        print_line(&line)?;
    }
    let reload_flags = flags.clone();
    let control = crate::server::Control {
        shutdown: Box::pin(signals),
        reload: Box::pin(reloads),
        reload_config: Some(Box::new(move || {
            Config::load_from_process_over(defaults(), &reload_flags)
        })),
        demo,
        dev,
    };
    system
        .block_on(crate::server::run_controlled(listener, config, control))
        .map_err(|e| failed(e.to_string()))
}

/// The line `serve --dev` prints on start: the API key, and loudly, what a page may do
/// without it.
fn dev_line(key: &str, origins: &[String]) -> String {
    let pages = if origins.is_empty() {
        "allowed_origins lists no origin, so every token still needs the key".to_string()
    } else {
        format!("pages from {} may POST /v1/tokens WITHOUT the key", origins.join(", "))
    };
    format!("dev mode, NOT FOR PRODUCTION: API key {key}; {pages}")
}

/// Every SIGTERM or SIGINT, as a stream: the first starts a drain, a second forces it.
/// Must be called inside a tokio runtime; the handlers are installed by the call, not by
/// the first poll.
fn shutdown_signals() -> std::io::Result<impl futures_util::Stream<Item = ()> + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let terminate = signal(SignalKind::terminate())?;
    let interrupt = signal(SignalKind::interrupt())?;
    Ok(futures_util::stream::unfold(
        (terminate, interrupt),
        |(mut terminate, mut interrupt)| async move {
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            tracing::info!("{name} received");
            Some(((), (terminate, interrupt)))
        },
    ))
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
