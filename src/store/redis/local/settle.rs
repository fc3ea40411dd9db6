//! Settling a request's cost against the leases in hand: a refund goes back to the lease
//! that paid it (`refund`), a debt is spent from the leases or ends them (`debit`).

use smallvec::SmallVec;

use super::entry::Held;
use super::{Local, Return};
use crate::limiter::{Algorithm, ScopeCheck, WindowLimit};
use crate::store::redis::wire::LeaseArgs;

// === impl Local ===

impl Local {
    /// Gives `back` refunded tokens of a request of `s` charged at `granted_at` (its
    /// `decided_at`: for a scope of several windows, the earliest of their charges) to
    /// the leases in hand: `true` when every window of `s` holds one that can take them;
    /// else nothing changes and the refund is Redis's.
    ///
    /// A refunded request paid from a lease is, for the lease rule, tokens of the lease
    /// never used: they go back with its leftovers, to the window (or bucket, or log
    /// entry) the lease was charged in, which is where Redis's refund of a request
    /// charged then goes. A counter (fixed or sliding window) takes any give-back into
    /// its window: any live lease of it takes the refund of a request charged in the
    /// current window (the call's own charge too). A bucket's or a log's refund depends
    /// on when it was charged: only the lease granted at `granted_at` takes it, never
    /// beyond what it was granted (a give-back is at most its size). The remaining the
    /// lease reports counts it.
    pub fn refund(&self, s: &ScopeCheck<'_>, granted_at: u64, back: u32, now: u64) -> bool {
        if granted_at == 0 || back == 0 {
            return false;
        }
        let counter = |w: &WindowLimit| {
            matches!(
                w.algorithm,
                Algorithm::FixedWindow | Algorithm::SlidingWindow
            )
        };
        let fits = |l: &Held| l.tokens.saturating_add(u64::from(back)) <= l.grant.granted;
        let off = |w: &WindowLimit| s.ident.offset_ms(w);
        let mut m = self.shard(s.scope, &s.ident);
        let Some(e) = m.map.get_mut(&(s.scope, s.ident.clone())) else {
            return false;
        };
        let paid_by = |slot: &super::entry::Slot, w: &WindowLimit| {
            slot.leases.iter().position(|l| {
                let paid = match counter(w) {
                    // A counter's lease is of the window of its grant (it ends with it):
                    // the refund belongs there when the request was charged in that
                    // window too (its scope's windows may have been paid by leases
                    // granted at other times; `granted_at` is the earliest). Both times
                    // are the script's clock.
                    true => w.bounds(granted_at, off(w)) == w.bounds(l.granted_at, off(w)),
                    false => l.granted_at == granted_at && fits(l),
                };
                paid && l.limit == *w && now < l.until
            })
        };
        let mut found: SmallVec<[usize; 2]> = SmallVec::new();
        for w in &s.limits.windows {
            let at = e.windows.iter().find(|slot| slot.window == w.window);
            match at.and_then(|slot| paid_by(slot, w)) {
                Some(i) => found.push(i),
                None => return false,
            }
        }
        for (w, i) in s.limits.windows.iter().zip(found) {
            let l = &mut e.slot(w.window).leases[i];
            l.tokens += u64::from(back);
            l.visible = l.visible.saturating_add(back);
        }
        true
    }

    /// Charges a debt of `debt` units of a request of `s` (its true cost above its
    /// reserve) at `now`: to the leases in hand when every window of `s` holds a live
    /// lease of its limit with that many tokens (they were charged in Redis when
    /// granted: spending them is an admission of `debt` more on the lease, which the
    /// lease rule allows for every algorithm), and `Ok`: nothing goes to Redis. Else the
    /// scope's live leases end and `Err` names, per window, the one the settle call
    /// gives back before it charges the whole debt in Redis (a second lease of a window
    /// goes back with the next expiry pass), so no gateway keeps admitting on tokens of
    /// a window the debt has spent, and a check racing the settle sees less spent, not
    /// more (the leftovers are below the debt).
    pub fn debit(
        &self,
        s: &ScopeCheck<'_>,
        debt: u64,
        now: u64,
    ) -> Result<(), SmallVec<[LeaseArgs; 2]>> {
        let mut m = self.shard(s.scope, &s.ident);
        let Some(e) = m.map.get_mut(&(s.scope, s.ident.clone())) else {
            return Err(SmallVec::new());
        };
        let live = |l: &Held, w: &WindowLimit| now < l.until && l.limit == *w;
        let mut found: SmallVec<[usize; 2]> = SmallVec::new();
        for w in &s.limits.windows {
            let slot = e.windows.iter().find(|slot| slot.window == w.window);
            let paying = slot.and_then(|slot| {
                slot.leases
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| live(l, w) && l.tokens >= debt)
                    .min_by_key(|(_, l)| l.until)
                    .map(|(i, _)| i)
            });
            match paying {
                Some(i) => found.push(i),
                None => break,
            }
        }
        if found.len() == s.limits.windows.len() {
            let units = u32::try_from(debt).unwrap_or(u32::MAX);
            for (w, i) in s.limits.windows.iter().zip(found) {
                let l = &mut e.slot(w.window).leases[i];
                l.tokens -= debt;
                l.visible = l.visible.saturating_sub(units);
            }
            return Ok(());
        }
        let mut named = SmallVec::new();
        let mut later = Vec::new();
        for w in &s.limits.windows {
            let slot = e.slot(w.window);
            let mut ended: SmallVec<[Return; 2]> = SmallVec::new();
            slot.leases.retain(|l| {
                if !live(l, w) {
                    return true;
                }
                ended.extend(l.returned(s.scope, &s.ident));
                false
            });
            // The call names the lease with the most left; any other goes back later.
            let most = (0..ended.len()).max_by_key(|i| ended[*i].lease.ret);
            named.push(most.map_or_else(LeaseArgs::default, |i| ended.remove(i).lease));
            later.extend(ended);
        }
        drop(m);
        if !later.is_empty() {
            self.queue_returns(later);
        }
        Err(named)
    }
}
