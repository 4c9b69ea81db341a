//! Each user's last migration time (`user_migration`, indexed by that time in
//! `migration_expiry`): the migration budget's memory on one node, and in cluster mode
//! the charges this node made while NATS was away.

use super::records::{self, MigrationRecord};
use super::time_index::TimeIndex;
use super::StoreError;

/// The migration trees ([`Store::migrations`](super::Store::migrations)).
#[derive(Clone)]
pub struct Migrations {
    user_migration: sled::Tree,
    /// `user_migration` by migration time.
    pub(super) by_time: TimeIndex,
}

impl Migrations {
    pub(super) fn open(db: &sled::Db) -> Result<Migrations, StoreError> {
        let user_migration = db.open_tree("user_migration")?;
        let by_time =
            TimeIndex::open(db, "migration_expiry", &user_migration, "user_migration", |value| {
                records::decode::<MigrationRecord>("user_migration", value)
                    .map(|r| r.last_migration_ms)
            })?;
        Ok(Migrations { user_migration, by_time })
    }

    /// When `user`'s last migration was, while it is kept.
    pub fn last(&self, user: &str) -> Result<Option<u64>, StoreError> {
        self.user_migration
            .get(user.as_bytes())?
            .map(|bytes| {
                records::decode::<MigrationRecord>("user_migration", &bytes)
                    .map(|r| r.last_migration_ms)
            })
            .transpose()
    }

    /// Charge a migration of `user` at `at_ms`.
    pub fn set_last(&self, user: &str, at_ms: u64) -> Result<(), StoreError> {
        let record = MigrationRecord { last_migration_ms: at_ms };
        self.by_time.note(user.as_bytes(), at_ms)?;
        self.user_migration.insert(user.as_bytes(), records::encode(&record))?;
        Ok(())
    }

    /// Every user's migration time still kept (the purge forgets those past their window).
    pub fn all(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut found = Vec::new();
        for item in self.user_migration.iter() {
            let (key, value) = item?;
            let user = String::from_utf8(key.to_vec()).map_err(|_| StoreError::Corrupt {
                tree: "user_migration",
                why: "key is not UTF-8".into(),
            })?;
            found.push((
                user,
                records::decode::<MigrationRecord>("user_migration", &value)?.last_migration_ms,
            ));
        }
        Ok(found)
    }

    /// Forget migration times older than `window_ms`: past its window a record budgets
    /// nothing (the same as none). A record rewritten meanwhile stays.
    pub fn purge(&self, now_ms: u64, window_ms: u64) -> Result<usize, StoreError> {
        match now_ms.checked_sub(window_ms) {
            Some(cutoff) => self.by_time.purge(cutoff),
            None => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[test]
    fn migration_times_are_forgotten_once_past_their_window() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let migrations = store.migrations();
        migrations.set_last("old", 1_000).unwrap();
        migrations.set_last("recent", 5_000).unwrap();
        // Window 3 s, now 6 s: "old" (budget free since 4 s) goes, "recent" (until 8 s) stays.
        assert_eq!(migrations.purge(6_000, 3_000).unwrap(), 1);
        assert_eq!(migrations.last("old").unwrap(), None);
        assert_eq!(migrations.last("recent").unwrap(), Some(5_000));
        assert_eq!(migrations.purge(8_000, 3_000).unwrap(), 1);
        assert_eq!(migrations.last("recent").unwrap(), None);
    }
}
