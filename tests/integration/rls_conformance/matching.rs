//! The conformance table, part 1: which limit a descriptor gets (exact, wildcard, bare
//! key, nesting and the depth rule, whitelist, share_threshold, units, a directory of
//! files) and counting it down. Each function is one case, played by `super::run` on
//! every store; limits are per minute or longer.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::{Ok, OverLimit};

use super::{call, free, ok, one, over, Case, Step, D, MIN};

/// `current_limit` {requests_per_unit, unit, name} and the remaining count, counting down.
pub(super) fn basic() -> Case {
    let yaml = "
domain: basic
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: minute
      requests_per_unit: 3
      name: users_limit
  - key: database
    value: default
    rate_limit:
      unit: minute
      requests_per_unit: 2
";
    let users = || one("basic", &[&[("database", "users")]]);
    let default = || one("basic", &[&[("database", "default")]]);
    let (u, d) = ((3, MIN, "users_limit"), (2, MIN, ""));
    Case::new(
        "basic",
        yaml,
        vec![
            call(users(), Ok, vec![ok(u, 2)]),
            call(users(), Ok, vec![ok(u, 1)]),
            call(default(), Ok, vec![ok(d, 1)]),
            call(users(), Ok, vec![ok(u, 0)]),
            call(one("basic", &[&[("database", "other")]]), Ok, vec![free()]),
            call(default(), Ok, vec![ok(d, 0)]),
            call(users(), OverLimit, vec![over(u)]),
        ],
    )
}

/// N requests pass, every later one is OVER_LIMIT with remaining 0 (and stays so).
pub(super) fn over_limit() -> Case {
    let yaml = "
domain: over
descriptors:
  - key: client
    value: c1
    rate_limit:
      unit: minute
      requests_per_unit: 4
      name: four
";
    let c1 = || one("over", &[&[("client", "c1")]]);
    let l = (4, MIN, "four");
    let mut steps: Vec<Step> = (0..4)
        .rev()
        .map(|n| call(c1(), Ok, vec![ok(l, n)]))
        .collect();
    steps.extend((0..3).map(|_| call(c1(), OverLimit, vec![over(l)])));
    Case::new("over_limit", yaml, steps)
}

/// Statuses in request order; one over makes the whole request OVER_LIMIT, and the other
/// descriptor consumed nothing (its status tells what it has left, untouched).
pub(super) fn two_descriptors() -> Case {
    let yaml = "
domain: pair
descriptors:
  - key: a
    value: x
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: a_limit
  - key: b
    value: y
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: b_limit
";
    let (a, b) = ((5, MIN, "a_limit"), (1, MIN, "b_limit"));
    let (da, db): (D, D) = (&[("a", "x")], &[("b", "y")]);
    Case::new(
        "two_descriptors",
        yaml,
        vec![
            call(one("pair", &[da, db]), Ok, vec![ok(a, 4), ok(b, 0)]),
            call(one("pair", &[da, db]), OverLimit, vec![ok(a, 4), over(b)]),
            call(one("pair", &[db, da]), OverLimit, vec![over(b), ok(a, 4)]),
            call(one("pair", &[da]), Ok, vec![ok(a, 3)]),
            call(one("pair", &[da]), Ok, vec![ok(a, 2)]),
        ],
    )
}

/// `duration_until_reset` as time passes (the runner checks every one against the
/// epoch-aligned window and that it never grows).
pub(super) fn reset() -> Case {
    let yaml = "
domain: reset
descriptors:
  - key: m
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: h
    rate_limit:
      unit: hour
      requests_per_unit: 10
";
    let both = || one("reset", &[&[("m", "1")], &[("h", "1")]]);
    let (m, h) = ((10, MIN, ""), (10, Unit::Hour, ""));
    Case::new(
        "reset",
        yaml,
        vec![
            call(both(), Ok, vec![ok(m, 9), ok(h, 9)]),
            call(both(), Ok, vec![ok(m, 8), ok(h, 8)]),
            Step::Pause(Duration::from_millis(1_100)),
            call(both(), Ok, vec![ok(m, 7), ok(h, 7)]),
            Step::Pause(Duration::from_millis(1_100)),
            call(both(), Ok, vec![ok(m, 6), ok(h, 6)]),
        ],
    )
}

/// Nested keys: the limit of the deepest node applies only to a descriptor of exactly
/// that depth; shorter and longer ones get no limit and consume nothing.
pub(super) fn nested() -> Case {
    let yaml = "
domain: nested
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: minute
          requests_per_unit: 2
          name: marketing_per_number
  - key: to_number
    rate_limit:
      unit: minute
      requests_per_unit: 3
      name: per_number
";
    let n = |d: &[(&str, &str)]| one("nested", &[d]);
    let mk = ("message_type", "marketing");
    let (m, p) = ((2, MIN, "marketing_per_number"), (3, MIN, "per_number"));
    Case::new(
        "nested",
        yaml,
        vec![
            call(n(&[mk, ("to_number", "111")]), Ok, vec![ok(m, 1)]),
            call(n(&[mk]), Ok, vec![free()]),
            call(
                n(&[mk, ("to_number", "111"), ("extra", "z")]),
                Ok,
                vec![free()],
            ),
            call(n(&[("to_number", "111")]), Ok, vec![ok(p, 2)]),
            call(n(&[("to_number", "111"), ("extra", "z")]), Ok, vec![free()]),
            call(n(&[mk, ("to_number", "111")]), Ok, vec![ok(m, 0)]),
            call(n(&[mk, ("to_number", "222")]), Ok, vec![ok(m, 1)]),
            call(n(&[mk, ("to_number", "111")]), OverLimit, vec![over(m)]),
            call(
                n(&[("message_type", "other"), ("to_number", "111")]),
                Ok,
                vec![free()],
            ),
            call(n(&[("to_number", "111")]), Ok, vec![ok(p, 1)]),
        ],
    )
}

/// A key without a value: one counter per value.
pub(super) fn bare_key() -> Case {
    let yaml = "
domain: bare
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 2
      name: per_ip
";
    let ip = |v| one("bare", &[&[("remote_address", v)]]);
    let l = (2, MIN, "per_ip");
    Case::new(
        "bare_key",
        yaml,
        vec![
            call(ip("10.0.0.1"), Ok, vec![ok(l, 1)]),
            call(ip("10.0.0.1"), Ok, vec![ok(l, 0)]),
            call(ip("10.0.0.1"), OverLimit, vec![over(l)]),
            call(ip("10.0.0.2"), Ok, vec![ok(l, 1)]),
            call(ip("10.0.0.2"), Ok, vec![ok(l, 0)]),
            call(ip("10.0.0.2"), OverLimit, vec![over(l)]),
        ],
    )
}

/// A value entry without rate_limit beside a bare key with one: that value is unlimited
/// (OK, no current_limit, never counted), every other value limited.
pub(super) fn whitelist() -> Case {
    let yaml = "
domain: white
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: per_ip
  - key: remote_address
    value: 50.0.0.5
";
    let ip = |v| one("white", &[&[("remote_address", v)]]);
    let l = (1, MIN, "per_ip");
    let (white, other): (D, D) = (
        &[("remote_address", "50.0.0.5")],
        &[("remote_address", "50.0.0.2")],
    );
    let mut steps: Vec<Step> = (0..3)
        .map(|_| call(ip("50.0.0.5"), Ok, vec![free()]))
        .collect();
    steps.extend([
        call(ip("50.0.0.1"), Ok, vec![ok(l, 0)]),
        call(ip("50.0.0.1"), OverLimit, vec![over(l)]),
        call(one("white", &[white, other]), Ok, vec![free(), ok(l, 0)]),
    ]);
    Case {
        never_stored: &["50.0.0.5"],
        ..Case::new("whitelist", yaml, steps)
    }
}

/// Wildcards: trailing and middle `*` (any run of characters), the first wildcard in file
/// order, exact before a wildcard listed earlier, bare key last; without share_threshold
/// each matching value has its own counter.
pub(super) fn wildcard() -> Case {
    let yaml = "
domain: wild
descriptors:
  - key: path
    value: /api/*
    rate_limit:
      unit: minute
      requests_per_unit: 2
      name: api_any
  - key: path
    value: /api/v*
    rate_limit:
      unit: minute
      requests_per_unit: 9
      name: api_v
  - key: path
    value: /api/admin
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: admin
  - key: path
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: any_path
  - key: route
    value: /users/*/orders
    rate_limit:
      unit: minute
      requests_per_unit: 2
      name: orders
";
    let path = |v| one("wild", &[&[("path", v)]]);
    let route = |v| one("wild", &[&[("route", v)]]);
    let (any, admin) = ((2, MIN, "api_any"), (1, MIN, "admin"));
    let (bare, orders) = ((5, MIN, "any_path"), (2, MIN, "orders"));
    Case::new(
        "wildcard",
        yaml,
        vec![
            call(path("/api/a"), Ok, vec![ok(any, 1)]),
            call(path("/api/b"), Ok, vec![ok(any, 1)]),
            call(path("/api/v1"), Ok, vec![ok(any, 1)]),
            call(path("/api/admin"), Ok, vec![ok(admin, 0)]),
            call(path("/api/admin"), OverLimit, vec![over(admin)]),
            call(path("/api/a"), Ok, vec![ok(any, 0)]),
            call(path("/api/a"), OverLimit, vec![over(any)]),
            call(path("/apix"), Ok, vec![ok(bare, 4)]),
            call(route("/users/42/orders"), Ok, vec![ok(orders, 1)]),
            call(route("/users/a/b/orders"), Ok, vec![ok(orders, 1)]),
            call(route("/users/42/orders/x"), Ok, vec![free()]),
            call(route("/users/42/orders"), Ok, vec![ok(orders, 0)]),
        ],
    )
}

/// `share_threshold`: every value matching the wildcard spends one counter; without it
/// each value has its own.
pub(super) fn share_threshold() -> Case {
    let yaml = "
domain: share
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
      name: shared
  - key: own
    value: own/*
    rate_limit:
      unit: minute
      requests_per_unit: 2
      name: isolated
";
    let f = |v| one("share", &[&[("files", v)]]);
    let o = |v| one("share", &[&[("own", v)]]);
    let (s, i) = ((3, MIN, "shared"), (2, MIN, "isolated"));
    Case::new(
        "share_threshold",
        yaml,
        vec![
            call(f("files/a"), Ok, vec![ok(s, 2)]),
            call(f("files/b"), Ok, vec![ok(s, 1)]),
            call(f("files/c"), Ok, vec![ok(s, 0)]),
            call(f("files/a"), OverLimit, vec![over(s)]),
            call(f("files/zzz"), OverLimit, vec![over(s)]),
            call(o("own/a"), Ok, vec![ok(i, 1)]),
            call(o("own/b"), Ok, vec![ok(i, 1)]),
            call(o("own/a"), Ok, vec![ok(i, 0)]),
            call(o("own/b"), Ok, vec![ok(i, 0)]),
            call(o("own/a"), OverLimit, vec![over(i)]),
            call(o("own/c"), Ok, vec![ok(i, 1)]),
        ],
    )
}

/// Every unit (case-insensitive in the YAML) is accepted and echoed; the runner checks
/// each `duration_until_reset` against its window (week 7 d, month 30 d, year 365 d).
pub(super) fn units() -> Case {
    let yaml = "
domain: units
descriptors:
  - key: s
    rate_limit:
      unit: second
      requests_per_unit: 1000
  - key: h
    rate_limit:
      unit: Hour
      requests_per_unit: 3
  - key: d
    rate_limit:
      unit: DAY
      requests_per_unit: 3
  - key: w
    rate_limit:
      unit: week
      requests_per_unit: 3
      name: per_week
  - key: mo
    rate_limit:
      unit: Month
      requests_per_unit: 3
      name: per_month
  - key: y
    rate_limit:
      unit: YEAR
      requests_per_unit: 3
      name: per_year
";
    let (w, mo) = ((3, Unit::Week, "per_week"), (3, Unit::Month, "per_month"));
    let y = (3, Unit::Year, "per_year");
    let (dw, dmo, dy): (D, D, D) = (&[("w", "1")], &[("mo", "1")], &[("y", "1")]);
    let (ds, dh, dd): (D, D, D) = (&[("s", "1")], &[("h", "1")], &[("d", "1")]);
    let first = vec![
        ok((1000, Unit::Second, ""), 999),
        ok((3, Unit::Hour, ""), 2),
        ok((3, Unit::Day, ""), 2),
        ok(w, 2),
        ok(mo, 2),
        ok(y, 2),
    ];
    Case::new(
        "units",
        yaml,
        vec![
            call(one("units", &[ds, dh, dd, dw, dmo, dy]), Ok, first),
            call(
                one("units", &[dw, dmo, dy]),
                Ok,
                vec![ok(w, 1), ok(mo, 1), ok(y, 1)],
            ),
            call(one("units", &[dy, dw]), Ok, vec![ok(y, 0), ok(w, 0)]),
            call(one("units", &[dw]), OverLimit, vec![over(w)]),
        ],
    )
}

/// `[rls] config` naming a directory: every *.yaml and *.yml directly in it, nothing else
/// (other extensions, sub-directories: all junk here, which would fail the load).
pub(super) fn directory() -> Case {
    let file = |domain: &str, unit: &str, n: u32, name: &str| {
        format!("domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: {unit}\n      requests_per_unit: {n}\n      name: {name}\n")
    };
    let junk = "domain: [not: yaml: at all\n";
    let k = |domain| one(domain, &[&[("k", "v")]]);
    let (la, lb) = ((1, MIN, "a"), (2, Unit::Hour, "b"));
    Case {
        files: vec![
            ("10-a.yaml", file("dir_a", "minute", 1, "a")),
            ("20-b.yml", file("dir_b", "hour", 2, "b")),
            ("notes.txt", junk.into()),
            ("ratelimit.yaml.bak", junk.into()),
            ("sub/c.yaml", junk.into()),
        ],
        dir: true,
        ..Case::new(
            "directory",
            "",
            vec![
                call(k("dir_a"), Ok, vec![ok(la, 0)]),
                call(k("dir_b"), Ok, vec![ok(lb, 1)]),
                call(k("dir_a"), OverLimit, vec![over(la)]),
                call(k("dir_b"), Ok, vec![ok(lb, 0)]),
            ],
        )
    }
}
