//! The PostgreSQL-backed admin API: `/v1/keys`, `/v1/tenants`, `/v1/policies`, against
//! the real gateway and a fresh database per test.

use std::time::Duration;

use serde_json::{json, Value};

use crate::db::{config, connected, limit_header, status};
use crate::support::postgres::TestDb;
use crate::support::{client, eventually, Gateway, Upstream, ADMIN_TOKEN};

/// `method path` with the admin token and an optional JSON body: (status, body).
async fn call(gw: &Gateway, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    call_as(gw, Some(ADMIN_TOKEN), method, path, body).await
}

async fn call_as(
    gw: &Gateway,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = client().request(method.parse().unwrap(), gw.admin_url(path));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A raw body (not JSON) posted with the admin token.
async fn post_raw(gw: &Gateway, path: &str, body: &str) -> (u16, Value) {
    let r = client()
        .post(gw.admin_url(path))
        .bearer_auth(ADMIN_TOKEN)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn assert_field(got: (u16, Value), field: &str) {
    assert_eq!(got.0, 400, "{:?}", got.1);
    assert_eq!(got.1["error"], "invalid_request", "{:?}", got.1);
    assert_eq!(got.1["field"], field, "{:?}", got.1);
}

/// A key created through the API is honoured by this gateway at once and by another on
/// the same database through NOTIFY; the list never shows the key or its hash; a revoked
/// key is refused by both; a second revoke is 404.
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_keys_created_and_revoked_reach_every_gateway() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw1 = connected(&db.url, &up).await;
    let gw2 = connected(&db.url, &up).await;
    let (s, created) = call(
        &gw1,
        "POST",
        "/v1/keys",
        Some(json!({"tenant": "newco", "tier": "free"})),
    )
    .await;
    assert_eq!(s, 201, "{created}");
    let (id, key) = (
        created["id"].as_str().unwrap().to_string(),
        created["key"].as_str().unwrap().to_string(),
    );
    assert_eq!(
        (created["tenant"].as_str(), created["tier"].as_str()),
        (Some("newco"), Some("free"))
    );
    assert_eq!(status(&gw1, &key).await, 200);
    eventually(Duration::from_secs(2), "key on gw2", || async {
        (status(&gw2, &key).await == 200).then_some(())
    })
    .await;
    let r = client()
        .get(gw1.admin_url("/v1/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(!text.contains(&key) && !text.contains("sha256"), "{text}");
    let listed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(listed["keys"][0]["id"], id.as_str());
    assert!(listed["keys"][0].get("key").is_none());
    let (s, tenant) = call(&gw1, "GET", "/v1/tenants/newco", None).await;
    assert_eq!((s, tenant["tier"].as_str()), (200, Some("free")));

    assert_eq!(
        call(&gw1, "DELETE", &format!("/v1/keys/{id}"), None)
            .await
            .0,
        204
    );
    assert_eq!(status(&gw1, &key).await, 401);
    eventually(Duration::from_secs(2), "revocation on gw2", || async {
        (status(&gw2, &key).await == 401).then_some(())
    })
    .await;
    assert_eq!(
        call(&gw1, "DELETE", &format!("/v1/keys/{id}"), None)
            .await
            .0,
        404
    );
    assert_eq!(call(&gw1, "DELETE", "/v1/keys/key_nope", None).await.0, 404);
}

/// Bad key requests answer 400 naming the field and write nothing (no key, no tenant).
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_bad_key_requests_name_the_field_and_write_nothing() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    let post = |b: Value| call(&gw, "POST", "/v1/keys", Some(b));
    assert_field(
        post(json!({"tenant": "ghost", "tier": "nope"})).await,
        "tier",
    );
    assert_field(post(json!({"tier": "free"})).await, "tenant");
    assert_field(post(json!({"tenant": "ghost"})).await, "tier");
    assert_field(post(json!({"tenant": 5, "tier": "free"})).await, "tenant");
    assert_field(post(json!({"tenant": "", "tier": "free"})).await, "tenant");
    assert_field(
        post(json!({"tenant": "a\u{0}b", "tier": "free"})).await,
        "tenant",
    );
    assert_field(
        post(json!({"tenant": "ghost", "tier": "free", "x": 1})).await,
        "body",
    );
    assert_field(post(json!(["ghost"])).await, "body");
    assert_field(post_raw(&gw, "/v1/keys", "{not json").await, "body");
    assert_eq!(
        call(&gw, "GET", "/v1/keys", None).await.1,
        json!({"keys": []})
    );
    assert_eq!(call(&gw, "GET", "/v1/tenants/ghost", None).await.0, 404);
    assert_eq!(call(&gw, "PUT", "/v1/keys", None).await.0, 405);
}

/// Tenants: create (409 on a taken id), read, list, replace (404 when missing), delete
/// (409 while it has keys); bad input names the field.
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_tenants_crud() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    let (s, t) = call(
        &gw,
        "POST",
        "/v1/tenants",
        Some(json!({"id": "t1", "tier": "free"})),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    assert_eq!(
        (t["id"].as_str(), t["name"].as_str(), t["tier"].as_str()),
        (Some("t1"), Some("t1"), Some("free"))
    );
    assert!(t["created_at"].as_str().unwrap().ends_with('Z'));
    let again = call(
        &gw,
        "POST",
        "/v1/tenants",
        Some(json!({"id": "t1", "tier": "free"})),
    )
    .await;
    assert_eq!(
        (again.0, again.1["error"].as_str()),
        (409, Some("conflict"))
    );
    assert_field(
        call(
            &gw,
            "POST",
            "/v1/tenants",
            Some(json!({"id": "t2", "tier": "gold"})),
        )
        .await,
        "tier",
    );
    assert_field(
        call(&gw, "POST", "/v1/tenants", Some(json!({"tier": "free"}))).await,
        "id",
    );
    assert_field(
        call(
            &gw,
            "POST",
            "/v1/tenants",
            Some(json!({"id": "t2", "tier": "free", "name": 3})),
        )
        .await,
        "name",
    );
    let (s, t) = call(
        &gw,
        "PUT",
        "/v1/tenants/t1",
        Some(json!({"name": "T One", "tier": "tight"})),
    )
    .await;
    assert_eq!(
        (s, t["name"].as_str(), t["tier"].as_str()),
        (200, Some("T One"), Some("tight"))
    );
    assert_eq!(
        call(
            &gw,
            "PUT",
            "/v1/tenants/none",
            Some(json!({"tier": "free"}))
        )
        .await
        .0,
        404
    );
    assert_field(
        call(&gw, "PUT", "/v1/tenants/t1", Some(json!({"tier": "gold"}))).await,
        "tier",
    );
    assert_eq!(
        call(&gw, "GET", "/v1/tenants/t1", None).await.1["tier"],
        "tight"
    );
    let (s, list) = call(&gw, "GET", "/v1/tenants", None).await;
    assert_eq!((s, list["tenants"].as_array().unwrap().len()), (200, 1));
    let (s, key) = call(
        &gw,
        "POST",
        "/v1/keys",
        Some(json!({"tenant": "t1", "tier": "free"})),
    )
    .await;
    assert_eq!(s, 201);
    assert_eq!(call(&gw, "DELETE", "/v1/tenants/t1", None).await.0, 409);
    // A revoked key does not keep its tenant: the tenant goes, and the key with it.
    let key_path = format!("/v1/keys/{}", key["id"].as_str().unwrap());
    assert_eq!(call(&gw, "DELETE", &key_path, None).await.0, 204);
    assert_eq!(call(&gw, "DELETE", "/v1/tenants/t1", None).await.0, 204);
    assert_eq!(call(&gw, "GET", "/v1/tenants/t1", None).await.0, 404);
    assert_eq!(
        call(
            &gw,
            "POST",
            "/v1/tenants",
            Some(json!({"id": "t2", "tier": "free"}))
        )
        .await
        .0,
        201
    );
    assert_eq!(call(&gw, "DELETE", "/v1/tenants/t2", None).await.0, 204);
    assert_eq!(call(&gw, "GET", "/v1/tenants/t2", None).await.0, 404);
    assert_eq!(call(&gw, "DELETE", "/v1/tenants/t2", None).await.0, 404);
}

/// Policies: the config's tiers are rows; a PUT reaches another gateway through NOTIFY
/// (its X-RateLimit-Limit changes); a new id is created (201); bad input names the field.
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_policies_put_reaches_every_gateway() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw1 = connected(&db.url, &up).await;
    let gw2 = connected(&db.url, &up).await;
    let (s, list) = call(&gw1, "GET", "/v1/policies", None).await;
    assert_eq!(s, 200);
    let ids: Vec<&str> = list["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"free") && ids.contains(&"tight"), "{ids:?}");
    let (s, free) = call(&gw1, "GET", "/v1/policies/free", None).await;
    assert_eq!((s, free["req_per_minute"].as_i64()), (200, Some(100)));
    let (_, created) = call(
        &gw1,
        "POST",
        "/v1/keys",
        Some(json!({"tenant": "p", "tier": "free"})),
    )
    .await;
    let key = created["key"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(2), "key on gw2", || async {
        (limit_header(&gw2, &key).await == "100").then_some(())
    })
    .await;
    let body = json!({"name": "Free", "req_per_second": 0, "req_per_minute": 40, "req_per_hour": 0,
                      "req_per_day": 0, "req_per_month": 0, "burst_multiplier": 1.0, "algorithm": null});
    let (s, put) = call(&gw1, "PUT", "/v1/policies/free", Some(body.clone())).await;
    assert_eq!(
        (s, put["req_per_minute"].as_i64(), put["name"].as_str()),
        (200, Some(40), Some("Free"))
    );
    eventually(Duration::from_secs(2), "policy on gw2", || async {
        (limit_header(&gw2, &key).await == "40").then_some(())
    })
    .await;
    assert_eq!(call(&gw1, "GET", "/v1/policies/free", None).await.1, put);
    assert_eq!(
        call(&gw1, "PUT", "/v1/policies/gold", Some(body.clone()))
            .await
            .0,
        201
    );
    assert_eq!(call(&gw1, "GET", "/v1/policies/none", None).await.0, 404);
    let with = |field: &str, v: Value| {
        let mut b = body.clone();
        b[field] = v;
        b
    };
    for (field, v) in [
        ("burst_multiplier", json!(0.5)),
        ("req_per_minute", json!(-1)),
        ("req_per_hour", json!("10")),
        ("algorithm", json!("bogus")),
    ] {
        assert_field(
            call(&gw1, "PUT", "/v1/policies/free", Some(with(field, v))).await,
            field,
        );
    }
    let mut missing = body.clone();
    missing.as_object_mut().unwrap().remove("req_per_day");
    assert_field(
        call(&gw1, "PUT", "/v1/policies/free", Some(missing)).await,
        "req_per_day",
    );
    assert_eq!(call(&gw1, "GET", "/v1/policies/free", None).await.1, put);
    assert_eq!(call(&gw1, "DELETE", "/v1/policies/free", None).await.0, 405);
}

/// Without a database the endpoints answer 503 database_unavailable; without the admin
/// token (or with a wrong one) 401 first.
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_needs_a_database_and_the_token() {
    let up = Upstream::start("u").await;
    let body = config("postgres://unused/none")
        .replace("[database]\nurl = \"postgres://unused/none\"\n", "");
    let gw = Gateway::start(&body, Some(&up)).await;
    for (method, path) in [
        ("GET", "/v1/keys"),
        ("POST", "/v1/keys"),
        ("DELETE", "/v1/keys/k"),
        ("GET", "/v1/tenants"),
        ("POST", "/v1/tenants"),
        ("GET", "/v1/tenants/t"),
        ("PUT", "/v1/tenants/t"),
        ("DELETE", "/v1/tenants/t"),
        ("GET", "/v1/policies"),
        ("GET", "/v1/policies/p"),
        ("PUT", "/v1/policies/p"),
    ] {
        assert_eq!(
            call_as(&gw, None, method, path, None).await.0,
            401,
            "{method} {path}"
        );
        assert_eq!(
            call_as(&gw, Some("wrong"), method, path, None).await.0,
            401,
            "{method} {path}"
        );
        let valid = match path {
            "/v1/keys" => Some(json!({"tenant": "t", "tier": "free"})),
            "/v1/tenants" => Some(json!({"id": "t", "tier": "free"})),
            "/v1/tenants/t" => Some(json!({"tier": "free"})),
            _ => Some(
                json!({"req_per_second": 1, "req_per_minute": 1, "req_per_hour": 1,
                             "req_per_day": 1, "req_per_month": 1, "burst_multiplier": 1.0}),
            ),
        };
        let body = (method == "POST" || method == "PUT")
            .then_some(valid)
            .flatten();
        let (s, b) = call(&gw, method, path, body).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (503, Some("database_unavailable")),
            "{method} {path}"
        );
    }
}

/// Every route of `throttle::admin::ROUTES` (which the unit test holds to openapi.json)
/// is served by the live admin listener, and `GET /v1/openapi.json` is the checked-in
/// document.
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_serves_every_documented_route() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(
        &config("x").replace("[database]\nurl = \"x\"\n", ""),
        Some(&up),
    )
    .await;
    for (method, path) in throttle::admin::ROUTES {
        let concrete = path.replace("{id}", "1");
        let body = (*method == "POST" || *method == "PUT").then(|| json!({}));
        let (s, b) = call(&gw, method, &concrete, body).await;
        assert_ne!(s, 405, "{method} {path}: {b}");
        if !path.contains("{id}") {
            assert_ne!(s, 404, "{method} {path}: {b}");
        }
    }
    let (s, doc) = call(&gw, "GET", "/v1/openapi.json", None).await;
    assert_eq!(s, 200);
    let file: Value = serde_json::from_str(include_str!("../../src/admin/openapi.json")).unwrap();
    assert_eq!(doc, file);
    assert_eq!(call(&gw, "PATCH", "/v1/keys", None).await.0, 405);
    assert_eq!(call(&gw, "GET", "/v1/nope", None).await.0, 404);
}

/// Ids are addressable again: `/` and whitespace around an id are 400 naming the field;
/// path ids are percent-decoded; a JSON field given twice is 400 (nothing written).
#[tokio::test(flavor = "multi_thread")]
async fn admin_ids_are_addressable_and_fields_unique() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    for id in ["a/b", " acme", "acme ", "/"] {
        let got = call(
            &gw,
            "POST",
            "/v1/tenants",
            Some(json!({"id": id, "tier": "free"})),
        )
        .await;
        assert_field(got, "id");
    }
    assert_field(
        call(
            &gw,
            "POST",
            "/v1/keys",
            Some(json!({"tenant": "x/y", "tier": "free"})),
        )
        .await,
        "tenant",
    );
    assert_field(
        call(
            &gw,
            "PUT",
            "/v1/policies/%20p",
            Some(json!({"per_second": 1})),
        )
        .await,
        "id",
    );
    let (s, _) = call(
        &gw,
        "POST",
        "/v1/tenants",
        Some(json!({"id": "acme co", "tier": "free"})),
    )
    .await;
    assert_eq!(s, 201);
    let (s, got) = call(&gw, "GET", "/v1/tenants/acme%20co", None).await;
    assert_eq!((s, got["id"].as_str()), (200, Some("acme co")));
    let (s, body) = post_raw(
        &gw,
        "/v1/tenants",
        r#"{"id":"dup","tier":"free","tier":"tight"}"#,
    )
    .await;
    assert_eq!(s, 400, "{body}");
    assert!(
        body["detail"].as_str().unwrap_or("").contains("twice"),
        "{body}"
    );
    assert_eq!(call(&gw, "GET", "/v1/tenants/dup", None).await.0, 404);
    let (s, list) = call(&gw, "GET", "/v1/tenants", None).await;
    assert_eq!((s, list["tenants"].as_array().unwrap().len()), (200, 1));
}
