//! Webhooks on one node: `room_occupied`, `room_vacated` and
//! `client_published`, POSTed to `webhook_url`, signed, at least once, in order per room,
//! from a durable queue in the store (tree `webhooks`).
//!
//! [`Webhooks`] is the handle producers hold (the rooms through [`Occupancy`], connections
//! after a client's publish): [`Webhooks::enqueue`] renders the body once, writes it to the
//! store under the next queue seq, asks for a flush and wakes the scheduler; it never
//! waits on the network. A full queue (`webhook_queue_max`) drops the new webhook, counted
//! and logged. The scheduler thread keeps the pure [`Lanes`] (which webhook of which room
//! is due) and hands due ones to a few sender threads, which make the blocking HTTP
//! attempt (ureq, `webhook_timeout_ms`), carry out the step `core::rules::webhooks::step`
//! decides and report it back: a delivered webhook leaves the store; a failed one waits its
//! jittered backoff (`webhook_retry_first_ms` doubling to `webhook_retry_max_ms`), its
//! room's later webhooks behind it; after `webhook_max_attempts`, or at once when the
//! receiver refuses it (a 4xx other than 408 and 429), it moves to the [`DeadLetters`]
//! (tree `webhook_dead`, at most `webhook_dead_letters_max`, the oldest dropped) and its
//! room goes on. On start the queue is read back from the store; on stop what is left
//! stays there for the next start.
//!
//! [`DeadLetters`] are listed, replayed (one attempt now, outside the room's order:
//! delivered, it leaves the list; failed, it stays with one attempt more) and deleted
//! through the admin API; they are kept whether webhooks are on or not.

mod dead;
mod post;
mod settings;

pub use dead::{DeadLetters, ReplayError, Replayed};
pub use settings::WebhookSettings;

use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::room::Occupancy;
use crate::core::rules::names;
use crate::core::rules::webhooks::{self as rules, Kind, Lanes, Step};
use crate::metrics::Metrics;
use crate::protocol::{self, EventData, WebhookBody};
use crate::store::{DeadLetterRecord, Store, StoreError, WebhookRecord};
use crate::world::{now_ms, random_hex, random_u64};
use dead::drop_flush;
use post::Poster;

/// Queued webhooks read back per store page at start.
const RESUME_PAGE: usize = 1000;
/// How long a stop waits for attempts in flight to end (at most `webhook_timeout_ms`), so
/// a delivered webhook is not sent again at the next start.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Why the webhooks could not start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook queue: {0}")]
    Store(#[from] StoreError),
    #[error("cannot start the webhook threads: {0}")]
    Thread(#[source] std::io::Error),
}

/// What happened, for the webhook that tells it.
#[derive(Debug, Clone)]
pub enum WebhookEvent {
    RoomOccupied {
        room: String,
        ts_ms: u64,
    },
    RoomVacated {
        room: String,
        ts_ms: u64,
    },
    ClientPublished {
        room: String,
        ts_ms: u64,
        user: String,
        device: Option<String>,
        seq: u64,
        event_id: Option<String>,
        data: Box<EventData>,
    },
}

impl WebhookEvent {
    /// The room whose lane it waits in.
    pub fn room(&self) -> &str {
        match self {
            WebhookEvent::RoomOccupied { room, .. }
            | WebhookEvent::RoomVacated { room, .. }
            | WebhookEvent::ClientPublished { room, .. } => room,
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            WebhookEvent::RoomOccupied { .. } => Kind::RoomOccupied,
            WebhookEvent::RoomVacated { .. } => Kind::RoomVacated,
            WebhookEvent::ClientPublished { .. } => Kind::ClientPublished,
        }
    }

    /// The request body, with its `id` and the node's name.
    fn body(&self, id: &str, node: &str) -> String {
        let (room, ts_ms) = match self {
            WebhookEvent::RoomOccupied { room, ts_ms }
            | WebhookEvent::RoomVacated { room, ts_ms }
            | WebhookEvent::ClientPublished { room, ts_ms, .. } => (room.as_str(), *ts_ms),
        };
        let mut body = WebhookBody {
            id,
            kind: self.kind().as_str(),
            room,
            ts_ms,
            node,
            user: None,
            device: None,
            seq: None,
            event_id: None,
            data: None,
        };
        if let WebhookEvent::ClientPublished { user, device, seq, event_id, data, .. } = self {
            body.user = Some(user.as_str());
            body.device = device.as_deref();
            body.seq = Some(*seq);
            body.event_id = event_id.as_deref();
            body.data = Some(&**data);
        }
        protocol::webhook_body(&body)
    }
}

/// The handle to the node's webhooks; cheap to clone, every clone feeds one queue.
#[derive(Clone)]
pub struct Webhooks {
    shared: Arc<Shared>,
    worker: Arc<Mutex<Option<Worker>>>,
    /// Replays make their attempt with it.
    poster: Arc<Poster>,
}

/// What producers, the scheduler and the senders share.
struct Shared {
    store: Store,
    metrics: Arc<Metrics>,
    node: String,
    queue_max: usize,
    note_occupancy: bool,
    max_attempts: u32,
    dead: DeadLetters,
    /// The queue's count and next seq; held while a webhook is written and announced, so
    /// the scheduler hears of them in seq order.
    queue: Mutex<Queue>,
}

struct Queue {
    next_seq: u64,
    queued: usize,
    /// The scheduler's wake-up line (`None` once stopped: new webhooks stay in the store).
    wake: Option<mpsc::Sender<Wake>>,
}

struct Worker {
    wake: mpsc::Sender<Wake>,
    scheduler: JoinHandle<()>,
    senders: Vec<JoinHandle<()>>,
    timeout: Duration,
}

/// What the scheduler hears.
enum Wake {
    Queued { room: String, seq: u64 },
    Finished { room: String, seq: u64, step: Step },
    Stop,
}

/// One attempt to make.
struct Job {
    room: String,
    seq: u64,
    retries: u32,
    first_ms: u64,
}

impl Webhooks {
    /// Read the queue back from the store and start the scheduler and the senders; what
    /// they give up goes to `dead`.
    pub fn start(
        store: Store,
        metrics: Arc<Metrics>,
        settings: WebhookSettings,
        dead: DeadLetters,
    ) -> Result<Webhooks, WebhookError> {
        let mut resumed: Vec<(String, u64)> = Vec::new();
        let mut from = 0;
        loop {
            let page = store.webhooks().page(from, RESUME_PAGE)?;
            let Some(&(last, _)) = page.last() else { break };
            resumed.extend(page.into_iter().map(|(seq, record)| (record.room, seq)));
            match last.checked_add(1) {
                Some(next) => from = next,
                None => break,
            }
        }
        let next_seq = store.webhooks().last_seq()?.map_or(0, |last| last.saturating_add(1));
        metrics.webhooks_queued.set(resumed.len() as i64);
        if !resumed.is_empty() {
            tracing::info!(queued = resumed.len(), "webhooks resumed from the store");
        }
        let now = now_ms();
        let mut lanes = Lanes::new(settings.max_in_flight, settings.retry);
        for (room, seq) in &resumed {
            lanes.push(room, *seq, now);
        }
        let (wake, woken) = mpsc::channel();
        let shared = Arc::new(Shared {
            store,
            metrics,
            node: settings.node.clone(),
            queue_max: settings.queue_max,
            note_occupancy: settings.note_occupancy,
            max_attempts: settings.max_attempts,
            dead,
            queue: Mutex::new(Queue { next_seq, queued: resumed.len(), wake: Some(wake.clone()) }),
        });
        let (jobs, taken) = mpsc::channel::<Job>();
        let taken = Arc::new(Mutex::new(taken));
        let poster = Arc::new(Poster::new(&settings));
        let spawn = |name: String, work: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name).spawn(work).map_err(WebhookError::Thread)
        };
        let mut senders = Vec::new();
        for n in 0..settings.max_in_flight.max(1) {
            let sender = Sender {
                shared: shared.clone(),
                poster: poster.clone(),
                jobs: taken.clone(),
                wake: wake.clone(),
            };
            senders.push(spawn(format!("livegate-webhook-{n}"), Box::new(move || sender.run()))?);
        }
        let scheduler =
            spawn("livegate-webhooks".into(), Box::new(move || schedule(lanes, woken, jobs)))?;
        let worker = Worker { wake, scheduler, senders, timeout: settings.timeout };
        Ok(Webhooks { shared, worker: Arc::new(Mutex::new(Some(worker))), poster })
    }

    /// Queue a webhook for `event`: written to the store (durable with the next flush) and
    /// sent in its room's turn. When the queue holds `webhook_queue_max`, the new one is
    /// dropped instead (`livegate_webhooks_dropped_total{reason="queue_full"}`, a warning).
    /// Never waits on the network.
    pub fn enqueue(&self, event: WebhookEvent) {
        let shared = &self.shared;
        let id = random_hex(16);
        let record = WebhookRecord {
            room: event.room().to_string(),
            body: event.body(&id, &shared.node),
            id,
        };
        let mut queue = shared.queue.lock();
        if !rules::admits(queue.queued, shared.queue_max) {
            drop(queue);
            shared.metrics.webhook_dropped("queue_full");
            tracing::warn!(
                room = %record.room,
                kind = event.kind().as_str(),
                id = %record.id,
                webhook_queue_max = shared.queue_max,
                "webhook queue full: the new webhook is dropped"
            );
            return;
        }
        let seq = queue.next_seq;
        if let Err(error) = shared.store.webhooks().push(seq, &record) {
            drop(queue);
            tracing::error!(room = %record.room, kind = event.kind().as_str(), %error, "webhook not queued: the store refused it");
            return;
        }
        queue.next_seq += 1;
        queue.queued += 1;
        let occupied = match &event {
            WebhookEvent::RoomOccupied { .. } => Some(true),
            WebhookEvent::RoomVacated { .. } => Some(false),
            WebhookEvent::ClientPublished { .. } => None,
        };
        if let Some(occupied) = occupied.filter(|_| shared.note_occupancy) {
            if let Err(error) = shared.store.webhooks().note_occupancy(&record.room, occupied) {
                tracing::warn!(room = %record.room, %error, "could not note the room's occupancy for a restart");
            }
        }
        shared.metrics.webhooks_queued.set(queue.queued as i64);
        if let Some(wake) = &queue.wake {
            let _ = wake.send(Wake::Queued { room: record.room, seq });
        }
        drop(queue);
        // Durable soon, with whatever else is being written; nothing waits for it.
        drop_flush(&shared.store);
    }

    /// Queue `room_vacated` for every room a previous run told occupied and never
    /// vacated (it was killed with subscribers): at start, before anyone can subscribe, no
    /// room has a subscriber, so each such receiver's room is empty now. Returns how many.
    pub fn vacate_left_over(&self, now_ms: u64) -> Result<usize, WebhookError> {
        let rooms = self.shared.store.webhooks().noted_occupied()?;
        for room in &rooms {
            self.enqueue(WebhookEvent::RoomVacated { room: room.clone(), ts_ms: now_ms });
        }
        if !rooms.is_empty() {
            tracing::info!(
                rooms = rooms.len(),
                "room_vacated queued for the rooms a previous run left occupied"
            );
        }
        Ok(rooms.len())
    }

    /// Send dead letter `id` again now: one attempt, to `webhook_url` as configured now.
    /// Blocks for the attempt (at most `webhook_timeout_ms`).
    pub fn replay(&self, id: &str) -> Result<Replayed, ReplayError> {
        self.shared.dead.replay(id, &self.poster)
    }

    /// Webhooks queued (in flight included).
    pub fn queued(&self) -> usize {
        self.shared.queue.lock().queued
    }

    /// Stop sending: no new attempt starts, and those in flight get a moment to end. What
    /// is queued (and what is queued from now on) stays in the store for the next start.
    pub fn stop(&self) {
        let Some(worker) = self.worker.lock().take() else { return };
        self.shared.queue.lock().wake = None;
        let _ = worker.wake.send(Wake::Stop);
        let _ = worker.scheduler.join();
        let deadline = Instant::now() + STOP_WAIT.min(worker.timeout);
        while worker.senders.iter().any(|sender| !sender.is_finished()) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::info!(queued = self.queued(), "webhooks stopped; the queue stays in the store");
    }
}

/// On one node the webhooks are the rooms' occupancy: each local edge is a webhook.
impl Occupancy for Webhooks {
    fn changed(&self, room: &str, occupied: bool, now_ms: u64) {
        if names::inbox_owner(room).is_some() {
            return;
        }
        let (room, ts_ms) = (room.to_string(), now_ms);
        self.enqueue(if occupied {
            WebhookEvent::RoomOccupied { room, ts_ms }
        } else {
            WebhookEvent::RoomVacated { room, ts_ms }
        });
    }
}

/// The scheduler: starts what is due, sleeps until the next retry is, and hears of new
/// webhooks and of verdicts. Ends on `Stop` (dropping `jobs` ends the senders).
fn schedule(mut lanes: Lanes, woken: mpsc::Receiver<Wake>, jobs: mpsc::Sender<Job>) {
    loop {
        for due in lanes.due(now_ms()) {
            if jobs
                .send(Job {
                    room: due.room,
                    seq: due.seq,
                    retries: due.retries,
                    first_ms: due.first_ms,
                })
                .is_err()
            {
                return;
            }
        }
        let heard = match lanes.next_due() {
            Some(at) => woken.recv_timeout(Duration::from_millis(at.saturating_sub(now_ms()))),
            None => woken.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match heard {
            Ok(Wake::Queued { room, seq }) => lanes.push(&room, seq, now_ms()),
            Ok(Wake::Finished { room, seq, step }) => {
                if let Some(delay) = lanes.finished(&room, seq, step, now_ms(), random_u64()) {
                    tracing::debug!(%room, seq, delay_ms = delay.as_millis() as u64, "webhook retry scheduled");
                }
            }
            Ok(Wake::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// A sender thread: takes a job, makes the attempt, carries out its step on the store
/// and the metrics, and reports it.
struct Sender {
    shared: Arc<Shared>,
    poster: Arc<Poster>,
    jobs: Arc<Mutex<mpsc::Receiver<Job>>>,
    wake: mpsc::Sender<Wake>,
}

impl Sender {
    fn run(self) {
        loop {
            // One sender waits on the channel at a time; the others wait for the lock.
            let job = self.jobs.lock().recv();
            let Ok(job) = job else { return };
            let step = self.attempt(&job);
            if self.wake.send(Wake::Finished { room: job.room, seq: job.seq, step }).is_err() {
                return;
            }
        }
    }

    fn attempt(&self, job: &Job) -> Step {
        let shared = &self.shared;
        let record = match shared.store.webhooks().get(job.seq) {
            Ok(Some(record)) => record,
            // Gone already: nothing to send, its room goes on.
            Ok(None) => return Step::Delivered,
            Err(error) => {
                tracing::error!(room = %job.room, seq = job.seq, %error, "queued webhook unreadable: dropped");
                self.remove(job.seq);
                return Step::Delivered;
            }
        };
        let (attempt, detail) = self.poster.post(&record.id, &record.body);
        let attempts = job.retries.saturating_add(1);
        let step = rules::step(rules::verdict(attempt), attempts, shared.max_attempts);
        match step {
            Step::Delivered => {
                self.remove(job.seq);
                shared.metrics.webhooks_delivered.inc();
                tracing::debug!(room = %record.room, id = %record.id, retries = job.retries, "webhook delivered");
            }
            Step::Retry => {
                shared.metrics.webhook_attempts_failed.inc();
                // The first failure of a webhook is worth a warning; its retries are not.
                if job.retries == 0 {
                    tracing::warn!(room = %record.room, id = %record.id, url = %self.poster.url_for_log, ?attempt, %detail, "webhook attempt failed; retrying with backoff");
                } else {
                    tracing::debug!(room = %record.room, id = %record.id, ?attempt, %detail, retries = job.retries, "webhook attempt failed");
                }
            }
            Step::DeadLetter(reason) => {
                let dead = DeadLetterRecord {
                    kind: protocol::webhook_kind(&record.body).unwrap_or_default(),
                    room: record.room.clone(),
                    url: self.poster.url_for_log.clone(),
                    body: record.body.clone(),
                    attempts: u64::from(attempts),
                    first_attempt_ms: job.first_ms,
                    last_attempt_ms: now_ms(),
                    last_error: rules::describe(attempt, &detail),
                    reason: reason.as_str().to_string(),
                    id: record.id.clone(),
                };
                tracing::warn!(
                    room = %record.room,
                    id = %record.id,
                    attempts,
                    reason = reason.as_str(),
                    last_error = %dead.last_error,
                    "webhook given up: kept as a dead letter (GET /v1/admin/webhooks/dead)"
                );
                match shared.dead.bury(job.seq, &dead, reason) {
                    Ok(()) => self.left_queue(),
                    Err(error) => {
                        tracing::error!(room = %record.room, id = %record.id, %error, "dead letter not kept: the store refused it; the webhook is dropped");
                        self.remove(job.seq);
                    }
                }
            }
        }
        step
    }

    /// Take webhook `seq` off the queue (delivered or given up).
    fn remove(&self, seq: u64) {
        if let Err(error) = self.shared.store.webhooks().remove(seq) {
            // It stays queued and is sent again at the next start: at least once still holds.
            tracing::error!(seq, %error, "webhook done but not removed from the store");
        }
        self.left_queue();
    }

    /// Count one webhook less in the queue.
    fn left_queue(&self) {
        let shared = &self.shared;
        let mut queue = shared.queue.lock();
        queue.queued = queue.queued.saturating_sub(1);
        shared.metrics.webhooks_queued.set(queue.queued as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn raw(text: &str) -> Box<EventData> {
        protocol::event_data(text.to_string()).unwrap()
    }

    #[test]
    fn webhook_bodies() {
        let published =
            |device: Option<&str>, event_id: Option<&str>| WebhookEvent::ClientPublished {
                room: "chat".into(),
                ts_ms: 7,
                user: "u1".into(),
                device: device.map(Into::into),
                seq: 42,
                event_id: event_id.map(Into::into),
                data: raw(r#"{"text":"hi","n":[1,2]}"#),
            };
        let cases = [
            (
                WebhookEvent::RoomOccupied { room: "lobby".into(), ts_ms: 1764650000000 },
                r#"{"id":"w1","type":"room_occupied","room":"lobby","ts_ms":1764650000000,"node":"n1"}"#,
            ),
            (
                WebhookEvent::RoomVacated { room: "a\"b".into(), ts_ms: 2 },
                r#"{"id":"w1","type":"room_vacated","room":"a\"b","ts_ms":2,"node":"n1"}"#,
            ),
            (
                published(Some("web"), Some("e-9")),
                r#"{"id":"w1","type":"client_published","room":"chat","ts_ms":7,"node":"n1","user":"u1","device":"web","seq":42,"event_id":"e-9","data":{"text":"hi","n":[1,2]}}"#,
            ),
            (
                published(None, None),
                r#"{"id":"w1","type":"client_published","room":"chat","ts_ms":7,"node":"n1","user":"u1","seq":42,"data":{"text":"hi","n":[1,2]}}"#,
            ),
        ];
        for (event, want) in cases {
            assert_eq!(event.body("w1", "n1"), want);
        }
    }

    #[test]
    fn webhooks_off_without_a_url() {
        assert!(WebhookSettings::from_config(&Config::default()).is_none());
        let config = Config {
            webhook_url: "http://127.0.0.1:1/h".into(),
            webhook_secret: "s".into(),
            ..Config::default()
        };
        let settings = WebhookSettings::from_config(&config).unwrap();
        assert_eq!(
            (settings.secret.as_slice(), settings.queue_max, settings.timeout),
            (&b"s"[..], 10_000, Duration::from_millis(5000))
        );
    }

    /// The queue in a real store: the bound drops and counts, what is queued is read back
    /// at the next start in order, and an inbox never produces an occupancy webhook.
    #[test]
    fn webhooks_queue_bound_and_resume() {
        let dir = tempfile::tempdir().unwrap();
        // Nothing listens on port 1: every attempt fails and is retried, so all stay queued.
        let settings = WebhookSettings {
            url: "http://127.0.0.1:1/hooks".into(),
            secret: b"s".to_vec(),
            queue_max: 3,
            timeout: Duration::from_millis(200),
            node: "n1".into(),
            max_in_flight: 2,
            max_attempts: 1000,
            retry: rules::RETRY,
            note_occupancy: true,
        };
        {
            let metrics = Arc::new(Metrics::default());
            let store = Store::open(dir.path()).unwrap();
            let dead = DeadLetters::open(store.clone(), metrics.clone(), 10).unwrap();
            let webhooks = Webhooks::start(store, metrics.clone(), settings.clone(), dead).unwrap();
            webhooks.changed("user:bob", true, 1);
            for n in 0..5 {
                webhooks.changed(&format!("r{n}"), true, n);
            }
            assert_eq!(webhooks.queued(), 3);
            assert_eq!(
                metrics
                    .webhooks_dropped
                    .get_or_create(&crate::metrics::ReasonLabel { reason: "queue_full" })
                    .get(),
                2
            );
            assert_eq!(metrics.webhooks_queued.get(), 3);
            webhooks.stop();
            webhooks.stop();
            // Queued after the stop: kept for the next start.
            assert_eq!(webhooks.queued(), 3);
            webhooks.shared.store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let queued = store.webhooks().page(0, 10).unwrap();
        let rooms: Vec<&str> = queued.iter().map(|(_, record)| record.room.as_str()).collect();
        assert_eq!(rooms, ["r0", "r1", "r2"]);
        let body: serde_json::Value = serde_json::from_str(&queued[1].1.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"id": queued[1].1.id, "type": "room_occupied", "room": "r1", "ts_ms": 1, "node": "n1"})
        );
        // Only the rooms whose room_occupied was queued are owed a room_vacated.
        assert_eq!(store.webhooks().noted_occupied().unwrap(), ["r0", "r1", "r2"]);
        let metrics = Arc::new(Metrics::default());
        let dead = DeadLetters::open(store.clone(), metrics.clone(), 10).unwrap();
        let webhooks = Webhooks::start(store, metrics.clone(), settings, dead).unwrap();
        assert_eq!(
            (webhooks.queued(), metrics.webhooks_queued.get()),
            (3, 3),
            "resumed from the store"
        );
        webhooks.changed("r9", false, 9);
        assert_eq!(
            metrics
                .webhooks_dropped
                .get_or_create(&crate::metrics::ReasonLabel { reason: "queue_full" })
                .get(),
            1
        );
        // A room_vacated the full queue dropped leaves its room noted, to be vacated later.
        assert_eq!(webhooks.vacate_left_over(10).unwrap(), 3);
        assert_eq!(webhooks.shared.store.webhooks().noted_occupied().unwrap(), ["r0", "r1", "r2"]);
        webhooks.stop();
    }
}
