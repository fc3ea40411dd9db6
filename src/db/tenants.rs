//! Tenants in PostgreSQL (`tenants`): the admin API's CRUD and what the snapshot reads.
//! Each write is one statement (one implicit transaction); the `tenants_notify` trigger
//! tells every gateway.

use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;

use super::DbError;

/// A `tenants` row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TenantRow {
    /// Tenant id (what `api_keys.tenant_id` names).
    pub id: String,
    /// A label for humans.
    pub name: String,
    /// The tenant's tier.
    pub tier: String,
    /// The tenant's own `calendar_tz` for its tenant windows (None: its tier's).
    pub calendar_tz: Option<String>,
    /// The tenant's own `billing_anchor_day` (1..=28; None: its tier's).
    pub billing_anchor_day: Option<i16>,
    /// Creation time (RFC 3339).
    pub created_at: String,
}

/// What a tenant write sets: name, tier and the tenant's own calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantFields<'a> {
    /// A label for humans.
    pub name: &'a str,
    /// The tier.
    pub tier: &'a str,
    /// `calendar_tz` (None: NULL, the tier's).
    pub calendar_tz: Option<&'a str>,
    /// `billing_anchor_day` (None: NULL, the tier's).
    pub billing_anchor_day: Option<i16>,
}

/// A tenant as the snapshot reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TenantRecord {
    /// Tenant id.
    pub id: String,
    /// Tier name.
    pub tier: String,
    /// `calendar_tz` (None: the tier's).
    pub calendar_tz: Option<String>,
    /// `billing_anchor_day` (None: the tier's).
    pub billing_anchor_day: Option<i16>,
}

/// What a write changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The row as stored.
    Row(TenantRow),
    /// No row with that id.
    Missing,
    /// The id is taken (create) or still has a live key (delete).
    Conflict,
}

macro_rules! columns {
    () => {
        "id, name, tier, calendar_tz, billing_anchor_day, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS created"
    };
}

fn row(r: &PgRow) -> TenantRow {
    TenantRow {
        id: r.get("id"),
        name: r.get("name"),
        tier: r.get("tier"),
        calendar_tz: r.get("calendar_tz"),
        billing_anchor_day: r.get("billing_anchor_day"),
        created_at: r.get("created"),
    }
}

/// Every tenant with its tier and own calendar, for the snapshot.
///
/// # Errors
/// When the database fails.
pub async fn records(pool: &PgPool) -> Result<Vec<TenantRecord>, DbError> {
    let rows = sqlx::query("SELECT id, tier, calendar_tz, billing_anchor_day FROM tenants")
        .fetch_all(pool)
        .await?;
    Ok(rows
        .iter()
        .map(|r| TenantRecord {
            id: r.get("id"),
            tier: r.get("tier"),
            calendar_tz: r.get("calendar_tz"),
            billing_anchor_day: r.get("billing_anchor_day"),
        })
        .collect())
}

/// Every tenant, by id.
///
/// # Errors
/// When the database fails.
pub async fn list(pool: &PgPool) -> Result<Vec<TenantRow>, DbError> {
    const Q: &str = concat!("SELECT ", columns!(), " FROM tenants ORDER BY id");
    Ok(sqlx::query(Q)
        .fetch_all(pool)
        .await?
        .iter()
        .map(row)
        .collect())
}

/// Tenant `id`.
///
/// # Errors
/// When the database fails.
pub async fn get(pool: &PgPool, id: &str) -> Result<Option<TenantRow>, DbError> {
    const Q: &str = concat!("SELECT ", columns!(), " FROM tenants WHERE id = $1");
    Ok(sqlx::query(Q)
        .bind(id)
        .fetch_optional(pool)
        .await?
        .as_ref()
        .map(row))
}

/// Creates tenant `id`; `Conflict` when it exists.
///
/// # Errors
/// When the database fails.
pub async fn create(pool: &PgPool, id: &str, f: TenantFields<'_>) -> Result<Written, DbError> {
    const Q: &str = concat!(
        "INSERT INTO tenants (id, name, tier, calendar_tz, billing_anchor_day) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING RETURNING ",
        columns!()
    );
    write(pool, Q, id, f, Written::Conflict).await
}

/// Replaces the name, tier and own calendar of tenant `id`; `Missing` when there is none.
///
/// # Errors
/// When the database fails.
pub async fn update(pool: &PgPool, id: &str, f: TenantFields<'_>) -> Result<Written, DbError> {
    const Q: &str = concat!(
        "UPDATE tenants SET name = $2, tier = $3, calendar_tz = $4, billing_anchor_day = $5 WHERE id = $1 RETURNING ",
        columns!()
    );
    write(pool, Q, id, f, Written::Missing).await
}

/// Runs `q` (binding id, name, tier, calendar_tz, billing_anchor_day; returning the
/// tenant's columns): the row written, or `none` when it wrote nothing.
async fn write(
    pool: &PgPool,
    q: &'static str,
    id: &str,
    f: TenantFields<'_>,
    none: Written,
) -> Result<Written, DbError> {
    let r = sqlx::query(q)
        .bind(id)
        .bind(f.name)
        .bind(f.tier)
        .bind(f.calendar_tz)
        .bind(f.billing_anchor_day)
        .fetch_optional(pool)
        .await?;
    Ok(r.as_ref().map_or(none, |r| Written::Row(row(r))))
}

/// Deletes tenant `id` with its revoked keys: `Missing` when there is none, `Conflict`
/// while it has a live key. The tenant row is locked first, so a key made meanwhile
/// (its foreign key reads the row) waits and then fails rather than being orphaned.
///
/// # Errors
/// When the database fails.
pub async fn delete(pool: &PgPool, id: &str) -> Result<Written, DbError> {
    const DELETE: &str = concat!("DELETE FROM tenants WHERE id = $1 RETURNING ", columns!());
    let mut tx = pool.begin().await?;
    let exists = sqlx::query("SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .is_some();
    if !exists {
        return Ok(Written::Missing);
    }
    let live: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM api_keys WHERE tenant_id = $1 AND revoked_at IS NULL)",
    )
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    if live {
        return Ok(Written::Conflict);
    }
    // Revoked keys go with their tenant (their overrides cascade); the violation log
    // names tenants and keys by value and keeps its history.
    sqlx::query("DELETE FROM api_keys WHERE tenant_id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let deleted = sqlx::query(DELETE)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(deleted.map_or(Written::Missing, |r| Written::Row(row(&r))))
}
