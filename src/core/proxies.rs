//! Which address a request comes from when it passes trusted reverse proxies: the TCP
//! peer, unless that peer is a trusted proxy; then the right-most entry of
//! `X-Forwarded-For` that is not itself a trusted proxy (or `X-Real-IP` when there is no
//! `X-Forwarded-For`). A header from a peer that is not trusted is never read, so a client
//! cannot pick its own address. Pure: addresses and header values in, an address out.

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
            (IpAddr::V4(net), IpAddr::V4(ip)) => same_prefix(u32::from(net).into(), u32::from(ip).into(), 32, self.prefix),
            (IpAddr::V6(net), IpAddr::V6(ip)) => same_prefix(u128::from(net), u128::from(ip), 128, self.prefix),
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
/// order; `real_ip` the `X-Real-IP` value. An entry that is not an address ends the
/// walk: the hop that appended it is the last one known.
pub fn client_ip(peer: IpAddr, forwarded_for: &[&str], real_ip: Option<&str>, trusted: &[Cidr]) -> IpAddr {
    let peer = canonical(peer);
    let is_trusted = |ip: IpAddr| trusted.iter().any(|block| block.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let hops: Vec<&str> = forwarded_for.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|h| !h.is_empty()).collect();
    if hops.is_empty() {
        return real_ip.and_then(|v| v.trim().parse().ok()).map_or(peer, canonical);
    }
    let mut last_known = peer;
    for hop in hops.iter().rev() {
        match hop.parse::<IpAddr>() {
            Ok(ip) if is_trusted(ip) => last_known = canonical(ip),
            Ok(ip) => return canonical(ip),
            Err(_) => return last_known,
        }
    }
    // Every hop is a trusted proxy: the left-most one is as far as anyone can tell.
    last_known
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
        let trusted: Vec<Cidr> = ["127.0.0.1", "10.0.0.0/8"].iter().map(|b| b.parse().unwrap()).collect();
        let cases: &[(&str, &[&str], Option<&str>, &str)] = &[
            // An untrusted peer's headers are ignored: it cannot pick its address.
            ("203.0.113.5", &["198.51.100.1"], Some("198.51.100.2"), "203.0.113.5"),
            // Through one trusted proxy.
            ("127.0.0.1", &["198.51.100.1"], None, "198.51.100.1"),
            // The right-most untrusted hop; what the client wrote to the left is ignored.
            ("127.0.0.1", &["6.6.6.6, 198.51.100.1, 10.1.1.1"], None, "198.51.100.1"),
            // Several headers count as one list, in order.
            ("127.0.0.1", &["6.6.6.6", "198.51.100.1"], None, "198.51.100.1"),
            // Every hop trusted: the left-most.
            ("127.0.0.1", &["10.0.0.7, 10.0.0.8"], None, "10.0.0.7"),
            // Garbage ends the walk at the hop that appended it.
            ("127.0.0.1", &["198.51.100.1, junk, 10.0.0.9"], None, "10.0.0.9"),
            ("127.0.0.1", &["junk"], None, "127.0.0.1"),
            // No X-Forwarded-For: X-Real-IP, else the peer.
            ("127.0.0.1", &[], Some(" 198.51.100.3 "), "198.51.100.3"),
            ("127.0.0.1", &[], Some("junk"), "127.0.0.1"),
            ("127.0.0.1", &[""], None, "127.0.0.1"),
            // IPv4 through an IPv6 socket.
            ("::ffff:127.0.0.1", &["::ffff:198.51.100.4"], None, "198.51.100.4"),
            ("2001:db8::1", &["198.51.100.1"], None, "2001:db8::1"),
        ];
        for (peer, xff, real, want) in cases {
            assert_eq!(client_ip(ip(peer), xff, *real, &trusted), ip(want), "peer {peer}, XFF {xff:?}, X-Real-IP {real:?}");
        }
        assert_eq!(client_ip(ip("127.0.0.1"), &["198.51.100.1"], None, &[]), ip("127.0.0.1"), "nothing trusted by default");
    }
}
