//! The cluster's side of the credential seam (`store::credentials::CredentialStore`):
//! token and resume nonces, resume revocations and kicks in the nonce bucket, so a
//! credential is single use and a revocation or kick holds on every node; while NATS is
//! away, in this node's store ([`ClusterCredentials`] keeps both).

use std::collections::BTreeSet;
use std::sync::Arc;

use async_nats::jetstream::kv::{self as nats_kv, CreateErrorKind, UpdateErrorKind};
use futures_util::future::LocalBoxFuture;

use super::errors::{ClusterError, Unreachable};
use super::setup::leader_get;
use super::Cluster;
use crate::store::credentials::{CredentialStore, ResumeRevocations, SpentIn, StoreCredentials};
use crate::store::StoreError;

/// Compare-and-set rounds a kick record gets against other kicks of the same user.
const KICK_WRITE_ATTEMPTS: usize = 8;

/// The nonce bucket's key of a user's kick (of every device, or of `device`).
fn kicked_key(user: &str, device: Option<&str>) -> String {
    match device {
        None => format!("kicked.{}", hex::encode(user)),
        Some(device) => format!("kicked.{}.{}", hex::encode(user), hex::encode(device)),
    }
}

/// A kick time as the nonce bucket holds it.
fn decode_ms(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_be_bytes)
}

/// The nonce bucket's key of a session's resume revocation.
fn revoked_key(session: &str) -> String {
    format!("revoked.{}", hex::encode(session))
}

impl Cluster {
    /// Mark a token nonce used cluster-wide. `Ok(false)`: used before (a replay).
    pub async fn use_nonce(&self, nonce: &[u8; 16]) -> Result<bool, ClusterError> {
        if !self.connected() {
            return Err(ClusterError::Unavailable(Unreachable::NotConnected));
        }
        let key = hex::encode(nonce);
        match self.nonces.create(&key, vec![1u8].into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Give back a nonce [`Cluster::use_nonce`] just marked (nobody else can have marked
    /// it since): the connection it was spent for was refused before it opened.
    pub async fn unuse_nonce(&self, nonce: &[u8; 16]) -> Result<(), ClusterError> {
        if !self.connected() {
            return Err(ClusterError::Unavailable(Unreachable::NotConnected));
        }
        self.nonces.delete(hex::encode(nonce)).await?;
        Ok(())
    }

    /// Void every credential of `user` (on `device` only, when given) issued at or before
    /// `at_ms`, on every node; a later kick wins (compare-and-set on the record). The
    /// record ages out with the nonce bucket, after the credentials would have expired.
    pub async fn record_kick(
        &self,
        user: &str,
        device: Option<&str>,
        at_ms: u64,
    ) -> Result<(), ClusterError> {
        if !self.connected() {
            return Err(ClusterError::Unavailable(Unreachable::NotConnected));
        }
        let key = kicked_key(user, device);
        let value = || at_ms.to_be_bytes().to_vec().into();
        for _ in 0..KICK_WRITE_ATTEMPTS {
            let current =
                self.nonces.entry(&key).await?.filter(|e| e.operation == nats_kv::Operation::Put);
            let written = match current {
                Some(entry) if decode_ms(&entry.value).is_some_and(|stored| stored >= at_ms) => {
                    return Ok(())
                }
                Some(entry) => match self.nonces.update(&key, value(), entry.revision).await {
                    Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => false,
                    other => other.map(|_| true)?,
                },
                None => match self.nonces.create(&key, value()).await {
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => false,
                    other => other.map(|_| true)?,
                },
            };
            if written {
                return Ok(());
            }
        }
        Err(ClusterError::Contended(user.to_string()))
    }

    /// When `user` was last kicked on every device or on `device`, whichever is later,
    /// if within the bucket's age.
    pub async fn kicked_at(&self, user: &str, device: &str) -> Result<Option<u64>, ClusterError> {
        if !self.connected() {
            return Err(ClusterError::Unavailable(Unreachable::NotConnected));
        }
        let (every, one) = futures_util::future::join(
            leader_get(&self.nonces, &kicked_key(user, None)),
            leader_get(&self.nonces, &kicked_key(user, Some(device))),
        )
        .await;
        Ok(every?.and_then(|b| decode_ms(&b)).max(one?.and_then(|b| decode_ms(&b))))
    }

    /// Void `session`'s resume credentials issued before `at_ms`, on every node (the
    /// record ages out with the nonce bucket, after the credentials would have expired).
    pub async fn revoke_resumes(&self, session: &str, at_ms: u64) -> Result<(), ClusterError> {
        if !self.connected() {
            return Err(ClusterError::Unavailable(Unreachable::NotConnected));
        }
        self.nonces.put(revoked_key(session), at_ms.to_be_bytes().to_vec().into()).await?;
        Ok(())
    }

    /// When `session`'s resume credentials were last revoked, if within the bucket's age.
    pub async fn resumes_revoked_at(&self, session: &str) -> Result<Option<u64>, ClusterError> {
        if !self.connected() {
            return Err(ClusterError::Unavailable(Unreachable::NotConnected));
        }
        let value = leader_get(&self.nonces, &revoked_key(session)).await?;
        Ok(value.and_then(|bytes| decode_ms(&bytes)))
    }
}

/// Cluster mode: the credential records are kept in NATS, so a credential is single use
/// across nodes; while NATS is unreachable, in this node's store (single use on this node
/// at least). Revocations and kicks go to both, so this node honours them even while NATS
/// is away.
pub struct ClusterCredentials {
    pub cluster: Cluster,
    pub local: StoreCredentials,
    /// Revocations on their way to NATS.
    pub sending: Arc<InFlight>,
}

impl ResumeRevocations for ClusterCredentials {
    fn revoke(&self, session: &str, at_ms: u64) {
        self.local.revoke(session, at_ms);
        let (cluster, session) = (self.cluster.clone(), session.to_string());
        let sent = InFlight::start(&self.sending);
        actix::spawn(async move {
            if let Err(error) = cluster.revoke_resumes(&session, at_ms).await {
                tracing::warn!(session, %error, "resume credentials revoked on this node only");
            }
            drop(sent);
        });
    }
}

/// Writes started and not yet finished, so a caller can wait for those started before
/// it. Bounded by the writes in flight (each ends with its NATS request's timeout).
#[derive(Default)]
pub struct InFlight {
    /// The next write's number, and the numbers of those still running.
    running: parking_lot::Mutex<(u64, BTreeSet<u64>)>,
    finished: tokio::sync::Notify,
}

/// One write in flight; finished when dropped (also when its task is cancelled).
pub struct Sending {
    to: Arc<InFlight>,
    id: u64,
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.to.running.lock().1.remove(&self.id);
        self.to.finished.notify_waiters();
    }
}

impl InFlight {
    pub fn start(this: &Arc<InFlight>) -> Sending {
        let mut running = this.running.lock();
        let id = running.0;
        running.0 += 1;
        running.1.insert(id);
        Sending { to: Arc::clone(this), id }
    }

    /// Resolves once every write started before the call has finished.
    pub async fn settled(&self) {
        let before = self.running.lock().0;
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            if self.running.lock().1.range(..before).next().is_none() {
                return;
            }
            finished.await;
        }
    }
}

impl CredentialStore for ClusterCredentials {
    fn revocations_durable(&self) -> LocalBoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.sending.settled().await;
            self.local.revocations_durable().await
        })
    }

    fn resumes_revoked_at<'a>(
        &'a self,
        session: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let here = self.local.store.credentials().resumes_revoked_at(session)?;
            match self.cluster.resumes_revoked_at(session).await {
                Ok(there) => Ok(here.max(there)),
                Err(error) => {
                    tracing::warn!(%error, "resume revocations checked on this node only");
                    Ok(here)
                }
            }
        })
    }

    fn use_nonce<'a>(
        &'a self,
        nonce: &'a [u8; 16],
        expires_at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<Option<SpentIn>, StoreError>> {
        Box::pin(async move {
            match self.cluster.use_nonce(nonce).await {
                Ok(fresh) => Ok(fresh.then_some(SpentIn::Nats)),
                Err(error) => {
                    tracing::warn!(%error, "token nonce checked on this node only");
                    self.local.use_nonce(nonce, expires_at_ms).await
                }
            }
        })
    }

    fn unuse_nonce<'a>(
        &'a self,
        nonce: &'a [u8; 16],
        spent: SpentIn,
    ) -> LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            match spent {
                SpentIn::Store => self.local.store.credentials().unuse_nonce(nonce),
                SpentIn::Nats => {
                    if let Err(error) = self.cluster.unuse_nonce(nonce).await {
                        // It stays spent: the client gets a new credential, as before.
                        tracing::warn!(%error, "a refused handshake's nonce could not be given back");
                    }
                    Ok(())
                }
            }
        })
    }

    fn kick_user<'a>(
        &'a self,
        user: &'a str,
        device: Option<&'a str>,
        at_ms: u64,
    ) -> LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.local.record_kick(user, device, at_ms)?;
            if let Err(error) = self.cluster.record_kick(user, device, at_ms).await {
                tracing::warn!(user, %error, "kick recorded on this node only");
            }
            self.local.store.flush_soon().await
        })
    }

    fn kicked_at<'a>(
        &'a self,
        user: &'a str,
        device: &'a str,
    ) -> LocalBoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let here = self.local.store.kicks().kicked_at(user, device)?;
            match self.cluster.kicked_at(user, device).await {
                Ok(there) => Ok(here.max(there)),
                Err(error) => {
                    tracing::warn!(%error, "kicks checked on this node only");
                    Ok(here)
                }
            }
        })
    }
}
