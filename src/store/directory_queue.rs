//! Cluster mode's outage queue (`directory_queue`: a generated id → a session write made
//! while NATS was unreachable), replayed in order once NATS is back.

use super::records::{self, QueuedSessionWrite};
use super::StoreError;

/// The outage queue's tree ([`Store::directory_queue`](super::Store::directory_queue)).
#[derive(Clone)]
pub struct DirectoryQueue {
    db: sled::Db,
    directory_queue: sled::Tree,
}

impl DirectoryQueue {
    pub(super) fn open(db: &sled::Db) -> Result<DirectoryQueue, StoreError> {
        Ok(DirectoryQueue { db: db.clone(), directory_queue: db.open_tree("directory_queue")? })
    }

    /// Queue a cluster directory write for replay (durable once the next flush returns).
    pub fn push(&self, write: &QueuedSessionWrite) -> Result<(), StoreError> {
        let id = self.db.generate_id()?;
        self.directory_queue.insert(id.to_be_bytes(), records::encode(write))?;
        Ok(())
    }

    /// Queued cluster directory writes, oldest first, with the key that removes each.
    pub fn all(&self) -> Result<Vec<(u64, QueuedSessionWrite)>, StoreError> {
        let mut writes = Vec::new();
        for item in self.directory_queue.iter() {
            let (key, value) = item?;
            let id = u64::from_be_bytes(key.as_ref().try_into().map_err(|_| {
                StoreError::Corrupt { tree: "directory_queue", why: "key is not 8 bytes".into() }
            })?);
            writes.push((id, records::decode("directory_queue", &value)?));
        }
        Ok(writes)
    }

    /// Remove a replayed write.
    pub fn remove(&self, id: u64) -> Result<(), StoreError> {
        self.directory_queue.remove(id.to_be_bytes())?;
        Ok(())
    }
}
