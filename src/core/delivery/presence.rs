//! Who is in a room (presence): the pure parts. A member is a distinct
//! `(user, device)`; one node's members of a room are a multiset of them (several tabs
//! of one user and device are one member with several connections); the room's view
//! joins this node's members with the tables the other nodes sent (cluster mode); the
//! diff since the last frame sent, and the throttle that sends it at most once per
//! interval and only when something changed. Above `members_max` members only counts
//! are kept and sent. Time is a parameter (ms).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// One member of a room: a user on a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    pub user: Arc<str>,
    pub device: Arc<str>,
}

impl Member {
    pub fn new(user: &str, device: &str) -> Self {
        Member { user: user.into(), device: device.into() }
    }
}

/// This node's members of one room: each member with its number of subscribed
/// connections, by connection so that a connection leaving twice counts once.
#[derive(Debug, Default, Clone)]
pub struct LocalMembers<C: Eq + std::hash::Hash + Copy = u64> {
    by_conn: HashMap<C, Member>,
    counts: BTreeMap<Member, u32>,
}

impl<C: Eq + std::hash::Hash + Copy> LocalMembers<C> {
    pub fn new() -> Self {
        LocalMembers { by_conn: HashMap::new(), counts: BTreeMap::new() }
    }

    /// Connection `conn` is in the room as `member` (replacing what it was before).
    /// Returns whether the room's members changed.
    pub fn join(&mut self, conn: C, member: Member) -> bool {
        if self.by_conn.get(&conn) == Some(&member) {
            return false;
        }
        let left = self.leave(conn);
        let count = self.counts.entry(member.clone()).or_insert(0);
        *count += 1;
        let joined = *count == 1;
        self.by_conn.insert(conn, member);
        left || joined
    }

    /// Connection `conn` left (nothing if it was not in). Returns whether the room's
    /// members changed (its member's last connection went).
    pub fn leave(&mut self, conn: C) -> bool {
        let Some(member) = self.by_conn.remove(&conn) else { return false };
        let count = self.counts.get_mut(&member).expect("every connection's member is counted");
        *count -= 1;
        if *count == 0 {
            self.counts.remove(&member);
            return true;
        }
        false
    }

    /// Distinct members.
    pub fn distinct(&self) -> usize {
        self.counts.len()
    }

    pub fn connections(&self) -> usize {
        self.by_conn.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_conn.is_empty()
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.counts.keys()
    }

    /// What this node tells the others about the room: the members, or only their count
    /// above `members_max`.
    pub fn table(&self, members_max: usize) -> NodeTable {
        let count = self.distinct();
        let members = (count <= members_max).then(|| self.members().cloned().collect());
        NodeTable { count, members }
    }
}

/// One node's members of a room as it sends them: `members` is `None` above
/// `members_max` (the count alone), sorted otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeTable {
    pub count: usize,
    pub members: Option<Vec<Member>>,
}

/// The room as a client sees it: distinct members across every node, listed unless
/// there are more than `members_max` (or some node sent only its count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub count: usize,
    pub members: Option<BTreeSet<Member>>,
}

/// The room's view from this node's members and the other nodes' tables. A member on
/// two nodes counts once when both listed it; a node that sent only its count adds that
/// count (above `members_max` the count is that sum, and no list is given).
pub fn view<'a, C: Eq + std::hash::Hash + Copy>(
    local: Option<&LocalMembers<C>>,
    remote: impl IntoIterator<Item = &'a NodeTable>,
    members_max: usize,
) -> View {
    let mut listed: BTreeSet<Member> =
        local.map(|l| l.members().cloned().collect()).unwrap_or_default();
    let mut unlisted = 0usize;
    for table in remote {
        match &table.members {
            Some(members) => listed.extend(members.iter().cloned()),
            None => unlisted += table.count,
        }
    }
    let count = listed.len() + unlisted;
    let members = (unlisted == 0 && count <= members_max).then_some(listed);
    View { count, members }
}

/// A presence frame's content: the count, and who joined and left since the last frame
/// (`None` when the members are not listed: above `members_max`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diff {
    pub count: usize,
    pub joined: Option<Vec<Member>>,
    pub left: Option<Vec<Member>>,
}

/// What the subscribers were last told, to send only what changed. After a frame
/// without lists, the next frame with lists names every member in `joined` (a client
/// that saw `joined: null` starts its list again from there).
#[derive(Debug, Clone, Default)]
pub struct LastSent {
    count: usize,
    members: Option<BTreeSet<Member>>,
    /// Nothing was sent yet: the empty room needs no frame.
    sent_any: bool,
}

impl LastSent {
    /// The room as of the last frame, for a new subscriber: every member then in
    /// `joined` (the frames after it bring it up to date like everyone else).
    pub fn snapshot(&self) -> Diff {
        if !self.sent_any {
            return Diff { count: 0, joined: Some(Vec::new()), left: Some(Vec::new()) };
        }
        Diff {
            count: self.count,
            joined: self.members.as_ref().map(|members| members.iter().cloned().collect()),
            left: self.members.as_ref().map(|_| Vec::new()),
        }
    }

    /// The frame that brings the subscribers from the last one to `now`, if anything
    /// changed; it is then what was last sent.
    pub fn diff(&mut self, now: View) -> Option<Diff> {
        let first = !self.sent_any;
        let diff = match (&self.members, &now.members) {
            (Some(before), Some(after)) => {
                let joined: Vec<Member> = after.difference(before).cloned().collect();
                let left: Vec<Member> = before.difference(after).cloned().collect();
                if joined.is_empty() && left.is_empty() && now.count == self.count {
                    return None;
                }
                Diff { count: now.count, joined: Some(joined), left: Some(left) }
            }
            (None, Some(after)) => {
                if first && after.is_empty() {
                    return None;
                }
                Diff {
                    count: now.count,
                    joined: Some(after.iter().cloned().collect()),
                    left: Some(Vec::new()),
                }
            }
            (_, None) => {
                if self.members.is_none() && now.count == self.count && !first {
                    return None;
                }
                Diff { count: now.count, joined: None, left: None }
            }
        };
        self.count = now.count;
        self.members = now.members;
        self.sent_any = true;
        Some(diff)
    }
}

/// Sends at most once per interval: a change right after a send waits for the
/// interval's end (one timer), a change later goes at once.
#[derive(Debug, Clone)]
pub struct Throttle {
    interval_ms: u64,
    last_at: Option<u64>,
    armed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Throttled {
    /// Send now (and call [`Throttle::sent`]).
    Now,
    /// Arm a timer for this time (ms); when it fires, send.
    At(u64),
    /// A timer is armed already; it will carry this change too.
    Wait,
}

impl Throttle {
    pub fn new(interval_ms: u64) -> Self {
        Throttle { interval_ms, last_at: None, armed: false }
    }

    /// Something changed at `now`.
    pub fn changed(&mut self, now: u64) -> Throttled {
        if self.armed {
            return Throttled::Wait;
        }
        match self.last_at {
            Some(last) if now < last + self.interval_ms => {
                self.armed = true;
                Throttled::At(last + self.interval_ms)
            }
            _ => Throttled::Now,
        }
    }

    /// The timer fired or a send happened at `now` (whether or not a frame went out:
    /// an unchanged room sends nothing, and its next change may go at once).
    pub fn sent(&mut self, now: u64, anything: bool) {
        self.armed = false;
        if anything {
            self.last_at = Some(now);
        }
    }
}

/// Cluster mode: the other nodes' tables of every room, and when each node was last
/// heard, so a node declared dead (or never heard again) has its members removed.
#[derive(Debug, Default)]
pub struct RemoteTables {
    rooms: HashMap<Arc<str>, BTreeMap<Arc<str>, NodeTable>>,
    heard: HashMap<Arc<str>, u64>,
}

impl RemoteTables {
    /// `node`'s table of `room` (count 0: it has no members there). Returns whether the
    /// room's remote members changed.
    pub fn update(&mut self, node: &str, room: &str, table: NodeTable, now: u64) -> bool {
        let node: Arc<str> = match self.heard.get_key_value(node) {
            Some((known, _)) => known.clone(),
            None => node.into(),
        };
        self.heard.insert(node.clone(), now);
        if table.count == 0 {
            let Some(nodes) = self.rooms.get_mut(room) else { return false };
            let removed = nodes.remove(&node).is_some();
            if nodes.is_empty() {
                self.rooms.remove(room);
            }
            return removed;
        }
        let nodes = self.rooms.entry(room.into()).or_default();
        if nodes.get(&node) == Some(&table) {
            return false;
        }
        nodes.insert(node, table);
        true
    }

    /// Drop every table of `node`; returns the rooms whose members changed.
    pub fn remove_node(&mut self, node: &str) -> Vec<Arc<str>> {
        self.heard.remove(node);
        let mut changed = Vec::new();
        self.rooms.retain(|room, nodes| {
            if nodes.remove(node).is_some() {
                changed.push(room.clone());
            }
            !nodes.is_empty()
        });
        changed
    }

    /// Drop the tables of nodes not `alive` and not heard for `timeout_ms` (a node that
    /// died before liveness ever heard it); returns the rooms whose members changed.
    pub fn sweep(
        &mut self,
        alive: impl Fn(&str) -> bool,
        now: u64,
        timeout_ms: u64,
    ) -> Vec<Arc<str>> {
        let dead: Vec<Arc<str>> = self
            .heard
            .iter()
            .filter(|(node, at)| !alive(node) && now.saturating_sub(**at) >= timeout_ms)
            .map(|(node, _)| node.clone())
            .collect();
        let mut changed = Vec::new();
        for node in dead {
            changed.extend(self.remove_node(&node));
        }
        changed.sort_unstable();
        changed.dedup();
        changed
    }

    /// The other nodes' tables of `room`.
    pub fn room(&self, room: &str) -> impl Iterator<Item = &NodeTable> {
        self.rooms.get(room).into_iter().flat_map(|nodes| nodes.values())
    }

    /// Rooms with members on other nodes.
    pub fn rooms(&self) -> usize {
        self.rooms.len()
    }

    /// Tables kept (one per node and room).
    pub fn tables(&self) -> usize {
        self.rooms.values().map(BTreeMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(user: &str, device: &str) -> Member {
        Member::new(user, device)
    }

    fn set(members: &[Member]) -> BTreeSet<Member> {
        members.iter().cloned().collect()
    }

    #[test]
    fn tabs_of_one_user_and_device_count_once() {
        let mut local = LocalMembers::<u64>::new();
        // (action, conn, member, changed, distinct, connections)
        let steps: &[(&str, u64, Member, bool, usize, usize)] = &[
            ("join", 1, m("ann", "web"), true, 1, 1),
            ("join", 2, m("ann", "web"), false, 1, 2),
            ("join", 3, m("ann", "phone"), true, 2, 3),
            ("join", 3, m("ann", "phone"), false, 2, 3),
            ("join", 4, m("bob", "web"), true, 3, 4),
            ("leave", 1, m("ann", "web"), false, 3, 3),
            ("leave", 1, m("ann", "web"), false, 3, 3),
            ("leave", 2, m("ann", "web"), true, 2, 2),
            ("join", 4, m("bob", "phone"), true, 2, 2),
            ("leave", 3, m("ann", "phone"), true, 1, 1),
            ("leave", 4, m("bob", "phone"), true, 0, 0),
        ];
        for (i, (action, conn, member, changed, distinct, connections)) in steps.iter().enumerate()
        {
            let got = match *action {
                "join" => local.join(*conn, member.clone()),
                _ => local.leave(*conn),
            };
            assert_eq!(got, *changed, "step {i}");
            assert_eq!(
                (local.distinct(), local.connections()),
                (*distinct, *connections),
                "step {i}"
            );
        }
        assert!(local.is_empty());
    }

    #[test]
    fn tables_list_members_up_to_the_max() {
        let mut local = LocalMembers::<u64>::new();
        local.join(1, m("b", "web"));
        local.join(2, m("a", "web"));
        local.join(3, m("a", "web"));
        assert_eq!(
            local.table(2),
            NodeTable { count: 2, members: Some(vec![m("a", "web"), m("b", "web")]) }
        );
        assert_eq!(local.table(1), NodeTable { count: 2, members: None });
    }

    #[test]
    fn views_join_nodes() {
        let mut local = LocalMembers::<u64>::new();
        local.join(1, m("a", "web"));
        let listed = |ms: &[Member]| NodeTable { count: ms.len(), members: Some(ms.to_vec()) };
        let counted = |count| NodeTable { count, members: None };
        let cases: Vec<(Vec<NodeTable>, usize, View)> = vec![
            (vec![], 10, View { count: 1, members: Some(set(&[m("a", "web")])) }),
            (
                vec![listed(&[m("a", "web"), m("b", "web")])],
                10,
                View { count: 2, members: Some(set(&[m("a", "web"), m("b", "web")])) },
            ),
            (vec![listed(&[m("a", "web"), m("b", "web")])], 1, View { count: 2, members: None }),
            (vec![listed(&[m("b", "web")]), counted(5)], 10, View { count: 7, members: None }),
        ];
        for (i, (remote, max, want)) in cases.into_iter().enumerate() {
            assert_eq!(view(Some(&local), &remote, max), want, "case {i}");
        }
        assert_eq!(view::<u64>(None, &[], 10), View { count: 0, members: Some(BTreeSet::new()) });
    }

    #[test]
    #[allow(clippy::cloned_ref_to_slice_refs)] // the table reads best with literal lists
    fn diffs_say_what_changed_since_the_last_frame() {
        let listed = |ms: &[Member]| View { count: ms.len(), members: Some(set(ms)) };
        let diff = |count, joined: Option<&[Member]>, left: Option<&[Member]>| {
            Some(Diff {
                count,
                joined: joined.map(<[Member]>::to_vec),
                left: left.map(<[Member]>::to_vec),
            })
        };
        let (a, b, c) = (m("a", "web"), m("b", "web"), m("c", "web"));
        let mut last = LastSent::default();
        let steps: Vec<(View, Option<Diff>)> = vec![
            (listed(&[]), None),
            (listed(&[a.clone()]), diff(1, Some(&[a.clone()]), Some(&[]))),
            (listed(&[a.clone()]), None),
            (listed(&[a.clone(), b.clone()]), diff(2, Some(&[b.clone()]), Some(&[]))),
            (listed(&[b.clone(), c.clone()]), diff(2, Some(&[c.clone()]), Some(&[a.clone()]))),
            (View { count: 3, members: None }, diff(3, None, None)),
            (View { count: 3, members: None }, None),
            (View { count: 4, members: None }, diff(4, None, None)),
            (listed(&[a.clone()]), diff(1, Some(&[a.clone()]), Some(&[]))),
            (listed(&[]), diff(0, Some(&[]), Some(&[a.clone()]))),
            (listed(&[]), None),
        ];
        for (i, (now, want)) in steps.into_iter().enumerate() {
            assert_eq!(last.diff(now), want, "step {i}");
        }
        assert_eq!(last.snapshot(), Diff { count: 0, joined: Some(vec![]), left: Some(vec![]) });
        last.diff(listed(&[b.clone(), c.clone()]));
        assert_eq!(
            last.snapshot(),
            Diff { count: 2, joined: Some(vec![b.clone(), c.clone()]), left: Some(vec![]) }
        );
        last.diff(View { count: 3000, members: None });
        assert_eq!(last.snapshot(), Diff { count: 3000, joined: None, left: None });
        assert_eq!(
            LastSent::default().snapshot(),
            Diff { count: 0, joined: Some(vec![]), left: Some(vec![]) }
        );
        let mut fresh = LastSent::default();
        assert_eq!(fresh.diff(View { count: 2000, members: None }), diff(2000, None, None));
    }

    #[test]
    fn at_most_once_per_interval() {
        let mut throttle = Throttle::new(1000);
        assert_eq!(throttle.changed(0), Throttled::Now);
        throttle.sent(0, true);
        assert_eq!(throttle.changed(10), Throttled::At(1000));
        assert_eq!(throttle.changed(500), Throttled::Wait);
        throttle.sent(1000, true);
        assert_eq!(throttle.changed(1999), Throttled::At(2000));
        // The timer found nothing to send (the change was undone): the next goes at once.
        throttle.sent(2000, false);
        assert_eq!(throttle.changed(2100), Throttled::Now);
        throttle.sent(2100, true);
        assert_eq!(throttle.changed(3100), Throttled::Now);
    }

    #[test]
    fn remote_tables_follow_nodes() {
        let mut remote = RemoteTables::default();
        let t = |ms: &[Member]| NodeTable { count: ms.len(), members: Some(ms.to_vec()) };
        assert!(remote.update("n2", "r1", t(&[m("a", "web")]), 0));
        assert!(!remote.update("n2", "r1", t(&[m("a", "web")]), 10));
        assert!(remote.update("n3", "r1", t(&[m("b", "web")]), 10));
        assert!(remote.update("n3", "r2", NodeTable { count: 5000, members: None }, 10));
        assert_eq!((remote.rooms(), remote.tables()), (2, 3));
        assert_eq!(remote.room("r1").count(), 2);
        let mut changed = remote.remove_node("n3");
        changed.sort();
        assert_eq!(changed, remote_rooms(&["r1", "r2"]));
        assert_eq!((remote.rooms(), remote.tables()), (1, 1));
        assert!(remote.update("n2", "r1", NodeTable::default(), 20));
        assert!(!remote.update("n2", "r1", NodeTable::default(), 20));
        assert_eq!(remote.rooms(), 0);
    }

    fn remote_rooms(rooms: &[&str]) -> Vec<Arc<str>> {
        rooms.iter().map(|r| Arc::from(*r)).collect()
    }

    #[test]
    fn dead_nodes_leave() {
        let mut remote = RemoteTables::default();
        let t = NodeTable { count: 1, members: Some(vec![m("a", "web")]) };
        remote.update("n2", "r1", t.clone(), 0);
        remote.update("n3", "r1", t.clone(), 2000);
        remote.update("n3", "r2", t, 2500);
        let alive = |node: &str| node == "n2";
        assert_eq!(remote.sweep(|_| false, 2999, 3000), Vec::<Arc<str>>::new());
        // n2 is alive (heard by liveness): kept however old its last table.
        assert_eq!(remote.sweep(alive, 5000, 3000), Vec::<Arc<str>>::new());
        assert_eq!(remote.sweep(alive, 5500, 3000), remote_rooms(&["r1", "r2"]));
        assert_eq!(remote.tables(), 1);
    }
}
