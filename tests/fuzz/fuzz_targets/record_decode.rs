//! `store::records::decode` of every stored record type on arbitrary bytes never panics
//! (a corrupt or hostile database file is an error, not a crash); whatever decodes
//! encodes to bytes that decode to the same record; and arbitrary records survive
//! `encode` then `decode` unchanged.
#![no_main]

use std::fmt::Debug;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use livegate::store::records::{self, EventRecord, MigrationRecord, NonceRecord, RoomHeadRecord, SessionRecord};
use serde::{de::DeserializeOwned, Serialize};

fn decodes<T: Serialize + DeserializeOwned + PartialEq + Debug>(bytes: &[u8]) {
    if let Ok(record) = records::decode::<T>("fuzz", bytes) {
        let again = records::encode(&record);
        let back = records::decode::<T>("fuzz", &again);
        assert_eq!(back.as_ref().ok(), Some(&record), "re-encoding {record:?} ({again:?}) decodes as {back:?}");
    }
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(record: T) {
    let bytes = records::encode(&record);
    assert_eq!(bytes[0], records::RECORD_VERSION);
    match records::decode::<T>("fuzz", &bytes) {
        Ok(back) => assert_eq!(back, record, "round trip through {bytes:?}"),
        Err(e) => panic!("{record:?} encoded as {bytes:?} does not decode: {e}"),
    }
}

#[derive(Arbitrary, Debug)]
enum AnyRecord {
    RoomHead { epoch: String, head: u64 },
    Event { seq: u64, id: String, ts_ms: u64, data: String, devices: Option<Vec<String>>, from: Option<String> },
    Session { session: String, user: String, owner: String, version: u64, updated_at_ms: u64 },
    Migration { last_migration_ms: u64 },
    Nonce { expires_at_ms: u64 },
}

fuzz_target!(|data: &[u8]| {
    // The raw bytes as a stored value of every tree's type.
    decodes::<RoomHeadRecord>(data);
    if let Ok(event) = records::decode_event("fuzz", data) {
        let back = records::decode_event("fuzz", &records::encode_event(&event));
        assert_eq!(back.as_ref().ok(), Some(&event), "re-encoding {event:?} decodes as {back:?}");
    }
    decodes::<SessionRecord>(data);
    decodes::<MigrationRecord>(data);
    decodes::<NonceRecord>(data);

    // The same bytes as the description of a record to round-trip.
    let Ok(record) = AnyRecord::arbitrary_take_rest(Unstructured::new(data)) else { return };
    match record {
        AnyRecord::RoomHead { epoch, head } => round_trip(RoomHeadRecord { epoch, head }),
        AnyRecord::Event { seq, id, ts_ms, data, devices, from } => {
            let event = EventRecord { seq, id, ts_ms, data, devices, from };
            assert_eq!(records::decode_event("fuzz", &records::encode_event(&event)).ok(), Some(event));
        }
        AnyRecord::Session { session, user, owner, version, updated_at_ms } => {
            round_trip(SessionRecord { session, user, owner, version, updated_at_ms })
        }
        AnyRecord::Migration { last_migration_ms } => round_trip(MigrationRecord { last_migration_ms }),
        AnyRecord::Nonce { expires_at_ms } => round_trip(NonceRecord { expires_at_ms }),
    }
});
