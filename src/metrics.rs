//! Prometheus metrics, registered into a registry owned by the gateway (never global).
//!
//! No label ever carries an IP, key or tenant id: labels are route names, status codes,
//! scopes, decisions and store names, all bounded by the config.

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
    /// `throttle_bans_total{scope}`: automatic bans this gateway imposed.
    bans: [IntCounter; 5],
    /// `throttle_bans_dropped_total`: automatic bans refused because the table of bans
    /// (or the fleet's, on Redis) was full of bans still in force.
    pub bans_dropped_total: IntCounter,
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
        let registry = Registry::new();
        let requests_total = IntCounterVec::new(
            Opts::new(
                "throttle_requests_total",
                "Requests served, by route and status.",
            ),
            &["route", "status"],
        )?;
        let decisions_total = IntCounterVec::new(
            Opts::new(
                "throttle_decisions_total",
                "Limiter decisions, by scope and outcome.",
            ),
            &["scope", "decision"],
        )?;
        let store_call_seconds = HistogramVec::new(
            HistogramOpts::new(
                "throttle_store_call_seconds",
                "Latency of limit store calls.",
            )
            .buckets(vec![
                0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
            ]),
            &["store"],
        )?;
        let store_errors_total = IntCounterVec::new(
            Opts::new("throttle_store_errors_total", "Failed limit store calls."),
            &["store"],
        )?;
        let fallback_active = IntGauge::new(
            "throttle_fallback_active",
            "1 while decisions come from the local fallback.",
        )?;
        let events_dropped_total = IntCounterVec::new(
            Opts::new(
                "throttle_events_dropped_total",
                "Violation events dropped, by reason (queue_full, rejected).",
            ),
            &["reason"],
        )?;
        let invalid_limits_total = IntCounterVec::new(
            Opts::new(
                "throttle_invalid_limits_total",
                "Database limits refused (a key's custom_override, a policy row), by source.",
            ),
            &["source"],
        )?;
        let upstream_seconds = HistogramVec::new(
            HistogramOpts::new(
                "throttle_upstream_seconds",
                "Time from upstream connect to the end of the response, by route.",
            ),
            &["route"],
        )?;
        registry.register(Box::new(requests_total.clone()))?;
        registry.register(Box::new(decisions_total.clone()))?;
        registry.register(Box::new(store_call_seconds.clone()))?;
        registry.register(Box::new(store_errors_total.clone()))?;
        registry.register(Box::new(fallback_active.clone()))?;
        registry.register(Box::new(events_dropped_total.clone()))?;
        registry.register(Box::new(invalid_limits_total.clone()))?;
        for reason in ["queue_full", "rejected"] {
            events_dropped_total.with_label_values(&[reason]);
        }
        for source in ["override", "policy"] {
            invalid_limits_total.with_label_values(&[source]);
        }
        registry.register(Box::new(upstream_seconds.clone()))?;
        let store_calls_total = IntCounterVec::new(
            Opts::new(
                "throttle_store_calls_total",
                "Round trips to the limit store (script calls), by store.",
            ),
            &["store"],
        )?;
        let local_decisions_total = IntCounterVec::new(
            Opts::new(
                "throttle_local_decisions_total",
                "Requests decided by the gateway without a round trip, by reason.",
            ),
            &["reason"],
        )?;
        let lease_tokens_returned_total = IntCounter::new(
            "throttle_lease_tokens_returned_total",
            "Unused leased tokens given back to Redis.",
        )?;
        registry.register(Box::new(store_calls_total.clone()))?;
        registry.register(Box::new(local_decisions_total.clone()))?;
        registry.register(Box::new(lease_tokens_returned_total.clone()))?;
        let lease_table_evictions_total = IntCounter::new(
            "throttle_lease_table_evictions_total",
            "Identities the table of leases and cached rejections evicted to stay within its bound (524,288).",
        )?;
        registry.register(Box::new(lease_table_evictions_total.clone()))?;
        let store_late_charges_total = IntCounter::new(
            "throttle_store_late_charges_total",
            "Redis calls that missed their deadline but charged; refunded when the reply came in.",
        )?;
        registry.register(Box::new(store_late_charges_total.clone()))?;
        let store_calls = store_calls_total.with_label_values(&["redis"]);
        let cost_settled_total = IntCounterVec::new(
            Opts::new(
                "throttle_cost_settled_total",
                "Tokens settled against a route's cost_header after the response, by direction (charge, refund).",
            ),
            &["direction"],
        )?;
        registry.register(Box::new(cost_settled_total.clone()))?;
        let cost_settled = ["charge", "refund"].map(|d| cost_settled_total.with_label_values(&[d]));
        let cost_clamped = IntCounter::new(
            "throttle_cost_clamped_total",
            "Settlements whose reported usage was above the route's max_cost, settled as max_cost.",
        )?;
        registry.register(Box::new(cost_clamped.clone()))?;
        let near_limit_total = IntCounterVec::new(
            Opts::new(
                "throttle_near_limit_total",
                "Admitted requests that left their tightest window at most 10% of its limit, by scope.",
            ),
            &["scope"],
        )?;
        registry.register(Box::new(near_limit_total.clone()))?;
        let adaptive_factor = GaugeVec::new(
            Opts::new(
                "throttle_adaptive_factor",
                "The factor an adaptive route's limits are multiplied by (1: full limits), by route.",
            ),
            &["route"],
        )?;
        registry.register(Box::new(adaptive_factor.clone()))?;
        let near_limit = Scope::ALL.map(|s| near_limit_total.with_label_values(&[s.as_str()]));
        let bans_total = IntCounterVec::new(
            Opts::new(
                "throttle_bans_total",
                "Automatic temporary bans this gateway imposed, by scope.",
            ),
            &["scope"],
        )?;
        registry.register(Box::new(bans_total.clone()))?;
        let bans = Scope::ALL.map(|s| bans_total.with_label_values(&[s.as_str()]));
        let bans_dropped_total = IntCounter::new(
            "throttle_bans_dropped_total",
            "Automatic bans refused because the table of bans was full of bans in force.",
        )?;
        registry.register(Box::new(bans_dropped_total.clone()))?;
        let ban_syncs_total = IntCounterVec::new(
            Opts::new(
                "throttle_ban_syncs_total",
                "Ban syncs from Redis, by what they read (full: the whole table; changes: what changed since the last).",
            ),
            &["read"],
        )?;
        registry.register(Box::new(ban_syncs_total.clone()))?;
        let ban_syncs = ["full", "changes"].map(|r| ban_syncs_total.with_label_values(&[r]));
        let local_decisions =
            ["lease", "over_limit_cache"].map(|r| local_decisions_total.with_label_values(&[r]));
        let upstream_healthy = IntGaugeVec::new(
            Opts::new(
                "throttle_upstream_healthy",
                "1 while an upstream passes its route's health check, 0 while it fails.",
            ),
            &["route", "upstream"],
        )?;
        registry.register(Box::new(upstream_healthy.clone()))?;
        let decisions = Scope::ALL.map(|s| {
            Outcome::ALL.map(|o| decisions_total.with_label_values(&[s.as_str(), o.as_str()]))
        });
        Ok(Self {
            registry,
            requests_total,
            decisions,
            store_call_seconds,
            store_errors_total,
            fallback_active,
            events_dropped_total,
            invalid_limits_total,
            store_calls,
            local_decisions,
            lease_tokens_returned_total,
            lease_table_evictions_total,
            store_late_charges_total,
            upstream_seconds,
            cost_settled,
            cost_clamped,
            near_limit,
            bans,
            bans_dropped_total,
            ban_syncs,
            adaptive_factor,
            upstream_healthy,
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
        self.near_limit[scope as usize].inc();
    }

    /// The counter of automatic bans imposed by `scope`.
    pub fn bans(&self, scope: Scope) -> IntCounter {
        self.bans[scope as usize].clone()
    }

    /// Counts one decision of `scope`.
    pub fn decision(&self, scope: Scope, outcome: Outcome) {
        self.decisions[scope as usize][outcome as usize].inc();
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

/// The position of `code`'s label in `STATUS_LABELS`.
pub fn status_index(code: u16) -> usize {
    let label = status_label(code);
    STATUS_LABELS
        .iter()
        .position(|l| *l == label)
        .unwrap_or(STATUS_LABELS.len() - 1)
}

/// The `status` label: a static string for common codes, no allocation.
pub fn status_label(code: u16) -> &'static str {
    const EXACT: [(u16, &str); 15] = [
        (200, "200"),
        (201, "201"),
        (204, "204"),
        (301, "301"),
        (302, "302"),
        (304, "304"),
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (429, "429"),
        (500, "500"),
        (502, "502"),
        (503, "503"),
        (504, "504"),
    ];
    if let Some((_, s)) = EXACT.iter().find(|(c, _)| *c == code) {
        return s;
    }
    match code {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}
