//! The servers under test as child processes pinned to CPU 0 with `taskset`: livegate
//! (the release binary cargo built for this bench), nginx with nchan (one worker), and
//! Socket.IO in one Node process. Start, readiness, the pid whose CPU and memory are
//! sampled, and shutdown.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http::HttpClient;
use crate::procstat;

pub const API_KEY: &str = "fanout-bench-api-key-0123456789";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The CPU the servers run on; the load generator takes the other one.
pub const SERVER_CPU: usize = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Livegate,
    Nchan,
    SocketIo,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Livegate, Kind::Nchan, Kind::SocketIo];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Livegate => "livegate",
            Kind::Nchan => "nchan",
            Kind::SocketIo => "socketio",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Kind::Livegate => "livegate",
            Kind::Nchan => "nchan",
            Kind::SocketIo => "Socket.IO",
        }
    }

    pub fn from_name(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s || (s == "socket.io" && *k == Kind::SocketIo))
    }
}

/// Where things are: the repository, the livegate binary, peers' files, scratch space.
pub struct Paths {
    pub root: PathBuf,
    pub livegate_bin: PathBuf,
    pub scratch: PathBuf,
}

impl Paths {
    pub fn peers(&self) -> PathBuf {
        self.root.join("benches/peers")
    }

    /// Why `kind` cannot run here, if it cannot.
    pub fn missing(&self, kind: Kind) -> Option<String> {
        let need: Vec<PathBuf> = match kind {
            Kind::Livegate => vec![self.livegate_bin.clone()],
            Kind::Nchan => vec!["/usr/sbin/nginx".into(), "/usr/lib/nginx/modules/ngx_nchan_module.so".into()],
            Kind::SocketIo => vec!["/usr/bin/node".into(), self.peers().join("socketio/node_modules/socket.io")],
        };
        need.iter().find(|p| !p.exists()).map(|p| format!("{} not found (run benches/run to install peers)", p.display()))
    }
}

#[derive(Clone, Copy, Debug)]
pub struct LivegateOpts {
    pub batch_window_ms: u64,
    pub max_outbox_bytes: u64,
}

impl Default for LivegateOpts {
    fn default() -> Self {
        LivegateOpts { batch_window_ms: 100, max_outbox_bytes: 1 << 20 }
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

fn log_file(dir: &Path, name: &str) -> Stdio {
    std::fs::File::create(dir.join(name)).map(Stdio::from).unwrap_or_else(|_| Stdio::null())
}

impl Server {
    pub async fn start(kind: Kind, lg: LivegateOpts, paths: &Paths) -> Result<Server, String> {
        std::fs::create_dir_all(&paths.scratch).map_err(|e| e.to_string())?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-", kind.name()))
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
        for var in ["LIVEGATE_MAX_CONNECTIONS", "LIVEGATE_MAX_CONNECTIONS_PER_IP", "LIVEGATE_HANDSHAKES_PER_IP_PER_SEC"] {
            cmd.env(var, "0");
        }
        cmd.arg("-c").arg(SERVER_CPU.to_string());
        match kind {
            Kind::Livegate => {
                cmd.arg(&paths.livegate_bin)
                    .arg("serve")
                    .args(["--listen", &addr.to_string()])
                    .arg("--data-dir")
                    .arg(&data_dir)
                    .args(["--api-key", API_KEY])
                    .args(["--batch-window-ms", &lg.batch_window_ms.to_string()])
                    .args(["--max-outbox-bytes", &lg.max_outbox_bytes.to_string()])
                    .args(["--max-subscriptions", "1024"])
                    .args(["--drain-wait-secs", "0", "--drain-spread-secs", "0", "--drain-grace-secs", "1"])
                    .args(["--log-format", "json"])
                    .env("RUST_LOG", "warn");
            }
            Kind::Nchan => {
                let template = std::fs::read_to_string(paths.peers().join("nginx.conf")).map_err(|e| e.to_string())?;
                let prefix = dir.path().to_str().ok_or("non-UTF-8 scratch path")?;
                let conf = template.replace("@PORT@", &port.to_string()).replace("@PREFIX@", prefix);
                std::fs::write(dir.path().join("nginx.conf"), conf).map_err(|e| e.to_string())?;
                cmd.arg("/usr/sbin/nginx").arg("-p").arg(dir.path()).arg("-c").arg(dir.path().join("nginx.conf"));
            }
            Kind::SocketIo => {
                cmd.arg("node").arg(paths.peers().join("socketio/server.js")).arg(port.to_string());
            }
        }
        cmd.stdin(Stdio::null()).stdout(log_file(dir.path(), "stdout.log")).stderr(log_file(dir.path(), "stderr.log"));
        let child = cmd.spawn().map_err(|e| format!("spawn {}: {e}", kind.name()))?;
        let pid = child.id() as i32;
        let mut server = Server { kind, addr, stat_pid: pid, data_dir, child, _dir: dir };
        let started = Instant::now();
        let mut http = HttpClient::new(addr, None);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("{} exited at start ({status}); see {}", kind.name(), server.log_hint()));
            }
            if matches!(http.get("/readyz").await, Ok(r) if r.status == 200) {
                break;
            }
            if started.elapsed() > READY_TIMEOUT {
                server.stop();
                return Err(format!("{} not ready after {READY_TIMEOUT:?}", kind.name()));
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

    /// Stops the server and waits for it: SIGTERM to nginx's master (it stops its worker),
    /// SIGKILL to the others (nothing of theirs is needed after a run).
    pub fn stop(&mut self) {
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
            while std::path::Path::new(&format!("/proc/{}", self.stat_pid)).exists() && Instant::now() < deadline {
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
