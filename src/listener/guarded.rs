//! The connection guard both listeners read through (the proxy's HTTP/1 and HTTP/2, the
//! Envoy rate-limit service's HTTP/2): a client stream with a deadline on reading each
//! request's headers (and, for HTTP/2, its frames and bodies), holding its connection
//! slot for as long as it lives.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::lifecycle::ConnSlot;

/// Where a connection is in its request cycle, as far as reading goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading a request's headers: the deadline applies.
    Headers,
    /// Headers complete (body or response under way): no deadline from this layer.
    Past,
    /// Between requests: the next byte read starts a request (and its deadline); with
    /// an idle timeout, the connection ends (EOF) when none comes in time.
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
    /// HTTP/1 keep-alive: how long the connection may wait between requests (None:
    /// the request loop's own timer, if any).
    idle_timeout: Option<Duration>,
    /// The header deadline while reading a head; the idle deadline between requests.
    deadline: Pin<Box<Sleep>>,
    end: HeaderEnd,
    /// HTTP/2: the frames read so far (the deadline covers the preface and every
    /// header block instead of HTTP/1 heads).
    h2: Option<H2Frames>,
    /// HTTP/2 without a stream loop of ours (the RLS): the connection is closed when
    /// nothing has been read for this long outside a header block.
    quiet_timeout: Option<Duration>,
    /// HTTP/2: the request bodies under way and their deadlines.
    bodies: Option<H2Bodies>,
    /// Reads that found nothing to read (the client had not sent yet).
    waits: u64,
    _slot: ConnSlot,
}

// === impl Guarded ===

impl Guarded {
    pub(crate) fn new(inner: Stream, header_timeout: Duration, slot: ConnSlot) -> Self {
        Self {
            inner,
            phase: Phase::Headers,
            next_request: AtomicBool::new(false),
            header_timeout,
            idle_timeout: None,
            deadline: Box::pin(tokio::time::sleep(header_timeout)),
            end: HeaderEnd::default(),
            h2: None,
            quiet_timeout: None,
            bodies: None,
            waits: 0,
            _slot: slot,
        }
    }

    /// An HTTP/2 connection: the preface and each header block must arrive within
    /// `header_timeout`, and each request body within `body_timeout` of its headers (the
    /// connection is closed when one does not: Pingora's HTTP/2 body reads have no
    /// timeout of their own); with `quiet_timeout`, a connection that reads nothing else
    /// for that long is closed too.
    pub(crate) fn http2(
        inner: Stream,
        header_timeout: Duration,
        body_timeout: Duration,
        quiet_timeout: Option<Duration>,
        slot: ConnSlot,
    ) -> Self {
        let mut g = Self::new(inner, header_timeout, slot);
        g.h2 = Some(H2Frames::default());
        g.bodies = Some(H2Bodies::new(body_timeout));
        g.quiet_timeout = quiet_timeout;
        g
    }

    /// HTTP/1 keep-alive enforced here: between requests the connection ends (a clean
    /// EOF to the request loop) after `idle` without a byte, so the loop needs no timer
    /// of its own (one timer per connection, not two).
    pub(crate) fn idle_after_requests(mut self, idle: Duration) -> Self {
        self.idle_timeout = Some(idle);
        self
    }

    /// How many reads so far found nothing to read. A request served without one came
    /// from bytes the client had sent ahead (pipelined, or a flood's next request).
    pub(crate) fn waits(&self) -> u64 {
        self.waits
    }

    /// The previous request is done: the next byte read starts a new one.
    pub(crate) fn await_next_request(&self) {
        self.next_request.store(true, Ordering::Relaxed);
    }

    /// Tracks the request cycle through the bytes just read.
    fn saw(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if let Some(frames) = &mut self.h2 {
            let was = frames.in_headers();
            let bodies = &mut self.bodies;
            let mut request_frame = false;
            let started = frames.feed(bytes, |kind, flags, id| {
                request_frame |= matches!(kind, H2Frames::HEADERS | H2Bodies::DATA);
                if let Some(b) = bodies.as_mut() {
                    b.client_frame(kind, flags, id);
                }
            });
            let now = frames.in_headers();
            if now {
                if started || !was {
                    let at = Instant::now() + self.header_timeout;
                    self.deadline.as_mut().reset(at);
                }
                self.phase = Phase::Headers;
            } else if let Some(quiet) = self.quiet_timeout {
                // Only requests keep the connection: PING, SETTINGS or WINDOW_UPDATE
                // frames alone would hold a slot forever.
                if request_frame || was {
                    self.deadline.as_mut().reset(Instant::now() + quiet);
                }
                self.phase = Phase::Headers;
            } else {
                self.phase = Phase::Past;
            }
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
        if this.phase != Phase::Idle && this.next_request.load(Ordering::Relaxed) {
            this.phase = Phase::Idle;
            if let Some(idle) = this.idle_timeout {
                this.deadline.as_mut().reset(Instant::now() + idle);
            }
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
                this.waits = this.waits.wrapping_add(1);
                if this.phase == Phase::Headers && this.deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "request headers not complete within header_timeout_secs",
                    )));
                }
                // Idle too long between requests: the end of the stream, which the
                // request loop takes as a client that closed its keep-alive connection.
                if this.phase == Phase::Idle
                    && this.idle_timeout.is_some()
                    && this.deadline.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Ok(()));
                }
                if this.bodies.as_mut().is_some_and(|b| b.poll_late(cx)) {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "an HTTP/2 request body not complete within body_timeout_secs",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

/// Follows the frames a client sends on an HTTP/2 connection, far enough to tell
/// whether a header block (or the connection preface) is incomplete.
#[derive(Debug, Clone, Copy)]
struct H2Frames {
    /// Preface bytes still to come.
    preface: usize,
    /// The frame header being read, and how much of it is in.
    head: [u8; 9],
    head_len: usize,
    /// Payload bytes of the current frame still to come.
    payload: usize,
    /// The current frame is HEADERS or CONTINUATION and carries END_HEADERS.
    ends_block: bool,
    /// A header block has begun and not ended.
    in_block: bool,
}

impl Default for H2Frames {
    fn default() -> Self {
        Self {
            preface: 24,
            head: [0; 9],
            head_len: 0,
            payload: 0,
            ends_block: false,
            in_block: false,
        }
    }
}

// === impl H2Frames ===

impl H2Frames {
    const HEADERS: u8 = 0x1;
    const CONTINUATION: u8 = 0x9;
    const END_HEADERS: u8 = 0x4;

    /// True while the preface or a header block is incomplete.
    fn in_headers(&self) -> bool {
        self.preface > 0 || self.in_block
    }

    /// Feeds bytes read; true when a header block began among them. `frame` is told the
    /// type, flags and stream id of every frame header completed.
    fn feed(&mut self, mut bytes: &[u8], mut frame: impl FnMut(u8, u8, u32)) -> bool {
        let mut began = false;
        while !bytes.is_empty() {
            if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                bytes = &bytes[n..];
            } else if self.payload > 0 {
                let n = self.payload.min(bytes.len());
                self.payload -= n;
                bytes = &bytes[n..];
                if self.payload == 0 {
                    self.frame_done();
                }
            } else {
                let n = (9 - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
                self.head_len += n;
                bytes = &bytes[n..];
                if self.head_len < 9 {
                    continue;
                }
                self.head_len = 0;
                let [l0, l1, l2, kind, flags, s0, s1, s2, s3] = self.head;
                let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
                frame(kind, flags, u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]));
                let header_frame = kind == Self::HEADERS || kind == Self::CONTINUATION;
                if kind == Self::HEADERS && !self.in_block {
                    self.in_block = true;
                    began = true;
                }
                self.ends_block = header_frame && flags & Self::END_HEADERS != 0;
                self.payload = len;
                if len == 0 {
                    self.frame_done();
                }
            }
        }
        began
    }

    fn frame_done(&mut self) {
        if self.ends_block {
            self.in_block = false;
            self.ends_block = false;
        }
    }
}

/// The request bodies under way on an HTTP/2 connection, followed from the frames both
/// sides send: a stream whose HEADERS did not end it must see its body end (DATA or
/// trailers with END_STREAM) within `timeout`, unless either side resets it.
#[derive(Debug)]
struct H2Bodies {
    timeout: Duration,
    /// (stream id, deadline), oldest first.
    pending: std::collections::VecDeque<(u32, Instant)>,
    /// Frames the server writes (no preface on that side).
    written: H2Frames,
    timer: Pin<Box<Sleep>>,
    /// What `timer` is set to.
    armed: Option<Instant>,
}

// === impl H2Bodies ===

impl H2Bodies {
    const DATA: u8 = 0x0;
    const RST_STREAM: u8 = 0x3;
    const END_STREAM: u8 = 0x1;
    /// More bodies under way than any client may have (Pingora refuses streams far
    /// below this): the connection is treated as late.
    const MAX_PENDING: usize = 4096;

    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            pending: std::collections::VecDeque::new(),
            written: H2Frames {
                preface: 0,
                ..H2Frames::default()
            },
            timer: Box::pin(tokio::time::sleep(timeout)),
            armed: None,
        }
    }

    fn client_frame(&mut self, kind: u8, flags: u8, id: u32) {
        let ends = flags & Self::END_STREAM != 0;
        match kind {
            H2Frames::HEADERS
                if id % 2 == 1 && !ends && !self.pending.iter().any(|(s, _)| *s == id) =>
            {
                self.pending.push_back((id, Instant::now() + self.timeout));
            }
            H2Frames::HEADERS | Self::DATA if ends => self.done(id),
            Self::RST_STREAM => self.done(id),
            _ => {}
        }
    }

    /// Bytes the server wrote: a stream it reset needs no body. One it has finished
    /// answering still does: Pingora's proxy task waits for the request body to end (with
    /// no timeout on HTTP/2), so a client that never ends it would hold the stream, and
    /// the connection, forever.
    fn wrote(&mut self, bytes: &[u8]) {
        let mut ended = Vec::new();
        self.written.feed(bytes, |kind, _flags, id| {
            if kind == Self::RST_STREAM {
                ended.push(id);
            }
        });
        for id in ended {
            self.done(id);
        }
    }

    fn done(&mut self, id: u32) {
        if let Some(i) = self.pending.iter().position(|(s, _)| *s == id) {
            self.pending.remove(i);
        }
    }

    /// Whether a body is late (registering a wake-up for the next deadline otherwise).
    fn poll_late(&mut self, cx: &mut Context<'_>) -> bool {
        if self.pending.len() > Self::MAX_PENDING {
            return true;
        }
        let Some(first) = self.pending.iter().map(|(_, d)| *d).min() else {
            self.armed = None;
            return false;
        };
        if self.armed != Some(first) {
            self.timer.as_mut().reset(first);
            self.armed = Some(first);
        }
        self.timer.as_mut().poll(cx).is_ready()
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(b)) = (&written, this.bodies.as_mut()) {
            b.wrote(buf.get(..*n).unwrap_or_default());
        }
        written
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
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(b)) = (&written, this.bodies.as_mut()) {
            let mut left = *n;
            for s in bufs {
                let take = left.min(s.len());
                b.wrote(&s[..take]);
                left -= take;
                if left == 0 {
                    break;
                }
            }
        }
        written
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
