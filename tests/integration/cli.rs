//! The CLI as a user runs it: `throttle check` and `throttle demo`.

use std::path::Path;
use std::process::Command;

use crate::support::{client, header, Gateway};

fn throttle(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_throttle"))
        .args(args)
        .output()
        .unwrap()
}

/// `throttle check` accepts the shipped config and exits 0.
#[test]
fn check_accepts_shipped_config() {
    let gw = Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.toml");
    let out = throttle(&["check", "--config", gw.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(": ok"));
}

/// For every invalid fixture `throttle check` exits non-zero and prints FILE:LINE:COL: message.
#[test]
fn check_names_file_line_and_column() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config/invalid");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let expect = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .strip_prefix("# expect: ")
            .unwrap()
            .trim()
            .to_string();
        let p = path.to_str().unwrap();
        let out = throttle(&["check", "--config", p]);
        assert_eq!(out.status.code(), Some(1), "{p}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with(&format!("{p}:{expect}")),
            "{p}: {stderr}"
        );
        n += 1;
    }
    assert!(n >= 10);
    let out = throttle(&["check", "--config", "/nonexistent.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("/nonexistent.toml: cannot read"));
}

/// `throttle check` on a region of a three-region fleet (issue 37): the file passes with
/// its peers' URLs in the environment and says what it warns about; a bad `fleet`, a
/// missing variable and a memory store each fail naming file:line:col.
#[test]
fn check_a_three_region_config() {
    let dir = tempfile::tempdir().unwrap();
    let good = r#"[store]
backend = "redis"
url = "redis://127.0.0.1:6379"

[regions]
name = "eu"
peers = { us = "${US_REDIS}", ap = "${AP_REDIS}" }

[tiers.pro]
fleet = "regions"
key = { per_second = 100, per_day = 1000000 }
tenant = { per_minute = 2 }

[scopes.user]
from = "header:X-User-Id"

[limits.user]
per_minute = 5
fleet = "home"

[[keys]]
id = "k1"
key = "a-long-enough-test-key-for-the-check"
tenant = "acme"
tier = "pro"

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:9000"]
"#;
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let check = |path: &str, env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_throttle"));
        cmd.args(["check", "--config", path])
            .env_remove("US_REDIS")
            .env_remove("AP_REDIS");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let peers = [
        ("US_REDIS", "redis://us.example:6379"),
        ("AP_REDIS", "rediss://ap.example:6380"),
    ];
    let path = write("eu.toml", good);
    let (code, stdout, stderr) = check(&path, &peers);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with(&format!("{path}: ok (1 routes, 1 tiers, 1 keys")),
        "{stdout}"
    );
    // The tenant's 2 a minute across 3 regions: passes, with a warning at its value.
    assert!(
        stderr.starts_with(&format!(
            "{path}:12:25: warning: per_minute = 2 with fleet = \"regions\" is below the 3 regions"
        )),
        "{stderr}"
    );
    // Without the peers' variables: the first one read is named.
    let (code, _, stderr) = check(&path, &peers[..1]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.starts_with(&format!(
            "{path}:7:36: [regions] peers.ap: environment variable AP_REDIS is not set"
        )),
        "{stderr}"
    );
    // A token bucket cannot be one limit across regions.
    let bad = good.replace(
        "key = { per_second = 100, per_day = 1000000 }",
        "key = { per_second = 100, per_day = 1000000, algorithm = \"token_bucket\" }",
    );
    let path = write("bucket.toml", &bad);
    let (code, _, stderr) = check(&path, &peers);
    assert_eq!(code, Some(1));
    assert!(
        stderr.starts_with(&format!(
            "{path}:11:58: algorithm = \"token_bucket\" with fleet = \"regions\" (the tier's)"
        )),
        "{stderr}"
    );
    // Each region keeps its own Redis.
    let memory = good.replace(
        "backend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"",
        "backend = \"memory\"",
    );
    let path = write("memory.toml", &memory);
    let (code, _, stderr) = check(&path, &peers);
    assert_eq!(code, Some(1));
    assert!(
        stderr.starts_with(&format!(
            "{path}:4:1: [regions] needs [store] backend = \"redis\""
        )),
        "{stderr}"
    );
}

/// `throttle demo` serves the shipped routes from its own upstream: 200s, then a 429.
#[tokio::test(flavor = "multi_thread")]
async fn demo_gives_200_then_429() {
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.toml"))
            .unwrap();
    // Keep everything but [server] (the helper renders its own with free ports).
    let body: String = shipped
        .split("[client_ip]")
        .nth(1)
        .map(|rest| format!("[client_ip]{rest}"))
        .unwrap();
    let gw = Gateway::start_with(&["demo"], &body).await;
    let c = client();
    let hello = || {
        c.get(gw.url("/v1/hello"))
            .header("authorization", "Bearer demo-key-123")
            .send()
    };
    // The free tier allows 5 per second: a full bucket admits the first 5 whatever the
    // machine's speed (refill only adds), and a burst of 30 at once then meets a 429
    // however slowly a loaded machine serves them (refill timing is proven in unit tests).
    for _ in 0..5 {
        let r = hello().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.json::<serde_json::Value>().await.unwrap()["upstream"],
            "throttle-demo"
        );
    }
    let burst = futures_util::future::join_all((0..30).map(|_| hello())).await;
    let limited: Vec<_> = burst
        .into_iter()
        .map(|r| r.unwrap())
        .filter(|r| r.status() == 429)
        .collect();
    let r = limited
        .into_iter()
        .next()
        .expect("a 429 in a burst of 30 after 5");
    assert_eq!(header(&r, "retry-after"), "1");
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["scope"], "key");
}
