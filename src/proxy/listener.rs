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
//!   open-file limit) and per peer address (`max_connections_per_ip`), answered with
//!   `503 {"error":"too_many_connections"}` and a close.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::Gateway;
use crate::admission::Core;
use crate::lifecycle::{ConnSlot, Lifecycle, Refused};

/// The proxy listener's app: connection caps and deadlines around Pingora's HTTP proxy.
pub struct Edge {
    proxy: Arc<HttpProxy<Gateway>>,
    core: Arc<Core>,
    lifecycle: Arc<Lifecycle>,
    max_connections: usize,
}

// === impl Edge ===

impl Edge {
    /// The edge over `proxy`; `max_connections` is fixed at start, the timeouts and the
    /// per-address cap follow config reloads.
    pub fn new(
        proxy: HttpProxy<Gateway>,
        core: Arc<Core>,
        lifecycle: Arc<Lifecycle>,
        max_connections: usize,
    ) -> Self {
        Self {
            proxy: Arc::new(proxy),
            core,
            lifecycle,
            max_connections,
        }
    }

    /// Runs Pingora's HTTP/1 request loop on a guarded stream, re-arming the header
    /// deadline before every request and applying the idle timeout between requests.
    async fn serve_http1(&self, stream: Guarded, idle_secs: u64, shutdown: &ShutdownWatch) {
        let keepalive = |shutdown: &ShutdownWatch| (!*shutdown.borrow()).then_some(idle_secs);
        let mut session = ServerSession::new_http1(Box::new(stream));
        session.set_keepalive(keepalive(shutdown));
        let mut result = self.proxy.process_new_http(session, shutdown).await;
        while let Some((stream, settings)) = result.map(|r| r.consume()) {
            if let Some(g) = stream.as_any().downcast_ref::<Guarded>() {
                g.await_next_request();
            }
            let mut session = ServerSession::new_http1(stream);
            if let Some(s) = settings {
                s.apply_to_session(&mut session);
            }
            session.set_keepalive(keepalive(shutdown));
            result = self.proxy.process_new_http(session, shutdown).await;
        }
    }
}

#[async_trait]
impl ServerApp for Edge {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let rt = self.core.runtime();
        let server = &rt.config.server;
        let peer = peer_ip(&stream);
        let slot =
            match self
                .lifecycle
                .open(peer, self.max_connections, server.max_connections_per_ip)
            {
                Ok(slot) => slot,
                Err(why) => {
                    refuse(&mut stream, why).await;
                    return None;
                }
            };
        if stream.selected_alpn_proto() == Some(ALPN::H2) {
            // HTTP/2 over TLS: Pingora's own stream loop (h2 has its own idle timeout).
            let _slot = slot;
            return self.proxy.process_new(stream, shutdown).await;
        }
        let guarded = Guarded::new(stream, server.header_timeout, slot);
        let idle_secs = server.idle_timeout.as_secs().max(1);
        drop(rt); // the connection may outlive a reload
        self.serve_http1(guarded, idle_secs, shutdown).await;
        None
    }

    async fn cleanup(&self) {
        self.proxy.http_cleanup().await;
    }
}

fn peer_ip(stream: &Stream) -> IpAddr {
    stream
        .get_socket_digest()
        .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()))
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |ip| ip.to_canonical())
}

/// Answers a refused connection with a 503 and closes it (best effort, bounded).
async fn refuse(stream: &mut Stream, why: Refused) {
    tracing::debug!(?why, "connection refused: cap reached");
    let body = r#"{"error":"too_many_connections"}"#;
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(reply.as_bytes()).await?;
        stream.flush().await
    };
    let _ = tokio::time::timeout(Duration::from_millis(50), write).await;
    Shutdown::shutdown(&mut **stream).await;
}

/// Where a connection is in its request cycle, as far as reading goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading a request's headers: the deadline applies.
    Headers,
    /// Headers complete (body or response under way): no deadline from this layer.
    Past,
    /// Between requests: the next byte read starts a request (and its deadline).
    Idle,
}

/// A client stream with a deadline on reading each request's headers.
#[derive(Debug)]
pub struct Guarded {
    inner: Stream,
    phase: Phase,
    /// Set by the request loop when a request is done; read by the next `poll_read`.
    next_request: AtomicBool,
    header_timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    end: HeaderEnd,
    _slot: ConnSlot,
}

// === impl Guarded ===

impl Guarded {
    fn new(inner: Stream, header_timeout: Duration, slot: ConnSlot) -> Self {
        Self {
            inner,
            phase: Phase::Headers,
            next_request: AtomicBool::new(false),
            header_timeout,
            deadline: Box::pin(tokio::time::sleep(header_timeout)),
            end: HeaderEnd::default(),
            _slot: slot,
        }
    }

    /// The previous request is done: the next byte read starts a new one.
    fn await_next_request(&self) {
        self.next_request.store(true, Ordering::Relaxed);
    }

    /// Tracks the request cycle through the bytes just read.
    fn saw(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if self.next_request.swap(false, Ordering::Relaxed) || self.phase == Phase::Idle {
            self.phase = Phase::Headers;
            self.end = HeaderEnd::default();
            let at = Instant::now() + self.header_timeout;
            self.deadline.as_mut().reset(at);
        }
        if self.phase == Phase::Headers && self.end.feed(bytes) {
            self.phase = Phase::Past;
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.next_request.load(Ordering::Relaxed) {
            this.phase = Phase::Idle;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let filled = buf.filled();
                let new = filled.get(before..).unwrap_or_default();
                this.saw(new);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if this.phase == Phase::Headers && this.deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "request headers not complete within header_timeout_secs",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for Guarded {
    async fn shutdown(&mut self) {
        Shutdown::shutdown(&mut *self.inner).await;
    }
}

impl UniqueID for Guarded {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Guarded {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for Guarded {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
}

impl GetProxyDigest for Guarded {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for Guarded {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for Guarded {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

/// Finds the end of a request head: an empty line, `\r\n\r\n` or a bare `\n\n` (which
/// HTTP/1 parsers accept), across reads.
#[derive(Debug, Default, Clone, Copy)]
struct HeaderEnd {
    /// 0: inside a line; 1: just after `\n`; 2: after `\n\r`.
    state: u8,
}

// === impl HeaderEnd ===

impl HeaderEnd {
    /// Feeds bytes; true once the head is complete. Jumps from line feed to line feed
    /// (memchr), so a read costs about one step per header line, not per byte.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.state == 0 {
                match memchr::memchr(b'\n', rest) {
                    Some(i) => {
                        self.state = 1;
                        rest = &rest[i + 1..];
                    }
                    None => return false,
                }
                continue;
            }
            self.state = match (self.state, rest[0]) {
                (1 | 2, b'\n') => return true,
                (1, b'\r') => 2,
                _ => 0,
            };
            if self.state == 0 {
                continue; // re-examine this byte as the start of a line
            }
            rest = &rest[1..];
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head ends at the first empty line, whatever the split across reads.
    #[test]
    fn finds_the_end_of_a_head_across_reads() {
        let cases: [(&[&[u8]], bool); 7] = [
            (&[b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"], true),
            (&[b"GET / HTTP/1.1\r\nHost: a\r\n"], false),
            (&[b"GET / HTTP/1.1\r\n", b"Host: a\r", b"\n\r", b"\n"], true),
            (&[b"GET / HTTP/1.1\nHost: a\n\n"], true),
            (&[b"GET / HTTP/1.1\r\nX: \r\r\n"], false),
            (&[b"\r\n", b"\r\n"], true),
            (&[b"GET / HTTP/1.1\r\nHost: a\r\nB: c\r\n"], false),
        ];
        for (i, (reads, want)) in cases.into_iter().enumerate() {
            let mut end = HeaderEnd::default();
            let got = reads.iter().any(|r| end.feed(r));
            assert_eq!(got, want, "case {i}");
        }
    }
}
