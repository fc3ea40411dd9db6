//! The grant policy: what a region forecasts it needs, what it wants, and what it grants
//! to whom. Policy only: the bound holds whatever a region grants, as long as it grants
//! through [`WindowState::grant`].

use super::{allotment, Links, Params, WindowState};

/// `ceil(a x b / c)` in u128, saturating into u64 (`c > 0`).
fn mul_div_ceil(a: u64, b: u64, c: u64) -> u64 {
    let n = u128::from(a) * u128::from(b);
    u64::try_from(n.div_ceil(u128::from(c))).unwrap_or(u64::MAX)
}

/// The demand a region expects over the rest of a window of `window_ms`, `elapsed_ms`
/// into it: the larger of the previous window's demand (`prior`) pro rata and the rate
/// measured so far, the latter only once `sample_ms` have passed. None: nothing to go by.
pub fn forecast_remaining(
    demand: u64,
    prior: Option<u64>,
    elapsed_ms: u64,
    params: &Params,
) -> Option<u64> {
    let w = params.window_ms.max(1);
    let elapsed = elapsed_ms.min(w);
    let remaining = w - elapsed;
    let from_prior = prior.map(|p| mul_div_ceil(p, remaining, w));
    let measured = elapsed >= params.sample_ms.max(1);
    let from_rate = measured.then(|| mul_div_ceil(demand, remaining, elapsed));
    match (from_prior, from_rate) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

impl WindowState {
    fn elapsed(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.window())
    }

    /// What this region expects to need in the whole window: what it was asked so far
    /// plus its forecast, at least 1 more while the window lasts (a sparse caller still
    /// finds a token). None: no forecast yet.
    pub fn need(&self, params: &Params, now_ms: u64) -> Option<u64> {
        let elapsed = self.elapsed(now_ms);
        let rest = forecast_remaining(self.demand(), self.prior(), elapsed, params)?;
        let open = u64::from(elapsed < params.window_ms);
        Some(self.demand().max(self.own()).saturating_add(rest.max(open)))
    }

    /// What this region wants beyond its cap: its forecast need (or, without one, what
    /// it was asked) less its cap.
    pub fn want(&self, params: &Params, now_ms: u64) -> u64 {
        let need = self.need(params, now_ms).unwrap_or(self.demand());
        need.saturating_sub(self.cap())
    }

    /// What `peer` still wants from this region, as far as this region knows: what the
    /// peer last said (or, before it said anything this window, its previous demand less
    /// its allotment), less what this region granted that the peer had not heard of then.
    fn wanted_by(&self, params: &Params, peer: usize) -> u64 {
        let Some(p) = self.peers.get(peer) else {
            return 0;
        };
        let prior_want = || {
            p.prior.map_or(0, |d| {
                d.saturating_sub(allotment(params.limit, params.regions, peer))
            })
        };
        let unheard = self.given(peer).saturating_sub(p.heard_from_me);
        p.want.unwrap_or_else(prior_want).saturating_sub(unheard)
    }

    /// The grants this region would make at `now_ms`: the room above its forecast need,
    /// to the live peers that want more, in proportion to what each wants (never more).
    pub fn plan(&self, params: &Params, links: &Links, now_ms: u64) -> Vec<(usize, u64)> {
        let Some(need) = self.need(params, now_ms) else {
            return Vec::new();
        };
        let spare = self.cap().saturating_sub(need).min(self.room());
        let live =
            |k: &usize| *k != self.me() && !links.partitioned(*k, now_ms, params.partition_ms);
        let wants: Vec<(usize, u64)> = (0..params.regions)
            .filter(live)
            .map(|k| (k, self.wanted_by(params, k)))
            .filter(|&(_, w)| w > 0)
            .collect();
        let total = wants.iter().fold(0u64, |s, &(_, w)| s.saturating_add(w));
        if spare == 0 || total == 0 {
            return Vec::new();
        }
        let share = |w: u64| {
            let n = u128::from(spare) * u128::from(w) / u128::from(total);
            u64::try_from(n).unwrap_or(u64::MAX).min(w)
        };
        let mut plan: Vec<(usize, u64)> = wants.iter().map(|&(k, w)| (k, share(w))).collect();
        // What the floors left: to the peer that wants the most, within what it wants.
        let granted = plan.iter().fold(0u64, |s, &(_, g)| s.saturating_add(g));
        let top = (0..wants.len()).max_by_key(|&n| (wants[n].1, usize::MAX - n));
        if let Some(n) = top {
            let more = spare.saturating_sub(granted).min(wants[n].1 - plan[n].1);
            plan[n].1 += more;
        }
        plan.retain(|&(_, g)| g > 0);
        plan
    }

    /// Makes the grants of [`WindowState::plan`]; what was granted in all.
    pub fn donate(&mut self, params: &Params, links: &Links, now_ms: u64) -> u64 {
        let mut total = 0;
        for (peer, amount) in self.plan(params, links, now_ms) {
            if self.grant(peer, amount) {
                total += amount;
            }
        }
        total
    }
}
