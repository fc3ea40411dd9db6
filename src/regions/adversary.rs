//! Randomised adversarial runs of the simulation (deterministic seeds, no real time):
//! jittered delays, attackers that come and go, cuts of any shape (one link: a partial
//! partition; both links of a region: a region cut off; all three) and any length, many
//! close to `partition_ms` so that a heal falls while regions decide to whom they grant,
//! writes duplicated and replayed late (after newer ones), regions' clocks apart by up to
//! 100 ms (a write then reaches a peer in another window), and in half the runs grants
//! made at random (any amount, to any index, itself included) instead of by the policy:
//! the bound must not depend on the policy. Every window is checked against the bound.

use super::sim::{Sim, World, R};
use super::{Params, DEFAULT_PARTITION_MS};

/// xorshift64*: enough for reproducible schedules.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// One cut: the links it takes (bit 0: 1-2, bit 1: 1-3, bit 2: 2-3) over `[from, to)`.
#[derive(Debug, Clone, Copy)]
struct Cut {
    links: u8,
    from: u64,
    to: u64,
}

#[derive(Debug)]
struct Adversary {
    window_ms: u64,
    limit: u64,
    run_ms: u64,
    /// Base one-way delay per link (1-2, 1-3, 2-3) and the jitter added per message.
    delays: [u64; 3],
    jitter: u64,
    cuts: Vec<Cut>,
    /// Per region: requests per ms while on, and the times its attack switches on or off.
    rate: [u64; R],
    switches: [Vec<u64>; R],
    /// Grants at random instead of the policy's.
    random_grants: bool,
    /// The percentage of messages sent twice, the copy after the messages sent next.
    duplicates: u64,
    /// How far ahead each region's clock runs (ms).
    skew: [u64; R],
    rng: Rng,
}

fn link(a: usize, b: usize) -> usize {
    match (a.min(b), a.max(b)) {
        (0, 1) => 0,
        (0, 2) => 1,
        _ => 2,
    }
}

impl Adversary {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let run_ms = 30_000;
        let cuts = (0..rng.range(1, 3))
            .map(|_| {
                let from = rng.range(0, run_ms - 1);
                let len = match rng.range(0, 2) {
                    0 => rng.range(1, 4_000),
                    // Around partition_secs: the heal falls among the declarations.
                    _ => DEFAULT_PARTITION_MS - 150 + rng.range(0, 500),
                };
                let links = rng.pick(&[1u8, 2, 4, 3, 5, 6, 7]);
                Cut {
                    links,
                    from,
                    to: from + len,
                }
            })
            .collect();
        let switches = std::array::from_fn(|_| {
            let mut t = 0;
            let mut at = Vec::new();
            while t < run_ms {
                t += rng.range(1, 3_000);
                at.push(t);
            }
            at
        });
        Self {
            window_ms: rng.pick(&[500, 1_000, 2_000, 5_000]),
            limit: rng.pick(&[20, 50, 100, 300, 1_000, 3_000]),
            run_ms,
            delays: std::array::from_fn(|_| rng.range(1, 200)),
            jitter: rng.pick(&[0, 5, 50]),
            cuts,
            rate: std::array::from_fn(|_| rng.range(1, 6)),
            switches,
            random_grants: rng.range(0, 1) == 1,
            duplicates: rng.pick(&[0, 10, 50]),
            skew: {
                let most = rng.pick(&[0, 5, 100]);
                std::array::from_fn(|_| rng.range(0, most))
            },
            rng,
        }
    }
}

impl World for Adversary {
    fn window_ms(&self) -> u64 {
        self.window_ms
    }

    fn params(&self) -> Params {
        Params::new(self.limit, R, self.window_ms)
    }

    fn run_ms(&self) -> u64 {
        self.run_ms
    }

    fn delay(&mut self, _: u64, from: usize, to: usize) -> u64 {
        let jitter = self.jitter;
        self.delays[link(from, to)] + self.rng.range(0, jitter)
    }

    fn cut(&self, t: u64, a: usize, b: usize) -> bool {
        let bit = 1u8 << link(a, b);
        self.cuts
            .iter()
            .any(|c| c.links & bit != 0 && (c.from..c.to).contains(&t))
    }

    fn arrivals(&mut self, t: u64, region: usize) -> u64 {
        // On while an even number of switches has passed.
        let passed = self.switches[region].partition_point(|&s| s <= t);
        if passed % 2 == 0 {
            self.rate[region]
        } else {
            0
        }
    }

    fn heal_at(&self) -> Option<u64> {
        None
    }

    fn grants(&mut self, _: u64, _: usize, room: u64) -> Option<Vec<(usize, u64)>> {
        if !self.random_grants {
            return None;
        }
        // Up to the room and a little past it (refused), to any index but one past the
        // regions, at most two a tick.
        let n = self.rng.range(0, 2);
        let grants = (0..n)
            .map(|_| {
                let peer = self.rng.range(0, R as u64) as usize;
                (peer, self.rng.range(0, room + 2))
            })
            .collect();
        Some(grants)
    }

    fn skew(&self, region: usize) -> u64 {
        self.skew[region]
    }

    fn duplicate(&mut self) -> Option<u64> {
        (self.rng.range(1, 100) <= self.duplicates).then(|| self.rng.range(1, 300))
    }
}

#[test]
fn random_cuts_delays_and_bursts_stay_within_the_bound() {
    let (mut worst, mut worst_seed, mut windows, mut heard) = (0.0f64, 0, 0, 0);
    let mut over = Vec::new();
    for seed in 0..200 {
        let world = Adversary::new(seed);
        let (bound, limit) = (world.params().bound(), world.limit);
        let shape = format!(
            "{:?} {:?} skew {:?} random grants {}",
            world.cuts, world.delays, world.skew, world.random_grants
        );
        let out = Sim::new(world).run();
        heard += out.grants_heard;
        for (k, &admitted) in out.admitted.iter().enumerate() {
            windows += 1;
            let ratio = admitted as f64 / bound as f64;
            if ratio > worst {
                (worst, worst_seed) = (ratio, seed);
            }
            if admitted > bound {
                over.push(format!(
                    "seed {seed} window {k}: {admitted} > {bound} (L {limit}) {shape}"
                ));
            }
        }
    }
    eprintln!("{windows} windows, worst admitted / bound {worst:.3} (seed {worst_seed}), {heard} granted tokens heard");
    assert!(
        heard > 0,
        "no grant ever crossed: the runs tested nothing of the grants"
    );
    assert!(
        over.is_empty(),
        "{} windows over the bound:\n{}",
        over.len(),
        over.join("\n")
    );
}
