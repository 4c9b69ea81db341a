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

/// `user` (a kick of every device) or `user 0x00 device` (a kick of one device).
pub fn user_kick_key(user: &str, device: Option<&str>) -> Vec<u8> {
    match device {
        None => user.as_bytes().to_vec(),
        Some(device) => user_session_key(user, device),
    }
}

/// `last_seen_ms session`: sessions by the time their last connection closed.
pub fn expiry_key(last_seen_ms: u64, session: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + session.len());
    key.extend_from_slice(&last_seen_ms.to_be_bytes());
    key.extend_from_slice(session.as_bytes());
    key
}

pub fn split_expiry_key(key: &[u8]) -> Option<(u64, &str)> {
    let (at, session) = key.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*at), std::str::from_utf8(session).ok()?))
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
        let mut keys = vec![event_key("a", 256), event_key("ab", 1), event_key("a", 2), event_key("a", 1)];
        keys.sort();
        assert_eq!(keys, vec![event_key("a", 1), event_key("a", 2), event_key("a", 256), event_key("ab", 1)]);
        assert!(!event_key("ab", 1).starts_with(&room_prefix("a")));
        assert_eq!(seq_of_event_key(&event_key("r", 42)), Some(42));
        assert_eq!(seq_of_event_key(b"short"), None);
        assert!(expiry_key(255, "b") < expiry_key(256, "a"));
        assert_eq!(split_expiry_key(&expiry_key(7, "s1")), Some((7, "s1")));
        assert_eq!(split_expiry_key(b"short"), None);
    }
}
