//! Cell domains: each cell's NATS its own JetStream domain. This node's cell and the
//! others' streams as it reaches them ([`CellDomains`], through their domain's API or this
//! cell's mirrors of them), where a room is kept ([`RoomPlace`]), and a silent home cell's
//! rooms read from the mirrors for a while.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};

use super::errors::{ClusterError, Unreachable};
use super::names::{mirror_name, room_token, ROOMS_STREAM, STATE_STREAM};
use super::setup::{epoch_of, raise_replicas};
use super::{promotion, Cluster, StreamLimits, CROSS_CELL_TIMEOUT, REQUEST_TIMEOUT};
use crate::core::nodes::routing::RoomHomes;

/// Where every room is homed, shared by the cluster (which writes and reads it there)
/// and the router (which picks its writer there); a promotion changes it.
pub type SharedHomes = Arc<parking_lot::RwLock<RoomHomes>>;

/// `cluster_cell_domains`: this node's cell and every configured cell, each running its
/// own NATS whose JetStream domain is the cell's name, joined by leaf node connections.
#[derive(Debug, Clone)]
pub struct CellDomains {
    pub cell: String,
    /// Every configured cell (this one among them).
    pub cells: Vec<String>,
    /// Where each room is homed.
    pub homes: SharedHomes,
}

/// The cells of [`CellDomains`] as a node reaches them.
pub(super) struct Domains {
    pub(super) cell: String,
    pub(super) homes: SharedHomes,
    /// Every other cell's rooms and states streams, through its domain's API, and
    /// their mirrors in this cell.
    pub(super) remote: HashMap<String, RemoteCell>,
    /// Promoted cells, by origin: where their rooms are now, and their new epoch.
    pub(super) moves: parking_lot::RwLock<BTreeMap<String, promotion::Moved>>,
}

/// Another cell as a node reaches it: its origin streams through its domain, and this
/// cell's mirrors of them, which keep the origin's sequence numbers and serve its rooms'
/// reads while it does not answer.
pub(super) struct RemoteCell {
    pub(super) rooms: stream::Stream<()>,
    pub(super) states: stream::Stream<()>,
    pub(super) rooms_mirror: stream::Stream<()>,
    pub(super) states_mirror: stream::Stream<()>,
    /// The epoch of the cell's rooms, as its heartbeats say.
    pub(super) epoch: parking_lot::Mutex<Option<String>>,
    /// Until when reads go straight to the mirrors: the cell did not answer lately.
    pub(super) silent_until: parking_lot::Mutex<Option<std::time::Instant>>,
    /// The highest last sequence of the cell's rooms stream its heartbeats announced.
    pub(super) head_seen: AtomicU64,
}

/// How long reads of a cell that did not answer go to the mirrors without asking it.
const SILENT_CELL_SKIP: Duration = Duration::from_secs(2);

/// Where a room's events and state are kept: its home cell's streams (this node's, or
/// another cell's through its domain) and its subjects on them.
pub(crate) struct RoomPlace {
    pub rooms: stream::Stream<()>,
    pub states: stream::Stream<()>,
    /// The subjects the room's events and state are stored under (its origin cell's).
    pub room_subject: String,
    pub state_subject: String,
    /// The subjects a write is published to: the stored ones, but for a moved room the
    /// subjects its new home's stream takes and stores under the stored ones
    /// ([`promotion`]), so the old origin, back, never takes them too.
    pub room_write_subject: String,
    pub state_write_subject: String,
    /// The streams are this cell's mirrors of the home cell's.
    pub mirror: bool,
    /// The streams whose republished live copies are the room's events and states (a
    /// copy with another `Nats-Stream` comes from a fenced origin).
    pub live_stream: String,
    pub live_state_stream: String,
}

impl Cluster {
    /// With cell domains, `room`'s home cell (its namespace's `home_cell`, else a
    /// rendezvous hash over the configured cells: [`RoomHomes`]); `None` when every cell
    /// shares this NATS.
    pub fn room_home(&self, room: &str) -> Option<String> {
        self.domains.as_deref()?.homes.read().home(room).map(str::to_string)
    }

    /// With cell domains, the cell `room` was first homed in (see [`RoomHomes::origin`]).
    pub fn room_origin(&self, room: &str) -> Option<String> {
        self.domains.as_deref()?.homes.read().origin(room).map(str::to_string)
    }

    /// With cell domains, where rooms are homed (shared with the router).
    pub fn room_homes(&self) -> Option<SharedHomes> {
        self.domains.as_deref().map(|d| d.homes.clone())
    }

    /// Cells with their own NATS: how many messages this cell's mirror of each other
    /// cell's rooms stream lacks, as JetStream reports it (`StreamInfo.mirror.lag`), by
    /// cell name. One `STREAM.INFO` request per other cell (at most `MAX_CELLS - 1`), one
    /// after the other, each within [`REQUEST_TIMEOUT`]; nothing else waits on them.
    /// Empty when every cell shares this NATS.
    pub async fn mirror_lags(&self) -> Vec<(String, Result<u64, ClusterError>)> {
        let Some(domains) = self.domains.as_deref() else { return Vec::new() };
        let mut cells: Vec<&String> = domains.remote.keys().collect();
        cells.sort();
        let mut lags = Vec::with_capacity(cells.len());
        for cell in cells {
            let read = tokio::time::timeout(
                REQUEST_TIMEOUT,
                self.js.get_stream(mirror_name(ROOMS_STREAM, cell)),
            )
            .await;
            let lag = match read {
                Ok(Ok(stream)) => {
                    Ok(stream.cached_info().mirror.as_ref().map_or(0, |mirror| mirror.lag))
                }
                Ok(Err(error)) => Err(ClusterError::from(error)),
                Err(_) => {
                    Err(ClusterError::Unavailable(Unreachable::InfoTimedOut(REQUEST_TIMEOUT)))
                }
            };
            lags.push((cell.clone(), lag));
        }
        lags
    }

    /// This node's cell when cells run their own NATS.
    pub fn own_cell(&self) -> Option<&str> {
        self.domains.as_deref().map(|d| d.cell.as_str())
    }

    /// Where `room` is kept: this node's streams, or its home cell's through that cell's
    /// domain (with `mirror`, this cell's mirrors of them instead).
    pub(crate) fn room_place(&self, room: &str, mirror: bool) -> RoomPlace {
        let token = room_token(room);
        let (origin, home) = match self.domains.as_deref() {
            Some(domains) => {
                let homes = domains.homes.read();
                (homes.origin(room).map(str::to_string), homes.home(room).map(str::to_string))
            }
            None => (None, None),
        };
        let subject = |kind: &str, cell: Option<&str>| match cell {
            Some(cell) => format!("lg.{kind}.{cell}.{token}"),
            None => format!("lg.{kind}.{token}"),
        };
        let (room_subject, state_subject) =
            (subject("room", origin.as_deref()), subject("state", origin.as_deref()));
        // `moved_from`: the room's rooms moved from this origin (their streams are named after it).
        let place = |rooms: &stream::Stream<()>,
                     states: &stream::Stream<()>,
                     write_cell: Option<&str>,
                     mirror: bool,
                     moved_from: Option<&str>| RoomPlace {
            rooms: rooms.clone(),
            states: states.clone(),
            room_write_subject: subject("room", write_cell),
            state_write_subject: subject("state", write_cell),
            room_subject: room_subject.clone(),
            state_subject: state_subject.clone(),
            mirror,
            live_stream: moved_from
                .map_or(ROOMS_STREAM.to_string(), |from| mirror_name(ROOMS_STREAM, from)),
            live_state_stream: moved_from
                .map_or(STATE_STREAM.to_string(), |from| mirror_name(STATE_STREAM, from)),
        };
        if let (Some(origin), Some(home), Some(domains)) = (&origin, &home, self.domains.as_deref())
        {
            if origin != home {
                if let Some(moved) = domains.moves.read().get(origin) {
                    let write_cell = promotion::moved_subject_cell(origin, home);
                    return place(
                        &moved.rooms,
                        &moved.states,
                        Some(&write_cell),
                        false,
                        Some(origin),
                    );
                }
            }
        }
        let remote = home.as_deref().and_then(|home| self.domains.as_deref()?.remote.get(home));
        match remote {
            Some(cell) if mirror => {
                place(&cell.rooms_mirror, &cell.states_mirror, origin.as_deref(), true, None)
            }
            Some(cell) => place(&cell.rooms, &cell.states, origin.as_deref(), false, None),
            None => place(&self.rooms, &self.states, origin.as_deref(), false, None),
        }
    }

    /// `room`'s home cell when it is another cell (with cell domains), and how it is reached.
    fn remote_home(&self, room: &str) -> Option<(String, &RemoteCell)> {
        let domains = self.domains.as_deref()?;
        let home = self.room_home(room)?;
        domains.remote.get(&home).map(|cell| (home, cell))
    }

    /// Where to read `room` now: its home's streams, or this cell's mirrors of them while
    /// the home cell is marked silent ([`Cluster::home_silent`]).
    pub(crate) fn read_place(&self, room: &str) -> RoomPlace {
        let silent = self.remote_home(room).is_some_and(|(_, cell)| {
            cell.silent_until.lock().is_some_and(|until| std::time::Instant::now() < until)
        });
        self.room_place(room, silent)
    }

    /// `room`'s home cell did not answer a read: read its rooms from the mirrors for a
    /// while. Yields whether there is a mirror to read (the room is homed elsewhere).
    pub(crate) fn home_silent(&self, room: &str) -> bool {
        let Some((home, cell)) = self.remote_home(room) else { return false };
        let mut until = cell.silent_until.lock();
        if until.is_none_or(|until| std::time::Instant::now() >= until) {
            tracing::warn!(
                cell = home,
                "a room's home cell did not answer: reading its rooms from this cell's mirror"
            );
        }
        *until = Some(std::time::Instant::now() + SILENT_CELL_SKIP);
        true
    }

    /// With cell domains, what another cell's heartbeat says of its rooms' epoch.
    pub fn learn_epoch(&self, cell: &str, epoch: String) {
        let Some(remote) = self.domains.as_deref().and_then(|d| d.remote.get(cell)) else { return };
        let mut known = remote.epoch.lock();
        if known.as_deref() != Some(epoch.as_str()) {
            tracing::info!(cell, %epoch, "learned a cell's rooms epoch");
            *known = Some(epoch);
        }
    }

    /// `room`'s epoch: its home cell's rooms stream's identity (for another cell: as its
    /// heartbeats say, else asked of its JetStream).
    pub async fn room_epoch(&self, room: &str) -> Result<String, ClusterError> {
        if let Some(epoch) = self.moved_epoch(room) {
            return Ok(epoch);
        }
        let Some((home, cell)) = self.remote_home(room) else { return Ok(self.epoch.clone()) };
        if let Some(epoch) = cell.epoch.lock().clone() {
            return Ok(epoch);
        }
        let info = cell.rooms.get_info().await.map_err(|e| {
            ClusterError::Unavailable(Unreachable::HomeCell(format!("{home}: {e}")))
        })?;
        let epoch = epoch_of(&info);
        *cell.epoch.lock() = Some(epoch.clone());
        Ok(epoch)
    }
}

impl Domains {
    /// Handles on every other cell's streams through its domain's API (nothing is
    /// asked of them yet: a cell down at start is only a cell down).
    /// Also creates this cell's mirrors of every other cell's streams in `js` (this
    /// cell's domain) when they do not exist: made while the other cell is down, a mirror
    /// starts copying once it is back.
    pub(super) async fn reach(
        client: &async_nats::Client,
        js: &jetstream::Context,
        cells: &CellDomains,
        limits: &StreamLimits,
        replicas: usize,
    ) -> Result<Domains, ClusterError> {
        let mut remote = HashMap::new();
        for cell in cells.cells.iter().filter(|cell| **cell != cells.cell) {
            let mut origin = jetstream::with_domain(client.clone(), cell);
            origin.set_timeout(CROSS_CELL_TIMEOUT);
            for (stream, per_subject) in
                [(ROOMS_STREAM, limits.history_size as i64), (STATE_STREAM, 1)]
            {
                let mirror = js
                    .get_or_create_stream(stream::Config {
                        name: mirror_name(stream, cell),
                        mirror: Some(stream::Source {
                            name: stream.into(),
                            external: Some(stream::External {
                                api_prefix: format!("$JS.{cell}.API"),
                                delivery_prefix: None,
                            }),
                            ..Default::default()
                        }),
                        max_messages_per_subject: per_subject,
                        storage: stream::StorageType::File,
                        allow_direct: true,
                        num_replicas: replicas,
                        ..Default::default()
                    })
                    .await?;
                raise_replicas(js, &mirror.cached_info().config, replicas).await?;
            }
            remote.insert(
                cell.clone(),
                RemoteCell {
                    rooms: origin.get_stream_no_info(ROOMS_STREAM).await?,
                    states: origin.get_stream_no_info(STATE_STREAM).await?,
                    rooms_mirror: js.get_stream_no_info(mirror_name(ROOMS_STREAM, cell)).await?,
                    states_mirror: js.get_stream_no_info(mirror_name(STATE_STREAM, cell)).await?,
                    epoch: Default::default(),
                    silent_until: Default::default(),
                    head_seen: AtomicU64::new(0),
                },
            );
        }
        Ok(Domains {
            cell: cells.cell.clone(),
            homes: cells.homes.clone(),
            remote,
            moves: Default::default(),
        })
    }
}
