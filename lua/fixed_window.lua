-- fixed_window.lua: twin of src/limiter/algorithm/fixed_window.rs.
-- State: string "start:count" for the epoch-aligned window (calendar month for 1mo),
-- shifted by the per-key offset. TTL: until the window ends. Leases are charged to the
-- window and end with it; unused tokens come back only while it lasts.
--
-- A regions window (w.regions > 0, `fleet = "regions"`, src/regions): the count is this
-- region's `own`, and the limit it admits under is the region's cap, kept in a hash next
-- to the count (rg_key: same hash tag, named by the window's start, so a write for
-- another window never lands in this one). The hash holds `cap` (created at this region's
-- allotment w.allot by whichever script touches it first), `demand`, and the grants and
-- peers' reports the sync loop writes (lua/regions.lua). Headers keep the configured
-- limit; remaining is cap - own, what this region will still admit.

-- How long a regions hash outlives its window (ms): the sync loop reads the previous
-- window's demand as the prior of the next one's grants.
local RG_GRACE = 5000

local function rg_key(key, s)
  return key .. ':rg:' .. fmt(s)
end

-- The limit a window admits under: its cap for a regions window, else its limit.
local function rg_cap(key, w, s)
  if w.regions == 0 then return w.limit end
  local c = redis.call('HGET', rg_key(key, s), 'cap')
  if c then return tonumber(c) end
  return w.allot
end

-- Creates the regions hash of the window [s, e) at this region's allotment when absent.
local function rg_create(h, allot, s, e, now)
  if redis.call('HSETNX', h, 'cap', allot) == 1 then
    redis.call('PEXPIRE', h, math.max(e - now, 0) + RG_GRACE)
  end
end

-- Mirrors a regions window's count into its hash as `own`: what the window admitted in
-- this region, still readable (by operators, by the tests of the bound) for RG_GRACE
-- after the count's own key expired with its window.
local function rg_own(key, w, s, count)
  if w.regions == 0 then return end
  local h = rg_key(key, s)
  if redis.call('EXISTS', h) == 1 then redis.call('HSET', h, 'own', count) end
end

-- Counts `cost` of demand in a regions window, admitted or not.
local function rg_demand(key, w, now, cost)
  local s, e = bounds(w, now, w.offset)
  local h = rg_key(key, s)
  rg_create(h, w.allot, s, e, now)
  redis.call('HINCRBY', h, 'demand', cost)
end

-- Takes k leased tokens given back unused off the demand of the regions window starting
-- at s (a lease counts as demand when taken): the grant policy forecasts a region's need
-- from its demand, and tokens nobody asked for are not need.
local function rg_undemand(key, w, s, k)
  if w.regions == 0 or k < 1 then return end
  local h = rg_key(key, s)
  local d = tonumber(redis.call('HGET', h, 'demand'))
  if d then redis.call('HSET', h, 'demand', math.max(d - k, 0)) end
end

ALG[3] = {
  decide = function(key, w, now, cost)
    local s, e = bounds(w, now, w.offset)
    local start, count = split2(redis.call('GET', key))
    if start ~= s then count = 0 end
    local cap = rg_cap(key, w, s)
    local current = count + cost
    local reset = e - now
    if current <= cap then
      return decision(1, w.limit, cap - current, current, reset, 0), { s, current }
    end
    return decision(0, w.limit, 0, current, reset, reset), nil
  end,
  write = function(key, w, now, cost, nxt, d)
    redis.call('SET', key, fmt(nxt[1]) .. ':' .. fmt(nxt[2]), 'PX', math.max(d.reset_after, 1))
    rg_own(key, w, nxt[1], nxt[2])
  end,
  refund = function(key, w, now, cost)
    local s = bounds(w, now, w.offset)
    local start, count = split2(redis.call('GET', key))
    if start ~= s then return end
    count = count - cost
    if count < 0 then count = 0 end
    redis.call('SET', key, fmt(start) .. ':' .. fmt(count), 'KEEPTTL')
    rg_own(key, w, start, count)
  end,
  -- Adds up to n tokens (never beyond the limit; a regions window's cap), leased until
  -- till or the window's end. Tags: the window's start, 0.
  take = function(key, w, now, n, till)
    if n < 1 or till <= now then return 0, 0, 0, 0 end
    local s, e = bounds(w, now, w.offset)
    local start, count = split2(redis.call('GET', key))
    if start ~= s then count = 0 end
    local granted = math.min(n, math.max(rg_cap(key, w, s) - count, 0))
    if granted < 1 then return 0, 0, 0, 0 end
    if w.regions > 0 then rg_demand(key, w, now, granted) end
    redis.call('SET', key, fmt(s) .. ':' .. fmt(count + granted), 'PX', math.max(e - now, 1))
    rg_own(key, w, s, count + granted)
    return granted, math.min(till, e), s, 0
  end,
  -- k unused tokens of the lease taken in the window starting at tag1 come back while the
  -- state is still that window's; later they are gone with it.
  give_back = function(key, w, now, k, tag1, tag2, size)
    local start, count = split2(redis.call('GET', key))
    -- The demand of the lease's window, even once it is over: its hash outlives it as
    -- the next window's prior.
    rg_undemand(key, w, tag1, k)
    if start ~= tag1 then return end
    count = count - k
    if count < 0 then count = 0 end
    redis.call('SET', key, fmt(start) .. ':' .. fmt(count), 'KEEPTTL')
    rg_own(key, w, start, count)
  end,
  -- Debt: added to the current window's count, past the limit if need be, to at most
  -- 2 x limit. Refund: off the window the request was charged in (its `admitted` time),
  -- only while it is current. See `settle` in fixed_window.rs.
  settle = function(key, w, now, cost, delta, admitted)
    local s, e = bounds(w, now, w.offset)
    local start, count = split2(redis.call('GET', key))
    if start ~= s then count = 0 end
    if delta > 0 then
      count = add_debt(count, math.min(delta, debt_ceiling(w)), counter_top(w))
      redis.call('SET', key, fmt(s) .. ':' .. fmt(count), 'PX', math.max(e - now, 1))
      rg_own(key, w, s, count)
    elseif start == s and bounds(w, admitted, w.offset) == s then
      count = math.max(count - math.min(-delta, cost), 0)
      redis.call('SET', key, fmt(s) .. ':' .. fmt(count), 'KEEPTTL')
      rg_own(key, w, s, count)
    end
  end,
}
