//! The controller: the next factor as a pure function of the current one, the route's
//! settings and what its window shows. No clock, no state.

use super::window::Observed;
use super::{Factor, Settings};

/// Multiplicative decrease while above target: x 0.8 (in millionths, exact).
const DECREASE_NUM: u64 = 4;
const DECREASE_DEN: u64 = 5;
/// Additive increase while at or below target: + 0.05.
const INCREASE: u32 = 50_000;

/// Whether the window is above the route's target: p99 over `target_p99_ms`, or the
/// 5xx share over `max_error_rate`. An empty window (no responses) is not: a route that
/// gets no traffic recovers.
pub fn above_target(settings: &Settings, observed: &Observed) -> bool {
    let slow = matches!(
        (settings.target_p99_ms, observed.p99_ms),
        (Some(target), Some(p99)) if p99 > target as f64
    );
    let failing = matches!(
        (settings.max_error_rate, observed.error_rate()),
        (Some(max), Some(rate)) if rate > max
    );
    slow || failing
}

/// The factor after one second: x 0.8 above target, + 0.05 otherwise, always within
/// `[min_factor, 1]` (so a reload that raised `min_factor` takes effect at the next tick).
pub fn next(factor: Factor, settings: &Settings, observed: &Observed) -> Factor {
    let ppm = if above_target(settings, observed) {
        let scaled = u64::from(factor.ppm()) * DECREASE_NUM / DECREASE_DEN;
        u32::try_from(scaled).unwrap_or(u32::MAX)
    } else {
        factor.ppm().saturating_add(INCREASE)
    };
    Factor::from_ppm(ppm.clamp(settings.min_factor.ppm(), Factor::ONE.ppm()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(p99: Option<u64>, err: Option<f64>, min: f64) -> Settings {
        Settings {
            target_p99_ms: p99,
            max_error_rate: err,
            min_factor: Factor::from_f64(min),
            min_clients: 1,
        }
    }

    fn seen(total: u64, errors: u64, p99: Option<f64>) -> Observed {
        Observed {
            total,
            errors,
            p99_ms: p99,
        }
    }

    /// One step per row: (settings, observed, factor before, factor after).
    #[test]
    fn one_step_table() {
        let both = settings(Some(200), Some(0.05), 0.1);
        let cases = [
            // Above the latency target: x 0.8.
            (both, seen(100, 0, Some(250.0)), 1.0, 0.8),
            (both, seen(100, 0, Some(250.0)), 0.8, 0.64),
            // Exactly at target is not above: + 0.05.
            (both, seen(100, 5, Some(200.0)), 0.8, 0.85),
            // Over the error share alone.
            (both, seen(100, 6, Some(10.0)), 1.0, 0.8),
            // Floor at min_factor; ceiling at 1.
            (both, seen(100, 50, Some(900.0)), 0.11, 0.1),
            (both, seen(100, 0, Some(10.0)), 0.98, 1.0),
            (both, seen(100, 0, Some(10.0)), 1.0, 1.0),
            // No traffic: recovers.
            (both, seen(0, 0, None), 0.5, 0.55),
            // An unset target is never exceeded.
            (
                settings(None, Some(0.5), 0.1),
                seen(10, 1, Some(5_000.0)),
                0.5,
                0.55,
            ),
            (
                settings(Some(100), None, 0.1),
                seen(10, 10, Some(50.0)),
                0.5,
                0.55,
            ),
            (
                settings(Some(100), None, 0.1),
                seen(10, 0, Some(101.0)),
                0.5,
                0.4,
            ),
            // A raised min_factor lifts a lower factor at once.
            (
                settings(Some(100), None, 0.5),
                seen(10, 0, Some(101.0)),
                0.2,
                0.5,
            ),
            // max_error_rate 0: any 5xx is too many.
            (
                settings(None, Some(0.0), 0.1),
                seen(1_000, 1, Some(1.0)),
                1.0,
                0.8,
            ),
        ];
        for (i, (s, o, before, after)) in cases.into_iter().enumerate() {
            let got = next(Factor::from_f64(before), &s, &o);
            assert_eq!(got, Factor::from_f64(after), "case {i}: {got:?}");
        }
    }

    /// Sustained trouble walks down to the floor and stays; recovery climbs back in
    /// steps of 0.05 and stops at 1.
    #[test]
    fn walks_down_and_back() {
        let s = settings(Some(200), None, 0.1);
        let slow = seen(50, 0, Some(400.0));
        let fine = seen(50, 0, Some(20.0));
        let mut f = Factor::ONE;
        let mut path = Vec::new();
        for _ in 0..12 {
            f = next(f, &s, &slow);
            path.push(f.ppm());
        }
        assert_eq!(
            &path[..4],
            &[800_000, 640_000, 512_000, 409_600],
            "x 0.8 each second"
        );
        assert_eq!(f, Factor::from_f64(0.1), "floored");
        let mut steps = 0;
        while f != Factor::ONE {
            f = next(f, &s, &fine);
            steps += 1;
        }
        assert_eq!(steps, 18, "0.1 -> 1.0 in 0.05 steps");
    }
}
