-- leaky_bucket.lua: twin of src/limiter/algorithm/leaky_bucket.rs (a meter, never a queue).
-- State: string "level:last" (water in token-ms units, draining `limit` units per ms), or
-- "level:last:held:held_until" while leased tokens are held: until held_until the meter
-- drains to no less than held (as if every held token had been poured at once; see the
-- Rust twin). A missing key is an empty meter. TTL: the time until the meter is empty.

-- The level at `now` (never before the state's time), drained, the hold still in force
-- then, and that time.
local function lb_level(key, w, now)
  local level, last, held, hu = bucket_state(key)
  if not level then return 0, 0, 0, now end
  local t = math.max(now, last)
  if held == 0 then
    return math.max(level - (t - last) * w.limit, 0), 0, 0, t
  end
  if t < hu then
    return math.max(level - (t - last) * w.limit, held), held, hu, t
  end
  local mid = math.max(hu, last)
  local at_end = math.max(level - (mid - last) * w.limit, held)
  return math.max(at_end - (t - mid) * w.limit, 0), 0, 0, t
end

-- Ms from `now` until a meter at `level` (holding `held` until `hu`) is down to `target`.
local function lb_time_to(w, level, held, hu, now, target)
  if level <= target then return 0 end
  if held == 0 or now >= hu or target >= held then
    return div_ceil(level - target, w.limit)
  end
  local d = hu - now
  local at_end = math.max(level - d * w.limit, held)
  return d + div_ceil(at_end - target, w.limit)
end

ALG[5] = {
  decide = function(key, w, now, cost)
    local cap = w.limit * w.period
    local level, held, hu = lb_level(key, w, now)
    local need = cost * w.period
    local current = div_ceil(level, w.period) + cost
    if level + need <= cap then
      local nxt = level + need
      return decision(1, w.limit, idiv(cap - nxt, w.period), current,
                      lb_time_to(w, nxt, held, hu, now, 0), 0), { nxt, held, hu }
    end
    local retry
    if need > cap then
      retry = lb_time_to(w, level, held, hu, now, 0)
      if retry < 1 then retry = 1 end
    else
      retry = lb_time_to(w, level, held, hu, now, cap - need)
    end
    return decision(0, w.limit, 0, current, lb_time_to(w, level, held, hu, now, 0), retry), nil
  end,
  write = function(key, w, now, cost, nxt, d)
    bucket_set(key, nxt[1], now, nxt[2], nxt[3], d.reset_after)
  end,
  refund = function(key, w, now, cost)
    if not bucket_state(key) then return end
    local level, held, hu, at = lb_level(key, w, now)
    level = math.max(level - cost * w.period, held)
    bucket_set(key, level, at, held, hu, lb_time_to(w, level, held, hu, now, 0))
  end,
  -- Pours up to n more tokens in (never above the limit) and holds them until hold_end.
  -- Tags: the hold's end for this lease, 0.
  take = function(key, w, now, n, till)
    if n < 1 or till <= now then return 0, 0, 0, 0 end
    local cap = w.limit * w.period
    local level, held, hu, at = lb_level(key, w, now)
    local granted = math.min(n, idiv(math.max(cap - level, 0), w.period))
    if granted < 1 then return 0, 0, 0, 0 end
    local units = granted * w.period
    local e = hold_end(now, till)
    level = level + units
    held = held + units
    hu = math.max(hu, e)
    bucket_set(key, level, at, held, hu, lb_time_to(w, level, held, hu, now, 0))
    return granted, till, e, 0
  end,
  -- While the lease's hold (ending at tag1) lasts, k unused tokens leave the meter and
  -- the hold. Later: nothing.
  give_back = function(key, w, now, k, tag1, tag2, size)
    if now >= tag1 then return end
    local level, held, hu, at = lb_level(key, w, now)
    if held == 0 then return end
    level = level - math.min(math.min(k, size) * w.period, held)
    held = held - math.min(size * w.period, held)
    if held == 0 then hu = 0 end
    bucket_set(key, level, at, held, hu, lb_time_to(w, level, held, hu, now, 0))
  end,
  -- Debt: poured in at once, past the limit if need be, to at most capacity + max_debt
  -- (a level already above stays). Refund: refund_units come out, never below the hold.
  -- See `settle` in leaky_bucket.rs.
  settle = function(key, w, now, cost, delta, admitted)
    local level, held, hu, at = lb_level(key, w, now)
    if delta > 0 then
      local top = (w.capacity + max_debt(w)) * w.period
      level = add_debt(level, math.min(delta, debt_ceiling(w)) * w.period, top)
    else
      local units = refund_units(w, math.min(-delta, cost), cost, admitted, now)
      level = math.min(math.max(level - units, held), level)
    end
    bucket_set(key, level, at, held, hu, (at - now) + lb_time_to(w, level, held, hu, at, 0))
  end,
}
