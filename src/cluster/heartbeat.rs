//! The wire of a heartbeat: its body (`name\ncell\nurl\ndraining\nstarted_at_ms`) and
//! headers, written by [`super::Cluster::heartbeat`] and read by [`super::bus`] as peer
//! input (`core::nodes::peer_input`: bounded, every field checked).

use crate::core::nodes::heartbeats::{NodeInfo, Usage, MAX_ROUTES_LISTED};
use crate::core::nodes::peer_input::{self, PeerInputError};

/// A heartbeat's header with the node's open connections (absent from earlier builds).
pub const CONNECTIONS_HEADER: &str = "Lg-Connections";
/// A heartbeat's header with the connections the node admits, its limit in force
/// (absent from earlier builds).
pub const CAPACITY_HEADER: &str = "Lg-Capacity";
/// A heartbeat's header with the node's use of its machine: `cpu_permille,resident_bytes,
/// deliveries_per_sec` (absent from earlier builds; see `core::nodes::heartbeats::Usage`).
pub const USAGE_HEADER: &str = "Lg-Usage";
/// A heartbeat's header with the sender's last probe of its cell's store: `1` passed,
/// `0` failed; absent: no report (an earlier build ignores it, as this one ignores its
/// absence).
pub const CELL_PROBE_HEADER: &str = "Lg-Cell-Probe";
/// A heartbeat's header with the release the sender belongs to (absent from earlier
/// builds): `core::nodes::routing::release_first`.
pub const RELEASE_HEADER: &str = "Lg-Release";
/// A heartbeat's header with the peers of the sender's cell it routes to, comma-separated
/// (`core::nodes::heartbeats::Heartbeats::routes_to`, at most `MAX_ROUTES_LISTED`; absent from
/// earlier builds): what a joining node waits for before it says it is ready.
pub const ROUTES_HEADER: &str = "Lg-Routes";
/// A heartbeat's header with the epoch of the rooms homed in the sender's cell (absent
/// from earlier builds): with cell domains, how a node knows another cell's epoch while
/// that cell cannot be asked, to serve its rooms from a mirror.
pub const EPOCH_HEADER: &str = "Lg-Epoch";
/// A heartbeat's header, with cell domains: the last sequence of the sender's cell's
/// rooms stream the sender knows (see [`super::promotion`]).
pub const ROOMS_HEAD_HEADER: &str = "Lg-Rooms-Head";
/// A heartbeat's header, with cell domains: the promotions the sender knows,
/// `<from>><to>:<epoch>` separated by `,` (see [`super::promotion`]).
pub const MOVES_HEADER: &str = "Lg-Moves";

/// Heartbeat body: `name\ncell\nurl\ndraining\nstarted_at_ms` (names and URLs hold no
/// newline; a body without the last line comes from a node of an earlier build).
pub fn encode_node(info: &NodeInfo) -> String {
    format!(
        "{}\n{}\n{}\n{}\n{}",
        info.name,
        info.cell,
        info.url,
        u8::from(info.draining),
        info.started_at_ms
    )
}

/// A heartbeat body, read as client input is (`core::nodes::peer_input`): at most
/// [`peer_input::MAX_HEARTBEAT_BYTES`], a node name and cell by the configuration's rule,
/// an http(s) URL, `0` or `1`, a number.
pub fn decode_node(body: &[u8]) -> Result<NodeInfo, PeerInputError> {
    let text = peer_input::text("heartbeat", body, peer_input::MAX_HEARTBEAT_BYTES)?;
    let fields = peer_input::fields("heartbeat", text, 4, 5, "4 or 5")?;
    let started_at_ms = match fields.get(4) {
        Some(text) => peer_input::number("heartbeat start time", text)?,
        None => 0,
    };
    Ok(NodeInfo::new(
        peer_input::node_name("heartbeat name", fields[0])?.into(),
        peer_input::node_name("heartbeat cell", fields[1])?.into(),
        peer_input::url("heartbeat url", fields[2])?.into(),
        peer_input::flag("heartbeat draining", fields[3])?,
        started_at_ms,
    ))
}

/// A heartbeat's [`RELEASE_HEADER`] (absent: an earlier build, empty): a name by the
/// configuration's rule for `release`.
pub fn decode_release(value: Option<&[u8]>) -> Result<String, PeerInputError> {
    let Some(value) = value else { return Ok(String::new()) };
    let text = peer_input::text("heartbeat release", value, peer_input::MAX_NODE_NAME_LEN)?;
    peer_input::node_name("heartbeat release", text).map(str::to_string)
}

/// A heartbeat's [`ROUTES_HEADER`] (absent: an earlier build): at most
/// [`MAX_ROUTES_LISTED`] node names, comma-separated (empty: none), read unsplit only
/// within the bytes that many names take.
pub fn decode_routes(value: Option<&[u8]>) -> Result<Option<Vec<String>>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let max = MAX_ROUTES_LISTED * (peer_input::MAX_NODE_NAME_LEN + 1);
    let text = peer_input::text("heartbeat routes", value, max)?;
    if text.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let names: Vec<&str> = text.splitn(MAX_ROUTES_LISTED + 1, ',').collect();
    if names.len() > MAX_ROUTES_LISTED {
        return Err(PeerInputError::Fields {
            what: "heartbeat routes",
            got: names.len(),
            expected: "at most 64 names",
        });
    }
    names
        .into_iter()
        .map(|name| peer_input::node_name("heartbeat routes", name).map(str::to_string))
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A heartbeat's [`CONNECTIONS_HEADER`] (absent from earlier builds), clamped to
/// [`peer_input::MAX_NODE_CONNECTIONS`].
pub fn decode_connections(
    value: Option<&[u8]>,
) -> Result<Option<peer_input::Count>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat connections", value, peer_input::MAX_HEADER_BYTES)?;
    peer_input::count("heartbeat connections", text, peer_input::MAX_NODE_CONNECTIONS).map(Some)
}

/// A heartbeat's [`CAPACITY_HEADER`] (absent from earlier builds), clamped as
/// connections are.
pub fn decode_capacity(value: Option<&[u8]>) -> Result<Option<peer_input::Count>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat capacity", value, peer_input::MAX_HEADER_BYTES)?;
    peer_input::count("heartbeat capacity", text, peer_input::MAX_NODE_CONNECTIONS).map(Some)
}

/// A heartbeat's [`USAGE_HEADER`] (absent from earlier builds): three counts, each
/// clamped (a claim past a bound is shown at the bound, never trusted past it).
pub fn decode_usage(value: Option<&[u8]>) -> Result<Option<Usage>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat usage", value, peer_input::MAX_HEADER_BYTES)?;
    let fields: Vec<&str> = text.splitn(4, ',').collect();
    if fields.len() != 3 {
        return Err(PeerInputError::Fields {
            what: "heartbeat usage",
            got: fields.len(),
            expected: "3",
        });
    }
    let count = |what, text, cap| peer_input::count(what, text, cap).map(|c| c.value);
    Ok(Some(Usage {
        cpu_permille: count("heartbeat cpu", fields[0], MAX_CPU_PERMILLE)?,
        resident_bytes: count("heartbeat memory", fields[1], MAX_RESIDENT_BYTES)?,
        deliveries_per_sec: count("heartbeat delivery rate", fields[2], MAX_DELIVERIES_PER_SEC)?,
    }))
}

/// Bounds of what a heartbeat's usage may claim: 4,096 cores, 16 TiB, 10^9 events a second.
const MAX_CPU_PERMILLE: u64 = 4_096_000;
const MAX_RESIDENT_BYTES: u64 = 16 << 40;
const MAX_DELIVERIES_PER_SEC: u64 = 1_000_000_000;

/// A heartbeat's [`EPOCH_HEADER`] (absent: an earlier build): 16 hex digits.
pub fn decode_epoch(value: Option<&[u8]>) -> Result<Option<String>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat epoch", value, peer_input::MAX_HEADER_BYTES)?;
    if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PeerInputError::BadNumber("heartbeat epoch"));
    }
    Ok(Some(text.to_string()))
}

/// A heartbeat's [`CELL_PROBE_HEADER`] (absent: no report), `0` or `1` of at most
/// [`peer_input::MAX_HEADER_BYTES`].
pub fn decode_probe(value: Option<&[u8]>) -> Result<Option<bool>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat cell probe", value, peer_input::MAX_HEADER_BYTES)?;
    peer_input::flag("heartbeat cell probe", text).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeats_release_and_routes_are_read_as_peer_input() {
        assert_eq!(decode_release(None), Ok(String::new()), "an earlier build says none");
        assert_eq!(decode_release(Some(b"5d4f8b9c7")), Ok("5d4f8b9c7".to_string()));
        assert_eq!(decode_release(Some(b"r 1")), Err(PeerInputError::BadName("heartbeat release")));
        assert!(matches!(
            decode_release(Some("x".repeat(65).as_bytes())),
            Err(PeerInputError::TooLarge { .. })
        ));
        assert_eq!(decode_routes(None), Ok(None), "an earlier build lists nothing: not waited for");
        assert_eq!(decode_routes(Some(b"")), Ok(Some(Vec::new())));
        assert_eq!(
            decode_routes(Some(b"a,b-1")),
            Ok(Some(vec!["a".to_string(), "b-1".to_string()]))
        );
        assert_eq!(decode_routes(Some(b"a,,b")), Err(PeerInputError::BadName("heartbeat routes")));
        let most: Vec<String> = (0..MAX_ROUTES_LISTED).map(|i| format!("{i:0>64}")).collect();
        assert_eq!(
            decode_routes(Some(most.join(",").as_bytes())),
            Ok(Some(most.clone())),
            "the bound's worst case is read"
        );
        let more: Vec<String> = (0..MAX_ROUTES_LISTED + 1).map(|i| format!("n{i}")).collect();
        assert!(matches!(
            decode_routes(Some(more.join(",").as_bytes())),
            Err(PeerInputError::Fields { .. })
        ));
        let long = format!("{},x", most.join(","));
        assert!(
            matches!(decode_routes(Some(long.as_bytes())), Err(PeerInputError::TooLarge { .. })),
            "refused unread past the bound"
        );
    }

    #[test]
    fn heartbeat_bodies_round_trip() {
        let info = NodeInfo::new(
            "a".into(),
            "eu".into(),
            "http://127.0.0.1:1".into(),
            true,
            1_700_000_000_123,
        );
        assert_eq!(decode_node(encode_node(&info).as_bytes()), Ok(info));
        let earlier_build =
            decode_node(b"a\neu\nhttp://x\n0").expect("a body without the start time");
        assert_eq!(earlier_build.started_at_ms, 0);
        let long_url = format!("a\neu\nhttp://{}\n0", "x".repeat(300));
        let huge = format!("a\neu\nhttp://x\n0\n{}", "1".repeat(2000));
        let cases: &[(&str, PeerInputError)] = &[
            ("", PeerInputError::Fields { what: "heartbeat", got: 1, expected: "4 or 5" }),
            ("a", PeerInputError::Fields { what: "heartbeat", got: 1, expected: "4 or 5" }),
            (
                "a\nb\nhttp://c",
                PeerInputError::Fields { what: "heartbeat", got: 3, expected: "4 or 5" },
            ),
            ("\nb\nhttp://c\n0", PeerInputError::BadName("heartbeat name")),
            (
                "a\nb\nhttp://c\n0\n5\nmore",
                PeerInputError::Fields { what: "heartbeat", got: 6, expected: "4 or 5" },
            ),
            ("a b\neu\nhttp://x\n0", PeerInputError::BadName("heartbeat name")),
            ("a\ne u\nhttp://x\n0", PeerInputError::BadName("heartbeat cell")),
            ("a\neu\nhttp://attacker.example/ x\n0", PeerInputError::BadUrl("heartbeat url")),
            ("a\neu\njavascript:x\n0", PeerInputError::BadUrl("heartbeat url")),
            (long_url.as_str(), PeerInputError::BadUrl("heartbeat url")),
            ("a\neu\nhttp://x\nyes", PeerInputError::BadFlag("heartbeat draining")),
            ("a\neu\nhttp://x\n0\n-1", PeerInputError::BadNumber("heartbeat start time")),
            (
                huge.as_str(),
                PeerInputError::TooLarge {
                    what: "heartbeat",
                    len: huge.len(),
                    max: peer_input::MAX_HEARTBEAT_BYTES,
                },
            ),
        ];
        for (junk, error) in cases {
            assert_eq!(decode_node(junk.as_bytes()).as_ref(), Err(error), "{junk:?}");
        }
    }

    #[test]
    fn a_heartbeat_reports_its_epoch_as_16_hex_digits_or_nothing() {
        assert_eq!(decode_epoch(None), Ok(None), "an earlier build says nothing");
        assert_eq!(
            decode_epoch(Some(b"0123456789abcDEF")),
            Ok(Some("0123456789abcDEF".to_string()))
        );
        let long = "a".repeat(100);
        for junk in [
            "",
            "0123456789abcde",
            "0123456789abcdef0",
            "0123456789abcdeg",
            " 123456789abcdef",
            long.as_str(),
        ] {
            assert!(decode_epoch(Some(junk.as_bytes())).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn a_heartbeat_reports_its_cell_probe_or_nothing() {
        assert_eq!(decode_probe(None), Ok(None), "an earlier build says nothing");
        assert_eq!(decode_probe(Some(b"1")), Ok(Some(true)));
        assert_eq!(decode_probe(Some(b"0")), Ok(Some(false)));
        let long = "1".repeat(100);
        for junk in ["", "yes", "2", " 1", long.as_str()] {
            assert!(decode_probe(Some(junk.as_bytes())).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn a_heartbeat_claims_at_most_the_cap() {
        use peer_input::{Count, MAX_NODE_CONNECTIONS};
        let read = |v: &str| decode_connections(Some(v.as_bytes()));
        assert_eq!(decode_connections(None), Ok(None), "an earlier build says nothing");
        assert_eq!(read("42"), Ok(Some(Count { value: 42, clamped: false })));
        for claim in ["1000000000000000", "18446744073709551615", "99999999999999999999999"] {
            assert_eq!(
                read(claim),
                Ok(Some(Count { value: MAX_NODE_CONNECTIONS, clamped: true })),
                "{claim}"
            );
        }
        for junk in ["", "-1", "1e15", "lots", "9".repeat(100).as_str()] {
            assert!(read(junk).is_err(), "{junk:?}");
        }
    }
}
