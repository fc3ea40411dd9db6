//! Sliding log: the exact count of cost admitted in the trailing window `(now - len, now]`.
//! Lua twin: `lua/sliding_log.lua` (a sorted set).
//!
//! Trade-off: exact, but memory grows with the limit (one entry per admitted request),
//! so it suits small limits. `1mo` is 30 days here.
//!
//! Leases: `take` adds one entry for the leased tokens timestamped at the lease's end,
//! not now: its tokens may be spent until then, so they must count until `until + len`
//! (an entry at now would leave the window too early). Entries are kept in time order, so
//! a lease's future entry counts from the take on and `retry_after` stays exact.
//! `give_back` shrinks (or removes) that entry.
//!
//! Settling: a debt is a new entry at the settle's time, cut so the live total stays
//! within 2 x limit; a refund shrinks the request's own entry (at its admission time, of
//! its reserved cost). See `settle`.

use std::collections::VecDeque;

use super::{add_debt, counter_top, to_u32, Lease, Settle};
use crate::limiter::decision::Decision;
use crate::limiter::policy::WindowLimit;

/// Admitted requests (and leases, at their end), in time order, with their running total.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Log {
    /// `(at_ms, cost)`, ordered by `at_ms` (a lease's entry may lie in the future).
    pub entries: VecDeque<(u64, u32)>,
    /// Sum of `cost` over `entries`.
    pub total: u64,
}

// === impl Log ===

impl Log {
    /// Cost of the entries still counted at `now` (`at + len > now`).
    fn used(&self, len: u64, now: u64) -> u64 {
        let expired: u64 = self
            .entries
            .iter()
            .take_while(|(t, _)| t.saturating_add(len) <= now)
            .map(|(_, c)| u64::from(*c))
            .sum();
        self.total - expired
    }

    /// Adds an entry in time order (after entries at the same time).
    fn insert(&mut self, at: u64, cost: u32) {
        if self.entries.back().is_none_or(|(t, _)| *t <= at) {
            self.entries.push_back((at, cost));
        } else {
            let i = self.entries.partition_point(|(t, _)| *t <= at);
            self.entries.insert(i, (at, cost));
        }
        self.total += u64::from(cost);
    }
}

/// One request of `cost` at `now`.
pub fn step(log: &mut Log, limit: &WindowLimit, now: u64, cost: u32, commit: bool) -> Decision {
    let len = limit.window.period_ms();
    let live = |t: u64| t.saturating_add(len) > now;
    let used = log.used(len, now);
    let current = used + u64::from(cost);
    let lim = u64::from(limit.limit);
    // The log is empty again one window after its latest entry (this request, or a
    // lease's entry in the future).
    let latest = log.entries.back().map_or(now, |(t, _)| (*t).max(now));
    if current <= lim {
        if commit {
            while log.entries.front().is_some_and(|(t, _)| !live(*t)) {
                if let Some((_, c)) = log.entries.pop_front() {
                    log.total -= u64::from(c);
                }
            }
            log.insert(now, cost);
        }
        return Decision {
            allowed: true,
            limit: limit.limit,
            remaining: (lim - current) as u32,
            current,
            reset_after_ms: latest + len - now,
            retry_after_ms: 0,
        };
    }
    // The oldest live entries must expire until `cost` fits again.
    let mut to_free = current - lim;
    let mut retry_at = now.saturating_add(len);
    if u64::from(cost) <= lim {
        for (t, c) in log.entries.iter().filter(|(t, _)| live(*t)) {
            if u64::from(*c) >= to_free {
                retry_at = t + len;
                break;
            }
            to_free -= u64::from(*c);
        }
    }
    let reset_at = log.entries.back().map_or(now, |(t, _)| (t + len).max(now));
    Decision {
        allowed: false,
        limit: limit.limit,
        remaining: 0,
        current,
        reset_after_ms: reset_at - now,
        retry_after_ms: (retry_at - now).max(1),
    }
}

/// Leases up to `n` tokens at `now` (never more than the window has left) until `until`
/// (a millisecond earlier per entry already there): one entry of the granted cost at its
/// end. Tags: the end and a total naming the Lua member (`(limit + 1) x (until - now) +
/// used`, `used` the count after the take): above the limit, so never a request's.
pub fn take(log: &mut Log, limit: &WindowLimit, now: u64, n: u64, until: u64) -> Lease {
    let len = limit.window.period_ms();
    let lim = u64::from(limit.limit);
    let used = log.used(len, now);
    let granted = n.min(lim.saturating_sub(used));
    if granted == 0 {
        return Lease::default();
    }
    // One entry per lease end: a lease ending when another entry is (a lease taken in the
    // same millisecond) ends a millisecond earlier, so its Lua member is unique.
    let mut until = until;
    while until > now && log.entries.binary_search_by(|(t, _)| t.cmp(&until)).is_ok() {
        until -= 1;
    }
    if until <= now {
        return Lease::default();
    }
    log.insert(until, to_u32(granted));
    Lease {
        granted,
        until,
        tag1: until,
        tag2: (lim + 1) * (until - now) + used + granted,
    }
}

/// Gives `k` unused tokens of the lease whose entry is at `tag1` with cost `size` back:
/// the entry shrinks by `k` (gone at 0). No such entry (expired): nothing. (A request
/// entry equal in time and cost is equivalent; only a lease given back twice could meet
/// one where Lua, finding no member, does nothing.)
pub fn give_back(log: &mut Log, k: u64, tag1: u64, size: u64) {
    let Some(i) = log
        .entries
        .iter()
        .position(|&(t, c)| t == tag1 && u64::from(c) == size)
    else {
        return;
    };
    let back = k.min(size);
    if back == size {
        log.entries.remove(i);
    } else {
        log.entries[i].1 = to_u32(size - back);
    }
    log.total -= back;
}

/// Settles a request at `now`; answers the debt accepted (0 for a refund).
///
/// Debt: one entry of the debt at `now` (as a replay's forced charge), past the limit if
/// need be but cut so the live total is at most 2 x limit (`counter_top`; none when it
/// already is: several settlements never stack past it). `step` rejects until enough of
/// the oldest entries have left the window, and `retry_after` stays exact (the entries
/// are in time order); every entry in the log at the settlement has left one period
/// after it (but a lease's, dated at its end).
///
/// Refund: the request's own entry (at its admission time `at`, of its reserved cost)
/// shrinks by the refund, or goes at 0: the log is then exactly the replay's. Not the
/// newest entry: taken off a later entry, the refund would outlive the request's own
/// entry, and once that has left the window the log would count less than the replay
/// (which still counts the later entry in full). An entry equal in time
/// and cost is equivalent (Lua picks the first by member name). None (a lease paid for
/// the request, or it was pruned): nothing.
pub fn settle(log: &mut Log, limit: &WindowLimit, now: u64, s: Settle) -> u64 {
    let len = limit.window.period_ms();
    match s {
        Settle::Debt(d) => {
            let used = log.used(len, now);
            let entry = add_debt(used, d, counter_top(limit)) - used;
            if entry == 0 {
                return 0;
            }
            while log
                .entries
                .front()
                .is_some_and(|(t, _)| t.saturating_add(len) <= now)
            {
                if let Some((_, c)) = log.entries.pop_front() {
                    log.total -= u64::from(c);
                }
            }
            log.insert(now, to_u32(entry));
            entry
        }
        Settle::Refund { back, cost, at } => {
            let from = log.entries.partition_point(|(t, _)| *t < at);
            let Some(i) = (from..log.entries.len())
                .take_while(|i| log.entries[*i].0 == at)
                .find(|i| u64::from(log.entries[*i].1) == cost)
            else {
                return 0;
            };
            if back >= cost {
                log.entries.remove(i);
            } else {
                log.entries[i].1 = to_u32(cost - back);
            }
            log.total -= back;
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::testkit::{
        admitted_between, assert_exact_at, assert_leases_safe, assert_retry_exact,
        assert_settles_safe, run_table,
    };
    use crate::limiter::algorithm::{self as alg, Lease, State};
    use crate::limiter::policy::{Algorithm, Window};

    fn lim(window: Window, limit: u32) -> WindowLimit {
        WindowLimit::with_algorithm(window, limit, Algorithm::SlidingLog)
    }

    /// Each admitted request leaves the window exactly `len` after it was admitted.
    #[test]
    fn entries_expire_exactly_one_window_later() {
        run_table(
            &lim(Window::Second, 3),
            &[
                (1_000, 1, true, 2, 0),
                (1_400, 2, true, 0, 0),
                (1_500, 1, false, 0, 500),
                (1_999, 1, false, 0, 1),
                (2_000, 1, true, 0, 0),
                (2_001, 2, false, 0, 399),
                (2_400, 2, true, 0, 0),
            ],
        );
    }

    /// Exactness: in any trailing window of the limit's length, at most `limit` are admitted.
    #[test]
    fn never_exceeds_the_limit_in_any_trailing_window() {
        let l = lim(Window::Minute, 10);
        let mut rng = crate::limiter::algorithm::testkit::Rng(42);
        let mut now = 1_000_000u64;
        let mut admitted = Vec::new();
        let mut log = Log::default();
        for _ in 0..5_000 {
            now += rng.below(2_000);
            if step(&mut log, &l, now, 1, true).allowed {
                admitted.push(now);
            }
        }
        for (i, t) in admitted.iter().enumerate() {
            let in_window = admitted[..=i].iter().filter(|s| **s + 60_000 > *t).count();
            assert!(
                in_window <= 10,
                "{in_window} admitted in the minute ending {t}"
            );
        }
        // ...and it is not trivially strict: the spike test admits the full limit once.
        let times: Vec<u64> = (0..10)
            .map(|i| 119_000 + i * 100)
            .chain((0..10).map(|i| 120_000 + i * 100))
            .collect();
        assert_eq!(admitted_between(&l, &times), 10);
    }

    /// A request at now + retry_after is admitted, one a millisecond earlier is not.
    #[test]
    fn retry_after_is_exact() {
        for (limit, window) in [(3, Window::Second), (7, Window::Minute), (20, Window::Hour)] {
            assert_retry_exact(&lim(window, limit));
        }
    }

    fn entries(s: &State) -> Vec<(u64, u32)> {
        match s.log() {
            Some(l) => {
                assert_eq!(
                    l.total,
                    l.entries.iter().map(|e| u64::from(e.1)).sum::<u64>()
                );
                l.entries.iter().copied().collect()
            }
            None => panic!("{s:?}"),
        }
    }

    /// A lease is one entry at its end: it counts from the take until one window after
    /// `until` (its tokens may be spent until then); `retry_after` stays exact around it.
    #[test]
    fn lease_entry_counts_until_one_window_after_its_end() {
        let l = lim(Window::Second, 5);
        let mut s = State::initial(Algorithm::SlidingLog);
        assert!(alg::step(&mut s, &l, 1_000, 0, 1, true).allowed);
        let lease = alg::take(&mut s, &l, 1_000, 0, 2, 1_250);
        // tag2: (limit + 1) x (until - now) + count after the take.
        let want = Lease {
            granted: 2,
            until: 1_250,
            tag1: 1_250,
            tag2: 6 * 250 + 3,
        };
        assert_eq!(lease, want);
        // The log is empty again one window after the lease's end.
        assert_eq!(
            alg::step(&mut s.clone(), &l, 1_000, 0, 1, false).reset_after_ms,
            1_250
        );
        // A later request goes before the lease's entry.
        assert!(alg::step(&mut s, &l, 1_100, 0, 1, true).allowed);
        assert_eq!(entries(&s), [(1_000, 1), (1_100, 1), (1_250, 2)]);
        run_rows(
            &l,
            &mut s,
            &[
                // (now, cost, allowed, remaining, retry_after_ms)
                (1_999, 2, false, 0, 1), // 1 + 1 + 2 counted; the oldest leaves at 2 000
                (2_000, 2, true, 0, 0),
                (2_249, 2, false, 0, 1), // the lease's 2 count until 2 250
                (2_250, 2, true, 1, 0),
            ],
        );
        assert_eq!(entries(&s), [(2_000, 2), (2_250, 2)]);
    }

    fn run_rows(l: &WindowLimit, s: &mut State, rows: &[(u64, u32, bool, u32, u64)]) {
        for &(now, cost, allowed, remaining, retry) in rows {
            let d = alg::step(s, l, now, 0, cost, true);
            assert_eq!(
                (d.allowed, d.remaining, d.retry_after_ms),
                (allowed, remaining, retry),
                "now={now} cost={cost} -> {d:?}"
            );
        }
    }

    /// Giving back shrinks the lease's entry, or removes it; a lease never takes more
    /// than the window has left.
    #[test]
    fn give_back_shrinks_the_lease_entry() {
        let l = lim(Window::Second, 10);
        let mut s = State::initial(Algorithm::SlidingLog);
        assert!(alg::step(&mut s, &l, 1_000, 0, 2, true).allowed);
        let lease = alg::take(&mut s, &l, 1_000, 0, 4, 1_250);
        assert_eq!(alg::take(&mut s, &l, 1_000, 0, 9, 1_200).granted, 4);
        assert_eq!(entries(&s), [(1_000, 2), (1_200, 4), (1_250, 4)]);
        alg::give_back(
            &mut s,
            &l,
            1_100,
            0,
            3,
            lease.tag1,
            lease.tag2,
            lease.granted,
        );
        assert_eq!(entries(&s), [(1_000, 2), (1_200, 4), (1_250, 1)]);
        // Given back again with its original size: no such entry any more.
        alg::give_back(
            &mut s,
            &l,
            1_100,
            0,
            1,
            lease.tag1,
            lease.tag2,
            lease.granted,
        );
        assert_eq!(entries(&s), [(1_000, 2), (1_200, 4), (1_250, 1)]);
        alg::give_back(&mut s, &l, 1_100, 0, 1, 1_250, lease.tag2, 1);
        assert_eq!(entries(&s), [(1_000, 2), (1_200, 4)]);
        assert_eq!(alg::step(&mut s, &l, 1_100, 0, 1, false).remaining, 3);
    }

    /// Random requests and leases: a replay of what was admitted admits it all, no
    /// trailing window admits more than the limit, and `retry_after` stays exact.
    #[test]
    fn leases_never_admit_more_than_a_replay() {
        for (limit, window) in [
            (20, Window::Second),
            (60, Window::Minute),
            (6, Window::Hour),
        ] {
            let l = lim(window, limit);
            let len = window.period_ms();
            for run in assert_leases_safe(&l, 0) {
                let a = &run.admitted;
                let mut from = 0;
                let mut sum = 0u64;
                for &(t, c) in a {
                    sum += u64::from(c);
                    while a[from].0 + len <= t {
                        sum -= u64::from(a[from].1);
                        from += 1;
                    }
                    assert!(sum <= u64::from(limit), "{sum} in the window ending {t}");
                }
            }
        }
    }

    /// A debt is an entry at the settle's time: rejected until enough of the oldest
    /// entries have left the window, exactly.
    #[test]
    fn debt_is_an_entry_at_the_settle() {
        let l = lim(Window::Second, 5);
        let mut s = State::initial(Algorithm::SlidingLog);
        assert!(alg::step(&mut s, &l, 1_000, 0, 1, true).allowed);
        alg::settle(&mut s, &l, 1_100, 0, 1, 7, 1_000); // true cost 8
        assert_eq!(entries(&s), [(1_000, 1), (1_100, 7)]);
        // 1 + 7 + 1 - 5 = 4 to free: the debt entry must leave, at 2 100.
        let d = assert_exact_at(&s, &l, 1_100, 1);
        assert_eq!(
            (d.retry_after_ms, d.reset_after_ms, d.current),
            (1_000, 1_000, 9)
        );
        run_rows(
            &l,
            &mut s,
            &[(2_099, 1, false, 0, 1), (2_100, 5, true, 0, 0)],
        );
    }

    /// A debt entry is cut so the live total stays within 2 x limit (in debt by at most
    /// the limit), whatever the debt; several settlements never stack past it. Every
    /// entry there at the settlement has left one period after it: a unit request waits
    /// at most one period.
    #[test]
    fn debt_is_bounded_by_the_limit() {
        // (window, limit, admissions (at, cost), settled at, delta, accepted, then for a
        // unit request: current, retry_after)
        type Row = (Window, u32, &'static [(u64, u32)], u64, i64, u64, u64, u64);
        let rows: [Row; 4] = [
            (
                Window::Second,
                5,
                &[(1_000, 1)],
                1_100,
                i64::MAX,
                9,
                11,
                1_000,
            ),
            (
                Window::Minute,
                5,
                &[(61_000, 1)],
                61_000,
                999_999_999,
                9,
                11,
                60_000,
            ),
            (
                Window::Second,
                10,
                &[(1_000, 4), (1_500, 4)],
                1_600,
                999,
                12,
                21,
                1_000,
            ),
            // Within the bound: all of it.
            (Window::Second, 5, &[(1_000, 1)], 1_100, 7, 7, 9, 1_000),
        ];
        for (i, (window, limit, admitted, at, delta, accepted, current, retry)) in
            rows.into_iter().enumerate()
        {
            let l = lim(window, limit);
            let mut s = State::initial(Algorithm::SlidingLog);
            for &(t, c) in admitted {
                assert!(alg::step(&mut s, &l, t, 0, c, true).allowed, "row {i}");
            }
            assert_eq!(
                alg::settle(&mut s, &l, at, 0, 1, delta, at),
                accepted,
                "row {i}"
            );
            assert_eq!(entries(&s).last(), Some(&(at, accepted as u32)), "row {i}");
            let d = assert_exact_at(&s, &l, at, 1);
            assert_eq!(
                (d.current, d.retry_after_ms),
                (current, retry),
                "row {i}: {d:?}"
            );
            assert!(retry <= window.period_ms(), "row {i}");
        }
        // Stacked: a log at its bound takes no more; once entries leave, a new debt fills
        // it up to the bound again, no further.
        let l = lim(Window::Second, 10);
        let mut s = State::initial(Algorithm::SlidingLog);
        assert!(alg::step(&mut s, &l, 1_000, 0, 4, true).allowed);
        assert!(alg::step(&mut s, &l, 1_500, 0, 4, true).allowed);
        assert_eq!(alg::settle(&mut s, &l, 1_600, 0, 4, 999, 1_000), 12);
        assert_eq!(alg::settle(&mut s, &l, 1_700, 0, 4, 999, 1_000), 0);
        assert_eq!(alg::settle(&mut s, &l, 2_000, 0, 4, 999, 1_000), 4);
        assert_eq!(entries(&s), [(1_500, 4), (1_600, 12), (2_000, 4)]);
        let d = assert_exact_at(&s, &l, 2_000, 1);
        assert_eq!((d.current, d.retry_after_ms), (21, 600));
    }

    /// A refund shrinks the request's own entry, not the newest: the log is then the
    /// replay's. Shrinking the newest instead would count 2 less than the replay once
    /// the request's entry has left (at 2 000).
    #[test]
    fn refund_shrinks_the_requests_own_entry() {
        let l = lim(Window::Second, 5);
        let mut s = State::initial(Algorithm::SlidingLog);
        assert!(alg::step(&mut s, &l, 1_000, 0, 2, true).allowed); // true cost 0
        assert!(alg::step(&mut s, &l, 1_200, 0, 2, true).allowed);
        assert!(alg::step(&mut s, &l, 1_300, 0, 1, true).allowed);
        alg::settle(&mut s, &l, 1_400, 0, 2, -2, 1_000);
        assert_eq!(entries(&s), [(1_200, 2), (1_300, 1)]);
        // And partly: the entry keeps the rest.
        alg::settle(&mut s, &l, 1_400, 0, 2, -1, 1_200);
        assert_eq!(entries(&s), [(1_200, 1), (1_300, 1)]);
        // No entry of that time and cost (a lease paid, or pruned): nothing.
        alg::settle(&mut s, &l, 1_400, 0, 3, -1, 1_300);
        assert_eq!(entries(&s), [(1_200, 1), (1_300, 1)]);
        run_rows(
            &l,
            &mut s,
            &[(2_100, 4, false, 0, 100), (2_200, 4, true, 0, 0)],
        );
    }

    /// Random requests settled at random times, both ways: a replay with the true costs
    /// (debts as forced charges when settled) admits every admitted request, and
    /// `retry_after` stays exact throughout.
    #[test]
    fn settles_never_admit_more_than_a_replay() {
        for (limit, window) in [
            (20, Window::Second),
            (60, Window::Minute),
            (6, Window::Hour),
        ] {
            assert_settles_safe(&lim(window, limit), 0);
        }
    }
}
