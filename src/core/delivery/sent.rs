//! Which events of one room a connection has already sent: the contiguous run of seqs
//! `(lo, hi]`. Lets a resubscribe with an older `since` replay what the client missed
//! without sending anything twice on the same connection. Pure bookkeeping.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SentRange {
    lo: u64,
    hi: u64,
}

impl SentRange {
    /// Whether `seq` went out on this connection already.
    pub fn contains(&self, seq: u64) -> bool {
        self.lo < seq && seq <= self.hi
    }

    /// The last seq handled (0: none yet): what the client is caught up to.
    pub fn last(&self) -> u64 {
        self.hi
    }

    /// A live event was handled (sent, or not for this device).
    pub fn on_live(&mut self, seq: u64) {
        if seq == self.hi + 1 {
            self.hi = seq;
        } else if !self.contains(seq) {
            *self = SentRange { lo: seq - 1, hi: seq };
        }
    }

    /// Whether any seq of `first..=last` went out already.
    pub fn overlaps(&self, first: u64, last: u64) -> bool {
        first <= self.hi && last > self.lo && self.hi > self.lo
    }

    /// The live events `first..=last` (ascending, contiguous) were handled: the same as
    /// [`on_live`] for each of them, in constant time.
    ///
    /// [`on_live`]: SentRange::on_live
    pub fn on_live_run(&mut self, first: u64, last: u64) {
        if first > last {
            return;
        }
        if first == self.hi + 1 || self.contains(first) {
            self.hi = self.hi.max(last);
        } else {
            *self = SentRange { lo: first - 1, hi: last };
        }
    }

    /// A (re)subscribe was answered with `head`. `replayed_after` is `Some(since)` when
    /// every event after `since` up to `head` was replayed (minus what [`contains`] said
    /// was sent already); `None` for a live-only or unrecovered subscribe.
    ///
    /// [`contains`]: SentRange::contains
    pub fn on_subscribed(&mut self, head: u64, replayed_after: Option<u64>) {
        let nonempty = self.hi > self.lo;
        *self = match replayed_after {
            // The replay joins the run sent before: one contiguous run again.
            Some(since) if nonempty && since <= self.hi => {
                SentRange { lo: self.lo.min(since), hi: self.hi.max(head) }
            }
            Some(since) => SentRange { lo: since, hi: head },
            // Live from `head`: the run continues only if nothing lies between.
            None if nonempty && head == self.hi => *self,
            None => SentRange { lo: head, hi: head },
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum Step {
        Subscribed(u64, Option<u64>),
        Live(u64),
    }

    /// Runs `steps`, replaying `replay` seqs before each `Subscribed` step that has a
    /// `since`, and returns the seqs that would have been sent.
    fn run(steps: &[Step]) -> Vec<u64> {
        let mut range = SentRange::default();
        let mut sent = Vec::new();
        for step in steps {
            match *step {
                Step::Subscribed(head, since) => {
                    if let Some(since) = since {
                        sent.extend((since + 1..=head).filter(|s| !range.contains(*s)));
                    }
                    range.on_subscribed(head, since);
                }
                Step::Live(seq) => {
                    if !range.contains(seq) {
                        sent.push(seq);
                    }
                    range.on_live(seq);
                }
            }
        }
        sent
    }

    #[test]
    fn table() {
        use Step::*;
        let cases: &[(&[Step], &[u64])] = &[
            // Live only, then live events.
            (&[Subscribed(5, None), Live(6), Live(7)], &[6, 7]),
            // Recovery on a fresh connection.
            (&[Subscribed(5, Some(2)), Live(6)], &[3, 4, 5, 6]),
            // The inbox case: automatic live-only subscribe at head 5, then an explicit
            // resubscribe from 2 must still replay 3..=5.
            (&[Subscribed(5, None), Subscribed(5, Some(2))], &[3, 4, 5]),
            // A live event arrived before the resubscribe: replay skips it.
            (&[Subscribed(5, None), Live(6), Subscribed(6, Some(2)), Live(7)], &[6, 3, 4, 5, 7]),
            // Resubscribing from an older point again sends nothing twice.
            (
                &[Subscribed(4, Some(0)), Live(5), Subscribed(5, Some(1)), Subscribed(5, Some(0))],
                &[1, 2, 3, 4, 5],
            ),
            // A live-only resubscribe after a gap starts a new run.
            (
                &[Subscribed(3, Some(0)), Subscribed(9, None), Live(10), Subscribed(10, Some(3))],
                &[1, 2, 3, 10, 4, 5, 6, 7, 8, 9],
            ),
            // The client claims more than this connection sent: trust it from there on.
            (&[Subscribed(2, Some(0)), Subscribed(8, Some(5)), Live(9)], &[1, 2, 6, 7, 8, 9]),
        ];
        for (i, (steps, expected)) in cases.iter().enumerate() {
            assert_eq!(run(steps), *expected, "case {i}");
        }
    }

    /// `on_live_run` and `overlaps` agree with `on_live` and `contains` seq by seq, from
    /// every small starting range.
    #[test]
    fn runs_match_single_events() {
        for lo in 0..6u64 {
            for hi in lo..8 {
                for first in 1..10u64 {
                    for last in first..12 {
                        let start = SentRange { lo, hi };
                        let mut one_by_one = start;
                        (first..=last).for_each(|seq| one_by_one.on_live(seq));
                        let mut run = start;
                        run.on_live_run(first, last);
                        assert_eq!(run, one_by_one, "from {start:?} with {first}..={last}");
                        let any = (first..=last).any(|seq| start.contains(seq));
                        assert_eq!(
                            start.overlaps(first, last),
                            any,
                            "{start:?} overlaps {first}..={last}"
                        );
                    }
                }
            }
        }
    }
}
