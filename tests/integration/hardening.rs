//! Edge hardening on the real binary: header and idle deadlines, connection caps (set and
//! derived from the open-file limit), a shutdown that ends when the work does (and at once
//! on SIGINT), block-field validation, a Redis health probe that needs no traffic, the
//! check API's brute-force accounting, and `throttle demo` across a reload.

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::support::redis::RedisServer;
use crate::support::{
    client, eventually, free_port, header, raw_exchange, Gateway, Upstream, ADMIN_TOKEN,
};

/// One public route to `{upstream}`.
const ALL: &str = "[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstreams = [\"{upstream}\"]\nauth = \"none\"\n";

const GET: &[u8] = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n";

const TOO_MANY: &str = r#"{"error":"too_many_connections"}"#;

/// A gateway over one public route to `up`, with extra `[server]` lines.
async fn gateway(up: &Upstream, server: &str) -> Gateway {
    Gateway::start_full(
        &["run"],
        &ALL.replace("{upstream}", &up.addr.to_string()),
        server,
    )
    .await
}

/// Time until the server closes a connection we only read from (None: still open after
/// `patience`). Bytes the server sends before closing are returned as well.
async fn closed_within(
    stream: &mut tokio::net::TcpStream,
    patience: Duration,
) -> (Option<Instant>, Vec<u8>) {
    let deadline = Instant::now() + patience;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (None, got),
            Ok(Ok(0) | Err(_)) => return (Some(Instant::now()), got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// What a connection that sent nothing got from the gateway.
#[derive(Debug)]
enum Fate {
    /// Nothing yet, still open.
    Open,
    /// Bytes, then the close.
    Answered(String),
    /// Bytes, no close yet.
    Partial,
    /// Closed without a byte.
    Closed,
}

/// Reads what is there (waiting up to `wait` for the first byte, then up to 2 s for the
/// close).
fn fate(stream: &mut TcpStream, wait: Duration) -> Fate {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                stream
                    .set_read_timeout(Some(Duration::from_secs(2)))
                    .unwrap();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return if got.is_empty() {
                    Fate::Open
                } else {
                    Fate::Partial
                };
            }
            Err(_) => break,
        }
    }
    if got.is_empty() {
        Fate::Closed
    } else {
        Fate::Answered(String::from_utf8_lossy(&got).into())
    }
}

/// Non-blocking: true when the connection is open with nothing to read.
fn still_open(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let open = matches!((&*stream).read(&mut buf), Err(e) if e.kind() == ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    open
}

/// The cap's answer: 503, `connection: close`, the JSON body, then the close.
fn assert_too_many(answer: &str) {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete head: {answer:?}"));
    assert!(head.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(
        head.to_ascii_lowercase().contains("\r\nconnection: close"),
        "{answer:?}"
    );
    assert_eq!(body, TOO_MANY, "{answer:?}");
}

/// Connections that sent nothing, once the gateway has dealt with all of them.
struct Settled {
    /// Indexes of the connections held open (no byte, no close).
    open: Vec<usize>,
    /// (index, everything received) of the connections answered and closed.
    answered: Vec<(usize, String)>,
    /// Closed without a byte.
    closed_silently: Vec<usize>,
    /// Some bytes but no close yet.
    partial: usize,
}

/// Polls `conns` (non-blocking) until at most `max_open` are held open and every other
/// one has been answered and closed, or `patience` runs out; the state then.
async fn settle(conns: &mut [TcpStream], max_open: usize, patience: Duration) -> Settled {
    for s in conns.iter() {
        s.set_nonblocking(true).unwrap();
    }
    let mut got: Vec<Vec<u8>> = vec![Vec::new(); conns.len()];
    let mut closed = vec![false; conns.len()];
    let deadline = Instant::now() + patience;
    let mut buf = [0u8; 1024];
    loop {
        for (i, s) in conns.iter_mut().enumerate() {
            while !closed[i] {
                match s.read(&mut buf) {
                    Ok(0) => closed[i] = true,
                    Ok(n) => got[i].extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => closed[i] = true,
                }
            }
        }
        let settled = Settled {
            open: (0..conns.len())
                .filter(|&i| !closed[i] && got[i].is_empty())
                .collect(),
            answered: (0..conns.len())
                .filter(|&i| closed[i] && !got[i].is_empty())
                .map(|i| (i, String::from_utf8_lossy(&got[i]).into_owned()))
                .collect(),
            closed_silently: (0..conns.len())
                .filter(|&i| closed[i] && got[i].is_empty())
                .collect(),
            partial: (0..conns.len())
                .filter(|&i| !closed[i] && !got[i].is_empty())
                .count(),
        };
        if (settled.open.len() <= max_open && settled.partial == 0) || Instant::now() > deadline {
            for s in conns.iter() {
                s.set_nonblocking(false).unwrap();
            }
            return settled;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens `cap + 1` silent connections at once: exactly one is refused with the 503 (which
/// one is the gateway's race to run), `cap` stay open; the open ones are returned.
async fn saturate(addr: SocketAddr, cap: usize) -> Vec<TcpStream> {
    let mut conns: Vec<TcpStream> = (0..=cap)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let s = settle(&mut conns, cap, Duration::from_secs(10)).await;
    assert!(
        s.open.len() == cap && s.answered.len() == 1 && s.partial == 0,
        "{} connections: {} open, {} answered, {} closed silently, {} partial (cap {cap})",
        cap + 1,
        s.open.len(),
        s.answered.len(),
        s.closed_silently.len(),
        s.partial
    );
    assert_too_many(&s.answered[0].1);
    let open = s.open;
    conns
        .into_iter()
        .enumerate()
        .filter(|(i, _)| open.contains(i))
        .map(|(_, c)| c)
        .collect()
}

/// Opens connections until one is refused with the 503 (retrying for a while: a refused
/// probe closes, so a probe that was let in races nothing), and checks that answer.
async fn expect_refusal(addr: SocketAddr, what: &str) {
    let answer = eventually(Duration::from_secs(10), what, || async {
        let mut s = TcpStream::connect(addr).unwrap();
        match fate(&mut s, Duration::from_millis(500)) {
            Fate::Answered(a) => Some(a),
            _ => None,
        }
    })
    .await;
    assert_too_many(&answer);
}

async fn proxied_ok(gw: &Gateway) -> Option<()> {
    let r = client().get(gw.url("/x")).send().await.ok()?;
    (r.status() == 200).then_some(())
}

async fn healthz(admin: SocketAddr) -> u16 {
    client()
        .get(format!("http://{admin}/healthz"))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// An upstream that answers 200 "slow" after `delay_ms` (from the query), one request per
/// connection; counts the requests it has received.
struct SlowUpstream {
    addr: SocketAddr,
    received: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowUpstream {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let received = received.clone();
            async move {
                loop {
                    let Ok((mut s, _)) = listener.accept().await else {
                        continue;
                    };
                    let received = received.clone();
                    tokio::spawn(async move {
                        let mut head = Vec::new();
                        let mut buf = [0u8; 1024];
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        received.fetch_add(1, Ordering::SeqCst);
                        let head = String::from_utf8_lossy(&head);
                        let delay: u64 = head
                            .split_whitespace()
                            .nth(1)
                            .and_then(|target| target.split_once("delay_ms="))
                            .and_then(|(_, v)| v.split('&').next()?.parse().ok())
                            .unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 4\r\nconnection: close\r\n\r\nslow")
                            .await;
                        let _ = s.shutdown().await;
                    });
                }
            }
        });
        Self {
            addr,
            received,
            task,
        }
    }

    fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

impl Drop for SlowUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A gateway on `up` (slow upstream) with `grace_period_secs = 30`, and a slow request in
/// flight (the upstream has it) answered after `delay_ms`; returns the gateway, the
/// client (kept: its keep-alive connection is a real client's) and the request.
async fn slow_request_in_flight(
    up: &SlowUpstream,
    delay_ms: u64,
) -> (
    Gateway,
    reqwest::Client,
    tokio::task::JoinHandle<Result<(u16, String, Instant), String>>,
) {
    let body = ALL.replace("{upstream}", &up.addr.to_string());
    let gw = Gateway::start_full(&["run"], &body, "grace_period_secs = 30").await;
    let c = client();
    let before = up.received();
    let slow = tokio::spawn({
        let (c, url) = (c.clone(), gw.url(&format!("/slow?delay_ms={delay_ms}")));
        async move {
            let r = c.get(url).send().await.map_err(|e| e.to_string())?;
            let status = r.status().as_u16();
            let text = r.text().await.map_err(|e| e.to_string())?;
            Ok((status, text, Instant::now()))
        }
    });
    eventually(
        Duration::from_secs(5),
        "slow request at the upstream",
        || async { (up.received() > before).then_some(()) },
    )
    .await;
    (gw, c, slow)
}

// ---------------------------------------------------------------------------------------
// 1. Header deadline

/// A client dripping one header byte every 300 ms is cut off about `header_timeout_secs`
/// after its first byte (long before it would finish), and a connection that sends nothing
/// is closed about `header_timeout_secs` after accept.
#[tokio::test(flavor = "multi_thread")]
async fn header_drip_and_silent_connections_are_cut_at_the_header_deadline() {
    let up = Upstream::start("u").await;
    let gw = gateway(&up, "grace_period_secs = 0\nheader_timeout_secs = 2").await;

    let drip = b"X-Drip: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n"; // ~12 s at 300 ms a byte
    let stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let first = Instant::now();
    wr.write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n")
        .await
        .unwrap();
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        let r = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        (r.is_ok().then(Instant::now), got)
    });
    let mut sent = 0;
    while sent < drip.len() && !reader.is_finished() {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if wr.write_all(&drip[sent..=sent]).await.is_err() {
            break;
        }
        sent += 1;
    }
    let (closed, got) = reader.await.unwrap();
    let closed = closed.expect("the dripping connection was never closed");
    let took = closed - first;
    eprintln!(
        "header drip: closed after {took:?}, {sent} of {} header bytes sent, got {:?}",
        drip.len(),
        String::from_utf8_lossy(&got)
    );
    assert!(
        sent < drip.len(),
        "the client finished its headers before being cut off"
    );
    assert!(
        took >= Duration::from_millis(1500) && took <= Duration::from_secs(5),
        "closed after {took:?} (header_timeout_secs = 2)"
    );
    assert!(
        !String::from_utf8_lossy(&got).starts_with("HTTP/1.1 2"),
        "the dripped request was served: {got:?}"
    );

    // Silent: nothing sent at all.
    let mut silent = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let opened = Instant::now();
    let (closed, got) = closed_within(&mut silent, Duration::from_secs(10)).await;
    let took = closed.expect("a silent connection was never closed") - opened;
    eprintln!("silent connection: closed after {took:?}, got {got:?}");
    assert!(
        took >= Duration::from_millis(1500) && took <= Duration::from_secs(5),
        "closed after {took:?} (header_timeout_secs = 2)"
    );

    // A complete request on a fresh connection is still served.
    assert_eq!(
        raw_exchange(&mut TcpStream::connect(gw.addr).unwrap(), GET).map(|r| r.0),
        Some(200)
    );
}

// ---------------------------------------------------------------------------------------
// 2. Keep-alive idle timeout

/// An idle keep-alive connection is closed after `idle_timeout_secs`; one busy every
/// 300 ms for 3 s is not (the timeout is between requests, and the header deadline is
/// per request, not per connection).
#[tokio::test(flavor = "multi_thread")]
async fn idle_keepalive_is_closed_but_a_busy_connection_is_not() {
    let up = Upstream::start("u").await;
    let gw = gateway(
        &up,
        "grace_period_secs = 0\nidle_timeout_secs = 1\nheader_timeout_secs = 1",
    )
    .await;

    let mut conn = TcpStream::connect(gw.addr).unwrap();
    let (status, head, _) = raw_exchange(&mut conn, GET).expect("first request");
    assert_eq!(status, 200);
    let answered = Instant::now();
    conn.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut buf = [0u8; 64];
    let read = conn.read(&mut buf);
    let took = answered.elapsed();
    eprintln!("idle keep-alive: {read:?} after {took:?} (idle_timeout_secs = 1)");
    assert!(
        matches!(&read, Ok(0))
            || matches!(&read, Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "idle connection not closed within 8 s: {read:?}"
    );
    assert!(
        took >= Duration::from_millis(500) && took <= Duration::from_secs(4),
        "closed {took:?} after the response (idle_timeout_secs = 1); head: {head}"
    );

    let mut busy = TcpStream::connect(gw.addr).unwrap();
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let r = raw_exchange(&mut busy, GET);
        assert_eq!(
            r.as_ref().map(|r| r.0),
            Some(200),
            "request {n} on a busy connection after {:?}",
            started.elapsed()
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(n >= 8, "only {n} requests in 3 s");
}

/// The idle timeout and the header deadline are apart: with `idle_timeout_secs = 1` and
/// `header_timeout_secs = 10` an idle keep-alive connection is closed after about 1 s (not
/// 10); with `idle_timeout_secs = 6` and `header_timeout_secs = 1` one silent for 2.5 s
/// between requests is kept, and its next request is answered.
#[tokio::test(flavor = "multi_thread")]
async fn idle_and_header_deadlines_are_apart() {
    let up = Upstream::start("u").await;
    let short_idle = gateway(
        &up,
        "grace_period_secs = 0\nidle_timeout_secs = 1\nheader_timeout_secs = 10",
    )
    .await;
    let mut conn = TcpStream::connect(short_idle.addr).unwrap();
    assert_eq!(raw_exchange(&mut conn, GET).map(|r| r.0), Some(200));
    let answered = Instant::now();
    conn.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut buf = [0u8; 64];
    let read = conn.read(&mut buf);
    let took = answered.elapsed();
    assert!(
        matches!(read, Ok(0)),
        "idle connection not closed cleanly: {read:?}"
    );
    assert!(
        took >= Duration::from_millis(500) && took <= Duration::from_secs(4),
        "closed {took:?} after the response (idle 1 s, header deadline 10 s)"
    );

    let long_idle = gateway(
        &up,
        "grace_period_secs = 0\nidle_timeout_secs = 6\nheader_timeout_secs = 1",
    )
    .await;
    let mut conn = TcpStream::connect(long_idle.addr).unwrap();
    assert_eq!(raw_exchange(&mut conn, GET).map(|r| r.0), Some(200));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        raw_exchange(&mut conn, GET).map(|r| r.0),
        Some(200),
        "a keep-alive connection idle 2.5 s (idle 6 s, header deadline 1 s)"
    );
}

// ---------------------------------------------------------------------------------------
// 3. Connection caps

/// `max_connections = 20`: 20 silent connections stay open, the next gets the 503 and a
/// close, the admin listener keeps answering, and closing some makes room again.
#[tokio::test(flavor = "multi_thread")]
async fn max_connections_refuses_with_503_and_keeps_admin_up() {
    let up = Upstream::start("u").await;
    let gw = gateway(
        &up,
        // One address holds them all: the per-client cap (default 16 here) set out of the way.
        "grace_period_secs = 0\nheader_timeout_secs = 30\nmax_connections = 20\nmax_connections_per_ip = 20",
    )
    .await;
    // One complete exchange first (the readiness probe's connection is long gone after it).
    let mut c = TcpStream::connect(gw.addr).unwrap();
    let close = b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_exchange(&mut c, close).map(|r| r.0), Some(200));
    assert!(matches!(fate(&mut c, Duration::from_secs(5)), Fate::Closed));
    drop(c);

    let mut held = saturate(gw.addr, 20).await;
    expect_refusal(gw.addr, "one more connection refused with 503").await;
    let open = held.iter().filter(|s| still_open(s)).count();
    assert_eq!(open, 20, "the 20 connections under the cap must stay open");
    assert_eq!(healthz(gw.admin).await, 200, "admin down while saturated");
    assert_ne!(
        client()
            .get(gw.url("/x"))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0),
        200,
        "a proxied request while saturated"
    );

    held.truncate(10);
    eventually(Duration::from_secs(5), "room after closing 10", || {
        proxied_ok(&gw)
    })
    .await;
    assert!(held.iter().all(still_open));
}

/// `max_connections_per_ip = 3`: the 4th connection from 127.0.0.1 is refused; one closed
/// makes room.
#[tokio::test(flavor = "multi_thread")]
async fn max_connections_per_ip_refuses_the_fourth() {
    let up = Upstream::start("u").await;
    let gw = gateway(
        &up,
        "grace_period_secs = 0\nheader_timeout_secs = 30\nmax_connections_per_ip = 3",
    )
    .await;
    let mut c = TcpStream::connect(gw.addr).unwrap();
    let close = b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_exchange(&mut c, close).map(|r| r.0), Some(200));
    assert!(matches!(fate(&mut c, Duration::from_secs(5)), Fate::Closed));
    drop(c);

    let mut held = saturate(gw.addr, 3).await;
    expect_refusal(gw.addr, "one more connection from the address refused").await;
    assert_eq!(held.iter().filter(|s| still_open(s)).count(), 3);
    assert_eq!(healthz(gw.admin).await, 200);
    held.pop();
    eventually(Duration::from_secs(5), "room after closing one", || {
        proxied_ok(&gw)
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// 4. The derived cap under a low open-file limit

/// `throttle run` under `ulimit -n <nofile>` (soft and hard), with a launcher of its own
/// (support's `Gateway` spawns the binary directly).
struct Limited {
    addr: SocketAddr,
    admin: SocketAddr,
    child: Child,
    dir: TempDir,
}

impl Limited {
    async fn start(nofile: u32, body: &str, server_extra: &str) -> Self {
        for _ in 0..5 {
            let (port, admin_port) = (free_port(), free_port());
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("gateway.toml");
            let id = format!("limited-{port}-{admin_port}-{}", std::process::id());
            let server = format!("[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\ninstance_id = \"{id}\"\nthreads = 1\n{server_extra}\n\n");
            std::fs::write(&path, format!("{server}{body}")).unwrap();
            let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
            let child = Command::new("sh")
                .arg("-c")
                .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_throttle"))
                .args(["run", "--config"])
                .arg(&path)
                .env(
                    "RUST_LOG",
                    std::env::var("GW_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .env("THROTTLE_ADMIN_TOKEN", ADMIN_TOKEN)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            let mut gw = Limited {
                addr: ([127, 0, 0, 1], port).into(),
                admin: ([127, 0, 0, 1], admin_port).into(),
                child,
                dir,
            };
            if gw.wait_ready(&id).await {
                return gw;
            }
        }
        panic!("gateway under ulimit did not become ready");
    }

    async fn wait_ready(&mut self, id: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                eprintln!("gateway exited early ({status}):\n{}", self.log());
                return false;
            }
            let ready = match client()
                .get(format!("http://{}/readyz", self.admin))
                .send()
                .await
            {
                Ok(r) if r.status() == 200 => r
                    .json::<Value>()
                    .await
                    .is_ok_and(|v| v["instance_id"] == id),
                _ => false,
            };
            if ready && TcpStream::connect(self.addr).is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Under `ulimit -n 512` the derived cap (at most (512 - 256) / 2 = 128: the files open
/// at start and a margin of 256 are kept free) meets a flood of 400 connections long
/// before the files run out: every connection is held open, refused with the 503, or (past
/// 16 refusals being answered at once) closed; the process lives, the admin listener
/// answers, and accept never fails with EMFILE.
#[tokio::test(flavor = "multi_thread")]
async fn fd_exhaustion_is_met_by_the_derived_cap() {
    const NOFILE: u32 = 512;
    const CAP: usize = (512 - 256) / 2;
    const FLOOD: usize = 400;
    let up = Upstream::start("u").await;
    let body = ALL.replace("{upstream}", &up.addr.to_string());
    let mut gw = Limited::start(
        NOFILE,
        &body,
        "grace_period_secs = 0\nheader_timeout_secs = 30",
    )
    .await;
    // The readiness probe's connection has closed once a full exchange is done.
    let mut c = TcpStream::connect(gw.addr).unwrap();
    let close = b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_exchange(&mut c, close).map(|r| r.0), Some(200));
    drop(c);

    let mut conns: Vec<TcpStream> = (0..FLOOD)
        .map(|i| TcpStream::connect(gw.addr).unwrap_or_else(|e| panic!("connect {i}: {e}")))
        .collect();
    let settled = settle(&mut conns, CAP, Duration::from_secs(15)).await;
    let (open, partial) = (settled.open.len(), settled.partial);
    eprintln!(
        "fd flood under ulimit -n {NOFILE}: {open} held open, {} refused, {} closed silently, {partial} partial (cap {CAP})",
        settled.answered.len(),
        settled.closed_silently.len()
    );
    assert!(
        open <= CAP && partial == 0,
        "{open} connections open without an answer (cap {CAP}), {partial} partial answers; log:\n{}",
        gw.log()
    );
    assert_eq!(
        open + settled.answered.len() + settled.closed_silently.len(),
        FLOOD
    );
    assert!(
        !settled.answered.is_empty(),
        "no refusal was answered with the 503"
    );
    for (_, answer) in &settled.answered {
        assert_too_many(answer);
    }
    assert!(open >= 16, "only {open} connections admitted");
    assert!(gw.alive(), "the gateway died:\n{}", gw.log());
    assert_eq!(
        healthz(gw.admin).await,
        200,
        "admin down while the proxy is flooded:\n{}",
        gw.log()
    );
    assert!(gw.alive());
    let log = gw.log();
    let emfile: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Too many open files") || l.contains("os error 24"))
        .collect();
    assert!(
        emfile.is_empty(),
        "{} accept errors from file exhaustion ({open} connections held, cap {CAP}):\n{}",
        emfile.len(),
        emfile.join("\n")
    );
    // The flood goes away: proxied requests are served again.
    drop(conns);
    eventually(Duration::from_secs(5), "served after the flood", || async {
        let r = client().get(format!("http://{}/x", gw.addr)).send().await;
        r.is_ok_and(|r| r.status() == 200).then_some(())
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// 5. & 6. Shutdown

/// SIGTERM on an idle gateway with `grace_period_secs = 30` exits at once, not after 30 s.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_on_an_idle_gateway_exits_at_once() {
    let up = Upstream::start("u").await;
    let mut gw = gateway(&up, "grace_period_secs = 30").await;
    assert_eq!(proxied_ok(&gw).await, Some(()));
    let sent = Instant::now();
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(10)).await;
    let took = sent.elapsed();
    eprintln!("idle sigterm: {status:?} after {took:?}");
    let status = status.unwrap_or_else(|| panic!("not exited after 10 s:\n{}", gw.log()));
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(status.success(), "{status}:\n{}", gw.log());
}

/// SIGTERM with a 2 s request in flight: it completes with 200, and the process exits
/// right after it, well before the 30 s grace period.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_waits_for_the_request_in_flight_then_exits() {
    let up = SlowUpstream::start().await;
    let (mut gw, _client, slow) = slow_request_in_flight(&up, 2000).await;
    let sent = Instant::now();
    gw.signal("TERM");
    let (status, text, answered) = slow
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the in-flight request failed: {e}\n{}", gw.log()));
    assert_eq!((status, text.as_str()), (200, "slow"));
    let exit = gw.wait_exit(Duration::from_secs(40)).await;
    let took = sent.elapsed();
    eprintln!(
        "sigterm with a request in flight: answered after {:?}, {exit:?} after {took:?}",
        answered - sent
    );
    let exit = exit.unwrap_or_else(|| panic!("not exited:\n{}", gw.log()));
    assert!(exit.success(), "{exit}:\n{}", gw.log());
    assert!(
        took < Duration::from_secs(8),
        "exited {took:?} after SIGTERM with grace_period_secs = 30 (the request took 2 s)"
    );
}

/// SIGINT during a graceful shutdown (a 10 s request in flight, grace 30 s) exits at once,
/// with the SIGINT status.
#[tokio::test(flavor = "multi_thread")]
async fn sigint_during_graceful_shutdown_exits_at_once() {
    let up = SlowUpstream::start().await;
    let (mut gw, _client, slow) = slow_request_in_flight(&up, 10_000).await;
    gw.signal("TERM");
    assert!(
        gw.wait_exit(Duration::from_millis(300)).await.is_none(),
        "exited on SIGTERM with a request in flight:\n{}",
        gw.log()
    );
    let sent = Instant::now();
    gw.signal("INT");
    let exit = gw.wait_exit(Duration::from_secs(5)).await;
    let took = sent.elapsed();
    eprintln!("sigint during shutdown: {exit:?} after {took:?}");
    let exit = exit.unwrap_or_else(|| panic!("not exited 5 s after SIGINT:\n{}", gw.log()));
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(
        exit.code() == Some(130) || exit.signal() == Some(2),
        "exit status {exit}"
    );
    slow.abort();
}

// ---------------------------------------------------------------------------------------
// 7. Block fields

/// NUL, control characters and over-long fields are 400 invalid_request (nothing stored);
/// the limits are in bytes; a normal block is still 201.
#[tokio::test(flavor = "multi_thread")]
async fn blocks_refuse_control_characters_and_long_fields() {
    let up = Upstream::start("u").await;
    let gw = gateway(&up, "grace_period_secs = 0").await;
    let c = client();
    let url = gw.admin_url("/v1/blocks");
    let post = |b: Value| c.post(&url).bearer_auth(ADMIN_TOKEN).json(&b).send();

    let bad = [
        json!({"scope": "key", "value": "abc\u{0}def"}),
        json!({"scope": "key", "value": "abc\u{0}"}),
        json!({"scope": "key", "value": "a\u{1}b"}),
        json!({"scope": "key", "value": "a\nb"}),
        json!({"scope": "tenant", "value": "a\u{1b}[31mred"}),
        json!({"scope": "key", "value": "a\u{7f}b"}),
        json!({"scope": "key", "value": "a\u{85}b"}),
        json!({"scope": "key", "value": "ok", "reason": "bad\u{0}reason"}),
        json!({"scope": "key", "value": "ok", "reason": "bad\u{8}reason"}),
        json!({"scope": "ip", "value": "10.0.0.1", "reason": "line\r\nInjected: yes"}),
        json!({"scope": "key", "value": "v".repeat(257)}),
        json!({"scope": "key", "value": "é".repeat(129)}), // 258 bytes, 129 characters
        json!({"scope": "key", "value": "ok", "reason": "r".repeat(1025)}),
        json!({"scope": "key", "value": "ok", "reason": "é".repeat(513)}), // 1026 bytes
    ];
    for b in &bad {
        let r = post(b.clone()).await.unwrap();
        let status = r.status().as_u16();
        let reply: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 400, "{b} answered {status} {reply}");
        assert_eq!(reply["error"], "invalid_request", "{b}: {reply}");
    }
    let good = [
        json!({"scope": "key", "value": "normal_key", "reason": "abuse: too many 4xx, see ticket #1"}),
        json!({"scope": "key", "value": "v".repeat(256), "reason": "r".repeat(1024)}),
        json!({"scope": "tenant", "value": "ünïcödé-tenant", "reason": "tab\u{9}free"}),
    ];
    let mut created = 0;
    for b in &good {
        let r = post(b.clone()).await.unwrap();
        let status = r.status().as_u16();
        let reply: Value = r.json().await.unwrap_or(Value::Null);
        if b["reason"].as_str().is_some_and(|r| r.contains('\t')) {
            // A tab is a control character too: refusing it is as valid as keeping it.
            assert!(matches!(status, 201 | 400), "{b}: {status} {reply}");
            created += usize::from(status == 201);
            continue;
        }
        assert_eq!(status, 201, "{b}: {reply}");
        assert_eq!(reply["value"], b["value"]);
        created += 1;
    }
    let listed: Value = c
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let blocks = listed["blocks"].as_array().unwrap();
    assert_eq!(
        blocks.len(),
        created,
        "refused blocks were stored: {listed}"
    );
    for b in blocks {
        let text = format!("{}{}", b["value"], b["reason"]);
        assert!(!text.contains('\u{0}'), "{b}");
    }
}

// ---------------------------------------------------------------------------------------
// 8. Redis health without traffic

/// Redis dies: /readyz turns degraded within a few seconds with no request sent (the
/// heartbeat is the probe), and healthy again when Redis comes back.
#[tokio::test(flavor = "multi_thread")]
async fn readyz_turns_degraded_when_redis_dies_without_traffic() {
    let mut redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 200\non_failure = \"closed\"\nkey_prefix = \"hardening\"\n\n{}",
        redis.url(),
        ALL.replace("{upstream}", &up.addr.to_string())
    );
    let gw = Gateway::start(&body, None).await;
    eventually(
        Duration::from_secs(5),
        "not degraded with Redis up",
        || async {
            let r = gw.readyz().await;
            (r["degraded"] == false && r["store"]["backend"] == "redis").then_some(())
        },
    )
    .await;
    let port = redis.port;
    redis.kill();
    let killed = Instant::now();
    let r = eventually(
        Duration::from_secs(6),
        "degraded after Redis died (no requests)",
        || async {
            let r = gw.readyz().await;
            (r["degraded"] == true).then_some(r)
        },
    )
    .await;
    eprintln!("degraded {:?} after Redis died: {r}", killed.elapsed());
    assert_eq!(r["ready"], true);
    assert_eq!(r["store"]["healthy"], false);
    let m = gw.metrics().await;
    assert!(
        !m.lines()
            .any(|l| l.starts_with("throttle_requests_total{") && !l.ends_with(" 0")),
        "a proxied request was sent: {m}"
    );
    let _back = RedisServer::start_on(port).await;
    eventually(
        Duration::from_secs(10),
        "healthy after Redis came back",
        || async { (gw.readyz().await["degraded"] == false).then_some(()) },
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// 9. /v1/check brute force

/// Failed key lookups through /v1/check count against the caller too: rotating the `ip`
/// field does not buy guesses, and the 429 is the documented decision body.
#[tokio::test(flavor = "multi_thread")]
async fn check_api_counts_failed_lookups_against_the_caller() {
    let up = Upstream::start("u").await;
    let body = r#"
[limits.auth]
per_minute = 2

[tiers.free]
key = { per_minute = 100 }

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{upstream}"]

[[keys]]
id = "k"
key = "good-key-1"
tenant = "acme"
tier = "free"
"#;
    let gw = Gateway::start(body, Some(&up)).await;
    let c = client();
    let check = |ip: &str| {
        c.post(gw.admin_url("/v1/check"))
            .json(&json!({"ip": ip, "api_key": "bad"}))
            .send()
    };
    let mut statuses = Vec::new();
    for ip in ["1.1.1.1", "2.2.2.2"] {
        statuses.push(check(ip).await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [401, 401], "the first two failures");
    let r = check("3.3.3.3").await.unwrap();
    let status = r.status().as_u16();
    let retry_after = header(&r, "retry-after");
    let b: Value = r.json().await.unwrap();
    assert_eq!(
        status, 429,
        "a third failure from the same caller, with a fresh `ip`: {b}"
    );
    let mut keys: Vec<&str> = b.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "allowed",
            "limit",
            "remaining",
            "reset",
            "retry_after",
            "scope",
            "window"
        ],
        "{b}"
    );
    assert_eq!(
        (
            b["allowed"].as_bool(),
            b["scope"].as_str(),
            b["limit"].as_u64(),
            b["remaining"].as_u64(),
            b["window"].as_str()
        ),
        (Some(false), Some("auth"), Some(2), Some(0), Some("1m")),
        "{b}"
    );
    assert!(b["reset"].as_u64().unwrap() > 1_700_000_000, "{b}");
    assert!(b["retry_after"].as_f64().unwrap() > 0.0, "{b}");
    assert!(
        retry_after.parse::<u64>().unwrap_or(0) >= 1,
        "{retry_after:?}"
    );
    // More rotation does not help either.
    assert_eq!(check("4.4.4.4").await.unwrap().status(), 429);
}

// ---------------------------------------------------------------------------------------
// 10. throttle demo across a reload

/// `throttle demo` points every route at its in-process echo upstream, also after a
/// reload re-reads a file whose upstream is unused.
#[tokio::test(flavor = "multi_thread")]
async fn demo_keeps_its_upstream_across_a_reload() {
    let body = "[[routes]]\nname = \"public\"\npath_prefix = \"/public\"\nupstreams = [\"127.0.0.1:9\"]\nauth = \"none\"\n";
    let gw = Gateway::start_with(&["demo"], body).await;
    let c = client();
    let get = || c.get(gw.url("/public/hello")).send();
    let r = get().await.unwrap();
    assert_eq!(r.status(), 200, "{}", gw.log());
    assert_eq!(
        r.json::<Value>().await.unwrap()["upstream"],
        "throttle-demo"
    );
    let r = c
        .post(gw.admin_url("/v1/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["reloaded"], true);
    for _ in 0..3 {
        let r = get().await.unwrap();
        assert_eq!(r.status(), 200, "after the reload:\n{}", gw.log());
        assert_eq!(
            r.json::<Value>().await.unwrap()["upstream"],
            "throttle-demo"
        );
    }
}
