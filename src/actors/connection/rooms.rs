//! What a connection gets from its rooms and asks of them: subscribes (and the automatic
//! inbox), then each room's answers, windows and presence frames taken off the mailbox,
//! written as the machine decides.

use super::*;

impl Connection {
    /// Ask the room for generation `generation` of a subscribe the machine began.
    pub(super) fn ask_room(&mut self, generation: u64, ask: Ask, ctx: &mut Context<Self>) {
        let Ask { room, since, epoch, state, presence, reference } = ask;
        let (rooms, conn, to) = (self.rooms.clone(), self.id, self.link.clone());
        let member = crate::core::delivery::presence::Member {
            user: self.identity.user.clone(),
            device: self.identity.device.clone(),
        };
        let subscribe = Subscribe {
            conn,
            to,
            since,
            epoch,
            reference,
            generation,
            automatic: false,
            state,
            member: Some(member),
            presence,
        };
        let name = room.clone();
        let fut = async move { rooms.subscribe(&name, subscribe).await };
        ctx.spawn(fut.into_actor(self).map(move |result, conn, ctx| match result {
            Ok(addr) => conn.step(ctx, |m| m.attached(&room, generation, addr)),
            Err(e) => conn.step(ctx, |m| m.refused(&room, generation, reference, e.to_string())),
        }));
    }

    /// The automatic inbox subscription: announced now, parked in the rooms table while
    /// the inbox has no actor (nothing is read until a message comes or the client asks).
    pub(super) fn park_inbox(&mut self, room: Arc<str>, generation: u64, ctx: &mut Context<Self>) {
        self.io.text(ServerOp::Subscribed, &protocol::inbox_notice_frame(&room));
        let parked = Parked { conn: self.id, to: self.link.clone(), generation };
        let rooms = self.rooms.clone();
        let fut =
            async move { rooms.subscribe_inbox(&room, parked).await.map(|addr| (room, addr)) };
        ctx.spawn(fut.into_actor(self).map(move |result, conn, ctx| match result {
            Ok((room, Some(addr))) => conn.step(ctx, |m| m.attached(&room, generation, addr)),
            Ok((_, None)) => {}
            Err(error) => {
                tracing::warn!(conn = conn.id, %error, "automatic inbox subscription failed")
            }
        }));
    }

    /// A room's update, taken off the mailbox.
    pub(super) fn on_update(&mut self, update: RoomUpdate, ctx: &mut Context<Self>) {
        // What a room reserved for this window leaves the backlog whatever happens next.
        if let RoomUpdate::Events { window, .. } = &update {
            self.settings.metrics.outbox_seen(self.held());
            self.link.backlog().release(window.frame.len());
        }
        if let RoomUpdate::Presence { frame, .. } = &update {
            self.link.backlog().release(frame.frame.len());
        }
        if self.link.machine().is_closing() {
            return;
        }
        match update {
            RoomUpdate::Subscribed {
                room,
                epoch,
                head,
                recovered,
                replay,
                reference,
                generation,
                state,
            } => {
                let state_seq = state.as_ref().map(|state| state.as_ref().map_or(0, |s| s.seq));
                let answer = Answer {
                    room: &room,
                    generation,
                    epoch: &epoch,
                    head,
                    recovered,
                    state_seq,
                    replay: &replay,
                };
                let Some(answered) = self.link.machine().on_subscribed(answer) else { return };
                if let Some(recovered) = recovered {
                    self.settings.metrics.recovery(recovered);
                }
                if answered.announce {
                    let frame = match &state {
                        Some(state) => {
                            let state = state.as_ref().map(|s| (s.seq, &*s.data));
                            protocol::subscribed_state_frame(
                                &room, &epoch, head, recovered, reference, state,
                            )
                        }
                        None => {
                            protocol::subscribed_frame(&room, &epoch, head, recovered, reference)
                        }
                    };
                    self.io.text(ServerOp::Subscribed, &frame);
                }
                if !answered.fresh.is_empty() {
                    self.write_events(&epoch, answered.fresh);
                }
            }
            RoomUpdate::Events { room, window } => {
                let plan = self.link.machine().on_window(
                    &room,
                    &window.epoch,
                    &window.events,
                    window.targeted,
                );
                window.frames_for(plan, |frame| self.write_window(frame));
            }
            RoomUpdate::Presence { room, frame } => {
                if self.link.machine().is_live(&room) {
                    self.io.presence(&frame);
                }
            }
            RoomUpdate::SlowConsumer => self.step(ctx, |m| m.slow_consumer()),
            RoomUpdate::Moved { room, to } => {
                let reason = format!("room {room} moved to cell {to}: reconnect and resume");
                self.close(ctx, CloseCode::ServiceRestart, &reason, false);
            }
            RoomUpdate::Refused { room, reference, message, generation } => {
                self.step(ctx, |m| m.refused(&room, generation, reference, message))
            }
        }
        // A replay, or a frame this connection rendered itself, may have taken it over.
        let (held, born) = (self.held(), self.born);
        self.step(ctx, |m| m.wrote(held, || ms_since(born)));
    }

    /// Write `events` (of one room of `epoch`, ascending) as `events` frames of bounded size.
    pub(super) fn write_events(&mut self, epoch: &Arc<str>, events: Vec<Arc<Delivery>>) {
        for window in Window::cut(epoch, events) {
            self.write_window(&window);
        }
    }

    pub(super) fn write_window(&mut self, window: &Window) {
        self.settings.metrics.frame_written(window.events.len());
        let link = &self.link;
        self.io.window(window, || {
            crate::core::delivery::sse::render_cursor(link.machine().subscriptions().positions())
        });
    }
}

impl Handler<RoomUpdate> for Connection {
    type Result = ();

    fn handle(&mut self, update: RoomUpdate, ctx: &mut Self::Context) {
        self.on_update(update, ctx);
        // Only now, with what it wrote queued: rooms may write to the socket directly again.
        self.link.handled();
    }
}
