//! The gateway's background link to PostgreSQL.
//!
//! `Refresher` keeps the in-memory snapshot of keys, tenants, overrides and blocks fresh:
//! loaded at start, reloaded on every `throttle_changes` notification (LISTEN/NOTIFY,
//! fired by triggers on the tables, SQL edits included) and every `FULL_REFRESH`
//! regardless. A change reaches every gateway well within 1 s. When PostgreSQL is down at
//! start the gateway serves the TOML keys and reports degraded; when it goes down later,
//! the last snapshot keeps serving. Either way it reconnects with backoff.
//!
//! `EventWriter` drains the violation log queue into PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use sqlx::postgres::{PgListener, PgPool};

use crate::admission::snapshot::{self, Database};
use crate::admission::Core;
use crate::db::events::EventQueue;
use crate::db::{self, DbError};
use crate::lifecycle::Lifecycle;

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
