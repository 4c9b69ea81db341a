//! Which address a request comes from when it passes trusted reverse proxies: the TCP
//! peer, unless that peer is a trusted proxy; then the right-most entry of
//! `X-Forwarded-For` that is not itself a trusted proxy (or `X-Real-IP` when there is no
//! `X-Forwarded-For` header at all). A header from a peer that is not trusted is never
//! read, so a client cannot pick its own address; header values are bytes, so one that is
//! not text is an entry that is not an address, never a missing header. And the key the
//! per-IP limits count an address under ([`limit_key`]: an IPv6 address by its /64).
//! Pure: addresses and header values in, an address out.

use std::net::IpAddr;
use std::str::FromStr;

/// An address block: `10.0.0.0/8`, `::1/128`, or a bare address (a block of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an address or an address block such as 10.0.0.0/8 or ::1/128")]
pub struct BadCidr(pub String);

impl FromStr for Cidr {
    type Err = BadCidr;

    fn from_str(text: &str) -> Result<Self, BadCidr> {
        let bad = || BadCidr(text.to_string());
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network = canonical(address.parse().map_err(|_| bad())?);
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= bits).ok_or_else(bad)?,
            None => bits,
        };
        Ok(Cidr { network, prefix })
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                same_prefix(u32::from(net).into(), u32::from(ip).into(), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                same_prefix(u128::from(net), u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

fn same_prefix(a: u128, b: u128, bits: u8, prefix: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let shift = u32::from(bits - prefix);
    (a >> shift) == (b >> shift)
}

/// IPv4 addresses seen through an IPv6 socket (`::ffff:a.b.c.d`) as plain IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The client's address. `forwarded_for` holds every `X-Forwarded-For` header value in
/// order, as bytes; `real_ip` the `X-Real-IP` value. An entry that is not an address (not
/// even text) ends the walk: the hop that appended it is the last one known. `X-Real-IP`
/// is read only when no `X-Forwarded-For` header came at all: a proxy that appends to
/// `X-Forwarded-For` may pass a client's own `X-Real-IP` through untouched.
pub fn client_ip(
    peer: IpAddr,
    forwarded_for: &[&[u8]],
    real_ip: Option<&[u8]>,
    trusted: &[Cidr],
) -> IpAddr {
    let peer = canonical(peer);
    let is_trusted = |ip: IpAddr| trusted.iter().any(|block| block.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    if forwarded_for.is_empty() {
        return real_ip.and_then(parse_address).map_or(peer, canonical);
    }
    let hops = forwarded_for
        .iter()
        .flat_map(|v| v.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|h| !h.is_empty());
    let mut last_known = peer;
    for hop in hops.rev() {
        match parse_address(hop) {
            Some(ip) if is_trusted(ip) => last_known = canonical(ip),
            Some(ip) => return canonical(ip),
            None => return last_known,
        }
    }
    // Every hop is a trusted proxy (or the header was empty): the left-most one is as far
    // as anyone can tell.
    last_known
}

/// An address written as text (surrounding spaces allowed); anything else is none.
fn parse_address(text: &[u8]) -> Option<IpAddr> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

/// The key the per-IP limits count `ip` under: an IPv4 address as it is, an IPv6 address
/// by its /64 (the block one subscriber gets, in which it picks addresses freely).
pub fn limit_key(ip: IpAddr) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_parse_and_contain() {
        let cases: &[(&str, &str, bool)] = &[
            ("10.0.0.0/8", "10.200.3.4", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("127.0.0.1", "127.0.0.1", true),
            ("127.0.0.1", "127.0.0.2", false),
            ("0.0.0.0/0", "203.0.113.9", true),
            ("192.168.1.0/24", "::ffff:192.168.1.77", true),
            ("::1/128", "::1", true),
            ("fd00::/8", "fd12::1", true),
            ("fd00::/8", "fe80::1", false),
            ("10.0.0.0/8", "::1", false),
        ];
        for (block, addr, want) in cases {
            let cidr: Cidr = block.parse().unwrap_or_else(|e| panic!("{block}: {e}"));
            assert_eq!(cidr.contains(ip(addr)), *want, "{block} contains {addr}");
        }
        for bad in ["", "10.0.0.0/33", "::/129", "10.0.0/8", "10.0.0.0/x", "nginx", "10.0.0.0/"] {
            assert_eq!(bad.parse::<Cidr>(), Err(BadCidr(bad.to_string())), "{bad:?}");
        }
    }

    #[test]
    fn client_address_behind_trusted_proxies() {
        let trusted: Vec<Cidr> =
            ["127.0.0.1", "10.0.0.0/8"].iter().map(|b| b.parse().unwrap()).collect();
        let cases: &[(&str, &[&[u8]], Option<&[u8]>, &str)] = &[
            // An untrusted peer's headers are ignored: it cannot pick its address.
            ("203.0.113.5", &[b"198.51.100.1"], Some(b"198.51.100.2".as_slice()), "203.0.113.5"),
            // Through one trusted proxy.
            ("127.0.0.1", &[b"198.51.100.1"], None, "198.51.100.1"),
            // The right-most untrusted hop; what the client wrote to the left is ignored.
            ("127.0.0.1", &[b"6.6.6.6, 198.51.100.1, 10.1.1.1"], None, "198.51.100.1"),
            // Several headers count as one list, in order.
            ("127.0.0.1", &[b"6.6.6.6", b"198.51.100.1"], None, "198.51.100.1"),
            // Every hop trusted: the left-most.
            ("127.0.0.1", &[b"10.0.0.7, 10.0.0.8"], None, "10.0.0.7"),
            // Garbage ends the walk at the hop that appended it.
            ("127.0.0.1", &[b"198.51.100.1, junk, 10.0.0.9"], None, "10.0.0.9"),
            ("127.0.0.1", &[b"junk"], None, "127.0.0.1"),
            // Bytes that are not text are garbage too, never a missing header: what the
            // proxy appended to the right of them still counts, and X-Real-IP (which a
            // proxy may pass through from the client) is not read (issue 29).
            (
                "127.0.0.1",
                &[b"\xff\xfe, 198.51.100.7"],
                Some(b"192.0.2.66".as_slice()),
                "198.51.100.7",
            ),
            ("127.0.0.1", &[b"\xc3\xa9t\xc3\xa9"], Some(b"192.0.2.66".as_slice()), "127.0.0.1"),
            ("127.0.0.1", &[b"198.51.100.8", b"\x80"], Some(b"192.0.2.66".as_slice()), "127.0.0.1"),
            (
                "127.0.0.1",
                &[b"\x80", b"198.51.100.8"],
                Some(b"192.0.2.66".as_slice()),
                "198.51.100.8",
            ),
            // A header that is there but empty is still there: X-Real-IP is not read.
            ("127.0.0.1", &[b""], Some(b"192.0.2.66".as_slice()), "127.0.0.1"),
            ("127.0.0.1", &[b" , "], Some(b"192.0.2.66".as_slice()), "127.0.0.1"),
            // No X-Forwarded-For: X-Real-IP, else the peer.
            ("127.0.0.1", &[], Some(b" 198.51.100.3 ".as_slice()), "198.51.100.3"),
            ("127.0.0.1", &[], Some(b"junk".as_slice()), "127.0.0.1"),
            ("127.0.0.1", &[], Some(b"\xff".as_slice()), "127.0.0.1"),
            ("127.0.0.1", &[b""], None, "127.0.0.1"),
            // IPv4 through an IPv6 socket.
            ("::ffff:127.0.0.1", &[b"::ffff:198.51.100.4"], None, "198.51.100.4"),
            ("2001:db8::1", &[b"198.51.100.1"], None, "2001:db8::1"),
        ];
        for (peer, xff, real, want) in cases {
            assert_eq!(
                client_ip(ip(peer), xff, *real, &trusted),
                ip(want),
                "peer {peer}, XFF {xff:?}, X-Real-IP {real:?}"
            );
        }
        assert_eq!(
            client_ip(ip("127.0.0.1"), &[b"198.51.100.1"], None, &[]),
            ip("127.0.0.1"),
            "nothing trusted by default"
        );
    }

    #[test]
    fn limits_key_ipv6_by_its_64() {
        let cases: &[(&str, &str)] = &[
            ("198.51.100.7", "198.51.100.7"),
            ("::ffff:198.51.100.7", "198.51.100.7"),
            ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::"),
            ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::"),
            ("2001:db8:1:3::1", "2001:db8:1:3::"),
            ("::1", "::"),
            ("fe80::1", "fe80::"),
        ];
        for (addr, want) in cases {
            assert_eq!(limit_key(ip(addr)), ip(want), "{addr}");
        }
        // Every address of one /64 is one key; the next /64 is another.
        assert_eq!(limit_key(ip("2001:db8::1")), limit_key(ip("2001:db8::ffff:1234")));
        assert_ne!(limit_key(ip("2001:db8::1")), limit_key(ip("2001:db8:0:1::1")));
    }
}
