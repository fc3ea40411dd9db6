//! Load generator of `benches/flood.sh`: a flood of HTTP/1.1 requests from one source
//! address, and a paced client from another, both on keep-alive connections over loopback.
//!
//! ```text
//! flood flood  --target 127.0.0.1:PORT --bind 127.0.0.2 --conns K --rate R --secs S
//!              [--warmup W] [--path /x]
//! flood client --target 127.0.0.1:PORT --bind 127.0.0.3 --rate R --secs S
//!              [--conns M] [--path /x]
//! ```
//!
//! `flood` opens K connections from `--bind` and pipelines requests on them (one
//! thread). With `--rate 0` every connection keeps its socket's send buffer full (as much
//! as TCP takes: the gateway's capacity for this traffic). With a rate, requests are due on
//! a fixed schedule, R a second over all connections; each millisecond a connection writes
//! what is due in one write, unless its socket still holds an unwritten part of the
//! previous batch: what TCP does not take then is counted as not taken and dropped (an
//! attacker's schedule does not wait for the gateway). A connection the gateway closes is
//! opened again. Prints one JSON object with the counts over the window from `--warmup`
//! (default 1 s) to `--secs`: `scheduled`, `written` (requests TCP took), `answered`
//! with `status` counts, `reconnects`, and the per-second rates.
//!
//! `client` sends R requests a second for S seconds from `--bind` (open loop: request i is
//! due at start + i/R whatever the previous ones are doing), on M keep-alive connections
//! (default 16), each its own blocking thread taking the next due request. Latency is
//! measured from the request's due time to the end of its answer, so a request that
//! waited for a free connection or a late thread counts the wait (no coordinated
//! omission), and also from the actual send. Prints one JSON object: `sent`, `ok`,
//! `limited`, `other`, `failed` (no answer within 10 s), `connects`, and percentiles
//! (microseconds) of both latencies and of the send's lateness.
//!
//! Without a mode (e.g. under a plain `cargo bench`) it prints how to run it and exits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memchr::memmem;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

/// A batch written at once: at most this many requests per connection and write.
const MAX_BATCH: u64 = 4096;
/// The schedule's tick: each connection writes what is due this often.
const TICK: Duration = Duration::from_millis(1);

struct Args {
    mode: String,
    target: SocketAddr,
    bind: IpAddr,
    conns: usize,
    rate: f64,
    secs: f64,
    warmup: f64,
    path: String,
}

fn args() -> Option<Args> {
    let mut it = std::env::args().skip(1);
    let mode = it.next()?;
    if mode != "flood" && mode != "client" {
        return None;
    }
    let mut a = Args {
        mode,
        target: "127.0.0.1:80".parse().ok()?,
        bind: "127.0.0.1".parse().ok()?,
        conns: 16,
        rate: 0.0,
        secs: 5.0,
        warmup: 1.0,
        path: "/x".to_string(),
    };
    while let Some(flag) = it.next() {
        let v = it.next()?;
        match flag.as_str() {
            "--target" => a.target = v.parse().ok()?,
            "--bind" => a.bind = v.parse().ok()?,
            "--conns" => a.conns = v.parse().ok()?,
            "--rate" => a.rate = v.parse().ok()?,
            "--secs" => a.secs = v.parse().ok()?,
            "--warmup" => a.warmup = v.parse().ok()?,
            "--path" => a.path = v,
            _ => return None,
        }
    }
    Some(a)
}

fn request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: flood\r\n\r\n").into_bytes()
}

/// A connection from `bind` (port chosen by the kernel) to `target`.
async fn connect(bind: IpAddr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(bind, 0))?;
    let stream = s.connect(target).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

// === flood ===

#[derive(Default)]
struct FloodTally {
    scheduled: AtomicU64,
    written_bytes: AtomicU64,
    s429: AtomicU64,
    s200: AtomicU64,
    other: AtomicU64,
    reconnects: AtomicU64,
    connect_errors: AtomicU64,
}

impl FloodTally {
    fn snapshot(&self, req_len: u64) -> [u64; 6] {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            l(&self.scheduled),
            l(&self.written_bytes) / req_len,
            l(&self.s429),
            l(&self.s200),
            l(&self.other),
            l(&self.reconnects),
        ]
    }
}

/// Counts the status lines of the answers read from `rd` until it closes.
async fn count_answers(mut rd: tokio::net::tcp::OwnedReadHalf, tally: Arc<FloodTally>) {
    const STATUS: &[u8] = b"HTTP/1.1 ";
    let finder = memmem::Finder::new(STATUS);
    let mut buf = vec![0u8; 256 * 1024];
    // Bytes kept from the previous read: a status line may straddle two reads.
    let mut carry = 0usize;
    loop {
        let n = match rd.read(&mut buf[carry..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let len = carry + n;
        let mut consumed = 0usize;
        for at in finder.find_iter(&buf[..len]) {
            let end = at + STATUS.len() + 3;
            if end > len {
                break;
            }
            match &buf[end - 3..end] {
                b"429" => &tally.s429,
                b"200" => &tally.s200,
                _ => &tally.other,
            }
            .fetch_add(1, Ordering::Relaxed);
            consumed = end;
        }
        let keep_from = consumed.max(len.saturating_sub(STATUS.len() + 2));
        buf.copy_within(keep_from..len, 0);
        carry = len - keep_from;
    }
}

/// One flooding connection until `end`: opened again whenever the gateway closes it.
async fn flood_conn(
    a: Arc<Args>,
    tally: Arc<FloodTally>,
    per_conn: f64,
    start: Instant,
    end: Instant,
) {
    let req = request(&a.path);
    let mut scheduled = 0u64;
    let mut first = true;
    while Instant::now() < end {
        let stream = match connect(a.bind, a.target).await {
            Ok(s) => s,
            Err(_) => {
                tally.connect_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if !first {
            tally.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        first = false;
        let (rd, wr) = stream.into_split();
        let reader = tokio::spawn(count_answers(rd, tally.clone()));
        let mut pending: Vec<u8> = Vec::new();
        let mut off = 0usize;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        'conn: while Instant::now() < end && !reader.is_finished() {
            let due = if per_conn > 0.0 {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = tokio::time::sleep_until(end) => break 'conn,
                }
                let want = (per_conn * start.elapsed().as_secs_f64()) as u64;
                let due = want.saturating_sub(scheduled);
                scheduled += due;
                tally.scheduled.fetch_add(due, Ordering::Relaxed);
                due
            } else {
                tokio::select! {
                    r = wr.writable() => if r.is_err() { break 'conn },
                    _ = tokio::time::sleep_until(end) => break 'conn,
                }
                256
            };
            // What is left of the previous batch goes first; a new batch only on an
            // empty buffer (otherwise this tick's requests are not taken).
            if off == pending.len() && due > 0 {
                pending.clear();
                off = 0;
                for _ in 0..due.min(MAX_BATCH) {
                    pending.extend_from_slice(&req);
                }
                if per_conn <= 0.0 {
                    tally.scheduled.fetch_add(256, Ordering::Relaxed);
                }
            }
            while off < pending.len() {
                match wr.try_write(&pending[off..]) {
                    Ok(n) => {
                        off += n;
                        tally.written_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => break 'conn,
                }
            }
        }
        reader.abort();
    }
}

async fn flood(a: Args) -> Value {
    let a = Arc::new(a);
    let tally = Arc::new(FloodTally::default());
    let req_len = request(&a.path).len() as u64;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(a.secs);
    let per_conn = a.rate / a.conns as f64;
    let tasks: Vec<_> = (0..a.conns)
        .map(|_| tokio::spawn(flood_conn(a.clone(), tally.clone(), per_conn, start, end)))
        .collect();
    tokio::time::sleep_until(start + Duration::from_secs_f64(a.warmup)).await;
    let (t0, c0) = (Instant::now(), tally.snapshot(req_len));
    tokio::time::sleep_until(end).await;
    let (t1, c1) = (Instant::now(), tally.snapshot(req_len));
    for t in tasks {
        let _ = t.await;
    }
    let secs = (t1 - t0).as_secs_f64();
    let d: Vec<u64> = c1.iter().zip(c0).map(|(b, a)| b - a).collect();
    let answered = d[2] + d[3] + d[4];
    json!({
        "conns": a.conns, "rate": a.rate, "window_secs": secs,
        "scheduled": d[0], "written": d[1], "answered": answered,
        "status": { "429": d[2], "200": d[3], "other": d[4] },
        "reconnects": d[5],
        "connect_errors": tally.connect_errors.load(Ordering::Relaxed),
        "per_sec": {
            "scheduled": d[0] as f64 / secs,
            "written": d[1] as f64 / secs,
            "answered": answered as f64 / secs,
            "429": d[2] as f64 / secs,
        },
    })
}

// === client ===

#[derive(Default)]
struct ClientTally {
    ok: AtomicU64,
    limited: AtomicU64,
    other: AtomicU64,
    failed: AtomicU64,
    connects: AtomicU64,
}

/// (from due time, from send, send lateness) in nanoseconds, one per answered request.
type Samples = Mutex<Vec<(u64, u64, u64)>>;

/// Reads one answer from `s`; its status, or None on a closed or broken connection.
fn read_answer(s: &mut std::net::TcpStream, buf: &mut Vec<u8>) -> Option<u16> {
    buf.clear();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = memmem::find(buf, b"\r\n\r\n") {
            break at + 4;
        }
        let n = s.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let status: u16 = head.get(9..12)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = s.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(status)
}

fn blocking_connect(rt: &tokio::runtime::Runtime, a: &Args) -> Option<std::net::TcpStream> {
    let s = rt
        .block_on(connect(a.bind, a.target))
        .ok()?
        .into_std()
        .ok()?;
    s.set_nonblocking(false).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    Some(s)
}

fn client_worker(
    a: &Args,
    next: &AtomicU64,
    n: u64,
    start: Instant,
    tally: &ClientTally,
    samples: &Samples,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let req = request(&a.path);
    // Connected before the first request is due, so no request's time includes a handshake
    // unless its connection was lost.
    let mut conn = blocking_connect(&rt, a);
    tally.connects.fetch_add(1, Ordering::Relaxed);
    let mut buf = Vec::with_capacity(4096);
    let mut mine = Vec::new();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        let due = start + Duration::from_secs_f64(i as f64 / a.rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if conn.is_none() {
            conn = blocking_connect(&rt, a);
            tally.connects.fetch_add(1, Ordering::Relaxed);
        }
        let sent = Instant::now();
        let status = conn.as_mut().and_then(|s| {
            s.write_all(&req).ok()?;
            read_answer(s, &mut buf)
        });
        let done = Instant::now();
        let Some(status) = status else {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            conn = None;
            continue;
        };
        match status {
            200 => &tally.ok,
            429 => &tally.limited,
            _ => &tally.other,
        }
        .fetch_add(1, Ordering::Relaxed);
        let ns = |d: Duration| d.as_nanos() as u64;
        mine.push((
            ns(done - due),
            ns(done - sent),
            ns(sent.saturating_duration_since(due)),
        ));
    }
    samples.lock().unwrap().extend(mine);
}

/// Percentiles (microseconds) of `v`, sorted in place.
fn percentiles(v: &mut [u64]) -> Value {
    v.sort_unstable();
    let p = |q: f64| {
        if v.is_empty() {
            return 0.0;
        }
        let k = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[k] as f64 / 1000.0
    };
    let mean = v.iter().sum::<u64>() as f64 / v.len().max(1) as f64 / 1000.0;
    json!({ "p50": p(0.50), "p90": p(0.90), "p99": p(0.99), "p999": p(0.999), "max": p(1.0), "mean": mean })
}

fn client(a: Args) -> Value {
    let n = (a.rate * a.secs).round() as u64;
    let next = AtomicU64::new(0);
    let tally = ClientTally::default();
    let samples: Samples = Mutex::new(Vec::with_capacity(n as usize));
    // The first request is due once every thread is up and connected.
    let start = Instant::now() + Duration::from_millis(200);
    std::thread::scope(|s| {
        for _ in 0..a.conns {
            s.spawn(|| client_worker(&a, &next, n, start, &tally, &samples));
        }
    });
    let samples = samples.into_inner().unwrap();
    let col = |k: usize| -> Vec<u64> { samples.iter().map(|s| [s.0, s.1, s.2][k]).collect() };
    let l = |x: &AtomicU64| x.load(Ordering::Relaxed);
    json!({
        "rate": a.rate, "secs": a.secs, "conns": a.conns, "sent": n,
        "ok": l(&tally.ok), "limited": l(&tally.limited), "other": l(&tally.other),
        "failed": l(&tally.failed), "connects": l(&tally.connects),
        "latency_us": percentiles(&mut col(0)),
        "service_us": percentiles(&mut col(1)),
        "send_late_us": percentiles(&mut col(2)),
    })
}

fn main() {
    let Some(a) = args() else {
        println!("flood: a load generator for benches/flood.sh (run that script)");
        return;
    };
    let out = if a.mode == "flood" {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(flood(a))
    } else {
        client(a)
    };
    println!("{out}");
}
