//! `fleet = "home"`: a table whose every request is decided in the Redis of its
//! identity's home region, so a small limit (5 a minute) is exact across regions at the
//! price of one cross-region round trip per request.
//!
//! Each identity has one home among `[regions]` (this region and its peers), the same in
//! every region: rendezvous hashing of the scope, the identity and each region's name
//! ([`home_of`], FNV-1a, stable across processes and versions), so adding a region moves
//! only the identities it wins. A check is split by where its scopes are decided: scopes
//! of this region (not homed, or homed here) go to this region's store, each other
//! region's to that region's (a [`TieredStore`] of its Redis: breaker, deadline and
//! `on_failure` as for this region's own). The parts are decided concurrently, all or
//! nothing as a whole: when one part refuses, the parts that admitted are refunded (a
//! settle of their whole cost, as a Redis Cluster check refunds the slots that
//! admitted when another refused), and a part that fails fails the check (the charged
//! parts are refunded first) so that `on_failure` of the request's scopes decides.
//!
//! Without a homed scope in a check, every call goes to this region's store unchanged:
//! the split costs a scan of the check's windows.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;

use super::slots::{Acquired, SlotRequest};
use super::{Ending, Held, LimitStore, MemoryStore, RedisStore, StoreError, TieredStore};
use crate::config::{Config, Regions};
use crate::limiter::{Check, DecidedAt, Fleet, Ident, Scope, ScopeCheck, Verdict, MAX_SCOPES};
use crate::metrics::Metrics;

/// This region's store, and every other region's for the identities homed there.
pub struct HomeStore {
    /// This region's store (every scope that is not homed elsewhere).
    local: Arc<dyn LimitStore>,
    /// Every region's name, sorted (`config::Regions::names`): a region's index.
    names: Vec<String>,
    /// This region's index in `names`.
    me: usize,
    /// By region index: that region's store (None at `me`).
    peers: Vec<Option<Arc<dyn LimitStore>>>,
}

/// The home region of `ident` in `scope` among `names` (sorted region names): the
/// region with the highest score (FNV-1a, then MurmurHash3's finalizer) of (scope,
/// identity, region name). Every region
/// computes the same home for an identity.
pub fn home_of(scope: Scope, ident: &Ident, names: &[String]) -> usize {
    let (scope, ident) = (scope.to_string(), ident.to_string());
    let score = |name: &str| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for part in [scope.as_bytes(), ident.as_bytes(), name.as_bytes()] {
            for b in part.iter().chain(&[0xff]) {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        // MurmurHash3's finalizer: FNV-1a alone leaves the high bits of inputs that
        // differ only at the end too alike for a fair maximum.
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    };
    (0..names.len())
        .max_by_key(|i| (score(&names[*i]), std::cmp::Reverse(*i)))
        .unwrap_or(0)
}

/// Whether `s` is decided at its identity's home region.
fn homed(s: &ScopeCheck<'_>) -> bool {
    s.limits.windows.iter().any(|w| w.fleet == Fleet::Home)
}

// === impl HomeStore ===

impl HomeStore {
    /// `local` for this region (`names[me]`), `peers[i]` for region `i` (None at `me`).
    pub fn new(
        local: Arc<dyn LimitStore>,
        names: Vec<String>,
        me: usize,
        peers: Vec<Option<Arc<dyn LimitStore>>>,
    ) -> Self {
        Self {
            local,
            names,
            me,
            peers,
        }
    }

    /// This region's store `local` behind the split, with each peer region's Redis of
    /// `regions` as a store of its own (its breaker and `on_failure` fallback, `memory`
    /// divided by `instances`): exact, without leases (another region's tokens would need
    /// lease returns to its Redis, which only serve this region's).
    ///
    /// # Errors
    /// A peer's Redis URL the client refuses.
    pub fn with_peers(
        config: &Config,
        regions: &Regions,
        local: Arc<dyn LimitStore>,
        memory: &Arc<MemoryStore>,
        instances: &Arc<AtomicU32>,
        metrics: &Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let names: Vec<String> = regions.names().into_iter().map(String::from).collect();
        let mut peers: Vec<Option<Arc<dyn LimitStore>>> = vec![None; names.len()];
        for peer in &regions.peers {
            let Some(i) = names.iter().position(|n| *n == peer.name) else {
                continue;
            };
            let store = crate::config::Store {
                url: Some(peer.url.clone()),
                cluster: Vec::new(),
                sentinel: None,
                lease: Duration::ZERO,
                // A round trip between regions (70-200 ms) is past the local deadline
                // (25 ms by default): a peer answers within `partition_secs` or counts
                // as cut off, as for the sync loop's writes.
                timeout: config.store.timeout.max(regions.partition),
                ..config.store.clone()
            };
            let redis = RedisStore::from_config(&store)
                .map_err(|e| {
                    StoreError::Unavailable(format!("[regions] peers.{}: {e}", peer.name))
                })?
                .with_metrics(metrics.clone());
            peers[i] = Some(Arc::new(TieredStore::new(
                Arc::new(redis),
                memory.clone(),
                instances.clone(),
                metrics.clone(),
            )));
        }
        Ok(Self::new(local, names, regions.index(), peers))
    }

    /// The region deciding each of `check`'s scopes; None when all are this region's.
    fn regions(&self, check: &Check<'_>) -> Option<[usize; MAX_SCOPES]> {
        if !check.scopes.iter().any(homed) {
            return None;
        }
        let mut at = [self.me; MAX_SCOPES];
        for (i, s) in check.scopes.iter().enumerate() {
            if homed(s) {
                at[i] = home_of(s.scope, &s.ident, &self.names);
            }
        }
        at[..check.scopes.len()]
            .iter()
            .any(|r| *r != self.me)
            .then_some(at)
    }

    fn store(&self, region: usize) -> Option<&Arc<dyn LimitStore>> {
        match region == self.me {
            true => Some(&self.local),
            false => self.peers.get(region).and_then(Option::as_ref),
        }
    }

    /// The parts of `check` by region, each with the positions of its scopes in `check`.
    fn parts<'a>(
        &self,
        check: &Check<'a>,
        at: &[usize; MAX_SCOPES],
    ) -> Vec<(usize, Check<'a>, Vec<usize>)> {
        let mut regions: Vec<usize> = at[..check.scopes.len()].to_vec();
        regions.sort_unstable();
        regions.dedup();
        regions
            .into_iter()
            .map(|r| {
                let (part, _) = check.part(DecidedAt::default(), |i| at[i] == r);
                let positions = (0..check.scopes.len()).filter(|i| at[*i] == r).collect();
                (r, part, positions)
            })
            .collect()
    }
}

/// Decides `part` on `store`: at once when it can (leases, the over-limit cache), else a
/// call.
async fn decide(store: &dyn LimitStore, part: &Check<'_>) -> Result<Verdict, StoreError> {
    match store.decide_locally(part) {
        Some(v) => Ok(v),
        None => store.check(part).await,
    }
}

#[async_trait]
impl LimitStore for HomeStore {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        let Some(at) = self.regions(check) else {
            return self.local.check(check).await;
        };
        let parts = self.parts(check, &at);
        let mut stores = Vec::with_capacity(parts.len());
        for (region, _, _) in &parts {
            match self.store(*region) {
                Some(s) => stores.push(s.clone()),
                None => {
                    return Err(StoreError::Unavailable(format!(
                        "no store for region {region}"
                    )))
                }
            }
        }
        let verdicts = join_all(
            (parts.iter().zip(&stores)).map(|((_, part, _), store)| decide(&**store, part)),
        )
        .await;
        let allowed = verdicts.iter().all(|v| v.as_ref().is_ok_and(|v| v.allowed));
        if !allowed {
            // Nothing stays charged where another part refused or failed.
            for (((_, part, _), store), v) in parts.iter().zip(&stores).zip(&verdicts) {
                match v {
                    Ok(v) if v.allowed && !part.peek => {
                        store.settle(part, -i64::from(part.cost), v.decided_at);
                    }
                    _ => {}
                }
            }
        }
        let mut merged = Verdict::from_decisions(
            check,
            verdicts
                .iter()
                .filter_map(|v| v.as_ref().ok()?.governing)
                .filter(|g| g.decision.allowed == allowed),
        );
        let mut decided_at = DecidedAt::default();
        let (mut checked, mut failed_open, mut fallback) = (0u8, 0u8, false);
        for ((_, _, positions), v) in parts.iter().zip(verdicts) {
            let v = v?;
            for (j, i) in positions.iter().enumerate() {
                decided_at.add(*i, v.decided_at.of(j));
                checked |= ((v.scopes_checked >> j) & 1) << i;
                failed_open |= ((v.failed_open >> j) & 1) << i;
            }
            fallback |= v.fallback;
        }
        merged.allowed = allowed;
        merged.scopes_checked = checked;
        merged.failed_open = failed_open;
        merged.fallback = fallback;
        merged.decided_at = decided_at;
        Ok(merged)
    }

    fn name(&self) -> &'static str {
        self.local.name()
    }

    fn healthy(&self) -> bool {
        self.local.healthy()
    }

    fn instances(&self) -> Option<u32> {
        self.local.instances()
    }

    fn decide_locally(&self, check: &Check<'_>) -> Option<Verdict> {
        // A check with a part elsewhere is decided by `check` (which asks each part's
        // store for a local decision first): deciding one part here and calling for the
        // rest would charge this one twice.
        match self.regions(check) {
            None => self.local.decide_locally(check),
            Some(_) => None,
        }
    }

    async fn acquire(&self, slots: &[SlotRequest]) -> Result<Acquired, StoreError> {
        self.local.acquire(slots).await
    }

    fn settle(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        let Some(at) = self.regions(check) else {
            return self.local.settle(check, delta, decided_at);
        };
        for region in 0..self.names.len() {
            let Some(store) = self.store(region) else {
                continue;
            };
            let (part, part_at) = check.part(decided_at, |i| at[i] == region);
            if !part.is_empty() {
                store.settle(&part, delta, part_at);
            }
        }
    }

    fn finish(&self, held: Held, ending: Ending) {
        self.local.finish(held, ending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    /// Every region computes the same home, whatever order it lists the names in before
    /// sorting; homes spread over the regions; adding a region moves only identities to it.
    #[test]
    fn homes_are_stable_spread_and_move_only_to_a_new_region() {
        let three = names(&["ap", "eu", "us"]);
        let four = names(&["ap", "eu", "sa", "us"]);
        let mut per = [0usize; 3];
        for n in 0..3000 {
            let ident = Ident::Name(Arc::from(format!("key-{n}").as_str()));
            let home = home_of(Scope::Key, &ident, &three);
            assert_eq!(home, home_of(Scope::Key, &ident, &three), "stable");
            per[home] += 1;
            let moved = home_of(Scope::Key, &ident, &four);
            let was = &three[home];
            assert!(
                four[moved] == *was || four[moved] == "sa",
                "{ident} moved from {was} to {}",
                four[moved]
            );
        }
        for (i, n) in per.iter().enumerate() {
            assert!((800..1200).contains(n), "region {i} is home to {n} of 3000");
        }
        // A scope is part of the home: the same name in two scopes may live apart.
        let apart = (0..100).any(|n| {
            let ident = Ident::Name(Arc::from(format!("x{n}").as_str()));
            home_of(Scope::Key, &ident, &three) != home_of(Scope::Tenant, &ident, &three)
        });
        assert!(apart);
        assert_eq!(home_of(Scope::Global, &Ident::Global, &names(&["solo"])), 0);
    }

    /// Known values, so that a change of the hash (which would move every identity's
    /// home in a fleet running two versions) fails here.
    #[test]
    fn homes_are_fixed_values() {
        let three = names(&["ap", "eu", "us"]);
        let got: Vec<usize> = ["k1", "k2", "k3", "k4", "k5", "k6"]
            .iter()
            .map(|k| home_of(Scope::Key, &Ident::Name(Arc::from(*k)), &three))
            .collect();
        assert_eq!(got, HOMES_OF_K1_TO_K6);
    }

    const HOMES_OF_K1_TO_K6: [usize; 6] = [2, 0, 1, 0, 0, 0];
}
