//! One identity's entry of the lease table: its windows' leases and cached rejections,
//! and its local rate.

use smallvec::SmallVec;

use super::super::wire::{Grant, LeaseArgs};
use super::carry::Pending;
use super::{Return, IDLE_MS};
use crate::limiter::{
    Algorithm, Check, Decision, Ident, Scope, Window, WindowDecision, WindowLimit,
};

#[derive(Debug, Default)]
pub(super) struct Entry {
    pub(super) windows: SmallVec<[Slot; 2]>,
    pub(super) meter: Meter,
    pub(super) touched: u64,
    /// The debts this identity's requests settle lately (a decaying maximum, in units),
    /// and when the last one came: what an admission on a lease leaves room for while
    /// they keep coming (see `Local::debit`, `Entry::need`).
    pub(super) debt: (u32, u64),
    /// The script's `now` of the latest call recorded for this identity, and the
    /// gateway's clock when its reply was recorded (see `Entry::redis_now`).
    pub(super) seen: (u64, u64),
    /// Settles held back to go with the next call, oldest first (see `Local::carry`).
    pub(super) held: Vec<Pending>,
}

#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub(super) window: Window,
    /// Leases in hand, usually one; two when concurrent calls each got one.
    pub(super) leases: SmallVec<[Held; 1]>,
    pub(super) blocked: Option<Blocked>,
    /// A call asking for a lease of this window is in flight until then: others do not
    /// ask too (they would strand tokens).
    pub(super) asking_until: u64,
    /// Leftovers of a lease of this window were handed to a background return until
    /// then: a rejection decided meanwhile may predate their arrival in Redis, so it is
    /// answered but not repeated from the cache.
    pub(super) returning_until: u64,
}

/// A lease in hand.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub(super) tokens: u64,
    pub(super) until: u64,
    /// Its length when granted.
    pub(super) len: u64,
    pub(super) grant: Grant,
    /// The script's time of the grant (when its tokens were charged).
    pub(super) granted_at: u64,
    /// The limit it was granted under: it pays only requests of that limit.
    pub(super) limit: WindowLimit,
    /// What the client may still spend (Redis's remaining when granted, lease included),
    /// decremented by local admissions: the `X-RateLimit-Remaining` shown.
    pub(super) visible: u32,
    pub(super) reset_at: u64,
}

/// A rejection Redis decided, repeated locally until `until` for requests of the same
/// limit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Blocked {
    /// Repeated from the cache until then (at most the retry).
    pub(super) until: u64,
    /// When the window admits the request again (the answer's retry).
    pub(super) retry_at: u64,
    pub(super) cost: u32,
    pub(super) limit: WindowLimit,
    pub(super) decision: Decision,
    pub(super) reset_at: u64,
}

/// Cost units of an identity over the last second (two 1 s buckets, the previous one
/// weighted by overlap), to size its leases.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Meter {
    pub(super) start: u64,
    pub(super) prev: u64,
    pub(super) curr: u64,
}

// === impl Entry ===

impl Entry {
    pub(super) fn slot(&mut self, window: Window) -> &mut Slot {
        let i = match self.windows.iter().position(|s| s.window == window) {
            Some(i) => i,
            None => {
                self.windows.push(Slot {
                    window,
                    leases: SmallVec::new(),
                    blocked: None,
                    asking_until: 0,
                    returning_until: 0,
                });
                self.windows.len() - 1
            }
        };
        &mut self.windows[i]
    }

    /// Counts a request of `check` arriving at `now` (in the rate, unless a peek), and
    /// answers what a lease must hold to admit it: a lease that can pay the request but
    /// not the debt it is likely to settle is renewed with a call now (see `need`).
    pub(super) fn arrive(&mut self, check: &Check<'_>, now: u64) -> u32 {
        self.touched = now;
        if check.peek {
            return check.cost;
        }
        self.meter.add(now, check.cost);
        self.need(check.cost, now)
    }

    /// What a lease must hold to admit a request of `cost` at `now`: the cost, and the
    /// debt the identity's requests have lately settled (for a second after the last).
    pub(super) fn need(&self, cost: u32, now: u64) -> u32 {
        let (debt, at) = self.debt;
        match now.saturating_sub(at) <= Meter::SPAN {
            true => cost.saturating_add(debt),
            false => cost,
        }
    }

    pub(super) fn idle(&self, now: u64) -> bool {
        now.saturating_sub(self.touched) > IDLE_MS
            && self.held.is_empty()
            && self
                .windows
                .iter()
                .all(|s| s.leases.is_empty() && s.blocked.is_none_or(|b| b.until <= now))
    }
}

// === impl Slot ===

impl Slot {
    /// The lease that can pay `cost` of a window of `limit` now: the one ending first.
    pub(super) fn usable(&self, now: u64, cost: u32, limit: &WindowLimit) -> Option<usize> {
        self.leases
            .iter()
            .enumerate()
            .filter(|(_, l)| l.live(limit, now) && l.tokens >= u64::from(cost))
            .min_by_key(|(_, l)| l.until)
            .map(|(i, _)| i)
    }
}

// === impl Held ===

impl Held {
    /// Whether it can pay for requests of a window of `limit` at `now`.
    pub(super) fn live(&self, limit: &WindowLimit, now: u64) -> bool {
        now < self.until && self.limit == *limit
    }

    /// Past half its life: renewed with the next call that goes to Redis anyway.
    pub(super) fn aging(&self, now: u64) -> bool {
        self.until.saturating_sub(now) < self.len / 2
    }

    /// When `expired` collects it: half a lease after its end, so that an identity still
    /// sending gives it back with its next call rather than a call of its own.
    pub(super) fn due(&self) -> u64 {
        self.until.saturating_add(self.len / 2)
    }

    /// What giving it back sends, if anything: its unused tokens, and for a bucket even
    /// none (naming a spent lease releases its hold).
    pub(super) fn returned(&self, scope: Scope, ident: &Ident) -> Option<Return> {
        let bucket = matches!(
            self.limit.algorithm,
            Algorithm::TokenBucket | Algorithm::LeakyBucket
        );
        (self.tokens > 0 || bucket).then(|| Return {
            scope,
            ident: ident.clone(),
            limit: self.limit,
            lease: LeaseArgs {
                ret: self.tokens,
                from: self.grant,
                ..LeaseArgs::default()
            },
        })
    }

    pub(super) fn spend(
        &mut self,
        scope: Scope,
        window: Window,
        cost: u32,
        now: u64,
    ) -> WindowDecision {
        self.tokens -= u64::from(cost);
        self.visible = self.visible.saturating_sub(cost);
        self.decision(scope, window, self.visible, now)
    }

    /// What `spend` would answer, spending nothing (a peek).
    pub(super) fn look(&self, scope: Scope, window: Window, cost: u32, now: u64) -> WindowDecision {
        self.decision(scope, window, self.visible.saturating_sub(cost), now)
    }

    /// An admission paid from this lease, `visible` left to the client.
    fn decision(&self, scope: Scope, window: Window, visible: u32, now: u64) -> WindowDecision {
        let limit = self.limit.limit;
        WindowDecision {
            scope,
            window,
            decision: Decision {
                allowed: true,
                limit,
                remaining: visible.min(limit),
                current: u64::from(limit.saturating_sub(visible)),
                reset_after_ms: self.reset_at.saturating_sub(now),
                retry_after_ms: 0,
            },
        }
    }
}

// === impl Blocked ===

impl Blocked {
    pub(super) fn at(&self, scope: Scope, window: Window, now: u64) -> WindowDecision {
        WindowDecision {
            scope,
            window,
            decision: Decision {
                allowed: false,
                remaining: 0,
                reset_after_ms: self.reset_at.saturating_sub(now),
                retry_after_ms: self.retry_at.saturating_sub(now).max(1),
                ..self.decision
            },
        }
    }
}

// === impl Meter ===

impl Meter {
    pub(super) const SPAN: u64 = 1_000;

    pub(super) fn roll(&mut self, now: u64) {
        if now >= self.start + 2 * Self::SPAN {
            *self = Meter {
                start: now - now % Self::SPAN,
                prev: 0,
                curr: 0,
            };
        } else if now >= self.start + Self::SPAN {
            self.start += Self::SPAN;
            self.prev = self.curr;
            self.curr = 0;
        }
    }

    pub(super) fn add(&mut self, now: u64, cost: u32) {
        self.roll(now);
        self.curr += u64::from(cost);
    }

    /// Cost units over the last second.
    pub(super) fn per_second(&mut self, now: u64) -> u64 {
        self.roll(now);
        let into = now.saturating_sub(self.start).min(Self::SPAN);
        self.prev * (Self::SPAN - into) / Self::SPAN + self.curr
    }
}
