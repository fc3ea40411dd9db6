//! The database side of admission: the connection state, and the one function that
//! reloads the snapshot of keys, tenants, overrides and blocks and swaps it in
//! (`refresh`), used by the background refresher, the admin API and config reloads.
//!
//! The database returns plain records (`db::Records`); turning them into the key table
//! (tiers from the config, overrides applied) happens here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use sqlx::postgres::PgPool;

use super::core::{Core, Dynamic};
use crate::config::Config;
use crate::db::{self, DbError, Records};
use crate::identity::{apply_override, KeyInfo, KeyTable};

/// The configured database: its pool once connected, and whether it answered last.
#[derive(Debug, Default)]
pub struct Database {
    url: Option<String>,
    pool: ArcSwapOption<PgPool>,
    healthy: AtomicBool,
}

// === impl Database ===

impl Database {
    /// The database at `url` (None: no database configured).
    pub fn new(url: Option<String>) -> Self {
        Self {
            url,
            ..Self::default()
        }
    }

    /// The URL, when a database is configured.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// Whether a database is configured.
    pub fn configured(&self) -> bool {
        self.url.is_some()
    }

    /// The pool once connected.
    pub fn pool(&self) -> Option<Arc<PgPool>> {
        self.pool.load_full()
    }

    /// Publishes the connected pool.
    pub fn set_pool(&self, pool: PgPool) {
        self.pool.store(Some(Arc::new(pool)));
    }

    /// Whether the database answered its last use.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Records health; true when it changed (log once per transition).
    pub fn set_healthy(&self, healthy: bool) -> bool {
        self.healthy.swap(healthy, Ordering::Relaxed) != healthy
    }
}

/// Reloads the snapshot from `pool` and publishes it.
///
/// # Errors
/// When the database fails; the old snapshot keeps serving.
pub async fn refresh(core: &Core, pool: &PgPool) -> Result<(), DbError> {
    let records = db::records(pool).await?;
    let dynamic = build(&core.runtime().config, records);
    core.swap_dynamic(dynamic);
    Ok(())
}

/// The snapshot of `records` under `config`: the config's keys, and each live database
/// key (a key in both is the config's) with its tier (from the
/// config; keys naming an unknown tier are skipped and logged), its `custom_override`
/// applied over the tier's key windows, and its tenant's tier (the tenants table, else
/// `[[tenants]]`, else the key's tier).
pub fn build(config: &Config, records: Records) -> Dynamic {
    let tenants: HashMap<String, String> = records.tenants.into_iter().collect();
    let mut keys = KeyTable::default();
    for k in &records.keys {
        let Some(tier) = config.tiers.get(&k.tier) else {
            tracing::warn!(key_id = %k.id, tier = %k.tier, "key names a tier gateway.toml does not define; ignored");
            continue;
        };
        let tier = match &k.custom_override {
            Some(o) => match apply_override(tier, o) {
                Ok(t) => Arc::new(t),
                Err(e) => {
                    tracing::warn!(key_id = %k.id, error = %e, "invalid custom_override; using the tier's limits");
                    tier.clone()
                }
            },
            None => tier.clone(),
        };
        let tenant_tier = tenants
            .get(&k.tenant)
            .or_else(|| config.tenants.get(&k.tenant))
            .and_then(|t| config.tiers.get(t))
            .cloned()
            .unwrap_or_else(|| tier.clone());
        keys.insert(k.sha256, KeyInfo::new(&k.id, &k.tenant, tier, tenant_tier));
    }
    // The config's own keys, last: a key in both is the config's.
    for (sha256, info) in KeyTable::from_config(config).iter() {
        keys.insert(*sha256, info.clone());
    }
    Dynamic::new(keys, records.blocks)
}
