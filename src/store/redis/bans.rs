//! Automatic bans shared by a fleet: rejections counted per identity
//! (`<prefix>:{<scope>:<id>}:strikes`, INCRBY with the span as its expiry; a gateway adds
//! its rejections in batches, at most one call per identity per rejection's
//! `retry_after`, see `Bans::strike_shared`) and the bans in force in one hash, `<prefix>:{bans}`: field `<scope>|<value>`, value
//! `<expires_at_ms>|<reason>`. Every gateway reads the hash each second (the ban sync)
//! and drops expired fields; the request path never asks Redis about a ban.

use std::sync::LazyLock;

use redis::{FromRedisValue, Script, ScriptInvocation};

use super::{unavailable, wire, Conn, RedisStore};
use crate::bans::{parse_ident, Ban, MAX_BANS};
use crate::limiter::{Ident, Scope};
use crate::store::StoreError;

/// INCRBY, and the span's expiry when the count is new.
static STRIKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local n = redis.call('INCRBY', KEYS[1], ARGV[2])
if n == tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n",
    )
});

/// ARGV: field, value, max bans, now (ms). `{1, ''}`: set. `{0, ''}`: refused, the hash
/// is full (`ARGV[3]` fields) and the field is new (no ban is dropped for another).
/// `{2, value}`: a ban on the field is in force already (a gateway the first ban has not
/// reached yet struck too): kept, not renewed.
static PUBLISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local e = tonumber(string.match(cur, '^(%d+)|'))
  if e and e > tonumber(ARGV[4]) then return {2, cur} end
elseif redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return {0, ''} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {1, ''}",
    )
});

/// The strike count of a banned identity until its ban ends: so far below zero that no
/// gateway's INCR reaches `after` meanwhile; when the key expires with the ban, the next
/// rejection starts a new span at 1.
const QUIET: i64 = -(1 << 62);

/// What publishing a ban did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// It is the fleet's ban.
    Set,
    /// Refused: the fleet's table holds `MAX_BANS` bans in force, none on this identity.
    Full,
    /// The identity is banned already (that ban is kept).
    InForce(Ban),
}

impl RedisStore {
    fn bans_key(&self) -> String {
        format!("{}:{{bans}}", self.prefix)
    }

    async fn command<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let timeout_ms = self.timeout.as_millis() as u64;
        let call = async {
            let mut conn = self.conn().await?;
            let r: redis::RedisResult<T> = match &mut conn {
                Conn::Single(c) => cmd.query_async(c).await,
                Conn::Cluster(c) => cmd.query_async(c).await,
                Conn::Sentinel(c) => cmd.query_async(c).await,
            };
            r.map_err(unavailable)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(timeout_ms))?
    }

    /// `inv` (EVALSHA, loading the script when Redis does not have it) within the
    /// deadline.
    async fn script<T: FromRedisValue>(&self, inv: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        let timeout_ms = self.timeout.as_millis() as u64;
        let call = async {
            let mut conn = self.conn().await?;
            let r: redis::RedisResult<T> = match &mut conn {
                Conn::Single(c) => inv.invoke_async(c).await,
                Conn::Cluster(c) => inv.invoke_async(c).await,
                Conn::Sentinel(c) => inv.invoke_async(c).await,
            };
            r.map_err(unavailable)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(timeout_ms))?
    }

    /// Adds `n` rejections of `ident` by `scope` to the fleet's count in the current span
    /// of `within_ms` (which starts with the first of them); the count after it. Far
    /// below zero while the identity is banned (see `quiet_strikes`).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn strike(
        &self,
        scope: Scope,
        ident: &Ident,
        n: u32,
        within_ms: u64,
    ) -> Result<i64, StoreError> {
        let key = wire::identity_key(&self.prefix, scope, ident, "strikes");
        let mut inv = STRIKE.prepare_invoke();
        inv.key(key).arg(within_ms).arg(n);
        self.script(&inv).await
    }

    /// Keeps the strike count of `ident` in `scope` quiet until `until_ms` (its ban's
    /// end): rejections meanwhile (gateways the ban has not reached yet) count for
    /// nothing, and the first one after the ban starts a new span.
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn quiet_strikes(
        &self,
        scope: Scope,
        ident: &Ident,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let key = wire::identity_key(&self.prefix, scope, ident, "strikes");
        let mut cmd = redis::cmd("SET");
        cmd.arg(key)
            .arg(QUIET)
            .arg("PX")
            .arg(until_ms.saturating_sub(now_ms).max(1));
        self.command::<()>(&cmd).await
    }

    /// Publishes `ban` to the fleet at `now_ms`, unless the identity is banned already
    /// or the fleet's table holds `MAX_BANS` bans and none of them is on `ban`'s identity
    /// (refused: no ban is dropped for another).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn publish_ban(&self, ban: &Ban, now_ms: u64) -> Result<Published, StoreError> {
        let field = field(ban);
        let mut inv = PUBLISH.prepare_invoke();
        inv.key(self.bans_key())
            .arg(&field)
            .arg(format!("{}|{}", ban.expires_at_ms, ban.reason))
            .arg(MAX_BANS)
            .arg(now_ms);
        let (code, value): (i64, String) = self.script(&inv).await?;
        Ok(match code {
            1 => Published::Set,
            0 => Published::Full,
            _ => Published::InForce(parse(&field, &value).map_or_else(|| ban.clone(), |(_, b)| b)),
        })
    }

    /// Lifts `ban` fleet-wide; the identity's rejections are then counted afresh.
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn lift_ban(&self, ban: &Ban) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(self.bans_key()).arg(field(ban));
        self.command::<i64>(&cmd).await?;
        if let Some(ident) = parse_ident(ban.scope, &ban.value) {
            let key = wire::identity_key(&self.prefix, ban.scope, &ident, "strikes");
            let mut cmd = redis::cmd("DEL");
            cmd.arg(key);
            self.command::<i64>(&cmd).await?;
        }
        Ok(())
    }

    /// The fleet's bans in force at `now_ms`; expired (and unreadable) fields are
    /// removed on the way.
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn bans(&self, now_ms: u64) -> Result<Vec<(Ident, Ban)>, StoreError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.bans_key());
        let all: Vec<(String, String)> = self.command(&cmd).await?;
        let mut live = Vec::with_capacity(all.len());
        let mut dead = Vec::new();
        for (f, v) in all {
            match parse(&f, &v).filter(|(_, b)| b.expires_at_ms > now_ms) {
                Some(entry) => live.push(entry),
                None => dead.push(f),
            }
        }
        if !dead.is_empty() {
            let mut cmd = redis::cmd("HDEL");
            cmd.arg(self.bans_key()).arg(dead);
            // Best effort: the next sync tries again.
            let _ = self.command::<i64>(&cmd).await;
        }
        Ok(live)
    }
}

fn field(ban: &Ban) -> String {
    format!("{}|{}", ban.scope.as_str(), ban.value)
}

/// A hash entry back into a ban.
fn parse(field: &str, value: &str) -> Option<(Ident, Ban)> {
    let (scope, who) = field.split_once('|')?;
    let scope = Scope::ALL.into_iter().find(|s| s.as_str() == scope)?;
    let ident = parse_ident(scope, who)?;
    let (expires, reason) = value.split_once('|')?;
    let ban = Ban {
        scope,
        value: who.to_string(),
        reason: reason.to_string(),
        expires_at_ms: expires.parse().ok()?,
    };
    Some((ident, ban))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields and values round-trip; garbage is refused.
    #[test]
    fn entries_round_trip() {
        let ident = Ident::client("2001:db8:1:2::9".parse().unwrap(), 64);
        let ban = Ban {
            scope: Scope::Ip,
            value: ident.to_string(),
            reason: "automatic: 3 rate-limit rejections in 10s".into(),
            expires_at_ms: 1_800_000_000_000,
        };
        let v = format!("{}|{}", ban.expires_at_ms, ban.reason);
        assert_eq!(parse(&field(&ban), &v), Some((ident, ban)));
        for (f, v) in [
            ("ip|x", "1|r"),
            ("nope|1.2.3.4", "1|r"),
            ("ip|1.2.3.4", "x|r"),
            ("ip", "1|r"),
        ] {
            assert_eq!(parse(f, v), None, "{f} {v}");
        }
    }
}
