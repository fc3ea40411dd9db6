//! `JwtVerifier`: the settings, the merged key set and the token cache as one snapshot in
//! an `ArcSwap` (a request loads it once and never waits), replaced whole when the file is
//! re-read, the URL set changes or the settings do.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};
use tokio::sync::Notify;

use super::cache::TokenCache;
use super::error::{FetchError, InvalidToken, JwtConfigError};
use super::header::{self, Header};
use super::keys::{parse_jwks, usable_count, KeySet};
use super::refresh::{FETCH_DEADLINE, KID_REFETCH_INTERVAL};
use super::settings::JwtSettings;
use super::{Caller, MAX_TOKEN_LEN};

/// Verifies JWTs against the configured keys. Share it in an `Arc`: `verify` on the
/// request path, `run_refresher` as a background task when `jwks_url` is set, `reload` on
/// a config reload.
pub struct JwtVerifier {
    state: ArcSwap<State>,
    /// Serializes installs (reload, fetch), so none is lost to a concurrent one.
    install: Mutex<()>,
    /// Set by a `verify` that met an unknown `kid`, cleared before each fetch: whether a
    /// refetch is wanted (`kid_miss` only wakes the refresher).
    pub(super) kid_wanted: AtomicBool,
    pub(super) kid_miss: Notify,
    /// Woken when a reload changes `jwks_url`: the new URL is fetched at once.
    pub(super) url_changed: Notify,
    pub(super) counters: Counters,
    pub(super) client: Mutex<Option<reqwest::Client>>,
    pub(super) timing: Timing,
    /// Set once a `jwks_url` set has been installed (`awaiting_keys`).
    pub(super) url_loaded: AtomicBool,
}

/// Counts since the verifier was built (for metrics; no label needed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JwtStats {
    /// JWKS fetches that installed a set (or found it unchanged).
    pub fetches: u64,
    /// JWKS fetches that failed (the last good set stayed).
    pub fetch_failures: u64,
    /// Tokens refused for an unknown `kid`.
    pub kid_misses: u64,
    /// Fetches brought forward by unknown kids.
    pub kid_refetches: u64,
    /// JWKS keys in use.
    pub keys: usize,
    /// Tokens in the cache.
    pub cached: usize,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) fetches: AtomicU64,
    pub(super) fetch_failures: AtomicU64,
    pub(super) kid_misses: AtomicU64,
    pub(super) kid_refetches: AtomicU64,
}

/// The refresher's clocks (constants in production; shorter in tests).
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub(super) fetch_deadline: Duration,
    pub(super) kid_refetch: Duration,
}

/// One consistent view: what `verify` reads.
struct State {
    settings: JwtSettings,
    keys: KeySet,
    /// One jsonwebtoken `Validation` per allowed algorithm: signature and algorithm only
    /// (time and claims are checked in `claims`, against the caller's clock).
    validations: Vec<(Algorithm, Validation)>,
    file: Vec<Jwk>,
    url: Vec<Jwk>,
    cache: TokenCache,
}

// === impl JwtVerifier ===

impl JwtVerifier {
    /// A verifier for `settings`, with `jwks_file` read now. The `jwks_url` set is empty
    /// until the first fetch (`refresh_once`, or `run_refresher`'s first tick).
    ///
    /// # Errors
    /// Settings that `JwtSettings::check` refuses; a `jwks_file` that cannot be read, is
    /// not a JWKS or has no key usable with `algorithms` (each naming the file).
    pub fn new(settings: JwtSettings) -> Result<Self, JwtConfigError> {
        let timing = Timing {
            fetch_deadline: FETCH_DEADLINE,
            kid_refetch: KID_REFETCH_INTERVAL,
        };
        Self::with_timing(settings, timing)
    }

    pub(super) fn with_timing(
        settings: JwtSettings,
        timing: Timing,
    ) -> Result<Self, JwtConfigError> {
        settings.check()?;
        let file = read_file(&settings)?;
        Ok(Self {
            state: ArcSwap::from_pointee(State::new(settings, file, Vec::new())),
            install: Mutex::new(()),
            kid_wanted: AtomicBool::new(false),
            kid_miss: Notify::new(),
            url_changed: Notify::new(),
            counters: Counters::default(),
            client: Mutex::new(None),
            timing,
            url_loaded: AtomicBool::new(false),
        })
    }

    /// Takes new settings and re-reads `jwks_file`. The keys fetched from `jwks_url` stay
    /// when the URL is unchanged; a new URL starts empty and is fetched at once by the
    /// refresher. Nothing changed (same settings, same keys): the cache stays warm.
    ///
    /// # Errors
    /// As `new`; on error the verifier keeps its current settings and keys.
    pub fn reload(&self, settings: JwtSettings) -> Result<(), JwtConfigError> {
        settings.check()?;
        let file = read_file(&settings)?;
        let _installing = self.install.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.state.load_full();
        let same_url = current.settings.jwks_url == settings.jwks_url;
        let url = if same_url {
            current.url.clone()
        } else {
            Vec::new()
        };
        let wake = !same_url && settings.jwks_url.is_some();
        self.swap(&current, settings, file, url);
        if wake {
            self.url_changed.notify_one();
        }
        Ok(())
    }

    /// The caller `token` names, if it verifies at `now_secs` (Unix seconds). No I/O and
    /// no waiting: an unknown `kid` fails now and only tells the refresher.
    ///
    /// # Errors
    /// Why the token is refused (each a 401 `invalid_token`).
    pub fn verify(&self, token: &[u8], now_secs: u64) -> Result<Caller, InvalidToken> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(InvalidToken::TooLong);
        }
        let state = self.state.load();
        let tag = state.cache.tag(token);
        if let Some(caller) = state.cache.get(tag, now_secs) {
            return Ok(caller);
        }
        let caller = self.check(&state, token, now_secs)?;
        state.cache.put(tag, &caller, now_secs);
        Ok(caller)
    }

    /// `verify` without the cache: every call checks the signature. For benchmarks, and
    /// for a caller that must see each token verified.
    ///
    /// # Errors
    /// As `verify`.
    pub fn verify_uncached(&self, token: &[u8], now_secs: u64) -> Result<Caller, InvalidToken> {
        self.check(&self.state.load(), token, now_secs)
    }

    fn check(&self, state: &State, token: &[u8], now_secs: u64) -> Result<Caller, InvalidToken> {
        let (text, Header { alg, kid }) = header::read(token)?;
        if !state.settings.allows(alg) {
            return Err(InvalidToken::Algorithm);
        }
        let key = state.keys.select(alg, kid.as_deref()).inspect_err(|e| {
            if *e == InvalidToken::UnknownKid {
                self.kid_missed();
            }
        })?;
        let validation = state.validation(alg).ok_or(InvalidToken::Algorithm)?;
        let data = jsonwebtoken::decode::<Map<String, Value>>(text, key, validation)
            .map_err(|e| refusal(e.kind()))?;
        super::claims::caller(&data.claims, &state.settings, now_secs)
    }

    /// Counts the miss and wakes the refresher once per wanted refetch (a flood of unknown
    /// kids touches one flag, mostly by loads).
    fn kid_missed(&self) {
        self.counters.kid_misses.fetch_add(1, Ordering::Relaxed);
        if !self.kid_wanted.load(Ordering::Relaxed) && !self.kid_wanted.swap(true, Ordering::AcqRel)
        {
            self.kid_miss.notify_one();
        }
    }

    /// Installs a fetched JWKS `body` as the set of `url`.
    ///
    /// # Errors
    /// Not a JWKS, or no key usable with `algorithms`; the last good set stays.
    pub(super) fn install_url(&self, url: &str, body: &[u8]) -> Result<usize, FetchError> {
        let jwks = parse_jwks(body).map_err(FetchError::Jwks)?;
        let _installing = self.install.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.state.load_full();
        if current.settings.jwks_url.as_deref() != Some(url) {
            return Ok(0); // overtaken by a reload to another URL
        }
        let usable = usable_count(&current.settings, &jwks);
        if usable == 0 {
            return Err(FetchError::Jwks("no key usable with algorithms".into()));
        }
        self.swap(
            &current,
            current.settings.clone(),
            current.file.clone(),
            jwks,
        );
        self.url_loaded.store(true, Ordering::Release);
        Ok(usable)
    }

    /// Replaces the snapshot unless nothing changed (a periodic fetch of the same set keeps
    /// the cache). Called with `install` held.
    fn swap(&self, current: &State, settings: JwtSettings, file: Vec<Jwk>, url: Vec<Jwk>) {
        if current.settings == settings && current.file == file && current.url == url {
            return;
        }
        self.state.store(Arc::new(State::new(settings, file, url)));
    }

    /// The cached caller of `token` at `now_secs`, without verifying anything.
    #[cfg(test)]
    pub(super) fn cached(&self, token: &[u8], now_secs: u64) -> Option<Caller> {
        let state = self.state.load();
        state.cache.get(state.cache.tag(token), now_secs)
    }

    /// Whether `jwks_url` is set and no key set from it has loaded since the process
    /// started: tokens may then be signed by keys not fetched yet (`not_ready`, and
    /// `/readyz` waits). A later failed fetch keeps the last good set and does not count.
    pub fn awaiting_keys(&self) -> bool {
        !self.url_loaded.load(Ordering::Acquire) && self.state.load().settings.jwks_url.is_some()
    }

    /// The settings in use.
    pub fn settings(&self) -> JwtSettings {
        self.state.load().settings.clone()
    }

    /// Counts and sizes, for metrics.
    pub fn stats(&self) -> JwtStats {
        let state = self.state.load();
        let c = &self.counters;
        JwtStats {
            fetches: c.fetches.load(Ordering::Relaxed),
            fetch_failures: c.fetch_failures.load(Ordering::Relaxed),
            kid_misses: c.kid_misses.load(Ordering::Relaxed),
            kid_refetches: c.kid_refetches.load(Ordering::Relaxed),
            keys: state.keys.len(),
            cached: state.cache.len(),
        }
    }
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.load();
        f.debug_struct("JwtVerifier")
            .field("settings", &state.settings)
            .field("keys", &state.keys.len())
            .finish_non_exhaustive()
    }
}

// === impl State ===

impl State {
    fn new(settings: JwtSettings, file: Vec<Jwk>, url: Vec<Jwk>) -> Self {
        let validations = settings
            .algorithms
            .iter()
            .map(|alg| (*alg, signature_only(*alg)))
            .collect();
        Self {
            keys: KeySet::build(&settings, &file, &url),
            validations,
            settings,
            file,
            url,
            cache: TokenCache::default(),
        }
    }

    fn validation(&self, alg: Algorithm) -> Option<&Validation> {
        self.validations
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, v)| v)
    }
}

/// A `Validation` that checks the signature with `alg` and nothing else.
fn signature_only(alg: Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    v.required_spec_claims.clear();
    v.validate_exp = false;
    v.validate_nbf = false;
    v.validate_aud = false;
    v.leeway = 0;
    v
}

/// The refusal a jsonwebtoken error stands for (after `header::read` passed, a parse error
/// is a payload that is not JSON, or a signature that is not base64url).
fn refusal(kind: &ErrorKind) -> InvalidToken {
    match kind {
        ErrorKind::InvalidSignature => InvalidToken::Signature,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => InvalidToken::Algorithm,
        _ => InvalidToken::Malformed,
    }
}

/// The keys of `jwks_file`, if set.
fn read_file(settings: &JwtSettings) -> Result<Vec<Jwk>, JwtConfigError> {
    let Some(path) = &settings.jwks_file else {
        return Ok(Vec::new());
    };
    let body = std::fs::read(path).map_err(|source| JwtConfigError::ReadFile {
        path: path.clone(),
        source,
    })?;
    let bad = |reason: String| JwtConfigError::BadFile {
        path: path.clone(),
        reason,
    };
    let jwks = parse_jwks(&body).map_err(bad)?;
    if usable_count(settings, &jwks) == 0 {
        return Err(bad(format!(
            "none of its {} keys is usable with algorithms {:?}",
            jwks.len(),
            settings.algorithms
        )));
    }
    Ok(jwks)
}
