//! Presence in a room actor and across the node. A room counts its explicit
//! subscribers as members (`core::delivery::presence::LocalMembers`; the automatic inbox
//! subscription is none, and inbox rooms keep no presence); on a change it sends, at
//! most once per `presence_interval_ms` and only when something changed, one presence
//! frame, rendered once, to the subscribers that asked, and in cluster mode its table to
//! the other nodes. [`PresenceHub`] is the node's part: the other nodes' tables of every
//! room (so a node without the room's actor still answers), what this node last sent
//! (for a newcomer's hello), and which room actor to tell when another node's table of
//! its room changed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use parking_lot::Mutex;

use super::{RoomActor, RoomCore};
use crate::actors::messages::{ConnId, PresenceChanged, PresenceFrame, PresenceOff, RoomUpdate};
use crate::cluster::presence::PresenceSender;
use crate::core::delivery::backlog::Reserve;
use crate::core::delivery::presence::{
    self, LastSent, LocalMembers, Member, NodeTable, RemoteTables, Throttle, Throttled, View,
};
use crate::protocol;
use crate::world::now_ms;

/// The node's presence: settings every room shares, the other nodes' tables, and the
/// way to NATS (cluster mode).
pub struct PresenceHub {
    interval_ms: u64,
    members_max: usize,
    sender: Option<PresenceSender>,
    tables: Mutex<HubTables>,
}

#[derive(Default)]
struct HubTables {
    remote: RemoteTables,
    /// What this node last sent of each room with members here (cluster mode).
    local: HashMap<Arc<str>, NodeTable>,
    /// The live actor of each room with members here, told when other nodes' tables change.
    watchers: HashMap<Arc<str>, Addr<RoomActor>>,
}

impl PresenceHub {
    /// `sender`: cluster mode's way to the other nodes; `None` on a single node.
    pub fn new(
        interval: Duration,
        members_max: usize,
        sender: Option<PresenceSender>,
    ) -> Arc<PresenceHub> {
        let interval_ms = interval.as_millis() as u64;
        Arc::new(PresenceHub { interval_ms, members_max, sender, tables: Mutex::default() })
    }

    pub fn members_max(&self) -> usize {
        self.members_max
    }

    /// The room's view from this node's members (`None`: no actor here, so none) and
    /// the other nodes' tables.
    pub fn view(&self, room: &str, local: Option<&LocalMembers<ConnId>>) -> View {
        let tables = self.tables.lock();
        presence::view(local, tables.remote.room(room), self.members_max)
    }

    /// Another node's table of `room`.
    pub fn remote_table(&self, node: &str, room: &str, table: NodeTable) {
        let mut tables = self.tables.lock();
        if tables.remote.update(node, room, table, now_ms()) {
            tables.notify(room);
        }
    }

    /// `node` is gone (liveness declared it dead, or it said goodbye): its members leave.
    pub fn node_gone(&self, node: &str) {
        let mut tables = self.tables.lock();
        let changed = tables.remote.remove_node(node);
        if !changed.is_empty() {
            tracing::info!(
                peer = node,
                rooms = changed.len(),
                "presence: a gone node's members left"
            );
        }
        for room in changed {
            tables.notify(&room);
        }
    }

    /// Drop the tables of nodes neither `alive` nor heard for `timeout_ms`.
    pub fn sweep(&self, alive: impl Fn(&str) -> bool, timeout_ms: u64) {
        let mut tables = self.tables.lock();
        for room in tables.remote.sweep(alive, now_ms(), timeout_ms) {
            tables.notify(&room);
        }
    }

    /// `node` started or reconnected: what it sent before is void, and it needs ours.
    pub fn hello(&self, node: &str) {
        self.node_gone(node);
        self.send_all();
    }

    /// This node's NATS connection came back: ask for the others' tables, send ours.
    pub fn reconnected(&self) {
        if let Some(sender) = &self.sender {
            sender.hello();
            self.send_all();
        }
    }

    /// Cluster mode: say hello once at start.
    pub fn started(&self) {
        if let Some(sender) = &self.sender {
            sender.hello();
        }
    }

    fn send_all(&self) {
        let Some(sender) = &self.sender else { return };
        let tables = self.tables.lock();
        for (room, table) in &tables.local {
            sender.table(room.clone(), table.clone());
        }
    }

    fn clustered(&self) -> bool {
        self.sender.is_some()
    }

    /// This node's members of `room` changed to `table`: tell the other nodes.
    fn send_local(&self, room: &Arc<str>, table: NodeTable) {
        let Some(sender) = &self.sender else { return };
        let mut tables = self.tables.lock();
        if table.count == 0 {
            tables.local.remove(room);
        } else {
            tables.local.insert(room.clone(), table.clone());
        }
        sender.table(room.clone(), table);
    }

    fn watch(&self, room: &Arc<str>, addr: Addr<RoomActor>) {
        self.tables.lock().watchers.insert(room.clone(), addr);
    }

    fn unwatch(&self, room: &str, addr: &Addr<RoomActor>) {
        let mut tables = self.tables.lock();
        if tables.watchers.get(room) == Some(addr) {
            tables.watchers.remove(room);
        }
    }

    /// Rooms with members on other nodes, and tables kept (one per node and room).
    pub fn remote_size(&self) -> (usize, usize) {
        let tables = self.tables.lock();
        (tables.remote.rooms(), tables.remote.tables())
    }
}

impl HubTables {
    fn notify(&self, room: &str) {
        if let Some(addr) = self.watchers.get(room) {
            addr.do_send(PresenceChanged);
        }
    }
}

/// One room's presence.
pub(super) struct RoomPresence {
    hub: Arc<PresenceHub>,
    /// The room keeps presence (its namespace has it on, and it is no inbox).
    enabled: bool,
    members: LocalMembers<ConnId>,
    last: LastSent,
    throttle: Throttle,
    /// Members changed (here or on another node) since the last frame.
    dirty: bool,
    /// What this room last sent the other nodes (cluster mode; `None`: nothing, or 0).
    sent_table: Option<NodeTable>,
    /// Registered with the hub for other nodes' changes.
    watching: bool,
}

impl RoomPresence {
    pub(super) fn new(hub: Arc<PresenceHub>, enabled: bool) -> Self {
        let throttle = Throttle::new(hub.interval_ms);
        RoomPresence {
            hub,
            enabled,
            members: LocalMembers::new(),
            last: LastSent::default(),
            throttle,
            dirty: false,
            sent_table: None,
            watching: false,
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Connection `conn` subscribed (as `member`; `None`: automatically, no member).
    pub(super) fn join(&mut self, conn: ConnId, member: Option<Member>) {
        if !self.enabled {
            return;
        }
        let changed = match member {
            Some(member) => self.members.join(conn, member),
            None => self.members.leave(conn),
        };
        self.dirty |= changed;
    }

    /// Connection `conn`'s subscription ended (nothing if it was no member).
    pub(super) fn leave(&mut self, conn: ConnId) {
        if self.members.leave(conn) {
            self.dirty = true;
        }
    }

    /// Nothing changed since the last frame and table went out (a room stops only then,
    /// so the other nodes never keep members it had).
    pub(super) fn settled(&self) -> bool {
        !self.dirty
    }

    /// Another node's table of the room changed.
    pub(super) fn remote_changed(&mut self) {
        self.dirty |= self.enabled;
    }

    pub(super) fn view(&self, room: &str) -> Result<View, PresenceOff> {
        if !self.enabled {
            return Err(PresenceOff);
        }
        Ok(self.hub.view(room, Some(&self.members)))
    }
}

impl RoomCore {
    /// After anything that may have changed the members: send now, or arm the one timer
    /// for the interval's end, or wait for the timer already armed.
    pub(super) fn presence_poke(&mut self, ctx: &mut Context<RoomActor>) {
        if !self.presence.dirty {
            return;
        }
        let now = now_ms();
        match self.presence.throttle.changed(now) {
            Throttled::Now => self.presence_flush(ctx),
            Throttled::At(at) => {
                ctx.run_later(Duration::from_millis(at.saturating_sub(now)), |room, ctx| {
                    room.core.presence_flush(ctx)
                });
            }
            Throttled::Wait => {}
        }
    }

    /// Send what changed: this node's table to the others (cluster mode) and the frame
    /// to the subscribers that asked.
    fn presence_flush(&mut self, ctx: &mut Context<RoomActor>) {
        let now = now_ms();
        let name = self.name.clone();
        let presence = &mut self.presence;
        presence.dirty = false;
        if !presence.members.is_empty() && !presence.watching && presence.hub.clustered() {
            presence.hub.watch(&name, ctx.address());
            presence.watching = true;
        }
        let mut sent_table = false;
        if presence.hub.clustered() {
            let table = presence.members.table(presence.hub.members_max);
            let before = presence.sent_table.as_ref().map_or(0, |t| t.count);
            if presence.sent_table.as_ref() != Some(&table) && !(table.count == 0 && before == 0) {
                presence.hub.send_local(&name, table.clone());
                presence.sent_table = (table.count > 0).then_some(table);
                sent_table = true;
            }
        }
        let view = presence.hub.view(&name, Some(&presence.members));
        let diff = presence.last.diff(view);
        presence.throttle.sent(now, diff.is_some() || sent_table);
        if presence.members.is_empty() && presence.watching {
            presence.hub.unwatch(&name, &ctx.address());
            presence.watching = false;
        }
        if let Some(diff) = diff {
            let frame = PresenceFrame::new(protocol::presence_frame(&name, &diff));
            for (_, member) in
                self.machine.members().iter().filter(|(_, member)| member.sink.presence)
            {
                send_presence(&name, &member.sink, &frame, &self.settings.metrics);
            }
        }
    }

    /// A subscriber that asked for presence gets, right after `Subscribed`, the room as
    /// of its last frame (every member then in `joined`; null above
    /// `presence_members_max`): the frames after it apply to it as to everyone.
    pub(super) fn presence_snapshot(&mut self, conn: ConnId) {
        let Some(sub) =
            self.machine.members().get(conn).map(|member| &member.sink).filter(|sub| sub.presence)
        else {
            return;
        };
        let frame = PresenceFrame::new(protocol::presence_frame(
            &self.name,
            &self.presence.last.snapshot(),
        ));
        send_presence(&self.name, sub, &frame, &self.settings.metrics);
    }
}

/// One presence frame to one subscriber, its size reserved in the backlog like a
/// window's (a subscriber over its bound is told to close; the room drops it when it
/// unsubscribes, or at the tick).
fn send_presence(
    room: &Arc<str>,
    sub: &super::Subscriber,
    frame: &Arc<PresenceFrame>,
    metrics: &crate::metrics::Metrics,
) {
    match sub.to.backlog().reserve(frame.frame.len()) {
        Reserve::Ok => {
            sub.to.post(RoomUpdate::Presence { room: room.clone(), frame: frame.clone() })
        }
        Reserve::EvictNow => {
            metrics.slow_consumer_closes.inc();
            sub.to.post(RoomUpdate::SlowConsumer);
        }
        Reserve::Evicted => {}
    }
}
