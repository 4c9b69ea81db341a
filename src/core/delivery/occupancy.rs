//! Room occupancy as pure state: a node's `vacated` edges held back for
//! `webhook_vacated_delay_ms` ([`VacateDelay`]: a room left and joined again within it
//! reports neither edge, in both modes), and, cluster-wide, which nodes have subscribers
//! in a room ([`Occupants`], one record per occupied room, with its encoding), what a
//! change of that set decides ([`Edge`]: the first node in is `occupied`, the last one
//! out is `vacated`), and one node's queue of rooms whose record must catch up with its
//! local state ([`LocalRooms`]). No I/O and no clock: times are parameters.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use thiserror::Error;

/// Format byte in front of an encoded [`Occupants`].
pub const OCCUPANTS_FORMAT: u8 = 1;

/// A cluster-wide decision about a room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// The room's first subscriber anywhere in the cluster arrived.
    Occupied,
    /// The room's last subscriber anywhere in the cluster left.
    Vacated,
}

impl Edge {
    pub fn occupied(self) -> bool {
        self == Edge::Occupied
    }

    pub fn label(self) -> &'static str {
        match self {
            Edge::Occupied => "occupied",
            Edge::Vacated => "vacated",
        }
    }
}

/// The nodes with subscribers in one room. Empty means the room is vacated: its record
/// is deleted, so the stored records are the occupied rooms only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Occupants {
    pub nodes: BTreeSet<String>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum OccupantsError {
    #[error("occupancy record is empty")]
    Empty,
    #[error("occupancy record has format {0}, this build reads {OCCUPANTS_FORMAT}")]
    Format(u8),
    #[error("occupancy record is not UTF-8")]
    Text,
    #[error("occupancy record names an empty node")]
    EmptyNode,
}

/// What applying a change to a room's record gives: the record to store (`None`: delete
/// it) and the decision, if the change crossed between empty and not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub record: Option<Occupants>,
    pub edge: Option<Edge>,
    /// Whether the record changes at all (no write when it does not).
    pub changed: bool,
}

impl Occupants {
    /// `format byte, node names joined by newlines` (node names hold no newline).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![OCCUPANTS_FORMAT];
        let names: Vec<&str> = self.nodes.iter().map(String::as_str).collect();
        out.extend_from_slice(names.join("\n").as_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Occupants, OccupantsError> {
        let (&format, rest) = bytes.split_first().ok_or(OccupantsError::Empty)?;
        if format != OCCUPANTS_FORMAT {
            return Err(OccupantsError::Format(format));
        }
        let text = std::str::from_utf8(rest).map_err(|_| OccupantsError::Text)?;
        if text.is_empty() {
            return Ok(Occupants::default());
        }
        let nodes = text.split('\n').map(|n| {
            if n.is_empty() {
                Err(OccupantsError::EmptyNode)
            } else {
                Ok(n.to_string())
            }
        });
        Ok(Occupants { nodes: nodes.collect::<Result<_, _>>()? })
    }
}

/// `node` has subscribers in the room (`present`) or none any more, applied to the stored
/// record (`None`: no record, the room is vacated).
pub fn apply(stored: Option<&Occupants>, node: &str, present: bool) -> Applied {
    let before = stored.cloned().unwrap_or_default();
    let mut after = before.clone();
    if present {
        after.nodes.insert(node.to_string());
    } else {
        after.nodes.remove(node);
    }
    decide(stored.is_some(), before, after)
}

/// The nodes of the record not in `alive` leave it (they are dead: heartbeats stopped).
pub fn remove_dead(stored: &Occupants, alive: &[&str]) -> Applied {
    let mut after = stored.clone();
    after.nodes.retain(|n| alive.contains(&n.as_str()));
    decide(true, stored.clone(), after)
}

fn decide(existed: bool, before: Occupants, after: Occupants) -> Applied {
    let edge = match (before.nodes.is_empty(), after.nodes.is_empty()) {
        (true, false) => Some(Edge::Occupied),
        (false, true) => Some(Edge::Vacated),
        _ => None,
    };
    // A record left empty (by an older build, or a write that lost its delete) goes too.
    let changed = before != after || (existed && after.nodes.is_empty());
    let record = (!after.nodes.is_empty()).then_some(after);
    Applied { record, edge, changed }
}

/// One room's reconciliation: make the record say whether this node has subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub room: Arc<str>,
    pub present: bool,
    /// When the local edge behind it happened.
    pub ts_ms: u64,
}

#[derive(Debug, Clone)]
struct LocalRoom {
    /// Whether this node has subscribers in the room now.
    occupied: bool,
    ts_ms: u64,
    /// What the record says of this node as of the last reconciliation (`None`: unknown,
    /// as for rooms a previous run of this node may have left in the records).
    recorded: Option<bool>,
    queued: bool,
    in_flight: bool,
}

impl LocalRoom {
    fn behind(&self) -> bool {
        self.recorded != Some(self.occupied)
    }

    fn idle(&self) -> bool {
        !self.occupied && self.recorded == Some(false) && !self.queued && !self.in_flight
    }
}

/// This node's rooms whose record may not match its local occupancy, in the order they
/// fell behind. Level-triggered: a job carries the room's local state when it is taken,
/// so edges that came while a room waited collapse into its latest state (a room
/// occupied and vacated again before its record was written leaves no trace). A room is
/// in flight at most once; one that changes meanwhile is queued again when it returns.
///
/// Bound: the rooms this node has subscribers in, plus those it left whose record has
/// not caught up yet (entries are dropped once a vacated room's record says so).
#[derive(Debug, Default)]
pub struct LocalRooms {
    rooms: HashMap<Arc<str>, LocalRoom>,
    queue: VecDeque<Arc<str>>,
}

impl LocalRooms {
    /// The room's local subscribers went from none to some (`occupied`) or back, at
    /// `ts_ms`. True when the room joined the queue (a worker should wake).
    pub fn changed(&mut self, room: &str, occupied: bool, ts_ms: u64) -> bool {
        let entry = self.rooms.entry(room.into()).or_insert(LocalRoom {
            occupied: false,
            ts_ms,
            recorded: Some(false),
            queued: false,
            in_flight: false,
        });
        entry.occupied = occupied;
        entry.ts_ms = ts_ms;
        self.enqueue(room)
    }

    /// The record of `room` names this node, or may (found there at start-up, or after an
    /// outage): reconcile it whatever the local state is.
    pub fn unknown(&mut self, room: &str, ts_ms: u64) -> bool {
        let entry = self.rooms.entry(room.into()).or_insert(LocalRoom {
            occupied: false,
            ts_ms,
            recorded: None,
            queued: false,
            in_flight: false,
        });
        entry.recorded = None;
        self.enqueue(room)
    }

    /// The node is stopping: none of its rooms has subscribers here any more.
    pub fn leave_all(&mut self, ts_ms: u64) -> bool {
        let rooms: Vec<Arc<str>> = self.rooms.keys().cloned().collect();
        let mut woke = false;
        for room in rooms {
            woke |= self.changed(&room, false, ts_ms);
        }
        woke
    }

    fn enqueue(&mut self, room: &str) -> bool {
        let Some(key) = self.rooms.get_key_value(room).map(|(key, _)| key.clone()) else {
            return false;
        };
        let entry = self.rooms.get_mut(room).expect("just found");
        if entry.queued || entry.in_flight || !entry.behind() {
            if entry.idle() {
                self.rooms.remove(room);
            }
            return false;
        }
        entry.queued = true;
        self.queue.push_back(key);
        true
    }

    /// The next room to reconcile, now in flight until [`LocalRooms::finished`].
    pub fn next_job(&mut self) -> Option<Job> {
        while let Some(room) = self.queue.pop_front() {
            let Some(entry) = self.rooms.get_mut(&room) else { continue };
            entry.queued = false;
            if !entry.behind() {
                if entry.idle() {
                    self.rooms.remove(&room);
                }
                continue;
            }
            entry.in_flight = true;
            return Some(Job { room, present: entry.occupied, ts_ms: entry.ts_ms });
        }
        None
    }

    /// `job` is done: `applied` when the record now says `job.present`, false when it
    /// failed (the room is queued again, at the back). True when the room was queued.
    pub fn finished(&mut self, job: &Job, applied: bool) -> bool {
        let Some(entry) = self.rooms.get_mut(&job.room) else { return false };
        entry.in_flight = false;
        if applied {
            entry.recorded = Some(job.present);
        }
        self.enqueue(&job.room)
    }

    /// Rooms kept (the bound above).
    pub fn len(&self) -> usize {
        self.rooms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rooms.is_empty()
    }

    /// Whether any room is waiting or in flight.
    pub fn pending(&self) -> bool {
        self.rooms.values().any(|r| r.queued || r.in_flight)
    }

    /// Whether this node has subscribers in `room` now.
    pub fn occupied(&self, room: &str) -> bool {
        self.rooms.get(room).is_some_and(|r| r.occupied)
    }
}

/// A node's rooms whose last local subscriber left less than the delay ago: their
/// `vacated` edge waits, and a room joined again meanwhile (a page reload, a
/// subscribe/unsubscribe loop) reports neither that `vacated` nor the next `occupied`.
/// Pusher's channel webhooks wait the same way.
///
/// Times: `now_ms` on a monotonic clock (when an edge is due), `ts_ms` on the wall clock
/// (what the edge reports: when the room was left). Edges of one room alternate, as a
/// room reports them.
///
/// Bound: one waiting entry per room left in the last delay, and one queue entry per
/// `vacated` edge of the last delay (a cancelled one leaves when it comes due).
#[derive(Debug)]
pub struct VacateDelay {
    delay_ms: u64,
    /// Room → (due at, left at `ts_ms`).
    waiting: HashMap<Arc<str>, (u64, u64)>,
    /// (due at, room), in the order the rooms were left (so by due time).
    due: VecDeque<(u64, Arc<str>)>,
}

impl VacateDelay {
    pub fn new(delay_ms: u64) -> VacateDelay {
        VacateDelay { delay_ms, waiting: HashMap::new(), due: VecDeque::new() }
    }

    /// A room's local edge: whether to report it now. A `vacated` waits (unless the
    /// delay is 0); an `occupied` while the room's `vacated` waits cancels both.
    pub fn edge(&mut self, room: &str, occupied: bool, now_ms: u64, ts_ms: u64) -> bool {
        if occupied {
            return self.waiting.remove(room).is_none();
        }
        if self.delay_ms == 0 {
            return true;
        }
        if !self.waiting.contains_key(room) {
            let room: Arc<str> = room.into();
            let at = now_ms.saturating_add(self.delay_ms);
            self.waiting.insert(room.clone(), (at, ts_ms));
            self.due.push_back((at, room));
        }
        false
    }

    /// The `vacated` edges due by `now_ms`: each room with when it was left (`ts_ms`).
    pub fn due(&mut self, now_ms: u64) -> Vec<(Arc<str>, u64)> {
        let mut due = Vec::new();
        while let Some((at, _)) = self.due.front().filter(|(at, _)| *at <= now_ms) {
            let at = *at;
            let (_, room) = self.due.pop_front().expect("front exists");
            // Cancelled, or left again later (a newer entry is queued for that).
            if self.waiting.get(&room).is_some_and(|(due_at, _)| *due_at == at) {
                let (_, ts_ms) = self.waiting.remove(&room).expect("just found");
                due.push((room, ts_ms));
            }
        }
        due
    }

    /// When the next queued entry comes due (it may have been cancelled).
    pub fn next_due(&self) -> Option<u64> {
        self.due.front().map(|(at, _)| *at)
    }

    /// Every waiting `vacated` edge at once (the node stops), in the order the rooms were
    /// left.
    pub fn drain(&mut self) -> Vec<(Arc<str>, u64)> {
        let mut left: Vec<(u64, Arc<str>, u64)> =
            self.waiting.drain().map(|(room, (at, ts_ms))| (at, room, ts_ms)).collect();
        left.sort();
        self.due.clear();
        left.into_iter().map(|(_, room, ts_ms)| (room, ts_ms)).collect()
    }

    /// Rooms whose `vacated` waits.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(nodes: &[&str]) -> Occupants {
        Occupants { nodes: nodes.iter().map(|n| n.to_string()).collect() }
    }

    #[test]
    fn applying_a_node_decides_the_first_in_and_the_last_out() {
        type Case<'a> =
            (Option<&'a [&'a str]>, &'a str, bool, Option<&'a [&'a str]>, Option<Edge>, bool);
        let cases: &[Case] = &[
            (None, "a", true, Some(&["a"]), Some(Edge::Occupied), true),
            (Some(&["a"]), "b", true, Some(&["a", "b"]), None, true),
            (Some(&["a", "b"]), "b", true, Some(&["a", "b"]), None, false),
            (Some(&["a", "b"]), "a", false, Some(&["b"]), None, true),
            (Some(&["b"]), "b", false, None, Some(Edge::Vacated), true),
            (None, "b", false, None, None, false),
            (Some(&["a"]), "b", false, Some(&["a"]), None, false),
            // An empty record left behind: deleted, nothing decided.
            (Some(&[]), "b", false, None, None, true),
            (Some(&[]), "b", true, Some(&["b"]), Some(Edge::Occupied), true),
        ];
        for (stored, node, present, after, edge, changed) in cases {
            let stored = stored.map(set);
            let applied = apply(stored.as_ref(), node, *present);
            let expected = Applied { record: after.map(set), edge: *edge, changed: *changed };
            assert_eq!(applied, expected, "{stored:?} {node} {present}");
        }
    }

    #[test]
    fn dead_nodes_leave_and_the_last_one_vacates() {
        let cases: &[(&[&str], &[&str], Option<&[&str]>, Option<Edge>, bool)] = &[
            (&["a", "b"], &["a", "b", "c"], Some(&["a", "b"]), None, false),
            (&["a", "b"], &["a"], Some(&["a"]), None, true),
            (&["b", "c"], &["a"], None, Some(Edge::Vacated), true),
            (&[], &["a"], None, None, true),
        ];
        for (stored, alive, after, edge, changed) in cases {
            let applied = remove_dead(&set(stored), alive);
            assert_eq!(
                applied,
                Applied { record: after.map(set), edge: *edge, changed: *changed },
                "{stored:?} {alive:?}"
            );
        }
    }

    #[test]
    fn records_round_trip_with_their_format_byte() {
        for record in [set(&[]), set(&["n1"]), set(&["a", "node-2", "z.3"])] {
            let bytes = record.encode();
            assert_eq!(bytes[0], OCCUPANTS_FORMAT);
            assert_eq!(Occupants::decode(&bytes), Ok(record));
        }
        let cases: &[(&[u8], OccupantsError)] = &[
            (b"", OccupantsError::Empty),
            (b"\x02a", OccupantsError::Format(2)),
            (b"\x01a\n\nb", OccupantsError::EmptyNode),
            (b"\x01a\n", OccupantsError::EmptyNode),
            (b"\x01\xff", OccupantsError::Text),
        ];
        for (bytes, error) in cases {
            assert_eq!(Occupants::decode(bytes).as_ref(), Err(error), "{bytes:?}");
        }
    }

    fn job(room: &str, present: bool, ts_ms: u64) -> Job {
        Job { room: room.into(), present, ts_ms }
    }

    #[test]
    fn a_room_is_reconciled_once_at_a_time_with_its_latest_state() {
        let mut rooms = LocalRooms::default();
        assert!(rooms.changed("r", true, 1));
        assert!(!rooms.changed("r", false, 2), "already queued");
        assert!(!rooms.changed("r", true, 3));
        assert!(rooms.changed("s", true, 4));
        // Collapsed to the latest state, in the order the rooms fell behind.
        let first = rooms.next_job().unwrap();
        assert_eq!(first, job("r", true, 3));
        assert_eq!(rooms.next_job(), Some(job("s", true, 4)));
        assert_eq!(rooms.next_job(), None);
        // Changes while in flight wait for it.
        assert!(!rooms.changed("r", false, 5));
        assert_eq!(rooms.next_job(), None);
        assert!(rooms.finished(&first, true), "behind again: queued");
        assert_eq!(rooms.next_job(), Some(job("r", false, 5)));
        assert!(!rooms.finished(&job("r", false, 5), true));
        assert_eq!(rooms.len(), 1, "the vacated room is forgotten, s is kept");
        assert!(rooms.occupied("s") && !rooms.occupied("r"));
    }

    #[test]
    fn a_flap_before_the_record_was_written_leaves_nothing() {
        let mut rooms = LocalRooms::default();
        rooms.changed("r", true, 1);
        rooms.changed("r", false, 2);
        assert_eq!(rooms.next_job(), None);
        assert!(rooms.is_empty());
        assert!(!rooms.pending());
    }

    #[test]
    fn failures_go_to_the_back_and_unknown_rooms_are_checked() {
        let mut rooms = LocalRooms::default();
        rooms.changed("a", true, 1);
        rooms.changed("b", true, 1);
        let a = rooms.next_job().unwrap();
        assert!(rooms.finished(&a, false));
        assert_eq!(rooms.next_job().unwrap().room.as_ref(), "b");
        assert_eq!(rooms.next_job(), Some(job("a", true, 1)));
        // Found in a record at start-up with no local subscribers: removed.
        assert!(rooms.unknown("old", 7));
        assert_eq!(rooms.next_job(), Some(job("old", false, 7)));
        assert!(!rooms.finished(&job("old", false, 7), true));
        assert!(!rooms.occupied("old"));
        assert!(rooms.pending(), "a and b are in flight");
    }

    #[test]
    fn leaving_vacates_every_room_here() {
        let mut rooms = LocalRooms::default();
        rooms.changed("a", true, 1);
        let a = rooms.next_job().unwrap();
        rooms.finished(&a, true);
        rooms.changed("b", true, 1);
        assert!(rooms.leave_all(9));
        assert_eq!(rooms.next_job(), Some(job("a", false, 9)));
        // b never reached the record: nothing to undo.
        assert_eq!(rooms.next_job(), None);
        assert!(!rooms.finished(&job("a", false, 9), true));
        assert!(rooms.is_empty());
    }

    #[test]
    fn a_room_left_and_joined_within_the_delay_reports_nothing() {
        let mut delay = VacateDelay::new(3_000);
        // (room, occupied, now, ts) → reported now.
        let steps: &[(&str, bool, u64, u64, bool)] = &[
            ("r", true, 0, 100, true),
            ("r", false, 10, 110, false),
            // A reload: joined again within the delay, neither edge.
            ("r", true, 2_000, 2_100, false),
            ("r", false, 2_500, 2_600, false),
            ("s", true, 2_600, 2_700, true),
            ("s", false, 2_700, 2_800, false),
        ];
        for (room, occupied, now, ts, told) in steps {
            assert_eq!(delay.edge(room, *occupied, *now, *ts), *told, "{room} {occupied} at {now}");
        }
        assert_eq!(delay.waiting(), 2);
        // r's first vacate was cancelled; its second is due at 5 500, s's at 5 700.
        assert_eq!(delay.next_due(), Some(3_010));
        assert_eq!(delay.due(3_010), vec![]);
        assert_eq!(delay.due(5_499), vec![]);
        assert_eq!(delay.due(5_600), vec![("r".into(), 2_600)]);
        assert_eq!(delay.next_due(), Some(5_700));
        assert_eq!(delay.due(9_000), vec![("s".into(), 2_800)]);
        assert_eq!((delay.waiting(), delay.next_due()), (0, None));
        // After its vacated went out, a room's next occupied is reported again.
        assert!(delay.edge("r", true, 9_100, 9_200));
    }

    #[test]
    fn a_stop_reports_every_waiting_vacate_and_no_delay_reports_at_once() {
        let mut delay = VacateDelay::new(1_000);
        for (room, now) in [("b", 5), ("a", 7)] {
            delay.edge(room, true, now, now);
            delay.edge(room, false, now, now + 100);
        }
        assert_eq!(delay.drain(), vec![("b".into(), 105), ("a".into(), 107)]);
        assert_eq!((delay.waiting(), delay.next_due()), (0, None));
        let mut none = VacateDelay::new(0);
        assert!(none.edge("r", true, 0, 0));
        assert!(none.edge("r", false, 0, 0));
        assert_eq!(none.waiting(), 0);
    }
}
