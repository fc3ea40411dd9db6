//! A `RateLimitRequest` read for the built-in mapping: each descriptor on its own (its
//! entries, each name given at most once, repeating the same value is fine; its cost).
//! Pure: no config, no state; what it refuses is a malformed request.

use std::net::IpAddr;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The entry keys a descriptor may carry.
const KNOWN: &str = "remote_address, api_key, key_id, tenant, route";

/// What one descriptor asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Asked<'a> {
    /// `remote_address`: the address the `ip` scope counts (None: no ip limit applies).
    pub(super) client_ip: Option<IpAddr>,
    /// `api_key` or `key_id`.
    pub(super) caller: Caller<'a>,
    /// `tenant`.
    pub(super) tenant: Option<&'a str>,
    /// `route`.
    pub(super) route: Option<&'a str>,
    /// `hits_addend` (None: 0 or unset, the default cost).
    pub(super) cost: Option<u32>,
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

/// The entries of one descriptor.
#[derive(Default)]
struct Entries<'a> {
    remote_address: Option<&'a str>,
    api_key: Option<&'a str>,
    key_id: Option<&'a str>,
    tenant: Option<&'a str>,
    route: Option<&'a str>,
}

/// Reads every descriptor of `req`, in order.
///
/// # Errors
/// Why the request is malformed, as the message of an `INVALID_ARGUMENT` status.
pub(super) fn read(req: &RateLimitRequest) -> Result<Vec<Asked<'_>>, String> {
    if req.descriptors.is_empty() {
        return Err("no descriptors".into());
    }
    if req.descriptors.len() > super::configured::MAX_DESCRIPTORS {
        return Err(format!(
            "{} descriptors: at most {}",
            req.descriptors.len(),
            super::configured::MAX_DESCRIPTORS
        ));
    }
    req.descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| descriptor(i, d, req.hits_addend))
        .collect()
}

/// Reads descriptor `i`; `request_hits` is the request's `hits_addend`, which the
/// descriptor's own `hits_addend` overrides.
fn descriptor(i: usize, d: &RateLimitDescriptor, request_hits: u32) -> Result<Asked<'_>, String> {
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
            "descriptor {i}: limit overrides are not supported: limits come from gateway.toml \
             (or use [rls] config)"
        ));
    }
    let mut found = Entries::default();
    for e in &d.entries {
        let (slot, secret) = match e.key.as_str() {
            "remote_address" => (&mut found.remote_address, false),
            "api_key" => (&mut found.api_key, true),
            "key_id" => (&mut found.key_id, false),
            "tenant" => (&mut found.tenant, false),
            "route" => (&mut found.route, false),
            other => {
                return Err(format!(
                    "descriptor {i}: unknown entry {other:?} (known: {KNOWN}; or use [rls] config)"
                ))
            }
        };
        match *slot {
            Some(v) if v != e.value && secret => {
                return Err(format!("descriptor {i}: two different {} values", e.key))
            }
            Some(v) if v != e.value => {
                return Err(format!(
                    "descriptor {i}: two different {} values: {v:?} and {:?}",
                    e.key, e.value
                ))
            }
            _ => *slot = Some(&e.value),
        }
    }
    let client_ip = match found.remote_address {
        Some(a) => Some(crate::client_ip::canonical(a.parse::<IpAddr>().map_err(
            |_| format!("descriptor {i}: remote_address {a:?} is not an IP address"),
        )?)),
        None => None,
    };
    let caller = match (found.api_key, found.key_id) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "descriptor {i}: api_key and key_id both name the caller: send one"
            ))
        }
        (Some(k), None) => Caller::ApiKey(k),
        (None, Some(id)) => Caller::KeyId(id),
        (None, None) => Caller::Anonymous,
    };
    let hits = d.hits_addend.map_or(u64::from(request_hits), |v| v.value);
    let cost = match hits {
        0 => None,
        n => Some(
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
    })
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

    /// Each descriptor is read on its own; a repeated equal value is fine; IPv4-mapped
    /// addresses count as IPv4; a descriptor without remote_address has no address.
    #[test]
    fn reads_each_descriptor_on_its_own() {
        let r = req(
            vec![
                d(&[("remote_address", "::ffff:203.0.113.7")]),
                d(&[
                    ("remote_address", "10.0.0.9"),
                    ("remote_address", "10.0.0.9"),
                ]),
                d(&[("tenant", "acme"), ("route", "api"), ("key_id", "k1")]),
            ],
            0,
        );
        let a = read(&r).unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(
            a[0].client_ip,
            Some("203.0.113.7".parse::<IpAddr>().unwrap())
        );
        assert_eq!(a[1].client_ip, Some("10.0.0.9".parse::<IpAddr>().unwrap()));
        assert_eq!(a[2].client_ip, None);
        assert_eq!(a[2].caller, Caller::KeyId("k1"));
        assert_eq!((a[2].tenant, a[2].route), (Some("acme"), Some("api")));
        assert_eq!(a[0].cost, None);
    }

    /// The request's hits_addend is the cost; 0 is the default; a descriptor's own
    /// hits_addend overrides it, for that descriptor alone.
    #[test]
    fn hits_addend_is_the_cost() {
        let ip = || d(&[("remote_address", "10.0.0.1")]);
        assert_eq!(read(&req(vec![ip()], 0)).unwrap()[0].cost, None);
        assert_eq!(read(&req(vec![ip(), ip()], 5)).unwrap()[1].cost, Some(5));
        let own = |n| RateLimitDescriptor {
            hits_addend: Some(UInt64Value { value: n }),
            ..ip()
        };
        let r = req(vec![own(7), ip(), own(0)], 5);
        let a = read(&r).unwrap();
        assert_eq!((a[0].cost, a[1].cost, a[2].cost), (Some(7), Some(5), None));
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
            (
                req(vec![d(&[("remote_address", "10.0.0.300")])], 0),
                "descriptor 0: remote_address \"10.0.0.300\" is not an IP address",
            ),
            (
                req(vec![d(&[("remote_address", "10.0.0.1:80")])], 0),
                "is not an IP address",
            ),
            (
                req(
                    vec![d(&[
                        ("remote_address", "10.0.0.1"),
                        ("remote_address", "10.0.0.2"),
                    ])],
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
                req(vec![d(&[("route", "a"), ("route", "b")])], 0),
                "two different route values",
            ),
        ];
        for (r, want) in cases {
            let e = err(r);
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
        // An api_key without remote_address is read (its failed lookups are counted in
        // throttle_rls_unmetered_lookups_total, not refused here).
        let r = req(vec![d(&[("api_key", "guess")])], 0);
        let a = read(&r).unwrap();
        assert_eq!(
            (a[0].client_ip, a[0].caller),
            (None, Caller::ApiKey("guess"))
        );
        let e = err(req(
            vec![d(&[
                ("remote_address", "10.0.0.1"),
                ("api_key", "secret-one"),
                ("api_key", "secret-two"),
            ])],
            0,
        ));
        assert_eq!(e, "descriptor 0: two different api_key values");
        let mut negative = d(&[("remote_address", "10.0.0.1")]);
        negative.is_negative_hits = true;
        assert!(err(req(vec![negative], 0)).contains("is_negative_hits"));
        let mut overridden = d(&[("remote_address", "10.0.0.1")]);
        overridden.limit = Some(RateLimitOverride::default());
        assert!(err(req(vec![overridden], 0)).contains("limit overrides"));
    }
}
