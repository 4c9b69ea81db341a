//! Session ownership decisions: which session a handshake gets, whether that is a
//! migration, whether the user's migration budget allows it, and compare-and-swap
//! version checks. Pure: records come in as values, time as a parameter.

use thiserror::Error;

/// What the directory holds about a session, as far as decisions need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionView<'a> {
    pub user: &'a str,
    pub owner: &'a str,
    pub version: u64,
}

/// What a handshake does with the session it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionPlan {
    /// The session belongs to the user and is owned here: reuse it, write nothing.
    Reuse,
    /// The session belongs to the user but another node owns it: take it over.
    Migrate { from: String },
    /// No usable session (none asked, unknown, or another user's): create a new one and
    /// leave the asked one untouched.
    Create,
}

pub fn plan_session(asked: Option<SessionView<'_>>, user: &str, node: &str) -> SessionPlan {
    match asked {
        Some(view) if view.user == user && view.owner == node => SessionPlan::Reuse,
        Some(view) if view.user == user => SessionPlan::Migrate { from: view.owner.to_string() },
        _ => SessionPlan::Create,
    }
}

#[derive(Debug, Error, PartialEq, Eq, Clone, Copy)]
pub enum BudgetError {
    #[error("migration budget spent; retry after {retry_after_secs} s")]
    Spent { retry_after_secs: u64 },
}

/// A user's sessions change owner at most once per window, whatever caused it.
pub fn check_migration_budget(
    last_migration_ms: Option<u64>,
    now_ms: u64,
    window_ms: u64,
) -> Result<(), BudgetError> {
    match last_migration_ms {
        Some(last) if now_ms < last.saturating_add(window_ms) => {
            let wait_ms = last.saturating_add(window_ms) - now_ms;
            Err(BudgetError::Spent { retry_after_secs: wait_ms.div_ceil(1000).max(1) })
        }
        _ => Ok(()),
    }
}

#[derive(Debug, Error, PartialEq, Eq, Clone, Copy)]
pub enum VersionError {
    #[error("stale write: read version {read:?}, stored version {stored:?}")]
    Stale { read: Option<u64>, stored: Option<u64> },
}

/// A write that read version `read` (None: "did not exist") may replace what is stored
/// only if nothing changed since; the new version is one more.
pub fn next_version(read: Option<u64>, stored: Option<u64>) -> Result<u64, VersionError> {
    if read == stored {
        Ok(stored.map_or(1, |v| v + 1))
    } else {
        Err(VersionError::Stale { read, stored })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_plans() {
        let view = |user, owner| Some(SessionView { user, owner, version: 3 });
        let cases = [
            (None, SessionPlan::Create),
            (view("u1", "a"), SessionPlan::Reuse),
            (view("u1", "b"), SessionPlan::Migrate { from: "b".into() }),
            (view("u2", "a"), SessionPlan::Create),
            (view("u2", "b"), SessionPlan::Create),
        ];
        for (asked, expected) in cases {
            assert_eq!(plan_session(asked.clone(), "u1", "a"), expected, "{asked:?}");
        }
    }

    #[test]
    fn migration_budget() {
        let window = 600_000;
        let cases = [
            (None, 0, Ok(())),
            (Some(1_000), 1_000, Err(BudgetError::Spent { retry_after_secs: 600 })),
            (Some(1_000), 300_500, Err(BudgetError::Spent { retry_after_secs: 301 })),
            (Some(1_000), 600_999, Err(BudgetError::Spent { retry_after_secs: 1 })),
            (Some(1_000), 601_000, Ok(())),
        ];
        for (last, now, expected) in cases {
            assert_eq!(
                check_migration_budget(last, now, window),
                expected,
                "last {last:?} now {now}"
            );
        }
        assert!(check_migration_budget(Some(u64::MAX - 5), 10, window).is_err());
    }

    #[test]
    fn versions() {
        assert_eq!(next_version(None, None), Ok(1));
        assert_eq!(next_version(Some(4), Some(4)), Ok(5));
        assert_eq!(
            next_version(Some(4), Some(5)),
            Err(VersionError::Stale { read: Some(4), stored: Some(5) })
        );
        assert_eq!(
            next_version(None, Some(1)),
            Err(VersionError::Stale { read: None, stored: Some(1) })
        );
        assert_eq!(
            next_version(Some(1), None),
            Err(VersionError::Stale { read: Some(1), stored: None })
        );
    }
}
