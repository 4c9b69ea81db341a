//! What the tests of the delivery machines share: an event that is only its seq, and is for
//! every device.

use super::subscriptions::Addressed;

/// A room's event as the connection and room machines' tests make them: its seq.
#[derive(Debug, Clone, PartialEq)]
pub struct Ev(pub u64);

impl Addressed for Ev {
    fn seq(&self) -> u64 {
        self.0
    }
    fn is_for(&self, _device: &str) -> bool {
        true
    }
}
