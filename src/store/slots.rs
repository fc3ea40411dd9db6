//! Concurrency slots (`concurrent = N`): at most N requests of one identity in flight.
//!
//! A request asks for one slot per scope that has `concurrent`, all-or-nothing, before
//! any rate window is charged; it holds them until it ends (`admission::Admission`
//! finishes exactly once, on every ending path) and gives them back then.
//!
//! `Inflight` is the exact in-process count, used by the memory store and by the Redis
//! store's local fallback. pingora-limits' `Inflight` was considered and not used: it is a
//! count-min estimator over a fixed number of slots, so two identities that collide share
//! a count and a tenant under its limit can be refused (a test below holds 100,000
//! identities at their limit of 1 at once; every one is admitted here). A limit that
//! refuses paying callers for someone else's traffic is wrong, so this is an exact map,
//! sharded to keep the locks short; an entry lives only while a request is in flight.

use std::sync::atomic::{AtomicU64, Ordering};

use arrayvec::ArrayVec;
use hashbrown::HashMap;

use crate::limiter::{Ident, OnFailure, Scope};
use crate::sharded::Sharded;

pub use crate::limiter::MAX_SLOTS;
const SHARDS: usize = 16;

/// One slot a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRequest {
    /// The scope.
    pub scope: Scope,
    /// Whose slot.
    pub ident: Ident,
    /// N of `concurrent = N`.
    pub limit: u32,
    /// The scope's failure policy (Redis unreachable).
    pub on_failure: OnFailure,
}

/// The slots of one request, in scope order.
pub type SlotRequests = ArrayVec<SlotRequest, MAX_SLOTS>;

/// A scope whose slots are all taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    /// The scope.
    pub scope: Scope,
    /// N.
    pub limit: u32,
    /// In flight including this request.
    pub current: u64,
}

/// Where a lease's slots were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// This process (the memory store, or the Redis store's local fallback).
    #[default]
    Local,
    /// Redis, fleet-wide.
    Remote,
}

/// The slots a request holds until it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotLease {
    /// Unique within the process (names the request's entries in Redis).
    pub id: u64,
    /// The identities holding a slot.
    pub entries: ArrayVec<(Scope, Ident), MAX_SLOTS>,
    /// Where they were taken.
    pub origin: Origin,
}

/// What a slot request answers.
pub type Acquired = Result<SlotLease, Full>;

static NEXT_LEASE: AtomicU64 = AtomicU64::new(1);

/// A process-unique lease id.
pub fn next_lease_id() -> u64 {
    NEXT_LEASE.fetch_add(1, Ordering::Relaxed)
}

// === impl SlotLease ===

impl SlotLease {
    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// In-flight counts of the identities of one shard.
type Counts = HashMap<(Scope, Ident), u32>;

/// Exact in-flight counts per (scope, identity).
pub struct Inflight {
    shards: Sharded<Counts>,
}

impl Default for Inflight {
    fn default() -> Self {
        Self {
            shards: Sharded::new(SHARDS),
        }
    }
}

impl Inflight {
    /// Takes one slot of each request, all-or-nothing; `limit` gives each one's N (the
    /// local fallback divides it by the fleet size).
    ///
    /// # Errors
    /// The first scope whose slots are all taken; nothing is taken then.
    pub fn acquire(&self, reqs: &[SlotRequest], limit: impl Fn(&SlotRequest) -> u32) -> Acquired {
        let mut lease = SlotLease {
            id: next_lease_id(),
            ..SlotLease::default()
        };
        for r in reqs {
            let n = limit(r).max(1);
            let mut map = self.shards.lock_for((r.scope, &r.ident));
            let count = map.entry((r.scope, r.ident.clone())).or_insert(0);
            if *count >= n {
                let current = u64::from(*count) + 1;
                if *count == 0 {
                    map.remove(&(r.scope, r.ident.clone()));
                }
                drop(map);
                self.release(&lease.entries);
                return Err(Full {
                    scope: r.scope,
                    limit: n,
                    current,
                });
            }
            *count += 1;
            drop(map);
            lease.entries.push((r.scope, r.ident.clone()));
        }
        Ok(lease)
    }

    /// Gives back one slot of each entry.
    pub fn release(&self, entries: &[(Scope, Ident)]) {
        for (scope, ident) in entries {
            let mut map = self.shards.lock_for((*scope, ident));
            let key = (*scope, ident.clone());
            if let Some(c) = map.get_mut(&key) {
                *c = c.saturating_sub(1);
                if *c == 0 {
                    map.remove(&key);
                }
            }
        }
    }

    /// Requests of `ident` in flight in `scope`.
    pub fn in_flight(&self, scope: Scope, ident: &Ident) -> u32 {
        let map = self.shards.lock_for((scope, ident));
        map.get(&(scope, ident.clone())).copied().unwrap_or(0)
    }

    /// Identities with a request in flight (memory is bounded by requests in flight).
    pub fn len(&self) -> usize {
        self.shards.iter_locked().map(|s| s.len()).sum()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    use super::*;

    fn req(scope: Scope, ident: &str, limit: u32) -> SlotRequest {
        SlotRequest {
            scope,
            ident: Ident::Name(Arc::from(ident)),
            limit,
            on_failure: OnFailure::Local,
        }
    }

    #[test]
    fn n_slots_then_full_then_released() {
        let f = Inflight::default();
        let r = [req(Scope::Tenant, "acme", 2)];
        let a = f.acquire(&r, |r| r.limit).unwrap();
        let b = f.acquire(&r, |r| r.limit).unwrap();
        let full = f.acquire(&r, |r| r.limit).unwrap_err();
        assert_eq!(
            full,
            Full {
                scope: Scope::Tenant,
                limit: 2,
                current: 3
            }
        );
        f.release(&a.entries);
        let c = f.acquire(&r, |r| r.limit).unwrap();
        f.release(&b.entries);
        f.release(&c.entries);
        assert!(f.is_empty());
        assert_ne!(a.id, b.id);
    }

    /// A later scope that is full leaves the earlier ones untouched.
    #[test]
    fn all_or_nothing() {
        let f = Inflight::default();
        let key = req(Scope::Key, "k1", 5);
        let tenant = req(Scope::Tenant, "acme", 1);
        let held = f
            .acquire(std::slice::from_ref(&tenant), |r| r.limit)
            .unwrap();
        let both = [key.clone(), tenant.clone()];
        assert_eq!(
            f.acquire(&both, |r| r.limit).unwrap_err().scope,
            Scope::Tenant
        );
        assert_eq!(f.in_flight(Scope::Key, &key.ident), 0);
        f.release(&held.entries);
        let ok = f.acquire(&both, |r| r.limit).unwrap();
        assert_eq!(f.in_flight(Scope::Key, &key.ident), 1);
        assert_eq!(f.in_flight(Scope::Tenant, &tenant.ident), 1);
        f.release(&ok.entries);
        assert!(f.is_empty());
    }

    /// The limit function (the local fallback's share) decides, not the request's N.
    #[test]
    fn divided_limit() {
        let f = Inflight::default();
        let r = [req(Scope::Key, "k", 9)];
        let _a = f.acquire(&r, |r| r.limit / 3).unwrap();
        let _b = f.acquire(&r, |r| r.limit / 3).unwrap();
        let _c = f.acquire(&r, |r| r.limit / 3).unwrap();
        assert_eq!(f.acquire(&r, |r| r.limit / 3).unwrap_err().limit, 3);
    }

    /// Exact per identity: 100,000 identities each at its limit of 1 are all admitted (an
    /// estimator of bounded size would make some share a count and refuse them), and a
    /// second request of each is refused.
    #[test]
    fn exact_for_many_identities() {
        let f = Inflight::default();
        let ident = |i: u32| Ident::Ip(IpAddr::V4(Ipv4Addr::from(i)));
        let r = |i| SlotRequest {
            scope: Scope::Ip,
            ident: ident(i),
            limit: 1,
            on_failure: OnFailure::Local,
        };
        let leases: Vec<_> = (0..100_000u32)
            .map(|i| f.acquire(&[r(i)], |r| r.limit).expect("its only request"))
            .collect();
        assert!((0..100_000u32)
            .step_by(997)
            .all(|i| f.acquire(&[r(i)], |r| r.limit).is_err()));
        for l in &leases {
            f.release(&l.entries);
        }
        assert!(f.is_empty());
    }
}
