//! Automatic bans shared by a fleet: rejections counted per identity
//! (`<prefix>:{<scope>:<id>}:strikes`, INCR with the span as its expiry) and the bans in
//! force in one hash, `<prefix>:{bans}`: field `<scope>|<value>`, value
//! `<expires_at_ms>|<reason>`. Every gateway reads the hash each second (the ban sync)
//! and drops expired fields; the request path never asks Redis about a ban.

use redis::FromRedisValue;

use super::{unavailable, wire, Conn, RedisStore};
use crate::bans::{parse_ident, Ban, MAX_BANS};
use crate::limiter::{Ident, Scope};
use crate::store::StoreError;

/// INCR, and the span's expiry on the first rejection.
const STRIKE_LUA: &str = "local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n";

/// HSET unless the hash is full (`ARGV[3]` fields) and the field is new: 1 when set, 0
/// when refused. A full hash of bans in force refuses; it never drops one for another.
const PUBLISH_LUA: &str = "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
  and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1";

/// The strike count of a banned identity until its ban ends: so far below zero that no
/// gateway's INCR reaches `after` meanwhile; when the key expires with the ban, the next
/// rejection starts a new span at 1.
const QUIET: i64 = -(1 << 62);

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

    /// Counts a rejection of `ident` by `scope`: the fleet's count in the current span
    /// of `within_ms` (which starts at the first rejection).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn strike(
        &self,
        scope: Scope,
        ident: &Ident,
        within_ms: u64,
    ) -> Result<i64, StoreError> {
        let key = wire::identity_key(&self.prefix, scope, ident, "strikes");
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(STRIKE_LUA).arg(1).arg(key).arg(within_ms);
        self.command(&cmd).await
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

    /// Publishes `ban` to the fleet: false when the fleet's table holds `MAX_BANS` bans
    /// and none of them is on `ban`'s identity (refused: no ban is dropped for another).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn publish_ban(&self, ban: &Ban) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(PUBLISH_LUA)
            .arg(1)
            .arg(self.bans_key())
            .arg(field(ban))
            .arg(format!("{}|{}", ban.expires_at_ms, ban.reason))
            .arg(MAX_BANS);
        self.command::<i64>(&cmd).await.map(|n| n == 1)
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
