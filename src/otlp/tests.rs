use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::{span, status, Span};
use prometheus::IntCounter;

use super::*;

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn counts() -> SpanCounts {
    let c = || IntCounter::new("c", "c").unwrap();
    SpanCounts {
        exported: c(),
        dropped: c(),
        failed: c(),
    }
}

/// A tracer whose collector is nowhere (nothing here exports).
fn tracer(sample_ratio: f64) -> Tracer {
    let config = Tracing {
        endpoint: "http://127.0.0.1:9".into(),
        service_name: "t".into(),
        sample_ratio,
    };
    Tracer::start(&config, counts()).unwrap()
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

/// A trusted proxy's `traceparent` is continued (its trace, its span as parent, its
/// sampling, its `tracestate`); an untrusted peer's, a malformed one or two of them
/// start a trace of their own, without `tracestate`.
#[test]
fn continued_only_from_a_trusted_proxy() {
    let t = tracer(1.0);
    let sent = headers(&[(TRACEPARENT, PARENT), (TRACESTATE, "congo=t61rcWkgMzE")]);
    let continued = t.trace(Began::now(), &sent, true);
    assert_eq!(continued.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(
        continued.parent,
        Some([0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7])
    );
    assert_eq!(continued.tracestate().unwrap(), "congo=t61rcWkgMzE");
    assert!(continued.sampled());

    let unsampled = headers(&[(TRACEPARENT, &PARENT.replace("-01", "-00"))]);
    assert!(!t.trace(Began::now(), &unsampled, true).sampled());

    let twice = headers(&[(TRACEPARENT, PARENT), (TRACEPARENT, PARENT)]);
    let malformed = headers(&[(TRACEPARENT, "00-xyz")]);
    for (h, trusted, why) in [
        (&sent, false, "untrusted"),
        (&twice, true, "sent twice"),
        (&malformed, true, "malformed"),
        (&HeaderMap::new(), true, "absent"),
    ] {
        let own = t.trace(Began::now(), h, trusted);
        assert_ne!(
            own.trace_id_hex(),
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "{why}"
        );
        assert_eq!(own.parent, None, "{why}");
        assert!(own.tracestate().is_none(), "{why}");
        assert!(own.sampled(), "{why}: sample_ratio 1");
    }
}

/// `sample_ratio` 0 samples no root request, but a trusted sampled parent still decides.
#[test]
fn sample_ratio_applies_to_roots_only() {
    let t = tracer(0.0);
    for _ in 0..100 {
        assert!(!t.trace(Began::now(), &HeaderMap::new(), true).sampled());
    }
    assert!(t
        .trace(Began::now(), &headers(&[(TRACEPARENT, PARENT)]), true)
        .sampled());
}

/// The upstream is told this trace with the upstream span as its parent; the spans are
/// the server span (child of the caller's), the store's and the upstream's (children of
/// the server span), on one timeline.
#[test]
fn spans_link_up() {
    let t = tracer(1.0);
    let began = Began::now();
    let trace = t.trace(began, &headers(&[(TRACEPARENT, PARENT)]), true);
    let sent = trace.upstream_traceparent();
    let told = traceparent::parse(sent.as_bytes()).unwrap();
    assert_eq!(told.trace_id, trace.trace_id);
    assert_eq!(told.span_id, trace.upstream_span_id);
    assert!(told.sampled());
    let at = |ms| began.at + Duration::from_millis(ms);
    let f = Finished {
        trace,
        ended: at(30),
        method: "GET",
        method_original: None,
        path: "/v1/x".into(),
        route: Some("api".into()),
        client_ip: Some("203.0.113.9".parse().unwrap()),
        status: 200,
        request_id: Some(HeaderValue::from_static("rid")),
        rejected: None,
        store: Some((at(1), Duration::from_millis(2), "redis")),
        upstream: Some(Upstream {
            started: at(5),
            addr: Some("127.0.0.1:8080".parse().unwrap()),
            status: Some(200),
        }),
        error: None,
    };
    let spans = f.spans();
    assert_eq!(spans.len(), 3);
    let (server, store, up) = (&spans[0], &spans[1], &spans[2]);
    assert_eq!(server.parent_span_id, told_parent());
    assert_eq!(server.name, "GET api");
    assert_eq!(server.kind, span::SpanKind::Server as i32);
    assert_eq!(server.trace_state, "");
    for child in [store, up] {
        assert_eq!(child.trace_id, server.trace_id);
        assert_eq!(child.parent_span_id, server.span_id);
    }
    assert_eq!(up.span_id, told.span_id.to_vec());
    assert_eq!(up.kind, span::SpanKind::Client as i32);
    let ns = |ms: u64| began.unix_ns + ms * 1_000_000;
    assert_eq!(server.start_time_unix_nano, ns(0));
    assert_eq!(server.end_time_unix_nano, ns(30));
    assert_eq!(
        (store.start_time_unix_nano, store.end_time_unix_nano),
        (ns(1), ns(3))
    );
    assert_eq!(up.start_time_unix_nano, ns(5));
    let attr = |s: &Span, k: &str| {
        s.attributes
            .iter()
            .find(|kv| kv.key == k)
            .and_then(|kv| kv.value.clone())
            .and_then(|v| v.value)
    };
    assert_eq!(
        attr(server, "http.response.status_code"),
        Some(any_value::Value::IntValue(200))
    );
    assert_eq!(
        attr(store, "throttle.store"),
        Some(any_value::Value::StringValue("redis".into()))
    );
    assert_eq!(
        server.status.as_ref().unwrap().code,
        status::StatusCode::Unset as i32
    );
}

fn told_parent() -> Vec<u8> {
    vec![0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
}

/// A 502 without an upstream answer is an error on the server and upstream spans.
#[test]
fn failures_are_errors() {
    let t = tracer(1.0);
    let began = Began::now();
    let f = Finished {
        trace: t.trace(began, &HeaderMap::new(), false),
        ended: began.at,
        method: "POST",
        method_original: None,
        path: "/".into(),
        route: None,
        client_ip: None,
        status: 502,
        request_id: None,
        rejected: None,
        store: None,
        upstream: Some(Upstream {
            started: began.at,
            addr: None,
            status: None,
        }),
        error: Some("ConnectRefused".into()),
    };
    let spans = f.spans();
    assert_eq!(spans.len(), 2);
    assert!(spans[0].parent_span_id.is_empty());
    for s in &spans {
        assert_eq!(
            s.status.as_ref().unwrap().code,
            status::StatusCode::Error as i32
        );
    }
}

/// A full queue drops spans and counts them; the caller never waits.
#[test]
fn a_full_queue_drops_and_counts() {
    let (tx, _rx) = mpsc::sync_channel(1);
    let t = Tracer {
        tx,
        counts: counts(),
        gone: std::sync::atomic::AtomicBool::new(false),
        threshold: u64::MAX,
    };
    let finished = || Finished {
        trace: t.trace(Began::now(), &HeaderMap::new(), false),
        ended: Instant::now(),
        method: "GET",
        method_original: None,
        path: "/".into(),
        route: None,
        client_ip: None,
        status: 200,
        request_id: None,
        rejected: None,
        store: Some((Instant::now(), Duration::ZERO, "memory")),
        upstream: None,
        error: None,
    };
    t.finish(finished());
    t.finish(finished());
    t.finish(finished());
    assert_eq!(t.counts.dropped.get(), 4, "two requests of two spans each");
}

/// A non-standard method is `_OTHER` (span name `HTTP`), the method as sent capped beside
/// it; several `tracestate` lines are joined, too long ones dropped.
#[test]
fn client_input_is_bounded() {
    let odd = Method::from_bytes(&[b'X'; 300]).unwrap();
    let (label, original) = method_label(&odd);
    assert_eq!(label, "_OTHER");
    assert_eq!(original.unwrap().len(), MAX_METHOD);
    assert_eq!(method_label(&Method::PATCH), ("PATCH", None));
    let t = tracer(1.0);
    let two = headers(&[
        (TRACEPARENT, PARENT),
        (TRACESTATE, "a=1"),
        (TRACESTATE, "b=2"),
    ]);
    assert_eq!(
        t.trace(Began::now(), &two, true).tracestate().unwrap(),
        "a=1,b=2"
    );
    let long = "k=".to_string() + &"v".repeat(MAX_TRACESTATE);
    let huge = headers(&[(TRACEPARENT, PARENT), (TRACESTATE, &long)]);
    assert!(t.trace(Began::now(), &huge, true).tracestate().is_none());
}
