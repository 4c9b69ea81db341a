//! The liveness table of peer nodes: down after one failed probe, up only after several
//! successes in a row. Pure: the caller runs the probes and reports their outcomes.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    WentDown,
    CameUp,
}

#[derive(Debug, Clone, Default)]
struct Peer {
    alive: bool,
    successes: u32,
}

#[derive(Debug, Clone)]
pub struct Liveness {
    up_after: u32,
    peers: BTreeMap<String, Peer>,
}

impl Liveness {
    /// Peers start down: they must earn `up_after` successful probes first.
    pub fn new(peers: impl IntoIterator<Item = String>, up_after: u32) -> Self {
        Liveness {
            up_after: up_after.max(1),
            peers: peers.into_iter().map(|p| (p, Peer::default())).collect(),
        }
    }

    /// Record one probe of `peer`; returns the change it caused, if any.
    pub fn on_probe(&mut self, peer: &str, ok: bool) -> Option<Change> {
        let state = self.peers.get_mut(peer)?;
        if !ok {
            state.successes = 0;
            return std::mem::replace(&mut state.alive, false).then_some(Change::WentDown);
        }
        state.successes = state.successes.saturating_add(1);
        (!state.alive && state.successes >= self.up_after).then(|| {
            state.alive = true;
            Change::CameUp
        })
    }

    pub fn is_alive(&self, peer: &str) -> bool {
        self.peers.get(peer).is_some_and(|p| p.alive)
    }

    /// Alive peers, by name.
    pub fn alive(&self) -> impl Iterator<Item = &str> {
        self.peers.iter().filter(|(_, p)| p.alive).map(|(name, _)| name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_fast_up_carefully() {
        let mut table = Liveness::new(["b".to_string()], 3);
        let steps: &[(bool, Option<Change>, bool)] = &[
            (true, None, false),
            (true, None, false),
            (true, Some(Change::CameUp), true),
            (true, None, true),
            (false, Some(Change::WentDown), false),
            (false, None, false),
            (true, None, false),
            (false, None, false),
            (true, None, false),
            (true, None, false),
            (true, Some(Change::CameUp), true),
        ];
        for (i, (ok, change, alive)) in steps.iter().enumerate() {
            assert_eq!(table.on_probe("b", *ok), *change, "step {i}");
            assert_eq!(table.is_alive("b"), *alive, "step {i}");
        }
        assert_eq!(table.on_probe("unknown", true), None);
        assert_eq!(table.alive().collect::<Vec<_>>(), vec!["b"]);
    }
}
