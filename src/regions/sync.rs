//! What a sync write carries between regions and what its acknowledgement does.

use super::state::Peer;
use super::{Links, Params, WindowState};

/// What a region writes into one peer's store every `sync_ms`, for one key in one window.
/// The window travels with it so that the peer merges it into that window only: a write
/// that arrives after the peer has moved on never adds to the next window (and a grant in
/// it is lost, never counted twice). Every count in it only grows within the window, so
/// the peer merges by max and a duplicated, reordered or replayed write changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncWrite {
    /// The writing region.
    pub from: usize,
    /// The window's identity (its start, Unix ms).
    pub window: u64,
    /// The writer's count.
    pub count: u64,
    /// The writer's demand (admitted or not).
    pub demand: u64,
    /// What the writer wants beyond its cap (advisory: the last one wins).
    pub want: u64,
    /// What the writer has granted to the receiver in this window, in all.
    pub granted: u64,
    /// What the writer has heard of the receiver's grants to it.
    pub heard: u64,
}

/// The reply to a [`SyncWrite`]: the link is alive (and whether the write was merged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The acknowledging region.
    pub from: usize,
    /// The window of the write.
    pub window: u64,
    /// The count merged (0: nothing was, the write was for another window).
    pub count: u64,
}

impl WindowState {
    /// What this region writes to `to` for this window at `now_ms`.
    pub fn sync_write(&self, params: &Params, to: usize, now_ms: u64) -> SyncWrite {
        SyncWrite {
            from: self.me(),
            window: self.window(),
            count: self.own(),
            demand: self.demand(),
            want: self.want(params, now_ms),
            granted: self.given(to),
            heard: self.heard(to),
        }
    }

    /// Receives a peer's write: max-merged when it is for this window. The reply always
    /// goes back (the link is alive) but acknowledges only what was merged: a write for
    /// another window (late, or from a clock ahead) changes nothing here.
    pub fn receive(&mut self, write: &SyncWrite) -> Ack {
        let merged = write.window == self.window() && write.from != self.me();
        if merged {
            let peer = Peer {
                count: write.count,
                demand: write.demand,
                want: Some(write.want),
                heard_from_me: write.heard,
                prior: None,
            };
            self.merge_peer(write.from, &peer, write.granted);
        }
        Ack {
            from: self.me(),
            window: write.window,
            count: if merged { write.count } else { 0 },
        }
    }
}

/// Takes a reply from `ack.from` at `now_ms`: renews the link (ends the partition with
/// that peer). Nothing in the rule waits for an acknowledgement; the link's state only
/// decides to whom a region grants.
pub fn take_ack(links: &mut Links, ack: &Ack, now_ms: u64) {
    links.acknowledged(ack.from, now_ms);
}
