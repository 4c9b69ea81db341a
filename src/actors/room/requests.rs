//! The messages a room takes. Requests it serves at once, or holds while a read they
//! need is in flight (`core::delivery::holds`): the room's log loading, its live feed being taken
//! again, a subscriber's `since` beyond its head; the room goes on serving the others
//! meanwhile. Each handler tells the room's machine and carries out what it decides.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::{RoomActor, RoomCore, Subscriber, Ticket};
use crate::actors::messages::*;
use crate::cluster::roomlog::LiveItem;
use crate::core::delivery::holds::{Released, RoomNow, Until, AHEAD_WAIT};
use crate::core::delivery::room::{self, seen_beyond_head, Ask, Input};
use crate::world::now_ms;

/// A request the room may hold while a read it needs is in flight (`core::delivery::holds`).
pub(super) enum Request {
    Subscribe(Subscribe),
    Publish(Publish),
    Put(PutState),
    ReadState(oneshot::Sender<Result<StateView, RoomGone>>),
    ReadHistory(ReadHistory, oneshot::Sender<Result<HistoryPage, RoomGone>>),
}

impl RoomCore {
    fn read_state(&self) -> StateView {
        let epoch = self.machine.live().map(|log| log.epoch().into());
        let (seq, data) =
            self.machine.current().map_or((0, None), |state| (state.seq, Some(state.data.clone())));
        StateView { epoch, seq, data }
    }

    fn read_history(&self, msg: ReadHistory) -> HistoryPage {
        match self.machine.live() {
            None => HistoryPage { epoch: None, head: 0, events: Vec::new(), complete: false },
            Some(log) => {
                let (events, complete) = log.read(msg.since, msg.limit);
                let events = events.into_iter().map(|e| e.payload.clone()).collect();
                HistoryPage {
                    epoch: Some(log.epoch().into()),
                    head: log.durable(),
                    events,
                    complete,
                }
            }
        }
    }
}

impl RoomActor {
    /// Serve `request` now, or hold it until what it needs is read (`patient`: a
    /// request whose wait ran out, or that found the room full of held ones, is
    /// answered from what the room has).
    fn serve(&mut self, request: Request, patient: bool, ctx: &mut Context<Self>) {
        let until = if patient { self.must_wait(&request, ctx) } else { None };
        let request = match until {
            Some(until) => match self.core.held.hold(until, request) {
                Ok(()) => return self.arm_release(ctx),
                Err(request) => {
                    let (room, held) = (&self.core.name, self.core.held.len());
                    tracing::debug!(room = %room, held, "room holds all it may: answered at once");
                    request
                }
            },
            None => request,
        };
        self.answer(request, ctx);
    }

    /// What `request` must wait for before it is answered, starting the read it waits
    /// on where there is one (beside the mailbox: the room goes on serving the others).
    fn must_wait(&mut self, request: &Request, ctx: &mut Context<Self>) -> Option<Until> {
        let RoomActor { core, log, .. } = self;
        if core.machine.is_loading() {
            return Some(Until::LoadEnds);
        }
        let shared = log.shared()?;
        if let Request::Publish(_) | Request::Put(_) = request {
            return None;
        }
        if let Request::Subscribe(_) = request {
            // The stored state is read again with backoff: the subscriber waits for
            // it instead of being refused for good.
            if core.machine.is_failed() {
                return Some(Until::Loaded);
            }
        }
        if shared.refeeding(core, ctx) {
            return Some(Until::Fed);
        }
        let Request::Subscribe(msg) = request else {
            return None;
        };
        let ask = Ask { since: msg.since, epoch: msg.epoch.as_deref(), state: msg.state };
        let since =
            msg.since.filter(|_| core.live().is_some_and(|log| seen_beyond_head(log, ask)))?;
        shared.ahead(core, since, ctx);
        Some(Until::Head { since, deadline: Instant::now() + AHEAD_WAIT })
    }

    /// Answer `request` from what the room has now.
    fn answer(&mut self, request: Request, ctx: &mut Context<Self>) {
        let core = &mut self.core;
        match request {
            Request::Subscribe(msg) => {
                core.input(Input::Expire { now_ms: now_ms() });
                let sink =
                    Subscriber { to: msg.to, presence: msg.presence && core.presence.enabled() };
                core.input(Input::Subscribe(room::Subscribe {
                    conn: msg.conn,
                    generation: msg.generation,
                    automatic: msg.automatic,
                    since: msg.since,
                    epoch: msg.epoch,
                    state: msg.state,
                    sink,
                    ticket: Ticket { reference: msg.reference, member: msg.member },
                }));
                self.drive(ctx);
                self.core.presence_poke(ctx);
            }
            Request::Publish(msg) => self.log.common().publish(core, msg, ctx),
            Request::Put(msg) => self.log.common().put_state(core, msg, ctx),
            Request::ReadState(reply) => {
                let _ = reply.send(Ok(core.read_state()));
            }
            Request::ReadHistory(msg, reply) => {
                core.input(Input::Expire { now_ms: now_ms() });
                let _ = reply.send(Ok(core.read_history(msg)));
            }
        }
        self.drive(ctx);
    }

    /// Serve the held requests whose wait is over.
    pub(super) fn release_held(&mut self, ctx: &mut Context<Self>) {
        if self.core.held.is_empty() {
            return;
        }
        let fed = self.log.shared().is_none_or(|shared| shared.fed());
        let machine = &self.core.machine;
        let room = RoomNow {
            loading: machine.is_loading(),
            loaded: machine.is_live(),
            fed,
            head: machine.durable_head(),
        };
        for (request, why) in self.core.held.release(room, Instant::now()) {
            self.serve(request, why == Released::Ready, ctx);
        }
        self.drive(ctx);
        self.arm_release(ctx);
    }

    /// A timer for the held requests' next deadline (one at a time, the earliest).
    fn arm_release(&mut self, ctx: &mut Context<Self>) {
        let Some(at) = self.core.held.next_deadline() else {
            return;
        };
        if self.release_at.is_some_and(|armed| armed <= at) {
            return;
        }
        self.release_at = Some(at);
        ctx.run_later(at.saturating_duration_since(Instant::now()), move |room, ctx| {
            if room.release_at == Some(at) {
                room.release_at = None;
            }
            room.settle(ctx);
        });
    }

    /// Every request starts here: a stopped room sends the caller back to the rooms
    /// table, a live one counts the request as activity. So does a room whose home moved
    /// since its log was read, when the rooms table has not told it yet ([`HomeMoved`]
    /// follows the homes): it stops as if told, and the caller's next actor reads the
    /// room where it moved. Served, a publish would be appended under the new home by a
    /// room that answers with the old epoch, or not answered at all once it is told.
    fn admit(&mut self, ctx: &mut Context<Self>) -> Result<(), RoomGone> {
        let moved = match self.log.shared() {
            Some(shared) if !self.core.machine.is_stopped() => shared.moved_away(&self.core),
            _ => None,
        };
        if let Some(to) = moved {
            self.home_moved(to, ctx);
        }
        self.core.admit()
    }

    /// The room's home moved to cell `to`: its subscribers are told to resume there and
    /// the room stops.
    fn home_moved(&mut self, to: Arc<str>, ctx: &mut Context<Self>) {
        if self.core.machine.is_stopped() {
            return;
        }
        self.core.moved_to = Some(to.clone());
        self.core.input(Input::Moved);
        self.drive(ctx);
        tracing::info!(room = %self.core.name, to = %to, "room moved to another cell: subscribers closed to resume there");
        ctx.stop();
    }

    /// Serve a request that came in a message (after the room admitted it).
    fn request(&mut self, request: Request, ctx: &mut Context<Self>) {
        self.serve(request, true, ctx);
        self.drive(ctx);
    }
}

impl Handler<Publish> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: Publish, ctx: &mut Self::Context) -> Self::Result {
        self.admit(ctx)?;
        self.request(Request::Publish(msg), ctx);
        Ok(())
    }
}

/// A subscribe waits, held by the room (never in its mailbox), while the room loads or
/// its stored state cannot be read, while it takes its live feed again, and while its
/// `since` is beyond the room's head (at most [`AHEAD_WAIT`]).
impl Handler<Subscribe> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: Subscribe, ctx: &mut Self::Context) -> Self::Result {
        self.admit(ctx)?;
        self.request(Request::Subscribe(msg), ctx);
        Ok(())
    }
}

impl Handler<PutState> for RoomActor {
    type Result = Result<(), RoomGone>;

    fn handle(&mut self, msg: PutState, ctx: &mut Self::Context) -> Self::Result {
        self.admit(ctx)?;
        self.request(Request::Put(msg), ctx);
        Ok(())
    }
}

/// A request answered once the room serves it (maybe after holding it): a room that
/// stopped meanwhile sends the caller back to the rooms table.
fn answered<T: 'static>(
    reply: oneshot::Receiver<Result<T, RoomGone>>,
) -> ResponseFuture<Result<T, RoomGone>> {
    Box::pin(async move { reply.await.unwrap_or(Err(RoomGone)) })
}

impl Handler<ReadState> for RoomActor {
    type Result = ResponseFuture<Result<StateView, RoomGone>>;

    fn handle(&mut self, _msg: ReadState, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        match self.admit(ctx) {
            Ok(()) => self.request(Request::ReadState(reply), ctx),
            Err(gone) => drop(reply.send(Err(gone))),
        }
        answered(answer)
    }
}

impl Handler<ReadHistory> for RoomActor {
    type Result = ResponseFuture<Result<HistoryPage, RoomGone>>;

    fn handle(&mut self, msg: ReadHistory, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        match self.admit(ctx) {
            Ok(()) => self.request(Request::ReadHistory(msg, reply), ctx),
            Err(gone) => drop(reply.send(Err(gone))),
        }
        answered(answer)
    }
}

/// The room's live feed (cluster mode), while it holds one.
impl StreamHandler<LiveItem> for RoomActor {
    fn handle(&mut self, item: LiveItem, ctx: &mut Self::Context) {
        let Some(shared) = self.log.shared() else {
            return;
        };
        self.core.settings.metrics.cluster_live_copies.inc();
        match item {
            LiveItem::Event(event) => shared.live_event(&mut self.core, event, ctx),
            LiveItem::State(state, version) if self.core.machine.is_live() => {
                let state = StateAt { seq: state.seq, data: state.data.into() };
                shared.live_state(&mut self.core, LiveState { state, version })
            }
            LiveItem::State(..) => {}
        }
        self.settle(ctx);
    }

    /// The feed ends with the node's NATS connection (the node is stopping); the room
    /// goes on without it.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

impl Handler<HomeMoved> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: HomeMoved, ctx: &mut Self::Context) {
        self.home_moved(msg.to, ctx);
    }
}

impl Handler<Resync> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: Resync, ctx: &mut Self::Context) {
        ctx.run_later(msg.after, |room, ctx| {
            if let Some(shared) = room.log.shared() {
                shared.catch_up(&mut room.core, ctx);
            }
            room.settle(ctx);
        });
    }
}

impl Handler<CloseWindow> for RoomActor {
    type Result = ();

    fn handle(&mut self, _msg: CloseWindow, ctx: &mut Self::Context) {
        self.core.input(Input::SendWindowNow);
        self.drive(ctx);
    }
}

impl Handler<Unsubscribe> for RoomActor {
    type Result = ();

    fn handle(&mut self, msg: Unsubscribe, ctx: &mut Self::Context) {
        self.core.input(Input::Unsubscribe { conn: msg.conn, generation: msg.generation });
        self.drive(ctx);
        let RoomActor { core, log, .. } = self;
        core.held.retain(|held| !matches!(held, Request::Subscribe(w) if w.conn == msg.conn && w.generation <= msg.generation));
        if let Some(shared) = log.shared() {
            shared.subscribers_changed(core, ctx);
        }
        core.presence_poke(ctx);
        self.drive(ctx);
    }
}

impl Handler<ReadPresence> for RoomActor {
    type Result = Result<Result<crate::core::delivery::presence::View, PresenceOff>, RoomGone>;

    fn handle(&mut self, _msg: ReadPresence, ctx: &mut Self::Context) -> Self::Result {
        self.admit(ctx)?;
        Ok(self.core.presence.view(&self.core.name))
    }
}

impl Handler<PresenceChanged> for RoomActor {
    type Result = ();

    fn handle(&mut self, _msg: PresenceChanged, ctx: &mut Self::Context) {
        self.core.presence.remote_changed();
        self.core.presence_poke(ctx);
    }
}
