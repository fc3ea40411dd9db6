//! `fleet = "regions"` where a region's Redis is a Redis Cluster: the sync loop reads
//! and grants one hash tag per call in its own region, and writes into a Cluster peer
//! one merge per hash tag with the index apart (a peer is found to be a Cluster from its
//! first reply). Three regions, two Clusters and one single node, no gateway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use throttle::clock::SystemClock;
use throttle::config::{Peer, Regions};
use throttle::limiter::{
    Admission, Algorithm, Check, Fleet, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit,
};
use throttle::regions::Live;
use throttle::store::redis::region_sync::RegionSync;
use throttle::store::redis::wire::RegionArgs;
use throttle::store::redis::Target;
use throttle::store::{LimitStore, RedisStore};
use tokio::time::Instant;

use crate::support::redis::{RedisCluster, RedisServer};

const R: usize = 3;
const SYNC_MS: u64 = 50;

fn limits(limit: u32) -> ScopeLimits {
    ScopeLimits {
        concurrent: None,
        ban: None,
        windows: vec![WindowLimit {
            fleet: Fleet::Regions,
            admission: Admission::Exact,
            ..WindowLimit::with_algorithm(Window::Hour, limit, Algorithm::FixedWindow)
        }],
        on_failure: OnFailure::Closed,
        message: None,
        count_on: None,
    }
}

fn name(i: usize) -> String {
    format!("r{i}")
}

/// Region 0 and 1 on a Redis Cluster (3 primaries, one replica each: grants wait for
/// them), region 2 on one node.
struct Mixed {
    _clusters: Vec<RedisCluster>,
    _single: RedisServer,
    stores: Vec<Arc<RedisStore>>,
    stop: Arc<AtomicBool>,
    /// The sync loops exchange counts and grants only once this is set.
    syncing: Arc<AtomicBool>,
}

impl Mixed {
    async fn start(prefix: &str) -> Self {
        let clusters = vec![
            RedisCluster::start_with_replicas(1).await,
            RedisCluster::start_with_replicas(1).await,
        ];
        let single = RedisServer::start().await;
        let targets = [
            Target::Cluster(clusters[0].urls()),
            Target::Cluster(clusters[1].urls()),
            Target::Single(single.url()),
        ];
        // A peer is named by one URL: a Cluster's first node (its seed).
        let urls = [
            clusters[0].urls()[0].clone(),
            clusters[1].urls()[0].clone(),
            single.url(),
        ];
        let stop = Arc::new(AtomicBool::new(false));
        let syncing = Arc::new(AtomicBool::new(false));
        let mut stores = Vec::new();
        for (i, target) in targets.into_iter().enumerate() {
            let store = RedisStore::new(target, Duration::from_millis(250), prefix).with_regions(
                RegionArgs { index: i, count: R },
                Arc::new(Live::new(10_000)),
            );
            let store = Arc::new(store);
            let regions = Regions {
                name: name(i),
                peers: (0..R)
                    .filter(|&j| j != i)
                    .map(|j| Peer {
                        name: name(j),
                        url: urls[j].clone(),
                    })
                    .collect(),
                sync: Duration::from_millis(SYNC_MS),
                partition: Duration::from_secs(1),
            };
            let sync =
                Arc::new(RegionSync::new(&regions, store.clone(), Arc::new(SystemClock)).unwrap());
            let (stop, syncing) = (stop.clone(), syncing.clone());
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_millis(SYNC_MS));
                while !stop.load(Ordering::Relaxed) {
                    every.tick().await;
                    if syncing.load(Ordering::Relaxed) {
                        sync.tick().await;
                    }
                }
            });
            stores.push(store);
        }
        Self {
            _clusters: clusters,
            _single: single,
            stores,
            stop,
            syncing,
        }
    }

    async fn ask(&self, i: usize, key: &str, l: &ScopeLimits) -> bool {
        let mut check = Check::new(1);
        check.push(Scope::Key, Ident::Name(key.into()), l);
        self.stores[i].check(&check).await.unwrap().allowed
    }
}

impl Drop for Mixed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Demand for eight keys (eight hash tags, spread over the slots) in a Cluster region
/// only: the other regions, a Cluster and a single node, grant it their spare, so it
/// admits nearly the whole limit of each key, and the fleet never more than it.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_region_reads_grants_and_merges_one_hash_tag_per_call() {
    let fleet = Mixed::start("rgk").await;
    let l = limits(30);
    let keys: Vec<String> = (0..8).map(|k| format!("k{k}")).collect();
    let mut admitted = vec![[0u32; R]; keys.len()];
    // Region 0's allotment of 30 is 10 per key (before any sync: on a loaded machine
    // the 120 calls outlast a few sync periods, and grants would come in between).
    for (k, key) in keys.iter().enumerate() {
        for _ in 0..15 {
            admitted[k][0] += u32::from(fleet.ask(0, key, &l).await);
        }
    }
    assert!(admitted.iter().all(|a| a[0] == 10), "{admitted:?}");
    fleet.syncing.store(true, Ordering::Relaxed);
    // The others keep 1 each (a sparse caller still finds a token) and grant the rest.
    let deadline = Instant::now() + Duration::from_secs(10);
    while admitted.iter().any(|a| a[0] < 28) && Instant::now() < deadline {
        for (k, key) in keys.iter().enumerate() {
            if admitted[k][0] < 28 {
                admitted[k][0] += u32::from(fleet.ask(0, key, &l).await);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for (key, a) in keys.iter().zip(admitted.iter_mut()) {
        for (i, n) in a.iter_mut().enumerate() {
            for _ in 0..3 {
                *n += u32::from(fleet.ask(i, key, &l).await);
            }
        }
    }
    eprintln!("admitted per key and region: {admitted:?}");
    for (k, a) in admitted.iter().enumerate() {
        assert!(a[0] >= 28, "key {k}: region 0 admitted {} of 28", a[0]);
        assert!(
            a.iter().sum::<u32>() <= 30,
            "key {k}: {a:?} passes the limit"
        );
    }
}
