//! `[tracing] otlp_endpoint` through the real gateway and a real OTLP/gRPC receiver the
//! test serves (the OpenTelemetry proto's `TraceService`): a span per request, children
//! for the store call and the upstream, the parent taken from a trusted proxy's
//! `traceparent` and the upstream told the trace; an untrusted peer's `traceparent`
//! starts a trace of its own; with tracing off the client's header passes untouched.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::Value;

use crate::support::{client, eventually, header, Gateway, Upstream};

/// An OTLP trace receiver on an ephemeral port, keeping what it is sent; stopped on drop.
struct Receiver {
    addr: std::net::SocketAddr,
    got: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

#[derive(Clone)]
struct Keep(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Keep {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let service = TraceServiceServer::new(Keep(got.clone()));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(async move {
            let stop = async move {
                let _ = rx.await;
            };
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(service, incoming, stop)
                .await;
        });
        Self {
            addr,
            got,
            stop: Some(tx),
        }
    }

    /// Every span received so far, with the resource's `service.name`.
    fn spans(&self) -> Vec<(String, Span)> {
        let got = self.got.lock().unwrap();
        let mut out = Vec::new();
        for req in got.iter() {
            for rs in &req.resource_spans {
                let service = rs
                    .resource
                    .as_ref()
                    .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                    .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                        Any::StringValue(s) => Some(s.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                for ss in &rs.scope_spans {
                    out.extend(ss.spans.iter().map(|s| (service.clone(), s.clone())));
                }
            }
        }
        out
    }

    /// The spans of trace `trace_id` (hex), once there are `n`.
    async fn trace(&self, trace_id: &str, n: usize) -> Vec<Span> {
        eventually(Duration::from_secs(10), "spans at the receiver", || async {
            let spans: Vec<Span> = self
                .spans()
                .into_iter()
                .map(|(_, s)| s)
                .filter(|s| hex(&s.trace_id) == trace_id)
                .collect();
            (spans.len() >= n).then_some(spans)
        })
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr(s: &Span, key: &str) -> Option<Any> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone()?.value)
}

/// `GET /v1/orders` with key_a's key and `headers`.
async fn orders(gw: &Gateway, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client()
        .get(gw.url("/v1/orders"))
        .header("x-api-key", "key-a-secret");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap()
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn config(trusted: &str, tracing: &str) -> String {
    format!(
        r#"
[client_ip]
trusted_proxies = {trusted}

[tiers.free]
key = {{ per_minute = 1 }}

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{{upstream}}"]
auth = "required"

[[keys]]
id = "key_a"
key = "key-a-secret"
tenant = "acme"
tier = "free"
{tracing}
"#
    )
}

/// A trusted proxy's `traceparent` is continued: the server span is its child, the store
/// and upstream spans are the server span's, and the upstream is told the trace with the
/// upstream span as its parent (and the `tracestate`). A 429 is traced too, with the
/// rejecting scope, a store span and no upstream span.
#[tokio::test(flavor = "multi_thread")]
async fn a_trace_continues_the_trusted_traceparent() {
    let receiver = Receiver::start().await;
    let up = Upstream::start("up").await;
    let tracing = format!(
        "[tracing]\notlp_endpoint = \"http://{}\"\nservice_name = \"edge-gw\"",
        receiver.addr
    );
    let gw = Gateway::start(&config(r#"["127.0.0.1/32"]"#, &tracing), Some(&up)).await;
    let parent = format!("00-{TRACE}-{PARENT}-01");
    let r = orders(
        &gw,
        &[("traceparent", &parent), ("tracestate", "vendor=abc")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let request_id = header(&r, "x-request-id");
    let echo: Value = r.json().await.unwrap();
    let told = echo["headers"]["traceparent"].as_str().unwrap().to_string();
    assert_eq!(echo["headers"]["tracestate"], "vendor=abc");
    let parts: Vec<&str> = told.split('-').collect();
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", TRACE, "01"),
        "{told}"
    );
    assert_ne!(
        parts[2], PARENT,
        "the upstream's parent is the gateway's span"
    );

    let spans = receiver.trace(TRACE, 3).await;
    assert_eq!(spans.len(), 3, "{spans:?}");
    let server = spans.iter().find(|s| s.kind == 2).expect("a server span");
    assert_eq!(hex(&server.parent_span_id), PARENT);
    assert_eq!(server.name, "GET api");
    assert_eq!(server.trace_state, "vendor=abc");
    assert_eq!(
        attr(server, "http.response.status_code"),
        Some(Any::IntValue(200))
    );
    assert_eq!(
        attr(server, "url.path"),
        Some(Any::StringValue("/v1/orders".into()))
    );
    assert_eq!(
        attr(server, "throttle.request_id"),
        Some(Any::StringValue(request_id))
    );
    let store = spans
        .iter()
        .find(|s| s.name == "throttle.store")
        .expect("a store span");
    let upstream = spans
        .iter()
        .find(|s| s.kind == 3)
        .expect("an upstream span");
    for child in [store, upstream] {
        assert_eq!(child.parent_span_id, server.span_id);
        assert!(child.start_time_unix_nano >= server.start_time_unix_nano);
        assert!(child.end_time_unix_nano <= server.end_time_unix_nano);
    }
    assert_eq!(hex(&upstream.span_id), parts[2]);
    assert_eq!(
        attr(store, "throttle.store"),
        Some(Any::StringValue("memory".into()))
    );
    assert_eq!(
        attr(upstream, "server.port"),
        Some(Any::IntValue(i64::from(up.addr.port())))
    );
    assert!(receiver.spans().iter().all(|(svc, _)| svc == "edge-gw"));

    // The key's second request in the minute: a 429, traced with its scope.
    let other = "0af7651916cd43dd8448eb211c80319c";
    let parent = format!("00-{other}-b7ad6b7169203331-01");
    let r = orders(&gw, &[("traceparent", &parent)]).await;
    assert_eq!(r.status(), 429);
    let spans = receiver.trace(other, 2).await;
    let server = spans.iter().find(|s| s.kind == 2).unwrap();
    assert_eq!(
        attr(server, "http.response.status_code"),
        Some(Any::IntValue(429))
    );
    assert_eq!(
        attr(server, "throttle.rejected.scope"),
        Some(Any::StringValue("key".into()))
    );
    assert!(spans.iter().any(|s| s.name == "throttle.store"));
    assert!(
        spans.iter().all(|s| s.kind != 3),
        "no upstream span for a 429"
    );
    eventually(Duration::from_secs(5), "exported spans counted", || async {
        let m = gw.metrics().await;
        m.lines()
            .any(|l| l.starts_with("throttle_trace_spans_total{outcome=\"exported\"} 5"))
            .then_some(())
    })
    .await;
}

/// From an untrusted peer, a `traceparent` is not continued: the request is a root of its
/// own trace, and the upstream is told that trace, never the client's; `tracestate` is
/// dropped.
#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_traceparent_starts_a_trace_of_its_own() {
    let receiver = Receiver::start().await;
    let up = Upstream::start("up").await;
    let tracing = format!("[tracing]\notlp_endpoint = \"http://{}\"", receiver.addr);
    let gw = Gateway::start(&config("[]", &tracing), Some(&up)).await;
    let parent = format!("00-{TRACE}-{PARENT}-01");
    let r = orders(
        &gw,
        &[("traceparent", &parent), ("tracestate", "vendor=abc")],
    )
    .await;
    let echo: Value = r.json().await.unwrap();
    let told = echo["headers"]["traceparent"].as_str().unwrap().to_string();
    assert!(!told.contains(TRACE), "{told}");
    assert!(echo["headers"]["tracestate"].is_null());
    let own = told.split('-').nth(1).unwrap().to_string();
    let spans = receiver.trace(&own, 3).await;
    let server = spans.iter().find(|s| s.kind == 2).unwrap();
    assert!(server.parent_span_id.is_empty(), "a root span");
    assert!(receiver
        .spans()
        .iter()
        .all(|(svc, s)| hex(&s.trace_id) != TRACE && svc == "throttle"));
}

/// With `[tracing]` off, the client's `traceparent` and `tracestate` reach the upstream as
/// they were sent, and no trace metric moves.
#[tokio::test(flavor = "multi_thread")]
async fn tracing_off_leaves_the_headers_alone() {
    let up = Upstream::start("up").await;
    let gw = Gateway::start(&config(r#"["127.0.0.1/32"]"#, ""), Some(&up)).await;
    let sent = format!("00-{TRACE}-{PARENT}-01");
    let r = orders(&gw, &[("traceparent", &sent), ("tracestate", "vendor=abc")]).await;
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["traceparent"], sent.as_str());
    assert_eq!(echo["headers"]["tracestate"], "vendor=abc");
    let m = gw.metrics().await;
    assert!(m
        .lines()
        .filter(|l| l.starts_with("throttle_trace_spans_total{"))
        .all(|l| l.ends_with(" 0")));
}

/// A collector that is down costs the spans (counted as failed), never the requests.
#[tokio::test(flavor = "multi_thread")]
async fn a_collector_down_fails_spans_not_requests() {
    let up = Upstream::start("up").await;
    let dead = crate::support::free_port();
    let tracing = format!("[tracing]\notlp_endpoint = \"http://127.0.0.1:{dead}\"");
    let gw = Gateway::start(&config("[]", &tracing), Some(&up)).await;
    let r = orders(&gw, &[]).await;
    assert_eq!(r.status(), 200);
    eventually(Duration::from_secs(10), "failed spans counted", || async {
        let m = gw.metrics().await;
        m.lines()
            .any(|l| l.starts_with("throttle_trace_spans_total{outcome=\"failed\"} 3"))
            .then_some(())
    })
    .await;
}
