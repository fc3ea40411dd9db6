//! A TCP proxy between regions: on 127.0.0.1:0 in front of a target address, it delays
//! every chunk by a one-way delay in each direction (order kept), and it can cut the link
//! and heal it. It stops on drop (its connections close with it).
//!
//! A cut is a network partition, not a dead host: nothing passes either way and nothing
//! is closed or refused. A connection that exists stops passing bytes; what is sent
//! meanwhile is held and delivered in order after the heal, as TCP retransmits what a
//! partition dropped once the path is back (before its retransmission timeout). A new
//! connection hangs: the kernel completes the handshake (a userspace proxy cannot hold
//! back a SYN-ACK), but the proxy connects it to the target only after the heal, so no
//! request on it is answered before then. Refusing (a RST) would say "the host is up and
//! nothing listens": what a client sees of a crashed server, not of a partition.
//!
//! A side that resets its connection during a cut (a close with `SO_LINGER` 0) loses
//! what the proxy holds from it: those bytes stand for its kernel's unacknowledged send
//! queue, which a reset discards, and the connection ends without delivering them. A
//! reset outside a cut delivers what was sent before it, as the wire would. (A reset is
//! judged by whether the link is cut when the proxy reads it, a moment after it came.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// The proxy; see the module docs.
pub struct DelayProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl DelayProxy {
    /// A proxy to `target` adding `delay` one way (so twice that to a round trip).
    pub async fn start(target: SocketAddr, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, watch) = watch::channel(false);
        let task = tokio::spawn(serve(listener, target, delay, watch));
        Self { addr, cut, task }
    }

    /// Cuts the link: from now on no byte passes either way until [`Self::heal`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Heals the link: held bytes flow again, in order.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it drops them all.
        self.task.abort();
    }
}

async fn serve(
    listener: TcpListener,
    target: SocketAddr,
    delay: Duration,
    cut: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        if let Ok((client, _)) = listener.accept().await {
            connections.spawn(connection(client, target, delay, cut.clone()));
        }
        while connections.try_join_next().is_some() {}
    }
}

/// Waits while the link is cut (returns at once when it is not).
async fn passable(cut: &mut watch::Receiver<bool>) {
    let _ = cut.wait_for(|cut| !*cut).await;
}

async fn connection(
    client: TcpStream,
    target: SocketAddr,
    delay: Duration,
    mut cut: watch::Receiver<bool>,
) {
    // The client's bytes are read (and held) from the start, so a reset during a cut is
    // seen; the target is connected once the link passes.
    let (client_read, client_write) = client.into_split();
    let (up, reset, reading) = Held::read(client_read, delay, cut.clone());
    let forward = async move {
        passable(&mut cut).await;
        if reset.load(Ordering::Acquire) {
            return;
        }
        let Ok(server) = TcpStream::connect(target).await else {
            return;
        };
        let (server_read, server_write) = server.into_split();
        tokio::join!(
            up.write(server_write, reset, cut.clone()),
            pipe(server_read, client_write, delay, cut),
        );
    };
    tokio::join!(reading, forward);
}

/// Copies `from` to `to`, each chunk (and the end of stream) `delay` after it was read,
/// in order, and nothing while the link is cut; a reset of `from` during a cut drops
/// what is held (see the module docs).
async fn pipe(
    from: OwnedReadHalf,
    to: OwnedWriteHalf,
    delay: Duration,
    cut: watch::Receiver<bool>,
) {
    let (held, reset, reading) = Held::read(from, delay, cut.clone());
    tokio::join!(reading, held.write(to, reset, cut));
}

/// What one side sent, held for its delay and while the link is cut: the chunks (`None`
/// for the end of stream) with the time each is due.
struct Held(mpsc::UnboundedReceiver<(Instant, Option<Vec<u8>>)>);

impl Held {
    /// What `from` sends, a flag that turns true when `from` is reset during a cut, and
    /// the future that reads it until its end (to be polled beside the writing).
    fn read(
        mut from: OwnedReadHalf,
        delay: Duration,
        cut: watch::Receiver<bool>,
    ) -> (Self, Arc<AtomicBool>, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let reset = Arc::new(AtomicBool::new(false));
        let seen = reset.clone();
        let reading = async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(n) => n,
                    Err(_) => {
                        if *cut.borrow() {
                            seen.store(true, Ordering::Release);
                        }
                        0
                    }
                };
                let chunk = (n > 0).then(|| buf[..n].to_vec());
                let end = chunk.is_none();
                if tx.send((Instant::now() + delay, chunk)).is_err() || end {
                    return;
                }
            }
        };
        (Self(rx), reset, reading)
    }

    /// Writes the chunks to `to` as they fall due and the link passes; stops at the end
    /// of stream, or without writing more once the sender was reset during a cut.
    async fn write(
        mut self,
        mut to: OwnedWriteHalf,
        reset: Arc<AtomicBool>,
        mut cut: watch::Receiver<bool>,
    ) {
        while let Some((due, chunk)) = self.0.recv().await {
            tokio::time::sleep_until(due).await;
            passable(&mut cut).await;
            if reset.load(Ordering::Acquire) {
                return;
            }
            let Some(chunk) = chunk else {
                let _ = to.shutdown().await;
                return;
            };
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    }
}
