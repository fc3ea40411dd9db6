//! The exporter thread: requests' spans batched (up to `BATCH` requests or
//! `EXPORT_EVERY`) and sent to the collector over OTLP/gRPC, each call within
//! `EXPORT_TIMEOUT`, counted in `SpanCounts`.

use std::sync::mpsc::{Receiver, RecvTimeoutError};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

use super::spans::kv;
use super::{Finished, SpanCounts, BATCH, EXPORT_EVERY, EXPORT_TIMEOUT};
use crate::config::Tracing;

/// The exporter thread's state: its runtime, the collector's client, the resource.
pub(super) struct Exporter {
    runtime: tokio::runtime::Runtime,
    client: TraceServiceClient<tonic::transport::Channel>,
    resource: Resource,
    counts: SpanCounts,
}

impl Exporter {
    pub(super) fn new(config: &Tracing, counts: SpanCounts) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let endpoint = tonic::transport::Endpoint::from_shared(config.endpoint.clone())
            .map_err(std::io::Error::other)?
            .connect_timeout(EXPORT_TIMEOUT)
            .timeout(EXPORT_TIMEOUT);
        // The channel connects on first use (and again after a failure), on this runtime.
        let channel = {
            let _entered = runtime.enter();
            endpoint.connect_lazy()
        };
        Ok(Self {
            runtime,
            client: TraceServiceClient::new(channel),
            resource: Resource {
                attributes: vec![kv("service.name", &config.service_name)],
                ..Resource::default()
            },
            counts,
        })
    }

    /// Batches and exports until the gateway goes away. A thread of its own, outside
    /// any runtime: its waits are the std channel's, on std's clock.
    #[allow(clippy::disallowed_methods)]
    pub(super) fn run(mut self, rx: &Receiver<Finished>) {
        let mut batch = Vec::with_capacity(BATCH);
        while let Ok(first) = rx.recv() {
            batch.push(first);
            let until = std::time::Instant::now() + EXPORT_EVERY;
            let mut gone = false;
            while batch.len() < BATCH {
                let left = until.saturating_duration_since(std::time::Instant::now());
                match rx.recv_timeout(left) {
                    Ok(f) => batch.push(f),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => {
                        gone = true;
                        break;
                    }
                }
            }
            self.export(&mut batch);
            if gone {
                return;
            }
        }
    }

    /// One export call for `batch` (emptied), within `EXPORT_TIMEOUT`.
    fn export(&mut self, batch: &mut Vec<Finished>) {
        let spans: Vec<Span> = batch.drain(..).flat_map(|f| f.spans()).collect();
        let n = spans.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "throttle".to_string(),
                        version: env!("CARGO_PKG_VERSION").to_string(),
                        ..InstrumentationScope::default()
                    }),
                    spans,
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        };
        let client = &mut self.client;
        // The timer is made inside the runtime (it needs one to exist).
        let sent = self
            .runtime
            .block_on(async { tokio::time::timeout(EXPORT_TIMEOUT, client.export(request)).await });
        match sent {
            Ok(Ok(reply)) => {
                let refused = reply
                    .into_inner()
                    .partial_success
                    .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0))
                    .min(n);
                self.counts.exported.inc_by(n - refused);
                self.counts.failed.inc_by(refused);
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "trace export failed");
                self.counts.failed.inc_by(n);
            }
            Err(_) => {
                tracing::debug!("trace export timed out");
                self.counts.failed.inc_by(n);
            }
        }
    }
}
