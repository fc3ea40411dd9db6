//! Keys made in the test (nothing private is committed), JWKS documents built from their
//! public halves, signed tokens, and a JWKS server on loopback.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rsa::pkcs1::{EncodeRsaPrivateKey, EncodeRsaPublicKey};
use rsa::traits::PublicKeyParts;
use rsa::RsaPrivateKey;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::auth::{JwtSettings, JwtVerifier};

/// The tests' "now" (Unix seconds).
pub(super) const NOW: u64 = 1_764_000_000;

/// A 32-byte HS256 secret.
pub(super) const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

/// A signing key and its public JWK.
pub(super) struct TestKey {
    pub(super) alg: Algorithm,
    pub(super) kid: Option<String>,
    pub(super) encoding: EncodingKey,
    pub(super) jwk: Value,
}

/// Two RSA-2048 keys, made once per test binary (RSA key generation is slow; ring cannot
/// do it, so RustCrypto's `rsa` does, in tests only).
fn rsa_keys() -> &'static [RsaPrivateKey; 2] {
    static KEYS: OnceLock<[RsaPrivateKey; 2]> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut rng = rsa::rand_core::OsRng;
        let mut make = || RsaPrivateKey::new(&mut rng, 2048).unwrap();
        [make(), make()]
    })
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

// === impl TestKey ===

impl TestKey {
    /// RSA key `which` (0 or 1) for `alg` (RS* or PS*); its JWK names no `alg`.
    pub(super) fn rsa(alg: Algorithm, kid: &str, which: usize) -> Self {
        let key = &rsa_keys()[which];
        let der = key.to_pkcs1_der().unwrap();
        let jwk = json!({
            "kty": "RSA", "use": "sig", "kid": kid,
            "n": b64(&key.n().to_bytes_be()), "e": b64(&key.e().to_bytes_be()),
        });
        Self::new(alg, kid, EncodingKey::from_rsa_der(der.as_bytes()), jwk)
    }

    /// The public key of RSA key `which` as PKCS#1 DER and PEM (what a confused verifier
    /// might take for an HMAC secret).
    pub(super) fn rsa_public_bytes(which: usize) -> (Vec<u8>, String) {
        let public = rsa_keys()[which].to_public_key();
        let der = public.to_pkcs1_der().unwrap().as_bytes().to_vec();
        let pem = public.to_pkcs1_pem(rsa::pkcs1::LineEnding::LF).unwrap();
        (der, pem)
    }

    /// A fresh EC key: ES256 on P-256 or ES384 on P-384.
    pub(super) fn ec(alg: Algorithm, kid: &str) -> Self {
        let (sig, crv) = match alg {
            Algorithm::ES256 => (&rcgen::PKCS_ECDSA_P256_SHA256, "P-256"),
            Algorithm::ES384 => (&rcgen::PKCS_ECDSA_P384_SHA384, "P-384"),
            other => panic!("not an EC algorithm: {other:?}"),
        };
        let pair = rcgen::KeyPair::generate_for(sig).unwrap();
        let point = pair.public_key_raw(); // 0x04 || x || y
        let half = (point.len() - 1) / 2;
        let jwk = json!({
            "kty": "EC", "crv": crv, "kid": kid, "alg": format!("{alg:?}"),
            "x": b64(&point[1..1 + half]), "y": b64(&point[1 + half..]),
        });
        Self::new(
            alg,
            kid,
            EncodingKey::from_ec_der(&pair.serialize_der()),
            jwk,
        )
    }

    /// A fresh Ed25519 key.
    pub(super) fn ed(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let jwk = json!({
            "kty": "OKP", "crv": "Ed25519", "kid": kid, "x": b64(pair.public_key_raw()),
        });
        let encoding = EncodingKey::from_ed_der(&pair.serialize_der());
        Self::new(Algorithm::EdDSA, kid, encoding, jwk)
    }

    /// The HS256 secret as a signing key (it has no JWK: the secret is configured).
    pub(super) fn hs256(secret: &[u8]) -> Self {
        let encoding = EncodingKey::from_secret(secret);
        Self {
            alg: Algorithm::HS256,
            kid: None,
            encoding,
            jwk: Value::Null,
        }
    }

    fn new(alg: Algorithm, kid: &str, encoding: EncodingKey, jwk: Value) -> Self {
        Self {
            alg,
            kid: Some(kid.to_string()),
            encoding,
            jwk,
        }
    }

    /// The same key under another `kid`, or none.
    pub(super) fn with_kid(mut self, kid: Option<&str>) -> Self {
        self.kid = kid.map(str::to_string);
        match kid {
            Some(k) => self.jwk["kid"] = json!(k),
            None => {
                if let Some(o) = self.jwk.as_object_mut() {
                    o.remove("kid");
                }
            }
        }
        self
    }

    /// A token of `claims` signed with this key, its `alg` and `kid` in the header.
    pub(super) fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = self.kid.clone();
        self.sign_with(&header, claims)
    }

    /// A token of `claims` under `header`, signed with this key.
    pub(super) fn sign_with(&self, header: &Header, claims: &Value) -> String {
        jsonwebtoken::encode(header, claims, &self.encoding).unwrap()
    }
}

/// A JWKS document of the keys' public JWKs.
pub(super) fn jwks(keys: &[&TestKey]) -> Vec<u8> {
    let keys: Vec<&Value> = keys.iter().map(|k| &k.jwk).collect();
    serde_json::to_vec(&json!({ "keys": keys })).unwrap()
}

/// Claims for `sub`, valid from an hour before `NOW` to an hour after.
pub(super) fn claims(sub: &str) -> Value {
    json!({ "sub": sub, "iat": NOW - 3600, "exp": NOW + 3600 })
}

/// `header.payload.signature` of raw JSON header and payload, signed with `key` as `alg`
/// (for tokens `jsonwebtoken::encode` would not make).
pub(super) fn hand_signed(
    header: &str,
    payload: &str,
    key: &EncodingKey,
    alg: Algorithm,
) -> String {
    let message = format!("{}.{}", b64(header.as_bytes()), b64(payload.as_bytes()));
    let sig = jsonwebtoken::crypto::sign(message.as_bytes(), key, alg).unwrap();
    format!("{message}.{sig}")
}

/// `header.payload.signature` with the given raw parts (no signing at all).
pub(super) fn unsigned(header: &str, payload: &str, signature: &str) -> String {
    format!(
        "{}.{}.{signature}",
        b64(header.as_bytes()),
        b64(payload.as_bytes())
    )
}

/// A JWKS file in a temporary directory (kept while the value lives).
pub(super) struct JwksFile {
    _dir: tempfile::TempDir,
    pub(super) path: PathBuf,
}

impl JwksFile {
    pub(super) fn new(body: &[u8]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, body).unwrap();
        Self { _dir: dir, path }
    }

    pub(super) fn write(&self, body: &[u8]) {
        std::fs::write(&self.path, body).unwrap();
    }
}

/// Settings allowing `algorithms`, keys from `file` (and the secret when HS256 is allowed).
pub(super) fn settings(algorithms: &[Algorithm], file: Option<&JwksFile>) -> JwtSettings {
    JwtSettings {
        algorithms: algorithms.to_vec(),
        jwks_file: file.map(|f| f.path.clone()),
        hs256_secret: algorithms
            .contains(&Algorithm::HS256)
            .then(|| SECRET.to_vec()),
        ..JwtSettings::default()
    }
}

/// A verifier over a JWKS file of `keys`, allowing `algorithms`.
pub(super) fn verifier(algorithms: &[Algorithm], keys: &[&TestKey]) -> (JwtVerifier, JwksFile) {
    let file = JwksFile::new(&jwks(keys));
    let v = JwtVerifier::new(settings(algorithms, Some(&file))).unwrap();
    (v, file)
}

/// What the JWKS server answers.
#[derive(Debug, Clone)]
pub(super) enum Serve {
    /// 200 with this body.
    Body(Vec<u8>),
    /// This status, empty body.
    Status(u16),
    /// No answer for a minute.
    Hang,
}

/// A JWKS server on 127.0.0.1:0 whose answer the test changes.
pub(super) struct JwksServer {
    pub(super) url: String,
    serve: Arc<Mutex<Serve>>,
    hits: Arc<AtomicUsize>,
}

impl JwksServer {
    pub(super) async fn start(first: Serve) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
        let serve = Arc::new(Mutex::new(first));
        let hits = Arc::new(AtomicUsize::new(0));
        let (s, h) = (serve.clone(), hits.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (s, h) = (s.clone(), h.clone());
                let service = service_fn(move |_req: Request<hyper::body::Incoming>| {
                    h.fetch_add(1, Ordering::SeqCst);
                    answer(s.lock().unwrap().clone())
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        Self { url, serve, hits }
    }

    pub(super) fn set(&self, serve: Serve) {
        *self.serve.lock().unwrap() = serve;
    }

    pub(super) fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn answer(serve: Serve) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    match serve {
        Serve::Body(b) => *resp.body_mut() = Full::new(Bytes::from(b)),
        Serve::Status(code) => *resp.status_mut() = http::StatusCode::from_u16(code).unwrap(),
        Serve::Hang => tokio::time::sleep(Duration::from_secs(60)).await,
    }
    Ok(resp)
}

/// Waits until `cond` holds, polling every 10 ms for at most `patience`.
pub(super) async fn eventually(what: &str, patience: Duration, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + patience;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
