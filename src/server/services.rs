//! The gateway's periodic background work, each written as one `lifecycle::every(period,
//! f)`: the memory store's sweeper, the instance heartbeat, lease returns and slot
//! renewals, ban sync and the adaptive-limit controller.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::admission::Core;
use crate::clock::{Clock, SystemClock};
use crate::lifecycle::{every, Every, Lifecycle};
use crate::store::bans::{BanCursor, BanRead};
use crate::store::{MemoryStore, RedisStore};

/// Evicts idle memory-store state every second (see `MemoryStore`).
pub(crate) fn sweeper(store: Arc<MemoryStore>) -> Every {
    every(Duration::from_secs(1), move || {
        store.sweep();
        std::future::ready(())
    })
}

/// Heartbeats this instance into Redis every second; the live count goes to `instances`
/// (None when `[store] instances` fixes it), where it sizes the local fallback (the last
/// count seen is kept while Redis is down).
pub(crate) fn heartbeat(
    redis: Arc<RedisStore>,
    instances: Option<Arc<AtomicU32>>,
    id: String,
) -> Every {
    let id: Arc<str> = id.into();
    every(Duration::from_secs(1), move || {
        let (redis, instances, id) = (redis.clone(), instances.clone(), id.clone());
        async move {
            redis.follow_master().await;
            match redis.heartbeat(&id, SystemClock.now_ms(), 3_000).await {
                Ok(n) => {
                    if let Some(i) = &instances {
                        i.store(n, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    tracing::trace!(error = %e, "heartbeat failed; keeping the last instance count");
                }
            }
        }
    })
}

/// `fleet = "regions"`: every `[regions] sync_ms`, this gateway's live regions windows
/// are read, granted from and written to every peer region (see `store::redis::region_sync`).
pub(crate) fn region_sync(sync: Arc<crate::store::redis::region_sync::RegionSync>) -> Every {
    every(sync.period(), move || {
        let sync = sync.clone();
        async move {
            sync.tick().await;
        }
    })
}

/// Gives leased tokens back to Redis when their lease ends, and all of them at shutdown
/// (the process does not exit early before that is done).
pub(crate) fn lease_returns(redis: Arc<RedisStore>, lifecycle: Arc<Lifecycle>) -> Every {
    let last = redis.clone();
    every(Duration::from_millis(100), move || {
        let redis = redis.clone();
        async move { redis.return_expired().await }
    })
    .at_shutdown(move || {
        let redis = last.clone();
        async move { redis.return_all().await }
    })
    .finishing(lifecycle)
}

/// Renews the concurrency slots of requests in flight while they run (a dead gateway's
/// expire by themselves).
pub(crate) fn slot_renewals(redis: Arc<RedisStore>) -> Every {
    every(redis.renew_every(), move || {
        let redis = redis.clone();
        async move { redis.renew_slots().await }
    })
}

/// Every second: what changed in the fleet's automatic bans, read from Redis (this
/// gateway's own are there too) and applied; the whole table on the first sync, after
/// Redis restarted or was flushed, or when this gateway fell behind the change log (see
/// `store::redis::bans`). On the memory store: expired bans dropped.
pub(crate) fn ban_sync(core: Arc<Core>) -> Every {
    let cursor = Arc::new(tokio::sync::Mutex::new(BanCursor::default()));
    every(Duration::from_secs(1), move || {
        let (core, cursor) = (core.clone(), cursor.clone());
        async move { sync_bans(&core, &mut *cursor.lock().await).await }
    })
}

/// One ban sync (see `ban_sync`).
async fn sync_bans(core: &Core, cursor: &mut BanCursor) {
    let now_ms = core.clock.now_ms();
    let bans = &core.bans;
    let Some(redis) = &core.shared_bans else {
        bans.prune(now_ms);
        return;
    };
    let syncs = &core.metrics.ban_syncs;
    match redis.sync_bans(cursor, now_ms).await {
        Ok(BanRead::Full(all)) => {
            bans.replace(all, now_ms);
            syncs[0].inc();
        }
        Ok(BanRead::Changes { set, lifted }) => {
            bans.apply(set, lifted, now_ms);
            syncs[1].inc();
        }
        // Keep the bans known; expired ones still stop matching.
        Err(e) => {
            tracing::debug!(error = %e, "ban sync failed");
            bans.prune(now_ms);
        }
    }
}

/// The adaptive-limit controller: once a second, every adaptive route's factor takes
/// one step on its window (see `adaptive`), and `throttle_adaptive_factor{route}`
/// follows. Routes are read from the current runtime at each tick, so a reload that adds,
/// changes or removes `adaptive` applies from the next tick (a removed route's series is
/// dropped).
pub(crate) fn adaptive_controller(core: Arc<Core>) -> Every {
    let shown: Arc<Mutex<Vec<Arc<str>>>> = Arc::default();
    every(Duration::from_secs(1), move || {
        let mut shown = shown.lock().unwrap_or_else(PoisonError::into_inner);
        *shown = adaptive_tick(&core, &shown);
        std::future::ready(())
    })
}

/// One controller step for every adaptive route of the current runtime; answers the
/// routes whose gauge is set (those of `shown` no longer adaptive lose theirs).
fn adaptive_tick(core: &Core, shown: &[Arc<str>]) -> Vec<Arc<str>> {
    let rt = core.runtime();
    let now_ms = core.clock.now_ms();
    let gauge = &core.metrics.adaptive_factor;
    let mut now_shown = Vec::new();
    for entry in rt.router.entries() {
        let Some(settings) = &entry.route.adaptive else {
            continue;
        };
        let live = core.route_state(entry);
        let Some(state) = live.adaptive() else {
            continue;
        };
        let factor = state.tick(settings, now_ms);
        let name = &entry.route.name;
        gauge.with_label_values(&[name]).set(factor.as_f64());
        now_shown.push(name.clone());
    }
    for gone in shown.iter().filter(|n| !now_shown.contains(n)) {
        let _ = gauge.remove_label_values(&[gone]);
    }
    now_shown
}
