//! A room's log in cluster mode: the room's JetStream subject. The room loads the
//! retained events when it starts, appends one event at a time with the stream's
//! expected-sequence guard (catching up and retrying when another node wrote first),
//! and takes other nodes' events from the live feed ([`LiveEvent`]), reading the stream
//! to fill any gap. An event is delivered only once the stream stored it. A state rides
//! in its event's message, then the writer stores it as the room's latest-state record
//! (`PUT`s too, queued between appends); other nodes take those records from the live
//! feed in the state stream's order. What to do next is decided by `core::delivery::append`'s
//! [`Pipeline`]; this file carries it out with NATS and the room.
//!
//! Interest-based fan-out: the room subscribes to its own live subjects before it reads
//! the stream, keeps them while it has subscribers (and [`FEED_LINGER`] after), and drops
//! them then (`core::delivery::interest`). A room without its feed subscribes again and reads what
//! it missed before it answers a subscribe or a read, which it holds meanwhile
//! (`core::delivery::holds`) while it goes on serving publishes and its other subscribers. An
//! inbox whose subscribers are parked (no actor) is watched by the rooms table through
//! [`StreamRoomLogs`]'s `watch_parked`, which wakes it for its next event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::StreamExt;

use super::{
    id_key, later, publish_key, render, spawn_then, Frames, Log, LogPart, ParkedWatch, RoomActor,
    RoomCore, RoomLog, RoomLogs, SharedLog,
};
use crate::actors::messages::*;
use crate::cluster::roomlog::{
    self, AppendError, Appended, LiveFeed, LiveItem, LoadedRoom, StoredState, StreamEvent,
};
use crate::cluster::{Cluster, ClusterError};
use crate::core::delivery::append::{Action, Outcome, Pipeline, Reply, Sequenced};
use crate::core::delivery::interest::{Interest, Verdict, FEED_LINGER};
use crate::core::delivery::room::Input;
use crate::core::delivery::seqlog::{Entry, SeqLog};
use crate::core::nodes::lag::FeedLag;
use crate::core::rules::backoff::{Backoff, BackoffPolicy, Jitter};
use crate::store::EventRecord;
use crate::world::{now_ms, random_u64};

/// How a parked inbox's watch retries a subscription NATS refused or did not answer.
const PARKED_WATCH_RETRY: BackoffPolicy = BackoffPolicy {
    first: Duration::from_millis(200),
    max: Duration::from_secs(5),
    jitter: Jitter::Full,
};

/// The cluster's room logs, one JetStream subject per room.
pub struct StreamRoomLogs(pub Cluster);

impl RoomLogs for StreamRoomLogs {
    fn open(&self, _room: &Arc<str>) -> Log {
        Log::Stream(Box::new(StreamLog {
            cluster: self.0.clone(),
            appends: Pipeline::default(),
            announced: 0,
            replay_after: None,
            interest: Interest::default(),
            feed: None,
            check_armed: false,
            lag: FeedLag::default(),
            home: None,
        }))
    }

    /// Watch the room's live events from a task on the current thread until the watch
    /// is dropped: `wake(after)` for each event (after its seq − 1) and, once subscribed,
    /// for what was stored after `head` meanwhile. A watch that cannot subscribe tries
    /// again with backoff.
    fn watch_parked(
        &self,
        room: &Arc<str>,
        head: Option<u64>,
        wake: Box<dyn Fn(u64)>,
    ) -> Option<ParkedWatch> {
        let (cluster, room) = (self.0.clone(), room.clone());
        let (ready, waiting) = tokio::sync::oneshot::channel();
        let task = actix::spawn(async move {
            let mut retry = Backoff::new(PARKED_WATCH_RETRY);
            // Whoever waits is let go after the first attempt, watched or not: while NATS
            // is away a connection must not wait for it (what it misses, it recovers).
            let mut ready = Some(ready);
            let mut feed = loop {
                let attempt = roomlog::watch(&cluster, &room, false).await;
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                match attempt {
                    Ok(feed) => break feed,
                    Err(error) => {
                        tracing::warn!(room = %room, %error, "could not watch a parked inbox; retrying");
                        actix_web::rt::time::sleep(retry.next_delay(crate::world::random_u64()))
                            .await;
                    }
                }
            };
            if let Some(head) = head {
                match roomlog::last_seq(&cluster, &room).await {
                    Ok(Some(last)) if last > head => wake(head),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(room = %room, %error, "could not read a parked inbox's head; its next event wakes it")
                    }
                }
            }
            while let Some(item) = feed.next().await {
                if let LiveItem::Event(event) = item {
                    wake(event.event.seq.saturating_sub(1));
                }
            }
        });
        Some(ParkedWatch::new(task.abort_handle(), waiting))
    }
}

/// One room's log on its JetStream subject: `core::delivery::append` decides what goes to the
/// stream and when; this carries it out.
pub struct StreamLog {
    cluster: Cluster,
    appends: Pipeline<Publish, PutState, StreamEvent, PublishFailed>,
    /// The newest event seq the room has seen on its feed or read: a subscriber whose
    /// `since` is beyond the head but not beyond this makes the room read what it missed.
    announced: u64,
    /// Parked subscribers adopted for a live event: once loaded, they get the events
    /// after this seq (the live event and any that came while loading).
    replay_after: Option<u64>,
    /// Whether the room holds its live feed ([`crate::core::delivery::interest`]).
    interest: Interest,
    /// The feed's subscription, running in the room's context while it holds one.
    feed: Option<SpawnHandle>,
    /// A timer for the next [`StreamLog::check_interest`] is armed.
    check_armed: bool,
    /// What the room applied when, to read how far behind the stream each event came
    /// (`core::nodes::lag`).
    lag: FeedLag,
    /// The room's home cell when its log was read (cells with their own NATS): its
    /// epoch and sequence are that home's.
    home: Option<String>,
}

impl Sequenced for StreamEvent {
    fn seq(&self) -> u64 {
        self.event.seq
    }
    fn stream_seq(&self) -> u64 {
        self.stream_seq
    }
}

fn entry(room: &str, event: &EventRecord) -> Entry<Arc<Delivery>> {
    Entry { seq: event.seq, payload: render(room, event), id: id_key(event), ts_ms: event.ts_ms }
}

impl LogPart for StreamLog {
    fn part(log: &mut Log) -> Option<&mut Self> {
        match log {
            Log::Stream(stream) => Some(stream.as_mut()),
            _ => None,
        }
    }
}

impl StreamLog {
    fn loaded(
        &mut self,
        room: &mut RoomCore,
        loaded: Result<(LiveFeed, LoadedRoom), ClusterError>,
        ctx: &mut Context<RoomActor>,
    ) {
        match loaded {
            Ok((feed, stored)) => {
                self.attach(feed, ctx);
                let head = stored.events.last().map_or(0, |e| e.event.seq);
                self.announced = self.announced.max(head);
                self.appends
                    .loaded(stored.events.last().map_or(0, |e| e.stream_seq), stored.state_version);
                let name = room.name().clone();
                let entries = stored.events.iter().map(|e| entry(&name, &e.event)).collect();
                let keep = room.retention().max_events;
                if stored.events.len() > keep {
                    // The stream keeps the largest namespace's history; this room keeps its own.
                    let (cluster, name) = (self.cluster.clone(), name.clone());
                    actix::spawn(async move {
                        if let Err(error) =
                            roomlog::purge_beyond(&cluster, &name, keep as u64).await
                        {
                            tracing::warn!(room = %name, %error, "could not delete history beyond the room's size from the stream");
                        }
                    });
                }
                // A record beyond the stream's head belongs to a wiped stream (a new epoch).
                let state = stored.state.filter(|state| state.seq <= head);
                let state =
                    state.map(|StoredState { seq, data }| StateAt { seq, data: data.into() });
                room.loaded(SeqLog::restore(stored.epoch, head, entries, room.retention()), state);
                self.lag.loaded(head, now_ms());
                let adopted = room.machine().members().len();
                tracing::debug!(room = %name, head, adopted, "room loaded from the stream");
                // The only subscribers yet are the adopted ones: requests wait for the load.
                if let Some(after) = self.replay_after.take() {
                    room.input(Input::ReplayAdopted(after));
                }
                // A room loaded for a publish or a read, with nobody subscribed, keeps
                // its feed only for the linger.
                self.check_interest(room, ctx);
            }
            Err(error) => {
                tracing::warn!(room = %room.name(), %error, "room could not be read from the stream; retrying");
                room.input(Input::Failed(error.into()));
                later(
                    ctx,
                    self.appends.load_failed(random_u64()),
                    |stream: &mut StreamLog, room, ctx| {
                        if room.machine().is_failed() && !room.machine().is_stopped() {
                            stream.load(room, ctx);
                        }
                    },
                );
            }
        }
    }

    /// Drop the feed once the room has had no subscriber for [`FEED_LINGER`], checking
    /// again when that is due (one timer at a time).
    fn check_interest(&mut self, room: &RoomCore, ctx: &mut Context<RoomActor>) {
        let watched = !room.machine().members().is_empty() || room.held_subscribes() > 0;
        let now = Instant::now();
        match self.interest.check(watched, now) {
            Verdict::Keep => {}
            Verdict::Drop => {
                if let Some(feed) = self.feed.take() {
                    ctx.cancel_future(feed);
                }
                tracing::debug!(room = %room.name(), linger_ms = FEED_LINGER.as_millis() as u64, "no subscriber here: live feed dropped");
            }
            Verdict::CheckAt(at) if !self.check_armed => {
                self.check_armed = true;
                later(
                    ctx,
                    at.saturating_duration_since(now),
                    |stream: &mut StreamLog, room, ctx| {
                        stream.check_armed = false;
                        stream.check_interest(room, ctx);
                    },
                );
            }
            Verdict::CheckAt(_) => {}
        }
    }

    /// Take the room's live copies from `feed`, in the room's context.
    fn attach(&mut self, feed: LiveFeed, ctx: &mut Context<RoomActor>) {
        self.feed = Some(ctx.add_stream(feed));
        self.interest.started();
    }

    /// Carry out what the machine decides, one action at a time, until it is idle.
    fn drive(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>) {
        while let Some(action) = self.appends.poll(room.live(), room.machine().is_stopped()) {
            match action {
                Action::Append { expected, seq } => self.append(room, expected, seq, ctx),
                Action::WriteState { put, seq } => self.write_state(room, put, seq, ctx),
                Action::CatchUp { after } => {
                    let head = room.live().map_or(0, |log| log.head());
                    tracing::debug!(room = %room.name(), after, head, wanted = self.appends.wanted(), "reading the stream for what the room lacks");
                    self.read_after(room, after, ctx)
                }
                Action::Answer { publish, reply } => answer(room, publish, reply),
                Action::RefusePut(put) => {
                    let _ = put.reply.send(Err(RoomLogError::NotLoaded.into()));
                }
                Action::Deliver(stored) => deliver(room, stored, &mut self.lag),
                Action::SkipAhead { head, next } => {
                    tracing::warn!(room = %room.name(), head, next, "events beyond the stream's retention are gone; skipping ahead");
                    room.input(Input::SkipTo(next - 1));
                }
                Action::RetryCatchUp { after } => {
                    tracing::debug!(room = %room.name(), after_ms = after.as_millis() as u64, wanted = self.appends.wanted(), "reading the stream again later");
                    later(ctx, after, |stream: &mut StreamLog, room, ctx| {
                        stream.catch_up(room, ctx)
                    })
                }
                Action::FillAbandoned { head, wanted } => {
                    tracing::warn!(room = %room.name(), head, wanted, "reads kept ending short of an announced event; left to the room's tick");
                }
            }
        }
    }

    /// Append the publish in flight as event `seq`, if the room's last message is still
    /// `expected`; then store its state as the room's latest-state record.
    fn append(&mut self, room: &RoomCore, expected: u64, seq: u64, ctx: &mut Context<RoomActor>) {
        let front = self.appends.appending().expect("an append is of the publish in flight");
        let record = EventRecord {
            seq,
            id: front.id.to_string(),
            ts_ms: now_ms(),
            data: front.data.to_string(),
            devices: front.devices.clone(),
            from: front.from.clone(),
        };
        let state = front.state.as_deref().map(str::to_string);
        let (cluster, name) = (self.cluster.clone(), room.name().clone());
        let append = async move {
            let result =
                roomlog::append(&cluster, &name, expected, &record, state.as_deref()).await;
            // The event carries its state; the latest-state record, written after it in
            // order (one append at a time), keeps it once the history drops the event.
            let mut version = None;
            if let (Ok(Appended { duplicate: false, .. }), Some(data)) = (&result, &state) {
                let latest = StoredState { seq: record.seq, data: data.clone() };
                match roomlog::write_state(&cluster, &name, &latest).await {
                    Ok(v) => version = Some(v),
                    Err(error) => {
                        tracing::warn!(room = %name, %error, "latest-state record not written; the event keeps the state")
                    }
                }
            }
            (record, state, version, result)
        };
        spawn_then(
            ctx,
            append,
            |stream: &mut StreamLog, room, (record, state, version, result), ctx| {
                if let Some(version) = version {
                    stream.appends.state_recorded(version);
                }
                let outcome = match result {
                    Ok(Appended { stream_seq, duplicate: false }) => {
                        Outcome::Stored(StreamEvent { stream_seq, event: record, state })
                    }
                    Ok(Appended { duplicate: true, .. }) => Outcome::Duplicate,
                    Err(AppendError::Conflict) => {
                        room.metrics().cluster_append_conflicts.inc();
                        Outcome::Conflict
                    }
                    Err(AppendError::Cluster(error)) => {
                        tracing::warn!(room = %room.name(), %error, "append to the stream failed");
                        Outcome::Failed(error.into())
                    }
                };
                stream.appends.appended(outcome);
                stream.drive(room, ctx);
            },
        );
    }

    /// Store `put` as the room's latest-state record at `seq`, and answer it.
    fn write_state(
        &mut self,
        room: &RoomCore,
        put: PutState,
        seq: u64,
        ctx: &mut Context<RoomActor>,
    ) {
        let log = room.live().expect("a state write starts on a live log");
        let state = StoredState { seq, data: put.data.to_string() };
        let epoch: Arc<str> = log.epoch().into();
        let (cluster, name) = (self.cluster.clone(), room.name().clone());
        let write = async move {
            let result = roomlog::write_state(&cluster, &name, &state).await;
            (state, result)
        };
        spawn_then(ctx, write, move |stream: &mut StreamLog, room, (state, result), ctx| {
            match result {
                Ok(version) => {
                    stream.appends.state_written(Some(version));
                    let seq = state.seq;
                    room.input(Input::State(StateAt { seq, data: state.data.into() }));
                    let _ = put.reply.send(Ok(Published { seq, epoch, duplicate: false }));
                }
                Err(error) => {
                    stream.appends.state_written(None);
                    tracing::warn!(room = %room.name(), %error, "state write to the stream failed");
                    let _ = put.reply.send(Err(error.into()));
                }
            }
            stream.drive(room, ctx);
        });
    }

    /// Read what the stream holds after stream sequence `after`.
    fn read_after(&mut self, room: &RoomCore, after: u64, ctx: &mut Context<RoomActor>) {
        let (cluster, name) = (self.cluster.clone(), room.name().clone());
        let read = async move { roomlog::read_after(&cluster, &name, after).await };
        spawn_then(ctx, read, |stream: &mut StreamLog, room, result, ctx| {
            match result {
                Ok(events) => {
                    let (first, last) =
                        (events.first().map(|e| e.event.seq), events.last().map(|e| e.event.seq));
                    tracing::debug!(room = %room.name(), events = events.len(), first, last, wanted = stream.appends.wanted(), "read the stream");
                    stream.appends.caught_up(events, random_u64())
                }
                Err(error) => {
                    tracing::warn!(room = %room.name(), %error, "catching up from the stream failed; retrying");
                    stream.appends.catch_up_failed(PublishFailed::from(error), random_u64());
                }
            }
            stream.drive(room, ctx);
        });
    }
}

/// Answer a publish (a stored one with the room's epoch).
fn answer(room: &RoomCore, publish: Publish, reply: Reply<PublishFailed>) {
    let result = match reply {
        Reply::Stored { seq, duplicate } => {
            let Some(log) = room.live() else { return };
            Ok(Published { seq, epoch: log.epoch().into(), duplicate })
        }
        Reply::NotLoaded => Err(RoomLogError::NotLoaded.into()),
        Reply::Contended => Err(PublishFailed::Contended),
        Reply::Failed(failed) => Err(failed),
    };
    let _ = publish.reply.send(result);
}

/// The room's next event, stored by the stream: into the room's log, and to its
/// subscribers; how late it came is read into `lag` and reported.
fn deliver(room: &mut RoomCore, stored: StreamEvent, lag: &mut FeedLag) {
    let seq = stored.event.seq;
    let payload = render(room.name(), &stored.event);
    let Ok(log) = room.live_mut() else { return };
    if log.append_sequenced(seq, id_key(&stored.event), stored.event.ts_ms, payload.clone()).is_ok()
    {
        let now = now_ms();
        room.report_lag(lag.applied(seq, stored.event.ts_ms, now), now);
        if let Some(data) = stored.state {
            room.input(Input::State(StateAt { seq, data: data.into() }));
        }
        room.input(Input::Durable(vec![payload]));
    }
}

impl RoomLog for StreamLog {
    fn load(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>) {
        room.input(Input::Loading);
        self.home = self.cluster.room_home(room.name());
        let (cluster, name) = (self.cluster.clone(), room.name().clone());
        // Requests that need the log are held until the room is loaded (the mailbox
        // is not). The feed comes first, so nothing stored between the read and the
        // subscription is missed.
        let load = async move {
            let feed = roomlog::watch(&cluster, &name, true).await?;
            Ok((feed, roomlog::load(&cluster, &name).await?))
        };
        spawn_then(ctx, load, |stream: &mut StreamLog, room, loaded, ctx| {
            stream.loaded(room, loaded, ctx)
        });
    }

    fn publish(&mut self, room: &mut RoomCore, msg: Publish, ctx: &mut Context<RoomActor>) {
        let log = match room.live_mut() {
            Ok(log) => log,
            Err(why) => {
                let _ = msg.reply.send(Err(why.into()));
                return;
            }
        };
        self.appends.publish(publish_key(&msg), msg, log);
        self.drive(room, ctx);
    }

    /// The stream keeps the newest event (it holds the room's head): only a log emptied
    /// by age is purged from it, down to that one.
    fn trimmed(&mut self, room: &RoomCore, _first_kept: u64, expired: bool) {
        let Some(log) = room.live() else { return };
        if !expired || log.oldest().is_some() {
            return;
        }
        let (cluster, name) = (self.cluster.clone(), room.name().clone());
        actix::spawn(async move {
            if let Err(error) = roomlog::purge_expired(&cluster, &name).await {
                tracing::warn!(room = %name, %error, "could not delete expired history from the stream");
            }
        });
    }

    fn busy(&self) -> bool {
        self.appends.busy()
    }

    /// The stream's writes are `core::delivery::append`'s: the room's machine asks for none.
    fn carry_out(
        &mut self,
        _room: &mut RoomCore,
        _action: crate::core::delivery::room::Action<Frames>,
        _ctx: &mut Context<RoomActor>,
    ) {
    }

    /// Queued with the publishes: written between appends, as of the head then.
    fn put_state(&mut self, room: &mut RoomCore, msg: PutState, ctx: &mut Context<RoomActor>) {
        if let Err(why) = room.live_mut() {
            let _ = msg.reply.send(Err(why.into()));
            return;
        }
        self.appends.put(msg);
        self.drive(room, ctx);
    }
}

impl SharedLog for StreamLog {
    /// A latest-state record newer than any this room took (the records' stream order
    /// decides, so a late copy never undoes a newer `PUT` at the same seq).
    fn live_state(&mut self, room: &mut RoomCore, live: LiveState) {
        if self.appends.live_state(live.version) {
            room.input(Input::State(live.state));
        }
    }

    fn live_event(
        &mut self,
        room: &mut RoomCore,
        event: StreamEvent,
        ctx: &mut Context<RoomActor>,
    ) {
        self.announced = self.announced.max(event.event.seq);
        self.appends.live_event(event);
        self.drive(room, ctx);
    }

    fn subscribers_changed(&mut self, room: &RoomCore, ctx: &mut Context<RoomActor>) {
        self.check_interest(room, ctx);
    }

    /// Without its feed: subscribe again, read what was stored meanwhile (and the
    /// latest-state record) beside the mailbox; the requests held for it are served when
    /// it is done, whatever it found.
    fn refeeding(&mut self, room: &RoomCore, ctx: &mut Context<RoomActor>) -> bool {
        if !room.machine().is_live() {
            return false;
        }
        if !self.interest.refeed() {
            return self.interest.starting();
        }
        let (cluster, name, after) =
            (self.cluster.clone(), room.name().clone(), self.appends.read_from());
        let refeed = async move {
            let feed = roomlog::watch(&cluster, &name, true).await?;
            let missed = roomlog::read_after(&cluster, &name, after).await?;
            Ok::<_, ClusterError>((feed, missed, roomlog::load_state(&cluster, &name).await?))
        };
        spawn_then(ctx, refeed, |stream: &mut StreamLog, room, result, ctx| {
            match result {
                Ok((feed, missed, record)) => {
                    tracing::debug!(room = %room.name(), missed = missed.len(), "room watched again: live feed back");
                    stream.attach(feed, ctx);
                    if let Some(last) = missed.last() {
                        stream.announced = stream.announced.max(last.event.seq);
                    }
                    stream.appends.caught_up(missed, random_u64());
                    stream.drive(room, ctx);
                    let head = room.live().map_or(0, |log| log.durable());
                    if let Some((state, version)) = record.filter(|(state, _)| state.seq <= head) {
                        stream.live_state(
                            room,
                            LiveState {
                                state: StateAt { seq: state.seq, data: state.data.into() },
                                version,
                            },
                        );
                    }
                }
                Err(error) => {
                    tracing::warn!(room = %room.name(), %error, "could not take the room's live feed again; answering from what it holds");
                    stream.interest.failed();
                }
            }
            stream.check_interest(room, ctx);
        });
        true
    }

    fn fed(&self) -> bool {
        !self.interest.starting()
    }

    /// Only an event the room has seen announced is read for: a `since` beyond every
    /// announced seq costs no read (the live copy may be on its way, and the held
    /// subscriber is answered when it comes or when its wait runs out).
    fn ahead(&mut self, room: &mut RoomCore, since: u64, ctx: &mut Context<RoomActor>) {
        if since <= self.announced {
            self.appends.catch_up();
            self.drive(room, ctx);
        }
    }

    /// Read what the stream holds beyond this node's head, then go on appending.
    fn catch_up(&mut self, room: &mut RoomCore, ctx: &mut Context<RoomActor>) {
        self.appends.catch_up();
        self.drive(room, ctx);
    }

    fn adopted(&mut self, replay_after: Option<u64>) {
        self.replay_after = replay_after;
    }

    /// The homes name another cell than the one the log was read under: a promotion
    /// this node learned before the rooms table told the room ([`HomeMoved`]).
    fn moved_away(&self, room: &RoomCore) -> Option<Arc<str>> {
        let home = self.cluster.room_home(room.name());
        (home != self.home).then(|| home.unwrap_or_default().into())
    }
}
