//! The cluster scenario (issues 9 and 33, livegate only): the same load on one node, on
//! three nodes sharing one nats-server, on three nodes over three replicated nats-servers
//! (a NATS cluster, streams and buckets at three replicas), and on four nodes over those
//! three, for each livegate build in the run (this one, and `--baseline-bin`'s).
//!
//! The load: `cluster_rooms` rooms, each room's `cluster_per_room` WebSocket subscribers
//! on one node (room `r` on node `r % nodes`), so rooms are spread over the nodes and a
//! node has no subscriber in the others' rooms. Publishers publish (HTTP, with an `id`) to
//! every room through every node: first open-loop at `cluster_rate` publishes/s
//! (publish→deliver latency, server CPU per publish, NATS traffic), then closed-loop
//! (acknowledged publishes/s) with the subscribers still there. Every delivery is checked:
//! once, in room order, none missing.
//!
//! The NATS traffic into each node is what its nats-server sent on the node's connection
//! (`out_msgs`/`out_bytes` of `/connz`, matched by the connection name `livegate <node>`).
//! With broadcast fan-out (every node subscribed to `lg.live.>`) every node receives every
//! room's events; with interest-based fan-out a node receives only its rooms' events
//! (plus its own acks, heartbeats and the like), which the side-by-side rows show.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use crate::load::{self, now_ns, ConnSpec, Publisher, Rec};
use crate::procstat;
use crate::scenarios::{ms, self_cpu, settle, Ctx, Out, Step};
use crate::servers::{
    self, Kind, LivegateCluster, LivegateOpts, Nats, Paths, Server, Traffic, NODE_NAMES,
};

/// The deployments of the cluster scenario, run one after the other for each build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Topology {
    /// One livegate node, no cluster url.
    One,
    /// Nodes a, b, c on one nats-server, one replica.
    ThreeOnOneNats,
    /// Nodes a, b, c on three nats-servers in one NATS cluster, three replicas.
    ThreeOnThreeNats,
    /// Nodes a, b, c, d on three nats-servers: what a fourth node costs the others.
    FourOnThreeNats,
}

impl Topology {
    pub const ALL: [Topology; 4] = [
        Topology::One,
        Topology::ThreeOnOneNats,
        Topology::ThreeOnThreeNats,
        Topology::FourOnThreeNats,
    ];

    pub fn nodes(self) -> usize {
        match self {
            Topology::One => 1,
            Topology::ThreeOnOneNats | Topology::ThreeOnThreeNats => 3,
            Topology::FourOnThreeNats => 4,
        }
    }

    /// nats-servers (0: no NATS at all).
    pub fn nats_servers(self) -> usize {
        match self {
            Topology::One => 0,
            Topology::ThreeOnOneNats => 1,
            Topology::ThreeOnThreeNats | Topology::FourOnThreeNats => 3,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Topology::One => "1 node",
            Topology::ThreeOnOneNats => "3 nodes / 1 NATS",
            Topology::ThreeOnThreeNats => "3 nodes / 3 NATS (R3)",
            Topology::FourOnThreeNats => "4 nodes / 3 NATS (R3)",
        }
    }
}

/// Metric names shared by the scenario and the report's cluster table.
pub mod metric {
    pub const ACKED: &str = "acked publishes/s";
    pub const P50: &str = "publish→deliver p50 ms";
    pub const P99: &str = "publish→deliver p99 ms";
    pub const MSGS_IN_MEAN: &str = "NATS msgs/s into a node, mean";
    pub const MSGS_IN_MAX: &str = "NATS msgs/s into a node, max";
    pub const KIB_IN_MEAN: &str = "NATS KiB/s into a node, mean";
    pub const MSGS_IN_PER_PUBLISH: &str = "NATS msgs into a node per publish, mean";
    pub const LG_CPU_PER_1K: &str = "livegate CPU ms per 1k acks, all nodes";
    pub const NATS_CPU_PER_1K: &str = "nats-server CPU ms per 1k acks, all servers";

    /// Per node: NATS messages/s into node `node` in the open-loop phase.
    pub fn node_msgs_in(node: &str) -> String {
        format!("node {node}: NATS msgs/s in")
    }

    /// Per node: node `node`'s CPU per 1000 acknowledged publishes in the open-loop phase.
    pub fn node_cpu_per_1k(node: &str) -> String {
        format!("node {node}: CPU ms per 1k acks")
    }
}

/// What one case runs against: one node, or a [`LivegateCluster`].
enum Deploy {
    One(Server),
    Cluster(LivegateCluster),
}

impl Deploy {
    async fn start(
        kind: Kind,
        topology: Topology,
        lg: LivegateOpts,
        paths: &Paths,
    ) -> Result<Deploy, String> {
        Ok(match topology {
            Topology::One => Deploy::One(Server::start(kind, lg, paths).await?),
            t => Deploy::Cluster(
                LivegateCluster::start(kind, t.nodes(), t.nats_servers(), lg, paths).await?,
            ),
        })
    }

    fn nodes(&self) -> Vec<&Server> {
        match self {
            Deploy::One(s) => vec![s],
            Deploy::Cluster(c) => c.nodes.iter().collect(),
        }
    }

    fn node_addrs(&self) -> Vec<SocketAddr> {
        self.nodes().iter().map(|n| n.addr).collect()
    }

    fn nats(&self) -> Option<&Nats> {
        match self {
            Deploy::One(_) => None,
            Deploy::Cluster(c) => Some(&c.nats),
        }
    }

    /// (name, pid) of every server process: the nodes, then the nats-servers.
    fn pids(&self) -> Vec<(String, i32)> {
        match self {
            Deploy::One(s) => vec![("a".into(), s.stat_pid)],
            Deploy::Cluster(c) => c.pids(),
        }
    }

    fn cpu(&self) -> Vec<f64> {
        self.pids().iter().map(|(_, p)| procstat::cpu_secs(*p).unwrap_or(0.0)).collect()
    }

    fn pss_total(&self) -> u64 {
        self.pids().iter().filter_map(|(_, p)| procstat::memory(*p)).map(|m| m.0).sum()
    }

    /// Warning and error lines in the processes' logs: (process, count, the first few).
    fn log_findings(&self) -> Vec<(String, usize, Vec<String>)> {
        let mut logs: Vec<(String, String)> = self
            .nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| (NODE_NAMES[i].to_string(), n.log_text()))
            .collect();
        if let Some(nats) = self.nats() {
            logs.extend(
                nats.servers.iter().map(|s| (format!("nats {}", s.name), s.log_since_ready())),
            );
        }
        logs.into_iter()
            .filter_map(|(name, text)| {
                let bad: Vec<String> = text
                    .lines()
                    .filter(|l| is_warning(l))
                    .map(|l| l.chars().take(300).collect())
                    .collect();
                (!bad.is_empty()).then(|| (name, bad.len(), bad.into_iter().take(3).collect()))
            })
            .collect()
    }

    fn stop(&mut self) {
        match self {
            Deploy::One(s) => s.stop(),
            Deploy::Cluster(c) => c.stop(),
        }
    }
}

/// livegate's JSON log lines at WARN or ERROR, a panic, or nats-server's [WRN]/[ERR]/[FTL].
pub fn is_warning(line: &str) -> bool {
    ["\"level\":\"WARN\"", "\"level\":\"ERROR\"", "panicked", "[WRN]", "[ERR]", "[FTL]"]
        .iter()
        .any(|n| line.contains(n))
}

/// What the servers did between two instants of the bench clock.
struct Window {
    secs: f64,
    /// CPU seconds of each of the deployment's processes (order of [`Deploy::pids`]).
    cpu: Vec<f64>,
    client_cpu: f64,
    other_cpu: f64,
    /// NATS traffic into and out of each node, by node name (empty without NATS).
    traffic: HashMap<String, Traffic>,
    traffic_error: Option<String>,
}

impl Window {
    /// CPU seconds of the livegate nodes and of the nats-servers.
    fn cpu_split(&self, nodes: usize) -> (f64, f64) {
        (self.cpu[..nodes].iter().sum(), self.cpu[nodes..].iter().sum())
    }

    /// NATS messages/s into each node, in node order.
    fn msgs_in_per_s(&self, nodes: usize) -> Vec<f64> {
        NODE_NAMES[..nodes]
            .iter()
            .map(|n| self.traffic.get(*n).map_or(f64::NAN, |t| t.msgs_in as f64 / self.secs))
            .collect()
    }
}

async fn traffic_now(dep: &Deploy) -> Result<HashMap<String, Traffic>, String> {
    match dep.nats() {
        Some(nats) => servers::node_traffic(nats).await,
        None => Ok(HashMap::new()),
    }
}

/// Samples CPU and NATS traffic at `from` and `to` (bench clock).
async fn window(dep: &Deploy, from: u64, to: u64) -> Window {
    tokio::time::sleep_until(load::instant_at(from)).await;
    let (cpu0, client0, busy0) = (dep.cpu(), self_cpu(), procstat::machine_busy_secs());
    let t0 = traffic_now(dep).await;
    tokio::time::sleep_until(load::instant_at(to)).await;
    let (cpu1, client1, busy1) = (dep.cpu(), self_cpu(), procstat::machine_busy_secs());
    let t1 = traffic_now(dep).await;
    let cpu: Vec<f64> = cpu1.iter().zip(&cpu0).map(|(b, a)| b - a).collect();
    let servers: f64 = cpu.iter().sum();
    let client_cpu = client1 - client0;
    let (traffic, traffic_error) = match (t0, t1) {
        (Ok(a), Ok(b)) => (
            b.iter()
                .map(|(k, v)| (k.clone(), v.since(a.get(k).copied().unwrap_or_default())))
                .collect(),
            None,
        ),
        (Err(e), _) | (_, Err(e)) => (HashMap::new(), Some(e)),
    };
    Window {
        secs: (to - from) as f64 / 1e9,
        cpu,
        client_cpu,
        other_cpu: ((busy1 - busy0) - servers - client_cpu).max(0.0),
        traffic,
        traffic_error,
    }
}

fn cpu_note(what: &str, dep: &Deploy, w: &Window) -> String {
    let parts: Vec<String> = dep
        .pids()
        .iter()
        .zip(&w.cpu)
        .map(|((name, _), c)| format!("{name} {:.0} %", c / w.secs * 100.0))
        .collect();
    format!("server CPU by process {what}: {}", parts.join(", "))
}

fn traffic_note(what: &str, nodes: usize, w: &Window) -> String {
    let parts: Vec<String> = NODE_NAMES[..nodes]
        .iter()
        .map(|n| match w.traffic.get(*n) {
            Some(t) => format!(
                "{n} in {:.0} msgs/s {:.1} KiB/s, out {:.0} msgs/s, {} subscriptions",
                t.msgs_in as f64 / w.secs,
                t.bytes_in as f64 / w.secs / 1024.0,
                t.msgs_out as f64 / w.secs,
                t.subscriptions
            ),
            None => format!("{n} not found in /connz"),
        })
        .collect();
    format!("NATS traffic by node {what}: {}", parts.join("; "))
}

fn mean(v: &[f64]) -> f64 {
    let f: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if f.is_empty() {
        f64::NAN
    } else {
        f.iter().sum::<f64>() / f.len() as f64
    }
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().filter(|x| x.is_finite()).fold(f64::NAN, f64::max)
}

pub async fn run(ctx: &Ctx<'_>, kind: Kind, topology: Topology) -> Result<Out, String> {
    let lg =
        LivegateOpts { batch_window_ms: ctx.sizes.cluster_window_ms, ..LivegateOpts::default() };
    (ctx.status)(format!("starting {}", topology.title()));
    let mut dep = Deploy::start(kind, topology, lg, ctx.paths).await?;
    let mut out = Out::new();
    if let Deploy::Cluster(c) = &dep {
        let version = servers::nats_version(&ctx.paths.nats_server);
        out.notes.push(format!(
            "nats-server {version} ({}); {}",
            ctx.paths.nats_server.display(),
            c.replicas
        ));
        if topology.nats_servers() == 3 && version.starts_with("v2.9") {
            out.notes.push("nats-server 2.9 has a replicated-JetStream expected-sequence race: use 2.15 (benches/run installs it)".into());
        }
    }
    if let Err(e) = measure(ctx, &dep, topology, &mut out).await {
        out.problems.push(format!("failed: {e}"));
    }
    for (name, n, first) in dep.log_findings() {
        out.notes.push(format!(
            "{name}'s log has {n} warning/error line(s); first: {}",
            first.join(" | ")
        ));
    }
    dep.stop();
    Ok(out)
}

/// Subscribers of room `r` on node `r % nodes`; open-loop publishes to every room through
/// every node, then closed-loop ones the same way; the delivery check over both.
async fn measure(
    ctx: &Ctx<'_>,
    dep: &Deploy,
    topology: Topology,
    out: &mut Out,
) -> Result<(), String> {
    let s = ctx.sizes;
    let nodes = topology.nodes();
    let addrs = dep.node_addrs();
    let rec = Rec::default();
    let mut sets = Vec::new();
    let mut connected = 0usize;
    for (j, &addr) in addrs.iter().enumerate() {
        let name = NODE_NAMES[j];
        let specs: Vec<ConnSpec> = (0..s.cluster_rooms)
            .filter(|r| r % nodes == j)
            .flat_map(|room| (0..s.cluster_per_room).map(move |_| ConnSpec { room, slow: false }))
            .collect();
        let progress =
            |d: usize, n: usize| (ctx.status)(format!("connecting to node {name}: {d}/{n}"));
        let first_user = j * s.cluster_rooms * s.cluster_per_room;
        let clients =
            load::open_clients(Kind::Livegate, addr, &specs, first_user, &rec, &progress).await?;
        if clients.failed > 0 {
            out.problems.push(format!(
                "{} of {} connections to node {name} failed: {}",
                clients.failed,
                specs.len(),
                clients.first_error.clone().unwrap_or_default()
            ));
        }
        connected += specs.len() - clients.failed;
        sets.push(clients);
    }
    // Let the nodes' interest in their rooms reach NATS before the first publish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pss = dep.pss_total();

    // Open loop: a fixed total rate, every room through every node.
    let rate = s.cluster_rate;
    (ctx.status)(format!("publishing {rate}/s through {nodes} node(s)"));
    let publisher = Publisher::spread(
        Kind::Livegate,
        &addrs,
        s.cluster_rooms,
        s.publish_connections,
        s.pad,
        true,
    );
    let start = now_ns() + 20_000_000;
    let idx = rec.borrow_mut().add_phase(start, s.warm_secs, s.cluster_secs);
    let (measure_at, end) = {
        let r = rec.borrow();
        (r.phases[idx].measure, r.phases[idx].end)
    };
    let ((), open) =
        tokio::join!(publisher.open_loop(&rec, rate, start, end), window(dep, measure_at, end));
    (ctx.status)("settling".into());
    let (published, pstats) = publisher.finish(Duration::from_secs_f64(s.settle_max_secs)).await;
    settle(&rec, s.settle_max_secs).await;
    if pstats.errors > 0 {
        out.problems.push(format!(
            "{} open-loop publishes failed: {}",
            pstats.errors,
            pstats.first_error.clone().unwrap_or_default()
        ));
    }
    let (open_published, p50, p99, p999) = {
        let r = rec.borrow();
        let p = &r.phases[idx];
        let secs = open.secs;
        let expected = p.published as f64 * s.cluster_per_room as f64 * connected as f64
            / (s.cluster_rooms * s.cluster_per_room) as f64;
        let open_cpu: f64 = open.cpu.iter().sum();
        // One step, so the report's machine-load line and results.json see this phase.
        out.steps.push(Step {
            rate,
            delivered_per_s: p.delivered as f64 / secs,
            expected_per_s: expected / secs,
            frames_per_s: p.frames as f64 / secs,
            server_cpu_util: open_cpu / secs,
            per_cpu_s: if open_cpu > 0.0 { p.delivered as f64 / open_cpu } else { f64::NAN },
            p50_ms: ms(&p.hist, 0.5),
            p99_ms: ms(&p.hist, 0.99),
            p999_ms: ms(&p.hist, 0.999),
            client_cpu_util: open.client_cpu / secs,
            other_cpu_util: open.other_cpu / secs,
        });
        out.cdfs.push((rate, p.hist.clone()));
        let delivered_pct =
            if expected > 0.0 { p.delivered as f64 / expected * 100.0 } else { f64::NAN };
        out.hi("delivered %", delivered_pct);
        (p.published, ms(&p.hist, 0.5), ms(&p.hist, 0.99), ms(&p.hist, 0.999))
    };
    out.notes.push(cpu_note(&format!("at {rate} publishes/s"), dep, &open));
    if dep.nats().is_some() {
        out.notes.push(traffic_note(&format!("at {rate} publishes/s"), nodes, &open));
    }
    if let Some(e) = &open.traffic_error {
        out.problems.push(format!("NATS traffic not measured: {e}"));
    }
    disturbance_notes(out, &open, "while publishing");

    // Closed loop: the same rooms and subscribers, as fast as acks return.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (ctx.status)(format!(
        "{} closed-loop publishers through {nodes} node(s)",
        s.cluster_durable_publishers
    ));
    let seqs = Rc::new(RefCell::new(published));
    let start = now_ns();
    let d_idx = rec.borrow_mut().add_phase(start, s.warm_secs, s.cluster_durable_secs);
    let (d_measure, d_end) = {
        let r = rec.borrow();
        (r.phases[d_idx].measure, r.phases[d_idx].end)
    };
    let ((acked, ack_hist, stats, _all), closed) = tokio::join!(
        load::closed_loop_spread(
            &addrs,
            seqs.clone(),
            s.cluster_durable_publishers,
            s.pad,
            true,
            d_measure,
            d_end
        ),
        window(dep, d_measure, d_end)
    );
    if stats.errors > 0 {
        out.problems.push(format!(
            "{} closed-loop publishes failed: {}",
            stats.errors,
            stats.first_error.unwrap_or_default()
        ));
    }
    out.notes.push(cpu_note("while acking", dep, &closed));
    if dep.nats().is_some() {
        out.notes.push(traffic_note("while acking", nodes, &closed));
    }
    disturbance_notes(out, &closed, "while acking");

    (ctx.status)("settling".into());
    settle(&rec, s.settle_max_secs).await;
    let mut summaries = Vec::new();
    for c in sets {
        summaries.extend(c.close().await);
    }
    let published = seqs.borrow().clone();
    let (mut missing, mut dups, mut out_of_order, mut closed_by_server) =
        (0u64, 0u64, 0u64, 0usize);
    for c in summaries.iter().filter(|c| c.connected) {
        if c.ended {
            closed_by_server += 1;
            continue;
        }
        missing += published.get(c.room).copied().unwrap_or(0).saturating_sub(c.distinct);
        dups += c.received - c.distinct;
        out_of_order += c.out_of_order;
    }
    if missing > 0 || dups > 0 || out_of_order > 0 || closed_by_server > 0 {
        out.problems
            .push(format!("{missing} missing, {dups} duplicate, {out_of_order} out-of-order deliveries, {closed_by_server} clients closed by the server"));
    }
    let (d_p50, d_p99) = {
        let r = rec.borrow();
        (ms(&r.phases[d_idx].hist, 0.5), ms(&r.phases[d_idx].hist, 0.99))
    };

    // Open-loop publishes acknowledged in the measured window: those scheduled in it,
    // times the share of all open-loop publishes that were acknowledged.
    let acked_share = if pstats.ok + pstats.errors > 0 {
        pstats.ok as f64 / (pstats.ok + pstats.errors) as f64
    } else {
        0.0
    };
    let open_acks = open_published as f64 * acked_share;
    let per_1k = |cpu: f64| if open_acks > 0.0 { cpu / open_acks * 1e6 } else { f64::NAN };
    let (lg_cpu, nats_cpu) = open.cpu_split(nodes);
    let msgs_in = open.msgs_in_per_s(nodes);
    let kib_in: Vec<f64> = NODE_NAMES[..nodes]
        .iter()
        .map(|n| open.traffic.get(*n).map_or(f64::NAN, |t| t.bytes_in as f64 / open.secs / 1024.0))
        .collect();
    let publishes_per_s = open_published as f64 / open.secs;

    out.hi(metric::ACKED, acked as f64 / closed.secs);
    out.lo(&format!("{} @{rate}/s", metric::P50), p50);
    out.lo(&format!("{} @{rate}/s", metric::P99), p99);
    out.lo(&format!("publish→deliver p99.9 ms @{rate}/s"), p999);
    out.lo(&format!("{} @{rate}/s", metric::MSGS_IN_MEAN), mean(&msgs_in));
    out.lo(&format!("{} @{rate}/s", metric::MSGS_IN_MAX), max(&msgs_in));
    out.lo(&format!("{} @{rate}/s", metric::KIB_IN_MEAN), mean(&kib_in));
    out.lo(metric::MSGS_IN_PER_PUBLISH, mean(&msgs_in) / publishes_per_s);
    out.lo(&format!("{} @{rate}/s", metric::LG_CPU_PER_1K), per_1k(lg_cpu));
    out.lo(
        &format!("{} @{rate}/s", metric::NATS_CPU_PER_1K),
        if dep.nats().is_some() { per_1k(nats_cpu) } else { f64::NAN },
    );
    for (j, name) in NODE_NAMES[..nodes].iter().enumerate() {
        out.lo(&metric::node_msgs_in(name), msgs_in[j]);
        out.lo(&metric::node_cpu_per_1k(name), per_1k(open.cpu[j]));
    }
    let closed_msgs_in = closed.msgs_in_per_s(nodes);
    out.lo("NATS msgs/s into a node while acking, mean", mean(&closed_msgs_in));
    out.lo(
        "NATS msgs into a node per acked publish, mean",
        if acked > 0 { mean(&closed_msgs_in) * closed.secs / acked as f64 } else { f64::NAN },
    );
    out.lo("publish→deliver p50 ms while acking", d_p50);
    out.lo("publish→deliver p99 ms while acking", d_p99);
    out.lo("ack p50 ms", ms(&ack_hist, 0.5));
    out.lo("ack p99 ms", ms(&ack_hist, 0.99));
    let (d_lg, d_nats) = closed.cpu_split(nodes);
    out.lo("server CPU %, all processes, while acking", (d_lg + d_nats) / closed.secs * 100.0);
    out.lo("missing deliveries", missing as f64);
    out.lo("duplicate deliveries", dups as f64);
    out.lo("out-of-order deliveries", out_of_order as f64);
    out.lo("server PSS, all processes, connected (MiB)", pss as f64 / (1024.0 * 1024.0));
    Ok(())
}

fn disturbance_notes(out: &mut Out, w: &Window, what: &str) {
    if w.other_cpu / w.secs > 0.25 {
        out.notes.push(format!(
            "other processes on the machine used {:.0} % of a core {what}: numbers are disturbed",
            w.other_cpu / w.secs * 100.0
        ));
    }
    if w.client_cpu / w.secs > 0.9 {
        out.notes.push(format!(
            "load generator CPU at {:.0} % {what}: figures may be client-bound",
            w.client_cpu / w.secs * 100.0
        ));
    }
}
