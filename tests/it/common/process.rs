//! The real `livegate serve` binary as a child process: started on `127.0.0.1:0` with a
//! data dir of the test's choosing, its address read from the `listening on http://ADDR`
//! line it prints on stdout, its log (stderr) kept in a file, and stopped with real
//! signals. Every wait is bounded; a process still running when the handle is dropped is
//! killed (SIGKILL), so a failing test never leaves a server behind.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{wait_for, wait_until, Auth, Body, Http, WsClient, API_KEY, NODE};

/// How long a start may take until `/readyz` answers 200.
pub const START_LIMIT: Duration = Duration::from_secs(30);

pub struct ServeProcess {
    child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
    /// When the process reported itself listening.
    pub started: Instant,
    /// Lines printed on stdout after the listening line.
    stdout: mpsc::Receiver<String>,
}

impl ServeProcess {
    /// `livegate serve --listen 127.0.0.1:0 --data-dir DATA --api-key .. --node ..` plus
    /// `extra` flags; stderr goes to `log`. Returns once `/readyz` answers 200. The
    /// process's environment has no `LIVEGATE_*` variables, so only the flags count.
    pub fn start(data_dir: &Path, log: &Path, extra: &[&str]) -> ServeProcess {
        ServeProcess::start_with_env(data_dir, log, extra, &[])
    }

    /// [`ServeProcess::start`] with extra environment variables (`RUST_LOG`, ...), set
    /// after the `LIVEGATE_*` variables of the test's own environment are removed.
    pub fn start_with_env(
        data_dir: &Path,
        log: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> ServeProcess {
        ServeProcess::spawn(data_dir, log, &["--api-key", API_KEY], extra, env)
    }

    /// Like [`ServeProcess::start`] but without `--api-key`: the key comes from `extra`
    /// (for example a `--config` file, which a reload reads again) or the key file.
    pub fn start_without_key(data_dir: &Path, log: &Path, extra: &[&str]) -> ServeProcess {
        ServeProcess::spawn(data_dir, log, &[], extra, &[])
    }

    /// [`ServeProcess::start`] as node `node` (instead of [`NODE`]), for several nodes of
    /// one cluster.
    pub fn start_named(data_dir: &Path, log: &Path, node: &str, extra: &[&str]) -> ServeProcess {
        ServeProcess::spawn_as(data_dir, log, node, &["--api-key", API_KEY], extra, &[])
    }

    /// [`ServeProcess::start_named`] with `LIVEGATE_*` variables `env` in its environment
    /// (a build that does not know a key ignores its variable with a warning, where it
    /// would refuse the flag).
    pub fn start_named_with_env(
        data_dir: &Path,
        log: &Path,
        node: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> ServeProcess {
        ServeProcess::spawn_as(data_dir, log, node, &["--api-key", API_KEY], extra, env)
    }

    fn spawn(
        data_dir: &Path,
        log: &Path,
        key: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> ServeProcess {
        ServeProcess::spawn_as(data_dir, log, NODE, key, extra, env)
    }

    fn spawn_as(
        data_dir: &Path,
        log: &Path,
        node: &str,
        key: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> ServeProcess {
        let mut serve = ServeProcess::spawn_listening(data_dir, log, node, key, extra, env);
        serve.wait_ready();
        serve
    }

    /// [`ServeProcess::start_named`] listening on `listen` (an address reserved before,
    /// so nodes that list each other as `peers` know their URLs before they start).
    pub fn start_named_at(
        data_dir: &Path,
        log: &Path,
        node: &str,
        listen: SocketAddr,
        extra: &[&str],
    ) -> ServeProcess {
        let listen = listen.to_string();
        let mut flags = vec!["--listen", listen.as_str()];
        flags.extend_from_slice(extra);
        ServeProcess::start_named(data_dir, log, node, &flags)
    }

    /// [`ServeProcess::start_named_with_env`] that returns as soon as the process prints
    /// its listening line, before it is ready (its listener is bound: connections wait in
    /// the backlog until it serves them). [`ServeProcess::wait_ready`] waits for the rest.
    pub fn start_named_listening(
        data_dir: &Path,
        log: &Path,
        node: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> ServeProcess {
        ServeProcess::spawn_listening(data_dir, log, node, &["--api-key", API_KEY], extra, env)
    }

    fn spawn_listening(
        data_dir: &Path,
        log: &Path,
        node: &str,
        key: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> ServeProcess {
        let mut cmd = Command::new(crate::common::livegate_bin());
        // An address in `extra` replaces the default.
        let listen_given = extra.contains(&"--listen");
        cmd.arg("serve")
            .args(if listen_given { &[][..] } else { &["--listen", "127.0.0.1:0"][..] })
            .arg("--data-dir")
            .arg(data_dir)
            .args(key)
            .args(["--node", node])
            .args(extra)
            .current_dir(data_dir.parent().unwrap_or(data_dir))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(log).expect("log file")));
        for (k, _) in std::env::vars() {
            if k.starts_with("LIVEGATE_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().expect("spawn livegate serve");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let log_text = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();
        let deadline = Instant::now() + START_LIMIT;
        let addr: SocketAddr = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(line) => {
                    if let Some((_, rest)) = line.split_once(" listening on http://") {
                        let text = rest.split_whitespace().next().unwrap_or("");
                        break text.parse().unwrap_or_else(|e| panic!("address in {line:?}: {e}"));
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().ok();
                    panic!("livegate serve ended stdout ({status:?}) without a listening line; log:\n{}", log_text(log));
                }
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "livegate serve printed no listening line within {START_LIMIT:?}; log:\n{}",
                    log_text(log)
                );
            }
        };
        ServeProcess { child, addr, log: log.to_path_buf(), started: Instant::now(), stdout: rx }
    }

    /// Waits until `/readyz` answers 200 (within [`START_LIMIT`] of the listening line);
    /// panics with the log if the process exits or stays unready.
    pub fn wait_ready(&mut self) {
        let http = Http::new(self.addr);
        let (addr, log) = (self.addr, self.log.clone());
        let log_text = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();
        let child = &mut self.child;
        let ready = wait_until(START_LIMIT.saturating_sub(self.started.elapsed()), || {
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!(
                    "livegate serve exited with {status} before becoming ready; log:\n{}",
                    log_text(&log)
                );
            }
            matches!(http.try_request("GET", "/readyz", Auth::None, Body::None), Ok((200, _)))
        });
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "livegate serve on {addr} not ready within {START_LIMIT:?}; log:\n{}",
                log_text(&log)
            );
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn http(&self) -> Http {
        Http::new(self.addr)
    }

    /// Sends a signal by name (`TERM`, `INT`, `KILL`, ...) with `kill -s`.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .unwrap_or_else(|e| panic!("run kill -s {name}: {e}"));
        assert!(status.success(), "kill -s {name} {} failed: {status}", self.pid());
    }

    /// Waits up to `within` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        wait_for(within, || self.child.try_wait().expect("try_wait"))
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// SIGKILL and reap: no drain, no flush.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A `VmXxx:` figure of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`, ...).
    pub fn vm_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/{}/status", self.pid()))
    }

    /// Resident memory in KiB.
    pub fn rss_kib(&self) -> u64 {
        self.vm_kib("VmRSS")
    }

    /// The process's log (stderr) so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stdout lines printed after the listening line, so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.try_iter().collect()
    }

    /// Every stdout line not read yet, through the end of the stream (the process has
    /// exited and the reader reached EOF); waits at most `within` for the end.
    pub fn stdout_to_end(&self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut lines = Vec::new();
        while let Ok(line) =
            self.stdout.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            lines.push(line);
        }
        lines
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of metric `name` in the Prometheus text at `/metrics`, summed over its label
/// sets (`name 3` or `name{device="web"} 2`); `None` when absent or the server did not
/// answer.
pub fn metric(http: &Http, name: &str) -> Option<f64> {
    let (status, body) = http.try_request("GET", "/metrics", Auth::None, Body::None).ok()?;
    if status != 200 {
        return None;
    }
    let text = body.as_str()?.to_string();
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
            value.split_whitespace().next()?.parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Every event of `room` after `since`, paging through `GET /v1/rooms/{room}/events`;
/// returns the events, the epoch and the head.
pub fn full_history(
    http: &Http,
    room: &str,
    since: u64,
) -> (Vec<serde_json::Value>, serde_json::Value, u64) {
    let mut events: Vec<serde_json::Value> = Vec::new();
    let mut after = since;
    loop {
        let page = http.history_ok(room, Some(after), Some(1000));
        let got = page["events"]
            .as_array()
            .unwrap_or_else(|| panic!("history of {room}: {page}"))
            .clone();
        let head = page["head"]
            .as_u64()
            .unwrap_or_else(|| panic!("history of {room} without head: {page}"));
        if let Some(last) = got.last() {
            after = super::seq_of(last);
        }
        let done = got.is_empty() || after >= head;
        events.extend(got);
        if done {
            return (events, page["epoch"].clone(), head);
        }
    }
}

/// What resume handshakes met while a node started ([`handshakes_through_start`]).
pub struct StartHandshakes {
    /// Refused with 503 `unavailable` while `/readyz` still said not ready.
    pub refused_unready: usize,
    /// The first handshake admitted (after which `/readyz` answered 200).
    pub admitted: Option<WsClient>,
    /// Anything else: an admission before readiness, another refusal.
    pub failures: Vec<String>,
}

/// Resume handshakes for `session` with `token` on a node that just printed its
/// listening line (the first one waits in the listener's backlog), one after another,
/// until one is admitted or `within` passed. After each, `/readyz` is asked: a handshake
/// admitted must find it 200 (the node admitted nobody before it was ready); one refused
/// before that must be the documented 503 `unavailable`, and leaves the token unspent, so
/// the same token serves every attempt.
pub async fn handshakes_through_start(
    addr: SocketAddr,
    token: &str,
    session: &str,
    within: Duration,
) -> StartHandshakes {
    let http = Http::with_timeout(addr, Duration::from_secs(5));
    let readyz =
        || http.try_request("GET", "/readyz", Auth::None, Body::None).map(|(status, _)| status);
    let mut out = StartHandshakes { refused_unready: 0, admitted: None, failures: Vec::new() };
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match WsClient::try_connect(addr, Some(token), Some(session)).await {
            Ok(ws) => {
                // Admitted: `/readyz` must say ready, or (cluster mode) joining: reconciled
                // and taking connections, not yet routed to by every peer.
                let after = http.try_request("GET", "/readyz", Auth::None, Body::None);
                let joining = |body: &serde_json::Value| {
                    body["error"]["message"].as_str().is_some_and(|m| m.contains("joining"))
                };
                match &after {
                    Ok((200, _)) => {}
                    Ok((503, body)) if joining(body) => {}
                    _ => out.failures.push(format!(
                        "a handshake was admitted, and /readyz after it answered {after:?}"
                    )),
                }
                out.admitted = Some(ws);
                return out;
            }
            Err(refused) => {
                let after = readyz();
                let documented =
                    refused.status == 503 && super::error_code(&refused.body) == "unavailable";
                match (documented, after) {
                    (true, Ok(200)) => {}
                    (true, _) => out.refused_unready += 1,
                    (false, after) => out.failures.push(format!(
                        "a handshake during the start got {} {} (readyz after: {after:?})",
                        refused.status, refused.body
                    )),
                }
            }
        }
    }
    out.failures.push(format!(
        "no handshake admitted within {within:?} ({} refused before ready)",
        out.refused_unready
    ));
    out
}
