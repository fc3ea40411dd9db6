//! A region's links to its peers: when each last acknowledged a write (for all keys).

/// The time of each peer's last acknowledgement, for the partition mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Links {
    /// Unix ms of the last acknowledgement from each region (this region's slot unused).
    last_ack_ms: Vec<u64>,
}

impl Links {
    /// Links to `regions` regions, all counted as acknowledged at `now_ms` (a region that
    /// starts gives its peers `partition_ms` to answer before it declares them partitioned).
    pub fn new(regions: usize, now_ms: u64) -> Self {
        Self {
            last_ack_ms: vec![now_ms; regions],
        }
    }

    /// Records an acknowledgement from `peer` at `now_ms` (a time never moves back).
    pub fn acknowledged(&mut self, peer: usize, now_ms: u64) {
        if let Some(t) = self.last_ack_ms.get_mut(peer) {
            *t = (*t).max(now_ms);
        }
    }

    /// When `peer` last acknowledged (None for an unknown index).
    pub fn last_ack_ms(&self, peer: usize) -> Option<u64> {
        self.last_ack_ms.get(peer).copied()
    }

    /// Whether `peer` has gone `partition_ms` or more without acknowledging. An unknown
    /// index is not a peer, so never partitioned.
    pub fn partitioned(&self, peer: usize, now_ms: u64, partition_ms: u64) -> bool {
        self.last_ack_ms(peer)
            .is_some_and(|t| now_ms.saturating_sub(t) >= partition_ms)
    }

    /// How long `peer` has gone without acknowledging (the sync lag metric).
    pub fn lag_ms(&self, peer: usize, now_ms: u64) -> u64 {
        self.last_ack_ms(peer)
            .map_or(0, |t| now_ms.saturating_sub(t))
    }
}
