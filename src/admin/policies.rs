//! `/v1/policies`: the `rate_limit_policies` rows (the seed's columns: id, name,
//! `req_per_second` .. `req_per_month`, `burst_multiplier`, `algorithm`). `PUT
//! /v1/policies/{id}` writes a row whole (201 when new, 200 when replaced) in one
//! statement; the `rate_limit_policies` NOTIFY trigger makes every gateway reload it
//! (`sync`), this one at once. A row the gateways would refuse when they read it (a
//! limit below the costliest route's `cost`, ...) is refused with 400 and its field
//! before anything is written (`snapshot::row_tier`, what the snapshot validates with).

use http::Method;
use pingora::protocols::http::ServerSession;

use super::dbapi::{self, Failure};
use super::{json_reply, read_body};
use crate::admission::Core;
use crate::config::{burst_multiplier, parse_algorithm, MAX_LIMIT};
use crate::db::policies::{self, PolicyRow};
use crate::reload::snapshot::{self, Database};
use crate::reply::{error_reply, Reply};

/// The limit columns, in `PolicyRow::limits` order.
const LIMITS: [&str; 5] = [
    "req_per_second",
    "req_per_minute",
    "req_per_hour",
    "req_per_day",
    "req_per_month",
];

/// Routes a `/v1/policies` request (the caller checked the admin token).
pub(super) async fn handle(
    core: &Core,
    db: &Database,
    session: &mut ServerSession,
    method: &Method,
    path: &str,
) -> Reply {
    let collection = path == "/v1/policies";
    match (method, dbapi::path_id(path, "/v1/policies").as_deref()) {
        (&Method::GET, None) if collection => dbapi::reply(list(db).await, |p| {
            json_reply(200, &serde_json::json!({ "policies": p }))
        }),
        (&Method::GET, Some(id)) => dbapi::reply(get(db, id).await, |p| json_reply(200, &p)),
        (&Method::PUT, Some(id)) => match read_body(core, session).await {
            Ok(body) => dbapi::reply(put(core, db, id, &body).await, |(created, p)| {
                json_reply(if created { 201 } else { 200 }, &p)
            }),
            Err(reply) => reply,
        },
        (_, None) if collection => error_reply(405, "method_not_allowed"),
        (_, Some(_)) => error_reply(405, "method_not_allowed"),
        _ => error_reply(404, "not_found"),
    }
}

async fn list(db: &Database) -> Result<Vec<serde_json::Value>, Failure> {
    let pool = dbapi::pool(db)?;
    let rows = dbapi::within(policies::all(&pool)).await?;
    Ok(rows.iter().map(policy_json).collect())
}

async fn get(db: &Database, id: &str) -> Result<serde_json::Value, Failure> {
    let pool = dbapi::pool(db)?;
    let row = dbapi::within(policies::get(&pool, id)).await?;
    row.as_ref().map(policy_json).ok_or(Failure::NotFound)
}

async fn put(
    core: &Core,
    db: &Database,
    id: &str,
    body: &[u8],
) -> Result<(bool, serde_json::Value), Failure> {
    dbapi::id("id", id)?;
    let row = parse(id, body)?;
    // Refused here exactly as every gateway's snapshot would refuse the row.
    snapshot::row_tier(&core.runtime().config, &row)
        .map_err(|e| Failure::Field(column(e.field()), e.to_string()))?;
    let pool = dbapi::pool(db)?;
    let created = dbapi::within(policies::put(&pool, &row)).await?;
    dbapi::refresh(core, &pool).await;
    Ok((created, policy_json(&row)))
}

/// A policy body, validated: every limit column (0: no such window) and
/// `burst_multiplier` required; `name` defaults to the id, `algorithm` to none (each
/// window's default).
fn parse(id: &str, body: &[u8]) -> Result<PolicyRow, Failure> {
    let mut allowed = vec!["name", "burst_multiplier", "algorithm"];
    allowed.extend(LIMITS);
    let map = dbapi::object(body, &allowed)?;
    let name = dbapi::string(&map, "name", false)?.unwrap_or_else(|| id.to_string());
    let mut limits = [None; 5];
    for (slot, field) in limits.iter_mut().zip(LIMITS) {
        let v = map.get(field).and_then(serde_json::Value::as_u64);
        match v {
            Some(n) if n <= MAX_LIMIT => *slot = Some(n as i64),
            _ => {
                return Err(Failure::Field(
                    field,
                    format!("{field} must be an integer from 0 (no such window) to {MAX_LIMIT}"),
                ))
            }
        }
    }
    let burst = map
        .get("burst_multiplier")
        .and_then(serde_json::Value::as_f64)
        .and_then(|b| burst_multiplier(b).ok())
        .ok_or_else(|| {
            Failure::Field(
                "burst_multiplier",
                "burst_multiplier must be a number from 1.0 to 1000.0".into(),
            )
        })?;
    let algorithm = dbapi::string(&map, "algorithm", false)?;
    if let Some(a) = &algorithm {
        parse_algorithm("algorithm", a).map_err(|e| Failure::Field("algorithm", e.to_string()))?;
    }
    Ok(PolicyRow {
        id: id.to_string(),
        name,
        limits,
        burst_multiplier: Some(burst),
        algorithm,
    })
}

/// The body field `field` names (a column; `body` for none).
fn column(field: &str) -> &'static str {
    LIMITS
        .into_iter()
        .chain(["burst_multiplier", "algorithm"])
        .find(|f| *f == field)
        .unwrap_or("body")
}

fn policy_json(p: &PolicyRow) -> serde_json::Value {
    let mut v = serde_json::json!({
        "id": p.id,
        "name": p.name,
        "burst_multiplier": p.burst_multiplier.unwrap_or(1.0),
        "algorithm": p.algorithm,
    });
    for (field, limit) in LIMITS.iter().zip(p.limits) {
        v[*field] = serde_json::json!(limit.unwrap_or(0));
    }
    v
}
