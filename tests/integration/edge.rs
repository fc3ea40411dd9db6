//! The route a request is matched on is the route its upstream serves: the bypasses found
//! against nginx (encoded separators, `..;`, absolute-form authority, trailing-dot hosts,
//! `//`, `%73`, `;x`) replayed against upstreams that decode paths the usual way, and the
//! header rules (underscores, `Forwarded`, rewrite headers).

use std::io::Write;
use std::net::TcpStream;

use serde_json::Value;

use crate::support::decoding::{route_of, Decoding, DecodingUpstream};
use crate::support::{client, header, raw_exchange, Gateway, Upstream};

const KEY: &str = "edge-key-1";

/// A gateway over five routes, each on its own upstream so the upstream's label says
/// which route the gateway chose; `params` is the `path_parameters` setting.
async fn gateway(ups: &Upstreams, params: &str) -> Gateway {
    let server = format!("grace_period_secs = 0\npath_parameters = \"{params}\"");
    Gateway::start_full(&["run"], &config(ups), &server).await
}

fn config(ups: &Upstreams) -> String {
    format!(
        r#"
[tiers.t]
key = {{ per_minute = 1000 }}

[[keys]]
id = "k1"
key = "{KEY}"
tenant = "acme"
tier = "t"

[[routes]]
name = "internal"
host = "internal.example.com"
path_prefix = "/"
upstreams = ["{internal}"]
auth = "required"

[[routes]]
name = "search"
path_prefix = "/v1/search"
upstreams = ["{search}"]
auth = "required"
cost = 5

[[routes]]
name = "v1"
path_prefix = "/v1"
upstreams = ["{v1}"]
auth = "required"

[[routes]]
name = "public"
path_prefix = "/public"
upstreams = ["{public}"]
auth = "none"

[[routes]]
name = "root"
path_prefix = "/"
upstreams = ["{root}"]
auth = "none"
"#,
        internal = ups.internal.addr,
        search = ups.search.addr,
        v1 = ups.v1.addr,
        public = ups.public.addr,
        root = ups.root.addr,
    )
}

struct Upstreams {
    internal: DecodingUpstream,
    search: DecodingUpstream,
    v1: DecodingUpstream,
    public: DecodingUpstream,
    root: DecodingUpstream,
}

impl Upstreams {
    async fn start(d: Decoding) -> Self {
        Self {
            internal: DecodingUpstream::start("internal", d).await,
            search: DecodingUpstream::start("search", d).await,
            v1: DecodingUpstream::start("v1", d).await,
            public: DecodingUpstream::start("public", d).await,
            root: DecodingUpstream::start("root", d).await,
        }
    }
}

/// The gateway's answer to one raw request: status, and the upstream's JSON when it
/// reached one.
fn send(gw: &Gateway, request: &str) -> (u16, Option<Value>) {
    let mut conn = TcpStream::connect(gw.addr).unwrap();
    let (status, _, body) = raw_exchange(&mut conn, request.as_bytes())
        .unwrap_or_else(|| panic!("no answer to {request:?}"));
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let from_upstream = json.filter(|j| j.get("upstream").is_some());
    (status, from_upstream)
}

fn get(path: &str, host: &str, key: bool) -> String {
    let auth = if key {
        format!("X-API-Key: {KEY}\r\n")
    } else {
        String::new()
    };
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}\r\n")
}

/// Either the gateway refused it (4xx, never 5xx), or the upstream that answered is the
/// one whose route the served path belongs to.
fn assert_consistent(gw: &Gateway, request: &str, decoding: Decoding) -> (u16, Option<Value>) {
    let (status, up) = send(gw, request);
    assert!(status < 500, "{request:?}: {status}");
    if let Some(up) = &up {
        let served = up["served"].as_str().unwrap_or_default();
        let host = up["host"].as_str().unwrap_or_default();
        assert_eq!(
            up["upstream"].as_str().unwrap(),
            route_of(host, served),
            "{request:?} was routed to {} but the upstream served {host}{served} ({decoding:?})",
            up["upstream"]
        );
    }
    (status, up)
}

/// The reported bypasses: each is now refused or routed where the upstream serves it.
#[tokio::test(flavor = "multi_thread")]
async fn reported_path_bypasses_are_closed_against_nginx_decoding() {
    let ups = Upstreams::start(Decoding::Nginx).await;
    let gw = gateway(&ups, "reject").await;
    // Encoded separators and dot segments: refused outright (400 invalid_path).
    for path in [
        "/public/%2e%2e%2fv1/secret",
        "/public/..%2fv1/secret",
        "/public/%2E%2E%2Fv1/secret",
        "/public/..%2Fv1/secret",
        "/public/%2e%2e%5cv1/secret",
        "/public/..;/v1/secret",
        "/public/.;/v1/secret",
        "/public/../v1/secret",
        "/public/%2e%2e/v1/secret",
    ] {
        let (status, up) = send(&gw, &get(path, "t", false));
        assert_eq!((status, up.is_none()), (400, true), "{path}");
    }
    // Paths the upstream reads as /v1/search are charged as /v1/search (cost 5).
    for path in ["/v1//search", "/v1/%73earch", "//v1/search", "/v1/./search"] {
        let (status, up) = assert_consistent(&gw, &get(path, "t", true), Decoding::Nginx);
        if status == 200 {
            assert_eq!(up.unwrap()["upstream"], "search", "{path}");
        } else {
            assert_eq!(status, 400, "{path}");
        }
    }
    // `;` is refused by default.
    let (status, _) = send(&gw, &get("/v1/search;x", "t", true));
    assert_eq!(status, 400);
    // The budget: a request to /v1//search spends 5 (search's cost), not 1.
    let r = client()
        .get(gw.url("/v1//search"))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    let before: u32 = header(&r, "x-ratelimit-remaining").parse().unwrap();
    let r = client()
        .get(gw.url("/v1/%73earch"))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    let after: u32 = header(&r, "x-ratelimit-remaining").parse().unwrap();
    // 5 spent; the key's bucket refills one token per 60 ms, so a slow machine may have
    // given one or two back in between (cost 1, the bypass, would show at most 1).
    let spent = before - after;
    assert!(
        (3..=5).contains(&spent),
        "spent {spent}, want 5 (search's cost)"
    );
}

/// With `path_parameters = "allow"`, a servlet container's reading decides the route.
#[tokio::test(flavor = "multi_thread")]
async fn path_parameters_route_like_a_servlet_container() {
    let ups = Upstreams::start(Decoding::Servlet).await;
    let gw = gateway(&ups, "allow").await;
    for (path, want) in [
        ("/v1/search;x", Some("search")),
        ("/v1/search;jsessionid=1/q", Some("search")),
        ("/public;x/y", Some("public")),
        ("/public/..;/v1/secret", None),
        ("/public/.;x/v1", None),
    ] {
        let (status, up) = assert_consistent(&gw, &get(path, "t", true), Decoding::Servlet);
        match want {
            Some(label) => assert_eq!(
                (status, up.unwrap()["upstream"].clone()),
                (200, label.into()),
                "{path}"
            ),
            None => assert_eq!(status, 400, "{path}"),
        }
    }
}

/// A sweep of generated hostile paths: nothing reaches an upstream that serves another
/// route than the one the gateway matched, under either decoding, and nothing is a 5xx.
#[tokio::test(flavor = "multi_thread")]
async fn generated_paths_never_escape_their_route() {
    let tokens = [
        "/", "//", ".", "..", "%2e", "%2f", "%2F", "%5c", ";", "..;", "%3b", "%25", "v1", "public",
        "search", "%73earch", "%2e%2e", "x",
    ];
    for (decoding, params) in [(Decoding::Nginx, "reject"), (Decoding::Servlet, "allow")] {
        let ups = Upstreams::start(decoding).await;
        let gw = gateway(&ups, params).await;
        let mut reached = 0;
        for (start, a, b, c) in itertools(&tokens) {
            let path = format!("{start}{a}{b}{c}");
            let (_, up) = assert_consistent(&gw, &get(&path, "t", true), decoding);
            reached += usize::from(up.is_some());
        }
        assert!(
            reached > 100,
            "too few paths reached an upstream: {reached}"
        );
    }
}

/// Every (start, token, token, tail) combination.
fn itertools<'a>(
    tokens: &'a [&'a str],
) -> impl Iterator<Item = (&'a str, &'a str, &'a str, &'a str)> + 'a {
    ["/public/", "/", "/v1/"]
        .into_iter()
        .flat_map(move |start| {
            tokens.iter().flat_map(move |a| {
                tokens.iter().flat_map(move |b| {
                    ["v1/secret", "search", "/x", ""]
                        .into_iter()
                        .map(move |c| (start, *a, *b, c))
                })
            })
        })
}

/// Absolute-form targets are routed by their authority; hosts compare without case, port
/// and one trailing dot; HTTP/1.1 without Host is refused.
#[tokio::test(flavor = "multi_thread")]
async fn authority_decides_the_route() {
    let ups = Upstreams::start(Decoding::Nginx).await;
    let gw = gateway(&ups, "reject").await;
    // Without a key, the internal host's route (auth required) answers 401.
    for request in [
        "GET http://internal.example.com/x HTTP/1.1\r\n\r\n".to_string(),
        get("/x", "internal.example.com.", false),
        get("/x", "INTERNAL.example.COM:8080", false),
    ] {
        let (status, up) = send(&gw, &request);
        assert_eq!((status, up.is_none()), (401, true), "{request:?}");
    }
    // With a key it reaches the internal upstream, which sees the host it was routed on.
    let (status, up) = send(
        &gw,
        &format!("GET http://internal.example.com/x?q=1 HTTP/1.1\r\nX-API-Key: {KEY}\r\n\r\n"),
    );
    let up = up.unwrap();
    assert_eq!((status, up["upstream"].as_str()), (200, Some("internal")));
    assert_eq!(up["host"], "internal.example.com");
    assert_eq!(up["served"], "/x");
    let (_, up) = send(&gw, &get("/x", "internal.example.com.", true));
    assert_eq!(up.unwrap()["host"], "internal.example.com");
    // Missing, duplicate and malformed Host: 400.
    for request in [
        "GET /x HTTP/1.1\r\n\r\n",
        "GET /x HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
        "GET /x HTTP/1.1\r\nHost: a..example\r\n\r\n",
        "GET http://internal.example.com/x HTTP/1.1\r\nHost: public.example\r\n\r\n",
    ] {
        let (status, up) = send(&gw, request);
        assert_eq!((status, up.is_none()), (400, true), "{request:?}");
    }
    // HTTP/1.0 without Host is refused too: the upstream's default virtual host need not
    // be the one the route was chosen for.
    let (status, up) = send(&gw, "GET /public/x HTTP/1.0\r\n\r\n");
    assert_eq!((status, up.is_none()), (400, true));
}

/// Header names with `_`, client `Forwarded` and path-override headers do not reach the
/// upstream from an untrusted client; `underscores_in_headers = true` lets `_` through.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_headers_are_dropped() {
    let up = Upstream::start("u").await;
    let routes = r#"
[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;
    let gw = Gateway::start(routes, Some(&up)).await;
    let send_echo = |gw: &Gateway| {
        let mut conn = TcpStream::connect(gw.addr).unwrap();
        conn.write_all(b"").unwrap();
        let (_, _, body) = raw_exchange(
            &mut conn,
            b"GET /x HTTP/1.1\r\nHost: t\r\nX_Throttle_Tenant: evil\r\nX_API_Thing: 1\r\nForwarded: for=6.6.6.6;host=evil\r\nX-Forwarded-Host: evil.example\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\nX-Throttle-Key-Id: forged\r\n\r\n",
        )
        .unwrap();
        serde_json::from_slice::<Value>(&body).unwrap()
    };
    let echo = send_echo(&gw);
    let h = &echo["headers"];
    for gone in [
        "x_throttle_tenant",
        "x_api_thing",
        "x-forwarded-host",
        "x-original-url",
        "x-rewrite-url",
        "x-throttle-key-id",
    ] {
        assert!(h.get(gone).is_none(), "{gone} reached the upstream: {h}");
    }
    // The gateway reads X-Forwarded-For: a client's Forwarded is dropped, not rewritten.
    assert!(h.get("forwarded").is_none(), "{h}");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    drop(gw);

    let routes = routes.replace("{upstream}", &up.addr.to_string());
    let server = "grace_period_secs = 0\nunderscores_in_headers = true";
    let gw = Gateway::start_full(&["run"], &routes, server).await;
    let echo = send_echo(&gw);
    assert_eq!(echo["headers"]["x_api_thing"], "1");
    assert!(echo["headers"].get("x-original-url").is_none());
}

/// From a trusted proxy the `Forwarded` chain the gateway reads is kept and the peer
/// appended.
#[tokio::test(flavor = "multi_thread")]
async fn forwarded_chain_is_kept_from_a_trusted_proxy() {
    let up = Upstream::start("u").await;
    let body = r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]
header = "forwarded"

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;
    let gw = Gateway::start(body, Some(&up)).await;
    let echo: Value = client()
        .get(gw.url("/x"))
        .header("forwarded", "for=203.0.113.7;proto=https")
        .header("x-forwarded-host", "api.example.com")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        echo["headers"]["forwarded"],
        "for=203.0.113.7;proto=https, for=127.0.0.1"
    );
    assert_eq!(echo["headers"]["x-forwarded-host"], "api.example.com");
}
