//! Real peers for the integration tests: an echo upstream, the gateway binary, raw HTTP.
//! Each helper waits for readiness (never a fixed sleep) and cleans up on drop.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use tempfile::TempDir;

pub mod decoding;
pub mod delay_proxy;
pub mod jwt;
pub mod kinds;
pub mod nginx;
pub mod postgres;
pub mod redis;
pub mod tls;
pub mod webdriver;

/// The admin token every test gateway is started with.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// Polls `f` every 10 ms until it returns Some, or panics after `patience`.
pub async fn eventually<T, F, Fut>(patience: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + patience;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {patience:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A free loopback port (bind :0, read, release). Races are handled by retrying starts.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The echo upstream (`throttle::demo`) on an ephemeral port, stopped on drop.
pub struct Upstream {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Upstream {
    pub async fn start(label: &'static str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(throttle::demo::serve(listener, label, async move {
            let _ = rx.await;
        }));
        Self {
            addr,
            stop: Some(tx),
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// The real `throttle` binary running a rendered config; killed on drop.
pub struct Gateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// The instance id rendered into the config: readiness is only believed from it, so a
    /// port taken by another test's gateway is never mistaken for ours.
    pub id: String,
    child: Child,
    dir: TempDir,
}

impl Gateway {
    /// Starts `throttle run` with `body` (everything but `[server]`); `{upstream}` in the body
    /// is replaced by `upstream`'s address.
    pub async fn start(body: &str, upstream: Option<&Upstream>) -> Self {
        let body = match upstream {
            Some(u) => body.replace("{upstream}", &u.addr.to_string()),
            None => body.to_string(),
        };
        Self::start_with(&["run"], &body).await
    }

    /// Starts the binary with `args` + `--config <rendered>`, retrying on port races.
    pub async fn start_with(args: &[&str], body: &str) -> Self {
        Self::start_full(args, body, "grace_period_secs = 0").await
    }

    /// As `start_with`, with extra `[server]` lines (e.g. a grace period).
    pub async fn start_full(args: &[&str], body: &str, server_extra: &str) -> Self {
        Self::start_env(args, body, server_extra, &[]).await
    }

    /// As `start_full`, with environment changes for the process (`None`: removed).
    pub async fn start_env(
        args: &[&str],
        body: &str,
        server_extra: &str,
        env: &[(&str, Option<&str>)],
    ) -> Self {
        Self::spawn(args, body, server_extra, env, "/readyz").await
    }

    /// Starts `throttle run` with `body` and waits only until it is alive (`/healthz`
    /// 200), not ready: for gateways whose database or key set is not there yet.
    pub async fn start_live(body: &str, server_extra: &str) -> Self {
        Self::spawn(&["run"], body, server_extra, &[], "/healthz").await
    }

    async fn spawn(
        args: &[&str],
        body: &str,
        server_extra: &str,
        env: &[(&str, Option<&str>)],
        probe: &str,
    ) -> Self {
        for _ in 0..5 {
            let (port, admin_port) = (free_port(), free_port());
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("gateway.toml");
            let id = format!("test-{port}-{admin_port}-{}", std::process::id());
            let server = format!("[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\ninstance_id = \"{id}\"\nthreads = 1\n{server_extra}\n\n");
            std::fs::write(&path, format!("{server}{body}")).unwrap();
            let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_throttle"));
            for (k, v) in env {
                match v {
                    Some(v) => cmd.env(k, v),
                    None => cmd.env_remove(k),
                };
            }
            let child = cmd
                .args(args)
                .arg("--config")
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
            let mut gw = Gateway {
                addr: ([127, 0, 0, 1], port).into(),
                admin: ([127, 0, 0, 1], admin_port).into(),
                id,
                child,
                dir,
            };
            if gw.wait_for(probe).await {
                return gw;
            }
        }
        panic!("gateway did not become ready");
    }

    async fn wait_for(&mut self, probe: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = client();
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                eprintln!("gateway exited early ({status}):\n{}", self.log());
                return false;
            }
            let ready = client
                .get(format!("http://{}{probe}", self.admin))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            let proxy_up = TcpStream::connect(self.addr).is_ok();
            if ready && proxy_up {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// The gateway's process id (for /proc/<pid>/status).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.toml")
    }

    /// Replaces everything after `[server]` in the config file (for reload tests).
    pub fn rewrite(&self, body: &str) {
        let current = std::fs::read_to_string(self.config_path()).unwrap();
        let server = current.split("\n\n").next().unwrap();
        std::fs::write(self.config_path(), format!("{server}\n\n{body}")).unwrap();
    }

    /// Sends `signal` ("HUP", "TERM", ...) to the gateway process.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal}");
    }

    /// Waits up to `patience` for the process to exit.
    pub async fn wait_exit(&mut self, patience: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// The `/readyz` JSON.
    pub async fn readyz(&self) -> serde_json::Value {
        client()
            .get(self.admin_url("/readyz"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn metrics(&self) -> String {
        client()
            .get(self.admin_url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that never uses a proxy from the environment.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A header value as a string ("" when absent).
pub fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// One raw HTTP/1.1 exchange on a connection: writes `request`, returns (status, head, body).
pub fn raw_exchange(stream: &mut TcpStream, request: &[u8]) -> Option<(u16, String, Vec<u8>)> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).ok()?;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).ok()?;
    Some((status, head, body))
}

/// Status of one raw request on a fresh connection (None: the connection was closed).
pub fn raw_status(addr: SocketAddr, request: &[u8]) -> Option<u16> {
    let mut s = TcpStream::connect(addr).unwrap();
    raw_exchange(&mut s, request).map(|(status, _, _)| status)
}

/// An upstream whose `/healthz` answers 200 or 503 on demand; every other path answers
/// 200 with `{"upstream": label}` and is counted (health checks are not).
pub struct HealthUpstream {
    pub addr: SocketAddr,
    pub healthy: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub served: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl HealthUpstream {
    pub async fn start(label: &'static str) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let healthy = Arc::new(AtomicBool::new(true));
        let served = Arc::new(AtomicUsize::new(0));
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let (h, s) = (healthy.clone(), served.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = &mut rx => return,
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                };
                let (h, s) = (h.clone(), s.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let (h, s) = (h.clone(), s.clone());
                            async move {
                                let (status, body) = if req.uri().path() == "/healthz" {
                                    if h.load(Ordering::SeqCst) {
                                        (200, "ok".to_string())
                                    } else {
                                        (503, "down".to_string())
                                    }
                                } else {
                                    s.fetch_add(1, Ordering::SeqCst);
                                    (200, format!("{{\"upstream\":\"{label}\"}}"))
                                };
                                let mut resp = hyper::Response::new(http_body_util::Full::new(
                                    bytes::Bytes::from(body),
                                ));
                                *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                                Ok::<_, std::convert::Infallible>(resp)
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            healthy,
            served,
            stop: Some(tx),
        }
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.healthy
            .store(healthy, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn served(&self) -> usize {
        self.served.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for HealthUpstream {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}
