//! `/healthz`, `/readyz` and `/metrics`.

use super::json_reply;
use crate::admission::snapshot::Database;
use crate::admission::Core;
use crate::reply::Reply;

/// `200 {"status":"ok"}` while the process answers.
pub(super) fn healthz() -> Reply {
    json_reply(200, &serde_json::json!({"status": "ok"}))
}

/// Ready with the store's and the database's health; `degraded` when either is down.
pub(super) fn readyz(core: &Core, db: &Database) -> Reply {
    let rt = core.runtime();
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

/// The Prometheus text exposition.
pub(super) fn metrics(core: &Core) -> Reply {
    Reply {
        status: 200,
        headers: Vec::new(),
        body: core.metrics.render().into(),
    }
}
