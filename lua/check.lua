-- check.lua: the entry point of Throttle's one script (prelude + algorithms + this file).
-- The wire format below mirrors src/store/redis/wire.rs (a test there checks it).
--
-- KEYS[i]   the state key of window i, e.g. thr:{ip:203.0.113.7}:1m. On Redis Cluster the
--           caller passes the windows of one scope per call; they share a hash tag, so a
--           call never touches two slots.
-- ARGV[1]   now in Unix ms, or '' to use the server clock (redis.call('TIME')); only
--           tests pass a time.
-- ARGV[2]   cost: units the request spends in every window (>= 1).
-- ARGV[3]   'check': decide every window, charge all of them only if all allow, then
--           lease what was asked for (below).
--           'peek': decide every window, charge nothing.
--           'refund': give back a charge made at ARGV[1] (Cluster: another scope rejected).
--           'return': only give back leased tokens (below), and apply carried settles; no
--           decision.
--           'settle': a request admitted with the reserved cost ARGV[2] at `current`
--           (below) learnt its true cost: charge or refund the difference, ARGV[4].
-- ARGV[4]   lease_ms: the longest lease (each window's is at most a quarter of its
--           period; fixed and sliding windows end theirs at the window's end); 0: none.
--           'settle': delta = true cost - reserved cost instead (signed; > 0 a debt
--           charged at now past the limit if need be, < 0 a refund).
-- Then 21 values per window i (all integers, times in ms):
--           algorithm (1 token_bucket, 2 sliding_window, 3 fixed_window, 4 sliding_log,
--           5 leaky_bucket), window (1 s, 2 min, 3 h, 4 d, 5 mo, and the rate-limit
--           service's 6 week, 7 30 days, 8 365 days: all but 5, the calendar month,
--           are period_ms aligned to the Unix epoch), limit, capacity,
--           period_ms, offset_ms, current (refund: the charge's `current`; settle: when
--           the request was admitted, Unix ms),
--           want (tokens to lease after an admitted 'check'; 0: none),
--           ret, tag1, tag2, size (end the lease `tag1`, `tag2` of `size` tokens, as a
--           'take' answered them, giving back `ret` unused tokens; size 0: no lease),
--           cal_prev, cal_start, cal_end, cal_next: a calendar window's edges around
--           the gateway's now (see `bounds` in prelude.lua; all 0: no calendar),
--           regions, allot: a `fleet = "regions"` fixed window's number of regions R
--           and this region's allotment of its limit (regions 0: not a regions window;
--           see fixed_window.lua),
--           s_cost, s_delta, s_at: an earlier request's settle of this window carried by
--           this call (s_delta 0: none; the gateway sends them with 'check' and 'return'
--           calls): applied after the give-backs, before anything is decided, as that
--           request's 'settle' call would be (reserved cost s_cost, delta s_delta, the
--           window charged at s_at).
--
-- Reply: one string of integers separated by spaces: now, all_allowed, then per window:
--          allowed, remaining, current, reset_after_ms, retry_after_ms, granted,
--          lease_until, tag1, tag2 -- the fields of the Rust `Decision`, then the lease
--          taken (granted 0: none). 'return', 'refund' and 'settle': "now 1".
-- Leases: a window leases min(want, remaining / 2) tokens, none below 2, charged at once,
-- so a fleet never admits more than the limit; unused tokens come back through `ret`.
-- Writes: only when every window allows ('check'), or a settle's, carried or not (a
-- debt charges past the limit), and a regions window's demand on every 'check', admitted
-- or not; each key with a TTL that ends when its state is back to the initial value, so
-- idle state expires by itself.

local now = now_ms()
local cost = tonumber(ARGV[2])
local mode = ARGV[3]
local lease_ms = tonumber(ARGV[4])
local ws = {}
for i = 1, #KEYS do
  local b = 5 + (i - 1) * 21
  ws[i] = {
    alg = tonumber(ARGV[b]), window = tonumber(ARGV[b + 1]), limit = tonumber(ARGV[b + 2]),
    capacity = tonumber(ARGV[b + 3]), period = tonumber(ARGV[b + 4]), offset = tonumber(ARGV[b + 5]),
    current = tonumber(ARGV[b + 6]), want = tonumber(ARGV[b + 7]), ret = tonumber(ARGV[b + 8]),
    tag1 = tonumber(ARGV[b + 9]), tag2 = tonumber(ARGV[b + 10]), size = tonumber(ARGV[b + 11]),
    cal_prev = tonumber(ARGV[b + 12]), cal_start = tonumber(ARGV[b + 13]),
    cal_end = tonumber(ARGV[b + 14]), cal_next = tonumber(ARGV[b + 15]),
    regions = tonumber(ARGV[b + 16]), allot = tonumber(ARGV[b + 17]),
    s_cost = tonumber(ARGV[b + 18]), s_delta = tonumber(ARGV[b + 19]),
    s_at = tonumber(ARGV[b + 20]),
  }
end

-- Leases ending first (unused tokens back, a bucket's hold released): they may make room
-- for this very request. A lease is named by its size (> 0); ret may be 0 (all used).
for i = 1, #KEYS do
  if ws[i].size > 0 then
    ALG[ws[i].alg].give_back(KEYS[i], ws[i], now, ws[i].ret, ws[i].tag1, ws[i].tag2, ws[i].size)
  end
end
-- Settles carried over from earlier requests: the decisions below see them, as they
-- would have seen each request's own 'settle' call sent before this one.
for i = 1, #KEYS do
  local w = ws[i]
  if w.s_delta ~= 0 then
    ALG[w.alg].settle(KEYS[i], w, now, w.s_cost, w.s_delta, w.s_at)
  end
end
if mode == 'return' then
  return fmt(now) .. ' 1'
end

if mode == 'refund' then
  for i = 1, #KEYS do
    ALG[ws[i].alg].refund(KEYS[i], ws[i], now, cost, ws[i].current)
  end
  return fmt(now) .. ' 1'
end

if mode == 'settle' then
  local delta = tonumber(ARGV[4])
  if delta ~= 0 then
    for i = 1, #KEYS do
      ALG[ws[i].alg].settle(KEYS[i], ws[i], now, cost, delta, ws[i].current)
    end
  end
  return fmt(now) .. ' 1'
end

local ds, nexts, all = {}, {}, 1
for i = 1, #KEYS do
  ds[i], nexts[i] = ALG[ws[i].alg].decide(KEYS[i], ws[i], now, cost)
  if ds[i].allowed == 0 then all = 0 end
end
if mode == 'check' then
  -- A regions window's demand counts every request asked, refused or not: the grant
  -- policy forecasts from it (src/regions).
  for i = 1, #KEYS do
    if ws[i].regions > 0 then rg_demand(KEYS[i], ws[i], now, cost) end
  end
end
local leases = {}
if all == 1 and mode == 'check' then
  for i = 1, #KEYS do
    ALG[ws[i].alg].write(KEYS[i], ws[i], now, cost, nexts[i], ds[i])
  end
  for i = 1, #KEYS do
    local w = ws[i]
    local len = math.min(lease_ms, idiv(w.period, 4))
    local n = math.min(w.want, idiv(ds[i].remaining, 2))
    if n >= 2 and len >= 1 then
      local granted, till, t1, t2 = ALG[w.alg].take(KEYS[i], w, now, n, now + len)
      leases[i] = { granted, till, t1, t2 }
    end
  end
end
local reply = { fmt(now), fmt(all) }
for i = 1, #KEYS do
  local d = ds[i]
  local l = leases[i] or { 0, 0, 0, 0 }
  reply[#reply + 1] = fmt(d.allowed)
  reply[#reply + 1] = fmt(d.remaining)
  reply[#reply + 1] = fmt(d.current)
  reply[#reply + 1] = fmt(d.reset_after)
  reply[#reply + 1] = fmt(d.retry_after)
  reply[#reply + 1] = fmt(l[1])
  reply[#reply + 1] = fmt(l[2])
  reply[#reply + 1] = fmt(l[3])
  reply[#reply + 1] = fmt(l[4])
end
-- One bulk string of integers: the client parses it in one pass instead of decoding a
-- RESP array element by element (measured: most of the client's cost of a round trip).
return table.concat(reply, ' ')
