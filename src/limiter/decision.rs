//! The outcome of a limit check: a value, never an error.
//!
//! Durations are relative milliseconds (`reset_after_ms`, `retry_after_ms`) so that a decision
//! made on Redis time never mixes clocks with the gateway's header rendering.

use smallvec::SmallVec;

use super::check::{Check, ScopeCheck, MAX_SCOPES};
use super::policy::{Scope, Window};

/// The outcome of one window for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    /// Whether this window admits the request.
    pub allowed: bool,
    /// The configured limit of the window.
    pub limit: u32,
    /// Requests left after this one (0 when rejected), clamped to `limit`.
    pub remaining: u32,
    /// The count the request would have reached: used + cost.
    pub current: u64,
    /// Ms until the window admits a full limit again (token bucket: until it is full).
    pub reset_after_ms: u64,
    /// Ms until this request would be admitted (0 when allowed). A request `retry_after_ms`
    /// later is admitted; one a millisecond earlier is not.
    pub retry_after_ms: u64,
}

/// One window's decision, labelled with where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowDecision {
    /// The scope the window belongs to.
    pub scope: Scope,
    /// The window.
    pub window: Window,
    /// The decision.
    pub decision: Decision,
}

/// The layered outcome of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// True when every scope allowed the request; only then was anything charged.
    pub allowed: bool,
    /// On a pass: the window with the fewest remaining (ties: the earliest reset).
    /// On a reject: the rejecting window with the longest retry (ties: the first scope).
    /// `None` when no limit applied.
    pub governing: Option<WindowDecision>,
    /// Bit `1 << i` for each scope `check.scopes[i]` that was checked.
    pub scopes_checked: u8,
    /// True when the shared store could not decide and each scope's `on_failure` did.
    pub fallback: bool,
    /// With `fallback`: bit `1 << i` for each scope `check.scopes[i]` skipped (`on_failure =
    /// "open"`); the other checked scopes were decided by the local fallback store.
    pub failed_open: u8,
    /// When the store decided each scope, on the store's own clock: what a settle of
    /// this request names (see `LimitStore::settle`).
    pub decided_at: DecidedAt,
}

/// When a store decided (and charged) each scope of a request, in Unix ms on the
/// store's own clock: the memory store's reading, the script's `now` on Redis (one per
/// Cluster node), the lease's grant time for windows paid from a lease. A settle names
/// these times, so a refund finds the window or log entry the charge went to whatever
/// the gateway's clock says. 0: not decided by a store.
///
/// Each scope keeps its earliest time (`of`), and each of the check's first
/// [`TIMED_WINDOWS`] windows its own (`of_window`): the windows of one scope may be paid
/// by leases granted at different times (a 1 s lease lives a quarter of a second, a 1 min
/// one longer), and a refund goes back to the lease granted at its window's time, or to
/// the window of the charge. A window's time is kept as ms after the earliest of all (a
/// `u16`: a `Verdict` is moved on the hot path, so it stays small; the times of one
/// request are at most a lease apart, and `lease_ms` is at most a minute). One out of
/// that range, or past the first [`TIMED_WINDOWS`], is its scope's earliest time (safe:
/// a bucket gives back less the longer ago, a counter or log entry not found nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecidedAt {
    /// Indexed like the check's scopes: the earliest time of each.
    at: [u64; MAX_SCOPES],
    /// Indexed like the check's windows (in check order, across scopes): ms after the
    /// earliest of `at`, `UNTIMED` when the window has no time of its own.
    windows: [u16; TIMED_WINDOWS],
}

/// How many windows of a check keep a decision time of their own (the others settle at
/// their scope's earliest time).
pub const TIMED_WINDOWS: usize = 8;

const UNTIMED: u16 = u16::MAX;

// === impl DecidedAt ===

impl Default for DecidedAt {
    fn default() -> Self {
        DecidedAt::all(0)
    }
}

impl DecidedAt {
    /// Every scope decided at `ms`.
    pub const fn all(ms: u64) -> DecidedAt {
        DecidedAt {
            at: [ms; MAX_SCOPES],
            windows: [UNTIMED; TIMED_WINDOWS],
        }
    }

    /// When the check's scope `i` was decided (0: not by a store): the earliest of its
    /// windows.
    pub fn of(&self, i: usize) -> u64 {
        self.at.get(i).copied().unwrap_or(0)
    }

    /// What the windows' times count from: the earliest time (0: none).
    fn base(&self) -> u64 {
        self.at
            .iter()
            .copied()
            .filter(|t| *t > 0)
            .min()
            .unwrap_or(0)
    }

    /// Records that `scope` was (also) decided at `ms`: the earliest time counts, the
    /// safe one for a refund (a bucket gives back less the longer ago; a counter or log
    /// entry not found gives back nothing).
    pub fn add(&mut self, i: usize, ms: u64) {
        let before = self.base();
        if let Some(t) = self.at.get_mut(i) {
            *t = if *t == 0 { ms } else { (*t).min(ms) };
        }
        let shift = before.saturating_sub(self.base());
        if before > 0 && shift > 0 {
            for w in self.windows.iter_mut().filter(|w| **w != UNTIMED) {
                *w = u16::try_from(u64::from(*w) + shift).unwrap_or(UNTIMED);
            }
        }
    }

    /// Where window `j` of scope `i` is among the windows of `scopes`, when it keeps a
    /// time of its own.
    fn slot(scopes: &[ScopeCheck<'_>], i: usize, j: usize) -> Option<usize> {
        let before: usize = scopes.iter().take(i).map(|s| s.limits.windows.len()).sum();
        Some(before + j).filter(|k| *k < TIMED_WINDOWS)
    }

    /// When window `j` of scope `i` of `scopes` (the check's) was charged: its own time,
    /// else its scope's earliest.
    pub fn of_window(&self, scopes: &[ScopeCheck<'_>], i: usize, j: usize) -> u64 {
        let own = Self::slot(scopes, i, j)
            .map(|k| self.windows[k])
            .filter(|off| *off != UNTIMED);
        own.map_or_else(|| self.of(i), |off| self.base() + u64::from(off))
    }

    /// Records that window `j` of scope `i` of `scopes` (the check's) was charged at `ms`
    /// (the earliest counts, as in `add`).
    pub fn add_window(&mut self, scopes: &[ScopeCheck<'_>], i: usize, j: usize, ms: u64) {
        self.put(i, Self::slot(scopes, i, j), ms);
    }

    /// Records scope `i`'s window at `slot` (of `windows`) charged at `ms`.
    fn put(&mut self, i: usize, slot: Option<usize>, ms: u64) {
        if ms == 0 || i >= MAX_SCOPES {
            return;
        }
        self.add(i, ms);
        let off = u16::try_from(ms - self.base()).unwrap_or(UNTIMED);
        if let Some(w) = slot.and_then(|k| self.windows.get_mut(k)) {
            *w = (*w).min(off);
        }
    }

    /// Records that `check`'s `scope` was (also) decided at `ms`, and so were those of
    /// its windows without a time of their own yet (the windows a script call decided,
    /// after the leases paid the others). A scope decided at one time keeps no window
    /// times: its windows' are its own (so a verdict compares equal to one of a store
    /// with one clock).
    pub fn add_for(&mut self, check: &Check<'_>, scope: Scope, ms: u64) {
        let Some(i) = check.position(scope) else {
            return;
        };
        let n = check.scopes[i].limits.windows.len();
        let slots: SmallVec<[usize; 4]> = (0..n)
            .filter_map(|j| Self::slot(&check.scopes, i, j))
            .collect();
        let mixed = slots.iter().any(|k| self.windows[*k] != UNTIMED);
        if !mixed && (self.of(i) == 0 || self.of(i) == ms) {
            return self.add(i, ms);
        }
        self.add(i, ms);
        let untimed: SmallVec<[usize; 4]> = (slots.into_iter())
            .filter(|k| self.windows[*k] == UNTIMED)
            .collect();
        for k in untimed {
            self.put(i, Some(k), ms);
        }
    }

    /// The times of the windows `keep` takes (by scope and window index) of `scopes`,
    /// re-indexed as the scopes and windows kept, in order: what a settle of part of a
    /// check names (see `Check::part`).
    pub fn select(
        &self,
        scopes: &[ScopeCheck<'_>],
        keep: impl Fn(usize, usize) -> bool,
    ) -> DecidedAt {
        let mut out = DecidedAt::default();
        let (mut i2, mut k2) = (0, 0);
        for (i, s) in scopes.iter().enumerate() {
            let mut kept = false;
            for j in (0..s.limits.windows.len()).filter(|j| keep(i, *j)) {
                kept = true;
                out.put(i2, Some(k2), self.of_window(scopes, i, j));
                k2 += 1;
            }
            i2 += usize::from(kept);
        }
        out
    }
}

impl From<u64> for DecidedAt {
    fn from(ms: u64) -> Self {
        DecidedAt::all(ms)
    }
}

// === impl Verdict ===

impl Verdict {
    /// A verdict for a request no limit applies to.
    pub const UNLIMITED: Verdict = Verdict {
        allowed: true,
        governing: None,
        scopes_checked: 0,
        fallback: false,
        failed_open: 0,
        decided_at: DecidedAt::all(0),
    };

    /// Folds per-window decisions of `check`'s scopes into the layered verdict (see
    /// `Verdict::governing`).
    pub fn from_decisions(
        check: &Check<'_>,
        decisions: impl IntoIterator<Item = WindowDecision>,
    ) -> Verdict {
        let mut allowed = true;
        let mut decided = false;
        let mut pass: Option<WindowDecision> = None;
        let mut reject: Option<WindowDecision> = None;
        for wd in decisions {
            decided = true;
            let d = &wd.decision;
            if !d.allowed {
                allowed = false;
                if reject.is_none_or(|r| d.retry_after_ms > r.decision.retry_after_ms) {
                    reject = Some(wd);
                }
            } else if pass.is_none_or(|p| {
                (d.remaining, d.reset_after_ms) < (p.decision.remaining, p.decision.reset_after_ms)
            }) {
                pass = Some(wd);
            }
        }
        // Every store decides every window of every scope of the check (a window paid from a
        // lease included): all of them were checked, without a search per decision.
        let all = (1u16 << check.scopes.len()).wrapping_sub(1) as u8;
        Verdict {
            allowed,
            governing: if allowed { pass } else { reject },
            scopes_checked: if decided { all } else { 0 },
            fallback: false,
            failed_open: 0,
            decided_at: DecidedAt::all(0),
        }
    }

    /// The verdict with each of the check's `n` scopes decided at `ms` (a store with one
    /// clock).
    pub fn at(self, n: usize, ms: u64) -> Verdict {
        let mut decided_at = DecidedAt::default();
        for i in 0..n {
            decided_at.add(i, ms);
        }
        Verdict { decided_at, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A check of ip, key, tenant and global (one window each; only the scopes matter).
    fn four() -> Check<'static> {
        use crate::limiter::{Ident, ScopeLimits};
        let limits: &'static ScopeLimits = Box::leak(Box::new(ScopeLimits {
            windows: vec![crate::limiter::WindowLimit {
                window: Window::Second,
                limit: 10,
                algorithm: crate::limiter::Algorithm::FixedWindow,
                capacity: 10,
                jitter_ms: 0,
                admission: crate::limiter::Admission::Auto,
                calendar: None,
                fleet: crate::limiter::Fleet::Local,
            }],
            on_failure: crate::limiter::OnFailure::Local,
            message: None,
            concurrent: None,
            ban: None,
            count_on: None,
        }));
        let mut c = Check::new(1);
        for s in [Scope::Ip, Scope::Key, Scope::Tenant, Scope::Global] {
            c.push(s, Ident::Global, limits);
        }
        c
    }

    fn wd(
        scope: Scope,
        window: Window,
        allowed: bool,
        remaining: u32,
        reset: u64,
        retry: u64,
    ) -> WindowDecision {
        WindowDecision {
            scope,
            window,
            decision: Decision {
                allowed,
                limit: 10,
                remaining,
                current: 0,
                reset_after_ms: reset,
                retry_after_ms: retry,
            },
        }
    }

    /// On a pass the fewest-remaining window governs, ties going to the earliest reset.
    #[test]
    fn pass_picks_fewest_remaining_then_earliest_reset() {
        let check = four();
        let v = Verdict::from_decisions(
            &check,
            [
                wd(Scope::Ip, Window::Second, true, 5, 100, 0),
                wd(Scope::Key, Window::Minute, true, 3, 9000, 0),
                wd(Scope::Key, Window::Hour, true, 3, 500, 0),
            ],
        );
        assert!(v.allowed);
        assert_eq!(v.governing.unwrap().window, Window::Hour);
        // Every scope of the check took part.
        assert_eq!(v.scopes_checked, 0b1111);
    }

    /// On a reject the longest retry governs, ties going to the first scope.
    #[test]
    fn reject_picks_longest_retry() {
        let check = four();
        let v = Verdict::from_decisions(
            &check,
            [
                wd(Scope::Ip, Window::Second, false, 0, 100, 700),
                wd(Scope::Key, Window::Minute, true, 3, 9000, 0),
                wd(Scope::Tenant, Window::Hour, false, 0, 500, 700),
                wd(Scope::Global, Window::Day, false, 0, 500, 900),
            ],
        );
        assert!(!v.allowed);
        let g = v.governing.unwrap();
        assert_eq!((g.scope, g.window), (Scope::Global, Window::Day));
        let v = Verdict::from_decisions(
            &check,
            [
                wd(Scope::Ip, Window::Second, false, 0, 100, 700),
                wd(Scope::Tenant, Window::Hour, false, 0, 500, 700),
            ],
        );
        assert_eq!(v.governing.unwrap().scope, Scope::Ip);
    }

    /// Each window keeps its own time (what a settle names), its scope the earliest;
    /// a part of the check keeps the times of the windows it keeps, re-indexed.
    #[test]
    fn windows_keep_their_own_times() {
        use crate::limiter::{Ident, ScopeLimits, WindowLimit};
        let two: &'static ScopeLimits = Box::leak(Box::new(ScopeLimits {
            windows: vec![
                WindowLimit::new(Window::Second, 10),
                WindowLimit::new(Window::Minute, 100),
            ],
            ..four().scopes[0].limits.clone()
        }));
        let mut c = Check::new(1);
        c.push(Scope::Ip, Ident::Global, two);
        c.push(Scope::Key, Ident::Global, two);
        let mut at = DecidedAt::default();
        // The key's 1 min lease was granted first, then both ip leases, then a call
        // decided the key's 1 s window (`add_for` fills the windows without a time).
        at.add_window(&c.scopes, 1, 1, 5_000);
        at.add_window(&c.scopes, 0, 0, 9_000);
        at.add_window(&c.scopes, 0, 1, 7_000);
        at.add_for(&c, Scope::Key, 9_500);
        let times = |at: &DecidedAt, c: &Check<'_>| {
            (0..c.scopes.len())
                .flat_map(|i| (0..2).map(move |j| (i, j)))
                .map(|(i, j)| at.of_window(&c.scopes, i, j))
                .collect::<Vec<_>>()
        };
        assert_eq!(times(&at, &c), [9_000, 7_000, 9_500, 5_000]);
        assert_eq!(
            (at.of(0), at.of(1)),
            (7_000, 5_000),
            "each scope's earliest"
        );
        // An earlier time moves the base: the others keep theirs.
        at.add(2, 1_000);
        assert_eq!(times(&at, &c), [9_000, 7_000, 9_500, 5_000]);
        let (key, part) = c.part(at, |i| i == 1);
        assert_eq!(times(&part, &key)[..2], [9_500, 5_000]);
        // Only the key's 1 s window: the scope's earliest is that window's.
        let one = at.select(&c.scopes, |i, j| (i, j) == (1, 0));
        assert_eq!(one.of(0), 9_500);
        // A window with no time of its own is its scope's earliest.
        let scoped = Verdict::UNLIMITED.at(2, 4_000).decided_at;
        assert_eq!(scoped.of_window(&c.scopes, 1, 1), 4_000);
        // Too far apart for an offset: the scope's earliest stands for it.
        let mut far = DecidedAt::default();
        far.add_window(&c.scopes, 0, 0, 1_000);
        far.add_window(&c.scopes, 0, 1, 1_000 + 70_000);
        assert_eq!(far.of_window(&c.scopes, 0, 1), 1_000);
    }

    /// `Verdict` is moved on the hot path: its size is watched.
    #[test]
    fn verdict_size() {
        let size = std::mem::size_of::<Verdict>();
        eprintln!(
            "size_of::<Verdict>() = {size}, DecidedAt = {}",
            std::mem::size_of::<DecidedAt>()
        );
        assert!(size <= 136, "{size}");
    }
}
