//! Blocks in PostgreSQL (`rate_limit_blocks`).

use sqlx::postgres::PgPool;
use sqlx::Row;

use super::DbError;
pub use crate::blocklist::BlockRow;

macro_rules! columns {
    () => {
        "id, scope, value, reason, (extract(epoch FROM expires_at) * 1000)::bigint AS expires_ms"
    };
}

fn row(r: &sqlx::postgres::PgRow) -> BlockRow {
    BlockRow {
        id: r.get("id"),
        scope: r.get("scope"),
        value: r.get("value"),
        reason: r.get("reason"),
        expires_at_ms: r.get("expires_ms"),
    }
}

/// Blocks not yet expired.
///
/// # Errors
/// When the database fails.
pub async fn active(pool: &PgPool) -> Result<Vec<BlockRow>, DbError> {
    const Q: &str = concat!(
        "SELECT ",
        columns!(),
        " FROM rate_limit_blocks WHERE expires_at IS NULL OR expires_at > now() ORDER BY id"
    );
    Ok(sqlx::query(Q)
        .fetch_all(pool)
        .await?
        .iter()
        .map(row)
        .collect())
}

/// Adds (or replaces) the block on (scope, value).
///
/// # Errors
/// When the database fails.
pub async fn upsert(
    pool: &PgPool,
    scope: &str,
    value: &str,
    reason: Option<&str>,
    expires_at_ms: Option<i64>,
) -> Result<BlockRow, DbError> {
    const Q: &str = concat!(
        "INSERT INTO rate_limit_blocks (scope, value, reason, expires_at)
         VALUES ($1, $2, $3, to_timestamp($4::double precision / 1000))
         ON CONFLICT (scope, value) DO UPDATE SET reason = EXCLUDED.reason, expires_at = EXCLUDED.expires_at, blocked_at = now()
         RETURNING ",
        columns!()
    );
    let r = sqlx::query(Q)
        .bind(scope)
        .bind(value)
        .bind(reason)
        .bind(expires_at_ms)
        .fetch_one(pool)
        .await?;
    Ok(row(&r))
}

/// Removes block `id`; false when there was none.
///
/// # Errors
/// When the database fails.
pub async fn delete(pool: &PgPool, id: i64) -> Result<bool, DbError> {
    let done = sqlx::query("DELETE FROM rate_limit_blocks WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() > 0)
}
