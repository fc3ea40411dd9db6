//! Bearer JWTs in the pipeline, without a gateway process: the token verified at the
//! request's clock reading, its claims as the caller's key id, tenant and tiers, and
//! refused tokens charged in `[limits.auth]`.

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::{EncodingKey, Header};
use serde_json::json;

use super::*;
use crate::auth::{Algorithm, JwtSettings};
use crate::clock::ManualClock;
use crate::config::Jwt;
use crate::metrics::Metrics;
use crate::store::MemoryStore;

/// A clock far from the system's: a token checked against the system clock would fail.
const NOW_MS: u64 = 1_700_000_000_000;
const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

const CONFIG: &str = r#"
[limits.auth]
per_minute = 2

[tiers.free]
key = { per_minute = 10 }

[tiers.gold]
key = { per_minute = 50 }

[[tenants]]
id = "big-org"
tier = "gold"

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:9000"]
auth = "required"
"#;

fn core(clock: Arc<ManualClock>) -> Core {
    let mut c = crate::config::parse("t.toml", CONFIG).unwrap();
    c.jwt = Some(Jwt {
        settings: JwtSettings {
            algorithms: vec![Algorithm::HS256],
            hs256_secret: Some(SECRET.to_vec()),
            tenant_claim: Some("org".into()),
            tier_claim: Some("plan".into()),
            ..JwtSettings::default()
        },
        default_tier: Some("free".into()),
    });
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let metrics = Arc::new(Metrics::new().unwrap());
    Core::with_clock(Runtime::from_config(c).unwrap(), store, metrics, clock).unwrap()
}

fn token(claims: serde_json::Value) -> String {
    let key = EncodingKey::from_secret(SECRET);
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap()
}

async fn admit_token(core: &Core, ip: &str, token: &str) -> Result<Admission, Refusal> {
    let req = AdmitRequest {
        client_ip: ip.parse().unwrap(),
        target: Target::Match {
            host: None,
            path: "/x",
            method: &http::Method::GET,
        },
        key: Presented::Token(token.as_bytes()),
        cost: None,
        also_charge: None,
        origin: Origin::Proxy,
        attrs: Default::default(),
        skip: Default::default(),
    };
    admit(core, &req).await
}

fn refused(r: Result<Admission, Refusal>) -> Rejection {
    r.unwrap_err().rejection
}

/// Claims become the caller: key id (its key scope `jwt:<sub>`), tenant only from
/// `tenant_claim`, tier (else the default), the tenant's tier from `[[tenants]]`; the token
/// is checked at the request's clock.
#[tokio::test]
async fn claims_become_the_caller_at_the_request_clock() {
    let clock = Arc::new(ManualClock::at(NOW_MS));
    let core = core(clock.clone());
    let exp = NOW_MS / 1000 + 60;
    let a = admit_token(
        &core,
        "192.0.2.1",
        &token(json!({"sub": "u1", "org": "big-org", "exp": exp})),
    )
    .await
    .unwrap();
    let k = a.key.clone().unwrap();
    assert_eq!((&*k.key_id, k.tenant_id()), ("u1", Some("big-org")));
    assert_eq!(k.key_scope_id(), Some("jwt:u1"));
    assert_eq!(
        (k.tier.name.as_str(), k.tenant_tier.name.as_str()),
        ("free", "gold")
    );
    drop(a);
    let solo = token(json!({"sub": "u2", "plan": "gold", "exp": exp}));
    let k = admit_token(&core, "192.0.2.1", &solo)
        .await
        .unwrap()
        .key
        .clone()
        .unwrap();
    // No tenant claim: no tenant (not a tenant named after the subject).
    assert_eq!((k.tenant_id(), k.tier.name.as_str()), (None, "gold"));
    assert!(k.tenant_ident.is_none() && k.headers.tenant.is_none());
    // Past exp and the 30 s leeway on the request's clock: refused.
    clock.advance(Duration::from_secs(91));
    assert!(matches!(
        refused(admit_token(&core, "192.0.2.1", &solo).await),
        Rejection::InvalidToken
    ));
}

/// A tier no config names makes the token invalid; refused tokens count in
/// `[limits.auth]` per address, and past the limit even a valid token gets 429 `auth`.
#[tokio::test]
async fn refused_tokens_count_in_limits_auth() {
    let core = core(Arc::new(ManualClock::at(NOW_MS)));
    let exp = NOW_MS / 1000 + 60;
    let unknown_tier = token(json!({"sub": "u", "plan": "platinum", "exp": exp}));
    let valid = token(json!({"sub": "u", "exp": exp}));
    for _ in 0..2 {
        let r = refused(admit_token(&core, "192.0.2.9", &unknown_tier).await);
        assert!(matches!(r, Rejection::InvalidToken), "{r:?}");
    }
    let r = refused(admit_token(&core, "192.0.2.9", &unknown_tier).await);
    assert!(
        matches!(&r, Rejection::RateLimited { governing, .. } if governing.scope == crate::limiter::Scope::Auth),
        "{r:?}"
    );
    let r = refused(admit_token(&core, "192.0.2.9", &valid).await);
    assert!(matches!(r, Rejection::RateLimited { .. }), "{r:?}");
    assert!(
        admit_token(&core, "192.0.2.10", &valid).await.is_ok(),
        "another address"
    );
}

/// The verifier is the core's, not the runtime's: a swap hands it the new settings and
/// keeps it (same `Arc`); settings it refuses leave the runtime and the verifier as they
/// were; a config without `[auth.jwt]` drops it, and one adding the section makes a new
/// one.
#[tokio::test]
async fn a_swap_hands_the_verifier_new_settings_or_changes_nothing() {
    let core = core(Arc::new(ManualClock::at(NOW_MS)));
    let valid = token(json!({"sub": "u", "exp": NOW_MS / 1000 + 60}));
    let first = core.jwt().expect("a verifier");
    let config = |jwt: Option<Jwt>| {
        let mut c = core.runtime().config.clone();
        c.jwt = jwt;
        Runtime::from_config(c).unwrap()
    };
    let settings = core.runtime().config.jwt.clone().unwrap();

    core.swap_runtime(config(Some(settings.clone()))).unwrap();
    assert!(
        Arc::ptr_eq(&core.jwt().unwrap(), &first),
        "kept over a reload"
    );

    let before = core.runtime();
    let mut no_secret = settings.clone();
    no_secret.settings.hs256_secret = None;
    let e = core.swap_runtime(config(Some(no_secret))).unwrap_err();
    assert!(matches!(e, RuntimeError::Jwt(_)), "{e}");
    assert!(Arc::ptr_eq(&core.runtime(), &before), "nothing swapped");
    assert!(Arc::ptr_eq(&core.jwt().unwrap(), &first));
    assert!(admit_token(&core, "192.0.2.1", &valid).await.is_ok());

    core.swap_runtime(config(None)).unwrap();
    assert!(core.jwt().is_none());
    core.swap_runtime(config(Some(settings))).unwrap();
    let again = core.jwt().expect("a verifier again");
    assert!(!Arc::ptr_eq(&again, &first), "a new verifier");
    assert!(admit_token(&core, "192.0.2.1", &valid).await.is_ok());
}
