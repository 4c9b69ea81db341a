//! The webhook queue (`webhooks`: queue seq → a webhook waiting to be delivered, in queue
//! order) and the rooms told occupied and not yet vacated (`webhook_occupied`: room → ();
//! one node only).

use super::records::{self, WebhookRecord};
use super::StoreError;

/// The webhook trees ([`Store::webhooks`](super::Store::webhooks)).
#[derive(Clone)]
pub struct WebhookQueue {
    webhooks: sled::Tree,
    webhook_occupied: sled::Tree,
}

impl WebhookQueue {
    pub(super) fn open(db: &sled::Db) -> Result<WebhookQueue, StoreError> {
        Ok(WebhookQueue { webhooks: db.open_tree("webhooks")?, webhook_occupied: db.open_tree("webhook_occupied")? })
    }

    /// Queue webhook `seq` (larger than every queued seq). Durable once a flush returns.
    pub fn push(&self, seq: u64, record: &WebhookRecord) -> Result<(), StoreError> {
        self.webhooks.insert(seq.to_be_bytes(), records::encode(record))?;
        Ok(())
    }

    /// Up to `limit` queued webhooks from seq `start` on, in queue order.
    pub fn page(&self, start: u64, limit: usize) -> Result<Vec<(u64, WebhookRecord)>, StoreError> {
        let mut queued = Vec::new();
        for item in self.webhooks.range(start.to_be_bytes()..).take(limit) {
            let (key, value) = item?;
            queued.push((webhook_seq(&key)?, records::decode("webhooks", &value)?));
        }
        Ok(queued)
    }

    /// Queued webhook `seq`, if it is still queued.
    pub fn get(&self, seq: u64) -> Result<Option<WebhookRecord>, StoreError> {
        self.webhooks.get(seq.to_be_bytes())?.map(|value| records::decode("webhooks", &value)).transpose()
    }

    /// The last queued webhook's seq (`None`: the queue is empty).
    pub fn last_seq(&self) -> Result<Option<u64>, StoreError> {
        self.webhooks.last()?.map(|(key, _)| webhook_seq(&key)).transpose()
    }

    /// Remove webhook `seq` (delivered, or given up on).
    pub fn remove(&self, seq: u64) -> Result<(), StoreError> {
        self.webhooks.remove(seq.to_be_bytes())?;
        Ok(())
    }

    /// Note that `room`'s `room_occupied` webhook was queued (`occupied`) or its
    /// `room_vacated` was: the rooms still noted after a crash are owed a `room_vacated`.
    pub fn note_occupancy(&self, room: &str, occupied: bool) -> Result<(), StoreError> {
        if occupied {
            self.webhook_occupied.insert(room.as_bytes(), &[][..])?;
        } else {
            self.webhook_occupied.remove(room.as_bytes())?;
        }
        Ok(())
    }

    /// The rooms whose `room_occupied` was queued and whose `room_vacated` was not.
    pub fn noted_occupied(&self) -> Result<Vec<String>, StoreError> {
        self.webhook_occupied
            .iter()
            .keys()
            .map(|key| {
                let key = key?;
                String::from_utf8(key.to_vec()).map_err(|_| StoreError::Corrupt { tree: "webhook_occupied", why: "room is not UTF-8".into() })
            })
            .collect()
    }
}

fn webhook_seq(key: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| StoreError::Corrupt { tree: "webhooks", why: "key is not 8 bytes".into() })?;
    Ok(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn webhooks_queue_in_order_survive_reopen_and_page() {
        let dir = tempfile::tempdir().unwrap();
        let record = |n: u64| WebhookRecord { room: format!("r{}", n % 2), id: format!("w-{n}"), body: format!(r#"{{"n":{n}}}"#) };
        {
            let store = Store::open(dir.path()).unwrap();
            let queue = store.webhooks();
            assert_eq!(queue.last_seq().unwrap(), None);
            // 255 before 256: the keys sort by number, not by their first byte.
            for seq in [1, 2, 255, 256, 300] {
                queue.push(seq, &record(seq)).unwrap();
            }
            queue.remove(2).unwrap();
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let queue = store.webhooks();
        let seqs = |list: Vec<(u64, WebhookRecord)>| list.into_iter().map(|(seq, _)| seq).collect::<Vec<_>>();
        assert_eq!(seqs(queue.page(0, 100).unwrap()), [1, 255, 256, 300]);
        assert_eq!(seqs(queue.page(255, 2).unwrap()), [255, 256]);
        assert_eq!(seqs(queue.page(301, 2).unwrap()), Vec::<u64>::new());
        assert_eq!(queue.get(256).unwrap(), Some(record(256)));
        assert_eq!(queue.get(2).unwrap(), None);
        assert_eq!(queue.last_seq().unwrap(), Some(300));
    }
}
