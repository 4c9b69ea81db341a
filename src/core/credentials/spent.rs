//! Credentials this node knows are spent or void, checked first in a handshake, before
//! any read of the kick and revocation records or the nonce store (NATS in cluster
//! mode): a replayed credential costs no NATS message after its first refusal here.
//!
//! A nonce is remembered when this node sees it spent for good: its handshake opened a
//! connection here, the nonce store said it was used before, or the credential was
//! refused as revoked or kicked (a revocation or a kick never comes undone before the
//! credential expires). A nonce a refused handshake gives back (a refusal the client is
//! told to retry) is forgotten at once. What is remembered is never wrong in the
//! credential's favour: at worst a credential another node marked and then gave back
//! while it was replayed here concurrently stays refused here, as a spent one (the
//! client then connects with a fresh token, as after any spent credential).
//!
//! Bounded: at most [`SPENT_NONCES_MAX`] nonces (least recently used out), each kept
//! only until its credential expires (after which the signature check refuses it
//! anyway): each new nonce first drops up to [`EXPIRED_PER_REMEMBER`] expired ones from
//! the least recently used end, so under a steady churn of users the cache holds about
//! the credentials of the last credential lifetime, not [`SPENT_NONCES_MAX`].

use std::num::NonZeroUsize;

use lru::LruCache;

/// Nonces a node remembers at most (about 7 MB at the most).
pub const SPENT_NONCES_MAX: usize = 100_000;

/// Expired nonces dropped, at most, each time one is remembered (more than one, so the
/// expired ones go faster than new ones come).
pub const EXPIRED_PER_REMEMBER: usize = 2;

/// Why a credential is void.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Void {
    /// Its nonce was used (here or on another node).
    Used,
    /// Its session's resume credentials were revoked (a kick or a replace).
    Revoked,
    /// Its user (or device) was kicked after it was issued.
    Kicked,
}

/// The nonces of credentials known void, with when each credential expires.
pub struct SpentNonces {
    nonces: LruCache<[u8; 16], (u64, Void)>,
}

impl Default for SpentNonces {
    fn default() -> Self {
        SpentNonces::new(SPENT_NONCES_MAX)
    }
}

impl SpentNonces {
    /// At most `capacity` nonces (at least one).
    pub fn new(capacity: usize) -> Self {
        SpentNonces {
            nonces: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
        }
    }

    /// Why `nonce`'s credential is void, if this node knows; a credential expired by
    /// `now_ms` is forgotten (its signature check refuses it).
    pub fn check(&mut self, nonce: &[u8; 16], now_ms: u64) -> Option<Void> {
        let (expires_at_ms, why) = *self.nonces.get(nonce)?;
        if expires_at_ms <= now_ms {
            self.nonces.pop(nonce);
            return None;
        }
        Some(why)
    }

    /// `nonce`'s credential, valid until `expires_at_ms`, is void for `why`. A
    /// revocation or kick is kept over a later `Used` (the first reason found is the one
    /// answered).
    pub fn remember(&mut self, nonce: [u8; 16], expires_at_ms: u64, why: Void, now_ms: u64) {
        if expires_at_ms <= now_ms {
            return;
        }
        self.forget_expired(now_ms);
        match self.nonces.get_mut(&nonce) {
            Some(known) if known.1 != Void::Used => {}
            Some(known) => *known = (expires_at_ms, why),
            None => {
                self.nonces.put(nonce, (expires_at_ms, why));
            }
        }
    }

    /// Drop up to [`EXPIRED_PER_REMEMBER`] expired nonces from the least recently used
    /// end (stopping at the first that is not expired).
    fn forget_expired(&mut self, now_ms: u64) {
        for _ in 0..EXPIRED_PER_REMEMBER {
            match self.nonces.peek_lru() {
                Some((_, (expires_at_ms, _))) if *expires_at_ms <= now_ms => {
                    self.nonces.pop_lru();
                }
                _ => break,
            }
        }
    }

    /// A handshake gave `nonce` back: it may open a connection again.
    pub fn forget(&mut self, nonce: &[u8; 16]) {
        self.nonces.pop(nonce);
    }

    pub fn len(&self) -> usize {
        self.nonces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nonces.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nonce(n: u8) -> [u8; 16] {
        [n; 16]
    }

    #[test]
    fn a_nonce_is_known_void_until_its_credential_expires_or_is_given_back() {
        let mut spent = SpentNonces::new(10);
        spent.remember(nonce(1), 1_000, Void::Used, 0);
        spent.remember(nonce(2), 1_000, Void::Kicked, 0);
        spent.remember(nonce(3), 1_000, Void::Revoked, 0);
        // Already expired: nothing to remember.
        spent.remember(nonce(4), 500, Void::Used, 500);
        // (nonce, now, expected)
        let cases = [
            (1, 10, Some(Void::Used)),
            (2, 10, Some(Void::Kicked)),
            (3, 999, Some(Void::Revoked)),
            (4, 10, None),
            (5, 10, None),
            (1, 1_000, None),
            // Forgotten once seen expired.
            (1, 10, None),
        ];
        for (n, now, expected) in cases {
            assert_eq!(spent.check(&nonce(n), now), expected, "nonce {n} at {now}");
        }
        spent.forget(&nonce(2));
        assert_eq!(spent.check(&nonce(2), 10), None, "given back");
    }

    #[test]
    fn a_revocation_or_kick_is_not_overwritten_by_a_later_use() {
        let mut spent = SpentNonces::new(10);
        spent.remember(nonce(1), 1_000, Void::Kicked, 0);
        spent.remember(nonce(1), 1_000, Void::Used, 1);
        assert_eq!(spent.check(&nonce(1), 2), Some(Void::Kicked));
        spent.remember(nonce(2), 1_000, Void::Used, 0);
        spent.remember(nonce(2), 1_000, Void::Revoked, 1);
        assert_eq!(spent.check(&nonce(2), 2), Some(Void::Revoked));
    }

    #[test]
    fn at_most_capacity_nonces_are_kept_the_least_recently_used_out() {
        let mut spent = SpentNonces::new(3);
        for n in 0..3 {
            spent.remember(nonce(n), 1_000, Void::Used, 0);
        }
        // 0 is checked (used), so 1 is the least recently used when 3 comes.
        assert_eq!(spent.check(&nonce(0), 1), Some(Void::Used));
        spent.remember(nonce(3), 1_000, Void::Used, 1);
        assert_eq!(spent.len(), 3);
        assert_eq!(spent.check(&nonce(1), 2), None);
        for n in [0, 2, 3] {
            assert_eq!(spent.check(&nonce(n), 2), Some(Void::Used), "nonce {n}");
        }
    }

    /// Users churning at one credential a millisecond, each valid 2 s: the cache holds
    /// about the last 2 s of credentials, not its capacity.
    #[test]
    fn under_a_steady_churn_expired_nonces_leave_and_the_cache_levels_off() {
        let mut spent = SpentNonces::new(SPENT_NONCES_MAX);
        let mut most = 0;
        for now in 0..60_000u64 {
            let mut n = [0u8; 16];
            n[..8].copy_from_slice(&now.to_le_bytes());
            spent.remember(n, now + 2_000, Void::Used, now);
            most = most.max(spent.len());
        }
        assert!(most <= 2_001, "at most the live credentials: {most}");
        assert!(spent.len() >= 1_999, "the live ones are kept: {}", spent.len());
    }
}
