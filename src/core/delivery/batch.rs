//! A room's batching window, leading edge first, counted from the end of each fan-out:
//! an event that finds the room's window closed leaves at once; once that frame is
//! written to every subscriber (the driver says so), a window opens, and what becomes
//! durable meanwhile waits and leaves as one frame when it closes, which opens the next
//! window after its own fan-out if it sent anything. So a calm room pays no wait, a busy
//! one sends at most one frame per window plus its fan-out, and a fan-out that takes
//! long (a big room on a busy core) stretches the gap between frames instead of
//! sending frames back to back. Pure: the caller passes `now` and arms the timer this
//! returns; one timer at a time, and a timer that fires early (before the window's end)
//! changes nothing.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchAction {
    /// Send what waits now; no window opens (a window of 0: every event at once).
    SendNow,
    /// Send what waits now; the window opens when that send is written
    /// ([`BatchWindow::on_sent`]).
    Send,
    /// A frame is being written or the window is open: the event waits.
    Wait,
}

/// What the window's timer firing means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Send what the window gathered; the next window opens when that send is written.
    Send,
    /// The window gathered nothing: it is closed, and the next event leaves at once.
    Idle,
    /// Not this window's end (a timer of a window that was already closed, or fired
    /// early): nothing to do.
    Early,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No window: the next event leaves at once.
    Closed,
    /// A frame left and is being written to the subscribers; events wait.
    Sending,
    /// A window is open until this instant; events wait for it to close.
    Open(Instant),
}

#[derive(Debug, Clone)]
pub struct BatchWindow {
    window: Duration,
    state: State,
}

impl BatchWindow {
    pub fn new(window: Duration) -> Self {
        BatchWindow { window, state: State::Closed }
    }

    /// An event is ready to send at `now`.
    pub fn on_event(&mut self, now: Instant) -> BatchAction {
        if self.window.is_zero() {
            return BatchAction::SendNow;
        }
        match self.state {
            State::Sending => BatchAction::Wait,
            State::Open(until) if now < until => BatchAction::Wait,
            // Closed, or past its end with the timer not run yet: what waits leaves now,
            // in order (the late timer will find no open window: early).
            State::Closed | State::Open(_) => self.send(),
        }
    }

    /// The frame sent last is written to every subscriber at `now`: the window opens
    /// until the instant returned, for the caller to arm its timer. `None` when no send
    /// was waiting for this (a repeated report).
    pub fn on_sent(&mut self, now: Instant) -> Option<Instant> {
        (self.state == State::Sending).then(|| {
            let until = now + self.window;
            self.state = State::Open(until);
            until
        })
    }

    /// The timer fired at `now`; `gathered`: whether events wait for this window.
    pub fn on_timer(&mut self, now: Instant, gathered: bool) -> Closing {
        match self.state {
            State::Open(until) if now >= until => {
                if gathered {
                    self.send();
                    Closing::Send
                } else {
                    self.state = State::Closed;
                    Closing::Idle
                }
            }
            _ => Closing::Early,
        }
    }

    /// A window is open or a frame is being written: events wait.
    pub fn is_busy(&self) -> bool {
        self.state != State::Closed
    }

    fn send(&mut self) -> BatchAction {
        self.state = State::Sending;
        BatchAction::Send
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WINDOW: Duration = Duration::from_millis(100);

    #[test]
    fn a_calm_room_sends_at_once_and_a_busy_one_once_per_window_after_its_fan_out() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let at = |m| t0 + ms(m);
        let mut batch = BatchWindow::new(WINDOW);
        assert_eq!(batch.on_event(at(0)), BatchAction::Send, "a calm room's event leaves at once");
        assert_eq!(batch.on_event(at(10)), BatchAction::Wait, "its fan-out is being written");
        assert_eq!(batch.on_sent(at(40)), Some(at(140)), "the window opens when it is written");
        assert_eq!(batch.on_sent(at(41)), None, "a repeated report changes nothing");
        assert_eq!(batch.on_event(at(139)), BatchAction::Wait);
        assert_eq!(batch.on_timer(at(100), true), Closing::Early, "a timer before the end");
        assert_eq!(batch.on_timer(at(140), true), Closing::Send);
        assert_eq!(batch.on_event(at(150)), BatchAction::Wait, "the next fan-out is written");
        assert_eq!(batch.on_timer(at(160), true), Closing::Early, "no window is open");
        assert_eq!(batch.on_sent(at(200)), Some(at(300)));
        assert_eq!(batch.on_timer(at(301), true), Closing::Send);
        assert_eq!(batch.on_sent(at(301)), Some(at(401)));
        assert_eq!(batch.on_timer(at(401), false), Closing::Idle);
        assert!(!batch.is_busy());
        assert_eq!(batch.on_event(at(500)), BatchAction::Send);
    }

    #[test]
    fn an_event_past_the_windows_end_before_its_timer_leaves_at_once() {
        let t0 = Instant::now();
        let mut batch = BatchWindow::new(WINDOW);
        assert_eq!(batch.on_event(t0), BatchAction::Send);
        assert_eq!(batch.on_sent(t0), Some(t0 + WINDOW));
        let late = t0 + WINDOW + Duration::from_millis(5);
        assert_eq!(batch.on_event(late), BatchAction::Send);
        assert_eq!(batch.on_timer(late, true), Closing::Early, "the late timer finds it sending");
        assert_eq!(batch.on_sent(late), Some(late + WINDOW));
        assert_eq!(batch.on_timer(late + WINDOW, false), Closing::Idle);
    }

    #[test]
    fn zero_window_sends_every_event_at_once() {
        let mut batch = BatchWindow::new(Duration::ZERO);
        let now = Instant::now();
        assert_eq!(batch.on_event(now), BatchAction::SendNow);
        assert_eq!(batch.on_event(now), BatchAction::SendNow);
        assert!(!batch.is_busy());
    }

    /// What happens next in a room driven as the room actor drives it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Next {
        /// The frame being written is written (before a timer or an event at the same
        /// instant: the driver reports it as soon as its fan-out ends).
        Sent,
        Timer,
    }

    /// A room's window driven as the room drives it: events, fan-outs that take a while,
    /// and timers that fire at their instant or late.
    struct Room {
        batch: BatchWindow,
        timers: Vec<Instant>,
        /// When the frame being written will be written.
        writing_until: Option<Instant>,
        waiting: Vec<Instant>,
        /// Each frame: when it left, when it was written, and when its events became ready.
        sends: Vec<(Instant, Instant, Vec<Instant>)>,
        lateness: std::iter::Cycle<std::vec::IntoIter<u64>>,
        fan_outs: std::iter::Cycle<std::vec::IntoIter<u64>>,
    }

    impl Room {
        fn send(&mut self, now: Instant) {
            let written = now + Duration::from_millis(self.fan_outs.next().unwrap_or(0));
            self.sends.push((now, written, std::mem::take(&mut self.waiting)));
            self.writing_until = Some(written);
        }

        /// Carry out what is due up to `until`, in time order.
        fn run_until(&mut self, until: Instant) -> Result<(), TestCaseError> {
            loop {
                let timer = self.timers.iter().copied().min().map(|at| (at, Next::Timer));
                let sent = self.writing_until.map(|at| (at, Next::Sent));
                let Some((at, next)) = timer.into_iter().chain(sent).min() else { break };
                if at > until {
                    break;
                }
                match next {
                    Next::Sent => {
                        self.writing_until = None;
                        let open = self.batch.on_sent(at);
                        prop_assert!(open.is_some(), "a written frame opens the window");
                        let late = self.lateness.next().unwrap_or(0);
                        self.timers.extend(open.map(|t| t + Duration::from_millis(late)));
                    }
                    Next::Timer => {
                        self.timers.retain(|&t| t != at);
                        match self.batch.on_timer(at, !self.waiting.is_empty()) {
                            Closing::Send => self.send(at),
                            Closing::Idle => prop_assert!(self.waiting.is_empty()),
                            Closing::Early => {}
                        }
                    }
                }
            }
            Ok(())
        }

        fn event(&mut self, now: Instant) -> Result<(), TestCaseError> {
            self.run_until(now)?;
            self.waiting.push(now);
            match self.batch.on_event(now) {
                BatchAction::Send => {
                    prop_assert!(self.writing_until.is_none(), "one frame written at a time");
                    self.send(now);
                }
                BatchAction::Wait => {}
                BatchAction::SendNow => prop_assert!(false, "a window of 100 ms sends at once"),
            }
            prop_assert!(self.timers.len() <= 2, "the open window's timer and at most a late one");
            Ok(())
        }
    }

    fn run(
        gaps_ms: &[u64],
        lateness_ms: Vec<u64>,
        fan_outs_ms: Vec<u64>,
    ) -> Result<(), TestCaseError> {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let max_late = ms(lateness_ms.iter().copied().max().unwrap_or(0));
        let max_fan_out = ms(fan_outs_ms.iter().copied().max().unwrap_or(0));
        let mut room = Room {
            batch: BatchWindow::new(WINDOW),
            timers: Vec::new(),
            writing_until: None,
            waiting: Vec::new(),
            sends: Vec::new(),
            lateness: lateness_ms.into_iter().cycle(),
            fan_outs: fan_outs_ms.into_iter().cycle(),
        };
        let mut now = t0;
        for gap in gaps_ms {
            now += ms(*gap);
            room.event(now)?;
        }
        room.run_until(now + ms(10_000))?;
        prop_assert!(room.waiting.is_empty(), "every event was sent");
        prop_assert!(!room.batch.is_busy() && room.timers.is_empty(), "the window ends closed");
        for pair in room.sends.windows(2) {
            let (_, written, _) = pair[0];
            prop_assert!(
                pair[1].0 >= written + WINDOW,
                "a frame within a window of the last one's fan-out: {pair:?}"
            );
        }
        for (sent_at, _, events) in &room.sends {
            for &ready in events {
                prop_assert!(
                    *sent_at <= ready + max_fan_out + WINDOW + max_late,
                    "an event waited past a fan-out and its window"
                );
            }
        }
        let first_sent = room.sends.first().map(|(at, _, _)| *at);
        let first_ready = gaps_ms.first().map(|gap| t0 + ms(*gap));
        prop_assert_eq!(first_sent, first_ready, "a calm room's first event leaves at once");
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
        #[test]
        fn frames_are_a_window_after_the_last_fan_out_and_no_event_waits_longer(
            gaps in proptest::collection::vec(0u64..250, 1..60),
            lateness in proptest::collection::vec(0u64..20, 1..8),
            fan_outs in proptest::collection::vec(0u64..120, 1..8),
        ) {
            run(&gaps, lateness, fan_outs)?;
        }
    }
}
