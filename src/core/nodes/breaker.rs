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
//! node that reported passed its probe; a round without a report feeds nothing). For the
//! operator (`GET /v1/admin/cells`, `livegate cells`) it keeps each cell's recent past,
//! bounded: the last [`HISTORY_ROUNDS`] rounds it fed (when, the merged outcome, how many
//! nodes reported, which failed: at most [`MAX_FAILED_NAMED`] named) and the last
//! [`HISTORY_CHANGES`] transitions.

use std::collections::{BTreeMap, VecDeque};

/// Failed probes in a row that open a closed breaker.
pub const OPEN_AFTER: u32 = 3;
/// Passing probes in a row that close a half-open breaker.
pub const CLOSE_AFTER: u32 = 3;
/// How long an open breaker stays open before a probe may try it (half-open).
pub const COOL_DOWN_MS: u64 = 10_000;

/// Rounds of each cell's history kept (oldest dropped first).
pub const HISTORY_ROUNDS: usize = 20;
/// Transitions of each cell's breaker kept (oldest dropped first).
pub const HISTORY_CHANGES: usize = 10;
/// Failed nodes named in one round of the history (the rest are only counted).
pub const MAX_FAILED_NAMED: usize = 8;

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
            (State::Closed { failures }, false) if failures + 1 >= OPEN_AFTER => {
                State::Open { since_ms: now_ms }
            }
            (State::Closed { failures }, false) => State::Closed { failures: failures + 1 },
            (State::Open { since_ms }, _) if now_ms < since_ms.saturating_add(COOL_DOWN_MS) => {
                before
            }
            // The cool-down is over: this probe is the first of the trial.
            (State::Open { .. }, true) => Breaker::trial(1),
            (State::Open { .. }, false) => State::Open { since_ms: now_ms },
            (State::HalfOpen { passes }, true) => Breaker::trial(passes + 1),
            (State::HalfOpen { .. }, false) => State::Open { since_ms: now_ms },
        };
        (std::mem::discriminant(&before) != std::mem::discriminant(&self.state))
            .then_some(self.state)
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

/// One breaker per configured cell (at most the configuration's `MAX_CELLS`), with its
/// bounded history: a cell nobody configured gets none, whatever a peer reports.
#[derive(Debug, Clone, Default)]
pub struct CellBreakers {
    cells: BTreeMap<String, Cell>,
}

#[derive(Debug, Clone)]
struct Cell {
    breaker: Breaker,
    /// When the breaker entered its state (its last transition, else the start).
    since_ms: u64,
    rounds: VecDeque<Round>,
    changes: VecDeque<Change>,
}

/// One node's probe outcome, as a round takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report<'a> {
    pub cell: &'a str,
    pub node: &'a str,
    pub passed: bool,
}

/// A round that fed a cell's breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub at_ms: u64,
    /// The AND of the reports: what the breaker was fed.
    pub passed: bool,
    /// Nodes that reported (each counted once).
    pub reports: u32,
    /// Nodes whose report failed.
    pub failures: u32,
    /// The first [`MAX_FAILED_NAMED`] of them by name.
    pub failed: Vec<String>,
}

/// A breaker's transition, as the history keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub at_ms: u64,
    pub from: &'static str,
    pub to: &'static str,
}

/// A cell's breaker and its recent past ([`CellBreakers::views`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellView {
    pub cell: String,
    pub state: State,
    /// When it entered `state`.
    pub since_ms: u64,
    /// Oldest first, at most [`HISTORY_ROUNDS`].
    pub rounds: Vec<Round>,
    /// Oldest first, at most [`HISTORY_CHANGES`].
    pub changes: Vec<Change>,
}

/// Appends `item`, dropping the oldest beyond `max`.
fn push_bounded<T>(queue: &mut VecDeque<T>, item: T, max: usize) {
    if queue.len() == max {
        queue.pop_front();
    }
    queue.push_back(item);
}

/// A breaker's change of state in a round: log it and count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub cell: String,
    pub from: &'static str,
    pub to: State,
}

impl CellBreakers {
    /// Closed breakers for `cells`, closed since `now_ms`.
    pub fn new<'a>(cells: impl IntoIterator<Item = &'a str>, now_ms: u64) -> CellBreakers {
        let cell = || Cell {
            breaker: Breaker::new(),
            since_ms: now_ms,
            rounds: VecDeque::new(),
            changes: VecDeque::new(),
        };
        CellBreakers { cells: cells.into_iter().map(|c| (c.to_string(), cell())).collect() }
    }

    /// One round at `now_ms`: `reports` from every node heard now (this one included), in
    /// any order and with repeats; each configured cell with a report is fed the AND of
    /// its nodes' reports (a node with a failed report fails), and the round is kept in
    /// its history. Returns the transitions, by cell name.
    pub fn round<'a>(
        &mut self,
        reports: impl IntoIterator<Item = Report<'a>>,
        now_ms: u64,
    ) -> Vec<Transition> {
        // cell → node → passed (every report of it).
        let mut merged: BTreeMap<&str, BTreeMap<&str, bool>> = BTreeMap::new();
        for Report { cell, node, passed } in reports {
            if self.cells.contains_key(cell) {
                *merged.entry(cell).or_default().entry(node).or_insert(true) &= passed;
            }
        }
        let mut transitions = Vec::new();
        for (name, nodes) in merged {
            let cell = self.cells.get_mut(name).expect("only configured cells are merged");
            let failed: Vec<&str> =
                nodes.iter().filter(|(_, passed)| !**passed).map(|(node, _)| *node).collect();
            let passed = failed.is_empty();
            let round = Round {
                at_ms: now_ms,
                passed,
                reports: nodes.len() as u32,
                failures: failed.len() as u32,
                failed: failed.iter().take(MAX_FAILED_NAMED).map(|node| node.to_string()).collect(),
            };
            push_bounded(&mut cell.rounds, round, HISTORY_ROUNDS);
            let from = cell.breaker.state().name();
            if let Some(to) = cell.breaker.probed(passed, now_ms) {
                cell.since_ms = now_ms;
                push_bounded(
                    &mut cell.changes,
                    Change { at_ms: now_ms, from, to: to.name() },
                    HISTORY_CHANGES,
                );
                transitions.push(Transition { cell: name.to_string(), from, to });
            }
        }
        transitions
    }

    /// The cells whose breaker is not closed: the route counts them unhealthy.
    pub fn broken(&self) -> Vec<&str> {
        self.cells
            .iter()
            .filter(|(_, c)| !c.breaker.healthy())
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Every configured cell's state, by name.
    pub fn states(&self) -> impl Iterator<Item = (&str, State)> {
        self.cells.iter().map(|(name, c)| (name.as_str(), c.breaker.state()))
    }

    /// Every configured cell's breaker and history, by name.
    pub fn views(&self) -> Vec<CellView> {
        self.cells
            .iter()
            .map(|(name, c)| CellView {
                cell: name.clone(),
                state: c.breaker.state(),
                since_ms: c.since_ms,
                rounds: c.rounds.iter().cloned().collect(),
                changes: c.changes.iter().copied().collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r<'a>(cell: &'a str, node: &'a str, passed: bool) -> Report<'a> {
        Report { cell, node, passed }
    }

    /// Feeds `(passed, at_ms)` probes; returns the state names after each.
    fn run(probes: &[(bool, u64)]) -> Vec<&'static str> {
        let mut breaker = Breaker::new();
        probes
            .iter()
            .map(|&(passed, at)| {
                breaker.probed(passed, at);
                breaker.state().name()
            })
            .collect()
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
        let mut cells = CellBreakers::new(["eu", "us"], 0);
        // eu: one node passes, one fails: the cell fails the round. us passes.
        for round in 0..2u64 {
            let t = cells.round(
                [r("eu", "e1", true), r("us", "u1", true), r("eu", "e2", false)],
                round * 1000,
            );
            assert_eq!(t, vec![], "round {round}");
        }
        let t = cells.round(
            [
                r("eu", "e2", false),
                r("eu", "e1", true),
                r("us", "u1", true),
                r("mars", "m1", false),
            ],
            2000,
        );
        assert_eq!(
            t,
            vec![Transition {
                cell: "eu".into(),
                from: "closed",
                to: State::Open { since_ms: 2000 }
            }]
        );
        assert_eq!(cells.broken(), vec!["eu"]);
        // A round without a report of eu feeds it nothing; a cell nobody configured has no breaker.
        assert_eq!(cells.round([r("us", "u1", true), r("mars", "m1", false)], 20_000), vec![]);
        assert_eq!(cells.states().map(|(c, _)| c).collect::<Vec<_>>(), vec!["eu", "us"]);
        // Recovery: every report passes, after the cool-down, CLOSE_AFTER rounds.
        let mut closed_at = None;
        for round in 0..CLOSE_AFTER as u64 {
            for t in cells.round([r("eu", "e1", true), r("eu", "e2", true)], 20_000 + round * 1000)
            {
                closed_at = (t.to == State::Closed { failures: 0 }).then_some(round);
            }
        }
        assert_eq!(closed_at, Some(CLOSE_AFTER as u64 - 1));
        assert!(cells.broken().is_empty());
    }

    #[test]
    fn history_keeps_the_last_rounds_and_transitions_with_failed_nodes_named() {
        let mut cells = CellBreakers::new(["eu", "us"], 5);
        let view =
            |cells: &CellBreakers| cells.views().into_iter().find(|v| v.cell == "eu").expect("eu");
        assert_eq!(
            view(&cells),
            CellView {
                cell: "eu".into(),
                state: State::Closed { failures: 0 },
                since_ms: 5,
                rounds: vec![],
                changes: vec![]
            }
        );
        // A round: two nodes, one failed (reported twice, once passing: it failed).
        cells.round(
            [r("eu", "e2", false), r("eu", "e1", true), r("eu", "e2", true), r("us", "u1", true)],
            1000,
        );
        let round = Round {
            at_ms: 1000,
            passed: false,
            reports: 2,
            failures: 1,
            failed: vec!["e2".into()],
        };
        assert_eq!(view(&cells).rounds, vec![round]);
        cells.round([r("eu", "e1", false)], 1500);
        // Many failed nodes: counted, the first MAX_FAILED_NAMED named by name.
        let names: Vec<String> = (0..12).map(|i| format!("n{i:02}")).collect();
        cells.round(names.iter().rev().map(|n| r("eu", n, false)), 2000);
        let last = view(&cells).rounds.pop().expect("a round");
        assert_eq!(
            (last.reports, last.failures, last.failed),
            (12, 12, names[..MAX_FAILED_NAMED].to_vec())
        );
        let v = view(&cells);
        assert_eq!(
            (v.state, v.since_ms),
            (State::Open { since_ms: 2000 }, 2000),
            "opened by the third failed round"
        );
        assert_eq!(v.changes, vec![Change { at_ms: 2000, from: "closed", to: "open" }]);
        // Bounded: only the last HISTORY_ROUNDS rounds and HISTORY_CHANGES transitions.
        let mut now = 2000;
        for _ in 0..30 {
            now += COOL_DOWN_MS + 1;
            cells.round([r("eu", "e1", true)], now); // half-open
            cells.round([r("eu", "e1", false)], now + 1); // open again
        }
        let v = view(&cells);
        assert_eq!(v.rounds.len(), HISTORY_ROUNDS);
        assert_eq!(
            v.rounds.last().map(|r| (r.at_ms, r.passed)),
            Some((now + 1, false)),
            "newest last"
        );
        assert_eq!(v.changes.len(), HISTORY_CHANGES);
        assert_eq!(
            v.changes.last(),
            Some(&Change { at_ms: now + 1, from: "half_open", to: "open" })
        );
        assert_eq!(
            v.changes[0],
            Change { at_ms: now - 4 * (COOL_DOWN_MS + 1), from: "open", to: "half_open" },
            "oldest kept: five cycles ago"
        );
        // A cell without reports has no rounds; us passed its one round.
        let us = cells.views().into_iter().find(|v| v.cell == "us").expect("us");
        assert_eq!(us.rounds.len(), 1);
        assert!(us.rounds[0].passed && us.changes.is_empty());
    }

    proptest! {
        /// A round's answer, and the history it leaves, ignore the order and repetition
        /// of its reports.
        #[test]
        fn rounds_ignore_report_order(
            rounds in proptest::collection::vec(proptest::collection::vec((0usize..3, 0usize..3, any::<bool>()), 0..8), 1..20),
        ) {
            let names = ["a", "b", "c"];
            let nodes = ["n1", "n2", "n3"];
            let (mut forward, mut backward) = (CellBreakers::new(names, 0), CellBreakers::new(names, 0));
            for (i, reports) in rounds.iter().enumerate() {
                let now = i as u64 * 4000;
                let report = |&(c, n, p): &(usize, usize, bool)| r(names[c], nodes[n], p);
                let f = forward.round(reports.iter().map(report), now);
                let b = backward.round(reports.iter().rev().chain(reports.iter()).map(report), now);
                prop_assert_eq!(f, b);
            }
            prop_assert_eq!(forward.views(), backward.views());
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
