//! `verify`: each algorithm, each way a token is refused, and the claims.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

use super::support::{
    claims, hand_signed, jwks, settings, unsigned, verifier, JwksFile, TestKey, NOW, SECRET,
};
use crate::auth::{Caller, InvalidToken, JwtSettings, JwtVerifier, MAX_TOKEN_LEN};

use Algorithm::{EdDSA, ES256, ES384, HS256, PS256, RS256, RS384, RS512};

const ALL: [Algorithm; 8] = [RS256, RS384, RS512, PS256, ES256, ES384, EdDSA, HS256];

/// Keys of every type in one JWKS, the verifier over them (all algorithms allowed).
struct World {
    rsa: Vec<TestKey>,
    ec256: TestKey,
    ec384: TestKey,
    ed: TestKey,
    hs: TestKey,
    v: JwtVerifier,
    _file: JwksFile,
}

fn world() -> World {
    let rsa: Vec<TestKey> = [RS256, RS384, RS512, PS256]
        .into_iter()
        .map(|alg| TestKey::rsa(alg, "rsa-1", 0))
        .collect();
    let (ec256, ec384, ed) = (
        TestKey::ec(ES256, "ec-256"),
        TestKey::ec(ES384, "ec-384"),
        TestKey::ed("ed-1"),
    );
    let (v, file) = verifier(&ALL, &[&rsa[0], &ec256, &ec384, &ed]);
    World {
        hs: TestKey::hs256(SECRET),
        rsa,
        ec256,
        ec384,
        ed,
        v,
        _file: file,
    }
}

impl World {
    fn keys(&self) -> impl Iterator<Item = &TestKey> {
        self.rsa
            .iter()
            .chain([&self.ec256, &self.ec384, &self.ed, &self.hs])
    }
}

fn caller(sub: &str) -> Caller {
    Caller {
        key_id: sub.into(),
        tenant: None,
        tier: None,
        expires_at: NOW + 3600,
        claims: Vec::new(),
    }
}

/// A token of every supported algorithm verifies and names its subject.
#[test]
fn verifies_every_algorithm() {
    let w = world();
    for key in w.keys() {
        let token = key.sign(&claims("user-1"));
        assert_eq!(
            w.v.verify_uncached(token.as_bytes(), NOW),
            Ok(caller("user-1")),
            "{:?}",
            key.alg
        );
    }
}

/// One changed signature byte fails, for every algorithm.
#[test]
fn refuses_a_forged_signature() {
    let w = world();
    for key in w.keys() {
        let token = key.sign(&claims("user-1"));
        let dot = token.rfind('.').unwrap();
        let mut forged = token.into_bytes();
        forged[dot + 1] = if forged[dot + 1] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            w.v.verify(&forged, NOW),
            Err(InvalidToken::Signature),
            "{:?}",
            key.alg
        );
    }
}

/// A token signed by another key under a known kid fails.
#[test]
fn refuses_a_token_of_another_key() {
    let w = world();
    let others = [
        TestKey::rsa(RS256, "rsa-1", 1),
        TestKey::rsa(PS256, "rsa-1", 1),
        TestKey::ec(ES256, "ec-256"),
        TestKey::ec(ES384, "ec-384"),
        TestKey::ed("ed-1"),
        TestKey::hs256(b"another secret of thirty-two bytes!"),
    ];
    for key in &others {
        let token = key.sign(&claims("user-1"));
        assert_eq!(
            w.v.verify(token.as_bytes(), NOW),
            Err(InvalidToken::Signature),
            "{:?}",
            key.alg
        );
    }
}

/// `exp` holds for `leeway_secs` (30) after it passes, not a second more; it is required.
#[test]
fn expiry_allows_the_leeway_only() {
    let w = world();
    let at = |exp: serde_json::Value| {
        let token = w.ed.sign(&json!({ "sub": "u", "exp": exp }));
        w.v.verify_uncached(token.as_bytes(), NOW)
    };
    assert!(at(json!(NOW - 29)).is_ok());
    assert!(at(json!(NOW - 30)).is_ok());
    assert_eq!(at(json!(NOW - 31)), Err(InvalidToken::Expired));
    assert_eq!(at(json!(NOW - 3600)), Err(InvalidToken::Expired));
    assert_eq!(at(json!("soon")), Err(InvalidToken::MissingExp));
    assert_eq!(at(json!(-5)), Err(InvalidToken::MissingExp));
    assert!(at(json!((NOW + 10) as f64 + 0.5)).is_ok());
    let no_exp = w.ed.sign(&json!({ "sub": "u" }));
    assert_eq!(
        w.v.verify(no_exp.as_bytes(), NOW),
        Err(InvalidToken::MissingExp)
    );
}

/// `nbf` in the future fails beyond the leeway.
#[test]
fn not_before_allows_the_leeway_only() {
    let w = world();
    let at = |nbf: serde_json::Value| {
        let token = w
            .ec256
            .sign(&json!({ "sub": "u", "exp": NOW + 600, "nbf": nbf }));
        w.v.verify_uncached(token.as_bytes(), NOW)
    };
    assert!(at(json!(NOW - 10)).is_ok());
    assert!(at(json!(NOW + 30)).is_ok());
    assert_eq!(at(json!(NOW + 31)), Err(InvalidToken::NotYetValid));
    assert_eq!(at(json!("later")), Err(InvalidToken::NotYetValid));
}

fn with(f: impl FnOnce(&mut JwtSettings), keys: &[&TestKey]) -> (JwtVerifier, JwksFile) {
    let file = JwksFile::new(&jwks(keys));
    let mut s = settings(&[ES256], Some(&file));
    f(&mut s);
    (JwtVerifier::new(s).unwrap(), file)
}

/// With `issuer` set, `iss` must be exactly it.
#[test]
fn checks_the_issuer() {
    let key = TestKey::ec(ES256, "k");
    let (v, _f) = with(|s| s.issuer = Some("https://idp.example".into()), &[&key]);
    let token = |iss: serde_json::Value| {
        let mut c = claims("u");
        c["iss"] = iss;
        v.verify(key.sign(&c).as_bytes(), NOW)
    };
    assert!(token(json!("https://idp.example")).is_ok());
    assert_eq!(
        token(json!("https://evil.example")),
        Err(InvalidToken::Issuer)
    );
    assert_eq!(
        token(json!(["https://idp.example"])),
        Err(InvalidToken::Issuer)
    );
    assert_eq!(token(json!(null)), Err(InvalidToken::Issuer));
}

/// With `audience` set, `aud` must be it or hold it; unset, `aud` is not looked at.
#[test]
fn checks_the_audience() {
    let key = TestKey::ec(ES256, "k");
    let (v, _f) = with(|s| s.audience = Some("api".into()), &[&key]);
    let token = |aud: Option<serde_json::Value>| {
        let mut c = claims("u");
        if let Some(a) = aud {
            c["aud"] = a;
        }
        key.sign(&c)
    };
    let check = |aud| v.verify(token(aud).as_bytes(), NOW);
    assert!(check(Some(json!("api"))).is_ok());
    assert!(check(Some(json!(["web", "api"]))).is_ok());
    assert_eq!(check(Some(json!("web"))), Err(InvalidToken::Audience));
    assert_eq!(check(Some(json!(["web"]))), Err(InvalidToken::Audience));
    assert_eq!(check(None), Err(InvalidToken::Audience));
    let (unset, _g) = with(|_| {}, &[&key]);
    let any_aud = token(Some(json!("whatever")));
    assert!(unset.verify(any_aud.as_bytes(), NOW).is_ok());
}

/// `alg: none` (any spelling) fails as an algorithm, signature or not.
#[test]
fn refuses_alg_none() {
    let w = world();
    let payload = json!({ "sub": "u", "exp": NOW + 60 }).to_string();
    for alg in ["none", "None", "NONE", "nOnE"] {
        let header = json!({ "alg": alg, "typ": "JWT" }).to_string();
        let token = unsigned(&header, &payload, "AAAA");
        assert_eq!(
            w.v.verify(token.as_bytes(), NOW),
            Err(InvalidToken::Algorithm)
        );
        let empty_sig = unsigned(&header, &payload, "");
        assert_eq!(
            w.v.verify(empty_sig.as_bytes(), NOW),
            Err(InvalidToken::Malformed)
        );
    }
}

/// HS/RS confusion: an HS256 token keyed with the RSA public key (DER, PEM, or the JWK's
/// modulus) never verifies, whatever its kid; and an RS256 token whose "signature" is an
/// HMAC under the secret never verifies either.
#[test]
fn never_confuses_hmac_and_public_keys() {
    let w = world();
    let (der, pem) = TestKey::rsa_public_bytes(0);
    let n = w.rsa[0].jwk["n"].as_str().unwrap().as_bytes().to_vec();
    for secret in [der.clone(), pem.into_bytes(), n] {
        let forger = TestKey::hs256(&secret);
        for kid in [None, Some("rsa-1")] {
            let mut header = Header::new(HS256);
            header.kid = kid.map(str::to_string);
            let token = forger.sign_with(&header, &claims("admin"));
            assert_eq!(
                w.v.verify(token.as_bytes(), NOW),
                Err(InvalidToken::Signature)
            );
        }
    }
    // With only RS256 allowed, the HS256 token is refused before any key is looked at.
    let (rs_only, _f) = verifier(&[RS256], &[&w.rsa[0]]);
    let forged = TestKey::hs256(&der).sign(&claims("admin"));
    assert_eq!(
        rs_only.verify(forged.as_bytes(), NOW),
        Err(InvalidToken::Algorithm)
    );
    // An RS256 header over an HMAC of the secret.
    let payload = claims("admin").to_string();
    let secret = EncodingKey::from_secret(SECRET);
    let with_kid = hand_signed(r#"{"alg":"RS256","kid":"rsa-1"}"#, &payload, &secret, HS256);
    assert_eq!(
        w.v.verify(with_kid.as_bytes(), NOW),
        Err(InvalidToken::Signature)
    );
    let (one_rsa_key, _g) = verifier(&[RS256, HS256], &[&w.rsa[0]]);
    let no_kid = hand_signed(r#"{"alg":"RS256"}"#, &payload, &secret, HS256);
    assert_eq!(
        one_rsa_key.verify(no_kid.as_bytes(), NOW),
        Err(InvalidToken::Signature)
    );
}

/// An algorithm outside `algorithms` fails even with a key that could verify it, and a
/// key verifies only the algorithms its type and `alg` allow.
#[test]
fn refuses_algorithms_not_allowed_or_not_the_keys() {
    let rs = TestKey::rsa(RS256, "rsa-1", 0);
    let ec = TestKey::ec(ES256, "ec-256");
    let (v, _f) = verifier(&[RS256, ES384], &[&rs, &ec]);
    let ps = TestKey::rsa(PS256, "rsa-1", 0).sign(&claims("u"));
    assert_eq!(v.verify(ps.as_bytes(), NOW), Err(InvalidToken::Algorithm));
    let es = ec.sign(&claims("u"));
    assert_eq!(v.verify(es.as_bytes(), NOW), Err(InvalidToken::Algorithm));
    // ES384 allowed and the P-256 key usable (ES256 allowed): its kid on an ES384 token,
    // and an EdDSA token naming the RSA key.
    let (v, _g) = verifier(&[RS256, ES256, ES384, EdDSA], &[&rs, &ec]);
    let es384 = TestKey::ec(ES384, "ec-256").sign(&claims("u"));
    assert_eq!(
        v.verify(es384.as_bytes(), NOW),
        Err(InvalidToken::Algorithm)
    );
    let ed = TestKey::ed("rsa-1").sign(&claims("u"));
    assert_eq!(v.verify(ed.as_bytes(), NOW), Err(InvalidToken::Algorithm));
    // A JWK whose `alg` is RS256 does not verify PS256 even when PS256 is allowed.
    let mut pinned = TestKey::rsa(RS256, "pinned", 1);
    pinned.jwk["alg"] = json!("RS256");
    let (v, _h) = verifier(&[RS256, PS256], &[&pinned]);
    let ps = TestKey::rsa(PS256, "pinned", 1).sign(&claims("u"));
    assert_eq!(v.verify(ps.as_bytes(), NOW), Err(InvalidToken::Algorithm));
    assert!(v.verify(pinned.sign(&claims("u")).as_bytes(), NOW).is_ok());
}

/// An unknown kid fails, is counted, and asks for a refetch once until the next fetch.
#[test]
fn an_unknown_kid_fails_and_asks_for_a_refetch() {
    let w = world();
    let stranger = TestKey::ed("ed-2").sign(&claims("u"));
    for _ in 0..3 {
        assert_eq!(
            w.v.verify(stranger.as_bytes(), NOW),
            Err(InvalidToken::UnknownKid)
        );
    }
    assert_eq!(w.v.stats().kid_misses, 3);
    assert!(w.v.kid_wanted.load(std::sync::atomic::Ordering::SeqCst));
}

/// Without a kid: the one key of a one-key set is used; with several keys, none is.
#[test]
fn a_token_without_kid_needs_a_single_key_set() {
    let ed = TestKey::ed("ed-1").with_kid(None);
    let (single, _f) = verifier(&[EdDSA], &[&ed]);
    let token = ed.sign(&claims("u"));
    assert!(single.verify(token.as_bytes(), NOW).is_ok());
    let other = TestKey::ed("ed-2");
    let (several, _g) = verifier(&[EdDSA], &[&ed, &other]);
    assert_eq!(
        several.verify(token.as_bytes(), NOW),
        Err(InvalidToken::NoKid)
    );
    // A kid never falls back to the single key.
    let kid = TestKey::ed("ed-1").with_kid(Some("x"));
    let (one, _h) = verifier(&[EdDSA], &[&ed]);
    let named = kid.sign(&claims("u"));
    assert_eq!(
        one.verify(named.as_bytes(), NOW),
        Err(InvalidToken::UnknownKid)
    );
}

/// Over 8 KiB is refused unread (a validly signed one too); at the bound it is parsed.
#[test]
fn refuses_oversized_tokens_unread() {
    let w = world();
    let mut big = claims("u");
    big["pad"] = json!("x".repeat(MAX_TOKEN_LEN));
    let token = w.ed.sign(&big);
    assert!(token.len() > MAX_TOKEN_LEN);
    assert_eq!(
        w.v.verify(token.as_bytes(), NOW),
        Err(InvalidToken::TooLong)
    );
    let junk = vec![b'.'; MAX_TOKEN_LEN + 1];
    assert_eq!(w.v.verify(&junk, NOW), Err(InvalidToken::TooLong));
    let at_bound = vec![b'a'; MAX_TOKEN_LEN];
    assert_eq!(w.v.verify(&at_bound, NOW), Err(InvalidToken::Malformed));
}

/// Anything but three base64url parts of JSON fails as malformed.
#[test]
fn refuses_malformed_tokens() {
    let w = world();
    let good = w.ed.sign(&claims("u"));
    let (h, rest) = good.split_once('.').unwrap();
    let (p, s) = rest.split_once('.').unwrap();
    let cases = [
        String::new(),
        "abc".into(),
        "a.b".into(),
        format!("{h}.{p}.{s}.{s}"),
        format!("{h}..{s}"),
        format!(".{p}.{s}"),
        format!("{h}.{p}.{s}="),
        format!("{h}.{p}+.{s}"),
        format!("{h} .{p}.{s}"),
        unsigned("not json", "{}", "AAAA"),
        unsigned("[1,2]", "{}", "AAAA"),
        unsigned(r#"{"typ":"JWT"}"#, "{}", "AAAA"),
        format!("{h}.{p}.A"),
    ];
    for case in &cases {
        assert_eq!(
            w.v.verify(case.as_bytes(), NOW),
            Err(InvalidToken::Malformed),
            "{case:?}"
        );
    }
    // Correctly signed, but the payload is not JSON.
    let hs = EncodingKey::from_secret(SECRET);
    let not_json = hand_signed(r#"{"alg":"HS256"}"#, "exp=1", &hs, HS256);
    assert_eq!(
        w.v.verify(not_json.as_bytes(), NOW),
        Err(InvalidToken::Malformed)
    );
    assert_eq!(
        w.v.verify(&[0xff, b'.', b'a', b'.', b'b'], NOW),
        Err(InvalidToken::Malformed)
    );
}

/// A header with `crit` is refused: no extension is understood.
#[test]
fn refuses_critical_extensions() {
    let w = world();
    let hs = EncodingKey::from_secret(SECRET);
    let payload = claims("u").to_string();
    let token = hand_signed(
        r#"{"alg":"HS256","crit":["b64"],"b64":false}"#,
        &payload,
        &hs,
        HS256,
    );
    assert_eq!(
        w.v.verify(token.as_bytes(), NOW),
        Err(InvalidToken::Critical)
    );
    let plain = hand_signed(r#"{"alg":"HS256"}"#, &payload, &hs, HS256);
    assert!(w.v.verify(plain.as_bytes(), NOW).is_ok());
}

/// The key claim is required; strings and numbers are identities, up to 256 bytes.
#[test]
fn reads_identity_claims() {
    let key = TestKey::ec(ES256, "k");
    let (v, _f) = with(
        |s| {
            s.key_claim = "uid".into();
            s.tenant_claim = Some("org".into());
            s.tier_claim = Some("plan".into());
        },
        &[&key],
    );
    let check = |extra: serde_json::Value| {
        let mut c = json!({ "exp": NOW + 60, "sub": "ignored" });
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v.verify(key.sign(&c).as_bytes(), NOW)
    };
    let full = check(json!({ "uid": "u-1", "org": "acme", "plan": "pro" })).unwrap();
    assert_eq!(full.key_id, "u-1");
    assert_eq!(full.tenant.as_deref(), Some("acme"));
    assert_eq!(full.tier.as_deref(), Some("pro"));
    assert_eq!(full.expires_at, NOW + 60);
    let bare = check(json!({ "uid": 42 })).unwrap();
    assert_eq!(
        (bare.key_id.as_str(), bare.tenant, bare.tier),
        ("42", None, None)
    );
    assert_eq!(check(json!({})), Err(InvalidToken::Claim));
    assert_eq!(check(json!({ "uid": "" })), Err(InvalidToken::Claim));
    assert_eq!(check(json!({ "uid": true })), Err(InvalidToken::Claim));
    assert_eq!(check(json!({ "uid": ["a"] })), Err(InvalidToken::Claim));
    assert!(check(json!({ "uid": "x".repeat(256) })).is_ok());
    assert_eq!(
        check(json!({ "uid": "x".repeat(257) })),
        Err(InvalidToken::Claim)
    );
    let long_org = json!({ "uid": "u", "org": "o".repeat(257) });
    assert_eq!(check(long_org), Err(InvalidToken::Claim));
    assert_eq!(
        check(json!({ "uid": "u", "plan": {} })),
        Err(InvalidToken::Claim)
    );
}

/// `looks_like_jwt` is DESIGN's "a value with two dots".
#[test]
fn tells_jwts_from_api_keys() {
    use crate::auth::looks_like_jwt;
    assert!(looks_like_jwt(b"a.b.c"));
    assert!(looks_like_jwt(b".."));
    assert!(!looks_like_jwt(b"demo-key-123"));
    assert!(!looks_like_jwt(b"a.b"));
    assert!(!looks_like_jwt(b"a.b.c.d"));
}
