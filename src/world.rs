//! The actors' one window on the world: the wall clock and the OS random source. The
//! pure core never calls this; actors, handlers and the terminal client read it and pass
//! the values in.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `N` random bytes from the OS.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes).expect("the OS provides randomness");
    bytes
}

/// `bytes` random bytes as lowercase hex (ids, epochs, sessions).
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::getrandom(&mut buf).expect("the OS provides randomness");
    hex::encode(buf)
}

pub fn random_u64() -> u64 {
    u64::from_le_bytes(random_bytes())
}
