//! One probe of a peer's `/healthz` (peers mode): a blocking HTTP GET with a timeout, its
//! bounded answer read as peer input ([`Health`]).

use std::time::Duration;

/// What a peer's `/healthz` says (`None` when the probe failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Health {
    pub(super) draining: bool,
    /// Its release (empty from an earlier build, or one that does not parse).
    pub(super) release: String,
    /// When it started (0: not said).
    pub(super) started_at_ms: u64,
}

/// One probe of a peer's `/healthz`: `None` when it failed.
pub(super) fn probe(url: &str, timeout: Duration) -> Option<Health> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let response = agent.get(url).call().ok()?;
    // A peer's answer is read as peer input: a bounded body, a plain name.
    let mut body = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(response.into_reader(), HEALTH_BODY_MAX),
        &mut body,
    )
    .ok()?;
    Some(health_of(&body))
}

/// Largest `/healthz` body a probe reads.
const HEALTH_BODY_MAX: u64 = 4096;

fn health_of(body: &str) -> Health {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let release = value["release"]
        .as_str()
        .and_then(|r| crate::core::nodes::peer_input::node_name("healthz release", r).ok())
        .unwrap_or_default();
    Health {
        draining: value["draining"].as_bool().unwrap_or(false),
        release: release.to_string(),
        started_at_ms: value["started_at_ms"].as_u64().unwrap_or(0),
    }
}
