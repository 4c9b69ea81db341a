//! The node's lifecycle: one [`Phase`], written by the supervisor and read by the HTTP
//! handlers (readiness, upgrades, status) and the liveness table (a draining node is no
//! routing candidate). [`Lifecycle`] holds it in a watch channel, so a reader can also
//! wait for a change.

use tokio::sync::watch;

/// Where the node is, from start to exit; the drain's steps in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Reconciling the directory; not ready yet.
    Starting,
    /// Reconciled, taking connections (its peers may route clients here), but not ready
    /// yet: waiting until every live peer of its cell counts it as a candidate (cluster
    /// mode), so a balancer that reads `/readyz` adds it only once the cluster routes to
    /// it (`core::nodes::heartbeats::Heartbeats::not_routing_to`, bounded by a timeout).
    Joining,
    Ready,
    /// Draining: readiness answers 503, upgrades are refused, the listener still accepts.
    NotReady,
    /// The listener is closed; connections are asked to reconnect elsewhere.
    Closing,
    /// The grace is over (or a second signal came): what is left is closed now.
    Forced,
    Done,
}

impl Phase {
    /// New WebSocket upgrades are accepted when ready, and while joining (a peer that
    /// counts this node routes clients here before `/readyz` says ready).
    pub fn accepts_connections(self) -> bool {
        matches!(self, Phase::Joining | Phase::Ready)
    }

    pub fn is_draining(self) -> bool {
        self >= Phase::NotReady
    }

    /// `starting`, `ready` or `draining`, as `/v1/admin/status` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting | Phase::Joining => "starting",
            Phase::Ready => "ready",
            _ => "draining",
        }
    }

    /// The `drain_phase` gauge: 0 while serving, then 1 (not ready) to 4 (done).
    pub fn drain_step(self) -> i64 {
        match self {
            Phase::Starting | Phase::Joining | Phase::Ready => 0,
            Phase::NotReady => 1,
            Phase::Closing => 2,
            Phase::Forced => 3,
            Phase::Done => 4,
        }
    }
}

/// The current phase; cheap to read from any thread.
#[derive(Debug)]
pub struct Lifecycle(watch::Sender<Phase>);

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle(watch::Sender::new(Phase::Starting))
    }
}

impl Lifecycle {
    pub fn set(&self, phase: Phase) {
        self.0.send_replace(phase);
    }

    pub fn phase(&self) -> Phase {
        *self.0.borrow()
    }

    /// Moves to `to` only from `from`; whether it did (a drain that began meanwhile wins).
    pub fn advance(&self, from: Phase, to: Phase) -> bool {
        self.0.send_if_modified(|phase| {
            let moved = *phase == from;
            if moved {
                *phase = to;
            }
            moved
        })
    }

    /// A receiver that sees every later change.
    pub fn watch(&self) -> watch::Receiver<Phase> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases() {
        use Phase::*;
        let cases = [
            (Starting, false, false, "starting", 0),
            (Joining, true, false, "starting", 0),
            (Ready, true, false, "ready", 0),
            (NotReady, false, true, "draining", 1),
            (Closing, false, true, "draining", 2),
            (Forced, false, true, "draining", 3),
            (Done, false, true, "draining", 4),
        ];
        for (phase, accepts, draining, name, step) in cases {
            assert_eq!(
                (
                    phase.accepts_connections(),
                    phase.is_draining(),
                    phase.name(),
                    phase.drain_step()
                ),
                (accepts, draining, name, step),
                "{phase:?}"
            );
        }
        let lifecycle = Lifecycle::default();
        let mut seen = lifecycle.watch();
        assert_eq!(lifecycle.phase(), Starting);
        lifecycle.set(Ready);
        assert!(seen.has_changed().unwrap());
        assert_eq!(*seen.borrow_and_update(), Ready);
        assert!(!lifecycle.advance(Joining, Ready), "only from the phase named");
        lifecycle.set(Joining);
        assert!(lifecycle.advance(Joining, Ready));
        assert_eq!(lifecycle.phase(), Ready);
    }
}
