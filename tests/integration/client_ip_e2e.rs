//! Client IP resolution seen from outside: what the upstream receives, and that limits
//! are keyed on the resolved address.

use serde_json::Value;

use crate::support::redis::RedisServer;
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

/// An IPv6 client is counted by its /64 (the default `ipv6_prefix`): rotating addresses
/// inside the network does not buy a fresh budget; another /64 has its own. The Redis key
/// names the network. With `ipv6_prefix = 128` each address counts alone.
#[tokio::test(flavor = "multi_thread")]
async fn ipv6_clients_count_by_their_64() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"v6\"\ntimeout_ms = 500\n",
        redis.url()
    );
    let trusted = "[client_ip]\ntrusted_proxies = [\"127.0.0.1/32\"]\n";
    let gw = Gateway::start(&format!("{trusted}{store}{ROUTES}"), Some(&up)).await;
    let c = client();
    let from = |ip: &'static str| c.get(gw.url("/x")).header("x-forwarded-for", ip).send();
    assert_eq!(from("2001:db8:1:2::1").await.unwrap().status(), 200);
    let r = from("2001:db8:1:2:ffff:ffff:ffff:fffe").await.unwrap();
    assert_eq!(
        (r.status().as_u16(), header(&r, "x-ratelimit-remaining")),
        (200, "0".to_string())
    );
    assert_eq!(from("2001:db8:1:2:dead::beef").await.unwrap().status(), 429);
    // The neighbouring /64 and an IPv4 client are unaffected.
    assert_eq!(from("2001:db8:1:3::1").await.unwrap().status(), 200);
    assert_eq!(from("203.0.113.9").await.unwrap().status(), 200);
    let mut conn = redis.client().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("v6:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        keys.iter().any(|k| k == "v6:{ip:2001:db8:1:2::/64}:1m"),
        "{keys:?}"
    );
    assert!(
        keys.iter().any(|k| k == "v6:{ip:203.0.113.9}:1m"),
        "{keys:?}"
    );

    // Per address.
    let per_address = format!("{trusted}ipv6_prefix = 128\n{ROUTES}");
    let gw = Gateway::start(&per_address, Some(&up)).await;
    let from = |ip: &'static str| c.get(gw.url("/x")).header("x-forwarded-for", ip).send();
    for ip in ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::3"] {
        assert_eq!(from(ip).await.unwrap().status(), 200, "{ip}");
    }
}

/// `header = "forwarded"`: RFC 7239 `Forwarded` is walked like `X-Forwarded-For` (the
/// right-most untrusted `for=`), and `X-Forwarded-For` is then ignored; `unknown` stops
/// the walk at the last trusted hop.
#[tokio::test(flavor = "multi_thread")]
async fn forwarded_header_is_walked_from_the_right() {
    let up = Upstream::start("u").await;
    let body = format!(
        "[client_ip]\ntrusted_proxies = [\"127.0.0.1/32\", \"10.0.0.0/8\"]\nheader = \"forwarded\"\n{ROUTES}"
    );
    let gw = Gateway::start(&body, Some(&up)).await;
    let c = client();
    let send = |fwd: &'static str| {
        c.get(gw.url("/x"))
            .header("forwarded", fwd)
            .header("x-forwarded-for", "198.51.100.200")
            .send()
    };
    let r = send(r#"for=6.6.6.6, for="[2001:db8::7]:4711";proto=https, for=10.1.1.1"#)
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-real-ip"], "2001:db8::7");
    // The same client (its /64), written differently, has one request left.
    let r = send(r#"for="[2001:db8::99]""#).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(send(r#"for="[2001:db8::7]""#).await.unwrap().status(), 429);
    // `unknown` stops the walk: the client is the last trusted hop examined.
    let r = send("for=203.0.113.5, for=unknown, for=10.2.2.2")
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-real-ip"], "10.2.2.2");
}
