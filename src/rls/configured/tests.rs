use std::sync::Arc;

use async_trait::async_trait;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

use super::plan::{override_unit, window};
use super::reply::pb_unit;
use super::*;
use crate::clock::ManualClock;
use crate::descriptors::Unit;
use crate::limiter::DecidedAt;
use crate::metrics::Metrics;
use crate::store::{LimitStore, MemoryStore, StoreError};

/// envoyproxy/ratelimit's units map to windows of its lengths.
#[test]
fn units_have_envoyproxy_lengths() {
    for (u, secs) in [
        (Unit::Second, 1),
        (Unit::Minute, 60),
        (Unit::Hour, 3600),
        (Unit::Day, 86_400),
        (Unit::Week, 604_800),
        (Unit::Month, 2_592_000),
        (Unit::Year, 31_536_000),
    ] {
        assert_eq!(window(u).period_ms(), secs * 1000, "{u:?}");
        assert_eq!(u.seconds(), secs, "{u:?}");
    }
    for code in 1..=7 {
        let u = override_unit(code).unwrap();
        assert_eq!(i32::from(pb_unit(u)), code, "{u:?}");
    }
    assert_eq!(override_unit(0), None);
    assert_eq!(override_unit(8), None);
}

/// A memory store whose every check yields once after deciding, as a store call over
/// the network would: calls in flight together interleave between a charge and what
/// follows it.
struct Yielding(MemoryStore<ManualClock>);

#[async_trait]
impl LimitStore for Yielding {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        let v = self.0.decide(check);
        tokio::task::yield_now().await;
        Ok(v)
    }

    fn settle(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        self.0.settle(check, delta, decided_at);
    }

    fn name(&self) -> &'static str {
        "yielding"
    }
}

/// The service over `yaml` and `store`: the core, `[rls]`, and the descriptors.
fn service(yaml: &str, store: Arc<dyn LimitStore>) -> (Core, Rls, Arc<RlsDescriptors>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rl.yaml");
    std::fs::write(&path, yaml).unwrap();
    let body = format!(
        "[rls]\nconfig = \"{}\"\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\n",
        path.display()
    );
    let config = crate::config::parse("t.toml", &body).unwrap();
    let rls = config.rls.clone();
    let d = rls.descriptors.clone().unwrap();
    let core = Core::with_clock(
        admission::Runtime::from_config(config).unwrap(),
        store,
        Arc::new(Metrics::new().unwrap()),
        Arc::new(ManualClock::at(1_764_000_000_000)),
    )
    .unwrap();
    (core, rls, d)
}

/// A descriptor's entries.
type Entries = &'static [(&'static str, &'static str)];

fn request(descriptors: &[Entries]) -> RateLimitRequest {
    let descriptor = |entries: &Entries| RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    };
    RateLimitRequest {
        domain: "race".into(),
        descriptors: descriptors.iter().map(descriptor).collect(),
        hits_addend: 0,
    }
}

/// A refused call in flight never holds a unit of a descriptor that fits: a call of that
/// descriptor alone, decided while the refused call's checks are pending, still gets
/// its last unit.
#[tokio::test]
async fn a_refused_call_holds_no_unit_while_in_flight() {
    let yaml = "domain: race\ndescriptors:\n  - key: a\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n  - key: b\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";
    let clock = ManualClock::at(1_764_000_000_000);
    let store = Arc::new(Yielding(MemoryStore::with_clock(clock)));
    let (core, rls, d) = service(yaml, store);
    let (a, b): (Entries, Entries) = (&[("a", "1")], &[("b", "1")]);
    let spend_b = decide(&core, &rls, &d, &request(&[b])).await.unwrap();
    assert_eq!(spend_b.overall_code(), Code::Ok);
    let (both, alone) = (request(&[a, b]), request(&[a]));
    let (both, alone) = tokio::join!(
        decide(&core, &rls, &d, &both),
        decide(&core, &rls, &d, &alone)
    );
    let (both, alone) = (both.unwrap(), alone.unwrap());
    assert_eq!(both.overall_code(), Code::OverLimit, "{both:?}");
    assert_eq!(alone.overall_code(), Code::Ok, "a alone: {alone:?}");
    let again = decide(&core, &rls, &d, &request(&[a])).await.unwrap();
    assert_eq!(again.overall_code(), Code::OverLimit, "a spent: {again:?}");
}
