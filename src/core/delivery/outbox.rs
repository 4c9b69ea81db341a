//! A connection's outbox bound, as pure decisions: every byte the node holds for one
//! connection (room windows in its mailbox, replays, replies, pongs, errors, the Close,
//! what waits in its socket or SSE queue) counts against one `max_outbox_bytes`.
//!
//! - A connection is read from only while it holds less than the bound (at the bound it
//!   is full: the next request would take it over) and fewer than
//!   [`MAX_ANSWERS_PENDING`] of its requests wait for their answer ([`Outbox::may_read`]):
//!   over it, the socket is not read, the kernel's receive buffer fills and TCP pushes back
//!   on the client, so a client that does not read cannot make the node queue more.
//! - A reply to a request read under the bound is still queued (it was asked for), which
//!   is how a connection gets over the bound; it is closed (4009) once it has stayed at
//!   or over the bound for the grace ([`Outbox::observe`]).
//! - A history page is cut to what fits under the bound, at least one event
//!   ([`Outbox::page_fits`]); the client reads on from the last seq (`complete:false`).
//!
//! Time is a parameter (milliseconds); nothing here reads a clock.

/// How long a connection may stay over its bound before it is closed with 4009: a
/// client reading a large answer over a slow link gets this long to take it.
pub const GRACE_MS: u64 = 5_000;

/// Requests of one connection whose answers are not queued yet (history, presence and
/// subscribe, whose answers a room sends later); while this many wait, the socket is not
/// read, so the answers that can land after the bound was reached are bounded too.
pub const MAX_ANSWERS_PENDING: usize = 16;

/// One connection's bound and how long it has been over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outbox {
    max: usize,
    grace_ms: u64,
    /// Since when the connection has held `max` or more (None: it does not now).
    over_since: Option<u64>,
}

/// What the connection must do about what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Under the bound.
    Under,
    /// At or over the bound; closed unless under again within `close_in_ms`.
    Over { close_in_ms: u64 },
    /// At or over the bound for the whole grace: close as a slow consumer (4009).
    Close,
}

impl Outbox {
    pub fn new(max: usize, grace_ms: u64) -> Self {
        Outbox { max, grace_ms, over_since: None }
    }

    /// Whether the next client frame may be read, given the bytes `held` for the
    /// connection and its requests still waiting for an answer.
    pub fn may_read(&self, held: usize, answers_pending: usize) -> bool {
        !self.full(held) && answers_pending < MAX_ANSWERS_PENDING
    }

    /// Whether `held` bytes fill the bound (only then does [`Outbox::observe`] need the
    /// time, and only then is the connection not read).
    pub fn full(&self, held: usize) -> bool {
        held >= self.max
    }

    /// Note that the connection holds `held` bytes at `now_ms`: under the bound the grace
    /// is forgotten; at or over it, it starts (or goes on) and ends in [`Verdict::Close`].
    pub fn observe(&mut self, held: usize, now_ms: u64) -> Verdict {
        if !self.full(held) {
            self.over_since = None;
            return Verdict::Under;
        }
        let since = *self.over_since.get_or_insert(now_ms);
        match (since + self.grace_ms).checked_sub(now_ms) {
            Some(left) if left > 0 => Verdict::Over { close_in_ms: left },
            _ => Verdict::Close,
        }
    }

    /// How many of a page's events (their sizes in bytes, in order) to answer with when
    /// the connection holds `held` and the frame around them takes `overhead`: as many as
    /// fit under the bound, and at least one, so a client paging on always gets further.
    pub fn page_fits(
        &self,
        held: usize,
        overhead: usize,
        sizes: impl IntoIterator<Item = usize>,
    ) -> usize {
        let mut room = self.max.saturating_sub(held).saturating_sub(overhead);
        let mut count = 0;
        for size in sizes {
            // One byte more per event: the comma between them.
            let cost = size + 1;
            if cost > room && count > 0 {
                break;
            }
            room = room.saturating_sub(cost);
            count += 1;
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_the_bound_or_with_too_many_answers_pending() {
        let outbox = Outbox::new(1000, GRACE_MS);
        let cases = [
            // (held, answers pending, may read)
            (0, 0, true),
            (999, 0, true),
            (1000, 0, false),
            (5000, 0, false),
            (0, MAX_ANSWERS_PENDING - 1, true),
            (0, MAX_ANSWERS_PENDING, false),
            (999, MAX_ANSWERS_PENDING, false),
        ];
        for (held, pending, expected) in cases {
            assert_eq!(outbox.may_read(held, pending), expected, "held {held}, pending {pending}");
        }
    }

    #[test]
    fn over_the_bound_for_the_grace_closes() {
        // (held, now, verdict), observed in order on one connection.
        let steps = [
            (500, 0, Verdict::Under),
            (999, 10, Verdict::Under),
            (1000, 100, Verdict::Over { close_in_ms: 5000 }),
            (4000, 2100, Verdict::Over { close_in_ms: 3000 }),
            // Under again: the grace starts over next time.
            (900, 3000, Verdict::Under),
            (2000, 4000, Verdict::Over { close_in_ms: 5000 }),
            (2000, 8999, Verdict::Over { close_in_ms: 1 }),
            (1500, 9000, Verdict::Close),
            (1500, 20000, Verdict::Close),
        ];
        let mut outbox = Outbox::new(1000, 5000);
        for (held, now, expected) in steps {
            assert_eq!(outbox.observe(held, now), expected, "held {held} at {now}");
        }
    }

    #[test]
    fn a_zero_grace_closes_at_once() {
        let mut outbox = Outbox::new(10, 0);
        assert_eq!(outbox.observe(10, 7), Verdict::Close);
    }

    #[test]
    fn a_page_is_cut_to_what_fits_but_never_to_nothing() {
        let outbox = Outbox::new(1000, GRACE_MS);
        let cases: &[(usize, usize, &[usize], usize)] = &[
            // (held, overhead, event sizes, events answered)
            (0, 100, &[100, 100, 100], 3),
            (0, 100, &[299, 299, 299, 299], 3),
            (0, 100, &[300, 300, 300], 2),
            (600, 100, &[100, 100, 100], 2),
            (990, 100, &[100, 100], 1),
            (5000, 100, &[100, 100], 1),
            (0, 0, &[5000, 1], 1),
            (0, 100, &[], 0),
        ];
        for &(held, overhead, sizes, expected) in cases {
            assert_eq!(
                outbox.page_fits(held, overhead, sizes.iter().copied()),
                expected,
                "held {held}, sizes {sizes:?}"
            );
        }
    }
}
