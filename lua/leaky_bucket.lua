-- leaky_bucket.lua: twin of src/limiter/algorithm/leaky_bucket.rs (a meter, never a queue).
-- State: string "level:last" (water in token-ms units, draining `limit` units per ms).
-- A missing key is an empty meter. TTL: the time until the meter is empty again.

local function lb_level(key, w, now)
  local level, last = split2(redis.call('GET', key))
  if not level then return 0, now end
  local drained = (now - last) * w.limit
  if drained < 0 then drained = 0 end
  level = level - drained
  if level < 0 then level = 0 end
  return level, last
end

ALG[5] = {
  decide = function(key, w, now, cost)
    local cap = w.limit * w.period
    local level = lb_level(key, w, now)
    local need = cost * w.period
    local current = div_ceil(level, w.period) + cost
    if level + need <= cap then
      local nxt = level + need
      return decision(1, w.limit, idiv(cap - nxt, w.period), current, div_ceil(nxt, w.limit), 0), nxt
    end
    local retry
    if need > cap then
      retry = div_ceil(level, w.limit)
      if retry < 1 then retry = 1 end
    else
      retry = div_ceil(level + need - cap, w.limit)
    end
    return decision(0, w.limit, 0, current, div_ceil(level, w.limit), retry), nil
  end,
  write = function(key, w, now, cost, nxt, d)
    redis.call('SET', key, fmt(nxt) .. ':' .. fmt(now), 'PX', math.max(d.reset_after, 1))
  end,
  refund = function(key, w, now, cost)
    local level, last = lb_level(key, w, now)
    if not redis.call('GET', key) then return end
    level = level - cost * w.period
    if level < 0 then level = 0 end
    local at = math.max(now, last)
    redis.call('SET', key, fmt(level) .. ':' .. fmt(at), 'PX', math.max(div_ceil(level, w.limit), 1))
  end,
}
