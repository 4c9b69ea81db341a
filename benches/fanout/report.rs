//! The report: `report.md` (machine, command, a table of medians with min–max and
//! livegate/peer ratios, the targets met or not, per-rate tables, problems),
//! `results.json` with every run's numbers, and the PNG plots (see `plots.rs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cluster::{metric, Topology};
use crate::floor::Floor;
use crate::plots;
use crate::scenarios::{Case, FloorStep, Record, Sizes, SCENARIOS};
use crate::servers::{Kind, Paths};

pub struct Meta {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub date: String,
    pub runs: usize,
    pub total: Duration,
    pub smoke: bool,
    pub versions: Vec<String>,
    pub skipped: Vec<String>,
    pub load_start: String,
    /// The CPUs livegate servers ran on.
    pub server_cpus: String,
}

fn cmd_out(cmd: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(cmd).args(args).output().ok()?;
    let s = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

impl Meta {
    pub fn collect(
        paths: &Paths,
        nproc: usize,
        runs: usize,
        total: Duration,
        smoke: bool,
        skipped: Vec<String>,
    ) -> Meta {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        let date = cmd_out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
        let root = paths.root.to_str().unwrap_or(".");
        let rev = cmd_out("git", &["-C", root, "rev-parse", "--short", "HEAD"])
            .unwrap_or_else(|| "?".into());
        let dirty = cmd_out("git", &["-C", root, "status", "--porcelain", "--untracked-files=no"])
            .is_some();
        let mut versions = vec![format!(
            "livegate {} (git {rev}{})",
            env!("CARGO_PKG_VERSION"),
            if dirty { ", with local changes" } else { "" }
        )];
        if let Some(b) = &paths.baseline_bin {
            let v =
                b.to_str().and_then(|p| cmd_out(p, &["--version"])).unwrap_or_else(|| "?".into());
            versions.push(format!(
                "livegate (before): {} from `--baseline-bin {}`",
                v,
                b.display()
            ));
        }
        if let Some(v) = cmd_out("nginx", &["-v"]) {
            let nchan = cmd_out("dpkg-query", &["-W", "-f", "${Version}", "libnginx-mod-nchan"])
                .unwrap_or_else(|| "?".into());
            versions.push(format!(
                "{} with libnginx-mod-nchan {nchan}",
                v.replace("nginx version: ", "")
            ));
        }
        let sio = std::fs::read_to_string(
            paths.peers().join("socketio/node_modules/socket.io/package.json"),
        )
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(String::from));
        if let (Some(s), Some(n)) = (sio, cmd_out("node", &["--version"])) {
            versions.push(format!("socket.io {s} on Node {n}"));
        }
        if paths.nats_server.is_file() {
            versions.push(format!(
                "nats-server {} ({})",
                crate::servers::nats_version(&paths.nats_server),
                paths.nats_server.display()
            ));
        }
        Meta {
            nproc,
            cpu_model,
            kernel,
            date,
            runs,
            total,
            smoke,
            versions,
            skipped,
            load_start: String::new(),
            server_cpus: paths.server_cpus.clone(),
        }
    }
}

/// One line per finished job for the log.
pub fn one_line(r: &Record) -> String {
    let key: Vec<String> =
        r.metrics.iter().take(4).map(|m| format!("{} {}", m.name, fmt(m.value))).collect();
    let mut s = format!(
        "[run {}] {} · {} ({:.0} s): {}",
        r.run,
        r.label,
        r.server.title(),
        r.secs,
        key.join(", ")
    );
    if r.steps.len() > 1 || matches!(r.case, Case::Slow) {
        for st in &r.steps {
            let _ = write!(
                s,
                "\n    {}/s: {} deliveries/s of {}, p99 {} ms, server CPU {:.0} %, load generator CPU {:.0} %, others {:.0} %",
                fmt(st.rate),
                fmt(st.delivered_per_s),
                fmt(st.expected_per_s),
                fmt(st.p99_ms),
                st.server_cpu_util * 100.0,
                st.client_cpu_util * 100.0,
                st.other_cpu_util * 100.0
            );
        }
    }
    for f in &r.floors {
        if let Ok(floor) = &f.floor {
            let _ = write!(
                s,
                "\n    floor beside {}/s ({} sockets, {:.1} rounds/s, {} B frames): {} µs CPU per write, {} writes per CPU-s, CPU {:.0} %; server {} µs per frame = {:.2}× the floor",
                fmt(f.rate),
                f.subscribers,
                f.rounds_per_s,
                f.frame_bytes,
                fmt(floor.us_per_write()),
                fmt(floor.writes_per_cpu_s()),
                floor.cpu_util() * 100.0,
                fmt(f.server_us_per_frame),
                f.times_floor()
            );
        }
    }
    for p in &r.problems {
        let _ = write!(s, "\n    problem: {p}");
    }
    for n in &r.notes {
        let _ = write!(s, "\n    note: {n}");
    }
    s
}

pub fn fmt(v: f64) -> String {
    if !v.is_finite() {
        return "—".into();
    }
    let a = v.abs();
    if a >= 100_000.0 {
        let s = format!("{:.0}", v);
        let (sign, digits) = s.split_at(if v < 0.0 { 1 } else { 0 });
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push('\u{202f}');
            }
            out.push(c);
        }
        format!("{sign}{out}")
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn cell(v: &[f64]) -> String {
    let f: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if f.is_empty() {
        return "—".into();
    }
    let (lo, hi) = f.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    if f.len() == 1 || fmt(lo) == fmt(hi) {
        fmt(median(&f))
    } else {
        format!("{} ({}–{})", fmt(median(&f)), fmt(lo), fmt(hi))
    }
}

/// Values of `metric` over the runs of `server` for a row: either livegate by its exact
/// case, peers by scenario (their one hot run stands against each of livegate's windows).
fn values(records: &[Record], server: Kind, case: Case, metric: &str) -> Vec<f64> {
    records
        .iter()
        .filter(|r| {
            r.server == server
                && if server.is_livegate() {
                    r.case == case
                } else {
                    r.case.scenario() == case.scenario()
                }
        })
        .filter_map(|r| r.metric(metric))
        .collect()
}

fn rows(records: &[Record]) -> Vec<(Case, Kind)> {
    // Cases in scenario order, livegate's variants first; a peer-only case if livegate did not run it.
    let mut out: Vec<(Case, Kind)> = Vec::new();
    for sc in SCENARIOS {
        let mut lg: Vec<(Case, Kind)> = Vec::new();
        for r in records.iter().filter(|r| r.case.scenario() == sc && r.server.is_livegate()) {
            if !lg.iter().any(|(c, _)| *c == r.case) {
                lg.push((r.case, r.server));
            }
        }
        if lg.is_empty() {
            if let Some(r) = records.iter().find(|r| r.case.scenario() == sc) {
                out.push((r.case, r.server));
            }
        }
        out.extend(lg);
    }
    out
}

pub fn servers_in(records: &[Record]) -> Vec<Kind> {
    let mut k: Vec<Kind> = records.iter().map(|r| r.server).collect();
    k.sort();
    k.dedup();
    k
}

pub fn write(
    dir: &Path,
    records: &[Record],
    sizes: &Sizes,
    meta: &Meta,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let kinds = servers_in(records);
    let peers: Vec<Kind> = kinds.iter().copied().filter(|k| *k != Kind::Livegate).collect();
    let mut md = String::new();
    let _ =
        writeln!(md, "# livegate fan-out benchmark{}\n", if meta.smoke { " (smoke)" } else { "" });
    let _ = writeln!(
        md,
        "Machine: `nproc` {} · CPU {} · kernel {} · {}. livegate servers pinned to CPU {} (`taskset -c`), other servers to CPU 0, the load generator to CPU 1; loopback only.\n",
        meta.nproc, meta.cpu_model, meta.kernel, meta.date, meta.server_cpus
    );
    let _ = writeln!(md, "Versions: {}.\n", meta.versions.join(" · "));
    let _ = writeln!(
        md,
        "Command: `benches/run` (installs the peers, then `cargo bench --bench fanout -- --all`). {} interleaved run(s) of every scenario for every server; total time {:.0} s ({:.1} min).\n",
        meta.runs,
        meta.total.as_secs_f64(),
        meta.total.as_secs_f64() / 60.0
    );
    let others: Vec<f64> =
        records.iter().flat_map(|r| r.steps.iter().map(|s| s.other_cpu_util * 100.0)).collect();
    let load_end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let _ = writeln!(
        md,
        "Machine load: 1-min load average {} at the start, {} at the end; other processes (not the server, not the load generator) used a median {:.0} % (max {:.0} %) of one core during the measured steps. The machine is shared, so this is part of the noise.\n",
        meta.load_start.split_whitespace().next().unwrap_or("?"),
        load_end.split_whitespace().next().unwrap_or("?"),
        median(&others),
        others.iter().copied().fold(0.0, f64::max)
    );
    for s in &meta.skipped {
        let _ = writeln!(md, "Skipped {s}.\n");
    }

    // Main table.
    let _ = writeln!(md, "## Results\n\nMedian of the runs, (min–max) when they differ. Ratio = livegate median / peer median (livegate/livegate (before): this build ÷ the `--baseline-bin` build, same run); the arrow says which direction is better. fanout's `floor:` and `÷ floor` rows are each server's own floor, measured beside its run (see the floor section below).\n");
    let mut head = String::from("| scenario | metric | ");
    let mut rule = String::from("|---|---|");
    for k in &kinds {
        let _ = write!(head, "{} | ", k.title());
        rule.push_str("---:|");
    }
    for p in &peers {
        let _ = write!(head, "livegate/{} | ", p.title());
        rule.push_str("---:|");
    }
    let _ = writeln!(md, "{}\n{rule}", head.trim_end());
    for (case, owner) in rows(records) {
        let Some(first) = records.iter().find(|r| r.case == case && r.server == owner) else {
            continue;
        };
        for m in &first.metrics {
            let arrow = if m.higher_better { "↑" } else { "↓" };
            let mut line = format!("| {} | {} {arrow} |", first.label, m.name);
            let mut meds = BTreeMap::new();
            for &k in &kinds {
                let v = values(records, k, case, &m.name);
                meds.insert(k, median(&v));
                let _ = write!(line, " {} |", cell(&v));
            }
            for p in &peers {
                let a = meds.get(&Kind::Livegate).copied().unwrap_or(f64::NAN);
                let b = meds.get(p).copied().unwrap_or(f64::NAN);
                let ratio = if a.is_finite() && b.is_finite() && b != 0.0 {
                    format!("{:.2}", a / b)
                } else {
                    "—".into()
                };
                let _ = write!(line, " {ratio} |");
            }
            let _ = writeln!(md, "{line}");
        }
    }

    // Targets.
    let _ = writeln!(md, "\n## Targets from issue 7\n");
    let _ = writeln!(md, "| target | measured (median) | met? |\n|---|---|---|");
    let med = |k: Kind, case: Case, m: &str| median(&values(records, k, case, m));
    let fan_metric = "deliveries per server CPU-s, best rate".to_string();
    let lg_fan = med(Kind::Livegate, Case::Fanout, &fan_metric);
    for (peer, factor) in [(Kind::Nchan, 2.0), (Kind::SocketIo, 5.0)] {
        let p = med(peer, Case::Fanout, &fan_metric);
        target_row(
            &mut md,
            &format!(
                "fanout deliveries per server CPU-second (best rate of each) ≥ {factor}× {}",
                peer.title()
            ),
            lg_fan / p,
            |r| (format!("{} vs {} = {:.2}×", fmt(lg_fan), fmt(p), r), r >= factor),
        );
    }
    // The same comparison at equal publish rates: the highest fanout step each pair both ran.
    for (peer, factor) in [(Kind::Nchan, 2.0), (Kind::SocketIo, 5.0)] {
        let per = |k: Kind, r: f64| {
            median(
                &step_values(records, k, Case::Fanout, r)
                    .iter()
                    .map(|s| s.per_cpu_s)
                    .collect::<Vec<_>>(),
            )
        };
        let common = step_rates(records, Case::Fanout)
            .into_iter()
            .rev()
            .find(|&r| per(Kind::Livegate, r).is_finite() && per(peer, r).is_finite());
        if let Some(r) = common {
            let (a, b) = (per(Kind::Livegate, r), per(peer, r));
            target_row(&mut md, &format!("… the same at an equal rate ({r} publishes/s, the highest both ran) ≥ {factor}× {}", peer.title()), a / b, |x| {
                (format!("{} vs {} = {:.2}×", fmt(a), fmt(b), x), x >= factor)
            });
        }
    }
    for n in sizes.idle {
        let name = crate::scenarios::idle_metric(n);
        let v = med(Kind::Livegate, Case::Idle, &name);
        let title =
            format!("≤ 8 KiB server memory per idle subscribed connection ({} connections)", n);
        let held =
            med(Kind::Livegate, Case::Idle, &format!("connections held (of {})", sizes.idle[1]));
        if v.is_nan() && held.is_finite() && held < n as f64 {
            let _ = writeln!(
                md,
                "| {title} | could not hold {n} connections: {} held | **not met** |",
                fmt(held)
            );
            continue;
        }
        target_row(&mut md, &title, v, |v| {
            (format!("{} bytes ({:.1} KiB)", fmt(v), v / 1024.0), v <= 8192.0)
        });
    }
    let p99 = med(Kind::Livegate, Case::Fanout, &format!("p99 ms @{}/s", sizes.fanout_ref_rate));
    if p99.is_nan() {
        // Not reached: say where livegate's fanout stopped.
        let last = step_rates(records, Case::Fanout).into_iter().rev().find_map(|r| {
            let v = step_values(records, Kind::Livegate, Case::Fanout, r);
            (!v.is_empty()).then(|| (r, median(&v.iter().map(|s| s.p99_ms).collect::<Vec<_>>())))
        });
        if let Some((r, p)) = last {
            let _ = writeln!(
                md,
                "| p99 ≤ batch window + 20 ms (= 120 ms) at {} subscribers and {} publishes/s | not reached: overloaded before; highest step {r}/s had p99 {} ms | **not met** |",
                sizes.fanout_subs, sizes.fanout_ref_rate, fmt(p)
            );
        }
    } else {
        target_row(
            &mut md,
            &format!(
                "p99 ≤ batch window + 20 ms (= 120 ms) at {} subscribers and {} publishes/s",
                sizes.fanout_subs, sizes.fanout_ref_rate
            ),
            p99,
            |v| (format!("{} ms", fmt(v)), v <= 120.0),
        );
    }
    let acked = med(Kind::Livegate, Case::Durable, "acked publishes/s");
    target_row(&mut md, "≥ 10 000 acknowledged durable publishes/s", acked, |v| {
        (format!("{}/s", fmt(v)), v >= 10_000.0)
    });

    if let Some(table) = cluster_table(records) {
        let _ = writeln!(
            md,
            "\n## Cluster (issues 9 and 33): 1, 3 and 4 nodes, one or three NATS servers, both builds\n\nThe same load on every deployment: {} rooms × {} subscribers, each room's subscribers on one node; {} publishes/s to every room through every node (latency, NATS traffic, CPU per 1k acks), then {} closed-loop publishers the same way (acked publishes/s). Medians of the runs, (min–max) when they differ; ratio rows are this build ÷ the `--baseline-bin` build, same run. The NATS messages into a node are the live events of the rooms it is subscribed to (with broadcast fan-out: every room's), the publishes other nodes forward to it as the rooms' writer, the replies to the publishes it forwards, JetStream's acks of its appends, and heartbeats; the notes give each node's figures and NATS subscriptions.\n\n{table}",
            sizes.cluster_rooms, sizes.cluster_per_room, sizes.cluster_rate, sizes.cluster_durable_publishers
        );
    }

    if let Some(table) = cells_table(records) {
        let _ = writeln!(
            md,
            "\n## Cells (issue 47): a room homed in cell a, watched in a and in b\n\nTwo cells, each its own nats-server (JetStream domain = the cell, b a leaf node of a) and one node; {} subscribers of a room homed in a, on a's node (local) or on b's (cross: the live copies cross the leaf), {} publishes/s through a's node for {} s. Medians of the runs, (min–max) when they differ; cross ÷ local is the median of each run's ratio.\n\n{table}",
            sizes.cells_subs, sizes.cells_rate, sizes.cells_secs
        );
    }

    if let Some(table) = presence_table(records) {
        let _ = writeln!(
            md,
            "\n## Presence (issue 19): one room of {} subscribers, with and without presence\n\n{} of them take turns leaving, {}/s, each replaced {} ms later by a new user; publishes at {:?}/s. Medians of the runs, (min–max) when they differ.\n\n{table}",
            sizes.presence_subs, sizes.presence_pool, sizes.presence_churn_per_sec, sizes.presence_rejoin_ms, sizes.presence_rates
        );
    }
    if let Some(table) = reconnect_table(records) {
        let _ = writeln!(
            md,
            "\n## Reconnect wave (issue 18): resume credentials on vs off\n\n{} clients like livegate.js on one node over {} rooms; SIGTERM (drain, spread 2 s), then the node starts again on the same port and data dir. Backend calls = requests to the stand-in token endpoint from the SIGTERM until every client is subscribed again. Medians of the runs, (min–max) when they differ.\n\n{table}",
            sizes.reconnect_clients, sizes.reconnect_rooms
        );
    }

    // Per-rate tables.
    for (case, title) in [(Case::Fanout, "fanout (1 room)"), (Case::Rooms, "rooms")] {
        let rates = step_rates(records, case);
        if rates.is_empty() {
            continue;
        }
        let _ = writeln!(md, "\n## {title}: per publish rate (medians)\n");
        let mut h = String::from("| publishes/s |");
        let mut r = String::from("|---:|");
        for k in &kinds {
            let _ = write!(
                h,
                " {0} deliveries/s | {0} per CPU-s | {0} CPU % | {0} p99 ms |",
                k.title()
            );
            r.push_str("---:|---:|---:|---:|");
        }
        let _ = writeln!(md, "{h}\n{r}");
        for rate in rates {
            let mut line = format!("| {} |", fmt(rate));
            for &k in &kinds {
                let st = step_values(records, k, case, rate);
                if st.is_empty() {
                    line.push_str(" — | — | — | — |");
                    continue;
                }
                let col = |f: &dyn Fn(&crate::scenarios::Step) -> f64| {
                    fmt(median(&st.iter().map(f).collect::<Vec<_>>()))
                };
                let _ = write!(
                    line,
                    " {} | {} | {} | {} |",
                    col(&|s| s.delivered_per_s),
                    col(&|s| s.per_cpu_s),
                    col(&|s| s.server_cpu_util * 100.0),
                    col(&|s| s.p99_ms)
                );
            }
            let _ = writeln!(md, "{line}");
        }
    }

    if let Some(table) = floor_table(records) {
        let _ = writeln!(
            md,
            "\n## fanout against the machine's floor (issue 32)\n\nBeside every fanout step, once the server has stopped: the floor (`benches/fanout/floor.rs`), one `write()` per subscriber per round on loopback TCP from a thread pinned to CPU 0, a thread on CPU 1 draining every socket, with the step's reading subscribers, one round per frame a subscriber received per second, and frames of the step's mean received size (WebSocket header included). Floor CPU = the writer thread's alone (`getrusage(RUSAGE_THREAD)`; on loopback it includes the receiver's TCP work, as the servers' CPU does). ÷ floor = server CPU per delivered frame ÷ floor CPU per write. Medians of the runs.\n\n{table}"
        );
    }

    // Plots.
    let _ = writeln!(md, "\n## Plots\n");
    if let Some(rate) = plots::cdf_rate(records, sizes) {
        let _ = writeln!(md, "The latency CDF is at {rate} publishes/s: the reference rate if every server ran it, else the highest fanout step every server reached.\n");
    }
    for (file, alt) in plots::draw_all(dir, records, sizes) {
        let _ = writeln!(md, "![{alt}]({file})\n");
    }

    // How it was measured.
    let _ = writeln!(md, "## How each scenario runs\n");
    for line in method_notes(sizes) {
        let _ = writeln!(md, "- {line}");
    }

    // Problems and notes per run.
    let _ = writeln!(md, "\n## Problems and notes seen\n");
    let mut any = false;
    for r in records {
        for p in &r.problems {
            any = true;
            let _ = writeln!(md, "- run {} · {} · {}: **{p}**", r.run, r.label, r.server.title());
        }
        for n in &r.notes {
            any = true;
            let _ = writeln!(md, "- run {} · {} · {}: {n}", r.run, r.label, r.server.title());
        }
    }
    if !any {
        let _ = writeln!(md, "None: every reading client got every event exactly once.");
    }
    let path = dir.join(if meta.smoke { "smoke.md" } else { "report.md" });
    std::fs::write(&path, md)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&json(records)).unwrap_or_default(),
    )?;
    Ok(path)
}

/// The cluster deployments × the livegate builds: the columns, a ratio row (this
/// build ÷ the `--baseline-bin` build) per deployment when both ran, then what the fourth
/// node did to each of the three existing nodes.
pub fn cluster_table(records: &[Record]) -> Option<String> {
    let ran: Vec<&Record> = records
        .iter()
        .filter(|r| matches!(r.case, Case::Cluster(_)) && !r.metrics.is_empty())
        .collect();
    let first = ran.first()?;
    let rate = first.steps.first().map_or(f64::NAN, |s| s.rate);
    let at = |name: &str| format!("{name} @{rate}/s");
    let columns: Vec<(String, &str)> = vec![
        (metric::ACKED.to_string(), "acked publishes/s ↑"),
        (at(metric::P50), "p50 ms ↓"),
        (at(metric::P99), "p99 ms ↓"),
        (at(metric::MSGS_IN_MEAN), "NATS msgs/s into a node, mean ↓"),
        (at(metric::MSGS_IN_MAX), "… max ↓"),
        (at(metric::KIB_IN_MEAN), "NATS KiB/s into a node, mean ↓"),
        (metric::MSGS_IN_PER_PUBLISH.to_string(), "NATS msgs into a node per publish ↓"),
        (at(metric::LG_CPU_PER_1K), "livegate CPU ms per 1k acks ↓"),
        (at(metric::NATS_CPU_PER_1K), "nats-server CPU ms per 1k acks ↓"),
    ];
    let builds: Vec<Kind> = [Kind::LivegateBase, Kind::Livegate]
        .into_iter()
        .filter(|k| ran.iter().any(|r| r.server == *k))
        .collect();
    let ratio = |a: f64, b: f64| {
        if a.is_finite() && b.is_finite() && b != 0.0 {
            format!("{:.2}", a / b)
        } else {
            "—".into()
        }
    };
    let mut md = format!(
        "Publish→deliver latency, NATS traffic and CPU at {} publishes/s; acked publishes/s from the closed loop.\n\n| deployment | build | NATS |",
        fmt(rate)
    );
    for (_, title) in &columns {
        let _ = write!(md, " {title} |");
    }
    md.push_str("\n|---|---|---|");
    md.push_str(&"---:|".repeat(columns.len()));
    md.push('\n');
    for t in Topology::ALL {
        let case = Case::Cluster(t);
        let nats = if t.nats_servers() == 0 {
            "—".to_string()
        } else {
            let version = ran
                .iter()
                .filter(|r| r.case == case)
                .flat_map(|r| r.notes.iter())
                .find_map(|n| {
                    n.strip_prefix("nats-server ").and_then(|v| v.split_whitespace().next())
                })
                .unwrap_or("?");
            format!("{} × {version}", t.nats_servers())
        };
        for &k in &builds {
            if !ran.iter().any(|r| r.server == k && r.case == case) {
                continue;
            }
            let _ = write!(md, "| {} | {} | {nats} |", t.title(), k.title());
            for (name, _) in &columns {
                let _ = write!(md, " {} |", cell(&values(records, k, case, name)));
            }
            md.push('\n');
        }
        if builds.len() == 2 {
            let _ = write!(md, "| {} | ratio | |", t.title());
            for (name, _) in &columns {
                let m = |k| median(&values(records, k, case, name));
                let _ = write!(md, " {} |", ratio(m(Kind::Livegate), m(Kind::LivegateBase)));
            }
            md.push('\n');
        }
    }

    // The fourth node: each existing node's NATS traffic and CPU, 3 nodes → 4 on three NATS.
    let (three, four) =
        (Case::Cluster(Topology::ThreeOnThreeNats), Case::Cluster(Topology::FourOnThreeNats));
    if ran.iter().any(|r| r.case == three) && ran.iter().any(|r| r.case == four) {
        md.push_str("\n**What a fourth node costs each existing node** (same load, three NATS servers; 4 ÷ 3 is the change the fourth node made):\n\n");
        md.push_str("| build | node | NATS msgs/s in, 3 nodes | 4 nodes | 4 ÷ 3 | CPU ms per 1k acks, 3 nodes | 4 nodes | 4 ÷ 3 |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
        let mut summary = Vec::new();
        for &k in &builds {
            let (mut msgs_ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
            for node in &crate::servers::NODE_NAMES[..3] {
                let (m3, m4) = (
                    values(records, k, three, &metric::node_msgs_in(node)),
                    values(records, k, four, &metric::node_msgs_in(node)),
                );
                let (c3, c4) = (
                    values(records, k, three, &metric::node_cpu_per_1k(node)),
                    values(records, k, four, &metric::node_cpu_per_1k(node)),
                );
                let (mr, cr) = (median(&m4) / median(&m3), median(&c4) / median(&c3));
                msgs_ratios.push(mr);
                cpu_ratios.push(cr);
                let _ = writeln!(
                    md,
                    "| {} | {node} | {} | {} | {} | {} | {} | {} |",
                    k.title(),
                    cell(&m3),
                    cell(&m4),
                    ratio(median(&m4), median(&m3)),
                    cell(&c3),
                    cell(&c4),
                    ratio(median(&c4), median(&c3))
                );
            }
            let pct = |v: &[f64]| {
                let m = median(v);
                let change = ((m - 1.0) * 100.0).round();
                if !m.is_finite() {
                    "—".into()
                } else if change == 0.0 {
                    "±0 %".into()
                } else {
                    format!("{change:+.0} %")
                }
            };
            summary.push(format!(
                "{}: NATS messages into each existing node {}, its CPU per acknowledged publish {}",
                k.title(),
                pct(&msgs_ratios),
                pct(&cpu_ratios)
            ));
        }
        let _ =
            writeln!(md, "\nA fourth node (medians over nodes a, b, c) — {}.", summary.join("; "));
    }
    Some(md)
}

/// The presence scenario's arms side by side: this build with `presence:true`, with
/// `presence:false`, and the `--baseline-bin` build; ratios of the medians, and what
/// presence costs in server CPU per delivery.
pub fn presence_table(records: &[Record]) -> Option<String> {
    use crate::presence::Arm;
    let arms = [
        (Kind::Livegate, Case::Presence(Arm::On)),
        (Kind::Livegate, Case::Presence(Arm::Off)),
        (Kind::LivegateBase, Case::Presence(Arm::Absent)),
    ];
    let first =
        records.iter().find(|r| matches!(r.case, Case::Presence(_)) && !r.metrics.is_empty())?;
    let ratio = |a: f64, b: f64| {
        if a.is_finite() && b.is_finite() && b != 0.0 {
            format!("{:.2}", a / b)
        } else {
            "—".into()
        }
    };
    let mut md = String::from("| metric | presence:true | presence:false | build without presence | true ÷ false | true ÷ without |\n|---|---:|---:|---:|---:|---:|\n");
    let mut cost = Vec::new();
    for m in &first.metrics {
        let arrow = if m.higher_better { "↑" } else { "↓" };
        let v: Vec<Vec<f64>> = arms.iter().map(|&(k, c)| values(records, k, c, &m.name)).collect();
        let med: Vec<f64> = v.iter().map(|x| median(x)).collect();
        let _ = writeln!(
            md,
            "| {} {arrow} | {} | {} | {} | {} | {} |",
            m.name,
            cell(&v[0]),
            cell(&v[1]),
            cell(&v[2]),
            ratio(med[0], med[1]),
            ratio(med[0], med[2])
        );
        if m.name.starts_with("server CPU µs per delivery") {
            let pct = |b: f64| {
                if med[0].is_finite() && b.is_finite() && b > 0.0 {
                    format!("{:+.1} %", (med[0] / b - 1.0) * 100.0)
                } else {
                    "—".into()
                }
            };
            cost.push(format!(
                "| presence's server CPU per delivery{} | | | | {} | {} |",
                m.name.trim_start_matches("server CPU µs per delivery"),
                pct(med[1]),
                pct(med[2])
            ));
        }
    }
    for c in cost {
        let _ = writeln!(md, "{c}");
    }
    Some(md)
}

/// The cells scenario's two arms side by side, with the median of each run's cross ÷
/// local, and each cell's idle traffic.
pub fn cells_table(records: &[Record]) -> Option<String> {
    use crate::cells::{metric as m, Arm};
    records.iter().find(|r| r.case == Case::Cells && !r.metrics.is_empty())?;
    let get = |name: &str| values(records, Kind::Livegate, Case::Cells, name);
    let mut md = format!(
        "| measure | {} | {} | cross ÷ local |\n|---|---:|---:|---:|\n",
        Arm::Local.title(),
        Arm::Cross.title()
    );
    for what in m::EACH {
        let _ = writeln!(
            md,
            "| {what} ↓ | {} | {} | {} |",
            cell(&get(&m::of(Arm::Local, what))),
            cell(&get(&m::of(Arm::Cross, what))),
            cell(&get(&m::ratio(what)))
        );
    }
    let d = m::DELIVERED;
    let _ = writeln!(
        md,
        "| {d} ↑ | {} | {} | |",
        cell(&get(&m::of(Arm::Local, d))),
        cell(&get(&m::of(Arm::Cross, d)))
    );
    for what in [m::P50, m::P99] {
        let _ = writeln!(
            md,
            "| {what}, both arms at once ↓ | {} | {} | {} |",
            cell(&get(&m::together(Arm::Local, what))),
            cell(&get(&m::together(Arm::Cross, what))),
            cell(&get(&m::together_ratio(what)))
        );
    }
    let _ = writeln!(
        md,
        "| {d}, both arms at once ↑ | {} | {} | |",
        cell(&get(&m::together(Arm::Local, d))),
        cell(&get(&m::together(Arm::Cross, d)))
    );
    let _ = writeln!(
        md,
        "\nIdle, before the arms (heartbeats, probes): cell a {} NATS msgs/s, cell b {}.",
        cell(&get(m::IDLE_A)),
        cell(&get(m::IDLE_B))
    );
    Some(md)
}

/// The reconnect wave's metrics side by side, mode on and off, with their ratio.
pub fn reconnect_table(records: &[Record]) -> Option<String> {
    let (on, off) = (Case::Reconnect(true), Case::Reconnect(false));
    let first =
        records.iter().find(|r| (r.case == on || r.case == off) && !r.metrics.is_empty())?;
    let mut md =
        String::from("| metric | resume on | resume off | on ÷ off |\n|---|---:|---:|---:|\n");
    for m in &first.metrics {
        let arrow = if m.higher_better { "↑" } else { "↓" };
        let (a, b) = (
            values(records, Kind::Livegate, on, &m.name),
            values(records, Kind::Livegate, off, &m.name),
        );
        let (ma, mb) = (median(&a), median(&b));
        let ratio = if ma.is_finite() && mb.is_finite() && mb != 0.0 {
            format!("{:.2}", ma / mb)
        } else {
            "—".into()
        };
        let _ = writeln!(md, "| {} {arrow} | {} | {} | {ratio} |", m.name, cell(&a), cell(&b));
    }
    Some(md)
}

/// The fanout steps of every server beside the floor measured with that server's
/// subscribers, rounds and frame size; "not measured" with the reason when no run got one.
pub fn floor_table(records: &[Record]) -> Option<String> {
    let fanout: Vec<&Record> =
        records.iter().filter(|r| r.case == Case::Fanout && !r.floors.is_empty()).collect();
    if fanout.is_empty() {
        return None;
    }
    let mut md = String::from(
        "| publishes/s | server | frames per subscriber per s | frame bytes | server CPU µs per frame | floor CPU µs per write | floor writes per CPU-s | floor CPU % | ÷ floor |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for rate in step_rates(records, Case::Fanout) {
        for k in servers_in(records) {
            let steps: Vec<&FloorStep> = fanout
                .iter()
                .filter(|r| r.server == k)
                .flat_map(|r| r.floors.iter().filter(|f| f.rate == rate))
                .collect();
            if steps.is_empty() {
                continue;
            }
            let col = |f: &dyn Fn(&FloorStep) -> f64| {
                cell(&steps.iter().map(|s| f(s)).collect::<Vec<_>>())
            };
            let of_floor = |f: fn(&Floor) -> f64| col(&|s| s.floor.as_ref().map_or(f64::NAN, f));
            let floor_cols = match steps.iter().find_map(|s| s.floor.as_ref().err()) {
                Some(why) if steps.iter().all(|s| s.floor.is_err()) => {
                    format!("not measured: {why} | — | — | —")
                }
                _ => format!(
                    "{} | {} | {} | {}",
                    of_floor(Floor::us_per_write),
                    of_floor(Floor::writes_per_cpu_s),
                    of_floor(|f| f.cpu_util() * 100.0),
                    col(&FloorStep::times_floor)
                ),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {floor_cols} |",
                fmt(rate),
                k.title(),
                col(&|s| s.rounds_per_s),
                col(&|s| s.frame_bytes as f64),
                col(&|s| s.server_us_per_frame)
            );
        }
    }
    Some(md)
}

fn target_row(md: &mut String, name: &str, v: f64, judge: impl Fn(f64) -> (String, bool)) {
    if v.is_finite() {
        let (text, ok) = judge(v);
        let _ = writeln!(md, "| {name} | {text} | {} |", if ok { "met" } else { "**not met**" });
    } else {
        let _ = writeln!(md, "| {name} | not measured | — |");
    }
}

pub fn step_rates(records: &[Record], case: Case) -> Vec<f64> {
    let mut rates: Vec<f64> = records
        .iter()
        .filter(|r| r.case == case)
        .flat_map(|r| r.steps.iter().map(|s| s.rate))
        .collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    rates.dedup();
    rates
}

pub fn step_values(
    records: &[Record],
    k: Kind,
    case: Case,
    rate: f64,
) -> Vec<crate::scenarios::Step> {
    records
        .iter()
        .filter(|r| r.server == k && r.case == case)
        .flat_map(|r| r.steps.iter().filter(|s| s.rate == rate).cloned())
        .collect()
}

fn method_notes(s: &Sizes) -> Vec<String> {
    vec![
        format!(
            "**idle**: {} then {} connections, each subscribed to one of {} rooms; bytes per connection = (server PSS after {} s settling − PSS before any connection) / N. The issue asks for 10k and 50k; a process may hold at most 20 000 open files here (hard limit), and both the server and the load generator are single processes, so the largest step is {}. livegate keeps a second descriptor (a dup) of every WebSocket socket, so it runs out of descriptors just under 10 000 connections: the first step and every 10k scenario below use {} so that livegate has room for its publishers; a step a server cannot hold reports how many connections it held.",
            s.idle[0], s.idle[1], s.idle_rooms, s.idle_settle_secs, s.idle[1], s.idle[0]
        ),
        format!(
            "**fanout**: 1 room × {} subscribers; open-loop publishing over HTTP at {:?} publishes/s, {} s warm-up + {} s measured per step; a step is the last one when p99 passes 2 s or fewer than half the deliveries arrive. Latency = receive time − intended send time (queueing in the publisher counts).",
            s.fanout_subs, s.fanout_rates, s.warm_secs, s.step_secs
        ),
        format!(
            "**floor** (issue 32, beside fanout): after each server's fanout, for every step it ran, {} s of one `write()` per reading subscriber per round on loopback TCP (writer thread on CPU 0, a reader thread on CPU 1 draining with epoll), one round per frame a subscriber received per second, frames of the step's mean received WebSocket frame (text payload + 2-byte header, 4 above 125 bytes); floor CPU per write = the writer thread's CPU (`getrusage(RUSAGE_THREAD)`) ÷ writes.",
            s.floor_secs
        ),
        format!("**rooms**: {} rooms × {} subscribers, publishes round-robin over the rooms at {:?} publishes/s in total.", s.rooms, s.per_room, s.rooms_rates),
        format!(
            "**hot**: {} rooms × {} subscribers, each room published at {}/s, so every connection receives {} events/s; livegate with batch windows {:?} ms, nchan and Socket.IO have one mode and run once (their row is repeated against each window).",
            s.hot_rooms, s.hot_per_room, s.hot_rate_per_room, s.hot_rate_per_room, s.hot_windows
        ),
        format!(
            "**durable**: livegate only — nchan and Socket.IO have no acknowledged durable publish. {} closed-loop publishers over {} rooms, each sending the next publish when the previous one was acknowledged (acked only after fsync); disk bytes per event = size of the data dir after the run / acknowledged events.",
            s.durable_publishers, s.durable_rooms
        ),
        format!(
            "**slow**: fanout with {} subscribers at {}/s with {} B padding per event; every {}th client never reads after subscribing (4 KiB receive buffer). livegate runs with `--max-outbox-bytes {}` here (default 1 MiB would not fill within the run) and closes such clients with 4009; nchan and Socket.IO buffer for them. p99 is over the reading clients.",
            s.slow_subs, s.slow_rate, s.slow_pad, s.slow_every, s.slow_outbox
        ),
        format!(
            "**cluster** (issues 9 and 33, livegate builds only): every process (livegate nodes, nats-servers) pinned to CPU 0 like every server here, so a cluster gets the same one core as the single node. Deployments: 1 node without a cluster url; nodes a, b, c on one `nats-server -js`; a, b, c on three nats-servers in one NATS cluster (routes on loopback, `--cluster-replicas 3`); a, b, c, d on those three. {0} rooms, each with {1} WebSocket subscribers on node `room % nodes`; {2} publishes/s (HTTP with an `id`) to every room through every node in turn ({3} s warm-up + {4} s measured): publish→deliver latency over all subscribers, delivered %, and missing, duplicate and out-of-order (room `seq` going back) deliveries; then {5} closed-loop publishers the same way for {6} s (acked = JetStream acknowledged; single node: fsynced), subscribers still connected. NATS traffic into a node = what its nats-server sent on the node's connection (`/connz` `out_msgs`/`out_bytes`, connection name `livegate <node>`, summed over the servers), measured over the open-loop window. CPU per 1k acks = the processes' CPU in the open-loop window ÷ the publishes acknowledged in it. Batch window {7} ms so latency shows the path, not the window.",
            s.cluster_rooms, s.cluster_per_room, s.cluster_rate, s.warm_secs, s.cluster_secs, s.cluster_durable_publishers, s.cluster_durable_secs, s.cluster_window_ms
        ),
        format!(
            "**reconnect** (issue 18, livegate only): {} clients, each its own user, subscribed to one of {} rooms, behaving like livegate.js: after a close 1012 they wait the delay its reason suggests (`reconnect in N ms`) plus up to {} ms of jitter, after a failed attempt they back off in livegate.js's tiers (random × 0, 2, 5, 10, 30 s). Mode on: the next attempt presents the last welcome's resume credential, a token only when a resume is refused (401); mode off: every attempt first asks the stand-in token endpoint (a small HTTP server in the bench that counts calls and mints through livegate's `POST /v1/tokens`). Both modes in every run, one after the other, each on a fresh node.",
            s.reconnect_clients, s.reconnect_rooms, crate::reconnect::HINT_JITTER_MS
        ),
        format!(
            "**presence** (issue 19, livegate only): 1 room × {} WebSocket subscribers, each its own user; {}/s of the last {} leave (oldest first), each replaced {} ms later by a new user; publishes at {:?}/s, {} s warm-up + {} s measured each. Three arms per run, each on a fresh server: this build subscribing `\"presence\":true`, the same with `\"presence\":false`, and the `--baseline-bin` build without the key. Stable subscribers must get every event once; presence frames are counted per stable subscriber.",
            s.presence_subs, s.presence_churn_per_sec, s.presence_pool, s.presence_rejoin_ms, s.presence_rates, s.warm_secs, s.presence_secs
        ),
        format!(
            "**cells** (issue 47, this build only): cells a and b, each its own nats-server (JetStream domain = the cell's name, `ping_interval` 1 s, `ping_max` 2; b's server a leaf node of a's) and one node (`a1`, `b1`, `--cluster-cell-domains true`), every process on CPU 0. Two arms one after the other on that deployment (their order alternates between runs), each a room of its own homed in cell a: {0} subscribers (users homed by their tokens' `cell` claim) on a1 (local) or on b1 (cross), {1} publishes/s (HTTP with an `id`) through a1, the rooms' writer ({2} s warm-up + {3} s measured), batch window {4} ms. NATS msgs per event = a cell's nats-server `/varz` `in_msgs + out_msgs` over the measured window ÷ events published in it; across the leaf = a's `/leafz` `in_msgs + out_msgs`; CPU = the four processes'. b's mirror of a's room stream takes every event of a in both arms. Each cell's idle traffic is read for {5} s before the arms. Then both arms at once, each in a fresh room with fresh subscribers and half the publish rate (the same events per second in all), for latency and the delivery check only (the cells' NATS counts cannot be split between the two rooms).",
            s.cells_subs, s.cells_rate, s.cells_warm_secs, s.cells_secs, s.cluster_window_ms, crate::cells::BACKGROUND_SECS
        ),
        format!("Payloads are `{{\"bs\":SEQ,\"bt\":NS,\"pad\":\"…\"}}` with {} B padding (~100 B of JSON); livegate wraps them as `{{\"data\":…}}` and delivers only once durable.", s.pad),
        "livegate clients each use their own user (`u0`, `u1`, …, device `web`), as real clients would, so each connection also holds its user's inbox subscription; each token is minted over HTTP before the connection.".into(),
        "Server CPU = utime+stime of the server process from `/proc/PID/stat` (nginx: its single worker; node: the whole process); memory = PSS from `/proc/PID/smaps_rollup`. The HTTP publishes are part of every server's CPU time.".into(),
        "Each run starts a fresh server process (fresh data dir for livegate); runs are interleaved: run 1 of every scenario and server, then run 2, then run 3.".into(),
    ]
}

fn json(records: &[Record]) -> serde_json::Value {
    serde_json::Value::Array(
        records
            .iter()
            .map(|r| {
                serde_json::json!({
                    "run": r.run,
                    "server": r.server.name(),
                    "case": r.label,
                    "secs": r.secs,
                    "metrics": r.metrics.iter().map(|m| (m.name.clone(), serde_json::json!(if m.value.is_finite() { Some(m.value) } else { None }))).collect::<serde_json::Map<_, _>>(),
                    "steps": r.steps.iter().map(|s| serde_json::json!({
                        "rate": s.rate, "delivered_per_s": s.delivered_per_s, "expected_per_s": s.expected_per_s,
                        "frames_per_s": s.frames_per_s, "server_cpu_util": s.server_cpu_util, "per_cpu_s": s.per_cpu_s,
                        "p50_ms": s.p50_ms, "p99_ms": s.p99_ms, "p999_ms": s.p999_ms, "client_cpu_util": s.client_cpu_util,
                        "other_cpu_util": s.other_cpu_util,
                    })).collect::<Vec<_>>(),
                    "floors": r.floors.iter().map(|f| serde_json::json!({
                        "rate": f.rate, "subscribers": f.subscribers, "rounds_per_s": f.rounds_per_s,
                        "frame_bytes": f.frame_bytes, "server_us_per_frame": f.server_us_per_frame,
                        "floor_us_per_write": f.floor.as_ref().map_or(f64::NAN, Floor::us_per_write),
                        "floor_writes_per_cpu_s": f.floor.as_ref().map_or(f64::NAN, Floor::writes_per_cpu_s),
                        "floor_cpu_util": f.floor.as_ref().map_or(f64::NAN, Floor::cpu_util),
                        "times_floor": f.times_floor(), "floor_error": f.floor.as_ref().err(),
                    })).collect::<Vec<_>>(),
                    "problems": r.problems,
                    "notes": r.notes,
                })
            })
            .collect(),
    )
}
