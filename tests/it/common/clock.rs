//! Time in the tests: the only place they sleep. A test waits for something it can
//! observe by polling it ([`wait_until`], [`wait_for`] and their `_every`/`_async`
//! kin), spreads load over time on purpose through [`Pacer`] or [`pace`], and lets the
//! product's own clock run through [`let_time_pass`] where the elapsed time is the
//! behaviour under test (a token's expiry, a TTL, a delay before which nothing may
//! happen). Each pace and each wait for the clock says why; `tests/count-sleeps` counts
//! them apart and fails on any other sleep.

use std::future::Future;
use std::time::{Duration, Instant};

/// The pause between two looks of a poll.
const POLL_EVERY: Duration = Duration::from_millis(10);

/// Polls `cond` (blocking, every 10 ms) until it holds; false after `within`.
pub fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    wait_for(within, || cond().then_some(())).is_some()
}

/// [`wait_until`] looking every `every`, for a condition that costs (several requests).
pub fn wait_until_every(within: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    wait_for_every(within, every, || cond().then_some(())).is_some()
}

/// Polls `look` (blocking, every 10 ms) until it finds something; `None` after `within`.
pub fn wait_for<T>(within: Duration, look: impl FnMut() -> Option<T>) -> Option<T> {
    wait_for_every(within, POLL_EVERY, look)
}

/// [`wait_for`] looking every `every`, for a look that costs (several requests, a log).
pub fn wait_for_every<T>(
    within: Duration,
    every: Duration,
    mut look: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = look() {
            return Some(found);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// [`wait_until_every`] for a condition that awaits (a request, a read of the bucket).
pub async fn wait_until_every_async<F: Future<Output = bool>>(
    within: Duration,
    every: Duration,
    mut cond: impl FnMut() -> F,
) -> bool {
    wait_for_every_async(within, every, || {
        let checked = cond();
        async move { checked.await.then_some(()) }
    })
    .await
    .is_some()
}

/// [`wait_for_every`] for a look that awaits.
pub async fn wait_for_every_async<T, F: Future<Output = Option<T>>>(
    within: Duration,
    every: Duration,
    mut look: impl FnMut() -> F,
) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = look().await {
            return Some(found);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Paces a loop at one round per `every` (a publisher's steady rate): [`Pacer::wait`]
/// sleeps until the next round is due; a late round starts at once and the schedule
/// goes on from it, without bursts to catch up.
pub struct Pacer {
    every: Duration,
    next_due: Instant,
}

impl Pacer {
    pub fn new(every: Duration) -> Pacer {
        Pacer { every, next_due: Instant::now() }
    }

    pub fn wait(&mut self) {
        let now = Instant::now();
        if self.next_due > now {
            std::thread::sleep(self.next_due - now);
        }
        self.next_due = self.next_due.max(now) + self.every;
    }
}

/// Spreads load over time on purpose: the test's own load (publishers, clients, a slow
/// writer) runs for `d` while this thread waits. `why` says what is being spread.
pub fn pace(d: Duration, why: &str) {
    let _ = why;
    std::thread::sleep(d);
}

/// [`pace`] in async code.
pub async fn pace_async(d: Duration, why: &str) {
    let _ = why;
    tokio::time::sleep(d).await;
}

/// Waits until `due` (a schedule's next step; at once when it is past), pacing a loop
/// that keeps to a timetable from its start rather than a period between rounds.
pub fn pace_until(due: Instant, why: &str) {
    pace(due.saturating_duration_since(Instant::now()), why);
}

/// Lets the product's clock run for `d` where the elapsed time is the behaviour under
/// test and nothing can be polled before it (a token's expiry, a TTL, a grace, "nothing
/// happens within X"). `why` names the product's time being waited for.
pub fn let_time_pass(d: Duration, why: &str) {
    let _ = why;
    std::thread::sleep(d);
}

/// [`let_time_pass`], running `check` every `every` meanwhile: an invariant that must
/// hold all through the product's time (a dead peer stays unrouted for three probes).
pub fn let_time_pass_checking(d: Duration, every: Duration, why: &str, mut check: impl FnMut()) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        check();
        let_time_pass(every.min(until.saturating_duration_since(Instant::now())), why);
    }
}

/// [`let_time_pass`] in async code.
pub async fn let_time_pass_async(d: Duration, why: &str) {
    let _ = why;
    tokio::time::sleep(d).await;
}

/// [`let_time_pass`] until the instant `until` (at once when it is past).
pub fn let_time_pass_until(until: Instant, why: &str) {
    let_time_pass(until.saturating_duration_since(Instant::now()), why);
}
