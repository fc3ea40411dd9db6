-- sliding_log.lua: twin of src/limiter/algorithm/sliding_log.rs.
-- State: a sorted set; one member per admitted request, "at:total:cost" scored by `at`
-- (the running total makes members unique even within one millisecond). A request at
-- `now` counts the cost of members with at > now - len. TTL: one window after the newest.

local function log_live(key, w, now)
  local members = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - w.period), '+inf', 'WITHSCORES')
  local entries, used = {}, 0
  for i = 1, #members, 2 do
    local c = tonumber(string.match(members[i], ':(%d+)$'))
    local at = tonumber(members[i + 1])
    entries[#entries + 1] = { at, c }
    used = used + c
  end
  return entries, used
end

ALG[4] = {
  decide = function(key, w, now, cost)
    local entries, used = log_live(key, w, now)
    local current = used + cost
    if current <= w.limit then
      return decision(1, w.limit, w.limit - current, current, w.period, 0), current
    end
    local to_free = current - w.limit
    local retry_at = now + w.period
    if cost <= w.limit then
      for _, e in ipairs(entries) do
        if e[2] >= to_free then
          retry_at = e[1] + w.period
          break
        end
        to_free = to_free - e[2]
      end
    end
    local reset_at = now
    if #entries > 0 then reset_at = math.max(entries[#entries][1] + w.period, now) end
    local retry = retry_at - now
    if retry < 1 then retry = 1 end
    return decision(0, w.limit, 0, current, reset_at - now, retry), nil
  end,
  write = function(key, w, now, cost, total, d)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - w.period))
    redis.call('ZADD', key, fmt(now), fmt(now) .. ':' .. fmt(total) .. ':' .. fmt(cost))
    redis.call('PEXPIRE', key, w.period)
  end,
  refund = function(key, w, now, cost, current)
    redis.call('ZREM', key, fmt(now) .. ':' .. fmt(current) .. ':' .. fmt(cost))
  end,
}
