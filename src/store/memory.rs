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
/// A shard below this size is never swept inline.
const INLINE_SWEEP_MIN: usize = 4_096;
/// Upper bound of windows in one check: 4 scopes x 5 windows.
const MAX_WINDOWS: usize = MAX_SCOPES * Window::COUNT;

/// The embedded limit store.
pub struct MemoryStore<C: Clock = SystemClock> {
    shards: Sharded<Shard>,
    clock: C,
    inflight: Inflight,
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
    windows: SmallVec<[(Window, State); 2]>,
}

#[derive(Default)]
struct Shard {
    map: HashMap<StateKey, Slot>,
    len_after_sweep: usize,
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
            shards: Sharded::new(SHARDS),
            clock,
            inflight: Inflight::default(),
        }
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
        let slot = self.map.get_mut(&KeyRef {
            scope: s.scope,
            ident: &s.ident,
        });
        let mut slot = slot.map(|s| &mut s.windows);
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

    /// Runs `f` on the slot of `s`, created empty when missing (after an amortized
    /// sweep). One hash lookup for an identity already held.
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
        let slot = match self.map.get_mut(&key) {
            Some(slot) => slot,
            None => {
                self.maybe_sweep(now_ms);
                let owned = StateKey {
                    scope: s.scope,
                    ident: s.ident.clone(),
                };
                self.map.entry(owned).or_insert(Slot {
                    idle_at: 0,
                    windows: SmallVec::new(),
                })
            }
        };
        f(slot)
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

    fn maybe_sweep(&mut self, now_ms: u64) {
        if self.map.len() >= INLINE_SWEEP_MIN && self.map.len() >= 2 * self.len_after_sweep {
            self.sweep(now_ms);
        }
    }

    fn sweep(&mut self, now_ms: u64) {
        self.map.retain(|_, slot| slot.idle_at > now_ms);
        self.len_after_sweep = self.map.len();
    }
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
