//! The single-node session directory: owner records (`session_owner`, with the index
//! `user_session`: user 0x00 session → ()), which sessions a process holds connected
//! (`session_live`), when each one's last connection closed (`session_seen`) and the
//! expiry index over that time (`session_expiry`: time ‖ session → ()).
//!
//! A session is connected (never expired) while it has a connected mark, or while it
//! has no `session_seen` record at all: a session created by a handshake has never
//! closed, so its record alone says it is connected and its first connection writes no
//! mark (one write less on the handshake's critical path, and one less at its close).
//! A later connection of a session that has closed before is marked, as it must be: its
//! `session_seen` record says it closed. Either way a process that stops with the
//! session open leaves it connected, and the next start counts it closed then
//! ([`Sessions::release_orphans`]). Stores written before this rule hold a mark for
//! every connected session, new or not, and open unchanged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::records::{self, SeenRecord, SessionRecord};
use super::{keys, StoreError};
use crate::core::nodes::sessions::{next_version, VersionError};

/// The session trees ([`Store::sessions`](super::Store::sessions)).
#[derive(Clone)]
pub struct Sessions {
    session_owner: sled::Tree,
    user_session: sled::Tree,
    session_live: sled::Tree,
    session_seen: sled::Tree,
    session_expiry: sled::Tree,
    /// Records in `session_owner`, counted at open and kept by every insert and delete.
    stored: Arc<AtomicU64>,
}

impl Sessions {
    pub(super) fn open(db: &sled::Db) -> Result<Sessions, StoreError> {
        let session_owner = db.open_tree("session_owner")?;
        let stored = Arc::new(AtomicU64::new(session_owner.len() as u64));
        Ok(Sessions {
            session_owner,
            user_session: db.open_tree("user_session")?,
            session_live: db.open_tree("session_live")?,
            session_seen: db.open_tree("session_seen")?,
            session_expiry: db.open_tree("session_expiry")?,
            stored,
        })
    }

    /// Sessions written by a build before expiry count as seen when last written (once,
    /// noted in `meta`).
    pub(super) fn date_undated(&self, meta: &sled::Tree) -> Result<(), StoreError> {
        if meta.get("sessions_dated")?.is_some() {
            return Ok(());
        }
        for item in self.session_owner.iter() {
            let (key, value) = item?;
            let record: SessionRecord = records::decode("session_owner", &value)?;
            if !self.session_seen.contains_key(&key)? {
                self.mark_seen(
                    &record.session,
                    SeenRecord { last_seen_ms: record.updated_at_ms, seen_by: 0 },
                )?;
            }
        }
        meta.insert("sessions_dated", &[1])?;
        Ok(())
    }

    /// The owner record of a session.
    pub fn get(&self, session: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.session_owner
            .get(session.as_bytes())?
            .map(|bytes| records::decode("session_owner", &bytes))
            .transpose()
    }

    /// Write a session record if the stored version is still `read_version` (`None`: the
    /// session must not exist). The new record gets the next version, which is returned.
    /// A stale write changes nothing and fails with [`StoreError::Stale`].
    pub fn write(
        &self,
        read_version: Option<u64>,
        record: &SessionRecord,
    ) -> Result<SessionRecord, StoreError> {
        let key = record.session.as_bytes();
        // A new record swaps against nothing: no read first (a handshake's new session).
        let current = match read_version {
            None => None,
            Some(_) => self.session_owner.get(key)?,
        };
        let stored_version = current
            .as_ref()
            .map(|bytes| {
                records::decode::<SessionRecord>("session_owner", bytes).map(|r| r.version)
            })
            .transpose()?;
        let version = next_version(read_version, stored_version)?;
        let written = SessionRecord { version, ..record.clone() };
        let created = current.is_none();
        let swapped =
            self.session_owner.compare_and_swap(key, current, Some(records::encode(&written)))?;
        if swapped.is_err() {
            // Another writer got in between our read and our swap.
            let stored = self.get(&record.session)?.map(|r| r.version);
            return Err(VersionError::Stale { read: read_version, stored }.into());
        }
        if created {
            self.stored.fetch_add(1, Ordering::Relaxed);
        }
        self.user_session.insert(keys::user_session_key(&record.user, &record.session), &[])?;
        Ok(written)
    }

    /// Every session record of `user`.
    pub fn of_user(&self, user: &str) -> Result<Vec<SessionRecord>, StoreError> {
        let prefix = keys::room_prefix(user);
        let mut sessions = Vec::new();
        for item in self.user_session.scan_prefix(&prefix) {
            let (key, _) = item?;
            let session = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
            if let Some(record) = self.get(&session)? {
                sessions.push(record);
            }
        }
        Ok(sessions)
    }

    /// Records in the session directory now.
    pub fn stored(&self) -> u64 {
        self.stored.load(Ordering::Relaxed)
    }

    /// A session's first connection in process `incarnation` opened. Not needed for a
    /// session that has never closed (see the module doc): the caller skips it for a
    /// session its handshake created.
    pub fn connected(&self, session: &str, incarnation: u64) -> Result<(), StoreError> {
        self.session_live.insert(session.as_bytes(), &incarnation.to_be_bytes())?;
        Ok(())
    }

    /// A session's last connection closed at `now_ms`; its expiry counts from then.
    pub fn released(&self, session: &str, now_ms: u64, incarnation: u64) -> Result<(), StoreError> {
        self.mark_seen(session, SeenRecord { last_seen_ms: now_ms, seen_by: incarnation })?;
        self.session_live.remove(session.as_bytes())?;
        Ok(())
    }

    /// When the session's last connection closed and which process saw it.
    pub fn seen(&self, session: &str) -> Result<Option<SeenRecord>, StoreError> {
        self.session_seen
            .get(session.as_bytes())?
            .map(|bytes| records::decode("session_seen", &bytes))
            .transpose()
    }

    fn mark_seen(&self, session: &str, seen: SeenRecord) -> Result<(), StoreError> {
        self.session_expiry.insert(keys::expiry_key(seen.last_seen_ms, session), &[])?;
        if let Some(previous) =
            self.session_seen.insert(session.as_bytes(), records::encode(&seen))?
        {
            let previous: SeenRecord = records::decode("session_seen", &previous)?;
            if previous.last_seen_ms != seen.last_seen_ms {
                self.session_expiry.remove(keys::expiry_key(previous.last_seen_ms, session))?;
            }
        }
        Ok(())
    }

    /// Sessions an earlier process left connected (it stopped or crashed with them open)
    /// count as released at `now_ms`: those it marked connected, seen by that process, and
    /// those that never closed (no `session_seen` record), seen by process 0 (none this
    /// run). Reads the connected marks, and the owner and seen keys side by side (both
    /// trees are in session order: one pass over each, no lookups); run before this
    /// process opens any session.
    pub fn release_orphans(&self, now_ms: u64, incarnation: u64) -> Result<usize, StoreError> {
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
        for session in self.never_closed()? {
            self.mark_seen(&session, SeenRecord { last_seen_ms: now_ms, seen_by: 0 })?;
            released += 1;
        }
        Ok(released)
    }

    /// The sessions with an owner record and no `session_seen` record: a merge of the two
    /// trees' keys, both sorted by session.
    fn never_closed(&self) -> Result<Vec<String>, StoreError> {
        let mut seen = self.session_seen.iter().keys();
        let mut next_seen = seen.next().transpose()?;
        let mut open = Vec::new();
        for key in self.session_owner.iter().keys() {
            let key = key?;
            while next_seen.as_ref().is_some_and(|s| s.as_ref() < key.as_ref()) {
                next_seen = seen.next().transpose()?;
            }
            if next_seen.as_ref().map(|s| s.as_ref()) != Some(key.as_ref()) {
                open.push(String::from_utf8_lossy(&key).into_owned());
            }
        }
        Ok(open)
    }

    /// A session's last connection closed, where the session's expiry is kept elsewhere
    /// (cluster mode: the KV bucket's age limit): only the connected mark goes.
    pub fn disconnected(&self, session: &str) -> Result<(), StoreError> {
        self.session_live.remove(session.as_bytes())?;
        Ok(())
    }

    /// Cluster mode's orphans: the sessions an earlier process left marked connected, at
    /// most `limit` of them (oldest key first), each with the process that marked it.
    /// Every such mark is removed, those beyond `limit` too (returned as a count), so the
    /// next start finds none of them again. Reads only the connected marks.
    pub fn take_orphans(
        &self,
        incarnation: u64,
        limit: usize,
    ) -> Result<(Vec<String>, usize), StoreError> {
        let (mut taken, mut beyond) = (Vec::new(), 0);
        for item in self.session_live.iter() {
            let (key, value) = item?;
            let seen_by = value.as_ref().try_into().map(u64::from_be_bytes).unwrap_or(0);
            if seen_by == incarnation {
                continue;
            }
            self.session_live.remove(&key)?;
            if taken.len() < limit {
                taken.push(String::from_utf8_lossy(&key).into_owned());
            } else {
                beyond += 1;
            }
        }
        Ok((taken, beyond))
    }

    /// Delete up to `limit` sessions whose last connection closed at or before
    /// `cutoff_ms`, with their user-index entries, unless `is_live` says one is connected
    /// again. Returns (entries examined, ids deleted); fewer examined than `limit` means
    /// nothing older is left.
    pub fn expire(
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
            if self.seen(session)?.map(|s| s.last_seen_ms) != Some(at) || is_live(session) {
                continue;
            }
            if let Some(bytes) = self.session_owner.remove(session.as_bytes())? {
                let record: SessionRecord = records::decode("session_owner", &bytes)?;
                self.user_session.remove(keys::user_session_key(&record.user, session))?;
                self.stored.fetch_sub(1, Ordering::Relaxed);
            }
            self.session_seen.remove(session.as_bytes())?;
            self.session_live.remove(session.as_bytes())?;
            deleted.push(session.to_string());
        }
        Ok((examined, deleted))
    }

    /// How many sessions the directory holds, and how many of them `node` owns.
    pub fn count(&self, node: &str) -> Result<(usize, usize), StoreError> {
        let (mut all, mut owned) = (0, 0);
        for item in self.session_owner.iter() {
            let (_, value) = item?;
            let record: SessionRecord = records::decode("session_owner", &value)?;
            all += 1;
            owned += usize::from(record.owner == node);
        }
        Ok((all, owned))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

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
        let sessions = store.sessions();
        for (session, user) in [("s1", "u1"), ("s2", "u1"), ("s3", "u2"), ("s4", "u3")] {
            sessions.write(None, &record(session, user)).unwrap();
            sessions.connected(session, 7).unwrap();
        }
        assert_eq!(sessions.stored(), 4);
        sessions.released("s1", 2_000, 7).unwrap();
        sessions.released("s2", 2_000, 7).unwrap();
        sessions.released("s2", 5_000, 7).unwrap(); // closed again later: expiry moves
        sessions.released("s3", 2_000, 7).unwrap();
        sessions.connected("s3", 7).unwrap(); // connected again; s4 never closed
        let (examined, mut deleted) = sessions.expire(4_000, 100, |s| s == "s3").unwrap();
        deleted.sort();
        assert_eq!((examined, deleted), (2, vec!["s1".to_string()]));
        assert_eq!(sessions.get("s1").unwrap(), None);
        assert_eq!(
            sessions.of_user("u1").unwrap().iter().map(|r| r.session.as_str()).collect::<Vec<_>>(),
            ["s2"]
        );
        assert_eq!(sessions.stored(), 3);
        assert_eq!(sessions.expire(4_999, 100, |_| false).unwrap(), (0, vec![]));
        assert_eq!(sessions.expire(5_000, 100, |_| false).unwrap(), (1, vec!["s2".to_string()]));
        drop(store);

        // A restart: s3 and s4 were left connected by process 7; they count as closed at
        // the new start, seen by 7, and expire from then.
        let store = Store::open(dir.path()).unwrap();
        let sessions = store.sessions();
        assert_eq!(sessions.stored(), 2);
        assert_eq!(sessions.release_orphans(9_000, 8).unwrap(), 2);
        assert_eq!(
            sessions.seen("s4").unwrap(),
            Some(SeenRecord { last_seen_ms: 9_000, seen_by: 7 })
        );
        assert_eq!(sessions.release_orphans(9_000, 8).unwrap(), 0);
        assert_eq!(sessions.expire(8_999, 100, |_| false).unwrap(), (0, vec![]));
        let (_, mut deleted) = sessions.expire(9_000, 1, |_| false).unwrap();
        deleted.extend(sessions.expire(9_000, 1, |_| false).unwrap().1);
        deleted.sort();
        assert_eq!(deleted, ["s3", "s4"]);
        assert_eq!(sessions.stored(), 0);
        assert_eq!(sessions.of_user("u2").unwrap(), vec![]);
    }

    #[test]
    fn a_new_session_needs_no_mark_and_counts_closed_at_the_next_start_as_marked_ones_do() {
        let dir = tempfile::tempdir().unwrap();
        let record = |session: &str| SessionRecord {
            session: session.into(),
            user: "u1".into(),
            owner: "a".into(),
            version: 0,
            updated_at_ms: 500,
        };
        let store = Store::open(dir.path()).unwrap();
        let sessions = store.sessions();
        // Written as stores before this layout rule were: a new session marked connected.
        sessions.write(None, &record("old")).unwrap();
        sessions.connected("old", 7).unwrap();
        // This rule: a new session is not marked until it has closed once.
        sessions.write(None, &record("new")).unwrap();
        sessions.write(None, &record("back")).unwrap();
        sessions.released("back", 1_000, 7).unwrap();
        sessions.connected("back", 7).unwrap();
        sessions.write(None, &record("gone")).unwrap();
        sessions.released("gone", 1_000, 7).unwrap();
        // Still running: the closed session expires; new never does, having no close.
        let is_live = |session: &str| ["new", "back"].contains(&session);
        assert_eq!(sessions.expire(5_000, 100, is_live).unwrap(), (2, vec!["gone".into()]));
        drop(store);

        // The process stopped with old, new and back connected: each counts as closed at
        // the next start, once.
        let store = Store::open(dir.path()).unwrap();
        let sessions = store.sessions();
        assert_eq!(sessions.release_orphans(9_000, 8).unwrap(), 3);
        let seen = |session| sessions.seen(session).unwrap();
        assert_eq!(seen("old"), Some(SeenRecord { last_seen_ms: 9_000, seen_by: 7 }));
        assert_eq!(seen("new"), Some(SeenRecord { last_seen_ms: 9_000, seen_by: 0 }));
        assert_eq!(seen("back"), Some(SeenRecord { last_seen_ms: 9_000, seen_by: 7 }));
        assert_eq!(sessions.release_orphans(9_000, 8).unwrap(), 0);
        assert_eq!(sessions.expire(8_999, 100, |_| false).unwrap(), (0, vec![]));
        let (examined, mut deleted) = sessions.expire(9_000, 100, |_| false).unwrap();
        deleted.sort();
        assert_eq!((examined, deleted), (3, vec!["back".into(), "new".into(), "old".into()]));
        assert_eq!(sessions.stored(), 0);
    }

    #[test]
    fn orphans_are_taken_once_up_to_the_limit_and_this_run_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let sessions = store.sessions();
        for session in ["s1", "s2", "s3"] {
            sessions.connected(session, 7).unwrap();
        }
        sessions.connected("mine", 8).unwrap();
        sessions.connected("gone", 7).unwrap();
        sessions.disconnected("gone").unwrap();
        assert_eq!(
            sessions.take_orphans(8, 2).unwrap(),
            (vec!["s1".to_string(), "s2".to_string()], 1)
        );
        assert_eq!(
            sessions.take_orphans(8, 2).unwrap(),
            (vec![], 0),
            "taken once, beyond the limit too"
        );
        assert_eq!(sessions.take_orphans(9, 2).unwrap(), (vec!["mine".to_string()], 0));
        assert_eq!(sessions.seen("s1").unwrap(), None, "no expiry kept here: the bucket keeps it");
    }

    #[test]
    fn racing_session_writers_from_one_version_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let sessions = store.sessions();
        let record = |owner: &str| SessionRecord {
            session: "s1".into(),
            user: "u1".into(),
            owner: owner.into(),
            version: 0,
            updated_at_ms: 0,
        };
        let first = sessions.write(None, &record("a")).unwrap();
        assert_eq!(first.version, 1);
        assert!(matches!(sessions.write(None, &record("b")), Err(StoreError::Stale(_))));
        for round in 0..50u64 {
            let read = sessions.get("s1").unwrap().unwrap().version;
            let barrier = std::sync::Barrier::new(2);
            let wins: Vec<bool> = std::thread::scope(|scope| {
                let writers: Vec<_> = ["x", "y"]
                    .map(|owner| {
                        let (sessions, barrier, rec) = (&sessions, &barrier, record(owner));
                        scope.spawn(move || {
                            barrier.wait();
                            sessions.write(Some(read), &rec).is_ok()
                        })
                    })
                    .into_iter()
                    .collect();
                writers.into_iter().map(|w| w.join().unwrap()).collect()
            });
            assert_eq!(wins.iter().filter(|w| **w).count(), 1, "round {round}: {wins:?}");
            assert_eq!(sessions.get("s1").unwrap().unwrap().version, read + 1);
        }
        assert_eq!(sessions.of_user("u1").unwrap().len(), 1);
        assert_eq!(sessions.count("x").unwrap().0, 1);
    }
}
