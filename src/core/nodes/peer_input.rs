//! What a node accepts from its peers over NATS, checked as client input is: anything that
//! may publish on the cluster's subjects can send a heartbeat, a rebalance order or a
//! kick, so none of it is trusted for being "from a node". Each message's size is checked
//! before it is read ([`text`]), every field is parsed with a typed error
//! ([`PeerInputError`]), node names and URLs are checked (length, characters) and counts
//! are clamped ([`count`]: a node's connections at most [`MAX_NODE_CONNECTIONS`]), so a
//! claim costs the node no more work than an honest one. The cluster's decoders
//! (`cluster::heartbeat`, `cluster::bus`) are built from these; a message that does not
//! parse is dropped, counted and logged there. Pure.

use thiserror::Error;

use crate::core::rules::names;

/// The kinds of peer messages a node reads (`livegate_peer_messages_dropped_total{kind}`).
pub const MESSAGE_KINDS: &[&str] =
    &["heartbeat", "leave", "order", "replace", "kick", "kick_answer", "moved"];

/// Largest heartbeat body (name, cell, URL, draining, start time).
pub const MAX_HEARTBEAT_BYTES: usize = 1024;
/// Largest heartbeat header value (`Lg-Connections`).
pub const MAX_HEADER_BYTES: usize = 64;
/// Largest rebalance order.
pub const MAX_ORDER_BYTES: usize = 1024;
/// Largest user command (a kick, an exclusive-device replacement, a move) and kick answer.
pub const MAX_USER_COMMAND_BYTES: usize = 512;
/// Longest node name or cell (the configuration's rule for `node` and `cell`).
pub const MAX_NODE_NAME_LEN: usize = names::MAX_NODE_NAME_LEN;
/// Longest node URL a peer may announce.
pub const MAX_PEER_URL_LEN: usize = 256;
/// Most connections one node is believed to hold (a heartbeat's `Lg-Connections`, a kick
/// answer's count, a rebalance order's connections): larger claims are clamped to it.
/// Ten million is far above what one process serves (each connection is a descriptor).
pub const MAX_NODE_CONNECTIONS: u64 = 10_000_000;

/// How far ahead of this node's clock a peer's time may be (clock skew): a kick "made"
/// later than that would void credentials not yet issued.
pub const MAX_PEER_CLOCK_AHEAD_MS: u64 = 60_000;

/// Why a peer's message was not taken. `what` names the message and field.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum PeerInputError {
    #[error("{what}: {len} bytes, more than {max}")]
    TooLarge { what: &'static str, len: usize, max: usize },
    #[error("{0}: not UTF-8")]
    NotUtf8(&'static str),
    #[error("{what}: {got} fields or more, not {expected}")]
    Fields { what: &'static str, got: usize, expected: &'static str },
    #[error("{0}: not a node name (1 to {MAX_NODE_NAME_LEN} of A-Z a-z 0-9 _ . -)")]
    BadName(&'static str),
    #[error("{0}: not an http:// or https:// URL of at most {MAX_PEER_URL_LEN} visible ASCII characters")]
    BadUrl(&'static str),
    #[error("{0}: not a decimal number")]
    BadNumber(&'static str),
    #[error("{0}: not 0 or 1")]
    BadFlag(&'static str),
    #[error("{what}: {error}")]
    BadClientName { what: &'static str, error: names::NameError },
}

/// `body` as text, refused unread when larger than `max` bytes.
pub fn text<'a>(what: &'static str, body: &'a [u8], max: usize) -> Result<&'a str, PeerInputError> {
    if body.len() > max {
        return Err(PeerInputError::TooLarge { what, len: body.len(), max });
    }
    std::str::from_utf8(body).map_err(|_| PeerInputError::NotUtf8(what))
}

/// `text`'s newline-separated fields: at least `min`, at most `max` (the work is bounded
/// by `max`, whatever the text holds).
pub fn fields<'a>(
    what: &'static str,
    text: &'a str,
    min: usize,
    max: usize,
    expected: &'static str,
) -> Result<Vec<&'a str>, PeerInputError> {
    let fields: Vec<&str> = text.splitn(max + 1, '\n').collect();
    if fields.len() < min || fields.len() > max {
        return Err(PeerInputError::Fields { what, got: fields.len(), expected });
    }
    Ok(fields)
}

/// A node name or cell: `[A-Za-z0-9_.-]{1,64}`, as the configuration requires.
pub fn node_name<'a>(what: &'static str, name: &'a str) -> Result<&'a str, PeerInputError> {
    names::is_plain_name(name, MAX_NODE_NAME_LEN)
        .then_some(name)
        .ok_or(PeerInputError::BadName(what))
}

/// A node's URL: `http://` or `https://`, a host, visible ASCII only (no space, no
/// control character: it becomes a close reason and a `/v1/route` answer), at most
/// [`MAX_PEER_URL_LEN`] bytes.
pub fn url<'a>(what: &'static str, url: &'a str) -> Result<&'a str, PeerInputError> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    let ok = url.len() <= MAX_PEER_URL_LEN
        && rest.is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
        && url.bytes().all(|b| (0x21..=0x7e).contains(&b));
    ok.then_some(url).ok_or(PeerInputError::BadUrl(what))
}

/// A decimal u64 (1 to 20 digits, nothing else: no sign, no space).
pub fn number(what: &'static str, text: &str) -> Result<u64, PeerInputError> {
    let digits = (1..=20).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit());
    if !digits {
        return Err(PeerInputError::BadNumber(what));
    }
    text.parse().map_err(|_| PeerInputError::BadNumber(what))
}

/// A claimed count, clamped to `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    pub value: u64,
    /// The claim was larger than the cap.
    pub clamped: bool,
}

/// A decimal count of any size (digits only, at most 64 of them), clamped to `cap`: a
/// number too large for a u64 is as clamped as one just above the cap.
pub fn count(what: &'static str, text: &str, cap: u64) -> Result<Count, PeerInputError> {
    let digits = (1..=64).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit());
    if !digits {
        return Err(PeerInputError::BadNumber(what));
    }
    let claimed = text.parse::<u64>().unwrap_or(u64::MAX);
    Ok(Count { value: claimed.min(cap), clamped: claimed > cap })
}

/// A time a peer names (ms since the epoch), at most [`MAX_PEER_CLOCK_AHEAD_MS`] after
/// `now_ms`.
pub fn peer_time(at_ms: u64, now_ms: u64) -> u64 {
    at_ms.min(now_ms.saturating_add(MAX_PEER_CLOCK_AHEAD_MS))
}

/// `"0"` or `"1"`.
pub fn flag(what: &'static str, text: &str) -> Result<bool, PeerInputError> {
    match text {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(PeerInputError::BadFlag(what)),
    }
}

/// A user id a peer names (a kick, a replacement), by the clients' rule.
pub fn user<'a>(what: &'static str, user: &'a str) -> Result<&'a str, PeerInputError> {
    names::check_user(user)
        .map(|_| user)
        .map_err(|error| PeerInputError::BadClientName { what, error })
}

/// A device a peer names (empty: every device), by the clients' rule.
pub fn device<'a>(what: &'static str, device: &'a str) -> Result<&'a str, PeerInputError> {
    if device.is_empty() {
        return Ok(device);
    }
    names::check_device(device)
        .map(|_| device)
        .map_err(|error| PeerInputError::BadClientName { what, error })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_are_checked_before_reading() {
        assert_eq!(text("m", b"abc", 3), Ok("abc"));
        assert_eq!(
            text("m", b"abcd", 3),
            Err(PeerInputError::TooLarge { what: "m", len: 4, max: 3 })
        );
        assert_eq!(text("m", &[0xff], 3), Err(PeerInputError::NotUtf8("m")));
        // A huge invalid body is refused for its size, not scanned.
        assert!(matches!(
            text("m", &vec![0xff; 1 << 20], 1024),
            Err(PeerInputError::TooLarge { .. })
        ));
    }

    #[test]
    fn fields_are_counted_with_bounded_work() {
        assert_eq!(fields("m", "a\nb", 2, 3, "2 or 3"), Ok(vec!["a", "b"]));
        assert_eq!(fields("m", "a\nb\nc", 2, 3, "2 or 3"), Ok(vec!["a", "b", "c"]));
        assert_eq!(
            fields("m", "a", 2, 3, "2 or 3"),
            Err(PeerInputError::Fields { what: "m", got: 1, expected: "2 or 3" })
        );
        let many = "x\n".repeat(10_000);
        assert_eq!(
            fields("m", &many, 2, 3, "2 or 3"),
            Err(PeerInputError::Fields { what: "m", got: 4, expected: "2 or 3" })
        );
    }

    #[test]
    fn names_and_urls() {
        for good in ["a", "node-1.eu_west", "n".repeat(64).as_str()] {
            assert_eq!(node_name("n", good), Ok(good));
        }
        for bad in ["", "a b", "a/b", "é", "a\r", "n".repeat(65).as_str()] {
            assert_eq!(node_name("n", bad), Err(PeerInputError::BadName("n")), "{bad:?}");
        }
        for good in ["http://127.0.0.1:7070", "https://lb.example/node-a", "http://[::1]:1"] {
            assert_eq!(url("u", good), Ok(good));
        }
        let long = format!("http://{}", "h".repeat(MAX_PEER_URL_LEN));
        for bad in [
            "",
            "http://",
            "http:///x",
            "ftp://x",
            "javascript:alert(1)",
            "http://a b",
            "http://a\u{7f}",
            "http://é",
            "http://x\n",
            long.as_str(),
        ] {
            assert_eq!(url("u", bad), Err(PeerInputError::BadUrl("u")), "{bad:?}");
        }
    }

    #[test]
    fn numbers_and_counts() {
        assert_eq!(number("n", "0"), Ok(0));
        assert_eq!(number("n", "18446744073709551615"), Ok(u64::MAX));
        for bad in ["", "-1", "+1", " 1", "1.5", "0x10", "18446744073709551616", "1e9"] {
            assert_eq!(number("n", bad), Err(PeerInputError::BadNumber("n")), "{bad:?}");
        }
        let cases: &[(&str, u64, Count)] = &[
            ("0", 10, Count { value: 0, clamped: false }),
            ("10", 10, Count { value: 10, clamped: false }),
            ("11", 10, Count { value: 10, clamped: true }),
            (
                "1000000000000000",
                MAX_NODE_CONNECTIONS,
                Count { value: MAX_NODE_CONNECTIONS, clamped: true },
            ),
            (
                "18446744073709551615",
                MAX_NODE_CONNECTIONS,
                Count { value: MAX_NODE_CONNECTIONS, clamped: true },
            ),
            (
                "99999999999999999999999999999999",
                MAX_NODE_CONNECTIONS,
                Count { value: MAX_NODE_CONNECTIONS, clamped: true },
            ),
        ];
        for (text, cap, want) in cases {
            assert_eq!(count("c", text, *cap), Ok(*want), "{text}");
        }
        for bad in ["", "-5", "5 ", "five", "9".repeat(65).as_str()] {
            assert_eq!(count("c", bad, 10), Err(PeerInputError::BadNumber("c")), "{bad:?}");
        }
        assert_eq!(peer_time(5, 1_000), 5);
        assert_eq!(peer_time(u64::MAX, 1_000), 1_000 + MAX_PEER_CLOCK_AHEAD_MS);
        assert_eq!(peer_time(u64::MAX, u64::MAX - 1), u64::MAX);
        assert_eq!(flag("f", "1"), Ok(true));
        assert_eq!(flag("f", "0"), Ok(false));
        assert_eq!(flag("f", "true"), Err(PeerInputError::BadFlag("f")));
    }

    #[test]
    fn users_and_devices_follow_the_clients_rules() {
        assert_eq!(user("u", "alice@x.org"), Ok("alice@x.org"));
        assert!(user("u", "").is_err());
        assert!(user("u", "a\nb").is_err());
        assert_eq!(device("d", ""), Ok(""));
        assert_eq!(device("d", "phone"), Ok("phone"));
        assert!(device("d", "a:b").is_err());
    }

    proptest! {
        #[test]
        fn a_count_never_exceeds_its_cap(text in "[0-9]{1,64}", cap in 0u64..=u64::MAX) {
            let got = count("c", &text, cap).unwrap();
            prop_assert!(got.value <= cap);
            prop_assert_eq!(got.clamped, text.parse::<u64>().map_or(true, |n| n > cap));
        }

        #[test]
        fn nothing_panics_on_any_bytes(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(t) = text("m", &body, 256) {
                for f in fields("m", t, 1, 5, "1 to 5").unwrap_or_default() {
                    let _ = (node_name("n", f), url("u", f), number("n", f), count("c", f, 7), flag("f", f), user("u", f), device("d", f));
                }
            }
        }
    }
}
