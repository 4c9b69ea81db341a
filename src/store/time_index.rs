//! `TimeIndex`: a tree's records indexed by a time of theirs, so a purge reads only what
//! is due. Shared by the facades whose records are forgotten by time (nonces and
//! revocations, kicks, migration times).

use super::{keys, StoreError};

/// A tree's records indexed by a time of theirs (an expiry, or a time a window counts
/// from): entries `time ‖ key → ()` in a tree of their own, written before the record,
/// so [`TimeIndex::purge`] reads only the entries up to its cutoff instead of walking
/// the records. A record rewritten with a later time has a later entry too; the earlier
/// one finds it newer and leaves it. Adding a purged tree is one more `TimeIndex` and
/// one more line in its purge.
#[derive(Clone)]
pub(super) struct TimeIndex {
    pub(super) entries: sled::Tree,
    records: sled::Tree,
    /// The records' tree, for logs.
    name: &'static str,
    /// The time a record is indexed by.
    time_of: fn(&[u8]) -> Result<u64, StoreError>,
}

impl TimeIndex {
    pub(super) fn open(
        db: &sled::Db,
        index: &'static str,
        records: &sled::Tree,
        name: &'static str,
        time_of: fn(&[u8]) -> Result<u64, StoreError>,
    ) -> Result<TimeIndex, StoreError> {
        Ok(TimeIndex { entries: db.open_tree(index)?, records: records.clone(), name, time_of })
    }

    /// Record `key` as due at `at_ms` (before the record itself is written).
    pub(super) fn note(&self, key: &[u8], at_ms: u64) -> Result<(), StoreError> {
        self.entries.insert(keys::timed_key(at_ms, key), &[][..])?;
        Ok(())
    }

    /// Remove the records whose time is at or before `cutoff_ms`, reading only the index
    /// entries due by then. An undecodable record (or index entry) is logged with its key
    /// and removed: it would never be due otherwise, and it never stops the purge.
    /// Returns how many records were removed.
    pub(super) fn purge(&self, cutoff_ms: u64) -> Result<usize, StoreError> {
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
                Err(error) => {
                    tracing::warn!(tree = self.name, key = %hex::encode(key), %error, "undecodable record removed by the purge")
                }
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
    pub(super) fn index_all(&self) -> Result<usize, StoreError> {
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
