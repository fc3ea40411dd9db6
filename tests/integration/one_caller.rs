//! One caller: where identities, tiers and tables meet, through the real gateway (issue
//! "One caller"). Every test here failed on the tree before the caller was built once:
//! - a table with only `concurrent` (a custom scope's, a route's `global`) was never
//!   applied (memory and Redis);
//! - a JWT subject equal to a tenant id joined that tenant (its counters and bans), and
//!   one equal to a key id shared that key's counters;
//! - one tenant was limited at two sizes: the tenants table's tier for database keys, the
//!   config's for `[[keys]]` keys;
//! - `/v1/usage` answered 404 for every JWT caller and did not percent-decode.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::jwt::{hs256, now_secs};
use crate::support::postgres::TestDb;
use crate::support::redis::{require_redis, RedisServer};
use crate::support::{client, eventually, header, Gateway, Upstream, ADMIN_TOKEN};

const SECRET: &str = "one-caller-test-secret-0123456789";

/// Sends three requests to `path` at once (the upstream answers after a second) as
/// `users`; answers their statuses, sorted, and the bodies of the 429s.
async fn three_at_once(gw: &Gateway, path: &str, users: [&str; 3]) -> (Vec<u16>, Vec<Value>) {
    let one = |user: &'static str| async move {
        let r = client()
            .get(gw.url(path))
            .header("x-user", user)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    let users = users.map(|u| -> &'static str { Box::leak(u.to_string().into_boxed_str()) });
    let (a, b, c) = tokio::join!(one(users[0]), one(users[1]), one(users[2]));
    let mut all = vec![a, b, c];
    all.sort_by_key(|(s, _)| *s);
    let refused = all
        .iter()
        .filter(|(s, _)| *s == 429)
        .map(|(_, b)| b.clone())
        .collect();
    (all.into_iter().map(|(s, _)| s).collect(), refused)
}

/// A table with `concurrent` and no rate window caps requests in flight: a custom scope's
/// `[limits.user]` and a route's `global` table, on memory and on Redis (leases on).
#[tokio::test(flavor = "multi_thread")]
async fn a_concurrent_only_table_caps_in_flight_requests() {
    require_redis();
    let redis = RedisServer::start().await;
    let up = Upstream::start("one-caller").await;
    let stores = [
        String::new(),
        format!(
            "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"oc1\"\n",
            redis.url()
        ),
    ];
    for store in &stores {
        let body = format!(
            r#"{store}
[scopes.user]
from = "header:X-User"

[limits.user]
concurrent = 1

[[routes]]
name = "capped"
path_prefix = "/capped"
upstreams = ["{{upstream}}"]
auth = "none"
limits = {{ global = {{ concurrent = 1 }} }}

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]
auth = "none"
"#
        );
        let gw = Gateway::start(&body, Some(&up)).await;
        let (codes, refused) = three_at_once(&gw, "/slow?delay_ms=1000", ["alice"; 3]).await;
        assert_eq!(
            codes,
            [200, 429, 429],
            "[limits.user] concurrent = 1 ({store:?})"
        );
        for b in &refused {
            assert_eq!(
                (&b["window"], &b["scope"]),
                (&json!("concurrent"), &json!("user")),
                "{b}"
            );
        }
        let r = client()
            .get(gw.url("/slow?delay_ms=1"))
            .header("x-user", "alice")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "the slot came back");
        // The route's global table counts the route's requests as a whole, whoever sends
        // them (three users, each with a free slot of their own).
        let users = ["bob", "carol", "dave"];
        let (codes, refused) = three_at_once(&gw, "/capped/slow?delay_ms=1000", users).await;
        assert_eq!(
            codes,
            [200, 429, 429],
            "route global concurrent = 1 ({store:?})"
        );
        for b in &refused {
            let got = (&b["window"], &b["scope"], &b["route"]);
            assert_eq!(
                got,
                (&json!("concurrent"), &json!("global"), &json!("capped")),
                "{b}"
            );
        }
    }
}

/// A token subject equal to a tenant id does not join that tenant (a token has a tenant
/// only by `tenant_claim`): tokens with `sub = "acme"` hit their own key limit, never the
/// tenant's, and cannot get tenant acme banned; a subject equal to a key id counts as
/// `jwt:<sub>`, not in that key's bucket.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_subject_never_meets_a_tenant_or_a_key() {
    let up = Upstream::start("one-caller").await;
    let body = r#"
[auth.jwt]
algorithms = ["HS256"]
hs256_secret_env = "THROTTLE_TEST_JWT_SECRET"
default_tier = "tokens"

[tiers.tokens]
key = { per_minute = 3 }
tenant = { per_minute = 2, ban = { after = 2, within_secs = 60, for_secs = 600 } }

[tiers.keys]
key = { per_minute = 3 }
tenant = { per_minute = 100, ban = { after = 2, within_secs = 60, for_secs = 600 } }

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "required"

[[keys]]
id = "key_acme"
key = "acme-secret-key"
tenant = "acme"
tier = "keys"
"#;
    let env = [("THROTTLE_TEST_JWT_SECRET", Some(SECRET))];
    let gw = Gateway::start_env(
        &["run"],
        &body.replace("{upstream}", &up.addr.to_string()),
        "",
        &env,
    )
    .await;
    let token = |sub: &str| {
        let claims = json!({"sub": sub, "exp": now_secs() + 600});
        hs256(SECRET.as_bytes(), "k", &claims)
    };
    let bearer = |t: &str| format!("Bearer {t}");
    let acme = token("acme");
    let mut codes = Vec::new();
    for _ in 0..8 {
        let r = client()
            .get(gw.url("/x"))
            .header("authorization", bearer(&acme))
            .send()
            .await
            .unwrap();
        codes.push(r.status().as_u16());
        if r.status() == 200 {
            let echo: Value = r.json().await.unwrap();
            assert_eq!(echo["headers"]["x-throttle-key-id"], "acme");
            assert!(echo["headers"].get("x-throttle-tenant").is_none(), "{echo}");
        } else {
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["scope"], "key", "{body}");
        }
    }
    assert_eq!(codes, [200, 200, 200, 429, 429, 429, 429, 429]);
    let key = |k: &'static str| client().get(gw.url("/x")).header("x-api-key", k).send();
    let r = key("acme-secret-key").await.unwrap();
    assert_eq!(r.status(), 200, "tenant acme is not banned by sub=acme");
    assert_eq!(
        header(&r, "x-ratelimit-remaining"),
        "2",
        "key_acme's own bucket"
    );
    // A subject equal to the key id: its own bucket (jwt:key_acme).
    let same_id = token("key_acme");
    for _ in 0..3 {
        let r = client()
            .get(gw.url("/x"))
            .header("authorization", bearer(&same_id))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = key("acme-secret-key").await.unwrap();
    assert_eq!(
        header(&r, "x-ratelimit-remaining"),
        "1",
        "untouched by jwt:key_acme"
    );
    let top: Value = client()
        .get(gw.admin_url("/v1/top?scope=key&n=10"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = top["top"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["identity"].as_str())
        .collect();
    assert!(
        ids.contains(&"jwt:acme") && ids.contains(&"jwt:key_acme"),
        "{top}"
    );
    assert!(ids.contains(&"key_acme"), "{top}");
    // /v1/usage answers for the JWT caller, under its namespaced id.
    let r = client()
        .get(gw.admin_url("/v1/usage?key_id=jwt%3Akey_acme"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    let key_window = &body["windows"][0];
    assert_eq!(
        (&key_window["scope"], &key_window["used"]),
        (&json!("key"), &json!(3)),
        "{body}"
    );
}

/// A tenant whose tier the tenants table sets is limited at that tier for every kind of
/// key: a database key and a `[[keys]]` key of the tenant both see the `pro` tenant
/// window (500), and `/v1/usage?tenant=` reports the same; a tenant named with a space is
/// found percent-decoded (`%20` and `+`).
#[tokio::test(flavor = "multi_thread")]
async fn one_tenant_is_limited_at_one_size() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("one-caller").await;
    let body = format!(
        r#"
[database]
url = "{}"

[tiers.free]
key = {{ per_hour = 1000 }}
tenant = {{ per_hour = 10 }}

[tiers.pro]
key = {{ per_hour = 1000 }}
tenant = {{ per_hour = 500 }}

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]

[[keys]]
id = "toml_acme"
key = "toml-acme-secret"
tenant = "acme"
tier = "free"

[[keys]]
id = "toml_spaced"
key = "toml-spaced-secret"
tenant = "Acme Corp"
tier = "free"
"#,
        db.url
    );
    let gw = Gateway::start(&body, Some(&up)).await;
    let admin = |method: reqwest::Method, path: &str| {
        client()
            .request(method, gw.admin_url(path))
            .bearer_auth(ADMIN_TOKEN)
    };
    eventually(Duration::from_secs(10), "the tenants table", || async {
        let r = admin(reqwest::Method::POST, "/v1/tenants")
            .json(&json!({"id": "acme", "tier": "pro"}))
            .send()
            .await
            .ok()?;
        (r.status() == 201).then_some(())
    })
    .await;
    let created: Value = admin(reqwest::Method::POST, "/v1/keys")
        .json(&json!({"tenant": "acme", "tier": "free"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let db_key = created["key"].as_str().unwrap().to_string();
    let limit_of = |key: String| {
        let gw = &gw;
        async move {
            let r = client()
                .get(gw.url("/x"))
                .header("x-api-key", key)
                .send()
                .await
                .ok()?;
            (r.status() == 200).then(|| header(&r, "x-ratelimit-limit"))
        }
    };
    for key in [db_key, "toml-acme-secret".to_string()] {
        let limit = eventually(Duration::from_secs(10), "pro's tenant window", || {
            let key = key.clone();
            async move { limit_of(key).await.filter(|l| l == "500") }
        })
        .await;
        assert_eq!(limit, "500");
    }
    for query in ["tenant=acme", "tenant=Acme%20Corp", "tenant=Acme+Corp"] {
        let r = admin(reqwest::Method::GET, &format!("/v1/usage?{query}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{query}");
        let body: Value = r.json().await.unwrap();
        let tenant = &body["windows"][0];
        let want = if query == "tenant=acme" { 500 } else { 10 };
        assert_eq!(
            (&tenant["scope"], &tenant["limit"]),
            (&json!("tenant"), &json!(want)),
            "{query}: {body}"
        );
    }
}
