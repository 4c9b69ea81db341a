//! The handshakes' group commit: a handshake that spent its credential's nonce (and had
//! its session recorded) waits here until both are durable, then answers 101. The
//! handshakes waiting at once share one store flush, and flushes for handshakes start at
//! most one per [`HANDSHAKE_FLUSH_SPACING`] (`core::delivery::group_commit` decides; this carries it
//! out on the HTTP worker that asked). Under a flood of connects that turns one flush per
//! few handshakes (each flush a write, a `sync_file_range` and hand-offs between sled's
//! threads, the costliest part of a handshake) into one per few dozen; an idle node still
//! flushes a lone handshake at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::core::delivery::group_commit::{GroupCommit, Next};
use crate::store::{Store, StoreError};

/// The least time between the starts of two handshake flushes: what a handshake may wait
/// at most beyond its flush. At 15,000 handshakes a second, 2 ms makes about 30 per flush.
pub const HANDSHAKE_FLUSH_SPACING: Duration = Duration::from_millis(2);

/// Why a handshake's writes could not be made durable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DurableError {
    #[error("store flush failed: {0}")]
    Flush(#[source] Arc<StoreError>),
    #[error("the flush was abandoned: the node is stopping")]
    Abandoned,
}

type Waiter = oneshot::Sender<Result<(), DurableError>>;

/// One per node, shared by the HTTP workers.
pub struct HandshakeFlushes {
    store: Store,
    inner: Mutex<Inner>,
}

struct Inner {
    group: GroupCommit,
    /// The requests `group` counts as waiting, in arrival order.
    waiting: Vec<Waiter>,
}

impl HandshakeFlushes {
    pub fn new(store: Store) -> Arc<Self> {
        HandshakeFlushes::with_spacing(store, HANDSHAKE_FLUSH_SPACING)
    }

    pub fn with_spacing(store: Store, spacing: Duration) -> Arc<Self> {
        Arc::new(HandshakeFlushes {
            store,
            inner: Mutex::new(Inner { group: GroupCommit::new(spacing), waiting: Vec::new() }),
        })
    }

    /// Resolves once everything written before the call is durable. Runs its flushes and
    /// timer on the caller's thread (an actix worker's local task set).
    pub async fn durable(self: &Arc<Self>) -> Result<(), DurableError> {
        let (tx, rx) = oneshot::channel();
        let next = {
            let mut inner = self.inner.lock();
            inner.waiting.push(tx);
            inner.group.join(Instant::now())
        };
        self.carry_out(next);
        rx.await.unwrap_or(Err(DurableError::Abandoned))
    }

    fn carry_out(self: &Arc<Self>, next: Next) {
        match next {
            Next::Idle => {}
            Next::WaitUntil(at) => {
                let this = self.clone();
                actix_web::rt::spawn(async move {
                    tokio::time::sleep_until(at.into()).await;
                    let next = this.inner.lock().group.timer(Instant::now());
                    this.carry_out(next);
                });
            }
            Next::Flush { requests } => {
                let waiters = std::mem::take(&mut self.inner.lock().waiting);
                debug_assert_eq!(waiters.len(), requests);
                let this = self.clone();
                actix_web::rt::spawn(async move {
                    let result =
                        this.store.flush_soon().await.map_err(|e| DurableError::Flush(Arc::new(e)));
                    if let Err(error) = &result {
                        tracing::error!(%error, handshakes = waiters.len(), "handshake flush failed");
                    }
                    for waiter in waiters {
                        let _ = waiter.send(result.clone());
                    }
                    let next = this.inner.lock().group.flushed(Instant::now());
                    this.carry_out(next);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_web::test]
    async fn concurrent_handshakes_share_flushes_and_each_waits_for_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let flushes = HandshakeFlushes::with_spacing(store.clone(), Duration::from_millis(20));
        let before = store.flush_stats().flushes.load(std::sync::atomic::Ordering::Relaxed);
        let waits: Vec<_> = (0..100).map(|_| flushes.durable()).collect();
        for result in futures_util::future::join_all(waits).await {
            result.unwrap();
        }
        let flushed =
            store.flush_stats().flushes.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert!((1..=2).contains(&flushed), "100 concurrent handshakes took {flushed} flushes");
        // A lone one later is flushed too.
        flushes.durable().await.unwrap();
        assert_eq!(flushes.inner.lock().group.waiting(), 0);
    }
}
