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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinSet;

use crate::admission::{Core, Runtime};
use crate::lifecycle::{every, Every};
use crate::metrics::Metrics;
use crate::routing::RouteEntry;

/// How often the service looks for a reloaded config.
const RELOAD_POLL: Duration = Duration::from_millis(100);

/// The background service running the health checks of the current config's routes:
/// every `RELOAD_POLL` it looks for a reloaded config, and when there is one it stops the
/// old routes' checks and starts the new ones'. At shutdown every check is stopped.
pub fn health_checks(core: Arc<Core>) -> Every {
    let checks: Arc<Mutex<Checks>> = Arc::default();
    let last = checks.clone();
    every(RELOAD_POLL, move || {
        let mut checks = checks.lock().unwrap_or_else(PoisonError::into_inner);
        checks.follow(&core);
        std::future::ready(())
    })
    .at_shutdown(move || {
        last.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tasks
            .abort_all();
        std::future::ready(())
    })
}

/// The checks running, and the runtime they belong to.
#[derive(Default)]
struct Checks {
    current: Option<Arc<Runtime>>,
    /// Dropping or aborting the set (shutdown, or a new config) stops its checks.
    tasks: JoinSet<()>,
}

// === impl Checks ===

impl Checks {
    /// Restarts the checks when `core`'s runtime is not the one they belong to.
    fn follow(&mut self, core: &Core) {
        let rt = core.runtime();
        if self.current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &rt)) {
            return;
        }
        self.tasks.abort_all();
        // Reap what ended (aborted or panicked) so the set does not grow across reloads.
        while self.tasks.try_join_next().is_some() {}
        core.metrics.upstream_healthy.reset();
        for entry in rt.router.entries() {
            if entry.route.health_check.is_some() {
                self.tasks
                    .spawn(check_route(entry.clone(), core.metrics.clone()));
            }
        }
        self.current = Some(rt);
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
