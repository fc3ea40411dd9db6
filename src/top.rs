//! Who is near or over the limit: the approximate heaviest identities of the last 60 s per
//! scope (`GET /v1/top`), in memory fixed at start whatever the traffic.
//!
//! Each scope (ip, key, tenant, and each custom scope) has a `TopSketch`:
//! - six 10 s slots, each two count-min sketches (`CountMin`, 4 rows x 4096 counters):
//!   one counts requests, one counts rejected requests. A slot is reset
//!   by the first request that lands in it after 60 s; reads sum the slots of the six
//!   most recent 10 s epochs and ignore older ones, so nothing needs a timer.
//! - a candidate set of at most `CANDIDATES` identities (min-eviction): a request whose
//!   windowed estimate beats the smallest candidate's takes its place. Only candidates
//!   are remembered by name, so the answer can name at most `CANDIDATES` identities.
//!
//! The approximation, stated:
//! - "The last 60 s" moves in 10 s steps: a request is counted for 50 to 60 s (the
//!   current slot plus the five before it).
//! - Count-min only over-counts: an estimate exceeds the truth by at most about
//!   e x (requests in the slot) / 4096 per slot, and usually far less (the least of four
//!   rows). `rejected` is clamped to `requests`.
//! - A request racing the reset of its slot (at a 10 s boundary) may be lost.
//! - An identity enters the candidate set only when its estimate beats the smallest
//!   candidate, so after a spray of light identities a new heavy hitter ranks from its
//!   next request on; candidate counts are re-read from the sketches on every answer.
//!
//! Cost per request and scope: one identity hash (foldhash), whose bits give the counter of
//! every row in every slot (`Cells`), four counter increments (eight when rejected) and up
//! to 20 counter reads; the candidate lock is taken only when
//! the identity's estimate beats the smallest candidate (heavy hitters, or while the set
//! is filling), and never across an await. Nothing is allocated but a candidate's
//! `Ident` clone (an address, or a shared name) when it enters the set.
//! Memory: 6 slots x 2 sketches x 4 x 4096 x 8 bytes = 1.5 MiB per scope, allocated (and
//! written) at start for ip, key and tenant, and on its first request for a custom scope.

use std::hash::BuildHasher;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use hashbrown::{DefaultHashBuilder, HashMap};

use crate::limiter::{Base, Ident, Named, Scope};

/// The window `/v1/top` describes, in seconds.
pub const WINDOW_SECS: u64 = 60;
/// Identities remembered by name per scope.
pub const CANDIDATES: usize = 128;

const SLOTS: u64 = 6;
const SLOT_MS: u64 = WINDOW_SECS * 1000 / SLOTS;
const HASHES: usize = 4;
const WIDTH: usize = 1 << ROW_BITS;
/// Bits of the fingerprint per row: `HASHES` x `ROW_BITS` <= 64.
const ROW_BITS: u32 = 12;
const _: () = assert!(HASHES as u32 * ROW_BITS <= 64);

/// The sketches of the ip, key and tenant scopes and of the custom scopes.
pub struct TopTable {
    ip: TopSketch,
    key: TopSketch,
    tenant: TopSketch,
    /// Custom scopes' sketches, made on a scope's first request and dropped when a reload
    /// removes the scope (`retain`): at most one per custom scope of the config (and of a
    /// config just replaced, until the next reload), read without a lock.
    custom: ArcSwap<HashMap<Named, Arc<TopSketch>>>,
    /// Taken to add or drop custom sketches (so a sketch is made once).
    changing: Mutex<()>,
    /// What `scope` lends for a custom scope nobody has counted in yet (never written).
    idle: std::sync::OnceLock<TopSketch>,
}

/// A scope's sketch, as `TopTable::scope` lends it.
pub enum SketchRef<'a> {
    /// One owned by the table (a built-in scope's, or an empty one).
    Table(&'a TopSketch),
    /// A custom scope's, shared with the table (which may drop it at a reload).
    Custom(Arc<TopSketch>),
}

/// The heavy hitters of one scope over the last 60 s (see the module docs).
pub struct TopSketch {
    slots: Box<[Slot]>,
    candidates: Mutex<Vec<Candidate>>,
    /// The smallest candidate's estimate when the set is full, else 0: a request at or
    /// under it cannot enter, so it takes no lock.
    floor: AtomicU64,
    hasher: DefaultHashBuilder,
}

/// One identity's estimated counts over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heavy {
    /// Who.
    pub identity: Ident,
    /// Requests, rejected ones included.
    pub requests: u64,
    /// Requests answered 429 by a limit.
    pub rejected: u64,
}

struct Slot {
    /// The 10 s epoch (`now / 10 s`) the counters belong to.
    epoch: AtomicU64,
    requests: CountMin,
    rejected: CountMin,
}

/// A count-min sketch of `HASHES` rows x `WIDTH` counters. Its rows are indexed by
/// disjoint 12-bit fields of one 64-bit fingerprint (`Cells`), so one hash serves every
/// row of every slot (`pingora_limits::Estimator` hashes the key once per row and call:
/// 24 hashes a request and scope here; one hash took 558 instructions off a request with
/// three identities, measured by callgrind).
struct CountMin {
    counters: Box<[AtomicU64]>,
}

/// The counter of each row for one fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cells([usize; HASHES]);

struct Candidate {
    ident: Ident,
    fp: u64,
    /// The windowed estimate when last seen (re-read on every rotation and answer).
    requests: u64,
}

// === impl TopTable ===

impl TopTable {
    /// Empty sketches for every scope (4.5 MiB).
    pub fn new() -> Self {
        Self {
            ip: TopSketch::new(),
            key: TopSketch::new(),
            tenant: TopSketch::new(),
            custom: ArcSwap::default(),
            changing: Mutex::new(()),
            idle: std::sync::OnceLock::new(),
        }
    }

    /// Counts one request of `ident` in `scope` (a no-op for global and auth, and for an
    /// empty name: a caller the Envoy service knows only by its tenant has no key id).
    pub fn record(&self, scope: Scope, ident: &Ident, rejected: bool, now_ms: u64) {
        if matches!(ident, Ident::Name(n) if n.is_empty()) {
            return;
        }
        match scope {
            Scope::Ip => self.ip.record(ident, rejected, now_ms),
            Scope::Key => self.key.record(ident, rejected, now_ms),
            Scope::Tenant => self.tenant.record(ident, rejected, now_ms),
            Scope::Named(n) if counts_identities(n) => match self.custom.load().get(&n) {
                Some(s) => s.record(ident, rejected, now_ms),
                None => self.custom(n).record(ident, rejected, now_ms),
            },
            Scope::Global | Scope::Auth | Scope::Named(_) => {}
        }
    }

    /// The sketch of `scope` (None for global and auth, which have no identities, and
    /// for a route's tables and domains, whose identities are others' or not counted).
    /// Reading never makes a custom scope's sketch: one nobody counted in reads empty.
    pub fn scope(&self, scope: Scope) -> Option<SketchRef<'_>> {
        match scope {
            Scope::Ip => Some(SketchRef::Table(&self.ip)),
            Scope::Key => Some(SketchRef::Table(&self.key)),
            Scope::Tenant => Some(SketchRef::Table(&self.tenant)),
            Scope::Named(n) if counts_identities(n) => Some(match self.custom.load().get(&n) {
                Some(s) => SketchRef::Custom(s.clone()),
                None => SketchRef::Table(self.idle.get_or_init(TopSketch::new)),
            }),
            Scope::Global | Scope::Auth | Scope::Named(_) => None,
        }
    }

    /// Drops the sketches of custom scopes `live` says are gone (a reload removed them).
    pub fn retain(&self, live: impl Fn(Named) -> bool) {
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.custom.load_full();
        if current.keys().all(|n| live(*n)) {
            return;
        }
        let mut kept = HashMap::clone(&current);
        kept.retain(|n, _| live(*n));
        self.custom.store(Arc::new(kept));
    }

    /// How many custom scopes have a sketch.
    pub fn custom_sketches(&self) -> usize {
        self.custom.load().len()
    }

    /// The sketch of custom scope `n`, made on first use.
    fn custom(&self, n: Named) -> Arc<TopSketch> {
        if let Some(s) = self.custom.load().get(&n) {
            return s.clone();
        }
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.custom.load_full();
        if let Some(s) = current.get(&n) {
            return s.clone(); // made while this request waited
        }
        let made = Arc::new(TopSketch::new());
        let mut more = HashMap::clone(&current);
        more.insert(n, made.clone());
        self.custom.store(Arc::new(more));
        made
    }
}

/// Whether `n` counts identities of its own: a custom scope (a route's tables count the
/// ip, key and tenant identities; a domain's counters are not callers).
fn counts_identities(n: Named) -> bool {
    n.info().route.is_none() && matches!(n.info().base, Base::Custom(_))
}

impl Deref for SketchRef<'_> {
    type Target = TopSketch;

    fn deref(&self) -> &TopSketch {
        match self {
            SketchRef::Table(s) => s,
            SketchRef::Custom(s) => s,
        }
    }
}

impl Default for TopTable {
    fn default() -> Self {
        Self::new()
    }
}

// === impl TopSketch ===

impl TopSketch {
    /// An empty sketch (1.5 MiB).
    pub fn new() -> Self {
        let slot = || Slot {
            epoch: AtomicU64::new(0),
            requests: CountMin::new(),
            rejected: CountMin::new(),
        };
        Self {
            slots: (0..SLOTS).map(|_| slot()).collect(),
            candidates: Mutex::new(Vec::with_capacity(CANDIDATES)),
            floor: AtomicU64::new(0),
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// Counts one request of `ident` at `now_ms` (`rejected`: answered 429 by a limit).
    pub fn record(&self, ident: &Ident, rejected: bool, now_ms: u64) {
        let fp = self.hasher.hash_one(ident);
        let epoch = now_ms / SLOT_MS;
        let slot = self.slot(epoch);
        let cells = Cells::of(fp);
        let current = slot.requests.incr(cells);
        if rejected {
            slot.rejected.incr(cells);
        }
        let total = current + self.sum(cells, epoch, Some(slot), |s| &s.requests);
        if total <= self.floor.load(Ordering::Relaxed) {
            return; // cannot beat the smallest candidate: no lock
        }
        self.offer(ident, fp, total);
    }

    /// The `n` heaviest identities of the window ending at `now_ms`, by requests (ties:
    /// by identity text).
    pub fn top(&self, n: usize, now_ms: u64) -> Vec<Heavy> {
        let epoch = now_ms / SLOT_MS;
        let named: Vec<(Ident, u64)> = self
            .lock()
            .iter()
            .map(|c| (c.ident.clone(), c.fp))
            .collect();
        let mut out: Vec<Heavy> = named
            .into_iter()
            .map(|(identity, fp)| {
                let cells = Cells::of(fp);
                let requests = self.sum(cells, epoch, None, |s| &s.requests);
                let rejected = self.sum(cells, epoch, None, |s| &s.rejected);
                Heavy {
                    identity,
                    requests,
                    rejected: rejected.min(requests),
                }
            })
            .filter(|h| h.requests > 0)
            .collect();
        out.sort_by(|a, b| {
            b.requests
                .cmp(&a.requests)
                .then_with(|| a.identity.to_string().cmp(&b.identity.to_string()))
        });
        out.truncate(n);
        out
    }

    /// The slot of `epoch`, reset first when it still holds an older epoch.
    fn slot(&self, epoch: u64) -> &Slot {
        // Both indexes are < SLOTS (6): the casts cannot truncate.
        let slot = &self.slots[(epoch % SLOTS) as usize];
        let seen = slot.epoch.load(Ordering::Acquire);
        if seen < epoch
            && slot
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            slot.requests.reset();
            slot.rejected.reset();
            self.refresh(epoch);
        }
        slot
    }

    /// The count at `cells` in the live slots of `epoch` (those of the last six epochs),
    /// except `skip`.
    fn sum(
        &self,
        cells: Cells,
        epoch: u64,
        skip: Option<&Slot>,
        sketch: impl Fn(&Slot) -> &CountMin,
    ) -> u64 {
        self.slots
            .iter()
            .filter(|s| !skip.is_some_and(|k| std::ptr::eq(*s, k)))
            .filter(|s| {
                let e = s.epoch.load(Ordering::Acquire);
                e <= epoch && e + SLOTS > epoch
            })
            .map(|s| sketch(s).get(cells))
            .sum()
    }

    /// Puts `ident` (estimate `total`) into the candidate set, evicting the smallest
    /// candidate when the set is full and `total` beats it.
    fn offer(&self, ident: &Ident, fp: u64, total: u64) {
        let mut c = self.lock();
        let floor = self.floor.load(Ordering::Relaxed);
        if let Some(e) = c.iter_mut().find(|e| e.fp == fp) {
            let was_floor = e.requests <= floor;
            e.requests = e.requests.max(total);
            if !was_floor {
                return; // only grew, and was not the smallest: the floor stands
            }
        } else if c.len() < CANDIDATES {
            c.push(Candidate {
                ident: ident.clone(),
                fp,
                requests: total,
            });
        } else if let Some(min) = c.iter_mut().min_by_key(|e| e.requests) {
            if total <= min.requests {
                return;
            }
            *min = Candidate {
                ident: ident.clone(),
                fp,
                requests: total,
            };
        }
        self.floor.store(floor_of(&c), Ordering::Relaxed);
    }

    /// Re-reads every candidate's estimate at a rotation, drops those with none left in
    /// the window, and resets the floor: so identities that went quiet make room.
    fn refresh(&self, epoch: u64) {
        let mut c = self.lock();
        for e in c.iter_mut() {
            e.requests = self.sum(Cells::of(e.fp), epoch, None, |s| &s.requests);
        }
        c.retain(|e| e.requests > 0);
        self.floor.store(floor_of(&c), Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Candidate>> {
        self.candidates
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for TopSketch {
    fn default() -> Self {
        Self::new()
    }
}

/// The smallest estimate of a full set, else 0 (anyone may enter).
fn floor_of(c: &[Candidate]) -> u64 {
    if c.len() < CANDIDATES {
        return 0;
    }
    c.iter().map(|e| e.requests).min().unwrap_or(0)
}

// === impl CountMin ===

impl CountMin {
    fn new() -> Self {
        Self {
            counters: (0..HASHES * WIDTH).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts one at `cells`; the new estimate (the least of the rows).
    fn incr(&self, cells: Cells) -> u64 {
        cells.0.iter().fold(u64::MAX, |min, &i| {
            let c = self
                .counters
                .get(i)
                .map_or(0, |c| c.fetch_add(1, Ordering::Relaxed));
            min.min(c.saturating_add(1))
        })
    }

    /// The estimate at `cells`.
    fn get(&self, cells: Cells) -> u64 {
        cells.0.iter().fold(u64::MAX, |min, &i| {
            min.min(
                self.counters
                    .get(i)
                    .map_or(0, |c| c.load(Ordering::Relaxed)),
            )
        })
    }

    fn reset(&self) {
        for c in self.counters.iter() {
            c.store(0, Ordering::Relaxed);
        }
    }
}

// === impl Cells ===

impl Cells {
    /// Row `r`'s counter: bits `12r..12r+12` of `fp` (`WIDTH` = 2^12), in row `r`'s block.
    fn of(fp: u64) -> Self {
        Self(std::array::from_fn(|r| {
            // 12 bits: the cast keeps them all on any target.
            r * WIDTH + ((fp >> (ROW_BITS * r as u32)) as usize & (WIDTH - 1))
        }))
    }
}

#[cfg(test)]
mod tests;
