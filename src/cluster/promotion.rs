//! Promotion: an operator moves every room of a cell lost for good to another cell (with
//! cell domains). The receiving cell's mirror of the lost cell's rooms stream
//! (`LG_ROOMS_<cell>`, and `LG_STATE_<cell>`) stops mirroring in place and becomes the
//! rooms' origin there: it keeps the origin's stream sequences, takes new events on
//! `lg.room.<cell>@<to>.<room>` and stores them under the origin's own subjects
//! (`lg.room.<cell>.<room>`, a subject transform), so a room's history stays one subject
//! and the old origin, if it comes back, never takes the new events (its stream listens
//! on `lg.room.<cell>.>` only). The rooms get a new epoch (the promoted stream's
//! identity): a client resuming with the old one gets `recovered:false`, never a silent
//! gap over the events the mirror had not received, whose count the promotion reports
//! (the origin's last sequence its heartbeats announced, `Lg-Rooms-Head`, against the
//! mirror's). The move is recorded in the receiving cell's `lg_meta` (`moved.<cell>`),
//! announced with every heartbeat (`Lg-Moves`), and each node that learns it records it
//! in its own cell's `lg_meta` too, so the old origin's nodes, back, write none of its
//! rooms: they forward them to the new home. Live copies republished by a stream that is
//! not the room's home (the old origin, back before it learnt the move) are dropped
//! ([`super::cells::RoomPlace::live_stream`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use futures_util::FutureExt;

use super::errors::ClusterError;
pub use super::errors::PromotionError;
use super::names::{
    mirror_name, LIVE_STATE_SUBJECTS, LIVE_SUBJECTS, META_BUCKET, ROOMS_STREAM, STATE_STREAM,
};
use super::setup::{epoch_of, leader_get};
use super::{Cluster, CROSS_CELL_TIMEOUT, REQUEST_TIMEOUT};
use crate::core::nodes::peer_input::{self, PeerInputError};
use crate::core::nodes::routing::MoveRefused;
use crate::core::rules::names::is_plain_name;

/// The most moves a heartbeat's [`super::heartbeat::MOVES_HEADER`] may name (one per other cell).
pub const MAX_MOVES: usize = 16;

/// A promoted cell's rooms, as this node reaches them: their new home, their new epoch,
/// and the streams that hold them now (this cell's, or the new home's through its domain).
pub struct Moved {
    pub to: String,
    pub epoch: String,
    pub(super) rooms: stream::Stream<()>,
    pub(super) states: stream::Stream<()>,
}

/// What a promotion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promotion {
    pub from: String,
    pub to: String,
    /// The moved rooms' new epoch.
    pub epoch: String,
    /// The rooms the mirror holds events of.
    pub rooms: u64,
    /// The last stream sequence the mirror had received.
    pub mirror_head: u64,
    /// The last stream sequence of the origin that its heartbeats announced (0: none heard).
    pub origin_head_seen: u64,
    /// Events the origin stored that the mirror never received: lost.
    pub missing: u64,
}

/// The cell token of a moved room's write subjects: `<origin>@<home>` (`@` is in no
/// cell name, so it is nobody's own subject).
pub fn moved_subject_cell(origin: &str, home: &str) -> String {
    format!("{origin}@{home}")
}

impl Cluster {
    /// Promote `from`'s rooms into this node's cell (see the module doc). The caller
    /// checks that `from` is gone (no node of it heard): this one only refuses what the
    /// homes refuse ([`crate::core::nodes::routing::RoomHomes::moved`]).
    pub async fn promote(&self, from: &str) -> Result<Promotion, ClusterError> {
        let domains = self.domains.as_deref().ok_or(PromotionError::NoCellDomains)?;
        let to = domains.cell.clone();
        if !domains.homes.read().clone().moved(from, &to).map_err(PromotionError::from)? {
            return Err(PromotionError::AlreadyHere(from.to_string()).into());
        }
        let remote = domains
            .remote
            .get(from)
            .ok_or_else(|| PromotionError::from(MoveRefused::Unknown(from.to_string())))?;
        let rooms_info = remote.rooms_mirror.get_info().await?;
        let states_info = remote.states_mirror.get_info().await?;
        let mirror_head = rooms_info.state.last_sequence;
        let origin_head_seen = remote.head_seen.load(Ordering::Relaxed);
        let epoch = epoch_of(&rooms_info);
        // Promoted already: by another node of this cell (whose heartbeat has not reached
        // this one yet), or by a promotion that stopped part way, which this one finishes
        // (each step is done once: a stream no longer a mirror is left as it is).
        let promoted_before = rooms_info.config.mirror.is_none();
        for (info, kind, live) in
            [(&rooms_info, "room", LIVE_SUBJECTS), (&states_info, "state", LIVE_STATE_SUBJECTS)]
        {
            promote_stream(&self.js, info.config.clone(), kind, from, &to, live).await?;
        }
        self.meta.put(moved_key(from), encode_move(&to, &epoch).into_bytes().into()).await?;
        self.install_move(from, &to, &epoch);
        if promoted_before {
            return Err(PromotionError::AlreadyHere(from.to_string()).into());
        }
        let missing = origin_head_seen.saturating_sub(mirror_head);
        tracing::warn!(from, to = %to, %epoch, mirror_head, origin_head_seen, missing, "promoted a cell's rooms: this cell writes them now");
        Ok(Promotion {
            from: from.to_string(),
            to,
            epoch,
            rooms: rooms_info.state.subjects_count,
            mirror_head,
            origin_head_seen,
            missing,
        })
    }

    /// A moved room's new epoch (`None`: the room did not move).
    pub fn moved_epoch(&self, room: &str) -> Option<String> {
        let domains = self.domains.as_deref()?;
        let origin = domains.homes.read().origin(room)?.to_string();
        domains.moves.read().get(&origin).map(|moved| moved.epoch.clone())
    }

    /// The moves this node knows, for its heartbeats (`None`: none).
    pub(super) fn encode_moves(&self) -> Option<String> {
        let moves = self.domains.as_deref()?.moves.read();
        (!moves.is_empty()).then(|| {
            moves
                .iter()
                .map(|(from, m)| format!("{from}>{}:{}", m.to, m.epoch))
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// What a heartbeat of `cell` says of its rooms stream's last sequence.
    pub fn learn_head(&self, cell: &str, head: u64) {
        if let Some(remote) = self.domains.as_deref().and_then(|d| d.remote.get(cell)) {
            remote.head_seen.fetch_max(head, Ordering::Relaxed);
        }
    }

    /// This node stored an event at `stream_seq` of its own rooms stream.
    pub(super) fn appended_own(&self, stream_seq: u64) {
        self.rooms_head.fetch_max(stream_seq, Ordering::Relaxed);
    }

    /// Moves a heartbeat announced: each new one is taken (and recorded in this cell's
    /// `lg_meta`, so it outlives this node); one that contradicts a known move is
    /// refused and logged. Yields the moves taken just now (from, to).
    pub async fn learn_moves(&self, moves: Vec<(String, String, String)>) -> Vec<(String, String)> {
        let mut moved = Vec::new();
        for (from, to, epoch) in moves {
            let Some(domains) = self.domains.as_deref() else { break };
            match domains.homes.read().clone().moved(&from, &to) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(refused) => {
                    tracing::warn!(from, to, %refused, "ignoring a promotion a peer announced");
                    continue;
                }
            }
            self.install_move(&from, &to, &epoch);
            let recorded = tokio::time::timeout(
                REQUEST_TIMEOUT,
                self.meta.put(moved_key(&from), encode_move(&to, &epoch).into_bytes().into()),
            )
            .await;
            if !matches!(recorded, Ok(Ok(_))) {
                tracing::warn!(from, to, "could not record a promotion a peer announced in this cell (its heartbeats will tell again)");
            }
            tracing::warn!(from, to, %epoch, "learned a promotion: the cell's rooms are written there now");
            moved.push((from, to));
        }
        moved
    }

    /// Whether a room's origin is `cell` (the rooms a promotion of `cell` moves).
    pub fn rooms_of(&self, cell: String) -> Box<dyn Fn(&str) -> bool> {
        let cluster = self.clone();
        Box::new(move |room| cluster.room_origin(room).as_deref() == Some(cell.as_str()))
    }

    /// At join: the moves this cell recorded, then those every other cell recorded (each
    /// asked through its domain, within [`CROSS_CELL_TIMEOUT`]; one that does not
    /// answer is skipped: its heartbeats will tell). A cell coming back after its rooms
    /// were promoted thus learns it before it writes any of them, as long as the cell
    /// that took them answers.
    pub(super) async fn load_moves(&self) -> Result<(), ClusterError> {
        let Some(domains) = self.domains.as_deref() else { return Ok(()) };
        let cells: Vec<String> =
            domains.remote.keys().cloned().chain([domains.cell.clone()]).collect();
        let mut recorded = Vec::new();
        for from in &cells {
            if let Some(value) = leader_get(&self.meta, &moved_key(from)).await? {
                recorded.push((from.clone(), value));
            }
        }
        for (from, value) in recorded {
            match std::str::from_utf8(&value).ok().and_then(decode_move) {
                Some((to, epoch)) if domains.homes.read().clone().moved(&from, &to).is_ok() => {
                    self.install_move(&from, &to, &epoch)
                }
                _ => {
                    tracing::warn!(from, "ignoring an unreadable or contradicting promotion record")
                }
            }
        }
        for other in domains.remote.keys() {
            let asked =
                tokio::time::timeout(CROSS_CELL_TIMEOUT * 2, self.moves_recorded_in(other, &cells))
                    .await;
            match asked {
                Ok(Ok(moves)) if !moves.is_empty() => {
                    self.learn_moves(moves).await;
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::info!(cell = %other, %error, "could not read the cell's promotions at join; its heartbeats will tell")
                }
                Err(_) => {
                    tracing::info!(cell = %other, "the cell did not answer for its promotions at join; its heartbeats will tell")
                }
            }
        }
        Ok(())
    }

    /// The moves `cell` recorded in its `lg_meta`, read through its domain.
    async fn moves_recorded_in(
        &self,
        cell: &str,
        cells: &[String],
    ) -> Result<Vec<(String, String, String)>, ClusterError> {
        let mut js = jetstream::with_domain(self.client.clone(), cell);
        js.set_timeout(CROSS_CELL_TIMEOUT);
        let meta = js.get_key_value(META_BUCKET).await?;
        let mut moves = Vec::new();
        for from in cells {
            let Some(value) = leader_get(&meta, &moved_key(from)).await? else { continue };
            if let Some((to, epoch)) = std::str::from_utf8(&value).ok().and_then(decode_move) {
                moves.push((from.clone(), to, epoch));
            }
        }
        Ok(moves)
    }

    /// Take the move `from` → `to` with `epoch`: where the rooms are reached now first,
    /// then the homes (which route writes there).
    fn install_move(&self, from: &str, to: &str, epoch: &str) {
        let Some(domains) = self.domains.as_deref() else { return };
        let js = if to == domains.cell {
            self.js.clone()
        } else {
            let mut js = jetstream::with_domain(self.client.clone(), to);
            js.set_timeout(CROSS_CELL_TIMEOUT);
            js
        };
        // Handles only: no call is made.
        let handle = |name: String| js.get_stream_no_info(name).now_or_never().and_then(Result::ok);
        let (Some(rooms), Some(states)) =
            (handle(mirror_name(ROOMS_STREAM, from)), handle(mirror_name(STATE_STREAM, from)))
        else {
            tracing::error!(from, "a promoted cell's stream names are invalid");
            return;
        };
        domains.moves.write().insert(
            from.to_string(),
            Moved { to: to.to_string(), epoch: epoch.to_string(), rooms, states },
        );
        if let Err(refused) = domains.homes.write().moved(from, to) {
            tracing::warn!(from, to, %refused, "a promotion contradicts the homes");
        }
    }
}

/// Turn a mirror into the origin of `from`'s rooms in cell `to`: no mirror any more,
/// new writes on `lg.<kind>.<from>@<to>.>` stored under `lg.<kind>.<from>.>` and
/// republished live like an origin's. Done already (a retried promotion): nothing.
async fn promote_stream(
    js: &jetstream::Context,
    mut config: stream::Config,
    kind: &str,
    from: &str,
    to: &str,
    live: &str,
) -> Result<(), ClusterError> {
    if config.mirror.is_none() {
        return Ok(());
    }
    let (write, stored) =
        (format!("lg.{kind}.{}.>", moved_subject_cell(from, to)), format!("lg.{kind}.{from}.>"));
    config.mirror = None;
    config.subjects = vec![write.clone()];
    config.subject_transform =
        Some(stream::SubjectTransform { source: write, destination: stored.clone() });
    config.republish = Some(stream::Republish {
        source: stored,
        destination: live.to_string(),
        headers_only: false,
    });
    if kind == "room" {
        config.duplicate_window = Duration::from_secs(120);
    }
    js.update_stream(&config).await?;
    Ok(())
}

fn moved_key(from: &str) -> String {
    format!("moved.{from}")
}

fn encode_move(to: &str, epoch: &str) -> String {
    format!("{to} {epoch}")
}

fn decode_move(text: &str) -> Option<(String, String)> {
    let (to, epoch) = text.split_once(' ')?;
    (is_plain_name(to, peer_input::MAX_NODE_NAME_LEN) && is_epoch(epoch))
        .then(|| (to.to_string(), epoch.to_string()))
}

fn is_epoch(text: &str) -> bool {
    text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A heartbeat's [`super::heartbeat::MOVES_HEADER`]: `<from>><to>:<epoch>` separated by `,`, at most
/// [`MAX_MOVES`], names plain, epochs 16 hex digits (absent: none).
pub fn decode_moves(value: Option<&[u8]>) -> Result<Vec<(String, String, String)>, PeerInputError> {
    let Some(value) = value else { return Ok(Vec::new()) };
    let text =
        peer_input::text("heartbeat moves", value, peer_input::MAX_HEADER_BYTES * MAX_MOVES)?;
    let moves: Vec<_> = text.split(',').collect();
    if moves.len() > MAX_MOVES {
        return Err(PeerInputError::Fields {
            what: "heartbeat moves",
            got: moves.len(),
            expected: "at most 16 (MAX_MOVES)",
        });
    }
    moves
        .into_iter()
        .map(|one| {
            let (from, rest) =
                one.split_once('>').ok_or(PeerInputError::BadName("heartbeat moves"))?;
            let (to, epoch) =
                rest.split_once(':').ok_or(PeerInputError::BadName("heartbeat moves"))?;
            let plain = |name: &str| is_plain_name(name, peer_input::MAX_NODE_NAME_LEN);
            if !plain(from) || !plain(to) || !is_epoch(epoch) {
                return Err(PeerInputError::BadName("heartbeat moves"));
            }
            Ok((from.to_string(), to.to_string(), epoch.to_string()))
        })
        .collect()
}

/// A heartbeat's [`super::heartbeat::ROOMS_HEAD_HEADER`] (absent: not said).
pub fn decode_rooms_head(value: Option<&[u8]>) -> Result<Option<u64>, PeerInputError> {
    let Some(value) = value else { return Ok(None) };
    let text = peer_input::text("heartbeat rooms head", value, peer_input::MAX_HEADER_BYTES)?;
    text.parse().map(Some).map_err(|_| PeerInputError::BadNumber("heartbeat rooms head"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_round_trip_and_junk_is_refused() {
        let epoch = "0123456789abcdef";
        let ok = format!("b>a:{epoch},c>a:{epoch}");
        assert_eq!(
            decode_moves(Some(ok.as_bytes())).unwrap(),
            vec![("b".into(), "a".into(), epoch.into()), ("c".into(), "a".into(), epoch.into())]
        );
        assert_eq!(decode_moves(None).unwrap(), vec![]);
        let many = vec![format!("b>a:{epoch}"); MAX_MOVES + 1].join(",");
        for junk in [
            "b>a",
            "b:a>x",
            &format!("b@x>a:{epoch}"),
            "b>a:0123",
            &format!("b>a:{epoch},"),
            "",
            many.as_str(),
        ] {
            assert!(decode_moves(Some(junk.as_bytes())).is_err(), "{junk:?}");
        }
        assert_eq!(decode_move(&encode_move("a", epoch)), Some(("a".into(), epoch.into())));
        assert_eq!(decode_move("a xyz"), None);
        assert_eq!(decode_rooms_head(Some(b"42")).unwrap(), Some(42));
        assert!(decode_rooms_head(Some(b"-1")).is_err());
    }
}
