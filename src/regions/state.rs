//! What one region keeps for one key and one window, and the admission rule over it.

use super::{Links, Params};

/// The share mode of one window: declared once, kept until the window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// `own` when the share was declared.
    pub base: u64,
    /// What the region may admit beyond `base` in this window.
    pub share: u64,
}

impl Share {
    /// The share of a region whose merged total is `merged` while `live` peers still
    /// acknowledge: `floor(max(0, L - merged - b x live) / R)`.
    pub fn declare(params: &Params, own: u64, merged: u64, live: usize) -> Self {
        let reserved = params.budget.saturating_mul(live as u64);
        let left = params.limit.saturating_sub(merged).saturating_sub(reserved);
        Self {
            base: own,
            share: left / (params.regions.max(1) as u64),
        }
    }
}

/// A decision on a request of some cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted and counted in `own`.
    Admit,
    /// Rule 1: the merged total plus the cost would pass the limit.
    OverLimit,
    /// Rule 2: the admissions `peer` has not acknowledged plus the cost would pass `b`.
    Unsynced {
        /// The region whose acknowledgements are missing.
        peer: usize,
    },
    /// Rule 3: the window's share (partition mode) is spent.
    ShareSpent,
}

/// One region's state for one key in one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowState {
    /// This region's index in `0..R`.
    me: usize,
    /// The window's identity (its start, Unix ms).
    window: u64,
    /// What this region admitted in the window.
    own: u64,
    /// The last count received from each region (this region's own slot stays 0).
    peers: Vec<u64>,
    /// The highest `own` each region acknowledged (own slot unused).
    acked: Vec<u64>,
    /// The share mode, once declared in this window.
    share: Option<Share>,
}

impl WindowState {
    /// An empty state of region `me` of `regions` for `window`.
    pub fn new(me: usize, regions: usize, window: u64) -> Self {
        Self {
            me,
            window,
            own: 0,
            peers: vec![0; regions],
            acked: vec![0; regions],
            share: None,
        }
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

    /// The last count received from `peer` (0 for this region itself).
    pub fn peer(&self, peer: usize) -> u64 {
        self.peers.get(peer).copied().unwrap_or(0)
    }

    /// `own + sum of the last peer counts`: the fleet's count as this region knows it.
    pub fn merged(&self) -> u64 {
        self.peers
            .iter()
            .fold(self.own, |s, &c| s.saturating_add(c))
    }

    /// What `peer` has not acknowledged of `own`.
    pub fn unacked(&self, peer: usize) -> u64 {
        self.own
            .saturating_sub(self.acked.get(peer).copied().unwrap_or(0))
    }

    /// The share mode, if declared in this window.
    pub fn share(&self) -> Option<Share> {
        self.share
    }

    /// Decides a request of `cost` at `now_ms` and counts it when admitted. The first
    /// decision taken while a peer is partitioned declares the window's share.
    pub fn decide(&mut self, params: &Params, links: &Links, now_ms: u64, cost: u64) -> Verdict {
        let (me, regions) = (self.me, self.peers.len());
        let live_peer = |p: &usize| *p != me && !links.partitioned(*p, now_ms, params.partition_ms);
        let live = (0..regions).filter(live_peer).count();
        if self.share.is_none() && live < regions.saturating_sub(1) {
            self.share = Some(Share::declare(params, self.own, self.merged(), live));
        }
        if self.merged().saturating_add(cost) > params.limit {
            return Verdict::OverLimit;
        }
        for peer in (0..regions).filter(live_peer) {
            if self.unacked(peer).saturating_add(cost) > params.budget {
                return Verdict::Unsynced { peer };
            }
        }
        if let Some(s) = self.share {
            if self.own.saturating_add(cost) > s.base.saturating_add(s.share) {
                return Verdict::ShareSpent;
            }
        }
        self.own = self.own.saturating_add(cost);
        Verdict::Admit
    }

    /// Max-merges `count` as `peer`'s count (a write already checked to be this window's).
    pub(super) fn merge_peer(&mut self, peer: usize, count: u64) {
        if let Some(c) = self.peers.get_mut(peer).filter(|_| peer != self.me) {
            *c = (*c).max(count);
        }
    }

    /// Raises what `peer` acknowledged to `count` (never above `own`, never down).
    pub(super) fn merge_ack(&mut self, peer: usize, count: u64) {
        let own = self.own;
        if let Some(a) = self.acked.get_mut(peer).filter(|_| peer != self.me) {
            *a = (*a).max(count.min(own));
        }
    }
}
