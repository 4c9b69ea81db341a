//! The node's timers and steering, each a task owned by the [`Node`](super::Node) and
//! stopped first at its shutdown: the purges of expired token nonces, kicks and
//! migration times, the session expiry sweep (after which freed memory goes back to the
//! system), the reading of cell mirrors' lag (cells with their own NATS), and the
//! forwarding of shutdown and reload signals.

use std::time::Duration;

use actix::Addr;
use actix_web::web;
use futures_util::StreamExt;

use super::Signals;
use crate::actors::directory::{Directory, ExpireSessions};
use crate::actors::supervisor::{Signal, Supervisor};
use crate::http::{self, AppState};
use crate::store::Store;
use crate::world::now_ms;

/// How often expired token nonces and migration times are forgotten.
const PURGE_EVERY: Duration = Duration::from_secs(60);

/// How often the cell mirrors' lag is read (one `STREAM.INFO` per other cell).
pub(super) const MIRROR_LAG_EVERY: Duration = Duration::from_secs(10);

/// Cells with their own NATS: every [`MIRROR_LAG_EVERY`], how many messages this cell's
/// mirror of each other cell's rooms stream lacks, into `livegate_cell_mirror_lag_events`
/// and the admin overview. A task of its own: it holds no room, lock or mailbox while it
/// waits on NATS. A mirror that did not answer keeps its last figure.
pub(super) async fn read_mirror_lags(
    cluster: crate::cluster::Cluster,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    loop {
        for (cell, lag) in cluster.mirror_lags().await {
            match lag {
                Ok(lag) => {
                    metrics
                        .cell_mirror_lag_events
                        .get_or_create(&crate::metrics::CellLabel { cell: cell.clone() })
                        .set(lag.min(i64::MAX as u64) as i64);
                    metrics.cell_mirror_lags.lock().insert(cell, lag);
                }
                Err(error) => {
                    tracing::debug!(%cell, %error, "could not read the mirror's lag; keeping the last figure")
                }
            }
        }
        actix_web::rt::time::sleep(MIRROR_LAG_EVERY).await;
    }
}

/// Each shutdown signal is one step of the drain.
pub(super) async fn forward_signals(mut signals: Signals, supervisor: Addr<Supervisor>) {
    while signals.next().await.is_some() {
        supervisor.do_send(Signal);
    }
}

/// Each reload signal reloads the access list.
pub(super) async fn reload_on(mut reload: Signals, state: web::Data<AppState>) {
    while reload.next().await.is_some() {
        if let Err(error) = http::reload_access(&state) {
            tracing::error!(%error, "reload failed; the access list is unchanged");
        }
    }
}

/// Forget expired token nonces and migration times past their window a few times per
/// token lifetime (at most every minute). Each purge reads only its time index's due
/// entries, on a blocking thread: store I/O never runs on the system arbiter.
pub(super) async fn purge_expired(store: Store, migration_window_ms: u64, token_ttl_max: Duration) {
    let every = (token_ttl_max / 4).clamp(Duration::from_millis(250), PURGE_EVERY);
    loop {
        actix_web::rt::time::sleep(every).await;
        let store = store.clone();
        let purged = actix_web::rt::task::spawn_blocking(move || {
            (
                store.credentials().purge(now_ms()),
                store.kicks().purge(now_ms()),
                store.migrations().purge(now_ms(), migration_window_ms),
            )
        });
        let (nonces, kicks, migrations) = match purged.await {
            Ok(results) => results,
            Err(error) => {
                tracing::error!(%error, "the purge thread failed");
                continue;
            }
        };
        match nonces {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "expired token nonces forgotten"),
            Err(error) => tracing::warn!(%error, "could not purge token nonces"),
        }
        match kicks {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "kicks older than every credential forgotten"),
            Err(error) => tracing::warn!(%error, "could not purge kicks"),
        }
        match migrations {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "migration times past their window forgotten"),
            Err(error) => tracing::warn!(%error, "could not purge migration times"),
        }
    }
}

/// Hand memory freed by departed users back to the system. glibc's malloc keeps freed
/// memory of its arenas for reuse; after a wave of users left and their sessions expired,
/// that is most of the process's growth (measured: 18 of 51 MiB after a churn of 60,000
/// sessions). Other allocators return memory themselves.
fn return_freed_memory() {
    #[cfg(all(
        target_os = "linux",
        target_env = "gnu",
        not(feature = "mimalloc"),
        not(feature = "jemalloc")
    ))]
    // SAFETY: malloc_trim only walks and releases the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How often [`trim_after_connect_bursts`] looks at the connect counter.
const BURST_CHECK_EVERY: Duration = Duration::from_millis(500);
/// Connects since the last trim that make a burst worth trimming after...
const BURST_CONNECTS: u64 = 1000;
/// ...once fewer than this many came in one check's interval (the burst is over).
const BURST_OVER_BELOW: u64 = 50;

/// Hand back what a burst of handshakes freed, once it is over. Each handshake uses
/// buffers and temporaries (the HTTP codec's, the token's, the session's) that are freed
/// as its connection starts, in between the connections' long-lived allocations, so
/// glibc cannot shrink its heaps and keeps those pages resident. One trim per burst of
/// at least [`BURST_CONNECTS`] connects, when a check finds it over.
pub(super) async fn trim_after_connect_bursts(metrics: std::sync::Arc<crate::metrics::Metrics>) {
    let mut ticks = actix_web::rt::time::interval(BURST_CHECK_EVERY);
    let mut last = metrics.connects.get();
    let mut trimmed_at = last;
    loop {
        ticks.tick().await;
        let now = metrics.connects.get();
        let over = now - last < BURST_OVER_BELOW;
        if over && now - trimmed_at >= BURST_CONNECTS {
            return_freed_memory();
            trimmed_at = now;
        }
        last = now;
    }
}

/// Sweep sessions past their TTL a few times per TTL (at most every minute).
pub(super) async fn expire_sessions(directory: Addr<Directory>, session_ttl: Duration) {
    let every = (session_ttl / 4).clamp(Duration::from_millis(250), PURGE_EVERY);
    let mut ticks =
        actix_web::rt::time::interval_at(actix_web::rt::time::Instant::now() + every, every);
    loop {
        ticks.tick().await;
        match directory.send(ExpireSessions).await {
            Ok(0) => {}
            Ok(_) => return_freed_memory(),
            Err(_) => return,
        }
    }
}
