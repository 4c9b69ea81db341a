//! The connection registry: every live connection by id and by (user, device). Exclusive
//! device kinds keep one connection per user (a newer one replaces the older, closed with
//! 4501); other kinds (web tabs) may have many. Kicks close a user's connections and
//! answer once each of them has handled its close. Kicks are remembered for a while
//! (`core::credentials::kicks`): a connection whose handshake checked its credential before a kick
//! was durable, and registers after the kick looked for connections, is closed as kicked.
//!
//! In cluster mode a new exclusive-device connection is announced through a [`UserBus`]
//! (NATS), and every other node closes that user's older connection on that device
//! ([`RemoteReplace`]); kicks reach the other nodes through `cluster::bus`.

use std::collections::{HashMap, HashSet};

use std::sync::Arc;
use tokio::sync::oneshot;

use actix::prelude::*;

use super::messages::*;
use crate::core::credentials::kicks::{Admission, RecentKicks};
use crate::core::nodes::drain::{drain_batches, reconnect_hint_ms};
use crate::protocol::CloseCode;
use crate::world::now_ms;

struct Entry {
    user: Arc<str>,
    device: Arc<str>,
    to: Closer,
    /// When the connection registered (ms since the Unix epoch).
    since_ms: u64,
}

/// How the registry reaches a connection to close it: a weak handle, so an entry holds
/// no sender of its own (an actix sender is two allocations per holder; the
/// connection's actor lives by its own futures and its link's sender, not by this).
#[derive(Clone)]
struct Closer(actix::WeakRecipient<CloseConnection>);

impl Closer {
    fn do_send(&self, close: CloseConnection) {
        if let Some(to) = self.0.upgrade() {
            to.do_send(close);
        }
    }

    fn connected(&self) -> bool {
        self.0.upgrade().is_some_and(|to| to.connected())
    }
}

/// Cluster mode: another node registered a connection of `user` on exclusive `device` at
/// `at_ms`; older ones here are replaced (4501).
#[derive(Message)]
#[rtype(result = "()")]
pub struct RemoteReplace {
    pub user: String,
    pub device: String,
    pub at_ms: u64,
}

/// Cluster mode: another node took `user`'s sessions at `at_ms` (a move); the user's
/// connections here registered before then are closed with 4421 whose reason is `url`,
/// that node's URL as this node knows it, so they reconnect there (the user moves as
/// one). Replies with how many were closed.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct RemoteMoved {
    pub user: String,
    pub url: String,
    pub at_ms: u64,
}

/// How long a kick is remembered for connections registering after it. A handshake
/// slower than this from its credential check to its registration, with a kick
/// forgotten meanwhile, is closed as kicked (`Admission::TooOld`).
const KICK_MEMORY: std::time::Duration = std::time::Duration::from_secs(300);

/// Longest a kick waits for its connections to stop.
const KICK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A kick waiting for its connections to stop.
struct PendingKick {
    waiting: HashSet<ConnId>,
    closed: usize,
    reply: oneshot::Sender<usize>,
}

/// What the registry tells the other nodes, in cluster mode. Defined here, implemented in
/// the wiring over the cluster's bus, so the registry knows no transport.
pub trait UserBus: Send + Sync {
    /// `user` connected an exclusive `device` here at `at_ms`: older ones elsewhere go.
    fn announce_replace(&self, user: &str, device: &str, at_ms: u64);
}

pub struct Registry {
    exclusive_devices: HashSet<String>,
    connections: HashMap<ConnId, Entry>,
    by_user: HashMap<Arc<str>, Vec<ConnId>>,
    kicks: Vec<PendingKick>,
    /// Kicks of the last `KICK_MEMORY`, for connections that register after them.
    recent_kicks: RecentKicks,
    /// Cluster mode: where other nodes hear of exclusive-device connections made here.
    bus: Option<Arc<dyn UserBus>>,
}

impl Registry {
    pub fn new(
        exclusive_devices: impl IntoIterator<Item = String>,
        bus: Option<Arc<dyn UserBus>>,
    ) -> Self {
        Registry {
            exclusive_devices: exclusive_devices.into_iter().collect(),
            connections: HashMap::new(),
            by_user: HashMap::new(),
            kicks: Vec::new(),
            recent_kicks: RecentKicks::new(KICK_MEMORY.as_millis() as u64),
            bus,
        }
    }

    /// Close `user`'s connections on `device` registered before `before_ms` with 4501.
    fn replace(&mut self, user: &str, device: &str, before_ms: u64) {
        for old in self.of_user(user, Some(device)) {
            if self.connections.get(&old).is_some_and(|e| e.since_ms > before_ms) {
                continue;
            }
            if let Some(entry) = self.remove(old) {
                tracing::debug!(conn = old, user, device, "replaced by a newer connection");
                entry.to.do_send(CloseConnection {
                    code: CloseCode::Replaced,
                    reason: "replaced by a newer connection of this user and device".into(),
                    force: false,
                });
            }
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
            .filter(|id| {
                device.is_none_or(|d| self.connections.get(id).is_some_and(|e| &*e.device == d))
            })
            .collect()
    }
}

impl Actor for Registry {
    type Context = Context<Self>;
}

impl Handler<Register> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Register, _ctx: &mut Self::Context) {
        let since_ms = now_ms();
        let credential = msg.credential;
        let admission = self.recent_kicks.admit(
            &msg.user,
            &msg.device,
            credential.issued_at_ms,
            credential.checked_at_ms,
            since_ms,
        );
        if admission != Admission::Clear {
            // Closed as kicked, which also revokes the resume credential its welcome held.
            tracing::info!(conn = msg.conn, user = %msg.user, ?admission, "a connection registering after a kick is closed");
            msg.to.do_send(CloseConnection {
                code: CloseCode::Kicked,
                reason: "closed by an operator".into(),
                force: false,
            });
            return;
        }
        if self.exclusive_devices.contains(&*msg.device) {
            self.replace(&msg.user, &msg.device, u64::MAX);
            if let Some(bus) = &self.bus {
                bus.announce_replace(&msg.user, &msg.device, since_ms);
            }
        }
        // Most users hold one connection: no spare room for three more.
        let of_user = self.by_user.entry(msg.user.clone()).or_insert_with(|| Vec::with_capacity(1));
        of_user.push(msg.conn);
        let to = Closer(msg.to.downgrade());
        self.connections
            .insert(msg.conn, Entry { user: msg.user, device: msg.device, to, since_ms });
    }
}

impl Handler<RemoteReplace> for Registry {
    type Result = ();

    fn handle(&mut self, msg: RemoteReplace, _ctx: &mut Self::Context) {
        self.replace(&msg.user, &msg.device, msg.at_ms);
    }
}

impl Handler<RemoteMoved> for Registry {
    type Result = usize;

    fn handle(&mut self, msg: RemoteMoved, _ctx: &mut Self::Context) -> usize {
        let mut closed = 0;
        for id in self.of_user(&msg.user, None) {
            let Some(entry) = self.connections.get(&id).filter(|e| e.since_ms < msg.at_ms) else {
                continue;
            };
            entry.to.do_send(CloseConnection {
                code: CloseCode::WrongNode,
                reason: msg.url.clone(),
                force: false,
            });
            closed += 1;
        }
        closed
    }
}

impl Handler<Unregister> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Unregister, _ctx: &mut Self::Context) {
        self.remove(msg.conn);
        for kick in &mut self.kicks {
            kick.waiting.remove(&msg.conn);
        }
        let (done, pending): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.kicks).into_iter().partition(|k| k.waiting.is_empty());
        self.kicks = pending;
        for kick in done {
            let _ = kick.reply.send(kick.closed);
        }
    }
}

impl Handler<Kick> for Registry {
    type Result = ResponseFuture<usize>;

    /// Answers once every kicked connection has stopped (its client answered the Close,
    /// or the close handshake timed out).
    fn handle(&mut self, msg: Kick, _ctx: &mut Self::Context) -> Self::Result {
        self.recent_kicks.remember(&msg.user, msg.device.as_deref(), msg.at_ms, now_ms());
        let targets = self.of_user(&msg.user, msg.device.as_deref());
        let close = CloseConnection {
            code: CloseCode::Kicked,
            reason: "closed by an operator".into(),
            force: false,
        };
        let mut waiting = HashSet::new();
        for id in &targets {
            if let Some(entry) = self.connections.get(id) {
                entry.to.do_send(close.clone());
                if entry.to.connected() {
                    waiting.insert(*id);
                }
            }
        }
        let closed = targets.len();
        let (reply, answer) = oneshot::channel();
        if waiting.is_empty() {
            let _ = reply.send(closed);
        } else {
            self.kicks.push(PendingKick { waiting, closed, reply });
        }
        // The close handshake is bounded, so this only guards against a lost Unregister.
        Box::pin(async move {
            actix_web::rt::time::timeout(KICK_WAIT, answer)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(closed)
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

impl Handler<DrainClose> for Registry {
    type Result = usize;

    fn handle(&mut self, msg: DrainClose, ctx: &mut Self::Context) -> usize {
        let mut ids: Vec<ConnId> = self.connections.keys().copied().collect();
        ids.sort_unstable();
        let total = ids.len();
        let hint_window = msg.spread.max(std::time::Duration::from_secs(1));
        for batch in drain_batches(total, msg.spread) {
            let targets: Vec<(usize, Closer)> = (batch.first..batch.first + batch.count)
                .filter_map(|i| self.connections.get(&ids[i]).map(|e| (i, e.to.clone())))
                .collect();
            ctx.run_later(batch.at, move |_, _| {
                for (i, to) in targets {
                    let hint = reconnect_hint_ms(i, total, hint_window);
                    to.do_send(CloseConnection {
                        code: CloseCode::ServiceRestart,
                        reason: format!("service restart: reconnect in {hint} ms"),
                        force: false,
                    });
                }
            });
        }
        total
    }
}

impl Handler<UsersHere> for Registry {
    type Result = MessageResult<UsersHere>;

    fn handle(&mut self, msg: UsersHere, _ctx: &mut Self::Context) -> Self::Result {
        let mut users: Vec<(u64, &Arc<str>, usize)> = self
            .by_user
            .iter()
            .map(|(user, ids)| {
                (
                    ids.iter()
                        .filter_map(|id| self.connections.get(id))
                        .map(|e| e.since_ms)
                        .min()
                        .unwrap_or(0),
                    user,
                    ids.len(),
                )
            })
            .collect();
        users.sort_unstable();
        MessageResult(
            users
                .into_iter()
                .take(msg.limit)
                .map(|(_, user, count)| (user.to_string(), count))
                .collect(),
        )
    }
}

impl Handler<HandOverUser> for Registry {
    type Result = usize;

    fn handle(&mut self, msg: HandOverUser, _ctx: &mut Self::Context) -> usize {
        let targets = self.of_user(&msg.user, None);
        for id in &targets {
            if let Some(entry) = self.connections.get(id) {
                entry.to.do_send(CloseConnection {
                    code: CloseCode::WrongNode,
                    reason: msg.url.clone(),
                    force: false,
                });
            }
        }
        targets.len()
    }
}

impl Handler<CountConnections> for Registry {
    type Result = usize;

    fn handle(&mut self, _msg: CountConnections, _ctx: &mut Self::Context) -> usize {
        self.connections.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::actors::messages::CredentialTimes;

    /// In a connection's place: notes the close codes it is sent.
    struct Closes(Arc<parking_lot::Mutex<Vec<CloseCode>>>);

    impl Actor for Closes {
        type Context = Context<Self>;
    }

    impl Handler<CloseConnection> for Closes {
        type Result = ();
        fn handle(&mut self, msg: CloseConnection, _ctx: &mut Context<Self>) {
            self.0.lock().push(msg.code);
        }
    }

    /// The race of issue 29 item 3: a handshake checked the durable kicks just before a
    /// kick, and its connection registers just after the kick looked for connections.
    #[test]
    fn a_connection_registering_after_a_kick_with_an_older_credential_is_closed_as_kicked() {
        actix_web::rt::System::new().block_on(async {
            let registry = Registry::new(Vec::<String>::new(), None).start();
            let codes = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let conn = Closes(codes.clone()).start();
            let at_ms = now_ms();
            let kick = Kick { user: "u".into(), device: None, at_ms };
            assert_eq!(registry.send(kick).await.unwrap(), 0, "nobody registered yet");
            let register = |id, user: &str, issued_at_ms| Register {
                conn: id,
                user: user.into(),
                device: "web".into(),
                to: conn.clone().recipient(),
                credential: CredentialTimes { issued_at_ms, checked_at_ms: at_ms - 1 },
            };
            registry.send(register(1, "u", at_ms - 5)).await.unwrap();
            registry.send(register(2, "u", at_ms + 1)).await.unwrap();
            registry.send(register(3, "v", at_ms - 5)).await.unwrap();
            assert_eq!(
                registry.send(CountConnections).await.unwrap(),
                2,
                "the credential issued after, and another user's"
            );
            // The mailbox is in order: the marker comes after whatever the registry sent.
            conn.send(CloseConnection {
                code: CloseCode::Normal,
                reason: String::new(),
                force: false,
            })
            .await
            .unwrap();
            assert_eq!(*codes.lock(), [CloseCode::Kicked, CloseCode::Normal]);
        });
    }
}
