//! The webhook queue (`webhooks`: queue seq → a webhook waiting to be delivered, in queue
//! order), the rooms told occupied and not yet vacated (`webhook_occupied`: room → ();
//! one node only), and the dead letters (`webhook_dead`: dead-letter seq → a webhook given
//! up, oldest first; `webhook_dead_id`: its id → its seq). A webhook moves from the queue
//! to the dead letters in one transaction, with the oldest dead letters the bound drops.

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::records::{self, DeadLetterRecord, WebhookRecord};
use super::StoreError;

/// The webhook trees ([`Store::webhooks`](super::Store::webhooks)).
#[derive(Clone)]
pub struct WebhookQueue {
    webhooks: sled::Tree,
    webhook_occupied: sled::Tree,
    webhook_dead: sled::Tree,
    webhook_dead_id: sled::Tree,
}

/// One dead letter and its place in the list (larger: newer).
pub type DeadLetter = (u64, DeadLetterRecord);

impl WebhookQueue {
    pub(super) fn open(db: &sled::Db) -> Result<WebhookQueue, StoreError> {
        Ok(WebhookQueue {
            webhooks: db.open_tree("webhooks")?,
            webhook_occupied: db.open_tree("webhook_occupied")?,
            webhook_dead: db.open_tree("webhook_dead")?,
            webhook_dead_id: db.open_tree("webhook_dead_id")?,
        })
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
        self.webhooks
            .get(seq.to_be_bytes())?
            .map(|value| records::decode("webhooks", &value))
            .transpose()
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
                String::from_utf8(key.to_vec()).map_err(|_| StoreError::Corrupt {
                    tree: "webhook_occupied",
                    why: "room is not UTF-8".into(),
                })
            })
            .collect()
    }
}

/// The dead letters.
impl WebhookQueue {
    /// Take queued webhook `queue_seq` off the queue and keep `record` as dead letter
    /// `dead_seq` (larger than every dead letter's), dropping the dead letters `drop` (seq
    /// and id: the oldest, to keep the bound), in one transaction. Durable once a flush
    /// returns.
    pub fn bury(
        &self,
        queue_seq: u64,
        dead_seq: u64,
        record: &DeadLetterRecord,
        drop: &[(u64, String)],
    ) -> Result<(), StoreError> {
        let bytes = records::encode(record);
        let written: Result<(), TransactionError<()>> =
            (&self.webhooks, &self.webhook_dead, &self.webhook_dead_id).transaction(
                |(queue, dead, ids)| {
                    queue.remove(&queue_seq.to_be_bytes())?;
                    for (seq, id) in drop {
                        dead.remove(&seq.to_be_bytes())?;
                        ids.remove(id.as_bytes())?;
                    }
                    dead.insert(&dead_seq.to_be_bytes(), bytes.as_slice())?;
                    ids.insert(record.id.as_bytes(), &dead_seq.to_be_bytes())?;
                    Ok::<(), ConflictableTransactionError<()>>(())
                },
            );
        transacted(written)
    }

    /// The `limit` newest dead letters, newest first.
    pub fn dead_newest(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        self.webhook_dead.iter().rev().take(limit).map(|item| decode_dead(item?)).collect()
    }

    /// The `n` oldest dead letters' seqs and ids, oldest first.
    pub fn dead_oldest(&self, n: usize) -> Result<Vec<(u64, String)>, StoreError> {
        self.webhook_dead
            .iter()
            .take(n)
            .map(|item| decode_dead(item?).map(|(seq, record)| (seq, record.id)))
            .collect()
    }

    /// Dead letter `id`, if it is kept.
    pub fn dead_find(&self, id: &str) -> Result<Option<DeadLetter>, StoreError> {
        let Some(seq) = self.webhook_dead_id.get(id.as_bytes())? else { return Ok(None) };
        let seq = key_seq("webhook_dead_id", &seq)?;
        let Some(value) = self.webhook_dead.get(seq.to_be_bytes())? else { return Ok(None) };
        Ok(Some((seq, records::decode("webhook_dead", &value)?)))
    }

    /// Write dead letter `seq` again (a replay that failed: its attempts and last error).
    pub fn dead_update(&self, seq: u64, record: &DeadLetterRecord) -> Result<(), StoreError> {
        self.webhook_dead.insert(seq.to_be_bytes(), records::encode(record))?;
        Ok(())
    }

    /// Forget dead letter `seq` with id `id` (replayed or deleted).
    pub fn dead_remove(&self, seq: u64, id: &str) -> Result<(), StoreError> {
        let written: Result<(), TransactionError<()>> = (&self.webhook_dead, &self.webhook_dead_id)
            .transaction(|(dead, ids)| {
                dead.remove(&seq.to_be_bytes())?;
                ids.remove(id.as_bytes())?;
                Ok::<(), ConflictableTransactionError<()>>(())
            });
        transacted(written)
    }

    /// Forget every dead letter; how many there were.
    pub fn dead_clear(&self) -> Result<usize, StoreError> {
        let count = self.webhook_dead.len();
        self.webhook_dead.clear()?;
        self.webhook_dead_id.clear()?;
        Ok(count)
    }

    /// Dead letters kept (reads them all: at start).
    pub fn dead_count(&self) -> usize {
        self.webhook_dead.len()
    }

    /// The newest dead letter's seq (`None`: there is none).
    pub fn dead_last_seq(&self) -> Result<Option<u64>, StoreError> {
        self.webhook_dead.last()?.map(|(key, _)| key_seq("webhook_dead", &key)).transpose()
    }
}

fn decode_dead((key, value): (sled::IVec, sled::IVec)) -> Result<DeadLetter, StoreError> {
    Ok((key_seq("webhook_dead", &key)?, records::decode("webhook_dead", &value)?))
}

fn transacted(written: Result<(), TransactionError<()>>) -> Result<(), StoreError> {
    match written {
        Ok(()) => Ok(()),
        Err(TransactionError::Storage(e)) => Err(e.into()),
        Err(TransactionError::Abort(())) => unreachable!("the transaction never aborts"),
    }
}

fn webhook_seq(key: &[u8]) -> Result<u64, StoreError> {
    key_seq("webhooks", key)
}

fn key_seq(tree: &'static str, key: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] =
        key.try_into().map_err(|_| StoreError::Corrupt { tree, why: "not 8 bytes".into() })?;
    Ok(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn webhooks_queue_in_order_survive_reopen_and_page() {
        let dir = tempfile::tempdir().unwrap();
        let record = |n: u64| WebhookRecord {
            room: format!("r{}", n % 2),
            id: format!("w-{n}"),
            body: format!(r#"{{"n":{n}}}"#),
        };
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
        let seqs = |list: Vec<(u64, WebhookRecord)>| {
            list.into_iter().map(|(seq, _)| seq).collect::<Vec<_>>()
        };
        assert_eq!(seqs(queue.page(0, 100).unwrap()), [1, 255, 256, 300]);
        assert_eq!(seqs(queue.page(255, 2).unwrap()), [255, 256]);
        assert_eq!(seqs(queue.page(301, 2).unwrap()), Vec::<u64>::new());
        assert_eq!(queue.get(256).unwrap(), Some(record(256)));
        assert_eq!(queue.get(2).unwrap(), None);
        assert_eq!(queue.last_seq().unwrap(), Some(300));
    }

    fn dead(n: u64) -> DeadLetterRecord {
        DeadLetterRecord {
            id: format!("w-{n}"),
            kind: "room_occupied".into(),
            room: "lobby".into(),
            url: "http://backend/hooks".into(),
            body: format!(r#"{{"id":"w-{n}"}}"#),
            attempts: 3,
            first_attempt_ms: n,
            last_attempt_ms: n + 1,
            last_error: "HTTP 500".into(),
            reason: "attempts".into(),
        }
    }

    #[test]
    fn dead_letters_leave_the_queue_in_one_step_survive_reopen_and_drop_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let record = |n: u64| WebhookRecord {
            room: "lobby".into(),
            id: format!("w-{n}"),
            body: format!(r#"{{"id":"w-{n}"}}"#),
        };
        {
            let store = Store::open(dir.path()).unwrap();
            let queue = store.webhooks();
            assert_eq!((queue.dead_count(), queue.dead_last_seq().unwrap()), (0, None));
            for n in 1..=4 {
                queue.push(n, &record(n)).unwrap();
            }
            for n in 1..=3 {
                queue.bury(n, n + 100, &dead(n), &[]).unwrap();
            }
            assert_eq!(queue.get(2).unwrap(), None, "off the queue");
            assert_eq!(queue.page(0, 10).unwrap().len(), 1);
            // The fourth pushes out the two oldest.
            let oldest = queue.dead_oldest(2).unwrap();
            assert_eq!(oldest, [(101, "w-1".to_string()), (102, "w-2".to_string())]);
            queue.bury(4, 104, &dead(4), &oldest).unwrap();
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let queue = store.webhooks();
        let ids = |list: Vec<DeadLetter>| list.into_iter().map(|(_, r)| r.id).collect::<Vec<_>>();
        assert_eq!(
            ids(queue.dead_newest(10).unwrap()),
            ["w-4", "w-3"],
            "newest first, kept over a reopen"
        );
        assert_eq!(ids(queue.dead_newest(1).unwrap()), ["w-4"]);
        assert_eq!(
            (queue.dead_count(), queue.dead_last_seq().unwrap(), queue.last_seq().unwrap()),
            (2, Some(104), None)
        );
        assert_eq!(queue.dead_find("w-1").unwrap(), None, "dropped: its id is gone too");
        let (seq, mut found) = queue.dead_find("w-3").unwrap().unwrap();
        assert_eq!((seq, &found), (103, &dead(3)));
        found.attempts += 1;
        queue.dead_update(seq, &found).unwrap();
        assert_eq!(queue.dead_find("w-3").unwrap().unwrap().1.attempts, 4);
        queue.dead_remove(seq, "w-3").unwrap();
        assert_eq!((queue.dead_find("w-3").unwrap(), queue.dead_count()), (None, 1));
        assert_eq!(queue.dead_clear().unwrap(), 1);
        assert_eq!((queue.dead_find("w-4").unwrap(), queue.dead_count()), (None, 0));
    }
}
