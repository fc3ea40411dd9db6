//! Ready means ready: `/readyz` turns 200 only once the first database snapshot and the
//! first `jwks_url` key set have loaded, and until then a credential the gateway may not
//! have loaded yet is answered 503 `not_ready`, never 401 (real PostgreSQL, real gateway).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::db::config;
use crate::support::jwt::{jwks, now_secs, JwksServer, RsaKey};
use crate::support::postgres::{PgServer, TestDb};
use crate::support::{client, eventually, header, Gateway, Upstream, ADMIN_TOKEN};

/// The config of `db::config` on `db_url`, its upstream filled in.
/// The free tier's key limit is raised out of the client loop's reach: these tests are
/// about readiness and 401s, and a loaded run's loop spent 100 a minute before `/readyz`
/// was seen ready (the key then got 429 "after ready").
fn body(db_url: &str, up: &Upstream) -> String {
    let (tier, raised) = (
        "key = { per_minute = 100 }",
        "key = { per_minute = 1000000 }",
    );
    let config = config(db_url);
    assert!(config.contains(tier), "db::config's free tier changed");
    config
        .replace(tier, raised)
        .replace("{upstream}", &up.addr.to_string())
}

/// A key made through the admin API of a gateway on `db_url` (its secret).
async fn made_key(db_url: &str, up: &Upstream) -> String {
    let gw = crate::db::connected(db_url, up).await;
    let created: Value = client()
        .post(gw.admin_url("/v1/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"tenant": "newco", "tier": "free"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["key"].as_str().unwrap().to_string()
}

/// `/readyz`'s status.
async fn ready_status(gw: &Gateway) -> u16 {
    client()
        .get(gw.admin_url("/readyz"))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

/// What a client saw: (status, error code, whether `/readyz` had said 200 before).
type Seen = Arc<Mutex<Vec<(u16, String, bool)>>>;

/// Sends `key` in a loop from the moment the gateway is alive until `stop`, keeping every
/// (status, error code, whether `/readyz` had answered 200 before the request was sent).
fn hammer(
    gw: Arc<Gateway>,
    key: String,
    ready: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> (tokio::task::JoinHandle<()>, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let c = client();
        while !stop.load(Ordering::SeqCst) {
            let was_ready = ready.load(Ordering::SeqCst);
            let r = c
                .get(gw.url("/x"))
                .header("x-api-key", &key)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            let code = body["error"].as_str().unwrap_or("").to_string();
            out.lock().unwrap().push((status, code, was_ready));
        }
    });
    (task, seen)
}

/// Restarts a gateway on `db_url` while a client sends a database key from its first
/// `/healthz`; with `pg` the database is down at start and brought up once it is seen waiting.
async fn restart_under_load(db_url: &str, up: &Upstream, key: &str, pg: Option<&PgServer>) {
    let gw = Arc::new(Gateway::start_live(&body(db_url, up), "grace_period_secs = 0").await);
    let (ready, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (task, seen) = hammer(gw.clone(), key.to_string(), ready.clone(), stop.clone());
    if let Some(pg) = pg {
        // The database is down: not ready, and the key is not refused.
        eventually(Duration::from_secs(5), "requests while down", || async {
            (seen.lock().unwrap().len() >= 5).then_some(())
        })
        .await;
        assert_eq!(ready_status(&gw).await, 503);
        assert!(pg.up());
    }
    eventually(Duration::from_secs(20), "/readyz 200", || async {
        (ready_status(&gw).await == 200).then_some(())
    })
    .await;
    ready.store(true, Ordering::SeqCst);
    let at_ready = seen.lock().unwrap().len();
    eventually(
        Duration::from_secs(10),
        "20 requests after ready",
        || async { (seen.lock().unwrap().len() >= at_ready + 20).then_some(()) },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    task.await.unwrap();
    let seen = seen.lock().unwrap().clone();
    for (status, code, was_ready) in &seen {
        assert_ne!(
            *status, 401,
            "a valid key got 401 during the restart: {seen:?}"
        );
        if *was_ready {
            assert_eq!(
                *status, 200,
                "after /readyz 200 the key is served: {seen:?}"
            );
        } else {
            assert!(
                *status == 200 || (*status == 503 && code == "not_ready"),
                "{seen:?}"
            );
        }
    }
}

/// A rolling restart with keys only in the database, three times over: from the first
/// `/healthz` a valid key is answered 200 or 503 `not_ready`, never 401, and once `/readyz`
/// says 200 it is served.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_under_load_never_answers_401_for_a_valid_key() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let key = made_key(&db.url, &up).await;
    for _ in 0..3 {
        restart_under_load(&db.url, &up, &key, None).await;
    }
}

/// PostgreSQL down when the gateway starts, up later: `/readyz` waits for the database,
/// database keys are `not_ready` meanwhile, then served.
#[tokio::test(flavor = "multi_thread")]
async fn ready_waits_for_a_database_that_comes_up_late() {
    let Some(pg) = PgServer::start() else {
        assert!(
            std::env::var("CI").is_err(),
            "a private PostgreSQL is required in CI"
        );
        return eprintln!("skipped: cannot start a private PostgreSQL");
    };
    let db = TestDb::create_on(&pg.url()).unwrap();
    db.migrate();
    let up = Upstream::start("u").await;
    let key = made_key(&db.url, &up).await;
    assert!(pg.down());
    restart_under_load(&db.url, &up, &key, Some(&pg)).await;
}

/// With `jwks_url`, `/readyz` waits for the first key set (a JWKS server failing at start):
/// meanwhile a token is 503 `not_ready`, not 401; once the set loads (retried within
/// seconds, not a whole `jwks_refresh_secs`), ready and the token is served.
#[tokio::test(flavor = "multi_thread")]
async fn ready_waits_for_the_first_key_set() {
    let key = RsaKey::new(0, "k1");
    let server = JwksServer::start(b"not a jwks".to_vec()).await;
    let up = Upstream::start("u").await;
    let cfg = format!(
        "[auth.jwt]\nalgorithms = [\"RS256\"]\njwks_url = \"{}\"\njwks_refresh_secs = 3600\ndefault_tier = \"free\"\n\n[tiers.free]\nkey = {{ per_minute = 100 }}\n\n[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"{}\"]\n",
        server.url(),
        up.addr
    );
    let gw = Gateway::start_live(&cfg, "grace_period_secs = 0").await;
    let token = key.sign(&json!({"sub": "user-1", "exp": now_secs() + 600}));
    let ask = || async {
        client()
            .get(gw.url("/x"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
    };
    let early = ask().await;
    assert_eq!(early.status(), 503);
    assert_eq!(header(&early, "retry-after"), "1");
    let r: Value = client()
        .get(gw.admin_url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r, json!({"ready": false, "waiting": ["jwks"]}));
    server.publish(jwks(&[&key]));
    eventually(
        Duration::from_secs(10),
        "ready after the key set",
        || async { (ready_status(&gw).await == 200).then_some(()) },
    )
    .await;
    assert_eq!(ask().await.status(), 200);
    let forged = RsaKey::new(1, "k1").sign(&json!({"sub": "x", "exp": now_secs() + 600}));
    let refused = client()
        .get(gw.url("/x"))
        .bearer_auth(&forged)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401, "once ready, a bad token is 401");
}
