//! Validation of the names clients and backends send: rooms, users, devices, event ids,
//! and the room patterns a token may carry.

use thiserror::Error;

/// Longest room name.
pub const MAX_ROOM_LEN: usize = 128;
/// Prefix of every user's inbox room.
pub const INBOX_PREFIX: &str = "user:";
/// Longest user id (so that `user:<id>` is still a valid room name).
pub const MAX_USER_LEN: usize = MAX_ROOM_LEN - INBOX_PREFIX.len();
/// Longest device name.
pub const MAX_DEVICE_LEN: usize = 32;
/// Longest event id.
pub const MAX_EVENT_ID_LEN: usize = 128;
/// Longest session id a client may name (the node makes 24 hex digits).
pub const MAX_SESSION_LEN: usize = 64;
/// Longest node name or cell (the configuration's `node`, `cell`, `cells` and `peers`,
/// and what a peer announces).
pub const MAX_NODE_NAME_LEN: usize = 64;

#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum NameError {
    #[error(
        "room names are 1 to 128 characters of A-Z a-z 0-9 _ . : - (and @ in an inbox, user:<id>)"
    )]
    BadRoom,
    #[error("user ids are 1 to 123 characters of A-Z a-z 0-9 _ . : - @")]
    BadUser,
    #[error("device names are 1 to 32 characters of A-Z a-z 0-9 _ . -")]
    BadDevice,
    #[error("event ids are 1 to 128 printable ASCII characters")]
    BadEventId,
    #[error("session ids are 1 to 64 characters of A-Z a-z 0-9 _ . -")]
    BadSession,
}

/// A plain name: 1 to `max` characters of A-Z a-z 0-9 _ . - (no `:`, no `@`). The one
/// rule for devices, session ids, node names and cells, wherever they come from (a
/// client, the configuration, a peer); each caller names the thing in its own error.
pub fn is_plain_name(name: &str, max: usize) -> bool {
    (1..=max).contains(&name.len())
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn is_room_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'-')
}

/// A room name: room characters, or the inbox of a valid user id (`user:<id>`, so the
/// `@` a user id may hold is allowed there and nowhere else).
pub fn check_room(room: &str) -> Result<(), NameError> {
    let plain = room.bytes().all(is_room_char);
    let inbox = || inbox_owner(room).is_some_and(|owner| check_user(owner).is_ok());
    let ok = (1..=MAX_ROOM_LEN).contains(&room.len()) && (plain || inbox());
    ok.then_some(()).ok_or(NameError::BadRoom)
}

pub fn check_user(user: &str) -> Result<(), NameError> {
    let ok = (1..=MAX_USER_LEN).contains(&user.len())
        && user.bytes().all(|c| is_room_char(c) || c == b'@');
    ok.then_some(()).ok_or(NameError::BadUser)
}

pub fn check_device(device: &str) -> Result<(), NameError> {
    is_plain_name(device, MAX_DEVICE_LEN).then_some(()).ok_or(NameError::BadDevice)
}

pub fn check_event_id(id: &str) -> Result<(), NameError> {
    let ok = (1..=MAX_EVENT_ID_LEN).contains(&id.len()) && id.bytes().all(|c| c.is_ascii_graphic());
    ok.then_some(()).ok_or(NameError::BadEventId)
}

/// A session id a client names (`session=`, to resume it): it becomes a store key and, in
/// cluster mode, part of a NATS subject, so it is short and plain.
pub fn check_session(session: &str) -> Result<(), NameError> {
    is_plain_name(session, MAX_SESSION_LEN).then_some(()).ok_or(NameError::BadSession)
}

/// The inbox room of a user: `user:<id>`.
pub fn inbox_room(user: &str) -> String {
    format!("{INBOX_PREFIX}{user}")
}

/// The user whose inbox `room` is, if it is an inbox room.
pub fn inbox_owner(room: &str) -> Option<&str> {
    room.strip_prefix(INBOX_PREFIX)
}

/// Whether a connection of `user`, whose token allows `patterns` (empty: any room), may
/// read `room`. Another user's inbox is never allowed; the own inbox always is. A pattern
/// is an exact name or a prefix followed by `*`.
pub fn may_read(user: &str, patterns: &[String], room: &str) -> bool {
    if let Some(owner) = inbox_owner(room) {
        return owner == user;
    }
    patterns.is_empty() || matches_any(patterns, room)
}

/// Whether a connection whose token grants publish `patterns` may publish to `room`.
/// No patterns: no room. An inbox (`user:…`) never, not even the own and
/// not even one a pattern names: inboxes are written by backends only, so a message
/// there always comes from the server side.
pub fn may_publish(patterns: &[String], room: &str) -> bool {
    inbox_owner(room).is_none() && matches_any(patterns, room)
}

/// The key an event's idempotency id is kept under in its room: a backend's id as it is,
/// a client's (`from`: its user) behind its user and a space. Neither event ids nor user
/// ids hold a space, so a client's id never takes a backend's or another user's, and a
/// client retrying its own publish still finds it.
pub fn idempotency_key(id: &str, from: Option<&str>) -> String {
    match from {
        Some(user) => format!("{user} {id}"),
        None => id.to_string(),
    }
}

/// The id an event was published with, from its [`idempotency_key`] (a key without the
/// user's prefix is the id itself, as events stored before the keys carried users).
pub fn id_of_key<'a>(key: &'a str, from: Option<&str>) -> &'a str {
    from.and_then(|user| key.strip_prefix(user)?.strip_prefix(' ')).unwrap_or(key)
}

fn matches_any(patterns: &[String], room: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => room.starts_with(prefix),
        None => p == room,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_rights() {
        let patterns = |ps: &[&str]| ps.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let cases: &[(&[&str], &str, bool)] = &[
            (&[], "chat:1", false),
            (&["chat:*"], "chat:1", true),
            (&["chat:*"], "chat:", true),
            (&["chat:*"], "match:1", false),
            (&["lobby"], "lobby", true),
            (&["lobby"], "lobby2", false),
            (&["user:*"], "user:u1", false),
            (&["user:u1"], "user:u1", false),
            (&["us*"], "user:u2", false),
            (&["us*"], "usa", true),
        ];
        for (ps, room, ok) in cases {
            assert_eq!(may_publish(&patterns(ps), room), *ok, "patterns {ps:?} room {room}");
        }
    }

    #[test]
    fn room_names() {
        let long = "a".repeat(129);
        let max = "a".repeat(128);
        let cases: &[(&str, bool)] = &[
            ("match:1", true),
            ("a", true),
            ("A-z_0.9:x", true),
            (&max, true),
            ("", false),
            (&long, false),
            ("with space", false),
            ("slash/room", false),
            ("ünïcode", false),
            ("nul\0", false),
            ("star*", false),
            ("user:ann@example.com", true),
            ("user:", true),
            ("ann@example.com", false),
            ("match:a@b", false),
            ("user:@", true),
            ("user:a b@c", false),
        ];
        for (room, ok) in cases {
            assert_eq!(check_room(room).is_ok(), *ok, "room {room:?}");
        }
    }

    #[test]
    fn users_devices_ids() {
        assert!(check_user("alice@example.com").is_ok());
        assert_eq!(check_user(""), Err(NameError::BadUser));
        assert_eq!(check_user(&"u".repeat(124)), Err(NameError::BadUser));
        assert!(check_room(&inbox_room(&"u".repeat(123))).is_ok());
        // Every valid user id's inbox is a valid room: its owner reads and recovers it.
        for user in ["alice@example.com", "@", "a@b@c", &format!("{}@", "u".repeat(122))] {
            assert!(check_user(user).is_ok(), "{user}");
            assert!(check_room(&inbox_room(user)).is_ok(), "the inbox of {user}");
        }
        assert!(check_device("phone").is_ok());
        assert_eq!(check_device("ph:one"), Err(NameError::BadDevice));
        assert_eq!(check_device(&"d".repeat(33)), Err(NameError::BadDevice));
        assert!(check_event_id("e-9").is_ok());
        assert_eq!(check_event_id("has space"), Err(NameError::BadEventId));
        assert_eq!(check_event_id(""), Err(NameError::BadEventId));
    }

    #[test]
    fn plain_names_one_rule() {
        // (name, max, plain): the rule's edges, then each caller keeps its own bound and error.
        let cases: &[(&str, usize, bool)] = &[
            ("a", 1, true),
            ("", 1, false),
            ("ab", 1, false),
            ("A-z_0.9", 7, true),
            ("a:b", 8, false),
            ("a@b", 8, false),
            ("a b", 8, false),
            ("é", 8, false),
            ("a\0", 8, false),
            ("star*", 8, false),
        ];
        for &(name, max, plain) in cases {
            assert_eq!(is_plain_name(name, max), plain, "{name:?} max {max}");
        }
        for len in [0, 1, 32, 33, 64, 65] {
            let name = "n".repeat(len);
            let at_most = |max: usize| (1..=max).contains(&len);
            assert_eq!(check_device(&name).is_ok(), at_most(MAX_DEVICE_LEN), "device of {len}");
            assert_eq!(check_session(&name).is_ok(), at_most(MAX_SESSION_LEN), "session of {len}");
            let node = crate::core::nodes::peer_input::node_name("n", &name);
            assert_eq!(node.is_ok(), at_most(MAX_NODE_NAME_LEN), "node of {len}");
        }
        assert_eq!(check_device("a.b"), Ok(()));
        assert_eq!(check_session("a:b"), Err(NameError::BadSession));
        assert_eq!(
            NameError::BadSession.to_string(),
            "session ids are 1 to 64 characters of A-Z a-z 0-9 _ . -"
        );
        assert_eq!(
            NameError::BadDevice.to_string(),
            "device names are 1 to 32 characters of A-Z a-z 0-9 _ . -"
        );
    }

    #[test]
    fn read_permissions() {
        let none: Vec<String> = vec![];
        let matches = vec!["match:*".to_string(), "lobby".to_string()];
        let cases: &[(&str, &[String], &str, bool)] = &[
            ("u1", &none, "match:1", true),
            ("u1", &none, "user:u1", true),
            ("u1", &none, "user:u2", false),
            ("u1", &matches, "match:7", true),
            ("u1", &matches, "lobby", true),
            ("u1", &matches, "lobby2", false),
            ("u1", &matches, "chat:1", false),
            ("u1", &matches, "user:u1", true),
            ("u1", &matches, "user:u2", false),
        ];
        for (user, patterns, room, ok) in cases {
            assert_eq!(may_read(user, patterns, room), *ok, "{user} {patterns:?} {room}");
        }
    }

    #[test]
    fn idempotency_keys_keep_clients_apart_from_backends_and_each_other() {
        let cases: &[(&str, Option<&str>, &str)] = &[
            ("sys-42", None, "sys-42"),
            ("sys-42", Some("mallory"), "mallory sys-42"),
            ("sys-42", Some("eve@x.org"), "eve@x.org sys-42"),
        ];
        for (id, from, key) in cases {
            assert_eq!(idempotency_key(id, *from), *key);
            assert_eq!(id_of_key(key, *from), *id, "{key}");
        }
        // An id stored under the bare id (before keys carried users) reads as itself.
        assert_eq!(id_of_key("sys-42", Some("mallory")), "sys-42");
        assert_eq!(id_of_key("malloryx sys-42", Some("mallory")), "malloryx sys-42");
        // No backend id can be a client's key: ids hold no space.
        assert!(check_event_id(&idempotency_key("sys-42", Some("mallory"))).is_err());
    }

    #[test]
    fn session_ids() {
        let max = "s".repeat(MAX_SESSION_LEN);
        let long = "s".repeat(MAX_SESSION_LEN + 1);
        let cases: &[(&str, bool)] = &[
            ("0123456789abcdef01234567", true),
            ("no-such-session", true),
            ("A.b_c-9", true),
            (&max, true),
            ("", false),
            (&long, false),
            ("a.*", false),
            ("a>b", false),
            ("with space", false),
            ("ses:sion", false),
            ("ünï", false),
        ];
        for (session, ok) in cases {
            assert_eq!(check_session(session).is_ok(), *ok, "session {session:?}");
        }
    }
}
