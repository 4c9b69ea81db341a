//! Rooms on one node: each room's head (`room_head`: epoch + head seq), its events
//! (`room_event`: room 0x00 seq → event) and its latest state (`room_state`), and the
//! epoch of every room this store writes first (`meta` key `rooms_epoch`).

use super::records::{self, EventRecord, RoomHeadRecord, StateRecord};
use super::{keys, StoreError};

/// A room as stored: its head record and the newest events of its history, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRoom {
    pub head: RoomHeadRecord,
    pub events: Vec<EventRecord>,
    /// The room's latest state, if one was ever set.
    pub state: Option<StateRecord>,
}

/// The rooms' trees ([`Store::rooms`](super::Store::rooms)).
#[derive(Clone)]
pub struct Rooms {
    db: sled::Db,
    meta: sled::Tree,
    room_head: sled::Tree,
    room_event: sled::Tree,
    room_state: sled::Tree,
}

impl Rooms {
    pub(super) fn open(db: &sled::Db, meta: &sled::Tree) -> Result<Rooms, StoreError> {
        Ok(Rooms {
            db: db.clone(),
            meta: meta.clone(),
            room_head: db.open_tree("room_head")?,
            room_event: db.open_tree("room_event")?,
            room_state: db.open_tree("room_state")?,
        })
    }

    /// The epoch of every room first written by this store (16 hex digits), made on first
    /// use and kept for good (`meta` key `rooms_epoch`). A room never published to has no
    /// record and answers this epoch, and its first publish stores it: a client told the
    /// epoch of an empty room recovers with it, across restarts too. A new data directory
    /// makes a new one, so its rooms' seqs are never taken for an old directory's.
    pub fn epoch(&self) -> Result<String, StoreError> {
        const KEY: &str = "rooms_epoch";
        if let Some(existing) = self.meta.get(KEY)? {
            return String::from_utf8(existing.to_vec()).map_err(|_| StoreError::Corrupt {
                tree: "meta",
                why: "rooms_epoch is not UTF-8".into(),
            });
        }
        let mut fresh = [0u8; 8];
        getrandom::getrandom(&mut fresh)?;
        let fresh = hex::encode(fresh);
        // Two callers racing: the first insert wins and both read it back.
        let _ = self.meta.compare_and_swap(KEY, None as Option<&[u8]>, Some(fresh.as_bytes()))?;
        let stored = self.meta.get(KEY)?.ok_or(StoreError::Closed)?;
        self.db.flush()?;
        String::from_utf8(stored.to_vec()).map_err(|_| StoreError::Corrupt {
            tree: "meta",
            why: "rooms_epoch is not UTF-8".into(),
        })
    }

    /// The room's head and its newest `max_events` events, or `None` for a room never created.
    pub fn load(&self, room: &str, max_events: usize) -> Result<Option<StoredRoom>, StoreError> {
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
        let state = self.state(room)?;
        Ok(Some(StoredRoom { head, events, state }))
    }

    /// [`Rooms::append`] with the room's state as of this event: event, head and state in
    /// one transaction, so after a crash the state never names an event that is not there
    /// (nor the other way round). Not durable until a flush.
    pub fn append_with_state(
        &self,
        room: &str,
        epoch: &str,
        event: &EventRecord,
        state: &str,
    ) -> Result<(), StoreError> {
        use sled::transaction::{ConflictableTransactionError, TransactionError};
        use sled::Transactional;
        let event_bytes = records::encode_event(event);
        let head = records::encode(&RoomHeadRecord { epoch: epoch.to_string(), head: event.seq });
        let state = records::encode(&StateRecord { seq: event.seq, data: state.to_string() });
        let key = keys::event_key(room, event.seq);
        let written: Result<(), TransactionError<()>> =
            (&self.room_event, &self.room_head, &self.room_state).transaction(
                |(events, heads, states)| {
                    events.insert(key.as_slice(), event_bytes.as_slice())?;
                    heads.insert(room.as_bytes(), head.as_slice())?;
                    states.insert(room.as_bytes(), state.as_slice())?;
                    Ok::<(), ConflictableTransactionError<()>>(())
                },
            );
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
    pub fn state(&self, room: &str) -> Result<Option<StateRecord>, StoreError> {
        self.room_state
            .get(room.as_bytes())?
            .map(|bytes| records::decode("room_state", &bytes))
            .transpose()
    }

    /// Record a new room with its epoch and head 0.
    pub fn create(&self, room: &str, epoch: &str) -> Result<(), StoreError> {
        let record = RoomHeadRecord { epoch: epoch.to_string(), head: 0 };
        self.room_head.insert(room.as_bytes(), records::encode(&record))?;
        Ok(())
    }

    /// Write an event and advance the room's head to it. Not durable until a flush.
    pub fn append(&self, room: &str, epoch: &str, event: &EventRecord) -> Result<(), StoreError> {
        self.room_event.insert(keys::event_key(room, event.seq), records::encode_event(event))?;
        let head = RoomHeadRecord { epoch: epoch.to_string(), head: event.seq };
        self.room_head.insert(room.as_bytes(), records::encode(&head))?;
        Ok(())
    }

    /// Delete a room's events with seq below `first_kept`.
    pub fn trim(&self, room: &str, first_kept: u64) -> Result<usize, StoreError> {
        let mut removed = 0;
        for item in
            self.room_event.range(keys::event_key(room, 0)..keys::event_key(room, first_kept))
        {
            let (key, _) = item?;
            self.room_event.remove(key)?;
            removed += 1;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn event(seq: u64) -> EventRecord {
        EventRecord {
            seq,
            id: format!("e{seq}"),
            ts_ms: seq,
            data: "{}".into(),
            devices: None,
            from: None,
        }
    }

    #[test]
    fn rooms_survive_reopen_with_head_epoch_and_history() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let rooms = store.rooms();
            assert_eq!(rooms.load("r", 10).unwrap(), None);
            rooms.create("r", "E1").unwrap();
            for seq in 1..=5 {
                rooms.append("r", "E1", &event(seq)).unwrap();
            }
            rooms.append("r2", "E2", &event(1)).unwrap();
            assert_eq!(rooms.trim("r", 3).unwrap(), 2);
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let room = store.rooms().load("r", 10).unwrap().unwrap();
        assert_eq!(room.head, RoomHeadRecord { epoch: "E1".into(), head: 5 });
        assert_eq!(room.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4, 5]);
        let newest = store.rooms().load("r", 2).unwrap().unwrap();
        assert_eq!(newest.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    }

    #[test]
    fn a_state_is_stored_with_its_event_and_outlives_the_history() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let rooms = store.rooms();
            rooms.create("r", "E1").unwrap();
            rooms.append("r", "E1", &event(1)).unwrap();
            rooms.append_with_state("r", "E1", &event(2), r#"{"n":2}"#).unwrap();
            rooms.append("r", "E1", &event(3)).unwrap();
            assert_eq!(rooms.trim("r", 3).unwrap(), 2);
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let rooms = store.rooms();
        let room = rooms.load("r", 10).unwrap().unwrap();
        assert_eq!(room.head.head, 3);
        assert_eq!(room.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3]);
        assert_eq!(room.state, Some(StateRecord { seq: 2, data: r#"{"n":2}"#.into() }));
        rooms.put_state("r", &StateRecord { seq: 3, data: "null".into() }).unwrap();
        assert_eq!(rooms.state("r").unwrap(), Some(StateRecord { seq: 3, data: "null".into() }));
        assert_eq!(rooms.state("other").unwrap(), None);
    }
}
