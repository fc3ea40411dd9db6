//! The verified-token cache: hits, `exp`, key rotation, failures, the bound.

use jsonwebtoken::Algorithm;
use serde_json::json;

use super::support::{claims, jwks, verifier, TestKey, NOW};
use crate::auth::cache::TokenCache;
use crate::auth::{Caller, InvalidToken, JwtSettings, CACHE_CAPACITY};

use Algorithm::{EdDSA, RS256};

/// A repeat token is served from the cache, as the same caller.
#[test]
fn a_repeat_token_is_a_hit_with_the_same_caller() {
    let key = TestKey::rsa(RS256, "rsa-1", 0);
    let (v, _f) = verifier(&[RS256], &[&key]);
    let token = key.sign(&claims("u"));
    assert_eq!(v.cached(token.as_bytes(), NOW), None);
    let first = v.verify(token.as_bytes(), NOW).unwrap();
    assert_eq!(v.cached(token.as_bytes(), NOW), Some(first.clone()));
    assert_eq!(v.verify(token.as_bytes(), NOW + 60), Ok(first));
    assert_eq!(v.stats().cached, 1);
}

/// A cached token serves until its `exp`, then is verified again (leeway included), and
/// is refused once past `exp` + leeway: the cache never outlives `exp`.
#[test]
fn a_hit_never_outlives_exp() {
    let key = TestKey::ed("k");
    let (v, _f) = verifier(&[EdDSA], &[&key]);
    let token = key.sign(&json!({ "sub": "u", "exp": NOW + 100 }));
    let t = token.as_bytes();
    assert!(v.verify(t, NOW).is_ok());
    assert!(v.cached(t, NOW + 99).is_some());
    assert_eq!(v.cached(t, NOW + 100), None);
    assert!(v.verify(t, NOW + 130).is_ok(), "within the leeway");
    assert_eq!(v.verify(t, NOW + 131), Err(InvalidToken::Expired));
    let strict = JwtSettings {
        leeway_secs: 0,
        ..v.settings()
    };
    v.reload(strict).unwrap();
    assert!(v.verify(t, NOW + 99).is_ok());
    assert!(v.verify(t, NOW + 100).is_ok(), "exp itself still holds");
    assert_eq!(v.verify(t, NOW + 101), Err(InvalidToken::Expired));
}

/// Refusals are not remembered.
#[test]
fn failures_are_not_cached() {
    let key = TestKey::ed("k");
    let (v, _f) = verifier(&[EdDSA], &[&key]);
    let expired = key.sign(&json!({ "sub": "u", "exp": NOW - 600 }));
    let stranger = TestKey::ed("other").sign(&claims("u"));
    for t in [&expired, &stranger, &"a.b.c".to_string()] {
        assert!(v.verify(t.as_bytes(), NOW).is_err());
    }
    assert_eq!(v.stats().cached, 0);
}

/// A key removed from the set stops verifying at once, cached tokens included; an
/// unchanged reload keeps the cache warm.
#[test]
fn key_rotation_drops_the_cache() {
    let (old, new) = (TestKey::ed("old"), TestKey::ed("new"));
    let (v, file) = verifier(&[EdDSA], &[&old]);
    let token = old.sign(&claims("u"));
    assert!(v.verify(token.as_bytes(), NOW).is_ok());
    v.reload(v.settings()).unwrap();
    assert_eq!(v.stats().cached, 1, "same file, same settings: cache kept");
    file.write(&jwks(&[&new]));
    v.reload(v.settings()).unwrap();
    assert_eq!(v.stats().cached, 0);
    assert_eq!(
        v.verify(token.as_bytes(), NOW),
        Err(InvalidToken::UnknownKid)
    );
    assert!(v.verify(new.sign(&claims("u")).as_bytes(), NOW).is_ok());
}

fn caller(exp: u64) -> Caller {
    Caller {
        key_id: "u".into(),
        tenant: None,
        tier: None,
        expires_at: exp,
        claims: Vec::new(),
    }
}

/// A full shard drops its expired entries first, and empties itself only when live
/// entries fill it; the whole cache never holds more than `CACHE_CAPACITY`.
#[test]
fn the_cache_is_bounded() {
    let per_shard = CACHE_CAPACITY as u128 / 16;
    let cache = TokenCache::default();
    let shard0 = |i: u128| i * 16;
    for i in 0..per_shard {
        cache.put(shard0(i), &caller(NOW + 1), NOW);
    }
    assert_eq!(cache.len() as u128, per_shard);
    // Later, all of them expired: the next insert sweeps them.
    let later = NOW + 2;
    cache.put(shard0(per_shard), &caller(NOW + 100), later);
    assert_eq!(cache.len(), 1);
    for i in 1..per_shard {
        cache.put(shard0(per_shard + i), &caller(NOW + 100), later);
    }
    assert_eq!(cache.len() as u128, per_shard);
    // Full of live entries: emptied, then the new one goes in.
    cache.put(shard0(10 * per_shard), &caller(NOW + 100), later);
    assert_eq!(cache.len(), 1);
    assert!(cache.get(shard0(10 * per_shard), later).is_some());
    // Spread over every shard, the total stays bounded.
    for i in 0..(3 * CACHE_CAPACITY as u128) {
        cache.put(
            i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            &caller(NOW + 100),
            later,
        );
    }
    assert!(cache.len() <= CACHE_CAPACITY, "{}", cache.len());
    // An entry at its exp is not stored.
    let fresh = TokenCache::default();
    fresh.put(1, &caller(later), later);
    assert_eq!(fresh.len(), 0);
}
