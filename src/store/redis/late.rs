//! Charges to undo: the refunds of scopes charged for a request another scope rejected
//! (Cluster), and the charges of calls whose reply came after the deadline.

use std::time::Duration;

use redis::RedisResult;

use super::wire::{self, LeaseArgs};
use super::{local, run_script, Conn, RedisStore, LATE_PATIENCE};
use crate::limiter::{Ident, Scope, ScopeCheck};

// === impl RedisStore ===

impl RedisStore {
    /// Waits (in the background, up to `LATE_PATIENCE`) for the reply of a call that
    /// missed its deadline. If it charged, the request was decided without it: the charge
    /// of every scope not failing open is refunded (an open scope admitted the request
    /// uncounted, so its late charge is the true count), and tokens it leased go back.
    pub(super) fn undo_late(
        &self,
        run: std::pin::Pin<Box<dyn std::future::Future<Output = RedisResult<Vec<u8>>> + Send>>,
        scopes: &[ScopeCheck<'_>],
        cost: u32,
        conn: Conn,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let owned: Vec<(Scope, Ident, crate::limiter::ScopeLimits)> = scopes
            .iter()
            .map(|s| (s.scope, s.ident.clone(), s.limits.clone()))
            .collect();
        let (prefix, script, timeout) = (self.prefix.clone(), self.script.clone(), self.timeout);
        let (local, region) = (self.local.clone(), self.region);
        let metrics = self.metrics.clone();
        runtime.spawn(async move {
            let Ok(Ok(raw)) = tokio::time::timeout(LATE_PATIENCE, run).await else {
                return; // no reply at all: the charge (if any) expires with its window
            };
            let scopes: Vec<ScopeCheck<'_>> = owned
                .iter()
                .map(|(scope, ident, limits)| ScopeCheck {
                    scope: *scope,
                    ident: ident.clone(),
                    limits,
                })
                .collect();
            let Ok(reply) = wire::ints(&raw).and_then(|v| wire::parse_reply(&v, &scopes)) else {
                return;
            };
            if !reply.all_allowed {
                return; // nothing was charged
            }
            let mut at = 0;
            let mut charged = Vec::new();
            let mut returns = Vec::new();
            for s in &scopes {
                let n = s.limits.windows.len();
                let decisions = reply.decisions.get(at..at + n).unwrap_or_default();
                let grants = reply.grants.get(at..at + n).unwrap_or_default();
                at += n;
                for (w, g) in s.limits.windows.iter().zip(grants) {
                    if g.granted > 0 {
                        returns.push(local::Return {
                            scope: s.scope,
                            ident: s.ident.clone(),
                            limit: *w,
                            lease: LeaseArgs {
                                ret: g.granted,
                                from: *g,
                                ..LeaseArgs::default()
                            },
                        });
                    }
                }
                if s.limits.on_failure != crate::limiter::OnFailure::Open {
                    let currents = decisions.iter().map(|d| d.decision.current).collect();
                    charged.push((s.clone(), reply.now, currents));
                }
            }
            tracing::debug!("a call that missed its deadline charged in Redis: undoing it");
            if let Some(m) = &metrics {
                m.store_late_charges_total.inc();
            }
            if let Some(local) = local.filter(|_| !returns.is_empty()) {
                local.queue_returns(returns);
            }
            let calls = refund_calls((script.get_hash(), &prefix), cost, &charged, region);
            run_refunds(conn, timeout, calls).await;
        });
    }

    /// Gives back the charges of scopes whose request another scope rejected. Runs in the
    /// background, each call within the deadline: the 429 does not wait for it.
    pub(super) fn refund(
        &self,
        conn: Conn,
        cost: u32,
        charged: Vec<(ScopeCheck<'_>, u64, Vec<u64>)>,
    ) {
        let calls = refund_calls(
            (self.script.get_hash(), &self.prefix),
            cost,
            &charged,
            self.region,
        );
        tokio::spawn(run_refunds(conn, self.timeout, calls));
    }
}

/// The 'refund' calls giving back `cost` on each of `charged`'s scopes: the scope, the
/// script's `now` of the charge, and each window's `current` then.
fn refund_calls(
    script: (&str, &str),
    cost: u32,
    charged: &[(ScopeCheck<'_>, u64, Vec<u64>)],
    region: Option<wire::RegionArgs>,
) -> Vec<redis::Cmd> {
    charged
        .iter()
        .map(|(s, now, currents)| wire::refund_command(script, cost, s, (*now, currents), region))
        .collect()
}

/// Runs `calls` one after another, each within `timeout`.
async fn run_refunds(mut conn: Conn, timeout: Duration, calls: Vec<redis::Cmd>) {
    for cmd in calls {
        let result = tokio::time::timeout(timeout, run_script(&mut conn, &cmd)).await;
        if !matches!(result, Ok(Ok(_))) {
            tracing::debug!("refund of a request's charge did not complete");
        }
    }
}
