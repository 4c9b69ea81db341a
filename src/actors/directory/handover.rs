//! A rebalance's move of one user (issue 30): the owner hands the user's sessions over
//! to another node through the same records and budget as any move the route did not
//! choose. Under the user's handshake lock: the migration budget is checked (a user
//! whose budget is spent is skipped, not refused: nobody is waiting), each session this
//! node owns is rewritten to the new owner with the versioned write, and the charge is
//! recorded. The route then answers the new owner on every node (it is alive and not
//! draining), so a reconnect anywhere lands there. Closing the user's connections is the
//! caller's part, after this answers.

use actix::prelude::*;

use super::seam::{DirectoryError, WriteError};
use super::shared::{Directory, Shared};
use crate::core::nodes::sessions::check_migration_budget;
use crate::store::SessionRecord;
use crate::world::now_ms;

/// Hand `user`'s sessions owned here over to node `to`.
#[derive(Message)]
#[rtype(result = "Result<HandedOver, DirectoryError>")]
pub struct HandOver {
    pub user: String,
    pub to: String,
}

/// What a [`HandOver`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandedOver {
    /// This many sessions now name the new owner.
    Moved(usize),
    /// The user's migration budget is spent: nothing was written.
    BudgetSpent,
    /// This node owns none of the user's sessions (they moved meanwhile).
    NothingHere,
}

impl Shared {
    async fn hand_over(&self, user: &str, to: &str) -> Result<HandedOver, DirectoryError> {
        let _user = self.user_lock(user).lock().await;
        let now = now_ms();
        let mut records = self.sessions.sessions_of_user(user).await?;
        // Sessions leased here whose user record has not caught up yet move too.
        let live: Vec<SessionRecord> = self
            .memory
            .lock()
            .live
            .values()
            .filter(|l| l.record.user == user)
            .map(|l| l.record.clone())
            .collect();
        for record in live {
            if !records.iter().any(|r| r.session == record.session) {
                records.extend(self.sessions.session(&record.session).await?);
            }
        }
        records.retain(|r| r.owner == self.node);
        if records.is_empty() {
            return Ok(HandedOver::NothingHere);
        }
        let last = self.sessions.last_migration(user).await?;
        if check_migration_budget(last, now, self.migration_window_ms).is_err() {
            return Ok(HandedOver::BudgetSpent);
        }
        let mut moved = 0;
        for record in records {
            let handed =
                SessionRecord { owner: to.to_string(), updated_at_ms: now, ..record.clone() };
            match self.write(Some(record.version), handed).await {
                Ok(written) => {
                    moved += 1;
                    tracing::info!(user, session = %written.session, from = %self.node, to, version = written.version, "session handed over (rebalance)");
                }
                Err(WriteError::Stale(stale)) => {
                    tracing::info!(user, session = %record.session, %stale, "handover lost a race; keeping the newer record");
                }
                Err(WriteError::Failed(e)) => return Err(e),
            }
        }
        if moved == 0 {
            return Ok(HandedOver::NothingHere);
        }
        self.sessions.set_last_migration(user, now).await?;
        self.metrics.migrations.inc();
        Ok(HandedOver::Moved(moved))
    }
}

impl Handler<HandOver> for Directory {
    type Result = ResponseFuture<Result<HandedOver, DirectoryError>>;

    fn handle(&mut self, msg: HandOver, _ctx: &mut Self::Context) -> Self::Result {
        let shared = self.shared.clone();
        Box::pin(async move { shared.hand_over(&msg.user, &msg.to).await })
    }
}
