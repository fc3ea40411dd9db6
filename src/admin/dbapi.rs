//! What the database-backed admin endpoints (`/v1/keys`, `/v1/tenants`, `/v1/policies`)
//! share: the pool or 503 `database_unavailable`, a deadline on every database call, 400
//! `invalid_request` naming the field, and the refresh that makes this gateway see its own
//! write at once (the others see it through the tables' NOTIFY triggers, `sync`).

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use super::json_reply;
use crate::admission::Core;
use crate::db::DbError;
use crate::reload::snapshot::{self, Database};
use crate::reply::{error_reply, Reply};

/// Longest id, name or tier accepted.
const MAX_TEXT: usize = 256;
/// How long one admin database call may take (the pool's acquire timeout is 3 s).
const DEADLINE: Duration = Duration::from_secs(5);

/// Why an admin request failed.
pub(super) enum Failure {
    /// No database configured or connected, or it failed (the detail).
    Unavailable(Option<String>),
    /// Bad input: the field and what is wrong.
    Field(&'static str, String),
    /// No such record.
    NotFound,
    /// The write conflicts with what is stored.
    Conflict(String),
}

// === impl Failure ===

impl Failure {
    /// The JSON error reply.
    pub(super) fn reply(self) -> Reply {
        match self {
            Failure::Unavailable(detail) => unavailable(detail),
            Failure::Field(field, detail) => invalid_field(field, &detail),
            Failure::NotFound => error_reply(404, "not_found"),
            Failure::Conflict(detail) => json_reply(
                409,
                &serde_json::json!({"error": "conflict", "detail": detail}),
            ),
        }
    }
}

impl From<DbError> for Failure {
    /// `DbError::Invalid` (a request the data does not allow: no live key with that id)
    /// is `NotFound`; anything else is the database failing.
    fn from(e: DbError) -> Self {
        match e {
            DbError::Invalid(_) => Failure::NotFound,
            e => Failure::Unavailable(Some(e.to_string())),
        }
    }
}

/// 503 `database_unavailable` with `Retry-After: 1`: the pool is not connected yet (at
/// start, or while the database is down) or a call failed (`detail`).
pub(super) fn unavailable(detail: Option<String>) -> Reply {
    let detail = detail.unwrap_or_else(|| "the database is not connected (yet)".to_string());
    let mut reply = json_reply(
        503,
        &serde_json::json!({"error": "database_unavailable", "detail": detail}),
    );
    reply.headers = vec![crate::reply::headers::retry_soon()];
    reply
}

/// 400 `invalid_request` naming `field`.
pub(super) fn invalid_field(field: &str, detail: &str) -> Reply {
    json_reply(
        400,
        &serde_json::json!({"error": "invalid_request", "field": field, "detail": detail}),
    )
}

/// The connected pool, else `Unavailable`.
pub(super) fn pool(db: &Database) -> Result<Arc<PgPool>, Failure> {
    db.pool().ok_or(Failure::Unavailable(None))
}

/// `call` within `DEADLINE`.
pub(super) async fn within<T>(
    call: impl Future<Output = Result<T, DbError>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(DEADLINE, call).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Failure::Unavailable(Some(format!(
            "no answer within {} s",
            DEADLINE.as_secs()
        )))),
    }
}

/// This gateway sees its own write at once; the others through NOTIFY.
pub(super) async fn refresh(core: &Core, pool: &PgPool) {
    match tokio::time::timeout(DEADLINE, snapshot::refresh(core, pool)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "snapshot reload after an admin write failed"),
        Err(_) => tracing::warn!("snapshot reload after an admin write timed out"),
    }
}

/// The JSON object of a body; every key must be one of `allowed` (else 400 naming it),
/// and no key may appear twice, at any depth (parsers disagree on which one wins).
pub(super) fn object(
    body: &[u8],
    allowed: &[&'static str],
) -> Result<serde_json::Map<String, serde_json::Value>, Failure> {
    let value = serde_json::from_slice::<Unique>(body)
        .map_err(|e| Failure::Field("body", format!("not JSON: {e}")))?
        .0;
    let serde_json::Value::Object(map) = value else {
        return Err(Failure::Field("body", "must be a JSON object".into()));
    };
    if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(Failure::Field(
            "body",
            format!("unknown field {unknown:?} (expected one of {allowed:?})"),
        ));
    }
    Ok(map)
}

/// String `field` of `map`: required, or `None` when absent or null.
pub(super) fn string(
    map: &serde_json::Map<String, serde_json::Value>,
    field: &'static str,
    required: bool,
) -> Result<Option<String>, Failure> {
    match map.get(field) {
        Some(serde_json::Value::String(s)) => text(field, s).map(|()| Some(s.clone())),
        None | Some(serde_json::Value::Null) if !required => Ok(None),
        None | Some(serde_json::Value::Null) => {
            Err(Failure::Field(field, format!("{field} is required")))
        }
        Some(_) => Err(Failure::Field(field, format!("{field} must be a string"))),
    }
}

/// Refuses an empty, too long or control-character id, name or tier.
pub(super) fn text(field: &'static str, value: &str) -> Result<(), Failure> {
    if value.trim().is_empty() {
        return Err(Failure::Field(field, format!("{field} must not be empty")));
    }
    if value.len() > MAX_TEXT {
        return Err(Failure::Field(
            field,
            format!("{field} is longer than {MAX_TEXT} bytes"),
        ));
    }
    match crate::blocklist::text_problem(value) {
        Some(problem) => Err(Failure::Field(field, format!("{field} {problem}"))),
        None => Ok(()),
    }
}

/// Refuses a tier that is neither a `[tiers.NAME]` of the config nor a
/// `rate_limit_policies` row (`db::policies::unknown_tier`, as `throttle keys create`).
pub(super) async fn known_tier(core: &Core, pool: &PgPool, tier: &str) -> Result<(), Failure> {
    text("tier", tier)?;
    let runtime = core.runtime();
    let unknown = crate::db::policies::unknown_tier(pool, &runtime.config, tier);
    match within(unknown).await? {
        None => Ok(()),
        Some(known) => Err(Failure::Field(
            "tier",
            format!("unknown tier {tier:?} (tiers of [tiers] and rate_limit_policies: {known:?})"),
        )),
    }
}

/// The `{id}` of `/v1/<collection>/{id}`, percent-decoded (`/v1/tenants/acme%20co` names
/// `acme co`), if the path has one that decodes to UTF-8.
pub(super) fn path_id<'a>(path: &'a str, collection: &str) -> Option<Cow<'a, str>> {
    let id = path.strip_prefix(collection)?.strip_prefix('/')?;
    if id.is_empty() || id.contains('/') {
        return None;
    }
    percent_encoding::percent_decode_str(id).decode_utf8().ok()
}

/// Refuses an id that could not be addressed again or reads differently from what is
/// stored: besides `text`'s rules, a `/` (a path segment is one id) and whitespace around
/// it.
pub(super) fn id(field: &'static str, value: &str) -> Result<(), Failure> {
    text(field, value)?;
    if value.contains('/') {
        return Err(Failure::Field(
            field,
            format!("{field} must not contain '/'"),
        ));
    }
    if value.trim() != value {
        return Err(Failure::Field(
            field,
            format!("{field} must not begin or end with whitespace"),
        ));
    }
    Ok(())
}

/// 204 with no body.
pub(super) fn no_content() -> Reply {
    Reply {
        status: 204,
        headers: Vec::new(),
        body: bytes::Bytes::new(),
    }
}

/// A result as a reply: `ok(value)` or the failure's.
pub(super) fn reply<T>(result: Result<T, Failure>, ok: impl FnOnce(T) -> Reply) -> Reply {
    result.map_or_else(Failure::reply, ok)
}

/// A JSON value whose objects, at every depth, name each key once: a key given twice is
/// a parse error, not the last one silently winning.
struct Unique(serde_json::Value);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Unique(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(serde_json::Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some((k, Unique(v))) = map.next_entry::<String, Unique>()? {
            if out.contains_key(&k) {
                return Err(serde::de::Error::custom(format!("field {k:?} given twice")));
            }
            out.insert(k, v);
        }
        Ok(serde_json::Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_bodies_are_checked() {
        for (id, ok) in [
            ("acme", true),
            ("acme co", true),
            ("a/b", false),
            (" acme", false),
            ("acme\t", false),
            ("", false),
        ] {
            assert_eq!(super::id("id", id).is_ok(), ok, "{id:?}");
        }
        assert_eq!(
            path_id("/v1/tenants/acme%20co", "/v1/tenants").as_deref(),
            Some("acme co")
        );
        assert_eq!(
            path_id("/v1/tenants/a%2Fb", "/v1/tenants").as_deref(),
            Some("a/b")
        );
        assert_eq!(path_id("/v1/tenants/%FF", "/v1/tenants"), None);
        assert_eq!(path_id("/v1/tenants/a/b", "/v1/tenants"), None);
        assert!(object(br#"{"id":"a","tier":"x"}"#, &["id", "tier"]).is_ok());
        for twice in [
            &br#"{"id":"a","id":"b"}"#[..],
            br#"{"id":"a","tier":{"x":1,"x":2}}"#,
            br#"{"id":"a","tier":[{"x":1,"x":2}]}"#,
        ] {
            assert!(object(twice, &["id", "tier"]).is_err(), "{twice:?}");
        }
    }
}
