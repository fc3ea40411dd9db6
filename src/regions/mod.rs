//! One limit across regions (`fleet = "regions"`): the rule each region applies, as pure
//! functions of its state and an injected time (`now_ms`), no I/O.
//!
//! # The rule: allotments and grants
//!
//! `R` regions share a limit `L` per window. Each region `i` starts every window with an
//! *allotment* `a_i` ([`allotment`]: `floor(L / R)`, plus one for the first `L mod R`
//! regions, so `sum a_i = L` and every region computes every allotment alike). It keeps,
//! for one key and one window ([`WindowState`]):
//! - `own`: what it admitted; `demand`: what it was asked (admitted or not), leased
//!   tokens counted while they are out (given back unused, they leave it; a peer's view
//!   of it is merged by max, so the peer keeps the highest it heard);
//! - `given[k]`: what it has granted to peer `k` in this window (it only ever grows);
//! - `heard[k]`: the highest `given` of `k` toward it that reached it (merged by max);
//! - its *cap*: `cap_i = a_i + sum_k heard[k] - sum_k given[k]`.
//!
//! A request of cost `x` (a lease of `n` tokens is an admission of `n`) is admitted when
//! `own + x <= cap`: a local test, no peer on the request path, no acknowledgement. A
//! region grants `g` to a peer only when `cap - own >= g` ([`WindowState::grant`]); the
//! grant lowers its cap at once and raises the peer's when the peer hears of it.
//!
//! Every `sync_ms` a region writes to each peer ([`SyncWrite`]) its count, its demand,
//! what it wants ([`WindowState::want`]), what it has granted to that peer and what it has
//! heard from that peer, for every live window. The peer merges it into that window only,
//! by max (a write that is duplicated, reordered, replayed or late changes nothing it
//! should not). Which peer gets what is policy ([`WindowState::plan`]): a region whose
//! forecast demand leaves part of its cap unused grants it to the peers that want more.
//! The bound does not depend on the policy.
//!
//! # The bound
//!
//! In every window, **admitted <= L**, whatever the attack rate, the delays, the losses,
//! the duplicates and the partitions; the contract's `L x (1 + (R - 1) x b / L)` holds
//! a fortiori.
//!
//! *Proof sketch.* Let `g_j[k]` be what `j` granted to `k` by the window's end and
//! `h_k[j] <= g_j[k]` what `k` heard of it (a write carries a value `j` held, and `k` keeps
//! the max of what arrived). Then `sum_i cap_i = sum_i a_i + sum h - sum g <= L` at every
//! instant. A region's cap never falls below its own count: receiving only raises it and a
//! grant takes only `cap - own`. Every admission keeps `own_i <= cap_i`, so at the end
//! `A_i = own_i <= cap_i` and `sum A_i <= sum cap_i <= L`. Nothing in the sketch depends
//! on when (or whether) a write arrives: a grant in flight, lost or held by a partition is
//! capacity nobody uses, never capacity counted twice.
//!
//! # A partition
//!
//! Nothing changes in the rule: a region cut off keeps admitting up to its cap, the
//! others up to theirs, and the bound holds. A region grants only to peers that have
//! acknowledged a write within `partition_ms` ([`Links`]), so that it does not send
//! capacity into a cut. A grant already in flight when the cut starts is lost for the
//! window (the write that carries it arrives, if ever, after the window: it is ignored).
//! What a partition costs is the grants that cannot cross it; with demand at or above the
//! allotment everywhere it costs nothing.
//!
//! # Throughput
//!
//! An admission waits for nothing: a region with demand fills its allotment at once. A
//! skewed demand is served by grants, which take a write (up to `sync_ms`) and a one-way
//! delay to arrive, and which a region plans from the demand of the previous window
//! (known at the window's start) and from the rates measured in this one.

mod grant;
mod link;
mod live;
mod state;
pub mod store;
mod sync;

#[cfg(test)]
mod adversary;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use grant::forecast_remaining;
pub use link::Links;
pub use live::{Live, LiveWindow};
pub use state::{Stored, StoredRegion, Verdict, WindowState};
pub use sync::{take_ack, Ack, SyncWrite};

/// How often a region writes its counts and grants to each peer (ms).
pub const DEFAULT_SYNC_MS: u64 = 50;
/// How long a peer may go without acknowledging before it is partitioned (ms).
pub const DEFAULT_PARTITION_MS: u64 = 1_000;

/// Region `i`'s allotment of `limit` among `regions`: `floor(L / R)`, plus one for the
/// first `L mod R` regions, so the allotments sum to `L` exactly.
pub fn allotment(limit: u64, regions: usize, i: usize) -> u64 {
    let r = regions.max(1) as u64;
    let extra = u64::from((i as u64) < limit % r);
    limit / r + extra
}

/// The settings of one limit shared by `regions` regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// `L`: the limit per window.
    pub limit: u64,
    /// `R`: the number of regions, this one included.
    pub regions: usize,
    /// The window's length (ms), for the forecasts of the grant policy.
    pub window_ms: u64,
    /// How long a region measures its rate before it trusts it, when it has no previous
    /// window to go by (ms): one sync period.
    pub sample_ms: u64,
    /// How long a peer may go without acknowledging before it is partitioned (ms).
    pub partition_ms: u64,
}

impl Params {
    /// The settings for `limit` per `window_ms` across `regions`, with the defaults.
    pub fn new(limit: u64, regions: usize, window_ms: u64) -> Self {
        Self {
            limit,
            regions,
            window_ms,
            sample_ms: DEFAULT_SYNC_MS,
            partition_ms: DEFAULT_PARTITION_MS,
        }
    }

    /// The stated bound on what the fleet admits in one window: `L`.
    pub fn bound(&self) -> u64 {
        self.limit
    }
}
