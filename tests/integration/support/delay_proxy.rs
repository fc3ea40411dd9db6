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

use std::net::SocketAddr;
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
    passable(&mut cut).await;
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pipe(client_read, server_write, delay, cut.clone()),
        pipe(server_read, client_write, delay, cut),
    );
}

/// Copies `from` to `to`, each chunk (and the end of stream) `delay` after it was read,
/// in order, and nothing while the link is cut.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: Duration,
    mut cut: watch::Receiver<bool>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Option<Vec<u8>>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = from.read(&mut buf).await.unwrap_or(0);
            let chunk = (n > 0).then(|| buf[..n].to_vec());
            let end = chunk.is_none();
            if tx.send((Instant::now() + delay, chunk)).is_err() || end {
                return;
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            passable(&mut cut).await;
            let Some(chunk) = chunk else {
                let _ = to.shutdown().await;
                return;
            };
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(read, write);
}
