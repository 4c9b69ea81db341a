//! A cell's circuit breaker: the health the route will use for a cell, fed by its probes
//! (a real write and read through the cell's store). Pure: each probe's outcome comes
//! with `now`.
//!
//! - **Closed** (the cell serves): [`OPEN_AFTER`] failed probes in a row open it; a pass
//!   resets the count.
//! - **Open** (the cell serves nobody): probes are still fed, but nothing closes it before
//!   [`COOL_DOWN_MS`] has passed since it opened; the first probe after that makes it
//!   half-open (a failure there opens it again, with a new cool-down).
//! - **HalfOpen** (on trial, still not serving): [`CLOSE_AFTER`] passes in a row close
//!   it; one failure opens it again.
//!
//! So opening needs [`OPEN_AFTER`] failures in a row, and closing needs the cool-down and
//! then [`CLOSE_AFTER`] passes: never Closed straight from Open. With probes every second
//! a dead cell is out within 3 s and a recovered one back within about 13 s.

/// Failed probes in a row that open a closed breaker.
pub const OPEN_AFTER: u32 = 3;
/// Passing probes in a row that close a half-open breaker.
pub const CLOSE_AFTER: u32 = 3;
/// How long an open breaker stays open before a probe may try it (half-open).
pub const COOL_DOWN_MS: u64 = 10_000;

/// Where a breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The cell serves; `failures` in a row so far.
    Closed { failures: u32 },
    /// The cell serves nobody since `since_ms`.
    Open { since_ms: u64 },
    /// On trial: `passes` in a row so far; serves nobody until closed.
    HalfOpen { passes: u32 },
}

impl State {
    /// Its name, for metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            State::Closed { .. } => "closed",
            State::Open { .. } => "open",
            State::HalfOpen { .. } => "half_open",
        }
    }
}

/// One cell's breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breaker {
    state: State,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker::new()
    }
}

impl Breaker {
    /// A closed breaker: a cell serves until its probes say otherwise.
    pub fn new() -> Breaker {
        Breaker { state: State::Closed { failures: 0 } }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// Whether the route may send users to the cell: only while closed.
    pub fn healthy(&self) -> bool {
        matches!(self.state, State::Closed { .. })
    }

    /// A probe's outcome at `now_ms`; returns the new state when it changed kind (a
    /// transition to log and count), `None` otherwise.
    pub fn probed(&mut self, passed: bool, now_ms: u64) -> Option<State> {
        let before = self.state;
        self.state = match (before, passed) {
            (State::Closed { .. }, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 >= OPEN_AFTER => State::Open { since_ms: now_ms },
            (State::Closed { failures }, false) => State::Closed { failures: failures + 1 },
            (State::Open { since_ms }, _) if now_ms < since_ms.saturating_add(COOL_DOWN_MS) => before,
            // The cool-down is over: this probe is the first of the trial.
            (State::Open { .. }, true) => Breaker::trial(1),
            (State::Open { .. }, false) => State::Open { since_ms: now_ms },
            (State::HalfOpen { passes }, true) => Breaker::trial(passes + 1),
            (State::HalfOpen { .. }, false) => State::Open { since_ms: now_ms },
        };
        (std::mem::discriminant(&before) != std::mem::discriminant(&self.state)).then_some(self.state)
    }

    /// Half-open after `passes` in a row, or closed once they are [`CLOSE_AFTER`].
    fn trial(passes: u32) -> State {
        if passes >= CLOSE_AFTER {
            State::Closed { failures: 0 }
        } else {
            State::HalfOpen { passes }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `(passed, at_ms)` probes; returns the state names after each.
    fn run(probes: &[(bool, u64)]) -> Vec<&'static str> {
        let mut breaker = Breaker::new();
        probes.iter().map(|&(passed, at)| {
            breaker.probed(passed, at);
            breaker.state().name()
        }).collect()
    }

    #[test]
    fn table() {
        const F: bool = false;
        const P: bool = true;
        let cases: &[(&str, &[(bool, u64)], &[&str])] = &[
            ("passes stay closed", &[(P, 0), (P, 1000)], &["closed", "closed"]),
            ("two failures do not open", &[(F, 0), (F, 1000)], &["closed", "closed"]),
            ("three in a row open", &[(F, 0), (F, 1000), (F, 2000)], &["closed", "closed", "open"]),
            ("a pass resets the count", &[(F, 0), (F, 1), (P, 2), (F, 3), (F, 4)], &["closed"; 5]),
            (
                "open until the cool-down, passes or not",
                &[(F, 0), (F, 1), (F, 2), (P, 3), (P, 9_999), (P, 10_002)],
                &["closed", "closed", "open", "open", "open", "half_open"],
            ),
            (
                "half-open closes after three passes",
                &[(F, 0), (F, 1), (F, 2), (P, 10_002), (P, 11_000), (P, 12_000)],
                &["closed", "closed", "open", "half_open", "half_open", "closed"],
            ),
            (
                "a failure half-open opens again, with a new cool-down",
                &[(F, 0), (F, 1), (F, 2), (P, 10_002), (F, 11_000), (P, 20_000), (P, 21_000)],
                &["closed", "closed", "open", "half_open", "open", "open", "half_open"],
            ),
            (
                "a failure after the cool-down stays open, cool-down restarted",
                &[(F, 0), (F, 1), (F, 2), (F, 10_002), (P, 20_001), (P, 20_002)],
                &["closed", "closed", "open", "open", "open", "half_open"],
            ),
        ];
        for (name, probes, expected) in cases {
            assert_eq!(run(probes), expected.to_vec(), "{name}");
        }
    }

    #[test]
    fn transitions_are_reported_once_and_health_is_closed_only() {
        let mut breaker = Breaker::new();
        assert!(breaker.healthy());
        assert_eq!(breaker.probed(false, 0), None);
        assert_eq!(breaker.probed(false, 1), None);
        assert_eq!(breaker.probed(false, 2), Some(State::Open { since_ms: 2 }));
        assert!(!breaker.healthy());
        assert_eq!(breaker.probed(false, 3), None, "still open: no transition");
        assert_eq!(breaker.probed(true, 10_002), Some(State::HalfOpen { passes: 1 }));
        assert!(!breaker.healthy(), "on trial, not serving");
        assert_eq!(breaker.probed(true, 10_003), None);
        assert_eq!(breaker.probed(true, 10_004), Some(State::Closed { failures: 0 }));
        assert!(breaker.healthy());
    }

    proptest! {
        /// Never Closed straight from Open; opening needs OPEN_AFTER failures in a row;
        /// closing needs CLOSE_AFTER passes in a row, the first at least COOL_DOWN_MS
        /// after the opening.
        #[test]
        fn never_closed_from_open_and_opening_needs_n_failures(
            probes in proptest::collection::vec((any::<bool>(), 0u64..6_000), 1..200),
        ) {
            let mut breaker = Breaker::new();
            let mut now = 0u64;
            let mut failures_in_a_row = 0u32;
            let mut passes_in_a_row = 0u32;
            let mut opened_at = None;
            for (passed, step) in probes {
                now += step;
                let before = breaker.state();
                breaker.probed(passed, now);
                let after = breaker.state();
                if passed { passes_in_a_row += 1; failures_in_a_row = 0 } else { failures_in_a_row += 1; passes_in_a_row = 0 }
                if let (State::Open { .. }, State::Closed { .. }) = (before, after) {
                    prop_assert!(false, "closed straight from open at {now}");
                }
                if let (State::Closed { .. }, State::Open { .. }) = (before, after) {
                    prop_assert!(failures_in_a_row >= OPEN_AFTER, "opened after {failures_in_a_row} failures");
                    opened_at = Some(now);
                }
                if let (State::HalfOpen { .. }, State::Open { .. }) | (State::Open { .. }, State::Open { .. }) = (before, after) {
                    if before != after { opened_at = Some(now); }
                }
                if let (State::HalfOpen { .. }, State::Closed { .. }) = (before, after) {
                    prop_assert!(passes_in_a_row >= CLOSE_AFTER, "closed after {passes_in_a_row} passes");
                    let opened = opened_at.expect("was open");
                    prop_assert!(now >= opened + COOL_DOWN_MS, "closed {}ms after opening", now - opened);
                }
                prop_assert_eq!(breaker.healthy(), matches!(after, State::Closed { .. }));
            }
        }
    }
}
