//! The outcome of a limit check: a value, never an error.
//!
//! Durations are relative milliseconds (`reset_after_ms`, `retry_after_ms`) so that a decision
//! made on Redis time never mixes clocks with the gateway's header rendering.

use super::check::{Check, MAX_SCOPES};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
/// Indexed like the check's scopes.
pub struct DecidedAt([u64; MAX_SCOPES]);

// === impl DecidedAt ===

impl DecidedAt {
    /// Every scope decided at `ms`.
    pub const fn all(ms: u64) -> DecidedAt {
        DecidedAt([ms; MAX_SCOPES])
    }

    /// When the check's scope `i` was decided (0: not by a store).
    pub fn of(&self, i: usize) -> u64 {
        self.0.get(i).copied().unwrap_or(0)
    }

    /// Records that `scope` was (also) decided at `ms`: the earliest time counts, the
    /// safe one for a refund (a bucket gives back less the longer ago; a counter or log
    /// entry not found gives back nothing).
    pub fn add(&mut self, i: usize, ms: u64) {
        if let Some(t) = self.0.get_mut(i) {
            *t = if *t == 0 { ms } else { (*t).min(ms) };
        }
    }
}

impl DecidedAt {
    /// Records that `check`'s `scope` was (also) decided at `ms` (see `add`).
    pub fn add_for(&mut self, check: &Check<'_>, scope: Scope, ms: u64) {
        if let Some(i) = check.position(scope) {
            self.add(i, ms);
        }
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
}
