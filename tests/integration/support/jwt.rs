//! JWT material made in the test (nothing private is committed): RSA keys, their JWKs,
//! signed tokens, and a JWKS server on loopback whose key set a test can change.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rsa::pkcs1::{EncodeRsaPrivateKey, EncodeRsaPublicKey};
use rsa::traits::PublicKeyParts;
use rsa::RsaPrivateKey;
use serde_json::{json, Value};

/// Three RSA-2048 keys, made once per test process (RSA key generation is slow).
fn rsa_keys() -> &'static [RsaPrivateKey; 3] {
    static KEYS: OnceLock<[RsaPrivateKey; 3]> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut rng = rsa::rand_core::OsRng;
        let mut make = || RsaPrivateKey::new(&mut rng, 2048).unwrap();
        [make(), make(), make()]
    })
}

pub fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The current Unix time in seconds (what the gateway's clock reads too).
pub fn now_secs() -> u64 {
    use throttle::clock::Clock;
    throttle::clock::SystemClock.now_ms() / 1000
}

/// An RS256 signing key and its public JWK.
pub struct RsaKey {
    pub kid: String,
    which: usize,
    encoding: EncodingKey,
}

impl RsaKey {
    /// RSA key `which` (0, 1 or 2) under `kid`.
    pub fn new(which: usize, kid: &str) -> Self {
        let der = rsa_keys()[which].to_pkcs1_der().unwrap();
        Self {
            kid: kid.to_string(),
            which,
            encoding: EncodingKey::from_rsa_der(der.as_bytes()),
        }
    }

    /// The public JWK (`use: sig`, no `alg`).
    pub fn jwk(&self) -> Value {
        let key = &rsa_keys()[self.which];
        json!({
            "kty": "RSA", "use": "sig", "kid": self.kid,
            "n": b64(&key.n().to_bytes_be()), "e": b64(&key.e().to_bytes_be()),
        })
    }

    /// The public key as PKCS#1 DER and PEM: what a confused verifier would take for an
    /// HMAC secret.
    pub fn public_bytes(&self) -> (Vec<u8>, String) {
        let public = rsa_keys()[self.which].to_public_key();
        let der = public.to_pkcs1_der().unwrap().as_bytes().to_vec();
        let pem = public.to_pkcs1_pem(rsa::pkcs1::LineEnding::LF).unwrap();
        (der, pem)
    }

    /// An RS256 token of `claims` with this key's `kid`.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }

    /// An RS256 token of `claims` signed with this key but naming `kid`.
    pub fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.to_string());
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

/// A JWKS document of `keys`.
pub fn jwks(keys: &[&RsaKey]) -> Vec<u8> {
    let keys: Vec<Value> = keys.iter().map(|k| k.jwk()).collect();
    serde_json::to_vec(&json!({ "keys": keys })).unwrap()
}

/// An HS256 token of `claims` signed with `secret`, naming `kid`.
pub fn hs256(secret: &[u8], kid: &str, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.to_string());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret)).unwrap()
}

/// `header.payload.` with raw JSON parts and an empty signature (`alg: none`).
pub fn unsigned(header: &str, payload: &str) -> String {
    format!("{}.{}.", b64(header.as_bytes()), b64(payload.as_bytes()))
}

/// A JWKS over HTTP on loopback (`GET /jwks.json`), its body settable, its fetches
/// counted; stopped on drop.
pub struct JwksServer {
    pub addr: SocketAddr,
    body: Arc<Mutex<Vec<u8>>>,
    hits: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl JwksServer {
    pub async fn start(body: Vec<u8>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let body = Arc::new(Mutex::new(body));
        let hits = Arc::new(AtomicUsize::new(0));
        let (shared, counted) = (body.clone(), hits.clone());
        let app = axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || {
                let (shared, counted) = (shared.clone(), counted.clone());
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let body = shared.lock().unwrap().clone();
                    ([("content-type", "application/json")], body)
                }
            }),
        );
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Self {
            addr,
            body,
            hits,
            stop: Some(tx),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/jwks.json", self.addr)
    }

    /// Publishes a new key set.
    pub fn publish(&self, body: Vec<u8>) {
        *self.body.lock().unwrap() = body;
    }

    /// Fetches served so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}
