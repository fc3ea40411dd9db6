//! The operator's console on the admin listener: its files are served without the token
//! under a strict Content-Security-Policy, `GET /v1/routes` wants the token and shows no
//! secret, and the page itself works in a real headless Chromium against a gateway
//! under traffic (charts move, a limited caller tops the list, a ban is lifted, a key's
//! usage is read) while sending nothing without the token.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::support::webdriver::Browser;
use crate::support::{client, eventually, header, Gateway, Upstream, ADMIN_TOKEN};

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// The raw API key: it must never reach the console.
const RAW_KEY: &str = "busy-secret-key-0123456789abcdef";

/// Trusted loopback proxy (so `X-Forwarded-For` names the client), an ip limit that bans,
/// a key tier that limits, and a route table of its own.
fn config() -> String {
    format!(
        r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[limits.ip]
per_second = 20
ban = {{ after = 5, within_secs = 60, for_secs = 600 }}

[tiers.free]
key = {{ per_second = 5 }}

[[keys]]
id = "key_busy"
key = "{RAW_KEY}"
tenant = "acme"
tier = "free"

[[routes]]
name = "login"
path_prefix = "/login"
upstreams = ["{{upstream}}"]
auth = "none"
[routes.limits.ip]
per_minute = 50

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]
auth = "optional"
"#
    )
}

/// The console's three files carry the policy and the framing headers, with the right
/// content types, without the token; the page loads nothing inline and nothing absolute.
#[tokio::test(flavor = "multi_thread")]
async fn console_files_are_served_with_a_strict_policy() {
    let up = Upstream::start("console").await;
    let gw = Gateway::start(&config(), Some(&up)).await;
    let c = client();
    let mut bodies = Vec::new();
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/index.html", "text/html; charset=utf-8"),
        ("/console.js", "text/javascript; charset=utf-8"),
        ("/console.css", "text/css; charset=utf-8"),
    ] {
        let r = c.get(gw.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(header(&r, "content-type"), content_type, "{path}");
        assert_eq!(header(&r, "content-security-policy"), CSP, "{path}");
        assert_eq!(header(&r, "x-frame-options"), "DENY", "{path}");
        assert_eq!(header(&r, "x-content-type-options"), "nosniff", "{path}");
        assert_eq!(header(&r, "referrer-policy"), "no-referrer", "{path}");
        assert_eq!(header(&r, "cache-control"), "no-store", "{path}");
        bodies.push(r.text().await.unwrap());
    }
    let (html, js) = (&bodies[0], &bodies[2]);
    assert_eq!(html, &bodies[1]);
    assert!(html.contains(r#"<script src="console.js" defer></script>"#));
    assert!(html.contains(r#"<link rel="stylesheet" href="console.css">"#));
    // Nothing the policy would refuse: no inline script, style or handler.
    assert_eq!(html.matches("<script").count(), 1);
    for inline in [
        "<style",
        " style=",
        " onclick=",
        " onload=",
        " onsubmit=",
        "javascript:",
    ] {
        assert!(!html.contains(inline), "inline {inline:?} in the page");
    }
    // Relative URLs only (a path prefix in front keeps working), no storage of the token.
    for absolute in ["\"/v1", "\"/metrics", "\"/readyz", "https://"] {
        assert!(!js.contains(absolute), "{absolute:?} in console.js");
    }
    let svg = "http://www.w3.org/2000/svg";
    assert_eq!(
        js.matches("http://").count(),
        js.matches(svg).count(),
        "an absolute URL"
    );
    for storage in ["localStorage", "sessionStorage", "document.cookie"] {
        assert!(!js.contains(storage), "{storage} in console.js");
    }
    let r = c.post(gw.admin_url("/")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(header(&r, "content-security-policy"), CSP);
}

/// `GET /v1/routes` answers 401 without the right token, and with it the routes, their
/// tables, the tiers and the global limits as loaded, holding no key, token or secret.
#[tokio::test(flavor = "multi_thread")]
async fn routes_endpoint_needs_the_token_and_shows_no_secret() {
    let up = Upstream::start("console").await;
    let server = "grace_period_secs = 0\ncheck_token = \"${THROTTLE_CHECK_TOKEN_C}\"";
    let env = [("THROTTLE_CHECK_TOKEN_C", Some("check-s3cret-console-42"))];
    let body = config().replace("{upstream}", &up.addr.to_string());
    let gw = Gateway::start_env(&["run"], &body, server, &env).await;
    let c = client();
    let url = gw.admin_url("/v1/routes");
    assert_eq!(c.get(&url).send().await.unwrap().status(), 401);
    let wrong = c.get(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let post = c.post(&url).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_eq!(post.status(), 405);
    let r = c.get(&url).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    for secret in [RAW_KEY, ADMIN_TOKEN, "check-s3cret-console-42", "key_busy"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    let v: Value = serde_json::from_str(&text).unwrap();
    let routes = v["routes"].as_array().unwrap();
    let names: Vec<&str> = routes.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["login", "api"]);
    let login = &routes[0];
    assert_eq!(login["path_prefix"], "/login");
    assert_eq!(login["auth"], "none");
    assert_eq!(login["mode"], "enforce");
    assert_eq!(login["upstreams"][0], up.addr.to_string());
    assert_eq!(login["limits"][0]["scope"], "login.ip");
    assert_eq!(login["limits"][0]["counts"], "ip");
    let window = &login["limits"][0]["limits"]["windows"][0];
    assert_eq!(
        (window["window"].as_str(), window["limit"].as_u64()),
        (Some("1m"), Some(50))
    );
    assert_eq!(routes[1]["auth"], "optional");
    let ip = &v["limits"]["ip"]["windows"][0];
    assert_eq!(
        (ip["window"].as_str(), ip["limit"].as_u64()),
        (Some("1s"), Some(20))
    );
    assert!(v["limits"]["global"].is_null());
    let free = &v["tiers"]["free"]["key"]["windows"][0];
    assert_eq!(
        (free["window"].as_str(), free["limit"].as_u64()),
        (Some("1s"), Some(5))
    );
}

/// Background traffic until dropped: the key caller at ~50/s from rotating addresses (its
/// 5/s tier limits it, no address is limited), light callers on the login route.
struct Traffic {
    stop: Arc<AtomicBool>,
}

impl Traffic {
    fn start(gw: &Gateway) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (api, login, flag) = (gw.url("/x"), gw.url("/login"), stop.clone());
        tokio::spawn(async move {
            let c = client();
            let mut i = 0u32;
            while !flag.load(Ordering::Relaxed) {
                let ip = format!("10.2.{}.{}", (i / 250) % 250, i % 250);
                let _ = c
                    .get(&api)
                    .header("x-api-key", RAW_KEY)
                    .header("x-forwarded-for", &ip)
                    .send()
                    .await;
                if i % 10 == 0 {
                    let _ = c.get(&login).header("x-forwarded-for", ip).send().await;
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Self { stop }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The status of one request from `ip`.
async fn status_from(gw: &Gateway, ip: &str) -> u16 {
    client()
        .get(gw.url("/x"))
        .header("x-forwarded-for", ip)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Until `script` (a function body) returns something other than null or false in the
/// page, for at most `secs`.
async fn until(b: &Browser, secs: u64, what: &str, script: &str) -> Value {
    eventually(Duration::from_secs(secs), what, || async {
        let v = b.eval(script).await;
        (!v.is_null() && v != Value::Bool(false)).then_some(v)
    })
    .await
}

/// An operator's ingress in front of the admin listener: serves it under `/ops/` (the
/// prefix stripped) and records every request it forwards as (path, carried the admin
/// token); stopped on drop.
struct Ingress {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<(String, bool)>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Ingress {
    async fn start(admin: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let log = log.clone();
            async move { forward(admin, &log, req).await }
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let stop = async move {
                let _ = rx.await;
            };
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await;
        });
        Self {
            addr,
            seen,
            _stop: tx,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/ops/", self.addr)
    }

    /// What was forwarded so far, but the console's own three files.
    fn data_requests(&self) -> Vec<(String, bool)> {
        let files = ["/", "/console.js", "/console.css"];
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(p, _)| !files.contains(&p.as_str()))
            .cloned()
            .collect()
    }
}

async fn forward(
    admin: SocketAddr,
    log: &Mutex<Vec<(String, bool)>>,
    req: axum::extract::Request,
) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("", |p| p.as_str());
    let Some(rest) = target.strip_prefix("/ops") else {
        return axum::response::Response::builder()
            .status(404)
            .body(axum::body::Body::empty())
            .unwrap();
    };
    let auth = parts.headers.get("authorization").cloned();
    let bearer = auth
        .as_ref()
        .is_some_and(|a| a.as_bytes() == format!("Bearer {ADMIN_TOKEN}").as_bytes());
    let path = rest.split('?').next().unwrap_or("").to_string();
    log.lock().unwrap().push((path, bearer));
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let mut out = client().request(parts.method, format!("http://{admin}{rest}"));
    if let Some(a) = auth {
        out = out.header("authorization", a);
    }
    let r = out.body(body).send().await.unwrap();
    let mut back = axum::response::Response::builder().status(r.status());
    for (name, value) in r.headers() {
        if name != "content-length" && name != "transfer-encoding" && name != "connection" {
            back = back.header(name, value);
        }
    }
    back.body(axum::body::Body::from(r.bytes().await.unwrap()))
        .unwrap()
}

/// The console in headless Chromium: nothing without the token, then charts that move,
/// the limited key in the top list, a ban lifted (its caller admitted again) and a key's
/// usage, never the raw key on the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_real_browser() {
    let Some(b) = Browser::start_or_skip("console_in_a_real_browser").await else {
        return;
    };
    let up = Upstream::start("console").await;
    let gw = Gateway::start(&config(), Some(&up)).await;
    let _traffic = Traffic::start(&gw);
    let ingress = Ingress::start(gw.admin).await;

    // Without the token: the login form only, and no request for data during two
    // refresh periods (absence needs a window; the page's own period is 2.5 s). The
    // page is reached through an ingress under `/ops/`: its URLs are relative.
    b.goto(&ingress.url()).await;
    until(
        &b,
        10,
        "the login form",
        "return document.readyState === 'complete' && !document.getElementById('login').hidden;",
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < deadline {
        assert_eq!(ingress.data_requests(), [], "requests without a token");
        let shown = b.eval("return !document.getElementById('app').hidden || document.querySelectorAll('#app tbody tr, #app figure').length;").await;
        assert!(
            shown == Value::Bool(false) || shown == 0,
            "data shown without a token: {shown}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    b.screenshot("01-login").await;

    // Log in: the route chart of `api` moves between two refreshes and shows limiting.
    b.type_into("#token", ADMIN_TOKEN).await;
    b.click("#login-button").await;
    let chart = "var f = document.querySelector('#route-charts figure[data-name=\"api\"]'); \
        return f && Number(f.getAttribute('data-samples')) >= 2 ? \
        Array.prototype.map.call(f.querySelectorAll('polyline'), function (p) { return p.getAttribute('points'); }).join('|') : null;";
    let first = until(&b, 20, "the api chart", chart).await;
    let moved = format!("var now = (function () {{ {chart} }})(); return now !== null && now !== {first} ? now : null;");
    until(&b, 20, "the api chart to change", &moved).await;
    until(&b, 20, "limiting on the api chart", "var f = document.querySelector('#route-charts figure[data-name=\"api\"]'); return f && /limited=(?!0\\.00)/.test(f.getAttribute('data-last'));").await;
    until(
        &b,
        20,
        "the key scope chart",
        "return document.querySelector('#scope-charts figure[data-name=\"key\"]') !== null;",
    )
    .await;

    // The limited key tops the list, by id.
    until(&b, 20, "key_busy limited in the top list", "var r = document.querySelector('#top tbody tr[data-identity=\"key_busy\"]'); return r && Number(r.getAttribute('data-rejected')) > 0;").await;
    until(
        &b,
        20,
        "the health line",
        "return /store memory healthy/.test(document.getElementById('health').textContent);",
    )
    .await;
    until(
        &b,
        20,
        "the routes table",
        "return document.querySelector('#routes tbody tr[data-route=\"login\"]') !== null;",
    )
    .await;
    b.screenshot("02-dashboard").await;

    // An address over [limits.ip] is banned; the console lists the ban and lifts it.
    let banned = "10.9.9.9";
    let mut statuses = Vec::new();
    while statuses.last() != Some(&403) {
        assert!(statuses.len() < 500, "no ban: {statuses:?}");
        statuses.push(status_from(&gw, banned).await);
    }
    let row = format!("#blocks tbody tr[data-value=\"{banned}\"]");
    let id = until(
        &b,
        20,
        "the ban in the list",
        &format!("var r = document.querySelector('{row}'); return r && r.getAttribute('data-id');"),
    )
    .await;
    let id = id.as_str().unwrap().to_string();
    assert!(
        id.starts_with('-'),
        "an automatic ban has a negative id: {id}"
    );
    b.screenshot("03-banned").await;
    b.click(&format!("{row} button.lift")).await;
    until(
        &b,
        20,
        "the ban gone from the list",
        &format!("return document.querySelector('{row}') === null;"),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the lifted address admitted",
        || async { (status_from(&gw, banned).await == 200).then_some(()) },
    )
    .await;

    // A key's usage, by id.
    b.type_into("#usage-value", "key_busy").await;
    b.click("#usage-go").await;
    let usage = "return Array.prototype.map.call(document.querySelectorAll('#usage tbody tr'), function (r) { return r.textContent; });";
    let rows = until(
        &b,
        20,
        "the usage rows",
        &format!("var rows = (function () {{ {usage} }})(); return rows.length ? rows : null;"),
    )
    .await;
    let rows: Vec<String> = serde_json::from_value(rows).unwrap();
    assert!(
        rows.iter().any(|r| r.starts_with("key1s5")),
        "the key's 5/s window: {rows:?}"
    );
    b.screenshot("04-usage").await;

    // The raw key is nowhere on the page.
    let page = b.eval("return document.documentElement.outerHTML;").await;
    assert!(!page.as_str().unwrap().contains(RAW_KEY));

    // Logging out forgets everything shown.
    b.click("#logout").await;
    let left = b
        .eval("return document.querySelectorAll('#app tbody tr, #app figure').length;")
        .await;
    assert_eq!(left, Value::from(0));
    b.close().await;

    // Everything the page asked for went through the prefix, with the token.
    let data = ingress.data_requests();
    for path in [
        "/metrics",
        "/readyz",
        "/v1/top",
        "/v1/blocks",
        "/v1/usage",
        "/v1/routes",
    ] {
        assert!(
            data.iter().any(|(p, _)| p == path),
            "{path} never requested: {data:?}"
        );
    }
    assert!(
        data.iter().any(|(p, _)| p.starts_with("/v1/blocks/-")),
        "no lift: {data:?}"
    );
    let bare: Vec<_> = data.iter().filter(|(_, token)| !token).collect();
    assert!(bare.is_empty(), "requests without the token: {bare:?}");
}
