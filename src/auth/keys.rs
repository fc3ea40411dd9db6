//! Key sets: JWKS documents parsed key by key, filtered down to the keys the settings can
//! use, merged (file first, then URL, by `kid`), and the one rule that picks a token's key.
//!
//! A key's usable algorithms are the intersection of what its type allows (RSA: RS*/PS256;
//! EC P-256: ES256; EC P-384: ES384; OKP Ed25519: EdDSA), its own `alg` if it names one,
//! and `algorithms`. HS256 never comes from a JWKS (a public document is no place for a
//! shared secret); its one key is `hs256_secret`.

use std::collections::{HashMap, HashSet};

use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, KeyOperations, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

use super::error::InvalidToken;
use super::settings::JwtSettings;

/// A set of algorithms, one bit each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct AlgSet(u16);

/// A key that can verify some allowed algorithms.
#[derive(Clone)]
pub(super) struct Key {
    kid: Option<String>,
    algs: AlgSet,
    decoding: DecodingKey,
}

/// The keys a verifier uses: the merged JWKS keys and the HS256 secret.
#[derive(Clone, Default)]
pub(super) struct KeySet {
    keys: Vec<Key>,
    by_kid: HashMap<String, Vec<usize>>,
    hs256: Option<DecodingKey>,
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

// === impl AlgSet ===

impl AlgSet {
    const RSA: AlgSet = AlgSet::of(&[
        Algorithm::RS256,
        Algorithm::RS384,
        Algorithm::RS512,
        Algorithm::PS256,
    ]);

    const fn bit(alg: Algorithm) -> u16 {
        1 << (alg as u16)
    }

    pub(super) const fn of(algs: &[Algorithm]) -> Self {
        let mut bits = 0;
        let mut i = 0;
        while i < algs.len() {
            bits |= Self::bit(algs[i]);
            i += 1;
        }
        Self(bits)
    }

    pub(super) fn contains(self, alg: Algorithm) -> bool {
        self.0 & Self::bit(alg) != 0
    }

    fn and(self, other: AlgSet) -> AlgSet {
        AlgSet(self.0 & other.0)
    }

    fn is_empty(self) -> bool {
        self.0 == 0
    }
}

// === impl KeySet ===

impl KeySet {
    /// The keys of `file` then `url` usable under `settings` (a URL key whose `kid` the
    /// file also has is left out), and the HS256 secret.
    pub(super) fn build(settings: &JwtSettings, file: &[Jwk], url: &[Jwk]) -> Self {
        let allowed = AlgSet::of(&settings.algorithms);
        let mut set = KeySet {
            hs256: settings
                .hs256_secret
                .as_deref()
                .map(DecodingKey::from_secret),
            ..KeySet::default()
        };
        let file_kids: HashSet<&str> = file.iter().filter_map(kid_of).collect();
        let from_url = url
            .iter()
            .filter(|k| kid_of(k).is_none_or(|kid| !file_kids.contains(kid)));
        for jwk in file.iter().chain(from_url) {
            if let Some(key) = usable(jwk, allowed) {
                if let Some(kid) = &key.kid {
                    set.by_kid
                        .entry(kid.clone())
                        .or_default()
                        .push(set.keys.len());
                }
                set.keys.push(key);
            }
        }
        set
    }

    /// Number of JWKS keys (the HS256 secret aside).
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The key for a token of `alg` with `kid`: HS256 uses the secret whatever the `kid`;
    /// otherwise the first key of that `kid` that can verify `alg`, or without a `kid` the
    /// set's only key.
    ///
    /// # Errors
    /// `UnknownKid` (no key has that `kid`), `NoKid` (no `kid`, not exactly one key),
    /// `Algorithm` (the chosen key cannot verify `alg`).
    pub(super) fn select(
        &self,
        alg: Algorithm,
        kid: Option<&str>,
    ) -> Result<&DecodingKey, InvalidToken> {
        if alg == Algorithm::HS256 {
            return self.hs256.as_ref().ok_or(InvalidToken::Algorithm);
        }
        let key = match kid {
            Some(kid) => {
                let found = self.by_kid.get(kid).ok_or(InvalidToken::UnknownKid)?;
                let mut keys = found.iter().filter_map(|i| self.keys.get(*i));
                keys.find(|k| k.algs.contains(alg))
                    .ok_or(InvalidToken::Algorithm)?
            }
            None => match self.keys.as_slice() {
                [only] if only.algs.contains(alg) => only,
                [_] => return Err(InvalidToken::Algorithm),
                _ => return Err(InvalidToken::NoKid),
            },
        };
        Ok(&key.decoding)
    }
}

fn kid_of(jwk: &Jwk) -> Option<&str> {
    jwk.common.key_id.as_deref()
}

/// The JWKs of a JWKS document, each parsed on its own: a key of a type jsonwebtoken
/// cannot represent (X25519, say) is skipped rather than failing the whole set.
///
/// # Errors
/// The document is not JSON of the form `{"keys": [...]}`.
pub(super) fn parse_jwks(body: &[u8]) -> Result<Vec<Jwk>, String> {
    let raw: RawSet = serde_json::from_slice(body).map_err(|e| format!("not a JWKS: {e}"))?;
    let keys = raw.keys.into_iter();
    Ok(keys
        .filter_map(|k| serde_json::from_value(k).ok())
        .collect())
}

/// How many of `jwks` `settings` can use.
pub(super) fn usable_count(settings: &JwtSettings, jwks: &[Jwk]) -> usize {
    let allowed = AlgSet::of(&settings.algorithms);
    jwks.iter().filter(|k| usable(k, allowed).is_some()).count()
}

/// `jwk` as a key for the allowed algorithms it can verify, if any.
fn usable(jwk: &Jwk, allowed: AlgSet) -> Option<Key> {
    let common = &jwk.common;
    if common
        .public_key_use
        .as_ref()
        .is_some_and(|u| *u != PublicKeyUse::Signature)
    {
        return None;
    }
    if common
        .key_operations
        .as_ref()
        .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
    {
        return None;
    }
    let mut algs = by_type(&jwk.algorithm).and(allowed);
    if let Some(named) = common.key_algorithm {
        algs = algs.and(named_alg(named).map_or(AlgSet(0), |a| AlgSet::of(&[a])));
    }
    if algs.is_empty() {
        return None;
    }
    let decoding = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key {
        kid: common.key_id.clone(),
        algs,
        decoding,
    })
}

/// What a key of this type and curve can verify (HS256 never: see the module docs).
fn by_type(params: &AlgorithmParameters) -> AlgSet {
    match params {
        AlgorithmParameters::RSA(_) => AlgSet::RSA,
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => AlgSet::of(&[Algorithm::ES256]),
            EllipticCurve::P384 => AlgSet::of(&[Algorithm::ES384]),
            _ => AlgSet::default(),
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            EllipticCurve::Ed25519 => AlgSet::of(&[Algorithm::EdDSA]),
            _ => AlgSet::default(),
        },
        AlgorithmParameters::OctetKey(_) => AlgSet::default(),
    }
}

/// The signing algorithm a JWK's `alg` names (encryption algorithms name none).
fn named_alg(alg: KeyAlgorithm) -> Option<Algorithm> {
    Some(match alg {
        KeyAlgorithm::HS256 => Algorithm::HS256,
        KeyAlgorithm::HS384 => Algorithm::HS384,
        KeyAlgorithm::HS512 => Algorithm::HS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        KeyAlgorithm::RSA1_5 | KeyAlgorithm::RSA_OAEP | KeyAlgorithm::RSA_OAEP_256 => return None,
    })
}
