//! The cluster's liveness table, fed by heartbeats: a peer is alive while it was heard
//! within the timeout, and a draining peer is alive but no longer a routing candidate.
//! Pure: the caller passes each heartbeat and the time.

use std::collections::BTreeMap;

/// What a node announces in each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub cell: String,
    pub url: String,
    /// The node is draining: it still serves its connections but takes no new ones.
    pub draining: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// First heartbeat of a peer, or the first after it was down.
    Joined,
    /// Started or stopped draining.
    DrainingChanged,
    Unchanged,
}

#[derive(Debug, Clone)]
pub struct Heartbeats {
    timeout_ms: u64,
    peers: BTreeMap<String, (NodeInfo, u64)>,
}

impl Heartbeats {
    pub fn new(timeout_ms: u64) -> Self {
        Heartbeats { timeout_ms, peers: BTreeMap::new() }
    }

    /// Record a heartbeat heard at `now_ms`.
    pub fn heard(&mut self, info: NodeInfo, now_ms: u64) -> Seen {
        let seen = match self.peers.get(&info.name) {
            Some((old, at)) if self.fresh(*at, now_ms) => {
                if old.draining != info.draining { Seen::DrainingChanged } else { Seen::Unchanged }
            }
            _ => Seen::Joined,
        };
        self.peers.insert(info.name.clone(), (info, now_ms));
        seen
    }

    /// A node said goodbye (or is known gone): down at once.
    pub fn left(&mut self, name: &str) -> bool {
        self.peers.remove(name).is_some()
    }

    /// Forget peers not heard within the timeout; returns their names.
    pub fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let timeout = self.timeout_ms;
        let gone: Vec<String> = self
            .peers
            .iter()
            .filter(|(_, (_, at))| now_ms.saturating_sub(*at) >= timeout)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            self.peers.remove(name);
        }
        gone
    }

    /// How long a peer stays alive without a heartbeat.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    fn fresh(&self, at_ms: u64, now_ms: u64) -> bool {
        now_ms.saturating_sub(at_ms) < self.timeout_ms
    }

    /// Peers heard within the timeout at `now_ms`, by name.
    pub fn alive(&self, now_ms: u64) -> impl Iterator<Item = &NodeInfo> {
        self.peers.values().filter(move |(_, at)| self.fresh(*at, now_ms)).map(|(info, _)| info)
    }

    /// Alive peers that take new connections.
    pub fn candidates(&self, now_ms: u64) -> impl Iterator<Item = &NodeInfo> {
        self.alive(now_ms).filter(|info| !info.draining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, draining: bool) -> NodeInfo {
        NodeInfo { name: name.into(), cell: "c".into(), url: format!("http://{name}"), draining }
    }

    fn names<'a>(it: impl Iterator<Item = &'a NodeInfo>) -> Vec<&'a str> {
        it.map(|i| i.name.as_str()).collect()
    }

    #[test]
    fn alive_while_heard_within_the_timeout() {
        let mut table = Heartbeats::new(3000);
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
    fn expire_and_leave() {
        let mut table = Heartbeats::new(3000);
        table.heard(info("b", false), 0);
        table.heard(info("c", false), 2000);
        assert_eq!(table.expire(2999), Vec::<String>::new());
        assert_eq!(table.expire(3000), vec!["b".to_string()]);
        assert!(table.left("c"));
        assert!(!table.left("c"));
        assert_eq!(names(table.alive(3000)), Vec::<&str>::new());
    }
}
