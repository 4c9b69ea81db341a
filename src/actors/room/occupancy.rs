//! The room's seam for occupancy: a room tells it when its explicit
//! subscribers on this node go from none to some and back. What follows — a webhook
//! straight away on one node, a cluster-wide decision in cluster mode — is the
//! implementation's business; the room only reports its own edges, in order.
//!
//! [`DelayedVacate`] sits in front of either: a room's `vacated` edge waits
//! `webhook_vacated_delay_ms`, and a room joined again meanwhile reports neither edge
//! (`core::delivery::occupancy::VacateDelay`), so a page reload or a subscribe/unsubscribe loop
//! makes no webhook, and in cluster mode no write of the room's occupancy record either.
//! It holds the edges itself, so a room actor may stop while its `vacated` waits.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::core::delivery::occupancy::VacateDelay;

/// Told of a room's local occupancy edges. Called from the room's actor, so an
/// implementation must not block: queue, or hand the work to a task.
pub trait Occupancy: Send + Sync + 'static {
    /// `room`'s explicit subscribers on this node went from 0 to 1 (`occupied`) or from
    /// 1 to 0 (`!occupied`), at `now_ms`. Inboxes are never reported.
    fn changed(&self, room: &str, occupied: bool, now_ms: u64);
}

/// [`Occupancy`] with each `vacated` edge held back for a delay; a thread of its own
/// passes on those that come due. [`DelayedVacate::stop`] passes on every waiting one.
pub struct DelayedVacate {
    inner: Arc<dyn Occupancy>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    state: Mutex<Waiting>,
    wake: Condvar,
    /// The monotonic clock's zero for [`VacateDelay`]'s due times.
    started: Instant,
}

struct Waiting {
    delay: VacateDelay,
    stopped: bool,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

impl DelayedVacate {
    /// Hold `inner`'s `vacated` edges for `delay` (not zero: then use `inner` itself).
    pub fn start(
        inner: Arc<dyn Occupancy>,
        delay: Duration,
    ) -> std::io::Result<Arc<DelayedVacate>> {
        let shared = Arc::new(Shared {
            state: Mutex::new(Waiting {
                delay: VacateDelay::new(delay.as_millis() as u64),
                stopped: false,
            }),
            wake: Condvar::new(),
            started: Instant::now(),
        });
        let (passing, to) = (shared.clone(), inner.clone());
        let thread = std::thread::Builder::new()
            .name("livegate-vacate".into())
            .spawn(move || pass_due(&passing, to.as_ref()))?;
        Ok(Arc::new(DelayedVacate { inner, shared, thread: Mutex::new(Some(thread)) }))
    }

    /// The node stops (its rooms are gone): every waiting `vacated` is passed on now, in
    /// the order the rooms were left, and the thread ends. Later edges pass at once.
    pub fn stop(&self) {
        {
            let mut state = self.shared.state.lock();
            state.stopped = true;
            for (room, ts_ms) in state.delay.drain() {
                self.inner.changed(&room, false, ts_ms);
            }
        }
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

/// Dropped before a stop (a start that failed later): the thread ends too.
impl Drop for DelayedVacate {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Edges are passed on under the lock, so a room's reach `inner` in the order decided
/// (a `vacated` coming due never overtakes the `occupied` after it); `inner` only queues.
impl Occupancy for DelayedVacate {
    fn changed(&self, room: &str, occupied: bool, now_ms: u64) {
        let mut state = self.shared.state.lock();
        let first = state.delay.next_due().is_none();
        if state.stopped || state.delay.edge(room, occupied, self.shared.now_ms(), now_ms) {
            self.inner.changed(room, occupied, now_ms);
        }
        // The thread sleeps without a deadline only while nothing waits.
        if first && state.delay.next_due().is_some() {
            self.shared.wake.notify_one();
        }
    }
}

/// The thread: pass on the `vacated` edges as they come due, until stopped.
fn pass_due(shared: &Shared, inner: &dyn Occupancy) {
    let mut state = shared.state.lock();
    loop {
        if state.stopped {
            return;
        }
        for (room, ts_ms) in state.delay.due(shared.now_ms()) {
            inner.changed(&room, false, ts_ms);
        }
        match state.delay.next_due() {
            Some(at) => {
                let wait = Duration::from_millis(at.saturating_sub(shared.now_ms()));
                shared.wake.wait_for(&mut state, wait);
            }
            None => shared.wake.wait(&mut state),
        }
    }
}
