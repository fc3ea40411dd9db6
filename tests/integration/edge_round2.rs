//! Edge hardening, second round, on the real binary: host before prefix (with a real
//! nginx upstream), IPv4 carried in IPv6, unambiguous credentials, only the client-IP
//! chain the gateway read is forwarded, methods and `Host` on every version, protocol
//! upgrades only where a route allows them, and case-insensitive upstreams.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::nginx::Nginx;
use crate::support::{client, raw_exchange, Gateway, Upstream};

/// Body text of a response.
async fn text(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// An internal site behind `host` (every path, key required) and a public host-less
/// `/assets` route: a request naming the internal host is the internal site's, whatever
/// the prefix lengths, and needs its key; nginx shows which upstream served it.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_route_wins_over_a_longer_host_less_prefix() {
    let nginx = Nginx::start(&["internal", "public"]).await;
    let (internal, public) = (nginx.addrs[0], nginx.addrs[1]);
    let body = format!(
        r#"
[tiers.free]
key = {{ per_second = 100 }}

[[keys]]
id = "key_staff"
key = "staff-key"
tenant = "acme"
tier = "free"

[[routes]]
name = "internal"
host = "internal.example.com"
path_prefix = "/"
upstreams = ["{internal}"]
auth = "required"

[[routes]]
name = "ops"
host = "ops.example.com"
path_prefix = "/admin"
upstreams = ["{internal}"]
auth = "required"

[[routes]]
name = "assets"
path_prefix = "/assets"
upstreams = ["{public}"]
auth = "none"
"#
    );
    let gw = Gateway::start(&body, None).await;
    let c = client();
    let get = |host: &'static str, key: Option<&'static str>| {
        let mut req = c.get(gw.url("/assets/x")).header("host", host);
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        req.send()
    };
    // The attack of the finding: no key, the internal host, a public prefix.
    let (status, body) = text(get("internal.example.com", None).await.unwrap()).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("missing_api_key"), "{body}");
    // Case, port and a trailing dot do not make it another host.
    let (status, _) = text(get("INTERNAL.example.com.:8080", None).await.unwrap()).await;
    assert_eq!(status, 401);
    // With the key, the internal upstream serves it.
    let (status, body) = text(
        get("internal.example.com", Some("staff-key"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("internal GET /assets/x"), "{body}");
    // Any other host is the public site.
    let (status, body) = text(get("www.example.com", None).await.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("public GET /assets/x"), "{body}");
    // A host with routes is a virtual host of its own: a path none of its routes serves
    // is 404, not the public route with that Host forwarded to its upstream.
    let (status, body) = text(get("ops.example.com", None).await.unwrap()).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no_route"), "{body}");
}

/// IPv4 clients behind NAT64 (and in the other IPv6 forms that carry IPv4) each have a
/// limit of their own, and a block on the IPv4 address holds for them.
#[tokio::test(flavor = "multi_thread")]
async fn ipv4_in_ipv6_counts_as_ipv4() {
    let up = Upstream::start("u").await;
    let body = r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[limits.ip]
per_minute = 1

[[blocks]]
scope = "ip"
value = "192.0.2.99"
reason = "abuse"

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;
    let gw = Gateway::start(body, Some(&up)).await;
    let c = client();
    let from = |xff: &'static str| c.get(gw.url("/x")).header("x-forwarded-for", xff).send();
    // Four IPv4 clients behind one NAT64 /64 (and other embeddings): one request each.
    for xff in [
        "64:ff9b::192.0.2.7",
        "64:ff9b::c000:208",
        "::ffff:0:192.0.2.9",
        "64:ff9b:1::192.0.2.10",
    ] {
        let r = from(xff).await.unwrap();
        assert_eq!(r.status(), 200, "{xff}");
        let echo: Value = r.json().await.unwrap();
        let v4 = echo["headers"]["x-real-ip"].as_str().unwrap().to_string();
        assert!(v4.starts_with("192.0.2."), "{xff} -> {v4}");
    }
    // The same IPv4 client, however it is written, has spent its one request.
    for xff in ["192.0.2.7", "::ffff:192.0.2.7", "64:ff9b::c000:207"] {
        assert_eq!(from(xff).await.unwrap().status(), 429, "{xff}");
    }
    // A block on the IPv4 address holds behind NAT64.
    assert_eq!(from("64:ff9b::192.0.2.99").await.unwrap().status(), 403);
}

const KEYED: &str = r#"
[tiers.free]
key = { per_second = 100 }

[[keys]]
id = "key_a"
key = "key-a"
tenant = "acme"
tier = "free"

[[keys]]
id = "key_b"
key = "key-b"
tenant = "globex"
tier = "free"

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "required"
"#;

/// Two credentials are refused (an upstream reading the other would serve a caller the
/// gateway did not identify); one credential sent both ways is one credential.
#[tokio::test(flavor = "multi_thread")]
async fn ambiguous_credentials_are_refused() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(KEYED, Some(&up)).await;
    let ambiguous: &[&[u8]] = &[
        b"GET /x HTTP/1.1\r\nHost: t\r\nX-API-Key: key-a\r\nX-API-Key: key-b\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer key-a\r\nX-API-Key: key-b\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer key-a\r\nAuthorization: Bearer key-a\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: t\r\nAuthorization: Basic YTpi\r\nAuthorization: Bearer key-a\r\n\r\n",
    ];
    for req in ambiguous {
        let mut s = TcpStream::connect(gw.addr).unwrap();
        let (status, _, body) = raw_exchange(&mut s, req).unwrap();
        let body = String::from_utf8_lossy(&body).to_string();
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(req));
        assert_eq!(body, r#"{"error":"ambiguous_credentials"}"#);
    }
    let mut s = TcpStream::connect(gw.addr).unwrap();
    let req =
        b"GET /x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer key-a\r\nX-API-Key: key-a\r\n\r\n";
    let (status, _, body) = raw_exchange(&mut s, req).unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let echo: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["headers"]["x-throttle-key-id"], "key_a");
}

const PUBLIC: &str = r#"
[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;

/// Only the client-IP chain the gateway read reaches the upstream as received: the other
/// one was never checked.
#[tokio::test(flavor = "multi_thread")]
async fn only_the_chain_the_gateway_read_is_forwarded() {
    let up = Upstream::start("u").await;
    let c = client();
    // Reading X-Forwarded-For from a trusted proxy: its chain is kept, a Forwarded is not.
    let body = format!("[client_ip]\ntrusted_proxies = [\"127.0.0.1/32\"]\n{PUBLIC}");
    let gw = Gateway::start(&body, Some(&up)).await;
    let r = c
        .get(gw.url("/x"))
        .header("x-forwarded-for", "203.0.113.7")
        .header("forwarded", "for=198.51.100.1")
        .send()
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert!(echo["headers"].get("forwarded").is_none(), "{echo}");
    drop(gw);
    // Reading Forwarded: its chain is kept, X-Forwarded-For carries this hop only.
    let body = format!(
        "[client_ip]\ntrusted_proxies = [\"127.0.0.1/32\"]\nheader = \"forwarded\"\n{PUBLIC}"
    );
    let gw = Gateway::start(&body, Some(&up)).await;
    let r = c
        .get(gw.url("/x"))
        .header("x-forwarded-for", "198.51.100.1")
        .header("forwarded", "for=203.0.113.7")
        .send()
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-real-ip"], "203.0.113.7");
    assert_eq!(echo["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(
        echo["headers"]["forwarded"],
        "for=203.0.113.7, for=127.0.0.1"
    );
}

/// TRACE, TRACK, CONNECT and lower-case methods are refused (405), and a request without
/// `Host` is refused on HTTP/1.0 as on HTTP/1.1.
#[tokio::test(flavor = "multi_thread")]
async fn methods_and_hosts_on_every_version() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(PUBLIC, Some(&up)).await;
    let cases: &[(&[u8], u16, &str)] = &[
        (
            b"TRACE /x HTTP/1.1\r\nHost: t\r\n\r\n",
            405,
            "method_not_allowed",
        ),
        (
            b"TRACK /x HTTP/1.1\r\nHost: t\r\n\r\n",
            405,
            "method_not_allowed",
        ),
        (
            b"get /x HTTP/1.1\r\nHost: t\r\n\r\n",
            405,
            "method_not_allowed",
        ),
        (
            b"Post /x HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n",
            405,
            "method_not_allowed",
        ),
        (b"GET /x HTTP/1.0\r\n\r\n", 400, "invalid_host"),
        (b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n", 200, "\"/x\""),
        (
            b"PROPFIND /x HTTP/1.1\r\nHost: t\r\n\r\n",
            200,
            "\"PROPFIND\"",
        ),
        (b"GET /x HTTP/1.0\r\nHost: t\r\n\r\n", 200, "\"/x\""),
    ];
    for (req, want, body_has) in cases {
        let mut s = TcpStream::connect(gw.addr).unwrap();
        let got = raw_exchange(&mut s, req);
        let (status, _, body) = got.unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(req)));
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, *want, "{} -> {body}", String::from_utf8_lossy(req));
        assert!(body.contains(body_has), "{body}");
    }
}

/// An upstream that switches to an echo tunnel when asked to upgrade, else answers
/// `plain`; it counts nothing, it only shows what it was asked.
async fn upgrading_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                // `/rogue` switches protocols whatever it was asked.
                if head.contains("\r\nupgrade: websocket") || head.starts_with("get /rogue") {
                    let _ = s
                        .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
                        .await;
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                } else {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nplain")
                        .await;
                }
            });
        }
    });
    addr
}

/// A WebSocket upgrade is forwarded only on a route with `upgrade = true`: elsewhere the
/// upstream sees a plain request, so one admission cannot open an unmetered tunnel. An
/// allowed tunnel is not cut at `body_timeout_secs`.
#[tokio::test(flavor = "multi_thread")]
async fn upgrades_only_where_the_route_allows_them() {
    let up = upgrading_upstream().await;
    let body = format!(
        r#"
[[routes]]
name = "ws"
path_prefix = "/ws"
upstreams = ["{up}"]
auth = "none"
upgrade = true

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{up}"]
auth = "none"
"#
    );
    // A tunnel outlives `body_timeout_secs`: its bytes are no request body.
    let gw = Gateway::start_full(
        &["run"],
        &body,
        "grace_period_secs = 0\nbody_timeout_secs = 1",
    )
    .await;
    let upgrade = |path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
    };
    // The default route: the upgrade is not forwarded, the upstream answers plain HTTP.
    let mut s = TcpStream::connect(gw.addr).unwrap();
    let (status, _, body) = raw_exchange(&mut s, upgrade("/api").as_bytes()).unwrap();
    assert_eq!((status, body.as_slice()), (200, &b"plain"[..]));
    // An upstream that switches protocols unasked gets no tunnel: 502.
    let mut s = TcpStream::connect(gw.addr).unwrap();
    let (status, _, _) = raw_exchange(&mut s, upgrade("/rogue").as_bytes()).unwrap();
    assert_eq!(status, 502);
    // The route that allows it: 101, then bytes go both ways.
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(upgrade("/ws").as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "closed before the 101");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    for _ in 0..3 {
        s.write_all(b"ping").unwrap();
        let mut echo = [0u8; 4];
        s.read_exact(&mut echo).unwrap();
        assert_eq!(&echo, b"ping");
        std::thread::sleep(Duration::from_millis(700)); // time passing in the tunnel
    }
}

/// With `case_insensitive_paths`, case and trailing dots or spaces do not dodge a route
/// (an IIS upstream serves `/ADMIN./x` as `/admin/x`); without it paths are exact.
#[tokio::test(flavor = "multi_thread")]
async fn case_insensitive_paths_match_as_the_upstream_serves() {
    let up = Upstream::start("u").await;
    let routes = r#"
[[routes]]
name = "admin"
path_prefix = "/admin"
upstreams = ["{upstream}"]
auth = "required"

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;
    let c = client();
    let gw = Gateway::start(routes, Some(&up)).await;
    assert_eq!(
        c.get(gw.url("/ADMIN/x")).send().await.unwrap().status(),
        200
    );
    drop(gw);
    let gw = Gateway::start_full(
        &["run"],
        &routes.replace("{upstream}", &up.addr.to_string()),
        "grace_period_secs = 0\ncase_insensitive_paths = true",
    )
    .await;
    for path in ["/admin/x", "/ADMIN/x", "/Admin./x", "/admin%20/x", "/aDmIn"] {
        let r = c.get(gw.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
    }
    // The forwarded path is the client's (normalized), not the folded one.
    let r = c.get(gw.url("/Public/X")).send().await.unwrap();
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["path"], "/Public/X");
}

/// A flood of bans cannot push out an older one: with the table full (100,000 bans in
/// force), new bans are refused and counted, and the first ban still holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_ban_flood_does_not_evict_older_bans() {
    let up = Upstream::start("u").await;
    let body = r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[limits.ip]
per_hour = 1
ban = { after = 1, within_secs = 3600, for_secs = 3600, from_check = true }

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;
    // 16 concurrent checkers from one address: over the admin listener's per-client cap.
    let body = body.replace("{upstream}", &up.addr.to_string());
    let server = "grace_period_secs = 0\nadmin_max_connections_per_ip = 64";
    let gw = Gateway::start_full(&["run"], &body, server).await;
    let c = client();
    let attacker = |c: &reqwest::Client| {
        c.get(gw.url("/x"))
            .header("x-forwarded-for", "198.51.100.1")
            .send()
    };
    assert_eq!(attacker(&c).await.unwrap().status(), 200);
    assert_eq!(attacker(&c).await.unwrap().status(), 429); // the ban's one rejection
    assert_eq!(attacker(&c).await.unwrap().status(), 403);
    // 100,050 other addresses, each banned by one refused check (from_check = true),
    // after a check that spends its window (a cost above it would be 400, no strike).
    const FLOOD: u32 = 100_050;
    const TASKS: u32 = 16;
    let url = gw.admin_url("/v1/check");
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while i < FLOOD {
                let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
                for want in [200, 429] {
                    let r = c
                        .post(&url)
                        .json(&serde_json::json!({"ip": ip}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), want, "{ip}");
                }
                i += TASKS;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // The attacker's ban is still in force; the bans past the cap were refused.
    assert_eq!(attacker(&c).await.unwrap().status(), 403);
    let metrics = gw.metrics().await;
    let dropped: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("throttle_bans_dropped_total{source=\"check\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(dropped >= 51.0, "throttle_bans_dropped_total {dropped}");
}

/// A service calling `POST /v1/check` with the check token is not charged for its users'
/// failed key lookups: one user's guesses exhaust that user's `[limits.auth]`, not every
/// other user's checks.
#[tokio::test(flavor = "multi_thread")]
async fn a_tokened_checker_is_not_locked_out_by_one_users_guesses() {
    let up = Upstream::start("u").await;
    let body = format!("[limits.auth]\nper_minute = 3\n{KEYED}")
        .replace("{upstream}", &up.addr.to_string());
    let server = "grace_period_secs = 0\ncheck_token = \"${THROTTLE_CHECK_TOKEN_E}\"";
    let env = [("THROTTLE_CHECK_TOKEN_E", Some("svc-token-0123456789"))];
    let gw = Gateway::start_env(&["run"], &body, server, &env).await;
    let c = client();
    let check = |ip: &str, key: &str| {
        c.post(gw.admin_url("/v1/check"))
            .header("authorization", "Bearer svc-token-0123456789")
            .json(&serde_json::json!({"ip": ip, "api_key": key}))
            .send()
    };
    for _ in 0..6 {
        check("198.18.0.7", "guess").await.unwrap();
    }
    // The guesser is over its budget; another user of the same service is not.
    let r = check("198.18.0.7", "key-a").await.unwrap();
    assert_eq!(r.status(), 429);
    let r = check("9.9.9.9", "key-a").await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // Two Authorization headers, even both right, are not one credential.
    let r = c
        .post(gw.admin_url("/v1/check"))
        .header("authorization", "Bearer svc-token-0123456789")
        .header("authorization", "Bearer svc-token-0123456789")
        .json(&serde_json::json!({"ip": "9.9.9.9"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

/// With every upstream of a route down, a keep-alive client gets `502 bad_gateway` on
/// every request of its connection, never a reset one; a 502 after a failed connect (the
/// gateway closes that connection) says `Connection: close`.
#[tokio::test(flavor = "multi_thread")]
async fn a_keep_alive_client_gets_502_on_every_request_when_the_upstream_is_down() {
    let (a, b) = (crate::support::free_port(), crate::support::free_port());
    let body = format!(
        r#"
[[routes]]
name = "down"
path_prefix = "/down"
upstreams = ["127.0.0.1:{a}", "127.0.0.1:{b}"]
auth = "none"
health_check = {{ path = "/healthz", interval_ms = 100 }}

[[routes]]
name = "refused"
path_prefix = "/refused"
upstreams = ["127.0.0.1:{a}"]
auth = "none"
"#
    );
    let gw = Gateway::start(&body, None).await;
    let down = format!("throttle_upstream_healthy{{route=\"down\",upstream=\"127.0.0.1:{b}\"}} 0");
    crate::support::eventually(Duration::from_secs(10), "both upstreams down", || async {
        let m = gw.metrics().await;
        (m.contains(&down) && m.contains(&format!("upstream=\"127.0.0.1:{a}\"}} 0"))).then_some(())
    })
    .await;
    let mut s = TcpStream::connect(gw.addr).unwrap();
    for i in 0..5 {
        let got = raw_exchange(&mut s, b"GET /down/x HTTP/1.1\r\nHost: t\r\n\r\n");
        let (status, head, body) = got.unwrap_or_else(|| panic!("request {i}: connection closed"));
        assert_eq!(status, 502, "request {i}");
        assert_eq!(body, br#"{"error":"bad_gateway"}"#);
        assert!(
            !head.to_ascii_lowercase().contains("connection: close"),
            "{head}"
        );
    }
    let mut s = TcpStream::connect(gw.addr).unwrap();
    let (status, head, _) =
        raw_exchange(&mut s, b"GET /refused HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert_eq!(status, 502);
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
}
