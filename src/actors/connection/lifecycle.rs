//! A connection's start (`welcome`, the inbox and the rooms it names up front, its
//! registration and heartbeat) and its end (its subscriptions left, its gauges down).

use super::*;

impl Actor for Connection {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        match &self.io {
            Transport::Ws(_) => wsio::drive(ctx),
            Transport::Sse(io) => {
                ctx.spawn(io.ended().into_actor(self).map(|(), conn, ctx| conn.on_stream_end(ctx)));
            }
        }
        let heartbeat_ms = self.settings.heartbeat.as_millis() as u64;
        let resume = self
            .identity
            .resume
            .as_ref()
            .map(|grant| (grant.credential.as_str(), grant.expires_at_ms));
        let (session, node, warmup) =
            (&self.identity.session, &self.settings.node, self.identity.warmup);
        self.io.text(
            ServerOp::Welcome,
            &protocol::welcome_frame(session, node, heartbeat_ms, warmup, resume),
        );
        // Sent: the credential's text is not needed again (only when it was issued).
        if let Some(grant) = &mut self.identity.resume {
            grant.credential = String::new();
        }
        let initial: Vec<(Ask, bool)> = std::mem::take(&mut self.initial)
            .into_iter()
            .map(|i| {
                let live = self.rooms.is_live(&i.room);
                let (since, epoch, state, presence) = (i.since, i.epoch, i.state, i.presence);
                (Ask { room: i.room, since, epoch, state, presence, reference: None }, live)
            })
            .collect();
        let now = self.now();
        self.step(ctx, |m| m.start(initial, now));
        self.settings.registry.do_send(Register {
            conn: self.id,
            user: self.identity.user.clone(),
            device: self.identity.device.clone(),
            to: ctx.address().recipient(),
            credential: self.identity.credential,
        });
        ctx.run_interval(self.settings.heartbeat, |conn, ctx| {
            let (held, now) = (conn.held(), conn.now());
            conn.step(ctx, |m| m.heartbeat(held, now));
        });
        let metrics = &self.settings.metrics;
        metrics.connections_open.get_or_create(&metrics.device(&self.identity.device)).inc();
        let transport = crate::metrics::TransportLabel { transport: self.io.name() };
        metrics.connections_by_transport.get_or_create(&transport).inc();
        metrics.connects.inc();
        let (user, device) = (&self.identity.user, &self.identity.device);
        tracing::debug!(conn = self.id, %user, %device, transport = self.io.name(), "connected");
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.io.finish(FINISH_WITHIN);
        self.step(ctx, |m| m.stopped());
        // The gauge first: a kick answers on Unregister and must find it already down.
        let metrics = &self.settings.metrics;
        metrics.connections_open.get_or_create(&metrics.device(&self.identity.device)).dec();
        let transport = crate::metrics::TransportLabel { transport: self.io.name() };
        metrics.connections_by_transport.get_or_create(&transport).dec();
        self.settings.registry.do_send(Unregister { conn: self.id });
        // No close code at all means the socket just ended.
        let code = self.close_code.unwrap_or(1006);
        metrics.disconnects.get_or_create(&crate::metrics::Metrics::close_code(code)).inc();
        tracing::debug!(conn = self.id, user = %self.identity.user, code, "disconnected");
    }
}
