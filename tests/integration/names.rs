//! Scope names never run out: a gateway reloaded a thousand times, each time with a new
//! route, custom scope and rate-limit service domain (and now and then a refused file),
//! applies every reload, enforces the last one's limits, and keeps metric series and
//! `/v1/top` answers only for the names its config has.

use serde_json::Value;

use crate::support::{client, Gateway, Upstream, ADMIN_TOKEN};

const ROUNDS: usize = 1000;

/// Round `i`'s config: route `r<i>` with an ip table and a custom table, custom scope
/// `c<i>` with limits of its own, and the domains of `ratelimit.yaml`.
fn body(i: usize, upstream: &str) -> String {
    format!(
        r#"[rls]
config = "ratelimit.yaml"

[scopes.c{i}]
from = "header:X-User"

[limits.c{i}]
per_minute = 1000

[[routes]]
name = "r{i}"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
limits = {{ ip = {{ per_minute = 2 }}, c{i} = {{ per_minute = 1000 }} }}
"#
    )
}

/// Round `i`'s domain `d<i>`.
fn domain(i: usize) -> String {
    format!("domain: d{i}\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n")
}

async fn reload(c: &reqwest::Client, gw: &Gateway) -> (u16, Value) {
    let r = c
        .post(gw.admin_url("/v1/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// A thousand reloads with fresh route, scope and domain names are all applied; a refused
/// file on the way changes nothing; the last config's route limit is enforced; `/metrics`
/// names only the last config's routes and scopes, and `/v1/top` answers only for its
/// custom scope.
#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_reloads_with_fresh_names_all_apply() {
    let up = Upstream::start("u").await;
    let upstream = up.addr.to_string();
    let first = body(0, &upstream).replace("[rls]\nconfig = \"ratelimit.yaml\"\n", "");
    let gw = Gateway::start(&first, None).await;
    let c = client();
    for i in 1..=ROUNDS {
        round(&c, &gw, i, &upstream).await;
    }
    last_round_enforced(&c, &gw).await;
    only_current_names(&c, &gw).await;
}

/// Round `i`: domain `d<i>` and the config of round `i`, reloaded (every 100th round a
/// refused file first), then one request that meets the round's named scopes.
async fn round(c: &reqwest::Client, gw: &Gateway, i: usize, upstream: &str) {
    let dir = gw.config_path().parent().unwrap().to_path_buf();
    std::fs::write(dir.join("ratelimit.yaml"), domain(i)).unwrap();
    if i % 100 == 0 {
        // A file with a table that could never apply: refused, the old config stays.
        let never = "[limits.ip]\nban = { after = 1, within_secs = 1, for_secs = 1 }\n";
        gw.rewrite(&format!("{}{never}", body(i + ROUNDS, upstream)));
        let (status, v) = reload(c, gw).await;
        let detail = v["detail"].as_str().unwrap_or_default();
        assert_eq!(status, 400, "round {i}: {v}");
        assert!(detail.contains("would never limit anything"), "{v}");
    }
    gw.rewrite(&body(i, upstream));
    let (status, v) = reload(c, gw).await;
    let applied = (status, &v["reloaded"]) == (200, &Value::Bool(true));
    assert!(applied, "round {i}: {status} {v}\n{}", gw.log());
    let r = c.get(gw.url("/x")).header("x-user", format!("u{i}"));
    let status = r.send().await.unwrap().status();
    assert_eq!(status, 200, "round {i}");
}

/// The last round's window: its own counter, 2 a minute per address (one spent by its
/// round's request).
async fn last_round_enforced(c: &reqwest::Client, gw: &Gateway) {
    let r = c
        .get(gw.url("/x"))
        .header("x-user", "z")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(gw.url("/x"))
        .header("x-user", "z")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    let named = (v["route"].as_str(), v["scope"].as_str());
    assert_eq!(named, (Some("r1000"), Some("ip")), "{v}");
}

/// `/metrics` has series of the last config's route, route tables and custom scope only
/// (removed ones are dropped at each reload); `/v1/top` answers for its custom scope only.
async fn only_current_names(c: &reqwest::Client, gw: &Gateway) {
    let metrics = gw.metrics().await;
    let gone = [
        r#"scope="r999.ip""#,
        r#"scope="c999""#,
        r#"route="r999""#,
        r#"scope="r1.c1""#,
    ];
    for g in gone {
        assert!(!metrics.contains(g), "{g} still in /metrics");
    }
    for kept in [
        r#"scope="r1000.ip""#,
        r#"scope="c1000""#,
        r#"route="r1000""#,
    ] {
        assert!(metrics.contains(kept), "{kept} not in /metrics");
    }
    let decisions = metrics
        .lines()
        .filter(|l| l.starts_with("throttle_decisions_total{"));
    let series = decisions.count();
    assert!(
        series < 60,
        "{series} decision series after {ROUNDS} reloads"
    );
    let top = |scope: &str| {
        c.get(gw.admin_url(&format!("/v1/top?scope={scope}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
    };
    assert_eq!(top("c1000").await.unwrap().status(), 200);
    assert_eq!(top("c999").await.unwrap().status(), 400);
}
