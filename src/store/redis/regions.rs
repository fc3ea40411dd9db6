//! The Redis store's side of `fleet = "regions"` (src/regions): this gateway's place
//! among the regions (sent with every decision of a regions window, see
//! `wire::RegionArgs`), the live windows it decided or leased on (for the sync loop), and
//! the sync loop's calls of `lua/regions.lua`, in this region's store or a peer's.

use std::sync::Arc;

use redis::Script;

use super::conn::{run_lua, unavailable, Conn, REGIONS_LUA};
use super::wire::{self, RegionArgs};
use super::RedisStore;
use crate::limiter::{Algorithm, Fleet, ScopeCheck};
use crate::regions::Live;
use crate::store::StoreError;

/// The regions script's hash (computed once).
fn regions_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(REGIONS_LUA))
}

// === impl RedisStore ===

impl RedisStore {
    /// Decides `fleet = "regions"` fixed windows as region `region.index` of
    /// `region.count` (under the region's cap), and notes their windows in `live` for the
    /// sync loop.
    pub fn with_regions(mut self, region: RegionArgs, live: Arc<Live>) -> Self {
        self.region = Some(region);
        self.live = Some(live);
        self
    }

    /// The live windows this gateway decided or leased on (None: no `[regions]`).
    pub fn regions_live(&self) -> Option<&Arc<Live>> {
        self.live.as_ref()
    }

    /// Whether the store is a Redis Cluster: the sync loop's calls name keys of many
    /// slots (and the index of live windows), so `fleet = "regions"` syncs on a single
    /// node or behind Sentinel only.
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, super::Target::Cluster(_))
    }

    /// The key prefix (`[store] key_prefix`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The store's deadline per call (`[store] timeout_ms`).
    pub fn timeout(&self) -> std::time::Duration {
        self.timeout
    }

    /// `ARGV[1]` of a script call: '' (the server's clock) unless a clock is injected.
    pub fn script_now(&self) -> String {
        self.now_arg()
    }

    /// The hash of `lua/regions.lua`.
    pub fn regions_sha(&self) -> &'static str {
        regions_script().get_hash()
    }

    /// Notes the regions windows of `scopes`, decided by a script whose clock read
    /// `redis_now`: the sync loop syncs what this gateway saw.
    pub(super) fn note_regions(&self, scopes: &[ScopeCheck<'_>], redis_now: u64) {
        let (Some(live), Some(_)) = (&self.live, self.region) else {
            return;
        };
        for s in scopes {
            for w in &s.limits.windows {
                if w.fleet != Fleet::Regions || w.algorithm != Algorithm::FixedWindow {
                    continue;
                }
                let (start, end) = w.bounds(redis_now, s.ident.offset_ms(w));
                let key = wire::key(&self.prefix, s.scope, &s.ident, w.window);
                live.note(&key, start, end, u64::from(w.limit));
            }
        }
    }

    /// One call of the regions script within the deadline (loaded on `NOSCRIPT`).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn regions_call(&self, cmd: &redis::Cmd) -> Result<Vec<u8>, StoreError> {
        let timeout = || StoreError::Timeout(self.timeout.as_millis() as u64);
        let run = async {
            let mut conn = self.conn().await?;
            run_lua(&mut conn, cmd, REGIONS_LUA)
                .await
                .map_err(unavailable)
        };
        let r = tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| timeout())?;
        if r.is_err() && !matches!(self.target, super::Target::Single(_)) {
            self.conn.store(None);
        }
        r
    }

    /// A store on the same Redis with its own connection (same deadline, prefix and
    /// clock): the sync loop's calls, whose `WAIT` blocks its connection, never queue
    /// behind or ahead of the request path's.
    pub fn sibling(&self) -> Self {
        let mut s = Self::new(self.target.clone(), self.timeout, &self.prefix);
        s.clock = self.clock.clone();
        s
    }

    /// How many replicas are connected to the node this store writes to (`INFO
    /// replication`: `connected_slaves`); on a Redis Cluster, the fewest any primary has
    /// (`CLUSTER NODES`: `WAIT` goes to every primary there and answers the least).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn connected_replicas(&self) -> Result<usize, StoreError> {
        if self.is_cluster() {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("NODES");
            let nodes: String = self.raw(&cmd, self.timeout).await?;
            return Ok(fewest_replicas(&nodes));
        }
        let mut cmd = redis::cmd("INFO");
        cmd.arg("replication");
        let info: String = self.raw(&cmd, self.timeout).await?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0))
    }

    /// `WAIT replicas timeout_ms`: how many replicas hold every write this store's
    /// connection made, waiting up to the store's deadline for `replicas` of them.
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn wait_replicas(&self, replicas: usize) -> Result<usize, StoreError> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(self.timeout.as_millis() as u64);
        let n: i64 = self.raw(&cmd, self.timeout * 2).await?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// One plain command within `deadline`.
    async fn raw<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        deadline: std::time::Duration,
    ) -> Result<T, StoreError> {
        let run = async {
            let mut conn = self.conn().await?;
            let r: redis::RedisResult<T> = match &mut conn {
                Conn::Single(c) => cmd.query_async(c).await,
                Conn::Cluster(c) => cmd.query_async(c).await,
                Conn::Sentinel(c) => cmd.query_async(c).await,
            };
            r.map_err(unavailable)
        };
        tokio::time::timeout(deadline, run)
            .await
            .map_err(|_| StoreError::Timeout(deadline.as_millis() as u64))?
    }

    /// A pipeline (the index of live windows on a Redis Cluster peer, one key) within
    /// the deadline.
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn regions_pipe(&self, pipe: &redis::Pipeline) -> Result<(), StoreError> {
        let run = async {
            let mut conn = self.conn().await?;
            let r: redis::RedisResult<()> = match &mut conn {
                Conn::Single(c) => pipe.query_async(c).await,
                Conn::Cluster(c) => pipe.query_async(c).await,
                Conn::Sentinel(c) => pipe.query_async(c).await,
            };
            r.map_err(unavailable)
        };
        let r = tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))?;
        if r.is_err() && !matches!(self.target, super::Target::Single(_)) {
            self.conn.store(None);
        }
        r
    }

    /// The windows peers wrote into this store that are not over at `now_ms` (members of
    /// `regions::store::index_key`).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn regions_index(&self, now_ms: u64) -> Result<Vec<String>, StoreError> {
        let key = crate::regions::store::index_key(&self.prefix);
        let mut cmd = redis::cmd("ZRANGEBYSCORE");
        cmd.arg(key).arg(format!("({now_ms}")).arg("+inf");
        let run = async {
            let mut conn = self.conn().await?;
            let r: redis::RedisResult<Vec<String>> = match &mut conn {
                Conn::Single(c) => cmd.query_async(c).await,
                Conn::Cluster(c) => cmd.query_async(c).await,
                Conn::Sentinel(c) => cmd.query_async(c).await,
            };
            r.map_err(unavailable)
        };
        tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))?
    }
}

/// The fewest healthy replicas any primary has in a `CLUSTER NODES` reply (0 with no
/// primary). Each line: id, address, flags, the primary's id for a replica, ...
fn fewest_replicas(nodes: &str) -> usize {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() >= 4)
        .collect();
    let healthy = |flags: &str| !flags.split(',').any(|f| f == "fail" || f == "fail?");
    lines
        .iter()
        .filter(|f| f[2].split(',').any(|x| x == "master") && healthy(f[2]))
        .map(|primary| {
            lines
                .iter()
                .filter(|f| {
                    f[2].split(',').any(|x| x == "slave") && healthy(f[2]) && f[3] == primary[0]
                })
                .count()
        })
        .min()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::fewest_replicas;

    #[test]
    fn the_fewest_replicas_of_any_primary() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b1 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922
c1 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383
r1 127.0.0.1:7003@17003 slave a1 0 0 1 connected
r2 127.0.0.1:7004@17004 slave b1 0 0 2 connected
r3 127.0.0.1:7005@17005 slave c1 0 0 3 connected
r4 127.0.0.1:7006@17006 slave c1 0 0 3 connected
";
        assert_eq!(fewest_replicas(nodes), 1);
        let failed = nodes.replace(
            "r2 127.0.0.1:7004@17004 slave",
            "r2 127.0.0.1:7004@17004 slave,fail",
        );
        assert_eq!(fewest_replicas(&failed), 0);
        let none: String = nodes.lines().take(3).map(|l| format!("{l}\n")).collect();
        assert_eq!(fewest_replicas(&none), 0);
        assert_eq!(fewest_replicas(""), 0);
    }
}
