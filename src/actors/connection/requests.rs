//! The requests a connection makes for its client, carried out once its machine let them
//! through: history and presence reads from rooms, and publishes. Each answer comes back
//! on one of the actor's futures and is handed to the machine (`answered`).

use super::*;

/// A client publish's `client_published` webhook, waiting for the event to be durable.
struct PublishedWebhook {
    webhooks: crate::actors::webhooks::Webhooks,
    user: String,
    device: String,
    event_id: Option<String>,
    data: String,
}

impl PublishedWebhook {
    fn enqueue(self, room: &str, seq: u64) {
        let Some(data) = protocol::event_data(self.data) else {
            // The op's data was parsed as JSON; this cannot happen.
            return tracing::error!(%room, seq, "client publish data is not JSON: no webhook");
        };
        self.webhooks.enqueue(crate::actors::webhooks::WebhookEvent::ClientPublished {
            room: room.to_string(),
            ts_ms: crate::world::now_ms(),
            user: self.user,
            device: Some(self.device),
            seq,
            event_id: self.event_id,
            data,
        });
    }
}

impl Connection {
    /// Read a history page from the room; answered with what fits under the bound.
    pub(super) fn read_history(
        &mut self,
        room: String,
        since: u64,
        limit: usize,
        reference: Option<i64>,
        ctx: &mut Context<Self>,
    ) {
        let rooms = self.rooms.clone();
        let fut = async move { (rooms.history(&room, since, limit).await, room) };
        ctx.spawn(fut.into_actor(self).map(move |(result, room), conn, ctx| {
            match result {
                Ok(page) => conn.reply_history(&room, &page, reference),
                Err(e) => {
                    conn.send_error(reference, Some(&room), ErrorCode::Unavailable, &e.to_string())
                }
            }
            conn.answered(Pending::Read, ctx);
        }));
    }

    /// Read who is in the room.
    pub(super) fn read_presence(
        &mut self,
        room: String,
        reference: Option<i64>,
        ctx: &mut Context<Self>,
    ) {
        let rooms = self.rooms.clone();
        let fut = async move { (rooms.presence(&room).await, room) };
        ctx.spawn(fut.into_actor(self).map(move |(result, room), conn, ctx| {
            match result {
                Ok(Ok(view)) => conn.reply(
                    ServerOp::Presence,
                    protocol::presence_reply_frame(&room, &view, reference),
                ),
                Ok(Err(off)) => conn.send_error(
                    reference,
                    Some(&room),
                    ErrorCode::PresenceOff,
                    &off.to_string(),
                ),
                Err(e) => {
                    conn.send_error(reference, Some(&room), ErrorCode::Unavailable, &e.to_string())
                }
            }
            conn.answered(Pending::Read, ctx);
        }));
    }

    /// A history page, cut to what fits under the outbox bound (at least one event; then
    /// `complete` is false and the client reads on after the last seq it got).
    pub(super) fn reply_history(&mut self, room: &str, page: &HistoryPage, reference: Option<i64>) {
        let device = &self.identity.device;
        let events: Vec<&str> =
            page.events.iter().filter(|e| e.is_for(device)).map(|e| &*e.json).collect();
        let epoch = page.epoch.as_deref();
        let overhead =
            protocol::history_frame(room, epoch, page.head, std::iter::empty(), false, reference)
                .len();
        let held = self.held();
        let fits = self.link.machine().page_fits(held, overhead, events.iter().map(|e| e.len()));
        let complete = page.complete && fits == events.len();
        let frame = protocol::history_frame(
            room,
            epoch,
            page.head,
            events[..fits].iter().copied(),
            complete,
            reference,
        );
        self.reply(ServerOp::History, frame)
    }

    /// A client's publish the machine let through: submitted through `Publisher::submit`,
    /// the HTTP API's path and checks; `published` goes out once the event is durable. The
    /// event's `from` is this connection's user, whatever the client sent.
    pub(super) fn publish(
        &mut self,
        room: String,
        id: Option<String>,
        data: String,
        state: Option<String>,
        reference: Option<i64>,
        ctx: &mut Context<Self>,
    ) {
        let metrics = self.settings.metrics.clone();
        let from = Some(self.identity.user.to_string());
        // What the `client_published` webhook tells, kept only when webhooks are on.
        let told = self.settings.webhooks.clone().map(|webhooks| PublishedWebhook {
            webhooks,
            user: self.identity.user.to_string(),
            device: self.identity.device.to_string(),
            event_id: id.clone(),
            data: data.clone(),
        });
        let event =
            Submission { id, data: data.into(), devices: None, from, state: state.map(Into::into) };
        let publisher = self.settings.publisher.clone();
        let fut = async move {
            let result = publisher.submit(&room, event).await;
            // Queued once durable, before the answer; a duplicate's went with the original.
            if let (Some(told), Ok(published)) = (told, &result) {
                if !published.duplicate {
                    told.enqueue(&room, published.seq);
                }
            }
            (room, result)
        };
        // The publish is a task of its own, not the actor's: a publish op read before its
        // connection closed is still stored, and its webhook queued, once it is durable.
        let task = actix::spawn(fut);
        ctx.spawn(async move { task.await.ok() }.into_actor(self).map(move |done, conn, ctx| {
            match done {
                Some((room, Ok(published))) => {
                    metrics.publish_answered(published.duplicate);
                    metrics.client_publish(if published.duplicate {
                        "duplicate"
                    } else {
                        "published"
                    });
                    let frame = protocol::published_frame(
                        &room,
                        published.seq,
                        published.duplicate,
                        reference,
                    );
                    conn.reply(ServerOp::Published, frame);
                }
                Some((room, Err(error))) => {
                    let code = error.code();
                    metrics.client_publish(code.as_str());
                    tracing::debug!(conn = conn.id, %room, %error, "client publish refused");
                    conn.send_error(reference, Some(&room), code, &error.to_string());
                }
                None => {}
            }
            conn.answered(Pending::Publish, ctx);
        }));
    }
}
