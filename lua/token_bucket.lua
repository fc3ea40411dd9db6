-- token_bucket.lua: twin of src/limiter/algorithm/token_bucket.rs.
-- State: string "level:last" (level in token-ms units; 1 token = period ms, refill = limit
-- units per ms), or "level:last:held:held_until" while leased tokens are held: until
-- held_until the bucket refills to at most cap - held (as if every held token had been
-- spent at once; see the Rust twin). A missing key is a full bucket. TTL: the time until
-- the bucket is full again, so an expired key and a fresh one are the same thing.
-- A debt (settle) below empty (at most limit tokens below) is an empty bucket at a `last`
-- in the future, when the debt is paid off: no refill before it, retry/reset count the
-- wait from now, and `current` the debt.

-- The level at `now` (never before the state's time), refilled and capped, the hold still
-- in force then, and that time.
local function tb_level(key, w, now)
  local cap = w.capacity * w.period
  local level, last, held, hu = bucket_state(key)
  if not level then return cap, cap, 0, 0, now end
  local t = math.max(now, last)
  if held == 0 then
    return math.min(level + (t - last) * w.limit, cap), cap, 0, 0, t
  end
  if t < hu then
    return math.min(level + (t - last) * w.limit, cap - held), cap, held, hu, t
  end
  local mid = math.max(hu, last)
  local at_end = math.min(level + (mid - last) * w.limit, cap - held)
  return math.min(at_end + (t - mid) * w.limit, cap), cap, 0, 0, t
end

-- The signed level at `now` (below 0 while a debt is paid off: last in the future,
-- refilling linearly up to it), cap, the hold in force at `now`, and whether the key is
-- missing (a full bucket).
local function tb_signed(key, w, now)
  local cap = w.capacity * w.period
  local level, last, held, hu = bucket_state(key)
  if not level then return cap, cap, 0, 0, true end
  if last > now then
    if held == 0 or now >= hu then held, hu = 0, 0 end
    return level - (last - now) * w.limit, cap, held, hu, false
  end
  local l, _, h, u = tb_level(key, w, now)
  return l, cap, h, u, false
end

-- Ms from `now` until a bucket at `level` (holding `held` until `hu`) holds `target`.
local function tb_time_to(w, level, cap, held, hu, now, target)
  if level >= target then return 0 end
  if held == 0 or now >= hu or target <= cap - held then
    return div_ceil(target - level, w.limit)
  end
  local d = hu - now
  local at_end = math.min(level + d * w.limit, cap - held)
  return d + div_ceil(target - at_end, w.limit)
end

-- Stores the signed `level` at `now`: below 0, an empty bucket until the debt is paid off.
local function tb_put(key, w, level, now, cap, held, hu)
  local at = now
  if level < 0 then
    at = now + div_ceil(-level, w.limit)
    level = 0
  end
  bucket_set(key, level, at, held, hu, (at - now) + tb_time_to(w, level, cap, held, hu, at, cap))
end

-- The tokens used at a decision: `level` units at `last`, `owed` units of refill still to
-- come before it (a debt), counted up to a whole token. Same as `used_tokens` in Rust.
local function tb_used(w, level, owed)
  if level >= owed then
    return w.capacity - idiv(level - owed, w.period)
  end
  return w.capacity + div_ceil(owed - level, w.period)
end

ALG[1] = {
  decide = function(key, w, now, cost)
    local level, cap, held, hu, at = tb_level(key, w, now)
    -- A bucket in debt is empty until `at` (in the future): no refill before it.
    local wait = at - now
    local need = cost * w.period
    -- The count includes the debt: the refill still owed before `at`.
    local current = tb_used(w, level, wait * w.limit) + cost
    if level >= need then
      local left = level - need
      local d = decision(1, w.limit, clamp_remaining(idiv(left, w.period), w.limit), current,
                         tb_time_to(w, left, cap, held, hu, now, cap), 0)
      return d, { left, held, hu }
    end
    local retry
    if need > cap then
      retry = wait + tb_time_to(w, level, cap, held, hu, at, cap)
      if retry < 1 then retry = 1 end
    else
      retry = wait + tb_time_to(w, level, cap, held, hu, at, need)
    end
    return decision(0, w.limit, 0, current, wait + tb_time_to(w, level, cap, held, hu, at, cap), retry), nil
  end,
  write = function(key, w, now, cost, nxt, d)
    bucket_set(key, nxt[1], now, nxt[2], nxt[3], d.reset_after)
  end,
  refund = function(key, w, now, cost)
    if not bucket_state(key) then return end
    local level, cap, held, hu, at = tb_level(key, w, now)
    level = math.min(level + cost * w.period, cap - held)
    bucket_set(key, level, at, held, hu, tb_time_to(w, level, cap, held, hu, now, cap))
  end,
  -- Spends up to n more tokens (never more than the level holds) and holds them until
  -- hold_end. Tags: the hold's end for this lease, 0.
  take = function(key, w, now, n, till)
    if n < 1 or till <= now then return 0, 0, 0, 0 end
    local level, cap, held, hu, at = tb_level(key, w, now)
    local granted = math.min(n, idiv(level, w.period))
    if granted < 1 then return 0, 0, 0, 0 end
    local units = granted * w.period
    local e = hold_end(now, till)
    level = level - units
    held = held + units
    hu = math.max(hu, e)
    bucket_set(key, level, at, held, hu, tb_time_to(w, level, cap, held, hu, now, cap))
    return granted, till, e, 0
  end,
  -- Ends a lease of `size` with k tokens unused, while its hold (ending at tag1) lasts:
  -- the unused tokens return to the level, the whole lease leaves the hold. Later: nothing.
  -- (Signed: a bucket in debt pays it off with the tokens given back.)
  give_back = function(key, w, now, k, tag1, tag2, size)
    if now >= tag1 then return end
    local level, cap, held, hu = tb_signed(key, w, now)
    if held == 0 then return end
    level = level + math.min(math.min(k, size) * w.period, held)
    held = held - math.min(size * w.period, held)
    if held == 0 then hu = 0 end
    tb_put(key, w, level, now, cap, held, hu)
  end,
  -- Debt: the level drops by it, below 0 if need be, never below -max_debt (limit tokens;
  -- a level already below stays). Refund: it rises by refund_units, at most to
  -- cap - held. See `settle` in token_bucket.rs.
  settle = function(key, w, now, cost, delta, admitted)
    local level, cap, held, hu, fresh = tb_signed(key, w, now)
    if delta > 0 then
      local floor = -max_debt(w) * w.period
      if level <= floor then return end
      level = level - math.min(math.min(delta, debt_ceiling(w)) * w.period, level - floor)
    else
      if fresh then return end
      local units = refund_units(w, math.min(-delta, cost), cost, admitted, now)
      local top = cap - held
      if units == 0 or level >= top then return end
      level = math.min(level + units, top)
    end
    tb_put(key, w, level, now, cap, held, hu)
  end,
}
