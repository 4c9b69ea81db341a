//! One actor per live room, the driver of the room's machine (`core::delivery::room::machine`):
//! the machine decides (the room's phase, its window, its subscribers and their
//! eviction, its states, occupancy, idling, the local log's flushes); the actor feeds
//! it what happens ([`RoomCore::input`]) and carries out what it decides
//! ([`RoomActor::drive`]): windows to connections, answers, timers, the log's writes.
//!
//! Where the room's events are kept is the room's [`Log`] ([`log`]), made by the
//! [`RoomLogs`] the wiring chose at start-up: the embedded store ([`local`]) or the
//! room's JetStream subject in cluster mode ([`stream`], whose appends `core::delivery::append`
//! decides). The messages a room takes, and the requests it holds while a read they need
//! is in flight, are in [`requests`]; presence in [`presence`].
//!
//! A room also keeps its state in memory: the latest state whose event is durable, read
//! once with the room. A `state:true` subscribe gets it and the retained events after
//! its seq, on the same ordered channel as a replay.

mod drive;
mod fanout;
pub use fanout::set_threads as set_fanout_threads;
mod load;
mod local;
mod log;
mod occupancy;
mod presence;
mod requests;
mod stream;
mod wire;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use actix::prelude::*;

pub use self::load::RoomLoad;
pub use self::local::LocalRoomLogs;
use self::log::{id_key, later, publish_key, render, spawn_then, LogPart, Pending};
pub use self::log::{Log, ParkedWatch, RoomLog, RoomLogs, SharedLog};
pub use self::occupancy::{DelayedVacate, Occupancy};
pub use self::presence::PresenceHub;
use self::requests::Request;
pub use self::stream::StreamRoomLogs;
pub use self::wire::{Frames, Subscriber, Ticket};
use super::messages::*;
use crate::core::delivery::holds::Holds;
use crate::core::delivery::room::{Input, Limits, RoomMachine};
use crate::core::delivery::seqlog::SeqLog;
use crate::core::rules::limits::Retention;
use crate::core::rules::names;
use crate::world::now_ms;

/// A room's limits: shared by every room, but for what its namespace sets
/// ([`RoomSettings::with_options`]).
#[derive(Clone)]
pub struct RoomSettings {
    pub metrics: Arc<crate::metrics::Metrics>,
    pub retention: Retention,
    pub recovery_max_events: u64,
    /// A room with no subscribers and nothing pending stops after this long.
    pub idle_stop: Duration,
    /// How often a room trims expired history and checks whether it is idle.
    pub tick: Duration,
    /// How long durable events gather before they leave as one frame (0: every flush).
    pub batch_window: Duration,
    /// Whether the room keeps presence (its namespace's `presence`, default true).
    pub presence: bool,
    /// The node's presence: interval, members bound, other nodes' tables.
    pub presence_hub: Arc<PresenceHub>,
    /// Told of the room's local occupancy edges (webhooks); `None` when nobody listens.
    pub occupancy: Option<Arc<dyn Occupancy>>,
}

impl RoomSettings {
    /// These settings with `options` (the room's namespace) for retention, window and
    /// presence.
    pub fn with_options(
        &self,
        options: &crate::core::rules::namespaces::RoomOptions,
    ) -> RoomSettings {
        RoomSettings {
            retention: options.retention(),
            batch_window: options.batch_window(),
            presence: options.presence,
            ..self.clone()
        }
    }
}

/// What a room needs of the table that started it: a place to leave its automatic
/// subscribers when it stops idle. Defined here, implemented by the rooms table, so a room
/// does not know the table's type.
pub trait RoomHome: Send + Sync {
    /// `head`: the room's durable head, the last event its subscribers were sent.
    fn retire(
        self: Arc<Self>,
        room: &Arc<str>,
        addr: &Addr<RoomActor>,
        subscribers: Vec<Parked>,
        head: u64,
    );
}

pub struct RoomActor {
    core: RoomCore,
    log: Log,
    /// When the timer for the held requests' next deadline fires, if one is armed.
    release_at: Option<Instant>,
}

/// The room's machine and what the actor keeps beside it: where to report, presence,
/// and the requests held for a read in flight.
pub struct RoomCore {
    name: Arc<str>,
    settings: RoomSettings,
    home: Weak<dyn RoomHome>,
    machine: RoomMachine<Frames>,
    presence: presence::RoomPresence,
    /// Where the room reports its subscribers and head for the admin overview.
    load: Option<Arc<RoomLoad>>,
    /// Told of the room's occupancy edges (`None` for an inbox, or when nobody listens).
    occupancy: Option<Arc<dyn Occupancy>>,
    /// Requests waiting for a read in flight, while the room serves the others.
    held: Holds<Request>,
    /// Where the room moved ([`HomeMoved`]), for its subscribers.
    moved_to: Option<Arc<str>>,
}

impl RoomActor {
    /// A room kept in `log`; it is read when the actor starts.
    pub fn new(name: Arc<str>, log: Log, settings: RoomSettings, home: Weak<dyn RoomHome>) -> Self {
        let inbox = names::inbox_owner(&name).is_some();
        let limits = Limits {
            retention: settings.retention,
            recovery_max_events: settings.recovery_max_events,
            batch_window: settings.batch_window,
            idle_stop: settings.idle_stop,
        };
        let occupancy = settings.occupancy.clone().filter(|_| !inbox);
        let mut machine = RoomMachine::new(Frames, limits, Instant::now());
        if occupancy.is_none() {
            machine = machine.without_occupancy();
        }
        let core = RoomCore {
            occupancy,
            presence: presence::RoomPresence::new(
                settings.presence_hub.clone(),
                settings.presence && !inbox,
            ),
            name,
            home,
            machine,
            settings,
            load: None,
            held: Holds::default(),
            moved_to: None,
        };
        RoomActor { core, log, release_at: None }
    }

    /// Take over the room's parked subscribers (automatic inbox subscriptions). They get
    /// no `Subscribed`: everything this actor delivers is newer than what they were sent.
    /// `replay_after` names the live event that started the room (cluster mode).
    pub fn adopting(mut self, parked: Vec<Parked>, replay_after: Option<u64>) -> Self {
        if let Some(shared) = self.log.shared().filter(|_| !parked.is_empty()) {
            shared.adopted(replay_after);
        }
        let parked = parked
            .into_iter()
            .map(|p| (p.conn, p.generation, Subscriber { to: p.to, presence: false }));
        self.core.input(Input::Adopt(parked.collect()));
        self
    }

    /// Report the room's subscribers and head to `load` as they change (the admin
    /// overview's busiest rooms).
    pub fn reporting(mut self, load: Option<Arc<RoomLoad>>) -> Self {
        self.core.load = load;
        self
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        let RoomActor { core, log, .. } = self;
        core.input(Input::Expire { now_ms: now_ms() });
        if let Some(shared) = log.shared().filter(|_| !core.machine.members().is_empty()) {
            // A live copy lost while NATS reconnected is found here at the latest.
            shared.catch_up(core, ctx);
        }
        core.machine.prune(|sink| sink.to.connected());
        self.drive(ctx);
        let RoomActor { core, log, .. } = self;
        if let Some(shared) = log.shared() {
            shared.subscribers_changed(core, ctx);
        }
        core.presence_poke(ctx);
        let busy = self.busy();
        self.core.input(Input::CheckIdle { busy });
        self.drive(ctx);
    }

    /// Requests or reads in flight the machine does not see: the room must not stop.
    fn busy(&self) -> bool {
        let log_busy = match &self.log {
            Log::Local(local) => local.busy(),
            Log::Stream(stream) => stream.busy(),
        };
        log_busy || !self.core.held.is_empty() || !self.core.presence.settled()
    }
}

impl RoomCore {
    /// Tell the room's machine what happened, now; the actor carries out what it decides
    /// once the handler or continuation that called this returns.
    pub(super) fn input(&mut self, input: Input<Frames>) {
        self.machine.handle(input, Instant::now());
    }

    /// Every request starts here: a stopped room sends the caller back to the rooms
    /// table, a live one counts the request as activity.
    fn admit(&mut self) -> Result<(), RoomGone> {
        match self.machine.admit(Instant::now()) {
            true => Ok(()),
            false => Err(RoomGone),
        }
    }

    pub(super) fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub(super) fn metrics(&self) -> &crate::metrics::Metrics {
        &self.settings.metrics
    }

    /// How much history the room keeps (its namespace's).
    pub(super) fn retention(&self) -> Retention {
        self.settings.retention
    }

    pub(super) fn machine(&self) -> &RoomMachine<Frames> {
        &self.machine
    }

    /// The room's log, once it is loaded.
    pub(super) fn live(&self) -> Option<&SeqLog<Arc<Delivery>>> {
        self.machine.live()
    }

    /// The room's log to append to, once it is loaded, or why not.
    pub(super) fn live_mut(&mut self) -> Result<&mut SeqLog<Arc<Delivery>>, RoomLogError> {
        self.machine.live_mut()
    }

    /// The log is read: the room answers from `events`, with its state as stored.
    pub(super) fn loaded(&mut self, log: SeqLog<Arc<Delivery>>, state: Option<StateAt>) {
        self.settings.metrics.state_reads.inc();
        self.input(Input::Loaded { log, state });
    }

    /// Subscribes held until a read in flight is done: the room is watched.
    pub(super) fn held_subscribes(&self) -> usize {
        self.held.count(|request| matches!(request, Request::Subscribe(_)))
    }

    /// Tell the load slot how far behind its stream the room applied its last event
    /// (cluster mode, `core::nodes::lag`).
    pub(super) fn report_lag(&self, reading: crate::core::nodes::lag::Reading, now_ms: u64) {
        if let Some(load) = &self.load {
            load.set_lag(reading, now_ms);
        }
    }
}

impl Actor for RoomActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.core.settings.tick, |room, ctx| room.tick(ctx));
        let RoomActor { core, log, .. } = self;
        log.common().load(core, ctx);
        core.input(Input::Started);
        self.settle(ctx);
    }
}

/// A room that ends with explicit subscribers (its arbiter stopped at shutdown) reports
/// it is vacated: nobody is subscribed to it on this node any more.
impl Drop for RoomCore {
    fn drop(&mut self) {
        if let Some(occupancy) = self.occupancy.as_ref().filter(|_| self.machine.occupied()) {
            occupancy.changed(&self.name, false, now_ms());
        }
    }
}
