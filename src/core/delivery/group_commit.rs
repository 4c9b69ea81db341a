//! Group commit with a floor on the spacing of flushes, for the handshakes' durability
//! (a spent nonce and the session record are flushed before the 101): every request that
//! arrives while a flush is in flight, or before `spacing` has passed since the last one
//! started, waits for the next flush, and one flush serves them all. An idle node flushes
//! a lone request at once; a flood of handshakes gets at most one flush per `spacing`
//! instead of one for every few handshakes. Pure: the driver (`http::durable`) passes
//! `now`, starts the flushes and arms the timer this returns.

use std::time::{Duration, Instant};

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Start one flush now for the `requests` waiting (all of them).
    Flush { requests: usize },
    /// Arm the one timer for this instant and call [`GroupCommit::timer`] then.
    WaitUntil(Instant),
    /// Nothing now: the flush in flight, or the timer armed, takes the waiting requests on.
    Idle,
}

#[derive(Debug, Clone)]
pub struct GroupCommit {
    spacing: Duration,
    /// Requests waiting for a flush that has not started.
    waiting: usize,
    in_flight: bool,
    /// A timer is armed (at most one).
    armed: bool,
    last_started: Option<Instant>,
}

impl GroupCommit {
    pub fn new(spacing: Duration) -> Self {
        GroupCommit { spacing, waiting: 0, in_flight: false, armed: false, last_started: None }
    }

    /// A request for durability of everything written before it, at `now`.
    pub fn join(&mut self, now: Instant) -> Next {
        self.waiting += 1;
        self.next(now)
    }

    /// The flush in flight is done (successfully or not) at `now`.
    pub fn flushed(&mut self, now: Instant) -> Next {
        self.in_flight = false;
        self.next(now)
    }

    /// The timer armed by [`Next::WaitUntil`] fired at `now`.
    pub fn timer(&mut self, now: Instant) -> Next {
        self.armed = false;
        self.next(now)
    }

    /// Requests waiting for a flush that has not started.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    fn next(&mut self, now: Instant) -> Next {
        if self.waiting == 0 || self.in_flight || self.armed {
            return Next::Idle;
        }
        let due = self.last_started.map(|last| last + self.spacing);
        match due {
            Some(due) if now < due => {
                self.armed = true;
                Next::WaitUntil(due)
            }
            _ => {
                self.in_flight = true;
                self.last_started = Some(now);
                Next::Flush { requests: std::mem::take(&mut self.waiting) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPACING: Duration = Duration::from_millis(2);

    fn ms(base: Instant, n: u64) -> Instant {
        base + Duration::from_millis(n)
    }

    #[derive(Debug, Clone, Copy)]
    enum Event {
        Join,
        Flushed,
        Timer,
    }

    /// Each row: (event, at ms, what comes out, requests still waiting).
    #[test]
    fn requests_share_flushes_at_most_one_per_spacing() {
        use Event::*;
        let base = Instant::now();
        let table: &[(Event, u64, Next, usize)] = &[
            // An idle node flushes the first request at once.
            (Join, 0, Next::Flush { requests: 1 }, 0),
            // Requests while it is in flight wait for the next one.
            (Join, 0, Next::Idle, 1),
            (Join, 1, Next::Idle, 2),
            // Done after the spacing: the next starts at once with both.
            (Flushed, 3, Next::Flush { requests: 2 }, 0),
            (Join, 3, Next::Idle, 1),
            // Done before the spacing since the last start (3): wait until 5.
            (Flushed, 4, Next::WaitUntil(ms(base, 5)), 1),
            (Join, 4, Next::Idle, 2),
            (Timer, 5, Next::Flush { requests: 2 }, 0),
            (Flushed, 6, Next::Idle, 0),
            // Long after: at once again.
            (Join, 50, Next::Flush { requests: 1 }, 0),
            (Flushed, 51, Next::Idle, 0),
            // Too soon after the last start (50): one timer for every joiner.
            (Join, 51, Next::WaitUntil(ms(base, 52)), 1),
            (Join, 51, Next::Idle, 2),
            (Timer, 52, Next::Flush { requests: 2 }, 0),
            // A timer with nobody waiting (cannot happen, but harmless).
            (Flushed, 60, Next::Idle, 0),
            (Timer, 61, Next::Idle, 0),
        ];
        let mut group = GroupCommit::new(SPACING);
        for (row, &(event, at, expected, waiting)) in table.iter().enumerate() {
            let now = ms(base, at);
            let next = match event {
                Join => group.join(now),
                Flushed => group.flushed(now),
                Timer => group.timer(now),
            };
            assert_eq!(
                (next, group.waiting()),
                (expected, waiting),
                "row {row}: {event:?} at {at} ms"
            );
        }
    }

    #[test]
    fn zero_spacing_is_plain_group_commit() {
        let now = Instant::now();
        let mut group = GroupCommit::new(Duration::ZERO);
        assert_eq!(group.join(now), Next::Flush { requests: 1 });
        assert_eq!(group.join(now), Next::Idle);
        assert_eq!(group.join(now), Next::Idle);
        assert_eq!(group.flushed(now), Next::Flush { requests: 2 });
        assert_eq!(group.flushed(now), Next::Idle);
    }

    /// Every request is served by exactly one flush that started after it joined, and
    /// flushes start at least `spacing` apart, whatever the interleaving.
    #[test]
    fn every_request_is_served_once_by_a_later_flush() {
        let base = Instant::now();
        let mut group = GroupCommit::new(SPACING);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut roll = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let (mut joined, mut served) = (0usize, 0usize);
        let (mut in_flight, mut timer): (bool, Option<Instant>) = (false, None);
        let mut last_start: Option<Instant> = None;
        let mut now = base;
        for _ in 0..10_000 {
            now += Duration::from_micros(roll(700));
            let next = match roll(3) {
                0 => {
                    joined += 1;
                    group.join(now)
                }
                1 if in_flight => {
                    in_flight = false;
                    group.flushed(now)
                }
                _ => match timer {
                    Some(at) if now >= at => {
                        timer = None;
                        group.timer(now)
                    }
                    _ => Next::Idle,
                },
            };
            match next {
                Next::Flush { requests } => {
                    assert!(!in_flight && timer.is_none());
                    if let Some(last) = last_start {
                        assert!(now >= last + SPACING, "flushes closer than the spacing");
                    }
                    assert!(requests > 0);
                    (in_flight, last_start) = (true, Some(now));
                    served += requests;
                }
                Next::WaitUntil(at) => {
                    assert!(timer.is_none() && !in_flight && at > now);
                    timer = Some(at);
                }
                Next::Idle => {}
            }
            assert_eq!(served + group.waiting(), joined);
        }
    }
}
