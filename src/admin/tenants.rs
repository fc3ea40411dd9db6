//! `/v1/tenants`: the `tenants` table (id, name, tier, calendar_tz, billing_anchor_day,
//! created_at). `POST` creates (409 when the id exists), `PUT /v1/tenants/{id}` replaces
//! name, tier and the tenant's own calendar (absent: NULL, the tier's; 404 when missing),
//! `DELETE` removes a tenant and its revoked keys (409 while it has a live key). Every write is one
//! statement or transaction; the `tenants` NOTIFY trigger tells the other gateways.

use http::Method;
use pingora::protocols::http::ServerSession;

use super::dbapi::{self, Failure};
use super::{json_reply, read_body};
use crate::admission::Core;
use crate::db::tenants::{self, TenantFields, TenantRow, Written};
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
    let map = dbapi::object(
        body,
        &["id", "name", "tier", "calendar_tz", "billing_anchor_day"],
    )?;
    let id = dbapi::string(&map, "id", true)?.unwrap_or_default();
    dbapi::id("id", &id)?;
    let tier = dbapi::string(&map, "tier", true)?.unwrap_or_default();
    let name = dbapi::string(&map, "name", false)?.unwrap_or_else(|| id.clone());
    let (zone, anchor) = calendar(&map)?;
    let pool = dbapi::pool(db)?;
    dbapi::known_tier(core, &pool, &tier).await?;
    let fields = TenantFields {
        name: &name,
        tier: &tier,
        calendar_tz: zone.as_deref(),
        billing_anchor_day: anchor,
    };
    let written = dbapi::within(tenants::create(&pool, &id, fields)).await?;
    settle(core, &pool, written, &id).await
}

async fn update(core: &Core, db: &Database, id: &str, body: &[u8]) -> Result<TenantRow, Failure> {
    let map = dbapi::object(body, &["name", "tier", "calendar_tz", "billing_anchor_day"])?;
    let tier = dbapi::string(&map, "tier", true)?.unwrap_or_default();
    let name = dbapi::string(&map, "name", false)?.unwrap_or_else(|| id.to_string());
    let (zone, anchor) = calendar(&map)?;
    let pool = dbapi::pool(db)?;
    dbapi::known_tier(core, &pool, &tier).await?;
    let fields = TenantFields {
        name: &name,
        tier: &tier,
        calendar_tz: zone.as_deref(),
        billing_anchor_day: anchor,
    };
    let written = dbapi::within(tenants::update(&pool, id, fields)).await?;
    settle(core, &pool, written, id).await
}

/// `calendar_tz` (an IANA zone of the gateway's bundled database) and
/// `billing_anchor_day` (1..=28), each optional (absent or null: the tier's); 400 naming
/// the field otherwise.
fn calendar(
    map: &serde_json::Map<String, serde_json::Value>,
) -> Result<(Option<String>, Option<i16>), Failure> {
    let zone = dbapi::string(map, "calendar_tz", false)?;
    if let Some(z) = &zone {
        if let Err(e) = crate::limiter::algorithm::Calendar::interned(z, 1) {
            return Err(Failure::Field("calendar_tz", e.to_string()));
        }
    }
    let anchor = match map.get("billing_anchor_day") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => match v.as_i64().and_then(|d| i16::try_from(d).ok()) {
            Some(d @ 1..=28) => Some(d),
            _ => {
                let msg = format!("billing_anchor_day must be a whole number from 1 to 28 (every month has these days), got {v}");
                return Err(Failure::Field("billing_anchor_day", msg));
            }
        },
    };
    Ok((zone, anchor))
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
