//! Where and how webhooks go ([`WebhookSettings`]), as the configuration says.

use std::time::Duration;

use crate::config::Config;
use crate::core::rules::backoff::BackoffPolicy;
use crate::core::rules::webhooks as rules;

/// Where and how webhooks go.
#[derive(Clone)]
pub struct WebhookSettings {
    pub url: String,
    pub secret: Vec<u8>,
    pub queue_max: usize,
    /// One attempt, at most.
    pub timeout: Duration,
    /// This node's name, in every body.
    pub node: String,
    /// Attempts in flight at once (rooms sent to in parallel).
    pub max_in_flight: usize,
    /// Attempts of one webhook before it is a dead letter.
    pub max_attempts: u32,
    /// The wait before each retry.
    pub retry: BackoffPolicy,
    /// Note in the store which rooms were told occupied, so a start after a crash can
    /// vacate them ([`Webhooks::vacate_left_over`](super::Webhooks::vacate_left_over)); one node only: in a cluster another
    /// node may still hold the room's subscribers.
    pub note_occupancy: bool,
}

impl WebhookSettings {
    /// The settings of `config`; `None` when `webhook_url` is empty (webhooks off).
    pub fn from_config(config: &Config) -> Option<WebhookSettings> {
        config.webhooks_enabled().then(|| WebhookSettings {
            url: config.webhook_url.clone(),
            secret: config.webhook_secret.as_bytes().to_vec(),
            queue_max: config.webhook_queue_max,
            timeout: config.webhook_timeout(),
            node: config.node.clone(),
            max_in_flight: rules::MAX_IN_FLIGHT,
            max_attempts: u32::try_from(config.webhook_max_attempts).unwrap_or(u32::MAX),
            retry: rules::retry_policy(config.webhook_retry_first(), config.webhook_retry_max()),
            note_occupancy: config.cluster_nats_url.is_none(),
        })
    }
}
