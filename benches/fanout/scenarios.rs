//! The six workloads of issue 7, each run against one server and returning named
//! metrics: idle (bytes per connection), fanout (1 room, rate stepped up), rooms
//! (many small rooms, rate stepped up), hot (each client gets 100 events/s; livegate at
//! several batch windows), durable (closed-loop acknowledged publishes, livegate only)
//! and slow (fanout with 1 % of clients not reading); and cluster (issues 9 and 33,
//! livegate only, in `fanout/cluster.rs`): one node, three nodes on one or on three
//! replicated nats-servers, and four nodes, the same load on each; and churn
//! (issue 16, livegate only): cycles of new users connecting and leaving, and the
//! server's memory with nobody connected after each; and cells (issue 47, livegate
//! only, in `fanout/cells.rs`): a room homed in one cell watched from that cell and from
//! another one across the cells' leaf connection.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::cluster::Topology;
use crate::floor::{self, Floor};
use crate::load::{self, now_ns, secs_ns, ConnSpec, ConnSummary, Publisher, Rec};
use crate::presence::Arm;
use crate::procstat;
use crate::servers::{Kind, LivegateOpts, Paths, Server};

/// Sizes and durations; `full` fits `--all` (3 runs of everything) in under 20 minutes on
/// two cores, `smoke` is a few seconds per scenario.
pub struct Sizes {
    pub idle: [usize; 2],
    pub idle_rooms: usize,
    pub fanout_subs: usize,
    pub fanout_rates: Vec<f64>,
    pub fanout_ref_rate: f64,
    pub rooms: usize,
    pub per_room: usize,
    pub rooms_rates: Vec<f64>,
    pub rooms_ref_rate: f64,
    pub hot_rooms: usize,
    pub hot_per_room: usize,
    pub hot_rate_per_room: f64,
    pub hot_windows: Vec<u64>,
    pub durable_rooms: usize,
    pub durable_publishers: usize,
    pub slow_subs: usize,
    pub slow_every: usize,
    pub slow_rate: f64,
    pub slow_pad: usize,
    pub slow_outbox: u64,
    pub pad: usize,
    pub warm_secs: f64,
    pub step_secs: f64,
    pub hot_secs: f64,
    pub durable_secs: f64,
    pub slow_secs: f64,
    pub idle_settle_secs: f64,
    pub settle_max_secs: f64,
    pub publish_connections: usize,
    /// cluster: rooms, each room's subscribers on one node (room `r` on node `r % nodes`);
    /// a multiple of 3 and 4 spreads them evenly on three and on four nodes.
    pub cluster_rooms: usize,
    /// cluster: WebSocket subscribers of each room.
    pub cluster_per_room: usize,
    /// cluster: open-loop publishes/s in total, every room through every node.
    pub cluster_rate: f64,
    /// cluster: measured seconds of the open-loop phase (`--step-secs` sets it too).
    pub cluster_secs: f64,
    /// cluster: livegate's batch window (0 = every event written at once).
    pub cluster_window_ms: u64,
    /// cluster: closed-loop publishers (over the same rooms, every node in turn).
    pub cluster_durable_publishers: usize,
    pub cluster_durable_secs: f64,
    /// churn: cycles, new users per cycle, rooms they subscribe to, and the servers'
    /// `session_ttl_secs` and token lifetime (short, so sessions and used-token nonces
    /// expire within the run).
    pub churn_cycles: usize,
    pub churn_users: usize,
    pub churn_rooms: usize,
    pub churn_session_ttl_secs: u64,
    /// reconnect: clients (livegate.js-like, one room each) and rooms they spread over.
    pub reconnect_clients: usize,
    pub reconnect_rooms: usize,
    /// state: events (each with the room's state) published before the joins, and the
    /// clients that join with `state:true`, then again with `since=0`.
    pub state_events: usize,
    pub state_joins: usize,
    /// presence (issue 19): subscribers of the one room, how many of them take turns
    /// leaving, leaves (each replaced by a new user) per second, the newcomer's delay
    /// after the leave, publish rates and measured seconds per rate.
    pub presence_subs: usize,
    pub presence_pool: usize,
    pub presence_churn_per_sec: f64,
    pub presence_rejoin_ms: u64,
    pub presence_rates: Vec<f64>,
    pub presence_secs: f64,
    /// Measured seconds of the floor beside each fanout step (issue 32).
    pub floor_secs: f64,
    /// cells: WebSocket subscribers of each arm's room.
    pub cells_subs: usize,
    /// cells: open-loop publishes/s into each arm's room.
    pub cells_rate: f64,
    /// cells: measured seconds of each arm (`--step-secs` sets it too).
    pub cells_secs: f64,
    /// cells: each arm's warm-up. The full size outlasts the feed a room's writer takes
    /// when it loads the room and keeps for `FEED_LINGER` without subscribers, so the
    /// per-event counts are the steady state's, not diluted by that fixed-size start.
    pub cells_warm_secs: f64,
}

impl Sizes {
    pub fn full() -> Sizes {
        Sizes {
            idle: [9_500, 15_000],
            idle_rooms: 100,
            fanout_subs: 9_500,
            fanout_rates: vec![5.0, 10.0, 20.0, 50.0, 100.0, 200.0],
            fanout_ref_rate: 100.0,
            rooms: 950,
            per_room: 10,
            rooms_rates: vec![250.0, 1000.0, 2000.0, 4000.0],
            rooms_ref_rate: 1000.0,
            hot_rooms: 10,
            hot_per_room: 100,
            hot_rate_per_room: 100.0,
            hot_windows: vec![100, 10, 0],
            durable_rooms: 100,
            durable_publishers: 48,
            slow_subs: 9_500,
            slow_every: 100,
            slow_rate: 10.0,
            slow_pad: 1024,
            slow_outbox: 32 * 1024,
            pad: 64,
            warm_secs: 1.0,
            step_secs: 3.0,
            hot_secs: 4.0,
            durable_secs: 5.0,
            slow_secs: 6.0,
            idle_settle_secs: 1.5,
            settle_max_secs: 3.0,
            publish_connections: 32,
            cluster_rooms: 48,
            cluster_per_room: 20,
            cluster_rate: 300.0,
            cluster_secs: 10.0,
            cluster_window_ms: 0,
            cluster_durable_publishers: 16,
            cluster_durable_secs: 5.0,
            churn_cycles: 20,
            churn_users: 3_000,
            churn_rooms: 50,
            churn_session_ttl_secs: 10,
            reconnect_clients: 2_000,
            reconnect_rooms: 20,
            state_events: 1000,
            state_joins: 200,
            presence_subs: 9_500,
            presence_pool: 950,
            presence_churn_per_sec: 95.0,
            presence_rejoin_ms: 500,
            presence_rates: vec![5.0, 100.0],
            presence_secs: 5.0,
            floor_secs: 2.0,
            cells_subs: 100,
            cells_rate: 200.0,
            cells_secs: 10.0,
            cells_warm_secs: livegate::core::delivery::interest::FEED_LINGER.as_secs_f64() + 1.0,
        }
    }

    pub fn smoke() -> Sizes {
        Sizes {
            idle: [150, 200],
            idle_rooms: 10,
            fanout_subs: 200,
            fanout_rates: vec![20.0, 100.0],
            fanout_ref_rate: 100.0,
            rooms: 20,
            per_room: 10,
            rooms_rates: vec![200.0],
            rooms_ref_rate: 200.0,
            hot_rooms: 2,
            hot_per_room: 50,
            hot_rate_per_room: 100.0,
            hot_windows: vec![100, 10, 0],
            durable_rooms: 10,
            durable_publishers: 8,
            slow_subs: 200,
            slow_every: 100,
            slow_rate: 20.0,
            slow_pad: 1024,
            slow_outbox: 64 * 1024,
            pad: 64,
            warm_secs: 0.5,
            step_secs: 1.5,
            hot_secs: 1.5,
            durable_secs: 1.5,
            slow_secs: 2.0,
            idle_settle_secs: 0.5,
            settle_max_secs: 3.0,
            publish_connections: 8,
            cluster_rooms: 12,
            cluster_per_room: 4,
            cluster_rate: 60.0,
            cluster_secs: 1.5,
            cluster_window_ms: 0,
            cluster_durable_publishers: 4,
            cluster_durable_secs: 1.0,
            churn_cycles: 3,
            churn_users: 100,
            churn_rooms: 5,
            churn_session_ttl_secs: 2,
            reconnect_clients: 200,
            reconnect_rooms: 5,
            state_events: 1000,
            state_joins: 20,
            presence_subs: 200,
            presence_pool: 40,
            presence_churn_per_sec: 2.0,
            presence_rejoin_ms: 500,
            presence_rates: vec![5.0, 100.0],
            presence_secs: 2.0,
            floor_secs: 1.0,
            cells_subs: 20,
            cells_rate: 50.0,
            cells_secs: 2.0,
            cells_warm_secs: 0.5,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    Idle,
    Fanout,
    Rooms,
    /// livegate's batch window in ms; peers have one mode and run it once.
    Hot(u64),
    Durable,
    Slow,
    /// livegate builds only: the cluster measurements on one deployment.
    Cluster(Topology),
    /// livegate only: user churn and the memory left behind.
    Churn,
    /// livegate only: a drain and restart under clients like livegate.js, with resume
    /// credentials (`true`) or a fresh token for every attempt (`false`).
    Reconnect(bool),
    /// livegate only: a flood of handshakes with tokens, then again with resume credentials.
    Connects,
    /// livegate only: joining a room with `state:true` (the state from memory, the
    /// events after it) against a replay of the whole history (`since=0`).
    State,
    /// livegate only: a hot room with churn, subscribing with presence on, off, or
    /// (the `--baseline-bin` build) without the key.
    Presence(Arm),
    /// livegate only (this build): two cells, a room homed in one watched from it and
    /// from the other.
    Cells,
}

pub const SCENARIOS: [&str; 13] = [
    "idle",
    "fanout",
    "rooms",
    "hot",
    "durable",
    "slow",
    "cluster",
    "churn",
    "reconnect",
    "state",
    "presence",
    "connects",
    "cells",
];

impl Case {
    pub fn scenario(self) -> &'static str {
        match self {
            Case::Idle => "idle",
            Case::Fanout => "fanout",
            Case::Rooms => "rooms",
            Case::Hot(_) => "hot",
            Case::Durable => "durable",
            Case::Slow => "slow",
            Case::Cluster(_) => "cluster",
            Case::Churn => "churn",
            Case::Reconnect(_) => "reconnect",
            Case::State => "state",
            Case::Presence(_) => "presence",
            Case::Connects => "connects",
            Case::Cells => "cells",
        }
    }

    pub fn label(self, kind: Kind) -> String {
        match self {
            Case::Hot(w) if kind.is_livegate() => format!("hot, window {w} ms"),
            Case::Cluster(t) => format!("cluster: {}", t.title()),
            Case::Reconnect(true) => "reconnect wave, resume on".into(),
            Case::Reconnect(false) => "reconnect wave, resume off".into(),
            Case::Presence(Arm::On) => "presence, subscribe presence:true".into(),
            Case::Presence(Arm::Off) => "presence, subscribe presence:false".into(),
            Case::Presence(Arm::Absent) => "presence, build without presence".into(),
            Case::Cells => "cells: a room homed in cell a, watched in a vs in b".into(),
            c => c.scenario().to_string(),
        }
    }

    /// The cases of a scenario for a server (none when the server has no such mode).
    pub fn expand(scenario: &str, kind: Kind, sizes: &Sizes) -> Vec<Case> {
        match (scenario, kind) {
            ("idle", _) => vec![Case::Idle],
            ("fanout", _) => vec![Case::Fanout],
            ("rooms", _) => vec![Case::Rooms],
            ("hot", k) if k.is_livegate() => {
                sizes.hot_windows.iter().map(|&w| Case::Hot(w)).collect()
            }
            ("hot", _) => vec![Case::Hot(0)],
            ("durable", k) if k.is_livegate() => vec![Case::Durable],
            ("slow", _) => vec![Case::Slow],
            ("cluster", k) if k.is_livegate() => {
                Topology::ALL.into_iter().map(Case::Cluster).collect()
            }
            ("churn", k) if k.is_livegate() => vec![Case::Churn],
            ("reconnect", Kind::Livegate) => vec![Case::Reconnect(true), Case::Reconnect(false)],
            ("state", Kind::Livegate) => vec![Case::State],
            ("presence", Kind::Livegate) => vec![Case::Presence(Arm::On), Case::Presence(Arm::Off)],
            ("presence", Kind::LivegateBase) => vec![Case::Presence(Arm::Absent)],
            ("connects", k) if k.is_livegate() => vec![Case::Connects],
            ("cells", Kind::Livegate) => vec![Case::Cells],
            _ => vec![],
        }
    }
}

#[derive(Clone)]
pub struct Metric {
    pub name: String,
    pub value: f64,
    pub higher_better: bool,
}

/// One publish rate of a stepped scenario.
#[derive(Clone, Debug)]
pub struct Step {
    pub rate: f64,
    pub delivered_per_s: f64,
    pub expected_per_s: f64,
    pub frames_per_s: f64,
    pub server_cpu_util: f64,
    pub per_cpu_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub client_cpu_util: f64,
    /// CPU (in cores) other processes on the machine used meanwhile.
    pub other_cpu_util: f64,
}

/// The floor measured beside one fanout step of a server, with that step's subscribers,
/// frames per subscriber per second and mean frame size (issue 32).
#[derive(Clone, Debug)]
pub struct FloorStep {
    pub rate: f64,
    pub subscribers: usize,
    pub rounds_per_s: f64,
    pub frame_bytes: usize,
    /// The server's CPU per frame it delivered in the step.
    pub server_us_per_frame: f64,
    /// The floor, or why it was not measured.
    pub floor: Result<Floor, String>,
}

impl FloorStep {
    /// Server CPU per delivered frame ÷ the floor's CPU per write.
    pub fn times_floor(&self) -> f64 {
        self.floor.as_ref().map_or(f64::NAN, |f| self.server_us_per_frame / f.us_per_write())
    }
}

pub struct Record {
    pub run: usize,
    pub server: Kind,
    pub case: Case,
    pub label: String,
    pub metrics: Vec<Metric>,
    pub steps: Vec<Step>,
    /// Latency histogram (µs) of every step, by publish rate, for the CDF plot.
    pub cdfs: Vec<(f64, Histogram<u64>)>,
    /// Missing or duplicated deliveries, failed connections or publishes.
    pub problems: Vec<String>,
    /// Worth knowing, not wrong: overload, a busy load generator.
    pub notes: Vec<String>,
    /// fanout: the floor beside each step.
    pub floors: Vec<FloorStep>,
    pub secs: f64,
}

impl Record {
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics.iter().find(|m| m.name == name).map(|m| m.value)
    }
}

pub struct Ctx<'a> {
    pub paths: &'a Paths,
    pub sizes: &'a Sizes,
    pub status: &'a dyn Fn(String),
}

/// What a scenario found: the fields of its [`Record`].
pub struct Out {
    pub metrics: Vec<Metric>,
    pub steps: Vec<Step>,
    pub cdfs: Vec<(f64, Histogram<u64>)>,
    pub problems: Vec<String>,
    pub notes: Vec<String>,
    pub floors: Vec<FloorStep>,
}

impl Out {
    pub fn new() -> Out {
        Out {
            metrics: Vec::new(),
            steps: Vec::new(),
            cdfs: Vec::new(),
            problems: Vec::new(),
            notes: Vec::new(),
            floors: Vec::new(),
        }
    }
    pub fn hi(&mut self, name: &str, value: f64) {
        self.metrics.push(Metric { name: name.into(), value, higher_better: true });
    }
    pub fn lo(&mut self, name: &str, value: f64) {
        self.metrics.push(Metric { name: name.into(), value, higher_better: false });
    }
}

const MIB: f64 = 1024.0 * 1024.0;

pub async fn run(ctx: &Ctx<'_>, kind: Kind, case: Case, run: usize) -> Record {
    let t0 = std::time::Instant::now();
    let out = match case {
        Case::Idle => idle(ctx, kind).await,
        Case::Fanout => {
            let s = ctx.sizes;
            let plan = Plan::new(
                1,
                s.fanout_subs,
                s.fanout_rates.clone(),
                s.fanout_ref_rate,
                s.pad,
                s.step_secs,
            );
            stepped(ctx, kind, &plan).await.map(|r| {
                let floors = floors_beside(ctx, &r);
                let mut out = r.headline("", s.fanout_ref_rate);
                floor_metrics(&mut out, floors, s.fanout_ref_rate);
                out
            })
        }
        Case::Rooms => {
            let s = ctx.sizes;
            let plan = Plan::new(
                s.rooms,
                s.per_room,
                s.rooms_rates.clone(),
                s.rooms_ref_rate,
                s.pad,
                s.step_secs,
            );
            stepped(ctx, kind, &plan).await.map(|r| r.headline("", s.rooms_ref_rate))
        }
        Case::Hot(window) => hot(ctx, kind, window).await,
        Case::Durable => durable(ctx, kind).await,
        Case::Slow => slow(ctx, kind).await,
        Case::Cluster(topology) => crate::cluster::run(ctx, kind, topology).await,
        Case::Churn => churn(ctx, kind).await,
        Case::Reconnect(resume) => reconnect(ctx, resume).await,
        Case::State => state_join(ctx).await,
        Case::Presence(arm) => presence(ctx, kind, arm).await,
        Case::Connects => connects(ctx, kind).await,
        Case::Cells => crate::cells::run(ctx, run).await,
    };
    let out = out.unwrap_or_else(|e| {
        let mut o = Out::new();
        o.problems.push(format!("failed: {e}"));
        o
    });
    Record {
        run,
        server: kind,
        case,
        label: case.label(kind),
        metrics: out.metrics,
        steps: out.steps,
        cdfs: out.cdfs,
        problems: out.problems,
        notes: out.notes,
        floors: out.floors,
        secs: t0.elapsed().as_secs_f64(),
    }
}

/// The idle scenario's metric name for `n` connections ("… @10k").
pub fn idle_metric(n: usize) -> String {
    if n.is_multiple_of(1000) {
        format!("bytes per connection @{}k", n / 1000)
    } else {
        format!("bytes per connection @{n}")
    }
}

async fn sleep_secs(s: f64) {
    tokio::time::sleep(Duration::from_secs_f64(s)).await;
}

/// Waits until no event has arrived for 400 ms, or `max` seconds.
pub async fn settle(rec: &Rec, max: f64) {
    let deadline = now_ns() + secs_ns(max);
    let (mut last, mut quiet) = (rec.borrow().events, 0);
    while now_ns() < deadline && quiet < 4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let e = rec.borrow().events;
        if e == last {
            quiet += 1;
        } else {
            (last, quiet) = (e, 0);
        }
    }
}

/// Samples the server's memory every 250 ms and keeps the peak (PSS, RSS).
fn peak_sampler(pid: i32) -> (Rc<Cell<(u64, u64)>>, tokio::task::JoinHandle<()>) {
    let peak = Rc::new(Cell::new((0, 0)));
    let p = peak.clone();
    let task = tokio::task::spawn_local(async move {
        loop {
            if let Some((pss, rss)) = procstat::memory(pid) {
                let (a, b) = p.get();
                p.set((a.max(pss), b.max(rss)));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    (peak, task)
}

pub fn self_cpu() -> f64 {
    procstat::cpu_secs(std::process::id() as i32).unwrap_or(0.0)
}

pub fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        f64::NAN
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

// ---------------------------------------------------------------------------------------
// idle
// ---------------------------------------------------------------------------------------

async fn idle(ctx: &Ctx<'_>, kind: Kind) -> Result<Out, String> {
    let s = ctx.sizes;
    let mut server = Server::start(kind, LivegateOpts::default(), ctx.paths).await?;
    sleep_secs(0.5).await;
    let s0 = server.sample();
    let rec = Rec::default();
    let mut out = Out::new();
    let mut all = Vec::new();
    let mut opened = 0;
    let mut held = 0;
    let mut pss = Vec::new();
    for &n in &s.idle {
        let specs: Vec<ConnSpec> =
            (opened..n).map(|i| ConnSpec { room: i % s.idle_rooms, slow: false }).collect();
        let t = std::time::Instant::now();
        let clients = load::open_clients(kind, server.addr, &specs, opened, &rec, &|d, n| {
            (ctx.status)(format!("connecting {d}/{n}"))
        })
        .await?;
        if clients.failed > 0 {
            out.problems.push(format!(
                "{} of {} connections failed: {}",
                clients.failed,
                specs.len(),
                clients.first_error.clone().unwrap_or_default()
            ));
        }
        if opened == 0 {
            out.hi(
                "connects per second",
                (specs.len() - clients.failed) as f64 / t.elapsed().as_secs_f64(),
            );
        }
        held += specs.len() - clients.failed;
        opened = n;
        all.push(clients);
        (ctx.status)(format!("{held} idle connections, settling"));
        sleep_secs(s.idle_settle_secs).await;
        let sample = server.sample();
        pss.push(sample.pss_bytes);
        // Per connection actually held; a step where the server refused some is not comparable.
        let per = (sample.pss_bytes as f64 - s0.pss_bytes as f64) / held as f64;
        out.lo(&idle_metric(n), if held == n { per } else { f64::NAN });
    }
    out.hi(&format!("connections held (of {opened})"), held as f64);
    let a = server.sample();
    sleep_secs(2.0).await;
    let b = server.sample();
    out.lo("server CPU % while idle", (b.cpu_secs - a.cpu_secs) / 2.0 * 100.0);
    out.lo("server PSS before (MiB)", s0.pss_bytes as f64 / MIB);
    out.lo("server PSS with all connected (MiB)", *pss.last().unwrap_or(&0) as f64 / MIB);
    let mut ended = 0;
    for c in all {
        ended += c.close().await.iter().filter(|s| s.ended).count();
    }
    if ended > 0 {
        out.problems.push(format!("{ended} idle connections were closed by the server"));
    }
    sleep_secs(1.0).await;
    out.lo("server PSS after close (MiB)", server.sample().pss_bytes as f64 / MIB);
    server.stop();
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// connects
// ---------------------------------------------------------------------------------------

/// Handshakes per second with tokens (the idle scenario's first step), then the same
/// clients again with their resume credentials; `idle[0]` clients over `idle_rooms` rooms.
/// One flood of handshakes (`how`: "token" or "resume"), its rate and the server's CPU per
/// connect into `out`.
async fn timed_flood(
    server: &Server,
    out: &mut Out,
    how: &str,
    clients: Vec<(String, String)>,
) -> crate::connects::Flood {
    let cpu = server.sample().cpu_secs;
    let flood = crate::connects::flood(server.addr, clients).await;
    let spent = server.sample().cpu_secs - cpu;
    out.hi(&format!("connects per second, {how}"), flood.per_second());
    out.lo(
        &format!("server CPU µs per connect, {how}"),
        spent * 1e6 / flood.sockets.len().max(1) as f64,
    );
    if flood.failed > 0 {
        out.problems.push(format!(
            "{} {how} handshakes failed: {}",
            flood.failed,
            flood.first_error.clone().unwrap_or_default()
        ));
    }
    flood
}

async fn connects(ctx: &Ctx<'_>, kind: Kind) -> Result<Out, String> {
    let s = ctx.sizes;
    let n = s.idle[0];
    let mut server = Server::start(kind, LivegateOpts::default(), ctx.paths).await?;
    sleep_secs(0.5).await;
    let mut out = Out::new();
    let tokens = crate::proto::credentials(kind, server.addr, n, 0, 8).await?;
    let rooms: Vec<String> = (0..n).map(|i| crate::proto::room_name(i % s.idle_rooms)).collect();
    let with_tokens = tokens
        .iter()
        .zip(&rooms)
        .map(|(t, r)| (crate::proto::ws_url(kind, server.addr, r, t.as_deref()), r.clone()))
        .collect();
    (ctx.status)(format!("{n} handshakes with tokens"));
    let first = timed_flood(&server, &mut out, "token", with_tokens).await;
    let resumes: Vec<(String, String)> = first
        .resumes
        .iter()
        .zip(&rooms)
        .filter_map(|(c, r)| {
            c.as_ref().map(|c| (format!("ws://{}/v1/ws?resume={c}", server.addr), r.clone()))
        })
        .collect();
    first.close().await;
    (ctx.status)("closed; waiting for the server to let go".into());
    sleep_secs(s.idle_settle_secs).await;
    (ctx.status)(format!("{} handshakes with resume credentials", resumes.len()));
    let second = timed_flood(&server, &mut out, "resume", resumes).await;
    second.close().await;
    sleep_secs(0.5).await;
    server.stop();
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// churn
// ---------------------------------------------------------------------------------------

/// Cycles of `churn_users` new users (so new sessions), each subscribed to one of
/// `churn_rooms` rooms, all connecting and then all leaving; the server's memory with
/// nobody connected after each cycle.
async fn churn(ctx: &Ctx<'_>, kind: Kind) -> Result<Out, String> {
    let s = ctx.sizes;
    let lg = LivegateOpts { ttl_secs: Some(s.churn_session_ttl_secs), ..LivegateOpts::default() };
    crate::proto::TOKEN_TTL_SECS
        .store(s.churn_session_ttl_secs, std::sync::atomic::Ordering::Relaxed);
    let result = churn_cycles(ctx, kind, lg).await;
    crate::proto::TOKEN_TTL_SECS.store(900, std::sync::atomic::Ordering::Relaxed);
    result
}

async fn churn_cycles(ctx: &Ctx<'_>, kind: Kind, lg: LivegateOpts) -> Result<Out, String> {
    let s = ctx.sizes;
    let mut server = Server::start(kind, lg, ctx.paths).await?;
    sleep_secs(0.5).await;
    let before = server.sample();
    let rec = Rec::default();
    let mut out = Out::new();
    let (mut after, mut dir_after) = (Vec::new(), Vec::new());
    for cycle in 0..s.churn_cycles {
        let specs: Vec<ConnSpec> =
            (0..s.churn_users).map(|i| ConnSpec { room: i % s.churn_rooms, slow: false }).collect();
        let clients =
            load::open_clients(kind, server.addr, &specs, cycle * s.churn_users, &rec, &|d, n| {
                (ctx.status)(format!("cycle {}/{}: connecting {d}/{n}", cycle + 1, s.churn_cycles))
            })
            .await?;
        if clients.failed > 0 {
            out.problems.push(format!(
                "cycle {}: {} of {} connections failed",
                cycle + 1,
                clients.failed,
                specs.len()
            ));
        }
        clients.close().await;
        sleep_secs(s.idle_settle_secs).await;
        after.push(server.sample());
        dir_after.push(dir_bytes(&server.data_dir));
    }
    // Sessions of the last cycles expire a TTL after they left (swept every TTL/4).
    (ctx.status)(format!(
        "waiting {} s for the last sessions to expire",
        s.churn_session_ttl_secs * 3 / 2
    ));
    sleep_secs(s.churn_session_ttl_secs as f64 * 1.5).await;
    let expired = server.sample();
    let first = after.first().ok_or("no churn cycle ran")?;
    let last = after.last().ok_or("no churn cycle ran")?;
    out.lo("RSS before (MiB)", before.rss_bytes as f64 / MIB);
    out.lo("RSS after cycle 1, nobody connected (MiB)", first.rss_bytes as f64 / MIB);
    out.lo(
        &format!("RSS after cycle {}, nobody connected (MiB)", after.len()),
        last.rss_bytes as f64 / MIB,
    );
    out.lo(
        "RSS growth after cycle 1 (%)",
        (last.rss_bytes as f64 / first.rss_bytes as f64 - 1.0) * 100.0,
    );
    out.lo("RSS 1.5 TTL after the last cycle (MiB)", expired.rss_bytes as f64 / MIB);
    if let Some(mid) = after.get(after.len() / 2) {
        out.lo(
            &format!("RSS after cycle {}, nobody connected (MiB)", after.len() / 2 + 1),
            mid.rss_bytes as f64 / MIB,
        );
    }
    let half = dir_after.get(dir_after.len() / 2).copied().unwrap_or(0);
    out.lo(&format!("data dir after cycle {} (MiB)", dir_after.len() / 2 + 1), half as f64 / MIB);
    out.lo("data dir 1.5 TTL after the last cycle (MiB)", dir_bytes(&server.data_dir) as f64 / MIB);
    out.lo(
        "RSS growth after cycle 1, sessions expired (%)",
        (expired.rss_bytes as f64 / first.rss_bytes as f64 - 1.0) * 100.0,
    );
    out.lo(
        "RSS left per session after cycle 1 (bytes)",
        (last.rss_bytes as f64 - first.rss_bytes as f64)
            / ((after.len().max(2) - 1) * s.churn_users) as f64,
    );
    server.stop();
    Ok(out)
}

/// The reconnect wave (`reconnect.rs`): backend calls and time to all back.
async fn reconnect(ctx: &Ctx<'_>, resume: bool) -> Result<Out, String> {
    let s = ctx.sizes;
    let wave = crate::reconnect::wave(
        ctx.paths,
        s.reconnect_clients,
        s.reconnect_rooms,
        resume,
        ctx.status,
    )
    .await?;
    let mut out = Out::new();
    out.lo("backend token calls during the wave", wave.backend_calls as f64);
    out.lo("backend token calls per client", wave.backend_calls as f64 / wave.clients as f64);
    out.lo("SIGTERM to all reconnected and resubscribed (s)", wave.all_back.as_secs_f64());
    out.lo("SIGTERM to the median client resubscribed (s)", wave.median_back.as_secs_f64());
    out.lo("drain: SIGTERM to exit (s)", wave.drain.as_secs_f64());
    out.lo("SIGTERM to the restarted node ready (s)", wave.ready_again.as_secs_f64());
    out.lo("failed attempts during the wave", wave.failed_attempts as f64);
    out.hi("handshakes with a resume credential (restarted node)", wave.resume_handshakes);
    out.lo("handshakes with a token (restarted node)", wave.token_handshakes);
    if resume && wave.backend_calls > 0 {
        out.notes.push(format!(
            "{} token calls with resume on (credentials refused or expired)",
            wave.backend_calls
        ));
    }
    Ok(out)
}

/// Room state on join: `state_events` events, each carrying the room's
/// state, then `state_joins` clients join with `state:true` (the state from the room's
/// memory, nothing after it to replay), then as many with `since=0` (a replay of the
/// whole history). Per join: bytes and events received, time to the last of them, and
/// the store reads of the state (`livegate_state_reads_total`) the joins caused.
async fn state_join(ctx: &Ctx<'_>) -> Result<Out, String> {
    let s = ctx.sizes;
    let kind = Kind::Livegate;
    let mut server = Server::start(kind, LivegateOpts::default(), ctx.paths).await?;
    let room = "state:0";
    let mut http = crate::http::HttpClient::new(server.addr, Some(crate::servers::API_KEY));
    let pad = "x".repeat(s.pad);
    for i in 1..=s.state_events {
        (ctx.status)(format!("state: publishing {i}/{}", s.state_events));
        let body = format!(
            r#"{{"id":"s-{i}","data":{{"i":{i},"pad":"{pad}"}},"state":{{"last":{i},"pad":"{pad}"}}}}"#
        );
        let r = http
            .post(&format!("/v1/rooms/{room}/events"), body.as_bytes())
            .await
            .map_err(|e| format!("publish: {e}"))?;
        if r.status != 201 {
            return Err(format!("publish: HTTP {} {}", r.status, String::from_utf8_lossy(&r.body)));
        }
    }
    let tokens = crate::proto::credentials(kind, server.addr, 2 * s.state_joins, 0, 4).await?;
    let reads_before =
        crate::servers::metric(server.addr, "livegate_state_reads_total").await.unwrap_or(0.0);
    let mut out = Out::new();
    let mut epoch = String::new();
    for (label, with_state) in [("state:true", true), ("since=0 replay", false)] {
        let (mut bytes, mut events, mut micros) = (0usize, 0usize, 0u128);
        for j in 0..s.state_joins {
            (ctx.status)(format!("state: {label} join {}/{}", j + 1, s.state_joins));
            let token = tokens[if with_state { j } else { s.state_joins + j }].as_deref();
            let url = crate::proto::ws_url(kind, server.addr, room, token);
            let mut ws = load::connect(server.addr, &url, false).await?;
            let started = std::time::Instant::now();
            let op = if with_state {
                format!(r#"{{"op":"subscribe","room":"{room}","state":true,"ref":1}}"#)
            } else {
                format!(
                    r#"{{"op":"subscribe","room":"{room}","since":0,"epoch":"{epoch}","ref":1}}"#
                )
            };
            futures_util::SinkExt::send(&mut ws, tokio_tungstenite::tungstenite::Message::Text(op))
                .await
                .map_err(|e| e.to_string())?;
            let (got, got_bytes, last) = read_join(&mut ws, s.state_events as u64).await?;
            micros += started.elapsed().as_micros();
            if with_state && epoch.is_empty() {
                epoch = last.ok_or("no epoch in subscribed")?;
            }
            bytes += got_bytes;
            events += got;
            let _ = futures_util::SinkExt::close(&mut ws).await;
        }
        let n = s.state_joins.max(1) as f64;
        out.lo(&format!("{label}: bytes received per join"), bytes as f64 / n);
        out.lo(&format!("{label}: events replayed per join"), events as f64 / n);
        out.lo(&format!("{label}: time to caught up per join (ms)"), micros as f64 / n / 1000.0);
    }
    let reads =
        crate::servers::metric(server.addr, "livegate_state_reads_total").await.unwrap_or(0.0)
            - reads_before;
    out.lo("store reads of the state for all joins", reads);
    if reads > 1.0 {
        out.problems.push(format!(
            "{reads} store reads of the state for {} joins (at most the room's load)",
            s.state_joins
        ));
    }
    server.stop();
    Ok(out)
}

/// Reads a join's answer up to the room's head (`head` events published): the events
/// received, the bytes of every frame after the welcome, and the `subscribed`'s epoch.
async fn read_join(
    ws: &mut crate::proto::Ws,
    head: u64,
) -> Result<(usize, usize, Option<String>), String> {
    use futures_util::StreamExt;
    let (mut events, mut bytes, mut epoch, mut caught_up_to) = (0usize, 0usize, None, None::<u64>);
    loop {
        let message = tokio::time::timeout(Duration::from_secs(15), ws.next())
            .await
            .map_err(|_| "join timed out")?;
        let text = match message {
            Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t))) => t,
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("socket ended during the join".into()),
        };
        let frame: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        match frame["op"].as_str() {
            Some("welcome") => continue,
            Some("subscribed") if frame["ref"] == 1 => {
                bytes += text.len();
                epoch = frame["epoch"].as_str().map(str::to_string);
                if frame["recovered"] == false {
                    return Err(format!("the replay was refused: {text}"));
                }
                // With a state, nothing after its seq when every event carried one.
                caught_up_to = Some(frame["state"]["seq"].as_u64().unwrap_or(0));
            }
            Some("events") => {
                bytes += text.len();
                let list = frame["events"].as_array().cloned().unwrap_or_default();
                events += list.len();
                if let Some(last) = list.last().and_then(|e| e["seq"].as_u64()) {
                    caught_up_to = Some(last);
                }
            }
            _ => continue,
        }
        if caught_up_to == Some(head) {
            return Ok((events, bytes, epoch));
        }
    }
}

/// The presence scenario (`presence.rs`): server CPU per delivery with and without
/// presence, presence frames per client, the delivery check.
async fn presence(ctx: &Ctx<'_>, kind: Kind, arm: Arm) -> Result<Out, String> {
    let s = ctx.sizes;
    let params = crate::presence::Params {
        subs: s.presence_subs,
        pool: s.presence_pool,
        churn_per_sec: s.presence_churn_per_sec,
        rejoin_ms: s.presence_rejoin_ms,
        rates: s.presence_rates.clone(),
        warm_secs: s.warm_secs,
        secs: s.presence_secs,
        settle_max_secs: s.settle_max_secs,
        pad: s.pad,
        publish_connections: s.publish_connections,
    };
    let r = crate::presence::run(ctx.paths, &params, kind, arm, ctx.status).await?;
    let mut out = Out::new();
    for st in &r.steps {
        let rate = st.rate;
        let secs = st.secs;
        let per_cpu =
            if st.server_cpu > 0.0 { st.delivered as f64 / st.server_cpu } else { f64::NAN };
        out.hi(&format!("deliveries per server CPU-s @{rate}/s"), per_cpu);
        out.lo(
            &format!("server CPU µs per delivery @{rate}/s"),
            if st.delivered > 0 { st.server_cpu / st.delivered as f64 * 1e6 } else { f64::NAN },
        );
        out.lo(&format!("server CPU % @{rate}/s"), st.server_cpu / secs * 100.0);
        out.hi(&format!("deliveries/s @{rate}/s"), st.delivered as f64 / secs);
        out.hi(
            &format!("delivered % of publishes × subscribers @{rate}/s"),
            st.delivered as f64 / (st.expected as f64 * s.presence_subs as f64) * 100.0,
        );
        out.lo(&format!("p99 ms @{rate}/s"), ms(&st.hist, 0.99));
        out.lo(
            &format!("presence frames per client per s @{rate}/s"),
            st.presence_frames as f64 / r.stable.max(1) as f64 / secs,
        );
        out.lo(&format!("leaves per s @{rate}/s"), st.leaves as f64 / secs);
        out.lo(&format!("other processes' CPU % @{rate}/s"), st.other_cpu / secs * 100.0);
        out.lo(&format!("load generator CPU % @{rate}/s"), st.client_cpu / secs * 100.0);
        out.steps.push(Step {
            rate,
            delivered_per_s: st.delivered as f64 / secs,
            expected_per_s: st.expected as f64 * s.presence_subs as f64 / secs,
            frames_per_s: st.frames as f64 / secs,
            server_cpu_util: st.server_cpu / secs,
            per_cpu_s: per_cpu,
            p50_ms: ms(&st.hist, 0.5),
            p99_ms: ms(&st.hist, 0.99),
            p999_ms: ms(&st.hist, 0.999),
            client_cpu_util: st.client_cpu / secs,
            other_cpu_util: st.other_cpu / secs,
        });
        if st.other_cpu / secs > 0.25 {
            out.notes.push(format!("other processes on the machine used {:.0} % of a core at {rate}/s: numbers are disturbed", st.other_cpu / secs * 100.0));
        }
        if st.client_cpu / secs > 0.9 {
            out.notes.push(format!(
                "load generator CPU at {:.0} % at {rate}/s: deliveries may be client-bound",
                st.client_cpu / secs * 100.0
            ));
        }
    }
    out.lo("missing deliveries", r.missing as f64);
    out.lo("duplicate deliveries", r.duplicates as f64);
    out.hi("newcomers joined", r.rejoined as f64);
    out.hi("last presence count seen", r.last_count.map(|c| c as f64).unwrap_or(f64::NAN));
    if r.missing > 0 || r.duplicates > 0 || r.closed_by_server > 0 {
        out.problems.push(format!(
            "{} missing, {} duplicate deliveries, {} stable clients closed by the server",
            r.missing, r.duplicates, r.closed_by_server
        ));
    }
    if r.failed_connects > 0 {
        out.problems.push(format!(
            "{} connections failed: {}",
            r.failed_connects,
            r.first_error.unwrap_or_default()
        ));
    }
    if r.publish_errors > 0 {
        out.problems.push(format!(
            "{} publishes failed: {}",
            r.publish_errors,
            r.first_publish_error.unwrap_or_default()
        ));
    }
    if arm != Arm::On && r.steps.iter().any(|s| s.presence_frames > 0) {
        out.problems.push("presence frames reached subscribers that did not ask for them".into());
    }
    if arm == Arm::On && r.steps.iter().all(|s| s.presence_frames == 0) {
        out.problems.push("no presence frame reached a subscriber that asked".into());
    }
    if r.tokens_ran_out {
        out.notes.push("churn stopped early: the newcomers' tokens ran out".into());
    }
    Ok(out)
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// stepped: fanout, rooms, slow, hot
// ---------------------------------------------------------------------------------------

struct Plan {
    rooms: usize,
    per_room: usize,
    slow_every: Option<usize>,
    rates: Vec<f64>,
    pad: usize,
    secs: f64,
    lg: LivegateOpts,
    stop_when_overloaded: bool,
}

impl Plan {
    fn new(
        rooms: usize,
        per_room: usize,
        rates: Vec<f64>,
        _ref_rate: f64,
        pad: usize,
        secs: f64,
    ) -> Plan {
        Plan {
            rooms,
            per_room,
            slow_every: None,
            rates,
            pad,
            secs,
            lg: LivegateOpts::default(),
            stop_when_overloaded: true,
        }
    }
}

struct SteppedResult {
    steps: Vec<Step>,
    hists: Vec<Histogram<u64>>,
    summaries: Vec<ConnSummary>,
    published: Vec<u64>,
    problems: Vec<String>,
    notes: Vec<String>,
    pss_connected: u64,
    rss_connected: u64,
    peak: (u64, u64),
    pss_after: u64,
    overloaded_at: Option<f64>,
    /// Mean WebSocket frame received per step, header included (bytes).
    bytes_per_frame: Vec<f64>,
}

impl SteppedResult {
    /// Missing and duplicated deliveries of clients that read and were not closed;
    /// clients the server closed are counted apart.
    fn delivery_check(&self) -> (u64, u64, usize, usize) {
        let (mut missing, mut dups, mut closed_fast, mut closed_slow) = (0, 0, 0, 0);
        for s in self.summaries.iter().filter(|s| s.connected) {
            if s.slow {
                closed_slow += s.ended as usize;
                continue;
            }
            if s.ended {
                closed_fast += 1;
                continue;
            }
            let expected = self.published.get(s.room).copied().unwrap_or(0);
            missing += expected.saturating_sub(s.distinct);
            dups += s.received - s.distinct;
        }
        (missing, dups, closed_fast, closed_slow)
    }

    /// The fanout/rooms headline: measures at the reference rate, the highest rate with
    /// p99 under 250 ms, and the delivery check.
    fn headline(self, prefix: &str, ref_rate: f64) -> Out {
        let mut out = Out::new();
        let at = |r: f64| self.steps.iter().position(|s| (s.rate - r).abs() < 1e-9);
        if let Some(i) = at(ref_rate) {
            let st = &self.steps[i];
            out.hi(&format!("{prefix}deliveries per server CPU-s @{ref_rate}/s"), st.per_cpu_s);
            out.lo(&format!("{prefix}p50 ms @{ref_rate}/s"), st.p50_ms);
            out.lo(&format!("{prefix}p99 ms @{ref_rate}/s"), st.p99_ms);
            out.lo(&format!("{prefix}p99.9 ms @{ref_rate}/s"), st.p999_ms);
            out.lo(&format!("{prefix}server CPU % @{ref_rate}/s"), st.server_cpu_util * 100.0);
        } else {
            out.notes
                .push(format!("never reached the reference rate {ref_rate}/s (overloaded before)"));
        }
        let best = self
            .steps
            .iter()
            .filter(|s| s.delivered_per_s >= 0.5 * s.expected_per_s && s.per_cpu_s.is_finite())
            .map(|s| s.per_cpu_s)
            .fold(f64::NAN, f64::max);
        out.hi(&format!("{prefix}deliveries per server CPU-s, best rate"), best);
        let ok = self
            .steps
            .iter()
            .filter(|s| s.p99_ms < 250.0 && s.delivered_per_s >= 0.95 * s.expected_per_s)
            .map(|s| (s.rate, s.delivered_per_s))
            .fold((0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
        out.hi(&format!("{prefix}max publish rate with p99 < 250 ms"), ok.0);
        out.hi(&format!("{prefix}deliveries/s at that rate"), ok.1);
        out.lo("server PSS peak (MiB)", self.peak.0 as f64 / MIB);
        self.check_into(&mut out);
        out.cdfs = self.steps.iter().map(|s| s.rate).zip(self.hists.iter().cloned()).collect();
        out.steps = self.steps;
        out
    }

    fn check_into(&self, out: &mut Out) {
        let (missing, dups, closed_fast, _) = self.delivery_check();
        out.lo("missing deliveries", missing as f64);
        out.lo("duplicate deliveries", dups as f64);
        if missing > 0 || dups > 0 || closed_fast > 0 {
            out.problems.push(format!("{missing} missing, {dups} duplicate deliveries, {closed_fast} reading clients closed by the server"));
        }
        if let Some(r) = self.overloaded_at {
            out.notes.push(format!(
                "overloaded at {r}/s (p99 over 2 s or under half delivered): higher rates skipped"
            ));
        }
        out.problems.extend(self.problems.iter().cloned());
        out.notes.extend(self.notes.iter().cloned());
    }
}

async fn stepped(ctx: &Ctx<'_>, kind: Kind, plan: &Plan) -> Result<SteppedResult, String> {
    let s = ctx.sizes;
    let mut server = Server::start(kind, plan.lg, ctx.paths).await?;
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let rec = Rec::default();
    let n = plan.rooms * plan.per_room;
    let specs: Vec<ConnSpec> = (0..n)
        .map(|i| ConnSpec {
            room: i % plan.rooms,
            slow: plan.slow_every.is_some_and(|k| i % k == k - 1),
        })
        .collect();
    let fast = specs.iter().filter(|c| !c.slow).count() as f64;
    let clients = load::open_clients(kind, server.addr, &specs, 0, &rec, &|d, n| {
        (ctx.status)(format!("connecting {d}/{n}"))
    })
    .await?;
    if clients.failed > 0 {
        problems.push(format!(
            "{} of {n} connections failed: {}",
            clients.failed,
            clients.first_error.clone().unwrap_or_default()
        ));
    }
    sleep_secs(0.3).await;
    let connected = server.sample();
    let (peak, sampler) = peak_sampler(server.stat_pid);
    let publisher = Publisher::new(kind, server.addr, plan.rooms, s.publish_connections, plan.pad);
    let mut cpu = Vec::new();
    let mut overloaded_at = None;
    for &rate in &plan.rates {
        (ctx.status)(format!("publishing {rate}/s"));
        let start = now_ns() + 20_000_000;
        let idx = rec.borrow_mut().add_phase(start, s.warm_secs, plan.secs);
        let (measure, end) = {
            let r = rec.borrow();
            (r.phases[idx].measure, r.phases[idx].end)
        };
        let sampling = async {
            tokio::time::sleep_until(load::instant_at(measure)).await;
            let a = (server.sample().cpu_secs, self_cpu(), procstat::machine_busy_secs());
            tokio::time::sleep_until(load::instant_at(end)).await;
            let b = (server.sample().cpu_secs, self_cpu(), procstat::machine_busy_secs());
            (b.0 - a.0, b.1 - a.1, (b.2 - a.2) - (b.0 - a.0) - (b.1 - a.1))
        };
        let ((), used) = tokio::join!(publisher.open_loop(&rec, rate, start, end), sampling);
        cpu.push(used);
        // Give in-flight events of this step a moment before judging it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = rec.borrow();
        let p = &r.phases[idx];
        let expected = p.published as f64 * fast / plan.rooms as f64;
        if plan.stop_when_overloaded
            && (ms(&p.hist, 0.99) > 2000.0 || (p.delivered as f64) < 0.5 * expected)
        {
            overloaded_at = Some(rate);
            break;
        }
    }
    (ctx.status)("settling".into());
    let (published, pstats) = publisher.finish(Duration::from_secs_f64(s.settle_max_secs)).await;
    settle(&rec, s.settle_max_secs).await;
    if !pstats.ack.is_empty() {
        notes.push(format!(
            "publish acks (intended send → HTTP answer): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            ms(&pstats.ack, 0.5),
            ms(&pstats.ack, 0.99),
            pstats.ack.max() as f64 / 1000.0
        ));
    }
    if pstats.errors > 0 {
        problems.push(format!(
            "{} publishes failed: {}",
            pstats.errors,
            pstats.first_error.unwrap_or_default()
        ));
    }
    sampler.abort();
    let summaries = clients.close().await;
    sleep_secs(0.5).await;
    let after = server.sample();
    server.stop();
    let r = rec.borrow();
    let mut steps = Vec::new();
    let mut hists = Vec::new();
    let mut bytes_per_frame = Vec::new();
    for (p, (&rate, &(scpu, ccpu, other))) in r.phases.iter().zip(plan.rates.iter().zip(cpu.iter()))
    {
        let secs = p.secs();
        bytes_per_frame.push(if p.frames > 0 {
            p.frame_bytes as f64 / p.frames as f64
        } else {
            f64::NAN
        });
        steps.push(Step {
            rate,
            delivered_per_s: p.delivered as f64 / secs,
            expected_per_s: p.published as f64 * fast / plan.rooms as f64 / secs,
            frames_per_s: p.frames as f64 / secs,
            server_cpu_util: scpu / secs,
            per_cpu_s: if scpu > 0.0 { p.delivered as f64 / scpu } else { f64::NAN },
            p50_ms: ms(&p.hist, 0.5),
            p99_ms: ms(&p.hist, 0.99),
            p999_ms: ms(&p.hist, 0.999),
            client_cpu_util: ccpu / secs,
            other_cpu_util: (other / secs).max(0.0),
        });
        hists.push(p.hist.clone());
    }
    for st in &steps {
        if st.other_cpu_util > 0.25 {
            notes.push(format!("other processes on the machine used {:.0} % of a core at {}/s: numbers are disturbed", st.other_cpu_util * 100.0, st.rate));
        }
        if st.client_cpu_util > 0.9 {
            notes.push(format!(
                "load generator CPU at {:.0} % at {}/s: deliveries there may be client-bound",
                st.client_cpu_util * 100.0,
                st.rate
            ));
        }
    }
    Ok(SteppedResult {
        steps,
        hists,
        summaries,
        published,
        problems,
        notes,
        pss_connected: connected.pss_bytes,
        rss_connected: connected.rss_bytes,
        peak: peak.get(),
        pss_after: after.pss_bytes,
        overloaded_at,
        bytes_per_frame,
    })
}

/// The floor (`floor.rs`) beside every step of a fan-out, the server stopped: as many
/// subscribers as read, one round per frame each received per second (the publish rate
/// when every event is its own frame; a batching server's windows otherwise) and frames
/// of the step's mean received size, WebSocket header included.
fn floors_beside(ctx: &Ctx<'_>, r: &SteppedResult) -> Vec<FloorStep> {
    let subscribers = r.summaries.iter().filter(|c| c.connected && !c.slow).count();
    let mut floors = Vec::new();
    for (st, &bytes) in r.steps.iter().zip(&r.bytes_per_frame) {
        let rounds_per_s = st.frames_per_s / subscribers.max(1) as f64;
        let frame_bytes = if bytes.is_finite() { bytes.round() as usize } else { 0 };
        (ctx.status)(format!("floor beside {}/s: {subscribers} sockets, {rounds_per_s:.1} rounds/s, {frame_bytes}-byte frames", st.rate));
        let floor = if st.frames_per_s > 0.0 {
            floor::measure(subscribers, rounds_per_s, frame_bytes, ctx.sizes.floor_secs)
        } else {
            Err("no frame was delivered in the step".into())
        };
        let server_us_per_frame = if st.frames_per_s > 0.0 {
            st.server_cpu_util / st.frames_per_s * 1e6
        } else {
            f64::NAN
        };
        floors.push(FloorStep {
            rate: st.rate,
            subscribers,
            rounds_per_s,
            frame_bytes,
            server_us_per_frame,
            floor,
        });
    }
    floors
}

/// The floor's figures at the reference rate as metrics (NaN when not measured, so the
/// rows stay), failures as notes.
fn floor_metrics(out: &mut Out, floors: Vec<FloorStep>, ref_rate: f64) {
    for f in &floors {
        if let Err(e) = &f.floor {
            out.notes.push(format!("floor beside {}/s not measured: {e}", f.rate));
        }
    }
    let at_ref = floors.iter().find(|f| (f.rate - ref_rate).abs() < 1e-9);
    let floor = at_ref.and_then(|f| f.floor.as_ref().ok());
    out.lo(
        &format!("server CPU µs per frame @{ref_rate}/s"),
        at_ref.map_or(f64::NAN, |f| f.server_us_per_frame),
    );
    out.lo(
        &format!("floor: CPU µs per write @{ref_rate}/s"),
        floor.map_or(f64::NAN, Floor::us_per_write),
    );
    out.hi(
        &format!("floor: writes per CPU-s @{ref_rate}/s"),
        floor.map_or(f64::NAN, Floor::writes_per_cpu_s),
    );
    out.lo(
        &format!("server CPU per frame ÷ floor @{ref_rate}/s"),
        at_ref.map_or(f64::NAN, FloorStep::times_floor),
    );
    out.floors = floors;
}

async fn hot(ctx: &Ctx<'_>, kind: Kind, window: u64) -> Result<Out, String> {
    let s = ctx.sizes;
    let rate = s.hot_rate_per_room * s.hot_rooms as f64;
    let mut plan = Plan::new(s.hot_rooms, s.hot_per_room, vec![rate], rate, s.pad, s.hot_secs);
    plan.lg.batch_window_ms = window;
    plan.stop_when_overloaded = false;
    let r = stepped(ctx, kind, &plan).await?;
    let mut out = Out::new();
    let conns = (s.hot_rooms * s.hot_per_room) as f64;
    if let Some(st) = r.steps.first() {
        out.lo("frames per connection per second", st.frames_per_s / conns);
        out.hi(
            "events per frame",
            if st.frames_per_s > 0.0 { st.delivered_per_s / st.frames_per_s } else { 0.0 },
        );
        out.hi("deliveries per server CPU-s", st.per_cpu_s);
        out.lo("server CPU %", st.server_cpu_util * 100.0);
        out.lo("p50 ms", st.p50_ms);
        out.lo("p99 ms", st.p99_ms);
        out.hi("delivered %", st.delivered_per_s / st.expected_per_s * 100.0);
    }
    r.check_into(&mut out);
    out.steps = r.steps;
    Ok(out)
}

async fn slow(ctx: &Ctx<'_>, kind: Kind) -> Result<Out, String> {
    let s = ctx.sizes;
    let mut plan =
        Plan::new(1, s.slow_subs, vec![s.slow_rate], s.slow_rate, s.slow_pad, s.slow_secs);
    plan.slow_every = Some(s.slow_every);
    plan.lg.max_outbox_bytes = s.slow_outbox;
    plan.stop_when_overloaded = false;
    let r = stepped(ctx, kind, &plan).await?;
    let mut out = Out::new();
    if let Some(st) = r.steps.first() {
        out.lo("reading clients p50 ms", st.p50_ms);
        out.lo("reading clients p99 ms", st.p99_ms);
        out.lo("reading clients p99.9 ms", st.p999_ms);
        out.hi("delivered % (reading clients)", st.delivered_per_s / st.expected_per_s * 100.0);
    }
    out.lo("server PSS growth (MiB)", (r.peak.0 as f64 - r.pss_connected as f64) / MIB);
    out.lo("server RSS growth (MiB)", (r.peak.1 as f64 - r.rss_connected as f64) / MIB);
    out.lo("server PSS after close (MiB)", r.pss_after as f64 / MIB);
    let (_, _, _, closed_slow) = r.delivery_check();
    let n_slow = r.summaries.iter().filter(|c| c.slow && c.connected).count();
    out.hi("non-reading clients closed by the server", closed_slow as f64);
    out.hi("non-reading clients", n_slow as f64);
    r.check_into(&mut out);
    out.steps = r.steps;
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// durable
// ---------------------------------------------------------------------------------------

async fn durable(ctx: &Ctx<'_>, kind: Kind) -> Result<Out, String> {
    let s = ctx.sizes;
    let mut server = Server::start(kind, LivegateOpts::default(), ctx.paths).await?;
    sleep_secs(0.3).await;
    let du0 = procstat::du_bytes(&server.data_dir);
    (ctx.status)(format!("{} publishers, closed loop", s.durable_publishers));
    let start = now_ns();
    let measure = start + secs_ns(s.warm_secs);
    let end = measure + secs_ns(s.durable_secs);
    let sampling = async {
        tokio::time::sleep_until(load::instant_at(measure)).await;
        let a = server.sample().cpu_secs;
        tokio::time::sleep_until(load::instant_at(end)).await;
        server.sample().cpu_secs - a
    };
    let ((acked, hist, stats, all), cpu) = tokio::join!(
        load::closed_loop(server.addr, s.durable_rooms, s.durable_publishers, s.pad, measure, end),
        sampling
    );
    sleep_secs(0.3).await;
    let du1 = procstat::du_bytes(&server.data_dir);
    server.stop();
    let mut out = Out::new();
    out.hi("acked publishes/s", acked as f64 / s.durable_secs);
    out.lo("ack p50 ms", ms(&hist, 0.5));
    out.lo("ack p99 ms", ms(&hist, 0.99));
    out.lo("ack p99.9 ms", ms(&hist, 0.999));
    out.lo("server CPU %", cpu / s.durable_secs * 100.0);
    out.lo("disk bytes per event", if all > 0 { du1 as f64 / all as f64 } else { f64::NAN });
    out.lo(
        "disk bytes per event (growth only)",
        if all > 0 { du1.saturating_sub(du0) as f64 / all as f64 } else { f64::NAN },
    );
    if stats.errors > 0 {
        out.problems.push(format!(
            "{} publishes failed: {}",
            stats.errors,
            stats.first_error.unwrap_or_default()
        ));
    }
    Ok(out)
}
