//! Automatic bans shared by a fleet.
//!
//! - Rejections are counted per identity in `<prefix>:{<scope>:<id>}:strikes` (INCRBY with
//!   the span as its expiry). A gateway adds its rejections in batches, at most one call
//!   per identity per rejection's `retry_after` (see `Bans::strike_shared`).
//! - The bans in force are one hash, `<prefix>:{bans}`: field `<scope>|<value>`, value
//!   `<expires_at_ms>|<reason>`. Beside it, on the same slot (hash tag `{bans}`):
//!   `<prefix>:{bans}:expiry` (a sorted set of the fields by end, so ended bans are
//!   removed without a scan), `<prefix>:{bans}:log` (a hash: `epoch`, a random id made
//!   with the log; `seq`, the last change's number; `floor`, the newest change trimmed
//!   away) and `<prefix>:{bans}:changes` (a sorted set of the fields by the number of
//!   their last change, at most [`MAX_CHANGES`]) and `<prefix>:{bans}:checks` (a sorted
//!   set, by end, of the fields whose ban a decision API struck: at most
//!   [`MAX_CHECK_BANS`], half the table, so they never crowd out bans of proxied abuse).
//! - Every publish and lift takes the next `seq` in the same script as its HSET / HDEL.
//!   The ban sync asks, in one script call, for the fields changed after the last `seq`
//!   it applied, with their values (none: lifted). It reads the whole hash only on its
//!   first sync, after the log was made anew (another epoch: Redis restarted or was
//!   flushed) or when it fell behind what the log still holds (`seq <= floor`). A sync
//!   with nothing changed transfers the epoch and two numbers.
//! - Ended bans are not logged (every gateway drops them by time); each sync removes up
//!   to [`PRUNE`] of them from Redis, cheaply, by the expiry set.
//!
//! The request path never asks Redis about a ban.

use std::sync::LazyLock;

use async_trait::async_trait;
use redis::{FromRedisValue, Script, ScriptInvocation};

use super::{unavailable, wire, Conn, RedisStore};
use crate::bans::{parse_ident, Ban, BanSource, MAX_BANS, MAX_CHECK_BANS};
use crate::limiter::{Ident, Scope};
pub use crate::store::bans::{BanCursor, BanRead, Published};
use crate::store::{BanStore, StoreError};

/// Most changes the log holds: a gateway further behind than this reads the whole hash.
pub const MAX_CHANGES: usize = 10_000;
/// Most ended bans a sync (or a publish at the cap) removes from Redis.
pub const PRUNE: usize = 1_000;

/// INCRBY, and the span's expiry when the count is new.
static STRIKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local n = redis.call('INCRBY', KEYS[1], ARGV[2])
if n == tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n",
    )
});

/// What the ban scripts share. KEYS: the hash, the log, the changes, the expiry set, the
/// decision APIs' bans.
/// `open` returns the log (made anew with epoch `e` when missing); `logged` numbers a
/// change of `field` and trims the changes to `max`; `prune` removes ended bans.
const BAN_LIB: &str = "
local function open(e)
  local m = redis.call('HMGET', KEYS[2], 'epoch', 'seq', 'floor')
  if not m[1] then
    redis.call('DEL', KEYS[3])
    redis.call('HSET', KEYS[2], 'epoch', e, 'seq', 0, 'floor', 0)
    return e, 0, 0
  end
  return m[1], tonumber(m[2]) or 0, tonumber(m[3]) or 0
end
local function logged(field, max, e)
  open(e)
  local seq = redis.call('HINCRBY', KEYS[2], 'seq', 1)
  redis.call('ZADD', KEYS[3], seq, field)
  local excess = redis.call('ZCARD', KEYS[3]) - max
  if excess > 0 then
    local last = redis.call('ZRANGE', KEYS[3], excess - 1, excess - 1, 'WITHSCORES')
    redis.call('HSET', KEYS[2], 'floor', last[2])
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, excess - 1)
  end
end
local function prune(now, limit)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, limit)
  for _, f in ipairs(dead) do
    redis.call('HDEL', KEYS[1], f)
    redis.call('ZREM', KEYS[4], f)
    redis.call('ZREM', KEYS[5], f)
  end
end
local function ends(v)
  return tonumber(string.match(v, '^(%d+)|'))
end
";

/// ARGV: max changes, epoch, field, value, ends (ms), max bans, now (ms), prune, `1` when
/// a decision API struck it, max such bans.
/// `{1, ''}`: set. `{0, ''}`: refused, the hash is full of bans in force (none is dropped
/// for another). `{3, ''}`: refused, a decision API's and they hold their maximum.
/// `{2, value}`: a ban on the field is in force already (a gateway the first ban has not
/// reached yet struck too): kept, not renewed.
static PUBLISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{BAN_LIB}
local cur = redis.call('HGET', KEYS[1], ARGV[3])
if cur then
  local e = ends(cur)
  if e and e > tonumber(ARGV[7]) then return {{2, cur}} end
elseif redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[6]) then
  prune(ARGV[7], tonumber(ARGV[8]))
  if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[6]) then return {{0, ''}} end
end
if ARGV[9] == '1' then
  if not redis.call('ZSCORE', KEYS[5], ARGV[3])
     and redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[10]) then
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[7])
    if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[10]) then return {{3, ''}} end
  end
  redis.call('ZADD', KEYS[5], ARGV[5], ARGV[3])
else
  redis.call('ZREM', KEYS[5], ARGV[3])
end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[3])
logged(ARGV[3], tonumber(ARGV[1]), ARGV[2])
return {{1, ''}}"
    ))
});

/// ARGV: max changes, epoch, field. The number of fields removed (0 or 1).
static LIFT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{BAN_LIB}
local n = redis.call('HDEL', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('ZREM', KEYS[5], ARGV[3])
logged(ARGV[3], tonumber(ARGV[1]), ARGV[2])
return n"
    ))
});

/// ARGV: epoch (to make the log with), the epoch and seq the gateway applied last, now
/// (ms), prune. `{epoch, seq, 1, {field, value, ...}}`: the whole hash (bans in force;
/// ended or unreadable fields are removed on the way). `{epoch, seq, 0, {field, value or
/// '', ...}}`: the fields changed since, with their values now ('': lifted).
static SYNC: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{BAN_LIB}
prune(ARGV[4], tonumber(ARGV[5]))
local epoch, seq, floor = open(ARGV[1])
local since = tonumber(ARGV[3])
if epoch ~= ARGV[2] or not since or since > seq or since < floor then
  local all = redis.call('HGETALL', KEYS[1])
  local live = {{}}
  for i = 1, #all, 2 do
    local e = ends(all[i + 1])
    if e and e > tonumber(ARGV[4]) then
      live[#live + 1] = all[i]
      live[#live + 1] = all[i + 1]
    else
      redis.call('HDEL', KEYS[1], all[i])
      redis.call('ZREM', KEYS[4], all[i])
      redis.call('ZREM', KEYS[5], all[i])
    end
  end
  return {{epoch, seq, 1, live}}
end
local out = {{}}
if since < seq then
  local fields = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[3], '+inf')
  for i, f in ipairs(fields) do
    out[2 * i - 1] = f
    out[2 * i] = redis.call('HGET', KEYS[1], f) or ''
  end
end
return {{epoch, seq, 0, out}}"
    ))
});

/// The strike count of a banned identity until its ban ends: so far below zero that no
/// gateway's INCRBY reaches `after` meanwhile; when the key expires with the ban, the next
/// rejection starts a new span.
const QUIET: i64 = -(1 << 62);

impl RedisStore {
    fn bans_key(&self) -> String {
        format!("{}:{{bans}}", self.prefix)
    }

    /// An invocation of `script` on the hash, the log, the changes, the expiry set and
    /// the decision APIs' bans (one slot: `{bans}`), in that order.
    fn on_bans<'a>(&self, script: &'a Script) -> ScriptInvocation<'a> {
        let hash = self.bans_key();
        let mut inv = script.prepare_invoke();
        inv.key(&hash)
            .key(format!("{hash}:log"))
            .key(format!("{hash}:changes"))
            .key(format!("{hash}:expiry"))
            .key(format!("{hash}:checks"));
        inv
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

    /// Publishes `ban` (struck by `source`) to the fleet at `now_ms`, unless the identity
    /// is banned already, the fleet's table holds `MAX_BANS` bans in force, or `source` is
    /// a decision API and it holds `MAX_CHECK_BANS` of theirs (no ban is dropped for
    /// another; ended ones make room).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn publish_ban(
        &self,
        ban: &Ban,
        now_ms: u64,
        source: BanSource,
    ) -> Result<Published, StoreError> {
        let field = field(ban);
        let mut inv = self.on_bans(&PUBLISH);
        inv.arg(MAX_CHANGES)
            .arg(new_epoch())
            .arg(&field)
            .arg(format!("{}|{}", ban.expires_at_ms, ban.reason))
            .arg(ban.expires_at_ms)
            .arg(MAX_BANS)
            .arg(now_ms)
            .arg(PRUNE)
            .arg(u8::from(source == BanSource::Check))
            .arg(MAX_CHECK_BANS);
        let (code, value): (i64, String) = self.script(&inv).await?;
        Ok(match code {
            1 => Published::Set,
            0 => Published::Full,
            3 => Published::ChecksFull,
            _ => Published::InForce(parse(&field, &value).map_or_else(|| ban.clone(), |(_, b)| b)),
        })
    }

    /// Lifts `ban` fleet-wide; the identity's rejections are then counted afresh.
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn lift_ban(&self, ban: &Ban) -> Result<(), StoreError> {
        let mut inv = self.on_bans(&LIFT);
        inv.arg(MAX_CHANGES).arg(new_epoch()).arg(field(ban));
        self.script::<i64>(&inv).await?;
        if let Some(ident) = parse_ident(ban.scope, &ban.value) {
            let key = wire::identity_key(&self.prefix, ban.scope, &ident, "strikes");
            let mut cmd = redis::cmd("DEL");
            cmd.arg(key);
            self.command::<i64>(&cmd).await?;
        }
        Ok(())
    }

    /// What changed in the fleet's bans since `cursor`, which then names this read (left
    /// as it was on an error): one script call. The whole table on the first sync, when
    /// the log was made anew (Redis restarted or flushed) or when `cursor` is further
    /// behind than the log holds; else the changed fields alone (nothing when nothing
    /// changed). Ended bans are removed from Redis on the way, a bounded number each time.
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn sync_bans(
        &self,
        cursor: &mut BanCursor,
        now_ms: u64,
    ) -> Result<BanRead, StoreError> {
        let mut inv = self.on_bans(&SYNC);
        inv.arg(new_epoch())
            .arg(&cursor.epoch)
            .arg(cursor.seq)
            .arg(now_ms)
            .arg(PRUNE);
        let (epoch, seq, full, flat): (String, i64, i64, Vec<String>) = self.script(&inv).await?;
        let pairs = flat.chunks_exact(2).map(|p| (&p[0], &p[1]));
        let read = if full == 1 {
            BanRead::Full(
                pairs
                    .filter_map(|(f, v)| parse(f, v))
                    .filter(|(_, b)| b.expires_at_ms > now_ms)
                    .collect(),
            )
        } else {
            let mut set = Vec::new();
            let mut lifted = Vec::new();
            for (f, v) in pairs {
                if v.is_empty() {
                    lifted.extend(parse_field(f).map(|(scope, _, ident)| (scope, ident)));
                } else if let Some(entry) = parse(f, v) {
                    set.push(entry);
                }
            }
            BanRead::Changes { set, lifted }
        };
        *cursor = BanCursor { epoch, seq };
        Ok(read)
    }
}

#[async_trait]
impl BanStore for RedisStore {
    async fn strike(
        &self,
        scope: Scope,
        ident: &Ident,
        n: u32,
        within_ms: u64,
    ) -> Result<i64, StoreError> {
        RedisStore::strike(self, scope, ident, n, within_ms).await
    }

    async fn quiet_strikes(
        &self,
        scope: Scope,
        ident: &Ident,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        RedisStore::quiet_strikes(self, scope, ident, until_ms, now_ms).await
    }

    async fn publish_ban(
        &self,
        ban: &Ban,
        now_ms: u64,
        source: BanSource,
    ) -> Result<Published, StoreError> {
        RedisStore::publish_ban(self, ban, now_ms, source).await
    }

    async fn lift_ban(&self, ban: &Ban) -> Result<(), StoreError> {
        RedisStore::lift_ban(self, ban).await
    }

    async fn sync_bans(&self, cursor: &mut BanCursor, now_ms: u64) -> Result<BanRead, StoreError> {
        RedisStore::sync_bans(self, cursor, now_ms).await
    }
}

/// A fresh epoch, for a log made anew.
fn new_epoch() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn field(ban: &Ban) -> String {
    format!("{}|{}", ban.scope.as_str(), ban.value)
}

/// A hash field back into its scope, value and identity.
fn parse_field(field: &str) -> Option<(Scope, &str, Ident)> {
    let (scope, who) = field.split_once('|')?;
    let scope = Scope::parse(scope)?;
    let ident = parse_ident(scope, who)?;
    Some((scope, who, ident))
}

/// A hash entry back into a ban.
fn parse(field: &str, value: &str) -> Option<(Ident, Ban)> {
    let (scope, who, ident) = parse_field(field)?;
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
