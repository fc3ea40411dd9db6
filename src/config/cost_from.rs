//! A route's `cost_from` and `cost_unit_bytes`: the request settles to the bytes it moved.

/// Which bytes a `cost_from` route counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// `"response_bytes"`: the response body bytes sent to the client.
    Response,
    /// `"request_bytes"`: the request body bytes read from the client.
    Request,
}

/// `cost_from = "..."`, `cost_unit_bytes = N`: the request reserves the route's `cost`
/// and settles to `ceil(bytes / unit_bytes)` (bounded by `max_cost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostFrom {
    /// The bytes counted.
    pub counted: Counted,
    /// Bytes per unit (at least 1).
    pub unit_bytes: u32,
}

impl CostFrom {
    /// `bytes` in units, rounded up (at most `u32::MAX`).
    pub fn units(&self, bytes: u64) -> u32 {
        let unit = u64::from(self.unit_bytes.max(1));
        u32::try_from(bytes.div_ceil(unit)).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::{CostFrom, Counted};

    #[test]
    fn bytes_round_up_to_units() {
        let c = |unit_bytes| CostFrom {
            counted: Counted::Response,
            unit_bytes,
        };
        assert_eq!(c(1).units(0), 0);
        assert_eq!(c(1).units(1234), 1234);
        assert_eq!(c(100).units(1), 1);
        assert_eq!(c(100).units(100), 1);
        assert_eq!(c(100).units(101), 2);
        assert_eq!(c(1).units(u64::MAX), u32::MAX);
    }
}
