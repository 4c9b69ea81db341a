//! Readiness probes of peers, shared and cached: before a move is charged to a user's
//! migration budget the directory asks whether the owner still answers its own `/readyz`
//! (`actors::liveness::Router::answers_ready`). A handshake never makes that request
//! itself: per peer there is at most one probe in flight, every handshake asking while it
//! runs joins it and gets its answer, and an answer serves every question for
//! [`PROBE_FRESH_MS`] after it came. So a peer is probed at most once per
//! [`PROBE_FRESH_MS`], however many handshakes ask, and a slow peer costs each of them
//! one wait at most, never one each.
//!
//! Per peer the state is idle (no entry), in flight since `t` (with the driver's waiter,
//! `W`, which askers clone to wait on the answer), or answered at `t`. An in-flight probe
//! whose driver never reported (it was lost) is replaced after [`PROBE_LOST_MS`]. The
//! table holds only peers asked about within the last [`PROBE_FRESH_MS`] or in flight
//! (older answers are dropped whenever a probe starts), and the driver asks only about
//! nodes its router knows: at most one entry per known node.

use std::collections::HashMap;

/// How long an answer serves every question about its peer.
pub const PROBE_FRESH_MS: u64 = 1_000;
/// An in-flight probe not answered after this long is counted lost and started again
/// (the driver's request times out well before: 500 ms).
pub const PROBE_LOST_MS: u64 = 5_000;

/// What a question about a peer's readiness gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask<W> {
    /// An answer younger than [`PROBE_FRESH_MS`].
    Known(bool),
    /// A probe is in flight: wait on its waiter.
    Join(W),
    /// No probe was in flight: the driver starts one now and reports it with
    /// [`ReadyProbes::answered`]; the waiter is the one the caller made.
    Start(W),
}

#[derive(Debug, Clone)]
enum State<W> {
    InFlight { since_ms: u64, waiter: W },
    Answered { ready: bool, at_ms: u64 },
}

/// The readiness answers of peers and the probes in flight; see the module doc.
#[derive(Debug)]
pub struct ReadyProbes<W> {
    peers: HashMap<String, State<W>>,
}

impl<W> Default for ReadyProbes<W> {
    fn default() -> Self {
        ReadyProbes { peers: HashMap::new() }
    }
}

impl<W: Clone> ReadyProbes<W> {
    /// `node`'s answer if one came within [`PROBE_FRESH_MS`] of `now_ms`; never starts
    /// a probe.
    pub fn known(&self, node: &str, now_ms: u64) -> Option<bool> {
        match self.peers.get(node)? {
            State::Answered { ready, at_ms } if fresh(*at_ms, now_ms) => Some(*ready),
            _ => None,
        }
    }

    /// A question about `node` at `now_ms`: the fresh answer, the probe in flight to
    /// join, or a new probe (in flight from now, waited on through `waiter()`).
    pub fn ask(&mut self, node: &str, now_ms: u64, waiter: impl FnOnce() -> W) -> Ask<W> {
        match self.peers.get(node) {
            Some(State::Answered { ready, at_ms }) if fresh(*at_ms, now_ms) => {
                return Ask::Known(*ready)
            }
            Some(State::InFlight { since_ms, waiter })
                if now_ms.saturating_sub(*since_ms) < PROBE_LOST_MS =>
            {
                return Ask::Join(waiter.clone())
            }
            _ => {}
        }
        self.forget_stale(now_ms);
        let waiter = waiter();
        self.peers
            .insert(node.to_string(), State::InFlight { since_ms: now_ms, waiter: waiter.clone() });
        Ask::Start(waiter)
    }

    /// The probe of `node` answered `ready` at `now_ms`.
    pub fn answered(&mut self, node: &str, ready: bool, now_ms: u64) {
        self.peers.insert(node.to_string(), State::Answered { ready, at_ms: now_ms });
    }

    /// Peers with an entry (an answer or a probe in flight).
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Drop answers no longer fresh and probes lost.
    fn forget_stale(&mut self, now_ms: u64) {
        self.peers.retain(|_, state| match state {
            State::Answered { at_ms, .. } => fresh(*at_ms, now_ms),
            State::InFlight { since_ms, .. } => now_ms.saturating_sub(*since_ms) < PROBE_LOST_MS,
        });
    }
}

fn fresh(at_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(at_ms) < PROBE_FRESH_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a table: a question and what it gets, a probe's answer, or a look
    /// at the fresh answer, each at a time.
    enum Step {
        Query(&'static str, u64, Ask<u32>),
        Answer(&'static str, bool, u64),
        Known(&'static str, u64, Option<bool>),
    }

    fn run(steps: &[Step]) -> ReadyProbes<u32> {
        let mut probes = ReadyProbes::default();
        let mut made = 0u32;
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Query(node, now, expected) => {
                    let got = probes.ask(node, *now, || {
                        made += 1;
                        made
                    });
                    assert_eq!(&got, expected, "step {i}: ask {node} at {now}");
                }
                Step::Answer(node, ready, now) => probes.answered(node, *ready, *now),
                Step::Known(node, now, expected) => assert_eq!(
                    probes.known(node, *now),
                    *expected,
                    "step {i}: known {node} at {now}"
                ),
            }
        }
        probes
    }

    #[test]
    fn one_probe_per_peer_is_shared_and_its_answer_serves_for_a_second() {
        use Step::*;
        run(&[
            Known("a", 0, None),
            // The first asker starts the probe (waiter 1); the others join it.
            Query("a", 0, Ask::Start(1)),
            Query("a", 10, Ask::Join(1)),
            Query("a", 449, Ask::Join(1)),
            Known("a", 449, None),
            // Another peer has its own probe.
            Query("b", 20, Ask::Start(2)),
            Answer("a", true, 450),
            Query("a", 450, Ask::Known(true)),
            Known("a", 1_449, Some(true)),
            Query("a", 1_449, Ask::Known(true)),
            // A second after the answer it is stale: the next question starts a probe.
            Known("a", 1_450, None),
            Query("a", 1_450, Ask::Start(3)),
            Answer("a", false, 1_950),
            Query("a", 1_960, Ask::Known(false)),
            // b's probe is still in flight.
            Query("b", 1_960, Ask::Join(2)),
        ]);
    }

    #[test]
    fn a_probe_never_answered_is_replaced_after_it_counts_lost() {
        use Step::*;
        run(&[
            Query("a", 0, Ask::Start(1)),
            Query("a", PROBE_LOST_MS - 1, Ask::Join(1)),
            Query("a", PROBE_LOST_MS, Ask::Start(2)),
            Query("a", PROBE_LOST_MS + 1, Ask::Join(2)),
            // The lost probe's late answer still counts (it is an answer about a).
            Answer("a", true, PROBE_LOST_MS + 2),
            Query("a", PROBE_LOST_MS + 3, Ask::Known(true)),
        ]);
    }

    #[test]
    fn probes_start_at_most_once_per_fresh_period_however_many_ask() {
        // Askers every millisecond for 10 s, a probe answering 450 ms after it started.
        let mut probes = ReadyProbes::default();
        let (mut started, mut answer_due): (Vec<u64>, Option<u64>) = (Vec::new(), None);
        for now in 0..10_000u64 {
            if answer_due == Some(now) {
                probes.answered("slow", true, now);
                answer_due = None;
            }
            if let Ask::Start(()) = probes.ask("slow", now, || ()) {
                started.push(now);
                answer_due = Some(now + 450);
            }
        }
        for pair in started.windows(2) {
            assert!(pair[1] - pair[0] >= PROBE_FRESH_MS, "probes started at {pair:?}");
        }
        assert_eq!(started.len(), 7, "one probe per 1.45 s over 10 s: {started:?}");
    }

    #[test]
    fn the_table_holds_only_fresh_answers_and_probes_in_flight() {
        use Step::*;
        let probes = run(&[
            Query("a", 0, Ask::Start(1)),
            Answer("a", true, 10),
            Query("b", 0, Ask::Start(2)),
            Answer("b", true, 10),
            Query("c", 500, Ask::Start(3)),
            // At 1_200 a's and b's answers are stale: starting d's probe drops them.
            Query("d", 1_200, Ask::Start(4)),
        ]);
        assert_eq!(probes.len(), 2, "c and d in flight only");
    }
}
