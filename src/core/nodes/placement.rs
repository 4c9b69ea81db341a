//! Placement by load: where a session goes when no owner keeps it, as pure functions of
//! each node's reported load ([`Load`]: connections against the limit in force). No I/O,
//! no clock; the same loads give the same answer in any process.
//!
//! - A node at or above the **high-water mark** of its capacity ([`over_high_water`])
//!   takes no new and no moving sessions (it keeps its own); when every node is, nobody
//!   is excluded and admission decides.
//! - Sessions that must move go by **weighted rendezvous** ([`weighted_rendezvous`])
//!   over the nodes below the mark, each weighted by its headroom ([`headroom_weight`]):
//!   a drained node's sessions land in proportion to headroom, and a change of load
//!   moves few answers. The headroom is rounded up to a
//!   sixteenth of the node's capacity, so two nodes whose views of a load differ by less
//!   than that still agree.
//! - A **new session** stays on the node its handshake reached (a load balancer's
//!   choice, no redirect) unless that node is over the mark or fuller than the emptiest
//!   node below it by more than [`SLACK_PERMILLE`]; then it goes to the weighted choice
//!   among the nodes within that slack ([`level`], [`place_new`]), which keep it; the
//!   route's answer for a new session is that same choice. Sessions arriving evenly fill
//!   the emptiest nodes first, and the nodes end level.
//!
//! [`rendezvous`] (plain rendezvous hashing) lives here too, so `core::nodes::routing` depends on
//! this module and not the other way round.
//!
//! A load an earlier build does not report (`None`) turns the weighing off for the
//! question: every node equal, plain rendezvous, the handshake's node keeps a new session;
//! a node that reports itself over the mark is still left out.

/// How much fuller (in thousandths of capacity) than the emptiest usable node a node may
/// be and still keep a new session that reached it.
pub const SLACK_PERMILLE: u64 = 100;
/// The headroom weight's step: a sixteenth of the node's capacity.
const WEIGHT_STEPS: u64 = 16;

/// A node's load as it reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Connections open on it.
    pub connections: u64,
    /// The connections it admits (its limit in force); 0: no limit said.
    pub capacity: u64,
}

impl Load {
    /// Connections in thousandths of capacity (0 without a capacity).
    pub fn used_permille(self) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        (self.connections.saturating_mul(1000) / self.capacity).min(1000)
    }

    /// Connections it may still admit (`None` without a capacity).
    pub fn headroom(self) -> Option<u64> {
        (self.capacity > 0).then(|| self.capacity.saturating_sub(self.connections))
    }
}

/// Whether `load` is at or above `high_water_permille` of its capacity (never without a
/// capacity, or with a mark of 0: off).
pub fn over_high_water(load: Load, high_water_permille: u64) -> bool {
    high_water_permille > 0
        && load.capacity > 0
        && load.connections.saturating_mul(1000)
            >= load.capacity.saturating_mul(high_water_permille)
}

/// A node's weight for [`weighted_rendezvous`]: its headroom rounded up to a sixteenth of
/// its capacity (at least one step), so loads that differ by less than a step weigh the
/// same, scaled by 16 (weights only compare). Without a capacity: 1.
pub fn headroom_weight(load: Load) -> u64 {
    let Some(headroom) = load.headroom() else { return 1 };
    // In steps of capacity / 16 (kept whole by scaling: `steps × capacity` is
    // `16 × headroom` rounded up to a step).
    let steps = headroom.saturating_mul(WEIGHT_STEPS).div_ceil(load.capacity).max(1);
    steps.saturating_mul(load.capacity)
}

/// The item chosen for `key` with each item's chance in proportion to its weight: the
/// highest `weight / -ln(u)`, `u` the (key, item) hash in (0, 1). Equal weights give
/// [`rendezvous`]'s answer exactly. Ties go to the smaller name; the answer ignores the
/// order of `items`.
pub fn weighted_rendezvous<'a>(key: &str, items: &[(&'a str, u64)]) -> Option<&'a str> {
    let first = items.first()?.1;
    if items.iter().all(|(_, weight)| *weight == first) {
        return rendezvous(key, items.iter().map(|(name, _)| *name));
    }
    let score = |name: &str, weight: u64| {
        let hash = item_hash(key, name);
        // (0, 1), never 0 nor 1: 53 bits of the hash, shifted off both ends.
        let u = ((hash >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        weight.max(1) as f64 / -u.ln()
    };
    items
        .iter()
        .map(|(name, weight)| (score(name, *weight), *name))
        .max_by(|(a, an), (b, bn)| a.total_cmp(b).then_with(|| bn.cmp(an)))
        .map(|(_, name)| name)
}

/// The item whose (key, item) hash is highest, ties broken by the smaller item: the
/// rendezvous choice, the same in every process whatever the order of `items`.
pub fn rendezvous<'a>(key: &str, items: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    items.into_iter().max_by_key(|item| (item_hash(key, item), std::cmp::Reverse(*item)))
}

/// FNV-1a over the room, a separator and the node, then a 64-bit finaliser (names that
/// differ only in their last byte must still spread): the same in every process and build.
fn item_hash(room: &str, node: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in room.bytes().chain([0xff]).chain(node.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

/// A node that may take a session, with its load (`None`: not reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usable<'a> {
    pub name: &'a str,
    pub load: Option<Load>,
}

/// The nodes of `nodes` that a new or moving session may go to: those below the high-water
/// mark, or all of them when none is (admission then refuses what does not fit).
pub fn below_high_water<'a>(nodes: &[Usable<'a>], high_water_permille: u64) -> Vec<Usable<'a>> {
    let below: Vec<Usable<'a>> = nodes
        .iter()
        .copied()
        .filter(|n| !n.load.is_some_and(|load| over_high_water(load, high_water_permille)))
        .collect();
    if below.is_empty() {
        nodes.to_vec()
    } else {
        below
    }
}

/// The choice among `nodes` for `key`: weighted by headroom when every node reports a
/// load, plain rendezvous otherwise.
pub fn choose<'a>(key: &str, nodes: &[Usable<'a>]) -> Option<&'a str> {
    let weights: Option<Vec<(&'a str, u64)>> =
        nodes.iter().map(|n| Some((n.name, headroom_weight(n.load?)))).collect();
    match weights {
        Some(weights) => weighted_rendezvous(key, &weights),
        None => rendezvous(key, nodes.iter().map(|n| n.name)),
    }
}

/// Where a new session goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewSession<'a> {
    /// The node its handshake reached keeps it.
    Here,
    /// Sent to this node.
    There(&'a str),
}

/// The nodes a new session may go to: below the mark and within [`SLACK_PERMILLE`] of the
/// emptiest such node. `None` when a load is unknown (placement is off for the question);
/// empty when every node is over the mark.
pub fn level<'a>(nodes: &[Usable<'a>], high_water_permille: u64) -> Option<Vec<Usable<'a>>> {
    let loads =
        nodes.iter().map(|n| n.load.map(|load| (n.name, load))).collect::<Option<Vec<_>>>()?;
    let below: Vec<(&'a str, Load)> = loads
        .into_iter()
        .filter(|(_, load)| !over_high_water(*load, high_water_permille))
        .collect();
    let Some(emptiest) = below.iter().map(|(_, load)| load.used_permille()).min() else {
        return Some(Vec::new());
    };
    Some(
        below
            .into_iter()
            .filter(|(_, load)| load.used_permille() <= emptiest + SLACK_PERMILLE)
            .map(|(name, load)| Usable { name, load: Some(load) })
            .collect(),
    )
}

/// Where a new session keyed `key` goes when its handshake reached `me`, among the `nodes`
/// of the cell that may take sessions (alive, not draining; `me` among them if it may):
/// see the module doc. `me` keeps it when it is in the [`level`] set, when a load is
/// unknown, or when every node is over the mark (admission refuses what does not fit).
pub fn place_new<'a>(
    me: &str,
    key: &str,
    nodes: &[Usable<'a>],
    high_water_permille: u64,
) -> NewSession<'a> {
    let Some(level) = level(nodes, high_water_permille) else { return NewSession::Here };
    if level.is_empty() || level.iter().any(|n| n.name == me) {
        return NewSession::Here;
    }
    match choose(key, &level) {
        Some(node) => NewSession::There(node),
        None => NewSession::Here,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn load(connections: u64, capacity: u64) -> Option<Load> {
        Some(Load { connections, capacity })
    }

    #[test]
    fn the_high_water_mark_is_a_share_of_capacity() {
        let table = [
            (Load { connections: 899, capacity: 1000 }, 900, false),
            (Load { connections: 900, capacity: 1000 }, 900, true),
            (Load { connections: 5000, capacity: 0 }, 900, false),
            (Load { connections: 1000, capacity: 1000 }, 0, false),
            (Load { connections: 9, capacity: 10 }, 900, true),
        ];
        for (load, mark, over) in table {
            assert_eq!(over_high_water(load, mark), over, "{load:?} at {mark}‰");
        }
    }

    #[test]
    fn headroom_weights_round_up_to_a_sixteenth_of_capacity() {
        let weight = |connections| headroom_weight(Load { connections, capacity: 1600 });
        assert_eq!(weight(0), 16 * 1600);
        assert_eq!(weight(1), 16 * 1600, "within a step: the same weight");
        assert_eq!(weight(100), 15 * 1600);
        assert_eq!(weight(1600), 1600, "full: one step, never 0");
        assert_eq!(headroom_weight(Load { connections: 7, capacity: 0 }), 1);
        // Proportional across capacities: 500 left of 1000 weighs what 500 of 2000 does.
        assert_eq!(
            headroom_weight(Load { connections: 500, capacity: 1000 }),
            headroom_weight(Load { connections: 1500, capacity: 2000 })
        );
    }

    #[test]
    fn a_burst_lands_in_proportion_to_headroom() {
        // Headroom 1000, 500, 250 (and a full node that is excluded before this).
        let nodes = [("a", load(0, 1000)), ("b", load(500, 1000)), ("c", load(750, 1000))];
        let usable: Vec<Usable> =
            nodes.iter().map(|(name, load)| Usable { name, load: *load }).collect();
        let mut landed: BTreeMap<&str, u32> = BTreeMap::new();
        for i in 0..7000 {
            *landed.entry(choose(&format!("s{i}"), &usable).unwrap()).or_default() += 1;
        }
        for (node, want) in [("a", 4000.0), ("b", 2000.0), ("c", 1000.0)] {
            let got = f64::from(landed[node]);
            assert!(
                (got - want).abs() < want * 0.08,
                "{node}: {got} of 7000, want about {want}: {landed:?}"
            );
        }
    }

    #[test]
    fn without_every_load_the_choice_is_plain_rendezvous() {
        let nodes = [
            Usable { name: "a", load: load(0, 100) },
            Usable { name: "b", load: None },
            Usable { name: "c", load: load(99, 100) },
        ];
        for i in 0..200 {
            let key = format!("s{i}");
            assert_eq!(choose(&key, &nodes), rendezvous(&key, ["a", "b", "c"]));
        }
        assert_eq!(
            place_new("c", "u", &nodes, 900),
            NewSession::Here,
            "an unknown load: the handshake's node keeps it"
        );
    }

    #[test]
    fn a_new_session_stays_unless_its_node_is_full_or_much_fuller() {
        let nodes = |c: u64| {
            vec![
                Usable { name: "a", load: load(100, 1000) },
                Usable { name: "b", load: load(150, 1000) },
                Usable { name: "c", load: load(c, 1000) },
            ]
        };
        // (c's connections, where a session reaching c goes)
        let table: [(u64, &[&str]); 4] = [
            (200, &["c"]),      // within the slack of a (100 + 100)
            (201, &["a", "b"]), // fuller by more than the slack: sent to a or b
            (950, &["a", "b"]), // over the mark
            (100, &["c"]),
        ];
        for (c, want) in table {
            for i in 0..50 {
                let got = match place_new("c", &format!("u{i}"), &nodes(c), 900) {
                    NewSession::Here => "c",
                    NewSession::There(node) => node,
                };
                assert!(want.contains(&got), "c at {c}: sent to {got}, want one of {want:?}");
            }
        }
        // Every node full: the one reached answers.
        let full = [
            Usable { name: "a", load: load(950, 1000) },
            Usable { name: "b", load: load(990, 1000) },
        ];
        assert_eq!(place_new("a", "u", &full, 900), NewSession::Here);
        assert_eq!(
            below_high_water(&full, 900),
            full.to_vec(),
            "nobody excluded when everyone is full"
        );
        // `me` not usable (draining): sent to the level nodes.
        assert!(matches!(place_new("z", "u", &full[..1], 900), NewSession::Here));
    }

    #[test]
    fn sessions_arriving_evenly_fill_the_emptiest_first_and_end_level() {
        // Three nodes of 700 with 0, 200 and 640 open (the last over the 90 % mark); 1,000
        // new sessions reach them in turn (a round-robin balancer), loads reported at once.
        let mut open: BTreeMap<&str, u64> = [("a", 0), ("b", 200), ("c", 640)].into();
        let start = open.clone();
        for i in 0..1000 {
            let reached = ["a", "b", "c"][i % 3];
            let nodes: Vec<Usable> =
                open.iter().map(|(name, open)| Usable { name, load: load(*open, 700) }).collect();
            let node = match place_new(reached, &format!("user{i}"), &nodes, 900) {
                NewSession::Here => reached,
                NewSession::There(node) => node,
            };
            *open.get_mut(node).unwrap() += 1;
        }
        assert_eq!(open["c"], start["c"], "the node over the mark got no session");
        let (a, b) = (open["a"] as i64, open["b"] as i64);
        assert!((a - b).abs() <= 70, "a and b end within the slack of each other: {open:?}");
    }

    proptest! {
        #[test]
        fn the_weighted_choice_ignores_order_and_agrees_within_a_step(
            loads in proptest::collection::vec(0u64..1600, 1..6),
            key in "[a-z0-9]{1,12}",
            wobble in 0u64..50,
        ) {
            let names: Vec<String> = (0..loads.len()).map(|i| format!("n{i}")).collect();
            let nodes: Vec<Usable> = names.iter().zip(&loads).map(|(name, c)| Usable { name, load: load(*c, 1600) }).collect();
            let mut reversed = nodes.clone();
            reversed.reverse();
            prop_assert_eq!(choose(&key, &nodes), choose(&key, &reversed));
            // Another node's view, each load off by less than what keeps it in its step.
            let seen: Vec<Usable> = nodes
                .iter()
                .map(|n| {
                    let l = n.load.unwrap();
                    let step = 100;
                    let room_in_step = (l.capacity - l.connections) % step;
                    let off = if room_in_step == 0 { 0 } else { wobble.min(room_in_step - 1) };
                    Usable { name: n.name, load: load(l.connections + off, l.capacity) }
                })
                .collect();
            prop_assert_eq!(choose(&key, &nodes), choose(&key, &seen));
        }

        #[test]
        fn a_chosen_node_is_below_the_mark_unless_all_are_over(
            loads in proptest::collection::vec(0u64..=1000, 1..6),
            key in "[a-z0-9]{1,12}",
        ) {
            let names: Vec<String> = (0..loads.len()).map(|i| format!("n{i}")).collect();
            let nodes: Vec<Usable> = names.iter().zip(&loads).map(|(name, c)| Usable { name, load: load(*c, 1000) }).collect();
            let pool = below_high_water(&nodes, 900);
            let chosen = choose(&key, &pool).unwrap();
            let chosen_load = nodes.iter().find(|n| n.name == chosen).unwrap().load.unwrap();
            prop_assert!(!over_high_water(chosen_load, 900) || loads.iter().all(|c| *c >= 900));
            if let NewSession::There(node) = place_new(&names[0], &key, &nodes, 900) {
                // The node it is sent to keeps it (the same view).
                prop_assert_eq!(place_new(node, &key, &nodes, 900), NewSession::Here);
            }
        }
    }
}
