//! Concurrency slots of the pipeline (`concurrent = N` on any table that takes it): taken
//! all-or-nothing before any rate window is charged, so a request this refuses charges no
//! window; given back when the request ends, or at once when a rate window refuses it.
//! The slots are those of the request's `Applied` tables with `concurrent`, scaled with
//! them on an adaptive route.

use super::applied::Part;
use super::core::Core;
use super::limits::Charge;
use super::Rejection;
use crate::config::Mode;
use crate::metrics::Outcome;
use crate::store::slots::SlotLease;

/// Takes the caller's slots (an empty lease when no table has `concurrent`).
///
/// # Errors
/// 429 `concurrent` when a scope has all its slots taken (enforce mode; in shadow mode
/// the request goes on without slots), 503 when a fail-closed scope's store is away.
pub(super) async fn acquire(core: &Core, c: &Charge<'_>) -> Result<SlotLease, Rejection> {
    let reqs = c.applied.slots(c.tables);
    if reqs.is_empty() {
        return Ok(SlotLease::default());
    }
    match core.store.acquire(&reqs).await {
        Ok(Ok(lease)) => Ok(lease),
        Ok(Err(full)) => {
            if c.mode == Mode::Shadow {
                core.metrics.decision(full.scope, Outcome::ShadowRejected);
                return Ok(SlotLease::default());
            }
            core.metrics.decision(full.scope, Outcome::Rejected);
            let message = c.applied.message(c.tables, full.scope);
            Err(Rejection::Concurrent { full, message })
        }
        Err(e) => {
            // The store answers an error only for a fail-closed scope (see `TieredStore`).
            tracing::debug!(error = %e, "concurrency slots: store failed");
            for scope in c.applied.closed(c.tables, Part::Slots) {
                core.metrics.decision(scope, Outcome::FailedClosed);
            }
            Err(Rejection::Unavailable)
        }
    }
}
