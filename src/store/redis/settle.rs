//! Settling a request's cost in Redis (`LimitStore::settle`): what the leases in hand
//! take locally, and the spawned 'settle' calls for the rest.

use super::*;

// === impl RedisStore ===

impl RedisStore {
    /// A refund's scopes paid from leases still in hand go back to those leases
    /// (`Local::refund`), so what they report counts it: the rest of `check` to settle
    /// in Redis, with its times; None when no scope did (settle all of `check`).
    pub(super) fn refund_leased<'a>(
        &self,
        check: &Check<'a>,
        delta: i64,
        decided_at: DecidedAt,
    ) -> Option<(Check<'a>, DecidedAt)> {
        let local = self.local.as_ref().filter(|_| delta < 0)?;
        let back = u32::try_from(delta.unsigned_abs()).map_or(check.cost, |b| b.min(check.cost));
        let now = self.local_now();
        let missed: u32 = (check.scopes.iter().enumerate())
            .filter(|(i, s)| !local.refund(s, decided_at.of(*i), back, now))
            .fold(0, |m, (i, _)| m | 1 << i);
        let remote = missed.count_ones() as usize;
        (remote < check.scopes.len()).then(|| check.part(decided_at, |i| missed & (1 << i) != 0))
    }

    /// A debt's scopes whose leases in hand hold it are charged there (`Local::debit`);
    /// the others are settled in Redis (the rest of `check`, with its times), each
    /// giving its ended leases back in the same call.
    pub(super) fn settle_debt(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        let Some(local) = self.local.as_ref() else {
            return self.spawn_settle(check, delta, decided_at, None);
        };
        let (debt, now) = (delta.unsigned_abs(), self.local_now());
        let mut missed = 0u32;
        let mut returns = Vec::new();
        for (i, s) in check.scopes.iter().enumerate() {
            if let Err(ended) = local.debit(s, debt, now) {
                missed |= 1 << i;
                returns.push(ended);
            }
        }
        if missed != 0 {
            let (rest, at) = check.part(decided_at, |i| missed & (1 << i) != 0);
            self.spawn_settle(&rest, delta, at, Some(&returns));
        }
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
                leases,
            )
        };
        let cmds: Vec<redis::Cmd> = if matches!(*conn, Conn::Cluster(_)) {
            // One call per scope: that scope's time at index 0.
            let one = |i| DecidedAt::all(decided_at.of(i));
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
