//! The sync loop of `fleet = "regions"` (the rule is `crate::regions`): every `sync_ms`, read this region's live windows
//! from its Redis, run the grant policy, grant (atomically in the store, checked against
//! the cap there), then write one batched merge into each peer's Redis; the reply is the
//! acknowledgement that keeps the link alive (`Links`).
//!
//! Live windows are what this gateway decided or leased on (`Live`, noted by the Redis
//! store), what the peers wrote into this region's store (the index the merge script
//! keeps), and the next window of one that had demand. Every gateway of a region runs
//! the loop for what it saw (see `Live` for why several writers per region are safe).
//!
//! A write goes to every peer every tick, whether the previous ones have come back or
//! not (merges are idempotent maxima, so order does not matter): after a partition
//! heals, the write that crosses first is at most one sync period old, and the regions
//! agree within `sync_ms` + the one-way delay. A write may take up to `partition_secs`
//! (a round trip between regions often takes longer than the local `[store]
//! timeout_ms`); when one misses that deadline the peer's connection is replaced, the
//! writes waiting on it are given up and it closes with a reset (`PeerLink::send`), so
//! a heal delivers at most `partition_secs / sync_ms` writes from a peer, not the whole
//! cut's, and a connection TCP has stopped retransmitting on (its backoff grows through
//! a long cut) does not delay the heal. Calls to this region's own Redis keep `[store]
//! timeout_ms` and go on a connection of their own.
//!
//! Grants are durable before a peer hears of them: when this region's Redis has
//! replicas, a tick that granted waits (`WAIT`, within `timeout_ms`) until one holds
//! the grant, and holds the tick's writes when none does (the next tick waits again).
//! Otherwise a failover to a replica that missed a grant would give the tokens back here
//! while the peer spends them: the fleet could pass `L` by the grant.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::join_all;

use self::peer::{PeerLink, Write};
use super::RedisStore;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::regions::store::{self as wire, GrantArgs};
use crate::regions::{allotment, Links, Live, LiveWindow, Params, SyncWrite, WindowState};

mod peer;

/// At most this many windows per script call.
const BATCH: usize = 256;

/// The calls `len` items go in: runs of at most `BATCH`, and on a Redis Cluster only
/// items whose keys (`key(i)`) share a hash tag together (items sorted by tag first).
fn ranges<'k>(len: usize, cluster: bool, key: impl Fn(usize) -> &'k str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=len {
        let split = i == len
            || i - start == BATCH
            || (cluster && wire::hash_tag(key(i)) != wire::hash_tag(key(start)));
        if split {
            out.push(start..i);
            start = i;
        }
    }
    out
}

/// The sync loop of one gateway (see the module).
pub struct RegionSync {
    me: usize,
    count: usize,
    sync_ms: u64,
    partition_ms: u64,
    own: Arc<RedisStore>,
    /// The loop's own connection to this region's Redis (its reads, grants and `WAIT`).
    durable: RedisStore,
    /// Replicas of this region's Redis, and when that was asked (ms); asked every second.
    replicas: Mutex<Option<(u64, usize)>>,
    /// A grant was made that no replica is known to hold yet.
    unconfirmed: AtomicBool,
    peers: Vec<Arc<PeerLink>>,
    live: Arc<Live>,
    links: Arc<Mutex<Links>>,
    clock: Arc<dyn Clock>,
    metrics: Option<Arc<Metrics>>,
    /// Per live window, what this region had heard from each peer at the last tick (for
    /// `throttle_region_heard_total`).
    heard_seen: Mutex<HashMap<(String, u64), Vec<u64>>>,
}

/// What one tick did (for tests and logs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tick {
    /// Windows read.
    pub windows: usize,
    /// Tokens granted, in all.
    pub granted: u64,
    /// Peers a write went to.
    pub sent: usize,
    /// The writes were held: no replica confirmed a grant in time.
    pub held: bool,
}

impl RegionSync {
    /// The loop of region `regions.index()` whose store is `own` (made `with_regions`,
    /// so it has the live set); one connection per peer URL, with `own`'s key prefix
    /// (every region uses the same `[store] key_prefix`).
    ///
    /// # Errors
    /// When `own` has no live set (it was not made `with_regions`).
    pub fn new(
        regions: &crate::config::Regions,
        own: Arc<RedisStore>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        let live = own
            .regions_live()
            .cloned()
            .ok_or_else(|| "the store was not made with_regions".to_string())?;
        let names = regions.names();
        let peers = regions
            .peers
            .iter()
            .filter_map(|p| {
                let index = names.iter().position(|n| *n == p.name)?;
                // A peer is a round trip between regions away (often more than the
                // local `[store] timeout_ms`, 25 ms by default): a write may take up to
                // `partition_secs`, past which the peer counts as cut anyway.
                let deadline = regions.partition.max(own.timeout());
                Some(Arc::new(PeerLink::new(
                    index,
                    &p.name,
                    &p.url,
                    deadline,
                    own.prefix(),
                )))
            })
            .collect();
        let count = regions.count();
        let now = clock.now_ms();
        Ok(Self {
            me: regions.index(),
            count,
            sync_ms: regions.sync.as_millis() as u64,
            partition_ms: regions.partition.as_millis() as u64,
            durable: own.sibling(),
            replicas: Mutex::new(None),
            unconfirmed: AtomicBool::new(false),
            own,
            peers,
            live,
            links: Arc::new(Mutex::new(Links::new(count, now))),
            clock,
            metrics: None,
            heard_seen: Mutex::new(HashMap::new()),
        })
    }

    /// Sets the `throttle_region_*` metrics; every peer's counters start at 0, so a
    /// rate over them exists before the first grant.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        for p in &self.peers {
            let label = [p.name.as_str()];
            metrics
                .regions
                .granted_total
                .with_label_values(&label)
                .inc_by(0);
            metrics
                .regions
                .heard_total
                .with_label_values(&label)
                .inc_by(0);
        }
        self.metrics = Some(metrics);
        self
    }

    /// How often the loop runs.
    pub fn period(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.sync_ms.max(1))
    }

    fn params(&self, w: &LiveWindow) -> Params {
        Params {
            limit: w.limit,
            regions: self.count,
            window_ms: w.len_ms(),
            sample_ms: self.sync_ms,
            partition_ms: self.partition_ms,
        }
    }

    /// At most this many writes in flight to one peer: each lives `partition_secs` at
    /// most and one goes per tick, so twice that is only reached when the runtime runs
    /// late (a bound on memory, never the pace).
    fn max_in_flight(&self) -> usize {
        2 * (self.partition_ms / self.sync_ms.max(1)) as usize + 4
    }

    /// Whether `peer` acknowledged a write within `partition_ms` of `now_ms`.
    pub fn partitioned(&self, peer: usize, now_ms: u64) -> bool {
        let links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        links.partitioned(peer, now_ms, self.partition_ms)
    }

    /// One round: learn the windows peers wrote, read, grant, write to every peer.
    pub async fn tick(&self) -> Tick {
        let now = self.clock.now_ms();
        match self.durable.regions_index(now).await {
            Ok(members) => {
                for w in members.iter().filter_map(|m| wire::parse_index_member(m)) {
                    self.live.add(&w);
                }
            }
            Err(e) => tracing::debug!(error = %e, "regions: the live index was not read"),
        }
        let mut windows = self.live.windows(now);
        let cluster = self.durable.is_cluster();
        if cluster {
            windows.sort_by(|a, b| wire::hash_tag(&a.key).cmp(wire::hash_tag(&b.key)));
        }
        let parts = ranges(windows.len(), cluster, |i| &windows[i].key);
        let reads = join_all(parts.iter().map(|r| self.read(&windows[r.clone()]))).await;
        let mut states = Vec::with_capacity(windows.len());
        for (range, read) in parts.into_iter().zip(reads) {
            match read {
                Some(s) => states.extend(windows[range].iter().cloned().zip(s)),
                None => return Tick::default(),
            }
        }
        let granted = self.grant(&mut states, now).await;
        if granted > 0 {
            self.unconfirmed.store(true, Ordering::Release);
        }
        if self.unconfirmed.load(Ordering::Acquire) {
            if !self.confirmed(now).await {
                tracing::debug!("regions: no replica holds the grants yet; writes held");
                self.observe(&states, now);
                return Tick {
                    windows: states.len(),
                    granted,
                    sent: 0,
                    held: true,
                };
            }
            self.unconfirmed.store(false, Ordering::Release);
        }
        // The next window of one that had demand is synced from its start: the priors
        // send the grants at once.
        for (w, s) in &states {
            let busy = s.demand() > 0 || (0..self.count).any(|j| s.peer(j) > 0);
            if busy && w.end <= now.saturating_add(2 * self.sync_ms) {
                self.live.add(&w.next());
            }
        }
        let sent = self.send(&states);
        self.observe(&states, now);
        Tick {
            windows: states.len(),
            granted,
            sent,
            held: false,
        }
    }

    /// Whether a replica (when this region's Redis has any) holds every grant made on
    /// the loop's connection.
    async fn confirmed(&self, now: u64) -> bool {
        let known = *self.replicas.lock().unwrap_or_else(PoisonError::into_inner);
        let replicas = match known {
            Some((at, n)) if now.saturating_sub(at) < 1000 => n,
            _ => match self.durable.connected_replicas().await {
                Ok(n) => {
                    *self.replicas.lock().unwrap_or_else(PoisonError::into_inner) = Some((now, n));
                    n
                }
                Err(e) => {
                    tracing::debug!(error = %e, "regions: replicas not counted");
                    return false;
                }
            },
        };
        if replicas == 0 {
            return true;
        }
        match self.durable.wait_replicas(1).await {
            Ok(n) => n >= 1,
            Err(e) => {
                tracing::debug!(error = %e, "regions: WAIT failed");
                false
            }
        }
    }

    /// Reads `windows` from this region's store into their states.
    async fn read(&self, windows: &[LiveWindow]) -> Option<Vec<WindowState>> {
        let prev = |w: &LiveWindow| w.start.saturating_sub(w.len_ms());
        let cmd = wire::read_cmd(
            self.own.regions_sha(),
            &self.own.script_now(),
            (self.count, self.me),
            windows,
            prev,
        );
        let raw = match self.durable.regions_call(&cmd).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "regions: the live windows were not read");
                return None;
            }
        };
        let stored = wire::parse_read(&wire::ints(&raw)?, self.count, windows.len())?;
        Some(
            windows
                .iter()
                .zip(stored)
                .map(|(w, s)| WindowState::from_stored(self.me, &self.params(w), w.start, &s))
                .collect(),
        )
    }

    /// Plans and makes the grants of every state; what was granted in all.
    async fn grant(&self, states: &mut [(LiveWindow, WindowState)], now: u64) -> u64 {
        let links = self
            .links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut planned: Vec<(usize, usize, u64, u64)> = Vec::new();
        for (at, (w, s)) in states.iter().enumerate() {
            let p = self.params(w);
            let keep = s.need(&p, now).unwrap_or(0);
            for (peer, amount) in s.plan(&p, &links, now) {
                planned.push((at, peer, amount, keep));
            }
        }
        let cluster = self.durable.is_cluster();
        let parts = ranges(planned.len(), cluster, |i| &states[planned[i].0].0.key);
        let calls = parts.iter().map(|range| {
            let chunk = &planned[range.clone()];
            let args: Vec<GrantArgs<'_>> = chunk
                .iter()
                .map(|&(at, peer, amount, keep)| {
                    let w = &states[at].0;
                    GrantArgs {
                        window: w,
                        allot: allotment(w.limit, self.count, self.me),
                        peer,
                        amount,
                        keep,
                    }
                })
                .collect();
            let cmd = wire::grant_cmd(
                self.own.regions_sha(),
                &self.own.script_now(),
                (self.count, self.me),
                &args,
            );
            async move {
                match self.durable.regions_call(&cmd).await {
                    Ok(raw) => wire::ints(&raw).and_then(|v| wire::parse_flags(&v, chunk.len())),
                    Err(e) => {
                        tracing::debug!(error = %e, "regions: grants not made");
                        None
                    }
                }
            }
        });
        let done = join_all(calls).await;
        let mut total = 0;
        for (range, done) in parts.into_iter().zip(done) {
            for (&(at, peer, amount, _), ok) in planned[range].iter().zip(done.unwrap_or_default())
            {
                if ok && states[at].1.grant(peer, amount) {
                    total += amount;
                    if let (Some(m), Some(p)) = (&self.metrics, self.peer(peer)) {
                        m.regions
                            .granted_total
                            .with_label_values(&[&p.name])
                            .inc_by(amount);
                    }
                }
            }
        }
        total
    }

    fn peer(&self, index: usize) -> Option<&Arc<PeerLink>> {
        self.peers.iter().find(|p| p.index == index)
    }

    /// Writes every state to every peer (an empty batch when there is none); how many
    /// peers a write went to.
    fn send(&self, states: &[(LiveWindow, WindowState)]) -> usize {
        let now = self.clock.now_ms();
        let mut sent = 0;
        let most = self.max_in_flight();
        for peer in &self.peers {
            if peer.in_flight.fetch_add(1, Ordering::AcqRel) >= most {
                peer.in_flight.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let writes: Vec<(LiveWindow, SyncWrite)> = states
                .iter()
                .map(|(w, s)| (w.clone(), s.sync_write(&self.params(w), peer.index, now)))
                .collect();
            let write = Write {
                writes,
                r: self.count,
                from: self.me,
                now_ms: now,
            };
            let (peer, links, clock) = (peer.clone(), self.links.clone(), self.clock.clone());
            sent += 1;
            tokio::spawn(async move {
                if peer.send(write).await {
                    let mut l = links.lock().unwrap_or_else(PoisonError::into_inner);
                    l.acknowledged(peer.index, clock.now_ms());
                }
                peer.in_flight.fetch_sub(1, Ordering::AcqRel);
            });
        }
        sent
    }

    /// Sets the metrics from this tick's states.
    fn observe(&self, states: &[(LiveWindow, WindowState)], now: u64) {
        let mut seen = self
            .heard_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut heard_new = vec![0u64; self.count];
        let mut unsynced = vec![0u64; self.count];
        let mut next = HashMap::with_capacity(states.len());
        for (w, s) in states {
            let id = (w.key.clone(), w.start);
            let before = seen.remove(&id).unwrap_or_else(|| vec![0; self.count]);
            let heard: Vec<u64> = (0..self.count).map(|j| s.heard(j)).collect();
            for j in 0..self.count {
                heard_new[j] += heard[j].saturating_sub(before.get(j).copied().unwrap_or(0));
                unsynced[j] += s.given(j).saturating_sub(s.heard_by(j));
            }
            next.insert(id, heard);
        }
        *seen = next;
        let Some(m) = &self.metrics else {
            return;
        };
        let links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        for p in &self.peers {
            let label = [p.name.as_str()];
            let lag = links.lag_ms(p.index, now) as f64 / 1000.0;
            m.regions
                .sync_lag_seconds
                .with_label_values(&label)
                .set(lag);
            let cut = links.partitioned(p.index, now, self.partition_ms);
            m.regions
                .partitioned
                .with_label_values(&label)
                .set(i64::from(cut));
            let u = unsynced.get(p.index).copied().unwrap_or(0);
            m.regions
                .unsynced
                .with_label_values(&label)
                .set(i64::try_from(u).unwrap_or(i64::MAX));
            let h = heard_new.get(p.index).copied().unwrap_or(0);
            if h > 0 {
                m.regions.heard_total.with_label_values(&label).inc_by(h);
            }
        }
    }
}
