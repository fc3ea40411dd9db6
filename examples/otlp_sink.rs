//! A minimal OTLP/gRPC trace receiver: counts the spans it is sent and prints the running
//! total every second. For trying `[tracing]` without a collector, and for
//! `benches/observability_cg.sh`, which measures a traced gateway against it.
//!
//! ```sh
//! cargo run --example otlp_sink -- 127.0.0.1:4317
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

#[derive(Clone, Default)]
struct Count(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Count {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = request
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.0.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4317".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let count = Count::default();
    let shown = count.0.clone();
    tokio::spawn(async move {
        let mut last = u64::MAX;
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let now = shown.load(Ordering::Relaxed);
            if now != last {
                eprintln!("spans: {now}");
                last = now;
            }
        }
    });
    eprintln!("otlp_sink listening on {addr}");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tonic::transport::Server::builder()
        .serve_with_incoming(TraceServiceServer::new(count), incoming)
        .await?;
    Ok(())
}
