//! A `RateLimitRequest` read as one admission request: every entry of every descriptor
//! merged, each name given at most once (repeating the same value is fine), the cost
//! agreed on. Pure: no config, no state; what it refuses is a malformed request.

use std::net::IpAddr;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The entry keys a descriptor may carry.
const KNOWN: &str = "remote_address, api_key, key_id, tenant, route";

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Asked<'a> {
    /// `remote_address`: the address the `ip` scope counts.
    pub(super) client_ip: IpAddr,
    /// `api_key` or `key_id`.
    pub(super) caller: Caller<'a>,
    /// `tenant`.
    pub(super) tenant: Option<&'a str>,
    /// `route`.
    pub(super) route: Option<&'a str>,
    /// `hits_addend` (None: 0 or unset, the default cost).
    pub(super) cost: Option<u32>,
    /// How many descriptors were sent (one status is answered per descriptor).
    pub(super) descriptors: usize,
}

/// Who the request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller<'a> {
    /// Neither `api_key` nor `key_id`.
    Anonymous,
    /// `api_key`: the raw key.
    ApiKey(&'a str),
    /// `key_id`.
    KeyId(&'a str),
}

/// The entries found so far.
#[derive(Default)]
struct Entries<'a> {
    remote_address: Option<&'a str>,
    api_key: Option<&'a str>,
    key_id: Option<&'a str>,
    tenant: Option<&'a str>,
    route: Option<&'a str>,
    /// The cost the descriptors agree on: `Some(None)` is the default cost.
    cost: Option<Option<u64>>,
}

/// Reads `req`.
///
/// # Errors
/// Why the request is malformed, as the message of an `INVALID_ARGUMENT` status.
pub(super) fn read(req: &RateLimitRequest) -> Result<Asked<'_>, String> {
    if req.descriptors.is_empty() {
        return Err("no descriptors: at least a remote_address entry is needed".into());
    }
    let mut found = Entries::default();
    for (i, d) in req.descriptors.iter().enumerate() {
        descriptor(&mut found, i, d, req.hits_addend)?;
    }
    let Some(address) = found.remote_address else {
        return Err("no remote_address entry: the ip scope needs the client address".into());
    };
    let client_ip = address
        .parse::<IpAddr>()
        .map_err(|_| format!("remote_address {address:?} is not an IP address"))?;
    let client_ip = crate::client_ip::canonical(client_ip);
    let caller = match (found.api_key, found.key_id) {
        (Some(_), Some(_)) => {
            return Err("api_key and key_id both name the caller: send one".into())
        }
        (Some(k), None) => Caller::ApiKey(k),
        (None, Some(id)) => Caller::KeyId(id),
        (None, None) => Caller::Anonymous,
    };
    let cost = match found.cost.flatten() {
        None => None,
        Some(n) => Some(
            u32::try_from(n)
                .map_err(|_| format!("hits_addend {n} is too large: at most {}", u32::MAX))?,
        ),
    };
    Ok(Asked {
        client_ip,
        caller,
        tenant: found.tenant,
        route: found.route,
        cost,
        descriptors: req.descriptors.len(),
    })
}

/// Adds descriptor `i` to `found`; `request_hits` is the request's `hits_addend`, which a
/// descriptor's own `hits_addend` overrides.
fn descriptor<'a>(
    found: &mut Entries<'a>,
    i: usize,
    d: &'a RateLimitDescriptor,
    request_hits: u32,
) -> Result<(), String> {
    if d.entries.is_empty() {
        return Err(format!("descriptor {i} has no entries"));
    }
    if d.is_negative_hits {
        return Err(format!(
            "descriptor {i}: is_negative_hits is not supported (nothing is refunded)"
        ));
    }
    if d.limit.is_some() {
        return Err(format!(
            "descriptor {i}: limit overrides are not supported: limits come from gateway.toml"
        ));
    }
    let hits = d.hits_addend.map_or(u64::from(request_hits), |v| v.value);
    let hits = (hits > 0).then_some(hits);
    match found.cost {
        Some(c) if c != hits => {
            let show = |c: Option<u64>| c.map_or("0 (the default)".to_string(), |n| n.to_string());
            return Err(format!(
                "descriptors ask for different hits_addend: {} and {}; one admission has one cost",
                show(c),
                show(hits)
            ));
        }
        _ => found.cost = Some(hits),
    }
    for e in &d.entries {
        let (slot, secret) = match e.key.as_str() {
            "remote_address" => (&mut found.remote_address, false),
            "api_key" => (&mut found.api_key, true),
            "key_id" => (&mut found.key_id, false),
            "tenant" => (&mut found.tenant, false),
            "route" => (&mut found.route, false),
            other => {
                return Err(format!(
                    "descriptor {i}: unknown entry {other:?} (known: {KNOWN})"
                ))
            }
        };
        match *slot {
            Some(v) if v != e.value && secret => {
                return Err(format!("two different {} values", e.key))
            }
            Some(v) if v != e.value => {
                return Err(format!(
                    "two different {} values: {v:?} and {:?}",
                    e.key, e.value
                ))
            }
            _ => *slot = Some(&e.value),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;

    fn d(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn req(descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
        RateLimitRequest {
            domain: "ignored".into(),
            descriptors,
            hits_addend: hits,
        }
    }

    fn err(r: RateLimitRequest) -> String {
        read(&r).expect_err("malformed")
    }

    /// Entries of several descriptors merge into one request; a repeated equal value is
    /// fine; IPv4-mapped addresses count as IPv4.
    #[test]
    fn merges_entries_across_descriptors() {
        let r = req(
            vec![
                d(&[("remote_address", "::ffff:203.0.113.7")]),
                d(&[("remote_address", "::ffff:203.0.113.7"), ("key_id", "k1")]),
                d(&[("tenant", "acme"), ("route", "api")]),
            ],
            0,
        );
        let a = read(&r).unwrap();
        assert_eq!(a.client_ip, "203.0.113.7".parse::<IpAddr>().unwrap());
        assert_eq!(a.caller, Caller::KeyId("k1"));
        assert_eq!((a.tenant, a.route), (Some("acme"), Some("api")));
        assert_eq!((a.cost, a.descriptors), (None, 3));
    }

    /// The request's hits_addend is the cost; 0 is the default; a descriptor's own
    /// hits_addend overrides it; descriptors that disagree are refused.
    #[test]
    fn hits_addend_is_the_cost() {
        let ip = || d(&[("remote_address", "10.0.0.1")]);
        assert_eq!(read(&req(vec![ip()], 0)).unwrap().cost, None);
        assert_eq!(read(&req(vec![ip(), ip()], 5)).unwrap().cost, Some(5));
        let own = |n| RateLimitDescriptor {
            hits_addend: Some(UInt64Value { value: n }),
            ..ip()
        };
        assert_eq!(read(&req(vec![own(7), own(7)], 5)).unwrap().cost, Some(7));
        let e = err(req(vec![own(7), ip()], 5));
        assert!(e.contains("different hits_addend: 7 and 5"), "{e}");
        let e = err(req(vec![own(7), own(0)], 0));
        assert!(e.contains("7 and 0 (the default)"), "{e}");
        let e = err(req(vec![own(u64::from(u32::MAX) + 1)], 0));
        assert!(e.contains("too large"), "{e}");
    }

    /// Every malformed request is refused with a message naming what is wrong, and never
    /// repeats a raw API key.
    #[test]
    fn refuses_malformed_requests() {
        let cases: Vec<(RateLimitRequest, &str)> = vec![
            (req(vec![], 0), "no descriptors"),
            (req(vec![d(&[])], 0), "descriptor 0 has no entries"),
            (req(vec![d(&[("api_key", "k")])], 0), "no remote_address"),
            (
                req(vec![d(&[("remote_address", "10.0.0.300")])], 0),
                "\"10.0.0.300\" is not an IP address",
            ),
            (
                req(vec![d(&[("remote_address", "10.0.0.1:80")])], 0),
                "is not an IP address",
            ),
            (
                req(
                    vec![
                        d(&[("remote_address", "10.0.0.1")]),
                        d(&[("remote_address", "10.0.0.2")]),
                    ],
                    0,
                ),
                "two different remote_address values: \"10.0.0.1\" and \"10.0.0.2\"",
            ),
            (
                req(
                    vec![d(&[("remote_address", "10.0.0.1"), ("generic_key", "x")])],
                    0,
                ),
                "descriptor 0: unknown entry \"generic_key\"",
            ),
            (
                req(
                    vec![d(&[
                        ("remote_address", "10.0.0.1"),
                        ("api_key", "a"),
                        ("key_id", "k"),
                    ])],
                    0,
                ),
                "api_key and key_id both name the caller",
            ),
            (
                req(vec![d(&[("route", "a")]), d(&[("route", "b")])], 0),
                "two different route values",
            ),
        ];
        for (r, want) in cases {
            let e = err(r);
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
        let e = err(req(
            vec![
                d(&[("api_key", "secret-one")]),
                d(&[("api_key", "secret-two")]),
            ],
            0,
        ));
        assert_eq!(e, "two different api_key values");
        let mut negative = d(&[("remote_address", "10.0.0.1")]);
        negative.is_negative_hits = true;
        assert!(err(req(vec![negative], 0)).contains("is_negative_hits"));
        let mut overridden = d(&[("remote_address", "10.0.0.1")]);
        overridden.limit = Some(RateLimitOverride::default());
        assert!(err(req(vec![overridden], 0)).contains("limit overrides"));
    }
}
