use super::*;
use crate::limiter::{Base, Named};

fn shown(m: &Metrics) -> String {
    String::from_utf8(m.render()).unwrap()
}

/// A reload's removed route tables, custom scopes, routes and domains lose their series;
/// the kept ones, the built-in scopes, `none` and `unknown` keep theirs.
#[test]
fn retain_drops_the_series_of_removed_names_only() {
    let m = Metrics::new().unwrap();
    let gone = Scope::Named(Named::intern(Some("m_old"), Base::Ip));
    let kept = Scope::Named(Named::custom("m_kept"));
    let domain = Scope::Named(Named::domain("m_edge"));
    for s in [gone, kept, domain, Scope::Ip] {
        m.decision(s, Outcome::Allowed);
        m.near_limit(s);
        m.bans(s).inc();
    }
    for r in ["m_old", "m_new", "none"] {
        m.route(r).request(200);
    }
    for d in ["m_edge", "m_gone", "unknown"] {
        m.rls_decisions_total.with_label_values(&[d, "ok"]).inc();
    }
    m.retain_scopes(|n| n == "m_kept");
    m.retain_routes(|r| r == "m_new");
    m.retain_domains(|d| d == "m_edge");
    let text = shown(&m);
    for absent in [
        "scope=\"m_old.ip\"",
        "scope=\"rls:m_edge\"",
        "route=\"m_old\"",
        "domain=\"m_gone\"",
    ] {
        assert!(!text.contains(absent), "{absent} still in\n{text}");
    }
    for present in [
        "throttle_decisions_total{decision=\"allowed\",scope=\"m_kept\"} 1",
        "throttle_near_limit_total{scope=\"m_kept\"} 1",
        "throttle_bans_total{scope=\"m_kept\"} 1",
        "throttle_decisions_total{decision=\"allowed\",scope=\"ip\"} 1",
        "throttle_requests_total{route=\"m_new\",status=\"200\"} 1",
        "throttle_requests_total{route=\"none\",status=\"200\"} 1",
        "throttle_rls_decisions_total{code=\"ok\",domain=\"m_edge\"} 1",
        "throttle_rls_decisions_total{code=\"ok\",domain=\"unknown\"} 1",
    ] {
        assert!(text.contains(present), "{present} missing from\n{text}");
    }
    // The built-in counters cached in arrays still count.
    m.decision(Scope::Ip, Outcome::Allowed);
    assert!(shown(&m).contains("throttle_decisions_total{decision=\"allowed\",scope=\"ip\"} 2"));
}
