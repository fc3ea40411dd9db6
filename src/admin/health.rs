//! `/healthz`, `/readyz` and `/metrics`.

use super::json_reply;
use crate::admission::Core;
use crate::reload::snapshot::Database;
use crate::reply::Reply;

/// `200 {"status":"ok"}` while the process answers.
pub(super) fn healthz() -> Reply {
    json_reply(200, &serde_json::json!({"status": "ok"}))
}

/// Ready with the store's and the database's health; `degraded` when either is down.
/// Not ready (503 `{"ready":false,"waiting":[...]}`, `Retry-After: 1`) until what
/// requests need has loaded once: the first database snapshot (keys, tenants, blocks,
/// policies) and, with `jwks_url`, the first key set.
pub(super) fn readyz(core: &Core, db: &Database) -> Reply {
    let rt = core.runtime();
    let waiting = waiting_for(core);
    if !waiting.is_empty() {
        let body = serde_json::json!({"ready": false, "waiting": waiting});
        let mut reply = json_reply(503, &body);
        reply.headers = vec![crate::reply::headers::retry_soon()];
        return reply;
    }
    let store_ok = core.store.healthy();
    let db_ok = !db.configured() || db.healthy();
    let body = serde_json::json!({
        "ready": true,
        "degraded": !store_ok || !db_ok,
        "instance_id": rt.config.server.instance_id,
        "store": { "backend": core.store.name(), "healthy": store_ok, "instances": core.store.instances() },
        "database": { "configured": db.configured(), "healthy": db_ok },
    });
    json_reply(200, &body)
}

/// What the gateway still waits for before it is ready: `database` (the first snapshot),
/// `jwks` (the first `jwks_url` key set).
fn waiting_for(core: &Core) -> Vec<&'static str> {
    let mut waiting = Vec::new();
    if core.dynamic().awaiting {
        waiting.push("database");
    }
    if core.jwt().is_some_and(|j| j.awaiting_keys()) {
        waiting.push("jwks");
    }
    waiting
}

/// The Prometheus text exposition.
pub(super) fn metrics(core: &Core) -> Reply {
    Reply {
        status: 200,
        headers: Vec::new(),
        body: core.metrics.render().into(),
    }
}
