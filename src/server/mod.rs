//! Assembles the Pingora server from a validated `Config`: the proxy and admin listeners,
//! the Envoy rate-limit service, the demo upstream, and the background services (the
//! periodic ones are in `services`: sweeper, heartbeat, lease returns, ban sync, adaptive
//! controller; besides them the SIGHUP reloader, the JWKS refresher (`jwks`), health
//! checks and the database's).

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;

use pingora::server::{ExecutionPhase, RunArgs};

use crate::access_log::AccessLog;
use crate::admin::Admin;
use crate::admission::{Core, Runtime, RuntimeError};
use crate::config::{Backend, Config};
use crate::db::events::EventQueue;
use crate::demo::DemoUpstream;
use crate::lifecycle::{self, Lifecycle};
use crate::metrics::Metrics;
use crate::proxy::listener::{Capped, ProxyListener};
use crate::proxy::Gateway;
use crate::reload::snapshot::Database;
use crate::rls::RlsListener;
use crate::store::home::HomeStore;
use crate::store::{BanStore, LimitStore, MemoryStore, RedisStore, TieredStore};
use crate::sync::{EventRetention, EventWriter, Refresher};
use crate::violations::EventSink;

mod jwks;
mod services;

use crate::lifecycle::Every;

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
    /// The request-path state could not be built (upstreams, the JWT verifier).
    #[error("{0}")]
    Runtime(#[from] crate::admission::RuntimeError),
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
    tracing::debug!(max_connections, nofile, "connection cap");
    let demo_addr = match &extras.demo_upstream {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    if let Some(addr) = demo_addr {
        crate::reload::point_routes_at(&mut config, addr);
    }
    let opt = Opt {
        upgrade: extras.upgrade,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(Some(opt), server_conf(&config));
    // rustls needs a process-wide crypto provider before the first `rediss://` connection
    // (redis-rs builds its client config from the default); Pingora's is ring.
    pingora::tls::install_default_crypto_provider();
    let metrics = Arc::new(Metrics::new()?);
    let stores = Stores::new(&config, extras.store, &metrics)?;
    let heartbeat = stores.heartbeat(&config);
    let region_sync = stores.region_sync(&config, &metrics);
    let listeners = Listeners::of(&config);
    let db = Arc::new(Database::new(config.database_url.clone()));
    let events = db.configured().then(|| {
        let dropped = metrics.events_dropped_total.clone();
        Arc::new(EventQueue::new(EVENT_QUEUE, dropped))
    });
    let runtime = Runtime::from_config(config).map_err(RuntimeError::from)?;
    let core = Core::builder(runtime, stores.store, metrics)
        .upstream_override(demo_addr)
        .shared_bans(stores.redis.clone().map(|r| r as Arc<dyn BanStore>))
        .events(events.clone().map(|q| q as Arc<dyn EventSink>))
        .awaiting_database(db.configured())
        .build()?;
    let core = Arc::new(core);
    core.metrics
        .register(Box::new(jwks::JwtMetrics::new(&core)?))?;
    let lifecycle = Arc::new(Lifecycle::default());
    let parts = Parts {
        core: core.clone(),
        db: db.clone(),
        events,
        lifecycle: lifecycle.clone(),
    };
    add_listeners(&mut server, &parts, &listeners, max_connections)?;
    add_background(&mut server, &parts, stores.memory, heartbeat);
    if let Some(sync) = region_sync {
        server.add_service(background_service("region sync", sync));
    }
    add_rls(&mut server, &parts, &listeners, extras.upgrade)?;
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

/// The shared state every service of the server is built from.
struct Parts {
    core: Arc<Core>,
    db: Arc<Database>,
    /// The violation log's queue (the core's event sink), when a database is configured.
    events: Option<Arc<EventQueue>>,
    lifecycle: Arc<Lifecycle>,
}

/// The addresses the server listens on (read before the config moves into the runtime).
struct Listeners {
    listen: std::net::SocketAddr,
    admin_listen: std::net::SocketAddr,
    rls_listen: Option<std::net::SocketAddr>,
    threads: usize,
}

impl Listeners {
    fn of(config: &Config) -> Self {
        Self {
            listen: config.server.listen,
            admin_listen: config.server.admin_listen,
            rls_listen: config.server.rls_listen,
            threads: config.server.threads,
        }
    }
}

/// The most keys a gateway syncs with its peer regions at once (`regions::Live`).
const REGIONS_LIVE_KEYS: usize = 100_000;

/// The limit store the gateway decides on, with the memory store (swept, and the
/// fallback of Redis) and Redis itself when configured.
struct Stores {
    store: Arc<dyn LimitStore>,
    memory: Arc<MemoryStore>,
    redis: Option<Arc<RedisStore>>,
    instances: Arc<AtomicU32>,
}

impl Stores {
    fn new(
        config: &Config,
        given: Option<Arc<dyn LimitStore>>,
        metrics: &Arc<Metrics>,
    ) -> Result<Self, StartError> {
        let memory = Arc::new(
            MemoryStore::new()
                .with_max_states(config.store.max_states)
                .with_evictions_counter(metrics.store_evictions_total.clone()),
        );
        let instances = Arc::new(AtomicU32::new(config.store.instances.unwrap_or(1)));
        let mut redis = None;
        let store: Arc<dyn LimitStore> = match (given, config.store.backend) {
            (Some(store), _) => store,
            (None, Backend::Memory) => memory.clone(),
            (None, Backend::Redis) => {
                let mut primary = RedisStore::from_config(&config.store)
                    .map_err(|e| StartError::Unsupported(e.to_string()))?
                    .with_metrics(metrics.clone());
                if let Some(r) = &config.regions {
                    let at = crate::store::redis::wire::RegionArgs {
                        index: r.index(),
                        count: r.count(),
                    };
                    let live = Arc::new(crate::regions::Live::new(REGIONS_LIVE_KEYS));
                    primary = primary.with_regions(at, live);
                }
                let primary = Arc::new(primary);
                redis = Some(primary.clone());
                let local: Arc<dyn LimitStore> = Arc::new(TieredStore::new(
                    primary,
                    memory.clone(),
                    instances.clone(),
                    metrics.clone(),
                ));
                match &config.regions {
                    Some(regions) => Arc::new(
                        HomeStore::with_peers(config, regions, local, &memory, &instances, metrics)
                            .map_err(|e| StartError::Unsupported(e.to_string()))?,
                    ),
                    None => local,
                }
            }
        };
        Ok(Self {
            store,
            memory,
            redis,
            instances,
        })
    }

    /// With `[regions]` on Redis: the sync loop of `fleet = "regions"` windows.
    fn region_sync(&self, config: &Config, metrics: &Arc<Metrics>) -> Option<Every> {
        let (redis, regions) = (self.redis.clone()?, config.regions.as_ref()?);
        let clock = Arc::new(crate::clock::SystemClock);
        match crate::store::redis::region_sync::RegionSync::new(regions, redis, clock) {
            Ok(sync) => Some(services::region_sync(Arc::new(
                sync.with_metrics(metrics.clone()),
            ))),
            Err(e) => {
                tracing::warn!(error = %e, "regions: no sync loop");
                None
            }
        }
    }

    /// On Redis the heartbeat always runs (it is also the store's health probe); its
    /// count sizes the local fallback unless `[store] instances` fixes it.
    fn heartbeat(&self, config: &Config) -> Option<(Arc<RedisStore>, Every)> {
        let redis = self.redis.clone()?;
        let instances = config
            .store
            .instances
            .is_none()
            .then(|| self.instances.clone());
        let beat = services::heartbeat(redis.clone(), instances, config.server.instance_id.clone());
        Some((redis, beat))
    }
}

/// The proxy and admin listeners.
fn add_listeners(
    server: &mut Server,
    parts: &Parts,
    listeners: &Listeners,
    max_connections: usize,
) -> Result<(), StartError> {
    let Parts {
        core,
        db,
        events: _,
        lifecycle,
    } = parts;
    let listen = listeners.listen;
    let dropped = core.metrics.access_log_dropped_total.clone();
    let log = AccessLog::open(&core.runtime().config.server.access_log, dropped)
        .map_err(|e| StartError::Listen(format!("access_log: {e}")))?;
    let tracer = match &core.runtime().config.tracing {
        Some(t) => {
            let m = &core.metrics.trace_spans;
            let counts = crate::otlp::SpanCounts {
                exported: m[0].clone(),
                dropped: m[1].clone(),
                failed: m[2].clone(),
            };
            let tracer = crate::otlp::Tracer::start(t, counts)
                .map_err(|e| StartError::Listen(format!("[tracing]: {e}")))?;
            Some(tracer)
        }
        None => None,
    };
    let proxy = Gateway::new(core.clone())
        .with_access_log(log)
        .with_tracer(tracer)
        .with_lifecycle(lifecycle.clone());
    let gateway = pingora::proxy::http_proxy(&server.configuration, proxy);
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
        ProxyListener::new(
            gateway,
            core.clone(),
            lifecycle.clone(),
            max_connections,
            tls,
        ),
    );
    proxy.add_tcp(&listen.to_string());
    // `$THROTTLE_ADMIN_TOKEN` or `[server] admin_token_file`'s content (the config
    // checked it: never both, never weak).
    let token = core.runtime().config.server.admin_token.clone();
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
    admin.add_tcp(&listeners.admin_listen.to_string());
    server.add_service(proxy);
    server.add_service(admin);
    Ok(())
}

/// The background services: periodic work, reloads, health checks and the database's.
fn add_background(
    server: &mut Server,
    parts: &Parts,
    memory: Arc<MemoryStore>,
    heartbeat: Option<(Arc<RedisStore>, Every)>,
) {
    let Parts {
        core,
        db,
        events,
        lifecycle,
    } = parts;
    let add = |server: &mut Server, name: &str, service: Every| {
        server.add_service(background_service(name, service));
    };
    add(server, "memory store sweeper", services::sweeper(memory));
    add(server, "ban sync", services::ban_sync(core.clone()));
    add(
        server,
        "adaptive limits",
        services::adaptive_controller(core.clone()),
    );
    server.add_service(background_service(
        "jwks refresher",
        jwks::JwksRefresher { core: core.clone() },
    ));
    server.add_service(background_service(
        "reload on SIGHUP",
        Reloader {
            core: core.clone(),
            db: db.clone(),
        },
    ));
    add(
        server,
        "upstream health checks",
        crate::upstream_health::health_checks(core.clone()),
    );
    if let Some((redis, beat)) = heartbeat {
        let returns = services::lease_returns(redis.clone(), lifecycle.clone());
        add(server, "lease returns", returns);
        add(server, "slot renewals", services::slot_renewals(redis));
        add(server, "instance heartbeat", beat);
    }
    if let Some(url) = db.url() {
        server.add_service(background_service(
            "database snapshot",
            Refresher::new(core.clone(), db.clone()),
        ));
        if let Some(queue) = events.clone() {
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
}

/// The Envoy rate-limit service, when `rls_listen` is set.
fn add_rls(
    server: &mut Server,
    parts: &Parts,
    listeners: &Listeners,
    upgrade: bool,
) -> Result<(), StartError> {
    let Some(addr) = listeners.rls_listen else {
        return Ok(());
    };
    let (core, lifecycle) = (parts.core.clone(), parts.lifecycle.clone());
    // Bound here, so that a taken port stops the start as the other listeners do;
    // an upgrading process binds it once its predecessor lets go (see `rls`).
    let rls = if upgrade {
        RlsListener::later(core, lifecycle, addr)
    } else {
        RlsListener::bind(core, lifecycle, addr)
            .map_err(|e| StartError::Listen(format!("rls_listen {addr}: {e}")))?
    };
    let mut service = background_service("envoy rate-limit service", rls);
    service.threads = Some(listeners.threads);
    server.add_service(service);
    Ok(())
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
                ) => {
                    tracing::info!(
                        "graceful shutdown: answering with `Connection: close` from now on"
                    );
                    lifecycle.drain();
                    break;
                }
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
