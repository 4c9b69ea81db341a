//! The room's seam for occupancy (DESIGN §10): a room tells it when its explicit
//! subscribers on this node go from none to some and back. What follows — a webhook
//! straight away on one node, a cluster-wide decision in cluster mode — is the
//! implementation's business; the room only reports its own edges, in order.

/// Told of a room's local occupancy edges. Called from the room's actor, so an
/// implementation must not block: queue, or hand the work to a task.
pub trait Occupancy: Send + Sync + 'static {
    /// `room`'s explicit subscribers on this node went from 0 to 1 (`occupied`) or from
    /// 1 to 0 (`!occupied`), at `now_ms`. Inboxes are never reported.
    fn changed(&self, room: &str, occupied: bool, now_ms: u64);
}
