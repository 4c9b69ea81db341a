//! The connection registry: every live connection by id, with its user and device, so
//! the server can reach connections it did not start (close all on shutdown).

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;

use super::messages::*;

struct Entry {
    #[allow(dead_code)]
    user: Arc<str>,
    #[allow(dead_code)]
    device: Arc<str>,
    to: Recipient<CloseConnection>,
}

#[derive(Default)]
pub struct Registry {
    connections: HashMap<ConnId, Entry>,
}

impl Actor for Registry {
    type Context = Context<Self>;
}

impl Handler<Register> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Register, _ctx: &mut Self::Context) {
        self.connections.insert(msg.conn, Entry { user: msg.user, device: msg.device, to: msg.to });
    }
}

impl Handler<Unregister> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Unregister, _ctx: &mut Self::Context) {
        self.connections.remove(&msg.conn);
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
