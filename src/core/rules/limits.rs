//! Abuse limits as pure state: a token bucket for rates (also a rebalance's pace) and a
//! per-minute strike count for refused messages. Time is a parameter (milliseconds); nothing here reads a clock.

/// A token bucket: `rate` tokens per second, holding at most `burst`. A rate of 0 means
/// no limit. Counted in thousandths of a token, so refills are exact: a millisecond at
/// `rate` per second adds `rate` thousandths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    thousandths: u64,
    last_ms: u64,
}

/// One token, in thousandths.
const TOKEN: u64 = 1000;

impl TokenBucket {
    /// A full bucket at `now_ms`.
    pub fn new(burst: u64, now_ms: u64) -> Self {
        TokenBucket { thousandths: burst.saturating_mul(TOKEN), last_ms: now_ms }
    }

    /// What came in since the last look (time going back adds nothing).
    fn refill(&mut self, rate: u64, burst: u64, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_ms);
        self.last_ms = self.last_ms.max(now_ms);
        self.thousandths = self
            .thousandths
            .saturating_add(elapsed.saturating_mul(rate))
            .min(burst.saturating_mul(TOKEN));
    }

    /// Take one token if there is one. On refusal, the milliseconds until one is back.
    pub fn take(&mut self, rate: u64, burst: u64, now_ms: u64) -> Result<(), u64> {
        if rate == 0 {
            return Ok(());
        }
        self.refill(rate, burst, now_ms);
        if self.thousandths >= TOKEN {
            self.thousandths -= TOKEN;
            Ok(())
        } else {
            Err(self.wait_ms(rate, burst, now_ms))
        }
    }

    /// Give back a token taken but not spent; the bucket still holds at most `burst`.
    pub fn refund(&mut self, rate: u64, burst: u64, now_ms: u64) {
        self.refill(rate, burst, now_ms);
        self.thousandths = self.thousandths.saturating_add(TOKEN).min(burst.saturating_mul(TOKEN));
    }

    /// Milliseconds from `now_ms` until a token is there (0: now).
    pub fn wait_ms(&mut self, rate: u64, burst: u64, now_ms: u64) -> u64 {
        if rate == 0 {
            return 0;
        }
        self.refill(rate, burst, now_ms);
        TOKEN.saturating_sub(self.thousandths).div_ceil(rate)
    }

    /// Whether the bucket would be full again by `now_ms` (the entry can be forgotten).
    pub fn is_full(&self, rate: u64, burst: u64, now_ms: u64) -> bool {
        let refilled = now_ms.saturating_sub(self.last_ms).saturating_mul(rate);
        rate == 0 || self.thousandths.saturating_add(refilled) >= burst.saturating_mul(TOKEN)
    }
}

/// The burst a rate allows: twice the rate per second, at least 1.
pub fn burst_for(rate: u64) -> u64 {
    rate.saturating_mul(2).max(1)
}

/// The burst of a connection's room starts: twice the rate, and at least
/// `max_subscriptions`, so a connection may subscribe to all the rooms it is allowed at
/// once on a node where none is live yet (after a restart), and to more only at the rate.
pub fn room_start_burst(rate: u64, max_subscriptions: usize) -> u64 {
    burst_for(rate).max(max_subscriptions as u64)
}

/// Strikes against a connection (refused messages) in the current minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Strikes {
    count: u64,
    window_start_ms: u64,
}

pub const STRIKE_WINDOW_MS: u64 = 60_000;

impl Strikes {
    /// Count one strike; true when this one goes over `max` in the current minute.
    pub fn strike(&mut self, max: u64, now_ms: u64) -> bool {
        if now_ms.saturating_sub(self.window_start_ms) >= STRIKE_WINDOW_MS {
            self.window_start_ms = now_ms;
            self.count = 0;
        }
        self.count += 1;
        self.count > max
    }
}

/// A `history` read asked for more events than `max_history_limit` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("limit must be at most {max}")]
pub struct HistoryLimitTooHigh {
    pub max: usize,
}

/// How many events a `history` read returns: the `limit` asked, else `default` (never
/// above `max`); a limit above `max` is refused, not cut.
pub fn history_limit(
    asked: Option<usize>,
    default: usize,
    max: usize,
) -> Result<usize, HistoryLimitTooHigh> {
    match asked {
        Some(limit) if limit > max => Err(HistoryLimitTooHigh { max }),
        Some(limit) => Ok(limit),
        None => Ok(default.min(max)),
    }
}

/// Heartbeat periods without a word from a client before it is closed (4008).
pub const MISSED_HEARTBEATS: u32 = 3;

/// Whether a connection's client went silent for too long: `silent_for` since it was last
/// heard, against `MISSED_HEARTBEATS` periods of `heartbeat`. Only a client that can speak
/// counts (a WebSocket, `reads`); an SSE client sends nothing, and one that is gone shows
/// up as its stream ending.
pub fn client_timed_out(
    reads: bool,
    silent_for: std::time::Duration,
    heartbeat: std::time::Duration,
) -> bool {
    reads && silent_for >= heartbeat * MISSED_HEARTBEATS
}

/// How much history a room keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retention {
    pub max_events: usize,
    pub max_age_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_limit_takes_the_ask_or_the_default_and_refuses_above_the_max() {
        // (asked, default, max) -> answer
        let table = [
            (None, 100, 1000, Ok(100)),
            (None, 100, 50, Ok(50)),
            (Some(0), 100, 1000, Ok(0)),
            (Some(1000), 100, 1000, Ok(1000)),
            (Some(1001), 100, 1000, Err(HistoryLimitTooHigh { max: 1000 })),
            (Some(usize::MAX), 100, 1000, Err(HistoryLimitTooHigh { max: 1000 })),
        ];
        for (asked, default, max, want) in table {
            assert_eq!(
                history_limit(asked, default, max),
                want,
                "asked {asked:?}, default {default}, max {max}"
            );
        }
        assert_eq!(HistoryLimitTooHigh { max: 7 }.to_string(), "limit must be at most 7");
    }

    #[test]
    fn a_client_times_out_after_three_silent_heartbeats_and_an_sse_client_never() {
        use std::time::Duration;
        let beat = Duration::from_secs(10);
        // (reads, silent for) -> timed out
        let table = [
            (true, Duration::ZERO, false),
            (true, Duration::from_millis(29_999), false),
            (true, Duration::from_secs(30), true),
            (true, Duration::from_secs(3600), true),
            (false, Duration::from_secs(30), false),
            (false, Duration::from_secs(3600), false),
        ];
        for (reads, silent, want) in table {
            assert_eq!(
                client_timed_out(reads, silent, beat),
                want,
                "reads {reads}, silent {silent:?}"
            );
        }
    }

    #[test]
    fn bucket_table() {
        // (rate, burst, [(now_ms, expected)]) from a full bucket at 0.
        let cases: &[(u64, u64, &[(u64, Result<(), u64>)])] = &[
            (0, 1, &[(0, Ok(())), (0, Ok(())), (0, Ok(()))]),
            (
                1,
                2,
                &[
                    (0, Ok(())),
                    (0, Ok(())),
                    (0, Err(1000)),
                    (500, Err(500)),
                    (1000, Ok(())),
                    (1000, Err(1000)),
                ],
            ),
            (10, 20, &[(0, Ok(())); 20]),
            (2, 1, &[(0, Ok(())), (100, Err(400)), (500, Ok(()))]),
            // Time going backwards refills nothing and breaks nothing.
            (1, 1, &[(5000, Ok(())), (1000, Err(1000)), (6000, Ok(()))]),
        ];
        for (rate, burst, steps) in cases {
            let mut bucket = TokenBucket::new(*burst, 0);
            for (i, (now, expected)) in steps.iter().enumerate() {
                assert_eq!(
                    bucket.take(*rate, *burst, *now),
                    *expected,
                    "rate {rate} burst {burst} step {i}"
                );
            }
        }
        let mut bucket = TokenBucket::new(20, 0);
        for _ in 0..20 {
            bucket.take(10, 20, 0).unwrap();
        }
        assert_eq!(bucket.take(10, 20, 0), Err(100));
        assert!(!bucket.is_full(10, 20, 1000));
        assert!(bucket.is_full(10, 20, 2000));
    }

    #[test]
    fn strikes_table() {
        let mut strikes = Strikes::default();
        let over: Vec<bool> = (0..5).map(|_| strikes.strike(3, 10)).collect();
        assert_eq!(over, [false, false, false, true, true]);
        // A new minute starts over.
        assert!(!strikes.strike(3, 10 + STRIKE_WINDOW_MS));
        assert!(!strikes.strike(3, 10 + STRIKE_WINDOW_MS));
        assert_eq!(burst_for(0), 1);
        assert_eq!(burst_for(50), 100);
        assert_eq!(room_start_burst(10, 128), 128);
        assert_eq!(room_start_burst(100, 128), 200);
        assert_eq!(room_start_burst(0, 0), 1);
    }
}
