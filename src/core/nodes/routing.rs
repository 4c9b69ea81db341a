//! Routing as pure functions: same inputs give the same answer in any process, whatever
//! the order or repetition of the inputs. No I/O, no clock, no global state.
//!
//! - [`route`]: which node serves a session — the recorded owner while it is alive and
//!   not draining, else a rendezvous choice that spreads; a session that must move goes
//!   to the nodes of the newest release first ([`release_first`]); [`route_session`] is
//!   its short form for peers that never drain.
//! - [`home_cell`]: a user's home cell — the token's `cell` claim, else the rendezvous
//!   choice over the **configured** cells. Data, never health: no node's or cell's state
//!   is an input, so a failure never re-homes anyone.
//! - [`route_cell`]: which cell serves a user — the home cell while healthy, else the
//!   first healthy cell by name; several reports of one cell are AND-merged.
//! - [`room_writer`]: which node appends a room's events in cluster mode — the candidate
//!   with the highest hash of (room, node) (rendezvous hashing: when a node leaves, only
//!   its rooms move).

pub use super::placement::rendezvous;
use super::placement::{self, Load, Usable};
use std::collections::BTreeMap;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum RouteError {
    #[error("session id is empty")]
    EmptySession,
    #[error("no owner candidates")]
    NoOwners,
    #[error("an owner candidate has an empty name")]
    EmptyOwnerName,
    #[error("no alive owner")]
    NoAliveOwner,
    /// No cell has a node that may serve the session; names the user's home cell.
    #[error("no healthy cell (the user's home cell is {home})")]
    NoHealthyCell { home: String },
}

/// For this long after a node starts, a client that says it could not reach it (`avoid`)
/// is believed without charge: it was restarting. Its sessions' moves are forced.
pub const RESTART_GRACE_MS: u64 = 10_000;

/// The start-time fallback of [`release_first`], for candidates that all carry the same
/// release label: a node started within this long counts as one a release in progress
/// brought. Three minutes: one release step at the default drain timings takes about a
/// minute from the new node's start to the last reconnect of the drained node's clients
/// (start, readiness, `minReadySeconds` 10, `drain_wait_secs` 15, `drain_spread_secs` 5,
/// `drain_grace_secs` 30), and only the step's own new node must still count; a node that
/// (re)started for another reason draws the moving sessions for three minutes at most,
/// never for the migration window (ten minutes by default) nor for days.
pub const RELEASE_FALLBACK_WINDOW_MS: u64 = 180_000;

/// A node routing may choose, as this node sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub cell: &'a str,
    /// Probed or heard alive now.
    pub alive: bool,
    /// Draining: it keeps its connections but takes no new ones.
    pub draining: bool,
    /// When it started (0: unknown).
    pub started_at_ms: u64,
    /// The release it belongs to (`release`; empty from a node that does not say). For
    /// sessions that must move, the newest release's nodes rank first ([`release_first`]).
    pub release: &'a str,
    /// Its connections against its capacity, as it reports them (`None`: not said).
    /// New and moving sessions avoid a node over the high-water mark and go in
    /// proportion to headroom (`core::nodes::placement`).
    pub load: Option<Load>,
}

/// What is asked of [`route`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteQuestion<'a> {
    pub session: &'a str,
    pub user: &'a str,
    /// The owner the directory records for the session, if any.
    pub recorded_owner: Option<&'a str>,
    /// A node the client could not reach: not a candidate for this question.
    pub avoid: Option<&'a str>,
    pub now_ms: u64,
    /// With every candidate of one release label: how long after its start a node counts
    /// as part of a release in progress ([`RELEASE_FALLBACK_WINDOW_MS`] in production).
    pub release_window_ms: u64,
    /// The user's home cell ([`home_cell`]); empty: none given, the recorded owner's cell
    /// or the rendezvous choice over the cells (configured, else the candidates').
    pub home: &'a str,
    /// The configured cells: one without a candidate that may serve counts as unhealthy.
    pub cells: &'a [&'a str],
    /// Cells whose breaker is not closed (`core::nodes::breaker::CellBreakers::broken`): unhealthy
    /// whatever their nodes' liveness says.
    pub broken: &'a [&'a str],
    /// The share of its capacity (thousandths) at which a node takes no new or moving
    /// sessions (`core::nodes::placement::over_high_water`); 0: no mark.
    pub high_water_permille: u64,
}

/// Why [`route`] chose its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The recorded owner, alive and not draining: the session stays.
    Owner,
    /// No recorded owner (a new session, or one nobody remembers): spread.
    Unowned,
    /// The recorded owner is draining: a move the owner's release forces.
    OwnerDraining,
    /// The recorded owner is not alive (or not a candidate): a move its loss forces.
    OwnerGone,
    /// The recorded owner is alive but the client could not reach it: a move the route
    /// did not choose (the migration budget applies).
    OwnerAvoided,
}

impl Reason {
    /// Whether moving the session here is forced on it (never refused by the budget).
    pub fn forced(self) -> bool {
        matches!(self, Reason::OwnerDraining | Reason::OwnerGone)
    }

    /// Whether a move for this reason is charged to the user's migration budget: only
    /// one the route did not choose. A forced move, or one of a session recorded under a
    /// name no node has, never is.
    pub fn charged(self) -> bool {
        self == Reason::OwnerAvoided
    }
}

/// The node that serves a session, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routed<'a> {
    pub node: &'a str,
    pub cell: &'a str,
    pub reason: Reason,
}

/// Where a session is served: the rule every node applies, so any two nodes with the
/// same view of the candidates give the same answer, whatever the order of the inputs.
///
/// 1. The cell: the user's home cell (`question.home`; without one, the recorded owner's
///    cell when the owner is a known candidate, else the user's rendezvous cell), so the
///    answer does not depend on which node is asked; while that cell has no node that may
///    serve, the first healthy cell by name ([`route_cell`]). The home is never replaced:
///    a fallback lasts while the home has no such node.
/// 2. The recorded owner keeps the session while it is alive, not draining and not
///    avoided, in whichever cell it is (a session is not moved by another cell's health).
/// 3. Otherwise rendezvous hashing of the session over the cell's alive, non-draining
///    candidates (all alive ones if every one drains), so new sessions and the sessions
///    of a lost node spread, and a node's loss moves only its own sessions; candidates
///    over the high-water mark are left out (unless all are) and the others weighted by
///    headroom when every one reports its load (`core::nodes::placement`). When the
///    session must move (its owner drains, is gone or was avoided), the newest release's
///    candidates rank first ([`release_first`]): during a rolling release, a drained
///    node's sessions go to the nodes the release brought, which it will not drain again.
pub fn route<'a>(
    question: &RouteQuestion<'_>,
    candidates: &[Candidate<'a>],
) -> Result<Routed<'a>, RouteError> {
    if question.session.is_empty() {
        return Err(RouteError::EmptySession);
    }
    if candidates.is_empty() {
        return Err(RouteError::NoOwners);
    }
    if candidates.iter().any(|c| c.name.is_empty()) {
        return Err(RouteError::EmptyOwnerName);
    }
    // One entry per name: alive only if every report says so, draining if any does.
    let mut merged: BTreeMap<&'a str, Candidate<'a>> = BTreeMap::new();
    for candidate in candidates {
        let entry = merged.entry(candidate.name).or_insert(Candidate {
            alive: true,
            draining: false,
            ..*candidate
        });
        entry.alive &= candidate.alive;
        entry.draining |= candidate.draining;
        entry.started_at_ms = entry.started_at_ms.max(candidate.started_at_ms);
        entry.release = entry.release.max(candidate.release);
        entry.cell = entry.cell.min(candidate.cell);
        // Reports of one node's load: the fuller one counts.
        entry.load = match (entry.load, candidate.load) {
            (Some(a), Some(b)) => Some(if b.connections > a.connections { b } else { a }),
            (a, b) => a.or(b),
        };
    }
    // What this question may use: alive, and not the node the client could not reach.
    let usable = |c: &Candidate| c.alive && question.avoid != Some(c.name);
    let owner = question.recorded_owner.and_then(|name| merged.get(name));
    let home: &str = match owner {
        _ if !question.home.is_empty() => question.home,
        Some(owner) => owner.cell,
        None if !question.cells.is_empty() => home_cell(question.user, None, question.cells),
        None => rendezvous(question.user, merged.values().map(|c| c.cell)).unwrap_or_default(),
    };
    let mut reports: Vec<CellReport> = merged
        .values()
        .map(|c| CellReport {
            name: c.cell,
            healthy: merged.values().any(|o| o.cell == c.cell && usable(o)),
        })
        .collect();
    reports.extend(question.broken.iter().map(|cell| CellReport { name: cell, healthy: false }));
    // A configured cell without a candidate: nobody there may serve.
    let unheard = question.cells.iter().filter(|cell| !merged.values().any(|c| c.cell == **cell));
    reports.extend(unheard.map(|cell| CellReport { name: cell, healthy: false }));
    let cell: &'a str = if merged.values().all(|c| c.cell == home) {
        merged.values().next().map_or("", |c| c.cell)
    } else {
        let chosen = route_cell(question.user, home, &reports)
            .map_err(|_| RouteError::NoHealthyCell { home: home.to_string() })?;
        merged
            .values()
            .map(|c| c.cell)
            .find(|cell| *cell == chosen)
            .expect("a healthy cell has a candidate")
    };
    let just_restarted = |c: &Candidate| {
        c.started_at_ms > 0 && question.now_ms < c.started_at_ms.saturating_add(RESTART_GRACE_MS)
    };
    let reason = match owner {
        // An owner that (re)started moments ago was unreachable to its clients while it
        // restarted: a move away from it is forced, not charged.
        Some(owner)
            if owner.alive
                && !owner.draining
                && question.avoid == Some(owner.name)
                && just_restarted(owner) =>
        {
            Reason::OwnerGone
        }
        Some(owner) if owner.alive && !owner.draining && question.avoid == Some(owner.name) => {
            Reason::OwnerAvoided
        }
        // An owner in a cell whose breaker is open serves nobody: its sessions move, forced.
        Some(owner) if owner.alive && !owner.draining && question.broken.contains(&owner.cell) => {
            Reason::OwnerGone
        }
        Some(owner) if owner.alive && !owner.draining => {
            return Ok(Routed { node: owner.name, cell: owner.cell, reason: Reason::Owner });
        }
        Some(owner) if owner.alive && owner.draining => Reason::OwnerDraining,
        Some(_) => Reason::OwnerGone,
        None if question.recorded_owner.is_some() => Reason::OwnerGone,
        None => Reason::Unowned,
    };
    let alive: Vec<&Candidate<'a>> =
        merged.values().filter(|c| c.cell == cell && usable(c)).collect();
    let taking: Vec<&Candidate<'a>> = alive.iter().copied().filter(|c| !c.draining).collect();
    let mut pool = if taking.is_empty() { alive } else { taking };
    if reason != Reason::Unowned {
        // The newest release's nodes, unless every one of them is full while another
        // node has room (then the mark below decides among all).
        let newest = release_first(pool.clone(), question.now_ms, question.release_window_ms);
        let has_room = |c: &&Candidate| {
            !c.load
                .is_some_and(|load| placement::over_high_water(load, question.high_water_permille))
        };
        if newest.iter().any(has_room) || !pool.iter().any(has_room) {
            pool = newest;
        }
    }
    let usable: Vec<Usable<'a>> =
        pool.iter().map(|c| Usable { name: c.name, load: c.load }).collect();
    // A new session: the nodes with the most room (where a handshake would keep it); a
    // moving one: every node below the mark, by headroom, so a drained node's spread.
    let level = (reason == Reason::Unowned)
        .then(|| placement::level(&usable, question.high_water_permille))
        .flatten();
    let pool = match level {
        Some(level) if !level.is_empty() => level,
        _ => placement::below_high_water(&usable, question.high_water_permille),
    };
    let node = placement::choose(question.session, &pool).ok_or(RouteError::NoAliveOwner)?;
    Ok(Routed { node, cell, reason })
}

/// The candidates a session that must move may go to first: the nodes a release in
/// progress brought, which it will not drain again (one move per session per release).
///
/// - When `pool` carries more than one release label, those of the newest release: the
///   label whose earliest-started member started latest (an unknown start counts as the
///   oldest; ties go to the greater label). A node of an old release that restarted
///   lately does not make its release new: its label's earliest member is old.
/// - With one label, the start-time fallback: the candidates started within `window_ms`
///   of `now_ms` ([`RELEASE_FALLBACK_WINDOW_MS`]), when there are any.
/// - Otherwise, or when `pool` is empty, `pool` as it is.
///
/// Order-free: the answer is the same set whatever the order of `pool`.
pub fn release_first<'a, 'c>(
    pool: Vec<&'c Candidate<'a>>,
    now_ms: u64,
    window_ms: u64,
) -> Vec<&'c Candidate<'a>> {
    // Each label's earliest start.
    let mut earliest: BTreeMap<&str, u64> = BTreeMap::new();
    for c in &pool {
        let start = earliest.entry(c.release).or_insert(c.started_at_ms);
        *start = (*start).min(c.started_at_ms);
    }
    if earliest.len() > 1 {
        let newest = earliest
            .iter()
            .max_by_key(|(label, start)| (**start, **label))
            .map(|(label, _)| *label);
        return pool.into_iter().filter(|c| Some(c.release) == newest).collect();
    }
    let fresh =
        |c: &Candidate| c.started_at_ms > 0 && now_ms < c.started_at_ms.saturating_add(window_ms);
    if pool.iter().any(|c| fresh(c)) {
        return pool.into_iter().filter(|c| fresh(c)).collect();
    }
    pool
}

/// The node for `session` among `owners`, as [`route`] answers it for candidates that
/// never drain and started long ago: the recorded owner while it is alive, else the
/// rendezvous choice among the alive owners.
pub fn route_session<'a>(
    session: &str,
    recorded: Option<&str>,
    owners: &[&'a str],
    alive: &[&str],
) -> Result<&'a str, RouteError> {
    let candidates: Vec<Candidate<'a>> = owners
        .iter()
        .map(|name| Candidate {
            name,
            cell: "",
            alive: alive.contains(name),
            draining: false,
            started_at_ms: 0,
            release: "",
            load: None,
        })
        .collect();
    let question = RouteQuestion {
        session,
        user: "",
        recorded_owner: recorded,
        avoid: None,
        now_ms: 0,
        release_window_ms: 0,
        home: "",
        cells: &[],
        broken: &[],
        high_water_permille: 0,
    };
    route(&question, &candidates).map(|routed| routed.node)
}

/// A user's home cell: the `claim` (a token's `cell`) when there is one, else the
/// rendezvous choice of the user over the `configured` cells (empty: none). Nothing about
/// health is an input: a node or a cell going down never changes a user's home; the route
/// falls back instead ([`route_cell`]). The answer ignores the order of `configured`.
pub fn home_cell<'a>(user: &str, claim: Option<&'a str>, configured: &[&'a str]) -> &'a str {
    match claim.filter(|c| !c.is_empty()) {
        Some(claim) => claim,
        None => rendezvous(user, configured.iter().copied()).unwrap_or_default(),
    }
}

/// A room's home cell (where its events are written): the rendezvous choice of the room
/// over the `configured` cells, salted apart from users' so a user and a room of the same
/// name are placed independently. Health is no input: a room never moves by itself, an
/// operator moves it. `None` without cells. The answer ignores the order of `configured`.
pub fn room_home_cell<'a>(room: &str, configured: &[&'a str]) -> Option<&'a str> {
    rendezvous(&format!("room\u{0}{room}"), configured.iter().copied())
}

/// Where rooms are homed: the configured cells, and the namespaces (room-name prefixes)
/// whose `home_cell` pins their rooms to a cell. A room takes its namespace's pin (the
/// namespace is the longest prefix the room starts with, as for its other options), else
/// [`room_home_cell`] over the cells.
///
/// A promotion moves every room of a lost cell to another cell ([`RoomHomes::moved`]):
/// the room keeps its *origin* (the cell the configuration homes it in, which names its
/// subjects) and is written in its *home*, where it moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomHomes {
    cells: Vec<String>,
    /// Every namespace's prefix with its pin (`None`: hashed), longest prefix first.
    namespaces: Vec<(String, Option<String>)>,
    /// Promoted cells: origin cell → the cell its rooms moved to.
    moves: BTreeMap<String, String>,
}

/// Why a move of a cell's rooms is refused.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum MoveRefused {
    #[error("cell {0:?} is not one of the configured cells")]
    Unknown(String),
    #[error("a cell's rooms cannot move to the cell itself ({0:?})")]
    ToItself(String),
    #[error("cell {from:?}'s rooms already moved to {to:?}")]
    AlreadyMoved { from: String, to: String },
    #[error("cell {0:?}'s own rooms moved away: it takes no other cell's")]
    ToMovedCell(String),
    #[error("rooms moved to cell {0:?}: it cannot move away itself")]
    FromHostingCell(String),
}

impl RoomHomes {
    pub fn new(cells: Vec<String>, mut namespaces: Vec<(String, Option<String>)>) -> RoomHomes {
        namespaces.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        RoomHomes { cells, namespaces, moves: BTreeMap::new() }
    }

    /// `room`'s home cell, where it is written now: its [origin](RoomHomes::origin), or
    /// the cell the origin's rooms moved to (`None` without cells).
    pub fn home(&self, room: &str) -> Option<&str> {
        let origin = self.origin(room)?;
        Some(self.moved_to(origin).unwrap_or(origin))
    }

    /// Where `cell`'s rooms moved, if a promotion moved them.
    pub fn moved_to(&self, cell: &str) -> Option<&str> {
        self.moves.get(cell).map(String::as_str)
    }

    /// Every move: (origin cell, the cell its rooms moved to), by origin.
    pub fn moves(&self) -> impl Iterator<Item = (&str, &str)> {
        self.moves.iter().map(|(from, to)| (from.as_str(), to.as_str()))
    }

    /// Move `from`'s rooms to `to`. One hop only, and once: a cell hosting moved rooms
    /// does not move itself, nor takes rooms while its own moved away. Yields `false`
    /// when the same move is known already (moves are announced again and again).
    pub fn moved(&mut self, from: &str, to: &str) -> Result<bool, MoveRefused> {
        for cell in [from, to] {
            if !self.cells.iter().any(|c| c == cell) {
                return Err(MoveRefused::Unknown(cell.to_string()));
            }
        }
        if from == to {
            return Err(MoveRefused::ToItself(from.to_string()));
        }
        match self.moved_to(from) {
            Some(known) if known == to => return Ok(false),
            Some(known) => {
                return Err(MoveRefused::AlreadyMoved {
                    from: from.to_string(),
                    to: known.to_string(),
                })
            }
            None => {}
        }
        if self.moves.contains_key(to) {
            return Err(MoveRefused::ToMovedCell(to.to_string()));
        }
        if self.moves.values().any(|host| host == from) {
            return Err(MoveRefused::FromHostingCell(from.to_string()));
        }
        self.moves.insert(from.to_string(), to.to_string());
        Ok(true)
    }

    /// `room`'s origin cell: its namespace's pin, else the hash over the cells (`None`
    /// without cells). It names the room's subjects wherever the room is written.
    pub fn origin(&self, room: &str) -> Option<&str> {
        let pinned = self
            .namespaces
            .iter()
            .find(|(prefix, _)| room.starts_with(prefix.as_str()))
            .and_then(|(_, pin)| pin.as_deref());
        if let Some(pin) = pinned {
            return Some(pin);
        }
        let cells: Vec<&str> = self.cells.iter().map(String::as_str).collect();
        let home = room_home_cell(room, &cells)?;
        self.cells.iter().find(|c| *c == home).map(String::as_str)
    }
}

/// One health report of a cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellReport<'a> {
    pub name: &'a str,
    pub healthy: bool,
}

#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum CellError {
    /// No cell is healthy; the text carries the user id only.
    #[error("no healthy cell for user {user}")]
    NoHealthyCell { user: String },
}

/// The cell for `user` whose home cell is `home` (empty: none).
pub fn route_cell<'a>(
    user: &str,
    home: &str,
    cells: &[CellReport<'a>],
) -> Result<&'a str, CellError> {
    let mut merged: BTreeMap<&'a str, bool> = BTreeMap::new();
    for report in cells {
        let healthy = merged.entry(report.name).or_insert(true);
        *healthy &= report.healthy;
    }
    if let Some((name, true)) = merged.get_key_value(home).map(|(n, h)| (*n, *h)) {
        if !home.is_empty() {
            return Ok(name);
        }
    }
    merged
        .into_iter()
        .find(|(name, healthy)| *healthy && !name.is_empty())
        .map(|(name, _)| name)
        .ok_or_else(|| CellError::NoHealthyCell { user: user.to_string() })
}

/// The node that appends `room`'s events: the candidate whose (room, node) hash is
/// highest, ties broken by name. `None` without candidates.
pub fn room_writer<'a>(room: &str, candidates: &[&'a str]) -> Option<&'a str> {
    rendezvous(room, candidates.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node<'a>(name: &'a str, alive: bool, draining: bool, started_at_ms: u64) -> Candidate<'a> {
        Candidate { name, cell: "", alive, draining, started_at_ms, release: "", load: None }
    }

    fn ask<'a>(session: &'a str, recorded_owner: Option<&'a str>) -> RouteQuestion<'a> {
        RouteQuestion {
            session,
            user: "u1",
            recorded_owner,
            avoid: None,
            now_ms: 1_000_000,
            release_window_ms: 600_000,
            home: "",
            cells: &[],
            broken: &[],
            high_water_permille: 0,
        }
    }

    #[test]
    fn load_table() {
        // a full (95 %), b half, c empty; capacity 1000 each; the mark at 90 %.
        let loaded = |name, connections| Candidate {
            load: Some(Load { connections, capacity: 1000 }),
            ..node(name, true, false, 1)
        };
        let nodes = [loaded("a", 950), loaded("b", 500), loaded("c", 0)];
        fn with_mark<'a>(session: &'a str, owner: Option<&'a str>) -> RouteQuestion<'a> {
            RouteQuestion { high_water_permille: 900, ..ask(session, owner) }
        }
        for i in 0..200 {
            let session = format!("s{i}");
            // The owner keeps its sessions, full or not.
            assert_eq!(route(&with_mark(&session, Some("a")), &nodes).unwrap().node, "a");
            // New sessions: the emptiest (c), b being more than 10 points fuller.
            assert_eq!(
                route(&with_mark(&session, None), &nodes).unwrap().node,
                "c",
                "new {session}"
            );
            // A session whose owner is gone: never the full node; b or c by headroom.
            let moved = route(&with_mark(&session, Some("gone")), &nodes).unwrap();
            assert_ne!(moved.node, "a", "moved {session}");
        }
        // Without the mark the full node may be chosen; every node full: nobody excluded.
        let full = [loaded("a", 950), loaded("b", 990)];
        assert!(route(&with_mark("s", None), &full).is_ok());
        // One node silent about its load: plain rendezvous, as before placement (a node
        // that says it is full would still be left out).
        let silent = [loaded("a", 850), node("b", true, false, 1), loaded("c", 0)];
        let plain =
            [node("a", true, false, 1), node("b", true, false, 1), node("c", true, false, 1)];
        for i in 0..50 {
            let session = format!("s{i}");
            assert_eq!(
                route(&with_mark(&session, None), &silent),
                route(&ask(&session, None), &plain)
            );
        }
    }

    #[test]
    fn session_table() {
        type Case<'a> =
            (&'a str, Option<&'a str>, &'a [&'a str], &'a [&'a str], Result<&'a str, RouteError>);
        let cases: &[Case] = &[
            ("s1", Some("b"), &["a", "b", "c"], &["a", "b", "c"], Ok("b")),
            ("s1", Some("z"), &["c", "b"], &["b", "z"], Ok("b")),
            ("s1", Some("a"), &["a"], &["a"], Ok("a")),
            ("s1", Some("a"), &["b", "b"], &["b"], Ok("b")),
            ("", Some("a"), &["a"], &["a"], Err(RouteError::EmptySession)),
            ("s1", Some("a"), &[], &["a"], Err(RouteError::NoOwners)),
            ("s1", Some("a"), &["a", ""], &["a"], Err(RouteError::EmptyOwnerName)),
            ("s1", Some("a"), &["a", "b"], &[], Err(RouteError::NoAliveOwner)),
            ("s1", None, &["a", "b"], &["c"], Err(RouteError::NoAliveOwner)),
        ];
        for (session, recorded, owners, alive, expected) in cases {
            assert_eq!(
                &route_session(session, *recorded, owners, alive),
                expected,
                "{session} {recorded:?} {owners:?} {alive:?}"
            );
        }
        // Without a live owner, the rendezvous choice among the alive ones.
        for session in ["s1", "s2", "s3", "s4"] {
            let expected = rendezvous(session, ["a", "c"]);
            assert_eq!(
                route_session(session, Some("b"), &["a", "b", "c"], &["a", "c"]).ok(),
                expected
            );
            assert_eq!(route_session(session, None, &["c", "b", "a"], &["c", "a"]).ok(), expected);
        }
    }

    #[test]
    fn reasons_and_the_budget() {
        let all = [node("a", true, false, 1), node("b", true, false, 1), node("c", true, false, 1)];
        let routed = |q: RouteQuestion, nodes: &[Candidate<'static>]| route(&q, nodes).unwrap();
        let kept = routed(ask("s", Some("b")), &all);
        assert_eq!((kept.node, kept.reason), ("b", Reason::Owner));
        assert!(!kept.reason.forced() && !kept.reason.charged());
        let draining = [all[0], node("b", true, true, 1), all[2]];
        let moved = routed(ask("s", Some("b")), &draining);
        assert_eq!(moved.reason, Reason::OwnerDraining);
        assert!(moved.reason.forced() && moved.node != "b");
        let gone = [all[0], node("b", false, false, 1), all[2]];
        let moved = routed(ask("s", Some("b")), &gone);
        assert_eq!(moved.reason, Reason::OwnerGone);
        assert!(moved.reason.forced() && moved.node != "b");
        assert_eq!(
            routed(ask("s", Some("zz")), &all).reason,
            Reason::OwnerGone,
            "an owner nobody knows is gone"
        );
        let avoided = routed(RouteQuestion { avoid: Some("b"), ..ask("s", Some("b")) }, &all);
        assert_eq!(avoided.reason, Reason::OwnerAvoided);
        assert!(!avoided.reason.forced() && avoided.reason.charged() && avoided.node != "b");
        // Avoiding an owner that restarted within the release window: forced (its clients
        // could not reach it while it restarted).
        let restarted = [all[0], node("b", true, false, 1_000_000 - RESTART_GRACE_MS + 1), all[2]];
        assert_eq!(
            routed(RouteQuestion { avoid: Some("b"), ..ask("s", Some("b")) }, &restarted).reason,
            Reason::OwnerGone
        );
        // Avoiding a node that is gone anyway does not make the move optional.
        assert_eq!(
            routed(RouteQuestion { avoid: Some("b"), ..ask("s", Some("b")) }, &gone).reason,
            Reason::OwnerGone
        );
        let new = routed(ask("s", None), &all);
        assert_eq!(new.reason, Reason::Unowned);
        // Every node draining: the owner keeps serving rather than nobody.
        let all_draining = [node("a", true, true, 1), node("b", true, true, 1)];
        assert_eq!(routed(ask("s", Some("b")), &all_draining).node, "b");
    }

    #[test]
    fn sessions_without_a_live_owner_spread_over_three_nodes() {
        let nodes =
            [node("a", true, false, 1), node("b", true, false, 1), node("c", true, false, 1)];
        let mut counts = BTreeMap::new();
        for i in 0..1000 {
            let session = format!("{i:012x}");
            *counts.entry(route(&ask(&session, None), &nodes).unwrap().node).or_insert(0) += 1;
        }
        // 1,000 sessions: a, b, c each get a third, give or take what chance gives.
        assert!(counts.values().all(|n| (280..=390).contains(n)), "uneven: {counts:?}");
        // The same for the sessions of a lost node: they do not pile onto one survivor.
        let without_a = [node("a", false, false, 1), nodes[1], nodes[2]];
        let mut moved = BTreeMap::new();
        for i in 0..1000 {
            let session = format!("{i:012x}");
            let q = ask(&session, Some("a"));
            *moved.entry(route(&q, &without_a).unwrap().node).or_insert(0) += 1;
        }
        assert!(moved.values().all(|n| (420..=580).contains(n)), "uneven failover: {moved:?}");
        eprintln!("1,000 sessions over a, b, c: {counts:?}; with a gone: {moved:?}");
    }

    /// A rolling release as Kubernetes does it: for each old node in turn a new node joins,
    /// then the old one drains and its sessions move. Returns how many moves each session
    /// made. `new_names`: the new nodes have new names; else the old ones restart in place.
    /// The old nodes started at `old_start`; with `labels`, the old nodes carry release
    /// `r1` and the new (or restarted) ones `r2`, else every node carries the same label.
    fn release(sessions: usize, new_names: bool, old_start: u64, labels: bool) -> Vec<usize> {
        let window = RELEASE_FALLBACK_WINDOW_MS;
        let mut now = 10_000_000u64;
        let (old_label, new_label) = if labels { ("r1", "r2") } else { ("same", "same") };
        // (name, draining, started, release)
        let mut nodes: Vec<(String, bool, u64, &str)> =
            ["a", "b", "c"].iter().map(|n| (n.to_string(), false, old_start, old_label)).collect();
        let route_now = |nodes: &[(String, bool, u64, &'static str)],
                         session: &str,
                         owner: Option<&str>,
                         now: u64|
         -> String {
            let candidates: Vec<Candidate> = nodes
                .iter()
                .map(|(n, d, s, r)| Candidate { release: r, ..node(n, true, *d, *s) })
                .collect();
            let q = RouteQuestion {
                session,
                user: "u",
                recorded_owner: owner,
                avoid: None,
                now_ms: now,
                release_window_ms: window,
                home: "",
                cells: &[],
                broken: &[],
                high_water_permille: 0,
            };
            route(&q, &candidates).unwrap().node.to_string()
        };
        let ids: Vec<String> = (0..sessions).map(|i| format!("{i:012x}")).collect();
        let mut owners: Vec<String> = ids.iter().map(|s| route_now(&nodes, s, None, now)).collect();
        let mut moves = vec![0; sessions];
        for (step, old) in ["a", "b", "c"].iter().enumerate() {
            now += 30_000;
            let old_index = nodes.iter().position(|(n, ..)| n == old).unwrap();
            if new_names {
                nodes.push((["d", "e", "f"][step].to_string(), false, now, new_label));
            }
            now += 30_000;
            nodes[old_index].1 = true; // drains
            for (i, id) in ids.iter().enumerate() {
                let to = route_now(&nodes, id, Some(&owners[i]), now);
                if to != owners[i] {
                    moves[i] += 1;
                    owners[i] = to;
                }
            }
            if new_names {
                nodes.remove(old_index);
            } else {
                nodes[old_index] = (old.to_string(), false, now + 5_000, new_label);
                // back, restarted
            }
        }
        moves
    }

    fn histogram(moves: &[usize]) -> BTreeMap<usize, usize> {
        let mut histogram = BTreeMap::new();
        for m in moves {
            *histogram.entry(*m).or_insert(0) += 1;
        }
        histogram
    }

    #[test]
    fn a_release_with_new_names_moves_each_session_at_most_once() {
        // Old nodes up for days: labels or not, each session moves once.
        for labels in [true, false] {
            let moves = release(1000, true, 1, labels);
            assert!(moves.iter().all(|m| *m == 1), "labels {labels}: {:?}", histogram(&moves));
        }
        // Old nodes started a minute before the release (the issue's case): their start
        // cannot tell them from the new ones, their label does.
        let moves = release(1000, true, 10_000_000 - 60_000, true);
        assert!(moves.iter().all(|m| *m == 1), "{:?}", histogram(&moves));
        let unlabelled = histogram(&release(1000, true, 10_000_000 - 60_000, false));
        assert!(
            unlabelled.keys().any(|m| *m > 1),
            "without labels the start time cannot tell: {unlabelled:?}"
        );
        eprintln!("a release a minute after the last, moves per session: with labels {{1: 1000}}, without {unlabelled:?}");
    }

    #[test]
    fn a_release_in_place_moves_each_session_at_most_twice() {
        for labels in [true, false] {
            let moves = release(1000, false, 1, labels);
            let histogram = histogram(&moves);
            assert!(
                moves.iter().all(|m| *m <= 2),
                "labels {labels}, moves per session: {histogram:?}"
            );
            eprintln!("in-place release of a, b, c (labels {labels}): sessions by moves made {histogram:?}");
        }
    }

    fn labelled<'a>(name: &'a str, started_at_ms: u64, release: &'a str) -> Candidate<'a> {
        Candidate { release, ..node(name, true, false, started_at_ms) }
    }

    #[test]
    fn release_first_table() {
        const NOW: u64 = 10_000_000;
        const W: u64 = RELEASE_FALLBACK_WINDOW_MS;
        const DAYS: u64 = 1;
        type Case =
            (&'static str, &'static [(&'static str, u64, &'static str)], &'static [&'static str]);
        let cases: &[Case] = &[
            ("empty", &[], &[]),
            ("one label, all old: all", &[("a", DAYS, "r1"), ("b", DAYS, "r1")], &["a", "b"]),
            ("one label, one fresh: it", &[("a", DAYS, "r1"), ("b", NOW - 1_000, "r1")], &["b"]),
            (
                "one label, fresh until the window ends",
                &[("a", DAYS, ""), ("b", NOW - W + 1, "")],
                &["b"],
            ),
            (
                "one label, the window over: all",
                &[("a", DAYS, ""), ("b", NOW - W, "")],
                &["a", "b"],
            ),
            ("one label, unknown starts: all", &[("a", 0, "r1"), ("b", 0, "r1")], &["a", "b"]),
            (
                "two labels: the later-started one",
                &[("a", DAYS, "r1"), ("b", DAYS, "r1"), ("d", NOW - 1_000, "r2")],
                &["d"],
            ),
            // The issue's case: the old nodes started a minute ago, within any window.
            (
                "two labels, all fresh",
                &[("a", NOW - 60_000, "r1"), ("b", NOW - 60_000, "r1"), ("d", NOW - 5_000, "r2")],
                &["d"],
            ),
            // A new node started long ago is still the new release (a slow rollout).
            (
                "two labels, beyond the window",
                &[("a", DAYS, "r1"), ("d", NOW - 10 * W, "r2"), ("e", NOW - 5 * W, "r2")],
                &["d", "e"],
            ),
            // An old node restarted lately does not make its release the newest.
            (
                "an old node restarted",
                &[("a", DAYS, "r1"), ("b", NOW - 500, "r1"), ("d", NOW - 5_000, "r2")],
                &["d"],
            ),
            (
                "a label's earliest member decides",
                &[("a", 100, "r1"), ("b", NOW - 1, "r1"), ("d", 200, "r2")],
                &["d"],
            ),
            // Unknown starts (earlier builds) and no label (earlier builds) are the oldest.
            ("unlabelled earlier build", &[("a", 0, ""), ("d", NOW - 5_000, "r2")], &["d"]),
            ("equal earliest starts: the greater label", &[("a", 7, "r1"), ("d", 7, "r2")], &["d"]),
        ];
        for (what, pool, want) in cases {
            let candidates: Vec<Candidate> =
                pool.iter().map(|(n, s, r)| labelled(n, *s, r)).collect();
            let mut got: Vec<&str> =
                release_first(candidates.iter().collect(), NOW, W).iter().map(|c| c.name).collect();
            got.sort();
            assert_eq!(got, *want, "{what}");
        }
    }

    #[test]
    fn a_session_that_must_move_goes_to_the_newest_release_and_a_new_one_spreads() {
        const NOW: u64 = 1_000_000;
        let nodes = [
            Candidate { draining: true, ..labelled("a", NOW - 60_000, "r1") },
            labelled("b", NOW - 60_000, "r1"),
            labelled("c", NOW - 60_000, "r1"),
            labelled("d", NOW - 5_000, "r2"),
        ];
        let mut new = BTreeMap::new();
        for i in 0..300 {
            let session = format!("{i:012x}");
            let moved = route(&ask(&session, Some("a")), &nodes).unwrap();
            assert_eq!((moved.node, moved.reason), ("d", Reason::OwnerDraining), "{session}");
            let gone = [Candidate { alive: false, ..nodes[0] }, nodes[1], nodes[2], nodes[3]];
            assert_eq!(
                route(&ask(&session, Some("a")), &gone).unwrap().node,
                "d",
                "{session}: its owner lost"
            );
            *new.entry(route(&ask(&session, None), &nodes).unwrap().node).or_insert(0) += 1;
        }
        assert_eq!(new.len(), 3, "new sessions spread over every node taking them: {new:?}");
    }

    fn cells<'a>(reports: &[(&'a str, bool)]) -> Vec<CellReport<'a>> {
        reports.iter().map(|(name, healthy)| CellReport { name, healthy: *healthy }).collect()
    }

    #[test]
    fn cell_table() {
        let none = |user: &str| Err(CellError::NoHealthyCell { user: user.into() });
        let cases: &[(&str, &[(&str, bool)], Result<&str, CellError>)] = &[
            ("eu", &[("eu", true), ("us", true)], Ok("eu")),
            ("eu", &[("us", true), ("eu", false), ("ap", true)], Ok("ap")),
            ("eu", &[("eu", true), ("eu", false), ("us", true)], Ok("us")),
            ("eu", &[("eu", true), ("eu", true)], Ok("eu")),
            ("", &[("us", true), ("ap", true)], Ok("ap")),
            ("mars", &[("us", true)], Ok("us")),
            ("eu", &[("eu", false), ("us", false)], none("u1")),
            ("eu", &[], none("u1")),
        ];
        for (home, reports, expected) in cases {
            assert_eq!(
                &route_cell("u1", home, &cells(reports)),
                expected,
                "home {home} {reports:?}"
            );
        }
        let err = route_cell("user-42", "eu", &[]).unwrap_err();
        assert_eq!(err.to_string(), "no healthy cell for user user-42");
        assert!(matches!(err, CellError::NoHealthyCell { .. }));
    }

    #[test]
    fn home_table() {
        let three = ["east", "north", "west"];
        // The claim wins, configured or not (the backend owns it; HTTP checks it).
        assert_eq!(home_cell("u1", Some("west"), &three), "west");
        assert_eq!(home_cell("u1", Some(""), &["east"]), "east", "an empty claim is no claim");
        assert_eq!(home_cell("u1", None, &[]), "", "no cells, no home");
        assert_eq!(home_cell("u1", None, &["east"]), "east");
        for i in 0..200 {
            let user = format!("user-{i}");
            let home = home_cell(&user, None, &three);
            assert_eq!(home, rendezvous(&user, three).unwrap());
            assert_eq!(
                home_cell(&user, None, &["west", "east", "north"]),
                home,
                "order must not matter"
            );
        }
        // Users spread over the cells.
        let mut per_cell = BTreeMap::new();
        for i in 0..900 {
            *per_cell.entry(home_cell(&format!("user-{i}"), None, &three)).or_insert(0) += 1;
        }
        assert!(per_cell.values().all(|n| (230..=370).contains(n)), "uneven homes: {per_cell:?}");
    }

    fn in_cell<'a>(name: &'a str, cell: &'a str, alive: bool) -> Candidate<'a> {
        Candidate { name, cell, alive, draining: false, started_at_ms: 1, release: "", load: None }
    }

    /// The cells east, north, west; nodes a (east), b (north), c and d (west).
    #[test]
    fn three_cells_table() {
        const CELLS: &[&str] = &["east", "north", "west"];
        let up = |a: bool, b: bool, c: bool, d: bool| {
            vec![
                in_cell("a", "east", a),
                in_cell("b", "north", b),
                in_cell("c", "west", c),
                in_cell("d", "west", d),
            ]
        };
        let ask_home =
            |home: &'static str| RouteQuestion { home, cells: CELLS, user: "u", ..ask("s", None) };
        type Case = (&'static str, [bool; 4], Result<&'static str, RouteError>);
        let cases: &[Case] = &[
            // Home healthy: home.
            ("west", [true, true, true, true], Ok("west")),
            ("north", [true, true, true, true], Ok("north")),
            ("west", [false, false, true, false], Ok("west")),
            // Home down: the first healthy cell by name, never a re-homing by hash.
            ("west", [true, true, false, false], Ok("east")),
            ("east", [false, true, true, true], Ok("north")),
            ("north", [false, false, true, true], Ok("west")),
            // A configured cell with no node at all is not healthy.
            ("south", [true, true, true, true], Ok("east")),
            (
                "west",
                [false, false, false, false],
                Err(RouteError::NoHealthyCell { home: "west".into() }),
            ),
        ];
        for (home, [a, b, c, d], expected) in cases {
            let routed = route(&ask_home(home), &up(*a, *b, *c, *d)).map(|r| r.cell);
            assert_eq!(&routed, expected, "home {home}, alive {:?}", [a, b, c, d]);
        }
        // The same answer over 20 calls, and from every order of the inputs.
        let nodes = up(true, true, false, false);
        for i in 0..20 {
            let mut shuffled = nodes.clone();
            shuffled.rotate_left(i % nodes.len());
            assert_eq!(route(&ask_home("west"), &shuffled).unwrap().cell, "east");
        }
        // An owner alive in the fallback cell keeps its session when home is back.
        let back = up(true, true, true, true);
        let kept =
            route(&RouteQuestion { recorded_owner: Some("a"), ..ask_home("west") }, &back).unwrap();
        assert_eq!((kept.node, kept.cell, kept.reason), ("a", "east", Reason::Owner));
        // Its session moves when the owner is gone: home first.
        let gone = up(false, true, true, true);
        let moved =
            route(&RouteQuestion { recorded_owner: Some("a"), ..ask_home("west") }, &gone).unwrap();
        assert_eq!((moved.cell, moved.reason), ("west", Reason::OwnerGone));
        let err = RouteError::NoHealthyCell { home: "west".into() };
        assert_eq!(err.to_string(), "no healthy cell (the user's home cell is west)");
    }

    /// A cell whose breaker is open is unhealthy though its nodes are alive: the route
    /// falls back, an owner there loses its sessions (forced), and the home never changes.
    #[test]
    fn a_broken_cell_is_unhealthy_while_its_nodes_live() {
        const CELLS: &[&str] = &["east", "north", "west"];
        let all = vec![
            in_cell("a", "east", true),
            in_cell("b", "north", true),
            in_cell("c", "west", true),
            in_cell("d", "west", true),
        ];
        let ask = |home: &'static str, broken: &'static [&'static str]| RouteQuestion {
            home,
            cells: CELLS,
            broken,
            user: "u",
            ..ask("s", None)
        };
        let cases: &[(&str, &[&str], Result<&str, RouteError>)] = &[
            ("west", &[], Ok("west")),
            ("west", &["west"], Ok("east")),
            ("west", &["east", "west"], Ok("north")),
            ("east", &["north"], Ok("east")),
            ("west", &["west", "west"], Ok("east")),
            (
                "west",
                &["east", "north", "west"],
                Err(RouteError::NoHealthyCell { home: "west".into() }),
            ),
        ];
        for (home, broken, expected) in cases {
            assert_eq!(
                &route(&ask(home, broken), &all).map(|r| r.cell),
                expected,
                "home {home}, broken {broken:?}"
            );
        }
        let moved =
            route(&RouteQuestion { recorded_owner: Some("c"), ..ask("west", &["west"]) }, &all)
                .unwrap();
        assert_eq!((moved.cell, moved.reason), ("east", Reason::OwnerGone));
        assert!(moved.reason.forced() && !moved.reason.charged());
        let kept =
            route(&RouteQuestion { recorded_owner: Some("a"), ..ask("west", &["north"]) }, &all)
                .unwrap();
        assert_eq!(
            (kept.node, kept.reason),
            ("a", Reason::Owner),
            "another cell's breaker moves nobody"
        );
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-e]{1,2}"
    }

    proptest! {
        #[test]
        fn route_ignores_order_and_duplicates(
            recorded in proptest::option::of(name()),
            nodes in proptest::collection::vec((name(), "[xy]", any::<bool>(), any::<bool>(), 0u64..3, "(|r1|r2)"), 1..7),
            avoid in proptest::option::of(name()),
            seed in any::<u64>(),
        ) {
            let candidates: Vec<Candidate> = nodes
                .iter()
                .map(|(name, cell, alive, draining, started, release)| Candidate { name, cell, alive: *alive, draining: *draining, started_at_ms: started * 500_000, release, load: None })
                .collect();
            let q = RouteQuestion { session: "s", user: "u", recorded_owner: recorded.as_deref(), avoid: avoid.as_deref(), now_ms: 1_000_000, release_window_ms: 600_000, home: "", cells: &[], broken: &[], high_water_permille: 0 };
            let expected = route(&q, &candidates);
            let mut shuffled = candidates.clone();
            shuffled.rotate_left(seed as usize % candidates.len());
            shuffled.reverse();
            prop_assert_eq!(route(&q, &shuffled), expected.clone());
            if let Ok(routed) = expected {
                let chosen: Vec<&Candidate> = candidates.iter().filter(|c| c.name == routed.node).collect();
                prop_assert!(chosen.iter().all(|c| c.alive), "chose a node not alive: {:?}", routed);
                prop_assert!(avoid.as_deref() != Some(routed.node), "chose the avoided node: {:?}", routed);
                if routed.reason == Reason::Owner {
                    prop_assert_eq!(Some(routed.node), recorded.as_deref());
                }
            }
        }

        /// Whatever the nodes' starts and labels: `release_first` keeps a non-empty part of
        /// a non-empty pool, the same whatever the order; with several labels all it keeps
        /// carry the one whose earliest member started latest, and nothing is dropped
        /// from a pool of one label that nobody started within the window.
        #[test]
        fn release_first_keeps_the_newest_release(
            nodes in proptest::collection::vec(("[a-h]", 0u64..2_000_000, "(|r1|r2|r3)"), 1..8),
            now in 0u64..2_000_000,
            window in 0u64..1_000_000,
            seed in any::<u64>(),
        ) {
            let names: Vec<String> = nodes.iter().enumerate().map(|(i, (n, ..))| format!("{n}{i}")).collect();
            let candidates: Vec<Candidate> = nodes.iter().zip(&names).map(|((_, start, release), name)| labelled(name, *start, release)).collect();
            let kept: Vec<&str> = release_first(candidates.iter().collect(), now, window).iter().map(|c| c.name).collect();
            prop_assert!(!kept.is_empty());
            let mut shuffled: Vec<&Candidate> = candidates.iter().collect();
            shuffled.rotate_left(seed as usize % candidates.len());
            shuffled.reverse();
            let mut again: Vec<&str> = release_first(shuffled, now, window).iter().map(|c| c.name).collect();
            let mut sorted = kept.clone();
            sorted.sort();
            again.sort();
            prop_assert_eq!(&again, &sorted);
            let labels: std::collections::BTreeSet<&str> = candidates.iter().map(|c| c.release).collect();
            let earliest = |label: &str| candidates.iter().filter(|c| c.release == label).map(|c| c.started_at_ms).min().unwrap();
            if labels.len() > 1 {
                let chosen = candidates.iter().find(|c| c.name == kept[0]).unwrap().release;
                prop_assert!(kept.iter().all(|k| candidates.iter().any(|c| c.name == *k && c.release == chosen)));
                prop_assert_eq!(kept.len(), candidates.iter().filter(|c| c.release == chosen).count());
                prop_assert!(labels.iter().all(|l| earliest(l) <= earliest(chosen)), "{} is not the newest of {:?}", chosen, labels);
            } else if !candidates.iter().any(|c| c.started_at_ms > 0 && now < c.started_at_ms + window) {
                prop_assert_eq!(kept.len(), candidates.len());
            }
        }

        /// A rolling release with new names and labels, at any pace and whatever the old
        /// nodes' start: every session moves once, never twice.
        #[test]
        fn a_labelled_release_moves_every_session_once(
            old_nodes in 2usize..5,
            old_start in 1u64..9_000_000,
            step_ms in 1_000u64..600_000,
            sessions in proptest::collection::vec("[0-9a-f]{6}", 1..40),
        ) {
            let old_names: Vec<String> = (0..old_nodes).map(|i| format!("old{i}")).collect();
            let new_names: Vec<String> = (0..old_nodes).map(|i| format!("new{i}")).collect();
            let mut now = 9_000_000u64;
            // (name, draining, started, label)
            let mut nodes: Vec<(&str, bool, u64, &str)> = old_names.iter().map(|n| (n.as_str(), false, old_start, "r1")).collect();
            let route_now = |nodes: &[(&str, bool, u64, &str)], session: &str, owner: Option<&str>, now: u64| -> String {
                let candidates: Vec<Candidate> = nodes.iter().map(|(n, d, s, r)| Candidate { release: r, ..node(n, true, *d, *s) }).collect();
                let q = RouteQuestion { session, user: "u", recorded_owner: owner, avoid: None, now_ms: now, release_window_ms: RELEASE_FALLBACK_WINDOW_MS, home: "", cells: &[], broken: &[], high_water_permille: 0 };
                route(&q, &candidates).unwrap().node.to_string()
            };
            let mut owners: Vec<String> = sessions.iter().map(|s| route_now(&nodes, s, None, now)).collect();
            let mut moves = vec![0; sessions.len()];
            for step in 0..old_nodes {
                now += step_ms;
                nodes.push((new_names[step].as_str(), false, now, "r2"));
                now += step_ms;
                let old = nodes.iter().position(|(n, ..)| *n == old_names[step]).unwrap();
                nodes[old].1 = true;
                for (i, session) in sessions.iter().enumerate() {
                    let to = route_now(&nodes, session, Some(&owners[i]), now);
                    if to != owners[i] {
                        moves[i] += 1;
                        owners[i] = to;
                    }
                }
                nodes.remove(old);
            }
            prop_assert!(moves.iter().all(|m| *m == 1), "moves per session: {:?}", moves);
        }

        #[test]
        fn cell_route_ignores_order_and_duplicates(
            home in name(),
            reports in proptest::collection::vec((name(), any::<bool>()), 0..8),
        ) {
            let owned: Vec<CellReport> = reports.iter().map(|(n, h)| CellReport { name: n, healthy: *h }).collect();
            let expected = route_cell("u", &home, &owned);
            let mut shuffled = owned.clone();
            shuffled.reverse();
            shuffled.extend(owned.iter().filter(|r| r.healthy).cloned());
            prop_assert_eq!(route_cell("u", &home, &shuffled), expected.clone());
            if let Ok(cell) = expected {
                prop_assert!(owned.iter().filter(|r| r.name == cell).all(|r| r.healthy));
            }
        }
    }

    proptest! {
        /// A user's home is configuration: under any health of any nodes, the route
        /// answers the home while a node there may serve, else the first cell by name that
        /// has one; never another cell chosen by hash. And the answer ignores input order.
        #[test]
        fn a_users_home_never_changes_with_health(
            user in "[a-z0-9]{1,8}",
            claim in proptest::option::of("(east|north|west|south)"),
            nodes in proptest::collection::vec(("[a-f]", "(east|north|west)", any::<bool>(), any::<bool>()), 1..8),
            health in proptest::collection::vec(any::<bool>(), 8),
            breakers in proptest::collection::vec(any::<bool>(), 4),
            seed in any::<u64>(),
        ) {
            let configured = ["east", "north", "west", "south"];
            // Cells whose breaker is open: health, never a home.
            let broken: Vec<&str> = configured.iter().zip(&breakers).filter(|(_, open)| **open).map(|(cell, _)| *cell).collect();
            let broken_reversed: Vec<&str> = broken.iter().rev().copied().collect();
            let mut reversed = configured;
            reversed.reverse();
            let home = home_cell(&user, claim.as_deref(), &configured);
            prop_assert_eq!(home, home_cell(&user, claim.as_deref(), &reversed));
            prop_assert!(configured.contains(&home));
            // A node's name says its cell: one name, one cell.
            let names: Vec<String> = nodes.iter().map(|(name, cell, ..)| format!("{name}-{cell}")).collect();
            let candidates: Vec<Candidate> = nodes
                .iter()
                .zip(&names)
                .zip(&health)
                .map(|(((_, cell, alive, draining), name), flip)| Candidate { name, cell, alive: *alive && *flip, draining: *draining, started_at_ms: 0, release: "", load: None })
                .collect();
            let q = RouteQuestion { user: &user, home, cells: &configured, broken: &broken, ..ask("s", None) };
            let answer = route(&q, &candidates);
            let mut shuffled = candidates.clone();
            shuffled.rotate_left(seed as usize % candidates.len());
            shuffled.reverse();
            prop_assert_eq!(route(&RouteQuestion { cells: &reversed, broken: &broken_reversed, ..q }, &shuffled), answer.clone());
            // AND-merged: a name reported dead once is dead; a broken cell is unhealthy,
            // unless every candidate is in the home cell (nowhere to fall back).
            let only_home = candidates.iter().all(|c| c.cell == home);
            let healthy = |cell: &str| {
                (only_home || !broken.contains(&cell))
                    && candidates.iter().any(|c| c.cell == cell && candidates.iter().filter(|o| o.name == c.name).all(|o| o.alive))
            };
            let mut by_name: Vec<&str> = configured.to_vec();
            by_name.sort();
            let expected = if healthy(home) { Some(home) } else { by_name.into_iter().find(|cell| healthy(cell)) };
            match (answer, expected) {
                (Ok(routed), Some(cell)) => prop_assert_eq!(routed.cell, cell),
                (Err(_), None) => {}
                (answer, expected) => prop_assert!(false, "home {home}: {answer:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn a_rooms_home_cell_is_stable_order_free_and_spread() {
        let cells = ["eu", "us", "ap"];
        let mut homed = std::collections::BTreeMap::new();
        for i in 0..300 {
            let room = format!("room-{i}");
            let home = room_home_cell(&room, &cells).expect("a home");
            assert_eq!(room_home_cell(&room, &["ap", "eu", "us"]), Some(home), "order-free");
            assert_eq!(room_home_cell(&room, &cells), Some(home), "stable");
            *homed.entry(home).or_insert(0) += 1;
        }
        assert!(homed.values().all(|&n| n > 60), "every cell homes rooms: {homed:?}");
        assert_eq!(room_home_cell("r", &[]), None);
    }

    #[test]
    fn a_rooms_namespace_pins_its_home_and_the_longest_prefix_decides() {
        let homes = RoomHomes::new(
            vec!["eu".into(), "us".into()],
            vec![
                ("chat:".into(), Some("us".into())),
                ("chat:eu:".into(), None),
                ("score:".into(), Some("eu".into())),
            ],
        );
        let cells = ["eu", "us"];
        let cases: &[(&str, Option<&str>)] = &[
            ("chat:lobby", Some("us")),
            ("score:final", Some("eu")),
            ("chat:eu:7", room_home_cell("chat:eu:7", &cells)),
            ("news", room_home_cell("news", &cells)),
        ];
        for (room, want) in cases {
            assert_eq!(homes.home(room), *want, "{room}");
        }
        assert_eq!(RoomHomes::default().home("x"), None);
    }

    #[test]
    fn a_promotion_moves_every_room_of_its_cell_once_and_one_hop_only() {
        let mut homes = RoomHomes::new(
            vec!["a".into(), "b".into(), "c".into()],
            vec![("eu:".into(), Some("b".into()))],
        );
        let rooms_of = |homes: &RoomHomes, cell: &str| {
            (0..200)
                .map(|i| format!("r{i}"))
                .filter(|r| homes.origin(r) == Some(cell))
                .collect::<Vec<_>>()
        };
        let of_b = rooms_of(&homes, "b");
        assert!(!of_b.is_empty());
        assert_eq!(homes.moved("b", "a"), Ok(true));
        for room in of_b.iter().map(String::as_str).chain(["eu:1"]) {
            assert_eq!((homes.origin(room), homes.home(room)), (Some("b"), Some("a")), "{room}");
        }
        let of_c = rooms_of(&homes, "c");
        assert!(of_c.iter().all(|r| homes.home(r) == Some("c")), "other cells' rooms stay");
        let cases: &[(&str, &str, Result<bool, MoveRefused>)] = &[
            ("b", "a", Ok(false)),
            ("b", "c", Err(MoveRefused::AlreadyMoved { from: "b".into(), to: "a".into() })),
            ("c", "b", Err(MoveRefused::ToMovedCell("b".into()))),
            ("a", "c", Err(MoveRefused::FromHostingCell("a".into()))),
            ("c", "c", Err(MoveRefused::ToItself("c".into()))),
            ("x", "a", Err(MoveRefused::Unknown("x".into()))),
            ("c", "x", Err(MoveRefused::Unknown("x".into()))),
        ];
        for (from, to, want) in cases {
            assert_eq!(homes.moved(from, to), *want, "{from} → {to}");
        }
        assert_eq!(homes.moves().collect::<Vec<_>>(), vec![("b", "a")]);
        assert_eq!(homes.moved("c", "a"), Ok(true), "a cell may host several");
    }

    #[test]
    fn room_writers_are_stable_and_move_only_the_lost_nodes_rooms() {
        assert_eq!(room_writer("r", &[]), None);
        assert_eq!(room_writer("r", &["a"]), Some("a"));
        let all = ["a", "b", "c"];
        let rooms: Vec<String> = (0..300).map(|i| format!("room:{i}")).collect();
        let mut per_node = std::collections::BTreeMap::new();
        for room in &rooms {
            let writer = room_writer(room, &all).unwrap();
            assert_eq!(room_writer(room, &["c", "a", "b"]), Some(writer), "order must not matter");
            *per_node.entry(writer).or_insert(0) += 1;
            let without_b = room_writer(room, &["a", "c"]).unwrap();
            if writer != "b" {
                assert_eq!(without_b, writer, "{room} moved although its writer stayed");
            }
        }
        assert!(per_node.values().all(|n| (60..=140).contains(n)), "uneven spread: {per_node:?}");
    }
}
