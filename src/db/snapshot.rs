//! The in-memory snapshot of keys, tenants, overrides and blocks, kept fresh in the
//! background: loaded at start, reloaded on every `throttle_changes` notification
//! (LISTEN/NOTIFY, fired by triggers on the tables, SQL edits included) and every
//! `FULL_REFRESH` regardless. A change reaches every gateway well within 1 s.
//!
//! When PostgreSQL is down at start the gateway serves with the TOML keys and reports
//! degraded; when it goes down later, the last snapshot keeps serving. Either way the
//! refresher reconnects with backoff.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use sqlx::postgres::{PgListener, PgPool};

use super::{blocks, check_schema, keys, sync_policies, DbError};
use crate::identity::KeyTable;
use crate::state::{Dynamic, Shared};

/// A full reload at least this often, even without notifications.
const FULL_REFRESH: Duration = Duration::from_secs(30);

/// The background service that owns the database side of the gateway.
pub struct Refresher {
    shared: Arc<Shared>,
    url: String,
}

// === impl Refresher ===

impl Refresher {
    /// A refresher for `url`, publishing into `shared`.
    pub fn new(shared: Arc<Shared>, url: String) -> Self {
        Self { shared, url }
    }
}

/// Loads the whole snapshot.
///
/// # Errors
/// When the database fails.
pub async fn load(shared: &Shared, pool: &PgPool) -> Result<Dynamic, DbError> {
    let rt = shared.runtime();
    let tenants: HashMap<String, String> = keys::tenants(pool).await?.into_iter().collect();
    let active = keys::active(pool).await?;
    let rows = blocks::active(pool).await?;
    Ok(Dynamic::new(
        KeyTable::from_rows(&rt.config, &active, &tenants),
        rows,
    ))
}

#[async_trait]
impl BackgroundService for Refresher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut backoff = Duration::from_millis(200);
        loop {
            let session = self.session(&mut shutdown);
            match session.await {
                Ok(()) => return,
                Err(e) => {
                    if self.shared.set_db_healthy(false) {
                        tracing::warn!(error = %e, "database unavailable; serving the last snapshot");
                    }
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

impl Refresher {
    /// One connected session: returns Ok on shutdown, Err when the database fails.
    async fn session(&self, shutdown: &mut ShutdownWatch) -> Result<(), DbError> {
        let pool = super::connect(&self.url).await?;
        check_schema(&pool).await?;
        sync_policies(&pool, &self.shared.runtime().config).await?;
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.listen("throttle_changes").await?;
        self.shared.set_db_pool(pool.clone());
        self.reload(&pool).await?;
        if self.shared.set_db_healthy(true) {
            tracing::info!("database connected; snapshot loaded");
        }
        let mut full = tokio::time::interval(FULL_REFRESH);
        full.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return Ok(()),
                n = listener.recv() => {
                    n?;
                    self.reload(&pool).await?;
                }
                _ = full.tick() => self.reload(&pool).await?,
            }
        }
    }

    async fn reload(&self, pool: &PgPool) -> Result<(), DbError> {
        let snapshot = load(&self.shared, pool).await?;
        self.shared.swap_dynamic(snapshot);
        Ok(())
    }
}
