//! A room's batching window: durable events gathered in a room leave as one frame per
//! window. Pure: the caller passes `now` and arms the timer this returns.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchAction {
    /// Write the outbox now (window 0).
    SendNow,
    /// Arm a timer firing at this instant, then write.
    ArmTimer(Instant),
    /// A timer is already armed; it will carry this event too.
    Wait,
}

#[derive(Debug, Clone)]
pub struct BatchWindow {
    window: Duration,
    armed_until: Option<Instant>,
}

impl BatchWindow {
    pub fn new(window: Duration) -> Self {
        BatchWindow { window, armed_until: None }
    }

    /// An event entered the outbox at `now`.
    pub fn on_event(&mut self, now: Instant) -> BatchAction {
        if self.window.is_zero() {
            return BatchAction::SendNow;
        }
        match self.armed_until {
            Some(_) => BatchAction::Wait,
            None => {
                let at = now + self.window;
                self.armed_until = Some(at);
                BatchAction::ArmTimer(at)
            }
        }
    }

    /// The armed timer fired or the outbox was written for another reason (drain,
    /// replay): the next event opens a new window.
    pub fn on_sent(&mut self) {
        self.armed_until = None;
    }

    pub fn is_armed(&self) -> bool {
        self.armed_until.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_timer_per_window() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut batch = BatchWindow::new(ms(100));
        let steps: &[(u64, Option<BatchAction>)] = &[
            (0, Some(BatchAction::ArmTimer(t0 + ms(100)))),
            (10, Some(BatchAction::Wait)),
            (99, Some(BatchAction::Wait)),
            (100, None), // timer fired
            (130, Some(BatchAction::ArmTimer(t0 + ms(230)))),
        ];
        for (at, expected) in steps {
            match expected {
                Some(action) => assert_eq!(batch.on_event(t0 + ms(*at)), *action, "at {at} ms"),
                None => batch.on_sent(),
            }
        }
        assert!(batch.is_armed());
    }

    #[test]
    fn zero_window_sends_every_event_at_once() {
        let mut batch = BatchWindow::new(Duration::ZERO);
        let now = Instant::now();
        assert_eq!(batch.on_event(now), BatchAction::SendNow);
        assert_eq!(batch.on_event(now), BatchAction::SendNow);
        assert!(!batch.is_armed());
    }
}
