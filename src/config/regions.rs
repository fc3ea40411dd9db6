//! `[regions]` as validated: this gateway's region and its peers (issue 37), what the
//! store's sync loop and the allotments (`src/regions`) number regions by.

use std::time::Duration;

/// `[regions]`: this gateway's region and its peers, for `fleet = "regions"` and
/// `fleet = "home"` tables (see `src/regions`).
#[derive(Debug, Clone, PartialEq)]
pub struct Regions {
    /// `name`: this region.
    pub name: String,
    /// `peers`: every other region, its name and its Redis URL (`${VAR}` expanded),
    /// sorted by name.
    pub peers: Vec<Peer>,
    /// `sync_ms` (default 50): how often this region writes to each peer.
    pub sync: Duration,
    /// `partition_secs` (default 1): a peer that acknowledged no write for this long is
    /// cut off (no grants go to it).
    pub partition: Duration,
}

/// One peer of `[regions] peers`.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// The peer region's name.
    pub name: String,
    /// Its Redis URL (the forms `[store] url` takes).
    pub url: String,
}

// === impl Regions ===

impl Regions {
    /// Every region's name (this one's and the peers'), sorted: a region's index is its
    /// place here, so every region numbers them alike.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.peers.iter().map(|p| p.name.as_str()).collect();
        names.push(&self.name);
        names.sort_unstable();
        names
    }

    /// How many regions share a `fleet = "regions"` limit.
    pub fn count(&self) -> usize {
        self.peers.len() + 1
    }

    /// This region's index in `names`.
    pub fn index(&self) -> usize {
        self.peers.iter().filter(|p| p.name < self.name).count()
    }
}
