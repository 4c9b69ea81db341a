//! Key layouts. Numbers are big-endian so sled's byte order is numeric order; a room's
//! keys share the prefix `room 0x00` (room names never contain 0x00).

pub fn room_prefix(room: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(room.len() + 9);
    key.extend_from_slice(room.as_bytes());
    key.push(0);
    key
}

pub fn event_key(room: &str, seq: u64) -> Vec<u8> {
    let mut key = room_prefix(room);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// `user 0x00 session`: the user → sessions index.
pub fn user_session_key(user: &str, session: &str) -> Vec<u8> {
    let mut key = room_prefix(user);
    key.extend_from_slice(session.as_bytes());
    key
}

/// `at_ms key`: an entry of a time index (records by a time of theirs), so a purge reads
/// only the prefix up to its cutoff.
pub fn timed_key(at_ms: u64, key: &[u8]) -> Vec<u8> {
    let mut timed = Vec::with_capacity(8 + key.len());
    timed.extend_from_slice(&at_ms.to_be_bytes());
    timed.extend_from_slice(key);
    timed
}

pub fn split_timed_key(timed: &[u8]) -> Option<(u64, &[u8])> {
    let (at, key) = timed.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*at), key))
}

/// `user` (a kick of every device) or `user 0x00 device` (a kick of one device).
pub fn user_kick_key(user: &str, device: Option<&str>) -> Vec<u8> {
    match device {
        None => user.as_bytes().to_vec(),
        Some(device) => user_session_key(user, device),
    }
}

/// `last_seen_ms session`: sessions by the time their last connection closed.
pub fn expiry_key(last_seen_ms: u64, session: &str) -> Vec<u8> {
    timed_key(last_seen_ms, session.as_bytes())
}

pub fn split_expiry_key(key: &[u8]) -> Option<(u64, &str)> {
    let (at, session) = split_timed_key(key)?;
    Some((at, std::str::from_utf8(session).ok()?))
}

pub fn seq_of_event_key(key: &[u8]) -> Option<u64> {
    let tail: [u8; 8] = key.get(key.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(u64::from_be_bytes(tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_keys_sort_by_room_then_seq() {
        let mut keys =
            vec![event_key("a", 256), event_key("ab", 1), event_key("a", 2), event_key("a", 1)];
        keys.sort();
        assert_eq!(
            keys,
            vec![event_key("a", 1), event_key("a", 2), event_key("a", 256), event_key("ab", 1)]
        );
        assert!(!event_key("ab", 1).starts_with(&room_prefix("a")));
        assert_eq!(seq_of_event_key(&event_key("r", 42)), Some(42));
        assert_eq!(seq_of_event_key(b"short"), None);
        assert!(expiry_key(255, "b") < expiry_key(256, "a"));
        assert_eq!(split_expiry_key(&expiry_key(7, "s1")), Some((7, "s1")));
        assert_eq!(split_expiry_key(b"short"), None);
        assert!(timed_key(255, &[9; 16]) < timed_key(256, &[0; 16]));
        assert_eq!(split_timed_key(&timed_key(7, &[1, 2])), Some((7, &[1u8, 2][..])));
        assert_eq!(split_timed_key(&[0; 7]), None);
    }
}
