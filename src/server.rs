//! Assembles the Pingora server: the proxy service, the admin service and background
//! tasks (the memory store's sweeper, the demo upstream, the Envoy rate-limit service),
//! from a validated `Config`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;

use pingora::server::{ExecutionPhase, RunArgs};

use crate::admin::Admin;
use crate::admission::snapshot::Database;
use crate::admission::{Core, Runtime};
use crate::config::{Backend, Config};
use crate::db::events::EventQueue;
use crate::demo::DemoUpstream;
use crate::lifecycle::{self, Lifecycle};
use crate::metrics::Metrics;
use crate::proxy::listener::{Capped, Edge};
use crate::proxy::Gateway;
use crate::rls::RlsListener;
use crate::store::redis::bans::{BanCursor, BanRead};
use crate::store::{LimitStore, MemoryStore, RedisStore, TieredStore};
use crate::sync::{EventRetention, EventWriter, Refresher};

/// Why the gateway cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configured store cannot be set up.
    #[error("{0}")]
    Unsupported(String),
    /// Metrics could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// Upstreams could not be set up.
    #[error("upstreams: {0}")]
    Io(#[from] std::io::Error),
    /// A listener of the gateway's own could not be bound.
    #[error("{0}")]
    Listen(String),
}

/// Extra pieces for `throttle demo`, `throttle run --upgrade` and in-process tests.
#[derive(Default)]
pub struct Extras {
    /// Serve the demo echo upstream on this listener.
    pub demo_upstream: Option<std::net::TcpListener>,
    /// Take over the listening sockets of a running gateway (zero-downtime upgrade): the
    /// old process hands them over on SIGQUIT through `server.upgrade_sock`.
    pub upgrade: bool,
    /// Decide on this store instead of the configured one (tests).
    pub store: Option<Arc<dyn LimitStore>>,
}

/// A built server and the state it shares.
pub struct Built {
    /// The Pingora server, ready to bootstrap and run.
    pub server: Server,
    /// What the admission pipeline reads.
    pub core: Arc<Core>,
    /// The database link.
    pub db: Arc<Database>,
    /// Open connections and shutdown work.
    pub lifecycle: Arc<Lifecycle>,
}

/// Builds the server for `config` and runs it until it is told to stop.
///
/// # Errors
/// `StartError` when the config asks for something this build cannot run.
pub fn run(config: Config, extras: Extras) -> Result<(), StartError> {
    let Built {
        mut server,
        lifecycle,
        ..
    } = build(config, extras)?;
    server.bootstrap();
    watch_shutdown(server.watch_execution_phase(), lifecycle);
    server.run(RunArgs::default());
    Ok(())
}

/// Builds the server for `config`, returning it with the state it shares.
///
/// # Errors
/// `StartError` when the config asks for something this build cannot run.
pub fn build(mut config: Config, extras: Extras) -> Result<Built, StartError> {
    let nofile = lifecycle::raise_nofile_limit();
    let max_connections = config.server.max_connections.map_or_else(
        || lifecycle::default_max_connections(nofile, lifecycle::open_files()),
        |n| n as usize,
    );
    let demo_addr = match &extras.demo_upstream {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    if let Some(addr) = demo_addr {
        crate::reload::point_routes_at(&mut config, addr);
    }
    let conf = server_conf(&config);
    let opt = Opt {
        upgrade: extras.upgrade,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(Some(opt), conf);
    // rustls needs a process-wide crypto provider before the first `rediss://` connection
    // (redis-rs builds its client config from the default); Pingora's is ring.
    pingora::tls::install_default_crypto_provider();
    let memory = Arc::new(MemoryStore::new());
    let metrics = Arc::new(Metrics::new()?);
    let instances = Arc::new(AtomicU32::new(config.store.instances.unwrap_or(1)));
    let mut redis = None;
    let store: Arc<dyn LimitStore> = match (extras.store, config.store.backend) {
        (Some(store), _) => store,
        (None, Backend::Memory) => memory.clone(),
        (None, Backend::Redis) => {
            let primary = Arc::new(
                RedisStore::from_config(&config.store)
                    .map_err(|e| StartError::Unsupported(e.to_string()))?
                    .with_metrics(metrics.clone()),
            );
            redis = Some(primary.clone());
            Arc::new(TieredStore::new(
                primary,
                memory.clone(),
                instances.clone(),
                metrics.clone(),
            ))
        }
    };
    // On Redis the heartbeat always runs (it is also the store's health probe); its
    // count sizes the local fallback unless `[store] instances` fixes it.
    let heartbeat = redis.as_ref().map(|r| Heartbeat {
        redis: r.clone(),
        instances: config.store.instances.is_none().then(|| instances.clone()),
        id: config.server.instance_id.clone(),
    });
    let listen = config.server.listen;
    let admin_listen = config.server.admin_listen;
    let rls_listen = config.server.rls_listen;
    let threads = config.server.threads;
    let db = Arc::new(Database::new(config.database_url.clone()));
    let mut core = Core::new(Runtime::from_config(config)?, store, metrics);
    core.upstream_override = demo_addr;
    core.shared_bans = redis.clone();
    if db.configured() {
        let dropped = core.metrics.events_dropped_total.clone();
        core.events = Some(Arc::new(EventQueue::new(EVENT_QUEUE, dropped)));
    }
    let core = Arc::new(core);

    let lifecycle = Arc::new(Lifecycle::default());
    tracing::debug!(max_connections, nofile, "connection cap");
    let gateway = pingora::proxy::http_proxy(&server.configuration, Gateway::new(core.clone()));
    // TLS is accepted by the edge itself (after the connection takes its slot, within
    // `header_timeout_secs`), so the listener is plain TCP either way.
    let tls = match crate::proxy::tls::CertResolver::new(core.clone()) {
        Some(resolver) => Some(
            resolver
                .settings()
                .map_err(|e| StartError::Listen(format!("tls on {listen}: {e}")))?
                .build(),
        ),
        None => None,
    };
    let mut proxy = Service::new(
        "throttle proxy".to_string(),
        Edge::new(
            gateway,
            core.clone(),
            lifecycle.clone(),
            max_connections,
            tls,
        ),
    );
    proxy.add_tcp(&listen.to_string());
    let token = std::env::var("THROTTLE_ADMIN_TOKEN").ok();
    // The admin listener counts its connections apart from the proxy's (its own cap).
    let mut admin = Service::new(
        "throttle admin".to_string(),
        Capped::new(
            Admin::new(core.clone(), db.clone(), token),
            core.clone(),
            Arc::new(Lifecycle::default()),
            lifecycle::ADMIN_MAX_CONNECTIONS,
        ),
    );
    admin.add_tcp(&admin_listen.to_string());
    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(background_service(
        "memory store sweeper",
        Sweeper { store: memory },
    ));
    server.add_service(background_service(
        "ban sync",
        BanSync { core: core.clone() },
    ));
    server.add_service(background_service(
        "adaptive limits",
        AdaptiveController { core: core.clone() },
    ));
    server.add_service(background_service(
        "reload on SIGHUP",
        Reloader {
            core: core.clone(),
            db: db.clone(),
        },
    ));
    server.add_service(background_service(
        "upstream health checks",
        crate::upstream_health::HealthChecks::new(core.clone()),
    ));
    if let Some(h) = heartbeat {
        server.add_service(background_service(
            "lease returns",
            LeaseReturns {
                redis: h.redis.clone(),
                lifecycle: lifecycle.clone(),
            },
        ));
        server.add_service(background_service("instance heartbeat", h));
    }
    if let Some(url) = db.url() {
        server.add_service(background_service(
            "database snapshot",
            Refresher::new(core.clone(), db.clone()),
        ));
        if let Some(queue) = core.events.clone() {
            server.add_service(background_service(
                "violation log writer",
                EventWriter::new(queue, url.to_string(), lifecycle.clone()),
            ));
        }
        server.add_service(background_service(
            "violation log retention",
            EventRetention::new(core.clone(), url.to_string()),
        ));
    }
    if let Some(addr) = rls_listen {
        // Bound here, so that a taken port stops the start as the other listeners do;
        // an upgrading process binds it once its predecessor lets go (see `rls`).
        let rls = if extras.upgrade {
            RlsListener::later(core.clone(), lifecycle.clone(), addr)
        } else {
            RlsListener::bind(core.clone(), lifecycle.clone(), addr)
                .map_err(|e| StartError::Listen(format!("rls_listen {addr}: {e}")))?
        };
        let mut service = background_service("envoy rate-limit service", rls);
        service.threads = Some(threads);
        server.add_service(service);
    }
    if let Some(listener) = extras.demo_upstream {
        server.add_service(background_service(
            "demo upstream",
            DemoUpstream::new(listener),
        ));
    }
    Ok(Built {
        server,
        core,
        db,
        lifecycle,
    })
}

/// After a graceful shutdown has begun (SIGTERM, or SIGQUIT's upgrade), exits as soon as
/// no connection is open and no shutdown work is pending, instead of sleeping the whole
/// grace period; and exits at once on SIGINT (Pingora stops listening for signals once a
/// graceful shutdown starts).
fn watch_shutdown(
    mut phases: tokio::sync::broadcast::Receiver<ExecutionPhase>,
    lifecycle: Arc<Lifecycle>,
) {
    let watch = async move {
        use tokio::signal::unix::{signal, SignalKind};
        loop {
            match phases.recv().await {
                Ok(
                    ExecutionPhase::GracefulTerminate
                    | ExecutionPhase::GracefulUpgradeTransferringFds,
                ) => break,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
        let mut interrupt = match signal(SignalKind::interrupt()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGINT during shutdown");
                None
            }
        };
        let mut draining = false;
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tokio::select! {
                Some(()) = async { match &mut interrupt { Some(s) => s.recv().await, None => std::future::pending().await } } => {
                    tracing::info!("SIGINT during graceful shutdown: exiting now");
                    std::process::exit(130);
                }
                phase = phases.recv(), if !draining => {
                    draining = matches!(phase, Ok(ExecutionPhase::ShutdownGracePeriod));
                }
                _ = tick.tick(), if draining => {
                    if lifecycle.idle() {
                        tracing::info!("graceful shutdown: drained, exiting before the grace period ends");
                        std::process::exit(0);
                    }
                }
            }
        }
    };
    let spawned = std::thread::Builder::new()
        .name("shutdown watch".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(watch),
                Err(e) => tracing::warn!(error = %e, "shutdown watch cannot start"),
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "shutdown watch cannot start");
    }
}

fn server_conf(config: &Config) -> ServerConf {
    let port = config.server.listen.port();
    ServerConf {
        threads: config.server.threads,
        grace_period_seconds: Some(config.server.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(1),
        pid_file: format!("/tmp/throttle-{port}.pid"),
        upgrade_sock: config
            .server
            .upgrade_sock
            .clone()
            .unwrap_or_else(|| format!("/tmp/throttle-{port}-upgrade.sock")),
        ..ServerConf::default()
    }
}

/// Violation events held while PostgreSQL is slow or down; beyond this the oldest are
/// dropped and counted.
const EVENT_QUEUE: usize = 100_000;

/// Reloads gateway.toml on SIGHUP (see `reload`).
struct Reloader {
    core: Arc<Core>,
    db: Arc<Database>,
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; reload with POST /v1/reload");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = hup.recv() => {
                    if let Err(e) = crate::reload::reload(&self.core, &self.db).await {
                        tracing::warn!("config reload rejected: {e}");
                    }
                }
            }
        }
    }
}

/// Heartbeats this instance into Redis every second; the live count sizes the local
/// fallback (the last count seen is kept while Redis is down).
struct Heartbeat {
    redis: Arc<RedisStore>,
    /// Where the live count goes (None when `[store] instances` fixes it).
    instances: Option<Arc<AtomicU32>>,
    id: String,
}

#[async_trait]
impl BackgroundService for Heartbeat {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let clock = crate::clock::SystemClock;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    use crate::clock::Clock;
                    self.redis.follow_master().await;
                    match self.redis.heartbeat(&self.id, clock.now_ms(), 3_000).await {
                        Ok(n) => {
                            if let Some(i) = &self.instances {
                                i.store(n, Ordering::Relaxed);
                            }
                        }
                        Err(e) => tracing::trace!(error = %e, "heartbeat failed; keeping the last instance count"),
                    }
                }
            }
        }
    }
}

/// Gives leased tokens back to Redis when their lease ends, and all of them at shutdown
/// (the process does not exit early before that is done); renews the concurrency slots
/// of requests in flight.
struct LeaseReturns {
    redis: Arc<RedisStore>,
    lifecycle: Arc<Lifecycle>,
}

#[async_trait]
impl BackgroundService for LeaseReturns {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let _finishing = self.lifecycle.finishing();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Concurrency slots of requests in flight: their entries are renewed while they
        // run (a dead gateway's expire by themselves).
        let mut renew = tokio::time::interval(self.redis.renew_every());
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => self.redis.return_expired().await,
                _ = renew.tick() => self.redis.renew_slots().await,
            }
        }
        self.redis.return_all().await;
    }
}

/// Every second: what changed in the fleet's automatic bans, read from Redis (this
/// gateway's own are there too) and applied; the whole table on the first sync, after
/// Redis restarted or was flushed, or when this gateway fell behind the change log (see
/// `store::redis::bans`). On the memory store: expired bans dropped.
struct BanSync {
    core: Arc<Core>,
}

#[async_trait]
impl BackgroundService for BanSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut cursor = BanCursor::default();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    let now_ms = self.core.clock.now_ms();
                    let bans = &self.core.bans;
                    let Some(redis) = &self.core.shared_bans else {
                        bans.prune(now_ms);
                        continue;
                    };
                    let syncs = &self.core.metrics.ban_syncs;
                    match redis.sync_bans(&mut cursor, now_ms).await {
                        Ok(BanRead::Full(all)) => {
                            bans.replace(all, now_ms);
                            syncs[0].inc();
                        }
                        Ok(BanRead::Changes { set, lifted }) => {
                            bans.apply(set, lifted, now_ms);
                            syncs[1].inc();
                        }
                        // Keep the bans known; expired ones still stop matching.
                        Err(e) => {
                            tracing::debug!(error = %e, "ban sync failed");
                            bans.prune(now_ms);
                        }
                    }
                }
            }
        }
    }
}

/// The adaptive-limit controller: once a second, every adaptive route's factor takes
/// one step on its window (see `adaptive`), and `throttle_adaptive_factor{route}`
/// follows. Routes are read from the current runtime at each tick, so a reload that adds,
/// changes or removes `adaptive` applies from the next tick (a removed route's series is
/// dropped).
struct AdaptiveController {
    core: Arc<Core>,
}

#[async_trait]
impl BackgroundService for AdaptiveController {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shown: Vec<Arc<str>> = Vec::new();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => shown = adaptive_tick(&self.core, &shown),
            }
        }
    }
}

/// One controller step for every adaptive route of the current runtime; answers the
/// routes whose gauge is set (those of `shown` no longer adaptive lose theirs).
fn adaptive_tick(core: &Core, shown: &[Arc<str>]) -> Vec<Arc<str>> {
    let rt = core.runtime();
    let now_ms = core.clock.now_ms();
    let gauge = &core.metrics.adaptive_factor;
    let mut now_shown = Vec::new();
    for entry in rt.router.entries() {
        let (Some(state), Some(settings)) = (&entry.adaptive, &entry.route.adaptive) else {
            continue;
        };
        let factor = state.tick(settings, now_ms);
        let name = &entry.route.name;
        gauge.with_label_values(&[name]).set(factor.as_f64());
        now_shown.push(name.clone());
    }
    for gone in shown.iter().filter(|n| !now_shown.contains(n)) {
        let _ = gauge.remove_label_values(&[gone]);
    }
    now_shown
}

/// Evicts idle memory-store state every second (see `MemoryStore`).
struct Sweeper {
    store: Arc<MemoryStore>,
}

#[async_trait]
impl BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => self.store.sweep(),
            }
        }
    }
}
