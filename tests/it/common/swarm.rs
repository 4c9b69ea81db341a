//! Many livegate.js clients in one Node process (`tests/js/support/swarm.mjs`), and what
//! its JSON lines say of each client: welcomes, losses, closes, refused upgrades, events
//! and redirects. The rolling-release and scale-out tests drive their clients with it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{wait_until, wait_until_every, API_KEY};

/// What the swarm runs: `clients` clients, each its own user (`user_prefix` and its
/// index), subscribed to `rooms_per_client` of `rooms` (client `c` takes rooms `c`,
/// `c + 1`, … modulo their number).
pub struct SwarmSpec<'a> {
    pub clients: usize,
    pub rooms: &'a [String],
    pub rooms_per_client: usize,
    pub user_prefix: &'a str,
}

#[derive(Debug, Clone)]
pub struct Welcome {
    pub at: Instant,
    pub node: String,
    pub session: String,
}

#[derive(Debug, Clone)]
pub struct Loss {
    /// By the client's clock (ms since the epoch).
    pub client_ms: u64,
    pub code: u16,
    /// The connection had been welcomed.
    pub welcomed: bool,
}

#[derive(Debug, Default)]
pub struct ClientState {
    pub welcomes: Vec<Welcome>,
    pub connected: bool,
    pub subscribed: HashSet<String>,
    /// Seqs handed to the application, per room, in order.
    pub events: HashMap<String, Vec<u64>>,
    /// Every `disconnected` of the client.
    pub losses: Vec<Loss>,
    /// Close frames the client's sockets received: (when, code, reason, "lb" | "direct").
    pub closes: Vec<(Instant, u16, String, String)>,
    /// Upgrades answered with an HTTP status instead of 101: (when, status, via).
    pub refusals: Vec<(Instant, u16, String)>,
    pub recovery_failed: Vec<(Instant, String)>,
    /// livegate.js's `redirect` events: where a refusal sent it, or why ("node reason").
    pub redirects: Vec<String>,
    pub errors: Vec<String>,
}

#[derive(Debug, Default)]
pub struct SwarmState {
    pub clients: Vec<ClientState>,
    pub ready: bool,
    pub bye: bool,
    /// Lines that were not understood.
    pub junk: Vec<String>,
}

impl SwarmState {
    fn take(&mut self, line: &str) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            self.junk.push(line.to_string());
            return;
        };
        let text = |k: &str| v[k].as_str().unwrap_or("").to_string();
        let code = |k: &str| v[k].as_u64().unwrap_or(0) as u16;
        match v["t"].as_str() {
            Some("ready") => return self.ready = true,
            Some("bye") => return self.bye = true,
            _ => {}
        }
        let Some(c) = v["c"].as_u64().map(|c| c as usize).filter(|&c| c < self.clients.len())
        else {
            self.junk.push(line.to_string());
            return;
        };
        let client = &mut self.clients[c];
        match v["t"].as_str().unwrap_or("") {
            "welcome" => {
                client.welcomes.push(Welcome {
                    at: Instant::now(),
                    node: text("node"),
                    session: text("session"),
                });
                client.connected = true;
            }
            "lost" => {
                client.connected = false;
                client.losses.push(Loss {
                    client_ms: v["ms"].as_u64().unwrap_or(0),
                    code: code("code"),
                    welcomed: v["welcomed"] == true,
                });
            }
            "sub" => {
                client.subscribed.insert(text("r"));
            }
            "ev" => client.events.entry(text("r")).or_default().push(v["s"].as_u64().unwrap_or(0)),
            "close" => {
                client.closes.push((Instant::now(), code("code"), text("reason"), text("via")))
            }
            "refused" => client.refusals.push((Instant::now(), code("status"), text("via"))),
            "redirect" => client.redirects.push(format!("{} {}", text("node"), text("reason"))),
            "rfail" => client.recovery_failed.push((Instant::now(), text("r"))),
            "err" => client.errors.push(format!("{}: {}", text("code"), text("message"))),
            _ => self.junk.push(line.to_string()),
        }
    }
}

pub struct Swarm {
    child: Child,
    stdin: Option<ChildStdin>,
    state: Arc<Mutex<SwarmState>>,
    reader: Option<JoinHandle<()>>,
}

impl Swarm {
    /// `node tests/js/support/swarm.mjs` as `spec` says, its clients given `url`; its
    /// stderr goes to `log`.
    pub fn start(url: &str, spec: &SwarmSpec<'_>, log: &Path) -> Swarm {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/js/support/swarm.mjs");
        let mut child = Command::new("node")
            .arg(script)
            .env("SWARM_URL", url)
            .env("SWARM_CLIENTS", spec.clients.to_string())
            .env("SWARM_ROOMS", spec.rooms.join(","))
            .env("SWARM_ROOMS_PER_CLIENT", spec.rooms_per_client.to_string())
            .env("SWARM_USER_PREFIX", spec.user_prefix)
            .env("SWARM_API_KEY", API_KEY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(log).expect("swarm log")))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run `node` ({e}): this test needs Node 20+ (`apt-get install -y nodejs`; .ci/test does this)")
            });
        let state = Arc::new(Mutex::new(SwarmState {
            clients: (0..spec.clients).map(|_| ClientState::default()).collect(),
            ..SwarmState::default()
        }));
        let stdout = child.stdout.take().expect("swarm stdout");
        let s = state.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                s.lock().unwrap().take(&line);
            }
        });
        let stdin = child.stdin.take();
        Swarm { child, stdin, state, reader: Some(reader) }
    }

    pub fn with<T>(&self, f: impl FnOnce(&SwarmState) -> T) -> T {
        f(&self.state.lock().unwrap())
    }

    /// Waits up to `within` for `cond`; returns whether it held.
    pub fn wait(&mut self, within: Duration, mut cond: impl FnMut(&SwarmState) -> bool) -> bool {
        let (state, child) = (&self.state, &mut self.child);
        wait_until_every(within, Duration::from_millis(20), || {
            if cond(&state.lock().unwrap()) {
                return true;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the Node swarm exited with {status}");
            }
            false
        })
    }

    /// Where each connected client was last welcomed, counted per node.
    pub fn distribution(&self) -> BTreeMap<String, usize> {
        self.with(|s| {
            let mut by_node = BTreeMap::new();
            for client in s.clients.iter().filter(|c| c.connected) {
                *by_node
                    .entry(client.welcomes.last().map(|w| w.node.clone()).unwrap_or_default())
                    .or_default() += 1;
            }
            by_node
        })
    }

    /// Closes stdin (the clients close, the process exits), waits a bounded time.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        wait_until(Duration::from_secs(10), || matches!(self.child.try_wait(), Ok(Some(_))));
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
