//! The node's dead letters ([`DeadLetters`]): webhooks out of attempts or refused, kept
//! in the store, listed, replayed (one attempt now) and deleted through the admin API.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;

use super::post::Poster;
use crate::core::rules::webhooks::{self as rules, DeadReason};
use crate::metrics::Metrics;
use crate::store::{DeadLetterRecord, Store, StoreError};
use crate::world::now_ms;

/// Why a replay was not made.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("no dead letter {0}")]
    NotFound(String),
    #[error("dead letter {0} is being replayed already")]
    InProgress(String),
    #[error("dead letters: {0}")]
    Store(#[from] StoreError),
}

/// What a replay did: the dead letter as it is now (failed: with its attempt counted and
/// its last error), and whether the receiver took it.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub delivered: bool,
    pub letter: DeadLetterRecord,
}

/// The node's dead letters in the store (`webhook_dead`): webhooks out of attempts or
/// refused, at most `webhook_dead_letters_max` (the oldest dropped for a new one, counted
/// in `livegate_webhook_dead_letters_dropped_total`). Cheap to clone.
#[derive(Clone)]
pub struct DeadLetters {
    inner: Arc<DeadInner>,
}

struct DeadInner {
    store: Store,
    metrics: Arc<Metrics>,
    max: usize,
    /// Held while the list changes, so the count and the seqs follow the store.
    state: Mutex<DeadState>,
}

struct DeadState {
    next_seq: u64,
    count: usize,
    /// Ids being replayed now (a second replay of one is refused).
    replaying: HashSet<String>,
}

impl DeadLetters {
    /// The dead letters kept in `store`, at most `max` from now on (a smaller bound than
    /// the list holds trims it at the next new one).
    pub fn open(
        store: Store,
        metrics: Arc<Metrics>,
        max: usize,
    ) -> Result<DeadLetters, StoreError> {
        let count = store.webhooks().dead_count();
        let next_seq = store.webhooks().dead_last_seq()?.map_or(0, |last| last.saturating_add(1));
        metrics.webhook_dead_letters.set(count as i64);
        if count > 0 {
            tracing::info!(
                dead_letters = count,
                "webhook dead letters kept in the store (GET /v1/admin/webhooks/dead)"
            );
        }
        let state = Mutex::new(DeadState { next_seq, count, replaying: HashSet::new() });
        Ok(DeadLetters { inner: Arc::new(DeadInner { store, metrics, max: max.max(1), state }) })
    }

    /// Move queued webhook `queue_seq` to the dead letters as `record`, dropping the
    /// oldest when the list is full; durable with the next flush.
    pub(super) fn bury(
        &self,
        queue_seq: u64,
        record: &DeadLetterRecord,
        reason: DeadReason,
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let mut state = inner.state.lock();
        let webhooks = inner.store.webhooks();
        let drop = webhooks.dead_oldest(rules::dead_letters_to_drop(state.count, inner.max))?;
        webhooks.bury(queue_seq, state.next_seq, record, &drop)?;
        state.next_seq += 1;
        state.count = state.count.saturating_sub(drop.len()) + 1;
        inner.metrics.webhook_dead_lettered(reason);
        inner.metrics.webhook_dead_letters.set(state.count as i64);
        if !drop.is_empty() {
            inner.metrics.webhook_dead_letters_dropped.inc_by(drop.len() as u64);
            let ids: Vec<&str> = drop.iter().map(|(_, id)| id.as_str()).collect();
            tracing::warn!(dropped = ?ids, webhook_dead_letters_max = inner.max, "dead-letter list full: the oldest dropped");
        }
        drop_flush(&inner.store);
        Ok(())
    }

    /// The `limit` newest dead letters, newest first.
    pub fn list(&self, limit: usize) -> Result<Vec<DeadLetterRecord>, StoreError> {
        Ok(self
            .inner
            .store
            .webhooks()
            .dead_newest(limit)?
            .into_iter()
            .map(|(_, record)| record)
            .collect())
    }

    /// Dead letters kept.
    pub fn count(&self) -> usize {
        self.inner.state.lock().count
    }

    /// The bound (`webhook_dead_letters_max`).
    pub fn max(&self) -> usize {
        self.inner.max
    }

    /// Forget dead letter `id`; whether it was kept.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let inner = &self.inner;
        let mut state = inner.state.lock();
        let Some((seq, _)) = inner.store.webhooks().dead_find(id)? else { return Ok(false) };
        inner.store.webhooks().dead_remove(seq, id)?;
        state.count = state.count.saturating_sub(1);
        inner.metrics.webhook_dead_letters.set(state.count as i64);
        drop_flush(&inner.store);
        tracing::info!(id, "dead letter deleted");
        Ok(true)
    }

    /// Forget every dead letter; how many there were.
    pub fn clear(&self) -> Result<usize, StoreError> {
        let inner = &self.inner;
        let mut state = inner.state.lock();
        let cleared = inner.store.webhooks().dead_clear()?;
        state.count = 0;
        inner.metrics.webhook_dead_letters.set(0);
        drop_flush(&inner.store);
        tracing::info!(cleared, "dead letters deleted");
        Ok(cleared)
    }

    /// One attempt of dead letter `id` now: delivered, it leaves the list; otherwise it
    /// stays, one attempt more, with this attempt's time and error.
    pub(super) fn replay(&self, id: &str, poster: &Poster) -> Result<Replayed, ReplayError> {
        let inner = &self.inner;
        let (seq, mut letter) = {
            let mut state = inner.state.lock();
            let found = inner
                .store
                .webhooks()
                .dead_find(id)?
                .ok_or_else(|| ReplayError::NotFound(id.to_string()))?;
            if !state.replaying.insert(id.to_string()) {
                return Err(ReplayError::InProgress(id.to_string()));
            }
            found
        };
        let (attempt, detail) = poster.post(&letter.id, &letter.body);
        let delivered = rules::verdict(attempt) == rules::Verdict::Delivered;
        letter.attempts = letter.attempts.saturating_add(1);
        letter.last_attempt_ms = now_ms();
        if !delivered {
            letter.last_error = rules::describe(attempt, &detail);
        }
        let mut state = inner.state.lock();
        state.replaying.remove(id);
        let webhooks = inner.store.webhooks();
        // Deleted (or dropped) while the attempt was made: nothing to keep or remove.
        let still_kept = webhooks.dead_find(id)?.is_some_and(|(now, _)| now == seq);
        if delivered {
            if still_kept {
                webhooks.dead_remove(seq, id)?;
                state.count = state.count.saturating_sub(1);
            }
            inner.metrics.webhook_replay("delivered");
            tracing::info!(id, room = %letter.room, attempts = letter.attempts, "dead letter replayed: delivered");
        } else {
            if still_kept {
                webhooks.dead_update(seq, &letter)?;
            }
            inner.metrics.webhook_replay("failed");
            tracing::warn!(id, room = %letter.room, attempts = letter.attempts, last_error = %letter.last_error, "dead letter replayed: failed, kept");
        }
        inner.metrics.webhook_dead_letters.set(state.count as i64);
        drop(state);
        drop_flush(&inner.store);
        Ok(Replayed { delivered, letter })
    }
}

/// Ask for a group flush and let it happen: nothing waits for it.
pub(super) fn drop_flush(store: &Store) {
    drop(store.flush_soon());
}
