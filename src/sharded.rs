//! One table split into mutex-guarded shards picked by key hash, so that requests for
//! different keys rarely wait on the same lock: the memory store's states, the Redis
//! store's lease table, the concurrency slots and the key cache.
//!
//! The type owns only the sharding; what a shard holds (a map, and whatever bookkeeping
//! its owner sweeps by) stays the owner's. Every lock tolerates poison: a thread that
//! panicked while holding a shard leaves at worst one half-updated limiter entry, and
//! serving that is better than refusing every later request of the shard.
//!
//! The shard count is a power of two (a count asked for is rounded up), so picking a
//! shard is a mask, as cheap as the `% 64` of a constant count, and a value that already
//! is a hash (the key cache's tags) serves as an index as it is.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::ops::{Index, IndexMut};
use std::sync::{Mutex, MutexGuard, PoisonError};

use arrayvec::ArrayVec;
use hashbrown::DefaultHashBuilder;

/// `T` held N times, each behind its own lock; a key's shard is its hash modulo N.
pub struct Sharded<T> {
    shards: Box<[Mutex<T>]>,
    hasher: DefaultHashBuilder,
    /// N - 1 (N a power of two).
    mask: usize,
}

/// The shards of up to `N` indices, locked by `Sharded::lock_each`; indexed by the
/// position of an index in the list given, not by shard.
pub struct Locked<'a, T, const N: usize> {
    /// One guard per distinct shard, in ascending shard order.
    guards: ArrayVec<MutexGuard<'a, T>, N>,
    /// Per index given, the position of its shard's guard.
    of: [usize; N],
    /// How many indices were given.
    given: usize,
}

// === impl Sharded ===

impl<T: Default> Sharded<T> {
    /// `n` (rounded up to a power of two) empty shards.
    pub fn new(n: usize) -> Self {
        Self::with(n, T::default)
    }
}

impl<T> Sharded<T> {
    /// `n` (rounded up to a power of two) shards, each made by `f`.
    pub fn with(n: usize, mut f: impl FnMut() -> T) -> Self {
        let n = n.max(1).next_power_of_two();
        Self {
            shards: (0..n).map(|_| Mutex::new(f())).collect(),
            hasher: DefaultHashBuilder::default(),
            mask: n - 1,
        }
    }

    /// The number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard of `key`: one hash of it with this table's hasher. The key is taken by
    /// value, as `BuildHasher::hash_one` takes it; a tuple of borrowed parts
    /// (`(scope, &ident)`) costs nothing to build.
    #[inline]
    pub fn index_of(&self, key: impl Hash) -> usize {
        self.hasher.hash_one(key) as usize & self.mask
    }

    /// Locks shard `i`, taken modulo the shard count: an `index_of`, or a hash of the
    /// caller's own.
    #[inline]
    pub fn lock(&self, i: usize) -> MutexGuard<'_, T> {
        lock(&self.shards[i & self.mask])
    }

    /// Locks the shard of `key`.
    #[inline]
    pub fn lock_for(&self, key: impl Hash) -> MutexGuard<'_, T> {
        self.lock(self.index_of(key))
    }

    /// Every shard in turn, each locked while its guard lives (one at a time if the
    /// caller drops each before taking the next, as `map` and `for_each` do).
    pub fn iter_locked(&self) -> impl Iterator<Item = MutexGuard<'_, T>> {
        self.shards.iter().map(lock)
    }

    /// Locks the shards of `indices` (at most `N`; any more are left out) together: in
    /// ascending shard order and each once, so two callers locking overlapping sets never
    /// deadlock, and indices sharing a shard share its guard. No allocation.
    #[inline]
    pub fn lock_each<const N: usize>(&self, indices: &[usize]) -> Locked<'_, T, N> {
        let indices = &indices[..indices.len().min(N)];
        // Positions in `indices`, sorted by shard: an insertion sort, N being a handful.
        let mut order = [0usize; N];
        for (k, i) in indices.iter().enumerate() {
            let shard = i & self.mask;
            let mut j = k;
            while j > 0 && indices[order[j - 1]] & self.mask > shard {
                order[j] = order[j - 1];
                j -= 1;
            }
            order[j] = k;
        }
        let mut locked = Locked {
            guards: ArrayVec::new(),
            of: [0; N],
            given: indices.len(),
        };
        let mut last = usize::MAX;
        for &k in &order[..indices.len()] {
            let shard = indices[k] & self.mask;
            if shard != last {
                locked.guards.push(self.lock(shard));
                last = shard;
            }
            locked.of[k] = locked.guards.len() - 1;
        }
        locked
    }
}

impl<T> fmt::Debug for Sharded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sharded")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

#[inline]
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// === impl Locked ===

impl<T, const N: usize> Locked<'_, T, N> {
    /// The number of distinct shards held.
    pub fn shards_held(&self) -> usize {
        self.guards.len()
    }
}

/// The shard of the `k`th index given to `lock_each`.
///
/// # Panics
/// When `k` is not below the number of indices given.
impl<T, const N: usize> Index<usize> for Locked<'_, T, N> {
    type Output = T;

    fn index(&self, k: usize) -> &T {
        &self.guards[self.of[..self.given][k]]
    }
}

impl<T, const N: usize> IndexMut<usize> for Locked<'_, T, N> {
    fn index_mut(&mut self, k: usize) -> &mut T {
        &mut self.guards[self.of[..self.given][k]]
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A key always lands in the same shard; a precomputed index is taken modulo N, and
    /// a count asked for is rounded up to a power of two.
    #[test]
    fn picks_one_shard_per_key() {
        let s: Sharded<Vec<u32>> = Sharded::new(12);
        assert_eq!(s.shard_count(), 16);
        let i = s.index_of(("key", 7u32));
        assert!(i < 16);
        assert_eq!(i, s.index_of(("key", 7u32)));
        s.lock_for(("key", 7u32)).push(1);
        assert_eq!(*s.lock(i), [1]);
        s.lock(i + 16).push(2);
        assert_eq!(*s.lock(i), [1, 2]);
        assert_eq!(Sharded::<()>::new(0).shard_count(), 1);
    }

    /// `with` builds every shard, and `iter_locked` visits each once.
    #[test]
    fn iterates_every_shard() {
        let mut n = 0;
        let s = Sharded::with(8, || {
            n += 1;
            n
        });
        let seen: Vec<i32> = s.iter_locked().map(|g| *g).collect();
        assert_eq!(seen, (1..=8).collect::<Vec<_>>());
        s.iter_locked().for_each(|mut g| *g = 0);
        assert_eq!(s.iter_locked().map(|g| *g).sum::<i32>(), 0);
    }

    /// Indices sharing a shard share its guard (a second lock would deadlock), each
    /// position reaches its own index's shard, and indices past `N` are left out.
    #[test]
    fn lock_each_locks_each_shard_once() {
        let s = Sharded::with(4, Vec::new);
        {
            let mut l = s.lock_each::<4>(&[3, 1, 7, 1]);
            assert_eq!(l.shards_held(), 2);
            l[0].push("a");
            l[1].push("b");
            l[2].push("c");
            l[3].push("d");
            assert_eq!(l[0], ["a", "c"]);
        }
        assert_eq!(*s.lock(1), ["b", "d"]);
        assert_eq!(*s.lock(3), ["a", "c"]);
        let l = s.lock_each::<2>(&[0, 2, 1]);
        assert_eq!(l.shards_held(), 2);
        assert!(
            s.shards[1].try_lock().is_ok(),
            "the third index is left out"
        );
    }

    /// Two threads locking overlapping sets in opposite orders never deadlock.
    #[test]
    fn lock_each_never_deadlocks() {
        let s = Arc::new(Sharded::with(4, || 0u64));
        let run = |order: [usize; 3]| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for _ in 0..10_000 {
                    let mut l = s.lock_each::<3>(&order);
                    for k in 0..3 {
                        l[k] += 1;
                    }
                }
            })
        };
        let (a, b) = (run([0, 1, 2]), run([2, 1, 0]));
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(s.iter_locked().map(|g| *g).sum::<u64>(), 60_000);
    }

    /// A shard whose holder panicked is still served.
    #[test]
    fn tolerates_poison() {
        let s = Arc::new(Sharded::with(2, || 1u32));
        let t = Arc::clone(&s);
        let _ = std::thread::spawn(move || {
            let _g = t.lock(0);
            panic!("poisons shard 0");
        })
        .join();
        assert!(s.shards[0].is_poisoned());
        *s.lock(0) += 1;
        assert_eq!(s.lock_each::<1>(&[0])[0], 2);
        assert_eq!(s.iter_locked().map(|g| *g).sum::<u32>(), 3);
    }
}
