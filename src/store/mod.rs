//! The embedded store: the only module that touches sled. Typed trees, big-endian keys,
//! versioned records, a schema version checked at open, and group commit: publishers ask
//! for a flush and one flusher thread turns every request that arrived meanwhile into a
//! single `sled::Db::flush` (one fsync for many events).
//!
//! Trees: `meta` (schema version, token secret, the epoch of new rooms), `room_head`
//! (room → epoch + head; written by a room's first publish or state, never by a read),
//! `room_event` (room 0x00 seq → event), `token_nonce` (nonce → expiry),
//! `session_owner` (session → owner record), `user_session` (user 0x00 session → ()),
//! `user_migration` (user → last migration time), `directory_queue` (cluster mode: session
//! writes made while NATS was unreachable, in order), `session_live` (session → the process
//! holding a connection of it; single node: only for a session that closed before, a
//! session that never closed has no `session_seen` record, which says the same), `session_seen` (session → when its last connection closed),
//! `session_expiry` (that time ‖ session → (), scanned by the expiry sweep),
//! `session_revoked` (session → when its resume credentials were revoked),
//! `user_kicked` (user, or user 0x00 device → when they were last kicked),
//! `nonce_expiry`, `revoked_expiry`, `migration_expiry` and `kick_expiry` (time ‖ key → ():
//! the time indexes of `token_nonce`, `session_revoked`, `user_migration` and
//! `user_kicked`, so a purge reads only what is due: `time_index.rs`),
//! `room_state` (room → its state as of a seq, written in one transaction with the event
//! that carries it and the head), `webhooks` (queue seq → a webhook waiting to be
//! delivered, in queue order), `webhook_occupied` (room → (): its `room_occupied` was
//! queued, its `room_vacated` not yet; one node only), `webhook_dead` (dead-letter seq →
//! a webhook given up, oldest first) and `webhook_dead_id` (its id → its dead-letter seq).
//!
//! Each subsystem reads and writes its trees through a typed facade, reached from the
//! one [`Store`] handle: [`Store::rooms`] (`rooms.rs`), [`Store::sessions`]
//! (`sessions.rs`), [`Store::migrations`] (`migrations.rs`), [`Store::credentials`]
//! (nonces, resume revocations and secrets: `credentials.rs`), [`Store::kicks`]
//! (`kicks.rs`), [`Store::directory_queue`] (cluster mode's outage queue:
//! `directory_queue.rs`) and [`Store::webhooks`] (`webhooks.rs`). The `Store` itself only
//! opens the database (schema check and upgrade), runs the flusher and answers for
//! durability and health.

pub mod credentials;
mod directory_queue;
pub mod keys;
mod kicks;
mod migrations;
pub mod records;
mod rooms;
mod sessions;
mod time_index;
mod webhooks;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::oneshot;

pub use credentials::Credentials;
pub use directory_queue::DirectoryQueue;
pub use kicks::Kicks;
pub use migrations::Migrations;
pub use records::{
    DeadLetterRecord, EventRecord, MigrationRecord, NonceRecord, QueuedSessionWrite, RevokedRecord,
    RoomHeadRecord, SeenRecord, SessionRecord, StateRecord, UserRecord, WebhookRecord,
};
pub use rooms::{Rooms, StoredRoom};
pub use sessions::Sessions;
pub use webhooks::{DeadLetter, WebhookQueue};

use crate::core::nodes::sessions::VersionError;

/// Version of the tree layout; a store written by another layout is refused at open,
/// except [`SCHEMA_UNINDEXED`], which is upgraded in place.
pub const SCHEMA_VERSION: u32 = 2;
/// The layout before the time indexes (`nonce_expiry`, `revoked_expiry`,
/// `migration_expiry`): opening such a store indexes its records once and makes it 2.
pub const SCHEMA_UNINDEXED: u32 = 1;
/// sled's page cache unless configured (`store_cache_mb`); sled's own default is 1 GiB.
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// How long `open` retries while another process (or a server instance being stopped)
/// still holds the database lock.
const LOCK_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("store I/O: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt record in tree {tree}: {why}")]
    Corrupt { tree: &'static str, why: String },
    #[error("store at {path} has schema version {found}; this build uses {expected}")]
    Schema { path: PathBuf, found: u32, expected: u32 },
    /// The group flush failed; every request it served gets the same error.
    #[error("flush failed: {0}")]
    Flush(#[source] Arc<sled::Error>),
    #[error("no randomness: {0}")]
    Randomness(#[from] getrandom::Error),
    #[error("store is closed")]
    Closed,
    #[error(transparent)]
    Stale(#[from] VersionError),
}

type FlushWaiter = oneshot::Sender<Result<(), Arc<sled::Error>>>;

/// Handle to the store; cheap to clone, all clones share one database. Its facades
/// share it too: each holds the trees of its subsystem.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    meta: sled::Tree,
    rooms: Rooms,
    sessions: Sessions,
    migrations: Migrations,
    credentials: Credentials,
    kicks: Kicks,
    directory_queue: DirectoryQueue,
    webhooks: WebhookQueue,
    flusher: Arc<Flusher>,
    stats: Arc<FlushStats>,
}

/// The group-commit thread. Dropped with the last `Store` handle: the request channel
/// closes and the thread is joined, so the database is closed when the last handle is gone.
struct Flusher {
    requests: Option<mpsc::Sender<FlushWaiter>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Counters of the group-commit flusher.
#[derive(Debug, Default)]
pub struct FlushStats {
    pub flushes: AtomicU64,
    pub requests: AtomicU64,
}

impl Store {
    /// [`Store::open_with_cache`] with the default page cache (`store_cache_mb` = 64).
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Store::open_with_cache(dir, DEFAULT_CACHE_BYTES)
    }

    /// Open (or create) the store in `dir` with a page cache of at most `cache_bytes`,
    /// check its schema, start the flusher thread.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Sled(e.into()))?;
        let path = dir.join("db");
        let db = open_with_lock_wait(&path, cache_bytes)?;
        let meta = db.open_tree("meta")?;
        let found = match meta.get("schema_version")? {
            None => {
                meta.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())?;
                SCHEMA_VERSION
            }
            Some(found) => {
                let found = u32::from_be_bytes(found.as_ref().try_into().map_err(|_| {
                    StoreError::Corrupt {
                        tree: "meta",
                        why: "schema_version is not 4 bytes".into(),
                    }
                })?);
                if found != SCHEMA_VERSION && found != SCHEMA_UNINDEXED {
                    return Err(StoreError::Schema { path, found, expected: SCHEMA_VERSION });
                }
                found
            }
        };
        let (requests, receiver) = mpsc::channel();
        let stats = Arc::new(FlushStats::default());
        let thread = spawn_flusher(db.clone(), receiver, stats.clone())?;
        let flusher = Arc::new(Flusher { requests: Some(requests), thread: Some(thread) });
        let store = Store {
            rooms: Rooms::open(&db, &meta)?,
            sessions: Sessions::open(&db)?,
            migrations: Migrations::open(&db)?,
            credentials: Credentials::open(&db, &meta)?,
            kicks: Kicks::open(&db)?,
            directory_queue: DirectoryQueue::open(&db)?,
            webhooks: WebhookQueue::open(&db)?,
            meta,
            db,
            flusher,
            stats,
        };
        store.sessions.date_undated(&store.meta)?;
        if found == SCHEMA_UNINDEXED {
            store.index_unindexed()?;
        }
        Ok(store)
    }

    /// Upgrade from [`SCHEMA_UNINDEXED`]: index every record of the trees purged by time
    /// (one walk, once; an undecodable record is logged and removed, as a purge would),
    /// then mark the store with the current layout. Durable before the store is used.
    fn index_unindexed(&self) -> Result<(), StoreError> {
        let mut indexed = 0;
        let credentials = &self.credentials;
        for index in [
            &credentials.nonces_by_expiry,
            &credentials.revocations_by_expiry,
            &self.migrations.by_time,
        ] {
            indexed += index.index_all()?;
        }
        self.meta.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())?;
        self.db.flush()?;
        tracing::info!(
            indexed,
            from = SCHEMA_UNINDEXED,
            to = SCHEMA_VERSION,
            "store upgraded: expiry times indexed"
        );
        Ok(())
    }

    /// Rooms' events, heads and states, and the epoch of new rooms.
    pub fn rooms(&self) -> &Rooms {
        &self.rooms
    }

    /// The single-node session directory.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Users' last migration times (the migration budget).
    pub fn migrations(&self) -> &Migrations {
        &self.migrations
    }

    /// Spent token nonces, revoked resume credentials, and secrets.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// Users kicked, and when.
    pub fn kicks(&self) -> &Kicks {
        &self.kicks
    }

    /// Cluster mode: session writes queued while NATS was away.
    pub fn directory_queue(&self) -> &DirectoryQueue {
        &self.directory_queue
    }

    /// Webhooks waiting to be delivered, and rooms owed a `room_vacated`.
    pub fn webhooks(&self) -> &WebhookQueue {
        &self.webhooks
    }

    /// A liveness probe: a real read and an idempotent write.
    pub fn probe(&self) -> Result<(), StoreError> {
        self.meta.get("schema_version")?;
        self.meta.insert("probe", &[1u8][..])?;
        Ok(())
    }

    /// Ask for everything written so far to be made durable. Requests that arrive while
    /// a flush runs are served together by the next one.
    pub fn flush_soon(&self) -> impl std::future::Future<Output = Result<(), StoreError>> {
        let (tx, rx) = oneshot::channel();
        let sent = self.flusher.requests.as_ref().is_some_and(|requests| requests.send(tx).is_ok());
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        async move {
            if !sent {
                return Err(StoreError::Closed);
            }
            match rx.await {
                Ok(result) => result.map_err(StoreError::Flush),
                Err(_) => Err(StoreError::Closed),
            }
        }
    }

    /// Flush now, blocking the caller.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    pub fn flush_stats(&self) -> &FlushStats {
        &self.stats
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }
}

fn open_with_lock_wait(path: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let started = Instant::now();
    loop {
        match sled::Config::new().path(path).cache_capacity(cache_bytes).open() {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(e)) if is_lock_error(&e) && started.elapsed() < LOCK_WAIT => {
                tracing::info!(path = %path.display(), "store locked by another instance, waiting");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A held database lock. sled 0.34 formats the lock's own error into an `ErrorKind::Other`
/// I/O error ("could not acquire lock on ..."), losing its kind, so its message is the one
/// signal; `WouldBlock` covers a sled that keeps the kind.
fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("could not acquire lock")
}

fn spawn_flusher(
    db: sled::Db,
    requests: mpsc::Receiver<FlushWaiter>,
    stats: Arc<FlushStats>,
) -> Result<std::thread::JoinHandle<()>, StoreError> {
    std::thread::Builder::new()
        .name("livegate-flush".into())
        .spawn(move || {
            while let Ok(first) = requests.recv() {
                let mut waiters = vec![first];
                waiters.extend(requests.try_iter());
                let result = db.flush().map(drop).map_err(Arc::new);
                stats.flushes.fetch_add(1, Ordering::Relaxed);
                if let Err(error) = &result {
                    tracing::error!(%error, waiters = waiters.len(), "store flush failed");
                }
                for waiter in waiters {
                    let _ = waiter.send(result.clone());
                }
            }
        })
        .map_err(|e| StoreError::Sled(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data dir written by the layout before the time indexes (schema 1): it opens, its
    /// records are indexed once (an undecodable one is dropped) and purged from then on.
    #[test]
    fn a_store_without_time_indexes_is_upgraded_in_place() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::Config::new().path(dir.path().join("db")).open().unwrap();
            db.open_tree("meta").unwrap().insert("schema_version", &1u32.to_be_bytes()).unwrap();
            let nonces = db.open_tree("token_nonce").unwrap();
            nonces.insert([1u8; 16], records::encode(&NonceRecord { expires_at_ms: 100 })).unwrap();
            nonces.insert([2u8; 16], records::encode(&NonceRecord { expires_at_ms: 300 })).unwrap();
            nonces.insert([3u8; 16], &[7u8, 7][..]).unwrap();
            let revoked = db.open_tree("session_revoked").unwrap();
            revoked
                .insert("s1", records::encode(&RevokedRecord { at_ms: 50, keep_until_ms: 150 }))
                .unwrap();
            let migrations = db.open_tree("user_migration").unwrap();
            migrations
                .insert("u1", records::encode(&MigrationRecord { last_migration_ms: 1_000 }))
                .unwrap();
            db.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let credentials = store.credentials();
        let schema = store.meta.get("schema_version").unwrap().unwrap();
        assert_eq!(schema.as_ref(), &SCHEMA_VERSION.to_be_bytes());
        assert_eq!(credentials.token_nonce.len(), 2, "the undecodable record is gone");
        assert!(!credentials.use_nonce(&[1; 16], 100).unwrap(), "old nonces are still spent");
        assert_eq!(credentials.resumes_revoked_at("s1").unwrap(), Some(50));
        assert_eq!(credentials.purge(200).unwrap(), 2);
        assert!(credentials.use_nonce(&[1; 16], 100).unwrap(), "purged");
        assert!(!credentials.use_nonce(&[2; 16], 300).unwrap());
        assert_eq!(store.migrations().purge(4_000, 3_000).unwrap(), 1);
        drop(store);
        // Upgraded once: the next open finds schema 2 and indexes nothing again.
        let store = Store::open(dir.path()).unwrap();
        let credentials = store.credentials();
        assert_eq!(credentials.purge(400).unwrap(), 2);
        assert_eq!(credentials.token_nonce.len(), 0);
    }

    #[test]
    fn schema_mismatch_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.meta.insert("schema_version", &99u32.to_be_bytes()).unwrap();
            store.flush().unwrap();
        }
        assert!(matches!(Store::open(dir.path()), Err(StoreError::Schema { found: 99, .. })));
    }

    #[test]
    fn flush_requests_are_grouped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let waits: Vec<_> = (0..50).map(|_| store.flush_soon()).collect();
            for wait in waits {
                wait.await.unwrap();
            }
        });
        let flushes = store.flush_stats().flushes.load(Ordering::Relaxed);
        assert!((1..50).contains(&flushes), "50 requests took {flushes} flushes");
    }
}
