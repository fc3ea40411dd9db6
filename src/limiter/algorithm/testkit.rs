//! Shared helpers for the algorithm tables.

use super::{step, State};
use crate::limiter::policy::WindowLimit;

/// A tiny deterministic PRNG (xorshift64*), so randomized tests replay exactly.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Runs `(now, cost, allowed, remaining, retry_after_ms)` rows through one state.
pub(crate) fn run_table(limit: &WindowLimit, rows: &[(u64, u32, bool, u32, u64)]) {
    let mut state = State::initial(limit.algorithm);
    for (i, &(now, cost, allowed, remaining, retry)) in rows.iter().enumerate() {
        let d = step(&mut state, limit, now, 0, cost, true);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms),
            (allowed, remaining, retry),
            "row {i}: now={now} cost={cost} -> {d:?}"
        );
    }
}

/// How many of the unit-cost requests at `times` are admitted.
pub(crate) fn admitted_between(limit: &WindowLimit, times: &[u64]) -> usize {
    let mut state = State::initial(limit.algorithm);
    times
        .iter()
        .filter(|&&t| step(&mut state, limit, t, 0, 1, true).allowed)
        .count()
}

/// Drives random traffic; after every rejection checks that a request `retry_after` later
/// is admitted and one a millisecond earlier is not (on copies of the state).
pub(crate) fn assert_retry_exact(limit: &WindowLimit) {
    let period = limit.window.period_ms();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ u64::from(limit.limit));
    let mut state = State::initial(limit.algorithm);
    let mut now = 1_764_000_000_000u64;
    let mut rejections = 0;
    for _ in 0..3_000 {
        now += rng.below(period / u64::from(limit.limit).max(1) * 2 + 1);
        let cost = 1 + rng.below(u64::from(limit.limit.min(3))) as u32;
        let d = step(&mut state, limit, now, 0, cost, true);
        if d.allowed {
            continue;
        }
        rejections += 1;
        assert!(d.retry_after_ms >= 1, "{d:?}");
        let at = now + d.retry_after_ms;
        let mut later = state.clone();
        assert!(
            step(&mut later, limit, at, 0, cost, false).allowed,
            "not admitted at retry: now={now} {d:?}"
        );
        let mut earlier = state.clone();
        assert!(
            !step(&mut earlier, limit, at - 1, 0, cost, false).allowed,
            "admitted early: now={now} {d:?}"
        );
    }
    assert!(
        rejections > 10,
        "the traffic never hit the limit ({rejections} rejections)"
    );
}
