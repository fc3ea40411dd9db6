//! `rate_limit_policies`: one row per tier, with the key windows of that tier.
//!
//! A tier of `gateway.toml` without a row gets one at start (`insert_missing`); from then
//! on the row is the truth for that tier's key windows, burst and algorithm. A row
//! without a tier in `gateway.toml` is a tier of its own. Rows are read as they are
//! (`PolicyRow`); the snapshot validates them.

use sqlx::postgres::PgPool;
use sqlx::Row;

use super::DbError;
use crate::config::Config;
use crate::limiter::Window;

/// A `rate_limit_policies` row as stored (not validated).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyRow {
    /// The tier name (what `api_keys.tier`, `tenants.tier` and
    /// `api_key_rate_limits.policy_id` name).
    pub id: String,
    /// A label for humans.
    pub name: String,
    /// `req_per_second` .. `req_per_month`, in `Window::ALL` order; 0 or NULL: no such
    /// window.
    pub limits: [Option<i64>; Window::ALL.len()],
    /// `burst_multiplier`; NULL: 1.0.
    pub burst_multiplier: Option<f64>,
    /// `algorithm` for every window; NULL: each window's default.
    pub algorithm: Option<String>,
}

/// The column of `window`: `req_per_second`, ...
pub fn column(window: Window) -> &'static str {
    match window {
        Window::Second => "req_per_second",
        Window::Minute => "req_per_minute",
        Window::Hour => "req_per_hour",
        Window::Day => "req_per_day",
        Window::Month => "req_per_month",
        // The rate-limit service's windows have no policy column (never in a tier).
        Window::Week | Window::Days30 | Window::Year => "",
    }
}

/// Every row.
///
/// # Errors
/// When the database fails.
pub async fn all(pool: &PgPool) -> Result<Vec<PolicyRow>, DbError> {
    all_where(pool, None).await
}

/// Every row, or row `id` only.
async fn all_where(pool: &PgPool, id: Option<&str>) -> Result<Vec<PolicyRow>, DbError> {
    let rows = sqlx::query(
        "SELECT id, name, req_per_second::bigint AS s, req_per_minute::bigint AS m,
                req_per_hour::bigint AS h, req_per_day::bigint AS d,
                req_per_month::bigint AS mo, burst_multiplier::float8 AS burst, algorithm
         FROM rate_limit_policies WHERE $1::text IS NULL OR id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| PolicyRow {
            id: r.get("id"),
            name: r.get("name"),
            limits: [r.get("s"), r.get("m"), r.get("h"), r.get("d"), r.get("mo")],
            burst_multiplier: r.get("burst"),
            algorithm: r.get("algorithm"),
        })
        .collect())
}

/// Inserts a row for every tier of `config` that has none: its key windows, burst and
/// algorithm. Existing rows are left as they are (they are the truth). One transaction,
/// so the other gateways get one notification.
///
/// # Errors
/// When the database fails.
pub async fn insert_missing(pool: &PgPool, config: &Config) -> Result<(), DbError> {
    let mut tiers: Vec<_> = config.tiers.values().collect();
    tiers.sort_by(|a, b| a.name.cmp(&b.name));
    let mut tx = pool.begin().await?;
    for tier in tiers {
        // 0: no such window (the columns are NOT NULL with the seed's defaults); a limit
        // beyond the column's range is stored as its largest value, never as "none".
        let limit = |w: Window| {
            tier.key
                .windows
                .iter()
                .find(|x| x.window == w)
                .map_or(0, |x| i32::try_from(x.limit).unwrap_or(i32::MAX))
        };
        let s = &tier.key_settings;
        sqlx::query(
            "INSERT INTO rate_limit_policies (id, name, req_per_second, req_per_minute,
                 req_per_hour, req_per_day, req_per_month, burst_multiplier, algorithm)
             VALUES ($1, $1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&tier.name)
        .bind(limit(Window::Second))
        .bind(limit(Window::Minute))
        .bind(limit(Window::Hour))
        .bind(limit(Window::Day))
        .bind(limit(Window::Month))
        .bind(s.burst_multiplier)
        .bind(s.algorithm.map(|a| a.as_str()))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Row `id`.
///
/// # Errors
/// When the database fails.
pub async fn get(pool: &PgPool, id: &str) -> Result<Option<PolicyRow>, DbError> {
    Ok(all_where(pool, Some(id)).await?.into_iter().next())
}

/// Writes row `id` whole (created when missing, in one statement, so the other gateways
/// get one notification); true when it was created.
///
/// # Errors
/// When the database fails.
pub async fn put(pool: &PgPool, row: &PolicyRow) -> Result<bool, DbError> {
    let limit = |i: usize| row.limits[i].unwrap_or(0);
    let created: bool = sqlx::query_scalar(
        "INSERT INTO rate_limit_policies (id, name, req_per_second, req_per_minute,
             req_per_hour, req_per_day, req_per_month, burst_multiplier, algorithm)
         VALUES ($1, $2, $3::int, $4::int, $5::int, $6::int, $7::int, $8, $9)
         ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name,
             req_per_second = EXCLUDED.req_per_second, req_per_minute = EXCLUDED.req_per_minute,
             req_per_hour = EXCLUDED.req_per_hour, req_per_day = EXCLUDED.req_per_day,
             req_per_month = EXCLUDED.req_per_month,
             burst_multiplier = EXCLUDED.burst_multiplier, algorithm = EXCLUDED.algorithm
         RETURNING (xmax = 0)",
    )
    .bind(&row.id)
    .bind(&row.name)
    .bind(limit(0))
    .bind(limit(1))
    .bind(limit(2))
    .bind(limit(3))
    .bind(limit(4))
    .bind(row.burst_multiplier.unwrap_or(1.0))
    .bind(row.algorithm.as_deref())
    .fetch_one(pool)
    .await?;
    Ok(created)
}

/// Whether `tier` is neither a `[tiers.NAME]` of `config` nor a row: `None` when known,
/// else every known tier name, sorted (what `throttle keys create` and `POST /v1/keys`
/// refuse with).
///
/// # Errors
/// When the database fails.
pub async fn unknown_tier(
    pool: &PgPool,
    config: &Config,
    tier: &str,
) -> Result<Option<Vec<String>>, DbError> {
    if config.tiers.contains_key(tier) {
        return Ok(None);
    }
    let rows = all(pool).await?;
    if rows.iter().any(|r| r.id == tier) {
        return Ok(None);
    }
    let mut known: Vec<String> = config.tiers.keys().cloned().collect();
    known.extend(rows.into_iter().map(|r| r.id));
    known.sort_unstable();
    known.dedup();
    Ok(Some(known))
}
