//! The embedded, in-process store: a sharded map from (scope, identity) to the states of
//! that scope's windows, so a request costs one lookup per scope and pass, not per window.
//!
//! Atomicity: a check locks the shards of all its scopes (in index order, so two checks
//! never deadlock), dry-runs every window, and charges only when every window allows.
//! Concurrent checks of the same identities are therefore serialized and exact.
//!
//! Memory is bounded by the number of identities *active* within their longest window:
//! each slot records when its state returns to the initial value (`idle_at`: the bucket is
//! full, the window is over, the log is empty), and slots past it are evicted by `sweep`
//! (run every second by the gateway) and by an amortized sweep of a shard whenever it has
//! doubled since its last sweep. An evicted slot is indistinguishable from a fresh one,
//! so eviction never hands an active client a fresh bucket. A client spraying a million
//! source IPs costs memory only until those IPs' windows have passed.
//!
//! And memory is bounded outright by `[store] max_states` (default [`DEFAULT_MAX_STATES`]),
//! as nginx bounds its zones: each shard holds at most its share of it. A new identity in
//! a full shard first sweeps the idle slots, then evicts the least recently used slots
//! down to 7/8 of the shard's share (`throttle_store_evictions_total` counts them): an
//! evicted client's limits start afresh. Recency is a per-shard counter stamped on a slot
//! at every decision, so the order is exact within a shard; the shard is the
//! approximation (a shard may fill while another has room). An eviction pass is one scan
//! of the shard plus a selection over its stamps, and frees an eighth of it, so it costs
//! O(1) per new identity amortized, and nothing while the store is below its bound: the
//! hot path only writes the stamp. (A CLOCK hand would need an index over the map; the
//! batch keeps the map a plain hash table.)

use std::hash::Hash;

use arrayvec::ArrayVec;
use async_trait::async_trait;
use hashbrown::{Equivalent, HashMap};
use smallvec::SmallVec;

use super::slots::{Acquired, Inflight, SlotRequest};
use super::{Ending, Held, LimitStore, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::limiter::algorithm::{self, step, State};
use crate::limiter::{
    Check, DecidedAt, Ident, Scope, ScopeCheck, Verdict, Window, WindowDecision, WindowLimit,
    MAX_SCOPES,
};
use crate::sharded::Sharded;

const SHARDS: usize = 64;
pub use crate::config::DEFAULT_MAX_STATES;
/// A store of fewer states has fewer shards (one per this many states, at least one), so
/// a small bound is a nearly exact LRU over the whole store.
const STATES_PER_SHARD: usize = 4_096;
/// A shard below this size is never swept inline.
const INLINE_SWEEP_MIN: usize = 4_096;
/// Upper bound of windows in one check: 4 scopes x 5 windows.
const MAX_WINDOWS: usize = MAX_SCOPES * Window::COUNT;

/// The embedded limit store.
pub struct MemoryStore<C: Clock = SystemClock> {
    shards: Sharded<Shard>,
    clock: C,
    inflight: Inflight,
    max_states: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StateKey {
    scope: Scope,
    ident: Ident,
}

/// Borrowed form of `StateKey`: same field order, so the derived hashes agree.
#[derive(Hash)]
struct KeyRef<'a> {
    scope: Scope,
    ident: &'a Ident,
}

/// The windows of one identity in one scope.
struct Slot {
    /// When every window is back to its initial value (Unix ms).
    idle_at: u64,
    /// The shard's `tick` at the last decision on it: the larger, the more recent.
    used: u64,
    windows: SmallVec<[(Window, State); 2]>,
}

struct Shard {
    map: HashMap<StateKey, Slot>,
    len_after_sweep: usize,
    /// Most slots held (this shard's share of `max_states`).
    cap: usize,
    /// Stamps every use of a slot (`Slot::used`).
    tick: u64,
    /// Slots evicted to stay within `cap`.
    evicted: u64,
    /// `throttle_store_evictions_total`, when the gateway's metrics are attached.
    counter: Option<prometheus::IntCounter>,
}

// === impl MemoryStore ===

impl MemoryStore<SystemClock> {
    /// A store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// A store reading time from `clock`.
    pub fn with_clock(clock: C) -> Self {
        Self {
            shards: shards_for(DEFAULT_MAX_STATES),
            clock,
            inflight: Inflight::default(),
            max_states: DEFAULT_MAX_STATES,
        }
    }

    /// The same store (empty) holding at most `max_states` window states (at least 1).
    pub fn with_max_states(mut self, max_states: usize) -> Self {
        self.max_states = max_states.max(1);
        self.shards = shards_for(self.max_states);
        self
    }

    /// Counts evictions in `counter` (`throttle_store_evictions_total`) too.
    pub fn with_evictions_counter(self, counter: prometheus::IntCounter) -> Self {
        for mut shard in self.shards.iter_locked() {
            shard.counter = Some(counter.clone());
        }
        self
    }

    /// The most window states held (`[store] max_states`).
    pub fn max_states(&self) -> usize {
        self.max_states
    }

    /// Slots evicted, least recently used first, to stay within `max_states`.
    pub fn evictions(&self) -> u64 {
        self.shards.iter_locked().map(|s| s.evicted).sum()
    }

    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Requests in flight per identity (`concurrent`).
    pub fn inflight(&self) -> &Inflight {
        &self.inflight
    }

    /// Decides `check` now; see the module docs for the atomicity argument.
    pub fn decide(&self, check: &Check<'_>) -> Verdict {
        let now_ms = check.at_ms.unwrap_or_else(|| self.clock.now_ms());
        self.decide_at(check, now_ms)
    }

    /// Decides `check` at `now_ms`.
    pub fn decide_at(&self, check: &Check<'_>, now_ms: u64) -> Verdict {
        if check.is_empty() {
            return Verdict::UNLIMITED;
        }
        let mut shard_of = [0usize; MAX_SCOPES];
        for (i, s) in check.scopes.iter().enumerate() {
            shard_of[i] = self.shards.index_of((s.scope, &s.ident));
        }
        // Indexed by scope: `shards[i]` is the shard of `check.scopes[i]`.
        let mut shards = self
            .shards
            .lock_each::<MAX_SCOPES>(&shard_of[..check.scopes.len()]);
        let total_windows: usize = check.scopes.iter().map(|s| s.limits.windows.len()).sum();
        if total_windows == 1 && !check.peek {
            // One window: charging is decided by that window alone, no dry run needed.
            let d = shards[0].charge(&check.scopes[0], now_ms, check.cost);
            return Verdict::from_decisions(check, d).at(check.scopes.len(), now_ms);
        }
        let mut decisions: ArrayVec<WindowDecision, MAX_WINDOWS> = ArrayVec::new();
        let mut nexts: ArrayVec<Option<State>, MAX_WINDOWS> = ArrayVec::new();
        for (i, s) in check.scopes.iter().enumerate() {
            shards[i].dry_run(s, now_ms, check.cost, &mut decisions, &mut nexts);
        }
        let verdict = Verdict::from_decisions(check, decisions.iter().copied())
            .at(check.scopes.len(), now_ms);
        if verdict.allowed && !check.peek {
            let mut at = 0;
            for (i, s) in check.scopes.iter().enumerate() {
                let n = s.limits.windows.len();
                shards[i].apply(
                    s,
                    now_ms,
                    check.cost,
                    &decisions[at..at + n],
                    &mut nexts[at..at + n],
                );
                at += n;
            }
        }
        verdict
    }

    /// Settles `check` (a request whose scopes were decided at `decided_at` with
    /// `check.cost`) at `now_ms`: see `LimitStore::settle` and `algorithm::settle`. Each
    /// scope is settled under its shard's lock, one scope at a time (a settle decides
    /// nothing, so it needs no all-or-nothing).
    pub fn settle_at(
        &self,
        check: &Check<'_>,
        delta: i64,
        decided_at: impl Into<DecidedAt>,
        now_ms: u64,
    ) {
        if delta == 0 || check.peek {
            return;
        }
        let decided_at = decided_at.into();
        for (i, s) in check.scopes.iter().enumerate() {
            let admitted_at_ms = decided_at.of(i);
            self.shards.lock_for((s.scope, &s.ident)).settle(
                s,
                now_ms,
                check.cost,
                delta,
                admitted_at_ms,
            );
        }
    }

    /// Evicts every slot whose state has returned to its initial value by `now_ms`.
    pub fn sweep_at(&self, now_ms: u64) {
        self.shards
            .iter_locked()
            .for_each(|mut shard| shard.sweep(now_ms));
    }

    /// `sweep_at` the clock's now.
    pub fn sweep(&self) {
        self.sweep_at(self.clock.now_ms());
    }

    /// Number of identities (scope, ident) held.
    pub fn len(&self) -> usize {
        self.shards.iter_locked().map(|s| s.map.len()).sum()
    }

    /// Heap bytes held: the hash tables (including free buckets) plus window lists and
    /// logs that spilled out of their slots. Identity names are shared `Arc`s, not counted.
    pub fn heap_bytes(&self) -> usize {
        self.shards
            .iter_locked()
            .map(|shard| {
                let spilled: usize = shard.map.values().map(Slot::spilled_bytes).sum();
                shard.map.allocation_size() + spilled
            })
            .sum()
    }

    /// Whether no state is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl<C: Clock> LimitStore for MemoryStore<C> {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        Ok(self.decide(check))
    }

    fn decide_locally(&self, check: &Check<'_>) -> Option<Verdict> {
        Some(self.decide(check))
    }

    async fn acquire(&self, slots: &[SlotRequest]) -> Result<Acquired, StoreError> {
        Ok(self.inflight.acquire(slots, |r| r.limit))
    }

    fn settle(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        self.settle_at(check, delta, decided_at, self.clock.now_ms());
    }

    fn finish(&self, held: Held, _ending: Ending) {
        self.inflight.release(&held.slots.entries);
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

// === impl Shard ===

impl Shard {
    /// Decisions of every window of `s` without charging; `nexts` receives the state each
    /// window would have after the charge, when that is cheap to compute now.
    fn dry_run(
        &mut self,
        s: &ScopeCheck<'_>,
        now_ms: u64,
        cost: u32,
        out: &mut ArrayVec<WindowDecision, MAX_WINDOWS>,
        nexts: &mut ArrayVec<Option<State>, MAX_WINDOWS>,
    ) {
        let tick = self.next_tick();
        let slot = self.map.get_mut(&KeyRef {
            scope: s.scope,
            ident: &s.ident,
        });
        let mut slot = slot.map(|slot| {
            slot.used = tick;
            &mut slot.windows
        });
        for limit in &s.limits.windows {
            let offset = s.ident.offset_ms(limit);
            let existing = slot
                .as_mut()
                .and_then(|w| w.iter_mut().find(|(w, _)| *w == limit.window));
            let (decision, next) = match existing {
                Some((_, state)) => match state.cheap_copy() {
                    Some(mut next) => (
                        step(&mut next, limit, now_ms, offset, cost, true),
                        Some(next),
                    ),
                    None => (step(state, limit, now_ms, offset, cost, false), None),
                },
                None => {
                    let mut next = State::initial(limit.algorithm);
                    (
                        step(&mut next, limit, now_ms, offset, cost, true),
                        Some(next),
                    )
                }
            };
            out.push(WindowDecision {
                scope: s.scope,
                window: limit.window,
                decision,
            });
            nexts.push(next);
        }
    }

    /// Stores the dry run's outcome for every window of `s` (all allowed): the precomputed
    /// next state where there is one, else a charging step.
    fn apply(
        &mut self,
        s: &ScopeCheck<'_>,
        now_ms: u64,
        cost: u32,
        decisions: &[WindowDecision],
        nexts: &mut [Option<State>],
    ) {
        self.with_slot(s, now_ms, |slot| {
            for ((limit, d), next) in s.limits.windows.iter().zip(decisions).zip(nexts) {
                let state = window_state(&mut slot.windows, limit);
                match next.take() {
                    Some(n) => *state = n,
                    None => {
                        step(state, limit, now_ms, s.ident.offset_ms(limit), cost, true);
                    }
                }
                slot.idle_at = slot
                    .idle_at
                    .max(now_ms.saturating_add(d.decision.reset_after_ms));
            }
        });
    }

    /// Runs `f` on the slot of `s`, created empty when missing (after making room: see
    /// `make_room`). One hash lookup for an identity already held.
    fn with_slot<R>(
        &mut self,
        s: &ScopeCheck<'_>,
        now_ms: u64,
        f: impl FnOnce(&mut Slot) -> R,
    ) -> R {
        let key = KeyRef {
            scope: s.scope,
            ident: &s.ident,
        };
        let used = self.next_tick();
        if let Some(slot) = self.map.get_mut(&key) {
            slot.used = used;
            return f(slot);
        }
        self.make_room(now_ms);
        let owned = StateKey {
            scope: s.scope,
            ident: s.ident.clone(),
        };
        f(self.map.entry(owned).or_insert(Slot {
            idle_at: 0,
            used,
            windows: SmallVec::new(),
        }))
    }

    /// Charges every window of `s` that allows (the caller knows all do, or that there is
    /// only one); returns the decisions.
    fn charge(
        &mut self,
        s: &ScopeCheck<'_>,
        now_ms: u64,
        cost: u32,
    ) -> ArrayVec<WindowDecision, { Window::COUNT }> {
        self.with_slot(s, now_ms, |slot| {
            let mut out = ArrayVec::new();
            for limit in &s.limits.windows {
                let state = window_state(&mut slot.windows, limit);
                let decision = step(state, limit, now_ms, s.ident.offset_ms(limit), cost, true);
                slot.idle_at = slot
                    .idle_at
                    .max(now_ms.saturating_add(decision.reset_after_ms));
                out.push(WindowDecision {
                    scope: s.scope,
                    window: limit.window,
                    decision,
                });
            }
            out
        })
    }

    /// Settles every window of `s` (see `algorithm::settle`). A refund for an identity
    /// not held (evicted: back to its initial value) has nothing to give back to.
    fn settle(
        &mut self,
        s: &ScopeCheck<'_>,
        now_ms: u64,
        cost: u32,
        delta: i64,
        admitted_at_ms: u64,
    ) {
        let key = KeyRef {
            scope: s.scope,
            ident: &s.ident,
        };
        if delta < 0 && !self.map.contains_key(&key) {
            return;
        }
        self.with_slot(s, now_ms, |slot| {
            for limit in &s.limits.windows {
                let offset = s.ident.offset_ms(limit);
                let state = window_state(&mut slot.windows, limit);
                algorithm::settle(state, limit, now_ms, offset, cost, delta, admitted_at_ms);
                // A debt may keep the state from its initial value for longer.
                let idle = step(state, limit, now_ms, offset, 1, false).reset_after_ms;
                slot.idle_at = slot.idle_at.max(now_ms.saturating_add(idle));
            }
        });
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Before a new slot: the amortized sweep of idle slots; then, at the cap, a sweep
    /// and the eviction of the least recently used slots down to 7/8 of the cap, so the
    /// next passes are an eighth of the cap away.
    fn make_room(&mut self, now_ms: u64) {
        if self.map.len() >= INLINE_SWEEP_MIN && self.map.len() >= 2 * self.len_after_sweep {
            self.sweep(now_ms);
        }
        if self.map.len() < self.cap {
            return;
        }
        self.sweep(now_ms);
        let keep = self.cap - (self.cap / 8).max(1);
        let excess = self.map.len().saturating_sub(keep);
        if excess == 0 {
            return;
        }
        // Stamps are unique within a shard: exactly `excess` evictable slots are at or
        // below the `excess`-th smallest.
        let mut stamps: Vec<u64> = self
            .map
            .iter()
            .filter(|(k, _)| evictable(k))
            .map(|(_, s)| s.used)
            .collect();
        let excess = excess.min(stamps.len());
        if excess == 0 {
            return;
        }
        let (_, threshold, _) = stamps.select_nth_unstable(excess - 1);
        let threshold = *threshold;
        self.map.retain(|k, s| !evictable(k) || s.used > threshold);
        self.len_after_sweep = self.map.len();
        self.evicted += excess as u64;
        if let Some(c) = &self.counter {
            c.inc_by(excess as u64);
        }
    }

    fn sweep(&mut self, now_ms: u64) {
        self.map.retain(|_, slot| slot.idle_at > now_ms);
        self.len_after_sweep = self.map.len();
    }
}

/// Whether a slot may be evicted: not the built-in key, tenant and global scopes. Their
/// identities are the keys and tenants the operator issued (and verified token subjects),
/// which a client cannot mint, so they are bounded without eviction; evicting them would
/// let anyone who floods fresh identities (addresses, a custom scope's header) restart a
/// key's day or month quota.
fn evictable(k: &StateKey) -> bool {
    !matches!(k.scope, Scope::Key | Scope::Tenant | Scope::Global)
}

/// Empty shards sharing `max_states`: one per [`STATES_PER_SHARD`] states (a power of
/// two, 1 to [`SHARDS`]), each holding at most its share (at least 1).
fn shards_for(max_states: usize) -> Sharded<Shard> {
    // The largest power of two at most the states over `STATES_PER_SHARD`.
    let want = (max_states / STATES_PER_SHARD).clamp(1, SHARDS);
    let n = 1usize << want.ilog2();
    let cap = (max_states / n).max(1);
    Sharded::with(n, || Shard {
        map: HashMap::new(),
        len_after_sweep: 0,
        cap,
        tick: 0,
        evicted: 0,
        counter: None,
    })
}

/// The state of `limit`'s window in `windows`, added as initial when missing.
fn window_state<'w>(
    windows: &'w mut SmallVec<[(Window, State); 2]>,
    limit: &WindowLimit,
) -> &'w mut State {
    let pos = match windows.iter().position(|(w, _)| *w == limit.window) {
        Some(pos) => pos,
        None => {
            windows.push((limit.window, State::initial(limit.algorithm)));
            windows.len() - 1
        }
    };
    &mut windows[pos].1
}

// === impl Slot ===

impl Slot {
    fn spilled_bytes(&self) -> usize {
        let list = if self.windows.spilled() {
            self.windows.capacity() * std::mem::size_of::<(Window, State)>()
        } else {
            0
        };
        let logs: usize = self
            .windows
            .iter()
            .map(|(_, s)| match s.log() {
                Some(log) => {
                    std::mem::size_of::<crate::limiter::algorithm::sliding_log::Log>()
                        + log.entries.capacity() * 16
                }
                None => 0,
            })
            .sum();
        list + logs
    }
}

// === impl KeyRef ===

impl Equivalent<StateKey> for KeyRef<'_> {
    fn equivalent(&self, key: &StateKey) -> bool {
        self.scope == key.scope && *self.ident == key.ident
    }
}

#[cfg(test)]
mod tests;
