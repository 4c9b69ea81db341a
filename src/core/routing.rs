//! Routing as pure functions: same inputs give the same answer in any process, whatever
//! the order or repetition of the inputs. No I/O, no clock, no global state.
//!
//! - [`route_session`]: which node serves a session — the recorded owner while it is a
//!   candidate and alive, else the lexicographically first alive candidate.
//! - [`route_cell`]: which cell serves a user — the home cell while healthy, else the
//!   first healthy cell by name; several reports of one cell are AND-merged.
//! - [`room_writer`]: which node appends a room's events in cluster mode — the candidate
//!   with the highest hash of (room, node) (rendezvous hashing: when a node leaves, only
//!   its rooms move).

use std::collections::BTreeMap;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum RouteError {
    #[error("session id is empty")]
    EmptySession,
    #[error("no owner candidates")]
    NoOwners,
    #[error("an owner candidate has an empty name")]
    EmptyOwnerName,
    #[error("no alive owner")]
    NoAliveOwner,
}

/// The node for `session`. `recorded` is the owner the directory holds (if any),
/// `owners` the candidate nodes, `alive` the nodes currently alive.
pub fn route_session<'a>(
    session: &str,
    recorded: Option<&str>,
    owners: &[&'a str],
    alive: &[&str],
) -> Result<&'a str, RouteError> {
    if session.is_empty() {
        return Err(RouteError::EmptySession);
    }
    if owners.is_empty() {
        return Err(RouteError::NoOwners);
    }
    if owners.iter().any(|o| o.is_empty()) {
        return Err(RouteError::EmptyOwnerName);
    }
    let is_alive = |owner: &str| alive.contains(&owner);
    if let Some(kept) = recorded.and_then(|r| owners.iter().copied().find(|o| *o == r)) {
        if is_alive(kept) {
            return Ok(kept);
        }
    }
    owners.iter().copied().filter(|o| is_alive(o)).min().ok_or(RouteError::NoAliveOwner)
}

/// One health report of a cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellReport<'a> {
    pub name: &'a str,
    pub healthy: bool,
}

#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum CellError {
    /// No cell is healthy; the text carries the user id only.
    #[error("no healthy cell for user {user}")]
    NoHealthyCell { user: String },
}

/// The cell for `user` whose home cell is `home` (empty: none).
pub fn route_cell<'a>(user: &str, home: &str, cells: &[CellReport<'a>]) -> Result<&'a str, CellError> {
    let mut merged: BTreeMap<&'a str, bool> = BTreeMap::new();
    for report in cells {
        let healthy = merged.entry(report.name).or_insert(true);
        *healthy &= report.healthy;
    }
    if let Some((name, true)) = merged.get_key_value(home).map(|(n, h)| (*n, *h)) {
        if !home.is_empty() {
            return Ok(name);
        }
    }
    merged
        .into_iter()
        .find(|(name, healthy)| *healthy && !name.is_empty())
        .map(|(name, _)| name)
        .ok_or_else(|| CellError::NoHealthyCell { user: user.to_string() })
}

/// The node that appends `room`'s events: the candidate whose (room, node) hash is
/// highest, ties broken by name. `None` without candidates.
pub fn room_writer<'a>(room: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates.iter().copied().max_by_key(|node| (writer_hash(room, node), std::cmp::Reverse(*node)))
}

/// FNV-1a over the room, a separator and the node, then a 64-bit finaliser (names that
/// differ only in their last byte must still spread): the same in every process and build.
fn writer_hash(room: &str, node: &str) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn session_table() {
        type Case<'a> = (&'a str, Option<&'a str>, &'a [&'a str], &'a [&'a str], Result<&'a str, RouteError>);
        let cases: &[Case] = &[
            ("s1", Some("b"), &["a", "b", "c"], &["a", "b", "c"], Ok("b")),
            ("s1", Some("b"), &["a", "b", "c"], &["a", "c"], Ok("a")),
            ("s1", Some("z"), &["c", "b"], &["b", "c", "z"], Ok("b")),
            ("s1", None, &["c", "b", "a"], &["c", "b"], Ok("b")),
            ("s1", Some("a"), &["a"], &["a"], Ok("a")),
            ("s1", Some("a"), &["b", "b"], &["b"], Ok("b")),
            ("", Some("a"), &["a"], &["a"], Err(RouteError::EmptySession)),
            ("s1", Some("a"), &[], &["a"], Err(RouteError::NoOwners)),
            ("s1", Some("a"), &["a", ""], &["a"], Err(RouteError::EmptyOwnerName)),
            ("s1", Some("a"), &["a", "b"], &[], Err(RouteError::NoAliveOwner)),
            ("s1", None, &["a", "b"], &["c"], Err(RouteError::NoAliveOwner)),
        ];
        for (session, recorded, owners, alive, expected) in cases {
            assert_eq!(&route_session(session, *recorded, owners, alive), expected, "{session} {recorded:?} {owners:?} {alive:?}");
        }
    }

    fn cells<'a>(reports: &[(&'a str, bool)]) -> Vec<CellReport<'a>> {
        reports.iter().map(|(name, healthy)| CellReport { name, healthy: *healthy }).collect()
    }

    #[test]
    fn cell_table() {
        let none = |user: &str| Err(CellError::NoHealthyCell { user: user.into() });
        let cases: &[(&str, &[(&str, bool)], Result<&str, CellError>)] = &[
            ("eu", &[("eu", true), ("us", true)], Ok("eu")),
            ("eu", &[("us", true), ("eu", false), ("ap", true)], Ok("ap")),
            ("eu", &[("eu", true), ("eu", false), ("us", true)], Ok("us")),
            ("eu", &[("eu", true), ("eu", true)], Ok("eu")),
            ("", &[("us", true), ("ap", true)], Ok("ap")),
            ("mars", &[("us", true)], Ok("us")),
            ("eu", &[("eu", false), ("us", false)], none("u1")),
            ("eu", &[], none("u1")),
        ];
        for (home, reports, expected) in cases {
            assert_eq!(&route_cell("u1", home, &cells(reports)), expected, "home {home} {reports:?}");
        }
        let err = route_cell("user-42", "eu", &[]).unwrap_err();
        assert_eq!(err.to_string(), "no healthy cell for user user-42");
        assert!(matches!(err, CellError::NoHealthyCell { .. }));
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-e]{1,2}"
    }

    proptest! {
        #[test]
        fn session_route_ignores_order_and_duplicates(
            recorded in proptest::option::of(name()),
            owners in proptest::collection::vec(name(), 1..6),
            alive in proptest::collection::vec(name(), 0..6),
            seed in any::<u64>(),
        ) {
            let owners_ref: Vec<&str> = owners.iter().map(String::as_str).collect();
            let alive_ref: Vec<&str> = alive.iter().map(String::as_str).collect();
            let expected = route_session("s", recorded.as_deref(), &owners_ref, &alive_ref);
            let mut shuffled_owners = owners_ref.clone();
            let mut shuffled_alive = alive_ref.clone();
            shuffled_owners.rotate_left(seed as usize % owners_ref.len());
            shuffled_owners.reverse();
            shuffled_owners.push(owners_ref[seed as usize % owners_ref.len()]);
            shuffled_alive.reverse();
            shuffled_alive.extend(alive_ref.iter().take(2));
            prop_assert_eq!(route_session("s", recorded.as_deref(), &shuffled_owners, &shuffled_alive), expected.clone());
            prop_assert_eq!(route_session("s", recorded.as_deref(), &owners_ref, &alive_ref), expected.clone());
            if let Ok(chosen) = expected {
                prop_assert!(alive_ref.contains(&chosen) && owners_ref.contains(&chosen));
            }
        }

        #[test]
        fn cell_route_ignores_order_and_duplicates(
            home in name(),
            reports in proptest::collection::vec((name(), any::<bool>()), 0..8),
        ) {
            let owned: Vec<CellReport> = reports.iter().map(|(n, h)| CellReport { name: n, healthy: *h }).collect();
            let expected = route_cell("u", &home, &owned);
            let mut shuffled = owned.clone();
            shuffled.reverse();
            shuffled.extend(owned.iter().filter(|r| r.healthy).cloned());
            prop_assert_eq!(route_cell("u", &home, &shuffled), expected.clone());
            if let Ok(cell) = expected {
                prop_assert!(owned.iter().filter(|r| r.name == cell).all(|r| r.healthy));
            }
        }
    }

    #[test]
    fn room_writers_are_stable_and_move_only_the_lost_nodes_rooms() {
        assert_eq!(room_writer("r", &[]), None);
        assert_eq!(room_writer("r", &["a"]), Some("a"));
        let all = ["a", "b", "c"];
        let rooms: Vec<String> = (0..300).map(|i| format!("room:{i}")).collect();
        let mut per_node = std::collections::BTreeMap::new();
        for room in &rooms {
            let writer = room_writer(room, &all).unwrap();
            assert_eq!(room_writer(room, &["c", "a", "b"]), Some(writer), "order must not matter");
            *per_node.entry(writer).or_insert(0) += 1;
            let without_b = room_writer(room, &["a", "c"]).unwrap();
            if writer != "b" {
                assert_eq!(without_b, writer, "{room} moved although its writer stayed");
            }
        }
        assert!(per_node.values().all(|n| (60..=140).contains(n)), "uneven spread: {per_node:?}");
    }
}
