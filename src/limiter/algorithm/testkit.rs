//! Shared helpers for the algorithm tables.

use super::{
    bounds, div_ceil, give_back, lease_len, lease_size, settle, step, take, to_u32, Lease, State,
};
use crate::limiter::policy::{Algorithm, WindowLimit};
use crate::limiter::Decision;

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

/// A lease a simulated gateway holds, and what it has left.
#[derive(Debug, Clone, Copy)]
struct Held {
    lease: Lease,
    left: u64,
}

/// What `run_leases` did.
#[derive(Debug, Default)]
pub(crate) struct LeaseRun {
    /// Every admitted request, through the state or on a lease: `(at, cost)`, in order.
    pub(crate) admitted: Vec<(u64, u32)>,
    /// Leases taken, requests admitted on leases, leftovers given back.
    pub(crate) takes: usize,
    pub(crate) uses: usize,
    pub(crate) returns: usize,
    /// Rejections whose `retry_after` was checked.
    pub(crate) rejections: usize,
}

/// Random traffic from `gateways` gateways sharing one state, as `lua/check.lua` orders a
/// call (give back, decide, write, take): each request is admitted on the gateway's
/// lease while it lasts and holds enough, else decided by the state, which may lease.
/// Leftovers go back with the gateway's next call (at once, or much later), or never.
/// After every rejection, checks that `retry_after` is exact (on copies of the state).
pub(crate) fn run_leases(
    limit: &WindowLimit,
    offset: u64,
    seed: u64,
    steps: usize,
    gateways: usize,
) -> LeaseRun {
    let mut sim = LeaseSim::new(limit, offset, seed, gateways);
    let lim = u64::from(limit.limit);
    for _ in 0..steps {
        sim.advance();
        let g = sim.rng.below(gateways as u64) as usize;
        let cost = 1 + sim.rng.below(lim.min(3)) as u32;
        if sim.use_lease(g, cost) {
            continue;
        }
        sim.end_lease(g);
        if sim.rng.below(10) == 0 {
            continue; // a 'return' call only
        }
        sim.decide(g, cost);
    }
    sim.run
}

/// The gateways and the state of `run_leases`, between calls.
struct LeaseSim<'a> {
    limit: &'a WindowLimit,
    offset: u64,
    rng: Rng,
    /// How long a lease is wanted for.
    lease_ms: u64,
    state: State,
    now: u64,
    /// Each gateway's lease.
    held: Vec<Option<Held>>,
    run: LeaseRun,
    /// The mean gap between requests of mean cost at the limit's rate.
    gap: u64,
    /// Requests left in the current burst (at one instant).
    burst: u64,
    /// In a phase of light traffic.
    slow: bool,
}

impl<'a> LeaseSim<'a> {
    fn new(limit: &'a WindowLimit, offset: u64, seed: u64, gateways: usize) -> Self {
        let period = limit.window.period_ms();
        let lim = u64::from(limit.limit);
        let mut rng = Rng(seed);
        let lease_ms = [period / 4, period / 10, 40, 1][rng.below(4) as usize].max(1);
        let now = 1_764_000_000_000u64 + rng.below(period);
        LeaseSim {
            limit,
            offset,
            rng,
            lease_ms,
            state: State::initial(limit.algorithm),
            now,
            held: vec![None; gateways],
            run: LeaseRun::default(),
            gap: (period * (1 + lim.min(3)) / 2 / lim.max(1)).max(1),
            burst: 0,
            slow: false,
        }
    }

    /// The clock to the next request: phases of light traffic (a bucket fills up while
    /// leases are out) and heavy traffic, and bursts (up to a full bucket at one
    /// instant, from any gateway).
    fn advance(&mut self) {
        let (rng, gap) = (&mut self.rng, self.gap);
        if rng.below(40) == 0 {
            self.slow = !self.slow;
        }
        if self.burst > 0 {
            self.burst -= 1;
            return;
        }
        self.now += match (self.slow, rng.below(8)) {
            (_, 0) => rng.below(gap * 8 + 1),
            (true, _) => rng.below(gap * 3 + 1),
            (false, _) => rng.below(gap / 2 + 1),
        };
        if rng.below(6) == 0 {
            self.burst = rng.below(u64::from(self.limit.capacity) + 2);
        }
    }

    /// Admits the request on gateway `g`'s lease, mostly, while it lasts and holds enough.
    fn use_lease(&mut self, g: usize, cost: u32) -> bool {
        let Some(h) = self.held[g].as_mut() else {
            return false;
        };
        if self.now < h.lease.until && h.left >= u64::from(cost) && self.rng.below(8) != 0 {
            h.left -= u64::from(cost);
            self.run.admitted.push((self.now, cost));
            self.run.uses += 1;
            return true;
        }
        false
    }

    /// Gateway `g`'s lease, if any, ends with this call (leftovers back), is kept to give
    /// back later, or is never given back.
    fn end_lease(&mut self, g: usize) {
        let Some(h) = self.held[g].take() else {
            return;
        };
        match self.rng.below(4) {
            0 => {}                      // never given back (a crashed gateway)
            1 => self.held[g] = Some(h), // kept to give back on a later call
            _ => {
                // Ended with the next call: leftovers back (maybe none), hold released.
                let l = h.lease;
                give_back(
                    &mut self.state,
                    self.limit,
                    self.now,
                    self.offset,
                    h.left,
                    l.tag1,
                    l.tag2,
                    l.granted,
                );
                self.run.returns += 1;
            }
        }
    }

    /// Decides the request on the state; an admitted one may lease for gateway `g`.
    fn decide(&mut self, g: usize, cost: u32) {
        let (limit, now, offset) = (self.limit, self.now, self.offset);
        let d = step(&mut self.state, limit, now, offset, cost, true);
        if !d.allowed {
            self.run.rejections += 1;
            assert_retry_on_copies(&self.state, limit, now, offset, cost, &d);
            return;
        }
        self.run.admitted.push((now, cost));
        if self.held[g].is_some() {
            return; // one lease per gateway
        }
        let period = limit.window.period_ms();
        let n = lease_size(self.rng.below(u64::from(limit.limit) / 2 + 3), d.remaining);
        let len = lease_len(self.lease_ms, period);
        if n < 2 || len < 1 {
            return;
        }
        let l = take(&mut self.state, limit, now, offset, n, now + len);
        assert!(
            l.granted <= n && (l.granted == 0 || (l.until > now && l.until <= now + len)),
            "{l:?}"
        );
        if l.granted > 0 {
            self.run.takes += 1;
            self.held[g] = Some(Held {
                lease: l,
                left: l.granted,
            });
        }
    }
}

/// After a rejection `d` of `cost` at `now`: a request `retry_after` later is admitted
/// and one a millisecond earlier is not (on copies of `state`).
fn assert_retry_on_copies(
    state: &State,
    limit: &WindowLimit,
    now: u64,
    offset: u64,
    cost: u32,
    d: &Decision,
) {
    assert!(d.retry_after_ms >= 1, "{d:?}");
    let at = now + d.retry_after_ms;
    assert!(
        step(&mut state.clone(), limit, at, offset, cost, false).allowed,
        "not admitted at retry: now={now} {d:?} {state:?}"
    );
    assert!(
        !step(&mut state.clone(), limit, at - 1, offset, cost, false).allowed,
        "admitted early: now={now} {d:?} {state:?}"
    );
}

/// The safety rule: a fresh state, fed only the requests actually admitted (lease uses
/// included, at the times they were used), admits every one of them.
pub(crate) fn assert_replay_admits(limit: &WindowLimit, offset: u64, admitted: &[(u64, u32)]) {
    let mut replay = State::initial(limit.algorithm);
    for (i, &(t, cost)) in admitted.iter().enumerate() {
        let d = step(&mut replay, limit, t, offset, cost, true);
        assert!(
            d.allowed,
            "admission {i} (at {t}, cost {cost}) is over the limit: {d:?}"
        );
    }
}

/// Most cost admitted in any span `[a, b]` of the admitted times, less what a bucket of
/// `capacity` refilling `limit` per period could have admitted from full: must be <= 0.
pub(crate) fn worst_bucket_excess(limit: &WindowLimit, admitted: &[(u64, u32)]) -> i128 {
    let period = i128::from(limit.window.period_ms());
    let (cap, rate) = (i128::from(limit.capacity), i128::from(limit.limit));
    let mut worst = i128::MIN;
    for i in 0..admitted.len() {
        let mut sum = 0i128;
        for &(t, c) in &admitted[i..] {
            sum += i128::from(c);
            let span = i128::from(t - admitted[i].0);
            // sum <= cap + rate x span / period, in integers.
            worst = worst.max(sum * period - cap * period - rate * span);
        }
    }
    worst
}

/// Runs `run_leases` on several seeds and gateway counts and checks the safety rule;
/// returns the runs for algorithm-specific checks.
pub(crate) fn assert_leases_safe(limit: &WindowLimit, offset: u64) -> Vec<LeaseRun> {
    let mut runs = Vec::new();
    for seed in 1..=12u64 {
        let run = run_leases(
            limit,
            offset,
            seed * 0x9E37_79B9 + u64::from(limit.limit),
            1_500,
            1 + (seed % 3) as usize,
        );
        assert_replay_admits(limit, offset, &run.admitted);
        runs.push(run);
    }
    if std::env::var_os("LEASE_STATS").is_some() {
        for r in &runs {
            eprintln!(
                "admitted {} takes {} uses {} returns {} rejections {}",
                r.admitted.len(),
                r.takes,
                r.uses,
                r.returns,
                r.rejections
            );
        }
    }
    let sum = |f: fn(&LeaseRun) -> usize| runs.iter().map(f).sum::<usize>();
    assert!(
        sum(|r| r.takes) > 50,
        "too few leases: {}",
        sum(|r| r.takes)
    );
    assert!(
        sum(|r| r.uses) > 100,
        "too few lease uses: {}",
        sum(|r| r.uses)
    );
    assert!(
        sum(|r| r.returns) > 20,
        "too few give-backs: {}",
        sum(|r| r.returns)
    );
    assert!(
        sum(|r| r.rejections) > 50,
        "too few rejections: {}",
        sum(|r| r.rejections)
    );
    runs
}

/// One event of a settle run, as the replay sees it.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// An admitted request: index into `SettleRun::requests`.
    Request(usize),
    /// A debt the state accepted (what `settle` answered), charged at `at` (a forced
    /// charge). A debt beyond the window's bound is forgiven, so the replay charges
    /// only the accepted part.
    Debt { at: u64, tokens: u64 },
}

/// What `run_settles` did.
#[derive(Debug, Default)]
pub(crate) struct SettleRun {
    /// Admitted requests: (at, reserved cost, true cost once settled).
    requests: Vec<(u64, u32, Option<u32>)>,
    events: Vec<Event>,
    pub(crate) debts: usize,
    /// Debts the window's bound cut short (`settle` accepted less than the delta).
    pub(crate) capped: usize,
    pub(crate) refunds: usize,
    /// Rejections whose `retry_after` was checked.
    pub(crate) rejections: usize,
}

/// When a window in debt by at most its limit admits a unit request again at the latest,
/// its state left alone after a settlement at `now` (no leases: no entry in the future).
/// Fixed window: the next window's start. Sliding log: one period. Buckets:
/// `(limit + 1) / rate`, one period and a token's refill (drain). Sliding counter: in the next
/// window, once the settled window's count (at most 2 x limit) weighs `limit - 1`, that
/// is `next end - (limit - 1) x len / (2 x limit)`: 1.5 window lengths and `len / (2 x
/// limit)` after a settlement at a window's start, the worst case.
pub(crate) fn recovered_by(limit: &WindowLimit, now: u64, offset: u64) -> u64 {
    let period = limit.window.period_ms();
    let lim = u64::from(limit.limit);
    match limit.algorithm {
        Algorithm::FixedWindow => bounds(limit.window, now, offset).1,
        Algorithm::SlidingLog => now + period,
        Algorithm::TokenBucket | Algorithm::LeakyBucket => now + period + div_ceil(period, lim),
        Algorithm::SlidingWindow => {
            let (_, end) = bounds(limit.window, now, offset);
            let (_, next_end) = bounds(limit.window, end, offset);
            next_end - (lim - 1) * (next_end - end) / (2 * lim)
        }
    }
}

/// The debt bound after a settlement at `now`: the count a unit request would reach is
/// at most capacity + limit + 1 (in debt by at most the limit), and the state left alone
/// admits a unit request by `recovered_by`.
pub(crate) fn assert_debt_bounded(state: &State, limit: &WindowLimit, now: u64, offset: u64) {
    let d = step(&mut state.clone(), limit, now, offset, 1, false);
    let most = u64::from(limit.capacity) + u64::from(limit.limit) + 1;
    assert!(
        d.current <= most,
        "in debt past the limit at {now}: {d:?} {state:?}"
    );
    let at = recovered_by(limit, now, offset);
    let later = step(&mut state.clone(), limit, at, offset, 1, false);
    assert!(
        later.allowed,
        "not usable again {} ms after a settlement at {now}: {later:?} {state:?}",
        at - now
    );
}

/// Random traffic with random settles: each admitted request learns a true cost from 0
/// to twice its reserved cost plus 2, or now and then far more than the window's bound
/// (a debt cut short), and settles at once, a little later, much later, or never. After
/// every rejection checks that `retry_after` is exact (on copies), after every debt that
/// the window is in debt by at most its limit and usable again by `recovered_by`.
pub(crate) fn run_settles(limit: &WindowLimit, offset: u64, seed: u64, steps: usize) -> SettleRun {
    let period = limit.window.period_ms();
    let lim = u64::from(limit.limit);
    let mut rng = Rng(seed);
    let mut state = State::initial(limit.algorithm);
    let mut now = 1_764_000_000_000u64 + rng.below(period);
    let mut run = SettleRun::default();
    // Unsettled requests: (index, settle no earlier than).
    let mut pending: Vec<(usize, u64)> = Vec::new();
    // Costs scale with large limits, so the traffic reaches them within the run.
    let max_cost = lim.min(4).max(lim / 200);
    let gap = (period * (1 + max_cost) / 2 / lim.max(1)).max(1);
    for _ in 0..steps {
        now += match rng.below(10) {
            0 => rng.below(gap * 6 + 1),
            1..=3 => 0,
            _ => rng.below(gap + 1),
        };
        // Settle what is due (in random order), sometimes.
        let mut i = 0;
        while i < pending.len() {
            let (idx, due) = pending[i];
            if due > now || rng.below(3) == 0 {
                i += 1;
                continue;
            }
            pending.swap_remove(i);
            let (at, cost, _) = run.requests[idx];
            let truth = match rng.below(40) {
                0 => u64::from(u32::MAX),
                1 => u64::from(cost) + lim + rng.below(2 * lim + u64::from(limit.capacity)),
                _ => rng.below(2 * u64::from(cost) + 3),
            };
            let delta = i64::try_from(truth).unwrap() - i64::from(cost);
            let accepted = settle(&mut state, limit, now, offset, cost, delta, at);
            run.requests[idx].2 = Some(to_u32(truth));
            if delta > 0 {
                assert!(accepted <= delta.unsigned_abs(), "{accepted} of {delta}");
                assert_debt_bounded(&state, limit, now, offset);
                run.debts += 1;
                run.capped += usize::from(accepted < delta.unsigned_abs());
                run.events.push(Event::Debt {
                    at: now,
                    tokens: accepted,
                });
            } else if delta < 0 {
                assert_eq!(accepted, 0, "a refund accepts no debt");
                run.refunds += 1;
            }
        }
        let cost = 1 + rng.below(max_cost) as u32;
        let d = step(&mut state, limit, now, offset, cost, true);
        if !d.allowed {
            run.rejections += 1;
            assert_retry_on_copies(&state, limit, now, offset, cost, &d);
            continue;
        }
        run.requests.push((now, cost, None));
        run.events.push(Event::Request(run.requests.len() - 1));
        if rng.below(8) != 0 {
            let later = [0, 0, gap / 2, gap * 3, period / 3, period * 2][rng.below(6) as usize];
            pending.push((run.requests.len() - 1, now + rng.below(later + 1)));
        }
    }
    run
}

/// The settle safety rule: a fresh state fed every admitted request at its true cost
/// (its reserved cost when it never settled or was a debt) and every debt, as far as the
/// state accepted it, as a forced charge at its settle time admits every request. (A
/// debt past the window's bound is forgiven by design; refunds and the accepted part of
/// debts are held to the rule.)
pub(crate) fn assert_settled_replay_admits(limit: &WindowLimit, offset: u64, run: &SettleRun) {
    let mut replay = State::initial(limit.algorithm);
    for e in &run.events {
        match *e {
            Event::Debt { at, tokens } => {
                let tokens = i64::try_from(tokens).unwrap();
                settle(&mut replay, limit, at, offset, 1, tokens, at);
            }
            Event::Request(i) => {
                let (at, cost, truth) = run.requests[i];
                let cost = truth.map_or(cost, |t| t.min(cost));
                if cost == 0 {
                    continue; // free in the replay
                }
                let d = step(&mut replay, limit, at, offset, cost, true);
                assert!(
                    d.allowed,
                    "request {i} (at {at}, cost {cost}) is over the limit in the replay: {d:?}"
                );
            }
        }
    }
}

/// Runs `run_settles` on several seeds, checks the replay rule and that the runs saw
/// debts (some cut short by the bound), refunds and rejections.
pub(crate) fn assert_settles_safe(limit: &WindowLimit, offset: u64) {
    let (mut debts, mut capped, mut refunds, mut rejections) = (0, 0, 0, 0);
    for seed in 1..=12u64 {
        let run = run_settles(
            limit,
            offset,
            seed * 0x2545_F491 + u64::from(limit.limit),
            1_500,
        );
        assert_settled_replay_admits(limit, offset, &run);
        debts += run.debts;
        capped += run.capped;
        refunds += run.refunds;
        rejections += run.rejections;
    }
    if std::env::var_os("LEASE_STATS").is_some() {
        eprintln!("{debts} debts ({capped} capped), {refunds} refunds, {rejections} rejections");
    }
    assert!(
        debts > 100 && capped > 20 && refunds > 100 && rejections > 100,
        "too one-sided: {debts} debts ({capped} capped), {refunds} refunds, {rejections} rejections"
    );
}

/// A request at `now + retry_after` is admitted and one a millisecond earlier is not
/// (on copies of `state`); returns the decision at `now`.
pub(crate) fn assert_exact_at(state: &State, limit: &WindowLimit, now: u64, cost: u32) -> Decision {
    let d = step(&mut state.clone(), limit, now, 0, cost, false);
    assert!(!d.allowed, "admitted at {now}: {d:?}");
    let at = now + d.retry_after_ms;
    assert!(
        step(&mut state.clone(), limit, at, 0, cost, false).allowed,
        "{d:?}"
    );
    assert!(
        !step(&mut state.clone(), limit, at - 1, 0, cost, false).allowed,
        "{d:?}"
    );
    d
}
