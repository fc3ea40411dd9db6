//! Callers named without a secret: the `key_id` and `tenant` entries of the Envoy
//! rate-limit service. Envoy (its ext_authz, a JWT filter) has identified the caller, so
//! the key is found by its id, and a tenant alone is a caller too.
//!
//! The index is built from one runtime and one database snapshot (the config's keys, then
//! the database's, which win, as in a key lookup) and rebuilt when either is swapped, on
//! the first call that needs it: O(keys) once per snapshot, then one map lookup per call.
//!
//! A tenant's tier follows the one tenant-tier rule (`Dynamic::tenant_tier`: the tenants
//! table, else `[[tenants]]`), so a tenant made through the admin API is known at once,
//! keys or not; a tenant with no tier of its own takes the tier its keys share. One with
//! no tier of its own whose keys are in different tiers has no single answer and is
//! refused, as is a tenant the gateway does not know.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwapOption;

use crate::admission::{Core, Dynamic, Runtime};
use crate::config::Tier;
use crate::identity::KeyInfo;

/// Key ids and tenants of the current snapshots, indexed.
#[derive(Default)]
pub(super) struct Directory {
    index: ArcSwapOption<Index>,
}

/// The index of one (runtime, database snapshot) pair.
struct Index {
    runtime: Arc<Runtime>,
    dynamic: Arc<Dynamic>,
    keys: HashMap<Arc<str>, Arc<KeyInfo>>,
    tenants: HashMap<Arc<str>, Option<Arc<KeyInfo>>>,
}

// === impl Directory ===

impl Directory {
    /// The key whose id is `id`.
    pub(super) fn key(&self, core: &Core, id: &str) -> Option<Arc<KeyInfo>> {
        self.index(core).keys.get(id).cloned()
    }

    /// The caller known only as `tenant`: its tenant limits, no key limits, no key id.
    ///
    /// # Errors
    /// Why there is no such caller (an `INVALID_ARGUMENT` message).
    pub(super) fn tenant(&self, core: &Core, tenant: &str) -> Result<Arc<KeyInfo>, String> {
        match self.index(core).tenants.get(tenant) {
            Some(Some(caller)) => Ok(caller.clone()),
            Some(None) => Err(format!(
                "tenant {tenant:?} has no tier of its own and its keys are in different tiers: \
                 send its api_key or key_id too"
            )),
            None => Err(format!(
                "unknown tenant {tenant:?}: no [[tenants]] entry and no key of it"
            )),
        }
    }

    fn index(&self, core: &Core) -> Arc<Index> {
        let (runtime, dynamic) = (core.runtime(), core.dynamic());
        if let Some(i) = self.index.load_full() {
            if Arc::ptr_eq(&i.runtime, &runtime) && Arc::ptr_eq(&i.dynamic, &dynamic) {
                return i;
            }
        }
        let i = Arc::new(Index::build(runtime, dynamic));
        self.index.store(Some(i.clone()));
        i
    }
}

// === impl Index ===

impl Index {
    fn build(runtime: Arc<Runtime>, dynamic: Arc<Dynamic>) -> Self {
        let mut keys = HashMap::new();
        for (_, k) in runtime.keys.iter().chain(dynamic.keys.iter()) {
            keys.insert(k.key_id.clone(), k.clone());
        }
        let config = &runtime.config;
        // Each tenant's tier: by the tenant-tier rule (the tenants table, else
        // `[[tenants]]`), else the one its keys share (None when they disagree).
        let mut tiers: HashMap<Arc<str>, Option<Arc<Tier>>> = HashMap::new();
        let declared = dynamic.tenants.keys().chain(config.tenants.keys());
        for tenant in declared {
            if let Some(tier) = dynamic.tenant_tier(config, tenant) {
                tiers
                    .entry(Arc::from(tenant.as_str()))
                    .or_insert(Some(tier));
            }
        }
        for k in keys.values() {
            let Some(tenant) = k.tenant.clone() else {
                continue;
            };
            match tiers.entry(tenant) {
                Entry::Vacant(e) => {
                    e.insert(Some(k.tenant_tier.clone()));
                }
                Entry::Occupied(mut e) => {
                    let disagree = e
                        .get()
                        .as_ref()
                        .is_some_and(|t| t.name != k.tenant_tier.name);
                    let declared = dynamic.tenant_tier(config, e.key()).is_some();
                    if disagree && !declared {
                        e.insert(None);
                    }
                }
            }
        }
        let tenants = tiers
            .into_iter()
            .map(|(tenant, tier)| {
                let caller = tier.map(|t| KeyInfo::tenant_only(&tenant, t));
                (tenant, caller)
            })
            .collect();
        Self {
            runtime,
            dynamic,
            keys,
            tenants,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::Factor;
    use crate::admission::{Applied, Skip, Tables};
    use crate::config;
    use crate::limiter::Scope;

    const CONFIG: &str = r#"
[tiers.free]
key = { per_minute = 5 }
tenant = { per_hour = 100 }
[tiers.pro]
key = { per_minute = 50 }
tenant = { per_hour = 1000 }
[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:9000"]
[[keys]]
id = "k_acme"
key = "acme-key"
tenant = "acme"
tier = "free"
[[keys]]
id = "k_mixed_free"
key = "mixed-key-1"
tenant = "mixed"
tier = "free"
[[keys]]
id = "k_mixed_pro"
key = "mixed-key-2"
tenant = "mixed"
tier = "pro"
[[keys]]
id = "k_declared"
key = "declared-key"
tenant = "declared"
tier = "free"
[[tenants]]
id = "declared"
tier = "pro"
[[tenants]]
id = "keyless"
tier = "pro"
"#;

    fn index() -> Index {
        let runtime = Runtime::from_config(config::parse("x.toml", CONFIG).unwrap()).unwrap();
        Index::build(Arc::new(runtime), Arc::new(Dynamic::default()))
    }

    fn tier_of(i: &Index, tenant: &str) -> Option<String> {
        let caller = i.tenants.get(tenant)?.as_ref()?;
        Some(caller.tenant_tier.name.clone())
    }

    /// Keys are found by id; nothing else is.
    #[test]
    fn finds_keys_by_id() {
        let i = index();
        assert_eq!(i.keys["k_acme"].tenant_id(), Some("acme"));
        assert!(!i.keys.contains_key("acme-key"));
    }

    /// A tenant's tier: its declared tier, else the one its keys share; keys in
    /// different tiers leave it without one; unknown tenants are absent.
    #[test]
    fn resolves_tenant_tiers() {
        let i = index();
        assert_eq!(tier_of(&i, "acme").as_deref(), Some("free"));
        assert_eq!(tier_of(&i, "declared").as_deref(), Some("pro"));
        assert_eq!(tier_of(&i, "keyless").as_deref(), Some("pro"));
        assert!(matches!(i.tenants.get("mixed"), Some(None)));
        assert!(!i.tenants.contains_key("nobody"));
    }

    /// A tenant-only caller is checked on the tenant scope alone, under its tenant's name.
    #[test]
    fn tenant_caller_has_no_key_scope() {
        let i = index();
        let caller = i.tenants["acme"].clone().unwrap();
        assert!(caller.key_id.is_empty());
        let rt = i.runtime.clone();
        let who = crate::admission::Who::of("10.0.0.1".parse().unwrap(), Some(&caller));
        let applied = Applied::of(&rt, who, Skip::default(), Factor::ONE);
        let tables = Tables {
            rt: &rt,
            key: Some(&caller),
            route: None,
        };
        let check = applied.check(tables, 1);
        let scopes: Vec<Scope> = check.scopes.iter().map(|s| s.scope).collect();
        assert_eq!(scopes, [Scope::Tenant]);
        assert_eq!(check.scopes[0].limits.windows.len(), 1);
    }
}
