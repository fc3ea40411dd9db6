//! `[server] rate_limit_headers`: the IETF `RateLimit-Policy` / `RateLimit` pair
//! (draft-ietf-httpapi-ratelimit-headers-11) on forwarded responses and on 429s, parsed
//! back as Structured Fields.

use sfv::{BareItem, List, ListEntry, Parser};

use crate::support::{client, header, Gateway, Upstream};

const BODY: &str = r#"
[limits.ip]
per_second = 50
per_minute = 3

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;

/// (item name, integer parameters) of each member of a Structured Field list.
fn members(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: List = Parser::parse_list(value.as_bytes()).unwrap();
    list.iter()
        .map(|m| match m {
            ListEntry::Item(item) => {
                let BareItem::String(name) = &item.bare_item else {
                    panic!("{value}: not a string item");
                };
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_int().unwrap()))
                    .collect();
                (name.clone(), params)
            }
            ListEntry::InnerList(_) => panic!("{value}: inner list"),
        })
        .collect()
}

fn param(params: &[(String, i64)], name: &str) -> i64 {
    params.iter().find(|(k, _)| k == name).unwrap().1
}

async fn gateway(style: &str, up: &Upstream) -> Gateway {
    let body = BODY.replace("{upstream}", &up.addr.to_string());
    let server = format!("grace_period_secs = 0\nrate_limit_headers = \"{style}\"");
    Gateway::start_full(&["run"], &body, &server).await
}

/// "ietf": the policy lists every window, `RateLimit` names the tightest with its
/// remaining count; the X family is gone; a 429 has r=0, t >= Retry-After - 1.
#[tokio::test(flavor = "multi_thread")]
async fn ietf_headers_on_pass_and_429() {
    let up = Upstream::start("u").await;
    let gw = gateway("ietf", &up).await;
    let c = client();
    let r = c.get(gw.url("/x")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-ratelimit-limit").is_none());
    let policy = members(&header(&r, "ratelimit-policy"));
    let names: Vec<_> = policy.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["ip-1s", "ip-1m"]);
    assert_eq!(
        (param(&policy[0].1, "q"), param(&policy[0].1, "w")),
        (50, 1)
    );
    assert_eq!(
        (param(&policy[1].1, "q"), param(&policy[1].1, "w")),
        (3, 60)
    );
    let limit = members(&header(&r, "ratelimit"));
    assert_eq!(limit.len(), 1);
    assert_eq!(limit[0].0, "ip-1m");
    assert_eq!(param(&limit[0].1, "r"), 2);
    let t = param(&limit[0].1, "t");
    assert!((0..=60).contains(&t), "t={t}");

    for _ in 0..2 {
        assert_eq!(c.get(gw.url("/x")).send().await.unwrap().status(), 200);
    }
    let r = c.get(gw.url("/x")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    let retry: i64 = header(&r, "retry-after").parse().unwrap();
    let limit = members(&header(&r, "ratelimit"));
    assert_eq!(limit[0].0, "ip-1m");
    assert_eq!(param(&limit[0].1, "r"), 0);
    assert!(param(&limit[0].1, "t") >= retry - 1);
    assert_eq!(members(&header(&r, "ratelimit-policy")).len(), 2);
    assert!(r.headers().get("x-ratelimit-remaining").is_none());
}

/// "both" writes both families; the default writes only `X-RateLimit-*`.
#[tokio::test(flavor = "multi_thread")]
async fn both_and_default() {
    let up = Upstream::start("u").await;
    let gw = gateway("both", &up).await;
    let r = client().get(gw.url("/x")).send().await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), "2");
    assert_eq!(param(&members(&header(&r, "ratelimit"))[0].1, "r"), 2);

    let gw = Gateway::start(BODY, Some(&up)).await;
    let r = client().get(gw.url("/x")).send().await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), "2");
    assert!(r.headers().get("ratelimit").is_none());
    assert!(r.headers().get("ratelimit-policy").is_none());
}

/// `POST /v1/check` answers in the same header family as the proxy: with `"ietf"` the
/// `RateLimit-Policy` / `RateLimit` pair and no `X-RateLimit-*`, on a pass and on a 429.
#[tokio::test(flavor = "multi_thread")]
async fn the_check_api_follows_the_header_style() {
    let up = Upstream::start("u").await;
    let body = BODY.replace("{upstream}", &up.addr.to_string());
    let gw = Gateway::start_full(
        &["run"],
        &body,
        "grace_period_secs = 0\nrate_limit_headers = \"ietf\"",
    )
    .await;
    let c = client();
    let check = || {
        c.post(gw.admin_url("/v1/check"))
            .json(&serde_json::json!({"ip": "198.51.100.9"}))
            .send()
    };
    for i in 0..4 {
        let r = check().await.unwrap();
        assert_eq!(r.status(), if i < 3 { 200 } else { 429 }, "check {i}");
        assert_eq!(header(&r, "x-ratelimit-limit"), "", "check {i}");
        let policy = members(&header(&r, "ratelimit-policy"));
        let names: Vec<&str> = policy.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["ip-1s", "ip-1m"], "check {i}");
        let limit = members(&header(&r, "ratelimit"));
        let remaining = limit[0].1.iter().find(|(k, _)| k == "r").unwrap().1;
        assert_eq!(remaining, 2 - i.min(2), "check {i}");
        if i == 3 {
            assert_eq!(limit[0].0, "ip-1m");
            assert!(!header(&r, "retry-after").is_empty());
        }
    }
}
