//! One HTTP edge for every transport: the listener's per-client connection cap and the
//! `ip` limits key a client on the same canonical address (`edge::peer_ip`), and the tower
//! layer ends a request as the proxy does (a client gone before the answer pays
//! `max_cost`; `X-Request-Id` on every answer).
//!
//! Loopback cannot bind a NAT64 address (`64:ff9b::/96`), so the end-to-end case is an
//! IPv4 client of a dual-stack (`[::]`) listener, which sees it as `::ffff:a.b.c.d`; the
//! NAT64 form is spent through `/v1/check`, and the listener's peer read of a NAT64 peer
//! is a unit test (`listener::tests`).

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use serde_json::json;
use tempfile::TempDir;
use throttle::admission::{Core, Runtime};
use throttle::clock::ManualClock;
use throttle::layer::ThrottleLayer;
use throttle::metrics::Metrics;
use throttle::store::MemoryStore;
use tower::{Layer, ServiceExt};

use crate::support::{client, eventually, free_port, Upstream, ADMIN_TOKEN};

/// `throttle run` with its proxy listening on `[::]` (dual stack); killed on drop.
struct DualStack {
    port: u16,
    admin: SocketAddr,
    child: Child,
    _dir: TempDir,
}

/// The echo upstream's label: a proxy answering with it is this test's gateway.
const LABEL: &str = "one-edge-upstream";

impl DualStack {
    /// Starts the gateway on a port free for IPv4 and IPv6 alike, retried until the
    /// proxy answering on it is this one (another test's gateway may take the port).
    async fn start(body: &str, server_extra: &str) -> Self {
        for _ in 0..5 {
            let gw = Self::spawn(body, server_extra);
            if gw.ready().await {
                return gw;
            }
        }
        panic!("the dual-stack gateway did not become ready");
    }

    fn spawn(body: &str, server_extra: &str) -> Self {
        let port = std::net::TcpListener::bind("[::]:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let admin_port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        let server = format!(
            "[server]\nlisten = \"[::]:{port}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\nthreads = 1\ngrace_period_secs = 0\n{server_extra}\n\n"
        );
        std::fs::write(&path, format!("{server}{body}")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_throttle"))
            .args(["run", "--config"])
            .arg(&path)
            .env("THROTTLE_ADMIN_TOKEN", ADMIN_TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self {
            port,
            admin: ([127, 0, 0, 1], admin_port).into(),
            child,
            _dir: dir,
        }
    }

    /// Whether the admin API is ready and the proxy on the port is this gateway's (its
    /// answer comes from this test's upstream), within 30 s.
    async fn ready(&self) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let ready = client().get(format!("http://{}/readyz", self.admin));
        while tokio::time::Instant::now() < deadline {
            let admin = ready.try_clone().unwrap().send().await;
            let proxy_up = TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            if proxy_up && admin.is_ok_and(|r| r.status() == 200) {
                let (status, answer) = self.get_from([127, 0, 0, 1]).await;
                return status == 200 && answer.contains(LABEL);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// A connection to the proxy from `source` (127.0.0.x), over IPv4.
    async fn connect_from(&self, source: [u8; 4]) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((source, 0))).unwrap();
        let to = SocketAddr::from(([127, 0, 0, 1], self.port));
        let stream = socket.connect(to).await.unwrap().into_std().unwrap();
        stream.set_nonblocking(false).unwrap();
        stream
    }

    /// One `GET /x` from `source` on a new connection: its status (0: none, or refused
    /// at connect by the cap's 503).
    async fn get_from(&self, source: [u8; 4]) -> (u16, String) {
        let mut s = self.connect_from(source).await;
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        let status = answer.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, answer)
    }
}

impl Drop for DualStack {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `stream` is open and unanswered.
fn still_open(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let open =
        matches!((&*stream).read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    open
}

/// Whether `stream`'s peer has closed it, or answered (the cap's 503), within `wait`.
fn answered_or_closed(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 256];
    !matches!(stream.read(&mut buf), Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

/// An IPv4 client of a dual-stack listener (peer `::ffff:127.0.0.x`) is one IPv4 client:
/// the per-client connection cap counts 127.0.0.2 apart from 127.0.0.1 (not as one IPv6
/// /64 holding every mapped address), and the `ip` limit it spends through the proxy is the
/// one `/v1/check` spends for its NAT64 form (`64:ff9b::7f00:2`) and its IPv4 form.
#[tokio::test(flavor = "multi_thread")]
async fn mapped_and_nat64_clients_are_their_ipv4_client() {
    let up = Upstream::start(LABEL).await;
    let body = format!(
        "[limits.ip]\nper_minute = 3\nalgorithm = \"fixed_window\"\n\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstreams = [\"{}\"]\nauth = \"none\"\n",
        up.addr
    );
    let gw = DualStack::start(
        &body,
        "header_timeout_secs = 30\nmax_connections_per_ip = 2",
    )
    .await;

    // The cap: two idle connections from 127.0.0.1 are its whole share (retried until
    // the probes' connections have given their slots back).
    let held = eventually(
        Duration::from_secs(10),
        "a third from 127.0.0.1 refused",
        || async {
            let held = [
                gw.connect_from([127, 0, 0, 1]).await,
                gw.connect_from([127, 0, 0, 1]).await,
            ];
            let refused = gw.get_from([127, 0, 0, 1]).await.0 == 503;
            (refused && held.iter().all(still_open)).then_some(held)
        },
    )
    .await;
    // Another IPv4 client is not in that share.
    let mut other = gw.connect_from([127, 0, 0, 2]).await;
    assert!(
        !answered_or_closed(&mut other, Duration::from_millis(500)),
        "127.0.0.2 was refused with 127.0.0.1's connections"
    );
    drop((held, other));

    // The `ip` limit: one request through the proxy from 127.0.0.2 ...
    let (status, answer) = gw.get_from([127, 0, 0, 2]).await;
    assert_eq!(status, 200, "{answer}");
    // ... and one through /v1/check for each other form of the address.
    let c = client();
    for (ip, left) in [("64:ff9b::7f00:2", "1"), ("127.0.0.2", "0")] {
        let r = c
            .post(format!("http://{}/v1/check", gw.admin))
            .json(&json!({"ip": ip}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{ip}");
        assert_eq!(r.headers()["x-ratelimit-remaining"], left, "{ip}");
    }
    let (status, answer) = gw.get_from([127, 0, 0, 2]).await;
    assert_eq!(status, 429, "the mapped client's budget is spent: {answer}");
    let (status, answer) = gw.get_from([127, 0, 0, 3]).await;
    assert_eq!(status, 200, "another client's budget is its own: {answer}");
}

/// A layer whose route reserves 1 and settles from `x-usage` up to `max_cost = 10`, on an
/// `ip` budget of 10 a minute.
fn costly_layer() -> ThrottleLayer {
    let clock = ManualClock::at(1_764_000_000_000);
    let config = throttle::config::parse(
        "test.toml",
        r#"
[limits.ip]
per_minute = 10
algorithm = "fixed_window"

[[routes]]
name = "llm"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
cost_header = "x-usage"
max_cost = 10
"#,
    )
    .unwrap();
    let core = Core::with_clock(
        Runtime::from_config(config).unwrap(),
        Arc::new(MemoryStore::with_clock(clock.clone())),
        Arc::new(Metrics::new().unwrap()),
        Arc::new(clock),
    )
    .unwrap();
    ThrottleLayer::from_core(Arc::new(core))
}

fn get(peer: [u8; 4], headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::get("/chat")
        .header("host", "api.example.com")
        .extension(SocketAddr::from((peer, 40_000)));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

/// A client cannot pay less by leaving: a response future dropped before the inner
/// service answered settles at the route's `max_cost`, as the proxy settles a client gone
/// before the upstream's answer.
#[tokio::test]
async fn a_dropped_layer_future_pays_max_cost() {
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel::<()>();
    // Holds a request sent with `x-hold` forever; answers any other at once.
    let inner = tower::service_fn(move |req: Request<Body>| {
        let entered = entered_tx.clone();
        async move {
            if req.headers().contains_key("x-hold") {
                let _ = entered.send(());
                std::future::pending::<()>().await;
            }
            Ok::<_, Infallible>(Response::new(Body::empty()))
        }
    });
    let svc = costly_layer().layer(inner);
    let peer = [192, 0, 2, 40];
    let gone = tokio::spawn(svc.clone().oneshot(get(peer, &[("x-hold", "1")])));
    entered.recv().await.unwrap();
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    // 1 reserved, then settled at 10 when the future was dropped: nothing left.
    let r = svc.oneshot(get(peer, &[])).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// The layer's `X-Request-Id`: an untrusted client's id is replaced; the inner service
/// gets the id the answer carries, and a refusal carries one too.
#[tokio::test]
async fn the_layer_keeps_a_request_id() {
    let inner = tower::service_fn(|req: Request<Body>| async move {
        let id = req.headers()["x-request-id"].clone();
        let mut r = Response::new(Body::empty());
        r.headers_mut().insert("x-seen-id", id);
        r.headers_mut()
            .insert("x-usage", http::HeaderValue::from_static("10"));
        Ok::<_, Infallible>(r)
    });
    let svc = costly_layer().layer(inner);
    let peer = [192, 0, 2, 41];
    let r = svc
        .clone()
        .oneshot(get(peer, &[("x-request-id", "client-chosen")]))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let id = r.headers()["x-request-id"].clone();
    assert_ne!(id, "client-chosen");
    assert_eq!(id.len(), 32);
    assert_eq!(r.headers()["x-seen-id"], id);
    let refused = svc.oneshot(get(peer, &[])).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["x-request-id"].len(), 32);
}
