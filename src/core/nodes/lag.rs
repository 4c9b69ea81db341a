//! How far a node's live copies of a room are behind the room's stream (cluster mode),
//! measured where the copies are applied, with no request to NATS.
//!
//! Why not "stream head − last seq applied", read from JetStream: everything a node hears
//! from NATS comes over its one connection, in order. When that link is slow, the
//! answer to a head read waits behind the very live copies it should be compared with,
//! so the head it brings is never far ahead of what already arrived: a slow link would
//! read as no lag. The events' own publish times do not have that blind spot.
//!
//! The two figures, for each event `s` a room applies here (its live copy, the writer's
//! own append, or a catch-up read), at time `now`, published (by the writer's clock,
//! `Lg-Ts`) at `t`:
//!
//! - **seconds**: `now − t`, the event's age when this node applied it;
//! - **events**: `s − 1 − x(t)`, where `x(t)` is the highest seq this node had applied by
//!   `t`: the events already published, when `s` was, that this node did not have yet.
//!   A node that keeps up reads 0 (it applied `s − 1` before `s` was published).
//!
//! `x` is kept as marks `(time, seq)`, one per [`MARK_SPACING_MS`] (the first time in it,
//! the last seq applied in it) for [`MARK_HORIZON_MS`]: at most [`MAX_MARKS`] per room.
//! A mark may credit a seq applied up to one spacing after `t`, and beyond the horizon
//! the oldest mark stands for `x(t)`: the events figure never counts more than were
//! behind, and a node that keeps up reads 0 (proptest). A
//! [`Reading`] is the last event's; it is reported for [`READING_FRESH_MS`] after it was
//! made (a room that applied nothing since reports nothing). The figures rest on the
//! nodes' clocks agreeing (NTP): a node whose clock runs behind the writer's by `δ` reads
//! `δ` less (never below 0), one ahead reads `δ` more.

use std::collections::VecDeque;

/// The least time between two kept marks.
pub const MARK_SPACING_MS: u64 = 250;
/// How far back the marks reach.
pub const MARK_HORIZON_MS: u64 = 60_000;
/// The most marks a room keeps.
pub const MAX_MARKS: usize = (MARK_HORIZON_MS / MARK_SPACING_MS) as usize + 2;
/// How long a room's last reading counts.
pub const READING_FRESH_MS: u64 = 15_000;

/// One event's lag as it was applied here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    /// Events published before it that this node had not applied when it was published.
    pub events: u64,
    /// Its age when applied, in milliseconds.
    pub millis: u64,
}

/// "By `at_ms`, this node had applied up to `seq`."
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    at_ms: u64,
    seq: u64,
}

/// One room's marks (see the module's doc).
#[derive(Debug, Default)]
pub struct FeedLag {
    marks: VecDeque<Mark>,
}

impl FeedLag {
    /// The room loaded up to `head` at `now_ms`: what it applied from then on is measured
    /// against that.
    pub fn loaded(&mut self, head: u64, now_ms: u64) {
        self.marks.clear();
        self.marks.push_back(Mark { at_ms: now_ms, seq: head });
    }

    /// The room applied event `seq`, published at `published_ms`, at `now_ms`: its lag.
    pub fn applied(&mut self, seq: u64, published_ms: u64, now_ms: u64) -> Reading {
        let reading = Reading {
            events: seq.saturating_sub(1).saturating_sub(self.applied_by(published_ms)),
            millis: now_ms.saturating_sub(published_ms),
        };
        self.mark(Mark { at_ms: now_ms, seq });
        reading
    }

    /// The highest seq applied by `t_ms` (an upper bound when `t_ms` is older than every
    /// mark; 0 with no mark).
    fn applied_by(&self, t_ms: u64) -> u64 {
        let later = self.marks.partition_point(|m| m.at_ms <= t_ms);
        match later {
            0 => self.marks.front().map_or(0, |m| m.seq),
            n => self.marks[n - 1].seq,
        }
    }

    fn mark(&mut self, mark: Mark) {
        match self.marks.back_mut() {
            // Not newer (a skip back after a new epoch, a clock step): start over.
            Some(last) if mark.seq < last.seq || mark.at_ms < last.at_ms => {
                self.marks.clear();
                self.marks.push_back(mark);
            }
            Some(last) if mark.seq == last.seq => {}
            // Within the spacing of the last mark's time: it now names this seq (so a
            // lookup may credit a seq applied up to a spacing later: an under-count).
            Some(last) if mark.at_ms - last.at_ms < MARK_SPACING_MS => last.seq = mark.seq,
            _ => self.marks.push_back(mark),
        }
        while self.marks.len() > MAX_MARKS
            || (self.marks.len() > 1
                && self.marks.front().is_some_and(|m| m.at_ms + MARK_HORIZON_MS < mark.at_ms))
        {
            self.marks.pop_front();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.marks.len()
    }
}

/// A room's last reading, when it still counts at `now_ms` (made at `at_ms`).
pub fn fresh(reading: Reading, at_ms: u64, now_ms: u64) -> Option<Reading> {
    (at_ms != 0 && now_ms.saturating_sub(at_ms) <= READING_FRESH_MS).then_some(reading)
}

/// The node's lag over its rooms: the worst room's events and seconds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Worst<N> {
    /// The most events any room is behind, and that room.
    pub events: u64,
    pub room: Option<N>,
    /// The oldest event applied lately, in milliseconds (any room).
    pub millis: u64,
    /// Rooms whose last reading is behind by at least one event.
    pub rooms_behind: u64,
}

/// The worst of `readings` (each room's fresh reading), in one pass.
pub fn worst<N>(readings: impl IntoIterator<Item = (N, Reading)>) -> Worst<N> {
    let mut worst = Worst { events: 0, room: None, millis: 0, rooms_behind: 0 };
    for (room, reading) in readings {
        worst.millis = worst.millis.max(reading.millis);
        if reading.events > 0 {
            worst.rooms_behind += 1;
            if reading.events > worst.events {
                worst.events = reading.events;
                worst.room = Some(room);
            }
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_node_that_keeps_up_reads_no_events_behind() {
        let mut lag = FeedLag::default();
        lag.loaded(10, 1_000);
        // One event every 50 ms, each applied 3 ms after it was published.
        for (i, seq) in (11..200).enumerate() {
            let published = 1_000 + 50 * i as u64;
            assert_eq!(
                lag.applied(seq, published, published + 3),
                Reading { events: 0, millis: 3 },
                "seq {seq}"
            );
        }
    }

    #[test]
    fn a_delayed_feed_reads_the_events_published_meanwhile() {
        // (published, applied) → (events, millis)
        let cases: &[(&str, u64, u64, u64, u64)] = &[
            ("every copy 300 ms late at 20 events a second: 5 behind", 50, 300, 5, 300),
            ("at 100 a second: 29 behind", 10, 300, 29, 300),
            ("late by less than the gap between events: none behind", 100, 60, 0, 60),
            ("2 s late at 50 a second", 20, 2_000, 99, 2_000),
        ];
        for &(what, every, late, events, millis) in cases {
            let mut lag = FeedLag::default();
            lag.loaded(0, 0);
            let mut last = Reading::default();
            for seq in 1..=400u64 {
                let published = 10_000 + seq * every;
                last = lag.applied(seq, published, published + late);
            }
            // Marks keep 250 ms apart: a reading may miss up to a mark's spacing of events.
            let slack = MARK_SPACING_MS / every + 1;
            assert!(
                last.events <= events && last.events + slack >= events,
                "{what}: {last:?}, want about {events}"
            );
            assert_eq!(last.millis, millis, "{what}");
        }
    }

    #[test]
    fn a_backlog_that_drains_reads_zero_again() {
        let mut lag = FeedLag::default();
        lag.loaded(0, 0);
        // 20 a second; the link stalls (seqs 20 to 79 arrive together at 5 s), then is fine.
        let (mut readings, mut applied) = (Vec::new(), 0);
        for seq in 1..=200u64 {
            let published = 1_000 + seq * 50;
            applied =
                if (20..80).contains(&seq) { 5_000 + seq } else { (published + 2).max(applied) };
            readings.push(lag.applied(seq, published, applied));
        }
        let worst = readings.iter().map(|r| r.events).max().unwrap();
        assert!((55..=60).contains(&worst), "the stall read about 60 behind: {worst}");
        assert_eq!(readings.last().unwrap(), &Reading { events: 0, millis: 2 });
    }

    #[test]
    fn beyond_the_horizon_the_oldest_mark_bounds_what_was_applied() {
        let mut lag = FeedLag::default();
        lag.loaded(100, 0);
        for seq in 101..=300u64 {
            lag.applied(seq, seq * 1_000, seq * 1_000 + 1);
        }
        assert!(lag.len() <= MAX_MARKS);
        // Published long before the oldest mark (about a minute back): at least the
        // events after that mark, never more than were truly behind (200).
        let reading = lag.applied(301, 1_000, 301_000);
        assert!((55..=200).contains(&reading.events), "{reading:?}");
    }

    #[test]
    fn a_skip_back_or_a_clock_step_starts_over() {
        let mut lag = FeedLag::default();
        lag.loaded(50, 10_000);
        lag.applied(51, 10_000, 10_010);
        // A new epoch: seqs start again.
        assert_eq!(lag.applied(1, 20_000, 20_001).events, 0);
        assert_eq!(lag.len(), 1);
        assert_eq!(lag.applied(2, 20_005, 20_006).events, 0);
        // The clock stepped back.
        lag.applied(3, 5_000, 5_001);
        assert_eq!(lag.len(), 1);
    }

    #[test]
    fn readings_count_while_fresh() {
        let reading = Reading { events: 3, millis: 400 };
        assert_eq!(fresh(reading, 1_000, 1_000 + READING_FRESH_MS), Some(reading));
        assert_eq!(fresh(reading, 1_000, 1_001 + READING_FRESH_MS), None);
        assert_eq!(fresh(reading, 0, 5), None, "never read");
    }

    #[test]
    fn the_worst_room_is_named() {
        let worst = worst([
            ("a", Reading { events: 0, millis: 900 }),
            ("b", Reading { events: 12, millis: 300 }),
            ("c", Reading { events: 40, millis: 200 }),
        ]);
        assert_eq!(worst, Worst { events: 40, room: Some("c"), millis: 900, rooms_behind: 2 });
        assert_eq!(
            super::worst::<&str>([]),
            Worst { events: 0, room: None, millis: 0, rooms_behind: 0 }
        );
    }

    proptest! {
        /// Whatever the delays, the events figure never exceeds the events truly published
        /// before and not applied (the marks only ever under-count), a node whose copies
        /// all arrive before the next publish reads 0, and the marks stay bounded.
        #[test]
        fn never_over_counts(gaps in prop::collection::vec(1u64..400, 1..300), delays in prop::collection::vec(0u64..3_000, 300)) {
            let mut lag = FeedLag::default();
            lag.loaded(0, 0);
            let mut published = Vec::new();
            let mut t = 1_000u64;
            for gap in &gaps {
                t += gap;
                published.push(t);
            }
            // Applied in order: each no earlier than the one before.
            let mut applied = Vec::new();
            let mut last = 0u64;
            for (i, p) in published.iter().enumerate() {
                last = last.max(p + delays[i]);
                applied.push(last);
            }
            for (i, (&p, &a)) in published.iter().zip(&applied).enumerate() {
                let seq = i as u64 + 1;
                let reading = lag.applied(seq, p, a);
                // Truly behind: events before seq not applied by p.
                let truly = (0..i).filter(|&j| applied[j] > p).count() as u64;
                prop_assert!(reading.events <= truly, "seq {} read {} truly {}", seq, reading.events, truly);
                if truly == 0 {
                    prop_assert_eq!(reading.events, 0);
                }
                prop_assert_eq!(reading.millis, a - p);
                prop_assert!(lag.len() <= MAX_MARKS);
            }
        }
    }
}
