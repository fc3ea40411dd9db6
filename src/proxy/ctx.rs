//! The state a request carries between Pingora's phases, and how it ends: the admission
//! given back exactly once (from `logging`, the phase that always runs), the route's
//! metrics, and what the route's adaptive limit learns from the upstream's timing marks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Uri};
use pingora::{Error, ErrorSource};
use tokio::time::Instant;

use super::upstream::is_connect_failure;
use crate::admission::{Admission, Core, RefusalSeen, RouteLive};
use crate::metrics::RouteCounters;
use crate::otlp::Trace;
use crate::routing::RouteEntry;
use crate::store::Ending;

/// Per-request state carried between phases.
#[derive(Default)]
pub struct RequestCtx {
    pub(super) admission: Option<Admission>,
    /// The `Host` to forward, when it differs from the client's (see `target`).
    pub(super) host_header: Option<HeaderValue>,
    /// The origin-form URI to forward, when it differs from the client's.
    pub(super) uri: Option<Uri>,
    /// The route, for metrics (none: no route matched).
    pub(super) route: Option<Arc<RouteEntry>>,
    pub(super) connect_tries: usize,
    /// The upstream chosen while admitting (a balanced route), for the first attempt.
    pub(super) chosen: Option<SocketAddr>,
    pub(super) upstream_started: Option<Instant>,
    /// When the request's last byte went to the upstream (its body's end, or its head
    /// for a request without a body): where the adaptive latency starts.
    pub(super) upstream_sent: Option<Instant>,
    /// When the upstream's response head arrived, and its status.
    pub(super) upstream_head: Option<(Instant, u16)>,
    /// When the request body must be complete (`body_timeout_secs` after the headers).
    pub(super) body_deadline: Option<Instant>,
    /// The request's `X-Request-Id` (see `request_id`).
    pub(super) request_id: Option<HeaderValue>,
    /// When the request reached `request_filter` (set only with the access log on).
    pub(super) started: Option<Instant>,
    /// The scope and window that rejected the request (a rate-limit rejection).
    pub(super) rejected: Option<(&'static str, &'static str)>,
    /// The upstream address of the last attempt.
    pub(super) upstream_addr: Option<SocketAddr>,
    /// What a refused request showed (its client address and key; only with the access
    /// log or tracing on: an admitted request's are in its admission).
    pub(super) refused: Option<Box<RefusalSeen>>,
    /// The request's trace (only with `[tracing]` on).
    pub(super) trace: Option<Box<Trace>>,
    /// The body bytes a `cost_from` route counts, so far.
    pub(super) counted_bytes: u64,
}

// === impl RequestCtx ===

impl RequestCtx {
    /// The route the request was admitted on.
    pub(super) fn admitted_route(&self) -> Option<&Arc<RouteEntry>> {
        self.admission.as_ref().and_then(|a| a.route.as_ref())
    }

    /// Counts `body`'s bytes when the admitted route settles on `which` (`cost_from`).
    pub(super) fn count_bytes(&mut self, which: crate::config::Counted, body: Option<&[u8]>) {
        let counts = self.admission.as_ref().and_then(Admission::counted_bytes);
        if counts == Some(which) {
            let n = body.map_or(0, <[u8]>::len);
            self.counted_bytes = self.counted_bytes.saturating_add(n as u64);
        }
    }

    /// Whether the request's route forwards protocol upgrades (`upgrade = true`).
    pub(super) fn upgrades(&self) -> bool {
        self.route.as_ref().is_some_and(|r| r.route.upgrade)
    }

    /// Ends the request in `logging`, with the `status` written to the client (0: none)
    /// and the error that ended it, if any: the admission finishes, then the route's
    /// counters and the adaptive window learn from it.
    pub(super) fn finish(
        &mut self,
        core: &Core,
        unrouted: &RouteCounters,
        status: u16,
        e: Option<&Error>,
    ) {
        let client = self
            .admission
            .as_ref()
            .map(|a| crate::adaptive::client_id(a.client_ip, a.runtime.config.ipv6_prefix));
        if let Some(mut a) = self.admission.take() {
            // Only a client that left before the upstream's response head: after it, the
            // usage header either came (and settled) or never will.
            let left_early = e.is_some_and(|e| e.esource() == &ErrorSource::Downstream)
                && self.upstream_head.is_none();
            if left_early {
                a.settle_abandoned(&core.metrics);
            }
            // `cost_from`: the bytes moved, however the request ended.
            a.settle_bytes(self.counted_bytes, &core.metrics);
            a.finish(ending(e, status));
        }
        let live = self.route.as_ref().map(|r| core.route_state(r));
        let counters =
            crate::edge::route_counters(core, self.route.as_deref(), live.as_deref(), unrouted);
        counters.request(status);
        if let Some(started) = self.upstream_started {
            counters
                .upstream_seconds
                .observe(started.elapsed().as_secs_f64());
            self.learn(core, live.as_deref(), started, e, client.unwrap_or(0));
        }
    }

    /// Feeds an adaptive route's window (`live`: the route's state) with what the
    /// upstream showed (`upstream_sample`).
    fn learn(
        &self,
        core: &Core,
        live: Option<&RouteLive>,
        started: Instant,
        e: Option<&Error>,
        client: u128,
    ) {
        let route = self.route.as_ref();
        let adaptive = route.and_then(|r| Some((live?.adaptive()?, r.route.adaptive?)));
        let sample = self.upstream_sample(started, e);
        if let (Some((state, settings)), Some((latency, error))) = (adaptive, sample) {
            let now_ms = core.clock.now_ms();
            state.record_from(&settings, now_ms, client, latency, error);
        }
    }

    /// What an adaptive route learns from a proxied request: (latency, error), or nothing.
    /// - The upstream answered: the time from the request's last byte written to the
    ///   response head (not the client's upload or download), an error when it answered
    ///   5xx.
    /// - No answer, and the upstream is to blame: the gateway could not connect (the
    ///   connect time), or the request was fully sent and the upstream failed or timed out
    ///   before its head (the time since the last byte): an error.
    /// - Otherwise nothing: the client went away or failed, the gateway refused or timed
    ///   the client out, or the upstream failed while the client was still uploading.
    fn upstream_sample(&self, started: Instant, e: Option<&Error>) -> Option<(Duration, bool)> {
        if let Some((at, status)) = self.upstream_head {
            // An upstream that answers before the body ends took no time after it.
            let from = self.upstream_sent.unwrap_or(at);
            return Some((at.saturating_duration_since(from), status >= 500));
        }
        let e = e.filter(|e| e.esource() == &ErrorSource::Upstream)?;
        if is_connect_failure(e.etype()) {
            return Some((started.elapsed(), true));
        }
        self.upstream_sent.map(|sent| (sent.elapsed(), true))
    }
}

/// How a request that reached `logging` ended.
fn ending(e: Option<&Error>, status: u16) -> Ending {
    match e {
        None => Ending::Completed { status },
        Some(e) if e.esource() == &ErrorSource::Downstream => Ending::ClientGone,
        Some(_) if status == 0 => Ending::ClientGone,
        Some(_) => Ending::UpstreamFailed,
    }
}
