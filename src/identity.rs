//! Who is calling: the API key from the request, and key -> key id, tenant, tier.
//!
//! Keys are never held in clear: the table maps SHA-256 digests to `KeyInfo`, and a
//! presented key is hashed once and looked up. Lookups of a preimage-resistant digest leak
//! nothing useful through timing, so no constant-time compare is needed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::config::{check_cost, Config, LimitError, Tier};
use crate::limiter::{Ident, Window};
use crate::sharded::Sharded;

/// Longest key accepted; longer ones are invalid without being hashed.
pub const MAX_KEY_LEN: usize = 256;

/// What the request says about its key.
#[derive(Debug, Clone, Copy)]
pub enum Presented<'a> {
    /// No key header.
    Missing,
    /// A key (non-empty, not over `MAX_KEY_LEN`, visible ASCII).
    Key(&'a [u8]),
    /// A key header that cannot hold a valid key (empty Bearer, too long, bad bytes).
    Malformed,
    /// A Bearer credential shaped like a JWT (`auth::looks_like_jwt`: two dots), read as
    /// one only when `[auth.jwt]` is configured (`api_key_from`'s `jwt`); any length (the
    /// verifier refuses what is too long). Without a verifier it is an API key again
    /// (`validate_key`).
    Token(&'a [u8]),
    /// A caller a trusted adapter has already identified (the Envoy rate-limit service's
    /// `key_id` and `tenant` entries): used as is, nothing is looked up.
    Known(&'a Arc<KeyInfo>),
}

impl PartialEq for Presented<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Missing, Self::Missing) | (Self::Malformed, Self::Malformed) => true,
            (Self::Key(a), Self::Key(b)) | (Self::Token(a), Self::Token(b)) => a == b,
            (Self::Known(a), Self::Known(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Presented<'_> {}

/// An identified caller: an API key, a verified JWT, or (the Envoy rate-limit service) a
/// tenant named without a key. Built once, when the caller is identified, with the tiers
/// resolved by the one tenant-tier rule (`admission::Dynamic::tenant_tier`).
///
/// Identities live in namespaces and never meet by accident: a key's scope identity is its
/// id, a JWT caller's is `jwt:<key_claim value>` (`JWT_PREFIX`; key ids may not start with
/// it), and a tenant is only ever what a key's record, or a token's `tenant_claim`, names.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    /// The bare id `X-Throttle-Key-Id` carries: the key id, or the JWT's `key_claim` value
    /// (empty for a tenant-only caller). Never the key itself.
    pub key_id: Arc<str>,
    /// What kind of caller this is.
    pub kind: CallerKind,
    /// The tenant id, when the caller has one.
    pub tenant: Option<Arc<str>>,
    /// The key's tier (its key limits).
    pub tier: Arc<Tier>,
    /// The tenant's tier (its tenant limits), by the one tenant-tier rule.
    pub tenant_tier: Arc<Tier>,
    /// `Ident` of the key scope (namespaced: `jwt:<sub>` for a token); None for a
    /// tenant-only caller.
    pub key_ident: Option<Ident>,
    /// `Ident` of the tenant scope; None without a tenant.
    pub tenant_ident: Option<Ident>,
    /// `X-Throttle-Tenant` and `X-Throttle-Key-Id` values, built once (None: absent, or an
    /// id that cannot be a header value).
    pub headers: CallerHeaders,
    /// A JWT caller's claims that custom scopes read (`jwt:<claim>`), by name; empty for
    /// an API key.
    pub claims: Box<[(String, String)]>,
}

pub use crate::auth::{key_id_allowed, JWT_PREFIX};

/// What kind of caller a `KeyInfo` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerKind {
    /// An API key (`[[keys]]` or the database).
    ApiKey,
    /// A verified Bearer JWT.
    Jwt,
    /// A tenant named without a key (the rate-limit service's `tenant` entry).
    Tenant,
}

/// The identity headers a caller sends upstream.
#[derive(Debug, Clone, Default)]
pub struct CallerHeaders {
    /// `X-Throttle-Tenant`.
    pub tenant: Option<http::HeaderValue>,
    /// `X-Throttle-Key-Id`.
    pub key_id: Option<http::HeaderValue>,
}

/// Digest -> key, swapped whole on refresh.
#[derive(Debug, Default)]
pub struct KeyTable {
    by_digest: HashMap<[u8; 32], Arc<KeyInfo>>,
    /// Keys already found in this table, by a keyed hash of the key: a repeat lookup
    /// skips SHA-256 (7,000 instructions, the largest single cost of a request).
    seen: KeyCache,
    /// The database limits refused while building this table (one string per refusal,
    /// naming what was refused and why), so that the next build reports only new ones.
    refused: HashSet<String>,
}

// === impl KeyInfo ===

impl KeyInfo {
    /// The API key `id` of `tenant`, limited by `tier` (key) and `tenant_tier` (tenant).
    pub fn api_key(id: &str, tenant: &str, tier: Arc<Tier>, tenant_tier: Arc<Tier>) -> Arc<Self> {
        let key_id: Arc<str> = Arc::from(id);
        Arc::new(Self::build(
            (
                CallerKind::ApiKey,
                key_id.clone(),
                Some(Ident::Name(key_id)),
            ),
            Some(tenant),
            (tier, tenant_tier),
        ))
    }

    /// The caller of a verified JWT whose `key_claim` is `sub`: its key-scope identity is
    /// `jwt:<sub>`; its tenant only what `tenant_claim` named (None: no tenant limits).
    pub fn jwt(
        sub: &str,
        tenant: Option<&str>,
        (tier, tenant_tier): (Arc<Tier>, Arc<Tier>),
        claims: Vec<(String, String)>,
    ) -> Arc<Self> {
        let ident = Ident::Name(Arc::from(format!("{JWT_PREFIX}{sub}")));
        let mut info = Self::build(
            (CallerKind::Jwt, Arc::from(sub), Some(ident)),
            tenant,
            (tier, tenant_tier),
        );
        info.claims = claims.into_boxed_slice();
        Arc::new(info)
    }

    /// A caller known only as `tenant` (no key scope, no key id), under `tenant_tier`.
    pub fn tenant_only(tenant: &str, tenant_tier: Arc<Tier>) -> Arc<Self> {
        Arc::new(Self::build(
            (CallerKind::Tenant, Arc::from(""), None),
            Some(tenant),
            (tenant_tier.clone(), tenant_tier),
        ))
    }

    fn build(
        (kind, key_id, key_ident): (CallerKind, Arc<str>, Option<Ident>),
        tenant: Option<&str>,
        (tier, tenant_tier): (Arc<Tier>, Arc<Tier>),
    ) -> Self {
        let tenant: Option<Arc<str>> = tenant.map(Arc::from);
        let value = |s: &str| http::HeaderValue::from_str(s).ok();
        let headers = CallerHeaders {
            tenant: tenant.as_deref().and_then(value),
            key_id: Some(&*key_id).filter(|id| !id.is_empty()).and_then(value),
        };
        KeyInfo {
            headers,
            tenant_ident: tenant.clone().map(Ident::Name),
            key_ident,
            key_id,
            kind,
            tenant,
            tier,
            tenant_tier,
            claims: Box::default(),
        }
    }

    /// The key scope's identity as text (`key_demo`, `jwt:alice`): what key blocks, bans,
    /// `/v1/top` and the violation log name. None for a tenant-only caller.
    pub fn key_scope_id(&self) -> Option<&str> {
        match &self.key_ident {
            Some(Ident::Name(n)) => Some(n),
            _ => None,
        }
    }

    /// The tenant id as text, when there is one.
    pub fn tenant_id(&self) -> Option<&str> {
        self.tenant.as_deref()
    }
}

// === impl KeyTable ===

impl KeyTable {
    /// The keys of `[[keys]]` (unknown tiers were rejected by validation), their tenants'
    /// tiers from `[[tenants]]` (the tenant-tier rule before any database snapshot).
    pub fn from_config(config: &Config) -> Self {
        let tenant_tier = |tenant: &str| {
            if let Some(own) = config.tenant_tiers.get(tenant) {
                return Some(own.clone());
            }
            let name = config.tenants.get(tenant)?;
            config.tiers.get(name).cloned()
        };
        Self::from_config_tiers(config, &config.tiers, &tenant_tier)
    }

    /// The keys of `[[keys]]`, their tiers looked up in `tiers` (the config's, with the
    /// database's policies applied) and their tenants' tiers given by `tenant_tier` (None:
    /// the key's tier); keys naming a tier missing from `tiers` are left out.
    pub fn from_config_tiers(
        config: &Config,
        tiers: &HashMap<String, Arc<Tier>>,
        tenant_tier: &dyn Fn(&str) -> Option<Arc<Tier>>,
    ) -> Self {
        let mut by_digest = HashMap::with_capacity(config.keys.len());
        for k in &config.keys {
            let Some(tier) = tiers.get(&k.tier) else {
                continue;
            };
            let tenant = tenant_tier(&k.tenant).unwrap_or_else(|| tier.clone());
            by_digest.insert(
                k.sha256,
                KeyInfo::api_key(&k.id, &k.tenant, tier.clone(), tenant),
            );
        }
        Self {
            by_digest,
            seen: KeyCache::default(),
            refused: HashSet::new(),
        }
    }

    /// The database limits refused while building this table.
    pub fn refused(&self) -> &HashSet<String> {
        &self.refused
    }

    /// Records the database limits refused while building this table.
    pub fn set_refused(&mut self, refused: HashSet<String>) {
        self.refused = refused;
    }

    /// Every key, by digest.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8; 32], &Arc<KeyInfo>)> {
        self.by_digest.iter()
    }

    /// Adds (or replaces) the key with digest `sha256`.
    pub fn insert(&mut self, sha256: [u8; 32], info: Arc<KeyInfo>) {
        self.by_digest.insert(sha256, info);
    }

    /// The key whose SHA-256 matches `key`.
    pub fn lookup(&self, key: &[u8]) -> Option<Arc<KeyInfo>> {
        if self.by_digest.is_empty() {
            return None;
        }
        let tag = self.seen.tag(key);
        if let Some(info) = self.seen.get(tag) {
            return Some(info);
        }
        let digest: [u8; 32] = Sha256::digest(key).into();
        let info = self.by_digest.get(&digest)?;
        self.seen.put(tag, info);
        Some(info.clone())
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

/// Keys found before, by SipHash-1-3/128 of the presented key under a secret drawn per
/// table: a match stands for the key itself (a collision needs ~2^64 guesses without the
/// secret), and no key is held in clear. Only keys the table holds get in (unknown keys
/// never do), at most `MAX_SEEN`; the table, and so the cache, is replaced on every
/// config reload and database snapshot.
///
/// The tags are hashes already, so a tag is its own shard index. Each shard is a mutex,
/// not a read-write lock: a hit holds it for one probe and one `Arc` clone, a read lock
/// writes the lock's cache line just as a mutex does, and two threads looking up one hot
/// key measured the same either way.
#[derive(Debug)]
struct KeyCache {
    secret: (u64, u64),
    shards: Sharded<HashMap<u128, Arc<KeyInfo>>>,
}

/// Most keys remembered per table.
const MAX_SEEN: usize = 1 << 20;
const SEEN_SHARDS: usize = 16;

impl Default for KeyCache {
    fn default() -> Self {
        Self {
            secret: (rand::random(), rand::random()),
            shards: Sharded::new(SEEN_SHARDS),
        }
    }
}

impl KeyCache {
    fn tag(&self, key: &[u8]) -> u128 {
        use std::hash::Hasher;
        let mut h = siphasher::sip128::SipHasher13::new_with_keys(self.secret.0, self.secret.1);
        h.write(key);
        siphasher::sip128::Hasher128::finish128(&h).as_u128()
    }

    fn get(&self, tag: u128) -> Option<Arc<KeyInfo>> {
        self.shards.lock(tag as usize).get(&tag).cloned()
    }

    fn put(&self, tag: u128, info: &Arc<KeyInfo>) {
        let mut m = self.shards.lock(tag as usize);
        if m.len() < MAX_SEEN / SEEN_SHARDS {
            m.insert(tag, info.clone());
        }
    }
}

/// `tier` with its key windows overridden field by field by `o`, a JSON object of
/// `per_second` .. `per_month`: a number sets that window's limit (built with the tier's
/// key settings: its algorithm for that window, its burst and jitter), `null` removes the
/// window, absent fields stay as they are. Every window set passes
/// `config::window_limit`, and no window of the result may be below `max_cost` (the
/// config's highest route cost), as in `gateway.toml`.
///
/// # Errors
/// `LimitError` naming the field refused.
pub fn apply_override(
    tier: &Tier,
    o: &serde_json::Value,
    max_cost: u32,
) -> Result<Tier, LimitError> {
    let obj = o.as_object().ok_or_else(|| LimitError::NotAnObject {
        field: "custom_override".into(),
    })?;
    let mut key = (*tier.key).clone();
    for (field, v) in obj {
        let window = Window::ALL
            .into_iter()
            .find(|w| w.config_key() == field)
            .ok_or_else(|| LimitError::UnknownField {
                field: field.clone(),
            })?;
        key.windows.retain(|w| w.window != window);
        if v.is_null() {
            continue;
        }
        let limit = v.as_u64().ok_or_else(|| LimitError::NotALimit {
            field: field.clone(),
            value: v.to_string(),
        })?;
        key.windows.push(tier.key_settings.window(window, limit)?);
    }
    key.windows.sort_by_key(|w| w.window);
    check_cost(&key, max_cost)?;
    Ok(Tier {
        key: Arc::new(key),
        ..tier.clone()
    })
}

/// More than one credential where the gateway can only honour one: several
/// `Authorization` headers, several `X-API-Key` headers, or a Bearer key and an
/// `X-API-Key` that differ. An upstream that reads the other one would serve a caller the
/// gateway did not identify (400 `ambiguous_credentials`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmbiguousCredentials;

/// The value of the parameter `name` in `query` (`application/x-www-form-urlencoded`), if
/// present: `[auth] key_query` and custom scopes' `query:` read it.
///
/// # Errors
/// `AmbiguousCredentials` when `name` appears more than once (an upstream reading the
/// other one would serve a caller the gateway did not identify).
pub fn query_param<'q>(
    query: Option<&'q str>,
    name: &str,
) -> Result<Option<std::borrow::Cow<'q, str>>, AmbiguousCredentials> {
    let Some(query) = query else { return Ok(None) };
    let mut found = None;
    for (n, v) in form_urlencoded::parse(query.as_bytes()) {
        if n == name {
            if found.is_some() {
                return Err(AmbiguousCredentials);
            }
            found = Some(v);
        }
    }
    Ok(found)
}

/// The API key of a request: `Authorization: Bearer <key>`, else `<key_header>: <key>`
/// (`[auth] key_header`, `X-API-Key` by default). A non-Bearer `Authorization` (e.g.
/// Basic) is left for the upstream and is no key. With `jwt` (`[auth.jwt]` is
/// configured), a Bearer value shaped like a JWT is a `Presented::Token`; without it
/// nothing here looks at the value's shape.
///
/// # Errors
/// `AmbiguousCredentials` when the request carries more than one credential.
pub fn api_key_from<'h>(
    headers: &'h HeaderMap,
    key_header: &http::HeaderName,
    jwt: bool,
) -> Result<Presented<'h>, AmbiguousCredentials> {
    let mut auth = headers.get_all(http::header::AUTHORIZATION).iter();
    let mut api = headers.get_all(key_header).iter();
    let (auth, api) = match ((auth.next(), auth.next()), (api.next(), api.next())) {
        ((_, Some(_)), _) | (_, (_, Some(_))) => return Err(AmbiguousCredentials),
        ((a, None), (k, None)) => (a, k),
    };
    let bearer = auth.and_then(|v| bearer(v.as_bytes()));
    match (bearer, api) {
        (Some(b), Some(k)) if b.trim_ascii() != k.as_bytes().trim_ascii() => {
            Err(AmbiguousCredentials)
        }
        (Some(b), _) if jwt && crate::auth::looks_like_jwt(b.trim_ascii()) => {
            Ok(Presented::Token(b.trim_ascii()))
        }
        (Some(b), _) => Ok(validate_key(b)),
        (None, Some(k)) => Ok(validate_key(k.as_bytes())),
        (None, None) => Ok(Presented::Missing),
    }
}

/// Whether an `Authorization` value is a Bearer credential (the gateway's to read, and
/// to hide with `hide_credentials`).
pub fn is_bearer(value: &[u8]) -> bool {
    bearer(value).is_some()
}

/// The credential of a Bearer `Authorization` value (case-insensitive scheme, then any
/// whitespace: `Bearer<TAB>k` is a Bearer credential, as lenient upstream parsers read it).
fn bearer(b: &[u8]) -> Option<&[u8]> {
    let scheme = b.get(..6)?;
    let sep = b.get(6).is_none_or(u8::is_ascii_whitespace);
    (scheme.eq_ignore_ascii_case(b"bearer") && sep).then(|| b.get(7..).unwrap_or_default())
}

/// Classifies a raw key value: a usable key or malformed.
pub fn validate_key(raw: &[u8]) -> Presented<'_> {
    let key = raw.trim_ascii();
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.iter().all(|b| b.is_ascii_graphic()) {
        return Presented::Malformed;
    }
    Presented::Key(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    /// Bearer first, then X-API-Key; malformed values are told apart from missing ones.
    #[test]
    fn extracts_key_table() {
        let long = vec![b'a'; 10_000];
        type Case<'a> = (
            &'a [(&'a str, &'a [u8])],
            Result<Presented<'a>, AmbiguousCredentials>,
        );
        let cases: &[Case<'_>] = &[
            (&[], Ok(Presented::Missing)),
            (
                &[("authorization", b"Bearer abc")],
                Ok(Presented::Key(b"abc")),
            ),
            (
                &[("authorization", b"bearer  abc ")],
                Ok(Presented::Key(b"abc")),
            ),
            (&[("x-api-key", b"k1")], Ok(Presented::Key(b"k1"))),
            // One credential given twice the same way is one credential.
            (
                &[("authorization", b"Bearer k1"), ("x-api-key", b" k1")],
                Ok(Presented::Key(b"k1")),
            ),
            // Two different credentials, or one header twice: refused.
            (
                &[("authorization", b"Bearer b1"), ("x-api-key", b"k1")],
                Err(AmbiguousCredentials),
            ),
            (
                &[
                    ("authorization", b"Bearer b1"),
                    ("authorization", b"Bearer b1"),
                ],
                Err(AmbiguousCredentials),
            ),
            (
                &[
                    ("authorization", b"Basic dXNlcg=="),
                    ("authorization", b"Bearer b1"),
                ],
                Err(AmbiguousCredentials),
            ),
            (
                &[("x-api-key", b"k1"), ("x-api-key", b"k2")],
                Err(AmbiguousCredentials),
            ),
            (
                &[("authorization", b"Basic dXNlcg=="), ("x-api-key", b"k1")],
                Ok(Presented::Key(b"k1")),
            ),
            (
                &[("authorization", b"Basic dXNlcg==")],
                Ok(Presented::Missing),
            ),
            (&[("authorization", b"Bearer")], Ok(Presented::Malformed)),
            (&[("authorization", b"Bearer   ")], Ok(Presented::Malformed)),
            (&[("x-api-key", b"")], Ok(Presented::Malformed)),
            (&[("x-api-key", &long)], Ok(Presented::Malformed)),
            (&[("x-api-key", b"caf\xc3\xa9")], Ok(Presented::Malformed)),
            (&[("authorization", b"Bearerabc")], Ok(Presented::Missing)),
            // Any whitespace after the scheme: a Bearer credential, tab included.
            (
                &[("authorization", b"Bearer\tabc")],
                Ok(Presented::Key(b"abc")),
            ),
            (
                &[("authorization", b"BEARER\t abc")],
                Ok(Presented::Key(b"abc")),
            ),
            (
                &[("authorization", b"Bearer\tb1"), ("x-api-key", b"k1")],
                Err(AmbiguousCredentials),
            ),
        ];
        for (i, (h, want)) in cases.iter().enumerate() {
            let x_api_key = http::HeaderName::from_static("x-api-key");
            assert_eq!(
                api_key_from(&headers(h), &x_api_key, false),
                *want,
                "case {i}"
            );
        }
    }

    /// `[auth] key_header` names the key's header: only that header carries a key, and
    /// a Bearer key must still agree with it.
    #[test]
    fn key_header_names_the_key_header() {
        let custom = http::HeaderName::from_static("x-client-token");
        type Row<'a> = (
            &'a [(&'a str, &'a [u8])],
            Result<Presented<'a>, AmbiguousCredentials>,
        );
        let cases: [Row<'_>; 4] = [
            (&[("x-client-token", b"k1")], Ok(Presented::Key(b"k1"))),
            (&[("x-api-key", b"k1")], Ok(Presented::Missing)),
            (
                &[("authorization", b"Bearer k1"), ("x-client-token", b"k2")],
                Err(AmbiguousCredentials),
            ),
            (
                &[("x-client-token", b"k1"), ("x-client-token", b"k1")],
                Err(AmbiguousCredentials),
            ),
        ];
        for (i, (h, want)) in cases.iter().enumerate() {
            assert_eq!(api_key_from(&headers(h), &custom, false), *want, "case {i}");
        }
    }

    /// With `[auth.jwt]`, a Bearer value with two dots is a token whatever its length;
    /// without it, the same value is an API key (or malformed when too long), and other
    /// values are keys either way.
    #[test]
    fn jwt_shaped_bearer_is_a_token_only_with_jwt() {
        let x_api_key = http::HeaderName::from_static("x-api-key");
        let long = format!("Bearer {}.{}.{}", "a".repeat(200), "b".repeat(300), "c");
        let h = headers(&[("authorization", long.as_bytes())]);
        let token = &long.as_bytes()[7..];
        assert_eq!(
            api_key_from(&h, &x_api_key, true),
            Ok(Presented::Token(token))
        );
        assert_eq!(
            api_key_from(&h, &x_api_key, false),
            Ok(Presented::Malformed)
        );
        let h = headers(&[("authorization", b"Bearer  a.b.c ")]);
        assert_eq!(
            api_key_from(&h, &x_api_key, true),
            Ok(Presented::Token(b"a.b.c"))
        );
        assert_eq!(
            api_key_from(&h, &x_api_key, false),
            Ok(Presented::Key(b"a.b.c"))
        );
        for key in [&b"Bearer a.b"[..], b"Bearer a.b.c.d", b"Bearer abc"] {
            let h = headers(&[("authorization", key)]);
            assert_eq!(
                api_key_from(&h, &x_api_key, true),
                Ok(Presented::Key(&key[7..]))
            );
        }
        // An X-API-Key is never a token, and a different one beside a token is ambiguous.
        let h = headers(&[("x-api-key", b"a.b.c")]);
        assert_eq!(
            api_key_from(&h, &x_api_key, true),
            Ok(Presented::Key(b"a.b.c"))
        );
        let h = headers(&[("authorization", b"Bearer a.b.c"), ("x-api-key", b"k1")]);
        assert_eq!(
            api_key_from(&h, &x_api_key, true),
            Err(AmbiguousCredentials)
        );
    }

    /// custom_override replaces, adds and removes windows field by field.
    #[test]
    fn override_merges_field_by_field() {
        let c = crate::config::parse("gateway.toml", crate::config::SHIPPED).unwrap();
        let free = &c.tiers["free"];
        let o = serde_json::json!({"per_minute": 1000, "per_day": null, "per_second": 7});
        let t = apply_override(free, &o, c.max_cost()).unwrap();
        let get = |w: Window| {
            t.key
                .windows
                .iter()
                .find(|x| x.window == w)
                .map(|x| x.limit)
        };
        assert_eq!(get(Window::Second), Some(7));
        assert_eq!(get(Window::Minute), Some(1000));
        assert_eq!(get(Window::Hour), Some(2000), "untouched window kept");
        assert_eq!(get(Window::Day), None, "null removes the window");
        assert_eq!(get(Window::Month), Some(500_000));
        assert_eq!(t.tenant, free.tenant);
        assert_eq!(t.key.message, free.key.message);
    }

    /// An override gets the checks a `gateway.toml` window gets, and names the field.
    #[test]
    fn override_is_validated_like_the_config() {
        let src = r#"
[tiers.free]
burst_multiplier = 1.5
key = { per_second = 10, per_day = 1000 }
[tiers.log]
key = { per_hour = 100, algorithm = "sliding_log" }
[[routes]]
name = "search"
path_prefix = "/"
upstreams = ["127.0.0.1:9000"]
cost = 5
"#;
        let c = crate::config::parse("t.toml", src).unwrap();
        let (free, log, cost) = (&c.tiers["free"], &c.tiers["log"], c.max_cost());
        assert_eq!(cost, 5);
        let refused = |tier, o: serde_json::Value| apply_override(tier, &o, cost).unwrap_err();
        // Too big for the algorithm: a day counted by a sliding window beyond 2^52.
        let e = refused(free, serde_json::json!({"per_day": 1_000_000_000u64}));
        assert!(matches!(e, LimitError::Inexact { .. }), "{e}");
        assert_eq!(e.field(), "per_day");
        assert!(
            e.to_string().contains("too large for sliding_window"),
            "{e}"
        );
        // The tier's sliding log keeps its bound.
        let e = refused(log, serde_json::json!({"per_hour": 200_000}));
        assert!(matches!(e, LimitError::SlidingLog { .. }), "{e}");
        let ok = apply_override(log, &serde_json::json!({"per_hour": 50_000}), cost).unwrap();
        assert_eq!(
            ok.key.windows[0].algorithm,
            crate::limiter::Algorithm::SlidingLog
        );
        // Below the costliest route (5): 3 x 1.5 = 4 tokens could never pay for it.
        let e = refused(free, serde_json::json!({"per_second": 3}));
        assert_eq!(
            e,
            LimitError::BelowCost {
                field: "per_second".into(),
                capacity: 4,
                cost: 5
            }
        );
        let ok = apply_override(free, &serde_json::json!({"per_second": 4}), cost).unwrap();
        assert_eq!(ok.key.windows[0].capacity, 6, "the tier's burst applies");
        // Fields and values that are not limits.
        let e = refused(free, serde_json::json!({"per_week": 3}));
        assert_eq!(e.to_string().split(' ').nth(2), Some("\"per_week\""));
        assert!(matches!(e, LimitError::UnknownField { .. }));
        for bad in [
            serde_json::json!({"per_minute": 0}),
            serde_json::json!({"per_minute": -1}),
            serde_json::json!({"per_minute": 1.5}),
            serde_json::json!({"per_minute": "10"}),
            serde_json::json!({"per_minute": 2_000_000_000u64}),
        ] {
            assert_eq!(refused(free, bad).field(), "per_minute");
        }
        assert!(matches!(
            refused(free, serde_json::json!([1])),
            LimitError::NotAnObject { .. }
        ));
        // null removes a window (and removing is never below a cost).
        let t = apply_override(free, &serde_json::json!({"per_second": null}), cost).unwrap();
        assert_eq!(t.key.windows.len(), 1);
        assert_eq!(t.key.windows[0].window, Window::Day);
    }

    /// Keys are found by SHA-256 (`key` and `key_sha256` alike); the tenant tier applies.
    #[test]
    fn looks_up_by_digest() {
        let c = crate::config::parse("gateway.toml", crate::config::SHIPPED).unwrap();
        let t = KeyTable::from_config(&c);
        let demo = t.lookup(b"demo-key-123").unwrap();
        assert_eq!(
            (
                &*demo.key_id,
                demo.tenant_id().unwrap(),
                demo.tier.name.as_str()
            ),
            ("key_demo", "acme", "free")
        );
        let pro = t.lookup(b"pro-key-456").unwrap();
        assert_eq!(
            (&*pro.key_id, pro.tenant_tier.name.as_str()),
            ("key_pro", "pro")
        );
        assert!(t.lookup(b"demo-key-124").is_none());
    }
}
