//! Two cells, `a` and `b`, each a stack of its own: a nats-server whose JetStream domain is
//! the cell's name ([`NatsServer::start_cell`]) and two livegate nodes joined to it with
//! `--cluster-cell-domains` (nodes `a1`, `a2`, `b1`, `b2`). Cell b's server is a leaf node
//! of cell a's through a [`Link`] the test can cut (the only path between the cells). A
//! whole cell can be killed with `kill -9` (its NATS and its nodes) and started again on
//! the same ports and stores.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use super::link::{Condition, Link};
use super::nats::{CellNatsConfig, NatsServer};
use super::process::ServeProcess;
use super::process::metric;
use super::{wait_until_every, Auth, Body, Http};

/// The cells, in the order their nodes are numbered.
pub const CELL_NAMES: [&str; 2] = ["a", "b"];
/// Nodes per cell.
pub const CELL_NODES: usize = 2;
/// The token key every node of every cell shares (`--cluster-token-secret`).
pub const TOKEN_SECRET: &str = "cells-test-token-secret-0123456789abcdef";
/// How long the four nodes may take to hear each other.
pub const CELLS_FORM_LIMIT: Duration = Duration::from_secs(30);

pub struct Cells {
    /// Each cell's nats-server, by [`CELL_NAMES`] index.
    pub nats: Vec<NatsServer>,
    /// Between cell b's server and cell a's leaf port.
    pub link: Link,
    nodes: Vec<Option<ServeProcess>>,
    extra: Vec<String>,
    starts: Vec<usize>,
    root: TempDir,
}

impl Cells {
    /// Starts both cells (cell `c`'s server with `nats(c)`) and their nodes with the cell
    /// flags plus `extra`; returns once every node is ready and counts the three others
    /// alive.
    pub fn start(extra: &[&str], nats: impl Fn(usize) -> CellNatsConfig) -> Cells {
        let root = tempfile::Builder::new().prefix("livegate-cells-").tempdir().expect("tempdir");
        let link = Link::start();
        let dir = |cell: &str| {
            let dir = root.path().join(format!("nats-{cell}"));
            std::fs::create_dir_all(&dir).expect("cell NATS dir");
            dir
        };
        let hub = NatsServer::start_cell(&dir("a"), "a", None, &nats(0));
        let through = format!("nats-leaf://{}", link.proxy(hub.leaf_addr()));
        let leaf = NatsServer::start_cell(&dir("b"), "b", Some(&through), &nats(1));
        let n = CELL_NAMES.len() * CELL_NODES;
        let mut cells = Cells {
            nats: vec![hub, leaf],
            link,
            nodes: (0..n).map(|_| None).collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            starts: vec![0; n],
            root,
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

    fn cell_index(cell: &str) -> usize {
        CELL_NAMES.iter().position(|c| *c == cell).unwrap_or_else(|| panic!("no cell {cell}"))
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.root().join(format!("data-{}", Cells::name(i)))
    }

    /// (Re)starts node `i` on its cell's NATS; returns once `/readyz` is 200.
    pub fn start_node(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "node {} is running", Cells::name(i));
        self.starts[i] += 1;
        let data = self.data_dir(i);
        std::fs::create_dir_all(&data).expect("node data dir");
        let log = self.root().join(format!("node-{}-{}.log", Cells::name(i), self.starts[i]));
        let url = self.nats[i / CELL_NODES].url();
        let cells = CELL_NAMES.join(",");
        let mut flags: Vec<&str> = vec![
            "--cluster-nats-url",
            &url,
            "--cell",
            Cells::cell_of(i),
            "--cells",
            &cells,
            "--cluster-cell-domains",
            "true",
            "--cluster-token-secret",
            TOKEN_SECRET,
        ];
        flags.extend(self.extra.iter().map(String::as_str));
        self.nodes[i] = Some(ServeProcess::start_named(&data, &log, &Cells::name(i), &flags));
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].is_some()
    }

    pub fn node(&self, i: usize) -> &ServeProcess {
        self.nodes[i].as_ref().unwrap_or_else(|| panic!("node {} is not running", Cells::name(i)))
    }

    pub fn addr(&self, i: usize) -> SocketAddr {
        self.node(i).addr
    }

    pub fn http(&self, i: usize) -> Http {
        self.node(i).http()
    }

    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.is_running(i)).collect()
    }

    /// Cuts the only path between the cells (a partition: no byte moves, no socket closes).
    pub fn cut(&self) {
        self.link.set(Condition::Cut);
    }

    pub fn heal(&self) {
        self.link.set(Condition::Up);
    }

    /// `kill -9` of `cell`'s nodes and its nats-server.
    pub fn kill_cell(&mut self, cell: &str) {
        for i in Cells::nodes_of(cell) {
            if let Some(node) = self.nodes[i].take() {
                node.kill9();
            }
        }
        self.nats[Cells::cell_index(cell)].kill9();
    }

    /// Starts `cell`'s nats-server again (same ports and store), then its nodes.
    pub fn restart_cell(&mut self, cell: &str) {
        self.nats[Cells::cell_index(cell)].restart();
        for i in Cells::nodes_of(cell) {
            self.start_node(i);
        }
    }

    /// Waits until cell b's server has (`true`) or has not a leaf connection to cell a's.
    pub fn wait_leaf(&self, up: bool, within: Duration) {
        let ok = wait_until_every(within, Duration::from_millis(50), || (self.nats[1].leaf_connections() > 0) == up);
        assert!(ok, "the leaf connection is not {} within {within:?}; logs:\n{}", if up { "up" } else { "down" }, self.logs());
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
                    let ready = matches!(http.try_request("GET", "/readyz", Auth::None, Body::None), Ok((200, _)));
                    (Cells::name(i), metric(&http, "livegate_cluster_peers_alive"), ready)
                })
                .collect::<Vec<_>>();
            seen.iter().all(|(_, peers, ready)| *ready && *peers == Some(want))
        });
        assert!(formed, "cells not formed within {within:?}: (node, peers alive, ready) = {seen:?}, want {want}; logs:\n{}", self.logs());
    }

    /// Every node log and both NATS logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (cell, nats) in CELL_NAMES.iter().zip(&self.nats) {
            out.push_str(&format!("===== nats of cell {cell} =====\n{}", nats.log_text()));
        }
        let mut paths: Vec<PathBuf> = std::fs::read_dir(self.root())
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "log")).collect())
            .unwrap_or_default();
        paths.sort();
        for p in paths {
            out.push_str(&format!("===== {} =====\n", p.display()));
            out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
        out
    }
}
