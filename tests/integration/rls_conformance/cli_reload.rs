//! The YAML as an operator meets it: `throttle check` naming FILE:LINE:COL of a broken
//! file, and reloads (`POST /v1/reload`, SIGHUP) changing the limits under a live gRPC
//! connection, a broken file keeping the old ones.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::{Channel, Endpoint};

use super::{body, desc_hits, fresh_window, one, req, show, Rls, Store};
use crate::support::{client, eventually, ADMIN_TOKEN};

/// A gateway.toml for `throttle check` with `[rls] config = config` (as written).
fn gateway_toml(dir: &Path, config: &str) -> std::path::PathBuf {
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:18080\"\nadmin_listen = \"127.0.0.1:19090\"\nrls_listen = \"127.0.0.1:18081\"\n\n[rls]\nconfig = \"{config}\"\n\n[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:9\"]\n"
    );
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// `throttle check --config toml`: (exit code, stdout + stderr).
fn check(toml: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_throttle"))
        .args(["check", "--config", toml.to_str().unwrap()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The `LINE:COL` of the first `file:LINE:COL: message` in `out`.
fn position(out: &str, file: &str) -> Option<(u32, u32)> {
    out.match_indices(&format!("{file}:"))
        .find_map(|(at, pat)| {
            let mut parts = out[at + pat.len()..].splitn(3, ':');
            let line = parts.next()?.parse().ok()?;
            let col = parts.next()?.parse().ok()?;
            let message = parts.next()?.lines().next()?.trim();
            (!message.is_empty()).then_some((line, col))
        })
}

const HEAD: &str = "domain: chk\ndescriptors:\n  - key: a\n";
const LIMIT: &str = "    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n";

/// Every kind of load error of the contract: `throttle check` exits 1 naming the YAML
/// file, the line (of the offending entry) and a column; a relative directory is read
/// from gateway.toml's directory, the broken file of it named; a good one passes.
#[test]
fn check_names_yaml_file_line_and_column() {
    let broken: Vec<(&str, String, &[u32])> = vec![
        (
            "unknown field",
            format!("{HEAD}{LIMIT}      burst: 3\n"),
            &[7],
        ),
        (
            "bad unit",
            format!("{HEAD}    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"),
            &[5],
        ),
        (
            "empty domain",
            format!("domain: \"\"\ndescriptors:\n  - key: a\n{LIMIT}"),
            &[1],
        ),
        (
            "empty key",
            format!("domain: chk\ndescriptors:\n  - key: \"\"\n{LIMIT}"),
            &[3],
        ),
        (
            "unit with unlimited",
            format!("{HEAD}    rate_limit:\n      unlimited: true\n      unit: minute\n"),
            &[4, 5, 6],
        ),
        (
            "share_threshold without *",
            format!("{HEAD}    value: plain\n    share_threshold: true\n{LIMIT}"),
            &[3, 4, 5],
        ),
        (
            "replaces itself",
            format!("{HEAD}{LIMIT}      name: me\n      replaces:\n        - name: me\n"),
            &[4, 7, 8, 9],
        ),
        (
            "empty replaces name",
            format!("{HEAD}{LIMIT}      replaces:\n        - name: \"\"\n"),
            &[7, 8],
        ),
        (
            "duplicate composite key",
            format!("{HEAD}    value: v\n{LIMIT}  - key: a\n    value: v\n{LIMIT}"),
            &[8, 9],
        ),
        (
            "list of non-maps",
            "domain: chk\ndescriptors:\n  - just a string\n".into(),
            &[2, 3],
        ),
        (
            "YAML syntax",
            format!("{HEAD}    rate_limit:\n      unit: minute\n     requests_per_unit: 1\n"),
            &[4, 5, 6],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (what, yaml, lines) in &broken {
        let yaml_path = dir.path().join("broken.yaml");
        std::fs::write(&yaml_path, yaml).unwrap();
        let file = yaml_path.to_str().unwrap();
        let (code, out) = check(&gateway_toml(dir.path(), file));
        assert_eq!(code, Some(1), "{what}: {out}\n{yaml}");
        let (line, col) = position(&out, file)
            .unwrap_or_else(|| panic!("{what}: no {file}:LINE:COL: message in {out:?}"));
        assert!(
            lines.contains(&line) && col >= 1,
            "{what}: {line}:{col} in {out}\n{yaml}"
        );
    }

    // A relative directory: a.yaml is good, b.yml has an unknown field on line 4.
    let conf = dir.path().join("ratelimit");
    std::fs::create_dir(&conf).unwrap();
    let good = format!("domain: d1\ndescriptors:\n  - key: a\n{LIMIT}");
    std::fs::write(conf.join("a.yaml"), &good).unwrap();
    std::fs::write(
        conf.join("b.yml"),
        "domain: d2\ndescriptors:\n  - key: a\n    colour: red\n",
    )
    .unwrap();
    let toml = gateway_toml(dir.path(), "ratelimit");
    let (code, out) = check(&toml);
    assert_eq!(code, Some(1), "{out}");
    let b = conf.join("b.yml");
    assert_eq!(
        position(&out, b.to_str().unwrap()).map(|p| p.0),
        Some(4),
        "{out}"
    );

    // The same domain in two files: one of them is named.
    std::fs::write(conf.join("b.yml"), &good).unwrap();
    let (code, out) = check(&toml);
    assert_eq!(code, Some(1), "{out}");
    let a = conf.join("a.yaml");
    assert!(
        position(&out, b.to_str().unwrap()).is_some()
            || position(&out, a.to_str().unwrap()).is_some(),
        "{out}"
    );

    std::fs::write(conf.join("b.yml"), good.replace("d1", "d2")).unwrap();
    let (code, out) = check(&toml);
    assert_eq!(code, Some(0), "{out}");
}

fn yaml(per_minute: u32, name: &str) -> String {
    format!("domain: rel\ndescriptors:\n  - key: r\n    rate_limit:\n      unit: minute\n      requests_per_unit: {per_minute}\n      name: {name}\n")
}

async fn ask(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    let what = show(&r);
    match c.should_rate_limit(r).await {
        Ok(r) => r.into_inner(),
        Err(s) => panic!("{what}: {s:?}"),
    }
}

/// `(requests_per_unit, name, remaining)` of the one status.
fn limit_of(r: &RateLimitResponse) -> (u32, String, u32) {
    let s = &r.statuses[0];
    let l = s.current_limit.clone().unwrap_or_default();
    assert_eq!(l.unit(), Unit::Minute, "{r:?}");
    (l.requests_per_unit, l.name, s.limit_remaining)
}

/// A changed YAML reloaded (`POST /v1/reload`, then SIGHUP) changes the limit for the
/// next call on the same gRPC connection (one TCP connection for the whole test); a broken
/// YAML is refused naming the file and the old limit stays.
#[tokio::test(flavor = "multi_thread")]
async fn reload_changes_limits_on_a_live_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rel.yaml");
    std::fs::write(&path, yaml(2, "v1")).unwrap();
    let rls = Rls::start(&body(&Store::Memory, &path, false)).await;
    let connects = Arc::new(AtomicUsize::new(0));
    let (counter, addr) = (connects.clone(), rls.addr);
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                let s = tokio::net::TcpStream::connect(addr).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .unwrap();
    let mut c = RateLimitServiceClient::new(channel);
    fresh_window(20.0).await;
    let r = || one("rel", &[&[("r", "x")]]);
    assert_eq!(limit_of(&ask(&mut c, r()).await), (2, "v1".into(), 1));

    let http = client();
    let reload = || async {
        let r = http
            .post(rls.gw.admin_url("/v1/reload"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    std::fs::write(&path, yaml(5, "v2")).unwrap();
    let (status, text) = reload().await;
    assert_eq!(status, 200, "{text}");
    let (limit, name, left) = limit_of(&ask(&mut c, r()).await);
    // The window's count may or may not carry over a reload (1 or 2 spent of 5).
    assert_eq!((limit, name.as_str()), (5, "v2"));
    assert!((3..=4).contains(&left), "{left} left of 5");

    std::fs::write(&path, yaml(9, "v3").replace("minute", "fortnight")).unwrap();
    let (status, text) = reload().await;
    assert_eq!(status, 400, "a broken YAML was accepted: {text}");
    assert!(text.contains(path.to_str().unwrap()), "{text}");
    let resp = ask(&mut c, r()).await;
    assert_eq!(resp.overall_code(), Code::Ok);
    assert_eq!(limit_of(&resp).0, 5, "the old limit must stay: {resp:?}");

    // SIGHUP re-reads it too; polled with hits_addend 0 (checks, consumes nothing).
    std::fs::write(&path, yaml(7, "v3")).unwrap();
    rls.gw.signal("HUP");
    let probe = || req("rel", vec![desc_hits(&[("r", "x")], 0)]);
    eventually(Duration::from_secs(10), "the SIGHUP reload", || {
        let mut c = c.clone();
        async move { (limit_of(&ask(&mut c, probe()).await).0 == 7).then_some(()) }
    })
    .await;
    assert_eq!(
        connects.load(Ordering::SeqCst),
        1,
        "the gRPC connection was dropped"
    );
}
