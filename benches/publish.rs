//! Durable publishes per second with group commit.
//!
//! A load harness, not a micro benchmark: it starts a real livegate server in-process on
//! `127.0.0.1:0` with a fresh temporary data dir for every scenario run, drives
//! `POST /v1/rooms/{room}/events` from closed-loop publisher threads (one keep-alive
//! `ureq::Agent` each: the next publish leaves when the previous one was acknowledged,
//! which the server does only once the event is durable in sled), and reports acked
//! publishes per second, ack latency and bytes on disk per event.
//!
//! Scenarios:
//! - `sequential`: 1 publisher, 1 room: every publish waits for its own flush (baseline).
//! - `grouped-1room`: 32 publishers on 1 room: one flush serves many publishes.
//! - `grouped-100rooms`: 32 publishers over 100 rooms, each publisher round-robin.
//!
//! Usage: `cargo bench --bench publish [-- --secs N --runs N --warmup-secs N]`.
//! Unknown arguments (such as the `--bench` cargo passes) are ignored. The whole set of
//! scenarios is repeated `--runs` times, interleaved, and the table reports the median
//! (min–max) per scenario; the ratio column compares each scenario's acked/s with
//! `sequential` of the same run.
//!
//! Bounded: loopback only, every loop stops by time, every HTTP call has a timeout, all
//! threads are joined and each server is shut down before the next one starts.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const API_KEY: &str = "bench-api-key-0123456789";
/// Bound of any single HTTP call; a publish slower than this counts as an error.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for a freshly started server to answer `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------

struct Args {
    secs: u64,
    runs: usize,
    warmup_secs: u64,
}

fn parse_args() -> Args {
    let mut args = Args { secs: 5, runs: 3, warmup_secs: 1 };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        if !matches!(name.as_str(), "--secs" | "--runs" | "--warmup-secs") {
            continue; // `--bench` and anything else cargo or the user passes
        }
        let value = inline.or_else(|| it.next()).unwrap_or_else(|| panic!("{name} needs a value"));
        match name.as_str() {
            "--secs" => args.secs = parse_num(&name, &value),
            "--runs" => args.runs = parse_num(&name, &value),
            _ => args.warmup_secs = parse_num(&name, &value),
        }
    }
    assert!(args.secs >= 1, "--secs must be at least 1");
    assert!(args.runs >= 1, "--runs must be at least 1");
    args
}

fn parse_num<T: std::str::FromStr>(name: &str, value: &str) -> T {
    value.parse().unwrap_or_else(|_| panic!("{name}: not a number: {value:?}"))
}

// ---------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------

struct BenchServer {
    addr: SocketAddr,
    dir: tempfile::TempDir,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl BenchServer {
    fn start() -> BenchServer {
        let dir = tempfile::Builder::new().prefix("livegate-bench-").tempdir().expect("tempdir");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let config = livegate::config::Config {
            data_dir: dir.path().to_path_buf(),
            api_key: Some(API_KEY.into()),
            listen: addr,
            ..livegate::config::Config::default()
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("livegate-bench-server".into())
            .spawn(move || {
                actix_web::rt::System::new()
                    .block_on(livegate::server::run(listener, config, async move {
                        let _ = rx.await;
                    }))
                    .map_err(|e| format!("{e:?}"))
            })
            .expect("spawn server thread");
        let server = BenchServer { addr, dir, shutdown: Some(tx), thread: Some(thread) };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(2)).build();
        let url = format!("http://{}/readyz", self.addr);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(resp) = agent.get(&url).call() {
                if resp.status() == 200 {
                    return;
                }
            }
            if Instant::now() >= deadline {
                panic!("server on {} not ready after {READY_TIMEOUT:?}", self.addr);
            }
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                panic!("server thread exited before becoming ready");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Shut the server down (it flushes the store) and return its data dir.
    fn stop(mut self) -> tempfile::TempDir {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("warning: server returned an error: {e}"),
                Err(_) => eprintln!("warning: server thread panicked"),
            }
        }
        // `self` still owns `dir`; move it out by swapping in a throwaway that is removed at once.
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"))
    }
}

impl Drop for BenchServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// (apparent bytes, allocated bytes) of every file under `dir`.
fn dir_size(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut total = (0, 0);
    let Ok(entries) = std::fs::read_dir(dir) else { return total };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            let (a, b) = dir_size(&entry.path());
            total.0 += a;
            total.1 += b;
        } else if meta.is_file() {
            total.0 += meta.len();
            total.1 += meta.blocks() * 512;
        }
    }
    total
}

fn thread_count() -> usize {
    thread_names().len()
}

/// Names of this process's threads, as the kernel knows them.
fn thread_names() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut names: Vec<String> = dir
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    publishers: usize,
    rooms: usize,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario { name: "sequential", publishers: 1, rooms: 1 },
    Scenario { name: "grouped-1room", publishers: 32, rooms: 1 },
    Scenario { name: "grouped-100rooms", publishers: 32, rooms: 100 },
];

#[derive(Default)]
struct PublisherResult {
    /// Ack latencies (µs) of publishes acknowledged inside the measured window.
    latencies_us: Vec<u32>,
    /// Publishes acknowledged inside the measured window (those started in the warm-up too).
    acked_in_window: u64,
    /// Every acknowledged publish, warm-up included (all of them are on disk).
    acked_total: u64,
    errors: u64,
    first_error: Option<String>,
}

struct RunResult {
    acked_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    bytes_per_event: f64,
    alloc_bytes_per_event: f64,
    disk_mib: f64,
    errors: u64,
    first_error: Option<String>,
    acked_total: u64,
}

fn event_body(publisher: usize, n: u64) -> String {
    // ~100 bytes of data: a small, realistic event.
    format!(
        r#"{{"data":{{"publisher":{publisher},"n":{n},"kind":"score","text":"bench payload 0123456789abcdef"}}}}"#
    )
}

fn publisher(
    index: usize,
    scenario: Scenario,
    base: String,
    measure_from: Instant,
    measure_until: Instant,
    abort: Arc<AtomicBool>,
) -> PublisherResult {
    let agent =
        ureq::AgentBuilder::new().timeout(CALL_TIMEOUT).max_idle_connections_per_host(1).build();
    let auth = format!("Bearer {API_KEY}");
    let mut result =
        PublisherResult { latencies_us: Vec::with_capacity(16 * 1024), ..Default::default() };
    let mut n: u64 = 0;
    while !abort.load(Ordering::Relaxed) {
        let started = Instant::now();
        if started >= measure_until {
            break;
        }
        // Publisher i starts at room i and walks the rooms round-robin.
        let room = (index + n as usize) % scenario.rooms;
        let url = format!("{base}/v1/rooms/bench-{room}/events");
        let outcome = agent
            .post(&url)
            .set("Authorization", &auth)
            .set("Content-Type", "application/json")
            .send_string(&event_body(index, n));
        n += 1;
        let done = Instant::now();
        match outcome {
            Ok(resp) if resp.status() == 201 => {
                // Read the body so the connection goes back to the agent's pool.
                let _ = resp.into_string();
                result.acked_total += 1;
                if done >= measure_from && done <= measure_until {
                    result.acked_in_window += 1;
                    // A publish that left during the warm-up is counted but not timed.
                    if started >= measure_from {
                        result
                            .latencies_us
                            .push(done.duration_since(started).as_micros().min(u32::MAX as u128)
                                as u32);
                    }
                }
            }
            Ok(resp) => {
                let status = resp.status();
                let body = resp.into_string().unwrap_or_default();
                record_error(&mut result, format!("HTTP {status}: {body}"));
            }
            Err(ureq::Error::Status(status, resp)) => {
                let body = resp.into_string().unwrap_or_default();
                record_error(&mut result, format!("HTTP {status}: {body}"));
            }
            Err(e) => {
                record_error(&mut result, format!("transport: {e}"));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    result
}

fn record_error(result: &mut PublisherResult, message: String) {
    result.errors += 1;
    result.first_error.get_or_insert(message);
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn run_scenario(scenario: Scenario, args: &Args) -> RunResult {
    let server = BenchServer::start();
    let base = format!("http://{}", server.addr);
    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup_secs);
    let measure_until = measure_from + Duration::from_secs(args.secs);
    let abort = Arc::new(AtomicBool::new(false));
    let threads: Vec<JoinHandle<PublisherResult>> = (0..scenario.publishers)
        .map(|i| {
            let (base, abort) = (base.clone(), abort.clone());
            std::thread::Builder::new()
                .name(format!("bench-pub-{i}"))
                .spawn(move || publisher(i, scenario, base, measure_from, measure_until, abort))
                .expect("spawn publisher")
        })
        .collect();
    let mut results = Vec::with_capacity(threads.len());
    for thread in threads {
        match thread.join() {
            Ok(r) => results.push(r),
            Err(_) => {
                abort.store(true, Ordering::Relaxed);
                eprintln!("warning: a publisher thread panicked");
            }
        }
    }
    let window = args.secs as f64;
    let mut all: Vec<u32> = Vec::new();
    let (mut acked_in_window, mut acked_total, mut errors, mut first_error) = (0, 0, 0, None);
    for r in results {
        all.extend(r.latencies_us);
        acked_in_window += r.acked_in_window;
        acked_total += r.acked_total;
        errors += r.errors;
        if first_error.is_none() {
            first_error = r.first_error;
        }
    }
    all.sort_unstable();
    let dir = server.stop();
    let (apparent, allocated) = dir_size(dir.path());
    let per_event =
        |bytes: u64| if acked_total == 0 { f64::NAN } else { bytes as f64 / acked_total as f64 };
    RunResult {
        acked_per_sec: acked_in_window as f64 / window,
        p50_ms: percentile(&all, 50.0),
        p99_ms: percentile(&all, 99.0),
        max_ms: all.last().map_or(f64::NAN, |&us| us as f64 / 1000.0),
        bytes_per_event: per_event(apparent),
        alloc_bytes_per_event: per_event(allocated),
        disk_mib: apparent as f64 / (1024.0 * 1024.0),
        errors,
        first_error,
        acked_total,
    }
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

/// (median, min, max) of the finite values.
fn summary(values: impl IntoIterator<Item = f64>) -> (f64, f64, f64) {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
    (median, v[0], v[v.len() - 1])
}

fn cell(values: impl IntoIterator<Item = f64>, decimals: usize, runs: usize) -> String {
    let (median, min, max) = summary(values);
    if runs == 1 {
        format!("{median:.decimals$}")
    } else {
        format!("{median:.decimals$} ({min:.decimals$}–{max:.decimals$})")
    }
}

fn main() {
    let args = parse_args();
    let threads_before = thread_count();
    eprintln!(
        "publish bench: {} run(s) × {} scenarios, {} s warm-up + {} s measured each, release build",
        args.runs,
        SCENARIOS.len(),
        args.warmup_secs,
        args.secs
    );
    // results[scenario][run]
    let mut results: Vec<Vec<RunResult>> = SCENARIOS.iter().map(|_| Vec::new()).collect();
    for run in 1..=args.runs {
        for (i, scenario) in SCENARIOS.iter().enumerate() {
            let r = run_scenario(*scenario, &args);
            eprintln!(
                "run {run} {:<17} acked/s {:>8.1}  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  \
                 events {:>7}  disk {:>6.2} MiB  bytes/event {:>8.1} (allocated {:>8.1})  errors {}",
                scenario.name,
                r.acked_per_sec,
                r.p50_ms,
                r.p99_ms,
                r.max_ms,
                r.acked_total,
                r.disk_mib,
                r.bytes_per_event,
                r.alloc_bytes_per_event,
                r.errors
            );
            if let Some(e) = &r.first_error {
                eprintln!("    first error: {e}");
            }
            results[i].push(r);
        }
    }

    let runs = args.runs;
    println!();
    println!(
        "Durable publishes (201 after sled flush), {}-byte request bodies, closed loop, {} s measured \
         after {} s warm-up; median (min–max) of {} interleaved run(s)",
        event_body(0, 0).len(),
        args.secs,
        args.warmup_secs,
        runs
    );
    println!();
    println!("| scenario | publishers | rooms | acked/s | p50 ms | p99 ms | max ms | disk MiB | bytes/event | errors | × sequential |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, scenario) in SCENARIOS.iter().enumerate() {
        let rs = &results[i];
        let ratios =
            rs.iter().zip(&results[0]).map(|(r, base)| r.acked_per_sec / base.acked_per_sec);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            scenario.name,
            scenario.publishers,
            scenario.rooms,
            cell(rs.iter().map(|r| r.acked_per_sec), 0, runs),
            cell(rs.iter().map(|r| r.p50_ms), 2, runs),
            cell(rs.iter().map(|r| r.p99_ms), 2, runs),
            cell(rs.iter().map(|r| r.max_ms), 1, runs),
            cell(rs.iter().map(|r| r.disk_mib), 1, runs),
            cell(rs.iter().map(|r| r.bytes_per_event), 0, runs),
            rs.iter().map(|r| r.errors).sum::<u64>(),
            cell(ratios, 2, runs),
        );
    }
    println!();
    println!(
        "bytes/event = apparent size of every file in the data dir after shutdown ÷ events acked \
         (warm-up included); errors summed over runs."
    );
    // sled 0.34 keeps a process-wide pool of 7 immortal `sled-io-*` threads, started on the
    // first open and never stopped (sled's threadpool.rs); everything else must be gone.
    let leftover: Vec<String> =
        thread_names().into_iter().filter(|n| !n.starts_with("sled-io")).collect();
    if leftover.len() > threads_before {
        eprintln!("warning: thread(s) left over: {leftover:?} ({threads_before} before)");
    } else {
        eprintln!(
            "threads: none left over ({} at start, {} now besides sled's global sled-io pool)",
            threads_before,
            leftover.len()
        );
    }
}
