//! What the gateway keeps per route across config reloads, owned by `Core` (the
//! `Runtime` stays immutable): the route's metric counters (resolved on first use) and,
//! on an `adaptive` route, its window and factor. Keyed by route name: a reload keeps
//! both for every route that keeps its name (the adaptive state while the route stays
//! adaptive, so a reload never lifts the protection from a struggling upstream), and
//! drops those of removed routes.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;

use crate::adaptive::{Factor, RouteState};
use crate::config::Route;
use crate::metrics::{Metrics, RouteCounters};

/// One route's state that outlives a runtime.
#[derive(Debug, Default)]
pub struct RouteLive {
    counters: OnceLock<RouteCounters>,
    adaptive: Option<Arc<RouteState>>,
}

/// Every route's `RouteLive`, by name; replaced whole when a runtime is swapped in.
#[derive(Default)]
pub(super) struct RouteRegistry {
    routes: ArcSwap<HashMap<Arc<str>, Arc<RouteLive>>>,
}

// === impl RouteLive ===

impl RouteLive {
    /// `throttle_requests_total` and `throttle_upstream_seconds` of the route `name`
    /// (this route's), resolved on first use.
    pub fn counters(&self, metrics: &Metrics, name: &str) -> &RouteCounters {
        self.counters.get_or_init(|| metrics.route(name))
    }

    /// The live state of an `adaptive` route (None otherwise).
    pub fn adaptive(&self) -> Option<&Arc<RouteState>> {
        self.adaptive.as_ref()
    }

    /// The factor every limit of a request on this route is multiplied by (1 unless the
    /// route is adaptive).
    pub fn factor(&self) -> Factor {
        self.adaptive.as_ref().map_or(Factor::ONE, |s| s.factor())
    }

    /// A fresh state for `route`.
    fn new(route: &Route) -> Self {
        Self {
            counters: OnceLock::new(),
            adaptive: route.adaptive.map(|_| Arc::new(RouteState::default())),
        }
    }
}

// === impl RouteRegistry ===

impl RouteRegistry {
    /// The state of the routes of one config.
    pub(super) fn new(routes: &[Route]) -> Self {
        let registry = Self::default();
        registry.follow(routes);
        registry
    }

    /// The state of `route`: the registered one of its name, else (a request on a runtime
    /// a reload has replaced since, whose route the new config removed) a fresh one.
    pub(super) fn get(&self, route: &Route) -> Arc<RouteLive> {
        match self.routes.load().get(&route.name) {
            Some(live) => live.clone(),
            None => Arc::new(RouteLive::new(route)),
        }
    }

    /// Takes the routes of a new config: a route of the same name keeps its counters,
    /// and its adaptive state while it stays adaptive; other routes start afresh, and
    /// removed ones are dropped. New `adaptive` settings apply from the next controller
    /// tick (they are read from the runtime's route).
    pub(super) fn follow(&self, routes: &[Route]) {
        let old = self.routes.load_full();
        let mut next = HashMap::with_capacity(routes.len());
        for route in routes {
            let live = match old.get(&route.name) {
                Some(prev) if prev.adaptive.is_some() == route.adaptive.is_some() => prev.clone(),
                Some(prev) => Arc::new(RouteLive {
                    counters: prev.counters.clone(),
                    ..RouteLive::new(route)
                }),
                None => Arc::new(RouteLive::new(route)),
            };
            next.insert(route.name.clone(), live);
        }
        self.routes.store(Arc::new(next));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(a_adaptive: bool, with_b: bool) -> Vec<Route> {
        let adaptive = if a_adaptive {
            "adaptive = { target_p99_ms = 100 }\n"
        } else {
            ""
        };
        let mut toml = format!(
            "[[routes]]\nname = \"a\"\npath_prefix = \"/a\"\nupstreams = [\"127.0.0.1:1\"]\n{adaptive}"
        );
        if with_b {
            toml.push_str(
                "[[routes]]\nname = \"b\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\n",
            );
        }
        crate::config::parse("t.toml", &toml).unwrap().routes
    }

    /// A route keeps its counters and, while it stays adaptive, its adaptive state over
    /// the configs that follow, by name; a route no longer adaptive loses the state (and
    /// starts afresh when it is adaptive again), a removed route all of it.
    #[test]
    fn state_follows_route_names_across_configs() {
        let metrics = Metrics::new().unwrap();
        let first = routes(true, true);
        let registry = RouteRegistry::new(&first);
        let a = registry.get(&first[0]);
        let state = a.adaptive().expect("adaptive").clone();
        a.counters(&metrics, "a");
        assert!(registry.get(&first[1]).adaptive().is_none());

        let same = routes(true, true);
        registry.follow(&same);
        let kept = registry.get(&same[0]);
        assert!(Arc::ptr_eq(kept.adaptive().unwrap(), &state));
        assert!(kept.counters.get().is_some(), "counters kept");

        let plain = routes(false, true);
        registry.follow(&plain);
        let a = registry.get(&plain[0]);
        assert!(a.adaptive().is_none() && a.factor().is_one());
        assert!(a.counters.get().is_some(), "counters kept without adaptive");
        registry.follow(&same);
        let back = registry.get(&same[0]);
        assert!(!Arc::ptr_eq(back.adaptive().unwrap(), &state), "afresh");

        let b = registry.get(&same[1]);
        b.counters(&metrics, "b");
        registry.follow(&routes(true, false));
        let b_again = registry.get(&same[1]);
        assert!(
            !Arc::ptr_eq(&b, &b_again) && b_again.counters.get().is_none(),
            "dropped"
        );
    }
}
