//! One client connection as a machine: its subscriptions ([`Subscriptions`]), the bound on
//! what is held for it ([`Outbox`]), its rate buckets and strikes (`core::rules::limits`), its
//! requests waiting for an answer (reads from rooms, publishes waiting to be durable), its
//! heartbeat deadline, its close and the grace before a slow consumer is closed (4009).
//!
//! In the quinn-proto form: the driver (the connection's actor) calls a method for each
//! thing that happened (a client message, a room's answer, a timer), with the time and
//! the bytes held for the connection as parameters, then carries out what [`Connection::poll`]
//! returns: frames to write, requests to make, timers to arm, counters to bump. Nothing
//! here reads a clock, writes to a socket, logs or counts a metric; what happened is told
//! through [`Action`]s. `R` is whatever handle the driver keeps for a room.
//!
//! The machine is shared with the rooms that write its windows from their own threads
//! (behind the driver's lock): [`Connection::route_window`] decides there whether a window
//! is written at once or posted behind what waits in the connection's mailbox.
//!
//! What holds, whatever the order of inputs (checked with the room's machine by the simulation
//! in `core::delivery::sim`):
//! - nothing is asked of a room, written or read for a request after the close began
//!   (only [`Action::Stop`] and [`Action::Leave`] follow [`Action::Close`]);
//! - a connection held at or over its bound for [`Outbox`]'s grace is evicted and closed
//!   as a slow consumer, and a timer is armed for the end of each grace;
//! - requests waiting for an answer are counted, and with too many the socket is not read;
//! - a refused message is a strike, and one strike over `max_bad_messages` in a minute
//!   closes with a policy violation.

use std::collections::VecDeque;
use std::sync::Arc;

mod io;

pub use self::io::{Action, Ask, Ending, Grants, Pending, Refusal, Route, Settings, Timer};
use super::outbox::{Outbox, Verdict, GRACE_MS};
use super::subscriptions::{Addressed, Answer, Answered, Subscriptions, WindowPlan};
use crate::core::rules::limits::{self, burst_for, room_start_burst, Strikes, TokenBucket};
use crate::core::rules::names;

/// `limit` of a `history` request that names none.
pub const HISTORY_DEFAULT_LIMIT: usize = 100;
/// A connection's publishes waiting to be durable; more are refused (`rate_limited`),
/// so a client cannot pile up appends even with `max_messages_per_sec = 0`.
pub const MAX_PUBLISHES_IN_FLIGHT: usize = 64;

/// A bug planted on purpose, to show the simulation finds it (tests only).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Plant {
    #[default]
    None,
    /// Over the bound for the whole grace, the connection is kept open.
    GraceNeverEnds,
    /// A room writes its window at once even while updates wait in the mailbox.
    WriteOvertakes,
}

pub struct Connection<R> {
    subs: Subscriptions<R>,
    grants: Grants,
    /// Shared by the connections of one kind (the driver keeps one copy per kind).
    settings: Arc<Settings>,
    /// Client messages allowed now.
    message_rate: TokenBucket,
    /// Rooms this connection may start now.
    room_starts: TokenBucket,
    strikes: Strikes,
    outbox: Outbox,
    /// A [`Timer::Grace`] is armed.
    grace_armed: bool,
    /// Whether the client has subscribed to a room (the automatic inbox not counted).
    subscribed_once: bool,
    /// Publishes not answered yet (at most [`MAX_PUBLISHES_IN_FLIGHT`]).
    publishing: usize,
    /// History and presence reads not answered yet.
    reading: usize,
    last_heard_ms: u64,
    /// Our Close went out or the client's came in.
    closing: bool,
    actions: VecDeque<Action<R>>,
    #[cfg(test)]
    pub(crate) plant: Plant,
}

impl<R> Connection<R> {
    /// A connection opened at `now_ms`.
    pub fn new(grants: Grants, settings: impl Into<Arc<Settings>>, now_ms: u64) -> Self {
        let settings = settings.into();
        let inbox = names::inbox_room(&grants.user).into();
        let subs = Subscriptions::new(inbox, grants.device.clone(), settings.max_subscriptions);
        let room_burst =
            room_start_burst(settings.max_room_starts_per_sec, settings.max_subscriptions);
        Connection {
            subs,
            message_rate: TokenBucket::new(burst_for(settings.max_messages_per_sec), now_ms),
            room_starts: TokenBucket::new(room_burst, now_ms),
            strikes: Strikes::default(),
            outbox: Outbox::new(settings.max_outbox_bytes, GRACE_MS),
            grace_armed: false,
            subscribed_once: false,
            publishing: 0,
            reading: 0,
            last_heard_ms: now_ms,
            closing: false,
            actions: VecDeque::new(),
            grants,
            settings,
            #[cfg(test)]
            plant: Plant::None,
        }
    }

    /// The next thing to do.
    pub fn poll(&mut self) -> Option<Action<R>> {
        self.actions.pop_front()
    }

    /// Everything to do so far, in order, as [`poll`](Self::poll) would give it one by
    /// one; the machine keeps no queue's capacity (an idle connection holds none).
    pub fn take_actions(&mut self) -> VecDeque<Action<R>> {
        std::mem::take(&mut self.actions)
    }

    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// The subscriptions, for what only reads them (an SSE cursor, `is_live`).
    pub fn subscriptions(&self) -> &Subscriptions<R> {
        &self.subs
    }

    /// The connection started (its `welcome` is written): the inbox, then the rooms it
    /// names up front (an SSE stream's), then the subscribe deadline.
    /// Each of `initial` comes with whether its room has a live actor here.
    pub fn start(&mut self, initial: Vec<(Ask, bool)>, now_ms: u64) {
        if !self.settings.reads {
            // It can never subscribe later: the deadline does not apply.
            self.subscribed_once = true;
        }
        let generation = self.subs.begin_inbox();
        self.actions
            .push_back(Action::SubscribeInbox { room: self.subs.inbox().clone(), generation });
        self.actions.push_back(Action::Subscriptions(1));
        for (ask, live) in initial {
            self.subscribe(ask, live, now_ms);
        }
        if let Some(after_ms) = self.settings.subscribe_timeout_ms {
            self.actions.push_back(Action::Arm { timer: Timer::SubscribeDeadline, after_ms });
        }
    }

    /// The client was heard from (any frame).
    pub fn heard(&mut self, now_ms: u64) {
        self.last_heard_ms = now_ms;
    }

    /// Whether the next client frame may be read, with `held` bytes held for the
    /// connection: not over the bound nor with too many answers pending. After our Close,
    /// only the client's Close matters, and reading goes on to see it.
    pub fn may_read(&mut self, held: usize, now_ms: impl FnOnce() -> u64) -> bool {
        self.check_outbox(held, now_ms);
        self.closing || self.outbox.may_read(held, self.pending_answers())
    }

    /// Requests whose answers have not come back: reads, and subscribes not answered.
    fn pending_answers(&self) -> usize {
        self.reading + self.subs.unanswered()
    }

    /// A client message (parsed) is about to be handled: `true` when the rate lets it
    /// through; otherwise it is refused (`publish`: it was a publish).
    pub fn admit(
        &mut self,
        publish: bool,
        reference: Option<i64>,
        room: Option<&str>,
        now_ms: u64,
    ) -> bool {
        let rate = self.settings.max_messages_per_sec;
        let Err(wait_ms) = self.message_rate.take(rate, burst_for(rate), now_ms) else {
            return true;
        };
        self.actions.push_back(Action::LimitHit("message_rate"));
        if publish {
            self.actions.push_back(Action::PublishOutcome("rate_limited"));
        }
        let message = format!("more than {rate} messages per second; retry in {wait_ms} ms");
        self.refuse(reference, room, Refusal::RateLimited, message, now_ms);
        false
    }

    /// A refused message the driver answered itself (one it could not parse): a strike.
    pub fn strike(&mut self, now_ms: u64) {
        if self.strikes.strike(self.settings.max_bad_messages, now_ms) {
            self.actions.push_back(Action::LimitHit("bad_messages"));
            self.close(Ending::TooManyRefused, false);
        }
    }

    /// Refuse a request with an error and a strike.
    fn refuse(
        &mut self,
        reference: Option<i64>,
        room: Option<&str>,
        refusal: Refusal,
        message: String,
        now_ms: u64,
    ) {
        self.error(reference, room, refusal, message);
        self.strike(now_ms);
    }

    /// Refuse a request with an error, no strike.
    fn error(
        &mut self,
        reference: Option<i64>,
        room: Option<&str>,
        refusal: Refusal,
        message: String,
    ) {
        let room = room.map(str::to_string);
        self.actions.push_back(Action::Error { reference, room, refusal, message });
    }

    /// Whether this connection may read `room` (`subscribe`, `history`, `presence`);
    /// if not, the error is queued.
    fn readable(&mut self, room: &str, reference: Option<i64>) -> bool {
        let refusal = match names::check_room(room) {
            Err(bad) => Some((Refusal::BadRoom, bad.to_string())),
            Ok(()) if !names::may_read(&self.grants.user, &self.grants.rooms, room) => {
                Some((Refusal::Forbidden, format!("this connection may not read room {room}")))
            }
            Ok(()) => None,
        };
        let Some((refusal, message)) = refusal else { return true };
        self.error(reference, Some(room), refusal, message);
        false
    }

    /// A request to a room with no live actor here starts one: it takes one of the
    /// connection's room starts, and without one it is refused (`rate_limited`, a
    /// strike). A room that stops between this look and the request is started anyway.
    fn may_start_room(
        &mut self,
        room: &str,
        live: bool,
        reference: Option<i64>,
        now_ms: u64,
    ) -> bool {
        let rate = self.settings.max_room_starts_per_sec;
        if rate == 0 || live {
            return true;
        }
        let burst = room_start_burst(rate, self.settings.max_subscriptions);
        let Err(wait_ms) = self.room_starts.take(rate, burst, now_ms) else {
            return true;
        };
        self.actions.push_back(Action::LimitHit("room_starts"));
        let message = format!("more than {rate} new rooms per second; retry in {wait_ms} ms");
        self.refuse(reference, Some(room), Refusal::RateLimited, message, now_ms);
        false
    }

    /// `subscribe` (or a room an SSE stream names); `live`: the room has a live actor here.
    pub fn subscribe(&mut self, ask: Ask, live: bool, now_ms: u64) {
        self.subscribed_once = true;
        let reference = ask.reference;
        if !self.readable(&ask.room, reference) {
            return;
        }
        let room: Arc<str> = ask.room.as_str().into();
        if let Err(too_many) = self.subs.admits(&room) {
            self.actions.push_back(Action::LimitHit("subscriptions"));
            return self.error(
                reference,
                Some(&room),
                Refusal::TooManySubscriptions,
                too_many.to_string(),
            );
        }
        if !self.may_start_room(&room, live, reference, now_ms) {
            return;
        }
        let (generation, replaced) = self.subs.begin(room.clone(), ask.since);
        match replaced {
            Some(old) => self.actions.push_back(Action::Leave {
                room,
                generation: old.generation,
                at: old.room,
            }),
            None => self.actions.push_back(Action::Subscriptions(1)),
        }
        self.actions.push_back(Action::Subscribe { generation, ask });
    }

    /// The room took generation `generation` of the subscribe, and this is its handle.
    pub fn attached(&mut self, room: &str, generation: u64, handle: R) {
        if let Err(stale) = self.subs.attach(room, generation, handle) {
            self.actions.push_back(Action::Leave {
                room: room.into(),
                generation,
                at: Some(stale),
            });
        }
    }

    /// Generation `generation` of the room's subscribe was refused (by the room, or the
    /// room could not be reached): if it is still current it ends, and the client is told.
    pub fn refused(
        &mut self,
        room: &str,
        generation: u64,
        reference: Option<i64>,
        message: String,
    ) {
        if let Some(sub) = self.subs.on_refused(room, generation) {
            self.actions.push_back(Action::Subscriptions(-1));
            self.actions.push_back(Action::Leave {
                room: room.into(),
                generation: sub.generation,
                at: sub.room,
            });
            self.error(reference, Some(room), Refusal::Unavailable, message);
        }
    }

    /// `unsubscribe`.
    pub fn unsubscribe(&mut self, room: String, reference: Option<i64>) {
        if let Err(bad) = names::check_room(&room) {
            return self.error(reference, Some(&room), Refusal::BadRoom, bad.to_string());
        }
        if let Some(sub) = self.subs.end(&room) {
            self.actions.push_back(Action::Subscriptions(-1));
            self.actions.push_back(Action::Leave {
                room: room.as_str().into(),
                generation: sub.generation,
                at: sub.room,
            });
        }
        self.actions.push_back(Action::Unsubscribed { room, reference });
    }

    /// `history`.
    pub fn history(
        &mut self,
        room: String,
        since: u64,
        limit: Option<usize>,
        reference: Option<i64>,
        live: bool,
        now_ms: u64,
    ) {
        if !self.readable(&room, reference) {
            return;
        }
        let max = self.settings.max_history_limit;
        let limit = match limits::history_limit(limit, HISTORY_DEFAULT_LIMIT, max) {
            Ok(limit) => limit,
            Err(too_high) => {
                self.actions.push_back(Action::LimitHit("history_limit"));
                return self.refuse(
                    reference,
                    Some(&room),
                    Refusal::BadRequest,
                    too_high.to_string(),
                    now_ms,
                );
            }
        };
        if !self.may_start_room(&room, live, reference, now_ms) {
            return;
        }
        self.reading += 1;
        self.actions.push_back(Action::ReadHistory { room, since, limit, reference });
    }

    /// `presence`: who is in a room this connection may read.
    pub fn presence(&mut self, room: String, reference: Option<i64>) {
        if !self.readable(&room, reference) {
            return;
        }
        self.reading += 1;
        self.actions.push_back(Action::ReadPresence { room, reference });
    }

    /// A client's `publish`: only to a room the token's publish patterns name (never an
    /// inbox), at most [`MAX_PUBLISHES_IN_FLIGHT`] waiting to be durable.
    pub fn publish(
        &mut self,
        room: String,
        id: Option<String>,
        data: String,
        state: Option<String>,
        reference: Option<i64>,
    ) {
        if let Err(bad) = names::check_room(&room) {
            self.actions.push_back(Action::PublishOutcome("bad_room"));
            return self.error(reference, Some(&room), Refusal::BadRoom, bad.to_string());
        }
        if !names::may_publish(&self.grants.publish, &room) {
            self.actions.push_back(Action::PublishOutcome("forbidden"));
            let message = format!("this connection may not publish to room {room}");
            return self.error(reference, Some(&room), Refusal::Forbidden, message);
        }
        if self.publishing >= MAX_PUBLISHES_IN_FLIGHT {
            self.actions.push_back(Action::PublishOutcome("rate_limited"));
            let message = format!(
                "at most {MAX_PUBLISHES_IN_FLIGHT} publishes may wait to be stored at once"
            );
            return self.error(reference, Some(&room), Refusal::RateLimited, message);
        }
        self.publishing += 1;
        self.actions.push_back(Action::Publish { room, id, data, state, reference });
    }

    /// A read or a publish was answered, and its answer (if any) queued: count it against
    /// the bound and have the reader look again.
    pub fn answered(&mut self, pending: Pending, held: usize, now_ms: impl FnOnce() -> u64) {
        match pending {
            Pending::Read => self.reading = self.reading.saturating_sub(1),
            Pending::Publish => self.publishing = self.publishing.saturating_sub(1),
        }
        self.check_outbox(held, now_ms);
        self.actions.push_back(Action::WakeReader);
    }

    /// How many of a history page's events (their sizes in bytes) to answer with when
    /// the frame around them takes `overhead`: what fits under the bound, at least one.
    pub fn page_fits(
        &self,
        held: usize,
        overhead: usize,
        sizes: impl IntoIterator<Item = usize>,
    ) -> usize {
        self.outbox.page_fits(held, overhead, sizes)
    }

    /// A room answered a subscribe: what to write (`None`: nothing).
    pub fn on_subscribed<E: Addressed + Clone>(
        &mut self,
        answer: Answer<'_, E>,
    ) -> Option<Answered<E>> {
        self.subs.on_subscribed(answer)
    }

    /// A room's window taken off the mailbox: what to write.
    pub fn on_window<E>(
        &mut self,
        room: &str,
        epoch: &Arc<str>,
        events: &[E],
        targeted: bool,
    ) -> WindowPlan<E>
    where
        E: Addressed + Clone,
    {
        self.subs.on_window(room, epoch, events, targeted)
    }

    /// A room's window, on the room's thread, with `waiting` updates the rooms posted
    /// that the connection has not taken yet: written now when the socket may be written
    /// from there and nothing waits (so nothing is overtaken), else posted.
    pub fn route_window<E>(
        &mut self,
        waiting: usize,
        room: &str,
        epoch: &Arc<str>,
        events: &[E],
        targeted: bool,
    ) -> Route<E>
    where
        E: Addressed + Clone,
    {
        #[cfg(test)]
        let waiting = if self.plant == Plant::WriteOvertakes { 0 } else { waiting };
        match self.settings.direct && waiting == 0 {
            true => Route::Write(self.on_window(room, epoch, events, targeted)),
            false => Route::Post,
        }
    }

    /// Whether the room's presence frames are written (its subscription is live).
    pub fn is_live(&self, room: &str) -> bool {
        !self.closing && self.subs.is_live(room)
    }

    /// A room's update was handled and what it wrote queued: a replay, or a frame this
    /// connection rendered itself, may have taken it over the bound.
    pub fn wrote(&mut self, held: usize, now_ms: impl FnOnce() -> u64) {
        self.check_outbox(held, now_ms);
    }

    /// A room found the connection over its bound (4009).
    pub fn slow_consumer(&mut self) {
        self.evict(None);
    }

    fn evict(&mut self, held: Option<usize>) {
        self.actions.push_back(Action::Evict { held });
        self.close(Ending::SlowConsumer, false);
    }

    /// Every byte held for the connection against its bound: over it for the grace,
    /// close with 4009; over it, look again when the grace ends. `now_ms` is asked only
    /// over the bound (this runs before every frame read).
    fn check_outbox(&mut self, held: usize, now_ms: impl FnOnce() -> u64) {
        if self.closing {
            return;
        }
        let now_ms = if self.outbox.full(held) { now_ms() } else { 0 };
        match self.outbox.observe(held, now_ms) {
            Verdict::Under => {}
            Verdict::Over { close_in_ms } => {
                if !self.grace_armed {
                    self.grace_armed = true;
                    self.actions
                        .push_back(Action::Arm { timer: Timer::Grace, after_ms: close_in_ms });
                }
            }
            #[cfg(test)]
            Verdict::Close if self.plant == Plant::GraceNeverEnds => {}
            Verdict::Close => self.evict(Some(held)),
        }
    }

    /// The heartbeat period passed: close a client silent for too long, else ping it.
    pub fn heartbeat(&mut self, held: usize, now_ms: u64) {
        if self.closing {
            return;
        }
        let silent = std::time::Duration::from_millis(now_ms.saturating_sub(self.last_heard_ms));
        let period = std::time::Duration::from_millis(self.settings.heartbeat_ms);
        if limits::client_timed_out(self.settings.reads, silent, period) {
            return self.close(Ending::HeartbeatTimeout, false);
        }
        self.actions.push_back(Action::Ping);
        self.check_outbox(held, || now_ms);
    }

    /// A timer armed by an [`Action::Arm`] fired.
    pub fn on_timer(&mut self, timer: Timer, held: usize, now_ms: u64) {
        match timer {
            Timer::Grace => {
                self.grace_armed = false;
                self.check_outbox(held, || now_ms);
                self.actions.push_back(Action::WakeReader);
            }
            Timer::SubscribeDeadline => {
                if !self.subscribed_once && !self.closing {
                    self.actions.push_back(Action::LimitHit("subscribe_timeout"));
                    self.close(Ending::NoSubscribe, false);
                }
            }
            Timer::CloseHandshake => self.actions.push_back(Action::Stop),
        }
    }

    /// Close: the Close goes out after what is written, nothing after it, and the client's
    /// Close is awaited for `close_handshake_ms`. A second close, or `force`, stops at once.
    pub fn close(&mut self, ending: Ending, force: bool) {
        if self.closing {
            return self.actions.push_back(Action::Stop);
        }
        // The subscriptions first: a room writing from its thread sends nothing after it.
        self.subs.close();
        self.closing = true;
        self.actions.push_back(Action::Close(ending));
        match force {
            true => self.actions.push_back(Action::Stop),
            false => {
                let after_ms = self.settings.close_handshake_ms;
                self.actions.push_back(Action::Arm { timer: Timer::CloseHandshake, after_ms });
            }
        }
    }

    /// The client's Close came in (the driver answers it and stops): nothing more is written.
    pub fn client_closed(&mut self) {
        self.subs.close();
        self.closing = true;
    }

    /// The connection stopped: every subscription ends and is left.
    pub fn stopped(&mut self) {
        self.subs.close();
        self.closing = true;
        let ended: Vec<_> = self.subs.drain().collect();
        if !ended.is_empty() {
            self.actions.push_back(Action::Subscriptions(-(ended.len() as i64)));
        }
        for (room, sub) in ended {
            self.actions.push_back(Action::Leave {
                room,
                generation: sub.generation,
                at: sub.room,
            });
        }
    }
}

#[cfg(test)]
mod tests;
