//! The cluster's liveness table, fed by heartbeats: a peer is up once it was heard
//! `up_after` times in a row (each within the timeout of the one before) and stays up
//! while it is heard within the timeout; a draining peer is up but no longer a routing
//! candidate. Down fast, up carefully. Pure: the caller passes each heartbeat and the time.
//!
//! Each heartbeat also lists the peers of its sender's cell the sender routes to
//! ([`Heartbeats::routes_to`], at most [`MAX_ROUTES_LISTED`]): a joining node turns ready
//! once no live peer of its cell leaves it out ([`Heartbeats::not_routing_to`],
//! [`readiness`]), so a balancer that reads `/readyz` adds it only when the cluster
//! routes to it.

use std::collections::BTreeMap;

/// What a node announces in each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub cell: String,
    pub url: String,
    /// The node is draining: it still serves its connections but takes no new ones.
    pub draining: bool,
    /// When the node started (ms since the epoch; 0 from a node that does not say).
    pub started_at_ms: u64,
    /// Connections open on the node (`None` from a node of a build that does not say):
    /// what a rebalance plans with (`core::nodes::rebalance`).
    pub connections: Option<u64>,
    /// The connections it admits, its limit in force (`None`: not said): with
    /// `connections`, what placement weighs (`core::nodes::placement`).
    pub capacity: Option<u64>,
    /// What else it reports of its load, for operators (`None`: not said).
    pub usage: Option<Usage>,
    /// Whether the node's last probe of its cell's store passed (`None`: no report, from a
    /// node of an earlier build or one that has not probed yet): what its cell's breaker
    /// is fed (`core::nodes::breaker::CellBreakers`).
    pub probe: Option<bool>,
    /// The release the node belongs to (empty from an earlier build): sessions that must
    /// move go to the newest release first (`core::nodes::routing::release_first`).
    pub release: String,
    /// The peers of its cell the node routes to ([`Heartbeats::routes_to`]); `None` from an
    /// earlier build, which a joining node does not wait for.
    pub routes_to: Option<Vec<String>>,
}

impl NodeInfo {
    /// A node as a heartbeat's body says it, with nothing said of its load, probe, release
    /// or routes (an earlier build's heartbeat, before its headers are read).
    pub fn new(
        name: String,
        cell: String,
        url: String,
        draining: bool,
        started_at_ms: u64,
    ) -> Self {
        NodeInfo {
            name,
            cell,
            url,
            draining,
            started_at_ms,
            connections: None,
            capacity: None,
            usage: None,
            probe: None,
            release: String::new(),
            routes_to: None,
        }
    }
}

/// At most this many names in a heartbeat's [`NodeInfo::routes_to`], the most recently
/// started first: a joining node is the newest, so it is listed whatever the cell's size.
pub const MAX_ROUTES_LISTED: usize = 64;

/// Where a joining node is ([`readiness`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Every live peer of its cell routes to it (or it has none): ready.
    Ready,
    /// Some peer does not yet, or it has not listened one heartbeat period yet (it may
    /// not have heard every peer).
    Waiting,
    /// The wait is over and some peer still does not: ready anyway (the caller logs who).
    TimedOut,
}

/// Whether a node that joins may say it is ready: `missing` live peers of its cell do not
/// route to it yet ([`Heartbeats::not_routing_to`]); it has listened to heartbeats for
/// `listened_ms` (after `listen_ms` it has heard every live peer) and waited `waited_ms`
/// of at most `limit_ms`.
pub fn readiness(
    missing: usize,
    listened_ms: u64,
    listen_ms: u64,
    waited_ms: u64,
    limit_ms: u64,
) -> Readiness {
    let heard_everyone = listened_ms >= listen_ms;
    if heard_everyone && missing == 0 {
        Readiness::Ready
    } else if waited_ms >= limit_ms {
        Readiness::TimedOut
    } else {
        Readiness::Waiting
    }
}

/// A node's use of its machine over its last heartbeat period, as it reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time used per wall time, in thousandths of one core (2000: two cores busy).
    pub cpu_permille: u64,
    /// Resident memory.
    pub resident_bytes: u64,
    /// Events sent to its clients per second.
    pub deliveries_per_sec: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The heartbeat that made a peer up (its `up_after`-th in a row).
    Joined,
    /// Started or stopped draining.
    DrainingChanged,
    Unchanged,
}

#[derive(Debug, Clone)]
struct Heard {
    info: NodeInfo,
    at_ms: u64,
    /// Heartbeats in a row, each within the timeout of the one before.
    in_a_row: u32,
}

#[derive(Debug, Clone)]
pub struct Heartbeats {
    timeout_ms: u64,
    up_after: u32,
    peers: BTreeMap<String, Heard>,
}

impl Heartbeats {
    pub fn new(timeout_ms: u64, up_after: u32) -> Self {
        Heartbeats { timeout_ms, up_after: up_after.max(1), peers: BTreeMap::new() }
    }

    /// Record a heartbeat heard at `now_ms`.
    pub fn heard(&mut self, info: NodeInfo, now_ms: u64) -> Seen {
        let up_after = self.up_after;
        let (in_a_row, was_draining) = match self.peers.get(&info.name) {
            Some(last) if self.fresh(last.at_ms, now_ms) => {
                (last.in_a_row.saturating_add(1), Some(last.info.draining))
            }
            _ => (1, None),
        };
        let seen = if in_a_row == up_after {
            Seen::Joined
        } else if in_a_row > up_after && was_draining != Some(info.draining) {
            Seen::DrainingChanged
        } else {
            Seen::Unchanged
        };
        self.peers.insert(info.name.clone(), Heard { info, at_ms: now_ms, in_a_row });
        seen
    }

    /// A node said goodbye (or is known gone): down at once.
    pub fn left(&mut self, name: &str) -> bool {
        self.peers.remove(name).is_some()
    }

    /// Forget peers not heard within the timeout; returns the names of those that were up.
    pub fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let timeout = self.timeout_ms;
        let stale: Vec<(String, bool)> = self
            .peers
            .iter()
            .filter(|(_, heard)| now_ms.saturating_sub(heard.at_ms) >= timeout)
            .map(|(name, heard)| (name.clone(), heard.in_a_row >= self.up_after))
            .collect();
        for (name, _) in &stale {
            self.peers.remove(name);
        }
        stale.into_iter().filter(|(_, was_up)| *was_up).map(|(name, _)| name).collect()
    }

    /// How long a peer stays alive without a heartbeat.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    fn fresh(&self, at_ms: u64, now_ms: u64) -> bool {
        now_ms.saturating_sub(at_ms) < self.timeout_ms
    }

    /// Peers up at `now_ms`, by name.
    pub fn alive(&self, now_ms: u64) -> impl Iterator<Item = &NodeInfo> {
        self.peers
            .values()
            .filter(move |heard| self.fresh(heard.at_ms, now_ms) && heard.in_a_row >= self.up_after)
            .map(|heard| &heard.info)
    }

    /// Peers heard within the timeout at `now_ms`, up or not yet (a node that is
    /// starting already has members in rooms' presence).
    pub fn recent(&self, now_ms: u64) -> impl Iterator<Item = &NodeInfo> {
        self.peers
            .values()
            .filter(move |heard| self.fresh(heard.at_ms, now_ms))
            .map(|heard| &heard.info)
    }

    /// Up peers that take new connections.
    pub fn candidates(&self, now_ms: u64) -> impl Iterator<Item = &NodeInfo> {
        self.alive(now_ms).filter(|info| !info.draining)
    }

    /// What this node's heartbeat lists: the candidates of `cell` it routes to, the most
    /// recently started first (ties by name), at most [`MAX_ROUTES_LISTED`].
    pub fn routes_to(&self, cell: &str, now_ms: u64) -> Vec<String> {
        let mut listed: Vec<&NodeInfo> =
            self.candidates(now_ms).filter(|info| info.cell == cell).collect();
        listed.sort_by(|a, b| {
            b.started_at_ms.cmp(&a.started_at_ms).then_with(|| a.name.cmp(&b.name))
        });
        listed.into_iter().take(MAX_ROUTES_LISTED).map(|info| info.name.clone()).collect()
    }

    /// The peers of `cell` heard now that take connections (a node still starting says it
    /// drains, and is not waited for) and whose last heartbeat did not list `me` among the
    /// nodes they route to, by name. A peer of an earlier build, which lists nothing, is
    /// not waited for.
    pub fn not_routing_to(&self, me: &str, cell: &str, now_ms: u64) -> Vec<String> {
        self.recent(now_ms)
            .filter(|info| info.cell == cell && info.name != me && !info.draining)
            .filter(|info| {
                info.routes_to.as_ref().is_some_and(|names| !names.iter().any(|n| n == me))
            })
            .map(|info| info.name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, draining: bool) -> NodeInfo {
        NodeInfo::new(name.into(), "c".into(), format!("http://{name}"), draining, 0)
    }

    fn names<'a>(it: impl Iterator<Item = &'a NodeInfo>) -> Vec<&'a str> {
        it.map(|i| i.name.as_str()).collect()
    }

    #[test]
    fn alive_while_heard_within_the_timeout() {
        let mut table = Heartbeats::new(3000, 1);
        let steps: &[(u64, Option<(&str, bool)>, Option<Seen>, &[&str], &[&str])] = &[
            (0, Some(("b", false)), Some(Seen::Joined), &["b"], &["b"]),
            (1000, Some(("c", false)), Some(Seen::Joined), &["b", "c"], &["b", "c"]),
            (1000, Some(("b", false)), Some(Seen::Unchanged), &["b", "c"], &["b", "c"]),
            (2000, Some(("b", true)), Some(Seen::DrainingChanged), &["b", "c"], &["c"]),
            (3999, None, None, &["b", "c"], &["c"]),
            (4000, None, None, &["b"], &[]),
            (5000, None, None, &[], &[]),
            (5001, Some(("b", false)), Some(Seen::Joined), &["b"], &["b"]),
        ];
        for (i, (now, beat, seen, alive, candidates)) in steps.iter().enumerate() {
            if let Some((name, draining)) = beat {
                assert_eq!(Some(table.heard(info(name, *draining), *now)), *seen, "step {i}");
            }
            assert_eq!(names(table.alive(*now)), *alive, "step {i}");
            assert_eq!(names(table.candidates(*now)), *candidates, "step {i}");
        }
    }

    #[test]
    fn up_only_after_several_heartbeats_in_a_row() {
        let mut table = Heartbeats::new(3000, 3);
        let steps: &[(u64, Seen, &[&str], &[&str])] = &[
            (0, Seen::Unchanged, &[], &["b"]),
            (1000, Seen::Unchanged, &[], &["b"]),
            (2000, Seen::Joined, &["b"], &["b"]),
            (3000, Seen::Unchanged, &["b"], &["b"]),
            // A gap longer than the timeout: down, and three in a row again.
            (6500, Seen::Unchanged, &[], &["b"]),
            (7000, Seen::Unchanged, &[], &["b"]),
            (8000, Seen::Joined, &["b"], &["b"]),
        ];
        for (i, (now, seen, alive, recent)) in steps.iter().enumerate() {
            assert_eq!(table.heard(info("b", false), *now), *seen, "step {i}");
            assert_eq!(names(table.alive(*now)), *alive, "step {i}");
            assert_eq!(names(table.recent(*now)), *recent, "step {i}");
        }
        // Only a peer that was up is reported down when it goes quiet; one heard once stays heard.
        table.heard(info("c", false), 9000);
        assert_eq!(table.expire(11_000), vec!["b".to_string()]);
        assert_eq!(names(table.recent(11_000)), vec!["c"]);
    }

    #[test]
    fn expire_and_leave() {
        let mut table = Heartbeats::new(3000, 1);
        table.heard(info("b", false), 0);
        table.heard(info("c", false), 2000);
        assert_eq!(table.expire(2999), Vec::<String>::new());
        assert_eq!(table.expire(3000), vec!["b".to_string()]);
        assert!(table.left("c"));
        assert!(!table.left("c"));
        assert_eq!(names(table.alive(3000)), Vec::<&str>::new());
    }

    #[test]
    fn a_heartbeat_lists_the_newest_candidates_of_its_cell() {
        let mut table = Heartbeats::new(3000, 1);
        for (name, cell, draining, started) in [
            ("b", "c", false, 10),
            ("c", "c", false, 30),
            ("d", "c", true, 40),
            ("e", "x", false, 50),
            ("f", "c", false, 30),
        ] {
            table.heard(
                NodeInfo { cell: cell.into(), started_at_ms: started, ..info(name, draining) },
                0,
            );
        }
        assert_eq!(
            table.routes_to("c", 0),
            vec!["c", "f", "b"],
            "newest first, not draining, its cell only"
        );
        for i in 0..(MAX_ROUTES_LISTED + 10) {
            table.heard(
                NodeInfo { started_at_ms: 100 + i as u64, ..info(&format!("n{i:03}"), false) },
                0,
            );
        }
        let listed = table.routes_to("c", 0);
        assert_eq!(listed.len(), MAX_ROUTES_LISTED);
        assert_eq!(
            listed[0],
            format!("n{:03}", MAX_ROUTES_LISTED + 9),
            "the newest is listed whatever the cell's size"
        );
    }

    #[test]
    fn a_joining_node_waits_for_the_live_peers_of_its_cell_that_do_not_route_to_it() {
        let mut table = Heartbeats::new(3000, 3);
        let routes = |names: &[&str]| Some(names.iter().map(|n| n.to_string()).collect());
        table.heard(NodeInfo { routes_to: routes(&["x", "me"]), ..info("b", false) }, 0);
        table.heard(NodeInfo { routes_to: routes(&["x"]), ..info("c", false) }, 0);
        table.heard(NodeInfo { routes_to: routes(&[]), ..info("d", true) }, 0); // starting itself
        table.heard(NodeInfo { routes_to: None, ..info("e", false) }, 0); // an earlier build
        table.heard(NodeInfo { routes_to: routes(&[]), cell: "y".into(), ..info("f", false) }, 0); // another cell
        assert_eq!(
            table.not_routing_to("me", "c", 100),
            vec!["c"],
            "heard once is live: not up yet, still waited for"
        );
        table.heard(NodeInfo { routes_to: routes(&["me"]), ..info("c", false) }, 1000);
        assert!(table.not_routing_to("me", "c", 1000).is_empty());
        // A peer that went quiet is not waited for once it times out.
        table.heard(NodeInfo { routes_to: routes(&[]), ..info("c", false) }, 2000);
        assert_eq!(table.not_routing_to("me", "c", 4999), vec!["c"]);
        assert!(table.not_routing_to("me", "c", 5000).is_empty());
    }

    #[test]
    fn readiness_table() {
        use Readiness::*;
        // (missing, listened, waited, limit), listening 1500 ms.
        let cases = [
            (0, 1500, 0, 10_000, Ready),
            (0, 1499, 0, 10_000, Waiting),
            (0, 1499, 10_000, 10_000, TimedOut),
            (1, 5000, 9_999, 10_000, Waiting),
            (1, 5000, 10_000, 10_000, TimedOut),
            (2, 0, 0, 0, TimedOut),
            (0, 60_000, 60_000, 10_000, Ready),
        ];
        for (missing, listened, waited, limit, want) in cases {
            assert_eq!(
                readiness(missing, listened, 1500, waited, limit),
                want,
                "{missing} {listened} {waited} {limit}"
            );
        }
    }
}
