//! Retry delays as pure state: exponential backoff, optionally with full jitter. The
//! randomness is a parameter (a uniform `u64` the caller draws, `world::random_u64` in
//! production), so a run's delays are reproducible in tests; nothing here sleeps or reads
//! a clock. [`Backoff`] is one retry loop's position; [`BackoffPolicy::delay`] is the same
//! rule without state, for a caller that keeps its own attempt counts (one per room, say).

use std::time::Duration;

/// How delays grow: `first`, doubling with each retry up to `max`. With [`Jitter::Full`]
/// each delay is drawn from zero up to that ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    pub first: Duration,
    pub max: Duration,
    pub jitter: Jitter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// The ceiling itself: a fixed schedule.
    None,
    /// Uniform in `[0, ceiling]` ("full jitter"): the retries of many clients that failed
    /// together spread over the window instead of arriving together again.
    Full,
}

impl BackoffPolicy {
    /// The longest delay before retry number `attempt` (0 is the first retry):
    /// `first * 2^attempt`, at most `max`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        self.first.checked_mul(2u32.saturating_pow(attempt)).map_or(self.max, |d| d.min(self.max))
    }

    /// The delay before retry number `attempt`, given `roll`, a uniformly random `u64`
    /// (ignored without jitter).
    pub fn delay(&self, attempt: u32, roll: u64) -> Duration {
        let ceiling = self.ceiling(attempt);
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => fraction(ceiling, roll),
        }
    }
}

/// `roll / u64::MAX` of `span`: zero for a roll of 0, all of it for `u64::MAX`. Spans
/// beyond `u64::MAX` nanoseconds (584 years) count as that.
fn fraction(span: Duration, roll: u64) -> Duration {
    let span = u128::from(u64::try_from(span.as_nanos()).unwrap_or(u64::MAX));
    let nanos = span * u128::from(roll) / u128::from(u64::MAX);
    Duration::from_nanos(nanos as u64) // at most `span`, which fits
}

/// One retry loop's place in its policy: the retries since the last success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    policy: BackoffPolicy,
    attempt: u32,
}

impl Backoff {
    pub const fn new(policy: BackoffPolicy) -> Self {
        Backoff { policy, attempt: 0 }
    }

    /// The delay before the next retry (see [`BackoffPolicy::delay`]); counts the retry.
    pub fn next_delay(&mut self, roll: u64) -> Duration {
        let delay = self.policy.delay(self.attempt, roll);
        self.attempt = self.attempt.saturating_add(1);
        delay
    }

    /// After a success: the next delay is the first one again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Retries since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    pub fn policy(&self) -> &BackoffPolicy {
        &self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn policy(first: u64, max: u64, jitter: Jitter) -> BackoffPolicy {
        BackoffPolicy { first: ms(first), max: ms(max), jitter }
    }

    #[test]
    fn delays() {
        let half = u64::MAX / 2;
        // (policy, roll for every retry, the delays of the first retries in ms)
        let cases: [(BackoffPolicy, u64, &[u64]); 8] = [
            (policy(500, 5000, Jitter::None), 0, &[500, 1000, 2000, 4000, 5000, 5000, 5000]),
            (policy(500, 5000, Jitter::Full), u64::MAX, &[500, 1000, 2000, 4000, 5000, 5000, 5000]),
            (policy(500, 5000, Jitter::Full), 0, &[0, 0, 0, 0, 0]),
            (policy(500, 5000, Jitter::Full), half, &[249, 499, 999, 1999, 2499, 2499]),
            (policy(100, 350, Jitter::None), 7, &[100, 200, 350, 350]),
            (policy(0, 5000, Jitter::None), 0, &[0, 0, 0]),
            (policy(9000, 5000, Jitter::None), 0, &[5000, 5000]),
            (policy(1, u64::MAX, Jitter::None), 0, &[1, 2, 4, 8, 16]),
        ];
        for (policy, roll, want) in cases {
            let mut backoff = Backoff::new(policy);
            let got: Vec<u64> =
                want.iter().map(|_| backoff.next_delay(roll).as_millis() as u64).collect();
            assert_eq!(got, want, "{policy:?} roll {roll}");
            assert_eq!(backoff.attempts(), want.len() as u32);
            backoff.reset();
            assert_eq!(
                (backoff.attempts(), backoff.next_delay(roll).as_millis() as u64),
                (0, want[0]),
                "reset: {policy:?}"
            );
        }
    }

    #[test]
    fn jitter_stays_under_the_ceiling_and_far_retries_do_not_overflow() {
        let full = policy(500, 5000, Jitter::Full);
        for attempt in [0, 1, 3, 31, 32, 64, u32::MAX] {
            for roll in [0, 1, 12_345, u64::MAX / 3, u64::MAX - 1, u64::MAX] {
                assert!(
                    full.delay(attempt, roll) <= full.ceiling(attempt),
                    "attempt {attempt} roll {roll}"
                );
            }
        }
        assert_eq!(full.ceiling(u32::MAX), ms(5000));
        let huge = BackoffPolicy { first: Duration::MAX, max: Duration::MAX, jitter: Jitter::Full };
        assert_eq!(huge.ceiling(3), Duration::MAX);
        assert_eq!(
            huge.delay(3, u64::MAX),
            Duration::from_nanos(u64::MAX),
            "a huge span saturates instead of wrapping"
        );
        let mut backoff = Backoff::new(full);
        for _ in 0..100 {
            backoff.next_delay(1);
        }
        assert_eq!(backoff.policy().delay(backoff.attempts(), u64::MAX), ms(5000));
    }
}
