//! Hot reload (POST /v1/reload and SIGHUP) and the SIGTERM drain, on the real binary.

use std::io::Write;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::support::{client, eventually, header, raw_exchange, Gateway, Upstream, ADMIN_TOKEN};

fn body(per_minute: u32, extra_route: bool) -> String {
    let mut b = format!(
        "[tiers.t]\nkey = {{ per_minute = {per_minute}, algorithm = \"fixed_window\" }}\n\n[[routes]]\nname = \"api\"\npath_prefix = \"/v1\"\nupstreams = [\"{{upstream}}\"]\n\n[[keys]]\nid = \"k\"\nkey = \"secret\"\ntenant = \"acme\"\ntier = \"t\"\n"
    );
    if extra_route {
        b.push_str("\n[[routes]]\nname = \"new\"\npath_prefix = \"/new\"\nupstreams = [\"{upstream}\"]\nauth = \"none\"\n");
    }
    b
}

/// Waits until the gateway has admitted `n` requests of the key (the `key` scope's
/// allowed decisions): a slow request is then in flight.
async fn until_admitted(gw: &Gateway, n: u64) {
    let series = "throttle_decisions_total{decision=\"allowed\",scope=\"key\"} ";
    eventually(
        Duration::from_secs(5),
        "the slow request admitted",
        || async {
            let m = gw.metrics().await;
            let count = m
                .lines()
                .find_map(|l| l.strip_prefix(series))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            (count >= n).then_some(())
        },
    )
    .await;
}

/// A valid file applies to new requests; keep-alive connections and in-flight requests
/// survive; an invalid file is refused with the `throttle check` error and the old config
/// keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn reload_applies_valid_and_refuses_invalid_config() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(&body(2, false), Some(&up)).await;
    let c = client();
    let mut conn = std::net::TcpStream::connect(gw.addr).unwrap();
    let req = b"GET /v1/x HTTP/1.1\r\nHost: t\r\nX-API-Key: secret\r\n\r\n";
    let (s, head, _) = raw_exchange(&mut conn, req).unwrap();
    assert_eq!(s, 200);
    assert!(head.to_ascii_lowercase().contains("x-ratelimit-limit: 2"));
    assert_eq!(c.get(gw.url("/new")).send().await.unwrap().status(), 404);

    // A slow request in flight across the reload.
    let slow = tokio::spawn({
        let url = gw.url("/v1/slow?delay_ms=700");
        async move {
            client()
                .get(url)
                .header("x-api-key", "secret")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    // In flight once admitted (the raw request before it was the first).
    until_admitted(&gw, 2).await;
    gw.rewrite(&body(50, true).replace("{upstream}", &up.addr.to_string()));
    let unauthorized = c.post(gw.admin_url("/v1/reload")).send().await.unwrap();
    assert_eq!(unauthorized.status(), 401);
    let r = c
        .post(gw.admin_url("/v1/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["reloaded"], true);
    assert_eq!(
        slow.await.unwrap(),
        200,
        "the in-flight request was dropped"
    );
    // The same keep-alive connection, now under the new limits (state carries over: the
    // fixed window's count of 2 now counts against 50).
    let (s, head, _) =
        raw_exchange(&mut conn, req).expect("keep-alive connection dropped by the reload");
    assert_eq!(s, 200);
    assert!(
        head.to_ascii_lowercase().contains("x-ratelimit-limit: 50"),
        "{head}"
    );
    assert_eq!(c.get(gw.url("/new")).send().await.unwrap().status(), 200);

    // An invalid file: refused with file:line:col, the old config keeps serving.
    let path = gw.config_path();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(f, "\n[limits.ip]\nper_minute = 0").unwrap();
    let r = c
        .post(gw.admin_url("/v1/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let detail = r.json::<Value>().await.unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_string();
    let expected_prefix = format!("{}:", path.display());
    assert!(
        detail.starts_with(&expected_prefix) && detail.contains("per_minute must be at least 1"),
        "{detail}"
    );
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_throttle"))
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&check.stderr).trim(),
        detail,
        "the same error as throttle check"
    );
    let r = c.get(gw.url("/new")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(gw.url("/v1/x"))
        .header("x-api-key", "secret")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&r, "x-ratelimit-limit"), "50");
}

/// SIGHUP re-reads the file too.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(&body(2, false), Some(&up)).await;
    gw.rewrite(&body(2, true).replace("{upstream}", &up.addr.to_string()));
    gw.signal("HUP");
    eventually(Duration::from_secs(5), "route added by SIGHUP", || async {
        (client().get(gw.url("/new")).send().await.unwrap().status() == 200).then_some(())
    })
    .await;
}

/// SIGTERM: new connections are refused, the in-flight request completes, and the
/// process exits within the grace period.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_in_flight_requests_and_exits() {
    let up = Upstream::start("u").await;
    let mut gw = Gateway::start_full(
        &["run"],
        &body(100, false).replace("{upstream}", &up.addr.to_string()),
        "grace_period_secs = 2",
    )
    .await;
    let slow = tokio::spawn({
        let url = gw.url("/v1/slow?delay_ms=1000");
        async move {
            client()
                .get(url)
                .header("x-api-key", "secret")
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    until_admitted(&gw, 1).await;
    let sent = Instant::now();
    gw.signal("TERM");
    assert_eq!(
        slow.await.unwrap().unwrap(),
        200,
        "the in-flight request was cut"
    );
    let status = gw
        .wait_exit(Duration::from_secs(8))
        .await
        .expect("did not exit");
    let took = sent.elapsed();
    eprintln!("sigterm: exited {status} after {took:?} (grace_period_secs = 2)");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        std::net::TcpStream::connect(gw.addr).is_err(),
        "still accepting after exit"
    );
}

/// Zero-downtime upgrade: a new process started with `run --upgrade` takes over the
/// listeners when the old one gets SIGQUIT; every request in between is answered.
#[tokio::test(flavor = "multi_thread")]
async fn upgrade_hands_over_listeners_without_refusing_requests() {
    let up = Upstream::start("u").await;
    let sock = tempfile::tempdir().unwrap();
    let sock_path = sock.path().join("upgrade.sock");
    let server_extra = format!(
        "grace_period_secs = 1\nupgrade_sock = \"{}\"",
        sock_path.display()
    );
    let body = "[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstreams = [\"{upstream}\"]\nauth = \"none\"\n".replace("{upstream}", &up.addr.to_string());
    let mut old = Gateway::start_full(&["run"], &body, &server_extra).await;
    let url = old.url("/x");
    let mut new = std::process::Command::new(env!("CARGO_BIN_EXE_throttle"))
        .args([
            "run",
            "--upgrade",
            "--config",
            old.config_path().to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let c = client();
    let mut statuses = Vec::new();
    // `Connection: close` answers before and after SIGQUIT: the old process drains its
    // keep-alive connections from the signal on, so no client holds an idle one when
    // Pingora closes them at the end of the upgrade's close timeout.
    let (mut closed_before, mut closed_after) = (0, 0);
    let started = Instant::now();
    let mut signalled = false;
    while started.elapsed() < Duration::from_secs(15) {
        if !signalled && started.elapsed() > Duration::from_millis(1500) {
            old.signal("QUIT"); // the new process is polling the upgrade socket by now
            signalled = true;
        }
        let answer = c.get(&url).send().await;
        if let Ok(r) = &answer {
            let close = r
                .headers()
                .get("connection")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
            match (close, signalled) {
                (true, false) => closed_before += 1,
                (true, true) => closed_after += 1,
                _ => {}
            }
        }
        statuses.push(answer.map(|r| r.status().as_u16()).unwrap_or(0));
        if signalled && old.wait_exit(Duration::from_millis(1)).await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        old.wait_exit(Duration::from_secs(1)).await.is_some(),
        "the old process did not exit"
    );
    for _ in 0..5 {
        statuses.push(
            c.get(&url)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0),
        );
    }
    let _ = new.kill();
    let _ = new.wait();
    assert!(
        statuses.iter().all(|s| *s == 200),
        "requests refused or failed during the upgrade: {statuses:?}"
    );
    assert_eq!(closed_before, 0, "keep-alive refused before the upgrade");
    assert!(
        closed_after > 0,
        "the old process kept its keep-alive connections open after SIGQUIT"
    );
    eprintln!(
        "upgrade: {} requests, all 200, {closed_after} answered `Connection: close` while \
         the old process drained, old process gone after {:?}",
        statuses.len(),
        started.elapsed()
    );
}
