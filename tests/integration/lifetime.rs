//! The request lifetime through Pingora's phases: every admitted request is finished
//! exactly once, from the `logging` phase, however it ends. The gateway runs in this
//! process (so the test can hand it a store that counts endings) on real sockets, with a
//! real upstream.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::{RunArgs, ShutdownSignal, ShutdownSignalWatch};
use throttle::limiter::{Check, Verdict};
use throttle::server::{build, Built, Extras};
use throttle::store::{Ending, Held, LimitStore, MemoryStore, StoreError};

use crate::support::{client, eventually, free_port, Upstream};

/// A memory store that records how each admitted request ended.
#[derive(Default)]
struct Counting {
    inner: MemoryStore,
    endings: Mutex<Vec<Ending>>,
}

#[async_trait]
impl LimitStore for Counting {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        Ok(self.inner.decide(check))
    }
    fn name(&self) -> &'static str {
        "memory"
    }
    fn finish(&self, _held: Held, ending: Ending) {
        self.endings.lock().unwrap().push(ending);
    }
}

struct Stop(tokio::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>);

#[async_trait]
impl ShutdownSignalWatch for Stop {
    async fn recv(&self) -> ShutdownSignal {
        if let Some(rx) = self.0.lock().await.take() {
            let _ = rx.await;
        }
        ShutdownSignal::FastShutdown
    }
}

/// The gateway in a thread of this process; stopped on drop.
struct InProcess {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcess {
    async fn start(body: &str, store: Arc<Counting>) -> Self {
        let (port, admin) = (free_port(), free_port());
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\nthreads = 1\ngrace_period_secs = 0\nupgrade_sock = \"/tmp/throttle-lifetime-{port}.sock\"\n{body}"
        );
        let config = throttle::config::parse("lifetime.toml", &toml).unwrap();
        let Built { mut server, .. } = build(
            config,
            Extras {
                store: Some(store),
                ..Extras::default()
            },
        )
        .unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            server.bootstrap();
            server.run(RunArgs {
                shutdown_signal: Box::new(Stop(tokio::sync::Mutex::new(Some(rx)))),
            });
        });
        let addr = ([127, 0, 0, 1], port).into();
        eventually(
            Duration::from_secs(20),
            "in-process gateway up",
            || async move { TcpStream::connect(addr).is_ok().then_some(()) },
        )
        .await;
        Self {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_request_is_finished_exactly_once() {
    let up = Upstream::start("u").await;
    let dead = free_port(); // nothing listens there
    let body = format!(
        r#"
[[routes]]
name = "ok"
path_prefix = "/ok"
upstreams = ["{up}"]
auth = "none"

[[routes]]
name = "dead"
path_prefix = "/dead"
upstreams = ["127.0.0.1:{dead}"]
auth = "none"
connect_timeout_ms = 200

[[routes]]
name = "keyed"
path_prefix = "/keyed"
upstreams = ["{up}"]
auth = "required"
"#,
        up = up.addr
    );
    let store = Arc::new(Counting::default());
    let gw = InProcess::start(&body, store.clone()).await;
    let url = |p: &str| format!("http://{}{p}", gw.addr);
    let endings = || store.endings.lock().unwrap().clone();

    // Success.
    assert_eq!(
        client().get(url("/ok/x")).send().await.unwrap().status(),
        200
    );
    // The upstream is down: 502.
    assert_eq!(
        client().get(url("/dead/x")).send().await.unwrap().status(),
        502
    );
    // Refused at admission (401): nothing was admitted, nothing to finish.
    assert_eq!(
        client().get(url("/keyed/x")).send().await.unwrap().status(),
        401
    );
    eventually(Duration::from_secs(5), "two endings", || async {
        (endings().len() == 2).then_some(())
    })
    .await;
    assert_eq!(
        endings(),
        [Ending::Completed { status: 200 }, Ending::UpstreamFailed]
    );

    // The client goes away while the upstream is still working on its request.
    let mut conn = TcpStream::connect(gw.addr).unwrap();
    conn.write_all(b"GET /ok/slow?delay_ms=800 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // let it reach the upstream
    drop(conn);
    eventually(
        Duration::from_secs(5),
        "the abandoned request ends",
        || async { (endings().len() == 3).then_some(()) },
    )
    .await;
    assert_eq!(endings()[2], Ending::ClientGone);

    // A keep-alive connection with several requests: one ending each.
    let mut conn = TcpStream::connect(gw.addr).unwrap();
    for _ in 0..3 {
        conn.write_all(b"GET /ok/y HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0);
    }
    eventually(Duration::from_secs(5), "six endings", || async {
        (endings().len() == 6).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(endings().len(), 6, "no request finished twice");
}
