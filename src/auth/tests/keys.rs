//! Settings that cannot work, JWKS files and which of their keys are used, and merging.

use jsonwebtoken::Algorithm;
use serde_json::json;

use super::support::{claims, jwks, settings, verifier, JwksFile, TestKey, NOW, SECRET};
use crate::auth::{InvalidToken, JwtConfigError, JwtSettings, JwtVerifier};

use Algorithm::{EdDSA, ES256, HS256, PS384, RS256};

fn refused(s: JwtSettings) -> JwtConfigError {
    JwtVerifier::new(s).unwrap_err()
}

/// Each rule of `JwtSettings::check`.
#[test]
fn refuses_settings_that_cannot_work() {
    let file = JwksFile::new(&jwks(&[&TestKey::ed("k")]));
    let base = || settings(&[EdDSA], Some(&file));
    let cases: Vec<(JwtSettings, &str)> = vec![
        (JwtSettings::default(), "at least one algorithm"),
        (
            JwtSettings {
                algorithms: vec![PS384],
                ..base()
            },
            "PS384 is not supported",
        ),
        (
            JwtSettings {
                hs256_secret: None,
                ..settings(&[HS256], None)
            },
            "gives no secret",
        ),
        (
            JwtSettings {
                hs256_secret: Some(b"short".to_vec()),
                ..settings(&[HS256], None)
            },
            "5 bytes",
        ),
        (
            JwtSettings {
                hs256_secret: Some(SECRET.to_vec()),
                ..base()
            },
            "HS256 is not in algorithms",
        ),
        (settings(&[EdDSA], None), "need jwks_file or jwks_url"),
        (
            JwtSettings {
                jwks_url: Some("ftp://idp/jwks".into()),
                ..base()
            },
            "scheme",
        ),
        (
            JwtSettings {
                jwks_url: Some("not a url".into()),
                ..base()
            },
            "jwks_url",
        ),
        (
            JwtSettings {
                jwks_refresh: std::time::Duration::ZERO,
                ..base()
            },
            "at least 1",
        ),
        (
            JwtSettings {
                key_claim: String::new(),
                ..base()
            },
            "must not be empty",
        ),
        (
            JwtSettings {
                tier_claim: Some(String::new()),
                ..base()
            },
            "must not be empty",
        ),
    ];
    for (s, want) in cases {
        let got = refused(s).to_string();
        assert!(got.contains(want), "{got:?} lacks {want:?}");
    }
    assert!(JwtVerifier::new(base()).is_ok());
}

/// HS256 alone needs only the secret; `jwks_file` with it alone is refused (dead keys).
#[test]
fn hs256_alone_needs_no_jwks() {
    let s = settings(&[HS256], None);
    let s = JwtSettings {
        hs256_secret: Some(SECRET.to_vec()),
        ..s
    };
    let v = JwtVerifier::new(s.clone()).unwrap();
    let token = TestKey::hs256(SECRET).sign(&claims("u"));
    assert!(v.verify(token.as_bytes(), NOW).is_ok());
    let file = JwksFile::new(&jwks(&[&TestKey::ed("k")]));
    let with_file = JwtSettings {
        jwks_file: Some(file.path.clone()),
        ..s
    };
    let got = refused(with_file).to_string();
    assert!(got.contains("no public-key algorithm"), "{got}");
}

/// The secret never shows in `Debug`.
#[test]
fn debug_hides_the_secret() {
    let s = JwtSettings {
        hs256_secret: Some(SECRET.to_vec()),
        ..settings(&[HS256], None)
    };
    let shown = format!("{s:?}");
    assert!(
        shown.contains("<redacted>") && !shown.contains("0123456789"),
        "{shown}"
    );
}

/// A missing, unreadable or useless `jwks_file` is a config error naming the file.
#[test]
fn file_errors_name_the_file() {
    let file = JwksFile::new(b"{}");
    let missing = file.path.with_file_name("nope.json");
    let s = JwtSettings {
        jwks_file: Some(missing.clone()),
        ..settings(&[EdDSA], None)
    };
    let got = refused(s).to_string();
    assert!(got.contains("nope.json"), "{got}");
    for (body, why) in [
        (&b"not json"[..], "not a JWKS"),
        (b"{}", "not a JWKS"),
        (br#"{"keys": []}"#, "none of its 0 keys"),
        (
            br#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#,
            "none of its 1 keys",
        ),
    ] {
        file.write(body);
        let got = refused(settings(&[EdDSA], Some(&file))).to_string();
        assert!(got.contains("jwks.json") && got.contains(why), "{got}");
    }
    // An EC key is of no use when only RS256 is allowed.
    file.write(&jwks(&[&TestKey::ec(ES256, "k")]));
    let got = refused(settings(&[RS256], Some(&file))).to_string();
    assert!(got.contains("none of its 1 keys"), "{got}");
}

/// Keys not meant for signatures, of unknown types or curves, or symmetric, are skipped
/// without failing the set; the usable ones still verify.
#[test]
fn skips_unusable_keys() {
    let good = TestKey::ed("good");
    let mut enc = TestKey::ed("enc");
    enc.jwk["use"] = json!("enc");
    let mut ops = TestKey::ed("ops");
    ops.jwk["key_ops"] = json!(["sign"]);
    let mut oaep = TestKey::rsa(RS256, "oaep", 0);
    oaep.jwk["alg"] = json!("RSA-OAEP");
    let body = json!({ "keys": [
        good.jwk, enc.jwk, ops.jwk, oaep.jwk,
        { "kty": "oct", "kid": "hmac", "k": "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0" },
        { "kty": "OKP", "crv": "X25519", "kid": "x", "x": "AAAA" },
        { "kty": "EC", "crv": "P-521", "kid": "p521", "x": "AAAA", "y": "AAAA" },
        { "kty": "weird" },
        "not even an object",
    ]});
    let file = JwksFile::new(&serde_json::to_vec(&body).unwrap());
    let v = JwtVerifier::new(settings(&[EdDSA, RS256], Some(&file))).unwrap();
    assert_eq!(v.stats().keys, 1);
    assert!(v.verify(good.sign(&claims("u")).as_bytes(), NOW).is_ok());
    for key in [&enc, &ops, &oaep] {
        let token = key.sign(&claims("u"));
        assert_eq!(
            v.verify(token.as_bytes(), NOW),
            Err(InvalidToken::UnknownKid)
        );
    }
}

/// `reload` re-reads the file; a bad file leaves the verifier as it was.
#[test]
fn reload_rereads_the_file_and_keeps_the_old_set_on_error() {
    let (a, b) = (TestKey::ed("a"), TestKey::ed("b"));
    let (v, file) = verifier(&[EdDSA], &[&a]);
    let s = v.settings();
    file.write(&jwks(&[&b]));
    v.reload(s.clone()).unwrap();
    assert!(v.verify(b.sign(&claims("u")).as_bytes(), NOW).is_ok());
    assert_eq!(
        v.verify(a.sign(&claims("u")).as_bytes(), NOW),
        Err(InvalidToken::UnknownKid)
    );
    file.write(b"garbage");
    assert!(v.reload(s).is_err());
    assert!(v.verify(b.sign(&claims("u")).as_bytes(), NOW).is_ok());
}

/// Settings change on reload: the new ones apply (here, a required issuer).
#[test]
fn reload_applies_new_settings() {
    let key = TestKey::ed("k");
    let (v, _f) = verifier(&[EdDSA], &[&key]);
    let token = key.sign(&claims("u"));
    assert!(v.verify(token.as_bytes(), NOW).is_ok());
    let strict = JwtSettings {
        issuer: Some("https://idp".into()),
        ..v.settings()
    };
    v.reload(strict).unwrap();
    assert_eq!(v.verify(token.as_bytes(), NOW), Err(InvalidToken::Issuer));
}
