//! The pure parts of the Server-Sent Events transport: the `rooms` list of a
//! `/v1/sse` request, the recovery cursor (`Last-Event-ID` or `since`) and the framing of
//! one message's data as `data:` lines. No I/O; the handler and the transport call these.
//!
//! A cursor is `ROOM:EPOCH:SEQ` entries joined with `,`. Room names may contain `:` but
//! never `,`, and epochs never contain `:`, so each entry is read from the right.

use thiserror::Error;

use crate::core::rules::names;

/// Why a `rooms` list is refused.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum RoomsError {
    #[error("room {0:?} in rooms: {err}", err = names::NameError::BadRoom)]
    BadRoom(String),
    #[error("rooms names {count} rooms; at most {max} subscriptions per connection")]
    TooMany { count: usize, max: usize },
}

/// Why a cursor is refused.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum CursorError {
    #[error("cursor entry {0:?} is not ROOM:EPOCH:SEQ")]
    Shape(String),
    #[error("cursor entry {0:?} names an invalid room")]
    BadRoom(String),
    #[error("cursor entry {0:?} has an empty or invalid epoch")]
    BadEpoch(String),
    #[error("cursor entry {0:?} has a seq that is not a whole number")]
    BadSeq(String),
    #[error("cursor names room {0:?} twice")]
    Duplicate(String),
    #[error("cursor has {count} entries; at most {max}")]
    TooLong { count: usize, max: usize },
}

/// One room's position in a cursor: the client has everything up to `seq` of `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorEntry {
    pub room: String,
    pub epoch: String,
    pub seq: u64,
}

/// Longest epoch a cursor may carry (the store's are 16 hex digits).
pub const MAX_EPOCH_LEN: usize = 64;

/// A query flag such as `state=1`: `1`/`true` on, `0`/`false` or absent off.
pub fn parse_flag(text: Option<&str>) -> Result<bool, FlagError> {
    match text {
        None | Some("0") | Some("false") => Ok(false),
        Some("1") | Some("true") => Ok(true),
        Some(other) => Err(FlagError(other.to_string())),
    }
}

/// A flag that is neither on nor off.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not 1, 0, true or false")]
pub struct FlagError(pub String);

/// The rooms of a `rooms=R1,R2` parameter, in order, each once. Absent or empty: none.
/// More than `max` distinct rooms is refused (the connection's subscription limit).
pub fn parse_rooms(text: Option<&str>, max: usize) -> Result<Vec<String>, RoomsError> {
    let text = text.unwrap_or("");
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut rooms: Vec<String> = Vec::new();
    for room in text.split(',') {
        names::check_room(room).map_err(|_| RoomsError::BadRoom(room.to_string()))?;
        if !rooms.iter().any(|r| r == room) {
            rooms.push(room.to_string());
        }
        if rooms.len() > max {
            return Err(RoomsError::TooMany { count: text.split(',').count(), max });
        }
    }
    Ok(rooms)
}

fn is_epoch_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.')
}

/// Parse a cursor of at most `max_entries` entries. An empty cursor has none.
pub fn parse_cursor(text: &str, max_entries: usize) -> Result<Vec<CursorEntry>, CursorError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let count = text.split(',').count();
    if count > max_entries {
        return Err(CursorError::TooLong { count, max: max_entries });
    }
    let mut entries: Vec<CursorEntry> = Vec::with_capacity(count);
    for entry in text.split(',') {
        let mut parts = entry.rsplitn(3, ':');
        let (Some(seq), Some(epoch), Some(room)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(CursorError::Shape(entry.to_string()));
        };
        names::check_room(room).map_err(|_| CursorError::BadRoom(entry.to_string()))?;
        if epoch.is_empty() || epoch.len() > MAX_EPOCH_LEN || !epoch.bytes().all(is_epoch_char) {
            return Err(CursorError::BadEpoch(entry.to_string()));
        }
        if seq.is_empty() || !seq.bytes().all(|c| c.is_ascii_digit()) {
            return Err(CursorError::BadSeq(entry.to_string()));
        }
        let seq = seq.parse().map_err(|_| CursorError::BadSeq(entry.to_string()))?;
        if entries.iter().any(|e| e.room == room) {
            return Err(CursorError::Duplicate(room.to_string()));
        }
        entries.push(CursorEntry { room: room.to_string(), epoch: epoch.to_string(), seq });
    }
    Ok(entries)
}

/// Render a cursor from `(room, epoch, seq)` positions, in the order given.
pub fn render_cursor<'a>(positions: impl IntoIterator<Item = (&'a str, &'a str, u64)>) -> String {
    let mut out = String::new();
    for (room, epoch, seq) in positions {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(room);
        out.push(':');
        out.push_str(epoch);
        out.push(':');
        out.push_str(&seq.to_string());
    }
    out
}

/// The text of one message's data as it follows a first `data: `: every line break
/// (`\r\n`, `\r` or `\n`) becomes `\ndata: `, so an SSE reader joins the lines back with
/// `\n`. `None` when `data` has no line break (it is written as it is).
pub fn data_lines(data: &[u8]) -> Option<Vec<u8>> {
    if !data.iter().any(|&c| c == b'\n' || c == b'\r') {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() + 64);
    let mut i = 0;
    while i < data.len() {
        match data[i] {
            b'\r' => {
                out.extend_from_slice(b"\ndata: ");
                if data.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
            }
            b'\n' => out.extend_from_slice(b"\ndata: "),
            c => out.push(c),
        }
        i += 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rooms(list: &[&str]) -> Result<Vec<String>, RoomsError> {
        Ok(list.iter().map(|r| r.to_string()).collect())
    }

    #[test]
    fn flags() {
        for (text, want) in [
            (None, Ok(false)),
            (Some("0"), Ok(false)),
            (Some("false"), Ok(false)),
            (Some("1"), Ok(true)),
            (Some("true"), Ok(true)),
        ] {
            assert_eq!(parse_flag(text), want, "{text:?}");
        }
        for bad in ["", "yes", "2", "TRUE"] {
            assert_eq!(parse_flag(Some(bad)), Err(FlagError(bad.into())));
        }
    }

    #[test]
    fn rooms_lists() {
        let cases: &[(Option<&str>, Result<Vec<String>, RoomsError>)] = &[
            (None, rooms(&[])),
            (Some(""), rooms(&[])),
            (Some("match:1"), rooms(&["match:1"])),
            (Some("match:1,match:2"), rooms(&["match:1", "match:2"])),
            (Some("a,b,a"), rooms(&["a", "b"])),
            (Some("a,,b"), Err(RoomsError::BadRoom(String::new()))),
            (Some("a,"), Err(RoomsError::BadRoom(String::new()))),
            (Some("a b"), Err(RoomsError::BadRoom("a b".into()))),
            (Some("ok,bad/room"), Err(RoomsError::BadRoom("bad/room".into()))),
            (Some("a,b,c"), Err(RoomsError::TooMany { count: 3, max: 2 })),
            (Some("a,b,b,a"), rooms(&["a", "b"])),
        ];
        for (text, expected) in cases {
            assert_eq!(&parse_rooms(*text, 2), expected, "rooms {text:?}");
        }
        let long = "r".repeat(129);
        assert_eq!(parse_rooms(Some(&long), 2), Err(RoomsError::BadRoom(long.clone())));
    }

    fn entry(room: &str, epoch: &str, seq: u64) -> CursorEntry {
        CursorEntry { room: room.into(), epoch: epoch.into(), seq }
    }

    #[test]
    fn cursors() {
        let cases: Vec<(&str, Result<Vec<CursorEntry>, CursorError>)> = vec![
            ("", Ok(vec![])),
            ("match:1:E:43", Ok(vec![entry("match:1", "E", 43)])),
            ("r:ab12:0", Ok(vec![entry("r", "ab12", 0)])),
            (
                "match:1:E:43,user:u1:F:2",
                Ok(vec![entry("match:1", "E", 43), entry("user:u1", "F", 2)]),
            ),
            ("a:b:c:d:9", Ok(vec![entry("a:b:c", "d", 9)])),
            ("room:E", Err(CursorError::Shape("room:E".into()))),
            ("room", Err(CursorError::Shape("room".into()))),
            ("r:E:43,", Err(CursorError::Shape(String::new()))),
            (":E:1", Err(CursorError::BadRoom(":E:1".into()))),
            ("r r:E:1", Err(CursorError::BadRoom("r r:E:1".into()))),
            ("r::1", Err(CursorError::BadEpoch("r::1".into()))),
            ("r:E/x:1", Err(CursorError::BadEpoch("r:E/x:1".into()))),
            ("r:E:", Err(CursorError::BadSeq("r:E:".into()))),
            ("r:E:-1", Err(CursorError::BadSeq("r:E:-1".into()))),
            ("r:E:+1", Err(CursorError::BadSeq("r:E:+1".into()))),
            ("r:E:x", Err(CursorError::BadSeq("r:E:x".into()))),
            (
                "r:E:99999999999999999999999",
                Err(CursorError::BadSeq("r:E:99999999999999999999999".into())),
            ),
            ("r:E:1,r:F:2", Err(CursorError::Duplicate("r".into()))),
            ("a:E:1,b:E:1,c:E:1,d:E:1", Err(CursorError::TooLong { count: 4, max: 3 })),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_cursor(text, 3), expected, "cursor {text:?}");
        }
        let epoch = "e".repeat(MAX_EPOCH_LEN + 1);
        let text = format!("r:{epoch}:1");
        assert_eq!(parse_cursor(&text, 3), Err(CursorError::BadEpoch(text.clone())));
    }

    #[test]
    fn cursors_read_back() {
        let text = render_cursor([("match:1", "E", 43), ("user:u1", "F", 2)]);
        assert_eq!(text, "match:1:E:43,user:u1:F:2");
        assert_eq!(
            parse_cursor(&text, 8).unwrap(),
            vec![entry("match:1", "E", 43), entry("user:u1", "F", 2)]
        );
        assert_eq!(render_cursor([]), "");
    }

    #[test]
    fn data_line_breaks() {
        let cases: &[(&str, Option<&str>)] = &[
            ("{\"a\":1}", None),
            ("", None),
            ("{\"a\":\n1}", Some("{\"a\":\ndata: 1}")),
            ("a\r\nb", Some("a\ndata: b")),
            ("a\rb", Some("a\ndata: b")),
            ("a\n\nb", Some("a\ndata: \ndata: b")),
            ("a\r\r\nb\n", Some("a\ndata: \ndata: b\ndata: ")),
        ];
        for (data, expected) in cases {
            let got = data_lines(data.as_bytes()).map(|v| String::from_utf8(v).unwrap());
            assert_eq!(got.as_deref(), *expected, "data {data:?}");
        }
    }
}
