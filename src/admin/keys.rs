//! `/v1/keys`: list (never the key or its hash), create (the raw key in the 201 only,
//! once; the tenant created with the key's tier if new, as `throttle keys create` does)
//! and revoke. Through `db::keys`, the functions the CLI uses; a created or revoked key
//! reaches this gateway at once and the others through the `api_keys` NOTIFY trigger.

use http::Method;
use pingora::protocols::http::ServerSession;

use super::dbapi::{self, Failure};
use super::{json_reply, read_body};
use crate::admission::Core;
use crate::db::keys::KeyRow;
use crate::reload::snapshot::Database;
use crate::reply::{error_reply, Reply};

/// Routes a `/v1/keys` request (the caller checked the admin token).
pub(super) async fn handle(
    core: &Core,
    db: &Database,
    session: &mut ServerSession,
    method: &Method,
    path: &str,
) -> Reply {
    match (method, dbapi::path_id(path, "/v1/keys").as_deref()) {
        (&Method::GET, None) if path == "/v1/keys" => dbapi::reply(list(db).await, |keys| {
            json_reply(200, &serde_json::json!({ "keys": keys }))
        }),
        (&Method::POST, None) if path == "/v1/keys" => match read_body(core, session).await {
            Ok(body) => dbapi::reply(create(core, db, &body).await, |v| json_reply(201, &v)),
            Err(reply) => reply,
        },
        (&Method::DELETE, Some(id)) => {
            dbapi::reply(revoke(core, db, id).await, |()| dbapi::no_content())
        }
        (_, None) if path == "/v1/keys" => error_reply(405, "method_not_allowed"),
        (_, Some(_)) => error_reply(405, "method_not_allowed"),
        _ => error_reply(404, "not_found"),
    }
}

async fn list(db: &Database) -> Result<Vec<serde_json::Value>, Failure> {
    let pool = dbapi::pool(db)?;
    let rows = dbapi::within(crate::db::keys::list(&pool)).await?;
    Ok(rows.iter().map(key_json).collect())
}

async fn create(core: &Core, db: &Database, body: &[u8]) -> Result<serde_json::Value, Failure> {
    let map = dbapi::object(body, &["tenant", "tier"])?;
    let tenant = dbapi::string(&map, "tenant", true)?.unwrap_or_default();
    dbapi::id("tenant", &tenant)?;
    let tier = dbapi::string(&map, "tier", true)?.unwrap_or_default();
    let pool = dbapi::pool(db)?;
    dbapi::known_tier(core, &pool, &tier).await?;
    let key = dbapi::within(crate::db::keys::create(&pool, &tenant, &tier)).await?;
    dbapi::refresh(core, &pool).await;
    Ok(serde_json::json!({"id": key.id, "key": key.key, "tenant": tenant, "tier": tier}))
}

async fn revoke(core: &Core, db: &Database, id: &str) -> Result<(), Failure> {
    let pool = dbapi::pool(db)?;
    // `DbError::Invalid` (no live key with that id) arrives as `NotFound`.
    dbapi::within(crate::db::keys::revoke(&pool, id)).await?;
    dbapi::refresh(core, &pool).await;
    Ok(())
}

fn key_json(k: &KeyRow) -> serde_json::Value {
    serde_json::json!({
        "id": k.id,
        "tenant": k.tenant,
        "tier": k.tier,
        "prefix": k.prefix,
        "created_at": k.created_at,
        "revoked_at": k.revoked_at,
    })
}
