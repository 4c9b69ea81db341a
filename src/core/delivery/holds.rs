//! The requests a room holds instead of its mailbox. A room whose answer depends on a
//! read in flight (its log loading, its live feed being taken again, a subscriber's
//! `since` beyond its head) keeps the request here and goes on serving everything else:
//! publishes, other subscribers, unsubscribes. Each held request names what it waits
//! for ([`Until`]); [`Holds::release`] hands back, in arrival order, those whose wait is
//! over, given the room as it is now. Pure: the room actor passes `now` and the room's
//! state, and serves what comes back.
//!
//! Bounds: at most [`MAX_HELD`] requests per room (the one past it is answered at once,
//! from what the room has), and a wait for the head lasts at most [`AHEAD_WAIT`].

use std::time::{Duration, Instant};

/// How long a subscriber ahead of the room's head waits for the room's live copies to
/// reach its `since` before it is answered from what the room has.
pub const AHEAD_WAIT: Duration = Duration::from_secs(2);

/// Most requests one room holds; the next is answered at once.
pub const MAX_HELD: usize = 4096;

/// What a held request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The load in flight ends, read or failed (a publish then gets its answer, a refusal
    /// if the read failed).
    LoadEnds,
    /// The room's log is read (a subscriber of a room whose read failed waits for the
    /// next attempt that succeeds).
    Loaded,
    /// The room has taken its live feed again and read what it missed (or gave up).
    Fed,
    /// The room's durable head reaches `since`, or `deadline` passes.
    Head { since: u64, deadline: Instant },
}

/// The room, as much of it as decides whether a wait is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomNow {
    /// A read of the log is in flight (the first load, or one after a failure).
    pub loading: bool,
    /// The log is read (the room is live).
    pub loaded: bool,
    /// No retake of the live feed is in flight.
    pub fed: bool,
    /// The durable head.
    pub head: u64,
}

/// Why a held request is handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// What it waited for happened: serve it as if it just arrived (it may wait again,
    /// for something else).
    Ready,
    /// Its wait for the head ran out: answer it from what the room has now.
    TimedOut,
}

/// One room's held requests, in arrival order.
#[derive(Debug)]
pub struct Holds<T> {
    held: Vec<(Until, T)>,
}

impl<T> Default for Holds<T> {
    fn default() -> Self {
        Holds { held: Vec::new() }
    }
}

impl<T> Holds<T> {
    /// Hold `request` until `until`; `Err` gives it back when the room holds
    /// [`MAX_HELD`] already (answer it at once).
    pub fn hold(&mut self, until: Until, request: T) -> Result<(), T> {
        if self.held.len() >= MAX_HELD {
            return Err(request);
        }
        self.held.push((until, request));
        Ok(())
    }

    /// The requests whose wait is over in `room` at `now`, in arrival order.
    pub fn release(&mut self, room: RoomNow, now: Instant) -> Vec<(T, Released)> {
        let mut out = Vec::new();
        let mut kept = Vec::with_capacity(self.held.len());
        for (until, request) in self.held.drain(..) {
            let released = match until {
                Until::LoadEnds if !room.loading => Some(Released::Ready),
                Until::Loaded if room.loaded => Some(Released::Ready),
                Until::Fed if room.fed || !room.loaded => Some(Released::Ready),
                Until::Head { since, .. } if room.loaded && room.head >= since => {
                    Some(Released::Ready)
                }
                Until::Head { deadline, .. } if now >= deadline => Some(Released::TimedOut),
                _ => None,
            };
            match released {
                Some(why) => out.push((request, why)),
                None => kept.push((until, request)),
            }
        }
        self.held = kept;
        out
    }

    /// The earliest deadline of a wait for the head (when to call [`Holds::release`]
    /// even if nothing else happens).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.held
            .iter()
            .filter_map(|(until, _)| match until {
                Until::Head { deadline, .. } => Some(*deadline),
                _ => None,
            })
            .min()
    }

    /// Drop the held requests `keep` says no to (a connection that left).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.held.retain(|(_, request)| keep(request));
    }

    /// Held requests for which `is` holds (the room's held subscribes, say).
    pub fn count(&self, mut is: impl FnMut(&T) -> bool) -> usize {
        self.held.iter().filter(|(_, request)| is(request)).count()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn now_at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn each_wait_ends_with_what_it_waits_for_in_arrival_order() {
        let t0 = Instant::now();
        let deadline = now_at(t0, 2_000);
        let mut holds = Holds::default();
        for (until, name) in [
            (Until::LoadEnds, "publish while loading"),
            (Until::Fed, "read while refeeding"),
            (Until::Head { since: 7, deadline }, "subscribe since 7"),
            (Until::Head { since: 1_000_000_000_000, deadline }, "subscribe far ahead"),
            (Until::Loaded, "subscribe to a room whose read failed"),
        ] {
            holds.hold(until, name).unwrap();
        }
        let loading = RoomNow { loading: true, loaded: false, fed: false, head: 0 };
        assert_eq!(
            holds.release(loading, t0),
            vec![("read while refeeding", Released::Ready)],
            "a room not live has no feed to wait for"
        );
        let failed = RoomNow { loading: false, ..loading };
        assert_eq!(
            holds.release(failed, now_at(t0, 5)),
            vec![("publish while loading", Released::Ready)],
            "a failed read answers the publish"
        );
        let live = RoomNow { loading: false, loaded: true, fed: true, head: 6 };
        assert_eq!(
            holds.release(live, now_at(t0, 10)),
            vec![("subscribe to a room whose read failed", Released::Ready)]
        );
        assert_eq!(holds.next_deadline(), Some(deadline));
        assert_eq!(
            holds.release(RoomNow { head: 7, ..live }, now_at(t0, 20)),
            vec![("subscribe since 7", Released::Ready)]
        );
        assert!(
            holds.release(RoomNow { head: 9, ..live }, now_at(t0, 1_999)).is_empty(),
            "before its deadline"
        );
        assert_eq!(
            holds.release(RoomNow { head: 9, ..live }, deadline),
            vec![("subscribe far ahead", Released::TimedOut)]
        );
        assert!(holds.is_empty());
        assert_eq!(holds.next_deadline(), None);
    }

    #[test]
    fn a_room_holds_at_most_max_held_and_forgets_a_connection_that_left() {
        let mut holds = Holds::default();
        for i in 0..MAX_HELD {
            holds.hold(Until::Fed, i).unwrap();
        }
        assert_eq!(
            holds.hold(Until::Fed, MAX_HELD),
            Err(MAX_HELD),
            "the one past the bound is answered at once"
        );
        holds.retain(|i| i % 2 == 0);
        assert_eq!(holds.len(), MAX_HELD / 2);
        assert_eq!(holds.count(|i| *i < 10), 5);
    }

    proptest! {
        /// Whatever is held and however the room moves, every request comes back exactly
        /// once, a wait for the head never outlives its deadline, and what comes back
        /// together keeps its arrival order.
        #[test]
        fn every_request_comes_back_once_and_in_order(
            waits in proptest::collection::vec((0u8..4, 0u64..20, 0u64..3_000), 0..60),
            steps in proptest::collection::vec((any::<bool>(), any::<bool>(), any::<bool>(), 0u64..20, 0u64..500), 1..30),
        ) {
            let t0 = Instant::now();
            let mut holds = Holds::default();
            for (i, (kind, since, deadline)) in waits.iter().enumerate() {
                let until = match kind {
                    0 => Until::Loaded,
                    1 => Until::Fed,
                    2 => Until::LoadEnds,
                    _ => Until::Head { since: *since, deadline: now_at(t0, *deadline) },
                };
                holds.hold(until, (i, until)).unwrap();
            }
            let (mut seen, mut elapsed, mut head) = (vec![false; waits.len()], 0, 0);
            for (loading, loaded, fed, grow, wait) in steps {
                elapsed += wait;
                head += grow;
                let room = RoomNow { loading, loaded, fed, head };
                let now = now_at(t0, elapsed);
                let back = holds.release(room, now);
                prop_assert!(back.windows(2).all(|w| w[0].0.0 < w[1].0.0), "arrival order");
                for ((i, until), why) in back {
                    prop_assert!(!seen[i], "released twice");
                    seen[i] = true;
                    if why == Released::TimedOut {
                        let due = matches!(until, Until::Head { deadline, .. } if now >= deadline);
                        prop_assert!(due, "timed out before its deadline");
                    }
                }
                if let Some(deadline) = holds.next_deadline() {
                    prop_assert!(deadline > now, "a passed deadline was released");
                }
            }
            let end = RoomNow { loading: false, loaded: true, fed: true, head: u64::MAX };
            for ((i, _), _) in holds.release(end, now_at(t0, u64::from(u32::MAX))) {
                prop_assert!(!seen[i]);
                seen[i] = true;
            }
            prop_assert!(seen.into_iter().all(|s| s), "every request came back");
        }
    }
}
