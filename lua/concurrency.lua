-- concurrency.lua: in-flight slots (`concurrent = N`), one sorted set per identity whose
-- members are the requests in flight, scored by when their entry expires. A gateway
-- renews its entries while their requests run; the entries of a gateway that died expire
-- by themselves (`[store] concurrency_lease_secs`), so its slots free themselves.
--
-- KEYS[i]   the set of identity i, e.g. thr:{tenant:acme}:conc (the identity's hash tag:
--           on Redis Cluster the caller sends one key per call).
-- ARGV[1]   'acquire': one slot in every set, all-or-nothing; 'release': remove the
--           member from every set; 'renew': push the expiry of each member (ARGV[4 + i]
--           is the member of KEYS[i]).
-- ARGV[2]   now in Unix ms, or '' for the server clock (only tests pass a time).
-- ARGV[3]   lease_ms: how long an entry lives without renewal.
-- ARGV[4]   acquire/release: the member (unique per request in the fleet).
-- ARGV[4+i] acquire: the limit N of KEYS[i].
-- Reply: "1 0 0" when done; acquire refused: "0 i current" (current: in flight in set i
-- including this request). Nothing is written when a set is full.

local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local lease = tonumber(ARGV[3])
local mode = ARGV[1]
local function fmt(n) return string.format('%d', n) end
local function extend(key)
  if redis.call('PTTL', key) < lease then redis.call('PEXPIRE', key, lease) end
end

if mode == 'acquire' then
  for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    local n = redis.call('ZCARD', KEYS[i]) + 1
    if n > tonumber(ARGV[4 + i]) then
      return '0 ' .. fmt(i) .. ' ' .. fmt(n)
    end
  end
  for i = 1, #KEYS do
    redis.call('ZADD', KEYS[i], now + lease, ARGV[4])
    extend(KEYS[i])
  end
elseif mode == 'release' then
  for i = 1, #KEYS do
    redis.call('ZREM', KEYS[i], ARGV[4])
  end
elseif mode == 'renew' then
  for i = 1, #KEYS do
    -- XX: an entry that already expired (and may have been reused) is not revived.
    if redis.call('ZADD', KEYS[i], 'XX', 'CH', now + lease, ARGV[4 + i]) == 1 then
      extend(KEYS[i])
    end
  end
end
return '1 0 0'
