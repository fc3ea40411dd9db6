//! Tokens verified before: a repeat token skips the signature check (RSA-2048 costs tens
//! of microseconds a verification; a hit costs a hash and a shard lookup).
//!
//! Keyed by SipHash-1-3/128 of the whole token under a secret drawn per cache, as
//! `identity`'s key cache is: a match stands for the token itself (a collision needs ~2^64
//! guesses without the secret) and no token is held. An entry serves until the token's
//! `exp` (never past it: from then on the token is verified again, leeway included), and
//! the cache lives inside one key-set snapshot, so a rotation or a reload starts empty.
//! Only successes get in: a failure costs the attacker a signature check of their own.
//!
//! Bound: `CACHE_CAPACITY` entries in 16 shards (`crate::sharded`). A full shard first
//! drops its expired entries; if it is still over three quarters full it is emptied, so a
//! full cache costs one scan per quarter-shard of inserts, never one per insert.

use std::collections::HashMap;
use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};

use super::Caller;
use crate::sharded::Sharded;

/// Most tokens remembered per key set.
pub const CACHE_CAPACITY: usize = 65_536;

const SHARDS: usize = 16;
const PER_SHARD: usize = CACHE_CAPACITY / SHARDS;

/// Verified tokens by keyed hash; a tag, already a keyed hash, picks its shard as it is.
pub(super) struct TokenCache {
    secret: (u64, u64),
    shards: Sharded<HashMap<u128, Caller>>,
}

// === impl TokenCache ===

impl Default for TokenCache {
    fn default() -> Self {
        Self {
            secret: (rand::random(), rand::random()),
            shards: Sharded::new(SHARDS),
        }
    }
}

impl TokenCache {
    /// The cache key of `token`.
    pub(super) fn tag(&self, token: &[u8]) -> u128 {
        let mut h = SipHasher13::new_with_keys(self.secret.0, self.secret.1);
        h.write(token);
        h.finish128().as_u128()
    }

    /// The caller of the token with `tag`, while `now_secs` is before its `exp`.
    pub(super) fn get(&self, tag: u128, now_secs: u64) -> Option<Caller> {
        let shard = self.shards.lock(tag as usize);
        let caller = shard.get(&tag)?;
        (now_secs < caller.expires_at).then(|| caller.clone())
    }

    /// Remembers a verified token (one already at its `exp` is not worth a slot).
    pub(super) fn put(&self, tag: u128, caller: &Caller, now_secs: u64) {
        if now_secs >= caller.expires_at {
            return;
        }
        let mut shard = self.shards.lock(tag as usize);
        if shard.len() >= PER_SHARD && !shard.contains_key(&tag) {
            shard.retain(|_, c| now_secs < c.expires_at);
            if shard.len() > PER_SHARD / 4 * 3 {
                shard.clear();
            }
        }
        shard.insert(tag, caller.clone());
    }

    /// Entries held (expired ones included until they are dropped).
    pub(super) fn len(&self) -> usize {
        self.shards.iter_locked().map(|s| s.len()).sum()
    }
}
