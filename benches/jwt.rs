//! JWT verification cost: a full verification per algorithm (RS256, PS256 on RSA-2048,
//! ES256, ES384, EdDSA, HS256), a verified-token cache hit, and the cheap refusals
//! (oversized, unknown kid) that an attacker can send for free. Keys are made here.
//!
//! Run: `cargo bench --bench jwt` (add `-- --quick` for a fast pass).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::hint::black_box;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use criterion::{BenchmarkId, Criterion, Throughput};
use jsonwebtoken::{EncodingKey, Header};
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::traits::PublicKeyParts;
use serde_json::{json, Value};
use throttle::auth::{Algorithm, JwtSettings, JwtVerifier};

const NOW: u64 = 1_764_000_000;
const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

struct Key {
    alg: Algorithm,
    kid: &'static str,
    encoding: EncodingKey,
    jwk: Value,
}

fn b64(b: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(b)
}

fn keys() -> Vec<Key> {
    let rsa = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
    let rsa_jwk = json!({
        "kty": "RSA", "kid": "rsa", "n": b64(&rsa.n().to_bytes_be()), "e": b64(&rsa.e().to_bytes_be()),
    });
    let rsa_der = rsa.to_pkcs1_der().unwrap();
    let mut out = vec![
        Key {
            alg: Algorithm::RS256,
            kid: "rsa",
            encoding: EncodingKey::from_rsa_der(rsa_der.as_bytes()),
            jwk: rsa_jwk,
        },
        Key {
            alg: Algorithm::PS256,
            kid: "rsa",
            encoding: EncodingKey::from_rsa_der(rsa_der.as_bytes()),
            jwk: Value::Null,
        },
    ];
    for (alg, sig, crv, kid) in [
        (
            Algorithm::ES256,
            &rcgen::PKCS_ECDSA_P256_SHA256,
            "P-256",
            "p256",
        ),
        (
            Algorithm::ES384,
            &rcgen::PKCS_ECDSA_P384_SHA384,
            "P-384",
            "p384",
        ),
    ] {
        let pair = rcgen::KeyPair::generate_for(sig).unwrap();
        let point = pair.public_key_raw();
        let half = (point.len() - 1) / 2;
        let jwk = json!({
            "kty": "EC", "crv": crv, "kid": kid,
            "x": b64(&point[1..1 + half]), "y": b64(&point[1 + half..]),
        });
        let encoding = EncodingKey::from_ec_der(&pair.serialize_der());
        out.push(Key {
            alg,
            kid,
            encoding,
            jwk,
        });
    }
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    out.push(Key {
        alg: Algorithm::EdDSA,
        kid: "ed",
        encoding: EncodingKey::from_ed_der(&ed.serialize_der()),
        jwk: json!({ "kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": b64(ed.public_key_raw()) }),
    });
    out.push(Key {
        alg: Algorithm::HS256,
        kid: "hs",
        encoding: EncodingKey::from_secret(SECRET),
        jwk: Value::Null,
    });
    out
}

fn sign(key: &Key, sub: &str) -> String {
    let mut header = Header::new(key.alg);
    header.kid = Some(key.kid.to_string());
    let claims = json!({ "sub": sub, "tenant": "acme", "exp": NOW + 3600, "iat": NOW });
    jsonwebtoken::encode(&header, &claims, &key.encoding).unwrap()
}

fn verifier(keys: &[Key]) -> (JwtVerifier, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    let jwks: Vec<&Value> = keys
        .iter()
        .map(|k| &k.jwk)
        .filter(|j| !j.is_null())
        .collect();
    std::fs::write(&path, serde_json::to_vec(&json!({ "keys": jwks })).unwrap()).unwrap();
    let settings = JwtSettings {
        algorithms: keys.iter().map(|k| k.alg).collect(),
        jwks_file: Some(path),
        hs256_secret: Some(SECRET.to_vec()),
        tenant_claim: Some("tenant".into()),
        ..JwtSettings::default()
    };
    (JwtVerifier::new(settings).unwrap(), dir)
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let keys = keys();
    let (v, _dir) = verifier(&keys);

    let mut g = c.benchmark_group("jwt_verify_uncached");
    g.throughput(Throughput::Elements(1));
    for key in &keys {
        let token = sign(key, "user-1");
        assert!(v.verify_uncached(token.as_bytes(), NOW).is_ok());
        g.bench_function(BenchmarkId::from_parameter(format!("{:?}", key.alg)), |b| {
            b.iter(|| v.verify_uncached(black_box(token.as_bytes()), NOW))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("jwt_verify_cached");
    g.throughput(Throughput::Elements(1));
    let token = sign(&keys[0], "user-1");
    assert!(v.verify(token.as_bytes(), NOW).is_ok());
    g.bench_function("hit", |b| {
        b.iter(|| v.verify(black_box(token.as_bytes()), NOW))
    });
    g.finish();

    let mut g = c.benchmark_group("jwt_refuse");
    g.throughput(Throughput::Elements(1));
    let oversized = vec![b'a'; 9000];
    g.bench_function("oversized", |b| {
        b.iter(|| v.verify(black_box(&oversized), NOW))
    });
    let mut stranger = Header::new(Algorithm::EdDSA);
    stranger.kid = Some("nobody".into());
    let unknown = jsonwebtoken::encode(
        &stranger,
        &json!({"sub": "x", "exp": NOW + 60}),
        &keys[4].encoding,
    )
    .unwrap();
    assert!(v.verify(unknown.as_bytes(), NOW).is_err());
    g.bench_function("unknown_kid", |b| {
        b.iter(|| v.verify(black_box(unknown.as_bytes()), NOW))
    });
    g.finish();
    c.final_summary();
}
