//! `run(listener, config, shutdown)`: opens the store, starts the actors and the HTTP
//! server on the given listener, and on `shutdown` lets the supervisor drain (1012 to every
//! connection, spread out), then stops the rooms and flushes the store before returning.
//! `main` and the tests call the same code; the caller owns the listener and the signals.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use actix_web::{web, App, HttpServer};
use futures_util::future::{select, Either};
use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::oneshot;
use thiserror::Error;

use crate::actors::connection::ConnectionSettings;
use crate::actors::directory::Directory;
use crate::actors::liveness::LivenessActor;
use crate::actors::registry::Registry;
use crate::actors::room::RoomSettings;
use crate::world::now_ms;
use crate::actors::rooms::Rooms;
use crate::actors::supervisor::{DrainTiming, Signal, Start, Supervisor};
use crate::config::{Config, ConfigError};
use crate::core::seqlog::Retention;
use crate::http::{self, AppState, Lifecycle};
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};

/// Largest client WebSocket message (frame or assembled fragments).
const MAX_CLIENT_MESSAGE_BYTES: usize = 64 * 1024;
/// How often expired token nonces are forgotten.
const NONCE_PURGE_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("startup failed: {0}")]
    Startup(String),
}

fn room_settings(config: &Config, metrics: Arc<Metrics>) -> RoomSettings {
    RoomSettings {
        metrics,
        retention: Retention { max_events: config.history_size, max_age_ms: config.history_ttl_secs * 1000 },
        recovery_max_events: config.recovery_max_events,
        idle_stop: Duration::from_secs(120),
        tick: Duration::from_secs(10),
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Serve on `listener` until `shutdown` resolves, then drain. Must run inside an actix
/// system.
pub async fn run(
    listener: std::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + 'static,
) -> Result<(), ServerError> {
    run_with_signals(listener, config, stream::once(shutdown).chain(stream::pending()), false).await
}

/// Serve on `listener`; the first item of `signals` starts a drain, a second one forces
/// it. `demo` adds the score page and the match simulator. Must run inside an actix system.
pub async fn run_with_signals(
    listener: std::net::TcpListener,
    config: Config,
    signals: impl Stream<Item = ()> + 'static,
    demo: bool,
) -> Result<(), ServerError> {
    config.validate()?;
    let api_key = config.resolve_api_key()?.key;
    let store = Store::open(&config.data_dir)?;
    let token_secret = store.secret("token")?;
    let device_kinds = config.exclusive_devices.iter().cloned().chain(["web".to_string()]);
    let metrics = Arc::new(Metrics::new(device_kinds));
    let rooms = Rooms::start(store.clone(), room_settings(&config, metrics.clone()), threads());
    let registry = Registry::new(config.exclusive_devices.clone()).start();
    let directory = Directory::new(
        store.clone(),
        config.node.clone(),
        Duration::from_secs(config.migration_window_secs),
        Duration::from_secs(config.warmup_secs),
        metrics.clone(),
    )
    .start();
    let local = listener.local_addr()?;
    let url = config.public_url.clone().unwrap_or_else(|| format!("http://{local}"));
    let me = crate::config::Peer { name: config.node.clone(), cell: config.cell.clone(), url };
    let liveness = LivenessActor::new(
        me,
        config.peer_nodes()?,
        Duration::from_millis(config.probe_interval_ms),
        config.probe_up_after.min(u32::MAX as u64) as u32,
        metrics.clone(),
    )
    .start();
    let lifecycle = Arc::new(Lifecycle::default());
    let connection = Arc::new(ConnectionSettings {
        metrics: metrics.clone(),
        node: config.node.clone(),
        heartbeat: Duration::from_secs(config.heartbeat_secs),
        batch_window: Duration::from_millis(config.batch_window_ms),
        max_subscriptions: config.max_subscriptions,
        max_message_bytes: MAX_CLIENT_MESSAGE_BYTES,
        max_outbox_bytes: config.max_outbox_bytes,
    });
    let timing = DrainTiming {
        wait: Duration::from_secs(config.drain_wait_secs),
        spread: Duration::from_secs(config.drain_spread_secs),
        grace: Duration::from_secs(config.drain_grace_secs),
    };
    let state = web::Data::new(AppState {
        config: Arc::new(config),
        api_key,
        store: store.clone(),
        rooms: rooms.clone(),
        registry: registry.clone(),
        directory: directory.clone(),
        liveness,
        metrics: metrics.clone(),
        token_secret,
        connection,
        lifecycle: lifecycle.clone(),
        next_conn: AtomicU64::new(1),
        started: std::time::Instant::now(),
        demo,
    });

    let app_state = state.clone();
    let server = HttpServer::new(move || App::new().app_data(app_state.clone()).configure(http::configure))
        .workers(threads())
        .disable_signals()
        .on_connect(http::on_connect)
        // The supervisor decides when connections end; this only bounds the very last step.
        .shutdown_timeout(timing.spread.as_secs() + timing.grace.as_secs() + 5)
        .listen(listener)?
        .run();
    let (done_tx, done) = oneshot::channel();
    let supervisor =
        Supervisor::new(lifecycle, registry, directory, server.handle(), timing, metrics, done_tx).start();
    let mut serving = actix_web::rt::spawn(server);
    let purge = actix_web::rt::spawn(purge_nonces(store.clone()));
    let simulator = demo.then(|| actix_web::rt::spawn(crate::demo::run_simulator(rooms.clone())));
    supervisor.send(Start).await.map_err(|e| ServerError::Startup(e.to_string()))?.map_err(ServerError::Startup)?;
    tracing::info!(addr = %local, node = %state.config.node, data_dir = %state.config.data_dir.display(), "ready");

    let forward = supervisor.clone();
    let signals = actix_web::rt::spawn(async move {
        let mut signals = std::pin::pin!(signals);
        while signals.next().await.is_some() {
            forward.do_send(Signal);
        }
    });
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
    signals.abort();
    purge.abort();
    if let Some(simulator) = simulator {
        simulator.abort();
    }
    rooms.shutdown();
    drop(state);
    store.flush()?;
    tracing::info!("store flushed; stopped");
    result
}

/// Forget expired token nonces now and then.
async fn purge_nonces(store: Store) {
    loop {
        actix_web::rt::time::sleep(NONCE_PURGE_EVERY).await;
        match store.purge_nonces(now_ms()) {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "expired token nonces forgotten"),
            Err(error) => tracing::warn!(%error, "could not purge token nonces"),
        }
    }
}
