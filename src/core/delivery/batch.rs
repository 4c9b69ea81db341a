//! A room's batching window, leading edge first: an event that finds the room's window
//! closed leaves at once and opens a window; what becomes durable while it is open waits
//! and leaves as one frame when it closes, which opens the next window if it sent
//! anything. So a calm room pays no wait, and a busy one still sends at most one frame
//! per window. Pure: the caller passes `now` and arms the timer this returns; one timer
//! at a time, and a timer that fires early (before the window's end) changes nothing.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchAction {
    /// Send what waits now; no window opens (a window of 0: every event at once).
    SendNow,
    /// Send what waits now, and arm a timer firing at this instant: the window that
    /// gathers what follows.
    SendAndArm(Instant),
    /// The window is open: the event waits for it to close.
    Wait,
}

/// What the window's timer firing means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Send what the window gathered, and arm the timer again for the next window.
    SendAndArm(Instant),
    /// The window gathered nothing: it is closed, and the next event leaves at once.
    Idle,
    /// Not this window's end (a timer of a window that was already closed, or fired
    /// early): nothing to do.
    Early,
}

#[derive(Debug, Clone)]
pub struct BatchWindow {
    window: Duration,
    /// The open window's end, when one is open.
    open_until: Option<Instant>,
}

impl BatchWindow {
    pub fn new(window: Duration) -> Self {
        BatchWindow { window, open_until: None }
    }

    /// An event is ready to send at `now`.
    pub fn on_event(&mut self, now: Instant) -> BatchAction {
        if self.window.is_zero() {
            return BatchAction::SendNow;
        }
        match self.open_until {
            Some(until) if now < until => BatchAction::Wait,
            // Closed, or past its end with the timer not run yet: what waits leaves now,
            // in order, and a new window opens (the late timer will find it early).
            _ => BatchAction::SendAndArm(self.open(now)),
        }
    }

    /// The timer fired at `now`; `gathered`: whether events wait for this window.
    pub fn on_timer(&mut self, now: Instant, gathered: bool) -> Closing {
        match self.open_until {
            Some(until) if now >= until => {
                if gathered {
                    Closing::SendAndArm(self.open(now))
                } else {
                    self.open_until = None;
                    Closing::Idle
                }
            }
            _ => Closing::Early,
        }
    }

    pub fn is_open(&self) -> bool {
        self.open_until.is_some()
    }

    fn open(&mut self, now: Instant) -> Instant {
        let until = now + self.window;
        self.open_until = Some(until);
        until
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WINDOW: Duration = Duration::from_millis(100);

    #[test]
    fn a_calm_room_sends_at_once_and_a_busy_one_once_per_window() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut batch = BatchWindow::new(WINDOW);
        // (at, an event (true) or the timer (false), what happens)
        let event = |b: &mut BatchWindow, at: u64| format!("{:?}", b.on_event(t0 + ms(at)));
        let timer = |b: &mut BatchWindow, at: u64, gathered| {
            format!("{:?}", b.on_timer(t0 + ms(at), gathered))
        };
        assert_eq!(event(&mut batch, 0), format!("{:?}", BatchAction::SendAndArm(t0 + ms(100))));
        assert_eq!(event(&mut batch, 10), "Wait");
        assert_eq!(event(&mut batch, 99), "Wait");
        assert_eq!(timer(&mut batch, 60, true), "Early", "a timer before the end changes nothing");
        assert_eq!(
            timer(&mut batch, 100, true),
            format!("{:?}", Closing::SendAndArm(t0 + ms(200)))
        );
        assert_eq!(event(&mut batch, 150), "Wait", "the next window gathers");
        assert_eq!(
            timer(&mut batch, 201, true),
            format!("{:?}", Closing::SendAndArm(t0 + ms(301)))
        );
        assert_eq!(timer(&mut batch, 301, false), "Idle");
        assert!(!batch.is_open());
        assert_eq!(event(&mut batch, 500), format!("{:?}", BatchAction::SendAndArm(t0 + ms(600))));
    }

    #[test]
    fn an_event_past_the_windows_end_before_its_timer_leaves_at_once() {
        let t0 = Instant::now();
        let mut batch = BatchWindow::new(WINDOW);
        assert_eq!(batch.on_event(t0), BatchAction::SendAndArm(t0 + WINDOW));
        let late = t0 + WINDOW + Duration::from_millis(5);
        assert_eq!(batch.on_event(late), BatchAction::SendAndArm(late + WINDOW));
        assert_eq!(batch.on_timer(t0 + WINDOW + Duration::from_millis(6), true), Closing::Early);
        assert_eq!(batch.on_timer(late + WINDOW, false), Closing::Idle);
    }

    #[test]
    fn zero_window_sends_every_event_at_once() {
        let mut batch = BatchWindow::new(Duration::ZERO);
        let now = Instant::now();
        assert_eq!(batch.on_event(now), BatchAction::SendNow);
        assert_eq!(batch.on_event(now), BatchAction::SendNow);
        assert!(!batch.is_open());
    }

    /// A room's window driven as the room drives it: events, and timers that fire at
    /// their instant or late.
    struct Room {
        batch: BatchWindow,
        timers: Vec<Instant>,
        waiting: Vec<Instant>,
        /// Each frame: when it left, and when its events became ready.
        sends: Vec<(Instant, Vec<Instant>)>,
        lateness: std::iter::Cycle<std::vec::IntoIter<u64>>,
    }

    impl Room {
        fn arm(&mut self, at: Instant) {
            self.timers.push(at + Duration::from_millis(self.lateness.next().unwrap_or(0)));
        }

        fn fire_until(&mut self, until: Instant) -> Result<(), TestCaseError> {
            while let Some(at) = self.timers.iter().copied().min().filter(|&at| at <= until) {
                self.timers.retain(|&t| t != at);
                match self.batch.on_timer(at, !self.waiting.is_empty()) {
                    Closing::SendAndArm(next) => {
                        self.sends.push((at, std::mem::take(&mut self.waiting)));
                        self.arm(next);
                    }
                    Closing::Idle => prop_assert!(self.waiting.is_empty()),
                    Closing::Early => {}
                }
            }
            Ok(())
        }

        fn event(&mut self, now: Instant) -> Result<(), TestCaseError> {
            self.fire_until(now)?;
            self.waiting.push(now);
            match self.batch.on_event(now) {
                BatchAction::SendAndArm(at) => {
                    self.sends.push((now, std::mem::take(&mut self.waiting)));
                    self.arm(at);
                }
                BatchAction::Wait => {}
                BatchAction::SendNow => prop_assert!(false, "a window of 100 ms sends at once"),
            }
            prop_assert!(self.timers.len() <= 2, "the open window's timer and at most a late one");
            Ok(())
        }
    }

    fn run(gaps_ms: &[u64], lateness_ms: Vec<u64>) -> Result<(), TestCaseError> {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let max_late = ms(lateness_ms.iter().copied().max().unwrap_or(0));
        let mut room = Room {
            batch: BatchWindow::new(WINDOW),
            timers: Vec::new(),
            waiting: Vec::new(),
            sends: Vec::new(),
            lateness: lateness_ms.into_iter().cycle(),
        };
        let mut now = t0;
        for gap in gaps_ms {
            now += ms(*gap);
            room.event(now)?;
        }
        room.fire_until(now + ms(10_000))?;
        prop_assert!(room.waiting.is_empty(), "every event was sent");
        prop_assert!(!room.batch.is_open() && room.timers.is_empty(), "the window ends closed");
        for pair in room.sends.windows(2) {
            prop_assert!(pair[1].0 >= pair[0].0 + WINDOW, "two frames within a window: {pair:?}");
        }
        for (sent_at, events) in &room.sends {
            for &ready in events {
                prop_assert!(
                    *sent_at <= ready + WINDOW + max_late,
                    "an event waited past its window"
                );
            }
        }
        let first_sent = room.sends.first().map(|(at, _)| *at);
        let first_ready = gaps_ms.first().map(|gap| t0 + ms(*gap));
        prop_assert_eq!(first_sent, first_ready, "a calm room's first event leaves at once");
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
        #[test]
        fn frames_are_a_window_apart_and_no_event_waits_longer(
            gaps in proptest::collection::vec(0u64..250, 1..60),
            lateness in proptest::collection::vec(0u64..20, 1..8),
        ) {
            run(&gaps, lateness)?;
        }
    }
}
