//! The gateway's background link to PostgreSQL.
//!
//! `Refresher` keeps the in-memory snapshot of keys, tenants, overrides and blocks fresh:
//! loaded at start, reloaded on every `throttle_changes` notification (LISTEN/NOTIFY,
//! fired by triggers on the tables, SQL edits included) and every `FULL_REFRESH`
//! regardless. A change reaches every gateway well within 1 s. When PostgreSQL is down at
//! start the gateway serves the TOML keys and reports degraded; when it goes down later,
//! the last snapshot keeps serving. Either way it reconnects with backoff.
//!
//! `EventWriter` drains the violation log queue into PostgreSQL; `EventRetention` drops its
//! partitions older than `[database] events_retention_months`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use sqlx::postgres::{PgListener, PgPool};

use crate::admission::Core;
use crate::db::events::EventQueue;
use crate::db::{self, DbError};
use crate::lifecycle::Lifecycle;
use crate::reload::snapshot::{self, Database};

/// A full reload at least this often, even without notifications.
const FULL_REFRESH: Duration = Duration::from_secs(30);

/// Keeps the database snapshot fresh (see the module docs).
pub struct Refresher {
    core: Arc<Core>,
    db: Arc<Database>,
}

// === impl Refresher ===

impl Refresher {
    /// A refresher for `db`, publishing into `core`.
    pub fn new(core: Arc<Core>, db: Arc<Database>) -> Self {
        Self { core, db }
    }

    /// One connected session: returns Ok on shutdown, Err when the database fails.
    async fn session(&self, url: &str, shutdown: &mut ShutdownWatch) -> Result<(), DbError> {
        let pool = db::connect(url).await?;
        db::check_schema(&pool).await?;
        db::sync_policies(&pool, &self.core.runtime().config).await?;
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.listen("throttle_changes").await?;
        self.db.set_pool(pool.clone());
        self.refresh(&pool).await?;
        if self.db.set_healthy(true) {
            tracing::info!("database connected; snapshot loaded");
        }
        let mut full = tokio::time::interval(FULL_REFRESH);
        full.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return Ok(()),
                n = listener.recv() => {
                    n?;
                    self.refresh(&pool).await?;
                }
                _ = full.tick() => self.refresh(&pool).await?,
            }
        }
    }

    async fn refresh(&self, pool: &PgPool) -> Result<(), DbError> {
        snapshot::refresh(&self.core, pool).await
    }
}

#[async_trait]
impl BackgroundService for Refresher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(url) = self.db.url().map(str::to_string) else {
            return;
        };
        let mut backoff = Duration::from_millis(200);
        loop {
            match self.session(&url, &mut shutdown).await {
                Ok(()) => return,
                Err(e) => {
                    if self.db.set_healthy(false) {
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

/// Drains the violation log queue into PostgreSQL, reconnecting with backoff; at
/// shutdown it flushes what is queued before the process may exit.
pub struct EventWriter {
    queue: Arc<EventQueue>,
    url: String,
    lifecycle: Arc<Lifecycle>,
}

// === impl EventWriter ===

impl EventWriter {
    /// A writer of `queue` into the database at `url`.
    pub fn new(queue: Arc<EventQueue>, url: String, lifecycle: Arc<Lifecycle>) -> Self {
        Self {
            queue,
            url,
            lifecycle,
        }
    }
}

#[async_trait]
impl BackgroundService for EventWriter {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // The process does not exit early while the queue is being flushed.
        let _finishing = self.lifecycle.finishing();
        let mut backoff = Duration::from_millis(200);
        loop {
            match db::connect(&self.url).await {
                Ok(pool) => {
                    let mut stop = shutdown.clone();
                    self.queue
                        .clone()
                        .run_writer(pool, async move {
                            let _ = stop.changed().await;
                        })
                        .await;
                    return;
                }
                Err(e) => tracing::debug!(error = %e, "violation log writer cannot connect yet"),
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

/// How often the violation log's old partitions are looked for (also once at start).
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// Drops the violation log's monthly partitions older than `[database]
/// events_retention_months` (read from the config in force each pass), at start and every
/// hour; `throttle_drop_event_partitions` does the work in one statement, so gateways
/// running it at once only race to drop the same tables (`DROP TABLE IF EXISTS`).
pub struct EventRetention {
    core: Arc<Core>,
    url: String,
}

// === impl EventRetention ===

impl EventRetention {
    /// Retention for the database at `url`.
    pub fn new(core: Arc<Core>, url: String) -> Self {
        Self { core, url }
    }

    async fn pass(&self, pool: &PgPool) -> Result<(), DbError> {
        let keep = self.core.runtime().config.events_retention_months;
        if keep == 0 {
            return Ok(());
        }
        let keep = i32::try_from(keep).unwrap_or(i32::MAX);
        let dropped: i32 = sqlx::query_scalar("SELECT throttle_drop_event_partitions($1)")
            .bind(keep)
            .fetch_one(pool)
            .await?;
        if dropped > 0 {
            tracing::info!(
                dropped,
                keep_months = keep,
                "violation log: old partitions dropped"
            );
        }
        Ok(())
    }
}

#[async_trait]
impl BackgroundService for EventRetention {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut pool = None;
        loop {
            if pool.is_none() {
                pool = db::connect(&self.url).await.ok();
            }
            let wait = match &pool {
                Some(p) => match self.pass(p).await {
                    Ok(()) => RETENTION_EVERY,
                    Err(e) => {
                        tracing::debug!(error = %e, "violation log retention failed; retrying");
                        pool = None;
                        Duration::from_secs(5)
                    }
                },
                None => Duration::from_secs(5),
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}
