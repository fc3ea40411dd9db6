//! Tracing (`[tracing] otlp_endpoint`): a span per proxied request, exported over
//! OTLP/gRPC, with child spans for the store call and the upstream.
//!
//! - The trace: a `traceparent` from a trusted proxy (the rule `X-Request-Id` follows) is
//!   continued, its `tracestate` kept, and its `sampled` flag decides; any other request
//!   starts a trace of its own, sampled at `sample_ratio`. A client's `traceparent` is
//!   client input: an untrusted one is never continued (it could not poison a trace or
//!   force sampling), a malformed one is ignored.
//! - Upstream, the gateway always sends its own `traceparent`: the trace, the upstream
//!   span's id as parent, the sampling decision. `tracestate` goes on only with a
//!   continued trace.
//! - On the request path a traced request records instants it mostly has already (the
//!   store call's, the upstream's) and, in `logging`, hands one `Finished` to a bounded
//!   queue with `try_send`. A dedicated thread turns them into OTLP spans, batches them
//!   (up to `BATCH` requests or `EXPORT_EVERY`) and exports each batch within
//!   `EXPORT_TIMEOUT`. A full queue drops the request's spans and counts them
//!   (`throttle_trace_spans_total{outcome="dropped"}`); the request never waits.
//! - With `[tracing]` off there is no `Tracer`: nothing is recorded or sent, and the
//!   client's `traceparent` passes through untouched.
//!
//! `traceparent` parses and formats the W3C header, `spans` turns a `Finished` into its
//! OTLP spans, `export` is the exporter thread.

mod export;
mod spans;
pub mod traceparent;

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, Method};
use prometheus::IntCounter;
use tokio::time::Instant;

use crate::config::{cap, Tracing};
use export::Exporter;

/// Requests the export queue holds before new ones are dropped.
pub const CAPACITY: usize = 4096;
/// Most requests in one export.
pub const BATCH: usize = 512;
/// How long a request waits in the exporter for its batch to fill.
pub const EXPORT_EVERY: Duration = Duration::from_millis(500);
/// The deadline of one export call (connecting included).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest path a span names (bytes; cut at a character boundary).
pub const MAX_PATH: usize = 2048;
/// The longest `tracestate` kept (the W3C limit is 32 members; 512 bytes is what it
/// requires a vendor to propagate at least).
pub const MAX_TRACESTATE: usize = 512;
/// The longest non-standard method kept as `http.request.method_original`.
pub const MAX_METHOD: usize = 32;

/// The request header carrying the parent.
pub const TRACEPARENT: &str = "traceparent";
/// The vendor state beside it.
pub const TRACESTATE: &str = "tracestate";

/// What becomes of spans: `throttle_trace_spans_total{outcome}`.
#[derive(Clone)]
pub struct SpanCounts {
    /// Taken by the collector.
    pub exported: IntCounter,
    /// Dropped on a full queue.
    pub dropped: IntCounter,
    /// The export failed or the collector refused them.
    pub failed: IntCounter,
}

/// The sending side (one per gateway).
pub struct Tracer {
    tx: SyncSender<Finished>,
    counts: SpanCounts,
    /// The exporter thread was found gone (logged once).
    gone: std::sync::atomic::AtomicBool,
    /// A root request is sampled when a random `u64` is below this (`u64::MAX`: all).
    threshold: u64,
}

/// A request's trace, from its head to its end.
#[derive(Debug)]
pub struct Trace {
    trace_id: [u8; 16],
    /// The trusted caller's span (None: this request is the trace's root).
    parent: Option<[u8; 8]>,
    span_id: [u8; 8],
    /// The upstream call's span: the parent the upstream is told.
    upstream_span_id: [u8; 8],
    sampled: bool,
    /// Kept from the trusted caller with its `traceparent`.
    tracestate: Option<HeaderValue>,
    /// The store call (set by the adapter from the admission or refusal).
    pub store_span: Option<(Instant, Duration)>,
    /// The request's start, on both clocks.
    started: Instant,
    started_unix_ns: u64,
}

/// When a request started, read once before it is decided.
#[derive(Debug, Clone, Copy)]
pub struct Began {
    at: Instant,
    unix_ns: u64,
}

impl Began {
    /// Now.
    // Span timestamps are the wall clock's nanoseconds the collector orders spans by,
    // not limiter time (which comes from the injected `Clock`).
    #[allow(clippy::disallowed_methods)]
    pub fn now() -> Self {
        let unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Self {
            at: Instant::now(),
            unix_ns,
        }
    }
}

/// A traced request's end: what its spans say.
#[derive(Debug)]
pub struct Finished {
    /// The trace.
    pub trace: Trace,
    /// When the response ended.
    pub ended: Instant,
    /// The request method (a non-standard one as `_OTHER`: a span name must not be client
    /// input of any length).
    pub method: &'static str,
    /// A non-standard method as sent, capped at `MAX_METHOD` bytes.
    pub method_original: Option<String>,
    /// The request path (capped at `MAX_PATH`).
    pub path: String,
    /// The matched route.
    pub route: Option<std::sync::Arc<str>>,
    /// The resolved client address.
    pub client_ip: Option<IpAddr>,
    /// The status written to the client (0: none).
    pub status: u16,
    /// `X-Request-Id`.
    pub request_id: Option<HeaderValue>,
    /// The scope and window of a rate-limit rejection.
    pub rejected: Option<(&'static str, &'static str)>,
    /// The store call: its start and length, and the store's name.
    pub store: Option<(Instant, Duration, &'static str)>,
    /// The upstream call: its start, the address of the last attempt and the response
    /// head's status.
    pub upstream: Option<Upstream>,
    /// What ended the request, when an error did.
    pub error: Option<String>,
}

/// The upstream call of a traced request.
#[derive(Debug)]
pub struct Upstream {
    /// The first connect attempt.
    pub started: Instant,
    /// The last attempt's address.
    pub addr: Option<SocketAddr>,
    /// The response head's status (None: no response).
    pub status: Option<u16>,
}

// === impl Tracer ===

impl Tracer {
    /// Starts the exporter thread for `config`.
    ///
    /// # Errors
    /// When the thread or its runtime cannot be made.
    pub fn start(config: &Tracing, counts: SpanCounts) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(CAPACITY);
        let exporter = Exporter::new(config, counts.clone())?;
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || exporter.run(&rx))?;
        let ratio = config.sample_ratio.clamp(0.0, 1.0);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let threshold = if ratio >= 1.0 {
            u64::MAX
        } else {
            (ratio * u64::MAX as f64) as u64
        };
        Ok(Self {
            tx,
            counts,
            gone: std::sync::atomic::AtomicBool::new(false),
            threshold,
        })
    }

    /// The trace of a request that began at `began`: continued from `headers`'
    /// `traceparent` when the peer is `trusted`, else new.
    pub fn trace(&self, began: Began, headers: &HeaderMap, trusted: bool) -> Trace {
        let parent = trusted
            .then(|| {
                let mut all = headers.get_all(TRACEPARENT).iter();
                match (all.next(), all.next()) {
                    (Some(v), None) => traceparent::parse(v.as_bytes()),
                    _ => None,
                }
            })
            .flatten();
        let (trace_id, parent_id, sampled, tracestate) = match parent {
            Some(p) => (
                p.trace_id,
                Some(p.span_id),
                p.sampled(),
                tracestate(headers),
            ),
            None => (
                nonzero_id(),
                None,
                self.threshold == u64::MAX || rand::random::<u64>() < self.threshold,
                None,
            ),
        };
        Trace {
            trace_id,
            parent: parent_id,
            span_id: nonzero_span(),
            upstream_span_id: nonzero_span(),
            sampled,
            tracestate,
            store_span: None,
            started: began.at,
            started_unix_ns: began.unix_ns,
        }
    }

    /// Queues a sampled request's spans without waiting (a full queue drops them, and
    /// counts); an unsampled one is forgotten.
    pub fn finish(&self, finished: Finished) {
        if !finished.trace.sampled {
            return;
        }
        let n = finished.span_count();
        match self.tx.try_send(finished) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.counts.dropped.inc_by(n),
            Err(TrySendError::Disconnected(_)) => {
                self.counts.dropped.inc_by(n);
                if !self.gone.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::error!("the trace exporter stopped: spans are dropped from now on");
                }
            }
        }
    }
}

/// The `tracestate` lines a trusted caller sent, combined (`a=1, b=2`, as W3C allows it
/// split over several); none when they are longer than `MAX_TRACESTATE` together.
fn tracestate(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut all = headers.get_all(TRACESTATE).iter();
    let first = all.next()?;
    let Some(second) = all.next() else {
        return (first.len() <= MAX_TRACESTATE).then(|| first.clone());
    };
    let mut joined = first.as_bytes().to_vec();
    for v in std::iter::once(second).chain(all) {
        joined.extend_from_slice(b",");
        joined.extend_from_slice(v.as_bytes());
        if joined.len() > MAX_TRACESTATE {
            return None;
        }
    }
    HeaderValue::from_bytes(&joined).ok()
}

/// A span's name for `method`: the method when standard, else `_OTHER` with the method
/// as sent (capped) beside it (OpenTelemetry's HTTP conventions).
pub fn method_label(method: &Method) -> (&'static str, Option<String>) {
    let known = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::CONNECT,
        Method::OPTIONS,
        Method::TRACE,
        Method::PATCH,
    ];
    match known.iter().find(|m| *m == method) {
        Some(m) => (static_method(m), None),
        None => ("_OTHER", Some(cap(method.as_str(), MAX_METHOD).to_string())),
    }
}

fn static_method(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        _ => "PATCH",
    }
}

fn nonzero_id() -> [u8; 16] {
    loop {
        let id: u128 = rand::random();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

fn nonzero_span() -> [u8; 8] {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

// === impl Trace ===

impl Trace {
    /// The `traceparent` to send upstream: this trace, the upstream span as parent.
    pub fn upstream_traceparent(&self) -> HeaderValue {
        let bytes = traceparent::format(&self.trace_id, &self.upstream_span_id, self.sampled);
        HeaderValue::from_bytes(&bytes).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The `tracestate` to send upstream (only with a continued trace).
    pub fn tracestate(&self) -> Option<&HeaderValue> {
        self.tracestate.as_ref()
    }

    /// Whether the request's spans are recorded.
    pub fn sampled(&self) -> bool {
        self.sampled
    }

    /// The trace's id, as hex.
    pub fn trace_id_hex(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unix_ns(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.started);
        self.started_unix_ns
            .saturating_add(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests;
