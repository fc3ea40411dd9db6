//! Gateway state: what every request reads.
//!
//! `Runtime` is everything derived from one `gateway.toml` (routes, resolver, keys, blocks,
//! limits); it is immutable and swapped whole (`ArcSwap`), so a request sees one
//! consistent config from its first phase to its last. `Shared` is what outlives config
//! changes: the store, the metrics, the clock.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::blocklist::BlockList;
use crate::client_ip::ClientIpResolver;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
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

/// State shared by the proxy, the admin listener and background tasks.
pub struct Shared {
    runtime: ArcSwap<Runtime>,
    /// The limit store.
    pub store: Arc<dyn LimitStore>,
    /// Metrics.
    pub metrics: Metrics,
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
    /// Shared state over `runtime` and `store`, on the system clock.
    pub fn new(runtime: Runtime, store: Arc<dyn LimitStore>, metrics: Metrics) -> Self {
        Self::with_clock(runtime, store, metrics, Arc::new(SystemClock))
    }

    /// Shared state with an explicit clock.
    pub fn with_clock(
        runtime: Runtime,
        store: Arc<dyn LimitStore>,
        metrics: Metrics,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            runtime: ArcSwap::from_pointee(runtime),
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
}
