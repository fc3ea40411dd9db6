//! An upstream that decodes request paths the usual way, to show what a path forwarded by
//! the gateway really means to the API behind it.
//!
//! nginx mode: percent-decode every escape (`%2F` included), merge slashes, resolve `.`
//! and `..`. Servlet mode (Tomcat, Jetty): first drop each segment's `;parameters`, then
//! the same. The answer is JSON: the upstream's label, the `Host` it saw and the path it
//! serves; a path that climbs above the root is a 400, as nginx answers.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// How the upstream decodes paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoding {
    /// nginx: decode, merge slashes, resolve dot segments.
    Nginx,
    /// A servlet container: strip `;params` per segment first.
    Servlet,
}

/// A decoding upstream on an ephemeral port, stopped on drop.
pub struct DecodingUpstream {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl DecodingUpstream {
    pub async fn start(label: &'static str, decoding: Decoding) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut rx => return,
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        tokio::spawn(async move {
                            let svc = service_fn(move |req| answer(req, label, decoding));
                            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                        });
                    }
                }
            }
        });
        Self {
            addr,
            stop: Some(tx),
        }
    }
}

impl Drop for DecodingUpstream {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    label: &'static str,
    decoding: Decoding,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let host = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    let (status, body) = match decode(req.uri().path(), decoding) {
        Some(served) => (
            200,
            serde_json::json!({"upstream": label, "host": host, "served": served}),
        ),
        None => (
            400,
            serde_json::json!({"upstream": label, "error": "bad path"}),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
    Ok(resp)
}

/// The path an upstream of this kind serves for `raw`; None when it climbs above `/`.
pub fn decode(raw: &str, decoding: Decoding) -> Option<String> {
    let raw = match decoding {
        Decoding::Nginx => raw.to_string(),
        Decoding::Servlet => raw
            .split('/')
            .map(|seg| seg.split(';').next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("/"),
    };
    let decoded = percent_decode(&raw);
    let mut out: Vec<&str> = Vec::new();
    let trailing = decoded.ends_with('/');
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            s => out.push(s),
        }
    }
    let mut path = format!("/{}", out.join("/"));
    if trailing && path.len() > 1 {
        path.push('/');
    }
    Some(path)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The route a request for `served` on `host` belongs to, by the tests' route table:
/// `internal.example.com` -> internal; else the longest of /v1/search, /v1, /public; else root.
pub fn route_of(host: &str, served: &str) -> &'static str {
    let host = host.split(':').next().unwrap_or("").trim_end_matches('.');
    if host.eq_ignore_ascii_case("internal.example.com") {
        return "internal";
    }
    let under = |p: &str| served == p || served.starts_with(&format!("{p}/"));
    if under("/v1/search") {
        "search"
    } else if under("/v1") {
        "v1"
    } else if under("/public") {
        "public"
    } else {
        "root"
    }
}
