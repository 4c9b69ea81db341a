//! What the client sends: the WebSocket's reads (only while the machine lets it read),
//! its requests handed to the machine, its Close and the socket's faults; an SSE stream's end.

use super::*;

impl Connection {
    pub(super) fn handle_text(&mut self, text: &str, ctx: &mut Context<Self>) {
        let now = self.now();
        let request = match protocol::parse_client_frame(text) {
            Ok(request) => request,
            Err(e) => {
                self.send_error(e.reference, e.room.as_deref(), e.code, &e.message);
                return self.step(ctx, |m| m.strike(now));
            }
        };
        let (reference, publish) =
            (request.reference, matches!(request.op, ClientOp::Publish { .. }));
        if !self.step(ctx, |m| m.admit(publish, reference, request.op.room(), now)) {
            return;
        }
        match request.op {
            ClientOp::Ping => self.io.text(ServerOp::Pong, &protocol::pong_frame(reference)),
            ClientOp::Publish { room, id, data, state } => {
                self.step(ctx, |m| m.publish(room, id, data, state, reference))
            }
            ClientOp::Subscribe { room, since, epoch, state, presence } => {
                let live = self.rooms.is_live(&room);
                let ask = Ask { room, since, epoch, state, presence, reference };
                self.step(ctx, |m| m.subscribe(ask, live, now))
            }
            ClientOp::Presence { room } => self.step(ctx, |m| m.presence(room, reference)),
            ClientOp::Unsubscribe { room } => self.step(ctx, |m| m.unsubscribe(room, reference)),
            ClientOp::History { room, since, limit } => {
                let live = self.rooms.is_live(&room);
                self.step(ctx, |m| m.history(room, since, limit, reference, live, now))
            }
        }
    }

    pub(super) fn on_inbound(&mut self, inbound: Inbound, ctx: &mut Context<Self>) {
        match inbound {
            Inbound::Text(text) => self.handle_text(&text, ctx),
            Inbound::Binary(_) => {
                let message = "binary frames are not part of the protocol; send JSON text";
                self.send_error(None, None, ErrorCode::BadRequest, message);
                let now = self.now();
                self.step(ctx, |m| m.strike(now));
            }
            Inbound::Ping(payload) => self.io.pong(&payload),
            Inbound::Nothing => {}
            Inbound::Close(reason) => {
                tracing::debug!(conn = self.id, ?reason, "client closed");
                self.close_code = Some(reason.as_ref().map_or(1005, |r| u16::from(r.code)));
                self.link.machine().client_closed();
                self.io.echo_close(reason);
                ctx.stop();
            }
        }
    }

    pub(super) fn on_fault(&mut self, fault: Fault, ctx: &mut Context<Self>) {
        if let Some(limit) = fault.limit() {
            self.settings.metrics.limit_hit(limit);
        }
        match fault.close_code() {
            Some(code) => self.close(ctx, code, fault.reason(), fault.fails_connection()),
            None => {
                // Keep a close code already known; otherwise this is an abnormal end (1006).
                self.close_code.get_or_insert(1006);
                ctx.stop();
            }
        }
    }

    /// An SSE stream's body ended: the client is gone (or took our close): stop.
    pub(super) fn on_stream_end(&mut self, ctx: &mut Context<Self>) {
        if !self.link.machine().is_closing() {
            tracing::debug!(conn = self.id, user = %self.identity.user, "SSE client went away");
        }
        self.close_code.get_or_insert(1006);
        ctx.stop();
    }
}

impl WsActor for Connection {
    fn io(&mut self) -> Option<&mut WsIo> {
        match &mut self.io {
            Transport::Ws(io) => Some(io),
            Transport::Sse(_) => None,
        }
    }

    /// As the machine says: not over the outbox bound nor with too many answers pending.
    fn may_read(&mut self, ctx: &mut Self::Context) -> bool {
        let (held, born) = (self.held(), self.born);
        self.step(ctx, |m| m.may_read(held, || ms_since(born)))
    }

    fn on_read(&mut self, item: Result<ws::Message, ReadError>, ctx: &mut Self::Context) {
        let now = self.now();
        let closing = {
            let mut machine = self.link.machine();
            machine.heard(now);
            machine.is_closing()
        };
        let read = self.reader.read(item);
        if closing {
            if ends_closing(&read) {
                ctx.stop();
            }
            return;
        }
        match read {
            Ok(inbound) => self.on_inbound(inbound, ctx),
            Err(fault) => self.on_fault(fault, ctx),
        }
    }
}
