//! Settling a request's cost in Redis (`LimitStore::settle`): what the leases in hand
//! take locally, and the spawned 'settle' calls for the rest.

use smallvec::SmallVec;

use super::*;
use crate::limiter::{ScopeLimits, MAX_SCOPES};

/// Bits `1 << j` for each of `n` windows.
fn all(n: usize) -> u32 {
    (1u64 << n.min(32)).wrapping_sub(1) as u32
}

/// When each window of `check`'s scope `i` was charged.
fn times(check: &Check<'_>, decided_at: DecidedAt, i: usize) -> SmallVec<[u64; 4]> {
    let n = check.scopes.get(i).map_or(0, |s| s.limits.windows.len());
    (0..n)
        .map(|j| decided_at.of_window(&check.scopes, i, j))
        .collect()
}

// === impl RedisStore ===

impl RedisStore {
    /// Settles a refund (`delta < 0`): each window of each scope paid from a lease still
    /// in hand gives it back to that lease, so what the lease reports counts it, and a
    /// window whose refund Redis would provably ignore sends nothing (`Local::refund`);
    /// of the other windows, an `auto` one's refund goes with the identity's next call
    /// (`Local::carry`), the rest are settled in Redis now, with their times.
    pub(super) fn settle_refund(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        let Some(local) = self.local.as_ref() else {
            return self.spawn_settle(check, delta, decided_at, None);
        };
        let back = u32::try_from(delta.unsigned_abs()).map_or(check.cost, |b| b.min(check.cost));
        let now = self.local_now();
        let mut missed = [0; MAX_SCOPES];
        for (i, s) in check.scopes.iter().enumerate() {
            let at = times(check, decided_at, i);
            let left = all(s.limits.windows.len()) & !local.refund(s, &at, (check.cost, back), now);
            missed[i] = left & !local.carry(s, left, &at, (check.cost, delta), now);
        }
        self.settle_windows(check, delta, decided_at, &missed, None);
    }

    /// A debt's windows whose leases in hand hold it are charged there, those whose
    /// leases hold part of it spend that part and carry the rest on the identity's next
    /// call (`Local::debit`); an `auto` window with no lease in hand carries it all
    /// (`Local::carry`); the others are settled in Redis now (with their times), each
    /// giving its ended lease back in the same call.
    pub(super) fn settle_debt(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        let Some(local) = self.local.as_ref() else {
            return self.spawn_settle(check, delta, decided_at, None);
        };
        let (debt, now) = (delta.unsigned_abs(), self.local_now());
        let mut missed = [0; MAX_SCOPES];
        let mut returns = Vec::new();
        for (i, s) in check.scopes.iter().enumerate() {
            let at = times(check, decided_at, i);
            if let Err(unpaid) = local.debit(s, debt, (check.cost, &at), now) {
                let carried = local.carry(s, unpaid.free(), &at, (check.cost, delta), now);
                let unpaid = (*unpaid).without(carried);
                if unpaid.windows != 0 {
                    missed[i] = unpaid.windows;
                    returns.push(unpaid.ended);
                }
            }
        }
        self.settle_windows(check, delta, decided_at, &missed, Some(&returns));
    }

    /// Spawns the settle of the windows `missed` names (per scope, bit `1 << j` for its
    /// window `j`): a scope missing only some of its windows is sent with those alone
    /// (each window settles on its own in the script), each with its own time; `returns`
    /// (per scope sent, per window sent) the leases to end first.
    fn settle_windows(
        &self,
        check: &Check<'_>,
        delta: i64,
        decided_at: DecidedAt,
        missed: &[u32; MAX_SCOPES],
        returns: Option<&[SmallVec<[wire::LeaseArgs; 2]>]>,
    ) {
        if missed.iter().all(|m| *m == 0) {
            return;
        }
        let reduced: SmallVec<[Option<ScopeLimits>; 4]> = (check.scopes.iter().zip(missed))
            .map(|(s, m)| {
                let n = s.limits.windows.len();
                (*m != 0 && *m & all(n) != all(n)).then(|| ScopeLimits {
                    windows: (s.limits.windows.iter().enumerate())
                        .filter(|(j, _)| m & (1 << j) != 0)
                        .map(|(_, w)| *w)
                        .collect(),
                    ..s.limits.clone()
                })
            })
            .collect();
        let mut rest = Check::new(check.cost);
        rest.peek = check.peek;
        rest.at_ms = check.at_ms;
        for ((s, m), r) in check.scopes.iter().zip(missed).zip(&reduced) {
            if *m != 0 {
                rest.scopes.push(ScopeCheck {
                    scope: s.scope,
                    ident: s.ident.clone(),
                    limits: r.as_ref().unwrap_or(s.limits),
                });
            }
        }
        let at = decided_at.select(&check.scopes, |i, j| missed[i] & (1 << j) != 0);
        self.spawn_settle(&rest, delta, at, returns);
    }

    /// Spawns the 'settle' calls of `check` (see `LimitStore::settle`): one on a single
    /// node or behind Sentinel, one per scope (one slot each) on Cluster, each within
    /// the deadline and counted as a store call. Built here, synchronously, so the task
    /// owns everything it sends. Skipped without a connection (none was made, or it was
    /// dropped after an error) or outside a Tokio runtime: the settle is lost, as a
    /// failed call's would be.
    pub(super) fn spawn_settle(
        &self,
        check: &Check<'_>,
        delta: i64,
        decided_at: DecidedAt,
        returns: Option<&[smallvec::SmallVec<[wire::LeaseArgs; 2]>]>,
    ) {
        let Some(conn) = self.conn.load_full() else {
            tracing::debug!("settle skipped: no connection to Redis");
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now = self.now_arg();
        let settle = |scopes: &[ScopeCheck<'_>], decided_at: DecidedAt, leases| {
            wire::settle_returning(
                self.script.get_hash(),
                (&now, check.cost, delta),
                decided_at,
                &self.prefix,
                scopes,
                (leases, self.region),
            )
        };
        let cmds: Vec<redis::Cmd> = if matches!(*conn, Conn::Cluster(_)) {
            // One call per scope: that scope's times at index 0.
            let one = |i| decided_at.select(&check.scopes, |x, _| x == i);
            check
                .scopes
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let leases = returns.and_then(|r| r.get(i..=i));
                    settle(std::slice::from_ref(s), one(i), leases)
                })
                .collect()
        } else {
            vec![settle(&check.scopes, decided_at, returns)]
        };
        for _ in &cmds {
            self.count_call();
        }
        let timeout = self.timeout;
        let mut conn = (*conn).clone();
        runtime.spawn(async move {
            for cmd in cmds {
                let result = tokio::time::timeout(timeout, run_script(&mut conn, &cmd)).await;
                if !matches!(result, Ok(Ok(_))) {
                    tracing::debug!("settling a request's cost did not complete");
                }
            }
        });
    }
}
