//! What a client puts in an HTTP request head before any credential is checked: the
//! `/v1/sse` query (`rooms`, the recovery cursor from `since` or `Last-Event-ID`, the
//! `state`/`presence` flags), the `session=` id of `/v1/ws` and `/v1/sse`, and the
//! `X-Forwarded-For` / `X-Real-IP` headers a trusted proxy passes (as bytes: a header
//! value need not be text). Every input gets an answer, never a panic, and the answers
//! keep their promises: accepted rooms are valid and distinct, an accepted cursor renders
//! back to itself, an accepted session id is short and plain, and the client address is
//! the peer or one the headers name.
//!
//! The input is lines (so the seeds read as text): rooms, cursor, flag, session id,
//! the TCP peer, the trusted blocks (space separated), `X-Real-IP` (an empty line: none),
//! then one `X-Forwarded-For` value per line.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use livegate::core::rules::names;
use livegate::core::rules::proxies::{client_ip, limit_key, Cidr};
use livegate::core::delivery::sse::{parse_cursor, parse_flag, parse_rooms, render_cursor};

/// Every address written somewhere in `values` (as `client_ip` reads them), IPv4-mapped
/// ones as IPv4.
fn named_in(values: &[&[u8]]) -> Vec<IpAddr> {
    values
        .iter()
        .flat_map(|v| v.split(|b| *b == b','))
        .filter_map(|hop| std::str::from_utf8(hop).ok()?.trim().parse::<IpAddr>().ok())
        .map(|ip| match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        })
        .collect()
}

fn text(line: Option<&[u8]>) -> String {
    String::from_utf8_lossy(line.unwrap_or_default()).into_owned()
}

fn sse_query(rooms: &str, cursor: &str, flag: &str) {
    for max in [0, 1, 3, 100] {
        if let Ok(rooms) = parse_rooms(Some(rooms), max) {
            assert!(rooms.len() <= max, "{} rooms over {max}", rooms.len());
            for (i, room) in rooms.iter().enumerate() {
                assert!(names::check_room(room).is_ok(), "accepted room {room:?}");
                assert!(!rooms[..i].contains(room), "room {room:?} twice");
            }
        }
        if let Ok(entries) = parse_cursor(cursor, max) {
            assert!(entries.len() <= max);
            let rendered = render_cursor(entries.iter().map(|e| (e.room.as_str(), e.epoch.as_str(), e.seq)));
            assert_eq!(parse_cursor(&rendered, max).as_ref(), Ok(&entries), "cursor {rendered:?} from {cursor:?}");
        }
    }
    let _ = parse_flag(Some(flag));
}

fn session_id(session: &str) {
    if names::check_session(session).is_ok() {
        assert!((1..=names::MAX_SESSION_LEN).contains(&session.len()), "session id of {} bytes", session.len());
        assert!(session.bytes().all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c)), "session id {session:?}");
    }
}

fn client_address(peer: IpAddr, trusted: &[Cidr], real_ip: Option<&[u8]>, forwarded_for: &[&[u8]]) {
    let client = client_ip(peer, forwarded_for, real_ip, trusted);
    let is_peer = limit_key(peer) == limit_key(client) && (client == peer || client.is_ipv4());
    let mut named = named_in(forwarded_for);
    if forwarded_for.is_empty() {
        named.extend(named_in(&real_ip.into_iter().collect::<Vec<_>>()));
    }
    assert!(is_peer || named.contains(&client), "client {client} is neither the peer {peer} nor named in the headers");
    if !trusted.iter().any(|block| block.contains(peer)) {
        assert!(is_peer, "an untrusted peer's headers named {client} instead of {peer}");
    }
    // The limits' key is a fixed point: an address and its key count as one.
    assert_eq!(limit_key(limit_key(client)), limit_key(client));
}

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|b| *b == b'\n');
    let (rooms, cursor, flag, session) = (text(lines.next()), text(lines.next()), text(lines.next()), text(lines.next()));
    sse_query(&rooms, &cursor, &flag);
    session_id(&session);
    let peer = text(lines.next()).trim().parse().unwrap_or(IpAddr::from([127, 0, 0, 1]));
    let trusted: Vec<Cidr> = text(lines.next()).split(' ').filter_map(|b| b.parse().ok()).collect();
    let real_ip = lines.next().filter(|v| !v.is_empty());
    let forwarded_for: Vec<&[u8]> = lines.collect();
    client_address(peer, &trusted, real_ip, &forwarded_for);
});
