//! Deadlines and caps on every transport (issue 19): TLS handshakes, idle HTTP/2, slow
//! bodies, and the admin and RLS listeners' own caps, against the real binary.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::tls::TestCa;
use crate::support::{client, free_port, Gateway, Upstream};

const ROUTE: &str = "[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"{upstream}\"]\nauth = \"none\"\n";

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame.
const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

/// A TLS gateway with `server` lines; its CA and the temp dir holding the certificate.
async fn tls_gateway(server: &str, up: SocketAddr) -> (Gateway, TestCa, tempfile::TempDir) {
    let ca = TestCa::new();
    let certs = tempfile::tempdir().unwrap();
    TestCa::write(&ca.leaf(), certs.path());
    let server = format!(
        "grace_period_secs = 0\ntls = {{ cert = \"{0}/cert.pem\", key = \"{0}/key.pem\" }}\n{server}",
        certs.path().display()
    );
    let body = ROUTE.replace("{upstream}", &up.to_string());
    let gw = Gateway::start_full(&["run"], &body, &server).await;
    (gw, ca, certs)
}

/// Reads until the peer closes (or `patience` passes): how long that took.
async fn closed_after<S: tokio::io::AsyncRead + Unpin>(s: &mut S, patience: Duration) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(start + patience, s.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return start.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => return patience,
        }
    }
}

/// One GET over HTTP/2 on `tls`: status and body.
async fn h2_get(tls: tokio_rustls::client::TlsStream<TcpStream>) -> Result<(u16, String), String> {
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get("https://localhost/x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((
        status,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    ))
}

/// Idle HTTP/2 connections (nothing sent, the preface only, half a HEADERS block) are
/// closed within `header_timeout_secs` / `idle_timeout_secs` and give their slots back:
/// with the cap full of them, a new client is served once they are gone.
#[tokio::test(flavor = "multi_thread")]
async fn idle_h2_connections_are_closed_within_the_deadlines() {
    let up = Upstream::start("transport").await;
    let server = "max_connections = 6\nheader_timeout_secs = 2\nidle_timeout_secs = 3";
    let (gw, ca, _certs) = tls_gateway(server, up.addr).await;
    // A HEADERS frame announcing 64 bytes (END_HEADERS) of which 10 are sent.
    let mut half = PREFACE.to_vec();
    half.extend_from_slice(SETTINGS);
    half.extend_from_slice(&[0, 0, 64, 1, 0x5, 0, 0, 0, 1]);
    half.extend_from_slice(&[0x82; 10]);
    let cases: [(&str, Vec<u8>, u64); 3] = [
        ("nothing", Vec::new(), 2),
        ("preface only", [PREFACE, SETTINGS].concat(), 3),
        ("half a HEADERS block", half, 2),
    ];
    let mut tasks = Vec::new();
    for (what, bytes, deadline) in cases {
        for _ in 0..2 {
            let (mut tls, alpn, _) = ca.connect(gw.addr).await;
            assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
            let bytes = bytes.clone();
            tasks.push(tokio::spawn(async move {
                tls.write_all(&bytes).await.unwrap();
                tls.flush().await.unwrap();
                (
                    what,
                    deadline,
                    closed_after(&mut tls, Duration::from_secs(15)).await,
                )
            }));
        }
    }
    // The cap is full of idle connections: a seventh is refused, in HTTP/2.
    let (tls, _, _) = ca.connect(gw.addr).await;
    let (status, body) = h2_get(tls).await.expect("an HTTP/2 answer");
    assert_eq!(
        (status, body.as_str()),
        (503, r#"{"error":"too_many_connections"}"#)
    );
    for t in tasks {
        let (what, deadline, took) = t.await.unwrap();
        assert!(
            took < Duration::from_secs(deadline + 2),
            "{what}: closed after {took:?}, deadline {deadline} s"
        );
    }
    let (tls, _, _) = ca.connect(gw.addr).await;
    assert_eq!(h2_get(tls).await.unwrap().0, 200, "{}", gw.log());
}

/// TCP connections that never send a ClientHello count against `max_connections`
/// while open, are closed after `header_timeout_secs`, and the admin listener answers
/// throughout.
#[tokio::test(flavor = "multi_thread")]
async fn silent_tls_handshakes_are_bounded_and_counted() {
    let up = Upstream::start("transport").await;
    let server = "max_connections = 8\nheader_timeout_secs = 2";
    let (gw, ca, _certs) = tls_gateway(server, up.addr).await;
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    // Let the gateway take them all (accepting is not instant).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = client().get(gw.admin_url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let (tls, _, _) = ca.connect(gw.addr).await;
    let (status, _) = h2_get(tls).await.expect("an HTTP/2 answer");
    assert_eq!(status, 503, "silent handshakes hold slots");
    for s in &mut silent {
        let took = closed_after(s, Duration::from_secs(10)).await;
        assert!(took < Duration::from_secs(4), "closed after {took:?}");
    }
    let (tls, _, _) = ca.connect(gw.addr).await;
    assert_eq!(h2_get(tls).await.unwrap().0, 200, "{}", gw.log());
}

/// A body dripped a byte at a time is answered 408 `request_timeout` once
/// `body_timeout_secs` have passed since its headers (HTTP/1).
#[tokio::test(flavor = "multi_thread")]
async fn dripped_body_gets_408_within_body_timeout() {
    let up = body_reader().await;
    let body = ROUTE.replace("{upstream}", &up.to_string());
    let gw = Gateway::start_full(
        &["run"],
        &body,
        "grace_period_secs = 0\nbody_timeout_secs = 2",
    )
    .await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let (mut r, mut w) = s.split();
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 1024];
        loop {
            tokio::select! {
                n = r.read(&mut buf) => match n {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                },
                _ = tokio::time::sleep(Duration::from_millis(400)) => {
                    if w.write_all(b"a").await.is_err() { break; }
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 408"),
        "{text:?} after {:?}",
        start.elapsed()
    );
    assert!(text.ends_with(r#"{"error":"request_timeout"}"#), "{text}");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
}

/// An upstream that answers 200 only once it has read a request's whole body
/// (`content-length`), as an application reading a form does.
async fn body_reader() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_lowercase();
                    let Some(end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if got.len() >= end + 4 + len {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await;
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn rls_request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: "198.51.100.7".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn rls_answers(addr: SocketAddr) -> bool {
    let call = async {
        let mut c = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .ok()?;
        c.should_rate_limit(rls_request()).await.ok()
    };
    tokio::time::timeout(Duration::from_secs(3), call)
        .await
        .ok()
        .flatten()
        .is_some()
}

async fn proxy_answers(gw: &Gateway) -> bool {
    let r = client()
        .get(gw.url("/x"))
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    r.is_ok_and(|r| r.status() == 200)
}

async fn admin_answers(gw: &Gateway) -> bool {
    let r = client()
        .get(gw.admin_url("/healthz"))
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    r.is_ok_and(|r| r.status() == 200)
}

async fn admin_api_answers(gw: &Gateway) -> bool {
    let r = client()
        .get(gw.admin_url("/v1/openapi.json"))
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    r.is_ok_and(|r| r.status() == 200)
}

/// `n` idle TCP connections to `addr`, once the listener has taken them.
async fn hold(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    held
}

/// Each listener's cap, exhausted, refuses further connections there while the other two
/// listeners still answer (proxy 10, admin 64, RLS 256 connections); the admin
/// listener's probe reserve still answers `/healthz`.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_listener_leaves_the_others_answering() {
    let up = Upstream::start("transport").await;
    let body = ROUTE.replace("{upstream}", &up.addr.to_string());
    let rls: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    // One address fills each listener: the per-client caps set out of the way.
    let per_ip = "max_connections_per_ip = 10\nadmin_max_connections_per_ip = 64\nrls_max_connections_per_ip = 256";
    let server = format!("grace_period_secs = 0\nmax_connections = 10\nheader_timeout_secs = 30\nidle_timeout_secs = 30\nrls_listen = \"{rls}\"\n{per_ip}");
    let gw = Gateway::start_full(&["run"], &body, &server).await;
    assert!(rls_answers(rls).await, "{}", gw.log());

    let held = hold(gw.addr, 10).await;
    assert!(!proxy_answers(&gw).await, "the proxy's cap is full");
    assert!(admin_answers(&gw).await && rls_answers(rls).await);
    drop(held);

    let held = hold(gw.admin, 64).await;
    assert!(!admin_api_answers(&gw).await, "the admin cap is full");
    // The probe reserve still answers /healthz (see listeners.rs).
    assert!(admin_answers(&gw).await);
    assert!(proxy_answers(&gw).await && rls_answers(rls).await);
    drop(held);

    let held = hold(rls, 256).await;
    assert!(!rls_answers(rls).await, "the RLS cap is full");
    assert!(
        proxy_answers(&gw).await && admin_answers(&gw).await,
        "{}",
        gw.log()
    );
    drop(held);
}

/// An HTTP/2 POST whose headers arrive but whose body never does is cut off within
/// `body_timeout_secs` (Pingora's HTTP/2 body reads have no timeout: the guard closes
/// the connection), while a stream that finishes its body is served.
#[tokio::test(flavor = "multi_thread")]
async fn h2_body_that_never_comes_is_cut_off() {
    let server = "body_timeout_secs = 2\nheader_timeout_secs = 10\nidle_timeout_secs = 30";
    let (gw, ca, _certs) = tls_gateway(server, body_reader().await).await;
    // POST / (HPACK: :method POST, :scheme https, :path /, :authority localhost,
    // content-length 10), END_HEADERS without END_STREAM, and then no DATA.
    let mut block = vec![0x83, 0x87, 0x84, 0x41, 9];
    block.extend_from_slice(b"localhost");
    block.extend_from_slice(&[0x5c, 2, b'1', b'0']);
    let mut bytes = [PREFACE, SETTINGS].concat();
    let len = u8::try_from(block.len()).unwrap();
    bytes.extend_from_slice(&[0, 0, len, 1, 0x4, 0, 0, 0, 1]);
    bytes.extend_from_slice(&block);
    let (mut tls, alpn, _) = ca.connect(gw.addr).await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    tls.write_all(&bytes).await.unwrap();
    tls.flush().await.unwrap();
    let took = closed_after(&mut tls, Duration::from_secs(15)).await;
    assert!(
        took < Duration::from_secs(5),
        "the stalled body's connection closed after {took:?}"
    );
    // The same request with its body is served on HTTP/2.
    let (tls, _, _) = ca.connect(gw.addr).await;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("https://localhost/x")
        .header("content-length", "10")
        .body(http_body_util::Full::new(Bytes::from_static(b"0123456789")))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// PINGs alone do not keep an RLS connection (and its slot): one that sends no call for
/// `idle_timeout_secs` is closed, however often it pings.
#[tokio::test(flavor = "multi_thread")]
async fn pings_alone_do_not_hold_an_rls_slot() {
    let up = Upstream::start("transport").await;
    let body = ROUTE.replace("{upstream}", &up.addr.to_string());
    let rls: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let server = format!(
        "grace_period_secs = 0\nheader_timeout_secs = 5\nidle_timeout_secs = 2\nrls_listen = \"{rls}\""
    );
    let gw = Gateway::start_full(&["run"], &body, &server).await;
    assert!(rls_answers(rls).await, "{}", gw.log());
    let mut s = TcpStream::connect(rls).await.unwrap();
    s.write_all(&[PREFACE, SETTINGS].concat()).await.unwrap();
    let start = Instant::now();
    // A PING frame (8 bytes of opaque data) every 500 ms, reading what comes back.
    let ping: &[u8] = &[0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    let mut buf = [0u8; 4096];
    let closed = loop {
        if start.elapsed() > Duration::from_secs(10) {
            break false;
        }
        if s.write_all(ping).await.is_err() {
            break true;
        }
        let read = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await;
        if let Ok(Ok(0) | Err(_)) = read {
            break true;
        }
    };
    assert!(closed, "still open after {:?} of PINGs", start.elapsed());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// An HTTP/2 stream the client never ends, answered by an upstream that does not wait
/// for its body, does not keep the connection (and its slot) once the response is out:
/// the unread body is drained for at most `body_timeout_secs`, then the connection idles
/// out.
#[tokio::test(flavor = "multi_thread")]
async fn an_h2_stream_left_open_after_its_answer_gives_its_slot_back() {
    let server = "body_timeout_secs = 2\nheader_timeout_secs = 10\nidle_timeout_secs = 2";
    let (gw, ca, _certs) = tls_gateway(server, body_reader().await).await;
    // GET / (HPACK: :method GET, :scheme https, :path /, :authority localhost), with
    // END_HEADERS and without END_STREAM, and then nothing.
    let mut block = vec![0x82, 0x87, 0x84, 0x41, 9];
    block.extend_from_slice(b"localhost");
    let mut bytes = [PREFACE, SETTINGS].concat();
    let len = u8::try_from(block.len()).unwrap();
    bytes.extend_from_slice(&[0, 0, len, 1, 0x4, 0, 0, 0, 1]);
    bytes.extend_from_slice(&block);
    let (mut tls, _, _) = ca.connect(gw.addr).await;
    tls.write_all(&bytes).await.unwrap();
    tls.flush().await.unwrap();
    let took = closed_after(&mut tls, Duration::from_secs(20)).await;
    assert!(
        took < Duration::from_secs(8),
        "the connection closed after {took:?}"
    );
    // A client that lets nothing of its response through (a zero flow-control window)
    // is dropped once nothing could be written for `idle_timeout_secs`.
    let mut bytes = PREFACE.to_vec();
    bytes.extend_from_slice(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0]);
    bytes.extend_from_slice(&[0, 0, len, 1, 0x5, 0, 0, 0, 1]);
    bytes.extend_from_slice(&block);
    let (mut tls, _, _) = ca.connect(gw.addr).await;
    tls.write_all(&bytes).await.unwrap();
    tls.flush().await.unwrap();
    let took = closed_after(&mut tls, Duration::from_secs(20)).await;
    assert!(
        took < Duration::from_secs(8),
        "the zero-window connection closed after {took:?}"
    );
}

/// A dripped body on the admin listener (`POST /v1/check`) is answered 408 within
/// `body_timeout_secs`, so 64 such clients cannot hold the admin API.
#[tokio::test(flavor = "multi_thread")]
async fn admin_bodies_have_a_deadline_too() {
    let up = Upstream::start("transport").await;
    let body = ROUTE.replace("{upstream}", &up.addr.to_string());
    let gw = Gateway::start_full(
        &["run"],
        &body,
        "grace_period_secs = 0\nbody_timeout_secs = 2",
    )
    .await;
    let mut s = TcpStream::connect(gw.admin).await.unwrap();
    s.write_all(b"POST /v1/check HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ip\":")
        .await
        .unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if got.windows(15).any(|w| w == b"request_timeout") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}
