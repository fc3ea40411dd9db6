//! Counting by outcome (`count_on`): a table admits as usual and, once the upstream
//! answered, a status outside its set refunds that table's reserve (and only that
//! table's). A request whose client left before the answer has no outcome: it counts.

use super::{Admission, Tables};
use crate::metrics::Metrics;

// === impl Admission ===

impl Admission {
    /// The upstream answered `status`: every charged table whose `count_on` leaves it
    /// out is refunded the request's reserve (memory, Redis and leases alike:
    /// `LimitStore::settle` of those tables alone), once. A later settle
    /// (`cost_header`) leaves those tables alone; `rate` is shown as refunded when its
    /// table was. Call before `settle_from` (`edge::answered` does).
    ///
    /// An interim answer (1xx other than 101, e.g. `100 Continue`) is no outcome: the
    /// final answer that follows decides (else `Expect: 100-continue` would refund a
    /// failed login before its 401).
    pub fn settle_outcome(&mut self, status: u16, metrics: &Metrics) {
        let interim = (100..200).contains(&status) && status != 101;
        if interim || self.uncounted.is_some() || !self.charged {
            return;
        }
        self.uncounted = Some(0);
        let Some(l) = &self.lifetime else {
            return;
        };
        let reserved = l.held.cost;
        let tables = Tables {
            rt: &self.runtime,
            key: self.key.as_deref(),
            route: self.route.as_deref().map(|r| &r.route),
        };
        // Most requests meet no `count_on` table: that is known without the check.
        let counts_on = (0..self.applied.entries().len()).any(|i| {
            self.applied
                .limits(tables, i)
                .is_some_and(|l| l.count_on.is_some())
        });
        if !counts_on || reserved == 0 {
            return;
        }
        let check = self.applied.check(tables, reserved);
        let mut mask = 0u32;
        for (i, s) in check.scopes.iter().enumerate() {
            if s.limits.count_on.is_some_and(|set| !set.contains(status)) {
                mask |= 1 << i;
            }
        }
        if mask == 0 || reserved == 0 {
            return;
        }
        let (refunded, at) = check.part(self.decided_at, |i| mask & (1 << i) != 0);
        let delta = -i64::from(reserved);
        l.store.settle(&refunded, delta, at);
        metrics.cost_settled(delta);
        self.uncounted = Some(mask);
        super::settle_rate(&mut self.rate, &refunded, delta);
    }
}
