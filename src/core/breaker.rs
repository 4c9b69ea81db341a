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
//!
//! [`CellBreakers`] holds one breaker per configured cell and feeds each, once a round,
//! with the AND of every report of that cell's nodes (a cell passes a round only if every
//! node that reported passed its probe; a round without a report feeds nothing).

/// Failed probes in a row that open a closed breaker.
pub const OPEN_AFTER: u32 = 3;
/// Passing probes in a row that close a half-open breaker.
pub const CLOSE_AFTER: u32 = 3;
/// How long an open breaker stays open before a probe may try it (half-open).
pub const COOL_DOWN_MS: u64 = 10_000;

/// Every [`State::name`].
pub const STATE_NAMES: &[&str] = &["closed", "half_open", "open"];

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

/// One breaker per configured cell (at most the configuration's `MAX_CELLS`): a cell
/// nobody configured gets none, whatever a peer reports.
#[derive(Debug, Clone, Default)]
pub struct CellBreakers {
    cells: std::collections::BTreeMap<String, Breaker>,
}

/// A breaker's change of state in a round: log it and count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub cell: String,
    pub from: &'static str,
    pub to: State,
}

impl CellBreakers {
    /// Closed breakers for `cells`.
    pub fn new<'a>(cells: impl IntoIterator<Item = &'a str>) -> CellBreakers {
        CellBreakers { cells: cells.into_iter().map(|c| (c.to_string(), Breaker::new())).collect() }
    }

    /// One round at `now_ms`: `reports` are (cell, probe passed) from every node heard now
    /// (this one included), in any order and with repeats; each configured cell with a
    /// report is fed the AND of its reports. Returns the transitions, by cell name.
    pub fn round<'a>(&mut self, reports: impl IntoIterator<Item = (&'a str, bool)>, now_ms: u64) -> Vec<Transition> {
        let mut merged: std::collections::BTreeMap<&str, bool> = std::collections::BTreeMap::new();
        for (cell, passed) in reports {
            if self.cells.contains_key(cell) {
                *merged.entry(cell).or_insert(true) &= passed;
            }
        }
        let mut transitions = Vec::new();
        for (cell, passed) in merged {
            let breaker = self.cells.get_mut(cell).expect("only configured cells are merged");
            let from = breaker.state().name();
            if let Some(to) = breaker.probed(passed, now_ms) {
                transitions.push(Transition { cell: cell.to_string(), from, to });
            }
        }
        transitions
    }

    /// The cells whose breaker is not closed: the route counts them unhealthy.
    pub fn broken(&self) -> Vec<&str> {
        self.cells.iter().filter(|(_, b)| !b.healthy()).map(|(c, _)| c.as_str()).collect()
    }

    /// Every configured cell's state, by name.
    pub fn states(&self) -> impl Iterator<Item = (&str, State)> {
        self.cells.iter().map(|(c, b)| (c.as_str(), b.state()))
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

    #[test]
    fn cells_are_fed_the_and_of_their_reports() {
        let mut cells = CellBreakers::new(["eu", "us"]);
        // eu: one node passes, one fails: the cell fails the round. us passes.
        for round in 0..2u64 {
            let t = cells.round([("eu", true), ("us", true), ("eu", false)], round * 1000);
            assert_eq!(t, vec![], "round {round}");
        }
        let t = cells.round([("eu", false), ("eu", true), ("us", true), ("mars", false)], 2000);
        assert_eq!(t, vec![Transition { cell: "eu".into(), from: "closed", to: State::Open { since_ms: 2000 } }]);
        assert_eq!(cells.broken(), vec!["eu"]);
        // A round without a report of eu feeds it nothing; a cell nobody configured has no breaker.
        assert_eq!(cells.round([("us", true), ("mars", false)], 20_000), vec![]);
        assert_eq!(cells.states().map(|(c, _)| c).collect::<Vec<_>>(), vec!["eu", "us"]);
        // Recovery: every report passes, after the cool-down, CLOSE_AFTER rounds.
        let mut closed_at = None;
        for round in 0..CLOSE_AFTER as u64 {
            for t in cells.round([("eu", true), ("eu", true)], 20_000 + round * 1000) {
                closed_at = (t.to == State::Closed { failures: 0 }).then_some(round);
            }
        }
        assert_eq!(closed_at, Some(CLOSE_AFTER as u64 - 1));
        assert!(cells.broken().is_empty());
    }

    proptest! {
        /// A round's answer ignores the order and repetition of its reports.
        #[test]
        fn rounds_ignore_report_order(
            rounds in proptest::collection::vec(proptest::collection::vec((0usize..3, any::<bool>()), 0..8), 1..20),
        ) {
            let names = ["a", "b", "c"];
            let (mut forward, mut backward) = (CellBreakers::new(names), CellBreakers::new(names));
            for (i, reports) in rounds.iter().enumerate() {
                let now = i as u64 * 4000;
                let f = forward.round(reports.iter().map(|&(c, p)| (names[c], p)), now);
                let b = backward.round(reports.iter().rev().chain(reports.iter()).map(|&(c, p)| (names[c], p)), now);
                prop_assert_eq!(f, b);
            }
        }

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
