//! A traced request's OTLP spans: the server span, then the store call's and the
//! upstream call's, named and attributed by OpenTelemetry's HTTP conventions.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span, status, Span, Status};

use super::{cap, nonzero_span, Finished, MAX_PATH};

impl Finished {
    pub(super) fn span_count(&self) -> u64 {
        1 + u64::from(self.store.is_some()) + u64::from(self.upstream.is_some())
    }

    /// The request's spans: the server span, then the store's and the upstream's.
    pub fn spans(&self) -> Vec<Span> {
        let mut spans = vec![self.server_span()];
        spans.extend(self.store_span());
        spans.extend(self.upstream_span());
        spans
    }

    /// The request as the gateway served it.
    fn server_span(&self) -> Span {
        let t = &self.trace;
        let failed = self.status >= 500 || self.status == 0 && self.error.is_some();
        let name = match (&self.route, self.method) {
            (Some(r), "_OTHER") => format!("HTTP {r}"),
            (Some(r), m) => format!("{m} {r}"),
            (None, "_OTHER") => "HTTP".to_string(),
            (None, m) => m.to_string(),
        };
        Span {
            trace_id: t.trace_id.to_vec(),
            span_id: t.span_id.to_vec(),
            parent_span_id: t.parent.map(|p| p.to_vec()).unwrap_or_default(),
            trace_state: t
                .tracestate
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            flags: 1,
            name,
            kind: span::SpanKind::Server as i32,
            start_time_unix_nano: t.started_unix_ns,
            end_time_unix_nano: t.unix_ns(self.ended),
            attributes: self.server_attributes(),
            status: Some(outcome(failed, self.error.as_deref())),
            ..Span::default()
        }
    }

    fn server_attributes(&self) -> Vec<KeyValue> {
        let mut attrs = vec![
            kv("http.request.method", self.method),
            kv("url.path", cap(&self.path, MAX_PATH)),
            kv_int("http.response.status_code", i64::from(self.status)),
        ];
        if let Some(m) = &self.method_original {
            attrs.push(kv("http.request.method_original", m));
        }
        if let Some(ip) = self.client_ip {
            attrs.push(kv("client.address", &ip.to_string()));
        }
        if let Some(route) = &self.route {
            attrs.push(kv("throttle.route", route));
        }
        if let Some(id) = self.request_id.as_ref().and_then(|v| v.to_str().ok()) {
            attrs.push(kv("throttle.request_id", id));
        }
        if let Some((scope, window)) = self.rejected {
            attrs.push(kv("throttle.rejected.scope", scope));
            attrs.push(kv("throttle.rejected.window", window));
        }
        attrs
    }

    /// The store call, a child of the server span.
    fn store_span(&self) -> Option<Span> {
        let (at, took, store) = self.store?;
        let t = &self.trace;
        let from = t.unix_ns(at);
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        Some(Span {
            trace_id: t.trace_id.to_vec(),
            span_id: nonzero_span().to_vec(),
            parent_span_id: t.span_id.to_vec(),
            flags: 1,
            name: "throttle.store".to_string(),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: from,
            end_time_unix_nano: from.saturating_add(took),
            attributes: vec![kv("throttle.store", store)],
            ..Span::default()
        })
    }

    /// The upstream call, a child of the server span with the id the upstream was told.
    fn upstream_span(&self) -> Option<Span> {
        let up = self.upstream.as_ref()?;
        let t = &self.trace;
        let mut attrs = Vec::new();
        if let Some(addr) = up.addr {
            attrs.push(kv("server.address", &addr.ip().to_string()));
            attrs.push(kv_int("server.port", i64::from(addr.port())));
        }
        if let Some(s) = up.status {
            attrs.push(kv_int("http.response.status_code", i64::from(s)));
        }
        let failed = up.status.is_none_or(|s| s >= 500);
        Some(Span {
            trace_id: t.trace_id.to_vec(),
            span_id: t.upstream_span_id.to_vec(),
            parent_span_id: t.span_id.to_vec(),
            flags: 1,
            name: if self.method == "_OTHER" {
                "HTTP".to_string()
            } else {
                self.method.to_string()
            },
            kind: span::SpanKind::Client as i32,
            start_time_unix_nano: t.unix_ns(up.started),
            end_time_unix_nano: t.unix_ns(self.ended),
            attributes: attrs,
            status: Some(outcome(failed, self.error.as_deref())),
            ..Span::default()
        })
    }
}

fn outcome(failed: bool, error: Option<&str>) -> Status {
    if failed {
        Status {
            code: status::StatusCode::Error as i32,
            message: error.unwrap_or("").to_string(),
        }
    } else {
        Status::default()
    }
}

pub(super) fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..KeyValue::default()
    }
}

fn kv_int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..KeyValue::default()
    }
}
