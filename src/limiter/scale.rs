//! The one place a scope's limits are scaled: by a route's adaptive factor (admission) and
//! by the live instance count of the local fallback (`store::tiered`). Every window's
//! limit and token-bucket capacity, and `concurrent`, become `f(n)`, at least 1, and a
//! capacity is never below its limit.

use super::{ScopeLimits, WindowLimit};

/// `limits` with every count mapped through `f` (see the module docs).
pub fn scaled(limits: &ScopeLimits, f: impl Fn(u32) -> u32) -> ScopeLimits {
    let windows = limits
        .windows
        .iter()
        .map(|w| {
            let limit = f(w.limit).max(1);
            WindowLimit {
                limit,
                capacity: f(w.capacity).max(limit),
                ..*w
            }
        })
        .collect();
    ScopeLimits {
        windows,
        concurrent: limits.concurrent.map(|c| f(c).max(1)),
        ban: limits.ban,
        on_failure: limits.on_failure,
        message: limits.message.clone(),
        count_on: limits.count_on,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{OnFailure, Window};

    /// Limits, capacities and `concurrent` are mapped and kept at least 1; a capacity
    /// never drops below its limit.
    #[test]
    fn maps_every_count() {
        let mut w = WindowLimit::new(Window::Second, 10);
        w.capacity = 15;
        let l = ScopeLimits {
            windows: vec![w, WindowLimit::new(Window::Hour, 3)],
            on_failure: OnFailure::Local,
            message: Some("m".into()),
            concurrent: Some(4),
            ban: None,
            count_on: None,
        };
        let half = scaled(&l, |n| n / 2);
        let got: Vec<(u32, u32)> = half.windows.iter().map(|w| (w.limit, w.capacity)).collect();
        assert_eq!(got, [(5, 7), (1, 1)]);
        assert_eq!(half.concurrent, Some(2));
        let zero = scaled(&l, |_| 0);
        assert_eq!(zero.concurrent, Some(1));
        assert!(zero.windows.iter().all(|w| w.limit == 1 && w.capacity == 1));
        let odd = scaled(&l, |n| if n == 10 { 8 } else { 2 });
        assert_eq!((odd.windows[0].limit, odd.windows[0].capacity), (8, 8));
        assert_eq!(half.message.as_deref(), Some("m"));
    }
}
