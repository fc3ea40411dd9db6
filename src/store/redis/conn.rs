//! The Redis connection: where the store connects (`Target`: one node, Cluster, or a
//! master behind Sentinel, followed by `follow_master`), TLS to it, the one script and
//! its loading (`NOSCRIPT`), the heartbeat, and the raw calls every part of the store
//! sends through (`run_script`, `eval`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{RedisResult, ScriptInvocation};

use super::RedisStore;
use crate::store::StoreError;

macro_rules! lua {
    ($f:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $f))
    };
}

/// The one script: prelude, the five algorithms, then the entry point.
pub const CHECK_LUA: &str = concat!(
    lua!("prelude.lua"),
    lua!("token_bucket.lua"),
    lua!("sliding_window.lua"),
    lua!("fixed_window.lua"),
    lua!("sliding_log.lua"),
    lua!("leaky_bucket.lua"),
    lua!("check.lua"),
);

/// The sync loop's script of `fleet = "regions"` (src/store/redis/region_sync.rs): the prelude and
/// the fixed window's regions helpers, then its entry point.
pub const REGIONS_LUA: &str = concat!(
    lua!("prelude.lua"),
    lua!("fixed_window.lua"),
    lua!("regions.lua"),
);

/// Where the store connects.
#[derive(Debug, Clone)]
pub enum Target {
    /// One node (`url`).
    Single(String),
    /// Redis Cluster seed nodes (`cluster`).
    Cluster(Vec<String>),
    /// Sentinel URLs and the master name (`sentinel`).
    Sentinel(Vec<String>, String),
}

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(MultiplexedConnection),
}

// === impl RedisStore ===

impl RedisStore {
    /// Behind Sentinel: asks the sentinels which node is the master now (within the store
    /// deadline) and, when it changed since the last ask, drops the connection so the next
    /// call connects to the new master. A promoted replica is followed this way even while
    /// the old master still accepts writes (a manual `SENTINEL FAILOVER` demotes it only
    /// later), which no call error would reveal. Called every second by the heartbeat;
    /// does nothing for a single node or Cluster.
    pub async fn follow_master(&self) {
        let Target::Sentinel(urls, master) = &self.target else {
            return;
        };
        let ask = async {
            let mut sentinel = redis::sentinel::Sentinel::build(urls.clone())?;
            let info = master_info(urls);
            let client = sentinel.async_master_for(master, Some(&info)).await?;
            Ok::<_, redis::RedisError>(client.get_connection_info().addr().to_string())
        };
        let addr = match tokio::time::timeout(self.timeout.max(Duration::from_millis(500)), ask)
            .await
        {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => return tracing::debug!(error = %e, "sentinels not asked for the master"),
            Err(_) => return tracing::debug!("sentinels did not name the master in time"),
        };
        let changed = match self.master_seen.lock() {
            Ok(mut seen) => {
                let changed = seen.as_ref().is_some_and(|s| *s != addr);
                *seen = Some(addr.clone());
                changed
            }
            Err(_) => false,
        };
        if changed {
            tracing::info!(master = %addr, "sentinels name a new master; reconnecting");
            self.conn.store(None);
        }
    }

    /// Records this instance as alive for `ttl_ms` and returns how many instances are alive
    /// (a sorted set `<prefix>:{instances}` scored by last heartbeat).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn heartbeat(
        &self,
        instance_id: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<u32, StoreError> {
        // The heartbeat doubles as a health probe: /readyz turns degraded when it fails,
        // before any request meets the outage.
        let r = self.beat(instance_id, now_ms, ttl_ms).await;
        self.healthy.store(r.is_ok(), Ordering::Relaxed);
        r
    }

    async fn beat(&self, instance_id: &str, now_ms: u64, ttl_ms: u64) -> Result<u32, StoreError> {
        let script = redis::Script::new(
            "redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
             redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]) - tonumber(ARGV[3]))
             redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
             return redis.call('ZCARD', KEYS[1])",
        );
        let key = format!("{}:{{instances}}", self.prefix);
        let mut conn = tokio::time::timeout(self.timeout, self.conn())
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))??;
        let mut inv = script.key(key);
        inv.arg(now_ms).arg(instance_id).arg(ttl_ms);
        let n: Vec<i64> = match tokio::time::timeout(self.timeout, async {
            let n: RedisResult<i64> = match &mut conn {
                Conn::Single(c) => inv.invoke_async(c).await,
                Conn::Cluster(c) => inv.invoke_async(c).await,
                Conn::Sentinel(c) => inv.invoke_async(c).await,
            };
            n.map(|v| vec![v])
        })
        .await
        {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(unavailable(e)),
            Err(_) => return Err(StoreError::Timeout(self.timeout.as_millis() as u64)),
        };
        Ok(n.first()
            .and_then(|v| u32::try_from(*v).ok())
            .unwrap_or(1)
            .max(1))
    }

    /// Whether the last call succeeded.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub(super) async fn conn(&self) -> Result<Conn, StoreError> {
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        let _guard = self.connecting.lock().await;
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        let c = self.connect().await.map_err(unavailable)?;
        self.conn.store(Some(Arc::new(c.clone())));
        Ok(c)
    }

    async fn connect(&self) -> RedisResult<Conn> {
        Ok(match &self.target {
            // The store's own deadline bounds every call (`timeout_ms`); the client's
            // response timeout (redis-rs defaults to 500 ms) is set past it, so that a
            // call that missed the deadline still gets its reply (`undo_late`).
            Target::Single(url) => Conn::Single(
                ConnectionManager::new_with_config(
                    self.single_client(url)?,
                    redis::aio::ConnectionManagerConfig::new()
                        .set_response_timeout(Some(LATE_PATIENCE)),
                )
                .await?,
            ),
            Target::Cluster(nodes) => Conn::Cluster(
                ClusterClient::builder(nodes.clone())
                    .tcp_settings(self.tcp_settings())
                    .response_timeout(LATE_PATIENCE)
                    .build()?
                    .get_async_connection()
                    .await?,
            ),
            Target::Sentinel(urls, master) => {
                let mut client = SentinelClient::build(
                    urls.clone(),
                    master.clone(),
                    Some(master_info(urls)),
                    SentinelServerType::Master,
                )?;
                let config =
                    redis::AsyncConnectionConfig::new().set_response_timeout(Some(LATE_PATIENCE));
                Conn::Sentinel(client.get_async_connection_with_config(&config).await?)
            }
        })
    }
}

impl RedisStore {
    /// The client of a single node at `url` (without `CLIENT SETINFO` for a peer region's
    /// store, `RedisStore::peer`), with `tcp_settings`.
    fn single_client(&self, url: &str) -> RedisResult<redis::Client> {
        let info = redis::Client::open(url)?
            .get_connection_info()
            .clone()
            .set_tcp_settings(self.tcp_settings());
        if !self.is_peer {
            return redis::Client::open(info);
        }
        let redis = info.redis_settings().clone().set_skip_set_lib_name();
        redis::Client::open(info.set_redis_settings(redis))
    }

    /// The sockets' options. `TCP_NODELAY` always: redis-rs leaves Nagle's algorithm on,
    /// which holds a small command while an earlier one is unacknowledged, so calls
    /// multiplexed on one connection would wait a round trip for each other (on loopback
    /// a few microseconds; between regions, a sync write would wait for the previous
    /// one's reply). A peer region's connection also closes with a reset (`SO_LINGER` 0):
    /// it is replaced when a write misses its deadline, most often in a partition, and
    /// the writes still queued on it are stale (merges take maxima, a newer write follows
    /// on the new connection); a plain close would leave the kernel retransmitting them
    /// to be delivered at the heal, ahead of the fresh one. And the kernel aborts it when
    /// what it sent stays unacknowledged for the peer's deadline (`TCP_USER_TIMEOUT`):
    /// redis-rs closes a connection only once its requests in flight are answered, which
    /// a partition can hold off until the heal. The cost: a write not yet acknowledged
    /// when the gateway exits is lost (a later tick of the region's gateways sends it
    /// again; until then grants it carried go unused, never spent twice).
    fn tcp_settings(&self) -> TcpSettings {
        let settings = no_delay();
        match self.is_peer {
            true => settings
                .set_linger_time(Duration::ZERO)
                .set_user_timeout(self.timeout),
            false => settings,
        }
    }
}

/// How long a call that missed its deadline is waited for (see `RedisStore::undo_late`).
pub(super) const LATE_PATIENCE: Duration = Duration::from_secs(10);

/// Runs an `EVALSHA` of the script, loading it first when Redis does not have it
/// (`NOSCRIPT`: a restart, a failover, `SCRIPT FLUSH`).
pub(super) async fn run_script(conn: &mut Conn, cmd: &redis::Cmd) -> RedisResult<Vec<u8>> {
    run_lua(conn, cmd, CHECK_LUA).await
}

/// Runs an `EVALSHA` of `source`, loading it first when Redis does not have it.
pub(super) async fn run_lua(
    conn: &mut Conn,
    cmd: &redis::Cmd,
    source: &str,
) -> RedisResult<Vec<u8>> {
    match query(conn, cmd).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(source);
            let _: String = match conn {
                Conn::Single(c) => load.query_async(c).await?,
                Conn::Cluster(c) => load.query_async(c).await?,
                Conn::Sentinel(c) => load.query_async(c).await?,
            };
            query(conn, cmd).await
        }
        other => other,
    }
}

pub(super) async fn eval(conn: &mut Conn, inv: &ScriptInvocation<'_>) -> RedisResult<Vec<u8>> {
    match conn {
        Conn::Single(c) => inv.invoke_async(c).await,
        Conn::Cluster(c) => inv.invoke_async(c).await,
        Conn::Sentinel(c) => inv.invoke_async(c).await,
    }
}

async fn query(conn: &mut Conn, cmd: &redis::Cmd) -> RedisResult<Vec<u8>> {
    match conn {
        Conn::Single(c) => cmd.query_async(c).await,
        Conn::Cluster(c) => cmd.query_async(c).await,
        Conn::Sentinel(c) => cmd.query_async(c).await,
    }
}

/// How the master named by the sentinels is connected to: TLS when the sentinels' URLs
/// use it, `TCP_NODELAY` (see `RedisStore::tcp_settings`).
fn master_info(urls: &[String]) -> SentinelNodeConnectionInfo {
    let info = SentinelNodeConnectionInfo::default().set_tcp_settings(no_delay());
    match urls.iter().any(|u| u.starts_with("rediss://")) {
        true => info.set_tls_mode(redis::TlsMode::Secure),
        false => info,
    }
}

/// Every Redis socket's options: `TCP_NODELAY` (see `RedisStore::tcp_settings`).
fn no_delay() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

pub(super) fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection goes without Nagle's algorithm (redis-rs's default keeps it); a
    /// peer region's also closes with a reset, is aborted by the kernel when what it sent
    /// stays unacknowledged for its deadline, and connects without `CLIENT SETINFO`. (The
    /// linger has no getter: read from the settings' `Debug`.)
    #[test]
    fn sockets_go_without_nagle_and_peers_close_with_a_reset() {
        let url = "redis://127.0.0.1:6379";
        let local = RedisStore::new(Target::Single(url.into()), Duration::from_millis(25), "t");
        let peer = RedisStore::peer(Target::Single(url.into()), Duration::from_secs(1), "t");
        for (store, reset) in [(&local, false), (&peer, true)] {
            let client = store.single_client(url).unwrap();
            let info = client.get_connection_info();
            assert!(info.tcp_settings().nodelay());
            let linger = format!("{:?}", info.tcp_settings());
            assert_eq!(linger.contains("linger_time: Some(0ns)"), reset, "{linger}");
            let abort = reset.then_some(Duration::from_secs(1));
            assert_eq!(info.tcp_settings().user_timeout(), abort);
            assert_eq!(info.redis_settings().skip_set_lib_name(), reset);
        }
        assert!(local.tcp_settings().nodelay() && peer.tcp_settings().nodelay());
        let sentinel = format!("{:?}", master_info(&["redis://127.0.0.1:26379".into()]));
        assert!(sentinel.contains("nodelay: true"), "{sentinel}");
    }
}
