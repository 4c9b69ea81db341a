//! How a subscribe is answered from the room's [`SeqLog`]: a whole replay after the
//! subscriber's `since`, or `recovered:false`; and whether the subscriber is ahead of the log.

use crate::core::delivery::seqlog::{NotRecovered, Recovery, SeqLog};

/// What a subscriber asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// The last seq the client saw (`None`: live from now on).
    pub since: Option<u64>,
    /// The epoch that seq belongs to (`None`: the room's current one).
    pub epoch: Option<&'a str>,
    /// The room's state and the events after it.
    pub state: bool,
}

/// How a subscribe is answered.
#[derive(Debug, PartialEq)]
pub struct SubscribeAnswer<T> {
    /// The durable head: the subscriber's windows start after it.
    pub head: u64,
    /// `Some` when the ask named a `since`: whether the replay is every event after it.
    pub recovered: Option<bool>,
    /// Why a recovery was refused, for the log.
    pub refused: Option<NotRecovered>,
    /// Events to send before any window, ascending, up to `head`.
    pub replay: Vec<T>,
    /// The answer carries the room's state (with the events after its seq in `replay`).
    pub with_state: bool,
}

/// Answer a subscribe from `log`: a replay after `since` when the log can give all of it
/// (at most `max_events`), else `recovered:false`; with `state` asked, the state (at seq
/// `state_seq`, 0 for none) and the retained events after it, when there is no recovery.
pub fn answer_subscribe<T: Clone>(
    log: &SeqLog<T>,
    ask: Ask<'_>,
    state_seq: u64,
    max_events: u64,
) -> SubscribeAnswer<T> {
    let head = log.durable();
    let snapshot =
        || log.read(state_seq, usize::MAX).0.into_iter().map(|e| e.payload.clone()).collect();
    let answer = |recovered, refused, replay, with_state| SubscribeAnswer {
        head,
        recovered,
        refused,
        replay,
        with_state,
    };
    match ask.since {
        None if ask.state => answer(None, None, snapshot(), true),
        None => answer(None, None, Vec::new(), false),
        Some(since) => match log.recover(since, ask.epoch, max_events) {
            Recovery::Replay(events) => answer(
                Some(true),
                None,
                events.into_iter().map(|e| e.payload.clone()).collect(),
                false,
            ),
            Recovery::NotRecovered(why) if ask.state => {
                answer(Some(false), Some(why), snapshot(), true)
            }
            Recovery::NotRecovered(why) => answer(Some(false), Some(why), Vec::new(), false),
        },
    }
}

/// Whether the subscriber saw events in the room's epoch that `log` has not taken yet.
/// A log other nodes append to (cluster mode) can be behind its own clients (a live copy
/// still in flight, a client moved from another node): such a room holds the subscribe
/// until its head reaches `since` (`core::delivery::holds`, at most `AHEAD_WAIT`), so the answer
/// neither refuses the recovery nor sends the client those events again. A log only this node writes is never behind an
/// acknowledged event: there the ask is a client's error, answered `recovered:false`.
pub fn seen_beyond_head<T>(log: &SeqLog<T>, ask: Ask<'_>) -> bool {
    ask.since.is_some_and(|since| since > log.durable())
        && ask.epoch.is_none_or(|epoch| epoch == log.epoch())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::rules::limits::Retention;

    fn log(events: u64, keep: usize) -> SeqLog<u64> {
        let mut log = SeqLog::restore(
            "e".into(),
            0,
            Vec::new(),
            Retention { max_events: keep, max_age_ms: u64::MAX },
        );
        for n in 1..=events {
            log.append(format!("id{n}").into(), 0, |seq| seq);
            let _ = log.mark_durable(n).count();
        }
        log
    }

    fn ask(since: Option<u64>, state: bool) -> Ask<'static> {
        Ask { since, epoch: None, state }
    }

    #[test]
    fn a_client_ahead_of_the_head_in_the_rooms_epoch_is_seen_beyond_it() {
        let log = log(10, 5);
        let cases = [
            (Ask { since: Some(11), epoch: None, state: false }, true),
            (Ask { since: Some(11), epoch: Some("e"), state: true }, true),
            (Ask { since: Some(11), epoch: Some("other"), state: false }, false),
            (Ask { since: Some(10), epoch: Some("e"), state: false }, false),
            (Ask { since: Some(3), epoch: None, state: false }, false),
            (Ask { since: None, epoch: None, state: true }, false),
        ];
        for (ask, beyond) in cases {
            assert_eq!(seen_beyond_head(&log, ask), beyond, "{ask:?}");
        }
    }

    #[test]
    fn answers() {
        let log = log(10, 5);
        let cases: &[(Ask, u64, Option<bool>, &[u64], bool)] = &[
            // (ask, state seq, recovered, replay, with state)
            (ask(None, false), 0, None, &[], false),
            (ask(Some(7), false), 0, Some(true), &[8, 9, 10], false),
            (ask(Some(10), false), 0, Some(true), &[], false),
            // 5 is the last seq before what is retained (6..=10): still whole.
            (ask(Some(5), false), 0, Some(true), &[6, 7, 8, 9, 10], false),
            (ask(Some(4), false), 0, Some(false), &[], false),
            (ask(Some(11), false), 0, Some(false), &[], false),
            (ask(None, true), 8, None, &[9, 10], true),
            (ask(Some(2), true), 8, Some(false), &[9, 10], true),
            // A recovery that works needs no state.
            (ask(Some(9), true), 8, Some(true), &[10], false),
        ];
        for (n, (ask, state_seq, recovered, replay, with_state)) in cases.iter().enumerate() {
            let answer = answer_subscribe(&log, *ask, *state_seq, 100);
            assert_eq!(answer.head, 10, "case {n}");
            assert_eq!(answer.recovered, *recovered, "case {n}");
            assert_eq!(answer.replay, replay.to_vec(), "case {n}");
            assert_eq!(answer.with_state, *with_state, "case {n}");
        }
        let too_many = answer_subscribe(&log, ask(Some(6), false), 0, 3);
        assert_eq!(
            (too_many.recovered, too_many.refused),
            (Some(false), Some(NotRecovered::TooManyMissing))
        );
        let other_epoch = answer_subscribe(
            &log,
            Ask { since: Some(9), epoch: Some("old"), state: false },
            0,
            100,
        );
        assert_eq!(other_epoch.refused, Some(NotRecovered::EpochChanged));
    }
}
