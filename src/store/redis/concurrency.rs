//! Concurrency slots on Redis: fleet-wide in-flight counts (`lua/concurrency.lua`).
//!
//! Each identity with `concurrent` has a sorted set `<prefix>:{<scope>:<id>}:conc` (the
//! identity's hash tag, so on Cluster it lives with its rate windows) holding one member
//! per request in flight, scored by when the entry expires. Taking slots is one script
//! call on a single node or behind Sentinel (all sets at once, all-or-nothing); on
//! Cluster one call per set, in scope order, and the sets taken before a full one are
//! given back. This gateway renews the entries of its requests every third of
//! `concurrency_lease_secs` (`renew`, a background task), so a gateway that dies
//! (SIGKILL) stops renewing and its slots free themselves within that time.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use redis::Script;

use super::{unavailable, wire, Conn, RedisStore};
use crate::limiter::{Ident, Scope};
use crate::store::slots::{next_lease_id, Acquired, Full, Origin, SlotLease, SlotRequest};
use crate::store::StoreError;

/// The script (see its header for the wire format).
pub const CONCURRENCY_LUA: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/concurrency.lua"));

/// Default `[store] concurrency_lease_secs`.
pub const DEFAULT_LEASE_MS: u64 = 30_000;

/// This gateway's slots on Redis.
pub(super) struct RemoteSlots {
    script: Script,
    lease_ms: u64,
    /// Makes members unique across the fleet: `<this>:<lease id>`.
    this: String,
    /// Requests in flight: lease id -> the sets holding its member.
    held: Mutex<HashMap<u64, Vec<String>>>,
}

impl RemoteSlots {
    pub(super) fn new(lease_ms: u64) -> Self {
        // A random 64-bit tag (std's per-process hash seed) beside the pid: unique
        // across a fleet and across restarts of one gateway.
        let tag = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        Self {
            script: Script::new(CONCURRENCY_LUA),
            lease_ms: lease_ms.max(1),
            this: format!("{:x}-{tag:x}", std::process::id()),
            held: Mutex::new(HashMap::new()),
        }
    }

    fn member(&self, id: u64) -> String {
        format!("{}:{id}", self.this)
    }

    /// How often entries are renewed.
    pub(super) fn renew_every_ms(&self) -> u64 {
        (self.lease_ms / 3).max(1)
    }
}

/// The set of one identity.
pub fn key(prefix: &str, scope: Scope, ident: &Ident) -> String {
    wire::identity_key(prefix, scope, ident, "conc")
}

// === impl RedisStore ===

impl RedisStore {
    /// One call of the concurrency script within the deadline; its reply's integers.
    async fn slots_call(
        &self,
        conn: &mut Conn,
        keys: &[String],
        args: &[String],
    ) -> Result<[i64; 3], StoreError> {
        let slots = &self.slots;
        let mut inv = slots.script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        self.count_call();
        let raw = tokio::time::timeout(self.timeout, super::eval(conn, &inv))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))?
            .map_err(unavailable)?;
        let v = wire::ints(&raw)?;
        match v[..] {
            [a, b, c] => Ok([a, b, c]),
            _ => Err(StoreError::Unavailable(
                "concurrency script: unexpected reply".into(),
            )),
        }
    }

    fn slots_args(&self, mode: &str, member: &str, limits: &[u32]) -> Vec<String> {
        let mut args = vec![
            mode.to_string(),
            self.now_arg(),
            self.slots.lease_ms.to_string(),
            member.to_string(),
        ];
        args.extend(limits.iter().map(u32::to_string));
        args
    }

    /// Takes one slot per request, fleet-wide (see the module docs).
    pub(super) async fn acquire_slots(&self, reqs: &[SlotRequest]) -> Result<Acquired, StoreError> {
        let mut conn = tokio::time::timeout(self.timeout, self.conn())
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))??;
        let id = next_lease_id();
        let member = self.slots.member(id);
        let keys: Vec<String> = reqs
            .iter()
            .map(|r| key(&self.prefix, r.scope, &r.ident))
            .collect();
        let full = |i: i64, current: i64| {
            let r = usize::try_from(i - 1).ok().and_then(|i| reqs.get(i));
            r.map(|r| Full {
                scope: r.scope,
                limit: r.limit,
                current: u64::try_from(current).unwrap_or(0),
            })
        };
        if !matches!(conn, Conn::Cluster(_)) || keys.len() == 1 {
            let limits: Vec<u32> = reqs.iter().map(|r| r.limit).collect();
            let args = self.slots_args("acquire", &member, &limits);
            let [ok, i, current] = self.slots_call(&mut conn, &keys, &args).await?;
            if ok == 0 {
                return full(i, current).map(Err).ok_or_else(bad_reply);
            }
        } else {
            for (n, (k, r)) in keys.iter().zip(reqs).enumerate() {
                let args = self.slots_args("acquire", &member, &[r.limit]);
                let result = self
                    .slots_call(&mut conn, std::slice::from_ref(k), &args)
                    .await;
                match result {
                    Ok([1, _, _]) => {}
                    other => {
                        self.release_remote(conn, keys[..n].to_vec(), member);
                        let [_, _, current] = other?;
                        return Ok(Err(Full {
                            scope: r.scope,
                            limit: r.limit,
                            current: u64::try_from(current).unwrap_or(0),
                        }));
                    }
                }
            }
        }
        self.slots
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, keys);
        Ok(Ok(SlotLease {
            id,
            entries: reqs.iter().map(|r| (r.scope, r.ident.clone())).collect(),
            origin: Origin::Remote,
        }))
    }

    /// Gives a request's slots back (in the background: the response does not wait).
    pub(super) fn release_slots(&self, lease: &SlotLease) {
        let keys = self
            .slots
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&lease.id);
        let Some(keys) = keys else { return };
        let Some(conn) = self.conn.load_full() else {
            return; // never connected since: the entries expire by themselves
        };
        self.release_remote((*conn).clone(), keys, self.slots.member(lease.id));
    }

    fn release_remote(&self, conn: Conn, keys: Vec<String>, member: String) {
        if keys.is_empty() {
            return;
        }
        let args = self.slots_args("release", &member, &[]);
        let per_key = matches!(conn, Conn::Cluster(_));
        let script = self.slots.script.clone();
        let timeout = self.timeout;
        if let Some(m) = &self.metrics {
            m.store_calls
                .inc_by(if per_key { keys.len() as u64 } else { 1 });
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime (a request state dropped at exit): the entries expire
        };
        runtime.spawn(async move {
            let mut conn = conn;
            let groups: Vec<&[String]> = if per_key {
                keys.chunks(1).collect()
            } else {
                vec![&keys[..]]
            };
            for g in groups {
                let mut inv = script.prepare_invoke();
                for k in g {
                    inv.key(k);
                }
                for a in &args {
                    inv.arg(a);
                }
                let done = tokio::time::timeout(timeout, super::eval(&mut conn, &inv)).await;
                if !matches!(done, Ok(Ok(_))) {
                    // The entry expires within concurrency_lease_secs all the same.
                    tracing::debug!("releasing a concurrency slot did not complete");
                }
            }
        });
    }

    /// Pushes the expiry of every entry this gateway holds (run every `renew_every`).
    pub async fn renew_slots(&self) {
        let pairs: Vec<(String, String)> = {
            let held = self
                .slots
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            held.iter()
                .flat_map(|(id, keys)| {
                    let m = self.slots.member(*id);
                    keys.iter().map(move |k| (k.clone(), m.clone()))
                })
                .collect()
        };
        if pairs.is_empty() {
            return;
        }
        let Ok(Ok(mut conn)) = tokio::time::timeout(self.timeout, self.conn()).await else {
            return;
        };
        let chunk = if matches!(conn, Conn::Cluster(_)) {
            1
        } else {
            256
        };
        for group in pairs.chunks(chunk) {
            let keys: Vec<String> = group.iter().map(|(k, _)| k.clone()).collect();
            let mut args = self.slots_args("renew", "", &[]);
            args.extend(group.iter().map(|(_, m)| m.clone()));
            if let Err(e) = self.slots_call(&mut conn, &keys, &args).await {
                tracing::debug!(error = %e, "renewing concurrency slots did not complete");
                return;
            }
        }
    }

    /// How often `renew_slots` must run.
    pub fn renew_every(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.slots.renew_every_ms())
    }
}

fn bad_reply() -> StoreError {
    StoreError::Unavailable("concurrency script: unexpected reply".into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn set_names_carry_the_identity_tag() {
        let ip = Ident::Ip("203.0.113.7".parse().unwrap());
        assert_eq!(key("thr", Scope::Ip, &ip), "thr:{ip:203.0.113.7}:conc");
        let t = Ident::Name(Arc::from("acme"));
        assert_eq!(key("thr", Scope::Tenant, &t), "thr:{tenant:acme}:conc");
    }
}
