//! The cells scenario (issue 47, this build only): what watching a room from another cell
//! costs. Two cells, each its own nats-server with JetStream in a domain named after the
//! cell (b's server a leaf node of a's, configured as the book's Cells chapter does) and
//! one livegate node (`a1`, `b1`, `--cluster-cell-domains true`), every process pinned to
//! the servers' CPU. On that one deployment two arms run one after the other, each in a
//! room of its own homed in cell a (`core::nodes::routing::room_home_cell`), published to
//! through a1 (the room's writer) at a fixed rate with an `id`:
//!
//! - **local**: the room's subscribers on a1, users homed in a;
//! - **cross**: the room's subscribers on b1, users homed in b: the events' live copies
//!   cross the leaf, and b1 reads the room through a's domain.
//!
//! Per arm: publish→deliver latency, every delivery checked (once, in room order, none
//! missing); the NATS messages each cell's server handled per event (its `/varz`
//! `in_msgs + out_msgs` over the measured window ÷ the events published in it: client,
//! leaf and JetStream traffic alike), the messages across the leaf per event (a's
//! `/leafz`), and the CPU of all four processes per event. Cell b's mirror of a's room
//! stream (`LG_ROOMS_a`) takes every event of a in both arms, so cell b is not silent in
//! the local arm. The warm-up outlasts `FEED_LINGER`: a1 takes its room's live feed when
//! the first publish loads the room and keeps it that long even in the cross arm, where
//! nobody watches the room on a1 (5 s of live copies into a1, whatever the window), so
//! the measured window shows the steady state. Before the arms, each cell's idle traffic
//! (heartbeats, probes) is read for [`BACKGROUND_SECS`]; the arms' order alternates
//! between runs. Then both arms run at once, each in a fresh room with fresh
//! subscribers and half the rate (the same events and deliveries per second in all), for
//! their latency only (the cells' NATS counts cannot be split between two rooms at once):
//! the same moments of a shared machine for both. Each run's record has the arms' figures
//! and their ratios cross ÷ local; the report gives the medians.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use livegate::core::nodes::routing::room_home_cell;

use crate::load::{self, now_ns, ConnSpec, Publisher, Rec};
use crate::procstat;
use crate::scenarios::{ms, self_cpu, settle, Ctx, Out};
use crate::servers::{self, CellNats, Kind, LivegateOpts, Server};

/// The cells, hub first; every room of the scenario is homed in the first.
pub const CELLS: [&str; 2] = ["a", "b"];
/// `--cluster-token-secret`, the same in both cells.
const TOKEN_SECRET: &str = "fanout-bench-cells-token-secret-0123456789";
/// How long the two nodes may take to hear each other across the leaf.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// Seconds of each cell's idle traffic read before the arms.
pub const BACKGROUND_SECS: f64 = 3.0;
/// Each arm's users start at a multiple of this, so that no user is in two arms.
const USERS_PER_ARM: usize = 100_000;

/// Where an arm's subscribers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// On a1, in the room's home cell.
    Local,
    /// On b1, across the leaf from the room's home cell.
    Cross,
}

impl Arm {
    pub const ALL: [Arm; 2] = [Arm::Local, Arm::Cross];

    pub fn name(self) -> &'static str {
        match self {
            Arm::Local => "local",
            Arm::Cross => "cross",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Arm::Local => "subscribers in cell a (the room's home)",
            Arm::Cross => "subscribers in cell b (across the leaf)",
        }
    }

    /// The index in [`CELLS`] of the cell (and node) the subscribers are in.
    fn cell(self) -> usize {
        match self {
            Arm::Local => 0,
            Arm::Cross => 1,
        }
    }

    /// The arm's first user, alone or when both arms run at once.
    fn first_user(self, together: bool) -> usize {
        (self.cell() + if together { 2 } else { 0 }) * USERS_PER_ARM
    }
}

/// Metric names shared by the scenario and the report's cells table.
pub mod metric {
    use super::Arm;

    pub const P50: &str = "publish→deliver p50 ms";
    pub const P99: &str = "publish→deliver p99 ms";
    pub const MSGS_A: &str = "NATS msgs per event, cell a";
    pub const MSGS_B: &str = "NATS msgs per event, cell b";
    pub const LEAF: &str = "NATS msgs across the leaf per event";
    pub const CPU: &str = "CPU ms per 1k events, all 4 processes";
    /// Deliveries in the measured window ÷ (events published in it × subscribers).
    pub const DELIVERED: &str = "delivered %";
    /// What each arm measures, in the report's order.
    pub const EACH: [&str; 6] = [P50, P99, MSGS_A, MSGS_B, LEAF, CPU];
    /// Each cell's idle NATS messages per second (`/varz`), read before the arms.
    pub const IDLE_A: &str = "idle NATS msgs/s, cell a";
    pub const IDLE_B: &str = "idle NATS msgs/s, cell b";

    /// `what` for `arm`.
    pub fn of(arm: Arm, what: &str) -> String {
        format!("{}: {what}", arm.name())
    }

    /// The run's cross ÷ local of `what`.
    pub fn ratio(what: &str) -> String {
        format!("cross ÷ local: {what}")
    }

    /// `what` for `arm` when both arms run at once.
    pub fn together(arm: Arm, what: &str) -> String {
        format!("both at once, {}: {what}", arm.name())
    }

    /// The run's cross ÷ local of `what` when both arms run at once.
    pub fn together_ratio(what: &str) -> String {
        format!("both at once, cross ÷ local: {what}")
    }
}

/// The first four rooms (`r<i>`) homed in cell a: the local arm's and the cross arm's,
/// then theirs when both run at once.
pub fn rooms() -> [usize; 4] {
    let mut homed =
        (0..).filter(|&i| room_home_cell(&crate::proto::room_name(i), &CELLS) == Some(CELLS[0]));
    std::array::from_fn(|_| homed.next().expect("rooms homed in cell a"))
}

/// Both cells: their nats-servers and nodes (nodes stop first: field order).
struct Deploy {
    nodes: Vec<Server>,
    nats: Vec<CellNats>,
}

impl Deploy {
    async fn start(ctx: &Ctx<'_>) -> Result<Deploy, String> {
        let paths = ctx.paths;
        (ctx.status)("starting cell a's and cell b's nats-servers".into());
        let hub = CellNats::start(paths, CELLS[0], None).await?;
        let spoke = CellNats::start(paths, CELLS[1], Some(hub.leaf_port)).await?;
        let nats = vec![hub, spoke];
        servers::wait_leaves(&nats).await?;
        // The room writer of a cell's rooms is a node of that cell; a1 alone in a writes
        // every room of the scenario, so no publish is forwarded.
        let lg = LivegateOpts {
            batch_window_ms: ctx.sizes.cluster_window_ms,
            ..LivegateOpts::default()
        };
        let cells = CELLS.join(",");
        let mut nodes = Vec::new();
        // a1 first: it makes cell a's streams, which b1 mirrors.
        for (&cell, server) in CELLS.iter().zip(&nats) {
            (ctx.status)(format!("starting node {cell}1"));
            let node = format!("{cell}1");
            let url = server.server.url();
            let extra: Vec<String> = [
                "--node",
                &node,
                "--cluster-nats-url",
                &url,
                "--cell",
                cell,
                "--cells",
                &cells,
                "--cluster-cell-domains",
                "true",
                "--cluster-token-secret",
                TOKEN_SECRET,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            nodes.push(
                Server::start_with(Kind::Livegate, lg, paths, &format!("livegate-{node}"), &extra)
                    .await?,
            );
        }
        let dep = Deploy { nodes, nats };
        dep.wait_formed().await?;
        Ok(dep)
    }

    /// Until each node counts the other alive (heartbeats cross the leaf).
    async fn wait_formed(&self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let mut seen = Vec::new();
            for node in &self.nodes {
                seen.push(servers::metric(node.addr, "livegate_cluster_peers_alive").await);
            }
            if seen.iter().all(|v| *v == Some(1.0)) {
                return Ok(());
            }
            if started.elapsed() > FORM_TIMEOUT {
                return Err(format!("the two cells' nodes did not hear each other within {FORM_TIMEOUT:?}: livegate_cluster_peers_alive {seen:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn pids(&self) -> Vec<i32> {
        self.nodes
            .iter()
            .map(|n| n.stat_pid)
            .chain(self.nats.iter().map(|n| n.server.pid))
            .collect()
    }

    fn cpu(&self) -> f64 {
        self.pids().iter().map(|&p| procstat::cpu_secs(p).unwrap_or(0.0)).sum()
    }

    /// Each cell's server's `in_msgs + out_msgs` and, of those, what its livegate node's
    /// connection sent and took (`/connz`), and the messages both ways on a's leaf
    /// connections.
    async fn counters(&self) -> Result<Counters, String> {
        let mut c = Counters::default();
        for (i, n) in self.nats.iter().enumerate() {
            let v = servers::monitor_json(n.monitor(), "/varz").await?;
            c.msgs[i] = v["in_msgs"].as_u64().unwrap_or(0) + v["out_msgs"].as_u64().unwrap_or(0);
            let connz = servers::monitor_json(n.monitor(), "/connz?limit=4096").await?;
            for conn in connz["connections"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["name"].as_str().is_some_and(|n| n.starts_with("livegate ")))
            {
                c.node[i] +=
                    conn["in_msgs"].as_u64().unwrap_or(0) + conn["out_msgs"].as_u64().unwrap_or(0);
            }
        }
        let leafz = servers::monitor_json(self.nats[0].monitor(), "/leafz").await?;
        c.leaf = leafz["leafs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| l["in_msgs"].as_u64().unwrap_or(0) + l["out_msgs"].as_u64().unwrap_or(0))
            .sum();
        Ok(c)
    }

    /// Warning and error lines in the processes' logs: (process, count, the first few).
    fn log_findings(&self) -> Vec<(String, usize, Vec<String>)> {
        let mut logs: Vec<(String, String)> = CELLS
            .iter()
            .zip(&self.nodes)
            .map(|(c, n)| (format!("node {c}1"), n.log_text()))
            .collect();
        logs.extend(
            self.nats
                .iter()
                .map(|n| (format!("nats of cell {}", n.cell), n.server.log_since_ready())),
        );
        logs.into_iter()
            .filter_map(|(name, text)| {
                let bad: Vec<String> = text
                    .lines()
                    .filter(|l| crate::cluster::is_warning(l))
                    .map(|l| l.chars().take(300).collect())
                    .collect();
                (!bad.is_empty()).then(|| (name, bad.len(), bad.into_iter().take(3).collect()))
            })
            .collect()
    }

    fn stop(&mut self) {
        self.nodes.iter_mut().for_each(Server::stop);
        self.nats.iter_mut().for_each(|n| n.server.stop());
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    /// By [`CELLS`] index.
    msgs: [u64; 2],
    /// By [`CELLS`] index: the part of `msgs` on the cell's livegate node's connection.
    node: [u64; 2],
    leaf: u64,
}

impl Counters {
    fn since(self, before: Counters) -> Counters {
        Counters {
            msgs: [
                self.msgs[0].saturating_sub(before.msgs[0]),
                self.msgs[1].saturating_sub(before.msgs[1]),
            ],
            node: [
                self.node[0].saturating_sub(before.node[0]),
                self.node[1].saturating_sub(before.node[1]),
            ],
            leaf: self.leaf.saturating_sub(before.leaf),
        }
    }
}

/// What the deployment did between two instants of the bench clock.
struct Window {
    secs: f64,
    nats: Counters,
    /// CPU seconds of the four processes, of the load generator, and of everything else.
    cpu: f64,
    client_cpu: f64,
    other_cpu: f64,
}

async fn window(dep: &Deploy, from: u64, to: u64) -> Result<Window, String> {
    tokio::time::sleep_until(load::instant_at(from)).await;
    let (cpu0, client0, busy0) = (dep.cpu(), self_cpu(), procstat::machine_busy_secs());
    let c0 = dep.counters().await?;
    tokio::time::sleep_until(load::instant_at(to)).await;
    let (cpu1, client1, busy1) = (dep.cpu(), self_cpu(), procstat::machine_busy_secs());
    let c1 = dep.counters().await?;
    let (cpu, client_cpu) = (cpu1 - cpu0, client1 - client0);
    Ok(Window {
        secs: (to - from) as f64 / 1e9,
        nats: c1.since(c0),
        cpu,
        client_cpu,
        other_cpu: ((busy1 - busy0) - cpu - client_cpu).max(0.0),
    })
}

pub async fn run(ctx: &Ctx<'_>, run: usize) -> Result<Out, String> {
    let bin = &ctx.paths.livegate_bin;
    if !servers::knows_cell_domains(bin) {
        return Err(format!("{} has no cluster_cell_domains (issue 47)", bin.display()));
    }
    let mut dep = Deploy::start(ctx).await?;
    let mut out = Out::new();
    out.notes.push(format!(
        "nats-server {} ({})",
        servers::nats_version(&ctx.paths.nats_server),
        ctx.paths.nats_server.display()
    ));
    if let Err(e) = measure(ctx, &dep, run, &mut out).await {
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

/// Each cell's idle traffic, then both arms (local first in odd runs, cross first in
/// even ones), then their ratios, then both arms at once.
async fn measure(ctx: &Ctx<'_>, dep: &Deploy, run: usize, out: &mut Out) -> Result<(), String> {
    (ctx.status)(format!("reading each cell's idle NATS traffic for {BACKGROUND_SECS} s"));
    let from = now_ns() + 10_000_000;
    let idle = window(dep, from, from + load::secs_ns(BACKGROUND_SECS)).await?;
    let order = if run % 2 == 1 { Arm::ALL } else { [Arm::Cross, Arm::Local] };
    let rooms = rooms();
    let mut figures: Vec<(Arm, [f64; 6], f64)> = Vec::new();
    for arm in order {
        let mut prepared =
            [prepare(ctx, dep, arm, rooms[arm.cell()], arm.first_user(false), arm.name(), out)
                .await?];
        let w = drive(ctx, dep, &mut prepared).await?;
        let [p] = prepared;
        let done = finish(ctx, p, arm.name(), out).await;
        figures.push((arm, arm_figures(arm, &done, &w, out), done.delivered));
        // Let the arm's sockets leave the nodes' and our tables.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let of = |arm: Arm| {
        figures.iter().find(|(a, _, _)| *a == arm).map(|(_, f, _)| *f).expect("both arms ran")
    };
    let (local, cross) = (of(Arm::Local), of(Arm::Cross));
    // The ratios first: the progress line shows a record's first four metrics.
    for (k, what) in metric::EACH.iter().enumerate() {
        out.lo(&metric::ratio(what), cross[k] / local[k]);
    }
    for arm in Arm::ALL {
        for (k, what) in metric::EACH.iter().enumerate() {
            out.lo(&metric::of(arm, what), of(arm)[k]);
        }
    }
    for (arm, _, delivered) in &figures {
        out.hi(&metric::of(*arm, metric::DELIVERED), *delivered);
    }
    out.lo(metric::IDLE_A, idle.nats.msgs[0] as f64 / idle.secs);
    out.lo(metric::IDLE_B, idle.nats.msgs[1] as f64 / idle.secs);
    together(ctx, dep, [rooms[2], rooms[3]], out).await
}

/// Both arms at once, each in a room of its own with subscribers of its own and half the
/// rate: the same moments of the machine for both, so their latency ratio is not a comparison of two
/// stretches of other work. The cells' NATS counts cannot be split between the arms
/// here; only latency and the delivery check are recorded.
async fn together(
    ctx: &Ctx<'_>,
    dep: &Deploy,
    rooms: [usize; 2],
    out: &mut Out,
) -> Result<(), String> {
    let mut prepared = Vec::with_capacity(2);
    let label = |arm: Arm| format!("both at once, {}", arm.name());
    for arm in Arm::ALL {
        prepared.push(
            prepare(ctx, dep, arm, rooms[arm.cell()], arm.first_user(true), &label(arm), out)
                .await?,
        );
    }
    let w = drive(ctx, dep, &mut prepared).await?;
    let mut done = Vec::with_capacity(2);
    for (arm, p) in Arm::ALL.into_iter().zip(prepared) {
        done.push(finish(ctx, p, &label(arm), out).await);
    }
    let (local, cross) = (&done[0], &done[1]);
    out.lo(&metric::together_ratio(metric::P50), cross.p50 / local.p50);
    out.lo(&metric::together_ratio(metric::P99), cross.p99 / local.p99);
    for (arm, d) in Arm::ALL.into_iter().zip(&done) {
        out.lo(&metric::together(arm, metric::P50), d.p50);
        out.lo(&metric::together(arm, metric::P99), d.p99);
        out.hi(&metric::together(arm, metric::DELIVERED), d.delivered);
    }
    note_window("both at once", local.events + cross.events, &w, out);
    Ok(())
}

/// One arm's subscribers, connected, and its publisher, ready.
struct Prepared {
    room: usize,
    rec: Rec,
    clients: load::Clients,
    connected: usize,
    publisher: Publisher,
    /// The arm's phase in `rec` (set by [`drive`]).
    phase: usize,
}

/// An arm's subscribers on its cell's node and a publisher to its room through a1.
async fn prepare(
    ctx: &Ctx<'_>,
    dep: &Deploy,
    arm: Arm,
    room: usize,
    first_user: usize,
    label: &str,
    out: &mut Out,
) -> Result<Prepared, String> {
    let s = ctx.sizes;
    let cell = CELLS[arm.cell()];
    let addr: SocketAddr = dep.nodes[arm.cell()].addr;
    let rec = Rec::default();
    let specs = vec![ConnSpec { room, slow: false }; s.cells_subs];
    let progress =
        |d: usize, n: usize| (ctx.status)(format!("{label}: connecting to node {cell}1: {d}/{n}"));
    let clients = load::open_clients_in(
        Kind::Livegate,
        addr,
        &specs,
        first_user,
        Some(cell),
        &rec,
        &progress,
    )
    .await?;
    if clients.failed > 0 {
        out.problems.push(format!(
            "{label}: {} of {} connections to node {cell}1 failed: {}",
            clients.failed,
            specs.len(),
            clients.first_error.clone().unwrap_or_default()
        ));
    }
    let connected = specs.len() - clients.failed;
    let publisher = Publisher::spread(
        Kind::Livegate,
        &[dep.nodes[0].addr],
        1,
        s.publish_connections,
        s.pad,
        true,
    )
    .starting_at_room(room);
    Ok(Prepared { room, rec, clients, connected, publisher, phase: 0 })
}

/// Open-loop publishes into every prepared arm's room at once, warm-up then the measured
/// window, the rate shared between the rooms (the deployment takes the same events per
/// second however many arms run); returns what the deployment did in the measured window.
async fn drive(ctx: &Ctx<'_>, dep: &Deploy, arms: &mut [Prepared]) -> Result<Window, String> {
    let s = ctx.sizes;
    // Let b1's interest in a room reach a's server across the leaf (the warm-up is not
    // measured either; the delivery check covers it).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rooms: Vec<String> = arms.iter().map(|a| crate::proto::room_name(a.room)).collect();
    let rate = s.cells_rate / arms.len() as f64;
    (ctx.status)(format!(
        "publishing {rate}/s into each of {} through node a1",
        rooms.join(" and ")
    ));
    let start = now_ns() + 20_000_000;
    for a in arms.iter_mut() {
        a.phase = a.rec.borrow_mut().add_phase(start, s.cells_warm_secs, s.cells_secs);
    }
    let (measure_at, end) = {
        let r = arms[0].rec.borrow();
        (r.phases[arms[0].phase].measure, r.phases[arms[0].phase].end)
    };
    let publishing = futures_util::future::join_all(
        arms.iter().map(|a| a.publisher.open_loop(&a.rec, rate, start, end)),
    );
    let (_, w) = tokio::join!(publishing, window(dep, measure_at, end));
    w
}

/// What an arm delivered, once its publishes are answered and its subscribers quiet.
struct Done {
    events: u64,
    p50: f64,
    p99: f64,
    delivered: f64,
}

/// Waits for an arm's publishes and deliveries, closes its subscribers and checks every
/// delivery (once, in room order, none missing).
async fn finish(ctx: &Ctx<'_>, p: Prepared, label: &str, out: &mut Out) -> Done {
    let s = ctx.sizes;
    (ctx.status)(format!("{label}: settling"));
    let (published, pstats) = p.publisher.finish(Duration::from_secs_f64(s.settle_max_secs)).await;
    settle(&p.rec, s.settle_max_secs).await;
    if pstats.errors > 0 {
        out.problems.push(format!(
            "{label}: {} publishes failed: {}",
            pstats.errors,
            pstats.first_error.clone().unwrap_or_default()
        ));
    }
    let (mut missing, mut dups, mut out_of_order, mut closed_by_server) =
        (0u64, 0u64, 0u64, 0usize);
    for c in p.clients.close().await.iter().filter(|c| c.connected) {
        if c.ended {
            closed_by_server += 1;
            continue;
        }
        missing += published[0].saturating_sub(c.distinct);
        dups += c.received - c.distinct;
        out_of_order += c.out_of_order;
    }
    if missing > 0 || dups > 0 || out_of_order > 0 || closed_by_server > 0 {
        out.problems.push(format!(
            "{label}: {missing} missing, {dups} duplicate, {out_of_order} out-of-order deliveries, {closed_by_server} clients closed by the server"
        ));
    }
    let r = p.rec.borrow();
    let ph = &r.phases[p.phase];
    let expected = ph.published as f64 * p.connected as f64;
    Done {
        events: ph.published,
        p50: ms(&ph.hist, 0.5),
        p99: ms(&ph.hist, 0.99),
        delivered: if expected > 0.0 { ph.delivered as f64 / expected * 100.0 } else { f64::NAN },
    }
}

/// [`metric::EACH`] of an arm run alone, in order; notes its window.
fn arm_figures(arm: Arm, d: &Done, w: &Window, out: &mut Out) -> [f64; 6] {
    note_window(arm.name(), d.events, w, out);
    let events = d.events as f64;
    let per_event = |n: u64| if events > 0.0 { n as f64 / events } else { f64::NAN };
    [
        d.p50,
        d.p99,
        per_event(w.nats.msgs[0]),
        per_event(w.nats.msgs[1]),
        per_event(w.nats.leaf),
        if events > 0.0 { w.cpu / events * 1e6 } else { f64::NAN },
    ]
}

/// A note with what the deployment did in a measured window, and whether other work or
/// the load generator disturbed it.
fn note_window(label: &str, events: u64, w: &Window, out: &mut Out) {
    if w.other_cpu / w.secs > 0.25 {
        out.notes.push(format!(
            "{label}: other processes on the machine used {:.0} % of a core: figures are disturbed",
            w.other_cpu / w.secs * 100.0
        ));
    }
    if w.client_cpu / w.secs > 0.9 {
        out.notes.push(format!(
            "{label}: load generator CPU at {:.0} %: figures may be client-bound",
            w.client_cpu / w.secs * 100.0
        ));
    }
    out.notes.push(format!(
        "{label}: {events} events in {:.1} s; NATS msgs cell a {} (node a1's connection {}), cell b {} (node b1's {}), across the leaf {}; CPU of the 4 processes {:.0} % of a core",
        w.secs,
        w.nats.msgs[0],
        w.nats.node[0],
        w.nats.msgs[1],
        w.nats.node[1],
        w.nats.leaf,
        w.cpu / w.secs * 100.0
    ));
}
