//! What a cluster call can fail with: [`ClusterError`], why NATS was not reached
//! ([`Unreachable`]), and async-nats' errors classified as no answer or an answer
//! ([`NatsError::no_answer`]).

use std::time::Duration;

use async_nats::jetstream::context::{CreateStreamErrorKind, PublishErrorKind};
use async_nats::jetstream::kv::{
    CreateErrorKind, EntryErrorKind, PutErrorKind, UpdateErrorKind, WatchErrorKind,
    WatcherErrorKind,
};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, PurgeErrorKind};
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::{self, kv as nats_kv, stream};
use thiserror::Error;

use crate::core::nodes::routing::MoveRefused;
use crate::core::nodes::sessions::VersionError;
use crate::store::StoreError;

#[derive(Debug, Error)]
pub enum ClusterError {
    /// NATS could not be reached or gave no answer: callers may fall back (the session
    /// directory's cache and queue, a nonce checked on this node only).
    #[error("NATS is unreachable: {0}")]
    Unavailable(#[source] Unreachable),
    /// NATS answered, and refused (or async-nats refused before sending).
    #[error("NATS: {0}")]
    Nats(#[source] NatsError),
    /// `url` as [`url_for_log`](crate::core::rules::redact::url_for_log) shows it: without its
    /// credentials.
    #[error("could not connect to NATS at {url}: {source}")]
    Connect { url: String, source: async_nats::ConnectError },
    #[error(transparent)]
    Stale(#[from] VersionError),
    #[error("corrupt cluster record: {0}")]
    Corrupt(#[source] StoreError),
    /// A record another node created first is not there when read.
    #[error("corrupt cluster record: {0} vanished")]
    Vanished(String),
    /// The sled queue that keeps directory writes through an outage failed.
    #[error("could not queue the write: {0}")]
    Queue(#[source] StoreError),
    /// A user's record kept changing under this node's read-modify-write.
    #[error("user {0}: too many concurrent updates")]
    Contended(String),
    /// With cell domains: a write to a room homed in another cell, which only that
    /// cell's writer makes.
    #[error("room {room} is homed in cell {home}: only that cell writes it")]
    NotHome { room: String, home: String },
    /// A promotion that cannot be made (see [`PromotionError`]).
    #[error(transparent)]
    Promotion(#[from] PromotionError),
    /// A room's occupancy record kept changing under this node's compare-and-set.
    #[error("room {0}: too many concurrent occupancy updates")]
    RoomContended(String),
}

/// Why a promotion is refused.
#[derive(Debug, Error)]
pub enum PromotionError {
    #[error(
        "cells share one NATS here (cluster_cell_domains is off): there is no mirror to promote"
    )]
    NoCellDomains,
    #[error(transparent)]
    Refused(#[from] MoveRefused),
    #[error("cell {0:?}'s rooms already moved to this cell")]
    AlreadyHere(String),
}

/// Why NATS could not be reached.
#[derive(Debug, Error)]
pub enum Unreachable {
    #[error("not connected")]
    NotConnected,
    /// The session directory has been unreachable longer than `directory_outage_secs`.
    #[error("session directory unreachable for {} s; new sessions are refused until it is back", .0.as_secs())]
    Outage(Duration),
    /// A room's home cell did not answer (another cell's NATS, through the leaf).
    #[error("the room's home cell did not answer: {0}")]
    HomeCell(String),
    /// A cell probe's write and read took longer than this.
    #[error("the cell probe got no answer within {} ms", .0.as_millis())]
    ProbeTimedOut(Duration),
    /// A read of a mirror's state (its lag) took longer than this.
    #[error("the mirror's stream info got no answer within {} ms", .0.as_millis())]
    InfoTimedOut(Duration),
    /// A call that got no answer (timed out, connection lost, no JetStream responder).
    #[error(transparent)]
    NoAnswer(NatsError),
}

/// An async-nats error, typed as the call that failed returns it.
#[derive(Debug, Error)]
pub enum NatsError {
    #[error(transparent)]
    Stream(#[from] jetstream::context::CreateStreamError),
    /// A stream handle refused (a name JetStream does not take).
    #[error(transparent)]
    Handle(#[from] jetstream::context::GetStreamError),
    #[error(transparent)]
    Bucket(#[from] jetstream::context::KeyValueError),
    #[error(transparent)]
    Entry(#[from] nats_kv::EntryError),
    #[error(transparent)]
    Create(#[from] nats_kv::CreateError),
    #[error(transparent)]
    Update(#[from] nats_kv::UpdateError),
    #[error(transparent)]
    Put(#[from] nats_kv::PutError),
    #[error(transparent)]
    Keys(#[from] nats_kv::WatchError),
    #[error(transparent)]
    Key(#[from] nats_kv::WatcherError),
    /// A read of a stream, answered by its leader (`roomlog`: what a room knows).
    #[error(transparent)]
    Read(#[from] stream::LastRawMessageError),
    #[error(transparent)]
    Append(#[from] jetstream::context::PublishError),
    #[error(transparent)]
    Purge(#[from] stream::PurgeError),
    #[error(transparent)]
    Delete(#[from] stream::DeleteMessageError),
    #[error(transparent)]
    Publish(#[from] async_nats::PublishError),
    #[error(transparent)]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error(transparent)]
    Flush(#[from] async_nats::client::FlushError),
    /// A JetStream API request (a stream's info).
    #[error(transparent)]
    Request(#[from] jetstream::context::RequestError),
}

impl NatsError {
    /// Whether the call got no answer from NATS, judged by the error's kind: a timeout,
    /// a lost connection, no JetStream responder. async-nats reports a lost connection as
    /// `Other` for KV reads and writes, so those count as no answer too; an invalid key or
    /// subject, a JetStream error response or a size limit is an answer.
    pub fn no_answer(&self) -> bool {
        match self {
            NatsError::Stream(e) => matches!(
                e.kind(),
                CreateStreamErrorKind::TimedOut | CreateStreamErrorKind::JetStreamUnavailable
            ),
            // Opening a bucket at start-up, where nothing falls back: its kinds (the
            // name, the bucket's stream, JetStream) do not tell a timeout apart.
            NatsError::Bucket(_) | NatsError::Handle(_) => false,
            NatsError::Entry(e) => {
                matches!(e.kind(), EntryErrorKind::TimedOut | EntryErrorKind::Other)
            }
            NatsError::Create(e) => {
                matches!(e.kind(), CreateErrorKind::Publish | CreateErrorKind::Other)
            }
            NatsError::Update(e) => {
                matches!(e.kind(), UpdateErrorKind::TimedOut | UpdateErrorKind::Other)
            }
            NatsError::Put(e) => matches!(e.kind(), PutErrorKind::Publish | PutErrorKind::Ack),
            NatsError::Keys(e) => {
                matches!(e.kind(), WatchErrorKind::TimedOut | WatchErrorKind::Other)
            }
            NatsError::Key(e) => e.kind() == WatcherErrorKind::Other,
            // A stream between leaders answers "not available", or nothing (`Other`).
            NatsError::Read(e) => match e.kind() {
                LastRawMessageErrorKind::Other => true,
                LastRawMessageErrorKind::JetStream(e) => {
                    [ErrorCode::CLUSTER_NOT_AVAILABLE, ErrorCode::STREAM_OFFLINE]
                        .contains(&e.error_code())
                }
                LastRawMessageErrorKind::NoMessageFound
                | LastRawMessageErrorKind::InvalidSubject => false,
            },
            NatsError::Append(e) => {
                matches!(
                    e.kind(),
                    PublishErrorKind::TimedOut
                        | PublishErrorKind::BrokenPipe
                        | PublishErrorKind::StreamNotFound
                )
            }
            NatsError::Purge(e) => {
                matches!(e.kind(), PurgeErrorKind::TimedOut | PurgeErrorKind::Request)
            }
            NatsError::Delete(e) => matches!(
                e.kind(),
                stream::DeleteMessageErrorKind::TimedOut | stream::DeleteMessageErrorKind::Request
            ),
            NatsError::Publish(e) => e.kind() == async_nats::PublishErrorKind::Send,
            NatsError::Subscribe(e) => e.kind() == async_nats::SubscribeErrorKind::Other,
            // Either kind is the connection's: the client could not send, or got no pong.
            NatsError::Flush(_) => true,
            NatsError::Request(e) => matches!(
                e.kind(),
                jetstream::context::RequestErrorKind::TimedOut
                    | jetstream::context::RequestErrorKind::NoResponders
                    | jetstream::context::RequestErrorKind::Other
            ),
        }
    }
}

impl From<NatsError> for ClusterError {
    fn from(e: NatsError) -> Self {
        if e.no_answer() {
            ClusterError::Unavailable(Unreachable::NoAnswer(e))
        } else {
            ClusterError::Nats(e)
        }
    }
}

/// `?` on any async-nats call: the error classified by its kind.
macro_rules! from_nats_errors {
    ($($error:ty),* $(,)?) => {$(
        impl From<$error> for ClusterError {
            fn from(e: $error) -> Self {
                NatsError::from(e).into()
            }
        }
    )*};
}

from_nats_errors!(
    jetstream::context::CreateStreamError,
    jetstream::context::KeyValueError,
    jetstream::context::GetStreamError,
    nats_kv::EntryError,
    nats_kv::CreateError,
    nats_kv::UpdateError,
    nats_kv::PutError,
    nats_kv::WatchError,
    nats_kv::WatcherError,
    stream::LastRawMessageError,
    jetstream::context::PublishError,
    stream::PurgeError,
    stream::DeleteMessageError,
    async_nats::PublishError,
    async_nats::SubscribeError,
    async_nats::client::FlushError,
    jetstream::context::RequestError,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_errors_are_classified_by_kind() {
        let js_error = |code: u64| -> jetstream::Error {
            serde_json::from_value(
                serde_json::json!({"code": 503, "err_code": code, "description": "test"}),
            )
            .expect("a JetStream error")
        };
        let read = |kind| ClusterError::from(stream::LastRawMessageError::new(kind));
        let unreachable =
            |e: ClusterError| matches!(e, ClusterError::Unavailable(Unreachable::NoAnswer(_)));
        let cases: [(ClusterError, bool); 13] = [
            (nats_kv::EntryError::new(EntryErrorKind::TimedOut).into(), true),
            (nats_kv::EntryError::new(EntryErrorKind::InvalidKey).into(), false),
            (nats_kv::UpdateError::new(UpdateErrorKind::TimedOut).into(), true),
            (jetstream::context::PublishError::new(PublishErrorKind::StreamNotFound).into(), true),
            (jetstream::context::PublishError::new(PublishErrorKind::BrokenPipe).into(), true),
            (
                jetstream::context::PublishError::new(PublishErrorKind::MaxPayloadExceeded).into(),
                false,
            ),
            (read(LastRawMessageErrorKind::Other), true),
            (
                read(LastRawMessageErrorKind::JetStream(js_error(
                    ErrorCode::CLUSTER_NOT_AVAILABLE.0,
                ))),
                true,
            ),
            (
                read(LastRawMessageErrorKind::JetStream(js_error(ErrorCode::STREAM_NOT_FOUND.0))),
                false,
            ),
            (read(LastRawMessageErrorKind::NoMessageFound), false),
            (stream::PurgeError::new(PurgeErrorKind::TimedOut).into(), true),
            (
                stream::DeleteMessageError::new(stream::DeleteMessageErrorKind::TimedOut).into(),
                true,
            ),
            (stream::DeleteMessageError::new(stream::DeleteMessageErrorKind::Request).into(), true),
        ];
        for (error, expected) in cases {
            let text = error.to_string();
            assert_eq!(text.starts_with("NATS is unreachable: "), expected, "{text}");
            assert_eq!(unreachable(error), expected, "{text}");
        }
    }

    #[test]
    fn cluster_errors_cross_threads() {
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<ClusterError>();
    }
}
