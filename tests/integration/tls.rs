//! `[server] tls`: TLS with HTTP/2 by ALPN on the proxy listener, limits over HTTP/2, and a
//! new certificate served after a reload.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::support::tls::TestCa;
use crate::support::{client, eventually, Gateway, Upstream, ADMIN_TOKEN};

const BODY: &str = r#"
[limits.ip]
per_minute = 3

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;

/// Statuses and versions of `n` GETs on one HTTP/2 connection.
async fn h2_statuses(
    tls: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    n: usize,
) -> Vec<(u16, http::Version)> {
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut out = Vec::new();
    for _ in 0..n {
        let req = http::Request::get("https://localhost/x")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let (status, version) = (resp.status().as_u16(), resp.version());
        resp.into_body().collect().await.unwrap();
        out.push((status, version));
    }
    out
}

/// HTTP/2 is chosen by ALPN, limits apply (429 after the limit), and after a reload
/// with a new certificate the next handshake serves it.
#[tokio::test(flavor = "multi_thread")]
async fn serves_h2_by_alpn_and_reloads_the_certificate() {
    let ca = TestCa::new();
    let certs = tempfile::tempdir().unwrap();
    let first = ca.leaf();
    TestCa::write(&first, certs.path());
    let server = format!(
        "grace_period_secs = 0\ntls = {{ cert = \"{0}/cert.pem\", key = \"{0}/key.pem\" }}",
        certs.path().display()
    );
    let up = Upstream::start("tls").await;
    let body = BODY.replace("{upstream}", &up.addr.to_string());
    let gw = Gateway::start_full(&["run"], &body, &server).await;

    let (tls, alpn, served) = ca.connect(gw.addr).await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(served, first.der);
    let got = h2_statuses(tls, 4).await;
    assert!(
        got.iter().all(|(_, v)| *v == http::Version::HTTP_2),
        "{got:?}"
    );
    let statuses: Vec<u16> = got.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);

    let second = ca.leaf();
    TestCa::write(&second, certs.path());
    let r = client()
        .post(gw.admin_url("/v1/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let served = eventually(Duration::from_secs(5), "the new certificate", || async {
        let (_, _, served) = ca.connect(gw.addr).await;
        (served == second.der).then_some(served)
    })
    .await;
    assert_ne!(served, first.der);
}
