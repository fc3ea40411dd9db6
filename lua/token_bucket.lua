-- token_bucket.lua: twin of src/limiter/algorithm/token_bucket.rs.
-- State: string "level:last" (level in token-ms units; 1 token = period ms, refill = limit
-- units per ms). A missing key is a full bucket. TTL: the time until the bucket is full
-- again, so an expired key and a fresh one are the same thing.

local function tb_level(key, w, now)
  local cap = w.capacity * w.period
  local level, last = split2(redis.call('GET', key))
  if not level then return cap, cap end
  local elapsed = now - last
  if elapsed < 0 then elapsed = 0 end
  level = level + elapsed * w.limit
  if level > cap then level = cap end
  return level, cap
end

ALG[1] = {
  decide = function(key, w, now, cost)
    local level, cap = tb_level(key, w, now)
    local need = cost * w.period
    local current = w.capacity - idiv(level, w.period) + cost
    if level >= need then
      local left = level - need
      local d = decision(1, w.limit, clamp_remaining(idiv(left, w.period), w.limit), current,
                         div_ceil(cap - left, w.limit), 0)
      return d, left
    end
    local retry
    if need > cap then
      retry = div_ceil(cap - level, w.limit)
      if retry < 1 then retry = 1 end
    else
      retry = div_ceil(need - level, w.limit)
    end
    return decision(0, w.limit, 0, current, div_ceil(cap - level, w.limit), retry), nil
  end,
  write = function(key, w, now, cost, left, d)
    redis.call('SET', key, fmt(left) .. ':' .. fmt(now), 'PX', math.max(d.reset_after, 1))
  end,
  refund = function(key, w, now, cost)
    local level, cap = tb_level(key, w, now)
    local _, last = split2(redis.call('GET', key))
    if not last then return end
    level = level + cost * w.period
    if level > cap then level = cap end
    local at = math.max(now, last)
    redis.call('SET', key, fmt(level) .. ':' .. fmt(at), 'PX', math.max(div_ceil(cap - level, w.limit), 1))
  end,
}
