//! What makes a credential single use and revocable on this node: spent token nonces
//! (`token_nonce`: nonce → expiry, indexed in `nonce_expiry`), revoked resume credentials
//! (`session_revoked`: session → when, indexed in `revoked_expiry`), and the named
//! secrets tokens are signed with (`meta` keys `secret:<name>`).
//!
//! It also defines the one seam behind which every credential record is kept,
//! [`CredentialStore`] (the decisions about credentials are `core::credentials`'): this
//! node's store ([`StoreCredentials`]), or NATS with this store beside it in cluster mode
//! (`cluster::credentials`). The wiring picks one at start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{ready, LocalBoxFuture};

use super::records::{self, NonceRecord, RevokedRecord};
use super::time_index::TimeIndex;
use super::{Store, StoreError};

/// Where a nonce was marked used, so that giving it back undoes exactly that mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpentIn {
    /// This node's store (one node, or NATS was away).
    Store,
    /// NATS (cluster mode).
    Nats,
}

/// The part of [`CredentialStore`] a connection uses: a kicked or replaced connection
/// voids its session's resume credentials.
pub trait ResumeRevocations: Send + Sync {
    /// Credentials of `session` issued at or before `upto_ms` stop working.
    fn revoke(&self, session: &str, upto_ms: u64);
}

/// The credential records, where the deployment keeps them: marks token and resume
/// nonces used (so a credential opens one connection only) and gives them back, says
/// when a session's resume credentials were revoked ([`ResumeRevocations`]) and when a
/// user was kicked. Implemented by the embedded store and by the cluster.
pub trait CredentialStore: ResumeRevocations + 'static {
    /// Where `nonce` was marked, the first time it is used (`None`: used before); it is
    /// remembered until `expires_at_ms`.
    fn use_nonce<'a>(
        &'a self,
        nonce: &'a [u8; 16],
        expires_at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<Option<SpentIn>, StoreError>>;
    /// Give back a nonce this handshake just marked used where it was marked, because the
    /// handshake was refused before anything opened (a refusal the client is told to
    /// retry). While it was marked nobody else could use it, so it still opens at most
    /// one connection.
    fn unuse_nonce<'a>(
        &'a self,
        nonce: &'a [u8; 16],
        spent: SpentIn,
    ) -> LocalBoxFuture<'a, Result<(), StoreError>>;
    /// Record that `user` (on `device` only, when given) was kicked at `at_ms`: every
    /// credential issued to them at or before then is void. Resolves once that is
    /// durable (the store flushed; in cluster mode NATS acknowledged, or failed and the
    /// kick holds on this node only).
    fn kick_user<'a>(
        &'a self,
        user: &'a str,
        device: Option<&'a str>,
        at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<(), StoreError>>;
    /// When `user` was last kicked on every device or on `device`, whichever is later.
    fn kicked_at<'a>(
        &'a self,
        user: &'a str,
        device: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>>;
    /// When `session`'s resume credentials were last revoked (a kick or a replace).
    fn resumes_revoked_at<'a>(
        &'a self,
        session: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>>;
    /// Resolves once every revocation asked for before the call is durable: the store
    /// flushed and, in cluster mode, each NATS write acknowledged (or failed, when the
    /// revocation holds on this node only). A kick answers only after this.
    fn revocations_durable(&self) -> LocalBoxFuture<'_, Result<(), StoreError>>;
}

/// Single node: the embedded store; revocations are kept for `resume_ttl`, kicks for
/// `credential_ttl`.
pub struct StoreCredentials {
    pub store: Store,
    pub resume_ttl: Duration,
    /// The longest a credential lives (`token_ttl_max` or `resume_ttl`): how long a kick
    /// has something to void.
    pub credential_ttl: Duration,
}

impl StoreCredentials {
    /// `resume_ttl`: how long a resume credential lives; `token_ttl_max`: the longest a
    /// token may.
    pub fn new(store: &Store, resume_ttl: Duration, token_ttl_max: Duration) -> Self {
        StoreCredentials {
            store: store.clone(),
            resume_ttl,
            credential_ttl: token_ttl_max.max(resume_ttl),
        }
    }

    /// Record a kick in this store (not yet flushed).
    pub fn record_kick(
        &self,
        user: &str,
        device: Option<&str>,
        at_ms: u64,
    ) -> Result<(), StoreError> {
        let keep_until = at_ms.saturating_add(self.credential_ttl.as_millis() as u64);
        self.store.kicks().record(user, device, at_ms, keep_until)
    }
}

impl CredentialStore for StoreCredentials {
    fn use_nonce<'a>(
        &'a self,
        nonce: &'a [u8; 16],
        expires_at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<Option<SpentIn>, StoreError>> {
        Box::pin(ready(
            self.store
                .credentials()
                .use_nonce(nonce, expires_at_ms)
                .map(|fresh| fresh.then_some(SpentIn::Store)),
        ))
    }

    fn unuse_nonce<'a>(
        &'a self,
        nonce: &'a [u8; 16],
        _spent: SpentIn,
    ) -> LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(ready(self.store.credentials().unuse_nonce(nonce)))
    }

    fn kick_user<'a>(
        &'a self,
        user: &'a str,
        device: Option<&'a str>,
        at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.record_kick(user, device, at_ms)?;
            self.store.flush_soon().await
        })
    }

    fn kicked_at<'a>(
        &'a self,
        user: &'a str,
        device: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(ready(self.store.kicks().kicked_at(user, device)))
    }

    fn resumes_revoked_at<'a>(
        &'a self,
        session: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(ready(self.store.credentials().resumes_revoked_at(session)))
    }

    fn revocations_durable(&self) -> LocalBoxFuture<'_, Result<(), StoreError>> {
        // Revocations are written to the store at once; a flush makes them durable.
        Box::pin(self.store.flush_soon())
    }
}

impl ResumeRevocations for StoreCredentials {
    fn revoke(&self, session: &str, at_ms: u64) {
        let keep_until = at_ms.saturating_add(self.resume_ttl.as_millis() as u64);
        if let Err(error) = self.store.credentials().revoke_resumes(session, at_ms, keep_until) {
            tracing::warn!(session, %error, "could not revoke the session's resume credentials");
        }
    }
}

/// The credential trees ([`Store::credentials`](super::Store::credentials)).
#[derive(Clone)]
pub struct Credentials {
    db: sled::Db,
    meta: sled::Tree,
    pub(super) token_nonce: sled::Tree,
    session_revoked: sled::Tree,
    /// `token_nonce` by expiry.
    pub(super) nonces_by_expiry: TimeIndex,
    /// `session_revoked` by the time it may be forgotten.
    pub(super) revocations_by_expiry: TimeIndex,
    /// Whether a revocation may be stored: false while `session_revoked` was empty at open
    /// and nothing was revoked since, so a resume handshake's
    /// [`Credentials::resumes_revoked_at`] reads nothing then. Never goes back to false
    /// while running.
    any_revoked: Arc<AtomicBool>,
}

impl Credentials {
    pub(super) fn open(db: &sled::Db, meta: &sled::Tree) -> Result<Credentials, StoreError> {
        let token_nonce = db.open_tree("token_nonce")?;
        let session_revoked = db.open_tree("session_revoked")?;
        Ok(Credentials {
            nonces_by_expiry: TimeIndex::open(
                db,
                "nonce_expiry",
                &token_nonce,
                "token_nonce",
                |value| {
                    records::decode::<NonceRecord>("token_nonce", value).map(|r| r.expires_at_ms)
                },
            )?,
            revocations_by_expiry: TimeIndex::open(
                db,
                "revoked_expiry",
                &session_revoked,
                "session_revoked",
                |value| {
                    records::decode::<RevokedRecord>("session_revoked", value)
                        .map(|r| r.keep_until_ms)
                },
            )?,
            db: db.clone(),
            meta: meta.clone(),
            token_nonce,
            any_revoked: Arc::new(AtomicBool::new(!session_revoked.is_empty())),
            session_revoked,
        })
    }

    /// A named secret of 32 random bytes, created on first use and kept for good.
    pub fn secret(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        let key = format!("secret:{name}");
        if let Some(existing) = self.meta.get(&key)? {
            return Ok(existing.to_vec());
        }
        let mut fresh = [0u8; 32];
        getrandom::getrandom(&mut fresh)?;
        // Two callers racing: the first insert wins and both read it back.
        let _ = self.meta.compare_and_swap(&key, None as Option<&[u8]>, Some(&fresh[..]))?;
        let stored = self.meta.get(&key)?.ok_or(StoreError::Closed)?;
        self.db.flush()?;
        Ok(stored.to_vec())
    }

    /// Mark a token nonce used. `Ok(false)` when it was used before (a replay).
    pub fn use_nonce(&self, nonce: &[u8; 16], expires_at_ms: u64) -> Result<bool, StoreError> {
        let record = records::encode(&NonceRecord { expires_at_ms });
        // Indexed first: a replay adds the same entry again (same token, same expiry).
        self.nonces_by_expiry.note(nonce, expires_at_ms)?;
        let swapped =
            self.token_nonce.compare_and_swap(nonce, None as Option<&[u8]>, Some(record))?;
        Ok(swapped.is_ok())
    }

    /// Give back a nonce [`Credentials::use_nonce`] just marked: the connection it was
    /// spent for was refused before it opened (a refusal the client is told to retry).
    pub fn unuse_nonce(&self, nonce: &[u8; 16]) -> Result<(), StoreError> {
        self.token_nonce.remove(nonce)?;
        Ok(())
    }

    /// Void the resume credentials of `session` issued at or before `at_ms`; remembered
    /// until `keep_until_ms` (when the last of them expires). A later revocation wins.
    pub fn revoke_resumes(
        &self,
        session: &str,
        at_ms: u64,
        keep_until_ms: u64,
    ) -> Result<(), StoreError> {
        let record = RevokedRecord { at_ms, keep_until_ms };
        // Before the record: a reader that finds no revocation yet read before it.
        self.any_revoked.store(true, Ordering::SeqCst);
        // Whichever record stays, its own time was indexed when it was written.
        self.revocations_by_expiry.note(session.as_bytes(), keep_until_ms)?;
        self.session_revoked.fetch_and_update(session.as_bytes(), |old| {
            let newer = old
                .and_then(|bytes| records::decode::<RevokedRecord>("session_revoked", bytes).ok())
                .filter(|old| old.at_ms > at_ms);
            Some(records::encode(newer.as_ref().unwrap_or(&record)))
        })?;
        Ok(())
    }

    /// When the resume credentials of `session` were last revoked, if they were.
    pub fn resumes_revoked_at(&self, session: &str) -> Result<Option<u64>, StoreError> {
        if !self.any_revoked.load(Ordering::SeqCst) {
            return Ok(None);
        }
        let record = self.session_revoked.get(session.as_bytes())?;
        Ok(record
            .map(|bytes| records::decode::<RevokedRecord>("session_revoked", &bytes))
            .transpose()?
            .map(|r| r.at_ms))
    }

    /// Forget nonces of tokens (and revocations of resume credentials) that have expired
    /// anyway, reading only their time indexes up to `now_ms`. Returns how many.
    pub fn purge(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut removed = 0;
        for index in [&self.nonces_by_expiry, &self.revocations_by_expiry] {
            removed += index.purge(now_ms)?;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use crate::store::{records, Store};

    #[test]
    fn nonces_are_single_use_and_purged_after_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let credentials = store.credentials();
        assert!(credentials.use_nonce(&[1; 16], 100).unwrap());
        assert!(!credentials.use_nonce(&[1; 16], 100).unwrap());
        assert!(credentials.use_nonce(&[2; 16], 300).unwrap());
        assert_eq!(credentials.purge(200).unwrap(), 1);
        assert!(!credentials.use_nonce(&[2; 16], 300).unwrap());
    }

    #[test]
    fn an_undecodable_nonce_is_removed_and_never_stops_the_purge() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let credentials = store.credentials();
        for (n, expires) in [(1u8, 100), (2, 100), (3, 150), (4, 300)] {
            assert!(credentials.use_nonce(&[n; 16], expires).unwrap());
        }
        credentials.token_nonce.insert([2u8; 16], &[9, 9, 9][..]).unwrap();
        credentials.token_nonce.insert([3u8; 16], &[][..]).unwrap();
        credentials.revoke_resumes("s1", 10, 120).unwrap();
        credentials.session_revoked.insert("s1", &[records::RECORD_VERSION][..]).unwrap();
        // An index entry too short to name a key.
        credentials.nonces_by_expiry.entries.insert([0u8; 3], &[][..]).unwrap();
        assert_eq!(
            credentials.purge(200).unwrap(),
            4,
            "1, the corrupt 2 and 3, and s1's revocation"
        );
        assert_eq!(credentials.token_nonce.len(), 1);
        assert!(!credentials.use_nonce(&[4; 16], 300).unwrap(), "the one not due is still spent");
        assert_eq!(credentials.resumes_revoked_at("s1").unwrap(), None);
        assert_eq!(credentials.nonces_by_expiry.entries.len(), 1, "only the entry not due is left");
        assert_eq!(credentials.purge(300).unwrap(), 1);
        assert_eq!(
            (credentials.token_nonce.len(), credentials.nonces_by_expiry.entries.len()),
            (0, 0)
        );
    }

    #[test]
    fn a_purge_reads_only_what_is_due() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let credentials = store.credentials();
        for n in 0..1_000u64 {
            let mut nonce = [0u8; 16];
            nonce[..8].copy_from_slice(&n.to_be_bytes());
            assert!(credentials.use_nonce(&nonce, 1_000 + n).unwrap());
        }
        // A record the index does not know is never read: a purge cannot trip on it.
        credentials.token_nonce.insert([0xff; 16], &b"garbage"[..]).unwrap();
        assert_eq!(credentials.purge(1_009).unwrap(), 10);
        assert_eq!(credentials.nonces_by_expiry.entries.len(), 990);
        assert_eq!(credentials.token_nonce.len(), 991);
    }

    #[test]
    fn a_nonce_given_back_can_be_spent_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let credentials = store.credentials();
        assert!(credentials.use_nonce(&[1; 16], 100).unwrap());
        credentials.unuse_nonce(&[1; 16]).unwrap();
        assert!(credentials.use_nonce(&[1; 16], 100).unwrap());
        assert!(!credentials.use_nonce(&[1; 16], 100).unwrap());
    }

    #[test]
    fn resume_revocations_keep_the_latest_time_until_they_are_purged() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let credentials = store.credentials();
        assert_eq!(credentials.resumes_revoked_at("s1").unwrap(), None);
        credentials.revoke_resumes("s1", 100, 700).unwrap();
        credentials.revoke_resumes("s1", 50, 650).unwrap();
        assert_eq!(
            credentials.resumes_revoked_at("s1").unwrap(),
            Some(100),
            "an older revocation does not win"
        );
        credentials.revoke_resumes("s1", 200, 800).unwrap();
        assert_eq!(credentials.resumes_revoked_at("s1").unwrap(), Some(200));
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        let credentials = store.credentials();
        assert_eq!(
            credentials.resumes_revoked_at("s1").unwrap(),
            Some(200),
            "kept across a restart"
        );
        assert_eq!(credentials.purge(799).unwrap(), 0);
        assert_eq!(credentials.purge(800).unwrap(), 1);
        assert_eq!(credentials.resumes_revoked_at("s1").unwrap(), None);
    }

    #[test]
    fn secret_is_stable_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let first = Store::open(dir.path()).unwrap().credentials().secret("token").unwrap();
        assert_eq!(first.len(), 32);
        assert_eq!(Store::open(dir.path()).unwrap().credentials().secret("token").unwrap(), first);
    }
}
