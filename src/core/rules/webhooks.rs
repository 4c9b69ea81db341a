//! Webhooks' pure parts: the request signature, what an attempt's outcome means
//! (delivered, retry, rejected), the retry cap (`step`: after `webhook_max_attempts`, or a
//! refusal, a webhook becomes a dead letter), the queue's and the dead-letter list's bounds,
//! and the per-room lanes that decide which queued webhooks go out next. Nothing here does
//! I/O or reads the clock: `now_ms` and the random roll behind the retry jitter are
//! parameters.
//!
//! Order per room: a room's lane sends its oldest webhook, and its next one only once that
//! one was delivered or dead-lettered; lanes of different rooms go in parallel, at most
//! `max_in_flight` at once.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::core::rules::backoff::{BackoffPolicy, Jitter};

/// The header carrying `sha256=<lowercase hex of HMAC-SHA256(secret, raw body)>`.
pub const SIGNATURE_HEADER: &str = "X-Livegate-Signature";
/// The header carrying the webhook's id (the body's `id`; the same on every retry).
pub const ID_HEADER: &str = "X-Livegate-Id";
/// Webhooks in flight at once, over all rooms (one per room at most).
pub const MAX_IN_FLIGHT: usize = 8;
/// The default retry schedule (`webhook_retry_first_ms`, `webhook_retry_max_ms`): full
/// jitter up to 0.5 s · 2^retry, at most 60 s.
pub const RETRY: BackoffPolicy = BackoffPolicy {
    first: Duration::from_millis(500),
    max: Duration::from_secs(60),
    jitter: Jitter::Full,
};

/// The retry schedule of `first` doubling up to `max`, with full jitter.
pub fn retry_policy(first: Duration, max: Duration) -> BackoffPolicy {
    BackoffPolicy { first, max, jitter: Jitter::Full }
}

/// The longest a webhook waits between its first and its last attempt under `policy` with
/// `max_attempts` attempts: the sum of the retries' ceilings (each retry waits a random
/// part of its ceiling, so on average half of this). The attempts' own time (at most
/// `webhook_timeout_ms` each) comes on top.
pub fn retry_span(policy: &BackoffPolicy, max_attempts: u32) -> Duration {
    (0..max_attempts.saturating_sub(1))
        .map(|retry| policy.ceiling(retry))
        .fold(Duration::ZERO, Duration::saturating_add)
}

/// What a webhook tells: the body's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    RoomOccupied,
    RoomVacated,
    ClientPublished,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::RoomOccupied => "room_occupied",
            Kind::RoomVacated => "room_vacated",
            Kind::ClientPublished => "client_published",
        }
    }
}

/// The `X-Livegate-Signature` value of `body` under `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Whether `header` is the signature of `body` under `secret` (compared in constant time).
pub fn signature_valid(secret: &[u8], body: &[u8], header: &str) -> bool {
    let Some(given) = header.strip_prefix("sha256=").and_then(|hex| hex::decode(hex).ok()) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The receiver answered with this status.
    Status(u16),
    /// No answer within `webhook_timeout_ms`.
    Timeout,
    /// No connection (refused, reset, name not resolved).
    Unreachable,
}

/// What to do with a webhook after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: done, remove it.
    Delivered,
    /// The receiver may take it later: timeouts, no connection, 408, 429, 5xx (and the
    /// answers a receiver should not give, 1xx and 3xx: nothing said it was refused).
    Retry,
    /// Any other 4xx: the receiver refuses it for good; it becomes a dead letter at once.
    Rejected,
}

/// Why a webhook became a dead letter (`livegate_webhooks_dead_lettered_total{reason=…}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// `webhook_max_attempts` attempts, each to be retried.
    Attempts,
    /// The receiver refused it for good (a 4xx other than 408 and 429).
    Rejected,
}

impl DeadReason {
    pub const ALL: [DeadReason; 2] = [DeadReason::Attempts, DeadReason::Rejected];

    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Attempts => "attempts",
            DeadReason::Rejected => "rejected",
        }
    }
}

/// What happens to a webhook after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Delivered: off the queue; its room's next one goes.
    Delivered,
    /// Tried again after the retry delay; its room's next ones wait behind it.
    Retry,
    /// Off the queue into the dead-letter list; its room's next one goes.
    DeadLetter(DeadReason),
}

/// The step after an attempt that ended with `verdict`, the webhook's `attempts`-th (this
/// one counted), when at most `max_attempts` are made (0 is taken as 1).
pub fn step(verdict: Verdict, attempts: u32, max_attempts: u32) -> Step {
    match verdict {
        Verdict::Delivered => Step::Delivered,
        Verdict::Rejected => Step::DeadLetter(DeadReason::Rejected),
        Verdict::Retry if attempts >= max_attempts.max(1) => Step::DeadLetter(DeadReason::Attempts),
        Verdict::Retry => Step::Retry,
    }
}

/// What an attempt's failure is called in a dead letter's `last_error`: `HTTP 500`,
/// `timeout`, or `unreachable: ` and what the transport said (`detail`, without the URL).
pub fn describe(attempt: Attempt, detail: &str) -> String {
    match attempt {
        Attempt::Status(status) => format!("HTTP {status}"),
        Attempt::Timeout => "timeout".to_string(),
        Attempt::Unreachable if detail.is_empty() => "unreachable".to_string(),
        Attempt::Unreachable => format!("unreachable: {detail}"),
    }
}

/// How many of the oldest dead letters go to make room for one more, when the list holds
/// `count` of at most `max` (0 is taken as 1): the list never holds more than `max`.
pub fn dead_letters_to_drop(count: usize, max: usize) -> usize {
    (count + 1).saturating_sub(max.max(1))
}

pub fn verdict(attempt: Attempt) -> Verdict {
    match attempt {
        Attempt::Status(200..=299) => Verdict::Delivered,
        Attempt::Status(408 | 429) => Verdict::Retry,
        Attempt::Status(400..=499) => Verdict::Rejected,
        Attempt::Status(_) | Attempt::Timeout | Attempt::Unreachable => Verdict::Retry,
    }
}

/// Whether a new webhook fits a queue holding `queued` of at most `max` (else it is
/// dropped: the queue keeps the older ones, which are already promised).
pub fn admits(queued: usize, max: usize) -> bool {
    queued < max
}

/// One room's queued webhooks, oldest first, and the state of its oldest.
#[derive(Debug)]
struct Lane {
    queue: VecDeque<u64>,
    /// When the oldest may be sent (its retry delay's end).
    due_ms: u64,
    /// Failed attempts of the oldest so far.
    retries: u32,
    /// When the oldest's first attempt started.
    first_ms: u64,
    in_flight: bool,
}

/// The queued webhooks by room, each known by its queue sequence number (increasing in
/// queue order): which are due now, when the next one will be, and what an attempt's
/// verdict does to its room.
#[derive(Debug)]
pub struct Lanes {
    lanes: HashMap<String, Lane>,
    retry: BackoffPolicy,
    max_in_flight: usize,
    in_flight: usize,
    queued: usize,
}

/// A webhook to send now: its room and sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub room: String,
    pub seq: u64,
    /// Attempts made before this one.
    pub retries: u32,
    /// When its first attempt started (now, for a first attempt).
    pub first_ms: u64,
}

impl Lanes {
    /// Lanes retrying on `retry`'s schedule.
    pub fn new(max_in_flight: usize, retry: BackoffPolicy) -> Lanes {
        Lanes {
            lanes: HashMap::new(),
            retry,
            max_in_flight: max_in_flight.max(1),
            in_flight: 0,
            queued: 0,
        }
    }

    /// Queue webhook `seq` of `room` behind the room's others (`seq` is larger than every
    /// seq pushed before). The first of a room is due at once.
    pub fn push(&mut self, room: &str, seq: u64, now_ms: u64) {
        self.queued += 1;
        if let Some(lane) = self.lanes.get_mut(room) {
            lane.queue.push_back(seq);
            return;
        }
        let lane = Lane {
            queue: VecDeque::from([seq]),
            due_ms: now_ms,
            retries: 0,
            first_ms: now_ms,
            in_flight: false,
        };
        self.lanes.insert(room.to_string(), lane);
    }

    /// The webhooks to send now, marked in flight: the oldest of each room that has none
    /// in flight and whose retry delay is over, oldest first, as many as fit under
    /// `max_in_flight`.
    pub fn due(&mut self, now_ms: u64) -> Vec<Due> {
        let room_left = self.max_in_flight.saturating_sub(self.in_flight);
        if room_left == 0 {
            return Vec::new();
        }
        let mut ready: Vec<(u64, &String)> = self
            .lanes
            .iter()
            .filter(|(_, lane)| !lane.in_flight && lane.due_ms <= now_ms)
            .filter_map(|(room, lane)| Some((*lane.queue.front()?, room)))
            .collect();
        ready.sort_unstable();
        let picked: Vec<(u64, String)> =
            ready.into_iter().take(room_left).map(|(seq, room)| (seq, room.clone())).collect();
        picked
            .into_iter()
            .map(|(seq, room)| {
                let lane = self.lanes.get_mut(&room).expect("picked from the lanes");
                lane.in_flight = true;
                self.in_flight += 1;
                if lane.retries == 0 {
                    lane.first_ms = now_ms;
                }
                Due { retries: lane.retries, first_ms: lane.first_ms, room, seq }
            })
            .collect()
    }

    /// An attempt of `room`'s webhook `seq` ended in `step` at `now_ms`. Delivered or
    /// dead-lettered: the room's next webhook is due at once. Retry: the same webhook is
    /// due after the returned delay (full jitter from `roll`, a uniform random number).
    /// An answer for a webhook not in flight changes nothing.
    pub fn finished(
        &mut self,
        room: &str,
        seq: u64,
        step: Step,
        now_ms: u64,
        roll: u64,
    ) -> Option<Duration> {
        let lane = self
            .lanes
            .get_mut(room)
            .filter(|lane| lane.in_flight && lane.queue.front() == Some(&seq))?;
        lane.in_flight = false;
        self.in_flight -= 1;
        match step {
            Step::Retry => {
                let delay = self.retry.delay(lane.retries, roll);
                lane.retries = lane.retries.saturating_add(1);
                lane.due_ms =
                    now_ms.saturating_add(delay.as_millis().try_into().unwrap_or(u64::MAX));
                Some(delay)
            }
            Step::Delivered | Step::DeadLetter(_) => {
                lane.queue.pop_front();
                self.queued -= 1;
                lane.retries = 0;
                lane.due_ms = now_ms;
                if lane.queue.is_empty() {
                    self.lanes.remove(room);
                }
                None
            }
        }
    }

    /// When a webhook not yet in flight will be due (`None`: none waits, or no slot is free
    /// until an attempt ends).
    pub fn next_due(&self) -> Option<u64> {
        if self.in_flight >= self.max_in_flight {
            return None;
        }
        self.lanes.values().filter(|lane| !lane.in_flight).map(|lane| lane.due_ms).min()
    }

    /// Webhooks queued (in flight included).
    pub fn len(&self) -> usize {
        self.queued
    }

    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let known = "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        assert_eq!(signature(b"Jefe", b"what do ya want for nothing?"), known);
        let cases: [(&[u8], &[u8], &str, bool); 6] = [
            (b"Jefe", b"what do ya want for nothing?", known, true),
            (b"Jefe", b"what do ya want for nothing!", known, false),
            (b"jefe", b"what do ya want for nothing?", known, false),
            (b"Jefe", b"what do ya want for nothing?", &known[7..], false),
            (b"Jefe", b"what do ya want for nothing?", "sha256=zz", false),
            (b"Jefe", b"what do ya want for nothing?", "sha256=", false),
        ];
        for (secret, body, header, valid) in cases {
            assert_eq!(
                signature_valid(secret, body, header),
                valid,
                "{header} over {:?}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(signature_valid(b"s", b"{}", &signature(b"s", b"{}")));
        assert_eq!(signature(b"", b"").len(), "sha256=".len() + 64);
    }

    #[test]
    fn verdicts() {
        use Attempt::*;
        use Verdict::*;
        let cases = [
            (Status(200), Delivered),
            (Status(201), Delivered),
            (Status(204), Delivered),
            (Status(299), Delivered),
            (Status(408), Retry),
            (Status(429), Retry),
            (Status(500), Retry),
            (Status(502), Retry),
            (Status(503), Retry),
            (Status(599), Retry),
            (Status(400), Rejected),
            (Status(401), Rejected),
            (Status(403), Rejected),
            (Status(404), Rejected),
            (Status(410), Rejected),
            (Status(413), Rejected),
            (Status(499), Rejected),
            (Status(100), Retry),
            (Status(301), Retry),
            (Status(304), Retry),
            (Timeout, Retry),
            (Unreachable, Retry),
        ];
        for (attempt, want) in cases {
            assert_eq!(verdict(attempt), want, "{attempt:?}");
        }
    }

    #[test]
    fn the_queue_bound() {
        for (queued, max, fits) in [
            (0, 1, true),
            (0, 10_000, true),
            (9_999, 10_000, true),
            (10_000, 10_000, false),
            (10_001, 10_000, false),
            (0, 0, false),
        ] {
            assert_eq!(admits(queued, max), fits, "{queued} of {max}");
        }
    }

    fn due(lanes: &mut Lanes, now: u64) -> Vec<(String, u64)> {
        lanes.due(now).into_iter().map(|d| (d.room, d.seq)).collect()
    }

    fn pairs(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter().map(|(room, seq)| (room.to_string(), *seq)).collect()
    }

    #[test]
    fn a_room_sends_in_order_one_at_a_time() {
        let mut lanes = Lanes::new(8, RETRY);
        for (room, seq) in [("a", 1), ("b", 2), ("a", 3), ("a", 4), ("b", 5)] {
            lanes.push(room, seq, 0);
        }
        assert_eq!(lanes.len(), 5);
        assert_eq!(due(&mut lanes, 0), pairs(&[("a", 1), ("b", 2)]), "the oldest of each room");
        assert_eq!(due(&mut lanes, 0), vec![], "nothing more until an attempt ends");
        assert_eq!(lanes.next_due(), None, "both lanes are in flight");
        assert_eq!(lanes.finished("a", 1, Step::Delivered, 10, 0), None);
        assert_eq!(due(&mut lanes, 10), pairs(&[("a", 3)]), "a's next, at once");
        // A verdict for a webhook not in flight (a stale or doubled answer) is ignored.
        assert_eq!(lanes.finished("a", 4, Step::Delivered, 10, 0), None);
        assert_eq!(lanes.finished("c", 9, Step::Delivered, 10, 0), None);
        assert_eq!(lanes.in_flight(), 2);
        assert_eq!(lanes.finished("b", 2, Step::DeadLetter(DeadReason::Rejected), 11, 0), None);
        assert_eq!(lanes.finished("a", 3, Step::Delivered, 12, 0), None);
        assert_eq!(
            due(&mut lanes, 12),
            pairs(&[("a", 4), ("b", 5)]),
            "a rejected one lets the next go too"
        );
        lanes.finished("a", 4, Step::Delivered, 13, 0);
        lanes.finished("b", 5, Step::Delivered, 13, 0);
        assert!(lanes.is_empty());
        assert_eq!((lanes.lanes.len(), lanes.next_due()), (0, None), "empty lanes are forgotten");
    }

    #[test]
    fn a_retry_waits_its_jittered_delay_and_holds_back_its_room_only() {
        let mut lanes = Lanes::new(8, RETRY);
        lanes.push("a", 1, 0);
        lanes.push("a", 2, 0);
        lanes.push("b", 3, 0);
        assert_eq!(due(&mut lanes, 0), pairs(&[("a", 1), ("b", 3)]));
        // Roll u64::MAX: the ceiling itself, 500 ms, then 1 s, 2 s, ... up to 60 s.
        assert_eq!(
            lanes.finished("a", 1, Step::Retry, 100, u64::MAX),
            Some(Duration::from_millis(500))
        );
        assert_eq!(lanes.next_due(), Some(600));
        lanes.finished("b", 3, Step::Delivered, 100, 0);
        assert_eq!(due(&mut lanes, 599), vec![], "a's oldest waits; a's second never overtakes it");
        let again = lanes.due(600);
        assert_eq!(again, vec![Due { room: "a".into(), seq: 1, retries: 1, first_ms: 0 }]);
        let mut ceilings = vec![];
        let mut now = 600;
        for _ in 0..10 {
            let delay = lanes.finished("a", 1, Step::Retry, now, u64::MAX).unwrap();
            ceilings.push(delay.as_millis() as u64);
            now += delay.as_millis() as u64;
            assert_eq!(due(&mut lanes, now), pairs(&[("a", 1)]));
        }
        assert_eq!(ceilings, [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000, 60000]);
        // Full jitter: roll 0 retries at once, half a roll half the ceiling.
        assert_eq!(lanes.finished("a", 1, Step::Retry, now, 0), Some(Duration::ZERO));
        assert_eq!(due(&mut lanes, now), pairs(&[("a", 1)]));
        let half = lanes.finished("a", 1, Step::Retry, now, u64::MAX / 2).unwrap();
        assert!((29_999..=30_000).contains(&(half.as_millis() as u64)), "{half:?}");
        now += 30_000;
        assert_eq!(due(&mut lanes, now), pairs(&[("a", 1)]));
        lanes.finished("a", 1, Step::Delivered, now, 0);
        let next = lanes.due(now);
        assert_eq!(
            next,
            vec![Due { room: "a".into(), seq: 2, retries: 0, first_ms: now }],
            "the next one starts with no retries"
        );
    }

    #[test]
    fn at_most_max_in_flight_oldest_rooms_first() {
        let mut lanes = Lanes::new(3, RETRY);
        for (seq, room) in ["e", "d", "c", "b", "a"].into_iter().enumerate() {
            lanes.push(room, seq as u64 + 1, 0);
        }
        assert_eq!(due(&mut lanes, 0), pairs(&[("e", 1), ("d", 2), ("c", 3)]));
        assert_eq!(lanes.next_due(), None, "every slot is taken");
        lanes.finished("d", 2, Step::Retry, 0, u64::MAX);
        assert_eq!(lanes.next_due(), Some(0), "b and a wait for a slot only");
        assert_eq!(due(&mut lanes, 0), pairs(&[("b", 4)]));
        lanes.finished("e", 1, Step::Delivered, 1, 0);
        assert_eq!(due(&mut lanes, 1), pairs(&[("a", 5)]), "d still waits for its delay");
        assert_eq!(due(&mut lanes, 500), pairs(&[]), "slots full again");
        lanes.finished("c", 3, Step::Delivered, 500, 0);
        assert_eq!(due(&mut lanes, 500), pairs(&[("d", 2)]));
        assert_eq!((lanes.len(), lanes.in_flight()), (3, 3));
        // Zero is taken as one.
        let mut one = Lanes::new(0, RETRY);
        one.push("x", 1, 0);
        one.push("y", 2, 0);
        assert_eq!(due(&mut one, 0), pairs(&[("x", 1)]));
    }

    #[test]
    fn the_step_after_an_attempt_caps_retries() {
        use Verdict::{Delivered, Rejected, Retry};
        const ATTEMPTS: Step = Step::DeadLetter(DeadReason::Attempts);
        const REFUSED: Step = Step::DeadLetter(DeadReason::Rejected);
        // (verdict, attempts made with this one, max_attempts, step)
        let cases = [
            (Delivered, 1, 12, Step::Delivered),
            (Delivered, 12, 12, Step::Delivered),
            (Retry, 1, 12, Step::Retry),
            (Retry, 11, 12, Step::Retry),
            (Retry, 12, 12, ATTEMPTS),
            (Retry, 13, 12, ATTEMPTS),
            (Rejected, 1, 12, REFUSED),
            (Rejected, 12, 12, REFUSED),
            (Retry, 1, 1, ATTEMPTS),
            (Retry, 1, 0, ATTEMPTS),
        ];
        for (verdict, attempts, max, want) in cases {
            assert_eq!(
                step(verdict, attempts, max),
                want,
                "{verdict:?} attempt {attempts} of {max}"
            );
        }
        assert_eq!(DeadReason::ALL.map(DeadReason::as_str), ["attempts", "rejected"]);
    }

    #[test]
    fn the_default_schedule_spans_about_six_minutes() {
        // 12 attempts: 11 retries waiting at most 0.5, 1, 2, 4, 8, 16, 32, 60, 60, 60, 60 s.
        assert_eq!(retry_span(&RETRY, 12), Duration::from_millis(303_500));
        let cases = [(0, 0), (1, 0), (2, 500), (3, 1500), (8, 63_500), (9, 123_500)];
        for (attempts, span_ms) in cases {
            assert_eq!(
                retry_span(&RETRY, attempts),
                Duration::from_millis(span_ms),
                "{attempts} attempts"
            );
        }
        let short = retry_policy(Duration::from_millis(20), Duration::from_millis(50));
        assert_eq!(retry_span(&short, 4), Duration::from_millis(20 + 40 + 50));
        assert_eq!(
            retry_span(&retry_policy(Duration::MAX, Duration::MAX), 5),
            Duration::MAX,
            "saturates"
        );
    }

    #[test]
    fn last_errors_are_described_without_more_than_they_say() {
        let cases = [
            (Attempt::Status(500), "", "HTTP 500"),
            (Attempt::Status(404), "ignored", "HTTP 404"),
            (Attempt::Timeout, "", "timeout"),
            (Attempt::Unreachable, "", "unreachable"),
            (
                Attempt::Unreachable,
                "Connection Failed: Connect error: refused",
                "unreachable: Connection Failed: Connect error: refused",
            ),
        ];
        for (attempt, detail, want) in cases {
            assert_eq!(describe(attempt, detail), want);
        }
    }

    #[test]
    fn the_dead_letter_bound_drops_the_oldest() {
        // (held, max, to drop before one more is added)
        let cases = [
            (0, 1000, 0),
            (999, 1000, 0),
            (1000, 1000, 1),
            (1005, 1000, 6),
            (0, 1, 0),
            (1, 1, 1),
            (3, 0, 3),
            (0, 0, 0),
        ];
        for (count, max, drop) in cases {
            assert_eq!(dead_letters_to_drop(count, max), drop, "{count} of {max}");
        }
    }

    #[test]
    fn a_webhook_out_of_attempts_lets_its_room_go_on() {
        let policy = retry_policy(Duration::from_millis(10), Duration::from_millis(40));
        let mut lanes = Lanes::new(8, policy);
        lanes.push("a", 1, 0);
        lanes.push("a", 2, 0);
        let mut now = 5;
        let mut attempts = 0;
        loop {
            let due = lanes.due(now);
            assert_eq!(due.len(), 1, "one at a time in a room");
            assert_eq!(
                (due[0].seq, due[0].retries, due[0].first_ms),
                (1, attempts, 5),
                "the first attempt's time is kept"
            );
            attempts += 1;
            let step = step(Verdict::Retry, attempts, 3);
            match lanes.finished("a", 1, step, now, u64::MAX) {
                Some(delay) => now += delay.as_millis() as u64,
                None => break,
            }
        }
        assert_eq!((attempts, now), (3, 5 + 10 + 20), "three attempts: at 5, 15 and 35 ms");
        let next = lanes.due(now);
        assert_eq!(
            next,
            vec![Due { room: "a".into(), seq: 2, retries: 0, first_ms: now }],
            "the room's next one goes at once"
        );
    }

    proptest::proptest! {
        /// Whatever the receiver answers, a webhook gets at most `max_attempts` attempts and
        /// then is settled: delivered at its first 2xx, dead-lettered at its first refusal
        /// or its last retryable failure; never retried after.
        #[test]
        fn no_webhook_gets_more_than_max_attempts(max in 0u32..16, answers in proptest::collection::vec(0u8..3, 1..40), roll in proptest::prelude::any::<u64>()) {
            let mut lanes = Lanes::new(2, RETRY);
            lanes.push("r", 7, 0);
            let mut now = 0;
            let mut made = 0u32;
            let mut settled = None;
            for answer in answers.iter().copied().chain(std::iter::repeat(2)) {
                let due = lanes.due(now);
                if due.is_empty() {
                    proptest::prop_assert!(lanes.is_empty(), "nothing due, and it is not settled");
                    break;
                }
                proptest::prop_assert_eq!(due[0].retries, made);
                made += 1;
                let verdict = [Verdict::Delivered, Verdict::Rejected, Verdict::Retry][answer as usize];
                let step = step(verdict, made, max);
                if let Some(delay) = lanes.finished("r", 7, step, now, roll) {
                    now += delay.as_millis() as u64;
                } else {
                    settled = Some(step);
                }
            }
            proptest::prop_assert!(made <= max.max(1), "{} attempts of {}", made, max);
            let first_settling = answers.iter().position(|a| *a != 2).map(|at| at as u32 + 1);
            let want = match first_settling {
                Some(at) if at <= max.max(1) => if answers[at as usize - 1] == 0 { Step::Delivered } else { Step::DeadLetter(DeadReason::Rejected) },
                _ => Step::DeadLetter(DeadReason::Attempts),
            };
            proptest::prop_assert_eq!(settled, Some(want));
        }
    }

    #[test]
    fn kinds_are_named_as_the_body_types() {
        let names: Vec<&str> =
            [Kind::RoomOccupied, Kind::RoomVacated, Kind::ClientPublished].map(Kind::as_str).into();
        assert_eq!(names, ["room_occupied", "room_vacated", "client_published"]);
    }
}
