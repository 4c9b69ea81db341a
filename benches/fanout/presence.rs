//! The presence scenario (issue 19): what presence costs in a hot room. One room of
//! `subs` WebSocket subscribers, each its own user (so its own `(user, device)` member),
//! while 1 % of them leave and a new user joins in their place every second (leaves
//! spread evenly; each newcomer connects `rejoin_ms` after the leave it replaces, so the
//! count keeps moving), and a publisher sends events at fixed rates over HTTP. The same
//! load runs in three arms, one after the other in every run: this build with every
//! subscribe `"presence":true`, this build with `"presence":false` (members are still
//! counted, no presence frames are sent), and an older build without presence
//! (`--baseline-bin`, subscribe without the key).
//!
//! `subs - pool` subscribers are stable (connected before the first publish, until the
//! end): they must see every event exactly once. The `pool` others take turns leaving
//! (oldest first) and their replacements join the back of the queue; they are checked
//! for duplicates only.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use crate::load::{self, now_ns, secs_ns, Publisher, Rec};
use crate::procstat;
use crate::proto::{self, Ws};
use crate::scenarios::{self_cpu, settle};
use crate::servers::{Kind, LivegateOpts, Paths, Server};

/// What each subscribe says about presence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Arm {
    /// `"presence":true`: presence frames besides the events.
    On,
    /// `"presence":false`: counted as members, no frames.
    Off,
    /// No `presence` key (a build without presence).
    Absent,
}

pub struct Params {
    pub subs: usize,
    pub pool: usize,
    pub churn_per_sec: f64,
    pub rejoin_ms: u64,
    pub rates: Vec<f64>,
    pub warm_secs: f64,
    pub secs: f64,
    pub settle_max_secs: f64,
    pub pad: usize,
    pub publish_connections: usize,
}

pub struct StepOut {
    pub rate: f64,
    pub secs: f64,
    pub delivered: u64,
    /// Publishes in the measured stretch (each one event for every subscriber then in).
    pub expected: u64,
    pub frames: u64,
    pub server_cpu: f64,
    pub client_cpu: f64,
    pub other_cpu: f64,
    pub hist: Histogram<u64>,
    /// Presence frames the stable subscribers received in the measured stretch.
    pub presence_frames: u64,
    /// Leaves (each followed by a newcomer) in the measured stretch.
    pub leaves: u64,
}

pub struct RunOut {
    pub steps: Vec<StepOut>,
    pub stable: usize,
    pub missing: u64,
    pub duplicates: u64,
    pub closed_by_server: usize,
    pub failed_connects: usize,
    pub first_error: Option<String>,
    pub rejoined: u64,
    /// The `count` of the last presence frame a stable subscriber received.
    pub last_count: Option<u64>,
    pub publish_errors: u64,
    pub first_publish_error: Option<String>,
    pub tokens_ran_out: bool,
}

#[derive(Default)]
struct Counters {
    stable_presence: Cell<u64>,
    last_count: Cell<Option<u64>>,
    leaves: Cell<u64>,
}

#[derive(Default)]
struct ConnOut {
    stable: bool,
    received: u64,
    distinct: u64,
    ended: bool,
}

struct Live {
    stop: oneshot::Sender<()>,
    task: JoinHandle<ConnOut>,
}

fn subscribe_frame(room: &str, arm: Arm) -> String {
    match arm {
        Arm::On => format!(r#"{{"op":"subscribe","room":"{room}","presence":true,"ref":1}}"#),
        Arm::Off => format!(r#"{{"op":"subscribe","room":"{room}","presence":false,"ref":1}}"#),
        Arm::Absent => format!(r#"{{"op":"subscribe","room":"{room}","ref":1}}"#),
    }
}

/// livegate writes a frame's keys in order, so a presence frame starts with `count`
/// (`{"count":N,"joined":…,"left":…,"op":"presence","room":…}`).
fn is_presence(t: &[u8]) -> bool {
    t.starts_with(br#"{"count":"#) && memchr::memmem::find(t, br#""op":"presence""#).is_some()
}

fn presence_count(t: &[u8]) -> Option<u64> {
    let i = memchr::memmem::find(t, b"\"count\":")? + 8;
    let digits: Vec<u8> = t[i..].iter().copied().take_while(u8::is_ascii_digit).collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

async fn next_text(ws: &mut Ws) -> Result<String, String> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(15), ws.next())
            .await
            .map_err(|_| "timed out waiting for a frame".to_string())?;
        match m {
            Some(Ok(Message::Text(t))) => return Ok(t),
            Some(Ok(Message::Close(f))) => return Err(format!("closed during subscribe: {f:?}")),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("socket ended during subscribe".into()),
        }
    }
}

/// Connects, subscribes with `arm`'s flag and starts reading; returns once subscribed.
async fn open_one(
    addr: SocketAddr,
    token: &str,
    arm: Arm,
    stable: bool,
    rec: Rec,
    counters: Rc<Counters>,
) -> Result<Live, String> {
    let room = proto::room_name(0);
    let url = proto::ws_url(Kind::Livegate, addr, &room, Some(token));
    let mut ws = load::connect(addr, &url, false).await?;
    let welcome = next_text(&mut ws).await?;
    if !welcome.contains(r#""op":"welcome""#) {
        return Err(format!("expected welcome, got {welcome}"));
    }
    ws.send(Message::Text(subscribe_frame(&room, arm))).await.map_err(|e| e.to_string())?;
    let mut early_presence = 0;
    loop {
        let t = next_text(&mut ws).await?;
        if t.contains(r#""op":"subscribed""#) && t.contains(r#""ref":1"#) {
            break;
        }
        if is_presence(t.as_bytes()) {
            early_presence += 1;
        } else if t.contains(r#""op":"error""#) {
            return Err(format!("subscribe refused: {t}"));
        }
    }
    if stable {
        counters.stable_presence.set(counters.stable_presence.get() + early_presence);
    }
    let (stop, mut stop_rx) = oneshot::channel::<()>();
    let task = tokio::task::spawn_local(async move {
        let mut out = ConnOut { stable, ..ConnOut::default() };
        let mut seen: Vec<u64> = Vec::new();
        loop {
            tokio::select! {
                biased;
                _ = &mut stop_rx => return out,
                m = ws.next() => match m {
                    Some(Ok(Message::Text(t))) => {
                        let b = t.as_bytes();
                        let now = now_ns();
                        if is_presence(b) {
                            if stable {
                                counters.stable_presence.set(counters.stable_presence.get() + 1);
                                if let Some(c) = presence_count(b) {
                                    counters.last_count.set(Some(c));
                                }
                            }
                            continue;
                        }
                        let mut r = rec.borrow_mut();
                        r.on_frame(now, b.len());
                        proto::scan_events(b, |seq, sent| {
                            out.received += 1;
                            let (w, bit) = ((seq / 64) as usize, seq % 64);
                            if w < 1_000_000 {
                                if w >= seen.len() {
                                    seen.resize(w + 1, 0);
                                }
                                if seen[w] & (1 << bit) == 0 {
                                    out.distinct += 1;
                                }
                                seen[w] |= 1 << bit;
                            }
                            r.on_event(sent, now);
                        });
                    }
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                        out.ended = true;
                        return out;
                    }
                    Some(Ok(_)) => {}
                },
            }
        }
    });
    Ok(Live { stop, task })
}

async fn collect(lives: impl IntoIterator<Item = Live>) -> Vec<ConnOut> {
    let mut handles = Vec::new();
    for l in lives {
        let _ = l.stop.send(());
        handles.push(l.task);
    }
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(c) = h.await {
            out.push(c);
        }
    }
    out
}

/// One arm: a fresh server (`kind`), the subscribers, churn and the publish steps.
pub async fn run(
    paths: &Paths,
    p: &Params,
    kind: Kind,
    arm: Arm,
    status: &dyn Fn(String),
) -> Result<RunOut, String> {
    let mut server = Server::start(kind, LivegateOpts::default(), paths).await?;
    let result = measure(&server, p, kind, arm, status).await;
    server.stop();
    result
}

async fn measure(
    server: &Server,
    p: &Params,
    kind: Kind,
    arm: Arm,
    status: &dyn Fn(String),
) -> Result<RunOut, String> {
    let addr = server.addr;
    // Tokens for the newcomers too, minted before anything is measured.
    let churn_secs = p.rates.len() as f64 * (p.warm_secs + p.secs + 0.5) + 2.0;
    let spare = (p.churn_per_sec * churn_secs).ceil() as usize + 16;
    status(format!("minting {} tokens", p.subs + spare));
    let tokens: Vec<String> = proto::credentials(kind, addr, p.subs + spare, 0, 8)
        .await?
        .into_iter()
        .map(|t| t.unwrap_or_default())
        .collect();
    let rec = Rec::default();
    let counters = Rc::new(Counters::default());
    let stable_n = p.subs - p.pool.min(p.subs);

    // The subscribers, at most 256 handshakes at once.
    let gate = Rc::new(Semaphore::new(256));
    let mut pending = Vec::with_capacity(p.subs);
    for (i, token) in tokens[..p.subs].iter().cloned().enumerate() {
        let (gate, rec, counters) = (gate.clone(), rec.clone(), counters.clone());
        pending.push(tokio::task::spawn_local(async move {
            let _permit = gate.acquire().await;
            open_one(addr, &token, arm, i < stable_n, rec, counters).await
        }));
    }
    let (mut stable, mut pool) = (Vec::new(), VecDeque::new());
    let (mut failed, mut first_error) = (0usize, None);
    for (i, h) in pending.into_iter().enumerate() {
        match h.await.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(l) if i < stable_n => stable.push(l),
            Ok(l) => pool.push_back(l),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
        if (i + 1) % 500 == 0 {
            status(format!("connecting {}/{}", i + 1, p.subs));
        }
    }
    let stable_connected = stable.len();
    tokio::time::sleep(Duration::from_millis(1500)).await; // the join's presence frames go out

    // Churn: every 1/churn_per_sec s the oldest of the pool leaves; a new user joins
    // rejoin_ms later at the back of the queue.
    let pool = Rc::new(RefCell::new(pool));
    let churning = Rc::new(Cell::new(true));
    let left: Rc<RefCell<Vec<Live>>> = Rc::default();
    let rejoined = Rc::new(Cell::new(0u64));
    let churn_failed: Rc<RefCell<(usize, Option<String>)>> = Rc::default();
    let tokens_ran_out = Rc::new(Cell::new(false));
    let churn = {
        let (pool, churning, left, rejoined, churn_failed, tokens_ran_out) = (
            pool.clone(),
            churning.clone(),
            left.clone(),
            rejoined.clone(),
            churn_failed.clone(),
            tokens_ran_out.clone(),
        );
        let (rec, counters) = (rec.clone(), counters.clone());
        let spare_tokens: Vec<String> = tokens[p.subs..].to_vec();
        let (interval, rejoin) = (1.0 / p.churn_per_sec, Duration::from_millis(p.rejoin_ms));
        tokio::task::spawn_local(async move {
            let t0 = now_ns();
            let mut joins = Vec::new();
            for k in 0u64.. {
                tokio::time::sleep_until(load::instant_at(t0 + secs_ns(k as f64 * interval))).await;
                if !churning.get() {
                    break;
                }
                let Some(token) = spare_tokens.get(k as usize).cloned() else {
                    tokens_ran_out.set(true);
                    break;
                };
                let Some(l) = pool.borrow_mut().pop_front() else { continue };
                let _ = l.stop.send(());
                left.borrow_mut().push(Live { stop: oneshot::channel().0, task: l.task });
                counters.leaves.set(counters.leaves.get() + 1);
                let (pool, rejoined, churn_failed, rec, counters) = (
                    pool.clone(),
                    rejoined.clone(),
                    churn_failed.clone(),
                    rec.clone(),
                    counters.clone(),
                );
                joins.push(tokio::task::spawn_local(async move {
                    tokio::time::sleep(rejoin).await;
                    match open_one(addr, &token, arm, false, rec, counters).await {
                        Ok(l) => {
                            pool.borrow_mut().push_back(l);
                            rejoined.set(rejoined.get() + 1);
                        }
                        Err(e) => {
                            let mut f = churn_failed.borrow_mut();
                            f.0 += 1;
                            f.1.get_or_insert(e);
                        }
                    }
                }));
            }
            for j in joins {
                let _ = j.await;
            }
        })
    };

    let publisher = Publisher::new(kind, addr, 1, p.publish_connections, p.pad);
    let mut sampled = Vec::new();
    for &rate in &p.rates {
        status(format!("publishing {rate}/s, churn {}/s", p.churn_per_sec));
        let start = now_ns() + 20_000_000;
        let idx = rec.borrow_mut().add_phase(start, p.warm_secs, p.secs);
        let (measure, end) = {
            let r = rec.borrow();
            (r.phases[idx].measure, r.phases[idx].end)
        };
        let sampling = async {
            tokio::time::sleep_until(load::instant_at(measure)).await;
            let a = (
                server.sample().cpu_secs,
                self_cpu(),
                procstat::machine_busy_secs(),
                counters.stable_presence.get(),
                counters.leaves.get(),
            );
            tokio::time::sleep_until(load::instant_at(end)).await;
            let b = (
                server.sample().cpu_secs,
                self_cpu(),
                procstat::machine_busy_secs(),
                counters.stable_presence.get(),
                counters.leaves.get(),
            );
            (
                b.0 - a.0,
                b.1 - a.1,
                ((b.2 - a.2) - (b.0 - a.0) - (b.1 - a.1)).max(0.0),
                b.3 - a.3,
                b.4 - a.4,
            )
        };
        let ((), (scpu, ccpu, other, pres, leaves)) =
            tokio::join!(publisher.open_loop(&rec, rate, start, end), sampling);
        tokio::time::sleep(Duration::from_millis(300)).await;
        sampled.push((idx, rate, scpu, ccpu, other, pres, leaves));
    }
    status("settling".into());
    churning.set(false);
    let _ = churn.await;
    let (published, pstats) = publisher.finish(Duration::from_secs_f64(p.settle_max_secs)).await;
    settle(&rec, p.settle_max_secs).await;
    // Events are counted by their send time, so a step's deliveries and latency are
    // complete only once everything has arrived.
    let steps: Vec<StepOut> = {
        let r = rec.borrow();
        sampled
            .into_iter()
            .map(|(idx, rate, server_cpu, client_cpu, other_cpu, presence_frames, leaves)| {
                let ph = &r.phases[idx];
                StepOut {
                    rate,
                    secs: ph.secs(),
                    delivered: ph.delivered,
                    expected: ph.published,
                    frames: ph.frames,
                    server_cpu,
                    client_cpu,
                    other_cpu,
                    hist: ph.hist.clone(),
                    presence_frames,
                    leaves,
                }
            })
            .collect()
    };
    let last_count = counters.last_count.get();
    let mut outs = collect(stable).await;
    let (pool, left) = (pool.take(), left.take());
    outs.extend(collect(pool).await);
    outs.extend(collect(left).await);
    let expected = published.first().copied().unwrap_or(0);
    let (mut missing, mut duplicates, mut closed) = (0, 0, 0);
    for c in &outs {
        duplicates += c.received - c.distinct;
        if c.stable {
            if c.ended {
                closed += 1;
            } else {
                missing += expected.saturating_sub(c.distinct);
            }
        }
    }
    let (cf, cfe) = churn_failed.take();
    Ok(RunOut {
        steps,
        stable: stable_connected,
        missing,
        duplicates,
        closed_by_server: closed,
        failed_connects: failed + cf,
        first_error: first_error.or(cfe),
        rejoined: rejoined.get(),
        last_count,
        publish_errors: pstats.errors,
        first_publish_error: pstats.first_error,
        tokens_ran_out: tokens_ran_out.get(),
    })
}
