//! What a sync write carries between regions and what its acknowledgement does.

use super::{Links, WindowState};

/// One count a region writes into a peer's store every `sync_ms`: its own count of one
/// key in one window. The window travels with it so that the peer merges it into that
/// window only: a write that arrives after the peer has moved to the next window never
/// adds to the next window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncWrite {
    /// The writing region.
    pub from: usize,
    /// The window's identity (its start, Unix ms).
    pub window: u64,
    /// The writer's `own` count in that window when it wrote.
    pub count: u64,
}

/// The reply to a [`SyncWrite`]: the peer merged `count` for `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The acknowledging region.
    pub from: usize,
    /// The window the count was merged into.
    pub window: u64,
    /// The count merged (0: nothing was, the write was for another window).
    pub count: u64,
}

impl WindowState {
    /// What this region writes to its peers for this window.
    pub fn sync_write(&self) -> SyncWrite {
        SyncWrite {
            from: self.me(),
            window: self.window(),
            count: self.own(),
        }
    }

    /// Receives a peer's write: max-merged when it is for this window. The reply always
    /// goes back (the link is alive) but acknowledges only what was merged: a write for
    /// another window (late, or from a clock ahead) changes nothing here and is answered
    /// with a count of 0.
    pub fn receive(&mut self, write: &SyncWrite) -> Ack {
        let merged = write.window == self.window() && write.from != self.me();
        if merged {
            self.merge_peer(write.from, write.count);
        }
        Ack {
            from: self.me(),
            window: write.window,
            count: if merged { write.count } else { 0 },
        }
    }

    /// Takes an acknowledgement: for this window, `acked[from]` rises to its count (what
    /// the peer has merged no longer counts against `b`). The link's renewal is
    /// [`Links::acknowledged`], for every reply, whatever the window.
    pub fn acknowledged(&mut self, ack: &Ack) {
        if ack.window == self.window() {
            self.merge_ack(ack.from, ack.count);
        }
    }
}

/// Takes a reply from `ack.from` at `now_ms`: renews the link (ends the partition with
/// that peer) and applies the acknowledgement to `state` when it is for its window.
pub fn take_ack(links: &mut Links, state: &mut WindowState, ack: &Ack, now_ms: u64) {
    links.acknowledged(ack.from, now_ms);
    state.acknowledged(ack);
}
