//! The connects scenario (issue 32, livegate only): how fast a node admits a flood of new
//! connections, first with tokens, then the same clients again with the resume credential
//! each got in its `welcome` (a reconnect storm after a restart). Every connection is a
//! whole handshake as in the idle scenario: TCP connect, upgrade, `welcome`, a subscribe
//! to one of the rooms and its `subscribed`, [`CONNECT_PARALLEL`] in flight at once.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

use tokio::sync::Semaphore;

use crate::load::{self, CONNECT_PARALLEL};
use crate::proto::{self, Ws};

/// One flood of handshakes.
pub struct Flood {
    pub sockets: Vec<Ws>,
    /// Each client's resume credential (by its index), when it connected.
    pub resumes: Vec<Option<String>>,
    pub failed: usize,
    pub first_error: Option<String>,
    pub secs: f64,
}

impl Flood {
    pub fn per_second(&self) -> f64 {
        self.sockets.len() as f64 / self.secs
    }

    /// Close every socket (and wait until each close is sent).
    pub async fn close(self) {
        for mut ws in self.sockets {
            let _ = ws.close(None).await;
        }
    }
}

/// Open one connection per `(url, room)`, all at once but [`CONNECT_PARALLEL`] in flight.
pub async fn flood(addr: SocketAddr, clients: Vec<(String, String)>) -> Flood {
    let gate = Rc::new(Semaphore::new(CONNECT_PARALLEL));
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|(url, room)| {
            let gate = gate.clone();
            tokio::task::spawn_local(async move {
                let _permit = gate.acquire().await;
                let mut ws = load::connect(addr, &url, false).await?;
                let welcome = proto::subscribe_welcomed(&mut ws, &room).await?;
                let resume = serde_json::from_str::<serde_json::Value>(&welcome)
                    .ok()
                    .and_then(|v| v["resume"].as_str().map(str::to_string));
                Ok::<_, String>((ws, resume))
            })
        })
        .collect();
    let mut flood =
        Flood { sockets: Vec::new(), resumes: Vec::new(), failed: 0, first_error: None, secs: 0.0 };
    for task in tasks {
        match task.await.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok((ws, resume)) => {
                flood.sockets.push(ws);
                flood.resumes.push(resume);
            }
            Err(e) => {
                flood.failed += 1;
                flood.resumes.push(None);
                flood.first_error.get_or_insert(e);
            }
        }
    }
    flood.secs = started.elapsed().as_secs_f64();
    flood
}
