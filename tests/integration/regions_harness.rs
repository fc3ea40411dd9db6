//! The regions harness: a delay-injecting, cuttable TCP proxy in front of a real
//! redis-server, as the link from one region to another region's Redis.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

use crate::support::delay_proxy::DelayProxy;
use crate::support::redis::RedisServer;

/// Longer than any round trip here by far; a command unanswered for this long is cut.
const CUT_PATIENCE: Duration = Duration::from_millis(400);

async fn redis_behind(delay_ms: u64) -> (RedisServer, DelayProxy) {
    let redis = RedisServer::start().await;
    let target = SocketAddr::from(([127, 0, 0, 1], redis.port));
    let proxy = DelayProxy::start(target, Duration::from_millis(delay_ms)).await;
    (redis, proxy)
}

async fn send_ping(s: &mut TcpStream) {
    s.write_all(b"PING\r\n").await.unwrap();
}

/// The reply to one inline PING (`+PONG\r\n`, 7 bytes).
async fn read_pong(s: &mut TcpStream) -> [u8; 7] {
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).await.unwrap();
    buf
}

#[tokio::test]
async fn a_ping_through_a_50ms_proxy_takes_at_least_a_100ms_round_trip() {
    let (_redis, proxy) = redis_behind(50).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    for _ in 0..3 {
        let start = Instant::now();
        send_ping(&mut s).await;
        assert_eq!(&read_pong(&mut s).await, b"+PONG\r\n");
        let rtt = start.elapsed();
        assert!(rtt >= Duration::from_millis(100), "round trip {rtt:?}");
        assert!(rtt < Duration::from_secs(2), "round trip {rtt:?}");
    }
    // And through redis-rs, as the regions' sync will talk to a peer's Redis.
    let client = redis::Client::open(format!("redis://{}", proxy.addr)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let start = Instant::now();
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
    assert!(
        start.elapsed() >= Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_cut_holds_every_command_until_the_heal() {
    let (_redis, proxy) = redis_behind(5).await;
    let mut open = TcpStream::connect(proxy.addr).await.unwrap();
    send_ping(&mut open).await;
    assert_eq!(&read_pong(&mut open).await, b"+PONG\r\n");
    let client = redis::Client::open(format!("redis://{}", proxy.addr)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();

    proxy.cut();
    // An open connection passes nothing: the command times out.
    send_ping(&mut open).await;
    assert!(timeout(CUT_PATIENCE, read_pong(&mut open)).await.is_err());
    let ping = redis::cmd("PING");
    let rs = timeout(CUT_PATIENCE, ping.query_async::<String>(&mut conn)).await;
    assert!(rs.is_err(), "redis-rs got an answer through a cut: {rs:?}");
    // A new connection is not refused: it hangs.
    let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
    send_ping(&mut fresh).await;
    assert!(timeout(CUT_PATIENCE, read_pong(&mut fresh)).await.is_err());
    let opened = timeout(CUT_PATIENCE, client.get_multiplexed_async_connection()).await;
    assert!(
        opened.is_err(),
        "a redis-rs connection opened through a cut"
    );

    proxy.heal();
    // What was held is delivered, in order, then everything works again.
    let patience = Duration::from_secs(5);
    for s in [&mut open, &mut fresh] {
        let held = timeout(patience, read_pong(s)).await.unwrap();
        assert_eq!(&held, b"+PONG\r\n");
        send_ping(s).await;
        assert_eq!(
            &timeout(patience, read_pong(s)).await.unwrap(),
            b"+PONG\r\n"
        );
    }
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn the_proxy_stops_on_drop() {
    let (_redis, proxy) = redis_behind(5).await;
    let addr = proxy.addr;
    let mut s = TcpStream::connect(addr).await.unwrap();
    send_ping(&mut s).await;
    assert_eq!(&read_pong(&mut s).await, b"+PONG\r\n");
    drop(proxy);
    // The open connection is closed (end of stream) and nothing listens any more.
    let mut buf = [0u8; 1];
    let read = timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap();
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    crate::support::eventually(Duration::from_secs(5), "the listener closed", || async {
        TcpStream::connect(addr).await.is_err().then_some(())
    })
    .await;
}

#[tokio::test]
async fn chunks_keep_their_order_through_the_delay() {
    let (_redis, proxy) = redis_behind(20).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let mut expected = Vec::new();
    for i in 0..200 {
        // One write per command, so the proxy sees many chunks in flight at once.
        s.write_all(format!("ECHO e{i:03}\r\n").as_bytes())
            .await
            .unwrap();
        expected.extend_from_slice(format!("$4\r\ne{i:03}\r\n").as_bytes());
    }
    let mut got = vec![0u8; expected.len()];
    timeout(Duration::from_secs(10), s.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&expected)
    );
}

/// A connection closed during a cut delivers what it sent at the heal (the kernel goes on
/// retransmitting it); one reset during a cut (`SO_LINGER` 0) delivers nothing, as a
/// reset discards the kernel's send queue.
#[tokio::test]
async fn a_reset_during_a_cut_drops_what_the_cut_held_and_a_close_does_not() {
    let (redis, proxy) = redis_behind(5).await;
    let (mut closed, mut reset) = (
        TcpStream::connect(proxy.addr).await.unwrap(),
        TcpStream::connect(proxy.addr).await.unwrap(),
    );
    for s in [&mut closed, &mut reset] {
        send_ping(s).await;
        assert_eq!(&read_pong(s).await, b"+PONG\r\n");
    }
    proxy.cut();
    // A connection opened during the cut is held as well.
    let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
    closed.write_all(b"INCR closed\r\n").await.unwrap();
    reset.write_all(b"INCR reset\r\n").await.unwrap();
    fresh.write_all(b"INCR reset\r\n").await.unwrap();
    // Past the delay, so the proxy holds the commands for the heal.
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(closed);
    for s in [reset, fresh] {
        redis::io::tcp::socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.heal();
    let mut c = redis.client().await;
    crate::support::eventually(Duration::from_secs(5), "the closed one's INCR", || {
        let mut c = c.clone();
        async move {
            let n: Option<i64> = redis::cmd("GET")
                .arg("closed")
                .query_async(&mut c)
                .await
                .ok()?;
            (n == Some(1)).then_some(())
        }
    })
    .await;
    // The reset ones' INCRs, held alongside, did not come.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let n: Option<i64> = redis::cmd("GET")
        .arg("reset")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, None, "a reset connection's held command was delivered");
}
