//! Gateway state: what every request reads.
//!
//! `Runtime` is everything derived from one `gateway.toml` (routes, resolver, keys, blocks,
//! limits); it is immutable and swapped whole (`ArcSwap`), so a request sees one
//! consistent config from its first phase to its last. `Shared` is what outlives config
//! changes: the store, the metrics, the clock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::{ArcSwap, ArcSwapOption};
use sqlx::postgres::PgPool;

use crate::blocklist::BlockList;
use crate::client_ip::ClientIpResolver;
use crate::clock::{Clock, SystemClock};
use crate::config::{BlockEntry, BlockTarget, Config};
use crate::db::blocks::BlockRow;
use crate::db::events::EventQueue;
use crate::identity::KeyTable;
use crate::metrics::Metrics;
use crate::proxy::router::Router;
use crate::store::LimitStore;

/// One config's worth of request-path state.
pub struct Runtime {
    /// The validated config.
    pub config: Config,
    /// Client IP resolution.
    pub resolver: ClientIpResolver,
    /// Route matching and upstream selection.
    pub router: Router,
    /// Known API keys.
    pub keys: KeyTable,
    /// Active blocks.
    pub blocks: BlockList,
}

/// What changes without a deploy: database keys and blocks (or, without a database, the
/// blocks posted to the admin API). Immutable, swapped whole.
#[derive(Default)]
pub struct Dynamic {
    /// Keys from the database.
    pub keys: KeyTable,
    /// Blocks from the database or the admin API.
    pub blocks: BlockList,
    /// The same blocks as rows (for `GET /v1/blocks`).
    pub block_rows: Vec<BlockRow>,
}

/// State shared by the proxy, the admin listener and background tasks.
pub struct Shared {
    runtime: ArcSwap<Runtime>,
    dynamic: ArcSwap<Dynamic>,
    db_pool: ArcSwapOption<PgPool>,
    db_healthy: AtomicBool,
    memory_blocks: Mutex<(i64, Vec<BlockRow>)>,
    suspects: Mutex<HashMap<IpAddr, u64>>,
    /// Whether `suspects` may hold anything: lets the common case skip the lock.
    any_suspects: AtomicBool,
    /// The violation log queue, when a database is configured.
    pub events: Option<Arc<EventQueue>>,
    /// Every route's upstream, whatever the config file says (`throttle demo`'s
    /// in-process upstream, kept across reloads).
    pub upstream_override: Option<std::net::SocketAddr>,
    /// `throttle_store_call_seconds{store=<this store>}`, resolved once (no per-request
    /// label lookup).
    pub store_call: prometheus::Histogram,
    /// The limit store.
    pub store: Arc<dyn LimitStore>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Limiter time.
    pub clock: Arc<dyn Clock>,
}

// === impl Runtime ===

impl Runtime {
    /// Builds the request-path state of `config`.
    ///
    /// # Errors
    /// When an upstream set cannot be built.
    pub fn from_config(config: Config) -> std::io::Result<Self> {
        Ok(Self {
            resolver: ClientIpResolver::new(config.trusted_proxies.clone()),
            router: Router::new(&config.routes)?,
            keys: KeyTable::from_config(&config),
            blocks: BlockList::new(config.blocks.iter().cloned()),
            config,
        })
    }
}

// === impl Shared ===

impl Shared {
    /// Shared state over `runtime` and `store`, on the system clock (no database).
    pub fn new(runtime: Runtime, store: Arc<dyn LimitStore>, metrics: Arc<Metrics>) -> Self {
        Self::with_clock(runtime, store, metrics, Arc::new(SystemClock))
    }

    /// Shared state with an explicit clock.
    pub fn with_clock(
        runtime: Runtime,
        store: Arc<dyn LimitStore>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            runtime: ArcSwap::from_pointee(runtime),
            dynamic: ArcSwap::from_pointee(Dynamic::default()),
            db_pool: ArcSwapOption::empty(),
            db_healthy: AtomicBool::new(false),
            memory_blocks: Mutex::new((1, Vec::new())),
            suspects: Mutex::new(HashMap::new()),
            any_suspects: AtomicBool::new(false),
            events: None,
            upstream_override: None,
            store_call: metrics
                .store_call_seconds
                .with_label_values(&[store.name()]),
            store,
            metrics,
            clock,
        }
    }

    /// The current runtime.
    pub fn runtime(&self) -> Arc<Runtime> {
        self.runtime.load_full()
    }

    /// Replaces the runtime; requests in flight keep the one they started with.
    pub fn swap_runtime(&self, runtime: Runtime) {
        self.runtime.store(Arc::new(runtime));
    }

    /// The current database snapshot.
    pub fn dynamic(&self) -> Arc<Dynamic> {
        self.dynamic.load_full()
    }

    /// Publishes a new database snapshot.
    pub fn swap_dynamic(&self, d: Dynamic) {
        self.dynamic.store(Arc::new(d));
    }

    /// Records database health; true when it changed (log once per transition).
    pub fn set_db_healthy(&self, healthy: bool) -> bool {
        self.db_healthy.swap(healthy, Ordering::Relaxed) != healthy
    }

    /// Whether the database answered its last use.
    pub fn db_healthy(&self) -> bool {
        self.db_healthy.load(Ordering::Relaxed)
    }

    /// The database pool once connected.
    pub fn db_pool(&self) -> Option<Arc<PgPool>> {
        self.db_pool.load_full()
    }

    /// Publishes the connected pool.
    pub fn set_db_pool(&self, pool: PgPool) {
        self.db_pool.store(Some(Arc::new(pool)));
    }

    /// Adds an in-memory block (no database configured) and publishes it.
    pub fn add_memory_block(&self, mut row: BlockRow) -> BlockRow {
        let mut m = self
            .memory_blocks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        row.id = m.0;
        m.0 += 1;
        m.1.retain(|b| !(b.scope == row.scope && b.value == row.value));
        m.1.push(row.clone());
        self.swap_dynamic(Dynamic::new(KeyTable::default(), m.1.clone()));
        row
    }

    /// Removes in-memory block `id`; false when there was none.
    pub fn remove_memory_block(&self, id: i64) -> bool {
        let mut m = self
            .memory_blocks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let before = m.1.len();
        m.1.retain(|b| b.id != id);
        let removed = m.1.len() != before;
        self.swap_dynamic(Dynamic::new(KeyTable::default(), m.1.clone()));
        removed
    }

    /// Remembers that `ip` presented a bad key, until `until_ms`.
    pub fn suspect(&self, ip: IpAddr, until_ms: u64, now_ms: u64) {
        let mut s = self.suspects.lock().unwrap_or_else(PoisonError::into_inner);
        if s.len() >= 100_000 {
            s.retain(|_, t| *t > now_ms);
        }
        if s.len() < 100_000 {
            s.insert(ip, until_ms);
            self.any_suspects.store(true, Ordering::Relaxed);
        }
    }

    /// Whether `ip` presented a bad key recently.
    pub fn is_suspect(&self, ip: IpAddr, now_ms: u64) -> bool {
        if !self.any_suspects.load(Ordering::Relaxed) {
            return false; // nobody has failed a lookup: no lock on the request path
        }
        let s = self.suspects.lock().unwrap_or_else(PoisonError::into_inner);
        s.get(&ip).is_some_and(|t| *t > now_ms)
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
        }
    }
}

/// A stored block as the block list's entry.
pub fn block_entry(r: &BlockRow) -> Option<BlockEntry> {
    let target = match r.scope.as_str() {
        "ip" => BlockTarget::Ip(parse_net(&r.value)?),
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

/// An address or CIDR.
pub fn parse_net(s: &str) -> Option<ipnet::IpNet> {
    let s = s.trim();
    s.parse::<ipnet::IpNet>()
        .map(|n| n.trunc())
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(ipnet::IpNet::from))
}
