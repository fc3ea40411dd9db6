//! API keys and tenants in PostgreSQL: create (the key is shown once, only its SHA-256 is
//! stored), revoke, list, and the rows the snapshot loads.

use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::postgres::PgPool;
use sqlx::Row;

use super::DbError;

/// A key just created: the only time the clear key exists.
#[derive(Debug, Clone)]
pub struct NewKey {
    /// The key id (what `revoke` takes and `X-Throttle-Key-Id` carries).
    pub id: String,
    /// The key itself.
    pub key: String,
}

/// A key as `keys list` shows it (never the key).
#[derive(Debug, Clone)]
pub struct KeyRow {
    /// Key id.
    pub id: String,
    /// Tenant id.
    pub tenant: String,
    /// Tier name.
    pub tier: String,
    /// The first characters of the key.
    pub prefix: String,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// Revocation time, if revoked.
    pub revoked_at: Option<String>,
}

/// A live key as the snapshot needs it.
#[derive(Debug, Clone)]
pub struct ActiveKey {
    /// Key id.
    pub id: String,
    /// Tenant id.
    pub tenant: String,
    /// The key's tier (`api_keys.tier`).
    pub tier: String,
    /// The policy (tier) the key was moved to (`api_key_rate_limits.policy_id`), which
    /// wins over `tier`.
    pub policy_id: Option<String>,
    /// SHA-256 of the key.
    pub sha256: [u8; 32],
    /// Per-key window overrides (`api_key_rate_limits.custom_override`).
    pub custom_override: Option<serde_json::Value>,
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

/// Creates a key for `tenant` (created with `tier` if missing) in `tier`.
///
/// # Errors
/// When the database fails.
pub async fn create(pool: &PgPool, tenant: &str, tier: &str) -> Result<NewKey, DbError> {
    let key = format!("thr_{}", random_hex(24));
    let id = format!("key_{}", random_hex(8));
    let digest = hex::encode(Sha256::digest(key.as_bytes()));
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO tenants (id, name, tier) VALUES ($1, $1, $2) ON CONFLICT (id) DO NOTHING",
    )
    .bind(tenant)
    .bind(tier)
    .execute(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO api_keys (id, tenant_id, key_sha256, prefix, tier) VALUES ($1, $2, $3, $4, $5)")
        .bind(&id)
        .bind(tenant)
        .bind(&digest)
        .bind(&key[..8])
        .bind(tier)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(NewKey { id, key })
}

/// Revokes key `id`.
///
/// # Errors
/// `DbError::Invalid` when no live key has that id.
pub async fn revoke(pool: &PgPool, id: &str) -> Result<(), DbError> {
    let done =
        sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL")
            .bind(id)
            .execute(pool)
            .await?;
    if done.rows_affected() == 0 {
        return Err(DbError::Invalid(format!("no active key with id {id:?}")));
    }
    Ok(())
}

/// Every key, newest first.
///
/// # Errors
/// When the database fails.
pub async fn list(pool: &PgPool) -> Result<Vec<KeyRow>, DbError> {
    let rows = sqlx::query(
        "SELECT id, tenant_id, tier, prefix,
                to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS created,
                to_char(revoked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS revoked
         FROM api_keys ORDER BY created_at DESC, id",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| KeyRow {
            id: r.get("id"),
            tenant: r.get("tenant_id"),
            tier: r.get("tier"),
            prefix: r.get("prefix"),
            created_at: r.get("created"),
            revoked_at: r.get("revoked"),
        })
        .collect())
}

/// Live keys with their overrides.
///
/// # Errors
/// When the database fails.
pub async fn active(pool: &PgPool) -> Result<Vec<ActiveKey>, DbError> {
    let rows = sqlx::query(
        "SELECT k.id, k.tenant_id, k.tier, o.policy_id, k.key_sha256, o.custom_override
         FROM api_keys k
         LEFT JOIN api_key_rate_limits o ON o.api_key_id = k.id
         WHERE k.revoked_at IS NULL",
    )
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut sha256 = [0u8; 32];
        let hex_digest: String = r.get("key_sha256");
        if hex::decode_to_slice(&hex_digest, &mut sha256).is_err() {
            continue;
        }
        out.push(ActiveKey {
            id: r.get("id"),
            tenant: r.get("tenant_id"),
            tier: r.get("tier"),
            policy_id: r.get("policy_id"),
            sha256,
            custom_override: r.get("custom_override"),
        });
    }
    Ok(out)
}
