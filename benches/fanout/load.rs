//! The load generator's machinery: the bench clock, a recorder of latency and deliveries
//! per measured phase, WebSocket clients opened from spread source addresses (each keeps
//! a bitset of the sequence numbers it saw, to count gaps and duplicates), and
//! publishers, open-loop at a fixed rate or closed-loop as fast as acks return.
//!
//! Everything runs on one current-thread runtime (`spawn_local`), so shared state is
//! `Rc<RefCell<…>>` and costs no locking.

use std::cell::{Cell, RefCell};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use tokio::net::TcpSocket;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use crate::http::HttpClient;
use crate::proto::{self, Ws};
use crate::servers::{Kind, API_KEY};

static START: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the bench started; the `bt` of every payload.
pub fn now_ns() -> u64 {
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

pub fn instant_at(ns: u64) -> tokio::time::Instant {
    (*START.get_or_init(Instant::now) + Duration::from_nanos(ns)).into()
}

pub fn secs_ns(s: f64) -> u64 {
    (s * 1e9) as u64
}

/// A latency histogram in microseconds, 1 µs to 10 minutes, 3 significant digits.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

/// One measured stretch of a scenario: events are attributed by their send time, frames
/// by their arrival time; the first `measure - start` ns are warm-up and not recorded.
pub struct Phase {
    pub measure: u64,
    pub end: u64,
    pub hist: Histogram<u64>,
    pub delivered: u64,
    pub published: u64,
    pub frames: u64,
    /// Bytes of those frames on the wire, WebSocket header included.
    pub frame_bytes: u64,
}

impl Phase {
    pub fn secs(&self) -> f64 {
        (self.end - self.measure) as f64 / 1e9
    }
}

#[derive(Default)]
pub struct Recorder {
    pub phases: Vec<Phase>,
    /// Every event and frame received, measured or not (to see when traffic settles).
    pub events: u64,
    pub frames: u64,
}

impl Recorder {
    pub fn add_phase(&mut self, start: u64, warm_secs: f64, secs: f64) -> usize {
        let measure = start + secs_ns(warm_secs);
        self.phases.push(Phase {
            measure,
            end: measure + secs_ns(secs),
            hist: new_hist(),
            delivered: 0,
            published: 0,
            frames: 0,
            frame_bytes: 0,
        });
        self.phases.len() - 1
    }

    fn phase_of(&mut self, t: u64) -> Option<&mut Phase> {
        self.phases.iter_mut().rev().find(|p| t >= p.measure && t < p.end)
    }

    /// A text frame whose payload is `len` bytes arrived at `now`.
    pub fn on_frame(&mut self, now: u64, len: usize) {
        self.frames += 1;
        if let Some(p) = self.phase_of(now) {
            p.frames += 1;
            p.frame_bytes += ws_frame_bytes(len) as u64;
        }
    }

    pub fn on_event(&mut self, sent: u64, now: u64) {
        self.events += 1;
        if let Some(p) = self.phase_of(sent) {
            p.delivered += 1;
            p.hist.saturating_record(now.saturating_sub(sent) / 1000);
        }
    }

    fn on_publish(&mut self, sent: u64) {
        if let Some(p) = self.phase_of(sent) {
            p.published += 1;
        }
    }
}

pub type Rec = Rc<RefCell<Recorder>>;

/// Bytes on the wire of a server's unmasked, unfragmented WebSocket frame with a
/// `len`-byte payload (RFC 6455 §5.2: a 2-byte header, plus 2 or 8 for the longer lengths).
pub fn ws_frame_bytes(len: usize) -> usize {
    len + match len {
        0..=125 => 2,
        126..=65535 => 4,
        _ => 10,
    }
}

// ---------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
pub struct ConnSpec {
    pub room: usize,
    /// Never reads after subscribing, with a small receive buffer.
    pub slow: bool,
}

pub struct ConnSummary {
    /// Connected and subscribed (failed ones are reported by `open_clients`).
    pub connected: bool,
    pub room: usize,
    pub slow: bool,
    pub received: u64,
    pub distinct: u64,
    /// The server ended the connection (with this close code, if it sent one).
    pub ended: bool,
    pub close_code: Option<u16>,
    /// livegate only: events whose room `seq` was below the previous one on this connection.
    pub out_of_order: u64,
}

pub struct Clients {
    pub tasks: Vec<JoinHandle<ConnSummary>>,
    pub failed: usize,
    pub first_error: Option<String>,
    stop: watch::Sender<bool>,
}

impl Clients {
    /// Stops every client (dropping its socket) and returns what each one saw.
    pub async fn close(self) -> Vec<ConnSummary> {
        let _ = self.stop.send(true);
        let mut out = Vec::with_capacity(self.tasks.len());
        for t in self.tasks {
            if let Ok(s) = t.await {
                out.push(s);
            }
        }
        out
    }
}

/// Source addresses 127.0.0.2 … 127.0.0.(SOURCES+1), taken in turn across the whole bench
/// run, so neither one scenario nor the TIME_WAITs of earlier ones exhaust the ports.
const SOURCES: usize = 64;
static NEXT_SOURCE: AtomicUsize = AtomicUsize::new(0);
/// Handshakes in flight at once.
pub const CONNECT_PARALLEL: usize = 256;
/// Failed connections after which the rest of a batch is not tried.
const GIVE_UP_AFTER: usize = 50;
/// Bound of TCP connect and of the WebSocket upgrade.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A WebSocket to `addr` from the next source address; a refused upgrade's error names
/// its status (`HTTP error: 401 Unauthorized`).
pub async fn connect(addr: SocketAddr, url: &str, slow: bool) -> Result<Ws, String> {
    let n = NEXT_SOURCE.fetch_add(1, Ordering::Relaxed) % SOURCES;
    let src = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2 + n as u8), 0);
    let sock = TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
    if slow {
        sock.set_recv_buffer_size(4096).map_err(|e| e.to_string())?;
    }
    sock.bind(src.into()).map_err(|e| format!("bind {src}: {e}"))?;
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, sock.connect(addr))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let cfg = WebSocketConfig { write_buffer_size: 0, ..WebSocketConfig::default() };
    let (ws, _) = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_tungstenite::client_async_with_config(url, stream, Some(cfg)),
    )
    .await
    .map_err(|_| "handshake timed out".to_string())?
    .map_err(|e| format!("handshake: {e}"))?;
    Ok(ws)
}

/// Which bench sequence numbers a connection has seen.
#[derive(Default)]
struct Seen(Vec<u64>);

impl Seen {
    /// Records `seq`; false when it was seen before.
    fn insert(&mut self, seq: u64) -> bool {
        let (w, b) = ((seq / 64) as usize, seq % 64);
        if w >= self.0.len() {
            if w > 50_000_000 {
                return true; // garbage; do not allocate for it
            }
            self.0.resize(w + 1, 0);
        }
        let fresh = self.0[w] & (1 << b) == 0;
        self.0[w] |= 1 << b;
        fresh
    }
}

/// Opens one client per spec (a `user` per client for livegate, starting at
/// `first_user`), completes each server's subscribe handshake and starts reading.
/// Returns once every client is subscribed or has failed.
pub async fn open_clients(
    kind: Kind,
    addr: SocketAddr,
    specs: &[ConnSpec],
    first_user: usize,
    rec: &Rec,
    progress: &dyn Fn(usize, usize),
) -> Result<Clients, String> {
    open_clients_in(kind, addr, specs, first_user, None, rec, progress).await
}

/// [`open_clients`] whose livegate users are homed in `cell` (their tokens' `cell`
/// claim), so that a node of that cell serves their new sessions.
pub async fn open_clients_in(
    kind: Kind,
    addr: SocketAddr,
    specs: &[ConnSpec],
    first_user: usize,
    cell: Option<&str>,
    rec: &Rec,
    progress: &dyn Fn(usize, usize),
) -> Result<Clients, String> {
    let n = specs.len();
    let tokens = proto::credentials_in(kind, addr, n, first_user, 8, cell).await?;
    let (stop, stop_rx) = watch::channel(false);
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<Result<(), String>>();
    let gate = Rc::new(Semaphore::new(CONNECT_PARALLEL));
    // Once this many have failed (a server at its limit), the rest give up at once.
    let give_up = Rc::new(Cell::new(0usize));
    let mut tasks = Vec::with_capacity(n);
    for (spec, token) in specs.iter().copied().zip(tokens) {
        let room = proto::room_name(spec.room);
        let url = proto::ws_url(kind, addr, &room, token.as_deref());
        let (gate, ready, rec, mut stop, give_up) =
            (gate.clone(), ready_tx.clone(), rec.clone(), stop_rx.clone(), give_up.clone());
        tasks.push(tokio::task::spawn_local(async move {
            let mut sum = ConnSummary {
                room: spec.room,
                slow: spec.slow,
                received: 0,
                distinct: 0,
                connected: false,
                ended: false,
                close_code: None,
                out_of_order: 0,
            };
            let permit = gate.acquire().await;
            if give_up.get() >= GIVE_UP_AFTER {
                let _ = ready.send(Err("not tried: too many connections failed before".into()));
                return sum;
            }
            let attempt = async {
                let mut ws = connect(addr, &url, spec.slow).await?;
                proto::subscribe(kind, &mut ws, &room).await?;
                Ok::<_, String>(ws)
            };
            let ws = match attempt.await {
                Ok(ws) => Some(ws),
                Err(e) => {
                    give_up.set(give_up.get() + 1);
                    let _ = ready.send(Err(e));
                    None
                }
            };
            drop(permit);
            let Some(mut ws) = ws else { return sum };
            sum.connected = true;
            let _ = ready.send(Ok(()));
            drop(ready);
            read_loop(kind, &mut ws, spec.slow, &rec, &mut stop, &mut sum).await;
            sum
        }));
    }
    drop(ready_tx);
    let (mut done, mut failed, mut first_error) = (0, 0, None);
    while done < n {
        match ready_rx.recv().await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
            None => break,
        }
        done += 1;
        if done % 250 == 0 || done == n {
            progress(done, n);
        }
    }
    Ok(Clients { tasks, failed, first_error, stop })
}

async fn read_loop(
    kind: Kind,
    ws: &mut Ws,
    slow: bool,
    rec: &Rec,
    stop: &mut watch::Receiver<bool>,
    sum: &mut ConnSummary,
) {
    let mut seen = Seen::default();
    let mut last_seq = 0u64;
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            m = ws.next(), if !slow => match m {
                Some(Ok(Message::Text(t))) => {
                    let now = now_ns();
                    {
                        let mut r = rec.borrow_mut();
                        r.on_frame(now, t.len());
                        proto::scan_events(t.as_bytes(), |seq, sent| {
                            sum.received += 1;
                            if seen.insert(seq) {
                                sum.distinct += 1;
                            }
                            r.on_event(sent, now);
                        });
                    }
                    if kind.is_livegate() {
                        proto::scan_room_seqs(t.as_bytes(), |seq| {
                            if seq < last_seq {
                                sum.out_of_order += 1;
                            }
                            last_seq = last_seq.max(seq);
                        });
                    }
                    if proto::is_engine_ping(kind, &t) {
                        let _ = ws.send(Message::Text("3".into())).await;
                    }
                }
                Some(Ok(Message::Close(f))) => {
                    sum.ended = true;
                    sum.close_code = f.map(|f| u16::from(f.code));
                    return;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    sum.ended = true;
                    return;
                }
            },
        }
    }
}

// ---------------------------------------------------------------------------------------
// Publishers
// ---------------------------------------------------------------------------------------

pub struct PubStats {
    /// Intended send time → HTTP answer, µs (queueing in the publisher included).
    pub ack: Histogram<u64>,
    pub ok: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Default for PubStats {
    fn default() -> Self {
        PubStats { ack: new_hist(), ok: 0, errors: 0, first_error: None }
    }
}

struct Job {
    path: String,
    body: String,
    due: u64,
}

/// Open-loop publishing: jobs scheduled at a fixed rate go to a pool of keep-alive HTTP
/// connections; a job waits in the queue when all are busy, and its `bt` stays the
/// intended send time, so a slow server's queueing shows up as latency.
pub struct Publisher {
    kind: Kind,
    rooms: usize,
    /// The first room's index: the rooms are `room_name(first_room + k)`, k < `rooms`.
    first_room: usize,
    pad: String,
    /// One queue per server address; a room's publishes take the addresses in turn.
    tx: Vec<mpsc::UnboundedSender<Job>>,
    /// Every publish carries an `id` (livegate: the idempotency key users retry with).
    ids: bool,
    workers: Vec<JoinHandle<()>>,
    pub published: Rc<RefCell<Vec<u64>>>,
    pub stats: Rc<RefCell<PubStats>>,
}

impl Publisher {
    pub fn new(
        kind: Kind,
        addr: SocketAddr,
        rooms: usize,
        connections: usize,
        pad_bytes: usize,
    ) -> Publisher {
        Publisher::spread(kind, &[addr], rooms, connections, pad_bytes, false)
    }

    /// A publisher with `connections` to each of `addrs`: publish `k` goes to room
    /// `k % rooms` through address `(k / rooms) % addrs.len()`, so every room's publishes
    /// go through every address. With `ids`, each publish has an `id` unique in its room.
    pub fn spread(
        kind: Kind,
        addrs: &[SocketAddr],
        rooms: usize,
        connections: usize,
        pad_bytes: usize,
        ids: bool,
    ) -> Publisher {
        let stats = Rc::new(RefCell::new(PubStats::default()));
        let mut txs = Vec::with_capacity(addrs.len());
        let mut workers = Vec::with_capacity(addrs.len() * connections);
        for &addr in addrs {
            let (tx, rx) = mpsc::unbounded_channel::<Job>();
            txs.push(tx);
            let rx = Rc::new(tokio::sync::Mutex::new(rx));
            workers.extend((0..connections).map(|_| {
                let (rx, stats) = (rx.clone(), stats.clone());
                tokio::task::spawn_local(async move {
                    let mut http = HttpClient::new(addr, kind.is_livegate().then_some(API_KEY));
                    loop {
                        let job = rx.lock().await.recv().await;
                        let Some(job) = job else { return };
                        let r = http.post(&job.path, job.body.as_bytes()).await;
                        let mut s = stats.borrow_mut();
                        match r {
                            Ok(r) if proto::publish_ok(kind, r.status) => {
                                s.ok += 1;
                                s.ack.saturating_record((now_ns().saturating_sub(job.due)) / 1000);
                            }
                            Ok(r) => {
                                s.errors += 1;
                                s.first_error.get_or_insert_with(|| {
                                    format!(
                                        "HTTP {} {}",
                                        r.status,
                                        String::from_utf8_lossy(&r.body)
                                    )
                                });
                            }
                            Err(e) => {
                                s.errors += 1;
                                s.first_error.get_or_insert_with(|| e.to_string());
                            }
                        }
                    }
                })
            }));
        }
        Publisher {
            kind,
            rooms,
            first_room: 0,
            pad: "x".repeat(pad_bytes),
            tx: txs,
            ids,
            workers,
            published: Rc::new(RefCell::new(vec![0; rooms])),
            stats,
        }
    }

    /// The same publisher over rooms `first..first + rooms` instead of `0..rooms` (the
    /// bench sequence numbers in `published` stay indexed from 0).
    pub fn starting_at_room(mut self, first: usize) -> Publisher {
        self.first_room = first;
        self
    }

    /// Publishes `rate` events per second in total, round-robin over the rooms, with
    /// intended send times from `start` until `end` (ns on the bench clock).
    pub async fn open_loop(&self, rec: &Rec, rate: f64, start: u64, end: u64) {
        let interval = 1e9 / rate;
        assert!(!self.tx.is_empty(), "publisher open");
        for k in 0u64.. {
            let due = start + (k as f64 * interval) as u64;
            if due >= end {
                break;
            }
            if due > now_ns() {
                tokio::time::sleep_until(instant_at(due)).await;
            }
            let room = k as usize % self.rooms;
            let seq = {
                let mut p = self.published.borrow_mut();
                p[room] += 1;
                p[room]
            };
            let data = proto::payload(seq, due, &self.pad);
            let named = self.first_room + room;
            let (path, body) = if self.ids {
                proto::publish_request_with_id(
                    &proto::room_name(named),
                    &publish_id(named, seq),
                    &data,
                )
            } else {
                proto::publish_request(self.kind, &proto::room_name(named), &data)
            };
            rec.borrow_mut().on_publish(due);
            let through = (k as usize / self.rooms) % self.tx.len();
            let _ = self.tx[through].send(Job { path, body, due });
        }
    }

    /// Waits for every queued publish to be answered, at most `max`; what is still queued
    /// then is abandoned (and counted as one error).
    pub async fn finish(mut self, max: Duration) -> (Vec<u64>, PubStats) {
        self.tx.clear();
        let deadline = tokio::time::Instant::now() + max;
        let mut abandoned = false;
        for w in self.workers.drain(..) {
            let abort = w.abort_handle();
            if tokio::time::timeout_at(deadline, w).await.is_err() {
                abort.abort();
                abandoned = true;
            }
        }
        if abandoned {
            let mut s = self.stats.borrow_mut();
            s.errors += 1;
            s.first_error.get_or_insert_with(|| {
                format!("publish queue not drained {max:?} after the last step; rest abandoned")
            });
        }
        let published = self.published.borrow().clone();
        let stats = std::mem::take(&mut *self.stats.borrow_mut());
        (published, stats)
    }
}

/// The `id` of room `room`'s publish with bench sequence number `seq`: unique across
/// rooms too, since in cluster mode livegate's ids share one JetStream stream's
/// deduplication window (an id taken in another room is refused as contended).
fn publish_id(room: usize, seq: u64) -> String {
    format!("b{room}-{seq}")
}

/// Closed-loop durable publishing: `publishers` keep-alive connections, each sending its
/// next publish as soon as the previous one was acknowledged, round-robin over `rooms`.
/// Returns acks whose request started in [measure, end), their latency, errors, and all acks.
pub async fn closed_loop(
    addr: SocketAddr,
    rooms: usize,
    publishers: usize,
    pad_bytes: usize,
    measure: u64,
    end: u64,
) -> (u64, Histogram<u64>, PubStats, u64) {
    let seqs = Rc::new(RefCell::new(vec![0u64; rooms]));
    closed_loop_spread(&[addr], seqs, publishers, pad_bytes, false, measure, end).await
}

/// [`closed_loop`] through several livegate nodes: each publisher keeps a connection to
/// every address and takes them in turn, so every room's publishes go through every node.
/// `seqs` are the rooms' bench sequence numbers (shared with an earlier open-loop
/// [`Publisher`]'s `published`, so subscribers still see every number once); with
/// `ids`, each publish has an `id` unique in its room.
pub async fn closed_loop_spread(
    addrs: &[SocketAddr],
    seqs: Rc<RefCell<Vec<u64>>>,
    publishers: usize,
    pad_bytes: usize,
    ids: bool,
    measure: u64,
    end: u64,
) -> (u64, Histogram<u64>, PubStats, u64) {
    let rooms = seqs.borrow().len();
    let acked = Rc::new(Cell::new(0u64));
    let all = Rc::new(Cell::new(0u64));
    let hist = Rc::new(RefCell::new(new_hist()));
    let stats = Rc::new(RefCell::new(PubStats::default()));
    let pad = Rc::new("x".repeat(pad_bytes));
    let tasks: Vec<_> = (0..publishers)
        .map(|p| {
            let (acked, all, hist, stats, pad, seqs) = (
                acked.clone(),
                all.clone(),
                hist.clone(),
                stats.clone(),
                pad.clone(),
                seqs.clone(),
            );
            let mut https: Vec<HttpClient> =
                addrs.iter().map(|&a| HttpClient::new(a, Some(API_KEY))).collect();
            tokio::task::spawn_local(async move {
                let mut i = p;
                let mut sent = 0usize;
                loop {
                    let t0 = now_ns();
                    if t0 >= end {
                        return;
                    }
                    let room = i % rooms;
                    i += publishers;
                    let seq = {
                        let mut s = seqs.borrow_mut();
                        s[room] += 1;
                        s[room]
                    };
                    let data = proto::payload(seq, t0, &pad);
                    let (path, body) = if ids {
                        proto::publish_request_with_id(
                            &proto::room_name(room),
                            &publish_id(room, seq),
                            &data,
                        )
                    } else {
                        proto::publish_request(Kind::Livegate, &proto::room_name(room), &data)
                    };
                    let through = (p + sent) % https.len();
                    let http = &mut https[through];
                    sent += 1;
                    match http.post(&path, body.as_bytes()).await {
                        Ok(r) if r.status == 201 => {
                            all.set(all.get() + 1);
                            if t0 >= measure {
                                acked.set(acked.get() + 1);
                                hist.borrow_mut().saturating_record((now_ns() - t0) / 1000);
                            }
                        }
                        other => {
                            {
                                let mut s = stats.borrow_mut();
                                s.errors += 1;
                                s.first_error.get_or_insert_with(|| match other {
                                    Ok(r) => format!("HTTP {}", r.status),
                                    Err(e) => e.to_string(),
                                });
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let h = hist.borrow().clone();
    let s = std::mem::take(&mut *stats.borrow_mut());
    (acked.get(), h, s, all.get())
}
