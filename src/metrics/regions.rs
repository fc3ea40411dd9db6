//! The `throttle_region_*` metrics of `fleet = "regions"` (the sync loop sets them, see
//! `store::redis::region_sync`). The one label, `peer`, is a configured region name.

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec};

use super::{Def, Reg};

/// The metrics of the sync loop, by peer region.
pub struct RegionMetrics {
    /// `throttle_region_sync_lag_seconds{peer}`: since the peer last acknowledged a sync
    /// write.
    pub sync_lag_seconds: GaugeVec,
    /// `throttle_region_partitioned{peer}`: 1 while the peer acknowledged nothing for
    /// `partition_secs` (no grants go to it), else 0.
    pub partitioned: IntGaugeVec,
    /// `throttle_region_unsynced{peer}`: grants in flight to the peer (granted in the
    /// live windows, less what the peer said it heard).
    pub unsynced: IntGaugeVec,
    /// `throttle_region_granted_total{peer}`: tokens this region granted to the peer.
    pub granted_total: IntCounterVec,
    /// `throttle_region_heard_total{peer}`: tokens of the peer's grants this region heard.
    pub heard_total: IntCounterVec,
}

impl RegionMetrics {
    /// Registers them in `r`.
    pub(super) fn register(r: &Reg) -> Result<Self, prometheus::Error> {
        let peer = &["peer"];
        Ok(Self {
            sync_lag_seconds: r.add(GaugeVec::new(REGION_SYNC_LAG.opts(), peer)?)?,
            partitioned: r.add(IntGaugeVec::new(REGION_PARTITIONED.opts(), peer)?)?,
            unsynced: r.add(IntGaugeVec::new(REGION_UNSYNCED.opts(), peer)?)?,
            granted_total: r.counter_vec(&REGION_GRANTED_TOTAL, peer)?,
            heard_total: r.counter_vec(&REGION_HEARD_TOTAL, peer)?,
        })
    }
}

const REGION_SYNC_LAG: Def = Def {
    name: "throttle_region_sync_lag_seconds",
    help: "Seconds since the peer region last acknowledged a sync write (fleet = \"regions\"), by peer.",
};

const REGION_PARTITIONED: Def = Def {
    name: "throttle_region_partitioned",
    help: "1 while the peer region acknowledged no sync write for partition_secs (no grants go to it), else 0.",
};

const REGION_UNSYNCED: Def = Def {
    name: "throttle_region_unsynced",
    help: "Tokens granted to the peer region in the live windows that it has not said it heard, by peer.",
};

const REGION_GRANTED_TOTAL: Def = Def {
    name: "throttle_region_granted_total",
    help: "Tokens this region granted to the peer region, by peer.",
};

const REGION_HEARD_TOTAL: Def = Def {
    name: "throttle_region_heard_total",
    help: "Tokens of the peer region's grants this region heard, by peer.",
};
