//! A room's interest in its live feed, in cluster mode (interest-based fan-out): the
//! room's actor holds a subscription to the room's live subjects while it has
//! subscribers, and for [`FEED_LINGER`] after the last one left (against churn), then
//! drops it. A room without its feed takes nothing from other nodes; before it answers
//! a subscribe or a read it subscribes again and reads what it missed. Pure: the driver
//! (`actors/room/stream.rs`) passes `now` and carries out what this says.

use std::time::{Duration, Instant};

/// How long a room keeps its feed after its last subscriber left.
pub const FEED_LINGER: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No subscription: what other nodes store is not seen here.
    Off,
    /// Subscribing (and reading what was missed), holding the room's requests.
    Starting,
    /// Subscribed; `unwatched_since`: since when the room has had no subscriber.
    On { unwatched_since: Option<Instant> },
}

/// What the driver does after [`Interest::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing: the room is watched, or has no feed.
    Keep,
    /// Drop the feed now.
    Drop,
    /// Check again at this instant (one timer at a time is enough).
    CheckAt(Instant),
}

/// The feed of one room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    state: State,
}

impl Default for Interest {
    /// A room starts subscribing as it loads.
    fn default() -> Self {
        Interest { state: State::Starting }
    }
}

impl Interest {
    /// Whether a subscribe or a read must wait for the feed first (subscribe, read what
    /// was missed): `true` starts that, so the caller does it once.
    pub fn refeed(&mut self) -> bool {
        let off = self.state == State::Off;
        if off {
            self.state = State::Starting;
        }
        off
    }

    /// Subscribing (and reading what was missed) is in flight: requests that need the
    /// feed wait for it.
    pub fn starting(&self) -> bool {
        self.state == State::Starting
    }

    /// The subscription is in place.
    pub fn started(&mut self) {
        self.state = State::On { unwatched_since: None };
    }

    /// Subscribing failed: the next subscribe or read tries again.
    pub fn failed(&mut self) {
        self.state = State::Off;
    }

    /// The room's check, with whether it has subscribers now (on its periodic tick, when
    /// a subscriber leaves, and at the instant a previous check named).
    pub fn check(&mut self, watched: bool, now: Instant) -> Verdict {
        let State::On { unwatched_since } = &mut self.state else { return Verdict::Keep };
        match (watched, *unwatched_since) {
            (true, _) => {
                *unwatched_since = None;
                Verdict::Keep
            }
            (false, None) => {
                *unwatched_since = Some(now);
                Verdict::CheckAt(now + FEED_LINGER)
            }
            (false, Some(since)) if now.saturating_duration_since(since) >= FEED_LINGER => {
                self.state = State::Off;
                Verdict::Drop
            }
            (false, Some(since)) => Verdict::CheckAt(since + FEED_LINGER),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feed_goes_after_the_linger_without_subscribers_and_comes_back_on_demand() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut feed = Interest::default();
        assert!(!feed.refeed(), "a loading room is getting its feed");
        assert_eq!(feed.check(false, at(0)), Verdict::Keep, "nothing to drop while subscribing");
        feed.started();
        let steps = [
            (true, 0, Verdict::Keep),
            (false, 1_000, Verdict::CheckAt(at(6_000))),
            (false, 5_999, Verdict::CheckAt(at(6_000))),
            (true, 6_000, Verdict::Keep),
            (false, 7_000, Verdict::CheckAt(at(12_000))),
            (false, 11_999, Verdict::CheckAt(at(12_000))),
            (false, 12_000, Verdict::Drop),
            (false, 20_000, Verdict::Keep),
        ];
        for (watched, ms, verdict) in steps {
            assert_eq!(feed.check(watched, at(ms)), verdict, "watched {watched} at {ms} ms");
        }
        assert!(feed.refeed(), "the first subscribe or read after subscribes again");
        assert!(!feed.refeed(), "once");
        assert!(feed.starting(), "the others wait for it");
        feed.failed();
        assert!(feed.refeed(), "a failed subscribe is tried again by the next request");
        feed.started();
        assert!(!feed.refeed(), "a fed room does not subscribe again");
        assert_eq!(feed.check(true, at(30_000)), Verdict::Keep);
    }
}
