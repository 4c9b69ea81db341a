//! Policies, and how names are read: limits and rate buckets, retry backoff and the webhook
//! schedule, room and node names, namespaces, origins, trusted proxies, redaction. The lowest
//! group of the core: `nodes` and `delivery` use it, it uses neither.

pub mod backoff;
pub mod limits;
pub mod names;
pub mod namespaces;
pub mod origins;
pub mod proxies;
pub mod redact;
pub mod webhooks;
