//! `/v1/blocks`: list, add and remove blocks, behind one store that keeps them in memory
//! (no database configured) or in PostgreSQL (then every gateway sees the change through
//! NOTIFY, this one at once).

use std::sync::{Mutex, PoisonError};

use http::Method;
use pingora::protocols::http::ServerSession;
use serde::Deserialize;

use super::{invalid, json_reply, read_body};
use crate::admission::{Core, Dynamic};
use crate::config::parse_net;
use crate::db::blocks::BlockRow;
use crate::identity::KeyTable;
use crate::reload::snapshot::{self, Database};
use crate::reply::{error_reply, Reply};

/// Longest block `value` (an address, CIDR or id).
const MAX_VALUE: usize = 256;
/// Longest block `reason`.
const MAX_REASON: usize = 1024;

/// Where posted blocks live.
pub(super) enum BlockStore {
    /// No database: the next id and the blocks.
    Memory(Mutex<(i64, Vec<BlockRow>)>),
    /// `rate_limit_blocks` in PostgreSQL.
    Database,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockRequest {
    scope: String,
    value: String,
    reason: Option<String>,
    /// RFC 3339 (`2026-12-31T00:00:00Z`).
    expires_at: Option<String>,
    /// Accept an IP block with host bits set or wider than /8 (IPv4) or /32 (IPv6).
    #[serde(default)]
    force: bool,
}

/// Why a block change failed.
enum Failed {
    /// The database is not connected or failed.
    Unavailable(Option<String>),
}

// === impl BlockStore ===

impl BlockStore {
    /// PostgreSQL when `db` is configured, else memory.
    pub(super) fn new(db: &Database) -> Self {
        if db.configured() {
            BlockStore::Database
        } else {
            BlockStore::Memory(Mutex::new((1, Vec::new())))
        }
    }

    /// Routes a `/v1/blocks` request (the caller checked the admin token).
    pub(super) async fn handle(
        &self,
        core: &Core,
        db: &Database,
        session: &mut ServerSession,
        method: &Method,
        path: &str,
    ) -> Reply {
        match (method, path) {
            (&Method::GET, "/v1/blocks") => {
                let now_ms = core.clock.now_ms();
                let posted = core
                    .dynamic()
                    .block_rows
                    .iter()
                    .map(block_json)
                    .collect::<Vec<_>>();
                let automatic = core
                    .bans
                    .list(now_ms)
                    .iter()
                    .map(ban_json)
                    .collect::<Vec<_>>();
                let blocks: Vec<_> = posted.into_iter().chain(automatic).collect();
                json_reply(200, &serde_json::json!({ "blocks": blocks }))
            }
            (&Method::POST, "/v1/blocks") => match read_body(core, session).await {
                Ok(body) => match parse(&body) {
                    Ok(row) => match self.add(core, db, row).await {
                        Ok(stored) => json_reply(201, &block_json(&stored)),
                        Err(f) => f.reply(),
                    },
                    Err(reply) => reply,
                },
                Err(reply) => reply,
            },
            (&Method::DELETE, p) => match p
                .strip_prefix("/v1/blocks/")
                .and_then(|id| id.parse::<i64>().ok())
            {
                // Automatic bans have negative ids.
                Some(id) if id < 0 => match core.bans.lift(id) {
                    Some(ban) => {
                        if let Some(redis) = &core.shared_bans {
                            if let Err(e) = redis.lift_ban(&ban).await {
                                let detail = format!("lifted on this gateway only: {e}");
                                return json_reply(
                                    503,
                                    &serde_json::json!({"error": "store_unavailable", "detail": detail}),
                                );
                            }
                        }
                        Reply {
                            status: 204,
                            headers: Vec::new(),
                            body: bytes::Bytes::new(),
                        }
                    }
                    None => error_reply(404, "not_found"),
                },
                Some(id) => match self.remove(core, db, id).await {
                    Ok(true) => Reply {
                        status: 204,
                        headers: Vec::new(),
                        body: bytes::Bytes::new(),
                    },
                    Ok(false) => error_reply(404, "not_found"),
                    Err(f) => f.reply(),
                },
                None => error_reply(404, "not_found"),
            },
            _ => error_reply(405, "method_not_allowed"),
        }
    }

    /// Adds (or replaces) the block on (scope, value) and publishes it.
    async fn add(&self, core: &Core, db: &Database, mut row: BlockRow) -> Result<BlockRow, Failed> {
        match self {
            BlockStore::Memory(m) => {
                let mut m = m.lock().unwrap_or_else(PoisonError::into_inner);
                row.id = m.0;
                m.0 += 1;
                m.1.retain(|b| !(b.scope == row.scope && b.value == row.value));
                m.1.push(row.clone());
                core.swap_dynamic(Dynamic::new(KeyTable::default(), m.1.clone()));
                Ok(row)
            }
            BlockStore::Database => {
                let pool = db.pool().ok_or(Failed::Unavailable(None))?;
                let stored = crate::db::blocks::upsert(
                    &pool,
                    &row.scope,
                    &row.value,
                    row.reason.as_deref(),
                    row.expires_at_ms,
                )
                .await
                .map_err(|e| Failed::Unavailable(Some(e.to_string())))?;
                refresh(core, &pool).await;
                Ok(stored)
            }
        }
    }

    /// Removes block `id`; false when there was none.
    async fn remove(&self, core: &Core, db: &Database, id: i64) -> Result<bool, Failed> {
        match self {
            BlockStore::Memory(m) => {
                let mut m = m.lock().unwrap_or_else(PoisonError::into_inner);
                let before = m.1.len();
                m.1.retain(|b| b.id != id);
                core.swap_dynamic(Dynamic::new(KeyTable::default(), m.1.clone()));
                Ok(m.1.len() != before)
            }
            BlockStore::Database => {
                let pool = db.pool().ok_or(Failed::Unavailable(None))?;
                let found = crate::db::blocks::delete(&pool, id)
                    .await
                    .map_err(|e| Failed::Unavailable(Some(e.to_string())))?;
                refresh(core, &pool).await;
                Ok(found)
            }
        }
    }
}

// === impl Failed ===

impl Failed {
    fn reply(self) -> Reply {
        match self {
            Failed::Unavailable(detail) => super::dbapi::unavailable(detail),
        }
    }
}

/// This gateway sees its own change at once; the others through NOTIFY.
async fn refresh(core: &Core, pool: &sqlx::PgPool) {
    if let Err(e) = snapshot::refresh(core, pool).await {
        tracing::warn!(error = %e, "snapshot reload after a block change failed");
    }
}

/// A posted block, validated.
fn parse(body: &[u8]) -> Result<BlockRow, Reply> {
    let req: BlockRequest = serde_json::from_slice(body).map_err(|e| invalid(&e.to_string()))?;
    let value = req.value.trim().to_string();
    // PostgreSQL text cannot hold NUL; no control character belongs in either field.
    if let Some(detail) = text_problem("value", &value, MAX_VALUE)
        .or_else(|| text_problem("reason", req.reason.as_deref().unwrap_or(""), MAX_REASON))
    {
        return Err(invalid(&detail));
    }
    let mut value = value;
    match req.scope.as_str() {
        "ip" => match parse_net(&value) {
            None => return Err(invalid("value must be an address or CIDR")),
            Some(net) => {
                if let Some(problem) = crate::blocklist::net_problem(&value, req.force) {
                    return Err(invalid(&format!("value {problem}")));
                }
                // What is blocked is the network: list it so (`force` with host bits).
                if value.contains('/') {
                    value = net.to_string();
                }
            }
        },
        "key" | "tenant" if !value.is_empty() => {}
        "key" | "tenant" => return Err(invalid("value must not be empty")),
        _ => return Err(invalid("scope must be ip, key or tenant")),
    }
    let expires_at_ms = match req.expires_at.as_deref().map(crate::config::rfc3339_ms) {
        Some(Some(ms)) => Some(ms as i64),
        Some(None) => {
            return Err(invalid(
                "expires_at must be RFC 3339, e.g. 2026-12-31T00:00:00Z",
            ))
        }
        None => None,
    };
    Ok(BlockRow {
        id: 0,
        scope: req.scope,
        value,
        reason: req.reason,
        expires_at_ms,
    })
}

/// Why a block field cannot be stored: control or bidirectional formatting characters,
/// or too long.
fn text_problem(field: &str, s: &str, max: usize) -> Option<String> {
    if let Some(problem) = crate::blocklist::text_problem(s) {
        return Some(format!("{field} {problem}"));
    }
    (s.len() > max).then(|| format!("{field} is longer than {max} bytes"))
}

fn ban_json(b: &crate::bans::Ban) -> serde_json::Value {
    serde_json::json!({
        "id": b.id(),
        "scope": b.scope.as_str(),
        "value": b.value,
        "reason": b.reason,
        "expires_at": crate::config::format_rfc3339(b.expires_at_ms),
        "automatic": true,
    })
}

fn block_json(b: &BlockRow) -> serde_json::Value {
    serde_json::json!({
        "id": b.id,
        "scope": b.scope,
        "value": b.value,
        "reason": b.reason,
        "expires_at": b.expires_at_ms.and_then(|ms| u64::try_from(ms).ok()).map(crate::config::format_rfc3339),
        "automatic": false,
    })
}
