//! A network link the test controls: TCP proxies on `127.0.0.1:0`, one per upstream
//! address, that all carry one [`Condition`] at a time. A chaos test puts a link between
//! one livegate node and its NATS seeds and between that node and its clients, then cuts
//! it, degrades it and heals it while everything else stays on plain loopback.
//!
//! Why a proxy rather than network namespaces and `tc netem`: the proxy needs no root,
//! no kernel modules and no clean-up (a crashed test leaves no qdisc or namespace behind
//! on a machine other builds share), it affects exactly the sockets it carries (netem on
//! `lo` would reach every test running beside), and livegate, nats-server and the
//! clients run unchanged on loopback. What it cannot do is drop IP packets; what it does
//! instead, per direction of each connection:
//!
//! - [`Condition::Up`]: bytes are copied as they come.
//! - [`Condition::Cut`], a partition: nothing is read or written either way, sockets stay
//!   open (no RST, no FIN), and new connections are accepted but connected upstream only
//!   after the heal. What was sent into the cut is delivered after the heal, in order, as
//!   TCP delivers its retransmissions once the path is back; a peer that gave up meanwhile
//!   sees its close arrive after that data, as with a real partition.
//! - [`Condition::Degraded`]: each chunk read (at most [`CHUNK`] bytes) is written
//!   `one_way` after it was read, in order. Loss is applied per TCP segment as the
//!   application sees it: a chunk counts as `ceil(len / MSS)` segments, each lost with
//!   probability `loss`; a chunk with a lost segment is held an extra retransmission
//!   timeout, `RTO_MIN + 2 × one_way` (Linux's 200 ms floor plus the round trip), and
//!   everything behind it on that connection waits too (head-of-line blocking). Nothing
//!   is ever dropped for good: TCP does not drop bytes, it delays them.
//! - [`Condition::Slowed`]: each chunk is written `one_way` after it was read and no
//!   sooner than the link's rate lets the chunks before it through (a bottleneck of
//!   `bytes_per_sec` each way, whose queue is the proxy's): what a shaped link (`tc`'s
//!   netem delay with a rate) does to a stream that sends faster than the rate.
//!
//! The proxies run on a tokio runtime of their own (one worker thread); dropping the
//! link closes every listener and connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::Rng;

/// The largest chunk a proxy reads at once.
pub const CHUNK: usize = 16 * 1024;
/// The segment size loss is counted in (an Ethernet MSS).
pub const MSS: usize = 1448;
/// Linux's floor of the retransmission timeout.
pub const RTO_MIN: Duration = Duration::from_millis(200);
/// Chunks in flight per direction before the proxy stops reading (backpressure).
const IN_FLIGHT: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Condition {
    Up,
    /// A partition: no byte moves either way until the link is up again.
    Cut,
    /// Added delay each way, and the share of segments lost (0.02: 2 %).
    Degraded {
        one_way: Duration,
        loss: f64,
    },
    /// Added delay each way and a rate each way, in bytes a second.
    Slowed {
        one_way: Duration,
        bytes_per_sec: u64,
    },
}

pub struct Link {
    condition: watch::Sender<Condition>,
    /// Seeds the loss draws of each new connection, so a run is repeatable per link.
    seed: Arc<Mutex<Rng>>,
    /// Connections accepted by this link's proxies.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Link {
    /// A link that is up, with no proxies yet.
    pub fn start() -> Link {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("test-link")
            .enable_all()
            .build()
            .expect("link runtime");
        Link {
            condition: watch::channel(Condition::Up).0,
            seed: Arc::new(Mutex::new(Rng::new(33))),
            accepted: Default::default(),
            runtime: Some(runtime),
        }
    }

    /// A new proxy on this link in front of `upstream`; returns where it listens.
    pub fn proxy(&self, upstream: SocketAddr) -> SocketAddr {
        let runtime = self.runtime.as_ref().expect("link runtime");
        let listener =
            runtime.block_on(TcpListener::bind("127.0.0.1:0")).expect("link bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("link addr");
        let condition = self.condition.subscribe();
        let (seed, accepted) = (self.seed.clone(), self.accepted.clone());
        runtime.spawn(async move {
            loop {
                let Ok((downstream, _)) = listener.accept().await else { continue };
                accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let seed = seed.lock().unwrap().next_u64();
                tokio::spawn(carry(downstream, upstream, condition.clone(), seed));
            }
        });
        addr
    }

    /// [`Link::proxy`] in front of each of `urls` (`nats://host:port`, comma-separated),
    /// as the same list through this link.
    pub fn proxy_urls(&self, urls: &str) -> String {
        urls.split(',')
            .map(|url| {
                let upstream: SocketAddr = url
                    .trim()
                    .trim_start_matches("nats://")
                    .parse()
                    .unwrap_or_else(|e| panic!("{url}: {e}"));
                format!("nats://{}", self.proxy(upstream))
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// How many connections this link's proxies have accepted.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn set(&self, condition: Condition) {
        self.condition.send_replace(condition);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// One proxied connection: connects upstream once the link is not cut, then carries each
/// direction under the link's condition until both have ended.
async fn carry(
    downstream: TcpStream,
    upstream: SocketAddr,
    mut condition: watch::Receiver<Condition>,
    seed: u64,
) {
    if condition.wait_for(|c| *c != Condition::Cut).await.is_err() {
        return;
    }
    let Ok(upstream) = TcpStream::connect(upstream).await else { return };
    let _ = downstream.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (down_read, down_write) = downstream.into_split();
    let (up_read, up_write) = upstream.into_split();
    let outbound = tokio::spawn(direction(down_read, up_write, condition.clone(), Rng::new(seed)));
    let inbound = tokio::spawn(direction(up_read, down_write, condition, Rng::new(seed ^ 0x5555)));
    let _ = tokio::join!(outbound, inbound);
}

/// Bytes from `from` to `to`: a reader that stamps each chunk with when it may be written,
/// and a writer that writes it then (and only while the link is not cut). An end of
/// `from` is passed on as a shutdown of `to`, after the data before it.
async fn direction(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    condition: watch::Receiver<Condition>,
    mut rng: Rng,
) {
    let (chunks, mut queued) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let mut reading = condition.clone();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        // Never earlier than the chunk before: TCP delivers in order.
        let mut last_due = Instant::now();
        loop {
            if reading.wait_for(|c| *c != Condition::Cut).await.is_err() {
                return;
            }
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => 0,
                Ok(n) => n,
            };
            let now = Instant::now();
            let due = match *reading.borrow() {
                Condition::Degraded { one_way, loss } => {
                    let segments = n.div_ceil(MSS).max(1) as i32;
                    let kept = (1.0 - loss).powi(segments);
                    let lost = (rng.next_u64() as f64 / u64::MAX as f64) >= kept;
                    now + one_way + if lost { RTO_MIN + 2 * one_way } else { Duration::ZERO }
                }
                // The bottleneck sends this chunk once the ones before it are through.
                Condition::Slowed { one_way, bytes_per_sec } => {
                    let sending = Duration::from_secs_f64(n as f64 / bytes_per_sec.max(1) as f64);
                    (now + one_way).max(last_due + sending)
                }
                Condition::Up | Condition::Cut => now,
            };
            last_due = last_due.max(due);
            // An empty chunk is the end of the stream.
            if chunks.send((last_due, buf[..n].to_vec())).await.is_err() || n == 0 {
                return;
            }
        }
    };
    let mut writing = condition;
    let writer = async move {
        while let Some((due, chunk)) = queued.recv().await {
            tokio::time::sleep_until(due).await;
            if writing.wait_for(|c| *c != Condition::Cut).await.is_err() {
                return;
            }
            if chunk.is_empty() {
                let _ = to.shutdown().await;
                return;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(reader, writer);
}
