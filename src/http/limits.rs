//! What the upgrade handler checks before it spends a token: connections per node and per
//! client IP, and the handshake rate per IP, plus the reloadable access list (API keys and
//! allowed origins). Each admitted connection holds a [`ConnectionPermit`] that gives its
//! place back when the connection ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use subtle::{Choice, ConstantTimeEq};

use crate::config::{Config, ConfigError};
use crate::core::rules::limits::{burst_for, TokenBucket};
use crate::core::rules::proxies::{self, Cidr};

/// Per-IP entries kept before idle ones are swept out; after a sweep, the next one waits
/// until the table has doubled, so sweeps cost O(1) per handshake amortised even when
/// most entries hold connections.
const SWEEP_ABOVE: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitRefusal {
    #[error("this node holds its maximum of {0} connections; try another node or later")]
    Node(usize),
    #[error("at most {0} connections per client address")]
    PerIp(usize),
    #[error(
        "more than {rate} handshakes per second from this address; retry in {retry_after_ms} ms"
    )]
    HandshakeRate { rate: u64, retry_after_ms: u64 },
}

impl LimitRefusal {
    /// The name `livegate_limit_hits_total` counts it under.
    pub fn limit(self) -> &'static str {
        match self {
            LimitRefusal::Node(_) => "connections",
            LimitRefusal::PerIp(_) => "connections_per_ip",
            LimitRefusal::HandshakeRate { .. } => "handshake_rate",
        }
    }
}

#[derive(Debug)]
struct IpEntry {
    connections: usize,
    handshakes: TokenBucket,
}

#[derive(Debug)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, IpEntry>,
    /// The table size that starts the next sweep of idle entries.
    sweep_above: usize,
}

impl Default for Counts {
    fn default() -> Self {
        Counts { total: 0, per_ip: HashMap::new(), sweep_above: SWEEP_ABOVE }
    }
}

/// Connection and handshake limits, shared by every worker.
#[derive(Debug)]
pub struct ConnectionLimits {
    max_total: usize,
    max_per_ip: usize,
    handshakes_per_sec: u64,
    /// Reverse proxies whose `X-Forwarded-For` names the client (`trusted_proxies`).
    trusted_proxies: Vec<Cidr>,
    counts: Mutex<Counts>,
}

/// A connection's place in the limits; dropping it gives the place back.
#[derive(Debug)]
pub struct ConnectionPermit {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
}

impl ConnectionLimits {
    /// `max_total` is the node's connection limit (0: none), as [`connection_capacity`] bounds it.
    pub fn new(config: &Config, max_total: usize) -> Self {
        ConnectionLimits {
            max_total,
            max_per_ip: config.max_connections_per_ip,
            handshakes_per_sec: config.handshakes_per_ip_per_sec,
            // Checked by `Config::validate`; an entry that does not parse trusts nothing.
            trusted_proxies: config
                .trusted_proxies
                .iter()
                .filter_map(|block| block.parse().ok())
                .collect(),
            counts: Mutex::default(),
        }
    }

    /// The address the limits count a request under: the TCP peer, or the client a
    /// trusted proxy names in `X-Forwarded-For` / `X-Real-IP`.
    pub fn client_ip(&self, peer: IpAddr, headers: &actix_web::http::header::HeaderMap) -> IpAddr {
        if self.trusted_proxies.is_empty() {
            return peer;
        }
        // As bytes: a value that is not text is a bad entry, not a missing header.
        let forwarded: Vec<&[u8]> =
            headers.get_all("x-forwarded-for").map(|v| v.as_bytes()).collect();
        let real_ip = headers.get("x-real-ip").map(|v| v.as_bytes());
        proxies::client_ip(peer, &forwarded, real_ip, &self.trusted_proxies)
    }

    /// Count a handshake from `ip` against its rate, then take a place for its connection.
    /// An IPv6 address counts under its /64 ([`proxies::limit_key`]).
    pub fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        now_ms: u64,
    ) -> Result<ConnectionPermit, LimitRefusal> {
        let ip = proxies::limit_key(ip);
        let (rate, burst) = (self.handshakes_per_sec, burst_for(self.handshakes_per_sec));
        let mut counts = self.counts.lock();
        if counts.per_ip.len() > counts.sweep_above {
            counts
                .per_ip
                .retain(|_, e| e.connections > 0 || !e.handshakes.is_full(rate, burst, now_ms));
            counts.sweep_above = SWEEP_ABOVE.max(2 * counts.per_ip.len());
        }
        let total = counts.total;
        let entry = counts.per_ip.entry(ip).or_insert_with(|| IpEntry {
            connections: 0,
            handshakes: TokenBucket::new(burst, now_ms),
        });
        entry
            .handshakes
            .take(rate, burst, now_ms)
            .map_err(|retry_after_ms| LimitRefusal::HandshakeRate { rate, retry_after_ms })?;
        if self.max_per_ip > 0 && entry.connections >= self.max_per_ip {
            return Err(LimitRefusal::PerIp(self.max_per_ip));
        }
        if self.max_total > 0 && total >= self.max_total {
            return Err(LimitRefusal::Node(self.max_total));
        }
        entry.connections += 1;
        counts.total += 1;
        Ok(ConnectionPermit { limits: self.clone(), ip })
    }

    /// Connections holding a permit now.
    pub fn open(&self) -> usize {
        self.counts.lock().total
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let mut counts = self.limits.counts.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(entry) = counts.per_ip.get_mut(&self.ip) {
            entry.connections = entry.connections.saturating_sub(1);
        }
    }
}

/// Descriptors one WebSocket connection holds: its socket (the transport owns it, so no
/// duplicate is needed to shut a stuck one down).
const FDS_PER_CONNECTION: u64 = 1;
/// Descriptors left for the store, the listener, outgoing requests and peer probes.
const RESERVED_FDS: u64 = 256;

/// How many sockets the process's open-file limit leaves room for: the budget that
/// streams (WebSocket, SSE) and plain HTTP sockets share. Past it, accept fails and the
/// whole API (publishes included) stalls: better a clear refusal than a node that stops
/// answering.
pub fn connection_capacity(open_files: u64) -> usize {
    (open_files.saturating_sub(RESERVED_FDS) / FDS_PER_CONNECTION).max(1) as usize
}

/// The plain HTTP sockets' places in force: `max_http_connections` (at least 1), at most
/// half the budget.
pub fn effective_max_http_connections(configured: usize, open_files: u64) -> usize {
    configured.clamp(1, (connection_capacity(open_files) / 2).max(1))
}

/// The connection limit in force: the configured one (0: none), bounded by what the
/// plain HTTP sockets' `http_places` leave of the budget.
pub fn effective_max_connections(configured: usize, open_files: u64, http_places: usize) -> usize {
    let capacity = connection_capacity(open_files).saturating_sub(http_places).max(1);
    if configured == 0 {
        capacity
    } else {
        configured.min(capacity)
    }
}

/// Who may call the API and which browser pages may connect; replaced as a whole on reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessList {
    api_keys: Vec<String>,
    allowed_origins: Vec<String>,
}

impl AccessList {
    /// `primary` is the resolved API key (configured or generated); the config adds the
    /// previous keys and the origins.
    pub fn new(primary: String, config: &Config) -> Self {
        let mut api_keys = vec![primary];
        api_keys.extend(config.previous_api_keys.iter().cloned());
        AccessList { api_keys, allowed_origins: config.allowed_origins.clone() }
    }

    /// The access list of a reloaded configuration. The key file under `data_dir` is read
    /// again when no key is configured; without either, `current` primary key stays.
    pub fn reloaded(config: &Config, current: &AccessList) -> Result<Self, ConfigError> {
        let primary = config.existing_api_key()?.unwrap_or_else(|| current.api_keys[0].clone());
        Ok(AccessList::new(primary, config))
    }

    /// Whether `presented` is one of the keys, compared in constant time per key (every
    /// key is compared, so the time does not tell which one matched).
    pub fn accepts_key(&self, presented: &str) -> bool {
        let found = self
            .api_keys
            .iter()
            .fold(Choice::from(0), |found, key| found | presented.as_bytes().ct_eq(key.as_bytes()));
        found.into()
    }

    /// Whether a browser page from `origin` may connect; requests without `Origin` (not
    /// from a browser) always may.
    pub fn allows_origin(&self, origin: Option<&str>) -> bool {
        match origin {
            None => true,
            Some(origin) => self.allowed_origins.is_empty() || self.lists_origin(origin),
        }
    }

    /// Whether an entry of `allowed_origins` names `origin` (exactly or with any port):
    /// an empty list allows every origin but lists none. What `serve --dev` asks before
    /// minting a token without the API key.
    pub fn lists_origin(&self, origin: &str) -> bool {
        self.allowed_origins.iter().any(|entry| crate::core::rules::origins::matches(entry, origin))
    }

    pub fn key_count(&self) -> usize {
        self.api_keys.len()
    }

    pub fn origin_count(&self) -> usize {
        self.allowed_origins.len()
    }
}

/// The access list as handlers read it.
pub type SharedAccess = RwLock<AccessList>;

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_ip: usize, rate: u64) -> Arc<ConnectionLimits> {
        let config = Config {
            max_connections: total,
            max_connections_per_ip: per_ip,
            handshakes_per_ip_per_sec: rate,
            ..Config::default()
        };
        Arc::new(ConnectionLimits::new(&config, total))
    }

    #[test]
    fn permits_count_and_come_back() {
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let limits = limits(3, 2, 0);
        let first = limits.admit(a, 0).unwrap();
        let _second = limits.admit(a, 0).unwrap();
        assert_eq!(limits.admit(a, 0).unwrap_err(), LimitRefusal::PerIp(2));
        let _third = limits.admit(b, 0).unwrap();
        assert_eq!(limits.admit(b, 0).unwrap_err(), LimitRefusal::Node(3));
        drop(first);
        assert_eq!(limits.open(), 2);
        limits.admit(a, 0).unwrap();
        assert_eq!(limits.open(), 2, "a permit that is dropped at once gives its place back");
    }

    #[test]
    fn handshake_rate_per_ip() {
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let limits = limits(0, 0, 2);
        for _ in 0..4 {
            drop(limits.admit(a, 0).unwrap());
        }
        assert_eq!(
            limits.admit(a, 0).unwrap_err(),
            LimitRefusal::HandshakeRate { rate: 2, retry_after_ms: 500 }
        );
        drop(limits.admit(b, 0).expect("another address has its own budget"));
        drop(limits.admit(a, 500).expect("refilled"));
    }

    #[test]
    fn an_ipv6_64_is_one_address() {
        let limits = limits(0, 2, 0);
        let _one = limits.admit("2001:db8:0:1::1".parse().unwrap(), 0).unwrap();
        let _two = limits.admit("2001:db8:0:1::2".parse().unwrap(), 0).unwrap();
        let third = limits.admit("2001:db8:0:1:ffff::3".parse().unwrap(), 0);
        assert_eq!(third.unwrap_err(), LimitRefusal::PerIp(2), "a new address in the same /64");
        limits
            .admit("2001:db8:0:2::1".parse().unwrap(), 0)
            .expect("the next /64 is another address");
    }

    #[test]
    fn idle_addresses_are_swept_and_connected_ones_kept() {
        let limits = limits(0, 0, 10);
        let ip = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        // Addresses holding a connection are never swept: the table grows past the
        // threshold and the next sweep waits until it has doubled.
        let held: Vec<ConnectionPermit> =
            (0..SWEEP_ABOVE as u32 + 10).map(|i| limits.admit(ip(i), 0).unwrap()).collect();
        assert_eq!(limits.counts.lock().per_ip.len(), SWEEP_ABOVE + 10);
        assert_eq!(
            limits.counts.lock().sweep_above,
            2 * (SWEEP_ABOVE + 1),
            "swept once, at the first entry past the threshold"
        );
        drop(held);
        // Closed and with a full handshake bucket again (a second later), they are idle:
        // the sweep that comes once the table has doubled drops them all.
        let base = SWEEP_ABOVE as u32 + 10;
        for i in 0..(SWEEP_ABOVE as u32 + 10) {
            drop(limits.admit(ip(base + i), 1_000).unwrap());
        }
        let size = limits.counts.lock().per_ip.len();
        assert!(size <= SWEEP_ABOVE + 10, "idle entries swept: {size} left");
        assert_eq!(limits.open(), 0);
    }

    #[test]
    fn capacity_follows_the_open_file_limit() {
        assert_eq!(connection_capacity(1024), 768);
        assert_eq!(connection_capacity(20_000), 19_744);
        assert_eq!(connection_capacity(100), 1);
        assert_eq!(effective_max_http_connections(1024, 20_000), 1024);
        assert_eq!(effective_max_http_connections(0, 20_000), 1);
        assert_eq!(effective_max_http_connections(1024, 1024), 384, "at most half the budget");
        assert_eq!(effective_max_connections(15_000, 20_000, 1024), 15_000);
        assert_eq!(
            effective_max_connections(0, 20_000, 1024),
            18_720,
            "what the plain HTTP places leave"
        );
        assert_eq!(effective_max_connections(19_000, 20_000, 1024), 18_720);
        assert_eq!(effective_max_connections(500, 20_000, 1024), 500);
        assert_eq!(effective_max_connections(15_000, 1024, 384), 384);
    }

    #[test]
    fn access_list() {
        let config = Config {
            previous_api_keys: vec!["old-key-0123456789".into()],
            allowed_origins: vec!["https://app.example".into()],
            ..Config::default()
        };
        let access = AccessList::new("new-key-0123456789".into(), &config);
        assert!(access.accepts_key("new-key-0123456789"));
        assert!(access.accepts_key("old-key-0123456789"));
        assert!(!access.accepts_key("new-key-012345678"));
        assert!(!access.accepts_key(""));
        assert!(access.allows_origin(None));
        assert!(access.allows_origin(Some("https://APP.example")));
        assert!(!access.allows_origin(Some("https://evil.example")));
        assert!(access.lists_origin("https://app.example"));
        let any = AccessList::new("k".repeat(16), &Config::default());
        assert!(any.allows_origin(Some("https://any.example")));
        assert!(
            !any.lists_origin("https://any.example"),
            "an empty list allows any origin but lists none"
        );
        let dev = AccessList::new("k".repeat(16), &Config::dev_defaults());
        assert!(
            dev.allows_origin(Some("http://localhost:5173"))
                && dev.lists_origin("http://[::1]:8080")
        );
        assert!(!dev.allows_origin(Some("https://evil.example")));
    }
}
