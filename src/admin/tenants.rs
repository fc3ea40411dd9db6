//! `/v1/tenants`: the `tenants` table (id, name, tier, created_at). `POST` creates (409
//! when the id exists), `PUT /v1/tenants/{id}` replaces name and tier (404 when missing),
//! `DELETE` removes a tenant and its revoked keys (409 while it has a live key). Every write is one
//! statement or transaction; the `tenants` NOTIFY trigger tells the other gateways.

use http::Method;
use pingora::protocols::http::ServerSession;

use super::dbapi::{self, Failure};
use super::{json_reply, read_body};
use crate::admission::Core;
use crate::db::tenants::{self, TenantRow, Written};
use crate::reload::snapshot::Database;
use crate::reply::{error_reply, Reply};

/// Routes a `/v1/tenants` request (the caller checked the admin token).
pub(super) async fn handle(
    core: &Core,
    db: &Database,
    session: &mut ServerSession,
    method: &Method,
    path: &str,
) -> Reply {
    let collection = path == "/v1/tenants";
    match (method, dbapi::path_id(path, "/v1/tenants").as_deref()) {
        (&Method::GET, None) if collection => dbapi::reply(list(db).await, |t| {
            json_reply(200, &serde_json::json!({ "tenants": t }))
        }),
        (&Method::POST, None) if collection => match read_body(core, session).await {
            Ok(body) => dbapi::reply(create(core, db, &body).await, |t| json_reply(201, &t)),
            Err(reply) => reply,
        },
        (&Method::GET, Some(id)) => dbapi::reply(get(db, id).await, |t| json_reply(200, &t)),
        (&Method::PUT, Some(id)) => match read_body(core, session).await {
            Ok(body) => dbapi::reply(update(core, db, id, &body).await, |t| json_reply(200, &t)),
            Err(reply) => reply,
        },
        (&Method::DELETE, Some(id)) => {
            dbapi::reply(delete(core, db, id).await, |()| dbapi::no_content())
        }
        (_, None) if collection => error_reply(405, "method_not_allowed"),
        (_, Some(_)) => error_reply(405, "method_not_allowed"),
        _ => error_reply(404, "not_found"),
    }
}

async fn list(db: &Database) -> Result<Vec<TenantRow>, Failure> {
    let pool = dbapi::pool(db)?;
    dbapi::within(tenants::list(&pool)).await
}

async fn get(db: &Database, id: &str) -> Result<TenantRow, Failure> {
    let pool = dbapi::pool(db)?;
    dbapi::within(tenants::get(&pool, id))
        .await?
        .ok_or(Failure::NotFound)
}

async fn create(core: &Core, db: &Database, body: &[u8]) -> Result<TenantRow, Failure> {
    let map = dbapi::object(body, &["id", "name", "tier"])?;
    let id = dbapi::string(&map, "id", true)?.unwrap_or_default();
    dbapi::id("id", &id)?;
    let tier = dbapi::string(&map, "tier", true)?.unwrap_or_default();
    let name = dbapi::string(&map, "name", false)?.unwrap_or_else(|| id.clone());
    let pool = dbapi::pool(db)?;
    dbapi::known_tier(core, &pool, &tier).await?;
    let written = dbapi::within(tenants::create(&pool, &id, &name, &tier)).await?;
    settle(core, &pool, written, &id).await
}

async fn update(core: &Core, db: &Database, id: &str, body: &[u8]) -> Result<TenantRow, Failure> {
    let map = dbapi::object(body, &["name", "tier"])?;
    let tier = dbapi::string(&map, "tier", true)?.unwrap_or_default();
    let name = dbapi::string(&map, "name", false)?.unwrap_or_else(|| id.to_string());
    let pool = dbapi::pool(db)?;
    dbapi::known_tier(core, &pool, &tier).await?;
    let written = dbapi::within(tenants::update(&pool, id, &name, &tier)).await?;
    settle(core, &pool, written, id).await
}

async fn delete(core: &Core, db: &Database, id: &str) -> Result<(), Failure> {
    let pool = dbapi::pool(db)?;
    let written = dbapi::within(tenants::delete(&pool, id)).await?;
    settle(core, &pool, written, id).await.map(drop)
}

/// The stored row (this gateway refreshed), or the failure a write came back with.
async fn settle(
    core: &Core,
    pool: &sqlx::PgPool,
    written: Written,
    id: &str,
) -> Result<TenantRow, Failure> {
    match written {
        Written::Row(row) => {
            dbapi::refresh(core, pool).await;
            Ok(row)
        }
        Written::Missing => Err(Failure::NotFound),
        Written::Conflict => Err(Failure::Conflict(format!(
            "tenant {id:?} exists (POST) or still has a live key (DELETE)"
        ))),
    }
}
