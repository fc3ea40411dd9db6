//! PostgreSQL end to end: migrations (including from the previous schema), the keys CLI,
//! policies (tiers) and overrides, revocation and block propagation across two gateways,
//! brute-force protection, and the violation log (including across a PostgreSQL
//! restart). Each test has a database of its own.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::support::postgres::{PgServer, TestDb};
use crate::support::{client, eventually, free_port, header, Gateway, Upstream, ADMIN_TOKEN};

/// A gateway config on `db_url`. Failed lookups are generous here (polling for a key
/// that has not propagated yet is not an attack); `brute_force_is_limited_per_ip` tightens it.
pub(crate) fn config(db_url: &str) -> String {
    format!(
        r#"
[database]
url = "{db_url}"

[limits.auth]
per_minute = 1000

[tiers.free]
key = {{ per_minute = 100 }}

[tiers.tight]
key = {{ per_minute = 2 }}

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]

[[keys]]
id = "toml_key"
key = "toml-secret"
tenant = "acme"
tier = "tight"
"#
    )
}

/// A gateway on `db_url` that has connected to it and loaded its snapshot (the database
/// side comes up in the background, after the listeners).
pub(crate) async fn connected(db_url: &str, up: &Upstream) -> Gateway {
    let gw = Gateway::start(&config(db_url), Some(up)).await;
    eventually(Duration::from_secs(10), "database connected", || async {
        (gw.readyz().await["database"]["healthy"] == true).then_some(())
    })
    .await;
    gw
}

fn throttle(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_throttle"))
        .args(args)
        .output()
        .unwrap()
}

/// `keys create` through the real CLI; returns (key id, api key).
fn create_key(db: &TestDb, gw: &Gateway, tenant: &str, tier: &str) -> (String, String) {
    let out = throttle(&[
        "keys",
        "create",
        "--tenant",
        tenant,
        "--tier",
        tier,
        "--database-url",
        &db.url,
        "--config",
        gw.config_path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .to_string()
    };
    (field("key_id:"), field("api_key:"))
}

pub(crate) async fn status(gw: &Gateway, key: &str) -> u16 {
    client()
        .get(gw.url("/x"))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Migrations apply to an empty database and again (idempotent); a gateway refuses to
/// start on a schema that lacks them, saying what to run.
#[tokio::test(flavor = "multi_thread")]
async fn migrations_apply_twice_and_old_schemas_are_refused() {
    let Some(db) = TestDb::create() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gw.toml");
    let body = config(&db.url).replace("{upstream}", "127.0.0.1:9");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"127.0.0.1:{}\"\n{body}",
            free_port(),
            free_port()
        ),
    )
    .unwrap();
    let out = throttle(&["run", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("older than this gateway") && stderr.contains("throttle migrate"),
        "{stderr}"
    );
    db.migrate();
    db.migrate();
    let pool = db.pool().await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for t in [
        "api_key_rate_limits",
        "api_keys",
        "rate_limit_blocks",
        "rate_limit_events",
        "rate_limit_policies",
        "tenants",
    ] {
        assert!(tables.iter().any(|x| x == t), "{t} missing from {tables:?}");
    }
}

/// `keys create` prints the key once and stores only its SHA-256; the key works on two
/// gateways; `keys list` never shows it; `keys revoke` takes effect everywhere within 1 s.
#[tokio::test(flavor = "multi_thread")]
async fn keys_cli_and_revocation_reach_every_gateway_within_a_second() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw1 = connected(&db.url, &up).await;
    let gw2 = connected(&db.url, &up).await;
    let (id, key) = create_key(&db, &gw1, "globex", "free");
    assert!(key.starts_with("thr_") && key.len() > 40);
    let pool = db.pool().await;
    let stored: String = sqlx::query_scalar("SELECT key_sha256 FROM api_keys WHERE id = $1")
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        stored,
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()))
    );
    let tenant_tier: String = sqlx::query_scalar("SELECT tier FROM tenants WHERE id = 'globex'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tenant_tier, "free", "keys create creates the tenant");
    for gw in [&gw1, &gw2] {
        eventually(Duration::from_secs(2), "new key accepted", || async {
            (status(gw, &key).await == 200).then_some(())
        })
        .await;
        let r = client()
            .get(gw.url("/x"))
            .header("x-api-key", &key)
            .send()
            .await
            .unwrap();
        let echo: Value = r.json().await.unwrap();
        assert_eq!(echo["headers"]["x-throttle-key-id"], id.as_str());
    }
    let list =
        String::from_utf8(throttle(&["keys", "list", "--database-url", &db.url]).stdout).unwrap();
    assert!(
        list.contains(&id) && list.contains(&key[..8]) && !list.contains(&key),
        "{list}"
    );
    let out = throttle(&["keys", "revoke", &id, "--database-url", &db.url]);
    assert!(out.status.success());
    let revoked = Instant::now();
    for gw in [&gw1, &gw2] {
        eventually(Duration::from_secs(1), "revocation propagated", || async {
            (status(gw, &key).await == 401).then_some(())
        })
        .await;
    }
    assert!(
        revoked.elapsed() < Duration::from_secs(1),
        "took {:?}",
        revoked.elapsed()
    );
    assert!(
        !throttle(&["keys", "revoke", &id, "--database-url", &db.url])
            .status
            .success(),
        "revoking twice fails"
    );
}

/// custom_override replaces the tier's windows field by field (here per_minute 100 -> 2).
#[tokio::test(flavor = "multi_thread")]
async fn custom_override_replaces_tier_windows() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    let (id, key) = create_key(&db, &gw, "initech", "free");
    let pool = db.pool().await;
    sqlx::query("INSERT INTO api_key_rate_limits (api_key_id, custom_override) VALUES ($1, '{\"per_minute\": 2}')").bind(&id).execute(&pool).await.unwrap();
    eventually(Duration::from_secs(2), "override applied", || async {
        let r = client()
            .get(gw.url("/x"))
            .header("x-api-key", &key)
            .send()
            .await
            .unwrap();
        (header(&r, "x-ratelimit-limit") == "2").then_some(())
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(status(&gw, &key).await);
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    let r = client()
        .get(gw.url("/x"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["limit"], 2);
    let policies: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM rate_limit_policies WHERE name IN ('free', 'tight')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        policies, 2,
        "tiers are written through to rate_limit_policies"
    );
}

/// The `x-ratelimit-limit` a request with `key` gets (the governing window's limit).
pub(crate) async fn limit_header(gw: &Gateway, key: &str) -> String {
    let r = client()
        .get(gw.url("/x"))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap();
    header(&r, "x-ratelimit-limit")
}

/// `throttle_invalid_limits_total{source}` of `gw`.
async fn invalid_limits(gw: &Gateway, source: &str) -> u64 {
    let m = gw.metrics().await;
    let prefix = format!("throttle_invalid_limits_total{{source=\"{source}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {m}"))
        .trim()
        .parse()
        .unwrap()
}

/// A tier's row in rate_limit_policies is the truth for its key windows: an UPDATE
/// reaches every gateway within 1 s; a row the config would refuse is counted and the
/// tier falls back to gateway.toml's windows.
#[tokio::test(flavor = "multi_thread")]
async fn policy_updates_reach_every_gateway_within_a_second() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw1 = connected(&db.url, &up).await;
    let gw2 = connected(&db.url, &up).await;
    let (_, key) = create_key(&db, &gw1, "hooli", "free");
    let pool = db.pool().await;
    let row: (String, Option<i32>, Option<i32>, f64, Option<String>) = sqlx::query_as(
        "SELECT name, req_per_second, req_per_minute, burst_multiplier, algorithm
         FROM rate_limit_policies WHERE id = 'free'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        row,
        // No per-second window: 0 (the column is NOT NULL with the seed's default).
        ("free".into(), Some(0), Some(100), 1.0, None),
        "inserted at start"
    );
    for gw in [&gw1, &gw2] {
        eventually(Duration::from_secs(2), "key of tier free", || async {
            (limit_header(gw, &key).await == "100").then_some(())
        })
        .await;
    }
    sqlx::query("UPDATE rate_limit_policies SET req_per_minute = 3 WHERE id = 'free'")
        .execute(&pool)
        .await
        .unwrap();
    let updated = Instant::now();
    for gw in [&gw1, &gw2] {
        eventually(
            Duration::from_secs(1),
            "policy update propagated",
            || async { (limit_header(gw, &key).await == "3").then_some(()) },
        )
        .await;
    }
    assert!(
        updated.elapsed() < Duration::from_secs(1),
        "took {:?}",
        updated.elapsed()
    );
    let statuses: Vec<u16> =
        futures_util::future::join_all((0..4).map(|_| status(&gw1, &key))).await;
    assert!(statuses.contains(&429), "{statuses:?}");
    // The rows hold for the config's own keys too (toml_key is of tier tight).
    assert_eq!(limit_header(&gw1, "toml-secret").await, "2");
    sqlx::query("UPDATE rate_limit_policies SET req_per_minute = 4 WHERE id = 'tight'")
        .execute(&pool)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(1),
        "[[keys]] follow their row",
        || async { (limit_header(&gw1, "toml-secret").await == "4").then_some(()) },
    )
    .await;
    // An unknown algorithm: the row is refused, counted, and gateway.toml's windows hold.
    sqlx::query("UPDATE rate_limit_policies SET algorithm = 'magic' WHERE id = 'free'")
        .execute(&pool)
        .await
        .unwrap();
    eventually(Duration::from_secs(2), "invalid policy counted", || async {
        (invalid_limits(&gw2, "policy").await == 1).then_some(())
    })
    .await;
    assert_eq!(limit_header(&gw2, &key).await, "100");
    // A restart does not overwrite the row (only missing tiers are inserted).
    let gw3 = connected(&db.url, &up).await;
    let algorithm: Option<String> =
        sqlx::query_scalar("SELECT algorithm FROM rate_limit_policies WHERE id = 'free'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(algorithm.as_deref(), Some("magic"));
    drop(gw3);
}

/// A row inserted with exactly the seed's columns defines a new tier, and
/// `api_key_rate_limits.policy_id` moves a key to it (and back).
#[tokio::test(flavor = "multi_thread")]
async fn policy_id_moves_a_key_to_a_tier_defined_in_sql() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    let (id, key) = create_key(&db, &gw, "umbrella", "free");
    let pool = db.pool().await;
    sqlx::query(
        "INSERT INTO rate_limit_policies (id, name, req_per_second, req_per_minute, req_per_hour,
             req_per_day, req_per_month, burst_multiplier, algorithm, created_at, updated_at)
         VALUES ('gold', 'Gold plan', 0, 3, 0, 0, 0, 1.0, NULL, now(), now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO api_key_rate_limits (api_key_id, policy_id) VALUES ($1, 'gold')")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    eventually(Duration::from_secs(2), "key moved to gold", || async {
        (limit_header(&gw, &key).await == "3").then_some(())
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(status(&gw, &key).await);
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    let r = client()
        .get(gw.url("/x"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["limit"], 3);
    assert_eq!(invalid_limits(&gw, "policy").await, 0);
    sqlx::query("UPDATE api_key_rate_limits SET policy_id = NULL WHERE api_key_id = $1")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    eventually(Duration::from_secs(2), "key back on free", || async {
        (limit_header(&gw, &key).await == "100").then_some(())
    })
    .await;
}

/// A policy row inserted in the seed's style, naming only (id, name), is the seed's
/// limited tier (10/s, 500/min, ..., burst 1.5), not an unlimited one.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_row_with_only_id_and_name_has_the_seeds_limits() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    let (id, key) = create_key(&db, &gw, "seedco", "free");
    let pool = db.pool().await;
    sqlx::query("INSERT INTO rate_limit_policies (id, name) VALUES ('seedlike', 'Seed-like')")
        .execute(&pool)
        .await
        .unwrap();
    let row: (i32, i32, i32, i32, i32, f64) = sqlx::query_as(
        "SELECT req_per_second, req_per_minute, req_per_hour, req_per_day, req_per_month,
                burst_multiplier FROM rate_limit_policies WHERE id = 'seedlike'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row, (10, 500, 10_000, 100_000, 1_000_000, 1.5));
    sqlx::query("INSERT INTO api_key_rate_limits (api_key_id, policy_id) VALUES ($1, 'seedlike')")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(2),
        "key on the seed-like tier",
        || async { (limit_header(&gw, &key).await == "10").then_some(()) },
    )
    .await;
    // NULL is refused: it used to mean "no window", i.e. unlimited by accident.
    let null =
        sqlx::query("UPDATE rate_limit_policies SET req_per_second = NULL WHERE id = 'seedlike'")
            .execute(&pool)
            .await;
    assert!(null.is_err());
}

/// The violation log keeps `[database] events_retention_months` (default 12) whole months:
/// a gateway drops older monthly partitions at start, and keeps this month's.
#[tokio::test(flavor = "multi_thread")]
async fn old_violation_log_partitions_are_dropped() {
    let Some(db) = TestDb::migrated() else { return };
    let pool = db.pool().await;
    sqlx::query(
        "SELECT throttle_ensure_event_partition('2020-01-01'),
                throttle_ensure_event_partition((now() - interval '11 months')::date),
                throttle_ensure_event_partition(now()::date)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let partitions = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'rate_limit_events'
             ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    assert!(partitions()
        .await
        .contains(&"rate_limit_events_2020_01".to_string()));
    let up = Upstream::start("u").await;
    let _gw = connected(&db.url, &up).await;
    let kept = eventually(Duration::from_secs(10), "2020-01 dropped", || async {
        let p = partitions().await;
        (!p.contains(&"rate_limit_events_2020_01".to_string())).then_some(p)
    })
    .await;
    // This month and the one eleven months back are within the 12 kept.
    assert_eq!(kept.len(), 2, "{kept:?}");
}

/// custom_override: `null` removes a window of the tier; a value the config would refuse
/// (2^52 bound) is refused, counted, and the key keeps its tier's limits.
#[tokio::test(flavor = "multi_thread")]
async fn custom_override_null_removes_and_bad_values_are_refused() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    let (open_id, open_key) = create_key(&db, &gw, "initech", "tight");
    let (bad_id, bad_key) = create_key(&db, &gw, "initech", "tight");
    let pool = db.pool().await;
    sqlx::query(
        "INSERT INTO api_key_rate_limits (api_key_id, custom_override) VALUES
             ($1, '{\"per_minute\": null, \"per_hour\": 50}'),
             ($2, '{\"per_day\": 1000000000}')",
    )
    .bind(&open_id)
    .bind(&bad_id)
    .execute(&pool)
    .await
    .unwrap();
    eventually(Duration::from_secs(2), "override applied", || async {
        (limit_header(&gw, &open_key).await == "50").then_some(())
    })
    .await;
    for _ in 0..4 {
        assert_eq!(status(&gw, &open_key).await, 200, "per_minute = 2 removed");
    }
    eventually(Duration::from_secs(2), "bad override counted", || async {
        (invalid_limits(&gw, "override").await == 1).then_some(())
    })
    .await;
    assert_eq!(limit_header(&gw, &bad_key).await, "2", "the tier's limits");
    let statuses: Vec<u16> =
        futures_util::future::join_all((0..3).map(|_| status(&gw, &bad_key))).await;
    assert!(statuses.contains(&429), "{statuses:?}");
    // Refreshes do not count the same refusal again.
    sqlx::query("UPDATE tenants SET name = 'Initech' WHERE id = 'initech'")
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(invalid_limits(&gw, "override").await, 1);
}

/// A database created with the previous schema (serial policy ids, a `limits` JSONB)
/// keeps its policies, and the keys moved to them, through `throttle migrate`.
#[tokio::test(flavor = "multi_thread")]
async fn migrating_the_previous_schema_keeps_policies() {
    let Some(db) = TestDb::create() else { return };
    let pool = db.pool().await;
    throttle::db::MIGRATOR
        .run_to(20261129000003, &pool)
        .await
        .unwrap();
    sqlx::query(
        r#"INSERT INTO rate_limit_policies (name, limits) VALUES
           ('free', '{"key": {"per_second": {"limit": 5, "algorithm": "token_bucket", "capacity": 7},
                              "per_minute": {"limit": 100, "algorithm": "token_bucket", "capacity": 150},
                              "per_day": {"limit": 20000, "algorithm": "sliding_window", "capacity": 20000}},
                      "tenant": {"per_hour": {"limit": 50000, "algorithm": "sliding_window", "capacity": 50000}}}'),
           ('logged', '{"key": {"per_hour": {"limit": 100, "algorithm": "sliding_log", "capacity": 100}},
                        "tenant": {}}')"#,
    )
    .execute(&pool)
    .await
    .unwrap();
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"old-key"));
    sqlx::query("INSERT INTO tenants (id, name, tier) VALUES ('old', 'old', 'free')")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO api_keys (id, tenant_id, key_sha256, prefix, tier)
         VALUES ('key_old', 'old', $1, 'old-key', 'free')",
    )
    .bind(&digest)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO api_key_rate_limits (api_key_id, policy_id, custom_override)
         SELECT 'key_old', id, '{\"per_minute\": 5}' FROM rate_limit_policies WHERE name = 'logged'",
    )
    .execute(&pool)
    .await
    .unwrap();
    db.migrate();
    type Policy = (
        String,
        String,
        Option<i32>,
        Option<i32>,
        Option<i32>,
        Option<i32>,
        Option<i32>,
        f64,
        Option<String>,
    );
    let rows: Vec<Policy> = sqlx::query_as(
        "SELECT id, name, req_per_second, req_per_minute, req_per_hour, req_per_day,
                req_per_month, burst_multiplier, algorithm FROM rate_limit_policies ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let want: Vec<Policy> = vec![
        (
            "free".into(),
            "free".into(),
            Some(5),
            Some(100),
            Some(0),
            Some(20_000),
            Some(0),
            1.5,
            None,
        ),
        // The windows a policy had none of are 0 after the seed-defaults migration.
        (
            "logged".into(),
            "logged".into(),
            Some(0),
            Some(0),
            Some(100),
            Some(0),
            Some(0),
            1.0,
            Some("sliding_log".into()),
        ),
    ];
    assert_eq!(rows, want);
    let moved: (Option<String>, Value) = sqlx::query_as(
        "SELECT policy_id, custom_override FROM api_key_rate_limits WHERE api_key_id = 'key_old'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(moved, (Some("logged".into()), json!({"per_minute": 5})));
    // The migrated rows are live: the key is on the SQL-only tier, with its override.
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    eventually(Duration::from_secs(2), "migrated key served", || async {
        (limit_header(&gw, "old-key").await == "5").then_some(())
    })
    .await;
    assert_eq!(invalid_limits(&gw, "policy").await, 0);
    assert_eq!(invalid_limits(&gw, "override").await, 0);
}

/// Blocks posted to one gateway's admin API (and rows written with SQL) reach the other
/// within 1 s; the API needs the admin token.
#[tokio::test(flavor = "multi_thread")]
async fn blocks_propagate_across_gateways_within_a_second() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw1 = connected(&db.url, &up).await;
    let gw2 = connected(&db.url, &up).await;
    let c = client();
    let url = gw1.admin_url("/v1/blocks");
    assert_eq!(
        c.post(&url)
            .json(&json!({"scope": "key", "value": "toml_key"}))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        c.get(&url)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let posted = Instant::now();
    let r = c
        .post(&url)
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"scope": "key", "value": "toml_key", "reason": "abuse"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let block: Value = r.json().await.unwrap();
    let id = block["id"].as_i64().unwrap();
    eventually(Duration::from_secs(1), "block on gw2", || async {
        (status(&gw2, "toml-secret").await == 403).then_some(())
    })
    .await;
    assert!(posted.elapsed() < Duration::from_secs(1));
    let listed: Value = c
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["blocks"][0]["value"], "toml_key");
    assert_eq!(
        c.delete(format!("{url}/{id}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    // Not 403 any more (the key's own 2/minute may be spent by the polling above: 429).
    eventually(Duration::from_secs(1), "unblock on gw2", || async {
        (status(&gw2, "toml-secret").await != 403).then_some(())
    })
    .await;
    // Through SQL: a tenant block with an expiry in the future.
    let pool = db.pool().await;
    sqlx::query("INSERT INTO rate_limit_blocks (scope, value, expires_at) VALUES ('tenant', 'acme', now() + interval '1 hour')").execute(&pool).await.unwrap();
    for gw in [&gw1, &gw2] {
        eventually(Duration::from_secs(1), "SQL block", || async {
            let r = client()
                .get(gw.url("/x"))
                .header("x-api-key", "toml-secret")
                .send()
                .await
                .unwrap();
            (r.status() == 403).then_some(())
        })
        .await;
    }
    assert_eq!(
        c.post(&url)
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"scope": "ip", "value": "300.1.1.1"}))
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
}

/// Failed key lookups count against the client IP: past `[limits.auth]` every key, even a
/// valid one, gets 429 with scope "auth" (works without a database).
#[tokio::test(flavor = "multi_thread")]
async fn brute_force_is_limited_per_ip() {
    let up = Upstream::start("u").await;
    let body = config("postgres://unused")
        .replace("[database]\nurl = \"postgres://unused\"\n", "")
        .replace("per_minute = 1000", "per_minute = 3");
    let gw = Gateway::start(&body, Some(&up)).await;
    for i in 0..3 {
        assert_eq!(status(&gw, &format!("guess-{i}")).await, 401);
    }
    let r = client()
        .get(gw.url("/x"))
        .header("x-api-key", "guess-4")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.json::<Value>().await.unwrap()["scope"], "auth");
    let r = client()
        .get(gw.url("/x"))
        .header("x-api-key", "toml-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        429,
        "a valid key is not looked at either once the IP is over the limit"
    );
    // Requests without a key are not auth attempts.
    let r = client().get(gw.url("/x")).send().await.unwrap();
    assert_eq!(r.status(), 401);
}

/// Blocks posted without a database live in memory: add, list, delete.
#[tokio::test(flavor = "multi_thread")]
async fn blocks_api_works_without_a_database() {
    let up = Upstream::start("u").await;
    let body = config("postgres://unused").replace("[database]\nurl = \"postgres://unused\"\n", "");
    let gw = Gateway::start(&body, Some(&up)).await;
    let c = client();
    let url = gw.admin_url("/v1/blocks");
    let r = c
        .post(&url)
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"scope": "ip", "value": "127.0.0.0/8", "expires_at": "2099-01-01T00:00:00Z"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["expires_at"], "2099-01-01T00:00:00Z");
    assert_eq!(status(&gw, "toml-secret").await, 403);
    assert_eq!(
        c.delete(format!("{url}/{}", b["id"]))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    assert_eq!(status(&gw, "toml-secret").await, 200);
}

async fn event_count(db_url: &str) -> i64 {
    let pool = sqlx::PgPool::connect(db_url).await.unwrap();
    let n = sqlx::query_scalar("SELECT count(*) FROM rate_limit_events WHERE scope = 'key' AND limit_key = 'key:toml_key' AND api_key_id = 'toml_key'").fetch_one(&pool).await.unwrap();
    pool.close().await;
    n
}

/// Every rejection becomes a rate_limit_events row (batched, in this month's partition).
#[tokio::test(flavor = "multi_thread")]
async fn rejections_are_logged() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    let statuses: Vec<u16> =
        futures_util::future::join_all((0..7).map(|_| status(&gw, "toml-secret"))).await;
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 5);
    eventually(Duration::from_secs(5), "5 events", || async {
        (event_count(&db.url).await == 5).then_some(())
    })
    .await;
    let pool = db.pool().await;
    let row: (String, i64, i64, String) = sqlx::query_as(
        "SELECT ip::text, limit_value, count, \"window\"::text FROM rate_limit_events LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (row.0.as_str(), row.1, row.3.as_str()),
        ("127.0.0.1/32", 2, "00:01:00")
    );
    assert!(row.2 >= 3);
}

/// PostgreSQL stops and comes back: the gateway keeps answering (from its snapshot) and no
/// event is lost while the queue stays within its bound.
#[tokio::test(flavor = "multi_thread")]
async fn no_event_is_lost_across_a_postgres_restart() {
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
    let gw = connected(&db.url, &up).await;
    for _ in 0..5 {
        status(&gw, "toml-secret").await;
    }
    eventually(
        Duration::from_secs(5),
        "3 events before the restart",
        || async { (event_count(&db.url).await == 3).then_some(()) },
    )
    .await;
    assert!(pg.down());
    for _ in 0..4 {
        let started = Instant::now();
        assert_eq!(status(&gw, "toml-secret").await, 429);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "the request path waited on PostgreSQL"
        );
    }
    let ready: Value = gw.readyz().await;
    eventually(Duration::from_secs(10), "degraded", || async {
        let r: Value = gw.readyz().await;
        (r["degraded"] == true).then_some(())
    })
    .await;
    let _ = ready;
    assert!(pg.up());
    eventually(
        Duration::from_secs(15),
        "all 7 events after the restart",
        || async { (event_count(&db.url).await == 7).then_some(()) },
    )
    .await;
    let m = gw.metrics().await;
    assert!(
        m.contains("throttle_events_dropped_total{reason=\"queue_full\"} 0"),
        "{m}"
    );
}

/// PostgreSQL down at start: the gateway serves the TOML keys, but is not ready: a key it
/// does not know may be a database key not loaded yet (503 `not_ready`, never 401), and
/// the admin API's database endpoints say when to retry.
#[tokio::test(flavor = "multi_thread")]
async fn serves_toml_keys_when_postgres_is_down_at_start() {
    let up = Upstream::start("u").await;
    let dead = format!("postgres://postgres@127.0.0.1:{}/none", free_port());
    let body = config(&dead).replace("{upstream}", &up.addr.to_string());
    let gw = Gateway::start_live(&body, "grace_period_secs = 0").await;
    assert_eq!(status(&gw, "toml-secret").await, 200);
    let unknown = client()
        .get(gw.url("/x"))
        .header("x-api-key", "not-loaded-yet")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 503);
    assert_eq!(header(&unknown, "retry-after"), "1");
    let body: Value = unknown.json().await.unwrap();
    assert_eq!(body, json!({"error": "not_ready"}));
    let ready = client().get(gw.admin_url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(header(&ready, "retry-after"), "1");
    let r: Value = ready.json().await.unwrap();
    assert_eq!(r, json!({"ready": false, "waiting": ["database"]}));
    let posted = client()
        .post(gw.admin_url("/v1/blocks"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"scope": "ip", "value": "10.0.0.1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 503);
    assert_eq!(header(&posted, "retry-after"), "1");
    let keys = client()
        .get(gw.admin_url("/v1/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(keys.status(), 503);
    assert_eq!(header(&keys, "retry-after"), "1");
}
