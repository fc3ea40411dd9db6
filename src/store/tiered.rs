//! Failure is a policy: the shared store first; when it fails or the circuit breaker is
//! open, each scope's `on_failure` decides, in microseconds, without waiting on Redis.
//!
//! - `closed`: the request is refused (503 `rate_limiter_unavailable`, `Retry-After: 1`).
//! - `open`: the scope is skipped (counted as `failed_open`).
//! - `local`: the scope is decided by this process's `MemoryStore` with every limit divided
//!   by the live instance count (counted as `local_fallback`), so a fleet of N gateways
//!   admits about the limit in total, not N times it (Kong Enterprise's fallback counts
//!   the full limit per node).
//!
//! This store decides; it does not count decisions (the admission pipeline counts each
//! scope once from the verdict). It counts `throttle_store_errors_total` once per call
//! that reached the store and failed; calls an open breaker skips are not errors.
//!
//! The local state is separate and never written back: when Redis answers again,
//! decisions are shared again from the next request on (the breaker probes every
//! `PROBE_EVERY`), and Redis never sees what was counted locally.
//!
//! Settles (`cost_header`) follow the breaker at the time of the settle: closed, to the
//! shared store; otherwise a debt is charged to the local fallback (divided limits, the
//! scopes whose `on_failure` is `local`), where this gateway's requests are decided
//! now, and a refund is dropped: its charge may live in Redis, and refunding it locally
//! would free tokens this process never charged. A request that straddles a recovery
//! settles where the breaker points then (a refund reaching Redis for a charge made
//! locally frees up to that refund there once).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrayvec::ArrayVec;
use async_trait::async_trait;

use super::breaker::{BreakerState, CircuitBreaker};
use super::slots::{self, Acquired, Origin, SlotRequest};
use super::{LimitStore, MemoryStore, StoreError};
use crate::limiter::{Check, DecidedAt, OnFailure, ScopeLimits, Verdict, MAX_SCOPES};
use crate::metrics::Metrics;

/// Consecutive failures that open the breaker.
pub const FAILURES_TO_OPEN: u32 = 3;
/// How often an open breaker lets one call through to probe the store.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

/// The shared store with its failure policies.
pub struct TieredStore {
    primary: Arc<dyn LimitStore>,
    fallback: Arc<MemoryStore>,
    breaker: CircuitBreaker,
    instances: Arc<AtomicU32>,
    metrics: Arc<Metrics>,
}

// === impl TieredStore ===

impl TieredStore {
    /// `primary` guarded by a breaker, with a local fallback sized by `instances`.
    pub fn new(
        primary: Arc<dyn LimitStore>,
        fallback: Arc<MemoryStore>,
        instances: Arc<AtomicU32>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            primary,
            fallback,
            breaker: CircuitBreaker::new(FAILURES_TO_OPEN, PROBE_EVERY),
            instances,
            metrics,
        }
    }

    /// The breaker (for tests and `/readyz`).
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// The local fallback store (the gateway sweeps it).
    pub fn fallback(&self) -> &MemoryStore {
        &self.fallback
    }

    /// The limits of `check`'s `on_failure = "local"` scopes (by index), divided by the
    /// live instance count.
    fn divided(&self, check: &Check<'_>) -> ArrayVec<(usize, ScopeLimits), MAX_SCOPES> {
        let n = self.instances.load(Ordering::Relaxed).max(1);
        check
            .scopes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.limits.on_failure == OnFailure::Local)
            .map(|(i, s)| (i, divide(s.limits, n)))
            .collect()
    }

    fn degraded(
        &self,
        check: &Check<'_>,
        error: Option<StoreError>,
    ) -> Result<Verdict, StoreError> {
        if check
            .scopes
            .iter()
            .any(|s| s.limits.on_failure == OnFailure::Closed)
        {
            return Err(error.unwrap_or(StoreError::CircuitOpen));
        }
        let divided = self.divided(check);
        let mut local = Check::new(check.cost);
        local.peek = check.peek;
        for (i, limits) in &divided {
            let s = &check.scopes[*i];
            local.push(s.scope, s.ident.clone(), limits);
        }
        // Positions in `check` (the local verdict's own bits are positions in `local`).
        let failed_open = check
            .scopes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.limits.on_failure == OnFailure::Open)
            .fold(0u8, |bits, (i, _)| bits | 1 << i);
        let mut verdict = self.fallback.decide(&local);
        verdict.fallback = true;
        verdict.failed_open = failed_open;
        verdict.scopes_checked |= failed_open;
        Ok(verdict)
    }
}

impl TieredStore {
    /// Runs `call` on the primary when the breaker lets it through, recording its outcome
    /// (breaker, `throttle_store_errors_total`, `throttle_fallback_active`). `Err` carries
    /// the primary's error, or None when the breaker skipped the call.
    async fn guarded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, Option<StoreError>> {
        let mut error = None;
        if self.breaker.allow() {
            match call.await {
                Ok(v) => {
                    self.breaker.success();
                    self.metrics.fallback_active.set(0);
                    return Ok(v);
                }
                Err(e) => {
                    self.metrics
                        .store_errors_total
                        .with_label_values(&[self.primary.name()])
                        .inc();
                    self.breaker.failure();
                    error = Some(e);
                }
            }
        }
        self.metrics
            .fallback_active
            .set(i64::from(self.breaker.state() != BreakerState::Closed));
        Err(error)
    }
}

/// `limits` with every window's limit and capacity divided by `n` (at least 1).
pub fn divide(limits: &ScopeLimits, n: u32) -> ScopeLimits {
    crate::limiter::scale::scaled(limits, |c| c / n.max(1))
}

#[async_trait]
impl LimitStore for TieredStore {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        match self.guarded(self.primary.check(check)).await {
            Ok(v) => Ok(v),
            Err(error) => self.degraded(check, error),
        }
    }

    fn name(&self) -> &'static str {
        self.primary.name()
    }

    fn healthy(&self) -> bool {
        self.primary.healthy() && self.breaker.state() == BreakerState::Closed
    }

    fn instances(&self) -> Option<u32> {
        Some(self.instances.load(Ordering::Relaxed).max(1))
    }

    fn decide_locally(&self, check: &Check<'_>) -> Option<Verdict> {
        // Leases in hand and cached rejections need no store: they serve even while the
        // breaker is open, until they expire.
        self.primary.decide_locally(check)
    }

    async fn acquire(&self, slots: &[SlotRequest]) -> Result<Acquired, StoreError> {
        let error = match self.guarded(self.primary.acquire(slots)).await {
            Ok(v) => return Ok(v),
            Err(error) => error,
        };
        // As for rate windows: closed refuses, open skips the scope, local takes a slot in
        // this process with N divided by the live instance count.
        if slots.iter().any(|s| s.on_failure == OnFailure::Closed) {
            return Err(error.unwrap_or(StoreError::CircuitOpen));
        }
        let n = self.instances.load(Ordering::Relaxed).max(1);
        let local: ArrayVec<SlotRequest, { slots::MAX_SLOTS }> = slots
            .iter()
            .filter(|s| s.on_failure == OnFailure::Local)
            .cloned()
            .collect();
        Ok(self
            .fallback
            .inflight()
            .acquire(&local, |r| (r.limit / n).max(1)))
    }

    fn settle(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        if self.breaker.state() == BreakerState::Closed {
            self.primary.settle(check, delta, decided_at);
            return;
        }
        if delta <= 0 {
            return; // a refund of a charge that may live in Redis (module docs)
        }
        let divided = self.divided(check);
        let mut local = Check::new(check.cost);
        // The times by position in `local`, not `check`.
        let mut local_at = DecidedAt::default();
        for (j, (i, limits)) in divided.iter().enumerate() {
            let s = &check.scopes[*i];
            local.push(s.scope, s.ident.clone(), limits);
            local_at.add(j, decided_at.of(*i));
        }
        self.fallback.settle(&local, delta, local_at);
    }

    fn finish(&self, held: super::Held, ending: super::Ending) {
        match held.slots.origin {
            Origin::Local => self.fallback.finish(held, ending),
            Origin::Remote => self.primary.finish(held, ending),
        }
    }
}

#[cfg(test)]
mod tests;
