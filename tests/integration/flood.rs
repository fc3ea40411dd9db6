//! A flood from one address does not starve a polite client on the same worker: a
//! connection whose next request is already buffered (pipelined) is served one request
//! per turn, and the busy connections of one address share one turn. Counted on the
//! gateway's own metrics (requests answered while the polite request waited), not timed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{client, Gateway};

/// Every request over the ip limit, answered by the gateway itself (no upstream).
const BODY: &str = r#"
[limits.ip]
per_second = 1

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:9"]
auth = "none"
"#;

/// Connections of the flood, each with `PIPELINED` requests written at once.
const CONNECTIONS: usize = 32;
const PIPELINED: usize = 3_000;

/// 429s the gateway answered so far (`throttle_requests_total`, every route).
async fn refused(gw: &Gateway) -> u64 {
    gw.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("throttle_requests_total{") && l.contains("\"429\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// One flood connection from 127.0.0.2 (a client of its own, as in benches/flood.sh):
/// writes its requests at once, reading (and dropping) the answers until `stop`.
async fn flood(addr: SocketAddr, stop: Arc<AtomicBool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let write = tokio::spawn(async move {
        let all = b"GET /flood HTTP/1.1\r\nHost: h\r\n\r\n".repeat(PIPELINED);
        let _ = writer.write_all(&all).await;
        writer
    });
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(Duration::from_millis(100), reader.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            _ => {}
        }
    }
    write.abort();
}

/// While 32 pipelining connections from one address keep the gateway's one worker busy,
/// a request from another address is answered after a handful of the flood's answers,
/// not after a runtime budget's worth of each connection's (over a thousand in all).
#[tokio::test(flavor = "multi_thread")]
async fn a_pipelining_flood_from_one_address_takes_one_turn() {
    let gw = Gateway::start(BODY, None).await;
    let addr = gw.addr;
    let c = client();
    // The polite client's own address (127.0.0.1) is over its limit too: its answer is
    // a 429 like the flood's, so both cost the gateway the same.
    let stop = Arc::new(AtomicBool::new(false));
    let floods: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(flood(addr, stop))
        })
        .collect();
    // The flood is under way once the gateway has answered some of it.
    let started = refused(&gw).await;
    let mut before = started;
    for _ in 0..500 {
        before = refused(&gw).await;
        if before >= started + 500 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(before >= started + 500, "the flood did not start");
    // The least of five tries: the two scrapes' own round trips let some of the flood
    // through as well, more when the machine is busy.
    let mut least = u64::MAX;
    for _ in 0..5 {
        let at = refused(&gw).await;
        let r = c.get(gw.url("/polite")).send().await.unwrap();
        let status = r.status().as_u16();
        let after = refused(&gw).await;
        assert!(status == 200 || status == 429 || status == 502, "{status}");
        // Answered between the two scrapes: the flood's answers while the polite request
        // waited (and its own, and what the scrapes' own round trips let through).
        least = least.min(after.saturating_sub(at));
        assert!(
            after < started + (CONNECTIONS * PIPELINED) as u64,
            "the flood ended before the polite request was answered: the test proves nothing"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for f in floods {
        let _ = f.await;
    }
    eprintln!("flood: {least} answers of the flood while a polite request waited (least of 5)");
    assert!(
        least < 300,
        "{least} flood answers went ahead of one polite request (a turn per connection and \
         per address keeps it to a few)"
    );
}
