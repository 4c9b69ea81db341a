//! Scale-out's controlled entry (issue 30): sticky sessions never move by themselves, so
//! a node that joins stays idle. An operator asks for a rebalance towards a node; this
//! module decides how many connections each busiest node hands over ([`plan`]) and how
//! fast ([`Pacer`]). Pure: loads come in as values, time as a parameter.
//!
//! A move is a handover of one user (all of the user's connections on the node) through
//! the directory's versioned write and the migration budget; that is the actors' part.

use std::collections::BTreeMap;

use thiserror::Error;

use super::limits::TokenBucket;

/// The largest `per_second` an operator may ask for.
pub const MAX_PER_SECOND: u32 = 1000;
/// `per_second` when the operator names none.
pub const DEFAULT_PER_SECOND: u32 = 20;
/// Moves a pacer lets through at once after a pause (its bucket's size): a rebalance
/// never goes faster than `per_second` plus this over any interval.
pub const BURST: u32 = 1;

/// One node's load as a rebalance plans it: an alive node that takes connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load<'a> {
    pub node: &'a str,
    /// Connections open on it (a node that does not report its load counts 0).
    pub connections: u64,
}

/// How many connections `node` hands over to the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub node: String,
    pub connections: u64,
}

/// A rebalance's plan: who sheds how much towards `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub to: String,
    /// The mean load (rounded down) the plan levels towards.
    pub mean: u64,
    /// Busiest first (ties by name); nodes that shed nothing are left out.
    pub shares: Vec<Share>,
}

impl Plan {
    pub fn total(&self) -> u64 {
        self.shares.iter().map(|s| s.connections).sum()
    }
}

#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum PlanError {
    #[error("node {0} is not an alive node that takes connections")]
    UnknownTarget(String),
    #[error("per_second must be 1 to {MAX_PER_SECOND}, not {0}")]
    PerSecond(u32),
}

/// Check an operator's `per_second` (`None`: the default).
pub fn per_second(asked: Option<u32>) -> Result<u32, PlanError> {
    match asked.unwrap_or(DEFAULT_PER_SECOND) {
        n @ 1..=MAX_PER_SECOND => Ok(n),
        n => Err(PlanError::PerSecond(n)),
    }
}

/// How many connections each node above the mean sends to `target`: the target fills up
/// to the mean (rounded down) and no node sheds below it, always from the node with the
/// most left (ties by name), at most `limit` in all. The same answer whatever the order
/// or repetition of `loads` (a repeated node counts with its largest load).
pub fn plan(loads: &[Load<'_>], target: &str, limit: Option<u64>) -> Result<Plan, PlanError> {
    let mut merged: BTreeMap<&str, u64> = BTreeMap::new();
    for load in loads {
        let entry = merged.entry(load.node).or_default();
        *entry = (*entry).max(load.connections);
    }
    let Some(&at_target) = merged.get(target) else { return Err(PlanError::UnknownTarget(target.to_string())) };
    let total: u64 = merged.values().sum();
    let mean = total / merged.len() as u64;
    let mut room = mean.saturating_sub(at_target).min(limit.unwrap_or(u64::MAX));
    // Water-filling from the top: each step takes one from the node with the most left.
    let mut left: Vec<(&str, u64)> = merged.iter().filter(|(n, c)| **n != target && **c > mean).map(|(n, c)| (*n, *c)).collect();
    let mut shed: BTreeMap<&str, u64> = BTreeMap::new();
    // One at a time: `room` is at most the mean, so this is bounded by the connections.
    while room > 0 {
        let Some(busiest) = left.iter_mut().filter(|(_, c)| *c > mean).max_by_key(|(n, c)| (*c, std::cmp::Reverse(*n))) else { break };
        busiest.1 -= 1;
        *shed.entry(busiest.0).or_default() += 1;
        room -= 1;
    }
    let mut shares: Vec<Share> = shed.into_iter().map(|(node, connections)| Share { node: node.to_string(), connections }).collect();
    shares.sort_by(|a, b| (merged[b.node.as_str()], &a.node).cmp(&(merged[a.node.as_str()], &b.node)));
    Ok(Plan { to: target.to_string(), mean, shares })
}

impl Plan {
    /// Each share's part of the operation's `per_second`, in proportion to its
    /// connections (largest remainders get the rest), so the shedding nodes finish at
    /// about the same time and together go no faster than `per_second`; at least 1 each
    /// (so with more shedding nodes than `per_second`, that many per second).
    pub fn rates(&self, per_second: u32) -> Vec<u32> {
        let total = self.total().max(1);
        let exact: Vec<(u64, u64)> = self.shares.iter().map(|s| ((u64::from(per_second) * s.connections) / total, (u64::from(per_second) * s.connections) % total)).collect();
        let mut rates: Vec<u64> = exact.iter().map(|(floor, _)| *floor).collect();
        let left = u64::from(per_second).saturating_sub(rates.iter().sum());
        let mut order: Vec<usize> = (0..rates.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(exact[i].1));
        for &i in order.iter().take(left as usize) {
            rates[i] += 1;
        }
        rates.into_iter().map(|r| r.max(1) as u32).collect()
    }
}

/// How many moves a rebalance may make now: a [`TokenBucket`] of [`BURST`] moves, filled
/// at `per_second`. Over any interval of `t` seconds it allows at most `per_second × t + BURST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pacer {
    per_second: u32,
    bucket: TokenBucket,
}

impl Pacer {
    /// Starts with one move allowed.
    pub fn new(per_second: u32, now_ms: u64) -> Pacer {
        Pacer { per_second: per_second.max(1), bucket: TokenBucket::new(u64::from(BURST), now_ms) }
    }

    /// Take one move if one is allowed at `now_ms`.
    pub fn take(&mut self, now_ms: u64) -> bool {
        self.bucket.take(self.rate(), u64::from(BURST), now_ms).is_ok()
    }

    /// Give back a move taken but not made (a skipped user): it costs the rate nothing.
    pub fn refund(&mut self, now_ms: u64) {
        self.bucket.refund(self.rate(), u64::from(BURST), now_ms);
    }

    /// How long from `now_ms` until the next move is allowed (0: now).
    pub fn wait_ms(&mut self, now_ms: u64) -> u64 {
        self.bucket.wait_ms(self.rate(), u64::from(BURST), now_ms)
    }

    fn rate(&self) -> u64 {
        u64::from(self.per_second)
    }

    pub fn per_second(&self) -> u32 {
        self.per_second
    }
}

/// An order to one shedding node, as the answering node sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// The operation this order belongs to (the same on every shedding node).
    pub id: String,
    pub to: String,
    pub to_url: String,
    /// Connections to hand over (users are moved whole, so the last may overshoot by the
    /// connections of one user less one).
    pub connections: u64,
    pub per_second: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(loads: &[(&str, u64)], target: &str, limit: Option<u64>, expected: Result<(u64, &[(&str, u64)]), PlanError>) {
        let loads: Vec<Load> = loads.iter().map(|(node, connections)| Load { node, connections: *connections }).collect();
        let got = plan(&loads, target, limit).map(|p| (p.mean, p.shares.iter().map(|s| (s.node.clone(), s.connections)).collect::<Vec<_>>()));
        let expected = expected.map(|(mean, shares)| (mean, shares.iter().map(|(n, c)| (n.to_string(), *c)).collect::<Vec<_>>()));
        assert_eq!(got, expected, "{loads:?} → {target} limit {limit:?}");
    }

    #[test]
    fn plans() {
        check(&[("a", 30), ("b", 30), ("c", 0)], "c", None, Ok((20, &[("a", 10), ("b", 10)])));
        check(&[("a", 31), ("b", 30), ("c", 0)], "c", None, Ok((20, &[("a", 11), ("b", 9)])));
        // The busiest sheds first; a node at the mean sheds nothing.
        check(&[("a", 50), ("b", 20), ("c", 20), ("d", 10)], "d", None, Ok((25, &[("a", 15)])));
        check(&[("a", 90), ("b", 30), ("c", 0)], "c", None, Ok((40, &[("a", 40)])));
        check(&[("a", 90), ("b", 60), ("c", 0)], "c", None, Ok((50, &[("a", 40), ("b", 10)])));
        // A limit caps the total, still from the top.
        check(&[("a", 30), ("b", 30), ("c", 0)], "c", Some(5), Ok((20, &[("a", 3), ("b", 2)])));
        check(&[("a", 90), ("b", 60), ("c", 0)], "c", Some(20), Ok((50, &[("a", 20)])));
        check(&[("a", 30), ("b", 30), ("c", 0)], "c", Some(0), Ok((20, &[])));
        // Already level, or the target is the busiest: nothing moves.
        check(&[("a", 10), ("b", 10), ("c", 10)], "c", None, Ok((10, &[])));
        check(&[("a", 5), ("b", 5), ("c", 40)], "c", None, Ok((16, &[])));
        check(&[("c", 0)], "c", None, Ok((0, &[])));
        check(&[("a", 1), ("b", 1), ("c", 0)], "c", None, Ok((0, &[])));
        // Order and repetition do not matter.
        check(&[("b", 30), ("c", 0), ("a", 30), ("a", 12)], "c", None, Ok((20, &[("a", 10), ("b", 10)])));
        check(&[("a", 30), ("b", 30)], "c", None, Err(PlanError::UnknownTarget("c".into())));
    }

    #[test]
    fn rates_split_by_share() {
        let plan = |shares: &[u64]| Plan {
            to: "t".into(),
            mean: 0,
            shares: shares.iter().enumerate().map(|(i, c)| Share { node: format!("n{i}"), connections: *c }).collect(),
        };
        let cases: &[(&[u64], u32, &[u32])] = &[
            (&[10, 10], 5, &[3, 2]),
            (&[10, 10], 20, &[10, 10]),
            (&[30, 10], 8, &[6, 2]),
            (&[30, 10], 1, &[1, 1]),
            (&[1, 1, 1], 2, &[1, 1, 1]),
            (&[], 5, &[]),
        ];
        for (shares, per_second, expected) in cases {
            assert_eq!(plan(shares).rates(*per_second), *expected, "{shares:?} at {per_second}/s");
        }
    }

    #[test]
    fn per_second_bounds() {
        assert_eq!(per_second(None), Ok(DEFAULT_PER_SECOND));
        assert_eq!(per_second(Some(1)), Ok(1));
        assert_eq!(per_second(Some(1000)), Ok(1000));
        assert_eq!(per_second(Some(0)), Err(PlanError::PerSecond(0)));
        assert_eq!(per_second(Some(1001)), Err(PlanError::PerSecond(1001)));
    }

    #[test]
    fn pacer_lets_one_through_then_per_second() {
        let mut pacer = Pacer::new(4, 1_000);
        let steps: &[(u64, bool, u64)] = &[
            (1_000, true, 250),
            (1_000, false, 250),
            (1_100, false, 150),
            (1_250, true, 250),
            (1_250, false, 250),
            // A long pause banks only BURST moves.
            (9_000, true, 250),
            (9_000, false, 250),
            (9_249, false, 1),
            (9_250, true, 250),
        ];
        for (i, (now, taken, wait)) in steps.iter().enumerate() {
            assert_eq!(pacer.take(*now), *taken, "step {i}");
            assert_eq!(pacer.wait_ms(*now), *wait, "step {i}");
        }
        // A refund gives back a move, never more than the burst.
        let mut pacer = Pacer::new(4, 0);
        assert!(pacer.take(0));
        pacer.refund(0);
        assert!(pacer.take(0));
        pacer.refund(0);
        pacer.refund(0);
        assert!(pacer.take(0));
        assert!(!pacer.take(0));
        // The clock going back grants nothing.
        let mut pacer = Pacer::new(1, 10_000);
        assert!(pacer.take(10_000));
        assert!(!pacer.take(5_000));
        assert!(!pacer.take(10_999));
        assert!(pacer.take(11_000));
    }

    proptest! {
        #[test]
        fn a_plan_levels_without_overshooting(
            loads in proptest::collection::vec(0u64..500, 1..7),
            limit in proptest::option::of(0u64..400),
        ) {
            let names: Vec<String> = (0..loads.len()).map(|i| format!("n{i}")).collect();
            let input: Vec<Load> = names.iter().zip(&loads).map(|(node, c)| Load { node, connections: *c }).collect();
            let target = names.last().unwrap();
            let plan = plan(&input, target, limit).unwrap();
            let mean = loads.iter().sum::<u64>() / loads.len() as u64;
            prop_assert_eq!(plan.mean, mean);
            let at_target = *loads.last().unwrap();
            // The target reaches at most the mean; exactly it (or the limit) when there is surplus.
            let surplus: u64 = loads[..loads.len() - 1].iter().map(|c| c.saturating_sub(mean)).sum();
            let want = mean.saturating_sub(at_target).min(surplus).min(limit.unwrap_or(u64::MAX));
            prop_assert_eq!(plan.total(), want);
            for share in &plan.shares {
                let i: usize = share.node[1..].parse().unwrap();
                prop_assert!(share.node != *target);
                prop_assert!(share.connections > 0);
                prop_assert!(loads[i] - share.connections >= mean, "{} sheds below the mean", share.node);
            }
            // A node that shed is left at most one below the busiest: shed from the top.
            let after: Vec<u64> = names.iter().zip(&loads).map(|(n, c)| c - plan.shares.iter().find(|s| &s.node == n).map_or(0, |s| s.connections)).collect();
            let max_after = after[..after.len() - 1].iter().copied().max().unwrap_or(0);
            for share in &plan.shares {
                let j: usize = share.node[1..].parse().unwrap();
                prop_assert!(after[j] + 1 >= max_after, "{} shed too much: {after:?}", share.node);
            }
        }

        #[test]
        fn a_pacer_never_exceeds_its_rate(per_second in 1u32..50, gaps in proptest::collection::vec(0u64..300, 1..200)) {
            let mut pacer = Pacer::new(per_second, 0);
            let mut now = 0;
            let mut taken = Vec::new();
            for gap in gaps {
                now += gap;
                while pacer.take(now) {
                    taken.push(now);
                }
            }
            // In any window [t, t + w], at most per_second × w / 1000 + BURST moves.
            for (i, start) in taken.iter().enumerate() {
                for (j, end) in taken.iter().enumerate().skip(i) {
                    let moves = (j - i + 1) as u64;
                    prop_assert!(moves * 1000 <= (end - start) * u64::from(per_second) + u64::from(BURST) * 1000, "{moves} moves in {} ms", end - start);
                }
            }
        }
    }
}
