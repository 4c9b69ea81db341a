//! The supervisor: owns the node's lifecycle. Startup: reconcile the directory, then
//! ready (cluster mode: joining, until the peers route here; see `actors::liveness`). On the first signal: not ready (503) → wait `drain_wait` → stop accepting →
//! Close 1012 to every connection spread over `drain_spread` → wait for clients to close
//! or `drain_grace` → close what is left → done (the caller stops rooms, flushes the store
//! and exits). A second signal jumps to the forced close.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_web::dev::ServerHandle;
use tokio::sync::oneshot;

use super::directory::{Directory, DirectoryError, Reconcile};
use super::messages::{CloseAll, CloseConnection, CountConnections, DrainClose};
use super::registry::Registry;
use super::rooms::Rooms;
use crate::core::nodes::lifecycle::{Lifecycle, Phase};
use crate::metrics::Metrics;
use crate::protocol::CloseCode;

/// How often the close phase checks whether everyone has left.
const POLL: Duration = Duration::from_millis(100);
/// After the forced close, how long the Close frames get to go out before the HTTP
/// server is stopped (which cuts whatever sockets are left).
const FORCE_SETTLE: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy)]
pub struct DrainTiming {
    pub wait: Duration,
    pub spread: Duration,
    pub grace: Duration,
}

/// Reconcile the directory and turn ready.
#[derive(Message)]
#[rtype(result = "Result<(), StartError>")]
pub struct Start;

/// Why [`Start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the directory actor is gone: {0}")]
    DirectoryGone(#[from] MailboxError),
    #[error("reconciling the directory: {0}")]
    Reconcile(#[from] DirectoryError),
}

/// A shutdown signal (SIGTERM, SIGINT, or the caller's shutdown future).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Signal;

pub struct Supervisor {
    lifecycle: Arc<Lifecycle>,
    registry: Addr<Registry>,
    directory: Addr<Directory>,
    /// Its open windows are sent before the Close frames.
    rooms: Rooms,
    server: ServerHandle,
    timing: DrainTiming,
    metrics: Arc<Metrics>,
    began: Option<Instant>,
    closing_since: Option<Instant>,
    done: Option<oneshot::Sender<()>>,
    /// After the reconcile, join (`Phase::Joining`) before ready: there are peers whose
    /// routing to this node the liveness actor waits for.
    join_peers: bool,
}

impl Supervisor {
    #[allow(clippy::too_many_arguments)] // wired once, from the node's parts
    pub fn new(
        lifecycle: Arc<Lifecycle>,
        registry: Addr<Registry>,
        directory: Addr<Directory>,
        rooms: Rooms,
        server: ServerHandle,
        timing: DrainTiming,
        metrics: Arc<Metrics>,
        done: oneshot::Sender<()>,
    ) -> Self {
        Supervisor {
            lifecycle,
            registry,
            directory,
            rooms,
            server,
            timing,
            metrics,
            began: None,
            closing_since: None,
            done: Some(done),
            join_peers: false,
        }
    }

    /// Cluster mode: after the reconcile the node joins, and the liveness actor turns it
    /// ready once its peers route to it.
    pub fn joining_peers(mut self, join: bool) -> Self {
        self.join_peers = join;
        self
    }

    fn phase(&self) -> Phase {
        self.lifecycle.phase()
    }

    fn enter(&mut self, phase: Phase) {
        self.lifecycle.set(phase);
        self.metrics.drain_phase.set(phase.drain_step());
    }

    fn elapsed_ms(&self) -> u64 {
        self.began.map_or(0, |t| t.elapsed().as_millis() as u64)
    }

    fn stop_accepting(&mut self, ctx: &mut Context<Self>) {
        if self.phase() != Phase::NotReady {
            return;
        }
        self.enter(Phase::Closing);
        self.closing_since = Some(Instant::now());
        // Graceful: the listener closes now; open connections keep being served.
        actix_web::rt::spawn(self.server.stop(true));
        let spread = self.timing.spread;
        let elapsed_ms = self.elapsed_ms();
        let (rooms, registry) = (self.rooms.clone(), self.registry.clone());
        let close = async move {
            rooms.close_windows().await;
            registry.send(DrainClose { spread }).await
        };
        ctx.spawn(close.into_actor(self).map(move |told, _, _| {
            let connections = told.unwrap_or(0);
            tracing::info!(
                phase = "closing",
                connections,
                spread_ms = spread.as_millis() as u64,
                elapsed_ms,
                "drain: stopped accepting; asking clients to reconnect"
            );
        }));
        ctx.run_interval(POLL, |sup, ctx| sup.check_left(ctx));
    }

    fn check_left(&mut self, ctx: &mut Context<Self>) {
        if self.phase() != Phase::Closing {
            return;
        }
        let deadline = self.timing.spread + self.timing.grace;
        let overdue = self.closing_since.is_some_and(|t| t.elapsed() >= deadline);
        ctx.spawn(self.registry.send(CountConnections).into_actor(self).map(
            move |left, sup, ctx| {
                let left = left.unwrap_or(0);
                sup.metrics.drain_connections_left.set(left as i64);
                if sup.phase() != Phase::Closing {
                    return;
                }
                if left == 0 {
                    tracing::info!(
                        phase = "closed",
                        connections_left = 0,
                        elapsed_ms = sup.elapsed_ms(),
                        "drain: every client has left"
                    );
                    sup.finish();
                } else if overdue {
                    tracing::info!(
                        phase = "grace_over",
                        connections_left = left,
                        elapsed_ms = sup.elapsed_ms(),
                        "drain: grace over"
                    );
                    sup.force(ctx);
                }
            },
        ));
    }

    fn force(&mut self, ctx: &mut Context<Self>) {
        if matches!(self.phase(), Phase::Forced | Phase::Done) {
            return;
        }
        self.enter(Phase::Forced);
        let close = CloseConnection {
            code: CloseCode::ServiceRestart,
            reason: "service restart: reconnect now".into(),
            force: true,
        };
        ctx.spawn(self.registry.send(CloseAll { close }).into_actor(self).map(|left, sup, _| {
            tracing::info!(
                phase = "forced",
                connections_left = left.unwrap_or(0),
                elapsed_ms = sup.elapsed_ms(),
                "drain: closing what is left"
            );
        }));
        // Stopping the HTTP server cuts sockets: give the Close frames time to go out first.
        ctx.run_later(FORCE_SETTLE, |sup, _| {
            actix_web::rt::spawn(sup.server.stop(false));
            sup.finish();
        });
    }

    fn finish(&mut self) {
        self.enter(Phase::Done);
        self.metrics.drain_connections_left.set(0);
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;
}

impl Handler<Start> for Supervisor {
    type Result = ResponseActFuture<Self, Result<(), StartError>>;

    fn handle(&mut self, _msg: Start, _ctx: &mut Self::Context) -> Self::Result {
        Box::pin(self.directory.send(Reconcile).into_actor(self).map(|reply, sup, _| {
            reply??;
            // A signal during the start has begun the drain already. With peers to hear
            // from, the liveness actor turns it ready once they route here.
            let next = if sup.join_peers { Phase::Joining } else { Phase::Ready };
            sup.lifecycle.advance(Phase::Starting, next);
            Ok(())
        }))
    }
}

impl Handler<Signal> for Supervisor {
    type Result = ();

    fn handle(&mut self, _msg: Signal, ctx: &mut Self::Context) {
        match self.phase() {
            Phase::Starting | Phase::Joining | Phase::Ready => {
                self.began = Some(Instant::now());
                self.enter(Phase::NotReady);
                let wait = self.timing.wait;
                ctx.spawn(self.registry.send(CountConnections).into_actor(self).map(
                    move |n, _, _| {
                        tracing::info!(
                            phase = "not_ready",
                            connections = n.unwrap_or(0),
                            wait_ms = wait.as_millis() as u64,
                            "drain: readiness off, new upgrades refused"
                        );
                    },
                ));
                ctx.run_later(wait, |sup, ctx| sup.stop_accepting(ctx));
            }
            Phase::NotReady | Phase::Closing => {
                tracing::info!(elapsed_ms = self.elapsed_ms(), "second signal: forcing the close");
                self.force(ctx);
            }
            Phase::Forced | Phase::Done => {}
        }
    }
}
