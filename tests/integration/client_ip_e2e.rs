//! Client IP resolution seen from outside: what the upstream receives, and that limits
//! are keyed on the resolved address.

use serde_json::Value;

use crate::support::{client, header, Gateway, Upstream};

const ROUTES: &str = r#"
[limits.ip]
per_minute = 2

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;

/// Behind a trusted proxy the right-most untrusted hop is the client; the chain is kept
/// with the peer appended, and each client has its own ip budget.
#[tokio::test(flavor = "multi_thread")]
async fn trusted_proxy_chain_resolves_right_most_untrusted_hop() {
    let up = Upstream::start("u").await;
    let body =
        format!("[client_ip]\ntrusted_proxies = [\"127.0.0.1/32\", \"10.0.0.0/8\"]\n{ROUTES}");
    let gw = Gateway::start(&body, Some(&up)).await;
    let c = client();
    let r = c
        .get(gw.url("/x"))
        .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.1.1")
        .send()
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-real-ip"], "203.0.113.7");
    assert_eq!(
        echo["headers"]["x-forwarded-for"],
        "6.6.6.6, 203.0.113.7, 10.1.1.1, 127.0.0.1"
    );
    // 203.0.113.7 has one request left; a spoofed left-most entry does not change who it is.
    let r = c
        .get(gw.url("/x"))
        .header("x-forwarded-for", "1.1.1.1, 203.0.113.7")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    let r = c
        .get(gw.url("/x"))
        .header("x-forwarded-for", "9.9.9.9, 203.0.113.7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    // Another client behind the same proxy is unaffected.
    let r = c
        .get(gw.url("/x"))
        .header("x-forwarded-for", "198.51.100.4")
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), header(&r, "x-ratelimit-remaining")),
        (200, "1".to_string())
    );
}

/// From an untrusted peer X-Forwarded-For is ignored: the peer is the client and the
/// upstream gets the peer alone.
#[tokio::test(flavor = "multi_thread")]
async fn ignores_xff_from_untrusted_peer() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(ROUTES, Some(&up)).await;
    let c = client();
    for xff in ["203.0.113.1", "203.0.113.2"] {
        let r = c
            .get(gw.url("/x"))
            .header("x-forwarded-for", xff)
            .send()
            .await
            .unwrap();
        let echo: Value = r.json().await.unwrap();
        assert_eq!(echo["headers"]["x-forwarded-for"], "127.0.0.1");
        assert_eq!(echo["headers"]["x-real-ip"], "127.0.0.1");
    }
    // Both requests were charged to the peer, whatever the header claimed.
    let r = c
        .get(gw.url("/x"))
        .header("x-forwarded-for", "203.0.113.3")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
}
