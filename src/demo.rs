//! A tiny echo upstream for `throttle demo` and the tests: every request gets 200 and a
//! JSON body with the method, path and the headers the upstream received, so one can
//! see exactly what the gateway forwarded. `?delay_ms=N` makes it answer N ms late (at
//! most 60 s); `?status=N` makes it answer with status N (any code `http` accepts,
//! 100..=999; e.g. 503 for a failing upstream);
//! `?usage=N` makes it report `X-Usage-Tokens: N` (one line per `usage=`), like an LLM
//! API reporting the tokens a request used (a route's `cost_header`).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::net::TcpListener;

/// The echo upstream as a Pingora background service (for `throttle demo`).
pub struct DemoUpstream {
    listener: Mutex<Option<std::net::TcpListener>>,
}

// === impl DemoUpstream ===

impl DemoUpstream {
    /// Serves on an already bound listener (so its address is known before start).
    pub fn new(listener: std::net::TcpListener) -> Self {
        Self {
            listener: Mutex::new(Some(listener)),
        }
    }
}

#[async_trait]
impl BackgroundService for DemoUpstream {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let taken = self.listener.lock().ok().and_then(|mut l| l.take());
        let Some(std_listener) = taken else { return };
        let listener = match std_listener
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(std_listener))
        {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "demo upstream cannot listen");
                return;
            }
        };
        serve(listener, "throttle-demo", async move {
            let _ = shutdown.changed().await;
        })
        .await;
    }
}

/// Serves the echo app on `listener` until `shutdown` completes; `label` is echoed back
/// as `"upstream"` so tests can tell several upstreams apart.
pub async fn serve(listener: TcpListener, label: &'static str, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                tokio::spawn(async move {
                    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(move |req| echo(req, label)));
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "demo upstream connection");
                    }
                });
            }
        }
    }
}

/// The longest `delay_ms` honoured.
const MAX_DELAY_MS: u64 = 60_000;

/// `delay_ms=N` in the query: how long to wait before answering (slow upstreams in tests
/// and in the demo).
fn delay(query: Option<&str>) -> Option<std::time::Duration> {
    let ms = query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("delay_ms="))?
        .parse::<u64>()
        .ok()?;
    Some(std::time::Duration::from_millis(ms.min(MAX_DELAY_MS)))
}

async fn echo(
    req: Request<hyper::body::Incoming>,
    label: &'static str,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if let Some(d) = delay(req.uri().query()) {
        tokio::time::sleep(d).await;
    }
    let mut headers = serde_json::Map::new();
    for name in req.headers().keys() {
        let values: Vec<&str> = req
            .headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap_or("<binary>"))
            .collect();
        headers.insert(
            name.as_str().to_string(),
            serde_json::Value::from(values.join(", ")),
        );
    }
    let body = serde_json::json!({
        "upstream": label,
        "method": req.method().as_str(),
        "path": req.uri().path(),
        "query": req.uri().query(),
        "headers": headers,
    });
    let body = serde_json::to_vec_pretty(&body).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    // Each `usage=` adds one `X-Usage-Tokens` line (a repeated header in tests).
    let usages = req.uri().query().into_iter().flat_map(|q| q.split('&'));
    for v in usages.filter_map(|kv| kv.strip_prefix("usage=")) {
        if let Ok(v) = http::HeaderValue::from_str(v) {
            resp.headers_mut().append("x-usage-tokens", v);
        }
    }
    if let Some(code) = status(req.uri().query()) {
        *resp.status_mut() = code;
    }
    Ok(resp)
}

/// `status=N` in the query: the status to answer with (a failing upstream in tests and
/// in the demo).
fn status(query: Option<&str>) -> Option<http::StatusCode> {
    let code = query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("status="))?
        .parse::<u16>()
        .ok()?;
    http::StatusCode::from_u16(code).ok()
}
