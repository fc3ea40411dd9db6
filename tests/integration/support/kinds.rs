//! Every kind of scope table a limit key can appear in, and a config that puts one there:
//! for tests of a key across the cross product (`count_on`, `cost_from`, `fleet`).

/// Every kind of scope table: (label, the TOML that puts a table there (`{T}`: its
/// lines, `{I}`: the same inline), the 429's `scope`, its `route`).
pub const TABLE_KINDS: [(&str, &str, &str, Option<&str>); 10] = [
    ("[limits.ip]", "[limits.ip]\n{T}\n", "ip", None),
    ("[limits.global]", "[limits.global]\n{T}\n", "global", None),
    ("[limits.user]", "[limits.user]\n{T}\n", "user", None),
    ("tier key", "[tiers.t]\nkey = { {I} }\n", "key", None),
    (
        "tier tenant",
        "[tiers.t]\ntenant = { {I} }\n",
        "tenant",
        None,
    ),
    ("route ip", "[routes.limits.ip]\n{T}\n", "ip", Some("login")),
    (
        "route key",
        "[routes.limits.key]\n{T}\n",
        "key",
        Some("login"),
    ),
    (
        "route tenant",
        "[routes.limits.tenant]\n{T}\n",
        "tenant",
        Some("login"),
    ),
    (
        "route global",
        "[routes.limits.global]\n{T}\n",
        "global",
        Some("login"),
    ),
    (
        "route user",
        "[routes.limits.user]\n{T}\n",
        "user",
        Some("login"),
    ),
];

/// A gateway config with `table` (newline-separated `key = value` lines) in the table of
/// `kind` and `route_extra` lines on the route.
pub fn kind_config_with(
    store: &str,
    upstream: &str,
    kind: &str,
    table: &str,
    route_extra: &str,
) -> String {
    let inline = table.replace('\n', ", ");
    let kind = kind.replace("{T}", table).replace("{I}", &inline);
    let (top, route) = match kind.strip_prefix("[routes.") {
        Some(_) => (String::new(), kind.clone()),
        None => (kind.clone(), String::new()),
    };
    let tier = if top.contains("[tiers.t]") {
        ""
    } else {
        "[tiers.t]\nkey = { per_hour = 1000000 }\n"
    };
    format!(
        r#"{store}
[scopes.user]
from = "header:X-User"

{top}
{tier}
[[keys]]
id = "k1"
key = "key-one-secret"
tenant = "acme"
tier = "t"

[[routes]]
name = "login"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "optional"
{route_extra}

{route}
"#
    )
}
