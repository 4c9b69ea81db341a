//! Scale-out's controlled entry (issue 30): sticky sessions never move by themselves, so
//! a node that joins stays idle. An operator asks for a rebalance towards a node; this
//! module decides how many connections each busiest node hands over ([`plan`]) and how
//! fast ([`Pacer`]). Pure: loads come in as values, time as a parameter.
//!
//! A move is a handover of one user (all of the user's connections on the node) through
//! the directory's versioned write and the migration budget; that is the actors' part.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::core::rules::limits::TokenBucket;

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
        self.shares.iter().fold(0u64, |sum, s| sum.saturating_add(s.connections))
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
///
/// The work is proportional to the number of nodes (a bisection over the level the
/// busiest nodes are cut down to: at most 64 passes over them), never to the loads,
/// which peers claim; sums are taken in u128, so no claim overflows them.
pub fn plan(loads: &[Load<'_>], target: &str, limit: Option<u64>) -> Result<Plan, PlanError> {
    plan_counting(loads, target, limit, &mut 0)
}

/// [`plan`], adding to `work` one per node visited (the tests bound it).
fn plan_counting(
    loads: &[Load<'_>],
    target: &str,
    limit: Option<u64>,
    work: &mut u64,
) -> Result<Plan, PlanError> {
    let mut merged: BTreeMap<&str, u64> = BTreeMap::new();
    for load in loads {
        let entry = merged.entry(load.node).or_default();
        *entry = (*entry).max(load.connections);
        *work += 1;
    }
    let Some(&at_target) = merged.get(target) else {
        return Err(PlanError::UnknownTarget(target.to_string()));
    };
    let total: u128 = merged.values().map(|&c| u128::from(c)).sum();
    // At most the largest load, so it fits.
    let mean = u64::try_from(total / merged.len() as u128).unwrap_or(u64::MAX);
    let room = mean.saturating_sub(at_target).min(limit.unwrap_or(u64::MAX));
    let above: Vec<(&str, u64)> =
        merged.iter().filter(|(n, c)| **n != target && **c > mean).map(|(n, c)| (*n, *c)).collect();
    // What cutting every node above `level` down to it sheds.
    let mut surplus = |level: u64| -> u128 {
        *work += above.len() as u64;
        above.iter().map(|(_, c)| u128::from(c.saturating_sub(level))).sum()
    };
    let mut shed: BTreeMap<&str, u64> = BTreeMap::new();
    if u128::from(room) >= surplus(mean) {
        // Room for everything above the mean.
        shed.extend(above.iter().map(|(n, c)| (*n, c - mean)));
    } else {
        // The lowest level whose surplus fits in `room`: surplus(lo) > room >= surplus(hi).
        let (mut lo, mut hi) = (mean, above.iter().map(|(_, c)| *c).max().unwrap_or(mean));
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if surplus(mid) > u128::from(room) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let level = hi;
        // Fewer than the nodes at `level` (surplus(level - 1) > room): one more each from
        // the first by name, as taking one at a time from the busiest would.
        let mut extra = u128::from(room) - surplus(level);
        for (node, c) in &above {
            let mut give = c.saturating_sub(level);
            if *c >= level && extra > 0 {
                give += 1;
                extra -= 1;
            }
            if give > 0 {
                shed.insert(node, give);
            }
        }
    }
    let mut shares: Vec<Share> = shed
        .into_iter()
        .map(|(node, connections)| Share { node: node.to_string(), connections })
        .collect();
    shares.sort_by(|a, b| {
        (merged[b.node.as_str()], &a.node).cmp(&(merged[a.node.as_str()], &b.node))
    });
    *work += shares.len() as u64;
    Ok(Plan { to: target.to_string(), mean, shares })
}

impl Plan {
    /// Each share's part of the operation's `per_second`, in proportion to its
    /// connections (largest remainders get the rest), so the shedding nodes finish at
    /// about the same time and together go no faster than `per_second`; at least 1 each
    /// (so with more shedding nodes than `per_second`, that many per second).
    pub fn rates(&self, per_second: u32) -> Vec<u32> {
        // In u128: `per_second × connections` does not fit a u64 for every claim.
        let total = u128::from(self.total().max(1));
        let part = |s: &Share| u128::from(per_second) * u128::from(s.connections);
        let exact: Vec<(u64, u128)> =
            self.shares.iter().map(|s| ((part(s) / total) as u64, part(s) % total)).collect();
        let mut rates: Vec<u64> = exact.iter().map(|(floor, _)| *floor).collect();
        let left = u64::from(per_second)
            .saturating_sub(rates.iter().fold(0u64, |sum, r| sum.saturating_add(*r)));
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

/// An order to one shedding node, as the answering node sends it. It names its target,
/// never where the target is: the shedding node sends its clients to the URL its own view
/// of the cluster has for `to` ([`target_url`]), so a forged order cannot point them
/// anywhere else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// The operation this order belongs to (the same on every shedding node).
    pub id: String,
    pub to: String,
    /// Connections to hand over (users are moved whole, so the last may overshoot by the
    /// connections of one user less one).
    pub connections: u64,
    pub per_second: u32,
}

/// A node as the shedding node sees it when it checks an order (its Router's view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known<'a> {
    pub name: &'a str,
    pub url: &'a str,
    /// Draining or still starting: takes no connections.
    pub draining: bool,
}

/// Why a node refuses an order (`livegate_rebalance_orders_refused_total{reason}`).
#[derive(Debug, Error, PartialEq, Eq, Clone, Copy)]
pub enum OrderRefused {
    #[error("the order's target is this node itself")]
    ToItself,
    #[error("the order's target is not a node this node hears alive")]
    UnknownTarget,
    #[error("the order's target is draining or starting")]
    TargetDraining,
}

impl OrderRefused {
    /// The metric's `reason` label.
    pub fn reason(self) -> &'static str {
        match self {
            OrderRefused::ToItself => "itself",
            OrderRefused::UnknownTarget => "unknown_target",
            OrderRefused::TargetDraining => "target_draining",
        }
    }
}

/// Every [`OrderRefused::reason`].
pub const ORDER_REFUSED_REASONS: &[&str] = &["itself", "unknown_target", "target_draining"];

/// Where the clients of an order to `to` are sent: `to`'s URL as this node (`me`) knows
/// it among `nodes`, when `to` is another node, alive and taking connections; otherwise
/// the order is refused. Checked when the order comes and again while it runs.
pub fn target_url<'a>(to: &str, me: &str, nodes: &[Known<'a>]) -> Result<&'a str, OrderRefused> {
    if to == me {
        return Err(OrderRefused::ToItself);
    }
    match nodes.iter().find(|n| n.name == to) {
        None => Err(OrderRefused::UnknownTarget),
        Some(n) if n.draining => Err(OrderRefused::TargetDraining),
        Some(n) => Ok(n.url),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(
        loads: &[(&str, u64)],
        target: &str,
        limit: Option<u64>,
        expected: Result<(u64, &[(&str, u64)]), PlanError>,
    ) {
        let loads: Vec<Load> = loads
            .iter()
            .map(|(node, connections)| Load { node, connections: *connections })
            .collect();
        let got = plan(&loads, target, limit).map(|p| {
            (p.mean, p.shares.iter().map(|s| (s.node.clone(), s.connections)).collect::<Vec<_>>())
        });
        let expected = expected.map(|(mean, shares)| {
            (mean, shares.iter().map(|(n, c)| (n.to_string(), *c)).collect::<Vec<_>>())
        });
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
        check(
            &[("b", 30), ("c", 0), ("a", 30), ("a", 12)],
            "c",
            None,
            Ok((20, &[("a", 10), ("b", 10)])),
        );
        check(&[("a", 30), ("b", 30)], "c", None, Err(PlanError::UnknownTarget("c".into())));
    }

    #[test]
    fn absurd_claims_plan_in_bounded_steps() {
        const E15: u64 = 1_000_000_000_000_000;
        // A peer claiming 10^15 (or u64::MAX) connections: the plan is the arithmetic
        // answer, computed in a few passes over the nodes, never one step per connection.
        check(&[("a", E15), ("c", 0)], "c", None, Ok((E15 / 2, &[("a", E15 / 2)])));
        check(
            &[("a", u64::MAX), ("b", u64::MAX), ("c", 0)],
            "c",
            None,
            Ok((u64::MAX / 3 * 2, &[("a", u64::MAX / 3), ("b", u64::MAX / 3)])),
        );
        let mean = ((u128::from(u64::MAX) + 7) / 3) as u64;
        check(&[("a", u64::MAX), ("b", 7), ("c", 0)], "c", Some(5), Ok((mean, &[("a", 5)])));
        check(&[("a", u64::MAX), ("c", u64::MAX)], "c", None, Ok((u64::MAX, &[])));
        let loads = [
            Load { node: "a", connections: u64::MAX },
            Load { node: "b", connections: E15 },
            Load { node: "c", connections: 0 },
        ];
        let mut work = 0;
        let plan = plan_counting(&loads, "c", None, &mut work).unwrap();
        assert!(work <= 3 * 70, "{work} steps for 3 nodes");
        assert_eq!(plan.total(), plan.mean);
        assert_eq!(
            plan.rates(MAX_PER_SECOND).iter().map(|r| u64::from(*r)).sum::<u64>(),
            u64::from(MAX_PER_SECOND)
        );
    }

    #[test]
    fn an_order_goes_to_a_known_other_node_at_its_known_url() {
        let nodes = [
            Known { name: "a", url: "http://a:7070", draining: false },
            Known { name: "b", url: "http://b:7070", draining: false },
            Known { name: "d", url: "http://d:7070", draining: true },
        ];
        let cases: &[(&str, Result<&str, OrderRefused>)] = &[
            ("b", Ok("http://b:7070")),
            ("a", Err(OrderRefused::ToItself)),
            ("d", Err(OrderRefused::TargetDraining)),
            ("attacker", Err(OrderRefused::UnknownTarget)),
            ("", Err(OrderRefused::UnknownTarget)),
        ];
        for (to, want) in cases {
            assert_eq!(target_url(to, "a", &nodes), *want, "{to}");
        }
        for reason in
            [OrderRefused::ToItself, OrderRefused::UnknownTarget, OrderRefused::TargetDraining]
                .map(OrderRefused::reason)
        {
            assert!(ORDER_REFUSED_REASONS.contains(&reason));
        }
    }

    /// The planner as it was first written: one connection per step from the busiest
    /// (ties by name). The bounded [`plan`] must give the same answer.
    fn one_at_a_time(loads: &[Load<'_>], target: &str, limit: Option<u64>) -> Vec<(String, u64)> {
        let mut merged: BTreeMap<&str, u64> = BTreeMap::new();
        for load in loads {
            let entry = merged.entry(load.node).or_default();
            *entry = (*entry).max(load.connections);
        }
        let at_target = merged[target];
        let mean = merged.values().sum::<u64>() / merged.len() as u64;
        let mut room = mean.saturating_sub(at_target).min(limit.unwrap_or(u64::MAX));
        let mut left: Vec<(&str, u64)> = merged
            .iter()
            .filter(|(n, c)| **n != target && **c > mean)
            .map(|(n, c)| (*n, *c))
            .collect();
        let mut shed: BTreeMap<&str, u64> = BTreeMap::new();
        while room > 0 {
            let Some(busiest) = left
                .iter_mut()
                .filter(|(_, c)| *c > mean)
                .max_by_key(|(n, c)| (*c, std::cmp::Reverse(*n)))
            else {
                break;
            };
            busiest.1 -= 1;
            *shed.entry(busiest.0).or_default() += 1;
            room -= 1;
        }
        let mut shares: Vec<(String, u64)> =
            shed.into_iter().map(|(n, c)| (n.to_string(), c)).collect();
        shares.sort_by(|a, b| (merged[b.0.as_str()], &a.0).cmp(&(merged[a.0.as_str()], &b.0)));
        shares
    }

    #[test]
    fn rates_split_by_share() {
        let plan = |shares: &[u64]| Plan {
            to: "t".into(),
            mean: 0,
            shares: shares
                .iter()
                .enumerate()
                .map(|(i, c)| Share { node: format!("n{i}"), connections: *c })
                .collect(),
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
        fn the_bounded_plan_is_the_one_at_a_time_plan(
            loads in proptest::collection::vec(0u64..300, 1..7),
            names in proptest::collection::vec(0usize..4, 1..7),
            limit in proptest::option::of(0u64..300),
        ) {
            // Few names, so nodes repeat and loads tie.
            let names: Vec<String> = names.iter().map(|i| ["a", "b", "c", "d"][*i].to_string()).collect();
            let input: Vec<Load> = names.iter().zip(&loads).map(|(node, c)| Load { node, connections: *c }).collect();
            let target = &input[0].node.to_string();
            let got = plan(&input, target, limit).unwrap();
            let shares: Vec<(String, u64)> = got.shares.iter().map(|s| (s.node.clone(), s.connections)).collect();
            prop_assert_eq!(shares, one_at_a_time(&input, target, limit));
        }

        #[test]
        fn absurd_counts_plan_in_steps_bounded_by_the_nodes(
            loads in proptest::collection::vec(prop_oneof![Just(u64::MAX), Just(1_000_000_000_000_000u64), Just(u64::MAX - 1), any::<u64>(), 0u64..1000], 1..12),
            limit in proptest::option::of(prop_oneof![Just(u64::MAX), any::<u64>()]),
            per_second in 1u32..=MAX_PER_SECOND,
        ) {
            let names: Vec<String> = (0..loads.len()).map(|i| format!("n{i}")).collect();
            let input: Vec<Load> = names.iter().zip(&loads).map(|(node, c)| Load { node, connections: *c }).collect();
            let target = names.last().unwrap();
            let mut work = 0;
            let plan = plan_counting(&input, target, limit, &mut work).unwrap();
            // A bisection over a u64 level: at most 64 passes over the nodes, plus a few.
            prop_assert!(work <= loads.len() as u64 * 70, "{} steps for {} nodes", work, loads.len());
            let mean = (loads.iter().map(|c| u128::from(*c)).sum::<u128>() / loads.len() as u128) as u64;
            prop_assert_eq!(plan.mean, mean);
            let at_target = *loads.last().unwrap();
            let surplus: u128 = loads[..loads.len() - 1].iter().map(|c| u128::from(c.saturating_sub(mean))).sum();
            let want = u128::from(mean.saturating_sub(at_target).min(limit.unwrap_or(u64::MAX))).min(surplus);
            let total: u128 = plan.shares.iter().map(|s| u128::from(s.connections)).sum();
            prop_assert_eq!(total, want);
            prop_assert_eq!(u128::from(plan.total()), want);
            for share in &plan.shares {
                let i: usize = share.node[1..].parse().unwrap();
                prop_assert!(loads[i] - share.connections >= mean, "{} sheds below the mean", share.node);
            }
            let rates = plan.rates(per_second);
            prop_assert_eq!(rates.len(), plan.shares.len());
            prop_assert!(rates.iter().all(|r| (1..=per_second).contains(r)));
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
