//! Active upstream health checks: for every route with `health_check`, one task runs
//! Pingora's `HttpHealthCheck` pass over the route's upstreams each interval and
//! publishes `throttle_upstream_healthy{route,upstream}`. The balancer reads the result
//! on the request path (`RouteEntry::upstreams.select` skips an upstream whose last
//! check failed), so a request never waits on a check.
//!
//! The tasks belong to one runtime (config generation): when a reload swaps it, they are
//! stopped and the new routes' tasks start, with a first pass at once. Health is not
//! carried across a reload: the new balancers start with every upstream healthy (as
//! Pingora's do) until that first pass, at most one check timeout later.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::task::JoinSet;

use crate::admission::{Core, Runtime};
use crate::metrics::Metrics;
use crate::routing::RouteEntry;

/// How often the service looks for a reloaded config.
const RELOAD_POLL: Duration = Duration::from_millis(100);

/// The background service running the health checks of the current config's routes.
pub struct HealthChecks {
    core: Arc<Core>,
}

// === impl HealthChecks ===

impl HealthChecks {
    /// The checks of `core`'s routes, following reloads.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut current: Option<Arc<Runtime>> = None;
        // Dropping the set (shutdown, or a new config) aborts its checks.
        let mut tasks = JoinSet::new();
        let mut poll = tokio::time::interval(RELOAD_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = poll.tick() => {
                    let rt = self.core.runtime();
                    if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &rt)) {
                        continue;
                    }
                    tasks.abort_all();
                    self.core.metrics.upstream_healthy.reset();
                    for entry in rt.router.entries() {
                        if entry.route.health_check.is_some() {
                            tasks.spawn(check_route(entry.clone(), self.core.metrics.clone()));
                        }
                    }
                    current = Some(rt);
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
    }
}

/// Checks `entry`'s upstreams every interval, until aborted.
async fn check_route(entry: Arc<RouteEntry>, metrics: Arc<Metrics>) {
    let Some(cfg) = entry.route.health_check.clone() else {
        return;
    };
    publish(&entry, &metrics);
    // Each check's connect, write and read are capped at the interval (see `routing`);
    // this bounds a whole pass besides.
    let deadline = cfg.interval * 4;
    loop {
        let pass = entry.upstreams.backends().run_health_check(true);
        if tokio::time::timeout(deadline, pass).await.is_err() {
            tracing::warn!(route = %entry.route.name, "upstream health check pass timed out");
        }
        publish(&entry, &metrics);
        tokio::time::sleep(cfg.interval).await;
    }
}

/// Sets `throttle_upstream_healthy` for each upstream of `entry`.
fn publish(entry: &RouteEntry, metrics: &Metrics) {
    let backends = entry.upstreams.backends();
    for b in backends.get_backend().iter() {
        let healthy = backends.ready(b);
        metrics
            .upstream_healthy
            .with_label_values(&[&*entry.route.name, &b.addr.to_string()])
            .set(i64::from(healthy));
    }
}
