-- prelude.lua: helpers shared by every algorithm. Part of the one script Throttle loads
-- (prelude + the five algorithms + check.lua, concatenated in src/store/redis.rs).
--
-- Numbers are Lua 5.1 doubles: every integer below 2^53 is exact. gateway.toml validation
-- keeps limit x window_ms below 2^52, so products and sums here stay exact, and integer
-- division is corrected after the floating-point divide (idiv), as in the Rust twins.

local DAY = 86400000

-- floor(a / b) for non-negative integers, exact.
local function idiv(a, b)
  if b < 1 then b = 1 end
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b) for non-negative integers, exact.
local function div_ceil(a, b)
  if b < 1 then b = 1 end
  local q = idiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

local function fmt(n)
  return string.format('%.0f', n)
end

-- The time of the decision: ARGV[1] when given (tests), else the Redis server's clock.
local function now_ms()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end

-- Howard Hinnant's civil-date algorithms (same as src/limiter/algorithm/mod.rs).
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m > 2) and (m - 3) or (m + 9)
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = (mp < 10) and (mp + 3) or (mp - 9)
  if m <= 2 then y = y + 1 end
  return y, m, d
end

-- [start, end) of the window containing `now`, shifted by `offset`. Window 5 is the
-- calendar month in UTC; the others are `period` ms aligned to the Unix epoch. A window
-- in a calendar (`calendar_tz`, `billing_anchor_day`, `per_week`) comes with its edges,
-- computed by the gateway (the one place that knows the zone: src/limiter/algorithm/
-- calendar.rs `edges`): [cal_prev, cal_start) the window before, [cal_start, cal_end) the
-- one containing the gateway's now, [cal_end, cal_next) the next; the script looks times
-- up in them. Beyond them (only when the gateway's clock and Redis's differ across an
-- edge) the nearest window's length repeats.
local function calendar_bounds(w, now)
  if now >= w.cal_start then
    if now < w.cal_end then return w.cal_start, w.cal_end end
    if now < w.cal_next then return w.cal_end, w.cal_next end
    local len = math.max(w.cal_next - w.cal_end, 1)
    local s = w.cal_next + idiv(now - w.cal_next, len) * len
    return s, s + len
  end
  if now >= w.cal_prev then return w.cal_prev, w.cal_start end
  local len = math.max(w.cal_start - w.cal_prev, 1)
  local k = div_ceil(w.cal_prev - now, len)
  local s = math.max(w.cal_prev - k * len, 0)
  return s, s + len
end

local function bounds(w, now, offset)
  if w.cal_start > 0 then
    return calendar_bounds(w, now)
  end
  local t = now - offset
  if t < 0 then t = 0 end
  local s, e
  if w.window == 5 then
    local y, m = civil_from_days(idiv(t, DAY))
    local ny, nm = y, m + 1
    if nm == 13 then ny, nm = y + 1, 1 end
    s = days_from_civil(y, m, 1) * DAY
    e = days_from_civil(ny, nm, 1) * DAY
  else
    s = t - (t - idiv(t, w.period) * w.period)
    e = s + w.period
  end
  return s + offset, e + offset
end

local function split2(v)
  if not v then return nil end
  local a, b = string.match(v, '^(%d+):(%d+)$')
  if not a then return nil end
  return tonumber(a), tonumber(b)
end

local function split3(v)
  if not v then return nil end
  local a, b, c = string.match(v, '^(%d+):(%d+):(%d+)$')
  if not a then return nil end
  return tonumber(a), tonumber(b), tonumber(c)
end

local function split4(v)
  if not v then return nil end
  local a, b, c, d = string.match(v, '^(%d+):(%d+):(%d+):(%d+)$')
  if not a then return nil end
  return tonumber(a), tonumber(b), tonumber(c), tonumber(d)
end

-- A bucket's state: "level:last", or "level:last:held:held_until" while it holds leased
-- tokens (see token_bucket.lua). nil when missing.
local function bucket_state(key)
  local v = redis.call('GET', key)
  local level, last = split2(v)
  if level then return level, last, 0, 0 end
  return split4(v)
end

local function bucket_set(key, level, at, held, held_until, ttl)
  local v = fmt(level) .. ':' .. fmt(at)
  if held > 0 then v = v .. ':' .. fmt(held) .. ':' .. fmt(held_until) end
  redis.call('SET', key, v, 'PX', math.max(ttl, 1))
end

-- When a bucket's hold of a lease ending at `till`, taken at `now`, ends: the lease plus
-- as long again (the grace for giving leftovers back). Same as `hold_end` in Rust.
local function hold_end(now, till)
  return till + (till - now)
end

-- A decision: the same fields, in the same order, as the Rust `Decision`.
local function decision(allowed, limit, remaining, current, reset_after, retry_after)
  return { allowed = allowed, limit = limit, remaining = remaining, current = current,
           reset_after = reset_after, retry_after = retry_after }
end

local function clamp_remaining(r, limit)
  if r > limit then return limit end
  return r
end

-- Settling (see check.lua's 'settle' mode and `settle` in src/limiter/algorithm/).
-- The most tokens a settlement may leave a window in debt: its limit. Same as `max_debt`.
local function max_debt(w)
  return w.limit
end

-- More debt than any window accepts (a full bucket's capacity plus max_debt below empty):
-- a delta is cut to it first, so every product below stays exact. Same as `debt_ceiling`.
local function debt_ceiling(w)
  return max_debt(w) + math.max(w.capacity, w.limit)
end

-- `count` raised by a debt of d, to at most `top`; a count already at or above it stays.
-- Written so every sum stays exact. Same as `add_debt`.
local function add_debt(count, d, top)
  if count >= top then return count end
  return count + math.min(d, top - count)
end

-- A counter's bound after a debt: twice the limit, within 2^32 - 1. Same as `counter_top`.
local function counter_top(w)
  return math.min(2 * w.limit, 4294967295)
end

-- The units a bucket may give back for a refund of `back` tokens of a request of
-- reserved `cost` admitted at `at`, at `now` (the replay may have wasted refill or drain
-- since; see `refund_units` in src/limiter/algorithm/mod.rs).
local function refund_units(w, back, cost, at, now)
  local wasted = math.max(math.max(now - at, 0) * w.limit - (cost - back) * w.period, 0)
  return math.max(back * w.period - wasted, 0)
end

local ALG = {}
