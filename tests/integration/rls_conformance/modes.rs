//! The conformance table, part 2: modes and request fields (unlimited, shadow, quota,
//! replaces, hits_addend, limit overrides, response headers, invalid requests, unknown
//! domains). Each function is one case, played by `super::run` on every store.

use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::{Ok, OverLimit};

use super::{
    call, call_h, desc, desc_hits, desc_limit, fails, free, limitless, ok, one, over, req, unknown,
    Case, Step, D, MIN,
};

const INVALID: tonic::Code = tonic::Code::InvalidArgument;

/// `unlimited: true`: OK, no current_limit, remaining u32::MAX, never counted (whatever
/// the hits).
pub(super) fn unlimited() -> Case {
    let yaml = "
domain: unl
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: azure
";
    let (l, a): (D, D) = (&[("ldap", "a")], &[("azure", "x")]);
    let az = (1, MIN, "azure");
    let mut big = one("unl", &[l]);
    big.hits_addend = 1_000;
    Case {
        never_stored: &["ldap"],
        ..Case::new(
            "unlimited",
            yaml,
            vec![
                call(one("unl", &[l]), Ok, vec![limitless()]),
                call(one("unl", &[l]), Ok, vec![limitless()]),
                call(big, Ok, vec![limitless()]),
                call(one("unl", &[a, l]), Ok, vec![ok(az, 0), limitless()]),
                call(one("unl", &[l, a]), OverLimit, vec![limitless(), over(az)]),
            ],
        )
    }
}

/// `shadow_mode`: over its limit it answers OK (limit set, remaining 0) and never makes
/// the request OVER_LIMIT; a normal descriptor over beside it still does.
pub(super) fn shadow() -> Case {
    let yaml = "
domain: shadow
descriptors:
  - key: user
    value: a
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
      name: user_a
  - key: user
    value: b
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: user_b
  - key: user
    value: c
    rate_limit:
      unit: minute
      requests_per_unit: 3
      name: user_c
";
    let (ua, ub, uc): (D, D, D) = (&[("user", "a")], &[("user", "b")], &[("user", "c")]);
    let (a, b, c) = ((2, MIN, "user_a"), (1, MIN, "user_b"), (3, MIN, "user_c"));
    Case::new(
        "shadow",
        yaml,
        vec![
            call(one("shadow", &[ua]), Ok, vec![ok(a, 1)]),
            call(one("shadow", &[ua]), Ok, vec![ok(a, 0)]),
            call(one("shadow", &[ua]), Ok, vec![ok(a, 0)]),
            call(one("shadow", &[ua]), Ok, vec![ok(a, 0)]),
            call(one("shadow", &[ua, uc]), Ok, vec![ok(a, 0), ok(c, 2)]),
            call(one("shadow", &[ua, ub]), Ok, vec![ok(a, 0), ok(b, 0)]),
            call(one("shadow", &[ua, ub]), OverLimit, vec![ok(a, 0), over(b)]),
            call(one("shadow", &[uc]), Ok, vec![ok(c, 1)]),
        ],
    )
}

/// `quota_mode`: its OVER_LIMIT is reported; the request is OVER_LIMIT only when a normal
/// descriptor is over or every quota descriptor is; over ones consume nothing.
pub(super) fn quota() -> Case {
    let yaml = "
domain: quota
descriptors:
  - key: q1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: q1
  - key: q2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: q2
  - key: q3
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
      name: q3
  - key: n
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: n
  - key: m
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: m
";
    let q = |d: &[D]| one("quota", d);
    let (q1, q2, q3) = ((1, MIN, "q1"), (1, MIN, "q2"), (2, MIN, "q3"));
    let (n, m) = ((5, MIN, "n"), (1, MIN, "m"));
    let (d1, d2, d3): (D, D, D) = (&[("q1", "x")], &[("q2", "x")], &[("q3", "x")]);
    let (dn, dm): (D, D) = (&[("n", "x")], &[("m", "x")]);
    Case::new(
        "quota",
        yaml,
        vec![
            call(q(&[d1]), Ok, vec![ok(q1, 0)]),
            call(q(&[d1]), OverLimit, vec![over(q1)]),
            call(q(&[d1, d2]), Ok, vec![over(q1), ok(q2, 0)]),
            call(q(&[d1, d2]), OverLimit, vec![over(q1), over(q2)]),
            call(q(&[d1, dn]), OverLimit, vec![over(q1), ok(n, 5)]),
            call(q(&[dn]), Ok, vec![ok(n, 4)]),
            call(q(&[d3, dm]), Ok, vec![ok(q3, 1), ok(m, 0)]),
            call(q(&[d3, dm]), OverLimit, vec![ok(q3, 1), over(m)]),
            call(q(&[d3]), Ok, vec![ok(q3, 0)]),
        ],
    )
}

/// `replaces`: with both limits matched, the replaced one is OK without a limit and its
/// counter untouched (it does not count even when exhausted).
pub(super) fn replaces() -> Case {
    let yaml = "
domain: repl
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bk
        rate_limit:
          name: specific
          unit: minute
          requests_per_unit: 2
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bk
        rate_limit:
          replaces:
            - name: specific
          unit: minute
          requests_per_unit: 5
";
    let x: D = &[("key_1", "value_1"), ("user", "bk")];
    let y: D = &[("key_2", "value_2"), ("user", "bk")];
    let (s, w) = ((2, MIN, "specific"), (5, MIN, ""));
    Case::new(
        "replaces",
        yaml,
        vec![
            call(one("repl", &[x]), Ok, vec![ok(s, 1)]),
            call(one("repl", &[x, y]), Ok, vec![free(), ok(w, 4)]),
            call(one("repl", &[x, y]), Ok, vec![free(), ok(w, 3)]),
            call(one("repl", &[x]), Ok, vec![ok(s, 0)]),
            call(one("repl", &[x]), OverLimit, vec![over(s)]),
            call(one("repl", &[x, y]), Ok, vec![free(), ok(w, 2)]),
            call(one("repl", &[y, x]), Ok, vec![ok(w, 1), free()]),
        ],
    )
}

/// The request's `hits_addend`: 0 counts as 1 (the contract: only a descriptor's own 0
/// checks), 3 consumes 3, hits that do not fit are OVER_LIMIT and consume nothing.
pub(super) fn hits_request() -> Case {
    let yaml = "
domain: hits
descriptors:
  - key: h
    rate_limit:
      unit: minute
      requests_per_unit: 6
      name: six
";
    let h = |hits| {
        let mut r = one("hits", &[&[("h", "req")]]);
        r.hits_addend = hits;
        r
    };
    let l = (6, MIN, "six");
    Case::new(
        "hits_request",
        yaml,
        vec![
            call(h(3), Ok, vec![ok(l, 3)]),
            call(h(0), Ok, vec![ok(l, 2)]),
            call(h(3), OverLimit, vec![over(l)]),
            call(h(2), Ok, vec![ok(l, 0)]),
            call(h(1), OverLimit, vec![over(l)]),
        ],
    )
}

/// A descriptor's own `hits_addend` overrides the request's: 0 checks without consuming
/// (OVER_LIMIT only with no unit left), 3 consumes 3, hits that do not fit consume
/// nothing; descriptors without one take the request's.
pub(super) fn hits_descriptor() -> Case {
    let yaml = "
domain: hitsd
descriptors:
  - key: h
    rate_limit:
      unit: minute
      requests_per_unit: 6
      name: six
";
    let d = |hits, request_hits| {
        let mut r = req("hitsd", vec![desc_hits(&[("h", "desc")], hits)]);
        r.hits_addend = request_hits;
        r
    };
    let l = (6, MIN, "six");
    let mut mixed = req(
        "hitsd",
        vec![desc_hits(&[("h", "m1")], 1), desc(&[("h", "m2")])],
    );
    mixed.hits_addend = 2;
    Case::new(
        "hits_descriptor",
        yaml,
        vec![
            call(d(0, 0), Ok, vec![ok(l, 6)]),
            call(d(3, 1), Ok, vec![ok(l, 3)]),
            call(d(0, 0), Ok, vec![ok(l, 3)]),
            call(d(4, 0), OverLimit, vec![over(l)]),
            call(d(0, 3), Ok, vec![ok(l, 3)]),
            call(d(3, 5), Ok, vec![ok(l, 0)]),
            call(d(0, 0), OverLimit, vec![over(l)]),
            call(mixed, Ok, vec![ok(l, 5), ok(l, 4)]),
            call(one("hitsd", &[&[("h", "m1")]]), Ok, vec![ok(l, 4)]),
        ],
    )
}

/// A descriptor's `limit` replaces the configured one (name "", no shadow), needs no
/// config match but a known domain; unit UNKNOWN is INVALID_ARGUMENT.
pub(super) fn limit_override() -> Case {
    let yaml = "
domain: ovr
descriptors:
  - key: o
    value: x
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: cfg
  - key: sh
    value: x
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: shadowed
";
    let o = |d| req("ovr", vec![d]);
    let ox = || desc_limit(&[("o", "x")], 2, RateLimitUnit::Minute);
    let free_z = || desc_limit(&[("free", "z")], 1, RateLimitUnit::Hour);
    let sh = || desc_limit(&[("sh", "x")], 1, RateLimitUnit::Minute);
    let (two, hour, sh1) = ((2, MIN, ""), (1, Unit::Hour, ""), (1, MIN, ""));
    let nope = || {
        req(
            "nope",
            vec![desc_limit(&[("o", "x")], 1, RateLimitUnit::Minute)],
        )
    };
    let bad_unit = desc_limit(&[("o", "x")], 3, RateLimitUnit::Unknown);
    Case::new(
        "limit_override",
        yaml,
        vec![
            call(o(ox()), Ok, vec![ok(two, 1)]),
            call(o(ox()), Ok, vec![ok(two, 0)]),
            call(o(ox()), OverLimit, vec![over(two)]),
            call(o(free_z()), Ok, vec![ok(hour, 0)]),
            call(o(free_z()), OverLimit, vec![over(hour)]),
            call(o(sh()), Ok, vec![ok(sh1, 0)]),
            call(o(sh()), OverLimit, vec![over(sh1)]),
            fails(o(bad_unit), INVALID),
            call(nope(), Ok, vec![unknown()]),
            call(nope(), Ok, vec![unknown()]),
        ],
    )
}

/// `[rls] response_headers = true`: the RateLimit-* headers of the descriptor nearest its
/// limit (an over-limit one first, else the fewest remaining).
pub(super) fn headers() -> Case {
    let yaml = "
domain: hdr
descriptors:
  - key: a
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: a
  - key: b
    rate_limit:
      unit: minute
      requests_per_unit: 2
      name: b
  - key: c
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: c
";
    let (a, b, c) = ((5, MIN, "a"), (2, MIN, "b"), (1, MIN, "c"));
    let (da, db, dz): (D, D, D) = (&[("a", "1")], &[("b", "1")], &[("zz", "1")]);
    let (c1, c2): (D, D) = (&[("c", "1")], &[("c", "2")]);
    let h = |d: &[D]| one("hdr", d);
    let steps = vec![
        call_h(h(&[da, db]), Ok, vec![ok(a, 4), ok(b, 1)], (2, 1, 1)),
        call_h(h(&[dz, da]), Ok, vec![free(), ok(a, 3)], (5, 3, 1)),
        call_h(h(&[da, db]), Ok, vec![ok(a, 2), ok(b, 0)], (2, 0, 1)),
        call_h(h(&[c1, da]), Ok, vec![ok(c, 0), ok(a, 1)], (1, 0, 0)),
        call_h(h(&[c2, db]), OverLimit, vec![ok(c, 1), over(b)], (2, 0, 1)),
        call_h(h(&[c2]), Ok, vec![ok(c, 0)], (1, 0, 0)),
        call_h(h(&[da]), Ok, vec![ok(a, 0)], (5, 0, 0)),
    ];
    Case {
        headers: true,
        ..Case::new("headers", yaml, steps)
    }
}

/// Empty domain, no descriptors, more than 64 descriptors: INVALID_ARGUMENT, nothing
/// consumed; 64 descriptors are fine.
pub(super) fn invalid() -> Case {
    let yaml = "
domain: inv
descriptors:
  - key: n
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: one
";
    let l = (1, MIN, "one");
    let values: Vec<String> = (0..=64).map(|i| i.to_string()).collect();
    let many = |r: std::ops::Range<usize>| {
        let d = values[r].iter().map(|v| desc(&[("n", v)])).collect();
        req("inv", d)
    };
    Case::new(
        "invalid",
        yaml,
        vec![
            fails(one("", &[&[("n", "0")]]), INVALID),
            fails(req("inv", vec![]), INVALID),
            fails(req("", vec![]), INVALID),
            fails(many(0..65), INVALID),
            call(one("inv", &[&[("n", "0")]]), Ok, vec![ok(l, 0)]),
            call(many(1..65), Ok, vec![ok(l, 0); 64]),
            call(one("inv", &[&[("n", "64")]]), OverLimit, vec![over(l)]),
        ],
    )
}

/// An unknown domain: OK, every status OK without a limit and remaining 0, never counted.
pub(super) fn unknown_domain() -> Case {
    let yaml = "
domain: known
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: k
";
    let (k, other): (D, D) = (&[("k", "1")], &[("other", "x")]);
    let mut steps: Vec<Step> = (0..3)
        .map(|_| call(one("nope", &[k]), Ok, vec![unknown()]))
        .collect();
    steps.extend([
        call(one("nope", &[k, other]), Ok, vec![unknown(), unknown()]),
        call(one("known", &[k]), Ok, vec![ok((1, MIN, "k"), 0)]),
    ]);
    Case {
        never_stored: &["rls:nope"],
        ..Case::new("unknown_domain", yaml, steps)
    }
}
