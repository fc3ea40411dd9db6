//! The JWKS refresher as a background service: it runs the current JWT verifier's
//! (`Core::jwt`) `run_refresher` (fetch at start, every `jwks_refresh_secs`, early on an
//! unknown `kid`) until shutdown. A reload that keeps `[auth.jwt]` keeps the verifier, whose
//! own refresher follows a changed `jwks_url`; a reload that adds or removes the section
//! replaces it (`Core::jwt_replaced`), and the service moves to the new one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::admission::Core;

/// Keeps the `jwks_url` key set of the running verifier fresh.
pub(crate) struct JwksRefresher {
    pub(crate) core: Arc<Core>,
}

#[async_trait]
impl BackgroundService for JwksRefresher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let stopping = AtomicBool::new(false);
        while !stopping.load(Ordering::Relaxed) {
            // Taken before the verifier is read: a swap in between still wakes it.
            let replaced = self.core.jwt_replaced();
            let verifier = self.core.jwt();
            let until = async {
                tokio::select! {
                    _ = shutdown.changed() => stopping.store(true, Ordering::Relaxed),
                    () = replaced => {}
                }
            };
            match verifier {
                Some(v) => v.run_refresher(until).await,
                None => until.await,
            }
        }
    }
}

/// `throttle_jwt_*`: the running verifier's counters (`JwtVerifier::stats`), read at each
/// scrape; nothing without `[auth.jwt]`. No labels. Counters start again from 0 when a
/// reload removes and re-adds the section (a new verifier), as after a restart.
pub(crate) struct JwtMetrics {
    core: std::sync::Weak<Core>,
    descs: Vec<prometheus::core::Desc>,
}

/// The counters: name, help.
const JWT_COUNTERS: [(&str, &str); 4] = [
    (
        "throttle_jwt_fetches_total",
        "JWKS fetches from jwks_url that installed a key set (or found it unchanged).",
    ),
    (
        "throttle_jwt_fetch_failures_total",
        "JWKS fetches that failed (transport, status, body, deadline); the last good key set stays.",
    ),
    (
        "throttle_jwt_kid_misses_total",
        "Tokens refused for a kid no key has.",
    ),
    (
        "throttle_jwt_kid_refetches_total",
        "JWKS fetches brought forward by an unknown kid.",
    ),
];

/// The gauges: name, help.
const JWT_GAUGES: [(&str, &str); 2] = [
    (
        "throttle_jwt_keys",
        "JWKS keys the verifier uses (file and URL).",
    ),
    (
        "throttle_jwt_cached_tokens",
        "Verified tokens in the cache.",
    ),
];

impl JwtMetrics {
    /// The collector over `core`'s current verifier.
    pub(crate) fn new(core: &Arc<Core>) -> Result<Self, prometheus::Error> {
        let descs = JWT_COUNTERS
            .iter()
            .chain(JWT_GAUGES.iter())
            .map(|(name, help)| {
                use prometheus::core::Describer;
                prometheus::Opts::new(*name, *help).describe()
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            core: Arc::downgrade(core),
            descs,
        })
    }
}

impl prometheus::core::Collector for JwtMetrics {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let Some(core) = self.core.upgrade() else {
            return Vec::new();
        };
        let Some(s) = core.jwt().map(|v| v.stats()) else {
            return Vec::new();
        };
        let counts = [s.fetches, s.fetch_failures, s.kid_misses, s.kid_refetches];
        let sizes = [s.keys, s.cached].map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let mut out = Vec::new();
        for ((name, help), v) in JWT_COUNTERS.iter().zip(counts) {
            if let Ok(c) = prometheus::IntCounter::new(*name, *help) {
                c.inc_by(v);
                out.extend(c.collect());
            }
        }
        for ((name, help), v) in JWT_GAUGES.iter().zip(sizes) {
            if let Ok(g) = prometheus::IntGauge::new(*name, *help) {
                g.set(v);
                out.extend(g.collect());
            }
        }
        out
    }
}
