//! `run(listener, config, shutdown)`: opens the store, starts the actors and the HTTP
//! server on the given listener, and on `shutdown` lets the supervisor drain (1012 to every
//! connection, spread out), then stops the rooms and flushes the store before returning.
//! `main` and the tests call the same code; the caller owns the listener and the signals.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use actix_web::rt::net::TcpStream;
use actix_http::HttpService;
use actix_service::ServiceFactoryExt;
use actix_web::{web, App};
use futures_util::future::{select, Either, LocalBoxFuture};
use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::oneshot;
use thiserror::Error;

use crate::actors::connection::{ConnectionSettings, ResumeRevocations};
use crate::actors::directory::{Directory, DirectorySettings, ExpireSessions, SessionStore};
use crate::actors::liveness::{ClusterPeers, Heard, Left, LivenessActor, Router};
use crate::actors::messages::{Kick, NewEvent, StateAt};
use crate::actors::publish::Publisher;
use crate::actors::registry::{Registry, RemoteReplace, UserBus};
use crate::actors::room::{PresenceHub, RoomSettings};
use crate::actors::room::{DelayedVacate, LocalRoomLogs, Occupancy, RoomLogs, StreamRoomLogs};
use crate::actors::rooms::Rooms;
use crate::actors::rebalance::{Rebalancer, Shed};
use crate::actors::supervisor::{DrainTiming, Signal, Start, StartError, Supervisor};
use crate::actors::webhooks::{WebhookError, WebhookEvent, WebhookSettings, Webhooks};
use crate::cluster::bus::{Appended, ForwardedPublish, NodeEvents};
use crate::cluster::kv::KvSessions;
use crate::cluster::occupancy::{ClusterOccupancy, Report as OccupancyReport};
use crate::cluster::roomlog::{StoredState, StreamEvent};
use crate::cluster::{Cluster, ClusterError, StreamLimits};
use crate::config::{Config, ConfigError};
use crate::core::heartbeats::NodeInfo;
use crate::core::lifecycle::Lifecycle;
use crate::core::namespaces::Namespaces;
use crate::core::rebalance::Order;
use crate::core::seqlog::Retention;
use crate::http::limits::{AccessList, ConnectionLimits};
use crate::http::sockets::{SocketState, Timed};
use crate::http::seams::{ClusterNodes, ClusterNonces, Nonces, NoOtherNodes, OtherNodes, StoreNonces};
use crate::http::{self, AppState, ReloadConfig};
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};
use crate::world::now_ms;

/// How long a keep-alive connection may wait, idle, for a next request.
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// How long a finished connection may linger for the client to hang up first.
const CLIENT_DISCONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// How often expired token nonces and migration times are forgotten.
const PURGE_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("startup failed: {0}")]
    Start(#[from] StartError),
    #[error("webhooks: {0}")]
    Webhooks(#[from] WebhookError),
    #[error("startup failed: the supervisor is gone: {0}")]
    SupervisorGone(#[source] actix::MailboxError),
    #[error("TLS: cannot read the {what} from {}: {source}", path.display())]
    TlsPem { what: &'static str, path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("TLS: cannot read the certificate chain from {}: no CERTIFICATE block", path.display())]
    TlsNoCertificate { path: PathBuf },
    #[error("TLS: certificate {} and key {}: {source}", cert.display(), key.display())]
    TlsConfig { cert: PathBuf, key: PathBuf, source: rustls::Error },
    #[error("cluster: {0}")]
    Cluster(#[from] ClusterError),
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
    }
}

fn room_settings(config: &Config, metrics: Arc<Metrics>, presence_hub: Arc<PresenceHub>) -> RoomSettings {
    RoomSettings {
        metrics,
        retention: Retention { max_events: config.history_size, max_age_ms: config.history_ttl_secs * 1000 },
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
fn occupancy_report(metrics: &Arc<Metrics>, webhooks: Option<&Webhooks>) -> Option<OccupancyReport> {
    let (metrics, webhooks) = (metrics.clone(), webhooks?.clone());
    Some(Arc::new(move |room: &str, occupied: bool, ts_ms: u64| {
        metrics.occupancy_edges.get_or_create(&crate::metrics::EdgeLabel { edge: if occupied { "occupied" } else { "vacated" } }).inc();
        let room = room.to_string();
        webhooks.enqueue(if occupied { WebhookEvent::RoomOccupied { room, ts_ms } } else { WebhookEvent::RoomVacated { room, ts_ms } });
    }))
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Signals as a stream: each item is one signal.
pub type Signals = Pin<Box<dyn Stream<Item = ()>>>;

/// How a running node is steered from outside.
pub struct Control {
    /// The first item starts a drain, a second one forces it (SIGTERM, SIGINT).
    pub shutdown: Signals,
    /// Each item reloads the API keys and allowed origins (SIGHUP).
    pub reload: Signals,
    /// Where a reload reads the configuration; `None` keeps the one given at start.
    pub reload_config: Option<ReloadConfig>,
    /// Adds the score page and the match simulator.
    pub demo: bool,
}

/// Serve on `listener` until `shutdown` resolves, then drain. Must run inside an actix
/// system.
pub async fn run(
    listener: std::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + 'static,
) -> Result<(), ServerError> {
    let control = Control {
        shutdown: Box::pin(stream::once(shutdown).chain(stream::pending())),
        reload: Box::pin(stream::pending()),
        reload_config: None,
        demo: false,
    };
    run_controlled(listener, config, control).await
}

/// Serve on `listener`, steered by `control`. Must run inside an actix system.
pub async fn run_controlled(listener: std::net::TcpListener, config: Config, control: Control) -> Result<(), ServerError> {
    let Control { shutdown: signals, reload, reload_config, demo } = control;
    config.validate()?;
    let access = AccessList::new(config.resolve_api_key()?.key, &config);
    let tls = tls_config(&config)?;
    let namespaces = Arc::new(config.room_namespaces()?);
    let store = Store::open_with_cache(&config.data_dir, config.store_cache_mb * 1024 * 1024)?;
    let cluster = match &config.cluster_nats_url {
        Some(url) => Some(Cluster::connect_with(url, &config.node, stream_limits(&config, &namespaces)).await?),
        None => None,
    };
    let device_kinds = config.exclusive_devices.iter().cloned().chain(["web".to_string()]);
    let metrics = Arc::new(Metrics::new(device_kinds));
    let backends = Backends::open(&config, &store, cluster.as_ref()).await?;
    // Presence: this node's view of the other nodes' members (cluster mode: over NATS).
    let presence_sender = cluster.as_ref().map(crate::cluster::presence::PresenceSender::start);
    let presence = PresenceHub::new(config.presence_interval(), config.presence_members_max, presence_sender);
    // Webhooks (webhook_url): the queue in the store, resumed now, sent by its own threads.
    let webhooks = match WebhookSettings::from_config(&config) {
        Some(settings) => {
            let webhooks = Webhooks::start(store.clone(), metrics.clone(), settings)?;
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
        (Some(cluster), Some(report)) => Some(ClusterOccupancy::open(cluster, peer_timeout(&config), report).await?),
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
        Some(edges) if config.webhook_vacated_delay_ms > 0 => Some(DelayedVacate::start(edges, config.webhook_vacated_delay())?),
        _ => None,
    };
    shared_room_settings.occupancy = vacate_delay.clone().map(|d| d as Arc<dyn Occupancy>).or(local_edges);
    let rooms = Rooms::start(backends.room_logs, shared_room_settings, namespaces, threads());
    let registry = Registry::new(config.exclusive_devices.clone(), backends.user_bus).start();
    let directory_settings = DirectorySettings {
        migration_window: config.migration_window(),
        warmup: config.warmup(),
        session_ttl: config.session_ttl(),
        session_cache_max: config.session_cache_max,
    };
    let local = listener.local_addr()?;
    let lifecycle = Arc::new(Lifecycle::default());
    let me = this_node(&config, local, tls.is_some());
    let router = Arc::new(router(&config, me, cluster.is_some(), &lifecycle)?);
    let directory =
        Directory::new(backends.sessions.clone(), router.clone(), directory_settings, metrics.clone()).start();
    let liveness = start_liveness(&config, router.clone(), cluster.as_ref(), &metrics, &presence);
    let rebalance = Rebalancer::start(directory.clone(), registry.clone(), router.clone(), lifecycle.clone(), metrics.clone());
    if let (Some(cluster), Some(kv)) = (&cluster, &backends.kv) {
        let events = NodeActors {
            rooms: rooms.clone(),
            registry: registry.clone(),
            liveness: liveness.clone(),
            nonces: backends.nonces.clone(),
            presence: presence.clone(),
            rebalance: rebalance.actor.clone(),
        };
        crate::cluster::bus::listen(cluster, events, kv.clone()).await?;
        crate::cluster::presence::listen(cluster, PresenceNodes(presence.clone())).await?;
        presence.started();
        if let Some(occupancy) = &occupancy {
            occupancy.start(OccupancyPeers(router.clone())).await?;
        }
    }
    // The open-file budget, shared: plain HTTP sockets' places first, streams get the rest.
    let open_files = open_files_limit();
    let max_http_connections = crate::http::limits::effective_max_http_connections(config.max_http_connections, open_files);
    let max_connections = crate::http::limits::effective_max_connections(config.max_connections, open_files, max_http_connections);
    if max_connections != config.max_connections || max_http_connections != config.max_http_connections {
        tracing::info!(
            configured = config.max_connections,
            max_connections,
            max_http_connections,
            "connection limits bounded by the open-file limit"
        );
    }
    let timing = DrainTiming { wait: config.drain_wait(), spread: config.drain_spread(), grace: config.drain_grace() };
    // The publish path and the kicks' reach, chosen once with the rest: one node, or NATS.
    let (publisher, other_nodes): (Publisher, Arc<dyn OtherNodes>) = match &cluster {
        Some(cluster) => (
            Publisher::clustered(rooms.clone(), cluster.clone(), router.clone()),
            Arc::new(ClusterNodes { cluster: cluster.clone(), router: router.clone() }),
        ),
        None => (Publisher::local(rooms.clone()), Arc::new(NoOtherNodes)),
    };
    let publisher = publisher.with_max_state_bytes(config.max_state_bytes);
    let state = web::Data::new(AppState {
        limits: Arc::new(ConnectionLimits::new(&config, max_connections)),
        sockets: crate::http::sockets::SocketBudget::new(max_http_connections, metrics.clone()),
        connection: Arc::new(connection_settings(&config, metrics.clone(), backends.nonces.clone(), publisher.clone(), webhooks.clone())),
        config: Arc::new(config),
        access: parking_lot::RwLock::new(access),
        reload: reload_config,
        store: store.clone(),
        rooms: rooms.clone(),
        registry: registry.clone(),
        directory: directory.clone(),
        sessions: backends.sessions,
        nonces: backends.nonces,
        other_nodes,
        liveness,
        router: router.clone(),
        rebalance,
        publisher: publisher.clone(),
        metrics: metrics.clone(),
        token_secret: backends.token_secret,
        lifecycle: lifecycle.clone(),
        next_conn: AtomicU64::new(1),
        started: std::time::Instant::now(),
        health: Default::default(),
        demo,
    });
    let server = http_server(listener, tls, state.clone(), &timing)?.run();
    let (done_tx, done) = oneshot::channel();
    let supervisor =
        Supervisor::new(lifecycle, registry, directory.clone(), rooms.clone(), server.handle(), timing, metrics, done_tx).start();
    let mut serving = actix_web::rt::spawn(server);
    let config = state.config.clone();
    let mut background = vec![
        actix_web::rt::spawn(purge_expired(store.clone(), config.migration_window_secs * 1000, config.token_ttl_max())),
        actix_web::rt::spawn(expire_sessions(directory, config.session_ttl())),
    ];
    if demo {
        background.push(actix_web::rt::spawn(crate::demo::run_simulator(publisher)));
    }
    supervisor.send(Start).await.map_err(ServerError::SupervisorGone)??;
    tracing::info!(addr = %local, node = %config.node, data_dir = %config.data_dir.display(), "ready");
    background.push(actix_web::rt::spawn(forward_signals(signals, supervisor)));
    background.push(actix_web::rt::spawn(reload_on(reload, state.clone())));

    let result = match select(done, &mut serving).await {
        Either::Left(_) => {
            // Drained: every connection is closed; let the HTTP server finish.
            let _ = actix_web::rt::time::timeout(Duration::from_secs(5), &mut serving).await;
            Ok(())
        }
        Either::Right((ended, _)) => match ended {
            Ok(Err(e)) => Err(ServerError::Io(e)),
            _ => Ok(()),
        },
    };
    background.iter().for_each(|task| task.abort());
    rooms.shutdown();
    // The rooms' `vacated` edges still waiting go on now, before the rooms leave their
    // records and the webhooks stop.
    if let Some(vacate_delay) = &vacate_delay {
        vacate_delay.stop();
    }
    // The node's rooms leave their occupancy records (the vacated edges it decides go
    // to the webhooks), before the webhooks stop.
    if let Some(occupancy) = &occupancy {
        occupancy.leave(crate::cluster::occupancy::LEAVE_WAIT).await;
    }
    // After the rooms (the last vacated edges are queued), before the flush: what is not
    // delivered stays queued for the next start.
    if let Some(webhooks) = &webhooks {
        webhooks.stop();
    }
    if let Some(cluster) = &cluster {
        cluster.leave().await;
    }
    drop(state);
    store.flush()?;
    tracing::info!("store flushed; stopped");
    result
}

/// Where this node keeps rooms, sessions and token nonces, whom it tells about users,
/// and its token secret: the embedded store alone, or NATS. Chosen once, here.
struct Backends {
    room_logs: Arc<dyn RoomLogs>,
    sessions: Arc<dyn SessionStore>,
    /// Cluster mode: the KV directory, which the cluster bus also replays queued writes to.
    kv: Option<KvSessions>,
    nonces: Arc<dyn Nonces>,
    user_bus: Option<Arc<dyn UserBus>>,
    token_secret: Vec<u8>,
}

impl Backends {
    async fn open(config: &Config, store: &Store, cluster: Option<&Cluster>) -> Result<Backends, ServerError> {
        let Some(cluster) = cluster else {
            return Ok(Backends {
                room_logs: Arc::new(LocalRoomLogs::new(store.clone())?),
                sessions: Arc::new(store.clone()),
                kv: None,
                nonces: Arc::new(StoreNonces::new(store, config)),
                user_bus: None,
                token_secret: store.secret("token")?,
            });
        };
        let kv = KvSessions::open_with(cluster, Some(store.clone()), config.directory_outage()).await?;
        Ok(Backends {
            room_logs: Arc::new(StreamRoomLogs(cluster.clone())),
            sessions: Arc::new(kv.clone()),
            kv: Some(kv),
            nonces: Arc::new(ClusterNonces {
                cluster: cluster.clone(),
                local: StoreNonces::new(store, config),
                sending: Default::default(),
            }),
            user_bus: Some(Arc::new(ClusterUserBus(cluster.clone()))),
            // Every node verifies every other node's tokens.
            token_secret: cluster.secret("token", crate::world::random_bytes()).await?,
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
/// peers, probed. Nodes that started within `migration_window_secs` rank first for the
/// sessions a release moves.
fn router(config: &Config, me: crate::config::Peer, clustered: bool, lifecycle: &Arc<Lifecycle>) -> Result<Router, ServerError> {
    let up_after = config.probe_up_after.min(u32::MAX as u64) as u32;
    let release_window = config.migration_window();
    Ok(if clustered {
        let timeout = config.cluster_heartbeat() * HEARTBEATS_MISSED as u32;
        Router::clustered(me, timeout, up_after, lifecycle.clone(), release_window)
    } else {
        Router::probed(me, config.peer_nodes()?, up_after, lifecycle.clone(), release_window)
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
            LivenessActor::clustered(router, config.cluster_heartbeat(), peers, metrics.clone()).start()
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
) -> ConnectionSettings {
    ConnectionSettings {
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
        subscribe_timeout: (config.subscribe_timeout_secs > 0).then(|| Duration::from_secs(config.subscribe_timeout_secs)),
        webhooks,
    }
}

/// The HTTP server on `listener` (TLS when configured), not yet running. Upgrade requests
/// go through the same app (`http::upgrade`), then leave the HTTP layer for livegate's
/// own WebSocket transport.
fn http_server(
    listener: std::net::TcpListener,
    tls: Option<rustls::ServerConfig>,
    state: web::Data<AppState>,
    timing: &DrainTiming,
) -> Result<actix_server::ServerBuilder, ServerError> {
    let handshake_timeout = state.config.handshake_timeout();
    let on_connect = Arc::new(http::on_connect(state.metrics.clone(), handshake_timeout));
    let budget = state.sockets.clone();
    let make_app = move || {
        App::new()
            .app_data(state.clone())
            .wrap_fn(|req, service| {
                if let Some(watch) = req.conn_data::<Arc<http::RequestWatch>>() {
                    watch.seen();
                }
                http::sockets::watch_request(req, service)
            })
            .configure(http::configure)
    };
    // Every accepted socket takes a plain HTTP place first (none free: closed at once)
    // and reads through the head deadline's wrapper.
    let accept = move || {
        let budget = budget.clone();
        actix_service::fn_service(move |io: TcpStream| {
            let state = SocketState::open(&budget, handshake_timeout);
            async move {
                let Some(state) = state else {
                    tracing::debug!(peer = ?io.peer_addr().ok(), "no place for another plain HTTP socket; closed");
                    return Err(std::io::Error::other("no place for another plain HTTP socket"));
                };
                // Frames are written whole; never hold one back for the next.
                io.set_nodelay(true)?;
                let peer = io.peer_addr().ok();
                Ok::<_, std::io::Error>(Timed::new(io, state, peer))
            }
        })
    };
    let shutdown_timeout = timing.spread.as_secs() + timing.grace.as_secs() + 5;
    let builder = actix_server::Server::build()
        .workers(threads())
        .disable_signals()
        // The supervisor decides when connections end; this only bounds the very last step.
        .shutdown_timeout(shutdown_timeout);
    // On a stop, idle keep-alive connections close at once instead of lingering.
    let stopping = builder.graceful_shutdown_signal();
    // One HTTP service per worker for either stream type (plain TCP, TLS).
    macro_rules! http_service {
        ($io:ty) => {{
            let (make_app, on_connect, stopping) = (make_app.clone(), on_connect.clone(), stopping.clone());
            move || {
                let (on_connect, stopping) = (on_connect.clone(), stopping.clone());
                let app = || actix_service::map_config(make_app(), |_| actix_web::dev::AppConfig::default());
                HttpService::build()
                    // Slowloris: the first request head (so a WebSocket upgrade) must arrive
                    // in time; `Timed` times every later one.
                    .client_request_timeout(handshake_timeout)
                    // An idle keep-alive connection (not a byte of a next request) closes.
                    .keep_alive(KEEP_ALIVE)
                    // After a last response drop the TCP connection promptly instead of
                    // lingering actix's default second: clients wait for the server's FIN.
                    .client_disconnect_timeout(CLIENT_DISCONNECT_TIMEOUT)
                    // A client that ends its side of the connection is gone: an SSE
                    // stream's response stops at once (its connection is released now,
                    // not at the next heartbeat's failed write). No client of this API
                    // half-closes and then waits for an answer.
                    .h1_allow_half_closed(false)
                    .graceful_shutdown_signal(move || {
                        let stopping = stopping.clone();
                        async move { stopping.notified().await }
                    })
                    .on_connect_ext(move |io: &$io, data: &mut actix_web::dev::Extensions| on_connect(io as &dyn std::any::Any, data))
                    .upgrade(http::upgrade::UpgradeFactory::new(app()))
                    .finish(app())
            }
        }};
    }
    Ok(match tls {
        Some(mut tls) => {
            use actix_tls::accept::rustls_0_23::{Acceptor, TlsStream};
            use actix_tls::accept::TlsError;
            let service = http_service!(TlsStream<Timed<TcpStream>>);
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
            let acceptor = Acceptor::new(tls);
            builder.listen("livegate", listener, move || {
                accept()
                    .map_err(TlsError::Tls)
                    .and_then(acceptor.clone().map_init_err(|_| ()).map_err(TlsError::into_service_error))
                    .and_then(|io: TlsStream<Timed<TcpStream>>| async move {
                        let peer = io.get_ref().0.peer();
                        Ok((io, actix_http::Protocol::Http1, peer))
                    })
                    .and_then(service().map_err(TlsError::Service))
            })?
        }
        None => {
            let service = http_service!(Timed<TcpStream>);
            builder.listen("livegate", listener, move || {
                accept()
                    .map_err(actix_http::error::DispatchError::Io)
                    .and_then(|io: Timed<TcpStream>| async move {
                        let peer = io.peer();
                        Ok((io, actix_http::Protocol::Http1, peer))
                    })
                    .and_then(service())
            })?
        }
    })
}

/// Each shutdown signal is one step of the drain.
async fn forward_signals(mut signals: Signals, supervisor: Addr<Supervisor>) {
    while signals.next().await.is_some() {
        supervisor.do_send(Signal);
    }
}

/// Each reload signal reloads the access list.
async fn reload_on(mut reload: Signals, state: web::Data<AppState>) {
    while reload.next().await.is_some() {
        if let Err(error) = http::reload_access(&state) {
            tracing::error!(%error, "reload failed; the access list is unchanged");
        }
    }
}

/// The process's soft limit on open files.
fn open_files_limit() -> u64 {
    rlimit::Resource::NOFILE.get_soft().unwrap_or(1024)
}

/// Raise the soft open-file limit to the hard one, as a server holding many sockets
/// should; returns the limit now in force.
pub fn raise_open_files_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or_else(|_| open_files_limit())
}

/// The TLS server configuration when `tls_cert` and `tls_key` are set, read from their
/// files; callers check it before announcing a listener.
pub fn tls_config(config: &Config) -> Result<Option<rustls::ServerConfig>, ServerError> {
    config.tls_cert.as_ref().zip(config.tls_key.as_ref()).map(|(cert, key)| tls::server_config(cert, key)).transpose()
}

/// Forget expired token nonces and migration times past their window a few times per
/// token lifetime (at most every minute). Each purge reads only its time index's due
/// entries, on a blocking thread: store I/O never runs on the system arbiter.
async fn purge_expired(store: Store, migration_window_ms: u64, token_ttl_max: Duration) {
    let every = (token_ttl_max / 4).clamp(Duration::from_millis(250), PURGE_EVERY);
    loop {
        actix_web::rt::time::sleep(every).await;
        let store = store.clone();
        let purged = actix_web::rt::task::spawn_blocking(move || {
            (store.purge_nonces(now_ms()), store.purge_kicks(now_ms()), store.purge_migrations(now_ms(), migration_window_ms))
        });
        let (nonces, kicks, migrations) = match purged.await {
            Ok(results) => results,
            Err(error) => {
                tracing::error!(%error, "the purge thread failed");
                continue;
            }
        };
        match nonces {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "expired token nonces forgotten"),
            Err(error) => tracing::warn!(%error, "could not purge token nonces"),
        }
        match kicks {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "kicks older than every credential forgotten"),
            Err(error) => tracing::warn!(%error, "could not purge kicks"),
        }
        match migrations {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "migration times past their window forgotten"),
            Err(error) => tracing::warn!(%error, "could not purge migration times"),
        }
    }
}

/// Hand memory freed by departed users back to the system. glibc's malloc keeps freed
/// memory of its arenas for reuse; after a wave of users left and their sessions expired,
/// that is most of the process's growth (measured: 18 of 51 MiB after a churn of 60,000
/// sessions). Other allocators return memory themselves.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "mimalloc"), not(feature = "jemalloc")))]
    // SAFETY: malloc_trim only walks and releases the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The registry's announcements over the cluster's NATS subjects.
struct ClusterUserBus(Cluster);

impl UserBus for ClusterUserBus {
    fn announce_replace(&self, user: &str, device: &str, at_ms: u64) {
        let (cluster, user, device) = (self.0.clone(), user.to_string(), device.to_string());
        actix::spawn(async move { crate::cluster::bus::announce_replace(&cluster, &user, &device, at_ms).await });
    }
}

/// What the other nodes send, handed to the actors that act on it.
#[derive(Clone)]
struct NodeActors {
    rooms: Rooms,
    registry: Addr<Registry>,
    liveness: Addr<LivenessActor>,
    /// A kick from another node is answered once its revocations are durable.
    nonces: Arc<dyn Nonces>,
    presence: Arc<PresenceHub>,
    rebalance: Addr<Rebalancer>,
}

impl NodeEvents for NodeActors {
    fn live_event(&self, room: &str, event: StreamEvent) {
        self.rooms.live_event(room, event);
    }

    fn live_state(&self, room: &str, state: StoredState, version: u64) {
        self.rooms.live_state(room, StateAt { seq: state.seq, data: state.data.into() }, version);
    }

    fn peer_heard(&self, peer: NodeInfo) {
        self.liveness.do_send(Heard(peer));
    }

    fn peer_left(&self, node: String) {
        self.presence.node_gone(&node);
        self.liveness.do_send(Left(node));
    }

    fn replaced(&self, user: String, device: String, at_ms: u64) {
        self.registry.do_send(RemoteReplace { user, device, at_ms });
    }

    fn kick(&self, user: String, device: Option<String>, at_ms: u64) -> LocalBoxFuture<'static, usize> {
        let (registry, nonces) = (self.registry.clone(), self.nonces.clone());
        Box::pin(async move {
            // The asking node recorded the kick in NATS before it asked; this node's store
            // gets it too, so it holds here while NATS is away.
            if let Err(error) = nonces.kick_user(&user, device.as_deref(), at_ms).await {
                tracing::warn!(%error, user, "kick: not recorded in this node's store");
            }
            let closed = registry.send(Kick { user, device, at_ms }).await.unwrap_or(0);
            if let Err(error) = nonces.revocations_durable().await {
                tracing::warn!(%error, "kick: the revocations are not flushed");
            }
            closed
        })
    }

    fn publish(&self, publish: ForwardedPublish) -> LocalBoxFuture<'static, Result<Appended, Box<dyn std::error::Error>>> {
        let rooms = self.rooms.clone();
        Box::pin(async move {
            let ForwardedPublish { room, id, data, devices, from, state, put_state } = publish;
            let done = if put_state {
                rooms.put_state(&room, data.into()).await
            } else {
                rooms.publish(&room, NewEvent { id: id.into(), data: data.into(), devices, from, state: state.map(Into::into) }).await
            };
            match done {
                Ok(published) => Ok(Appended { seq: published.seq, epoch: published.epoch.to_string(), duplicate: published.duplicate }),
                Err(error) => Err(error.into()),
            }
        })
    }

    fn reconnected(&self) {
        self.rooms.resync_all();
        self.presence.reconnected();
    }

    fn rebalance(&self, order: Order) {
        self.rebalance.do_send(Shed(order));
    }
}

impl Occupancy for ClusterOccupancy {
    fn changed(&self, room: &str, occupied: bool, now_ms: u64) {
        self.local_edge(room, occupied, now_ms);
    }
}

/// Rooms' writers and the peers alive, for cluster occupancy, from the router.
struct OccupancyPeers(Arc<Router>);

impl crate::cluster::occupancy::Peers for OccupancyPeers {
    fn writer(&self, room: &str) -> LocalBoxFuture<'static, Option<String>> {
        Box::pin(std::future::ready(self.0.room_writer(room)))
    }

    fn alive(&self) -> LocalBoxFuture<'static, Vec<String>> {
        Box::pin(std::future::ready(self.0.peers_heard()))
    }
}

/// The other nodes' presence tables and hellos, into the node's presence hub.
#[derive(Clone)]
struct PresenceNodes(Arc<PresenceHub>);

impl crate::cluster::presence::PresenceEvents for PresenceNodes {
    fn table(&self, node: String, room: String, table: crate::core::presence::NodeTable) {
        self.0.remote_table(&node, &room, table);
    }

    fn hello(&self, node: String) {
        self.0.hello(&node);
    }
}

/// Sweep sessions past their TTL a few times per TTL (at most every minute).
async fn expire_sessions(directory: Addr<Directory>, session_ttl: Duration) {
    let every = (session_ttl / 4).clamp(Duration::from_millis(250), PURGE_EVERY);
    let mut ticks = actix_web::rt::time::interval_at(actix_web::rt::time::Instant::now() + every, every);
    loop {
        ticks.tick().await;
        match directory.send(ExpireSessions).await {
            Ok(0) => {}
            Ok(_) => return_freed_memory(),
            Err(_) => return,
        }
    }
}

/// The rustls server configuration from PEM files (ring provider, TLS 1.2 and 1.3).
mod tls {
    use std::path::Path;
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    use super::ServerError;

    pub fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, ServerError> {
        let failed = |what: &'static str, path: &Path, source| ServerError::TlsPem { what, path: path.to_path_buf(), source };
        let certs = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| failed("certificate chain", cert, e))?;
        if certs.is_empty() {
            return Err(ServerError::TlsNoCertificate { path: cert.to_path_buf() });
        }
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| failed("private key", key, e))?;
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .and_then(|builder| builder.with_no_client_auth().with_single_cert(certs, key_der))
            .map_err(|source| ServerError::TlsConfig { cert: cert.to_path_buf(), key: key.to_path_buf(), source })
    }
}
