//! The drain schedule: which connections are asked to reconnect when, so the next node
//! is not hit by one reconnect wave. Pure: counts and durations in, a plan out.

use std::time::Duration;

/// Closes are sent at most this often during the spread.
pub const DRAIN_TICK: Duration = Duration::from_millis(100);

/// One batch: connections `first..first + count` (in the caller's order) get their
/// Close at `at` after the close phase began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainBatch {
    pub at: Duration,
    pub first: usize,
    pub count: usize,
}

/// Spread `connections` closes evenly over `spread`, one batch per tick at most.
pub fn drain_batches(connections: usize, spread: Duration) -> Vec<DrainBatch> {
    if connections == 0 {
        return Vec::new();
    }
    let ticks = (spread.as_millis() / DRAIN_TICK.as_millis()).max(1) as usize;
    let batches = ticks.min(connections);
    (0..batches)
        .map(|b| {
            let first = connections * b / batches;
            let next = connections * (b + 1) / batches;
            DrainBatch { at: spread * b as u32 / batches as u32, first, count: next - first }
        })
        .collect()
}

/// The reconnect delay suggested to the `index`-th of `connections` closed connections:
/// spread evenly over `window`, so connections closed in one batch still come back apart.
pub fn reconnect_hint_ms(index: usize, connections: usize, window: Duration) -> u64 {
    let window_ms = window.as_millis().max(1) as u64;
    // A stride coprime with most counts scatters neighbours across the window.
    let slot = (index as u64).wrapping_mul(7919) % connections.max(1) as u64;
    window_ms * slot / connections.max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_every_connection_once_within_the_spread() {
        let ms = Duration::from_millis;
        let cases: &[(usize, Duration, usize)] = &[
            (0, ms(5000), 0),
            (1, ms(5000), 1),
            (7, ms(5000), 7),
            (200, ms(5000), 50),
            (200, ms(0), 1),
            (10_000, ms(5000), 50),
        ];
        for (n, spread, expected_batches) in cases {
            let plan = drain_batches(*n, *spread);
            assert_eq!(plan.len(), *expected_batches, "{n} over {spread:?}");
            let mut next = 0;
            for batch in &plan {
                assert_eq!(batch.first, next);
                assert!(batch.count >= 1 && batch.at <= *spread);
                next += batch.count;
            }
            assert_eq!(next, *n);
            assert!(plan.windows(2).all(|w| w[0].at < w[1].at));
        }
    }

    #[test]
    fn hints_differ_and_stay_in_the_window() {
        let window = Duration::from_secs(5);
        let hints: Vec<u64> = (0..200).map(|i| reconnect_hint_ms(i, 200, window)).collect();
        assert!(hints.iter().all(|h| *h < 5000));
        let mut distinct = hints.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 200, "every connection gets its own delay");
        assert_ne!(hints[0..10].iter().max(), hints[0..10].iter().min());
        assert_eq!(reconnect_hint_ms(0, 0, window), 0);
    }
}
