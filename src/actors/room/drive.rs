//! The room actor carrying out what its machine decides: windows and answers to
//! connections, evictions, timers, the log's writes, retiring when idle.

use std::time::Instant;

use actix::prelude::*;

use super::fanout::FanOut;
use super::RoomActor;
use crate::actors::messages::*;
use crate::core::delivery::room::{Action, Input, Timer};
use crate::world::now_ms;

impl RoomActor {
    /// Carry out what the room's machine decided, until it has nothing more.
    pub(super) fn drive(&mut self, ctx: &mut Context<Self>) {
        let mut fan_out = FanOut::default();
        while let Some(action) = self.core.machine.poll() {
            // A frame's windows come one after another: gathered, and handed out
            // together before whatever follows them.
            let action = match action {
                Action::Window { sink, window } => {
                    fan_out.add(sink.to, window);
                    continue;
                }
                action => action,
            };
            fan_out.hand_out(&self.core.name);
            let core = &mut self.core;
            let name = &core.name;
            match action {
                Action::Subscribed { conn, generation, sink, ticket, epoch, answer, state } => {
                    if let Some(why) = answer.refused {
                        tracing::debug!(room = %name, ?why, "recovery refused");
                    }
                    let (head, recovered, replay) = (answer.head, answer.recovered, answer.replay);
                    let (room, reference) = (name.clone(), ticket.reference);
                    let update = RoomUpdate::Subscribed {
                        room,
                        epoch,
                        head,
                        recovered,
                        replay,
                        reference,
                        generation,
                        state,
                    };
                    sink.to.post(update);
                    core.presence.join(conn, ticket.member);
                    core.presence_snapshot(conn);
                }
                Action::Refused { generation, sink, ticket, why } => {
                    let (room, reference, message) =
                        (name.clone(), ticket.reference, why.to_string());
                    sink.to.post(RoomUpdate::Refused { room, reference, message, generation });
                }
                Action::Window { .. } => {} // gathered above
                // The windows before it were handed out just now, written to the
                // sockets that had room (queued behind for the others): the fan-out
                // ends now, and the next window opens from here.
                Action::ReportWritten => core.input(Input::WindowWritten),
                Action::Evict { conn, sink, outstanding } => {
                    tracing::info!(room = %name, conn, outstanding, "slow consumer evicted");
                    core.settings.metrics.slow_consumer_closes.inc();
                    sink.to.post(RoomUpdate::SlowConsumer);
                }
                Action::Left { conn } => core.presence.leave(conn),
                Action::Moved { conn: _, sink } => {
                    let to = core.moved_to.clone().unwrap_or_default();
                    sink.to.post(RoomUpdate::Moved { room: name.clone(), to });
                }
                Action::Batched { events, first } => {
                    let metrics = &core.settings.metrics;
                    metrics.batch_events.observe(events as f64);
                    metrics
                        .delivery_latency
                        .observe(now_ms().saturating_sub(first.ts_ms) as f64 / 1000.0);
                }
                Action::Occupancy(occupied) => {
                    if let Some(occupancy) = &core.occupancy {
                        occupancy.changed(name, occupied, now_ms());
                    }
                }
                Action::Load { subscribers, head } => {
                    if let Some(load) = &core.load {
                        load.set(subscribers, head);
                    }
                }
                Action::ArmTimer(timer, at) => {
                    ctx.run_later(
                        at.saturating_duration_since(Instant::now()),
                        move |room, ctx| {
                            let input = match timer {
                                Timer::Window => Input::WindowCloses,
                                Timer::Flush => Input::FlushRetry,
                                Timer::Linger => Input::Lingered { busy: room.busy() },
                            };
                            room.core.input(input);
                            room.settle(ctx);
                        },
                    );
                }
                Action::Trim { first_kept, expired } => {
                    self.log.common().trimmed(core, first_kept, expired)
                }
                Action::Reply { to, result } => to.send(result),
                Action::Retire { parked, head } => {
                    let parked = parked.into_iter().map(|(conn, generation, sink)| Parked {
                        conn,
                        to: sink.to,
                        generation,
                    });
                    if let Some(home) = core.home.upgrade() {
                        home.retire(name, &ctx.address(), parked.collect(), head);
                    }
                    tracing::debug!(room = %name, "idle room stopped");
                    ctx.stop();
                }
                action @ (Action::Write { .. }
                | Action::WriteState { .. }
                | Action::Flush { .. }) => self.log.common().carry_out(core, action, ctx),
            }
        }
        fan_out.hand_out(&self.core.name);
    }

    /// Carry out what the machine decided, then serve the held requests whose wait is
    /// over (after every read the room's log finishes, every live copy, every deadline).
    pub(super) fn settle(&mut self, ctx: &mut Context<Self>) {
        self.drive(ctx);
        self.release_held(ctx);
    }
}
