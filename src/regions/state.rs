//! What one region keeps for one key and one window, and the admission rule over it.

use super::{allotment, Params};

/// A decision on a request of some cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted and counted in `own`.
    Admit,
    /// `own + x` would pass the cap.
    OverCap,
}

/// What a region knows of one peer in one window, from the peer's writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Peer {
    /// The peer's count (max of what arrived).
    pub(super) count: u64,
    /// The peer's demand (max of what arrived).
    pub(super) demand: u64,
    /// What the peer last said it wants beyond its cap (None: no write yet this window).
    pub(super) want: Option<u64>,
    /// What the peer has heard of this region's grants to it (max of what arrived).
    pub(super) heard_from_me: u64,
    /// The peer's demand in the previous window as this region last knew it.
    pub(super) prior: Option<u64>,
}

/// What a region's store holds of one region in one window (lua/regions.lua 'read').
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoredRegion {
    /// What this region granted to that one.
    pub given: u64,
    /// What this region heard of that one's grants to it.
    pub heard: u64,
    /// That region's count, as it last wrote it (max).
    pub count: u64,
    /// That region's demand (max).
    pub demand: u64,
    /// What it last said it wants (None: no write yet this window).
    pub want: Option<u64>,
    /// What it heard of this region's grants to it (max).
    pub heard_from_me: u64,
    /// Its demand in the previous window, when it wrote in that window.
    pub prior: Option<u64>,
}

/// What a region's store holds for one key in one window: the admission script's counts
/// and the sync loop's grants and peers' reports, read back for the grant policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// What this region admitted.
    pub own: u64,
    /// What it was asked, admitted or not.
    pub demand: u64,
    /// Its demand in the previous window (None: not known).
    pub prior: Option<u64>,
    /// Per region index (this region's own slot unused).
    pub regions: Vec<StoredRegion>,
}

/// One region's state for one key in one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowState {
    /// This region's index in `0..R`.
    me: usize,
    /// The window's identity (its start, Unix ms).
    window: u64,
    /// `a_i`: this region's allotment.
    allotment: u64,
    /// What this region admitted in the window.
    own: u64,
    /// What this region was asked in the window, admitted or not.
    demand: u64,
    /// This region's demand in the previous window (None: not known).
    prior: Option<u64>,
    /// What this region granted to each region (own slot stays 0).
    pub(super) given: Vec<u64>,
    /// What each region granted to this one, as heard (own slot stays 0).
    heard: Vec<u64>,
    /// What this region knows of each peer (own slot unused).
    pub(super) peers: Vec<Peer>,
}

impl WindowState {
    /// An empty state of region `me` for `window`, nothing known of the previous one.
    pub fn new(me: usize, params: &Params, window: u64) -> Self {
        let r = params.regions;
        Self {
            me,
            window,
            allotment: allotment(params.limit, r, me),
            own: 0,
            demand: 0,
            prior: None,
            given: vec![0; r],
            heard: vec![0; r],
            peers: vec![Peer::default(); r],
        }
    }

    /// The state region `me` keeps for `window` in its store (`stored`): the cap follows
    /// from the allotment and the grants given and heard, as the store's does.
    pub fn from_stored(me: usize, params: &Params, window: u64, stored: &Stored) -> Self {
        let mut s = Self::new(me, params, window);
        s.own = stored.own;
        s.demand = stored.demand;
        s.prior = stored.prior;
        for (j, r) in stored.regions.iter().enumerate().take(params.regions) {
            if j == me {
                continue;
            }
            s.given[j] = r.given;
            s.heard[j] = r.heard;
            s.peers[j] = Peer {
                count: r.count,
                demand: r.demand,
                want: r.want,
                heard_from_me: r.heard_from_me,
                prior: r.prior,
            };
        }
        s
    }

    /// What `peer` said it heard of this region's grants to it (max of its writes).
    pub fn heard_by(&self, peer: usize) -> u64 {
        self.peers.get(peer).map_or(0, |p| p.heard_from_me)
    }

    /// The state for the window that follows this one, at `window`: empty, with this
    /// window's demands (own and the peers' as heard) as the priors of the grant policy.
    pub fn next(&self, params: &Params, window: u64) -> Self {
        let mut s = Self::new(self.me, params, window);
        s.prior = Some(self.demand);
        for (p, old) in s.peers.iter_mut().zip(&self.peers) {
            p.prior = old.want.map(|_| old.demand);
        }
        s
    }

    /// This region's index.
    pub fn me(&self) -> usize {
        self.me
    }

    /// The window's identity.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// What this region admitted in the window.
    pub fn own(&self) -> u64 {
        self.own
    }

    /// What this region was asked in the window.
    pub fn demand(&self) -> u64 {
        self.demand
    }

    /// This region's demand in the previous window, if known.
    pub fn prior(&self) -> Option<u64> {
        self.prior
    }

    /// The last count received from `peer` (0 for this region itself).
    pub fn peer(&self, peer: usize) -> u64 {
        self.peers.get(peer).map_or(0, |p| p.count)
    }

    /// What this region has granted to `peer` in this window.
    pub fn given(&self, peer: usize) -> u64 {
        self.given.get(peer).copied().unwrap_or(0)
    }

    /// What `peer` has granted to this region, as heard.
    pub fn heard(&self, peer: usize) -> u64 {
        self.heard.get(peer).copied().unwrap_or(0)
    }

    /// `own + sum of the last peer counts`: the fleet's count as this region knows it.
    pub fn merged(&self) -> u64 {
        self.peers
            .iter()
            .fold(self.own, |s, p| s.saturating_add(p.count))
    }

    /// `cap = a + sum heard - sum given`: the most this region may admit in the window.
    pub fn cap(&self) -> u64 {
        let heard = self.heard.iter().fold(0u64, |s, &h| s.saturating_add(h));
        let given = self.given.iter().fold(0u64, |s, &g| s.saturating_add(g));
        self.allotment.saturating_add(heard).saturating_sub(given)
    }

    /// What is left under the cap: `cap - own`.
    pub fn room(&self) -> u64 {
        self.cap().saturating_sub(self.own)
    }

    /// Decides a request of `cost`: admitted (and counted) when `own + cost <= cap`. The
    /// demand counts it either way.
    pub fn decide(&mut self, cost: u64) -> Verdict {
        self.demand = self.demand.saturating_add(cost);
        if cost > self.room() {
            return Verdict::OverCap;
        }
        self.own += cost;
        Verdict::Admit
    }

    /// Counts `cost` of demand refused without a decision (the rest of a burst once one
    /// request of it was refused: nothing in between could have changed the answer).
    pub fn refused(&mut self, cost: u64) {
        self.demand = self.demand.saturating_add(cost);
    }

    /// Grants `amount` to `peer`: only from the room under the cap (so the cap never falls
    /// below `own`), never to itself. Whether it was granted.
    pub fn grant(&mut self, peer: usize, amount: u64) -> bool {
        if peer == self.me || peer >= self.given.len() || amount > self.room() {
            return false;
        }
        self.given[peer] = self.given[peer].saturating_add(amount);
        true
    }

    /// Max-merges what `peer` said in a write already checked to be this window's.
    pub(super) fn merge_peer(&mut self, peer: usize, from: &Peer, granted: u64) {
        if peer == self.me {
            return;
        }
        if let (Some(p), Some(h)) = (self.peers.get_mut(peer), self.heard.get_mut(peer)) {
            p.count = p.count.max(from.count);
            p.demand = p.demand.max(from.demand);
            p.want = from.want;
            p.heard_from_me = p.heard_from_me.max(from.heard_from_me);
            *h = (*h).max(granted);
        }
    }
}
