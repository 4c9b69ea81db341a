//! The connection registry: every live connection by id and by (user, device). Exclusive
//! device kinds keep one connection per user (a newer one replaces the older, closed with
//! 4501); other kinds (web tabs) may have many. Kicks close a user's connections and
//! answer once each of them has handled its close.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::join_all;

use super::connection::close;
use super::messages::*;

struct Entry {
    user: Arc<str>,
    device: Arc<str>,
    to: Recipient<CloseConnection>,
}

pub struct Registry {
    exclusive_devices: HashSet<String>,
    connections: HashMap<ConnId, Entry>,
    by_user: HashMap<Arc<str>, Vec<ConnId>>,
}

impl Registry {
    pub fn new(exclusive_devices: impl IntoIterator<Item = String>) -> Self {
        Registry {
            exclusive_devices: exclusive_devices.into_iter().collect(),
            connections: HashMap::new(),
            by_user: HashMap::new(),
        }
    }

    fn remove(&mut self, conn: ConnId) -> Option<Entry> {
        let entry = self.connections.remove(&conn)?;
        if let Some(ids) = self.by_user.get_mut(&entry.user) {
            ids.retain(|id| *id != conn);
            if ids.is_empty() {
                self.by_user.remove(&entry.user);
            }
        }
        Some(entry)
    }

    /// Connections of `user`, on `device` when given.
    fn of_user(&self, user: &str, device: Option<&str>) -> Vec<ConnId> {
        let ids = self.by_user.get(user).map(Vec::as_slice).unwrap_or_default();
        ids.iter()
            .copied()
            .filter(|id| device.is_none_or(|d| self.connections.get(id).is_some_and(|e| &*e.device == d)))
            .collect()
    }
}

impl Actor for Registry {
    type Context = Context<Self>;
}

impl Handler<Register> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Register, _ctx: &mut Self::Context) {
        if self.exclusive_devices.contains(&*msg.device) {
            for old in self.of_user(&msg.user, Some(&msg.device)) {
                if let Some(entry) = self.remove(old) {
                    tracing::debug!(conn = old, user = %msg.user, device = %msg.device, "replaced by a newer connection");
                    entry.to.do_send(CloseConnection {
                        code: close::REPLACED,
                        reason: "replaced by a newer connection of this user and device".into(),
                    });
                }
            }
        }
        self.by_user.entry(msg.user.clone()).or_default().push(msg.conn);
        self.connections.insert(msg.conn, Entry { user: msg.user, device: msg.device, to: msg.to });
    }
}

impl Handler<Unregister> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Unregister, _ctx: &mut Self::Context) {
        self.remove(msg.conn);
    }
}

impl Handler<Kick> for Registry {
    type Result = ResponseFuture<usize>;

    fn handle(&mut self, msg: Kick, _ctx: &mut Self::Context) -> Self::Result {
        let targets: Vec<_> = self
            .of_user(&msg.user, msg.device.as_deref())
            .into_iter()
            .filter_map(|id| self.remove(id))
            .collect();
        let close = CloseConnection { code: close::KICKED, reason: "closed by an operator".into() };
        Box::pin(async move {
            let closes = targets.iter().map(|entry| entry.to.send(close.clone()));
            // A connection that already stopped on its own counts as closed too.
            join_all(closes).await.len()
        })
    }
}

impl Handler<CloseAll> for Registry {
    type Result = usize;

    fn handle(&mut self, msg: CloseAll, _ctx: &mut Self::Context) -> usize {
        for entry in self.connections.values() {
            entry.to.do_send(msg.close.clone());
        }
        self.connections.len()
    }
}

impl Handler<CountConnections> for Registry {
    type Result = usize;

    fn handle(&mut self, _msg: CountConnections, _ctx: &mut Self::Context) -> usize {
        self.connections.len()
    }
}
