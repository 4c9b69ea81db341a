//! [`Node`]: one livegate node. [`Node::build`] wires it (store, cluster connection,
//! actors, the HTTP server on its listener), [`Node::serve`] turns it ready and serves
//! until the supervisor drained it, [`Node::shutdown`] stops what it started, in one
//! documented order. Every background task the wiring starts has its owner here.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use actix_web::dev::ServerHandle;
use actix_web::web;
use futures_util::future::{select, Either};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::bridges::{ClusterUserBus, NodeActors, OccupancyPeers, PresenceNodes};
use super::http_server::{http_server, threads};
use super::upkeep::{
    expire_sessions, forward_signals, purge_expired, read_mirror_lags, reload_on,
    trim_after_connect_bursts,
};
use super::{open_files_limit, tls_config, ServerError, Signals};
use crate::actors::connection::ConnectionSettings;
use crate::actors::directory::{Directory, DirectorySettings, SessionStore, UserMoves};
use crate::actors::liveness::{self, ClusterPeers, LivenessActor, OwnLoad, Router};
use crate::actors::publish::Publisher;
use crate::actors::rebalance::Rebalancer;
use crate::actors::registry::{Registry, UserBus};
use crate::actors::room::{
    DelayedVacate, LocalRoomLogs, Occupancy, PresenceHub, RoomLogs, RoomSettings, StreamRoomLogs,
};
use crate::actors::rooms::Rooms;
use crate::actors::supervisor::{DrainTiming, Start, Supervisor};
use crate::actors::webhooks::{DeadLetters, WebhookEvent, WebhookSettings, Webhooks};
use crate::cluster::credentials::ClusterCredentials;
use crate::cluster::kv::KvSessions;
use crate::cluster::occupancy::{ClusterOccupancy, Report as OccupancyReport, LEAVE_WAIT};
use crate::cluster::presence::PresenceSender;
use crate::cluster::{CellDomains, Cluster, Joining, NatsAuth, StreamLimits};
use crate::config::Config;
use crate::core::nodes::lifecycle::Lifecycle;
use crate::core::rules::backoff::{Backoff, BackoffPolicy, Jitter};
use crate::core::rules::limits::Retention;
use crate::core::rules::namespaces::Namespaces;
use crate::http::limits::{AccessList, ConnectionLimits};
use crate::http::seams::{ClusterNodes, NoOtherNodes, OtherNodes};
use crate::http::{AppState, ReloadConfig};
use crate::metrics::Metrics;
use crate::store::credentials::ResumeRevocations;
use crate::store::credentials::{CredentialStore, StoreCredentials};
use crate::store::Store;
use crate::tasks::Tasks;
use crate::world::now_ms;

/// How long the HTTP server gets to finish after the drain closed every connection.
const HTTP_STOP_WAIT: Duration = Duration::from_secs(5);
/// How long a starting node keeps trying to join NATS before it gives up and exits: a
/// NATS cluster started at the same time (pods started together) refuses to place
/// streams until its servers found each other and elected leaders.
pub const CLUSTER_JOIN_WAIT: Duration = Duration::from_secs(60);
/// The pause between two attempts to join, doubling from the first.
const CLUSTER_JOIN_RETRY: BackoffPolicy = BackoffPolicy {
    first: Duration::from_millis(250),
    max: Duration::from_secs(5),
    jitter: Jitter::None,
};
/// How long publishes and kicks other nodes sent and this node took get to be answered
/// at shutdown (the forwarding node waits as long, then appends itself).
const LISTENERS_STOP_WAIT: Duration = Duration::from_secs(5);
/// How long a timer or a sender gets to notice the stop before it is aborted.
const TASKS_STOP_WAIT: Duration = Duration::from_secs(1);

/// What a node is built with besides its configuration.
pub struct NodeOptions {
    /// Where a reload reads the configuration; `None` keeps the one given at start.
    pub reload_config: Option<ReloadConfig>,
    /// Adds the score page and the match simulator.
    pub demo: bool,
    /// Development mode: pages from allowed origins mint tokens without the API key.
    pub dev: bool,
}

/// A built node: what it serves with, and the owner of everything it started.
pub struct Node {
    addr: SocketAddr,
    store: Store,
    rooms: Rooms,
    /// The handlers' state (config, actors' addresses, seams); dropped before the flush.
    state: web::Data<AppState>,
    supervisor: Addr<Supervisor>,
    /// Resolves when the supervisor has drained every connection; taken by `serve`
    /// once ready (still here: the node never served, its HTTP server is stopped at once).
    drained: Option<oneshot::Receiver<()>>,
    /// The HTTP server, running since `build`.
    http: ServerHandle,
    serving: JoinHandle<std::io::Result<()>>,
    /// The purges, the session sweep and the demo's simulator (from `build`); signal
    /// and reload forwarding (from `serve`).
    timers: Tasks,
    /// Webhooks' queue and senders (`webhook_url`).
    webhooks: Option<Webhooks>,
    /// Rooms' `vacated` edges held for `webhook_vacated_delay_ms`, and their thread.
    vacate_delay: Option<Arc<DelayedVacate>>,
    cluster: Option<ClusterParts>,
}

/// What cluster mode adds to a node.
struct ClusterParts {
    cluster: Cluster,
    /// The bus's listeners: live feed, heartbeats, kicks, forwarded publishes, orders,
    /// the maintenance loop.
    bus: Tasks,
    /// The listeners of the other nodes' presence tables and hellos.
    presence: Tasks,
    /// The task sending this node's presence tables.
    presence_sender: Tasks,
    /// Cluster-wide occupancy (webhooks on), and its workers, sweeps and answers.
    occupancy: Option<(Arc<ClusterOccupancy>, Tasks)>,
}

/// How this node joins NATS: its login (`cluster_nats_user` and `cluster_nats_password`,
/// or `cluster_nats_token`; validated to be one or the other), `cluster_token_secret`,
/// and with `cluster_cell_domains` its cell and every configured cell.
fn joining(config: &Config) -> Joining {
    let auth = match (
        &config.cluster_nats_user,
        &config.cluster_nats_password,
        &config.cluster_nats_token,
    ) {
        (Some(user), Some(password), _) => {
            NatsAuth::UserPassword { user: user.clone(), password: password.clone() }
        }
        (_, _, Some(token)) => NatsAuth::Token(token.clone()),
        _ => NatsAuth::None,
    };
    let cells = config.cluster_cell_domains.then(|| CellDomains {
        cell: config.cell.clone(),
        cells: config.configured_cells(),
        homes: Arc::new(parking_lot::RwLock::new(config.room_homes())),
    });
    Joining {
        auth,
        token_secret: config.cluster_token_secret.as_ref().map(|s| s.as_bytes().to_vec()),
        cells,
    }
}

/// Connect to NATS and set up the streams and buckets ([`Cluster::connect_as`]),
/// trying again for up to [`CLUSTER_JOIN_WAIT`]: NATS may be starting too, or forming its
/// cluster (no stream leader yet, replicas not placeable). Each failure is logged.
async fn join_cluster(
    url: &str,
    node: &str,
    limits: StreamLimits,
    joining: &Joining,
) -> Result<Cluster, crate::cluster::ClusterError> {
    let started = std::time::Instant::now();
    let mut retry = Backoff::new(CLUSTER_JOIN_RETRY);
    loop {
        match Cluster::connect_as(url, node, limits, joining).await {
            Ok(cluster) => return Ok(cluster),
            Err(error) if started.elapsed() < CLUSTER_JOIN_WAIT => {
                let delay = retry.next_delay(0);
                tracing::warn!(
                    %error,
                    attempt = retry.attempts(),
                    retry_in_ms = delay.as_millis() as u64,
                    gives_up_in_s = CLUSTER_JOIN_WAIT.saturating_sub(started.elapsed()).as_secs(),
                    "could not join the cluster through NATS yet; trying again"
                );
                actix_web::rt::time::sleep(delay).await;
            }
            Err(error) => return Err(error),
        }
    }
}

impl Node {
    /// Wire a node on `listener`: validate the configuration, open the store (and
    /// connect to NATS in cluster mode), start the actors, the cluster's listeners and
    /// the node's timers, and start the HTTP server, which answers `/readyz` with 503
    /// until [`Node::serve`]. Must run inside an actix system.
    pub async fn build(
        listener: std::net::TcpListener,
        config: Config,
        options: NodeOptions,
    ) -> Result<Node, ServerError> {
        let NodeOptions { reload_config, demo, dev } = options;
        config.validate()?;
        let access = AccessList::new(config.resolve_api_key()?.key, &config);
        let tls = tls_config(&config)?;
        let jwt = Arc::new(crate::http::jwt::JwtKeys::load(&config)?);
        if !jwt.describe().is_empty() {
            tracing::info!(keys = %jwt.describe().join(", "), "JWTs signed by a backend are accepted");
        }
        let namespaces = Arc::new(config.room_namespaces()?);
        let store = Store::open_with_cache(&config.data_dir, config.store_cache_mb * 1024 * 1024)?;
        let cluster = match &config.cluster_nats_url {
            Some(url) => Some(
                join_cluster(
                    url,
                    &config.node,
                    stream_limits(&config, &namespaces),
                    &joining(&config),
                )
                .await?,
            ),
            None => None,
        };
        let device_kinds = config.exclusive_devices.iter().cloned().chain(["web".to_string()]);
        let metrics = Arc::new(Metrics::new(device_kinds));
        let backends = Backends::open(&config, &store, cluster.as_ref()).await?;
        // Presence: this node's view of the other nodes' members (cluster mode: over NATS).
        let (presence_sender, presence_sending) = match &cluster {
            Some(cluster) => {
                let (sender, sending) = PresenceSender::start(cluster);
                (Some(sender), sending)
            }
            None => (None, Tasks::default()),
        };
        let presence = PresenceHub::new(
            config.presence_interval(),
            config.presence_members_max,
            presence_sender,
        );
        // Dead letters (webhooks given up): kept in the store whether webhooks are on or not.
        let dead_letters =
            DeadLetters::open(store.clone(), metrics.clone(), config.webhook_dead_letters_max)?;
        // Webhooks (webhook_url): the queue in the store, resumed now, sent by its own threads.
        let webhooks = match WebhookSettings::from_config(&config) {
            Some(settings) => {
                let webhooks = Webhooks::start(
                    store.clone(),
                    metrics.clone(),
                    settings,
                    dead_letters.clone(),
                )?;
                // One node, before any subscribe: rooms a crash left occupied are empty now.
                if cluster.is_none() {
                    webhooks.vacate_left_over(now_ms())?;
                }
                Some(webhooks)
            }
            None => None,
        };
        // Cluster mode: rooms' occupancy decided cluster-wide (off without webhooks).
        let occupancy = match (&cluster, occupancy_report(&metrics, webhooks.as_ref())) {
            (Some(cluster), Some(report)) => {
                Some(ClusterOccupancy::open(cluster, peer_timeout(&config), report).await?)
            }
            _ => None,
        };
        let mut shared_room_settings = room_settings(&config, metrics.clone(), presence.clone());
        let local_edges = match (&webhooks, &cluster) {
            // One node: each room's local edge is the node's edge, a webhook.
            (Some(webhooks), None) => Some(Arc::new(webhooks.clone()) as Arc<dyn Occupancy>),
            // Cluster mode: a room's edges are decided across the nodes (cluster::occupancy),
            // which reports to the webhooks; no local edge makes a webhook by itself.
            _ => occupancy.clone().map(|o| o as Arc<dyn Occupancy>),
        };
        // In both modes a room's `vacated` waits `webhook_vacated_delay_ms` on its node, and
        // a room joined again meanwhile reports nothing (not even to the cluster's records).
        let vacate_delay = match local_edges.clone() {
            Some(edges) if config.webhook_vacated_delay_ms > 0 => {
                Some(DelayedVacate::start(edges, config.webhook_vacated_delay())?)
            }
            _ => None,
        };
        shared_room_settings.occupancy =
            vacate_delay.clone().map(|d| d as Arc<dyn Occupancy>).or(local_edges);
        crate::actors::room::set_fanout_threads(config.fanout_threads);
        let rooms = Rooms::start(backends.room_logs, shared_room_settings, namespaces, threads());
        let registry = Registry::new(config.exclusive_devices.clone(), backends.user_bus).start();
        let directory_settings = DirectorySettings {
            migration_window: config.migration_window(),
            warmup: config.warmup(),
            session_ttl: config.session_ttl(),
            session_cache_max: config.session_cache_max,
        };
        let addr = listener.local_addr()?;
        let lifecycle = Arc::new(Lifecycle::default());
        // The open-file budget, shared: plain HTTP sockets' places first, streams get the rest.
        let open_files = open_files_limit();
        let max_http_connections = crate::http::limits::effective_max_http_connections(
            config.max_http_connections,
            open_files,
        );
        let max_connections = crate::http::limits::effective_max_connections(
            config.max_connections,
            open_files,
            max_http_connections,
        );
        metrics.connection_capacity.set(max_connections.min(i64::MAX as usize) as i64);
        tracing::info!(
            open_files,
            configured = config.max_connections,
            max_connections,
            max_http_connections,
            "connection limits in force (max_connections 0: what the open-file limit allows)"
        );
        let me = this_node(&config, addr, tls.is_some());
        let own_load = OwnLoad { metrics: metrics.clone(), capacity: max_connections as u64 };
        let router = Arc::new(
            router(&config, me, cluster.as_ref(), &lifecycle)?
                .with_load(own_load, config.placement_high_water_percent),
        );
        let (directory, session_opener) = Directory::new(
            backends.sessions.clone(),
            router.clone(),
            directory_settings,
            metrics.clone(),
            backends.user_moves.clone(),
        )
        .start_with_opener();
        let liveness =
            start_liveness(&config, router.clone(), cluster.as_ref(), &metrics, &presence);
        let rebalance = Rebalancer::start(
            directory.clone(),
            registry.clone(),
            router.clone(),
            lifecycle.clone(),
            metrics.clone(),
        );
        let cluster = match (cluster, &backends.kv) {
            (Some(cluster), Some(kv)) => {
                let events = NodeActors {
                    rooms: rooms.clone(),
                    registry: registry.clone(),
                    liveness: liveness.clone(),
                    nonces: backends.nonces.clone(),
                    presence: presence.clone(),
                    rebalance: rebalance.actor.clone(),
                    router: router.clone(),
                    metrics: metrics.clone(),
                };
                let bus = crate::cluster::bus::listen(&cluster, events, kv.clone()).await?;
                let presence_listeners =
                    crate::cluster::presence::listen(&cluster, PresenceNodes(presence.clone()))
                        .await?;
                presence.started();
                let occupancy = match occupancy {
                    Some(occupancy) => {
                        let tasks = occupancy.start(OccupancyPeers(router.clone())).await?;
                        Some((occupancy, tasks))
                    }
                    None => None,
                };
                Some(ClusterParts {
                    cluster,
                    bus,
                    presence: presence_listeners,
                    presence_sender: presence_sending,
                    occupancy,
                })
            }
            _ => None,
        };
        let timing = DrainTiming {
            wait: config.drain_wait(),
            spread: config.drain_spread(),
            grace: config.drain_grace(),
        };
        // The publish path and the kicks' reach, chosen once with the rest: one node, or NATS.
        let (publisher, other_nodes): (Publisher, Arc<dyn OtherNodes>) = match &cluster {
            Some(parts) => (
                Publisher::clustered(rooms.clone(), parts.cluster.clone(), router.clone()),
                Arc::new(ClusterNodes {
                    cluster: parts.cluster.clone(),
                    router: router.clone(),
                    rooms: rooms.clone(),
                }),
            ),
            None => (Publisher::local(rooms.clone()), Arc::new(NoOtherNodes)),
        };
        let publisher = publisher.with_max_state_bytes(config.max_state_bytes);
        let state = web::Data::new(AppState {
            limits: Arc::new(ConnectionLimits::new(&config, max_connections)),
            sockets: crate::http::sockets::SocketBudget::new(max_http_connections, metrics.clone()),
            connection: Arc::new(connection_settings(
                &config,
                metrics.clone(),
                backends.nonces.clone(),
                publisher.clone(),
                webhooks.clone(),
                registry.clone(),
            )),
            config: Arc::new(config),
            access: parking_lot::RwLock::new(access),
            reload: reload_config,
            store: store.clone(),
            rooms: rooms.clone(),
            registry: registry.clone(),
            directory: directory.clone(),
            session_opener,
            handshake_flushes: crate::http::durable::HandshakeFlushes::new(store.clone()),
            sessions: backends.sessions,
            credentials: backends.nonces,
            spent: Default::default(),
            other_nodes,
            liveness,
            router: router.clone(),
            rebalance,
            publisher: publisher.clone(),
            webhooks: webhooks.clone(),
            dead_letters,
            metrics: metrics.clone(),
            token_secret: backends.token_secret,
            jwt,
            lifecycle: lifecycle.clone(),
            next_conn: AtomicU64::new(1),
            started: std::time::Instant::now(),
            health: Default::default(),
            demo,
            dev,
        });
        let server = http_server(listener, tls, state.clone(), &timing)?.run();
        let http = server.handle();
        let (done_tx, drained) = oneshot::channel();
        let joins = state.config.cluster_nats_url.is_some();
        let supervisor = Supervisor::new(
            lifecycle,
            registry,
            directory.clone(),
            rooms.clone(),
            http.clone(),
            timing,
            metrics,
            done_tx,
        )
        .joining_peers(joins)
        .start();
        let serving = actix_web::rt::spawn(server);
        let config = state.config.clone();
        let mut timers = Tasks::default();
        timers.spawn(purge_expired(
            store.clone(),
            config.migration_window_secs * 1000,
            config.token_ttl_max(),
        ));
        timers.spawn(expire_sessions(directory, config.session_ttl()));
        timers.spawn(trim_after_connect_bursts(state.metrics.clone()));
        if demo {
            timers.spawn(crate::demo::run_simulator(publisher));
        }
        if let Some(parts) = cluster.as_ref().filter(|parts| parts.cluster.own_cell().is_some()) {
            timers.spawn(read_mirror_lags(parts.cluster.clone(), state.metrics.clone()));
        }
        Ok(Node {
            addr,
            store,
            rooms,
            state,
            supervisor,
            drained: Some(drained),
            http,
            serving,
            timers,
            webhooks,
            vacate_delay,
            cluster,
        })
    }

    /// Have the supervisor reconcile the directory and turn the node ready, then serve
    /// until the drain is over: the first item of `shutdown` starts it, a second forces
    /// it; each item of `reload` reloads the access list. Returns early when the HTTP
    /// server fails. Either way, [`Node::shutdown`] comes next.
    pub async fn serve(&mut self, shutdown: Signals, reload: Signals) -> Result<(), ServerError> {
        self.supervisor.send(Start).await.map_err(ServerError::SupervisorGone)??;
        let config = &self.state.config;
        tracing::info!(addr = %self.addr, node = %config.node, data_dir = %config.data_dir.display(), "ready");
        self.timers.spawn(forward_signals(shutdown, self.supervisor.clone()));
        self.timers.spawn(reload_on(reload, self.state.clone()));
        let Some(drained) = self.drained.take() else { return Ok(()) };
        match select(drained, &mut self.serving).await {
            Either::Left(_) => Ok(()),
            Either::Right((Ok(Err(error)), _)) => Err(ServerError::Io(error)),
            Either::Right(_) => Ok(()),
        }
    }

    /// Stop the node, each step after the one it depends on:
    ///
    /// 1. The HTTP server finishes (the drain stopped it and closed every connection; a
    ///    node that never drained, its start failed, stops it now), bounded by
    ///    [`HTTP_STOP_WAIT`].
    /// 2. The timers stop: signal and reload forwarding, the purges, the session sweep,
    ///    the demo's simulator (it publishes through the rooms).
    /// 3. Cluster: the listeners take no more messages (live feed, heartbeats, kicks,
    ///    forwarded publishes, rebalance orders, presence); the publishes and kicks
    ///    already taken are answered within [`LISTENERS_STOP_WAIT`], while the rooms are
    ///    still there to append them.
    /// 4. The rooms stop (their arbiters joined).
    /// 5. The rooms' `vacated` edges still held back pass on now (after the rooms: their
    ///    last edges are in), before the occupancy records and webhooks see them.
    /// 6. Cluster: the node leaves its rooms' occupancy records (the `vacated` edges it
    ///    decides go to the webhooks), bounded by `LEAVE_WAIT`; then the occupancy
    ///    workers, sweeps and answers stop, and the presence sender.
    /// 7. The webhooks stop: what is not delivered stays queued in the store for the
    ///    next start.
    /// 8. No more heartbeats or probes (the liveness actor stops); cluster: then the
    ///    goodbye, so peers stop routing here at once and no later beat counts this node
    ///    alive again.
    /// 9. The handlers' state goes and the store is flushed.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        // Finished: `serve` saw it end (and took its outcome; a JoinHandle is polled once).
        if !self.serving.is_finished() {
            if self.drained.is_some() {
                self.http.stop(false).await;
            }
            let _ = actix_web::rt::time::timeout(HTTP_STOP_WAIT, &mut self.serving).await;
        }
        self.timers.stop(TASKS_STOP_WAIT).await;
        if let Some(parts) = &mut self.cluster {
            let aborted = parts.bus.stop(LISTENERS_STOP_WAIT).await
                + parts.presence.stop(TASKS_STOP_WAIT).await;
            if aborted > 0 {
                tracing::warn!(
                    aborted,
                    "cluster listeners still answering at shutdown were stopped"
                );
            }
        }
        self.rooms.shutdown();
        if let Some(vacate_delay) = &self.vacate_delay {
            vacate_delay.stop();
        }
        if let Some(parts) = &mut self.cluster {
            if let Some((occupancy, tasks)) = &mut parts.occupancy {
                occupancy.leave(LEAVE_WAIT).await;
                tasks.stop(TASKS_STOP_WAIT).await;
            }
            parts.presence_sender.stop(TASKS_STOP_WAIT).await;
        }
        if let Some(webhooks) = &self.webhooks {
            webhooks.stop();
        }
        let _ = self.state.liveness.send(liveness::Stop).await;
        if let Some(parts) = &self.cluster {
            parts.cluster.leave().await;
        }
        let Node { store, state, .. } = self;
        drop(state);
        store.flush()?;
        tracing::info!("store flushed; stopped");
        Ok(())
    }
}

/// A peer missing this many heartbeats in a row is down.
const HEARTBEATS_MISSED: u64 = 3;

fn stream_limits(config: &Config, namespaces: &Namespaces) -> StreamLimits {
    StreamLimits {
        // Every room's history fits, whatever its namespace; each room trims to its own.
        history_size: namespaces.largest_history_size() as u64,
        // Token nonces, resume nonces and resume revocations share the bucket.
        nonce_ttl: config.token_ttl_max().max(config.resume_ttl()),
        session_ttl: config.session_ttl(),
        replicas: config.cluster_replicas.map(|replicas| replicas as usize),
    }
}

fn room_settings(
    config: &Config,
    metrics: Arc<Metrics>,
    presence_hub: Arc<PresenceHub>,
) -> RoomSettings {
    RoomSettings {
        metrics,
        retention: Retention {
            max_events: config.history_size,
            max_age_ms: config.history_ttl_secs * 1000,
        },
        recovery_max_events: config.recovery_max_events,
        idle_stop: config.room_idle(),
        // Often enough that an idle room stops within about its idle time.
        tick: Duration::from_secs(config.room_idle_secs.clamp(1, 10)),
        batch_window: config.batch_window(),
        presence: true,
        presence_hub,
        occupancy: None,
    }
}

/// After how long without heartbeats a peer is down.
fn peer_timeout(config: &Config) -> Duration {
    config.cluster_heartbeat() * HEARTBEATS_MISSED as u32
}

/// Where cluster-wide occupancy decisions go: the webhooks (each also counted in
/// `livegate_occupancy_edges_total`); `None` (webhooks off) turns cluster occupancy off.
fn occupancy_report(
    metrics: &Arc<Metrics>,
    webhooks: Option<&Webhooks>,
) -> Option<OccupancyReport> {
    let (metrics, webhooks) = (metrics.clone(), webhooks?.clone());
    Some(Arc::new(move |room: &str, occupied: bool, ts_ms: u64| {
        metrics
            .occupancy_edges
            .get_or_create(&crate::metrics::EdgeLabel {
                edge: if occupied { "occupied" } else { "vacated" },
            })
            .inc();
        let room = room.to_string();
        webhooks.enqueue(if occupied {
            WebhookEvent::RoomOccupied { room, ts_ms }
        } else {
            WebhookEvent::RoomVacated { room, ts_ms }
        });
    }))
}

/// Where this node keeps rooms, sessions and token nonces, whom it tells about users,
/// and its token secret: the embedded store alone, or NATS. Chosen once, here.
struct Backends {
    room_logs: Arc<dyn RoomLogs>,
    sessions: Arc<dyn SessionStore>,
    /// Cluster mode: the KV directory, which the cluster bus also replays queued writes to.
    kv: Option<KvSessions>,
    nonces: Arc<dyn CredentialStore>,
    user_bus: Option<Arc<dyn UserBus>>,
    /// Cluster mode: where the directory announces a user's move.
    user_moves: Option<Arc<dyn UserMoves>>,
    token_secret: Vec<u8>,
}

impl Backends {
    async fn open(
        config: &Config,
        store: &Store,
        cluster: Option<&Cluster>,
    ) -> Result<Backends, ServerError> {
        let Some(cluster) = cluster else {
            return Ok(Backends {
                room_logs: Arc::new(LocalRoomLogs::new(store.clone())?),
                sessions: Arc::new(store.clone()),
                kv: None,
                nonces: Arc::new(StoreCredentials::new(
                    store,
                    config.resume_ttl(),
                    config.token_ttl_max(),
                )),
                user_bus: None,
                user_moves: None,
                token_secret: store.credentials().secret("token")?,
            });
        };
        let kv =
            KvSessions::open_with(cluster, Some(store.clone()), config.directory_outage()).await?;
        Ok(Backends {
            room_logs: Arc::new(StreamRoomLogs(cluster.clone())),
            sessions: Arc::new(kv.clone()),
            kv: Some(kv),
            nonces: Arc::new(ClusterCredentials {
                cluster: cluster.clone(),
                local: StoreCredentials::new(store, config.resume_ttl(), config.token_ttl_max()),
                sending: Default::default(),
            }),
            user_bus: Some(Arc::new(ClusterUserBus(cluster.clone()))),
            user_moves: Some(Arc::new(ClusterUserBus(cluster.clone()))),
            // Every node verifies every other node's tokens.
            token_secret: cluster.token_secret().to_vec(),
        })
    }
}

/// This node as `/v1/route` names it.
fn this_node(config: &Config, local: std::net::SocketAddr, tls: bool) -> crate::config::Peer {
    let scheme = if tls { "https" } else { "http" };
    let url = config.public_url.clone().unwrap_or_else(|| format!("{scheme}://{local}"));
    crate::config::Peer { name: config.node.clone(), cell: config.cell.clone(), url }
}

/// The routing view: peers from heartbeats on NATS (cluster mode), or the configured
/// peers, probed. For the sessions a release moves, the newest `release` ranks first
/// (`core::nodes::routing::release_first`).
fn router(
    config: &Config,
    me: crate::config::Peer,
    cluster: Option<&Cluster>,
    lifecycle: &Arc<Lifecycle>,
) -> Result<Router, ServerError> {
    let clustered = cluster.is_some();
    let up_after = config.probe_up_after.min(u32::MAX as u64) as u32;
    let release_window =
        Duration::from_millis(crate::core::nodes::routing::RELEASE_FALLBACK_WINDOW_MS);
    let router = if clustered {
        let timeout = config.cluster_heartbeat() * HEARTBEATS_MISSED as u32;
        Router::clustered(me, timeout, up_after, lifecycle.clone(), release_window)
    } else {
        Router::probed(me, config.peer_nodes()?, up_after, lifecycle.clone(), release_window)
    };
    let router = router.with_release(config.release());
    let router = router.with_cells(config.configured_cells());
    // With cell domains, the cluster's homes: a promotion it learns moves the writers too.
    Ok(match cluster.and_then(Cluster::room_homes) {
        Some(homes) => router.with_room_homes(homes),
        None => router,
    })
}

/// The liveness actor: heartbeats on NATS (cluster mode), or probes of the configured peers.
fn start_liveness(
    config: &Config,
    router: Arc<Router>,
    cluster: Option<&Cluster>,
    metrics: &Arc<Metrics>,
    presence: &Arc<PresenceHub>,
) -> Addr<LivenessActor> {
    match cluster {
        Some(cluster) => {
            let peers = ClusterPeers { cluster: cluster.clone(), presence: presence.clone() };
            LivenessActor::clustered(router, config.cluster_heartbeat(), peers, metrics.clone())
                .start()
        }
        None => LivenessActor::probing(router, config.probe_interval(), metrics.clone()).start(),
    }
}

fn connection_settings(
    config: &Config,
    metrics: Arc<Metrics>,
    revocations: Arc<dyn ResumeRevocations>,
    publisher: Publisher,
    webhooks: Option<Webhooks>,
    registry: Addr<Registry>,
) -> ConnectionSettings {
    ConnectionSettings {
        registry,
        metrics,
        revocations,
        publisher,
        node: config.node.clone(),
        heartbeat: config.heartbeat(),
        max_subscriptions: config.max_subscriptions,
        max_message_bytes: config.max_message_bytes,
        max_outbox_bytes: config.max_outbox_bytes,
        max_messages_per_sec: config.max_messages_per_sec,
        max_bad_messages: config.max_bad_messages,
        max_room_starts_per_sec: config.max_room_starts_per_sec,
        max_history_limit: config.max_history_limit,
        subscribe_timeout: (config.subscribe_timeout_secs > 0)
            .then(|| Duration::from_secs(config.subscribe_timeout_secs)),
        webhooks,
        limits: Default::default(),
    }
}
