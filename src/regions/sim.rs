//! A deterministic discrete-event simulation of three regions (1 ms steps, no real time):
//! demand at 10x the limit (or exactly 1x, with the heavy region fixed or moving every
//! `ROTATE` windows), one-way delays between the regions, a sync
//! write (with its grants) every `sync_ms` from each region to each peer, and region 3 cut
//! off for 30 s mid-run.
//!
//! `cargo test --lib regions::sim -- --nocapture` prints one line per case: the worst
//! admitted / L over the windows, the utilisation outside and during the cut, and how long
//! after the heal each region took to see the others' counts.

use std::collections::VecDeque;

use super::{take_ack, Ack, Links, Params, SyncWrite, Verdict, WindowState, DEFAULT_SYNC_MS};

pub(super) const R: usize = 3;
pub(super) const SYNC_MS: u64 = DEFAULT_SYNC_MS;
const RUN_MS: u64 = 180_000;
/// How many windows the heavy region stays heavy in the rotating cases.
const ROTATE: u64 = 5;
/// Region 3 (index 2) is cut off from both others over `[CUT.0, CUT.1)`.
const CUT: (u64, u64) = (60_500, 90_500);

#[derive(Debug, Clone, Copy)]
pub(super) struct Case {
    window_ms: u64,
    limit: u64,
    /// Each region's share of the demand, in percent.
    split: [u64; R],
    /// The demand, in multiples of the limit per window.
    times: u64,
    /// Every `ROTATE` windows the split moves one region over (region `i` takes what
    /// region `i - 1` had): the heavy region changes.
    rotate: bool,
    /// One-way delays (ms): 1-2, 1-3, 2-3.
    delays: [u64; 3],
    /// Attack arrivals not yet whole, per region (numerator over `100 x window_ms`).
    carry: [u64; R],
}

impl Case {
    fn delay(&self, a: usize, b: usize) -> u64 {
        match (a.min(b), a.max(b)) {
            (0, 1) => self.delays[0],
            (0, 2) => self.delays[1],
            _ => self.delays[2],
        }
    }

    fn params(&self) -> Params {
        Params::new(self.limit, R, self.window_ms)
    }

    /// Whether window `k` is the first after the heavy region changed.
    fn shifts(&self, k: usize) -> bool {
        self.rotate && k > 0 && k as u64 % ROTATE == 0
    }
}

/// What a simulated run is made of: the limit, the links and the attack.
pub(super) trait World {
    fn window_ms(&self) -> u64;
    fn params(&self) -> Params;
    fn run_ms(&self) -> u64;
    /// The one-way delay of a message sent at `t` from `from` to `to`.
    fn delay(&mut self, t: u64, from: usize, to: usize) -> u64;
    /// Whether the link between `a` and `b` passes nothing at `t`.
    fn cut(&self, t: u64, a: usize, b: usize) -> bool;
    /// The requests (cost 1) reaching `region` in the ms at `t`.
    fn arrivals(&mut self, t: u64, region: usize) -> u64;
    /// Grants to make instead of the policy's (None: the policy's), for adversaries.
    fn grants(&mut self, _t: u64, _region: usize, _room: u64) -> Option<Vec<(usize, u64)>> {
        None
    }
    /// Whether to send a message twice: the copy's extra delay (ms), for adversaries.
    fn duplicate(&mut self) -> Option<u64> {
        None
    }
    /// How far ahead of the simulation's time `region`'s clock runs (ms): it decides its
    /// windows, its grants and its links by its own clock.
    fn skew(&self, _region: usize) -> u64 {
        0
    }
    /// When to take the true counts and time how long each region takes to see them.
    fn heal_at(&self) -> Option<u64>;
}

impl World for Case {
    fn window_ms(&self) -> u64 {
        self.window_ms
    }

    fn params(&self) -> Params {
        Case::params(self)
    }

    fn run_ms(&self) -> u64 {
        RUN_MS
    }

    fn delay(&mut self, _: u64, from: usize, to: usize) -> u64 {
        Case::delay(self, from, to)
    }

    fn cut(&self, t: u64, a: usize, b: usize) -> bool {
        (a == 2 || b == 2) && (CUT.0..CUT.1).contains(&t)
    }

    fn arrivals(&mut self, t: u64, region: usize) -> u64 {
        let over = 100 * self.window_ms;
        let turn = if self.rotate {
            (t / self.window_ms / ROTATE) as usize
        } else {
            0
        };
        let share = self.split[(region + R - turn % R) % R];
        self.carry[region] += self.times * self.limit * share;
        let n = self.carry[region] / over;
        self.carry[region] %= over;
        n
    }

    fn heal_at(&self) -> Option<u64> {
        Some(CUT.1)
    }
}

#[derive(Debug, Clone, Copy)]
enum Msg {
    Write(SyncWrite),
    Ack(Ack),
}

struct Region {
    links: Links,
    state: WindowState,
}

/// What one run measured.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Admitted per window.
    pub(super) admitted: Vec<u64>,
    /// Demand (requests that arrived, admitted or not) per window.
    pub(super) demand: Vec<u64>,
    /// Per (seeing region, seen region): ms after the heal until the count the seen region
    /// had at the heal was known (None: never within the window).
    pub(super) heal_lag: [[Option<u64>; R]; R],
    /// Writes a region merged (for the adversary: every message path was taken).
    pub(super) grants_heard: u64,
}

pub(super) struct Sim<W: World> {
    world: W,
    params: Params,
    regions: Vec<Region>,
    /// In-flight messages per directed link `from * R + to`, in delivery order.
    links: Vec<VecDeque<(u64, Msg)>>,
    /// Copies of messages, delivered at their time whatever was sent since:
    /// (at, from, to, message).
    copies: Vec<(u64, usize, usize, Msg)>,
    out: Outcome,
    /// The true counts at the heal, and the window they are in.
    at_heal: Option<(u64, [u64; R])>,
}

impl<W: World> Sim<W> {
    pub(super) fn new(world: W) -> Self {
        let regions = (0..R)
            .map(|i| Region {
                links: Links::new(R, 0),
                state: WindowState::new(i, &world.params(), 0),
            })
            .collect();
        let ahead = (0..R).map(|i| world.skew(i)).max().unwrap_or(0);
        let windows = (world.run_ms() + ahead).div_ceil(world.window_ms()) as usize;
        Self {
            params: world.params(),
            world,
            regions,
            links: (0..R * R).map(|_| VecDeque::new()).collect(),
            copies: Vec::new(),
            out: Outcome {
                admitted: vec![0; windows],
                demand: vec![0; windows],
                ..Outcome::default()
            },
            at_heal: None,
        }
    }

    fn send(&mut self, t: u64, from: usize, to: usize, msg: Msg) {
        if !self.world.cut(t, from, to) {
            let queue = &mut self.links[from * R + to];
            // One TCP connection per direction: what is sent later never arrives earlier.
            let last = queue.back().map_or(0, |&(at, _)| at);
            let at = (t + self.world.delay(t, from, to)).max(last);
            queue.push_back((at, msg));
            // A copy, delivered late: after what is sent next, a replay of an older write.
            if let Some(extra) = self.world.duplicate() {
                self.copies.push((at + extra, from, to, msg));
            }
        }
    }

    fn deliver(&mut self, t: u64) {
        for link in 0..R * R {
            let (from, to) = (link / R, link % R);
            while self.links[link].front().is_some_and(|&(at, _)| at <= t) {
                let Some((_, msg)) = self.links[link].pop_front() else {
                    break;
                };
                self.handle(t, from, to, msg);
            }
        }
        let (due, later) = self.copies.drain(..).partition(|&(at, ..)| at <= t);
        self.copies = later;
        for (_, from, to, msg) in due {
            self.handle(t, from, to, msg);
        }
    }

    /// `to` takes `msg` from `from` at `t` (unless the link is cut: then it is lost).
    fn handle(&mut self, t: u64, from: usize, to: usize, msg: Msg) {
        if self.world.cut(t, from, to) {
            return;
        }
        let region = &mut self.regions[to];
        match msg {
            Msg::Write(w) => {
                let before = region.state.heard(from);
                let ack = region.state.receive(&w);
                self.out.grants_heard += region.state.heard(from) - before;
                self.send(t, to, from, Msg::Ack(ack));
            }
            Msg::Ack(a) => take_ack(&mut region.links, &a, t + self.world.skew(to)),
        }
    }

    fn tick(&mut self, t: u64) {
        for i in 0..R {
            // Each region ticks at its own phase, so the writes are not in lockstep.
            if (t + 17 * i as u64) % SYNC_MS != 0 {
                continue;
            }
            let room = self.regions[i].state.room();
            let region = &mut self.regions[i];
            match self.world.grants(t, i, room) {
                Some(grants) => {
                    for (peer, amount) in grants {
                        region.state.grant(peer, amount);
                    }
                }
                None => {
                    let now = t + self.world.skew(i);
                    region.state.donate(&self.params, &region.links, now);
                }
            }
            for j in (0..R).filter(|&j| j != i) {
                let now = t + self.world.skew(i);
                let w = self.regions[i].state.sync_write(&self.params, j, now);
                self.send(t, i, j, Msg::Write(w));
            }
        }
    }

    /// Moves every region to the window its own clock is in at `t`: the next one keeps the
    /// last one's demands as its priors.
    fn roll(&mut self, t: u64) {
        let w = self.world.window_ms();
        for (i, region) in self.regions.iter_mut().enumerate() {
            let window = (t + self.world.skew(i)) / w * w;
            let s = &region.state;
            if s.window() == window {
                continue;
            }
            region.state = if s.window() + w == window {
                s.next(&self.params, window)
            } else {
                WindowState::new(s.me(), &self.params, window)
            };
        }
    }

    fn attack(&mut self, t: u64) {
        for i in 0..R {
            // Counted in the window the region is in, by its own clock.
            let window = ((t + self.world.skew(i)) / self.world.window_ms()) as usize;
            let arrivals = self.world.arrivals(t, i);
            self.out.demand[window] += arrivals;
            let state = &mut self.regions[i].state;
            // Nothing changes the state between two requests of one ms but an admission,
            // so after the first refusal the rest of the ms is refused too.
            for n in 0..arrivals {
                if state.decide(1) != Verdict::Admit {
                    state.refused(arrivals - n - 1);
                    break;
                }
                self.out.admitted[window] += 1;
            }
        }
    }

    fn watch_heal(&mut self, t: u64) {
        let (w, heal) = (self.world.window_ms(), self.world.heal_at());
        let window = t / w * w;
        if heal == Some(t) {
            let counts = std::array::from_fn(|j| self.regions[j].state.own());
            self.at_heal = Some((window, counts));
        }
        let (Some(heal), Some((_, counts))) = (heal, self.at_heal.filter(|&(at, _)| at == window))
        else {
            return;
        };
        for i in 0..R {
            for j in (0..R).filter(|&j| j != i) {
                let lag = &mut self.out.heal_lag[i][j];
                if lag.is_none() && self.regions[i].state.peer(j) >= counts[j] {
                    *lag = Some(t - heal);
                }
            }
        }
    }

    pub(super) fn run(mut self) -> Outcome {
        for t in 0..self.world.run_ms() {
            self.roll(t);
            self.deliver(t);
            self.tick(t);
            self.attack(t);
            self.watch_heal(t);
        }
        self.out
    }
}

/// One case's figures.
struct Figures {
    worst_over_limit: f64,
    /// The lowest and the mean admitted / L among windows the cut does not touch.
    util: (f64, f64),
    /// The lowest admitted / L among windows the cut touches, and their mean.
    cut_util: (f64, f64),
    /// The lowest and the mean admitted / L in the windows where the heavy region changes
    /// (outside the cut), which are not held to `UTILISATION`.
    shifted: (f64, f64),
    worst_heal_lag: u64,
    /// The windows where the demand reached the limit and the fleet admitted less than
    /// `UTILISATION` of it.
    short: Vec<String>,
}

/// The lowest and the mean of `xs` (`(MAX, NaN)` when empty).
fn low_mean(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (f64::MAX, f64::NAN);
    }
    let low = xs.iter().copied().fold(f64::MAX, f64::min);
    (low, xs.iter().sum::<f64>() / xs.len() as f64)
}

/// A figure with three decimals, or `-` when there was nothing to measure.
fn show(x: f64) -> String {
    if x == f64::MAX || x.is_nan() {
        "-".into()
    } else {
        format!("{x:.3}")
    }
}

/// Utilisation asserted wherever the demand is at or above the limit, outside the cut.
const UTILISATION: f64 = 0.97;

fn check(case: &Case) -> Figures {
    let out = Sim::new(*case).run();
    let (p, w) = (case.params(), case.window_ms);
    let name = format!("{case:?}");
    let (mut clear, mut cut, mut worst) = (Vec::new(), Vec::new(), 0.0f64);
    let (mut short, mut shifted) = (Vec::new(), Vec::new());
    for (k, &admitted) in out.admitted.iter().enumerate() {
        let (from, to) = (k as u64 * w, (k as u64 + 1) * w);
        assert!(
            admitted <= p.bound(),
            "{name}: window {k}: {admitted} > {}",
            p.bound()
        );
        let util = admitted as f64 / p.limit as f64;
        worst = worst.max(util);
        if to <= CUT.0 || from > CUT.1 {
            let demand = out.demand[k];
            if case.shifts(k) {
                shifted.push(util);
            } else {
                clear.push(util);
            }
            if !case.shifts(k) && demand >= p.limit && util < UTILISATION {
                short.push(format!("{name}: window {k}: {admitted} of {demand}"));
            }
        } else {
            cut.push(util);
        }
    }
    let mut worst_heal_lag = 0;
    for i in 0..R {
        for j in (0..R).filter(|&j| j != i) {
            let lag = out.heal_lag[i][j];
            let allowed = SYNC_MS + case.delay(i, j);
            assert!(
                lag.is_some_and(|l| l <= allowed),
                "{name}: {i} saw {j} after {lag:?}"
            );
            worst_heal_lag = worst_heal_lag.max(lag.unwrap_or(u64::MAX));
        }
    }
    Figures {
        worst_over_limit: worst,
        util: low_mean(&clear),
        shifted: low_mean(&shifted),
        cut_util: low_mean(&cut),
        worst_heal_lag,
        short,
    }
}

fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    for window_ms in [1_000, 12_000, 60_000] {
        for limit in [10, 100, 6_000] {
            let demands = [
                ([80, 10, 10], 10, false),
                ([34, 33, 33], 10, false),
                ([80, 10, 10], 1, false),
                ([80, 10, 10], 1, true),
            ];
            for (split, times, rotate) in demands {
                for delays in [[5, 5, 5], [50, 50, 50], [150, 150, 150], [5, 50, 150]] {
                    all.push(Case {
                        window_ms,
                        limit,
                        split,
                        times,
                        rotate,
                        delays,
                        carry: [0; R],
                    });
                }
            }
        }
    }
    all
}

#[test]
fn three_regions_stay_within_the_limit_and_fill_it_under_attack_and_through_a_cut() {
    eprintln!("window  L     split      x  delays         max/L  util-min util-mean cut-min cut-mean shift-min shift-mean heal-lag");
    let mut short = Vec::new();
    for case in cases() {
        let mut f = check(&case);
        short.append(&mut f.short);
        eprintln!(
            "{:>6} {:>5} {:>11} {:>2} {:>13} {:>6.3} {:>8.3} {:>9.3} {:>7} {:>8} {:>9} {:>10} {:>5}ms",
            case.window_ms,
            case.limit,
            format!("{:?}", case.split),
            format!("{}{}", case.times, if case.rotate { "r" } else { "" }),
            format!("{:?}", case.delays),
            f.worst_over_limit,
            f.util.0,
            f.util.1,
            show(f.cut_util.0),
            show(f.cut_util.1),
            show(f.shifted.0),
            show(f.shifted.1),
            f.worst_heal_lag,
        );
    }
    assert!(
        short.is_empty(),
        "{} windows under {UTILISATION} of the limit:\n{}",
        short.len(),
        short.join("\n")
    );
}
