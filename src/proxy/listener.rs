//! The proxy listener's connection layer, in front of Pingora's HTTP/1 request loop.
//!
//! Pingora times out each read of a request on its own (60 s), so a client that drips one
//! header byte every few seconds, or holds an idle keep-alive connection, is never cut
//! off, and a flood of such connections exhausts the process's files until even the
//! admin listener cannot accept. This layer adds what an edge needs:
//! - a deadline for a request's headers (`header_timeout_secs`), counted from the first
//!   byte of the request, or from accept for a new connection;
//! - a keep-alive idle timeout (`idle_timeout_secs`) between requests;
//! - caps on open connections, in total (`max_connections`, by default sized from the
//!   open-file limit) and per client (`max_connections_per_ip`, by default max(16,
//!   max_connections / 16), counted per IPv4 address or IPv6 /64; a trusted proxy's
//!   connections are not capped), answered with `503 {"error":"too_many_connections"}`
//!   and a close, and counted in `throttle_connections_refused_total{listener="proxy"}`.
//!
//! `Capped` puts the admin API behind its own caps (64 connections, 8 per client) and a
//! probe reserve (`PROBE_SLOTS`): a connection over the caps may still ask `GET /healthz`
//! or `GET /readyz` once, so whoever holds the other slots, the probes are answered.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::http_app::ServeHttp;
use pingora::apps::{HttpServerApp, HttpServerOptions, ServerApp};
use pingora::http::ResponseHeader;
use pingora::listeners::tls::Acceptor;
use pingora::protocols::http::v2::server::{self as v2, H2Accept};
use pingora::protocols::http::ServerSession;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Digest;
use pingora::protocols::{Shutdown, Stream, ALPN};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::AsyncWriteExt;

use super::Gateway;
use crate::admission::Core;
use crate::lifecycle::{self, Lifecycle, Refused, PROBE_HEAD_TIMEOUT};
use crate::listener::{stream_peer, Guarded};

/// The proxy listener's app: connection caps and deadlines around Pingora's HTTP proxy.
pub struct ProxyListener {
    proxy: Arc<HttpProxy<Gateway>>,
    core: Arc<Core>,
    lifecycle: Arc<Lifecycle>,
    max_connections: usize,
    /// The TLS acceptor when the listener serves TLS: the handshake runs here, after the
    /// connection has taken its slot and under `header_timeout_secs`.
    tls: Option<Acceptor>,
}

/// How long answering a refused connection may take (TLS handshake included).
const REFUSE_WITHIN: Duration = Duration::from_secs(1);

// === impl ProxyListener ===

impl ProxyListener {
    /// The listener over `proxy`; `max_connections`, `tls` and the HTTP/2 idle timeout are
    /// fixed at start, the other timeouts and the per-address cap follow config reloads.
    pub fn new(
        mut proxy: HttpProxy<Gateway>,
        core: Arc<Core>,
        lifecycle: Arc<Lifecycle>,
        max_connections: usize,
        tls: Option<Acceptor>,
    ) -> Self {
        let mut options = HttpServerOptions::default();
        options.h2_idle_timeout = Some(core.runtime().config.server.idle_timeout);
        proxy.server_options = Some(options);
        Self {
            proxy: Arc::new(proxy),
            core,
            lifecycle,
            max_connections,
            tls,
        }
    }

    /// Answers a connection refused by a cap in its own protocol: a TLS handshake
    /// first when the listener serves TLS, then a 503 as HTTP/1.1 text or on the first
    /// HTTP/2 stream. At most `MAX_REFUSING` refusals are answered at once, each within
    /// `REFUSE_WITHIN`; beyond that the connection is just closed.
    async fn refuse(&self, stream: Stream, why: Refused) {
        tracing::debug!(?why, "connection refused: cap reached");
        self.core.metrics.connection_refused("proxy", why.as_str());
        let Some(_permit) = self.lifecycle.refusing() else {
            return;
        };
        let answer = async {
            let stream = match &self.tls {
                Some(acceptor) => tls_accept(acceptor, stream, REFUSE_WITHIN).await,
                None => Some(stream),
            };
            let Some(mut stream) = stream else { return };
            if stream.selected_alpn_proto() == Some(ALPN::H2) {
                refuse_h2(stream).await;
            } else {
                refuse_h1(&mut stream).await;
            }
        };
        let _ = tokio::time::timeout(REFUSE_WITHIN, answer).await;
    }
}

/// Turns of the connections that keep the worker busy (see `serve_http1`), one per stripe
/// of client addresses (keyed per process, so a client cannot aim at another's stripe).
static TURNS: [tokio::sync::Mutex<()>; 256] = [const { tokio::sync::Mutex::const_new(()) }; 256];

/// The turn of `peer`'s busy connections: an IPv4 address or an IPv6 /64 is one client,
/// as the connection caps count them.
fn turn_of(peer: IpAddr) -> &'static tokio::sync::Mutex<()> {
    use std::hash::BuildHasher;
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let keys = KEYS.get_or_init(Default::default);
    let at = keys.hash_one(lifecycle::conn_key(peer)) as usize % TURNS.len();
    &TURNS[at]
}

/// Runs Pingora's HTTP/1 request loop of `app` on a guarded stream, re-arming the
/// header deadline before every request and applying the idle timeout between requests.
/// The guard enforces the idle timeout; Pingora is asked to keep the connection alive
/// without a timer of its own (`Some(0)`, "infinite"), which would wrap every read of a
/// request head in a second timer.
pub(crate) async fn serve_http1<A>(
    app: &Arc<A>,
    stream: Guarded,
    idle_secs: u64,
    shutdown: &ShutdownWatch,
    turn: Option<&'static tokio::sync::Mutex<()>>,
) where
    A: HttpServerApp + Send + Sync + 'static,
{
    let keepalive = |shutdown: &ShutdownWatch| (!*shutdown.borrow()).then_some(0);
    let stream = stream.idle_after_requests(Duration::from_secs(idle_secs));
    let mut session = ServerSession::new_http1(Box::new(stream));
    session.set_keepalive(keepalive(shutdown));
    // HTTP/1.1 pipelining (RFC 9112 §9.3.2): requests sent before the previous answer
    // are served one after another, answered in order. Without it Pingora closes the
    // connection after the first answer and drops what followed unanswered. The
    // setting travels with the connection to each next session.
    session.set_pipelining_enabled(true);
    let mut result = app.process_new_http(session, shutdown).await;
    let mut waits = None;
    while let Some((stream, settings)) = result.map(|r| r.consume()) {
        let now = stream.as_any().downcast_ref::<Guarded>().map(|g| {
            g.await_next_request();
            g.waits()
        });
        let guarded = now.is_some();
        // One request per turn when the client keeps the connection busy: a request
        // served without waiting for a byte (pipelined, or a flood's next request already
        // buffered) gives the worker to the other connections before the next one, which
        // would otherwise wait until the runtime's budget for this task runs out (a
        // flood's 64 connections x 128 requests each ahead of one polite request). The
        // busy connections of one address queue for one turn (`turn`), so an address
        // takes one turn between everyone else's however many connections it opens.
        // A client that sends one request at a time waits for its next one anyway.
        if now.is_some() && now == waits {
            let _turn = match turn {
                Some(t) => Some(t.lock().await),
                None => None,
            };
            tokio::task::yield_now().await;
        }
        waits = now;
        let mut session = ServerSession::new_http1(stream);
        if let Some(s) = settings {
            s.apply_to_session(&mut session);
        }
        // A stream that is not the guard (never, today) keeps Pingora's idle timer.
        let idle = if guarded { 0 } else { idle_secs };
        session.set_keepalive((!*shutdown.borrow()).then_some(idle));
        result = app.process_new_http(session, shutdown).await;
    }
}

#[async_trait]
impl ServerApp for ProxyListener {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let rt = self.core.runtime();
        let server = &rt.config.server;
        let (header_timeout, idle_timeout) = (server.header_timeout, server.idle_timeout);
        let body_timeout = server.body_timeout;
        let peer = stream_peer(&stream);
        // A trusted proxy's connections carry many clients: not capped per address.
        let trusted = rt.resolver.is_trusted(peer);
        let per_ip = Some(server.max_connections_per_ip)
            .filter(|_| !trusted)
            .map(|n| n.unwrap_or_else(|| lifecycle::default_per_ip(self.max_connections)));
        let turn = (!trusted).then(|| turn_of(peer));
        // The connection may outlive a reload. The slot is taken before the TLS
        // handshake: a half-open handshake counts.
        drop(rt);
        let slot = match self.lifecycle.open(peer, self.max_connections, per_ip) {
            Ok(slot) => slot,
            Err(why) => {
                self.refuse(stream, why).await;
                return None;
            }
        };
        let stream = match &self.tls {
            Some(acceptor) => tls_accept(acceptor, stream, header_timeout).await?,
            None => stream,
        };
        if stream.selected_alpn_proto() == Some(ALPN::H2) {
            // HTTP/2 over TLS: Pingora's stream loop, which closes the connection once
            // no stream has been open for `idle_timeout_secs`; the guard bounds the
            // preface and every header block by `header_timeout_secs`.
            let guarded = Guarded::http2(stream, header_timeout, body_timeout, None, slot);
            return self.proxy.process_new(Box::new(guarded), shutdown).await;
        }
        let guarded = Guarded::new(stream, header_timeout, slot);
        serve_http1(
            &self.proxy,
            guarded,
            idle_timeout.as_secs().max(1),
            shutdown,
            turn,
        )
        .await;
        None
    }

    async fn cleanup(&self) {
        self.proxy.http_cleanup().await;
    }
}

/// An HTTP/1 app (the admin API) behind its own connection caps (in total, and per client:
/// `admin_max_connections_per_ip`) and the proxy's header and idle deadlines, so that its
/// connections cannot starve the proxy's, nor the proxy's its own. A connection over a
/// cap takes a slot of the probe reserve when one is free (`PROBE_SLOTS`, one per
/// client): it may ask `GET /healthz` or `GET /readyz` once, within `PROBE_HEAD_TIMEOUT`;
/// anything else is answered 503 `too_many_connections`.
pub struct Capped<A> {
    app: Arc<A>,
    core: Arc<Core>,
    lifecycle: Arc<Lifecycle>,
    probes: Arc<Lifecycle>,
    max_connections: usize,
}

impl<A> Capped<A> {
    /// `app` with at most `max_connections` connections open, counted in `lifecycle`.
    pub fn new(app: A, core: Arc<Core>, lifecycle: Arc<Lifecycle>, max_connections: usize) -> Self {
        Self {
            app: Arc::new(app),
            core,
            lifecycle,
            probes: Arc::new(Lifecycle::default()),
            max_connections,
        }
    }
}

impl<A: ServeHttp + Send + Sync + 'static> Capped<A> {
    /// Serves a connection refused by a cap (`why`) from the probe reserve: one probe
    /// answered, anything else (or nothing within `PROBE_HEAD_TIMEOUT`) refused.
    async fn probe_only(&self, mut stream: Stream, peer: IpAddr, why: Refused) {
        let reserve = self.probes.open(
            peer,
            lifecycle::PROBE_SLOTS,
            Some(lifecycle::PROBE_SLOTS_PER_IP),
        );
        let Ok(slot) = reserve else {
            tracing::debug!(?why, "admin connection refused: cap and probe reserve full");
            self.core.metrics.connection_refused("admin", why.as_str());
            if let Some(_permit) = self.lifecycle.refusing() {
                refuse_h1(&mut stream).await;
            }
            return;
        };
        let guarded = Guarded::new(stream, PROBE_HEAD_TIMEOUT, slot);
        let mut session = ServerSession::new_http1(Box::new(guarded));
        let read = tokio::time::timeout(PROBE_HEAD_TIMEOUT, session.read_request()).await;
        if !matches!(read, Ok(Ok(true))) {
            // No head in time (the header is only there after a successful read).
            self.core.metrics.connection_refused("admin", why.as_str());
            return;
        }
        let head = session.req_header();
        let probe =
            head.method == http::Method::GET && matches!(head.uri.path(), "/healthz" | "/readyz");
        if !probe {
            self.core.metrics.connection_refused("admin", why.as_str());
        }
        session.set_keepalive(None);
        let response = if probe {
            self.app.response(&mut session).await
        } else {
            refused_response()
        };
        let _ = tokio::time::timeout(PROBE_HEAD_TIMEOUT, answer(session, response)).await;
    }
}

#[async_trait]
impl<A> ServerApp for Capped<A>
where
    A: ServeHttp + Send + Sync + 'static,
{
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let rt = self.core.runtime();
        let s = &rt.config.server;
        let (header_timeout, idle) = (s.header_timeout, s.idle_timeout);
        let per_ip = s.admin_max_connections_per_ip;
        drop(rt);
        let peer = stream_peer(&stream);
        let slot = match self
            .lifecycle
            .open(peer, self.max_connections, Some(per_ip))
        {
            Ok(slot) => slot,
            Err(why) => {
                self.probe_only(stream, peer, why).await;
                return None;
            }
        };
        let guarded = Guarded::new(stream, header_timeout, slot);
        serve_http1(&self.app, guarded, idle.as_secs().max(1), shutdown, None).await;
        None
    }

    async fn cleanup(&self) {
        self.app.http_cleanup().await;
    }
}

/// Writes `response` on `session` with `connection: close` and ends it.
async fn answer(mut session: ServerSession, response: http::Response<Vec<u8>>) {
    let (parts, body) = response.into_parts();
    let mut head: ResponseHeader = parts.into();
    let _ = head.insert_header("connection", "close");
    if session.write_response_header(Box::new(head)).await.is_err() {
        return;
    }
    let _ = session.write_response_body(body.into(), true).await;
    let _ = session.finish().await;
}

/// The 503 `too_many_connections` answer as an HTTP response.
fn refused_response() -> http::Response<Vec<u8>> {
    http::Response::builder()
        .status(503)
        .header("content-type", "application/json")
        .header("content-length", REFUSED_BODY.len())
        .header(
            crate::reply::headers::RETRY_AFTER,
            crate::reply::headers::RETRY_SOON,
        )
        .body(REFUSED_BODY.as_bytes().to_vec())
        .unwrap_or_else(|_| http::Response::new(Vec::new()))
}

/// The TLS handshake of a plain TCP stream, within `within`; None (the connection is
/// closed) when it fails or is late.
async fn tls_accept(acceptor: &Acceptor, stream: Stream, within: Duration) -> Option<Stream> {
    let l4 = match stream.into_any().downcast::<L4Stream>() {
        Ok(l4) => *l4,
        Err(_) => {
            tracing::warn!("TLS listener got a stream that is not TCP");
            return None;
        }
    };
    match tokio::time::timeout(within, acceptor.tls_handshake(l4)).await {
        Ok(Ok(tls)) => Some(Box::new(tls)),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake not complete within header_timeout_secs");
            None
        }
    }
}

const REFUSED_BODY: &str = r#"{"error":"too_many_connections"}"#;

/// Answers a refused HTTP/1 connection with a 503 and closes it (best effort, bounded).
async fn refuse_h1(stream: &mut Stream) {
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{REFUSED_BODY}",
        REFUSED_BODY.len()
    );
    let write = async {
        stream.write_all(reply.as_bytes()).await?;
        stream.flush().await
    };
    let _ = tokio::time::timeout(Duration::from_millis(50), write).await;
    Shutdown::shutdown(&mut **stream).await;
}

/// Answers a refused HTTP/2 connection in HTTP/2: a 503 on its first stream, then a
/// GOAWAY (the caller bounds the time).
async fn refuse_h2(stream: Stream) {
    let digest = Arc::new(Digest {
        ssl_digest: stream.get_ssl_digest(),
        socket_digest: stream.get_socket_digest(),
        ..Digest::default()
    });
    let Ok(mut conn) = v2::handshake(stream, None).await else {
        return;
    };
    if let Ok(Some(H2Accept::Session(mut s))) =
        v2::HttpSession::from_h2_conn(&mut conn, digest).await
    {
        if let Ok(mut head) = ResponseHeader::build(503, Some(3)) {
            let _ = head.insert_header("content-type", "application/json");
            let _ = head.insert_header("content-length", REFUSED_BODY.len());
            let _ = head.insert_header(
                crate::reply::headers::RETRY_AFTER,
                crate::reply::headers::RETRY_SOON,
            );
            if s.write_response_header(Box::new(head), false).is_ok() {
                let _ = s
                    .write_body(bytes::Bytes::from_static(REFUSED_BODY.as_bytes()), true)
                    .await;
            }
        }
        let _ = s.finish();
    }
    conn.graceful_shutdown();
    while let Some(Ok(_)) = conn.accept().await {}
}
