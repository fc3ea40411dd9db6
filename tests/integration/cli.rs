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
