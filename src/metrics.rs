//! Prometheus metrics, registered into a registry owned by the gateway (never global).
//!
//! No label ever carries an IP, key or tenant id: labels are route names, status codes,
//! scopes, decisions and store names, all bounded by the config.

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::limiter::Scope;

/// A decision outcome, the `decision` label of `throttle_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every scope allowed.
    Allowed,
    /// This scope rejected.
    Rejected,
    /// Would have rejected, in shadow mode.
    ShadowRejected,
    /// The store failed and the scope fails open.
    FailedOpen,
    /// The store failed and the scope fails closed.
    FailedClosed,
    /// Decided by the local fallback store.
    LocalFallback,
}

/// Every metric of the gateway.
pub struct Metrics {
    registry: Registry,
    /// `throttle_requests_total{route,status}`.
    pub requests_total: IntCounterVec,
    decisions: [[IntCounter; 6]; 5],
    /// The same, for named scopes (labels: the configured names only).
    decisions_total: IntCounterVec,
    /// `throttle_store_call_seconds{store}`.
    pub store_call_seconds: HistogramVec,
    /// `throttle_store_errors_total{store}`.
    pub store_errors_total: IntCounterVec,
    /// `throttle_fallback_active`.
    pub fallback_active: IntGauge,
    /// `throttle_events_dropped_total{reason}`: `queue_full` (oldest dropped while the
    /// database was slow or down) or `rejected` (rows the database can never store).
    pub events_dropped_total: IntCounterVec,
    /// `throttle_invalid_limits_total{source}`: database limits refused (`override`: a
    /// key's `custom_override`; `policy`: a `rate_limit_policies` row); the key keeps its
    /// tier's limits.
    pub invalid_limits_total: IntCounterVec,
    /// `throttle_store_calls_total{store="redis"}`: script calls (round trips).
    pub store_calls: IntCounter,
    /// `throttle_local_decisions_total{reason}`: `lease` (admitted on leased tokens),
    /// `over_limit_cache` (a rejection Redis decided, repeated).
    pub local_decisions: [IntCounter; 2],
    /// `throttle_lease_tokens_returned_total`: unused leased tokens given back.
    pub lease_tokens_returned_total: IntCounter,
    /// `throttle_lease_table_evictions_total`: identities the Redis store's table of
    /// leases and cached rejections dropped to stay within its bound.
    pub lease_table_evictions_total: IntCounter,
    /// `throttle_store_late_charges_total`: store calls that missed their deadline but
    /// charged in Redis, undone when their reply came in.
    pub store_late_charges_total: IntCounter,
    /// `throttle_upstream_seconds{route}`.
    pub upstream_seconds: HistogramVec,
    /// `throttle_cost_settled_total{direction}`: tokens settled after the response
    /// (`charge`: the true cost was higher than reserved; `refund`: lower).
    pub cost_settled: [IntCounter; 2],
    /// `throttle_cost_clamped_total`: settlements whose reported usage was above the
    /// route's `max_cost` and settled as `max_cost`.
    pub cost_clamped: IntCounter,
    /// `throttle_near_limit_total{scope}`: admitted requests that left their governing
    /// window (the one with the fewest remaining) at most 10% of its limit, by its scope.
    near_limit: [IntCounter; 5],
    near_limit_total: IntCounterVec,
    /// `throttle_bans_total{scope}`: automatic bans this gateway imposed.
    bans: [IntCounter; 5],
    bans_total: IntCounterVec,
    /// `throttle_bans_dropped_total{source}`: automatic bans refused because the table of
    /// bans (or the fleet's, on Redis) was full of bans in force, or (`check`) half of it
    /// holds bans of the decision APIs; by what struck them (`proxy`, `check`).
    pub bans_dropped: [IntCounter; 2],
    /// `throttle_store_evictions_total`: window states the memory store evicted, least
    /// recently used first, to stay within `[store] max_states`.
    pub store_evictions_total: IntCounter,
    /// `throttle_access_log_dropped_total`: access-log lines dropped because the
    /// writer's queue was full (the request is never held up for its line).
    pub access_log_dropped_total: IntCounter,
    /// `throttle_trace_spans_total{outcome}`: spans of traced requests (`[tracing]`), by
    /// what became of them: `exported` (the collector took them), `dropped` (the export
    /// queue was full; the request was never held up), `failed` (the export failed or
    /// the collector refused them).
    pub trace_spans: [IntCounter; 3],
    /// `throttle_ban_syncs_total{read}`: ban syncs from Redis that succeeded, by what
    /// they read: `full` (the whole table: first sync, Redis restarted or flushed, or
    /// fallen behind the change log) or `changes` (what changed since the last).
    pub ban_syncs: [IntCounter; 2],
    /// `throttle_adaptive_factor{route}`: the factor an adaptive route's limits are
    /// multiplied by (only adaptive routes have a series).
    pub adaptive_factor: GaugeVec,
    /// `throttle_upstream_healthy{route,upstream}`: 1 while the upstream passes its
    /// route's `health_check`, 0 while it fails (only routes with a health check; the
    /// address is config, not a client identity).
    pub upstream_healthy: IntGaugeVec,
    /// `throttle_rls_decisions_total{domain,code}`: rate-limit service answers with
    /// `[rls] config`, by domain (a configured one, else `unknown`) and overall code
    /// (`ok`, `over_limit`).
    pub rls_decisions_total: IntCounterVec,
    /// `throttle_rls_descriptor_total{domain,descriptor,code}`: descriptors whose limit
    /// has `detailed_metric`, by the config path that matched (never a runtime value)
    /// and their own code (`ok`, `over_limit`, `shadow_over_limit`).
    pub rls_descriptor_total: IntCounterVec,
    /// `throttle_rls_unmetered_lookups_total`: failed key lookups (an unknown `api_key`, a
    /// token that does not verify) of rate-limit service descriptors without
    /// `remote_address`, which `[limits.auth]` cannot count against an address.
    pub rls_unmetered_lookups_total: IntCounter,
    /// `throttle_connections_refused_total{listener,reason}`: connections refused by a cap
    /// (`proxy`, `admin`, `rls`; `max_connections`, `per_ip`).
    pub connections_refused_total: IntCounterVec,
    /// The `throttle_region_*` metrics of `fleet = "regions"`, by peer region.
    pub regions: regions::RegionMetrics,
}

// === impl Outcome ===

impl Outcome {
    const ALL: [Outcome; 6] = [
        Outcome::Allowed,
        Outcome::Rejected,
        Outcome::ShadowRejected,
        Outcome::FailedOpen,
        Outcome::FailedClosed,
        Outcome::LocalFallback,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Rejected => "rejected",
            Outcome::ShadowRejected => "shadow_rejected",
            Outcome::FailedOpen => "failed_open",
            Outcome::FailedClosed => "failed_closed",
            Outcome::LocalFallback => "local_fallback",
        }
    }
}

// === impl Metrics ===

impl Metrics {
    /// Registers every metric in a fresh registry.
    ///
    /// # Errors
    /// When a metric cannot be registered (a programming error: duplicate names).
    pub fn new() -> Result<Self, prometheus::Error> {
        let r = Reg(Registry::new());
        let decisions_total = r.counter_vec(&DECISIONS_TOTAL, &["scope", "decision"])?;
        let decisions = Scope::ALL.map(|s| {
            Outcome::ALL.map(|o| decisions_total.with_label_values(&[s.as_str(), o.as_str()]))
        });
        let events_dropped_total = r.counter_vec(&EVENTS_DROPPED_TOTAL, &["reason"])?;
        for reason in ["queue_full", "rejected"] {
            events_dropped_total.with_label_values(&[reason]);
        }
        let invalid_limits_total = r.counter_vec(&INVALID_LIMITS_TOTAL, &["source"])?;
        for source in ["override", "policy"] {
            invalid_limits_total.with_label_values(&[source]);
        }
        let scoped = |def: &Def| -> Result<(IntCounterVec, [IntCounter; 5]), prometheus::Error> {
            let v = r.counter_vec(def, &["scope"])?;
            let each = Scope::ALL.map(|s| v.with_label_values(&[s.as_str()]));
            Ok((v, each))
        };
        let (near_limit_total, near_limit) = scoped(&NEAR_LIMIT_TOTAL)?;
        let (bans_total, bans) = scoped(&BANS_TOTAL)?;
        let refused = r.counter_vec(&CONNECTIONS_REFUSED_TOTAL, &["listener", "reason"])?;
        for l in ["proxy", "admin", "rls"].map(|l| [[l, "max_connections"], [l, "per_ip"]]) {
            let _ = l.map(|labels| refused.with_label_values(&labels));
        }
        Ok(Self {
            requests_total: r.counter_vec(&REQUESTS_TOTAL, &["route", "status"])?,
            decisions,
            decisions_total,
            store_call_seconds: r.histogram_vec(&STORE_CALL_SECONDS, &["store"], STORE_BUCKETS)?,
            store_errors_total: r.counter_vec(&STORE_ERRORS_TOTAL, &["store"])?,
            fallback_active: r.add(IntGauge::new(FALLBACK_ACTIVE.name, FALLBACK_ACTIVE.help)?)?,
            events_dropped_total,
            invalid_limits_total,
            store_calls: r.labelled(&STORE_CALLS_TOTAL, "store", ["redis"])?[0].clone(),
            local_decisions: r.labelled(
                &LOCAL_DECISIONS_TOTAL,
                "reason",
                ["lease", "over_limit_cache"],
            )?,
            lease_tokens_returned_total: r.counter(&LEASE_TOKENS_RETURNED_TOTAL)?,
            lease_table_evictions_total: r.counter(&LEASE_TABLE_EVICTIONS_TOTAL)?,
            store_late_charges_total: r.counter(&STORE_LATE_CHARGES_TOTAL)?,
            upstream_seconds: r.histogram_vec(&UPSTREAM_SECONDS, &["route"], None)?,
            cost_settled: r.labelled(&COST_SETTLED_TOTAL, "direction", ["charge", "refund"])?,
            cost_clamped: r.counter(&COST_CLAMPED)?,
            near_limit,
            near_limit_total,
            bans,
            bans_total,
            bans_dropped: r.labelled(&BANS_DROPPED_TOTAL, "source", ["proxy", "check"])?,
            store_evictions_total: r.counter(&STORE_EVICTIONS_TOTAL)?,
            access_log_dropped_total: r.counter(&ACCESS_LOG_DROPPED_TOTAL)?,
            trace_spans: r.labelled(
                &TRACE_SPANS_TOTAL,
                "outcome",
                ["exported", "dropped", "failed"],
            )?,
            ban_syncs: r.labelled(&BAN_SYNCS_TOTAL, "read", ["full", "changes"])?,
            adaptive_factor: r.add(GaugeVec::new(ADAPTIVE_FACTOR.opts(), &["route"])?)?,
            upstream_healthy: r.add(IntGaugeVec::new(
                UPSTREAM_HEALTHY.opts(),
                &["route", "upstream"],
            )?)?,
            rls_decisions_total: r.counter_vec(&RLS_DECISIONS_TOTAL, &["domain", "code"])?,
            rls_unmetered_lookups_total: r.counter(&RLS_UNMETERED_LOOKUPS_TOTAL)?,
            rls_descriptor_total: r
                .counter_vec(&RLS_DESCRIPTOR_TOTAL, &["domain", "descriptor", "code"])?,
            connections_refused_total: refused,
            regions: regions::RegionMetrics::register(&r)?,
            registry: r.0,
        })
    }

    /// The per-route counters of `route` (`none` for requests no route matched).
    pub fn route(&self, route: &str) -> RouteCounters {
        RouteCounters {
            requests: STATUS_LABELS
                .iter()
                .map(|s| self.requests_total.with_label_values(&[route, s]))
                .collect(),
            upstream_seconds: self.upstream_seconds.with_label_values(&[route]),
        }
    }

    /// Counts tokens settled: `delta` > 0 charged, < 0 refunded.
    pub fn cost_settled(&self, delta: i64) {
        let i = usize::from(delta < 0);
        self.cost_settled[i].inc_by(delta.unsigned_abs());
    }

    /// Counts an admitted request whose governing window of `scope` is near its limit.
    pub fn near_limit(&self, scope: Scope) {
        match scope.builtin_index() {
            Some(i) => self.near_limit[i].inc(),
            None => self
                .near_limit_total
                .with_label_values(&[scope.as_str()])
                .inc(),
        }
    }

    /// The counter of automatic bans imposed by `scope`.
    pub fn bans(&self, scope: Scope) -> IntCounter {
        match scope.builtin_index() {
            Some(i) => self.bans[i].clone(),
            None => self.bans_total.with_label_values(&[scope.as_str()]),
        }
    }

    /// Counts a connection `listener` refused, and why.
    pub fn connection_refused(&self, listener: &str, reason: &str) {
        let c = &self.connections_refused_total;
        c.with_label_values(&[listener, reason]).inc();
    }

    /// Counts one decision of `scope`.
    pub fn decision(&self, scope: Scope, outcome: Outcome) {
        match scope.builtin_index() {
            Some(i) => self.decisions[i][outcome as usize].inc(),
            None => self
                .decisions_total
                .with_label_values(&[scope.as_str(), outcome.as_str()])
                .inc(),
        }
    }

    /// Drops the series of named scopes (`throttle_decisions_total`, `_near_limit_total`,
    /// `_bans_total`) whose name `live` refuses: after a reload, those of route tables,
    /// custom scopes and domains the new config removed, so `/metrics` does not grow over
    /// reloads with fresh names. The built-in scopes' series always stay.
    pub fn retain_scopes(&self, live: impl Fn(&str) -> bool) {
        let keep = |name: &str| Scope::ALL.iter().any(|s| s.as_str() == name) || live(name);
        for vec in [
            &self.decisions_total,
            &self.near_limit_total,
            &self.bans_total,
        ] {
            retain_series(vec, "scope", &keep);
        }
    }

    /// Drops the series of routes (`throttle_requests_total`, `_upstream_seconds`) whose
    /// name `live` refuses; `none` (requests no route matched) always stays.
    pub fn retain_routes(&self, live: impl Fn(&str) -> bool) {
        let keep = |name: &str| name == "none" || live(name);
        retain_series(&self.requests_total, "route", &keep);
        retain_series(&self.upstream_seconds, "route", &keep);
    }

    /// Drops the series of rate-limit service domains (`throttle_rls_decisions_total`,
    /// `_rls_descriptor_total`) whose name `live` refuses; `unknown` always stays.
    pub fn retain_domains(&self, live: impl Fn(&str) -> bool) {
        let keep = |name: &str| name == "unknown" || live(name);
        retain_series(&self.rls_decisions_total, "domain", &keep);
        retain_series(&self.rls_descriptor_total, "domain", &keep);
    }

    /// Registers `collector`: metrics read from state kept elsewhere at each scrape (the
    /// JWT verifier's `throttle_jwt_*`).
    ///
    /// # Errors
    /// When a name is taken (a programming error).
    pub fn register(&self, collector: Box<dyn Collector>) -> Result<(), prometheus::Error> {
        self.registry.register(collector)
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(4096);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        buf
    }
}

/// Removes every series of `vec` whose `label` value `keep` refuses.
fn retain_series<T: MetricVecBuilder>(
    vec: &MetricVec<T>,
    label: &str,
    keep: &dyn Fn(&str) -> bool,
) {
    for family in vec.collect() {
        for m in family.get_metric() {
            let pairs = m.get_label();
            if pairs.iter().any(|p| p.name() == label && !keep(p.value())) {
                let labels: std::collections::HashMap<&str, &str> =
                    pairs.iter().map(|p| (p.name(), p.value())).collect();
                // Absent already (a concurrent removal): nothing to do.
                let _ = vec.remove(&labels);
            }
        }
    }
}

/// Every `status` label, in `status_index` order.
pub const STATUS_LABELS: [&str; 21] = [
    "200", "201", "204", "301", "302", "304", "400", "401", "403", "404", "429", "500", "502",
    "503", "504", "1xx", "2xx", "3xx", "4xx", "5xx", "other",
];

/// `throttle_requests_total` and `throttle_upstream_seconds` of one route, resolved once
/// (no label lookup per request).
#[derive(Debug, Clone)]
pub struct RouteCounters {
    requests: Box<[IntCounter]>,
    /// `throttle_upstream_seconds{route}`.
    pub upstream_seconds: prometheus::Histogram,
}

impl RouteCounters {
    /// Counts a request answered with `status`.
    pub fn request(&self, status: u16) {
        if let Some(c) = self.requests.get(status_index(status)) {
            c.inc();
        }
    }
}

/// A metric's name and help text.
struct Def {
    name: &'static str,
    help: &'static str,
}

impl Def {
    fn opts(&self) -> Opts {
        Opts::new(self.name, self.help)
    }
}

/// `throttle_store_call_seconds`'s buckets: 50 µs to 100 ms.
const STORE_BUCKETS: Option<&[f64]> = Some(&[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
]);

const REQUESTS_TOTAL: Def = Def {
    name: "throttle_requests_total",
    help: "Requests served, by route and status.",
};

const DECISIONS_TOTAL: Def = Def {
    name: "throttle_decisions_total",
    help: "Limiter decisions, by scope and outcome.",
};

const STORE_CALL_SECONDS: Def = Def {
    name: "throttle_store_call_seconds",
    help: "Latency of limit store calls.",
};

const STORE_ERRORS_TOTAL: Def = Def {
    name: "throttle_store_errors_total",
    help: "Failed limit store calls.",
};

const FALLBACK_ACTIVE: Def = Def {
    name: "throttle_fallback_active",
    help: "1 while decisions come from the local fallback.",
};

const EVENTS_DROPPED_TOTAL: Def = Def {
    name: "throttle_events_dropped_total",
    help: "Violation events dropped, by reason (queue_full, rejected).",
};

const INVALID_LIMITS_TOTAL: Def = Def {
    name: "throttle_invalid_limits_total",
    help: "Database limits refused (a key's custom_override, a policy row), by source.",
};

const UPSTREAM_SECONDS: Def = Def {
    name: "throttle_upstream_seconds",
    help: "Time from upstream connect to the end of the response, by route.",
};

const STORE_CALLS_TOTAL: Def = Def {
    name: "throttle_store_calls_total",
    help: "Round trips to the limit store (script calls), by store.",
};

const LOCAL_DECISIONS_TOTAL: Def = Def {
    name: "throttle_local_decisions_total",
    help: "Requests decided by the gateway without a round trip, by reason.",
};

const LEASE_TOKENS_RETURNED_TOTAL: Def = Def {
    name: "throttle_lease_tokens_returned_total",
    help: "Unused leased tokens given back to Redis.",
};

const LEASE_TABLE_EVICTIONS_TOTAL: Def = Def {
    name: "throttle_lease_table_evictions_total",
    help: "Identities the table of leases and cached rejections evicted to stay within its bound (524,288).",
};

const STORE_LATE_CHARGES_TOTAL: Def = Def {
    name: "throttle_store_late_charges_total",
    help: "Redis calls that missed their deadline but charged; refunded when the reply came in.",
};

const COST_SETTLED_TOTAL: Def = Def {
    name: "throttle_cost_settled_total",
    help: "Tokens settled against a route's cost_header after the response, by direction (charge, refund).",
};

const COST_CLAMPED: Def = Def {
    name: "throttle_cost_clamped_total",
    help: "Settlements whose reported usage was above the route's max_cost, settled as max_cost.",
};

const NEAR_LIMIT_TOTAL: Def = Def {
    name: "throttle_near_limit_total",
    help: "Admitted requests that left their tightest window at most 10% of its limit, by scope.",
};

const ADAPTIVE_FACTOR: Def = Def {
    name: "throttle_adaptive_factor",
    help: "The factor an adaptive route's limits are multiplied by (1: full limits), by route.",
};

const BANS_TOTAL: Def = Def {
    name: "throttle_bans_total",
    help: "Automatic temporary bans this gateway imposed, by scope.",
};

const BANS_DROPPED_TOTAL: Def = Def {
    name: "throttle_bans_dropped_total",
    help: "Automatic bans refused: the table of bans was full, or half of it held decision-API bans (source: proxy, check).",
};

const STORE_EVICTIONS_TOTAL: Def = Def {
    name: "throttle_store_evictions_total",
    help: "Window states the memory store evicted (least recently used) to stay within [store] max_states.",
};

const BAN_SYNCS_TOTAL: Def = Def {
    name: "throttle_ban_syncs_total",
    help: "Ban syncs from Redis, by what they read (full: the whole table; changes: what changed since the last).",
};

const RLS_DECISIONS_TOTAL: Def = Def {
    name: "throttle_rls_decisions_total",
    help: "Rate-limit service answers with [rls] config, by domain and overall code.",
};

const RLS_UNMETERED_LOOKUPS_TOTAL: Def = Def {
    name: "throttle_rls_unmetered_lookups_total",
    help: "Failed key lookups of rate-limit service descriptors without remote_address (not counted in [limits.auth]).",
};

const RLS_DESCRIPTOR_TOTAL: Def = Def {
    name: "throttle_rls_descriptor_total",
    help: "Rate-limit service descriptors with detailed_metric, by config path and code.",
};

const CONNECTIONS_REFUSED_TOTAL: Def = Def {
    name: "throttle_connections_refused_total",
    help: "Connections refused by a cap, by listener (proxy, admin, rls) and reason (max_connections, per_ip).",
};

const ACCESS_LOG_DROPPED_TOTAL: Def = Def {
    name: "throttle_access_log_dropped_total",
    help: "Access-log lines dropped because the writer's queue was full.",
};

const TRACE_SPANS_TOTAL: Def = Def {
    name: "throttle_trace_spans_total",
    help: "Spans of traced requests, by outcome (exported, dropped: the queue was full, failed: the export failed).",
};

const UPSTREAM_HEALTHY: Def = Def {
    name: "throttle_upstream_healthy",
    help: "1 while an upstream passes its route's health check, 0 while it fails.",
};

/// The registry being filled by `Metrics::new`: each metric is registered as it is made.
struct Reg(Registry);

impl Reg {
    fn add<M: Collector + Clone + 'static>(&self, m: M) -> Result<M, prometheus::Error> {
        self.0.register(Box::new(m.clone()))?;
        Ok(m)
    }

    fn counter(&self, def: &Def) -> Result<IntCounter, prometheus::Error> {
        self.add(IntCounter::new(def.name, def.help)?)
    }

    fn counter_vec(&self, def: &Def, labels: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
        self.add(IntCounterVec::new(def.opts(), labels)?)
    }

    /// The counters of `def` with `label` set to each of `values`.
    fn labelled<const N: usize>(
        &self,
        def: &Def,
        label: &str,
        values: [&str; N],
    ) -> Result<[IntCounter; N], prometheus::Error> {
        let v = self.counter_vec(def, &[label])?;
        Ok(values.map(|x| v.with_label_values(&[x])))
    }

    fn histogram_vec(
        &self,
        def: &Def,
        labels: &[&str],
        buckets: Option<&[f64]>,
    ) -> Result<HistogramVec, prometheus::Error> {
        let mut opts = HistogramOpts::new(def.name, def.help);
        if let Some(b) = buckets {
            opts = opts.buckets(b.to_vec());
        }
        self.add(HistogramVec::new(opts, labels)?)
    }
}

mod regions;
mod status;
#[cfg(test)]
mod tests;

pub use status::{status_index, status_label};
