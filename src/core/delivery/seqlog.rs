//! A room's sequence log: epoch, head, the bounded history window and the idempotency
//! ids of the events in it. Pure: the caller persists what it appends and tells the log
//! when a prefix became durable; only durable events are ever replayed or read.
//!
//! Invariants: sequence numbers are contiguous from 1; `durable <= head`; history holds a
//! contiguous run of seqs ending at `head`, of which at most `max_events` are durable (an
//! event not yet durable is never trimmed: appends in flight bound the rest); an id maps
//! to a seq only while its event is in history.

use crate::core::rules::limits::Retention;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// One event in history. `payload` is whatever the caller shares between subscribers
/// (livegate keeps the event rendered once as wire JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<T> {
    pub seq: u64,
    /// The key the event's idempotency id is kept under (livegate's keeps a client's ids
    /// apart from backends' and other users': `names::idempotency_key`).
    pub id: Arc<str>,
    pub ts_ms: u64,
    pub payload: T,
}

#[derive(Debug, PartialEq)]
pub enum Append {
    /// A new event got `seq`; history entries with a seq below `first_kept` (if any) were
    /// dropped and should be deleted from the store.
    Appended { seq: u64, trimmed_below: Option<u64> },
    /// The id is already in history under `seq`: nothing was appended.
    Duplicate { seq: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRecovered {
    /// The client's epoch is not the room's: its seqs mean other events.
    EpochChanged,
    /// The client claims a seq the room never reached.
    AheadOfHead,
    /// History no longer holds the event right after `since`.
    Trimmed,
    /// More events are missing than a recovery may replay.
    TooManyMissing,
}

/// The answer to "I saw everything up to `since`": all durable events after it, or none.
#[derive(Debug, PartialEq)]
pub enum Recovery<'a, T> {
    Replay(Vec<&'a Entry<T>>),
    NotRecovered(NotRecovered),
}

#[derive(Debug)]
pub struct SeqLog<T> {
    epoch: String,
    head: u64,
    durable: u64,
    history: VecDeque<Entry<T>>,
    ids: HashMap<Arc<str>, u64>,
    retention: Retention,
}

impl<T> SeqLog<T> {
    /// A log restored from the store: `head` and `history` as persisted (all durable).
    /// A history longer than the retention, or not ending at `head`, is cut to fit.
    pub fn restore(epoch: String, head: u64, history: Vec<Entry<T>>, retention: Retention) -> Self {
        let mut log = SeqLog {
            epoch,
            head,
            durable: head,
            history: VecDeque::with_capacity(history.len()),
            ids: HashMap::new(),
            retention,
        };
        let mut expected = None;
        for entry in history.into_iter().filter(|e| e.seq <= head) {
            if expected.is_some_and(|next| entry.seq != next) {
                // A hole in stored history: keep only the contiguous tail.
                log.history.clear();
                log.ids.clear();
            }
            expected = Some(entry.seq + 1);
            log.ids.insert(entry.id.clone(), entry.seq);
            log.history.push_back(entry);
        }
        if log.history.back().is_some_and(|e| e.seq != head) {
            log.history.clear();
            log.ids.clear();
        }
        log.trim_to_count();
        log
    }

    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// Last assigned seq (durable or not).
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Last seq known durable; everything up to it may be delivered and replayed.
    pub fn durable(&self) -> u64 {
        self.durable
    }

    /// Seq of the oldest event still in history.
    pub fn oldest(&self) -> Option<u64> {
        self.history.front().map(|e| e.seq)
    }

    /// The seq an event with this id got, while it is in history.
    pub fn seq_of(&self, id: &str) -> Option<u64> {
        self.ids.get(id).copied()
    }

    /// Append an event unless its id is already in history. `render` builds the payload
    /// from the assigned seq.
    pub fn append(&mut self, id: Arc<str>, ts_ms: u64, render: impl FnOnce(u64) -> T) -> Append {
        if let Some(seq) = self.seq_of(&id) {
            return Append::Duplicate { seq };
        }
        let seq = self.head + 1;
        self.head = seq;
        self.ids.insert(id.clone(), seq);
        self.history.push_back(Entry { seq, id, ts_ms, payload: render(seq) });
        let trimmed_below = self.trim_to_count().then(|| self.oldest().unwrap_or(seq + 1));
        Append::Appended { seq, trimmed_below }
    }

    /// Everything up to `seq` is durable now. Returns the newly durable entries, in order.
    /// Append an event that a shared log already sequenced and stored (cluster mode): it
    /// must be the next seq, and it is durable at once. An id seen before is taken as
    /// given: the shared log decided it is a new event. `Err(expected)` for any other seq.
    pub fn append_sequenced(
        &mut self,
        seq: u64,
        id: Arc<str>,
        ts_ms: u64,
        payload: T,
    ) -> Result<(), u64> {
        if seq != self.head + 1 || self.durable != self.head {
            return Err(self.head + 1);
        }
        self.head = seq;
        self.durable = seq;
        self.ids.insert(id.clone(), seq);
        self.history.push_back(Entry { seq, id, ts_ms, payload });
        self.trim_to_count();
        Ok(())
    }

    pub fn mark_durable(&mut self, seq: u64) -> impl Iterator<Item = &Entry<T>> {
        let from = self.durable;
        self.durable = self.durable.max(seq.min(self.head));
        let to = self.durable;
        self.history.iter().filter(move |e| e.seq > from && e.seq <= to)
    }

    /// Drop events older than the retention age. Returns the first seq kept when any
    /// were dropped (the store deletes everything below it).
    pub fn trim_expired(&mut self, now_ms: u64) -> Option<u64> {
        let cutoff = now_ms.saturating_sub(self.retention.max_age_ms);
        let mut trimmed = false;
        while let Some(front) = self.history.front() {
            if front.ts_ms >= cutoff || front.seq > self.durable {
                break;
            }
            self.drop_front();
            trimmed = true;
        }
        trimmed.then(|| self.oldest().unwrap_or(self.head + 1))
    }

    /// What a client that saw everything up to `since` in `epoch` is missing.
    /// `epoch: None` means "the current epoch".
    pub fn recover(&self, since: u64, epoch: Option<&str>, max_events: u64) -> Recovery<'_, T> {
        if epoch.is_some_and(|e| e != self.epoch) {
            return Recovery::NotRecovered(NotRecovered::EpochChanged);
        }
        if since > self.durable {
            return Recovery::NotRecovered(NotRecovered::AheadOfHead);
        }
        if self.durable - since > max_events {
            return Recovery::NotRecovered(NotRecovered::TooManyMissing);
        }
        if since < self.durable && self.oldest().is_none_or(|oldest| oldest > since + 1) {
            return Recovery::NotRecovered(NotRecovered::Trimmed);
        }
        Recovery::Replay(self.after(since).collect())
    }

    /// Up to `limit` durable events after `since`, and whether they reach the durable
    /// head with nothing missing before them.
    pub fn read(&self, since: u64, limit: usize) -> (Vec<&Entry<T>>, bool) {
        let events: Vec<_> = self.after(since).take(limit).collect();
        let gapless =
            since >= self.durable || self.oldest().is_some_and(|oldest| oldest <= since + 1);
        let reaches_head = events.last().map_or(since, |e| e.seq) >= self.durable;
        (events, gapless && reaches_head)
    }

    fn after(&self, since: u64) -> impl Iterator<Item = &Entry<T>> {
        let durable = self.durable;
        let start = match self.oldest() {
            Some(oldest) if since >= oldest => (since - oldest + 1) as usize,
            _ => 0,
        };
        self.history.iter().skip(start).take_while(move |e| e.seq <= durable)
    }

    /// Drop the oldest durable events over `max_events`. An event not durable yet is
    /// kept whatever the count: its subscribers have not had it (more appends than
    /// `max_events` between two flushes would otherwise never reach them).
    fn trim_to_count(&mut self) -> bool {
        let mut trimmed = false;
        while self.history.len() > self.retention.max_events
            && self.history.front().is_some_and(|e| e.seq <= self.durable)
        {
            self.drop_front();
            trimmed = true;
        }
        trimmed
    }

    fn drop_front(&mut self) {
        if let Some(entry) = self.history.pop_front() {
            if self.ids.get(&entry.id) == Some(&entry.seq) {
                self.ids.remove(&entry.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETAIN: Retention = Retention { max_events: 5, max_age_ms: 1_000 };

    fn log_with(n: u64, durable: u64) -> SeqLog<u64> {
        let mut log = SeqLog::restore("E".into(), 0, vec![], RETAIN);
        for i in 1..=n {
            log.append(format!("id-{i}").into(), i * 10, |seq| seq);
            let _ = log.mark_durable(i.min(durable)).count();
        }
        log
    }

    fn seqs<T>(entries: &[&Entry<T>]) -> Vec<u64> {
        entries.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn append_assigns_contiguous_seqs_and_trims_by_count() {
        let mut log = SeqLog::restore("E".into(), 0, vec![], RETAIN);
        let mut append = |i: u64| {
            let appended = log.append(format!("e{i}").into(), 0, |s| s);
            let _ = log.mark_durable(i).count();
            appended
        };
        let results: Vec<_> = (1..=7).map(&mut append).collect();
        assert_eq!(results[0], Append::Appended { seq: 1, trimmed_below: None });
        assert_eq!(results[4], Append::Appended { seq: 5, trimmed_below: None });
        assert_eq!(results[5], Append::Appended { seq: 6, trimmed_below: Some(2) });
        assert_eq!(results[6], Append::Appended { seq: 7, trimmed_below: Some(3) });
        assert_eq!(log.head(), 7);
        assert_eq!(log.oldest(), Some(3));
    }

    #[test]
    fn events_not_durable_yet_are_never_trimmed() {
        // More appends between two flushes than history keeps: each still reaches the
        // subscribers once durable (found by `core::delivery::sim`).
        let mut log = SeqLog::restore("E".into(), 0, vec![], RETAIN);
        for i in 1..=8 {
            assert_eq!(
                log.append(format!("e{i}").into(), 0, |s| s),
                Append::Appended { seq: i, trimmed_below: None }
            );
        }
        assert_eq!(
            log.mark_durable(8).map(|e| e.seq).collect::<Vec<_>>(),
            (1..=8).collect::<Vec<_>>()
        );
        assert!(matches!(
            log.append("e9".into(), 0, |s| s),
            Append::Appended { seq: 9, trimmed_below: Some(5) }
        ));
        assert_eq!(log.oldest(), Some(5));
    }

    #[test]
    fn duplicate_ids_within_history_only() {
        let mut log = log_with(3, 3);
        assert_eq!(log.append("id-2".into(), 0, |s| s), Append::Duplicate { seq: 2 });
        assert_eq!(log.head(), 3);
        for i in 4..=8 {
            log.append(format!("id-{i}").into(), 0, |s| s);
            let _ = log.mark_durable(i).count();
        }
        // id-2 has left history (5 kept: 4..=8), so it is new again.
        assert_eq!(log.seq_of("id-2"), None);
        assert!(matches!(log.append("id-2".into(), 0, |s| s), Append::Appended { seq: 9, .. }));
    }

    #[test]
    fn mark_durable_yields_each_event_once() {
        let mut log = log_with(4, 0);
        assert_eq!(log.mark_durable(2).map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(log.mark_durable(2).count(), 0);
        assert_eq!(log.mark_durable(9).map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(log.durable(), 4);
    }

    #[test]
    fn recovery_table() {
        // history 1..=5 durable up to 4, head 5.
        let log = log_with(5, 4);
        let cases: &[(u64, Option<&str>, u64, Result<Vec<u64>, NotRecovered>)] = &[
            (0, Some("E"), 100, Ok(vec![1, 2, 3, 4])),
            (2, Some("E"), 100, Ok(vec![3, 4])),
            (2, None, 100, Ok(vec![3, 4])),
            (4, Some("E"), 100, Ok(vec![])),
            (5, Some("E"), 100, Err(NotRecovered::AheadOfHead)),
            (2, Some("OTHER"), 100, Err(NotRecovered::EpochChanged)),
            (0, Some("E"), 3, Err(NotRecovered::TooManyMissing)),
            (1, Some("E"), 3, Ok(vec![2, 3, 4])),
        ];
        for (since, epoch, max, expected) in cases {
            let got = match log.recover(*since, *epoch, *max) {
                Recovery::Replay(events) => Ok(seqs(&events)),
                Recovery::NotRecovered(why) => Err(why),
            };
            assert_eq!(&got, expected, "since {since} epoch {epoch:?} max {max}");
        }
    }

    #[test]
    fn recovery_refuses_partial_replay_after_trim() {
        let log = log_with(8, 8); // history 4..=8
        assert_eq!(log.recover(2, Some("E"), 100), Recovery::NotRecovered(NotRecovered::Trimmed));
        assert!(matches!(log.recover(3, Some("E"), 100), Recovery::Replay(ref v) if v.len() == 5));
        assert!(matches!(log.recover(8, Some("E"), 100), Recovery::Replay(ref v) if v.is_empty()));
    }

    #[test]
    fn trim_by_age_keeps_undurable_events() {
        let mut log = log_with(5, 3); // ts 10..=50
        assert_eq!(log.trim_expired(1_025), Some(3)); // cutoff 25: drops 1, 2
        assert_eq!(log.trim_expired(1_025), None);
        assert_eq!(log.trim_expired(10_000), Some(4)); // 3 durable and old; 4, 5 not durable
        assert_eq!(log.oldest(), Some(4));
        assert_eq!(log.seq_of("id-3"), None);
        let _ = log.mark_durable(5).count();
        assert_eq!(log.trim_expired(10_000), Some(6));
        assert_eq!(log.oldest(), None);
        assert_eq!(log.recover(5, None, 10), Recovery::Replay(vec![]));
        assert_eq!(log.recover(4, None, 10), Recovery::NotRecovered(NotRecovered::Trimmed));
    }

    #[test]
    fn read_pages_and_completeness() {
        let log = log_with(8, 7); // history 4..=8, durable 7
        let cases: &[(u64, usize, Vec<u64>, bool)] = &[
            (3, 10, vec![4, 5, 6, 7], true),
            (3, 2, vec![4, 5], false),
            (0, 10, vec![4, 5, 6, 7], false),
            (6, 10, vec![7], true),
            (7, 10, vec![], true),
            (9, 10, vec![], true),
        ];
        for (since, limit, expected, complete) in cases {
            let (events, got_complete) = log.read(*since, *limit);
            assert_eq!(&seqs(&events), expected, "since {since} limit {limit}");
            assert_eq!(got_complete, *complete, "since {since} limit {limit}");
        }
    }

    #[test]
    fn restore_keeps_contiguous_tail_ending_at_head() {
        let entry =
            |seq: u64| Entry { seq, id: format!("id-{seq}").into(), ts_ms: 0, payload: seq };
        let log = SeqLog::restore(
            "E".into(),
            9,
            vec![entry(3), entry(4), entry(7), entry(8), entry(9)],
            RETAIN,
        );
        assert_eq!((log.oldest(), log.head(), log.durable()), (Some(7), 9, 9));
        assert_eq!(log.seq_of("id-4"), None);
        assert_eq!(log.seq_of("id-8"), Some(8));
        let stale = SeqLog::restore("E".into(), 12, vec![entry(8), entry(9)], RETAIN);
        assert_eq!(stale.oldest(), None);
    }

    #[test]
    fn sequenced_appends_take_only_the_next_seq() {
        let retention = Retention { max_events: 2, max_age_ms: 0 };
        let mut log: SeqLog<()> = SeqLog::restore("E".into(), 4, Vec::new(), retention);
        let cases: &[(u64, &str, Result<(), u64>, u64)] = &[
            (6, "a", Err(5), 4),
            (4, "a", Err(5), 4),
            (5, "a", Ok(()), 5),
            (6, "a", Ok(()), 6),
            (7, "b", Ok(()), 7),
        ];
        for (seq, id, expected, head) in cases {
            assert_eq!(log.append_sequenced(*seq, (*id).into(), 0, ()), *expected, "seq {seq}");
            assert_eq!((log.head(), log.durable()), (*head, *head), "seq {seq}");
        }
        assert_eq!(log.oldest(), Some(6));
        assert_eq!(log.seq_of("b"), Some(7));
    }
}
