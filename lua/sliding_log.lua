-- sliding_log.lua: twin of src/limiter/algorithm/sliding_log.rs.
-- State: a sorted set; one member per admitted request, "at:total:cost" scored by `at`
-- (the running total makes members unique within one millisecond; should leased tokens
-- given back bring it back to an earlier one's, "at:total.k:cost"). A request at
-- `now` counts the cost of members with at > now - len. TTL: one window after the newest.
-- A lease is one member "until:total:granted" scored by its end `until` (its tokens may be
-- spent until then, so they count until until + len), its total above the limit (never a
-- request's): (limit + 1) x (until - now) + count after it; no other member has its score.

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

-- Adds a member of `cost` scored `at`, named head:cost, or head.k:cost when taken.
local function log_add(key, at, head, cost)
  local tail = ':' .. fmt(cost)
  local member, k = head .. tail, 0
  while redis.call('ZSCORE', key, member) do
    k = k + 1
    member = head .. '.' .. k .. tail
  end
  redis.call('ZADD', key, fmt(at), member)
end

ALG[4] = {
  decide = function(key, w, now, cost)
    local entries, used = log_live(key, w, now)
    local current = used + cost
    if current <= w.limit then
      -- Empty again one window after the latest entry (this one, or a lease's, later).
      local latest = now
      if #entries > 0 then latest = math.max(entries[#entries][1], now) end
      return decision(1, w.limit, w.limit - current, current, latest + w.period - now, 0), current
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
    -- Unique even when leased tokens given back in this millisecond brought the count
    -- back to an earlier request's: "now:total.k:cost" (refund removes an equal one).
    local head, tail = fmt(now) .. ':' .. fmt(total), ':' .. fmt(cost)
    local member, k = head .. tail, 0
    while redis.call('ZSCORE', key, member) do
      k = k + 1
      member = head .. '.' .. k .. tail
    end
    redis.call('ZADD', key, fmt(now), member)
    redis.call('PEXPIRE', key, math.max(d.reset_after, 1))
  end,
  refund = function(key, w, now, cost, current)
    redis.call('ZREM', key, fmt(now) .. ':' .. fmt(current) .. ':' .. fmt(cost))
  end,
  -- One member of up to n tokens (never beyond the limit) at till. Tags: till, its total.
  take = function(key, w, now, n, till)
    if n < 1 or till <= now then return 0, 0, 0, 0 end
    local entries, used = log_live(key, w, now)
    local granted = math.min(n, math.max(w.limit - used, 0))
    if granted < 1 then return 0, 0, 0, 0 end
    -- One lease per end time: a lease ending when another entry is (a lease taken in the
    -- same millisecond) ends a millisecond earlier, so its member is unique.
    while till > now and redis.call('ZCOUNT', key, fmt(till), fmt(till)) > 0 do
      till = till - 1
    end
    if till <= now then return 0, 0, 0, 0 end
    local total = (w.limit + 1) * (till - now) + used + granted
    redis.call('ZADD', key, fmt(till), fmt(till) .. ':' .. fmt(total) .. ':' .. fmt(granted))
    local latest = till
    if #entries > 0 then latest = math.max(entries[#entries][1], till) end
    redis.call('PEXPIRE', key, latest + w.period - now)
    return granted, till, till, total
  end,
  -- The lease's member shrinks by k unused tokens (gone at 0); none left (expired): nothing.
  give_back = function(key, w, now, k, tag1, tag2, size)
    local prefix = fmt(tag1) .. ':' .. fmt(tag2) .. ':'
    if redis.call('ZREM', key, prefix .. fmt(size)) == 0 then return end
    if size - k > 0 then
      redis.call('ZADD', key, fmt(tag1), prefix .. fmt(size - k))
      local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      redis.call('PEXPIRE', key, math.max(tonumber(last[2]) + w.period - now, 1))
    end
  end,
  -- Debt: one member of the debt at now, cut so the live total stays within 2 x limit
  -- (none when it already is). Refund: the request's own member (scored `admitted`, of
  -- the reserved cost; the first by name if several) shrinks, or goes at 0. See `settle`
  -- in sliding_log.rs.
  settle = function(key, w, now, cost, delta, admitted)
    if delta > 0 then
      local entries, used = log_live(key, w, now)
      local d = add_debt(used, math.min(delta, debt_ceiling(w)), counter_top(w)) - used
      if d < 1 then return end
      redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - w.period))
      log_add(key, now, fmt(now) .. ':' .. fmt(used + d), d)
      local latest = now
      if #entries > 0 then latest = math.max(entries[#entries][1], now) end
      redis.call('PEXPIRE', key, latest + w.period - now)
      return
    end
    local back = math.min(-delta, cost)
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, fmt(admitted), fmt(admitted))) do
      local head, c = string.match(m, '^(.*):(%d+)$')
      if tonumber(c) == cost then
        redis.call('ZREM', key, m)
        if cost - back > 0 then
          log_add(key, admitted, head, cost - back)
          local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
          redis.call('PEXPIRE', key, math.max(tonumber(last[2]) + w.period - now, 1))
        end
        return
      end
    end
  end,
}
