//! Two cells, `a` and `b`, each a stack of its own, as issue 47 deploys them: a
//! nats-server whose JetStream domain is the cell's name ([`NatsServer::start_cell`]: a
//! leaf port, a low ping interval), two livegate nodes joined to it (nodes `a1`, `a2`,
//! `b1`, `b2`: `--cell`, `--cells a,b`, `--cluster-nats-url` their own cell's server,
//! and `--cluster-cell-domains true` with a shared `--cluster-token-secret`) and a
//! round-robin [`Balancer`] in front of them. Cell b's server is a leaf node of cell a's
//! through a [`Link`] the test can cut (the only path between the cells; a hub and a
//! spoke: more cells would be more spokes of the same hub, the leaf graph must stay
//! acyclic).
//!
//! A whole cell can be killed with `kill -9` (its NATS and its nodes) and started again
//! on the same ports, stores and data dirs; its store can be filled (with a small
//! `max_file_store`) so that every JetStream write in it fails while its ports and core
//! NATS stay up, and freed. [`Cells::start_with`] can leave the cell-domain flags out, so
//! that the harness itself runs on a build that does not know them (heartbeats cross the
//! leaf either way). Every wait is bounded; on a panic the root directory (node logs,
//! NATS logs and stores) is kept and its path printed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use super::balancer::Balancer;
use super::link::{Condition, Link};
use super::nats::{CellNatsConfig, NatsServer};
use super::process::{metric, ServeProcess};
use super::{wait_until_every, Auth, Body, Http};

/// The cells, in the order their nodes are numbered: `a` is the hub of the leaf
/// connection, `b` its spoke.
pub const CELL_NAMES: [&str; 2] = ["a", "b"];
/// Nodes per cell.
pub const CELL_NODES: usize = 2;
/// The token key every node of every cell shares (`--cluster-token-secret`).
pub const TOKEN_SECRET: &str = "cells-test-token-secret-0123456789abcdef";
/// How long the four nodes may take to hear each other, and the leaf to come up.
pub const CELLS_FORM_LIMIT: Duration = Duration::from_secs(30);

/// Whether the livegate binary the tests run knows `cluster_cell_domains` (its
/// `livegate reference config` lists the key).
pub fn binary_knows_cell_domains() -> bool {
    static KNOWS: OnceLock<bool> = OnceLock::new();
    *KNOWS.get_or_init(|| {
        let out = std::process::Command::new(super::livegate_bin())
            .args(["reference", "config"])
            .output()
            .unwrap_or_else(|e| panic!("run livegate reference config: {e}"));
        assert!(
            out.status.success(),
            "livegate reference config: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).contains("`cluster_cell_domains`")
    })
}

pub struct Cells {
    /// Each cell's nats-server, by [`CELL_NAMES`] index.
    pub nats: Vec<NatsServer>,
    /// Between cell b's server and cell a's leaf port.
    pub link: Link,
    /// Each cell's balancer, by [`CELL_NAMES`] index: its running nodes, in turn.
    pub balancers: Vec<Balancer>,
    nodes: Vec<Option<ServeProcess>>,
    extra: Vec<String>,
    starts: Vec<usize>,
    cell_domains: bool,
    root: Option<TempDir>,
}

impl Cells {
    /// Starts both cells (cell `c`'s server with `nats(c)`) and their nodes with the cell
    /// flags plus `extra`; returns once every node is ready and counts the three others
    /// alive.
    pub fn start(extra: &[&str], nats: impl Fn(usize) -> CellNatsConfig) -> Cells {
        Cells::start_with(extra, nats, true)
    }

    /// [`Cells::start`], with `--cluster-cell-domains true` and `--cluster-token-secret`
    /// only when `cell_domains` (a build that does not know them refuses the flags).
    pub fn start_with(
        extra: &[&str],
        nats: impl Fn(usize) -> CellNatsConfig,
        cell_domains: bool,
    ) -> Cells {
        let root = tempfile::Builder::new().prefix("livegate-cells-").tempdir().expect("tempdir");
        let link = Link::start();
        let dir = |cell: &str| {
            let dir = root.path().join(format!("nats-{cell}"));
            std::fs::create_dir_all(&dir).expect("cell NATS dir");
            dir
        };
        let hub = NatsServer::start_cell(&dir(CELL_NAMES[0]), CELL_NAMES[0], None, &nats(0));
        let through = format!("nats-leaf://{}", link.proxy(hub.leaf_addr()));
        let leaf =
            NatsServer::start_cell(&dir(CELL_NAMES[1]), CELL_NAMES[1], Some(&through), &nats(1));
        let n = CELL_NAMES.len() * CELL_NODES;
        let mut cells = Cells {
            nats: vec![hub, leaf],
            link,
            balancers: CELL_NAMES.iter().map(|_| Balancer::start(&[])).collect(),
            nodes: (0..n).map(|_| None).collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            starts: vec![0; n],
            cell_domains,
            root: Some(root),
        };
        cells.wait_leaf(true, CELLS_FORM_LIMIT);
        for i in 0..n {
            cells.start_node(i);
        }
        cells.wait_formed(CELLS_FORM_LIMIT);
        cells
    }

    /// Node `i`'s name: `a1`, `a2`, `b1`, `b2`.
    pub fn name(i: usize) -> String {
        format!("{}{}", Cells::cell_of(i), i % CELL_NODES + 1)
    }

    /// Node `i`'s cell.
    pub fn cell_of(i: usize) -> &'static str {
        CELL_NAMES[i / CELL_NODES]
    }

    /// The nodes of `cell`.
    pub fn nodes_of(cell: &str) -> Vec<usize> {
        (0..CELL_NAMES.len() * CELL_NODES).filter(|&i| Cells::cell_of(i) == cell).collect()
    }

    /// `cell`'s index in [`CELL_NAMES`] (and in [`nats`](Self::nats),
    /// [`balancers`](Self::balancers)).
    pub fn cell_index(cell: &str) -> usize {
        CELL_NAMES.iter().position(|c| *c == cell).unwrap_or_else(|| panic!("no cell {cell}"))
    }

    pub fn root(&self) -> &Path {
        self.root.as_ref().expect("root").path()
    }

    /// Whether the nodes run with `--cluster-cell-domains true`.
    pub fn cell_domains(&self) -> bool {
        self.cell_domains
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.root().join(format!("data-{}", Cells::name(i)))
    }

    /// (Re)starts node `i` on its cell's NATS and adds it to its cell's balancer; returns
    /// once `/readyz` is 200.
    pub fn start_node(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "node {} is running", Cells::name(i));
        self.starts[i] += 1;
        let data = self.data_dir(i);
        std::fs::create_dir_all(&data).expect("node data dir");
        let log = self.root().join(format!("node-{}-{}.log", Cells::name(i), self.starts[i]));
        let url = self.nats[i / CELL_NODES].url();
        let cells = CELL_NAMES.join(",");
        let mut flags: Vec<&str> =
            vec!["--cluster-nats-url", &url, "--cell", Cells::cell_of(i), "--cells", &cells];
        if self.cell_domains {
            flags.extend([
                "--cluster-cell-domains",
                "true",
                "--cluster-token-secret",
                TOKEN_SECRET,
            ]);
        }
        flags.extend(self.extra.iter().map(String::as_str));
        let node = ServeProcess::start_named(&data, &log, &Cells::name(i), &flags);
        self.balancers[i / CELL_NODES].add(node.addr);
        self.nodes[i] = Some(node);
    }

    /// `kill -9` of node `i`, out of its cell's balancer first.
    pub fn kill_node(&mut self, i: usize) {
        let node = self.nodes[i]
            .take()
            .unwrap_or_else(|| panic!("node {} is not running", Cells::name(i)));
        self.balancers[i / CELL_NODES].remove(node.addr);
        node.kill9();
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].is_some()
    }

    pub fn node(&self, i: usize) -> &ServeProcess {
        self.nodes[i].as_ref().unwrap_or_else(|| panic!("node {} is not running", Cells::name(i)))
    }

    /// Node `i`'s address (a new one after each start: port 0).
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.node(i).addr
    }

    pub fn http(&self, i: usize) -> Http {
        self.node(i).http()
    }

    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.is_running(i)).collect()
    }

    /// `http://ADDR` of `cell`'s running nodes.
    pub fn urls(&self, cell: &str) -> Vec<String> {
        Cells::nodes_of(cell)
            .into_iter()
            .filter(|&i| self.is_running(i))
            .map(|i| format!("http://{}", self.addr(i)))
            .collect()
    }

    /// `cell`'s balancer.
    pub fn balancer(&self, cell: &str) -> &Balancer {
        &self.balancers[Cells::cell_index(cell)]
    }

    /// An HTTP client of `cell`'s balancer.
    pub fn balanced(&self, cell: &str) -> Http {
        Http::new(self.balancer(cell).addr)
    }

    /// Cuts the only path between the cells (a partition: no byte moves, no socket
    /// closes; the servers close the leaf within a few seconds by their pings).
    pub fn cut(&self) {
        self.link.set(Condition::Cut);
    }

    pub fn heal(&self) {
        self.link.set(Condition::Up);
    }

    /// `kill -9` of `cell`'s nodes (out of its balancer) and its nats-server.
    pub fn kill_cell(&mut self, cell: &str) {
        for i in Cells::nodes_of(cell) {
            if self.is_running(i) {
                self.kill_node(i);
            }
        }
        self.nats[Cells::cell_index(cell)].kill9();
    }

    /// Starts `cell`'s nats-server again (same ports and store), then its nodes (same
    /// names and data dirs, back in the balancer). Wait with [`wait_leaf`](Self::wait_leaf)
    /// and [`wait_formed`](Self::wait_formed) for the cells to be whole again.
    pub fn restart_cell(&mut self, cell: &str) {
        let c = Cells::cell_index(cell);
        if !self.nats[c].running() {
            self.nats[c].restart();
        }
        for i in Cells::nodes_of(cell) {
            if !self.is_running(i) {
                self.start_node(i);
            }
        }
    }

    /// Waits until cell b's server has (`true`) or has not a leaf connection to cell a's.
    pub fn wait_leaf(&self, up: bool, within: Duration) {
        let ok = wait_until_every(within, Duration::from_millis(50), || {
            (self.nats[1].leaf_connections() > 0) == up
        });
        assert!(
            ok,
            "the leaf connection is not {} within {within:?}; logs:\n{}",
            if up { "up" } else { "down" },
            self.logs()
        );
    }

    /// Whether both servers count the leaf connection.
    pub fn leaf_up(&self) -> bool {
        self.nats.iter().all(|n| n.leaf_connections() == 1)
    }

    /// Waits until every running node is ready and counts every other running node alive
    /// (`livegate_cluster_peers_alive`, heartbeats crossing the leaf).
    pub fn wait_formed(&self, within: Duration) {
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
                    (Cells::name(i), metric(&http, "livegate_cluster_peers_alive"), ready)
                })
                .collect::<Vec<_>>();
            seen.iter().all(|(_, peers, ready)| *ready && *peers == Some(want))
        });
        assert!(formed, "cells not formed within {within:?}: (node, peers alive, ready) = {seen:?}, want {want}; logs:\n{}", self.logs());
    }

    /// The node names node `i` knows (`/v1/admin/overview`'s `nodes`, itself included),
    /// sorted; `None` when it does not answer.
    pub fn known_nodes(&self, i: usize) -> Option<Vec<String>> {
        match self.http(i).try_request("GET", "/v1/admin/overview", Auth::Key, Body::None) {
            Ok((200, body)) => {
                let mut names: Vec<String> = body["nodes"]
                    .as_array()?
                    .iter()
                    .filter_map(|n| n["node"].as_str().map(str::to_string))
                    .collect();
                names.sort();
                Some(names)
            }
            _ => None,
        }
    }

    /// Fills `cell`'s JetStream store (start its server with a small `max_file_store`)
    /// with a stream of the test's own (`FILL`, on `fill.<cell>.>`: subjects no other cell
    /// has a stream on, since stream subjects cross the leaf) until a write is refused;
    /// returns how many 64 KiB messages it took. Ports and core NATS stay up; every
    /// JetStream write in the cell fails ("insufficient resources") until
    /// [`free_store`](Self::free_store).
    pub async fn fill_store(&self, cell: &str) -> usize {
        let client = async_nats::connect(self.nats[Cells::cell_index(cell)].url())
            .await
            .expect("connect to the cell's NATS");
        let js = async_nats::jetstream::new(client);
        let config = async_nats::jetstream::stream::Config {
            name: "FILL".into(),
            subjects: vec![format!("fill.{cell}.>")],
            ..Default::default()
        };
        js.create_stream(config).await.expect("the filler stream");
        let payload = vec![b'x'; 64 * 1024];
        for i in 0..10_000 {
            let acked = match js.publish(format!("fill.{cell}.{i}"), payload.clone().into()).await {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            };
            if !acked {
                return i;
            }
        }
        panic!("cell {cell}'s store took 10,000 messages of 64 KiB: not full (no max_file_store?)");
    }

    /// Frees what [`fill_store`](Self::fill_store) took.
    pub async fn free_store(&self, cell: &str) {
        let client = async_nats::connect(self.nats[Cells::cell_index(cell)].url())
            .await
            .expect("connect to the cell's NATS");
        async_nats::jetstream::new(client)
            .delete_stream("FILL")
            .await
            .expect("delete the filler stream");
    }

    /// Every node log and both NATS logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (cell, nats) in CELL_NAMES.iter().zip(&self.nats) {
            out.push_str(&format!("===== nats of cell {cell} =====\n{}", nats.log_text()));
        }
        let mut paths: Vec<PathBuf> = std::fs::read_dir(self.root())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "log"))
                    .collect()
            })
            .unwrap_or_default();
        paths.sort();
        for p in paths {
            out.push_str(&format!("===== {} =====\n", p.display()));
            out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
        out
    }
}

impl Drop for Cells {
    fn drop(&mut self) {
        self.nodes.iter_mut().for_each(|n| drop(n.take())); // ServeProcess kills on drop
        self.nats.iter_mut().for_each(NatsServer::kill9);
        if std::thread::panicking() {
            if let Some(root) = self.root.take() {
                eprintln!(
                    "cells test failed: node logs, NATS logs and stores kept in {}",
                    root.keep().display()
                );
            }
        }
    }
}
