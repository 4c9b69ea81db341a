//! Two cells as issue 47 deploys them, for the tests of failures that must stay inside
//! a cell. Each cell has its own nats-server ([`NatsServer::start_cell`]: JetStream
//! domain = the cell's name, a leaf port, a low ping interval), two `livegate serve`
//! nodes joined through it and a round-robin [`Balancer`] in front of them. Cell `b`'s
//! server is a leaf node of cell `a`'s through a [`Link`] the test can cut and heal (a
//! hub and one spoke; more cells would be more spokes of the same hub: the leaf graph
//! must stay acyclic).
//!
//! Node `i` of cell `c` is named `c1`, `c2` (`a1`, `a2`, `b1`, `b2`) and runs with
//! `LIVEGATE_CELL=c`, `LIVEGATE_CELLS=a,b`, `--cluster-nats-url` its own cell's server,
//! short heartbeats and, when [`CellsOptions::cell_domains`] says so,
//! `LIVEGATE_CLUSTER_CELL_DOMAINS=true` and a shared `LIVEGATE_CLUSTER_TOKEN_SECRET`.
//! By default the keys are passed exactly when the binary knows them (`livegate
//! reference config` lists `cluster_cell_domains`): a build without them would only warn
//! about the variables and run as one cluster per NATS, which is what the harness's own
//! smoke test can check today.
//!
//! A cell can be killed whole (`kill -9` of its server and its nodes) and started again
//! on the same ports, store and data dirs; its store can be filled (with
//! [`CellsOptions::max_file_store`]) so that every JetStream write in it fails while its
//! ports and core NATS stay up, and freed. Every wait is bounded; on a panic the root
//! directory (node logs, NATS logs, stores) is kept and its path printed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::balancer::Balancer;
use super::link::{Condition, Link};
use super::nats::{CellNatsConfig, NatsServer};
use super::process::{metric, ServeProcess};
use super::{wait_until_every, Auth, Body, Http};

/// The cells, in order: `a` is the hub of the leaf connections, `b` its spoke.
pub const CELL_NAMES: [&str; 2] = ["a", "b"];
/// Nodes per cell.
pub const NODES_PER_CELL: usize = 2;
/// The token secret every node of every cell shares (`cluster_token_secret`).
pub const TEST_TOKEN_SECRET: &str = "cells-test-token-secret-0123456789abcdef";
/// How long the leaf connection may take to come up (the spoke solicits it about once a
/// second).
pub const LEAF_UP_LIMIT: Duration = Duration::from_secs(15);
/// How long the nodes may take to hear each other after a start.
pub const CELLS_PEERS_LIMIT: Duration = Duration::from_secs(30);
/// The nodes' heartbeat period: a node not heard for three is down.
pub const CELLS_HEARTBEAT_MS: u64 = 250;

/// What [`Cells::start`] starts.
#[derive(Clone, Debug)]
pub struct CellsOptions {
    /// Pass `LIVEGATE_CLUSTER_CELL_DOMAINS=true` and `LIVEGATE_CLUSTER_TOKEN_SECRET` to
    /// every node. Default: whether the binary knows `cluster_cell_domains`.
    pub cell_domains: bool,
    /// Each cell's `jetstream { max_file_store }` (`"8MB"`), for [`Cells::fill_store`].
    pub max_file_store: Option<String>,
    /// More flags for every node.
    pub flags: Vec<String>,
}

impl Default for CellsOptions {
    fn default() -> CellsOptions {
        CellsOptions { cell_domains: binary_knows_cell_domains(), max_file_store: None, flags: Vec::new() }
    }
}

/// Whether the livegate binary the tests run has the `cluster_cell_domains` key.
pub fn binary_knows_cell_domains() -> bool {
    static KNOWS: OnceLock<bool> = OnceLock::new();
    *KNOWS.get_or_init(|| {
        let out = std::process::Command::new(super::livegate_bin())
            .args(["reference", "config"])
            .output()
            .unwrap_or_else(|e| panic!("run livegate reference config: {e}"));
        assert!(out.status.success(), "livegate reference config: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).contains("`cluster_cell_domains`")
    })
}

/// One cell: its nats-server, its nodes (`None` while stopped) and its balancer.
pub struct Cell {
    pub name: &'static str,
    pub nats: NatsServer,
    nodes: Vec<Option<ServeProcess>>,
    starts: Vec<usize>,
    pub balancer: Balancer,
}

impl Cell {
    /// Node `i`'s name: the cell's name and `i + 1`.
    pub fn node_name(&self, i: usize) -> String {
        format!("{}{}", self.name, i + 1)
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].is_some()
    }

    pub fn node(&self, i: usize) -> &ServeProcess {
        self.nodes[i].as_ref().unwrap_or_else(|| panic!("node {} is not running", self.node_name(i)))
    }

    /// The running nodes' indexes.
    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_some()).collect()
    }

    /// The running nodes' addresses (they change with each start: port 0).
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.running().into_iter().map(|i| self.node(i).addr).collect()
    }

    /// The running nodes' `http://127.0.0.1:PORT`.
    pub fn urls(&self) -> Vec<String> {
        self.addrs().into_iter().map(|a| format!("http://{a}")).collect()
    }

    pub fn http(&self, i: usize) -> Http {
        self.node(i).http()
    }

    /// An HTTP client of the cell's balancer.
    pub fn balanced(&self) -> Http {
        Http::new(self.balancer.addr)
    }
}

/// Two cells joined by a leaf connection through [`Cells::link`]; see the module doc.
pub struct Cells {
    pub cells: Vec<Cell>,
    /// Carries cell b's leaf connection to cell a: cut it to part the cells.
    pub link: Link,
    options: CellsOptions,
    root: Option<TempDir>,
}

impl Cells {
    /// Starts both cells' servers, waits for the leaf connection, starts every node and
    /// waits until each is ready and hears the other three.
    pub fn start(options: CellsOptions) -> Cells {
        let root = tempfile::Builder::new().prefix("livegate-cells-").tempdir().expect("tempdir");
        let config = CellNatsConfig { max_file_store: options.max_file_store.clone(), ..Default::default() };
        let hub = NatsServer::start_cell(&root.path().join("nats-a"), CELL_NAMES[0], None, &config);
        let link = Link::start();
        let remote = format!("nats-leaf://{}", link.proxy(hub.leaf_addr()));
        let spoke = NatsServer::start_cell(&root.path().join("nats-b"), CELL_NAMES[1], Some(&remote), &config);
        let cell = |name: &'static str, nats: NatsServer| Cell {
            name,
            nats,
            nodes: (0..NODES_PER_CELL).map(|_| None).collect(),
            starts: vec![0; NODES_PER_CELL],
            balancer: Balancer::start(&[]),
        };
        let mut cells = Cells { cells: vec![cell(CELL_NAMES[0], hub), cell(CELL_NAMES[1], spoke)], link, options, root: Some(root) };
        cells.wait_leaf_up(LEAF_UP_LIMIT);
        for c in 0..cells.cells.len() {
            for i in 0..NODES_PER_CELL {
                cells.start_node(c, i);
            }
        }
        cells.wait_peers(CELLS_PEERS_LIMIT);
        cells
    }

    pub fn root(&self) -> &Path {
        self.root.as_ref().expect("root").path()
    }

    /// Whether the nodes get the cell-domain keys.
    pub fn cell_domains(&self) -> bool {
        self.options.cell_domains
    }

    /// The cell named `name`'s index.
    pub fn index(&self, name: &str) -> usize {
        self.cells.iter().position(|c| c.name == name).unwrap_or_else(|| panic!("no cell {name}"))
    }

    pub fn cell(&self, name: &str) -> &Cell {
        &self.cells[self.index(name)]
    }

    /// Node `i` of cell `c`'s data dir (the same across restarts).
    pub fn data_dir(&self, c: usize, i: usize) -> PathBuf {
        self.root().join(format!("data-{}", self.cells[c].node_name(i)))
    }

    /// (Re)starts node `i` of cell `c` with its name and data dir and adds it to its
    /// cell's balancer; returns once `/readyz` is 200.
    pub fn start_node(&mut self, c: usize, i: usize) {
        assert!(!self.cells[c].is_running(i), "node {} is running", self.cells[c].node_name(i));
        let data = self.data_dir(c, i);
        std::fs::create_dir_all(&data).expect("node data dir");
        let cell = &mut self.cells[c];
        cell.starts[i] += 1;
        let name = cell.node_name(i);
        let log = self.root.as_ref().expect("root").path().join(format!("node-{name}-{}.log", cell.starts[i]));
        let url = cell.nats.url();
        let heartbeat = CELLS_HEARTBEAT_MS.to_string();
        let mut flags: Vec<&str> = vec!["--cluster-nats-url", &url, "--cluster-heartbeat-ms", &heartbeat, "--probe-up-after", "1"];
        flags.extend(self.options.flags.iter().map(String::as_str));
        let cells = CELL_NAMES.join(",");
        let mut env: Vec<(&str, &str)> = vec![("LIVEGATE_CELL", cell.name), ("LIVEGATE_CELLS", &cells)];
        if self.options.cell_domains {
            env.push(("LIVEGATE_CLUSTER_CELL_DOMAINS", "true"));
            env.push(("LIVEGATE_CLUSTER_TOKEN_SECRET", TEST_TOKEN_SECRET));
        }
        let node = ServeProcess::start_named_with_env(&data, &log, &name, &flags, &env);
        cell.balancer.add(node.addr);
        cell.nodes[i] = Some(node);
    }

    /// `kill -9` of node `i` of cell `c`, out of its balancer first.
    pub fn kill_node(&mut self, c: usize, i: usize) {
        let cell = &mut self.cells[c];
        let node = cell.nodes[i].take().unwrap_or_else(|| panic!("node {} is not running", cell.node_name(i)));
        cell.balancer.remove(node.addr);
        node.kill9();
    }

    /// `kill -9` of a whole cell: its nodes and its nats-server, nothing flushed. Returns
    /// when they are gone.
    pub fn kill_cell(&mut self, name: &str) -> Instant {
        let c = self.index(name);
        for i in self.cells[c].running() {
            self.kill_node(c, i);
        }
        self.cells[c].nats.kill9();
        Instant::now()
    }

    /// Starts a killed cell again: its server on the same ports and store, then its
    /// nodes (same names and data dirs); returns once the leaf is up again and every node
    /// hears the other three.
    pub fn restart_cell(&mut self, name: &str) {
        let c = self.index(name);
        if !self.cells[c].nats.running() {
            self.cells[c].nats.restart();
        }
        self.wait_leaf_up(LEAF_UP_LIMIT);
        for i in 0..NODES_PER_CELL {
            if !self.cells[c].is_running(i) {
                self.start_node(c, i);
            }
        }
        self.wait_peers(CELLS_PEERS_LIMIT);
    }

    /// Parts the cells: the leaf connection's bytes stop, its sockets stay open (a
    /// silent partition; the servers notice within a few seconds by their pings).
    pub fn cut(&self) {
        self.link.set(Condition::Cut);
    }

    /// Heals [`cut`](Self::cut); the leaf connection comes back on its own.
    pub fn heal(&self) {
        self.link.set(Condition::Up);
    }

    /// Whether both servers run and each counts its leaf connection.
    pub fn leaf_up(&self) -> bool {
        self.cells.iter().all(|c| c.nats.leaf_connections() == 1)
    }

    /// Whether neither server counts a leaf connection (a cut noticed).
    pub fn leaf_down(&self) -> bool {
        self.cells.iter().all(|c| c.nats.leaf_connections() == 0)
    }

    pub fn wait_leaf_up(&self, within: Duration) {
        let up = wait_until_every(within, Duration::from_millis(20), || self.leaf_up());
        assert!(up, "no leaf connection between the cells within {within:?}; logs:\n{}", self.logs());
    }

    /// Every running node of every cell, as (cell index, node index).
    pub fn running(&self) -> Vec<(usize, usize)> {
        (0..self.cells.len()).flat_map(|c| self.cells[c].running().into_iter().map(move |i| (c, i))).collect()
    }

    /// The node names node `(c, i)` knows (`/v1/admin/overview`'s `nodes`, itself
    /// included), sorted; `None` when it does not answer.
    pub fn known_nodes(&self, c: usize, i: usize) -> Option<Vec<String>> {
        match self.cells[c].http(i).try_request("GET", "/v1/admin/overview", Auth::Key, Body::None) {
            Ok((200, body)) => {
                let mut names: Vec<String> =
                    body["nodes"].as_array()?.iter().filter_map(|n| n["node"].as_str().map(str::to_string)).collect();
                names.sort();
                Some(names)
            }
            _ => None,
        }
    }

    /// Waits until every running node is ready and counts every other running node, of
    /// both cells, as an alive peer (`livegate_cluster_peers_alive`: heartbeats are
    /// plain subjects and cross the leaf); panics after `within`.
    pub fn wait_peers(&self, within: Duration) {
        let running = self.running();
        let want = (running.len() - 1) as f64;
        let mut seen = Vec::new();
        let formed = wait_until_every(within, Duration::from_millis(50), || {
            seen = running
                .iter()
                .map(|&(c, i)| {
                    let http = self.cells[c].http(i);
                    let ready = matches!(http.try_request("GET", "/readyz", Auth::None, Body::None), Ok((200, _)));
                    (self.cells[c].node_name(i), metric(&http, "livegate_cluster_peers_alive"), ready)
                })
                .collect::<Vec<(String, Option<f64>, bool)>>();
            seen.iter().all(|(_, peers, ready)| *ready && *peers == Some(want))
        });
        assert!(
            formed,
            "cells not formed within {within:?}: (node, livegate_cluster_peers_alive, ready) = {seen:?}, want {want} peers each; \
             logs:\n{}",
            self.logs()
        );
    }

    /// Fills cell `name`'s JetStream store (it needs [`CellsOptions::max_file_store`])
    /// with a stream of the test's own (`FILL`, on `fill.<cell>.>`: subjects no other
    /// cell has, so nothing crosses the leaf) until a write is refused; returns how many
    /// 64 KiB messages it took. Ports and core NATS stay up; every JetStream write in the
    /// cell fails ("insufficient resources") until [`free_store`](Self::free_store).
    pub async fn fill_store(&self, name: &str) -> usize {
        assert!(self.options.max_file_store.is_some(), "fill_store needs CellsOptions::max_file_store");
        let client = async_nats::connect(self.cell(name).nats.url()).await.expect("connect to the cell's NATS");
        let js = async_nats::jetstream::new(client);
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "FILL".into(),
            subjects: vec![format!("fill.{name}.>")],
            ..Default::default()
        })
        .await
        .expect("the filler stream");
        let payload = vec![b'x'; 64 * 1024];
        for i in 0..10_000 {
            let acked = match js.publish(format!("fill.{name}.{i}"), payload.clone().into()).await {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            };
            if !acked {
                return i;
            }
        }
        panic!("cell {name}'s store took 10,000 messages of 64 KiB: not full");
    }

    /// Frees what [`fill_store`](Self::fill_store) took.
    pub async fn free_store(&self, name: &str) {
        let client = async_nats::connect(self.cell(name).nats.url()).await.expect("connect to the cell's NATS");
        async_nats::jetstream::new(client).delete_stream("FILL").await.expect("delete the filler stream");
    }

    /// Every node log (all starts) and each cell's NATS log, for a failure message.
    pub fn logs(&self) -> String {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(self.root())
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "log")).collect())
            .unwrap_or_default();
        paths.sort();
        paths.extend(self.cells.iter().map(|c| c.nats.log.clone()));
        let mut out = String::new();
        for p in paths {
            out.push_str(&format!("===== {} =====\n", p.display()));
            out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
        out
    }
}

impl Drop for Cells {
    fn drop(&mut self) {
        for cell in self.cells.iter_mut() {
            cell.nodes.iter_mut().for_each(|n| drop(n.take())); // ServeProcess kills on drop
            cell.nats.kill9();
        }
        if std::thread::panicking() {
            if let Some(root) = self.root.take() {
                eprintln!("cells test failed: node logs, NATS logs and stores kept in {}", root.keep().display());
            }
        }
    }
}
