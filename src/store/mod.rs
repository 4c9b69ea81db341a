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
//! holding a connection of it), `session_seen` (session → when its last connection closed),
//! `session_expiry` (that time ‖ session → (), scanned by the expiry sweep),
//! `session_revoked` (session → when its resume credentials were revoked),
//! `user_kicked` (user, or user 0x00 device → when they were last kicked),
//! `nonce_expiry`, `revoked_expiry`, `migration_expiry` and `kick_expiry` (time ‖ key → ():
//! the time indexes of `token_nonce`, `session_revoked`, `user_migration` and
//! `user_kicked`, so a purge reads only what is due, see [`TimeIndex`]),
//! `room_state` (room → its state as of a seq, written in one transaction with the event
//! that carries it and the head), `webhooks` (queue seq → a webhook waiting to be
//! delivered, in queue order), `webhook_occupied` (room → (): its `room_occupied` was
//! queued, its `room_vacated` not yet; one node only).

pub mod keys;
pub mod records;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::oneshot;

pub use records::{
    EventRecord, MigrationRecord, NonceRecord, QueuedSessionWrite, RevokedRecord, RoomHeadRecord, SeenRecord, SessionRecord, StateRecord,
    UserRecord, WebhookRecord,
};

use crate::core::sessions::{next_version, VersionError};

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

/// A room as stored: its head record and the newest events of its history, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRoom {
    pub head: RoomHeadRecord,
    pub events: Vec<EventRecord>,
    /// The room's latest state, if one was ever set.
    pub state: Option<StateRecord>,
}

type FlushWaiter = oneshot::Sender<Result<(), Arc<sled::Error>>>;

/// Handle to the store; cheap to clone, all clones share one database.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    room_head: sled::Tree,
    room_event: sled::Tree,
    room_state: sled::Tree,
    token_nonce: sled::Tree,
    session_owner: sled::Tree,
    user_session: sled::Tree,
    user_migration: sled::Tree,
    directory_queue: sled::Tree,
    session_live: sled::Tree,
    session_seen: sled::Tree,
    session_expiry: sled::Tree,
    session_revoked: sled::Tree,
    user_kicked: sled::Tree,
    webhooks: sled::Tree,
    webhook_occupied: sled::Tree,
    meta: sled::Tree,
    /// `token_nonce` by expiry.
    nonces_by_expiry: TimeIndex,
    /// `session_revoked` by the time it may be forgotten.
    revocations_by_expiry: TimeIndex,
    /// `user_migration` by migration time.
    migrations_by_time: TimeIndex,
    /// `user_kicked` by the time it may be forgotten.
    kicks_by_expiry: TimeIndex,
    /// Records in `session_owner`, counted at open and kept by every insert and delete.
    sessions_stored: Arc<AtomicU64>,
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
                let found = u32::from_be_bytes(found.as_ref().try_into().map_err(|_| StoreError::Corrupt {
                    tree: "meta",
                    why: "schema_version is not 4 bytes".into(),
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
        let session_owner = db.open_tree("session_owner")?;
        let sessions_stored = Arc::new(AtomicU64::new(session_owner.len() as u64));
        let token_nonce = db.open_tree("token_nonce")?;
        let session_revoked = db.open_tree("session_revoked")?;
        let user_migration = db.open_tree("user_migration")?;
        let user_kicked = db.open_tree("user_kicked")?;
        let store = Store {
            room_head: db.open_tree("room_head")?,
            room_event: db.open_tree("room_event")?,
            room_state: db.open_tree("room_state")?,
            nonces_by_expiry: TimeIndex::open(&db, "nonce_expiry", &token_nonce, "token_nonce", |value| {
                records::decode::<NonceRecord>("token_nonce", value).map(|r| r.expires_at_ms)
            })?,
            revocations_by_expiry: TimeIndex::open(&db, "revoked_expiry", &session_revoked, "session_revoked", |value| {
                records::decode::<RevokedRecord>("session_revoked", value).map(|r| r.keep_until_ms)
            })?,
            migrations_by_time: TimeIndex::open(&db, "migration_expiry", &user_migration, "user_migration", |value| {
                records::decode::<MigrationRecord>("user_migration", value).map(|r| r.last_migration_ms)
            })?,
            kicks_by_expiry: TimeIndex::open(&db, "kick_expiry", &user_kicked, "user_kicked", |value| {
                records::decode::<RevokedRecord>("user_kicked", value).map(|r| r.keep_until_ms)
            })?,
            token_nonce,
            session_owner,
            user_session: db.open_tree("user_session")?,
            user_migration,
            directory_queue: db.open_tree("directory_queue")?,
            session_live: db.open_tree("session_live")?,
            session_seen: db.open_tree("session_seen")?,
            session_expiry: db.open_tree("session_expiry")?,
            session_revoked,
            user_kicked,
            webhooks: db.open_tree("webhooks")?,
            webhook_occupied: db.open_tree("webhook_occupied")?,
            meta,
            sessions_stored,
            db,
            flusher,
            stats,
        };
        store.date_undated_sessions()?;
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
        for index in [&self.nonces_by_expiry, &self.revocations_by_expiry, &self.migrations_by_time] {
            indexed += index.index_all()?;
        }
        self.meta.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())?;
        self.db.flush()?;
        tracing::info!(indexed, from = SCHEMA_UNINDEXED, to = SCHEMA_VERSION, "store upgraded: expiry times indexed");
        Ok(())
    }

    /// Sessions written by a build before expiry count as seen when last written (once).
    fn date_undated_sessions(&self) -> Result<(), StoreError> {
        if self.meta.get("sessions_dated")?.is_some() {
            return Ok(());
        }
        for item in self.session_owner.iter() {
            let (key, value) = item?;
            let record: SessionRecord = records::decode("session_owner", &value)?;
            if !self.session_seen.contains_key(&key)? {
                self.mark_seen(&record.session, SeenRecord { last_seen_ms: record.updated_at_ms, seen_by: 0 })?;
            }
        }
        self.meta.insert("sessions_dated", &[1])?;
        Ok(())
    }

    /// A named secret of 32 random bytes, created on first use and kept for good.
    pub fn secret(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        let key = format!("secret:{name}");
        if let Some(existing) = self.meta.get(&key)? {
            return Ok(existing.to_vec());
        }
        let mut fresh = [0u8; 32];
        getrandom::getrandom(&mut fresh)?;
        // Two callers racing: the first insert wins and both read it back.
        let _ = self.meta.compare_and_swap(&key, None as Option<&[u8]>, Some(&fresh[..]))?;
        let stored = self.meta.get(&key)?.ok_or(StoreError::Closed)?;
        self.db.flush()?;
        Ok(stored.to_vec())
    }

    /// The epoch of every room first written by this store (16 hex digits), made on first
    /// use and kept for good (`meta` key `rooms_epoch`). A room never published to has no
    /// record and answers this epoch, and its first publish stores it: a client told the
    /// epoch of an empty room recovers with it, across restarts too. A new data directory
    /// makes a new one, so its rooms' seqs are never taken for an old directory's.
    pub fn rooms_epoch(&self) -> Result<String, StoreError> {
        const KEY: &str = "rooms_epoch";
        if let Some(existing) = self.meta.get(KEY)? {
            return String::from_utf8(existing.to_vec()).map_err(|_| StoreError::Corrupt { tree: "meta", why: "rooms_epoch is not UTF-8".into() });
        }
        let mut fresh = [0u8; 8];
        getrandom::getrandom(&mut fresh)?;
        let fresh = hex::encode(fresh);
        // Two callers racing: the first insert wins and both read it back.
        let _ = self.meta.compare_and_swap(KEY, None as Option<&[u8]>, Some(fresh.as_bytes()))?;
        let stored = self.meta.get(KEY)?.ok_or(StoreError::Closed)?;
        self.db.flush()?;
        String::from_utf8(stored.to_vec()).map_err(|_| StoreError::Corrupt { tree: "meta", why: "rooms_epoch is not UTF-8".into() })
    }

    /// The room's head and its newest `max_events` events, or `None` for a room never created.
    pub fn load_room(&self, room: &str, max_events: usize) -> Result<Option<StoredRoom>, StoreError> {
        let Some(head_bytes) = self.room_head.get(room.as_bytes())? else {
            return Ok(None);
        };
        let mut head: RoomHeadRecord = records::decode("room_head", &head_bytes)?;
        let mut events = Vec::new();
        for item in self.room_event.scan_prefix(keys::room_prefix(room)).rev().take(max_events) {
            let (_, value) = item?;
            events.push(records::decode_event("room_event", &value)?);
        }
        events.reverse();
        // The event is written before the head: after a crash between the two, the
        // event tree is ahead and right.
        if let Some(last) = events.last() {
            head.head = head.head.max(last.seq);
        }
        let state = self.room_state.get(room.as_bytes())?.map(|bytes| records::decode("room_state", &bytes)).transpose()?;
        Ok(Some(StoredRoom { head, events, state }))
    }

    /// [`Store::append_event`] with the room's state as of this event: event, head and
    /// state in one transaction, so after a crash the state never names an event that is
    /// not there (nor the other way round). Not durable until a flush.
    pub fn append_event_with_state(&self, room: &str, epoch: &str, event: &EventRecord, state: &str) -> Result<(), StoreError> {
        use sled::transaction::{ConflictableTransactionError, TransactionError};
        use sled::Transactional;
        let event_bytes = records::encode_event(event);
        let head = records::encode(&RoomHeadRecord { epoch: epoch.to_string(), head: event.seq });
        let state = records::encode(&StateRecord { seq: event.seq, data: state.to_string() });
        let key = keys::event_key(room, event.seq);
        let written: Result<(), TransactionError<()>> =
            (&self.room_event, &self.room_head, &self.room_state).transaction(|(events, heads, states)| {
                events.insert(key.as_slice(), event_bytes.as_slice())?;
                heads.insert(room.as_bytes(), head.as_slice())?;
                states.insert(room.as_bytes(), state.as_slice())?;
                Ok::<(), ConflictableTransactionError<()>>(())
            });
        match written {
            Ok(()) => Ok(()),
            Err(TransactionError::Storage(e)) => Err(e.into()),
            Err(TransactionError::Abort(())) => unreachable!("the transaction never aborts"),
        }
    }

    /// Set a room's state as of `seq` (its head): `PUT /v1/rooms/{room}/state`. Not
    /// durable until a flush.
    pub fn put_state(&self, room: &str, state: &StateRecord) -> Result<(), StoreError> {
        self.room_state.insert(room.as_bytes(), records::encode(state))?;
        Ok(())
    }

    /// A room's stored state (one read).
    pub fn room_state(&self, room: &str) -> Result<Option<StateRecord>, StoreError> {
        self.room_state.get(room.as_bytes())?.map(|bytes| records::decode("room_state", &bytes)).transpose()
    }

    /// Record a new room with its epoch and head 0.
    pub fn create_room(&self, room: &str, epoch: &str) -> Result<(), StoreError> {
        let record = RoomHeadRecord { epoch: epoch.to_string(), head: 0 };
        self.room_head.insert(room.as_bytes(), records::encode(&record))?;
        Ok(())
    }

    /// Write an event and advance the room's head to it. Not durable until a flush.
    pub fn append_event(&self, room: &str, epoch: &str, event: &EventRecord) -> Result<(), StoreError> {
        self.room_event.insert(keys::event_key(room, event.seq), records::encode_event(event))?;
        let head = RoomHeadRecord { epoch: epoch.to_string(), head: event.seq };
        self.room_head.insert(room.as_bytes(), records::encode(&head))?;
        Ok(())
    }

    /// Delete a room's events with seq below `first_kept`.
    pub fn trim_events(&self, room: &str, first_kept: u64) -> Result<usize, StoreError> {
        let mut removed = 0;
        for item in self.room_event.range(keys::event_key(room, 0)..keys::event_key(room, first_kept)) {
            let (key, _) = item?;
            self.room_event.remove(key)?;
            removed += 1;
        }
        Ok(removed)
    }

    /// Mark a token nonce used. `Ok(false)` when it was used before (a replay).
    pub fn use_nonce(&self, nonce: &[u8; 16], expires_at_ms: u64) -> Result<bool, StoreError> {
        let record = records::encode(&NonceRecord { expires_at_ms });
        // Indexed first: a replay adds the same entry again (same token, same expiry).
        self.nonces_by_expiry.note(nonce, expires_at_ms)?;
        let swapped = self.token_nonce.compare_and_swap(nonce, None as Option<&[u8]>, Some(record))?;
        Ok(swapped.is_ok())
    }

    /// Give back a nonce [`Store::use_nonce`] just marked: the connection it was spent for
    /// was refused before it opened (a refusal the client is told to retry).
    pub fn unuse_nonce(&self, nonce: &[u8; 16]) -> Result<(), StoreError> {
        self.token_nonce.remove(nonce)?;
        Ok(())
    }

    /// Void every credential of `user` (of its `device` only, when given) issued at or
    /// before `at_ms`; remembered until `keep_until_ms` (when the last of them expires).
    /// A later kick wins.
    pub fn record_kick(&self, user: &str, device: Option<&str>, at_ms: u64, keep_until_ms: u64) -> Result<(), StoreError> {
        let record = RevokedRecord { at_ms, keep_until_ms };
        let key = keys::user_kick_key(user, device);
        self.kicks_by_expiry.note(&key, keep_until_ms)?;
        self.user_kicked.fetch_and_update(key, |old| {
            let newer = old
                .and_then(|bytes| records::decode::<RevokedRecord>("user_kicked", bytes).ok())
                .filter(|old| old.at_ms > at_ms);
            Some(records::encode(newer.as_ref().unwrap_or(&record)))
        })?;
        Ok(())
    }

    /// When `user` was last kicked on every device or on `device`, whichever is later.
    pub fn kicked_at(&self, user: &str, device: &str) -> Result<Option<u64>, StoreError> {
        let mut latest = None;
        for key in [keys::user_kick_key(user, None), keys::user_kick_key(user, Some(device))] {
            if let Some(bytes) = self.user_kicked.get(key)? {
                let at = records::decode::<RevokedRecord>("user_kicked", &bytes)?.at_ms;
                latest = latest.max(Some(at));
            }
        }
        Ok(latest)
    }

    /// Forget kicks older than every credential they could void, reading only the due
    /// entries of their time index; a record that does not decode is removed, never left
    /// to stop the purge.
    pub fn purge_kicks(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.kicks_by_expiry.purge(now_ms)
    }

    /// Forget nonces of tokens (and revocations of resume credentials) that have expired
    /// anyway, reading only their time indexes up to `now_ms`. Returns how many.
    pub fn purge_nonces(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut removed = 0;
        for index in [&self.nonces_by_expiry, &self.revocations_by_expiry] {
            removed += index.purge(now_ms)?;
        }
        Ok(removed)
    }

    /// Void the resume credentials of `session` issued at or before `at_ms`; remembered
    /// until `keep_until_ms` (when the last of them expires). A later revocation wins.
    pub fn revoke_resumes(&self, session: &str, at_ms: u64, keep_until_ms: u64) -> Result<(), StoreError> {
        let record = RevokedRecord { at_ms, keep_until_ms };
        // Whichever record stays, its own time was indexed when it was written.
        self.revocations_by_expiry.note(session.as_bytes(), keep_until_ms)?;
        self.session_revoked.fetch_and_update(session.as_bytes(), |old| {
            let newer = old
                .and_then(|bytes| records::decode::<RevokedRecord>("session_revoked", bytes).ok())
                .filter(|old| old.at_ms > at_ms);
            Some(records::encode(newer.as_ref().unwrap_or(&record)))
        })?;
        Ok(())
    }

    /// When the resume credentials of `session` were last revoked, if they were.
    pub fn resumes_revoked_at(&self, session: &str) -> Result<Option<u64>, StoreError> {
        let record = self.session_revoked.get(session.as_bytes())?;
        Ok(record.map(|bytes| records::decode::<RevokedRecord>("session_revoked", &bytes)).transpose()?.map(|r| r.at_ms))
    }

    /// The owner record of a session.
    pub fn session(&self, session: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.session_owner
            .get(session.as_bytes())?
            .map(|bytes| records::decode("session_owner", &bytes))
            .transpose()
    }

    /// Write a session record if the stored version is still `read_version` (`None`: the
    /// session must not exist). The new record gets the next version, which is returned.
    /// A stale write changes nothing and fails with [`StoreError::Stale`].
    pub fn write_session(&self, read_version: Option<u64>, record: &SessionRecord) -> Result<SessionRecord, StoreError> {
        let key = record.session.as_bytes();
        let current = self.session_owner.get(key)?;
        let stored_version = current
            .as_ref()
            .map(|bytes| records::decode::<SessionRecord>("session_owner", bytes).map(|r| r.version))
            .transpose()?;
        let version = next_version(read_version, stored_version)?;
        let written = SessionRecord { version, ..record.clone() };
        let created = current.is_none();
        let swapped = self.session_owner.compare_and_swap(key, current, Some(records::encode(&written)))?;
        if swapped.is_err() {
            // Another writer got in between our read and our swap.
            let stored = self.session(&record.session)?.map(|r| r.version);
            return Err(VersionError::Stale { read: read_version, stored }.into());
        }
        if created {
            self.sessions_stored.fetch_add(1, Ordering::Relaxed);
        }
        self.user_session.insert(keys::user_session_key(&record.user, &record.session), &[])?;
        Ok(written)
    }

    /// Every session record of `user`.
    pub fn sessions_of_user(&self, user: &str) -> Result<Vec<SessionRecord>, StoreError> {
        let prefix = keys::room_prefix(user);
        let mut sessions = Vec::new();
        for item in self.user_session.scan_prefix(&prefix) {
            let (key, _) = item?;
            let session = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
            if let Some(record) = self.session(&session)? {
                sessions.push(record);
            }
        }
        Ok(sessions)
    }

    /// Records in the session directory now.
    pub fn sessions_stored(&self) -> u64 {
        self.sessions_stored.load(Ordering::Relaxed)
    }

    /// A session's first connection in process `incarnation` opened.
    pub fn session_connected(&self, session: &str, incarnation: u64) -> Result<(), StoreError> {
        self.session_live.insert(session.as_bytes(), &incarnation.to_be_bytes())?;
        Ok(())
    }

    /// A session's last connection closed at `now_ms`; its expiry counts from then.
    pub fn session_released(&self, session: &str, now_ms: u64, incarnation: u64) -> Result<(), StoreError> {
        self.mark_seen(session, SeenRecord { last_seen_ms: now_ms, seen_by: incarnation })?;
        self.session_live.remove(session.as_bytes())?;
        Ok(())
    }

    /// When the session's last connection closed and which process saw it.
    pub fn session_seen(&self, session: &str) -> Result<Option<SeenRecord>, StoreError> {
        self.session_seen.get(session.as_bytes())?.map(|bytes| records::decode("session_seen", &bytes)).transpose()
    }

    fn mark_seen(&self, session: &str, seen: SeenRecord) -> Result<(), StoreError> {
        self.session_expiry.insert(keys::expiry_key(seen.last_seen_ms, session), &[])?;
        if let Some(previous) = self.session_seen.insert(session.as_bytes(), records::encode(&seen))? {
            let previous: SeenRecord = records::decode("session_seen", &previous)?;
            if previous.last_seen_ms != seen.last_seen_ms {
                self.session_expiry.remove(keys::expiry_key(previous.last_seen_ms, session))?;
            }
        }
        Ok(())
    }

    /// Sessions an earlier process left marked connected (it stopped or crashed with them
    /// open) count as released at `now_ms`, seen by that process. Reads only those entries.
    pub fn release_orphaned_sessions(&self, now_ms: u64, incarnation: u64) -> Result<usize, StoreError> {
        let mut released = 0;
        for item in self.session_live.iter() {
            let (key, value) = item?;
            let seen_by = value.as_ref().try_into().map(u64::from_be_bytes).unwrap_or(0);
            if seen_by == incarnation {
                continue;
            }
            let session = String::from_utf8_lossy(&key).into_owned();
            self.mark_seen(&session, SeenRecord { last_seen_ms: now_ms, seen_by })?;
            self.session_live.remove(&key)?;
            released += 1;
        }
        Ok(released)
    }

    /// Delete up to `limit` sessions whose last connection closed at or before
    /// `cutoff_ms`, with their user-index entries, unless `is_live` says one is connected
    /// again. Returns (entries examined, ids deleted); fewer examined than `limit` means
    /// nothing older is left.
    pub fn expire_sessions(
        &self,
        cutoff_ms: u64,
        limit: usize,
        is_live: impl Fn(&str) -> bool,
    ) -> Result<(usize, Vec<String>), StoreError> {
        let end = cutoff_ms.saturating_add(1).to_be_bytes();
        let (mut examined, mut deleted) = (0, Vec::new());
        for item in self.session_expiry.range(..&end[..]).take(limit) {
            let (key, _) = item?;
            examined += 1;
            self.session_expiry.remove(&key)?;
            let Some((at, session)) = keys::split_expiry_key(&key) else { continue };
            // An entry replaced by a later close, or a session connected again, stays.
            if self.session_seen(session)?.map(|s| s.last_seen_ms) != Some(at) || is_live(session) {
                continue;
            }
            if let Some(bytes) = self.session_owner.remove(session.as_bytes())? {
                let record: SessionRecord = records::decode("session_owner", &bytes)?;
                self.user_session.remove(keys::user_session_key(&record.user, session))?;
                self.sessions_stored.fetch_sub(1, Ordering::Relaxed);
            }
            self.session_seen.remove(session.as_bytes())?;
            self.session_live.remove(session.as_bytes())?;
            deleted.push(session.to_string());
        }
        Ok((examined, deleted))
    }

    /// How many sessions the directory holds, and how many of them `node` owns.
    pub fn count_sessions(&self, node: &str) -> Result<(usize, usize), StoreError> {
        let (mut all, mut owned) = (0, 0);
        for item in self.session_owner.iter() {
            let (_, value) = item?;
            let record: SessionRecord = records::decode("session_owner", &value)?;
            all += 1;
            owned += usize::from(record.owner == node);
        }
        Ok((all, owned))
    }

    pub fn last_migration(&self, user: &str) -> Result<Option<u64>, StoreError> {
        self.user_migration
            .get(user.as_bytes())?
            .map(|bytes| records::decode::<MigrationRecord>("user_migration", &bytes).map(|r| r.last_migration_ms))
            .transpose()
    }

    pub fn set_last_migration(&self, user: &str, at_ms: u64) -> Result<(), StoreError> {
        let record = MigrationRecord { last_migration_ms: at_ms };
        self.migrations_by_time.note(user.as_bytes(), at_ms)?;
        self.user_migration.insert(user.as_bytes(), records::encode(&record))?;
        Ok(())
    }

    /// Every user's migration time still kept (the purge forgets those past their window).
    pub fn migrations(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut found = Vec::new();
        for item in self.user_migration.iter() {
            let (key, value) = item?;
            let user = String::from_utf8(key.to_vec())
                .map_err(|_| StoreError::Corrupt { tree: "user_migration", why: "key is not UTF-8".into() })?;
            found.push((user, records::decode::<MigrationRecord>("user_migration", &value)?.last_migration_ms));
        }
        Ok(found)
    }

    /// Forget migration times older than `window_ms`: past its window a record budgets
    /// nothing (the same as none). A record rewritten meanwhile stays.
    pub fn purge_migrations(&self, now_ms: u64, window_ms: u64) -> Result<usize, StoreError> {
        match now_ms.checked_sub(window_ms) {
            Some(cutoff) => self.migrations_by_time.purge(cutoff),
            None => Ok(0),
        }
    }

    /// Queue a cluster directory write for replay (durable once the next flush returns).
    pub fn queue_directory_write(&self, write: &QueuedSessionWrite) -> Result<(), StoreError> {
        let id = self.db.generate_id()?;
        self.directory_queue.insert(id.to_be_bytes(), records::encode(write))?;
        Ok(())
    }

    /// Queued cluster directory writes, oldest first, with the key that removes each.
    pub fn queued_directory_writes(&self) -> Result<Vec<(u64, QueuedSessionWrite)>, StoreError> {
        let mut writes = Vec::new();
        for item in self.directory_queue.iter() {
            let (key, value) = item?;
            let id = u64::from_be_bytes(key.as_ref().try_into().map_err(|_| StoreError::Corrupt {
                tree: "directory_queue",
                why: "key is not 8 bytes".into(),
            })?);
            writes.push((id, records::decode("directory_queue", &value)?));
        }
        Ok(writes)
    }

    pub fn remove_queued_directory_write(&self, id: u64) -> Result<(), StoreError> {
        self.directory_queue.remove(id.to_be_bytes())?;
        Ok(())
    }

    /// Queue webhook `seq` (larger than every queued seq). Durable once a flush returns.
    pub fn queue_webhook(&self, seq: u64, record: &WebhookRecord) -> Result<(), StoreError> {
        self.webhooks.insert(seq.to_be_bytes(), records::encode(record))?;
        Ok(())
    }

    /// Up to `limit` queued webhooks from seq `start` on, in queue order.
    pub fn queued_webhooks(&self, start: u64, limit: usize) -> Result<Vec<(u64, WebhookRecord)>, StoreError> {
        let mut queued = Vec::new();
        for item in self.webhooks.range(start.to_be_bytes()..).take(limit) {
            let (key, value) = item?;
            queued.push((webhook_seq(&key)?, records::decode("webhooks", &value)?));
        }
        Ok(queued)
    }

    /// Queued webhook `seq`, if it is still queued.
    pub fn queued_webhook(&self, seq: u64) -> Result<Option<WebhookRecord>, StoreError> {
        self.webhooks.get(seq.to_be_bytes())?.map(|value| records::decode("webhooks", &value)).transpose()
    }

    /// The last queued webhook's seq (`None`: the queue is empty).
    pub fn last_webhook_seq(&self) -> Result<Option<u64>, StoreError> {
        self.webhooks.last()?.map(|(key, _)| webhook_seq(&key)).transpose()
    }

    pub fn remove_webhook(&self, seq: u64) -> Result<(), StoreError> {
        self.webhooks.remove(seq.to_be_bytes())?;
        Ok(())
    }

    /// Note that `room`'s `room_occupied` webhook was queued (`occupied`) or its
    /// `room_vacated` was: the rooms still noted after a crash are owed a `room_vacated`.
    pub fn note_webhook_occupancy(&self, room: &str, occupied: bool) -> Result<(), StoreError> {
        if occupied {
            self.webhook_occupied.insert(room.as_bytes(), &[][..])?;
        } else {
            self.webhook_occupied.remove(room.as_bytes())?;
        }
        Ok(())
    }

    /// The rooms whose `room_occupied` was queued and whose `room_vacated` was not.
    pub fn rooms_noted_occupied(&self) -> Result<Vec<String>, StoreError> {
        self.webhook_occupied
            .iter()
            .keys()
            .map(|key| {
                let key = key?;
                String::from_utf8(key.to_vec()).map_err(|_| StoreError::Corrupt { tree: "webhook_occupied", why: "room is not UTF-8".into() })
            })
            .collect()
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

/// A tree's records indexed by a time of theirs (an expiry, or a time a window counts
/// from): entries `time ‖ key → ()` in a tree of their own, written before the record,
/// so [`TimeIndex::purge`] reads only the entries up to its cutoff instead of walking
/// the records. A record rewritten with a later time has a later entry too; the earlier
/// one finds it newer and leaves it. Adding a purged tree is one more `TimeIndex` and
/// one more line in its purge.
#[derive(Clone)]
struct TimeIndex {
    entries: sled::Tree,
    records: sled::Tree,
    /// The records' tree, for logs.
    name: &'static str,
    /// The time a record is indexed by.
    time_of: fn(&[u8]) -> Result<u64, StoreError>,
}

impl TimeIndex {
    fn open(
        db: &sled::Db,
        index: &'static str,
        records: &sled::Tree,
        name: &'static str,
        time_of: fn(&[u8]) -> Result<u64, StoreError>,
    ) -> Result<TimeIndex, StoreError> {
        Ok(TimeIndex { entries: db.open_tree(index)?, records: records.clone(), name, time_of })
    }

    /// Record `key` as due at `at_ms` (before the record itself is written).
    fn note(&self, key: &[u8], at_ms: u64) -> Result<(), StoreError> {
        self.entries.insert(keys::timed_key(at_ms, key), &[][..])?;
        Ok(())
    }

    /// Remove the records whose time is at or before `cutoff_ms`, reading only the index
    /// entries due by then. An undecodable record (or index entry) is logged with its key
    /// and removed: it would never be due otherwise, and it never stops the purge.
    /// Returns how many records were removed.
    fn purge(&self, cutoff_ms: u64) -> Result<usize, StoreError> {
        let end = cutoff_ms.saturating_add(1).to_be_bytes();
        let mut removed = 0;
        for entry in self.entries.range(..&end[..]).keys() {
            let entry = entry?;
            self.entries.remove(&entry)?;
            let Some((_, key)) = keys::split_timed_key(&entry) else {
                tracing::warn!(tree = self.name, entry = %hex::encode(&entry), "index entry too short: removed");
                continue;
            };
            let Some(value) = self.records.get(key)? else { continue };
            match (self.time_of)(&value) {
                // Rewritten since with a later time: its own entry comes later.
                Ok(at) if at > cutoff_ms => continue,
                Ok(_) => {}
                Err(error) => tracing::warn!(tree = self.name, key = %hex::encode(key), %error, "undecodable record removed by the purge"),
            }
            // Unless it was rewritten in the meantime.
            if self.records.compare_and_swap(key, Some(&value), None as Option<&[u8]>)?.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Index every record (a store written before the index); an undecodable record is
    /// logged and removed. Returns how many were indexed.
    fn index_all(&self) -> Result<usize, StoreError> {
        let mut indexed = 0;
        for item in self.records.iter() {
            let (key, value) = item?;
            match (self.time_of)(&value) {
                Ok(at) => {
                    self.note(&key, at)?;
                    indexed += 1;
                }
                Err(error) => {
                    tracing::warn!(tree = self.name, key = %hex::encode(&key), %error, "undecodable record removed while indexing");
                    self.records.remove(&key)?;
                }
            }
        }
        Ok(indexed)
    }
}

fn webhook_seq(key: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| StoreError::Corrupt { tree: "webhooks", why: "key is not 8 bytes".into() })?;
    Ok(u64::from_be_bytes(bytes))
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

    fn event(seq: u64) -> EventRecord {
        EventRecord { seq, id: format!("e{seq}"), ts_ms: seq, data: "{}".into(), devices: None, from: None }
    }

    #[test]
    fn rooms_survive_reopen_with_head_epoch_and_history() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.load_room("r", 10).unwrap(), None);
            store.create_room("r", "E1").unwrap();
            for seq in 1..=5 {
                store.append_event("r", "E1", &event(seq)).unwrap();
            }
            store.append_event("r2", "E2", &event(1)).unwrap();
            assert_eq!(store.trim_events("r", 3).unwrap(), 2);
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let room = store.load_room("r", 10).unwrap().unwrap();
        assert_eq!(room.head, RoomHeadRecord { epoch: "E1".into(), head: 5 });
        assert_eq!(room.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4, 5]);
        let newest = store.load_room("r", 2).unwrap().unwrap();
        assert_eq!(newest.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    }

    #[test]
    fn a_state_is_stored_with_its_event_and_outlives_the_history() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.create_room("r", "E1").unwrap();
            store.append_event("r", "E1", &event(1)).unwrap();
            store.append_event_with_state("r", "E1", &event(2), r#"{"n":2}"#).unwrap();
            store.append_event("r", "E1", &event(3)).unwrap();
            assert_eq!(store.trim_events("r", 3).unwrap(), 2);
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let room = store.load_room("r", 10).unwrap().unwrap();
        assert_eq!(room.head.head, 3);
        assert_eq!(room.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3]);
        assert_eq!(room.state, Some(StateRecord { seq: 2, data: r#"{"n":2}"#.into() }));
        store.put_state("r", &StateRecord { seq: 3, data: "null".into() }).unwrap();
        assert_eq!(store.room_state("r").unwrap(), Some(StateRecord { seq: 3, data: "null".into() }));
        assert_eq!(store.room_state("other").unwrap(), None);
    }

    #[test]
    fn migration_times_are_forgotten_once_past_their_window() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.set_last_migration("old", 1_000).unwrap();
        store.set_last_migration("recent", 5_000).unwrap();
        // Window 3 s, now 6 s: "old" (budget free since 4 s) goes, "recent" (until 8 s) stays.
        assert_eq!(store.purge_migrations(6_000, 3_000).unwrap(), 1);
        assert_eq!(store.last_migration("old").unwrap(), None);
        assert_eq!(store.last_migration("recent").unwrap(), Some(5_000));
        assert_eq!(store.purge_migrations(8_000, 3_000).unwrap(), 1);
        assert_eq!(store.last_migration("recent").unwrap(), None);
    }

    #[test]
    fn sessions_expire_from_their_last_close_unless_connected_again() {
        let dir = tempfile::tempdir().unwrap();
        let record = |session: &str, user: &str| SessionRecord {
            session: session.into(),
            user: user.into(),
            owner: "a".into(),
            version: 0,
            updated_at_ms: 1_000,
        };
        let store = Store::open(dir.path()).unwrap();
        for (session, user) in [("s1", "u1"), ("s2", "u1"), ("s3", "u2"), ("s4", "u3")] {
            store.write_session(None, &record(session, user)).unwrap();
            store.session_connected(session, 7).unwrap();
        }
        assert_eq!(store.sessions_stored(), 4);
        store.session_released("s1", 2_000, 7).unwrap();
        store.session_released("s2", 2_000, 7).unwrap();
        store.session_released("s2", 5_000, 7).unwrap(); // closed again later: expiry moves
        store.session_released("s3", 2_000, 7).unwrap();
        store.session_connected("s3", 7).unwrap(); // connected again; s4 never closed
        let (examined, mut deleted) = store.expire_sessions(4_000, 100, |s| s == "s3").unwrap();
        deleted.sort();
        assert_eq!((examined, deleted), (2, vec!["s1".to_string()]));
        assert_eq!(store.session("s1").unwrap(), None);
        assert_eq!(store.sessions_of_user("u1").unwrap().iter().map(|r| r.session.as_str()).collect::<Vec<_>>(), ["s2"]);
        assert_eq!(store.sessions_stored(), 3);
        assert_eq!(store.expire_sessions(4_999, 100, |_| false).unwrap(), (0, vec![]));
        assert_eq!(store.expire_sessions(5_000, 100, |_| false).unwrap(), (1, vec!["s2".to_string()]));
        drop(store);

        // A restart: s3 and s4 were left connected by process 7; they count as closed at
        // the new start, seen by 7, and expire from then.
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.sessions_stored(), 2);
        assert_eq!(store.release_orphaned_sessions(9_000, 8).unwrap(), 2);
        assert_eq!(store.session_seen("s4").unwrap(), Some(SeenRecord { last_seen_ms: 9_000, seen_by: 7 }));
        assert_eq!(store.release_orphaned_sessions(9_000, 8).unwrap(), 0);
        assert_eq!(store.expire_sessions(8_999, 100, |_| false).unwrap(), (0, vec![]));
        let (_, mut deleted) = store.expire_sessions(9_000, 1, |_| false).unwrap();
        deleted.extend(store.expire_sessions(9_000, 1, |_| false).unwrap().1);
        deleted.sort();
        assert_eq!(deleted, ["s3", "s4"]);
        assert_eq!(store.sessions_stored(), 0);
        assert_eq!(store.sessions_of_user("u2").unwrap(), vec![]);
    }

    #[test]
    fn nonces_are_single_use_and_purged_after_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.use_nonce(&[1; 16], 100).unwrap());
        assert!(!store.use_nonce(&[1; 16], 100).unwrap());
        assert!(store.use_nonce(&[2; 16], 300).unwrap());
        assert_eq!(store.purge_nonces(200).unwrap(), 1);
        assert!(!store.use_nonce(&[2; 16], 300).unwrap());
    }

    #[test]
    fn an_undecodable_nonce_is_removed_and_never_stops_the_purge() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for (n, expires) in [(1u8, 100), (2, 100), (3, 150), (4, 300)] {
            assert!(store.use_nonce(&[n; 16], expires).unwrap());
        }
        store.token_nonce.insert([2u8; 16], &[9, 9, 9][..]).unwrap();
        store.token_nonce.insert([3u8; 16], &[][..]).unwrap();
        store.revoke_resumes("s1", 10, 120).unwrap();
        store.session_revoked.insert("s1", &[records::RECORD_VERSION][..]).unwrap();
        // An index entry too short to name a key.
        store.nonces_by_expiry.entries.insert([0u8; 3], &[][..]).unwrap();
        assert_eq!(store.purge_nonces(200).unwrap(), 4, "1, the corrupt 2 and 3, and s1's revocation");
        assert_eq!(store.token_nonce.len(), 1);
        assert!(!store.use_nonce(&[4; 16], 300).unwrap(), "the one not due is still spent");
        assert_eq!(store.resumes_revoked_at("s1").unwrap(), None);
        assert_eq!(store.nonces_by_expiry.entries.len(), 1, "only the entry not due is left");
        assert_eq!(store.purge_nonces(300).unwrap(), 1);
        assert_eq!((store.token_nonce.len(), store.nonces_by_expiry.entries.len()), (0, 0));
    }

    #[test]
    fn a_purge_reads_only_what_is_due() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for n in 0..1_000u64 {
            let mut nonce = [0u8; 16];
            nonce[..8].copy_from_slice(&n.to_be_bytes());
            assert!(store.use_nonce(&nonce, 1_000 + n).unwrap());
        }
        // A record the index does not know is never read: a purge cannot trip on it.
        store.token_nonce.insert([0xff; 16], &b"garbage"[..]).unwrap();
        assert_eq!(store.purge_nonces(1_009).unwrap(), 10);
        assert_eq!(store.nonces_by_expiry.entries.len(), 990);
        assert_eq!(store.token_nonce.len(), 991);
    }

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
            revoked.insert("s1", records::encode(&RevokedRecord { at_ms: 50, keep_until_ms: 150 })).unwrap();
            let migrations = db.open_tree("user_migration").unwrap();
            migrations.insert("u1", records::encode(&MigrationRecord { last_migration_ms: 1_000 })).unwrap();
            db.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let schema = store.meta.get("schema_version").unwrap().unwrap();
        assert_eq!(schema.as_ref(), &SCHEMA_VERSION.to_be_bytes());
        assert_eq!(store.token_nonce.len(), 2, "the undecodable record is gone");
        assert!(!store.use_nonce(&[1; 16], 100).unwrap(), "old nonces are still spent");
        assert_eq!(store.resumes_revoked_at("s1").unwrap(), Some(50));
        assert_eq!(store.purge_nonces(200).unwrap(), 2);
        assert!(store.use_nonce(&[1; 16], 100).unwrap(), "purged");
        assert!(!store.use_nonce(&[2; 16], 300).unwrap());
        assert_eq!(store.purge_migrations(4_000, 3_000).unwrap(), 1);
        drop(store);
        // Upgraded once: the next open finds schema 2 and indexes nothing again.
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.purge_nonces(400).unwrap(), 2);
        assert_eq!(store.token_nonce.len(), 0);
    }

    #[test]
    fn a_nonce_given_back_can_be_spent_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.use_nonce(&[1; 16], 100).unwrap());
        store.unuse_nonce(&[1; 16]).unwrap();
        assert!(store.use_nonce(&[1; 16], 100).unwrap());
        assert!(!store.use_nonce(&[1; 16], 100).unwrap());
    }

    #[test]
    fn kicks_keep_the_latest_time_per_user_and_device_until_they_are_purged() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.kicked_at("u@x", "web").unwrap(), None);
        store.record_kick("u@x", Some("phone"), 300, 900).unwrap();
        assert_eq!(store.kicked_at("u@x", "web").unwrap(), None, "a kick of the phone leaves the web");
        assert_eq!(store.kicked_at("u@x", "phone").unwrap(), Some(300));
        store.record_kick("u@x", None, 100, 700).unwrap();
        store.record_kick("u@x", None, 50, 650).unwrap();
        assert_eq!(store.kicked_at("u@x", "web").unwrap(), Some(100), "an older kick does not win");
        assert_eq!(store.kicked_at("u@x", "phone").unwrap(), Some(300), "the later of the two");
        assert_eq!(store.kicked_at("u", "web").unwrap(), None, "another user");
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.kicked_at("u@x", "web").unwrap(), Some(100), "kept across a restart");
        assert_eq!(store.purge_kicks(699).unwrap(), 0);
        assert_eq!(store.purge_kicks(700).unwrap(), 1);
        assert_eq!(store.kicked_at("u@x", "web").unwrap(), None);
        assert_eq!(store.kicked_at("u@x", "phone").unwrap(), Some(300));
        store.kicks_by_expiry.note(b"bad", 800).unwrap();
        store.user_kicked.insert(b"bad", &b"\xff"[..]).unwrap();
        assert_eq!(store.purge_kicks(800).unwrap(), 1, "an undecodable record is removed, not an error");
        assert_eq!(store.purge_kicks(900).unwrap(), 1);
    }

    #[test]
    fn resume_revocations_keep_the_latest_time_until_they_are_purged() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.resumes_revoked_at("s1").unwrap(), None);
        store.revoke_resumes("s1", 100, 700).unwrap();
        store.revoke_resumes("s1", 50, 650).unwrap();
        assert_eq!(store.resumes_revoked_at("s1").unwrap(), Some(100), "an older revocation does not win");
        store.revoke_resumes("s1", 200, 800).unwrap();
        assert_eq!(store.resumes_revoked_at("s1").unwrap(), Some(200));
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.resumes_revoked_at("s1").unwrap(), Some(200), "kept across a restart");
        assert_eq!(store.purge_nonces(799).unwrap(), 0);
        assert_eq!(store.purge_nonces(800).unwrap(), 1);
        assert_eq!(store.resumes_revoked_at("s1").unwrap(), None);
    }

    #[test]
    fn webhooks_queue_in_order_survive_reopen_and_page() {
        let dir = tempfile::tempdir().unwrap();
        let record = |n: u64| WebhookRecord { room: format!("r{}", n % 2), id: format!("w-{n}"), body: format!(r#"{{"n":{n}}}"#) };
        {
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.last_webhook_seq().unwrap(), None);
            // 255 before 256: the keys sort by number, not by their first byte.
            for seq in [1, 2, 255, 256, 300] {
                store.queue_webhook(seq, &record(seq)).unwrap();
            }
            store.remove_webhook(2).unwrap();
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let seqs = |list: Vec<(u64, WebhookRecord)>| list.into_iter().map(|(seq, _)| seq).collect::<Vec<_>>();
        assert_eq!(seqs(store.queued_webhooks(0, 100).unwrap()), [1, 255, 256, 300]);
        assert_eq!(seqs(store.queued_webhooks(255, 2).unwrap()), [255, 256]);
        assert_eq!(seqs(store.queued_webhooks(301, 2).unwrap()), Vec::<u64>::new());
        assert_eq!(store.queued_webhook(256).unwrap(), Some(record(256)));
        assert_eq!(store.queued_webhook(2).unwrap(), None);
        assert_eq!(store.last_webhook_seq().unwrap(), Some(300));
    }

    #[test]
    fn secret_is_stable_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let first = Store::open(dir.path()).unwrap().secret("token").unwrap();
        assert_eq!(first.len(), 32);
        assert_eq!(Store::open(dir.path()).unwrap().secret("token").unwrap(), first);
    }

    #[test]
    fn racing_session_writers_from_one_version_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let record = |owner: &str| SessionRecord {
            session: "s1".into(),
            user: "u1".into(),
            owner: owner.into(),
            version: 0,
            updated_at_ms: 0,
        };
        let first = store.write_session(None, &record("a")).unwrap();
        assert_eq!(first.version, 1);
        assert!(matches!(store.write_session(None, &record("b")), Err(StoreError::Stale(_))));
        for round in 0..50u64 {
            let read = store.session("s1").unwrap().unwrap().version;
            let barrier = std::sync::Barrier::new(2);
            let wins: Vec<bool> = std::thread::scope(|scope| {
                let writers: Vec<_> = ["x", "y"]
                    .map(|owner| {
                        let (store, barrier, rec) = (&store, &barrier, record(owner));
                        scope.spawn(move || {
                            barrier.wait();
                            store.write_session(Some(read), &rec).is_ok()
                        })
                    })
                    .into_iter()
                    .collect();
                writers.into_iter().map(|w| w.join().unwrap()).collect()
            });
            assert_eq!(wins.iter().filter(|w| **w).count(), 1, "round {round}: {wins:?}");
            assert_eq!(store.session("s1").unwrap().unwrap().version, read + 1);
        }
        assert_eq!(store.sessions_of_user("u1").unwrap().len(), 1);
        assert_eq!(store.count_sessions("x").unwrap().0, 1);
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
