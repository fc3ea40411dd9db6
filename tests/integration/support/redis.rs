//! Private redis-server processes for tests: one node, or a 3-primary cluster, on free
//! loopback ports with no persistence; killed on drop. When `redis-server`/`redis-cli` are
//! missing they are installed (apt-get, as root) or the test fails naming the command.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;
use tokio::time::Instant;

use super::free_port;

#[path = "install.rs"]
pub mod install;

/// What to run when the Redis binaries are missing and the tests cannot install them.
const REDIS_INSTALL: &str = "sudo apt-get install redis-server redis-tools";

/// `redis-server` and `redis-cli` on PATH: checked once per test process, installed with
/// apt-get when missing and running as root, else a panic naming the command. Never a
/// skip, locally or under CI.
pub fn require_redis() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) = READY.get_or_init(ensure_redis) {
        panic!("{e}");
    }
}

fn ensure_redis() -> Result<(), String> {
    let present =
        || install::on_path("redis-server").is_some() && install::on_path("redis-cli").is_some();
    if present() {
        return Ok(());
    }
    let missing = "redis-server and redis-cli are needed (the Redis tests start their own \
                   servers) and are not on PATH";
    if !install::can_apt_install() {
        return Err(format!("{missing}; install them with: {REDIS_INSTALL}"));
    }
    let _lock = install::InstallLock::acquire();
    if !present() {
        install::apt_install(&["redis-server", "redis-tools"], true).map_err(|e| {
            format!("{missing}; installing them failed ({e}); run: {REDIS_INSTALL}")
        })?;
    }
    if present() {
        Ok(())
    } else {
        Err(format!(
            "{missing}, even after apt-get install; run: {REDIS_INSTALL}"
        ))
    }
}

/// One redis-server.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra: &[&str]) -> Self {
        require_redis();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let mut s = RedisServer {
                port: free_port(),
                child: None,
                dir,
                extra: extra.iter().map(|s| s.to_string()).collect(),
            };
            s.spawn();
            if s.wait_ready().await {
                return s;
            }
        }
        panic!("redis-server did not start");
    }

    /// A server on a given port (to bring a killed one back).
    pub async fn start_on(port: u16) -> Self {
        require_redis();
        let mut s = RedisServer {
            port,
            child: None,
            dir: tempfile::tempdir().unwrap(),
            extra: Vec::new(),
        };
        s.spawn();
        assert!(
            s.wait_ready().await,
            "redis-server did not restart on {port}"
        );
        s
    }

    /// A server that also serves TLS on `tls_port` with `cert.pem`/`key.pem` from `dir`
    /// (clients are not asked for certificates); the plain port stays for assertions.
    pub async fn start_tls(certs: &std::path::Path) -> (Self, u16) {
        for _ in 0..5 {
            let tls_port = free_port();
            let path = |f: &str| certs.join(f).to_str().unwrap().to_string();
            let extra = [
                "--tls-port".to_string(),
                tls_port.to_string(),
                "--tls-cert-file".to_string(),
                path("cert.pem"),
                "--tls-key-file".to_string(),
                path("key.pem"),
                "--tls-ca-cert-file".to_string(),
                path("ca.pem"),
                "--tls-auth-clients".to_string(),
                "no".to_string(),
            ];
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let s = Self::start_with(&extra).await;
            if TcpStream::connect(("127.0.0.1", tls_port)).is_ok() {
                return (s, tls_port);
            }
        }
        panic!("redis-server with TLS did not start (built without TLS support?)");
    }

    /// A sentinel monitoring `master` as `name` (quorum 1).
    pub async fn sentinel(master: &RedisServer, name: &str) -> Self {
        Self::sentinel_with(master, name, "").await
    }

    /// A sentinel as `sentinel`, with `extra` lines in its config (e.g.
    /// `sentinel down-after-milliseconds NAME 1000`).
    pub async fn sentinel_with(master: &RedisServer, name: &str, extra: &str) -> Self {
        require_redis();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "sentinel monitor {name} 127.0.0.1 {} 1\n{extra}",
                    master.port
                ),
            )
            .unwrap();
            let port = free_port();
            let child = Command::new("redis-server")
                .arg(&conf)
                .args([
                    "--sentinel",
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("redis-server: {e}; install it with: {REDIS_INSTALL}"));
            let mut s = RedisServer {
                port,
                child: Some(child),
                dir,
                extra: Vec::new(),
            };
            if s.wait_ready().await {
                return s;
            }
        }
        panic!("redis sentinel did not start");
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--dir", self.dir.path().to_str().unwrap()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-server: {e}; install it with: {REDIS_INSTALL}"));
        self.child = Some(child);
    }

    async fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false;
            }
            if ping(self.port) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends `signal` (e.g. "STOP", "CONT") to the server process.
    pub fn signal(&self, signal: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(c.id().to_string())
                .status()
                .unwrap()
                .success();
            assert!(ok, "kill -{signal}");
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A plain client for assertions.
    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A 3-primary Redis Cluster, formed with `redis-cli --cluster create`, optionally with
/// one replica per primary.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub async fn start() -> Self {
        Self::start_with_replicas(0).await
    }

    pub async fn start_with_replicas(replicas: usize) -> Self {
        let mut nodes = Vec::new();
        for _ in 0..3 * (1 + replicas) {
            nodes.push(
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "2000",
                ])
                .await,
            );
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("redis-cli: {e}; install it with: {REDIS_INSTALL}"));
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok().await;
        cluster
    }

    async fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let mut ok = true;
            for n in self.nodes.iter().filter(|n| n.child.is_some()) {
                let mut c = n.client().await;
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut c)
                    .await
                    .unwrap();
                ok &= info.contains("cluster_state:ok");
            }
            // Replicas must have synced with their primary, or Redis refuses to fail over.
            for n in self.nodes.iter().filter(|n| n.child.is_some()) {
                let mut c = n.client().await;
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c)
                    .await
                    .unwrap();
                ok &= !info.contains("role:slave") || info.contains("master_link_status:up");
            }
            if ok {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cluster never reached cluster_state:ok with every replica in sync");
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node serving `key` as primary.
    pub async fn primary_for(&mut self, key: &str) -> &mut RedisServer {
        let mut c = self.nodes[0].client().await;
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap();
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut c)
            .await
            .unwrap();
        let port = nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .find(|l| {
                l.split_whitespace().skip(8).any(|range| {
                    let mut it = range.split('-').map(|v| v.parse::<i64>().unwrap_or(-1));
                    let a = it.next().unwrap_or(-1);
                    let b = it.next().unwrap_or(a);
                    (a..=b).contains(&slot)
                })
            })
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|addr| addr.split('@').next())
            .and_then(|hp| hp.rsplit(':').next())
            .and_then(|p| p.parse::<u16>().ok())
            .expect("no primary for the slot");
        self.nodes.iter_mut().find(|n| n.port == port).unwrap()
    }

    /// Waits until every live node reports cluster_state:ok.
    pub async fn wait_healthy(&self) {
        self.wait_ok().await;
    }
}
