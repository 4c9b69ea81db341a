//! This node's part of a rebalance (issue 30: scale-out's controlled entry). The node an
//! operator asked plans with `core::nodes::rebalance::plan` over the loads the heartbeats carry
//! and sends each busiest node its [`Order`]; each shedding node paces its own moves
//! here (`core::nodes::rebalance::Pacer`: at most `per_second`, plus one after a pause).
//!
//! A move takes one user with connections here, oldest first: the directory hands the
//! user's sessions over to the target (budget checked, versioned write, charge recorded:
//! [`HandOver`]); then the registry closes the user's connections with 4421 whose reason
//! is the target's URL ([`HandOverUser`]), and the clients reconnect there. That URL is
//! the target's as this node's [`Router`] knows it (`core::nodes::rebalance::target_url`),
//! never one an order carries: an order whose target is this node, or not a node it hears
//! alive and taking connections, is refused and counted
//! (`livegate_rebalance_orders_refused_total`). A user whose
//! budget is spent, or whose sessions moved meanwhile, is skipped and costs no move.
//! The operation stops when its connections are moved, when it runs out of users, when
//! the target is no longer alive and taking connections, or when this node drains.
//!
//! What it has done is kept in a [`RebalanceStatus`] that `GET /v1/admin/rebalance` and
//! the admin page read without a message, and in the `livegate_rebalance_*` metrics.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use parking_lot::Mutex;

use super::directory::{Directory, HandOver, HandedOver};
use super::liveness::Router;
use super::messages::{HandOverUser, UsersHere};
use super::registry::Registry;
use crate::core::nodes::lifecycle::Lifecycle;
use crate::core::nodes::rebalance::{target_url, Known, Order, OrderRefused, Pacer};
use crate::metrics::Metrics;
use crate::protocol::{RebalancePlanReply, RebalanceShedding};
use crate::world::now_ms;

/// Moves in flight at once (each waits on the directory's store).
const MAX_IN_FLIGHT: usize = 16;
/// How often a running operation checks that its target still takes connections.
const TARGET_CHECK_EVERY_MS: u64 = 1000;
/// The longest close reason (a WebSocket close frame's 125 bytes less the code).
const MAX_CLOSE_REASON: usize = 123;

/// Start this node's part of a rebalance; one already running is replaced. Refused (and
/// the one running kept) when the order's target is not another node this node hears
/// alive and taking connections.
#[derive(Message)]
#[rtype(result = "Result<(), OrderRefused>")]
pub struct Shed(pub Order);

/// What a rebalance did, as the admin API shows it (kept in its answer's form).
#[derive(Debug, Clone, Default)]
pub struct RebalanceStatus {
    /// The last rebalance this node planned (answered `POST /v1/admin/rebalance`).
    pub issued: Option<RebalancePlanReply>,
    /// This node's part of the last rebalance it was given (by itself or another node);
    /// its `state` is `running` until it ends.
    pub shedding: Option<RebalanceShedding>,
}

/// What handlers hold: the actor and the status it keeps.
#[derive(Clone)]
pub struct Rebalance {
    pub actor: Addr<Rebalancer>,
    pub status: Arc<Mutex<RebalanceStatus>>,
}

pub struct Rebalancer {
    directory: Addr<Directory>,
    registry: Addr<Registry>,
    router: Arc<Router>,
    lifecycle: Arc<Lifecycle>,
    metrics: Arc<Metrics>,
    status: Arc<Mutex<RebalanceStatus>>,
    running: Option<Running>,
    /// Orders taken so far (each operation's generation).
    orders: u64,
}

struct Running {
    order: Order,
    /// The target's URL as the router knows it (checked again with the target).
    url: String,
    pacer: Pacer,
    /// Users with connections here, oldest first, not yet tried (bounded by the
    /// connections on this node when the order came).
    queue: VecDeque<(String, usize)>,
    in_flight: usize,
    /// Connections moved, counting those in flight as their user's count at the snapshot.
    committed: u64,
    target_checked_ms: u64,
    /// Bumped per order, so a replaced operation's late answers are ignored.
    generation: u64,
    poll: Option<SpawnHandle>,
}

impl Rebalancer {
    pub fn start(
        directory: Addr<Directory>,
        registry: Addr<Registry>,
        router: Arc<Router>,
        lifecycle: Arc<Lifecycle>,
        metrics: Arc<Metrics>,
    ) -> Rebalance {
        let status = Arc::new(Mutex::new(RebalanceStatus::default()));
        let actor = Rebalancer {
            directory,
            registry,
            router,
            lifecycle,
            metrics,
            status: status.clone(),
            running: None,
            orders: 0,
        }
        .start();
        Rebalance { actor, status }
    }

    fn finish(&mut self, outcome: &'static str, ctx: &mut Context<Self>) {
        let Some(running) = self.running.take() else { return };
        if let Some(poll) = running.poll {
            ctx.cancel_future(poll);
        }
        self.metrics.rebalance_pending.set(0);
        let now = now_ms();
        update(&self.status, |s| {
            s.finished_at_ms = Some(now);
            s.state = outcome;
        });
        tracing::info!(id = %running.order.id, to = %running.order.to, outcome, moved = running.committed, "rebalance: this node's part ended");
    }

    /// The target's URL, when it is another node alive and taking connections as this
    /// node's router sees it now.
    fn target_url(&self, to: &str) -> Result<String, OrderRefused> {
        let nodes = self.router.loads(0).unwrap_or_default();
        let known: Vec<Known> = nodes
            .iter()
            .map(|n| Known { name: &n.name, url: &n.url, draining: n.draining })
            .collect();
        target_url(to, &self.router.me().name, &known).map(str::to_string)
    }

    /// Start every move the pacer allows now, then wait for the next.
    fn poll(&mut self, ctx: &mut Context<Self>) {
        let now = now_ms();
        if !self.lifecycle.phase().accepts_connections() {
            return self.finish("draining", ctx);
        }
        let Some(running) = self.running.as_mut() else { return };
        running.poll = None;
        if now.saturating_sub(running.target_checked_ms) >= TARGET_CHECK_EVERY_MS {
            running.target_checked_ms = now;
            let to = running.order.to.clone();
            match self.target_url(&to) {
                Ok(url) => {
                    if let Some(running) = self.running.as_mut() {
                        running.url = url;
                    }
                }
                Err(_) => return self.finish("target_gone", ctx),
            }
        }
        let Some(running) = self.running.as_mut() else { return };
        let mut moves = Vec::new();
        while running.committed < running.order.connections
            && running.in_flight < MAX_IN_FLIGHT
            && !running.queue.is_empty()
        {
            if !running.pacer.take(now) {
                break;
            }
            let (user, connections) = running.queue.pop_front().expect("not empty");
            running.in_flight += 1;
            running.committed += connections as u64;
            let generation = running.generation;
            let (directory, registry) = (self.directory.clone(), self.registry.clone());
            let (to, url) = (running.order.to.clone(), running.url.clone());
            let url = if url.len() <= MAX_CLOSE_REASON { url } else { String::new() };
            let task = async move {
                let handed = directory.send(HandOver { user: user.clone(), to }).await;
                let closed = match &handed {
                    Ok(Ok(HandedOver::Moved(_))) => {
                        registry.send(HandOverUser { user, url }).await.unwrap_or(0)
                    }
                    _ => 0,
                };
                (handed, closed)
            };
            moves.push((task, generation, connections));
        }
        self.metrics.rebalance_pending.set(
            i64::try_from(running.order.connections.saturating_sub(running.committed))
                .unwrap_or(i64::MAX),
        );
        if running.in_flight == 0
            && (running.committed >= running.order.connections || running.queue.is_empty())
        {
            let outcome = if running.committed >= running.order.connections {
                "done"
            } else {
                "no_more_users"
            };
            return self.finish(outcome, ctx);
        }
        let wait = (running.in_flight < MAX_IN_FLIGHT
            && running.committed < running.order.connections
            && !running.queue.is_empty())
        .then(|| running.pacer.wait_ms(now).max(1));
        if let Some(wait) = wait {
            let poll = ctx.run_later(Duration::from_millis(wait), |actor, ctx| actor.poll(ctx));
            if let Some(running) = self.running.as_mut() {
                running.poll = Some(poll);
            }
        }
        for (task, generation, connections) in moves {
            ctx.spawn(task.into_actor(self).map(move |(handed, closed), actor, ctx| {
                actor.moved(generation, connections, handed, closed, ctx)
            }));
        }
    }

    /// A move's answer.
    fn moved(
        &mut self,
        generation: u64,
        connections: usize,
        handed: Result<Result<HandedOver, super::directory::DirectoryError>, MailboxError>,
        closed: usize,
        ctx: &mut Context<Self>,
    ) {
        let Some(running) = self.running.as_mut().filter(|r| r.generation == generation) else {
            return;
        };
        running.in_flight -= 1;
        let now = now_ms();
        let skipped = |running: &mut Running| {
            // Nothing moved: the connections it held back and its move are given back.
            running.committed = running.committed.saturating_sub(connections as u64);
            running.pacer.refund(now);
        };
        match handed {
            Ok(Ok(HandedOver::Moved(sessions))) => {
                // The user's connections now (some may have come or gone since the snapshot).
                running.committed =
                    running.committed.saturating_sub(connections as u64) + closed as u64;
                self.metrics.rebalance_moves.inc();
                self.metrics.rebalance_connections_moved.inc_by(closed as u64);
                tracing::debug!(sessions, closed, to = %running.order.to, "rebalance: user handed over");
                update(&self.status, |s| {
                    s.moved += closed as u64;
                    s.users += 1;
                });
            }
            Ok(Ok(HandedOver::BudgetSpent)) => {
                skipped(running);
                self.metrics.rebalance_skipped("budget");
                update(&self.status, |s| s.skipped_budget += 1);
            }
            Ok(Ok(HandedOver::NothingHere)) => {
                skipped(running);
                self.metrics.rebalance_skipped("gone");
                update(&self.status, |s| s.skipped_gone += 1);
            }
            Ok(Err(error)) => {
                skipped(running);
                tracing::warn!(%error, "rebalance: a handover failed; the user stays");
                self.metrics.rebalance_skipped("error");
                update(&self.status, |s| s.errors += 1);
            }
            Err(error) => {
                skipped(running);
                tracing::warn!(%error, "rebalance: the directory did not answer");
                self.metrics.rebalance_skipped("error");
                update(&self.status, |s| s.errors += 1);
            }
        }
        if let Some(poll) = running.poll.take() {
            ctx.cancel_future(poll);
        }
        self.poll(ctx);
    }
}

fn update(status: &Mutex<RebalanceStatus>, f: impl FnOnce(&mut RebalanceShedding)) {
    if let Some(shedding) = status.lock().shedding.as_mut() {
        f(shedding);
    }
}

impl Actor for Rebalancer {
    type Context = Context<Self>;
}

impl Handler<Shed> for Rebalancer {
    type Result = ResponseActFuture<Self, Result<(), OrderRefused>>;

    fn handle(&mut self, msg: Shed, ctx: &mut Self::Context) -> Self::Result {
        let order = msg.0;
        let url = match self.target_url(&order.to) {
            Ok(url) => url,
            Err(refused) => {
                tracing::warn!(id = %order.id, to = %order.to, reason = refused.reason(), "rebalance: order refused");
                self.metrics.rebalance_order_refused(refused.reason());
                return Box::pin(fut::ready(Err(refused)));
            }
        };
        if self.running.is_some() {
            self.finish("replaced", ctx);
        }
        // Every user here: some will be skipped (budget spent, gone meanwhile).
        let users = self.registry.send(UsersHere { limit: usize::MAX });
        Box::pin(users.into_actor(self).map(move |users, actor, ctx| {
            let now = now_ms();
            let queue: VecDeque<(String, usize)> = users.unwrap_or_default().into();
            tracing::info!(id = %order.id, to = %order.to, connections = order.connections, per_second = order.per_second, users = queue.len(), "rebalance: this node hands connections over");
            actor.status.lock().shedding = Some(RebalanceShedding {
                id: order.id.clone(),
                to: order.to.clone(),
                per_second: order.per_second,
                planned: order.connections,
                moved: 0,
                users: 0,
                skipped_budget: 0,
                skipped_gone: 0,
                errors: 0,
                started_at_ms: now,
                finished_at_ms: None,
                state: "running",
            });
            actor.orders += 1;
            let generation = actor.orders;
            actor.running = Some(Running {
                pacer: Pacer::new(order.per_second, now),
                order,
                url,
                queue,
                in_flight: 0,
                committed: 0,
                target_checked_ms: 0,
                generation,
                poll: None,
            });
            actor.poll(ctx);
            Ok(())
        }))
    }
}
