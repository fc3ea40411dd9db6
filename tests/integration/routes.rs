//! Per-route matching on the real binary: a route's `methods` take only those methods,
//! and another method falls through to the next candidate route (longest prefix first),
//! else 404 `no_route`.

use serde_json::Value;

use crate::support::{client, Gateway, Upstream};

/// `POST /v1/login` reaches the login route's upstream; a `GET` of the same path falls
/// through to the `/v1` route's; a method no candidate takes is a 404, and a `HEAD`
/// is the `GET`-only route's (a route that takes GET takes HEAD).
#[tokio::test(flavor = "multi_thread")]
async fn methods_fall_through_to_the_next_route() {
    let (login, api, docs) = (
        Upstream::start("login").await,
        Upstream::start("api").await,
        Upstream::start("docs").await,
    );
    let body = format!(
        r#"
[[routes]]
name = "login"
path_prefix = "/v1/login"
methods = ["POST"]
upstreams = ["{login}"]
auth = "none"

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{api}"]
auth = "none"

[[routes]]
name = "docs"
path_prefix = "/docs"
methods = ["GET"]
upstreams = ["{docs}"]
auth = "none"
"#,
        login = login.addr,
        api = api.addr,
        docs = docs.addr,
    );
    let gw = Gateway::start(&body, None).await;
    let c = client();
    let served_by = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        (status, v["upstream"].as_str().unwrap_or("").to_string(), v)
    };
    let (status, up, _) = served_by(c.post(gw.url("/v1/login")).send().await.unwrap()).await;
    assert_eq!((status, up.as_str()), (200, "login"));
    let (status, up, _) = served_by(c.get(gw.url("/v1/login")).send().await.unwrap()).await;
    assert_eq!(
        (status, up.as_str()),
        (200, "api"),
        "GET falls through to /v1"
    );
    let (status, up, _) = served_by(c.get(gw.url("/docs/a")).send().await.unwrap()).await;
    assert_eq!((status, up.as_str()), (200, "docs"));
    let r = c.delete(gw.url("/docs/a")).send().await.unwrap();
    assert_eq!(r.status(), 404, "no route takes DELETE /docs");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "no_route");
    let r = c.head(gw.url("/docs/a")).send().await.unwrap();
    assert_eq!(r.status(), 200, "a route that takes GET takes HEAD");
}

/// `[auth] key_header` moves the key to another header (`X-API-Key` is then no key), and
/// a route with `hide_credentials` forwards neither that header nor a Bearer
/// `Authorization`, while a Basic one (the upstream's own) goes through.
#[tokio::test(flavor = "multi_thread")]
async fn key_header_and_hide_credentials() {
    let up = Upstream::start("u").await;
    let body = format!(
        r#"
[auth]
key_header = "X-Client-Token"

[tiers.free]
key = {{ per_minute = 100 }}

[[keys]]
id = "key_a"
key = "token-a"
tenant = "acme"
tier = "free"

[[routes]]
name = "hidden"
path_prefix = "/hidden"
upstreams = ["{up}"]
hide_credentials = true

[[routes]]
name = "shown"
path_prefix = "/shown"
upstreams = ["{up}"]
"#,
        up = up.addr
    );
    let gw = Gateway::start(&body, None).await;
    let c = client();
    let seen = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        (status, v["headers"].clone())
    };
    // The default header is no key any more.
    let r = c.get(gw.url("/shown/x")).header("x-api-key", "token-a");
    assert_eq!(r.send().await.unwrap().status(), 401);
    let r = c
        .get(gw.url("/shown/x"))
        .header("x-client-token", "token-a");
    let (status, h) = seen(r.send().await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(
        h["x-client-token"], "token-a",
        "shown: the key goes upstream"
    );
    assert_eq!(h["x-throttle-key-id"], "key_a");
    let r = c
        .get(gw.url("/hidden/x"))
        .header("x-client-token", "token-a");
    let (status, h) = seen(r.send().await.unwrap()).await;
    assert_eq!(status, 200);
    assert!(h.get("x-client-token").is_none(), "hidden: {h}");
    assert_eq!(
        h["x-throttle-key-id"], "key_a",
        "the identity still goes upstream"
    );
    let r = c.get(gw.url("/hidden/x")).bearer_auth("token-a");
    let (status, h) = seen(r.send().await.unwrap()).await;
    assert_eq!(status, 200);
    assert!(h.get("authorization").is_none(), "hidden Bearer: {h}");
    let r = c
        .get(gw.url("/hidden/x"))
        .header("x-client-token", "token-a")
        .header("authorization", "Basic dXNlcjpwYXNz");
    let (status, h) = seen(r.send().await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(
        h["authorization"], "Basic dXNlcjpwYXNz",
        "Basic is the upstream's"
    );
}

/// `[auth] key_query` reads the key from a query parameter, which never goes upstream
/// (the other parameters do, as sent); a query key and a header key must agree.
#[tokio::test(flavor = "multi_thread")]
async fn key_query_is_read_and_stripped() {
    let up = Upstream::start("u").await;
    let body = format!(
        r#"
[auth]
key_query = "apikey"

[tiers.free]
key = {{ per_minute = 100 }}

[[keys]]
id = "key_a"
key = "token-a"
tenant = "acme"
tier = "free"

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{up}"]
"#,
        up = up.addr
    );
    let gw = Gateway::start(&body, None).await;
    let c = client();
    let r = c.get(gw.url("/v1/x?a=1&apikey=token-a&b=%20"));
    let r = r.send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["query"], "a=1&b=%20",
        "the key parameter is stripped: {v}"
    );
    assert_eq!(v["headers"]["x-throttle-key-id"], "key_a");
    let r = c.get(gw.url("/v1/x?apikey=token-a")).send().await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["query"],
        Value::Null,
        "nothing else was in the query: {v}"
    );
    // The query key is a key like any other: a wrong one is refused.
    let r = c.get(gw.url("/v1/x?apikey=wrong")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // Two different credentials, or the parameter twice: 400.
    let r = c
        .get(gw.url("/v1/x?apikey=token-a"))
        .header("x-api-key", "other")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c.get(gw.url("/v1/x?apikey=token-a&apikey=token-a"));
    assert_eq!(r.send().await.unwrap().status(), 400);
    // The same key in both places is one credential.
    let r = c
        .get(gw.url("/v1/x?apikey=token-a"))
        .header("x-api-key", "token-a")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
