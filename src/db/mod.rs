//! PostgreSQL: tenants, hashed API keys, policies (tiers), overrides, blocks and the
//! violation log.
//!
//! Nothing on the request path waits on this module: keys, overrides, policies and blocks
//! are read as plain `Records` into an in-memory snapshot (`reload::snapshot`)
//! refreshed in the background (`sync`), and violation events go through a bounded queue
//! to a batched writer (`events`). This module knows nothing above `config`, `limiter`
//! and the plain values it stores: `blocklist::BlockRow` and `violations::Event`.

pub mod blocks;
pub mod events;
pub mod keys;
pub mod policies;
pub mod tenants;

use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::config::Config;

/// The migrations of `migrations/`, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// A database failure.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The query or connection failed.
    #[error("database: {0}")]
    Sqlx(#[from] sqlx::Error),
    /// Applying migrations failed.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The schema lacks migrations this build needs.
    #[error("the database schema is older than this gateway ({0} migration(s) missing): run `throttle migrate --database-url <URL>`")]
    SchemaOutdated(usize),
    /// A request the data does not allow.
    #[error("{0}")]
    Invalid(String),
}

/// What the gateway's snapshot is built from, as the database holds it.
#[derive(Debug, Default)]
pub struct Records {
    /// Tenants with their tiers and own calendars.
    pub tenants: Vec<tenants::TenantRecord>,
    /// Live keys with their overrides.
    pub keys: Vec<keys::ActiveKey>,
    /// `rate_limit_policies` rows (not validated).
    pub policies: Vec<policies::PolicyRow>,
    /// Blocks not yet expired.
    pub blocks: Vec<blocks::BlockRow>,
}

/// Reads every record of the snapshot.
///
/// # Errors
/// When the database fails.
pub async fn records(pool: &PgPool) -> Result<Records, DbError> {
    Ok(Records {
        tenants: tenants::records(pool).await?,
        keys: keys::active(pool).await?,
        policies: policies::all(pool).await?,
        blocks: blocks::active(pool).await?,
    })
}

/// A small pool with short timeouts: the gateway never lets a slow database hold it up.
///
/// # Errors
/// When the database cannot be reached within 3 s.
pub async fn connect(url: &str) -> Result<PgPool, DbError> {
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(3))
        .connect(url)
        .await?)
}

/// Applies every pending migration (idempotent).
///
/// # Errors
/// When a migration fails.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// Refuses a schema older than this build.
///
/// # Errors
/// `DbError::SchemaOutdated` naming how many migrations are missing.
pub async fn check_schema(pool: &PgPool) -> Result<(), DbError> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    let applied: Vec<i64> = if exists {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await?
    } else {
        Vec::new()
    };
    let missing = MIGRATOR
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .count();
    if missing > 0 {
        return Err(DbError::SchemaOutdated(missing));
    }
    Ok(())
}

/// Inserts a `rate_limit_policies` row for every tier of `config` that has none (at
/// start); existing rows are the truth and stay as they are (`policies::insert_missing`).
///
/// # Errors
/// When the database fails.
pub async fn sync_policies(pool: &PgPool, config: &Config) -> Result<(), DbError> {
    policies::insert_missing(pool, config).await
}
