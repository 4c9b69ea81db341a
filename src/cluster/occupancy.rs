//! Cluster-wide room occupancy: the nodes' local occupancy edges turned into
//! one `occupied` when a room's first subscriber anywhere arrives and one `vacated` when
//! its last one anywhere leaves, reported through a callback (the webhooks' queue).
//!
//! - The `lg_occupancy` KV bucket holds one record per occupied room (key `r.<hex room>`):
//!   the set of nodes with subscribers there ([`Occupants`]). A vacated room's record is
//!   deleted (its one message removed by sequence, which fails when the record moved on:
//!   a compare-and-delete), so the bucket holds the occupied rooms only.
//! - A room's edges on this node go into [`LocalRooms`], and a few worker tasks reconcile
//!   each waiting room with its record, one job per room at a time (so a room's changes
//!   from this node stay in order; the room actor never waits).
//! - A job goes to the room's writer (`core::nodes::routing::room_writer`) on
//!   `lg.node.<hex node>.occupancy`: the writer changes the record by compare-and-set on
//!   its revision, under a per-room lock, and reports the decision itself, so one node
//!   holds a room's decisions in order. When the writer cannot be reached the node
//!   changes the record itself and reports locally (the CAS keeps the set right; only
//!   order across nodes is then not guaranteed).
//! - While NATS is away, jobs fail and stay queued (level-triggered: a room keeps only its
//!   latest local state) and are retried with backoff until NATS is back.
//! - A node that drains removes itself from its records ([`ClusterOccupancy::leave`]); at
//!   start it removes what a previous run of it left. A node declared dead by heartbeats
//!   is removed by each room's writer (a sweep of the bucket when a peer disappears, and
//!   every [`SWEEP_EVERY`]), which reports `vacated` where that empties a room. Dead
//!   nodes are only removed once this node has been connected for a heartbeat timeout,
//!   so its own outage does not make every peer look dead.

use std::collections::HashSet;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{CreateErrorKind, Operation, Store as Bucket, UpdateErrorKind};
use async_nats::jetstream::stream;
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::errors::{ClusterError, Unreachable};
use super::names::{room_from_token, room_token};
use super::setup::raise_replicas;
use super::Cluster;
use crate::core::delivery::occupancy::{
    apply, remove_dead, Applied, Edge, Job, LocalRooms, Occupants,
};
use crate::core::rules::backoff::{Backoff, BackoffPolicy, Jitter};
use crate::tasks::Tasks;
use crate::world::{now_ms, random_u64};

pub const OCCUPANCY_BUCKET: &str = "lg_occupancy";
/// Concurrent reconciliations on one node (different rooms).
const WORKERS: usize = 4;
/// Other nodes' changes applied at once as a room's writer; more wait in the
/// subscription's queue (then the asking node records its change itself).
pub const MAX_ANSWERS_RUNNING: usize = 64;
/// Locks the writer takes per room (by hash), so one room's changes apply one at a time.
const LOCK_SHARDS: usize = 64;
/// Reads and writes of one record before giving up on a room that keeps changing.
const CAS_ATTEMPTS: usize = 16;
/// How often the node looks for peers that went away.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How often every record is checked for dead nodes even when no peer went away.
pub const SWEEP_EVERY: Duration = Duration::from_secs(300);
/// Longest a job waits for the writer's answer.
const FORWARD_WAIT: Duration = Duration::from_secs(5);
/// Longest a draining node waits for its records to catch up.
pub const LEAVE_WAIT: Duration = Duration::from_secs(5);
const RETRY: BackoffPolicy = BackoffPolicy {
    first: Duration::from_millis(100),
    max: Duration::from_secs(5),
    jitter: Jitter::Full,
};

/// Where decided edges go: `(room, occupied, ts_ms)`.
pub type Report = Arc<dyn Fn(&str, bool, u64) + Send + Sync>;

/// What this module needs of the node's liveness (the wiring implements it).
pub trait Peers: 'static {
    /// The node that appends `room`'s events now (`None`: this node decides).
    fn writer(&self, room: &str) -> LocalBoxFuture<'static, Option<String>>;
    /// The other nodes alive now, draining ones included.
    fn alive(&self) -> LocalBoxFuture<'static, Vec<String>>;
}

fn room_key(room: &str) -> String {
    format!("r.{}", room_token(room))
}

fn occupancy_subject(node: &str) -> String {
    format!("lg.node.{}.occupancy", room_token(node))
}

/// This node's side of cluster-wide occupancy: the room actors' [`Occupancy`].
pub struct ClusterOccupancy {
    cluster: Cluster,
    bucket: Bucket,
    stream: stream::Stream,
    report: Report,
    local: Mutex<LocalRooms>,
    wake: Notify,
    locks: Vec<tokio::sync::Mutex<()>>,
    /// After how long without heartbeats a peer is dead.
    peer_timeout: Duration,
}

impl ClusterOccupancy {
    /// Open (or create) the bucket. Edges are kept until [`ClusterOccupancy::start`].
    pub async fn open(
        cluster: &Cluster,
        peer_timeout: Duration,
        report: Report,
    ) -> Result<Arc<ClusterOccupancy>, ClusterError> {
        // Not `ensure_bucket`: deleting a vacated room's message must be allowed.
        let stream = cluster
            .js
            .get_or_create_stream(stream::Config {
                name: format!("KV_{OCCUPANCY_BUCKET}"),
                subjects: vec![format!("$KV.{OCCUPANCY_BUCKET}.>")],
                max_messages_per_subject: 1,
                discard: stream::DiscardPolicy::New,
                allow_rollup: true,
                deny_delete: false,
                allow_direct: true,
                storage: stream::StorageType::File,
                duplicate_window: Duration::from_secs(120),
                num_replicas: cluster.replicas,
                ..Default::default()
            })
            .await?;
        raise_replicas(&cluster.js, &stream.cached_info().config, cluster.replicas).await?;
        let bucket = cluster.js.get_key_value(OCCUPANCY_BUCKET).await?;
        Ok(Arc::new(ClusterOccupancy {
            cluster: cluster.clone(),
            bucket,
            stream,
            report,
            local: Mutex::new(LocalRooms::default()),
            wake: Notify::new(),
            locks: (0..LOCK_SHARDS).map(|_| tokio::sync::Mutex::new(())).collect(),
            peer_timeout,
        }))
    }

    /// Take forwarded changes as a writer (at most [`MAX_ANSWERS_RUNNING`] at once),
    /// start the workers and the sweeps, on the current (actix) runtime, owned by the
    /// [`Tasks`] returned: stop them after [`ClusterOccupancy::leave`], which needs the
    /// workers. Subscribed before returning.
    pub async fn start(self: &Arc<Self>, peers: impl Peers) -> Result<Tasks, ClusterError> {
        let peers: Rc<dyn Peers> = Rc::new(peers);
        let forwarded =
            self.cluster.client.subscribe(occupancy_subject(&self.cluster.node)).await?;
        let mut tasks = Tasks::default();
        let this = self.clone();
        tasks.spawn_with_stop(|stop| {
            forwarded.take_until(stop.requested()).for_each_concurrent(
                MAX_ANSWERS_RUNNING,
                move |message| {
                    let this = this.clone();
                    async move { this.answer(message).await }
                },
            )
        });
        for _ in 0..WORKERS {
            let (this, peers) = (self.clone(), peers.clone());
            tasks.spawn(async move { this.work(peers).await });
        }
        let this = self.clone();
        tasks.spawn(async move { this.watch(peers).await });
        Ok(tasks)
    }

    /// The node is stopping: remove it from every record it is in, waiting at most `wait`.
    /// True when every record caught up.
    pub async fn leave(&self, wait: Duration) -> bool {
        if self.local.lock().leave_all(now_ms()) {
            self.wake.notify_waiters();
        }
        let deadline = Instant::now() + wait;
        loop {
            let (pending, rooms) = {
                let local = self.local.lock();
                (local.pending(), local.len())
            };
            if !pending {
                return true;
            }
            if Instant::now() >= deadline {
                tracing::warn!(rooms, "occupancy: stopping before every record caught up");
                return false;
            }
            actix_web::rt::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Rooms this node keeps for reconciliation (the bound in docs/src/internals/bounds.md).
    pub fn rooms_kept(&self) -> usize {
        self.local.lock().len()
    }

    async fn work(self: Arc<Self>, peers: Rc<dyn Peers>) {
        let mut backoff = Backoff::new(RETRY);
        loop {
            let next = self.local.lock().next_job();
            let Some(job) = next else {
                self.wake.notified().await;
                continue;
            };
            let done = self.reconcile(peers.as_ref(), &job).await;
            if let Err(error) = &done {
                tracing::warn!(room = %job.room, present = job.present, %error, "occupancy not recorded; will retry");
            }
            if self.local.lock().finished(&job, done.is_ok()) {
                self.wake.notify_one();
            }
            match done {
                Ok(()) => backoff.reset(),
                Err(_) => actix_web::rt::time::sleep(backoff.next_delay(random_u64())).await,
            }
        }
    }

    /// Have the room's writer record this node's state in `job.room`, or record it here.
    async fn reconcile(&self, peers: &dyn Peers, job: &Job) -> Result<(), ClusterError> {
        if !self.cluster.connected() {
            return Err(ClusterError::Unavailable(Unreachable::NotConnected));
        }
        let me = self.cluster.node.as_str();
        if let Some(writer) = peers.writer(&job.room).await.filter(|w| w != me) {
            match self.forward(&writer, job).await {
                Ok(()) => return Ok(()),
                Err(error) => {
                    tracing::debug!(room = %job.room, writer, %error, "occupancy: writer unreachable; recording here")
                }
            }
        }
        self.apply(&job.room, me, job.present, job.ts_ms).await.map(drop)
    }

    async fn forward(&self, writer: &str, job: &Job) -> Result<(), ForwardError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Lg-Room", &*job.room);
        headers.insert("Lg-Node", self.cluster.node.as_str());
        headers.insert("Lg-Present", if job.present { "1" } else { "0" });
        headers.insert("Lg-Ts", job.ts_ms.to_string().as_str());
        let request = async_nats::Request::new().headers(headers).timeout(Some(FORWARD_WAIT));
        let answer = self.cluster.client.send_request(occupancy_subject(writer), request).await?;
        match answer.headers.as_ref().and_then(|h| h.get("Lg-Error")) {
            Some(error) => Err(ForwardError::Refused(error.as_str().to_string())),
            None if answer.headers.as_ref().and_then(|h| h.get("Lg-Ok")).is_some() => Ok(()),
            None => Err(ForwardError::Malformed),
        }
    }

    /// A change another node forwarded to this one as the room's writer.
    async fn answer(&self, message: async_nats::Message) {
        let Some(reply) = message.reply.clone() else { return };
        let text = |name: &str| {
            message.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_string())
        };
        let mut headers = async_nats::HeaderMap::new();
        match (
            text("Lg-Room"),
            text("Lg-Node"),
            text("Lg-Present"),
            text("Lg-Ts").and_then(|t| t.parse().ok()),
        ) {
            (Some(room), Some(node), Some(present), Some(ts_ms)) => {
                match self.apply(&room, &node, present == "1", ts_ms).await {
                    Ok(_) => headers.insert("Lg-Ok", "1"),
                    Err(error) => headers
                        .insert("Lg-Error", error.to_string().replace(['\r', '\n'], " ").as_str()),
                }
            }
            _ => headers.insert("Lg-Error", "malformed occupancy change"),
        }
        let _ =
            self.cluster.client.publish_with_headers(reply, headers, Vec::<u8>::new().into()).await;
    }

    fn lock(&self, room: &str) -> &tokio::sync::Mutex<()> {
        let hash = room.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        &self.locks[(hash % LOCK_SHARDS as u64) as usize]
    }

    /// Record that `node` has subscribers in `room` (`present`) or none, and report the
    /// decision if that crossed between empty and not.
    pub async fn apply(
        &self,
        room: &str,
        node: &str,
        present: bool,
        ts_ms: u64,
    ) -> Result<Option<Edge>, ClusterError> {
        let _one_at_a_time = self.lock(room).lock().await;
        self.update(room, ts_ms, |stored| apply(stored, node, present)).await
    }

    /// Read-modify-write of `room`'s record by compare-and-set on its revision; the
    /// decision is reported once the write landed.
    async fn update(
        &self,
        room: &str,
        ts_ms: u64,
        change: impl Fn(Option<&Occupants>) -> Applied,
    ) -> Result<Option<Edge>, ClusterError> {
        let key = room_key(room);
        for _ in 0..CAS_ATTEMPTS {
            let entry = self.bucket.entry(key.as_str()).await?;
            let revision = entry.as_ref().map(|e| e.revision);
            let stored = match entry.as_ref().filter(|e| e.operation == Operation::Put) {
                Some(e) => match Occupants::decode(&e.value) {
                    Ok(record) => Some(record),
                    Err(error) => {
                        tracing::warn!(room, %error, "occupancy: unreadable record; rewriting it");
                        None
                    }
                },
                None => None,
            };
            let applied = change(stored.as_ref());
            let first_write_of_a_known_revision = stored.is_none() && revision.is_some();
            if !applied.changed && !first_write_of_a_known_revision {
                return Ok(None);
            }
            let written = match (&applied.record, revision) {
                (Some(record), None) => {
                    match self.bucket.create(key.as_str(), record.encode().into()).await {
                        Ok(_) => true,
                        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => false,
                        Err(e) => return Err(e.into()),
                    }
                }
                (Some(record), Some(revision)) => {
                    match self.bucket.update(key.as_str(), record.encode().into(), revision).await {
                        Ok(_) => true,
                        Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => false,
                        Err(e) => return Err(e.into()),
                    }
                }
                // The record's one message goes; gone already when the record moved on.
                (None, Some(revision)) => match self.stream.delete_message(revision).await {
                    Ok(deleted) => deleted,
                    Err(e) if matches!(e.kind(), stream::DeleteMessageErrorKind::JetStream(_)) => {
                        false
                    }
                    Err(e) => return Err(e.into()),
                },
                (None, None) => true,
            };
            if written {
                if let Some(edge) = applied.edge {
                    tracing::info!(room, edge = edge.label(), ts_ms, "room occupancy decided");
                    (self.report)(room, edge.occupied(), ts_ms);
                }
                return Ok(applied.edge);
            }
        }
        Err(ClusterError::RoomContended(room.to_string()))
    }

    /// Every second: note peers that went away; sweep the records when one did, every
    /// [`SWEEP_EVERY`], and once at start for what a previous run left.
    async fn watch(self: Arc<Self>, peers: Rc<dyn Peers>) {
        let started = Instant::now();
        let mut connected_since = self.cluster.connected().then(Instant::now);
        let mut known: HashSet<String> = HashSet::new();
        let mut last_sweep: Option<Instant> = None;
        let mut dead_sweep_due = false;
        let mut own_swept = false;
        loop {
            let connected = self.cluster.connected();
            match (connected, connected_since) {
                (true, None) => connected_since = Some(Instant::now()),
                (false, Some(_)) => connected_since = None,
                _ => {}
            }
            let alive: HashSet<String> = peers.alive().await.into_iter().collect();
            if known.iter().any(|node| !alive.contains(node)) {
                dead_sweep_due = true;
            }
            known = alive;
            let stable = started.elapsed() >= self.peer_timeout
                && connected_since.is_some_and(|t| t.elapsed() >= self.peer_timeout);
            let periodic = last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY);
            if connected && (!own_swept || (stable && (dead_sweep_due || periodic))) {
                match self.sweep(peers.as_ref(), stable).await {
                    Ok(()) => {
                        own_swept = true;
                        if stable {
                            dead_sweep_due = false;
                            last_sweep = Some(Instant::now());
                        }
                    }
                    Err(error) => tracing::warn!(%error, "occupancy sweep failed; will retry"),
                }
            }
            actix_web::rt::time::sleep(WATCH_EVERY).await;
        }
    }

    /// Read every record: rooms naming this node without its subscribers are queued for
    /// reconciliation; with `remove_dead`, nodes no longer alive leave the records of the
    /// rooms this node writes.
    async fn sweep(&self, peers: &dyn Peers, remove_dead_nodes: bool) -> Result<(), ClusterError> {
        let me = self.cluster.node.clone();
        let mut alive = peers.alive().await;
        alive.push(me.clone());
        let alive: Vec<&str> = alive.iter().map(String::as_str).collect();
        let mut keys = self.bucket.keys().await?;
        let mut rooms = Vec::new();
        while let Some(key) = keys.next().await {
            if let Some(room) = key?.strip_prefix("r.").and_then(room_from_token) {
                rooms.push(room);
            }
        }
        let (mut queued, mut cleaned) = (0, 0);
        for room in rooms {
            let Some(entry) = self.bucket.entry(room_key(&room)).await? else { continue };
            let Ok(record) = Occupants::decode(&entry.value) else { continue };
            if record.nodes.contains(&me) {
                let mut local = self.local.lock();
                if !local.occupied(&room) && local.unknown(&room, now_ms()) {
                    queued += 1;
                    self.wake.notify_one();
                }
            }
            let dead = record.nodes.iter().any(|n| !alive.contains(&n.as_str()));
            if remove_dead_nodes && dead && peers.writer(&room).await.is_none_or(|w| w == me) {
                let _one_at_a_time = self.lock(&room).lock().await;
                let now = now_ms();
                self.update(&room, now, |stored| {
                    stored.map_or_else(|| apply(None, &me, false), |s| remove_dead(s, &alive))
                })
                .await?;
                cleaned += 1;
            }
        }
        if queued + cleaned > 0 {
            tracing::info!(
                queued,
                cleaned,
                "occupancy sweep: records of this node and of dead nodes fixed"
            );
        }
        Ok(())
    }
}

impl ClusterOccupancy {
    /// `room`'s subscribers on this node went from none to some (`occupied`) or back, at
    /// `now_ms` (the room seam `actors::room::Occupancy`, implemented by the wiring, calls
    /// this). Never waits: the room is queued for the workers.
    pub fn local_edge(&self, room: &str, occupied: bool, now_ms: u64) {
        if crate::core::rules::names::inbox_owner(room).is_some() {
            return;
        }
        if self.local.lock().changed(room, occupied, now_ms) {
            self.wake.notify_one();
        }
    }
}

/// Why a change did not reach the room's writer (the node then records it itself).
#[derive(Debug, thiserror::Error)]
enum ForwardError {
    #[error("room writer unreachable: {0}")]
    Unreachable(#[from] async_nats::RequestError),
    #[error("room writer refused: {0}")]
    Refused(String),
    #[error("room writer's answer is not a livegate node's")]
    Malformed,
}
