//! A deterministic discrete-event simulation of three regions (1 ms steps, no real time):
//! attackers at 10x the limit, one-way delays between the regions, a sync write every
//! `sync_ms` from each region to each peer, and region 3 cut off for 30 s mid-run.
//!
//! `cargo test --lib regions::sim -- --nocapture` prints one line per case: the worst
//! admitted / L and admitted / bound over the windows, the utilisation outside and during
//! the cut, and how long after the heal each region took to see the others' counts.

use std::collections::VecDeque;

use super::{take_ack, Ack, Links, Params, SyncWrite, Verdict, WindowState};
use super::{DEFAULT_PARTITION_MS, DEFAULT_SYNC_MS, DEFAULT_UNSYNCED_PPM};

pub(super) const R: usize = 3;
pub(super) const SYNC_MS: u64 = DEFAULT_SYNC_MS;
const RUN_MS: u64 = 180_000;
/// Region 3 (index 2) is cut off from both others over `[CUT.0, CUT.1)`.
const CUT: (u64, u64) = (60_500, 90_500);

#[derive(Debug, Clone, Copy)]
pub(super) struct Case {
    window_ms: u64,
    limit: u64,
    /// Each region's share of the attack, in percent.
    split: [u64; R],
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
        Params::new(self.limit, R, DEFAULT_UNSYNCED_PPM, DEFAULT_PARTITION_MS)
    }

    /// A floor under what the rule lets the fleet admit in a window without a cut: each
    /// region gets `b` at once, then `b` per sync period + round trip to its farthest
    /// peer (rule 2), never more than its demand; the fleet never more than `L`.
    fn reachable(&self) -> u64 {
        let b = self.params().budget;
        let per_region = (0..R).map(|i| {
            let rtt = (0..R)
                .filter(|&j| j != i)
                .map(|j| 2 * self.delay(i, j))
                .max();
            let cycle = SYNC_MS + rtt.unwrap_or(0) + 1;
            let demand = 10 * self.limit * self.split[i] / 100;
            demand.min(b * (1 + self.window_ms / cycle))
        });
        per_region.sum::<u64>().min(self.limit)
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

    fn arrivals(&mut self, _: u64, region: usize) -> u64 {
        let over = 100 * self.window_ms;
        self.carry[region] += 10 * self.limit * self.split[region];
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
    /// Per (seeing region, seen region): ms after the heal until the count the seen region
    /// had at the heal was known (None: never within the window).
    pub(super) heal_lag: [[Option<u64>; R]; R],
}

pub(super) struct Sim<W: World> {
    world: W,
    params: Params,
    regions: Vec<Region>,
    /// In-flight messages per directed link `from * R + to`, in delivery order.
    links: Vec<VecDeque<(u64, Msg)>>,
    out: Outcome,
    /// The true counts at the heal, and the window they are in.
    at_heal: Option<(u64, [u64; R])>,
}

impl<W: World> Sim<W> {
    pub(super) fn new(world: W) -> Self {
        let regions = (0..R)
            .map(|i| Region {
                links: Links::new(R, 0),
                state: WindowState::new(i, R, 0),
            })
            .collect();
        let windows = world.run_ms().div_ceil(world.window_ms()) as usize;
        Self {
            params: world.params(),
            world,
            regions,
            links: (0..R * R).map(|_| VecDeque::new()).collect(),
            out: Outcome {
                admitted: vec![0; windows],
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
        }
    }

    fn deliver(&mut self, t: u64) {
        for link in 0..R * R {
            let (from, to) = (link / R, link % R);
            while self.links[link].front().is_some_and(|&(at, _)| at <= t) {
                let Some((_, msg)) = self.links[link].pop_front() else {
                    break;
                };
                if self.world.cut(t, from, to) {
                    continue;
                }
                let region = &mut self.regions[to];
                match msg {
                    Msg::Write(w) => {
                        let ack = region.state.receive(&w);
                        self.send(t, to, from, Msg::Ack(ack));
                    }
                    Msg::Ack(a) => take_ack(&mut region.links, &mut region.state, &a, t),
                }
            }
        }
    }

    fn tick(&mut self, t: u64) {
        for i in 0..R {
            // Each region ticks at its own phase, so the writes are not in lockstep.
            if (t + 17 * i as u64) % SYNC_MS == 0 {
                let w = self.regions[i].state.sync_write();
                for j in (0..R).filter(|&j| j != i) {
                    self.send(t, i, j, Msg::Write(w));
                }
            }
        }
    }

    fn attack(&mut self, t: u64) {
        let w = self.world.window_ms();
        let window = t / w;
        for i in 0..R {
            let arrivals = self.world.arrivals(t, i);
            let region = &mut self.regions[i];
            if region.state.window() != window * w {
                region.state = WindowState::new(i, R, window * w);
            }
            // Nothing changes the state between two requests of one ms but an admission,
            // so after the first refusal the rest of the ms is refused too.
            for _ in 0..arrivals {
                match region.state.decide(&self.params, &region.links, t, 1) {
                    Verdict::Admit => self.out.admitted[window as usize] += 1,
                    _ => break,
                }
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
    worst_over_bound: f64,
    /// The lowest admitted / L among windows the cut does not touch.
    min_util: f64,
    /// The lowest admitted / L among windows the cut touches, and their mean.
    cut_util: (f64, f64),
    worst_heal_lag: u64,
}

fn check(case: &Case) -> Figures {
    let out = Sim::new(*case).run();
    let (p, w) = (case.params(), case.window_ms);
    let name = format!("{case:?}");
    let mut f = Figures {
        worst_over_limit: 0.0,
        worst_over_bound: 0.0,
        min_util: f64::MAX,
        cut_util: (f64::MAX, 0.0),
        worst_heal_lag: 0,
    };
    let (mut cut_sum, mut cut_n) = (0.0, 0.0);
    for (k, &admitted) in out.admitted.iter().enumerate() {
        let (from, to) = (k as u64 * w, (k as u64 + 1) * w);
        assert!(
            admitted <= p.bound(),
            "{name}: window {k}: {admitted} > {}",
            p.bound()
        );
        let util = admitted as f64 / p.limit as f64;
        f.worst_over_limit = f.worst_over_limit.max(util);
        f.worst_over_bound = f.worst_over_bound.max(admitted as f64 / p.bound() as f64);
        if to <= CUT.0 || from > CUT.1 {
            f.min_util = f.min_util.min(util);
            let floor = case.reachable() as f64 * 0.97;
            assert!(
                admitted as f64 >= floor,
                "{name}: window {k}: {admitted} < {floor}"
            );
        } else {
            f.cut_util.0 = f.cut_util.0.min(util);
            (cut_sum, cut_n) = (cut_sum + util, cut_n + 1.0);
        }
    }
    f.cut_util.1 = cut_sum / cut_n;
    for i in 0..R {
        for j in (0..R).filter(|&j| j != i) {
            let lag = out.heal_lag[i][j];
            let allowed = SYNC_MS + case.delay(i, j);
            assert!(
                lag.is_some_and(|l| l <= allowed),
                "{name}: {i} saw {j} after {lag:?}"
            );
            f.worst_heal_lag = f.worst_heal_lag.max(lag.unwrap_or(u64::MAX));
        }
    }
    f
}

fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    for window_ms in [1_000, 12_000, 60_000] {
        for limit in [10, 100, 6_000] {
            for split in [[80, 10, 10], [34, 33, 33]] {
                for delays in [[5, 5, 5], [50, 50, 50], [150, 150, 150], [5, 50, 150]] {
                    all.push(Case {
                        window_ms,
                        limit,
                        split,
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
fn three_regions_stay_within_the_bound_under_attack_and_through_a_cut() {
    eprintln!("window  L     split     delays        b   bound  max/L  max/bound  util  reach  cut-min cut-mean heal-lag");
    for case in cases() {
        let f = check(&case);
        let p = case.params();
        eprintln!(
            "{:>6} {:>5} {:>9} {:>13} {:>3} {:>6} {:>6.3} {:>9.3} {:>6.3} {:>5.3} {:>7.3} {:>8.3} {:>5}ms",
            case.window_ms,
            case.limit,
            format!("{:?}", case.split),
            format!("{:?}", case.delays),
            p.budget,
            p.bound(),
            f.worst_over_limit,
            f.worst_over_bound,
            f.min_util,
            case.reachable() as f64 / case.limit as f64,
            f.cut_util.0,
            f.cut_util.1,
            f.worst_heal_lag,
        );
    }
}
