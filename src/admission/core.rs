//! What the admission pipeline reads.
//!
//! `Runtime` is everything derived from one `gateway.toml` (routes, resolver, keys,
//! blocks, limits); it is immutable, built from the config alone, and swapped whole
//! (`ArcSwap`), and every admitted request keeps the `Arc` it started with, so one
//! request never mixes two configs. `Dynamic` is what changes without a deploy (database
//! keys and blocks, or blocks posted to the admin API), swapped whole too. `Core` is what
//! outlives both: the store, the metrics, the clock, the failed-lookup memory, the
//! violation log's sink, the automatic bans (and the fleet's `BanStore`), the
//! heavy-hitter sketch, each route's counters and adaptive state (by name, see
//! `routes`) and the `[auth.jwt]` verifier, which a reload hands its new settings. It is
//! built once, complete (`Core::builder`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::auth::{JwtConfigError, JwtVerifier};
use crate::bans::Bans;
use crate::blocklist::{BlockList, BlockRow};
use crate::client_ip::ClientIpResolver;
use crate::clock::{Clock, SystemClock};
use crate::config::{BlockEntry, BlockTarget, Config, Tier};
use crate::identity::KeyTable;
use crate::metrics::Metrics;
use crate::routing::{RouteEntry, Router};
use crate::store::{BanStore, LimitStore};
use crate::top::TopTable;
use crate::violations::EventSink;

use super::routes::{RouteLive, RouteRegistry};

/// One config's worth of request-path state.
pub struct Runtime {
    /// The validated config.
    pub config: Config,
    /// Client IP resolution.
    pub resolver: ClientIpResolver,
    /// Route matching and upstream selection.
    pub router: Router,
    /// The keys of `[[keys]]`.
    pub keys: KeyTable,
    /// The blocks of `[[blocks]]`.
    pub blocks: BlockList,
}

/// Why a `Runtime` cannot be built from a validated config, or swapped in.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// An upstream set cannot be built.
    #[error("upstreams: {0}")]
    Upstreams(#[from] std::io::Error),
    /// The `[auth.jwt]` verifier refused the settings or its `jwks_file` (changed since
    /// the config was validated).
    #[error("[auth.jwt] {0}")]
    Jwt(#[from] JwtConfigError),
}

/// What changes without a deploy: database keys and blocks (or, without a database, the
/// blocks posted to the admin API). Immutable, swapped whole.
#[derive(Default)]
pub struct Dynamic {
    /// Keys from the database (with their policies and overrides applied).
    pub keys: KeyTable,
    /// Blocks from the database or the admin API.
    pub blocks: BlockList,
    /// The same blocks as rows (for `GET /v1/blocks`).
    pub block_rows: Vec<BlockRow>,
    /// The effective tiers (the config's with the database's policies, and the tiers only
    /// the database defines), which JWT callers' tiers resolve against; empty without a
    /// database (the config's tiers apply).
    pub tiers: HashMap<String, Arc<crate::config::Tier>>,
    /// The tenants table: tenant id -> tier name (empty without a database).
    pub tenants: HashMap<String, String>,
    /// The tier of each tenant with its own `calendar_tz` / `billing_anchor_day` (the
    /// tenants table's columns, or a `[[tenants]]` entry the table does not override):
    /// its effective tier with its tenant windows on that calendar, made by the snapshot.
    pub tenant_tiers: HashMap<String, Arc<crate::config::Tier>>,
    /// True until the first database snapshot is published (set only at start, when a
    /// database is configured): a key not in `gateway.toml` may then be a key not loaded
    /// yet, so it is answered 503 `not_ready`, never 401.
    pub awaiting: bool,
}

/// State the pipeline shares across requests, config reloads and snapshots.
pub struct Core {
    runtime: ArcSwap<Runtime>,
    dynamic: ArcSwap<Dynamic>,
    suspects: Suspects,
    /// Where violation events go (the database's log), when a database is configured.
    pub events: Option<Arc<dyn EventSink>>,
    /// Automatic bans in force, and the local rejection counts.
    pub bans: Arc<Bans>,
    /// The store bans are shared through, when a fleet shares them (the Redis store).
    pub shared_bans: Option<Arc<dyn BanStore>>,
    /// Each route's counters and adaptive state, by name (see `routes`).
    routes: RouteRegistry,
    /// The verifier of `[auth.jwt]` (None without the section): one per process while the
    /// section stays, taking each reload's settings (`swap_runtime`), so the keys fetched
    /// from `jwks_url` and its refresher outlive a reload.
    jwt: ArcSwapOption<JwtVerifier>,
    /// Every route's upstream, whatever the config file says (`throttle demo`'s
    /// in-process upstream, kept across reloads).
    pub upstream_override: Option<SocketAddr>,
    /// `throttle_store_call_seconds{store=<this store>}`, resolved once.
    pub store_call: prometheus::Histogram,
    /// The limit store.
    pub store: Arc<dyn LimitStore>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Limiter time.
    pub clock: Arc<dyn Clock>,
    /// The heaviest identities of the last 60 s per scope (`GET /v1/top`).
    pub top: TopTable,
    /// Woken when a swap replaces the JWT verifier.
    jwt_replaced: tokio::sync::Notify,
    /// Whether requests are observed (`[server] access_log` or `[tracing]` on, fixed at
    /// start): only then does admission keep what a refused request showed and the store
    /// call's timing, so with both off the request carries nothing for them.
    pub observed: bool,
    /// The config the process started with: what every setting fixed at start was read
    /// from, so a reload lists such a change until a restart (`reload::settings`).
    pub started: Arc<Config>,
}

/// Builds a `Core` in one go (see `Core::builder`).
#[must_use = "a builder does nothing until `build`"]
pub struct CoreBuilder {
    runtime: Runtime,
    store: Arc<dyn LimitStore>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    events: Option<Arc<dyn EventSink>>,
    bans: Arc<Bans>,
    shared_bans: Option<Arc<dyn BanStore>>,
    upstream_override: Option<SocketAddr>,
    awaiting_database: bool,
}

/// Clients that recently presented a bad key, so only they pay the extra `[limits.auth]`
/// look before a key is checked. Keyed by what `[limits.auth]` counts (an IPv4 address,
/// an IPv6 client's `/ipv6_prefix` network), so every address of an IPv6 network over
/// the limit is refused before any lookup, not only the one that failed. Bounded.
#[derive(Default)]
struct Suspects {
    map: Mutex<HashMap<ipnet::IpNet, u64>>,
    /// Whether `map` may hold anything: lets the common case skip the lock.
    any: AtomicBool,
}

/// Most addresses remembered as suspects; expired ones are pruned first.
const MAX_SUSPECTS: usize = 100_000;

// === impl Runtime ===

impl Runtime {
    /// Builds the request-path state of `config` (from it alone: what outlives a reload
    /// is `Core`'s).
    ///
    /// # Errors
    /// When an upstream set cannot be built.
    pub fn from_config(config: Config) -> std::io::Result<Self> {
        Ok(Self {
            resolver: ClientIpResolver::new(config.trusted_proxies.clone())
                .with_header(config.client_ip_header),
            router: Router::new(&config.routes, config.server.case_insensitive_paths)?,
            keys: KeyTable::from_config(&config),
            blocks: BlockList::new(config.blocks.iter().cloned()),
            config,
        })
    }
}

impl From<RuntimeError> for std::io::Error {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Upstreams(e) => e,
            e @ RuntimeError::Jwt(_) => std::io::Error::other(e.to_string()),
        }
    }
}

// === impl Dynamic ===

impl Dynamic {
    /// A snapshot of `keys` and the blocks of `rows` (rows that do not parse are skipped).
    pub fn new(keys: KeyTable, rows: Vec<BlockRow>) -> Self {
        let entries = rows.iter().filter_map(block_entry);
        Self {
            keys,
            blocks: BlockList::new(entries),
            block_rows: rows,
            tiers: HashMap::new(),
            tenants: HashMap::new(),
            tenant_tiers: HashMap::new(),
            awaiting: false,
        }
    }
}

impl Dynamic {
    /// The tier of `tenant`'s tenant limits, by the one rule every kind of caller follows
    /// (config keys, database keys, JWT callers, the rate-limit service, `/v1/check`,
    /// `/v1/usage`): see [`tenant_tier`].
    pub fn tenant_tier(&self, config: &Config, tenant: &str) -> Option<Arc<Tier>> {
        let table = TenantTable {
            tenants: &self.tenants,
            own: &self.tenant_tiers,
        };
        tenant_tier(config, table, &self.tiers, tenant)
    }

    /// The tier named `name`: the effective tiers (with the database's policies), else
    /// the config's.
    pub fn tier(&self, config: &Config, name: &str) -> Option<Arc<Tier>> {
        self.tiers
            .get(name)
            .or_else(|| config.tiers.get(name))
            .cloned()
    }
}

/// The database's side of the tenant-tier rule: the tenants table (tenant id -> tier
/// name) and the tiers made for tenants with their own calendar.
#[derive(Debug, Clone, Copy)]
pub struct TenantTable<'a> {
    /// Tenant id -> tier name.
    pub tenants: &'a HashMap<String, String>,
    /// Tenant id -> its own tier (`Dynamic::tenant_tiers`).
    pub own: &'a HashMap<String, Arc<Tier>>,
}

/// The tenant-tier rule: the tenants table's row for `tenant` (when a database is
/// configured), else its `[[tenants]]` entry; the tier by that name among `tiers` (the
/// effective tiers), else the config's. A tenant with its own `calendar_tz` /
/// `billing_anchor_day` gets the tier made for it (`table.own`, else the config's
/// `tenant_tiers` when the table has no row for it): a lookup, no work per request.
/// None (no entry, or a tier nobody defines): the tier of the key used.
pub fn tenant_tier(
    config: &Config,
    table: TenantTable<'_>,
    tiers: &HashMap<String, Arc<Tier>>,
    tenant: &str,
) -> Option<Arc<Tier>> {
    if let Some(own) = table.own.get(tenant) {
        return Some(own.clone());
    }
    let name = match table.tenants.get(tenant) {
        Some(name) => name,
        None => {
            if let Some(own) = config.tenant_tiers.get(tenant) {
                return Some(own.clone());
            }
            config.tenants.get(tenant)?
        }
    };
    tiers.get(name).or_else(|| config.tiers.get(name)).cloned()
}

// === impl Core ===

impl Core {
    /// State over `runtime` and `store`, on the system clock.
    ///
    /// # Errors
    /// When the `[auth.jwt]` verifier refuses the settings or its `jwks_file`.
    pub fn new(
        runtime: Runtime,
        store: Arc<dyn LimitStore>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, RuntimeError> {
        Self::builder(runtime, store, metrics).build()
    }

    /// State with an explicit clock.
    ///
    /// # Errors
    /// When the `[auth.jwt]` verifier refuses the settings or its `jwks_file`.
    pub fn with_clock(
        runtime: Runtime,
        store: Arc<dyn LimitStore>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, RuntimeError> {
        Self::builder(runtime, store, metrics).clock(clock).build()
    }

    /// A builder of state over `runtime` and `store`: the optional parts (clock, violation
    /// log queue, shared bans, upstream override) are given before `build`, so the state
    /// is complete when it is made.
    pub fn builder(
        runtime: Runtime,
        store: Arc<dyn LimitStore>,
        metrics: Arc<Metrics>,
    ) -> CoreBuilder {
        CoreBuilder {
            runtime,
            store,
            metrics,
            clock: Arc::new(SystemClock),
            events: None,
            bans: Arc::default(),
            shared_bans: None,
            upstream_override: None,
            awaiting_database: false,
        }
    }

    /// The current runtime.
    pub fn runtime(&self) -> Arc<Runtime> {
        self.runtime.load_full()
    }

    /// Replaces the runtime; requests in flight keep the one they started with. A route
    /// that keeps its name keeps its counters, and its window and factor while it stays
    /// adaptive (a reload does not reset adaptivity; new `adaptive` settings apply from
    /// the next controller tick). The `[auth.jwt]` verifier takes the new settings and
    /// re-reads `jwks_file` (the keys fetched from an unchanged `jwks_url` stay); that is
    /// the first step, so when the verifier refuses them nothing is swapped and it keeps
    /// its settings (`JwtVerifier::reload`).
    ///
    /// # Errors
    /// When the verifier refuses the new settings or its `jwks_file`.
    pub fn swap_runtime(&self, runtime: Runtime) -> Result<(), RuntimeError> {
        let running = self.jwt.load_full();
        let next = verifier_for(&runtime.config, running.as_ref())?;
        let replaced = match (&running, &next) {
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
            (a, b) => a.is_some() || b.is_some(),
        };
        self.routes.follow(&runtime.config.routes);
        // A request reads the runtime, then the verifier: an added verifier is in place
        // before the runtime whose config names it, a removed one goes after.
        let adds = next.is_some();
        if adds {
            self.jwt.store(next);
        }
        self.runtime.store(Arc::new(runtime));
        if !adds {
            self.jwt.store(None);
        }
        if replaced {
            self.jwt_replaced.notify_waiters();
        }
        Ok(())
    }

    /// The `[auth.jwt]` verifier (None without the section).
    pub fn jwt(&self) -> Option<Arc<JwtVerifier>> {
        self.jwt.load_full()
    }

    /// The counters and adaptive state of `route` (see `routes`): one map lookup, so an
    /// adapter asks once per request.
    pub fn route_state(&self, route: &RouteEntry) -> Arc<RouteLive> {
        self.routes.get(&route.route)
    }

    /// Completes when a runtime swap replaces the JWT verifier (`[auth.jwt]` added or
    /// removed): the JWKS refresher then follows the new one. Take it before reading the
    /// verifier (`jwt`), so no swap in between is missed.
    pub fn jwt_replaced(&self) -> tokio::sync::futures::Notified<'_> {
        self.jwt_replaced.notified()
    }

    /// The current snapshot of database keys and blocks.
    pub fn dynamic(&self) -> Arc<Dynamic> {
        self.dynamic.load_full()
    }

    /// Publishes a new snapshot.
    pub fn swap_dynamic(&self, d: Dynamic) {
        self.dynamic.store(Arc::new(d));
    }

    /// Remembers that the client `net` (what `[limits.auth]` counts) presented a bad key,
    /// until `until_ms`.
    pub fn suspect(&self, net: ipnet::IpNet, until_ms: u64, now_ms: u64) {
        let s = &self.suspects;
        let mut m = s.map.lock().unwrap_or_else(PoisonError::into_inner);
        if m.len() >= MAX_SUSPECTS {
            m.retain(|_, t| *t > now_ms);
        }
        if m.len() < MAX_SUSPECTS {
            m.insert(net, until_ms);
            s.any.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the client `net` presented a bad key recently.
    pub fn is_suspect(&self, net: ipnet::IpNet, now_ms: u64) -> bool {
        let s = &self.suspects;
        if !s.any.load(Ordering::Relaxed) {
            return false; // nobody has failed a lookup: no lock on the request path
        }
        let m = s.map.lock().unwrap_or_else(PoisonError::into_inner);
        m.get(&net).is_some_and(|t| *t > now_ms)
    }
}

// === impl CoreBuilder ===

impl CoreBuilder {
    /// Limiter time (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Where violation events go (default: nowhere).
    pub fn events(mut self, events: Option<Arc<dyn EventSink>>) -> Self {
        self.events = events;
        self
    }

    /// The table of automatic bans (default: an empty one with the default caps).
    pub fn bans(mut self, bans: Arc<Bans>) -> Self {
        self.bans = bans;
        self
    }

    /// The store bans are shared through, when a fleet shares them (default: none).
    pub fn shared_bans(mut self, store: Option<Arc<dyn BanStore>>) -> Self {
        self.shared_bans = store;
        self
    }

    /// Every route's upstream, whatever the config says (default: none).
    pub fn upstream_override(mut self, addr: Option<SocketAddr>) -> Self {
        self.upstream_override = addr;
        self
    }

    /// Whether a database snapshot is still to come (default: no): until the first one
    /// is published, keys not in the config answer `not_ready` and `/readyz` waits.
    pub fn awaiting_database(mut self, awaiting: bool) -> Self {
        self.awaiting_database = awaiting;
        self
    }

    /// The state.
    ///
    /// # Errors
    /// When the `[auth.jwt]` verifier refuses the settings or its `jwks_file`.
    pub fn build(self) -> Result<Core, RuntimeError> {
        let config = &self.runtime.config;
        let observed = config.tracing.is_some()
            || config.server.access_log != crate::config::AccessLogTarget::Off;
        let jwt = verifier_for(config, None)?;
        Ok(Core {
            observed,
            started: Arc::new(config.clone()),
            routes: RouteRegistry::new(&config.routes),
            jwt: ArcSwapOption::new(jwt),
            runtime: ArcSwap::from_pointee(self.runtime),
            dynamic: ArcSwap::from_pointee(Dynamic {
                awaiting: self.awaiting_database,
                ..Dynamic::default()
            }),
            suspects: Suspects::default(),
            events: self.events,
            bans: self.bans,
            shared_bans: self.shared_bans,
            upstream_override: self.upstream_override,
            store_call: self
                .metrics
                .store_call_seconds
                .with_label_values(&[self.store.name()]),
            store: self.store,
            metrics: self.metrics,
            clock: self.clock,
            top: TopTable::new(),
            jwt_replaced: tokio::sync::Notify::new(),
        })
    }
}

/// The verifier of `config`'s `[auth.jwt]`: `running` with the new settings when there
/// is one (its fetched keys and refresher stay), else a new one; None without the section.
fn verifier_for(
    config: &Config,
    running: Option<&Arc<JwtVerifier>>,
) -> Result<Option<Arc<JwtVerifier>>, JwtConfigError> {
    Ok(match (&config.jwt, running) {
        (None, _) => None,
        (Some(j), Some(verifier)) => {
            verifier.reload(j.settings.clone())?;
            Some(verifier.clone())
        }
        (Some(j), None) => Some(Arc::new(JwtVerifier::new(j.settings.clone())?)),
    })
}

/// A stored block as the block list's entry.
pub fn block_entry(r: &BlockRow) -> Option<BlockEntry> {
    let target = match r.scope.as_str() {
        "ip" => BlockTarget::Ip(crate::config::parse_net(&r.value)?),
        "key" => BlockTarget::Key(r.value.clone()),
        "tenant" => BlockTarget::Tenant(r.value.clone()),
        _ => return None,
    };
    Some(BlockEntry {
        target,
        reason: r.reason.clone(),
        expires_at_ms: r.expires_at_ms.and_then(|t| u64::try_from(t).ok()),
    })
}
