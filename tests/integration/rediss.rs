//! `rediss://` store URLs: the gateway decides on a redis-server reached over TLS,
//! verifying it against the file named by `SSL_CERT_FILE` (a test CA), and refuses a
//! server its trust store does not vouch for.

use crate::support::redis::RedisServer;
use crate::support::tls::TestCa;
use crate::support::{client, Gateway, Upstream};

fn body(tls_port: u16, upstream: &Upstream) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "rediss://127.0.0.1:{tls_port}"
timeout_ms = 2000
on_failure = "closed"

[limits.ip]
per_minute = 3

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{}"]
auth = "none"
"#,
        upstream.addr
    )
}

async fn statuses(gw: &Gateway, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            client()
                .get(gw.url("/x"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    out
}

/// With `SSL_CERT_FILE` naming the CA, limits are decided in Redis over TLS; without it
/// (system roots only) the server is not trusted and a closed scope answers 503.
#[tokio::test(flavor = "multi_thread")]
async fn decides_over_tls_verified_by_ssl_cert_file() {
    let ca = TestCa::new();
    let certs = tempfile::tempdir().unwrap();
    TestCa::write(&ca.leaf(), certs.path());
    std::fs::write(certs.path().join("ca.pem"), ca.pem()).unwrap();
    let (redis, tls_port) = RedisServer::start_tls(certs.path()).await;
    let up = Upstream::start("rediss").await;
    let ca_file = certs.path().join("ca.pem");

    let gw = Gateway::start_env(
        &["run"],
        &body(tls_port, &up),
        "grace_period_secs = 0",
        &[("SSL_CERT_FILE", Some(ca_file.to_str().unwrap()))],
    )
    .await;
    assert_eq!(statuses(&gw, 4).await, [200, 200, 200, 429], "{}", gw.log());
    let mut c = redis.client().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("thr:*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!keys.is_empty(), "no limiter keys in Redis");
    drop(gw);

    let untrusted = Gateway::start_env(
        &["run"],
        &body(tls_port, &up),
        "grace_period_secs = 0",
        &[("SSL_CERT_FILE", None), ("SSL_CERT_DIR", None)],
    )
    .await;
    assert_eq!(statuses(&untrusted, 2).await, [503, 503]);
}
