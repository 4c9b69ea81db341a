//! The registry's memory of recent kicks, for the connection that spent its credential
//! before a kick was durable and registers after the kick looked for it. The handshake
//! checks the durable kick records (`voided_by_kick`, in `token.rs`); a kick writes its
//! record before it looks for connections, so a handshake that missed the record
//! checked before the kick reached the registry. Such a connection is either registered
//! when the kick looks (and closed), or registers later and is caught here, as long as
//! the kick is remembered. A kick is remembered for a fixed time; a registration whose
//! check is older than a forgotten kick cannot be told apart and is treated as kicked.

use std::collections::{HashMap, VecDeque};

use super::token::voided_by_kick;

/// What the registry decides for a connection registering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// No kick it could have missed voids its credential.
    Clear,
    /// A kick voids its credential: close it as kicked.
    Kicked,
    /// Its credential was checked before a kick that is already forgotten: it cannot be
    /// cleared, so it is closed as kicked too (a handshake slower than the memory).
    TooOld,
}

struct Remembered {
    device: Option<String>,
    at_ms: u64,
    remembered_at_ms: u64,
}

/// Kicks of the last `memory_ms`, by user.
pub struct RecentKicks {
    memory_ms: u64,
    by_user: HashMap<String, Vec<Remembered>>,
    /// Users in the order their kicks were remembered, with when.
    order: VecDeque<(u64, String)>,
    /// The latest moment a forgotten kick was remembered at.
    forgotten_through_ms: u64,
}

impl RecentKicks {
    pub fn new(memory_ms: u64) -> Self {
        RecentKicks {
            memory_ms,
            by_user: HashMap::new(),
            order: VecDeque::new(),
            forgotten_through_ms: 0,
        }
    }

    /// `user` (on `device` only, when given) was kicked at `at_ms`; remembered from `now_ms`.
    pub fn remember(&mut self, user: &str, device: Option<&str>, at_ms: u64, now_ms: u64) {
        self.forget(now_ms);
        let kick =
            Remembered { device: device.map(str::to_string), at_ms, remembered_at_ms: now_ms };
        self.by_user.entry(user.to_string()).or_default().push(kick);
        self.order.push_back((now_ms, user.to_string()));
    }

    /// Whether a connection of `user` on `device`, whose credential was issued at
    /// `issued_at_ms` and checked against the durable kicks at `checked_at_ms`, may stay.
    pub fn admit(
        &mut self,
        user: &str,
        device: &str,
        issued_at_ms: u64,
        checked_at_ms: u64,
        now_ms: u64,
    ) -> Admission {
        self.forget(now_ms);
        let kicked = self.by_user.get(user).into_iter().flatten().any(|kick| {
            kick.device.as_deref().is_none_or(|d| d == device)
                && voided_by_kick(issued_at_ms, Some(kick.at_ms))
        });
        if kicked {
            Admission::Kicked
        } else if checked_at_ms <= self.forgotten_through_ms {
            Admission::TooOld
        } else {
            Admission::Clear
        }
    }

    /// Kicks remembered now (for tests and the bounds table).
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Forget the kicks remembered more than `memory_ms` before `now_ms`.
    fn forget(&mut self, now_ms: u64) {
        let horizon = now_ms.saturating_sub(self.memory_ms);
        while let Some((remembered_at_ms, _)) = self.order.front() {
            if *remembered_at_ms >= horizon {
                break;
            }
            let (remembered_at_ms, user) = self.order.pop_front().expect("front exists");
            self.forgotten_through_ms = self.forgotten_through_ms.max(remembered_at_ms);
            if let Some(kicks) = self.by_user.get_mut(&user) {
                kicks.retain(|k| k.remembered_at_ms >= horizon);
                if kicks.is_empty() {
                    self.by_user.remove(&user);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_is_judged_by_the_kicks_it_could_have_missed() {
        let mut kicks = RecentKicks::new(1_000);
        kicks.remember("u", None, 100, 110);
        kicks.remember("v", Some("phone"), 200, 210);
        // (user, device, issued at, checked at, now, decision)
        let cases = [
            ("u", "web", 50, 105, 120, Admission::Kicked),
            ("u", "web", 100, 105, 120, Admission::Kicked),
            ("u", "web", 101, 105, 120, Admission::Clear),
            ("w", "web", 50, 105, 120, Admission::Clear),
            ("v", "phone", 150, 205, 220, Admission::Kicked),
            ("v", "web", 150, 205, 220, Admission::Clear),
        ];
        for (user, device, issued, checked, now, expected) in cases {
            assert_eq!(
                kicks.admit(user, device, issued, checked, now),
                expected,
                "{user} {device} {issued} {checked}"
            );
        }
    }

    #[test]
    fn kicks_are_forgotten_after_the_memory_and_older_checks_are_not_cleared() {
        let mut kicks = RecentKicks::new(1_000);
        kicks.remember("u", None, 100, 110);
        kicks.remember("v", None, 600, 610);
        assert_eq!(kicks.len(), 2);
        // At 1_200 the first kick is forgotten; a check made before it was remembered
        // cannot be cleared, one made after can.
        assert_eq!(kicks.admit("u", "web", 50, 105, 1_200), Admission::TooOld);
        assert_eq!(kicks.admit("u", "web", 50, 111, 1_200), Admission::Clear);
        assert_eq!(kicks.admit("v", "web", 50, 111, 1_200), Admission::Kicked);
        assert_eq!(kicks.len(), 1);
        assert_eq!(kicks.admit("v", "web", 50, 1_700, 1_700), Admission::Clear);
        assert!(kicks.is_empty());
    }
}
