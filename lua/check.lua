-- check.lua: the entry point of Throttle's one script (prelude + algorithms + this file).
-- The wire format below mirrors src/store/redis/wire.rs (a test there checks it).
--
-- KEYS[i]   the state key of window i, e.g. thr:{ip:203.0.113.7}:1m. On Redis Cluster the
--           caller passes the windows of one scope per call; they share a hash tag, so a
--           call never touches two slots.
-- ARGV[1]   now in Unix ms, or '' to use the server clock (redis.call('TIME')); only
--           tests pass a time.
-- ARGV[2]   cost: units the request spends in every window (>= 1).
-- ARGV[3]   'check': decide every window, charge all of them only if all allow.
--           'peek': decide every window, charge nothing.
--           'refund': give back a charge made at ARGV[1] (Cluster: another scope rejected).
-- Then 7 values per window i (all integers, times in ms):
--           algorithm (1 token_bucket, 2 sliding_window, 3 fixed_window, 4 sliding_log,
--           5 leaky_bucket), window (1 s, 2 min, 3 h, 4 d, 5 mo), limit, capacity,
--           period_ms, offset_ms, current (refund only: the charge's `current`).
--
-- Reply: { now, all_allowed, then per window: allowed, remaining, current, reset_after_ms,
--          retry_after_ms } -- the fields of the Rust `Decision`, in that order.
-- Writes: only when every window allows ('check'), each key with a TTL that ends when its
-- state is back to the initial value, so idle state expires by itself.

local now = now_ms()
local cost = tonumber(ARGV[2])
local mode = ARGV[3]
local ws = {}
for i = 1, #KEYS do
  local b = 4 + (i - 1) * 7
  ws[i] = {
    alg = tonumber(ARGV[b]), window = tonumber(ARGV[b + 1]), limit = tonumber(ARGV[b + 2]),
    capacity = tonumber(ARGV[b + 3]), period = tonumber(ARGV[b + 4]), offset = tonumber(ARGV[b + 5]),
    current = tonumber(ARGV[b + 6]),
  }
end

if mode == 'refund' then
  for i = 1, #KEYS do
    ALG[ws[i].alg].refund(KEYS[i], ws[i], now, cost, ws[i].current)
  end
  return { now, 1 }
end

local ds, nexts, all = {}, {}, 1
for i = 1, #KEYS do
  ds[i], nexts[i] = ALG[ws[i].alg].decide(KEYS[i], ws[i], now, cost)
  if ds[i].allowed == 0 then all = 0 end
end
if all == 1 and mode == 'check' then
  for i = 1, #KEYS do
    ALG[ws[i].alg].write(KEYS[i], ws[i], now, cost, nexts[i], ds[i])
  end
end
local reply = { now, all }
for i = 1, #KEYS do
  local d = ds[i]
  reply[#reply + 1] = d.allowed
  reply[#reply + 1] = d.remaining
  reply[#reply + 1] = d.current
  reply[#reply + 1] = d.reset_after
  reply[#reply + 1] = d.retry_after
end
return reply
