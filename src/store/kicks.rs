//! Kicks (`user_kicked`: user, or user 0x00 device → when they were last kicked, indexed
//! by the time they may be forgotten in `kick_expiry`): a kick voids every credential
//! issued to the user (on the device) at or before it, on this node.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::records::{self, RevokedRecord};
use super::time_index::TimeIndex;
use super::{keys, StoreError};

/// The kick trees ([`Store::kicks`](super::Store::kicks)).
#[derive(Clone)]
pub struct Kicks {
    user_kicked: sled::Tree,
    /// `user_kicked` by the time it may be forgotten.
    by_expiry: TimeIndex,
    /// Whether a kick may be stored: false while the tree was empty at open and nothing
    /// was recorded since, so a handshake's [`Kicks::kicked_at`] reads nothing on a node
    /// where nobody was kicked. Never goes back to false while running.
    any: Arc<AtomicBool>,
}

impl Kicks {
    pub(super) fn open(db: &sled::Db) -> Result<Kicks, StoreError> {
        let user_kicked = db.open_tree("user_kicked")?;
        let by_expiry = TimeIndex::open(db, "kick_expiry", &user_kicked, "user_kicked", |value| {
            records::decode::<RevokedRecord>("user_kicked", value).map(|r| r.keep_until_ms)
        })?;
        let any = Arc::new(AtomicBool::new(!user_kicked.is_empty()));
        Ok(Kicks { user_kicked, by_expiry, any })
    }

    /// Void every credential of `user` (of its `device` only, when given) issued at or
    /// before `at_ms`; remembered until `keep_until_ms` (when the last of them expires).
    /// A later kick wins.
    pub fn record(
        &self,
        user: &str,
        device: Option<&str>,
        at_ms: u64,
        keep_until_ms: u64,
    ) -> Result<(), StoreError> {
        let record = RevokedRecord { at_ms, keep_until_ms };
        let key = keys::user_kick_key(user, device);
        // Before the record: a reader that finds no kick yet read before the kick.
        self.any.store(true, Ordering::SeqCst);
        self.by_expiry.note(&key, keep_until_ms)?;
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
        if !self.any.load(Ordering::SeqCst) {
            return Ok(latest);
        }
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
    pub fn purge(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.by_expiry.purge(now_ms)
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[test]
    fn kicks_keep_the_latest_time_per_user_and_device_until_they_are_purged() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let kicks = store.kicks();
        assert_eq!(kicks.kicked_at("u@x", "web").unwrap(), None);
        kicks.record("u@x", Some("phone"), 300, 900).unwrap();
        assert_eq!(
            kicks.kicked_at("u@x", "web").unwrap(),
            None,
            "a kick of the phone leaves the web"
        );
        assert_eq!(kicks.kicked_at("u@x", "phone").unwrap(), Some(300));
        kicks.record("u@x", None, 100, 700).unwrap();
        kicks.record("u@x", None, 50, 650).unwrap();
        assert_eq!(kicks.kicked_at("u@x", "web").unwrap(), Some(100), "an older kick does not win");
        assert_eq!(kicks.kicked_at("u@x", "phone").unwrap(), Some(300), "the later of the two");
        assert_eq!(kicks.kicked_at("u", "web").unwrap(), None, "another user");
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        let kicks = store.kicks();
        assert_eq!(kicks.kicked_at("u@x", "web").unwrap(), Some(100), "kept across a restart");
        assert_eq!(kicks.purge(699).unwrap(), 0);
        assert_eq!(kicks.purge(700).unwrap(), 1);
        assert_eq!(kicks.kicked_at("u@x", "web").unwrap(), None);
        assert_eq!(kicks.kicked_at("u@x", "phone").unwrap(), Some(300));
        kicks.by_expiry.note(b"bad", 800).unwrap();
        kicks.user_kicked.insert(b"bad", &b"\xff"[..]).unwrap();
        assert_eq!(kicks.purge(800).unwrap(), 1, "an undecodable record is removed, not an error");
        assert_eq!(kicks.purge(900).unwrap(), 1);
    }
}
