//! A handshake's session: which session it gets ([`Shared::open`]), decided from the
//! route (served here, elsewhere, or moved), the user's migration budget and, for a move
//! the route did not choose, whether the avoided owner still answers `/readyz`.

use super::seam::DirectoryError;
use super::shared::Shared;
use crate::actors::liveness::Unroutable;
use crate::core::nodes::sessions::{
    check_migration_budget, plan_session, SessionPlan, SessionView,
};
use crate::store::SessionRecord;
use crate::world::now_ms;

/// Open a session for a handshake of `user`, which asked for `asked` ([`SessionOpener`](super::SessionOpener)).
pub struct OpenSession {
    pub user: String,
    pub asked: Option<String>,
    /// A node the client could not reach (the handshake's `avoid`).
    pub avoid: Option<String>,
    /// The user's home cell as the credential claims it (none: the configured cells'
    /// rendezvous choice).
    pub cell: Option<String>,
}

/// A handshake lets its stripe go for a readiness probe at most this many times; the
/// pass after decides without one ([`Shared::open`]).
const PROBE_PASSES: usize = 2;

/// What the route makes of a handshake's asked session.
enum Move {
    /// Nothing to charge: no move, a forced one, or a new session.
    Free,
    /// The client avoided `owner`, which this node counts ready: a charged move if the
    /// owner still says it is ready.
    Avoided { owner: Option<String> },
}

impl Shared {
    /// The session a handshake gets, held by one more lease (returned as the session id;
    /// the caller wraps it in a [`SessionLease`](super::SessionLease)).
    ///
    /// Nothing here waits on a peer while the user's stripe is held: a move that would be
    /// charged asks whether the avoided owner still answers `/readyz`, and when no answer
    /// of the last second is known ([`Router::ready_known`](crate::actors::liveness::Router::ready_known)) the stripe is let go, the
    /// shared probe awaited, and the decision made again from the top with its answer.
    /// The budget is checked before any probe, so a refused handshake costs none; and a
    /// handshake with `avoid` is first decided from reads alone, before the stripe is
    /// taken, so a credential looping on its given-back refusal holds no stripe at all.
    pub(super) async fn open(
        &self,
        msg: OpenSession,
    ) -> Result<(String, bool, bool), DirectoryError> {
        if msg.avoid.is_some() {
            self.refuse_early(&msg).await?;
        }
        let mut probed: Option<(String, bool)> = None;
        for pass in 0..=PROBE_PASSES {
            let _user = self.user_lock(&msg.user).lock().await;
            let now = now_ms();
            let warmup = self.in_warmup();
            let asked = match msg.asked.as_deref().filter(|s| !s.is_empty()) {
                None => None,
                Some(session) => self.lookup(session, warmup, true).await?,
            };
            let view = asked.as_ref().map(|r| SessionView {
                user: &r.user,
                owner: &r.owner,
                version: r.version,
            });
            let plan = plan_session(view, &msg.user, &self.node);
            let charged = match self.routed_move(&msg, asked.as_ref(), &plan)? {
                Move::Free => false,
                Move::Avoided { owner } => {
                    self.check_budget(&msg.user, now).await?;
                    let answered = probed
                        .as_ref()
                        .filter(|(node, _)| Some(node.as_str()) == owner.as_deref())
                        .map(|(_, ready)| *ready);
                    let ready = match owner.as_deref() {
                        // No owner to ask (peers mode, a session no node placed): not ready.
                        None => false,
                        Some(owner) => match answered.or_else(|| self.router.ready_known(owner)) {
                            Some(ready) => ready,
                            // The record changed under every probe: the move is one the
                            // route did not choose, as far as this node can tell.
                            None if pass == PROBE_PASSES => true,
                            None => {
                                drop(_user);
                                let ready = self.router.answers_ready(owner).await;
                                probed = Some((owner.to_string(), ready));
                                continue;
                            }
                        },
                    };
                    if ready {
                        tracing::info!(user = %msg.user, owner = ?owner, "move charged to the budget: the client could not reach its ready owner");
                    } else {
                        tracing::debug!(user = %msg.user, owner = ?owner, "the owner the client avoided is not ready: a forced move");
                    }
                    ready
                }
            };
            let (record, migrated, created) = match (plan, asked) {
                (SessionPlan::Reuse, Some(record)) => (record, false, false),
                (SessionPlan::Migrate { .. }, Some(record)) => {
                    (self.migrate_user(&msg.user, &record, now, charged).await?, true, false)
                }
                _ => (self.create(&msg.user, now).await?, false, true),
            };
            let session = record.session.clone();
            self.hold(record, created)?;
            if warmup && msg.asked.as_deref() == Some(session.as_str()) {
                self.metrics.warmup_reconnect_successes.inc();
            }
            return Ok((session, warmup, migrated));
        }
        unreachable!("the last pass decides without a probe")
    }

    /// Before the stripe: the refusals that reads alone decide for a handshake with
    /// `avoid` (the session is served elsewhere; the move would be charged to a spent
    /// budget). Both are refusals the client retries, so one made from a read that a
    /// concurrent handshake of the user overtook costs a retry, nothing more; a handshake
    /// that passes is decided again under the stripe.
    async fn refuse_early(&self, msg: &OpenSession) -> Result<(), DirectoryError> {
        let Some(session) = msg.asked.as_deref().filter(|s| !s.is_empty()) else { return Ok(()) };
        let asked = self.lookup(session, self.in_warmup(), false).await?;
        let view = asked.as_ref().map(|r| SessionView {
            user: &r.user,
            owner: &r.owner,
            version: r.version,
        });
        let plan = plan_session(view, &msg.user, &self.node);
        if let Move::Avoided { .. } = self.routed_move(msg, asked.as_ref(), &plan)? {
            self.check_budget(&msg.user, now_ms()).await?;
        }
        Ok(())
    }

    /// Where the asked session is served: the router's answer for a session of this user
    /// that a node owns, and (peers mode, where no record names owners across nodes) for
    /// any asked session, known here or not. Served elsewhere: refused with that node.
    fn routed_move(
        &self,
        msg: &OpenSession,
        asked: Option<&SessionRecord>,
        plan: &SessionPlan,
    ) -> Result<Move, DirectoryError> {
        let Some(session) = msg.asked.as_deref().filter(|s| !s.is_empty()) else {
            return self.home_cell_move(msg);
        };
        let owned = matches!(plan, SessionPlan::Reuse | SessionPlan::Migrate { .. });
        if !(owned || (asked.is_none() && self.router.placement_decides())) {
            return self.home_cell_move(msg);
        }
        let owner = asked.map(|r| r.owner.as_str());
        let routed = self
            .router
            .route(session, &msg.user, msg.cell.as_deref(), owner, msg.avoid.as_deref())
            .map_err(DirectoryError::Unroutable)?;
        if routed.node != self.node {
            self.metrics.handshakes_redirected.inc();
            tracing::debug!(session, user = %msg.user, to = %routed.node, "handshake sent to the session's node");
            return Err(DirectoryError::Elsewhere { node: routed.node, url: routed.url });
        }
        // The client could not reach an owner this node counts ready: charged only if the
        // owner says so itself (its readiness goes off before its heartbeat tells the
        // others that it drains).
        Ok(if routed.reason.charged() {
            Move::Avoided { owner: owner.map(str::to_string) }
        } else {
            Move::Free
        })
    }

    /// Cluster mode: a new session opens in the cell the user's route answers (its home
    /// cell, a claim or the configured cells' choice, while a node there can serve; else
    /// the first healthy cell by name). A handshake in another cell is refused with the
    /// routed node, as for a session served elsewhere. In peers mode a session's node is
    /// the placement of its id, which this does not override.
    fn home_cell_move(&self, msg: &OpenSession) -> Result<Move, DirectoryError> {
        if self.router.placement_decides() {
            return Ok(Move::Free);
        }
        let inbox = crate::core::rules::names::inbox_room(&msg.user);
        let routed = match self.router.route(
            &inbox,
            &msg.user,
            msg.cell.as_deref(),
            None,
            msg.avoid.as_deref(),
        ) {
            Ok(routed) => routed,
            // No cell is healthy, this node's included: refused, as the route answers.
            Err(refusal @ Unroutable::NoHealthyCell { .. }) => {
                return Err(DirectoryError::Unroutable(refusal))
            }
            // No node (every one avoided, say): this node serves rather than nobody.
            Err(Unroutable::NoAliveNode(_)) => return Ok(Move::Free),
        };
        if routed.cell == self.router.me().cell {
            // In its cell: it stays here unless this node is full, or much fuller than
            // another (`core::nodes::placement::place_new`).
            return match self.router.new_session_elsewhere(&inbox) {
                None => Ok(Move::Free),
                Some((node, url)) => {
                    self.metrics.handshakes_redirected.inc();
                    tracing::debug!(user = %msg.user, to = %node, "new session sent to a node with more room");
                    Err(DirectoryError::Elsewhere { node, url })
                }
            };
        }
        self.metrics.handshakes_redirected.inc();
        tracing::debug!(user = %msg.user, home = %routed.home, cell = %routed.cell, to = %routed.node, "new session sent to the user's cell");
        Err(DirectoryError::Elsewhere { node: routed.node, url: routed.url })
    }

    /// The user's migration budget allows one more charged move at `now`.
    async fn check_budget(&self, user: &str, now: u64) -> Result<(), DirectoryError> {
        let last = self.sessions.last_migration(user).await?;
        check_migration_budget(last, now, self.migration_window_ms).map_err(|refusal| {
            self.metrics.migration_refusals.inc();
            tracing::info!(user, %refusal, "migration refused");
            refusal.into()
        })
    }
}
