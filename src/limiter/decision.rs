//! The outcome of a limit check: a value, never an error.
//!
//! Durations are relative milliseconds (`reset_after`, `retry_after`) so that a decision
//! made on Redis time never mixes clocks with the gateway's header rendering.

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
    /// Bit `1 << scope as u8` for each scope that was checked.
    pub scopes_checked: u8,
    /// True when the shared store could not decide and each scope's `on_failure` did.
    pub fallback: bool,
    /// With `fallback`: bit `1 << scope as u8` for each scope skipped (`on_failure =
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
pub struct DecidedAt([u64; Scope::COUNT]);

// === impl DecidedAt ===

impl DecidedAt {
    /// Every scope decided at `ms`.
    pub const fn all(ms: u64) -> DecidedAt {
        DecidedAt([ms; Scope::COUNT])
    }

    /// When `scope` was decided (0: not by a store).
    pub fn of(&self, scope: Scope) -> u64 {
        self.0[scope as usize]
    }

    /// Records that `scope` was (also) decided at `ms`: the earliest time counts, the
    /// safe one for a refund (a bucket gives back less the longer ago; a counter or log
    /// entry not found gives back nothing).
    pub fn add(&mut self, scope: Scope, ms: u64) {
        let t = &mut self.0[scope as usize];
        *t = if *t == 0 { ms } else { (*t).min(ms) };
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

    /// Folds per-window decisions into the layered verdict (see `Verdict::governing`).
    pub fn from_decisions(decisions: impl IntoIterator<Item = WindowDecision>) -> Verdict {
        let mut allowed = true;
        let mut scopes_checked = 0u8;
        let mut pass: Option<WindowDecision> = None;
        let mut reject: Option<WindowDecision> = None;
        for wd in decisions {
            scopes_checked |= 1 << wd.scope as u8;
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
        Verdict {
            allowed,
            governing: if allowed { pass } else { reject },
            scopes_checked,
            fallback: false,
            failed_open: 0,
            decided_at: DecidedAt::all(0),
        }
    }

    /// The verdict with each of `scopes` decided at `ms` (a store with one clock).
    pub fn at(self, scopes: impl IntoIterator<Item = Scope>, ms: u64) -> Verdict {
        let mut decided_at = DecidedAt::default();
        for s in scopes {
            decided_at.add(s, ms);
        }
        Verdict { decided_at, ..self }
    }

    /// Whether `scope` took part in the decision.
    pub fn checked(&self, scope: Scope) -> bool {
        self.scopes_checked & (1 << scope as u8) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let v = Verdict::from_decisions([
            wd(Scope::Ip, Window::Second, true, 5, 100, 0),
            wd(Scope::Key, Window::Minute, true, 3, 9000, 0),
            wd(Scope::Key, Window::Hour, true, 3, 500, 0),
        ]);
        assert!(v.allowed);
        assert_eq!(v.governing.unwrap().window, Window::Hour);
        assert!(v.checked(Scope::Ip) && v.checked(Scope::Key) && !v.checked(Scope::Tenant));
    }

    /// On a reject the longest retry governs, ties going to the first scope.
    #[test]
    fn reject_picks_longest_retry() {
        let v = Verdict::from_decisions([
            wd(Scope::Ip, Window::Second, false, 0, 100, 700),
            wd(Scope::Key, Window::Minute, true, 3, 9000, 0),
            wd(Scope::Tenant, Window::Hour, false, 0, 500, 700),
            wd(Scope::Global, Window::Day, false, 0, 500, 900),
        ]);
        assert!(!v.allowed);
        let g = v.governing.unwrap();
        assert_eq!((g.scope, g.window), (Scope::Global, Window::Day));
        let v = Verdict::from_decisions([
            wd(Scope::Ip, Window::Second, false, 0, 100, 700),
            wd(Scope::Tenant, Window::Hour, false, 0, 500, 700),
        ]);
        assert_eq!(v.governing.unwrap().scope, Scope::Ip);
    }
}
