-- sliding_window.lua: twin of src/limiter/algorithm/sliding_window.rs.
-- State: string "start:prev:curr" (the current window's start, the previous window's
-- count, the current window's count). Admission, in integers:
--   prev x (end - now) + (curr + cost) x len <= limit x len
-- TTL: until the end of the next window, when both counts have faded to nothing.
-- Leases are charged to the current window and end with it (a token spent in a later
-- window would be weighted as if spent earlier); unused tokens come back to that window's
-- count: `curr` while the state is that window's, `prev` once it moved to the next one.

local function sw_counts(key, w, now)
  local s, e = bounds(w, now, w.offset)
  local ps = bounds(w, math.max(s - 1, 0), w.offset)
  local start, prev, curr = split3(redis.call('GET', key))
  if start == s then
    return s, e, prev, curr
  elseif start == ps and s > 0 then
    return s, e, curr, 0
  end
  return s, e, 0, 0
end

ALG[2] = {
  decide = function(key, w, now, cost)
    local s, e, prev, curr = sw_counts(key, w, now)
    local len = e - s
    local lim = w.limit
    local after = prev * (e - now) + (curr + cost) * len
    -- div_ceil(after, len), exact in a double after a debt (after itself may not be).
    local current = curr + cost + div_ceil(prev * (e - now), len)
    local _, next_end = bounds(w, e, w.offset)
    if after <= lim * len then
      return decision(1, lim, idiv(lim * len - after, len), current, next_end - now, 0), { s, prev, curr + cost }
    end
    local retry_at
    if curr + cost <= lim then
      local slack = (lim - curr - cost) * len
      retry_at = e - math.min(idiv(slack, math.max(prev, 1)), e - now)
    elseif cost <= lim then
      local next_len = next_end - e
      local slack = (lim - cost) * next_len
      retry_at = next_end - math.min(idiv(slack, math.max(curr, 1)), next_len)
    else
      retry_at = next_end
    end
    local reset_at = now
    if curr > 0 then reset_at = next_end elseif prev > 0 then reset_at = e end
    local retry = retry_at - now
    if retry < 1 then retry = 1 end
    return decision(0, lim, 0, current, reset_at - now, retry), nil
  end,
  write = function(key, w, now, cost, nxt, d)
    redis.call('SET', key, fmt(nxt[1]) .. ':' .. fmt(nxt[2]) .. ':' .. fmt(nxt[3]), 'PX', math.max(d.reset_after, 1))
  end,
  refund = function(key, w, now, cost)
    local s = bounds(w, now, w.offset)
    local start, prev, curr = split3(redis.call('GET', key))
    if not start then return end
    if start == s then
      curr = math.max(curr - cost, 0)
    else
      local ns = bounds(w, select(2, bounds(w, now, w.offset)), w.offset)
      if start ~= ns then return end
      prev = math.max(prev - cost, 0)
    end
    redis.call('SET', key, fmt(start) .. ':' .. fmt(prev) .. ':' .. fmt(curr), 'KEEPTTL')
  end,
  -- Adds up to n tokens to the current window (never beyond the weighted limit), leased
  -- until till or the window's end. Tags: the window's start, 0.
  take = function(key, w, now, n, till)
    if n < 1 or till <= now then return 0, 0, 0, 0 end
    local s, e, prev, curr = sw_counts(key, w, now)
    local len = e - s
    local room = idiv(math.max(w.limit * len - prev * (e - now) - curr * len, 0), len)
    local granted = math.min(n, room)
    if granted < 1 then return 0, 0, 0, 0 end
    local _, next_end = bounds(w, e, w.offset)
    redis.call('SET', key, fmt(s) .. ':' .. fmt(prev) .. ':' .. fmt(curr + granted), 'PX',
               math.max(next_end - now, 1))
    return granted, math.min(till, e), s, 0
  end,
  -- k unused tokens of the lease taken in the window starting at tag1 come back to that
  -- window's count; nothing once the state is two windows on.
  give_back = function(key, w, now, k, tag1, tag2, size)
    local start, prev, curr = split3(redis.call('GET', key))
    if not start then return end
    if start == tag1 then
      curr = math.max(curr - k, 0)
    elseif start == select(2, bounds(w, tag1, w.offset)) then
      prev = math.max(prev - k, 0)
    else
      return
    end
    redis.call('SET', key, fmt(start) .. ':' .. fmt(prev) .. ':' .. fmt(curr), 'KEEPTTL')
  end,
  -- Debt: added to the current window's count, to at most a weighted count of 2 x limit
  -- (prev x (e - now) + curr x len <= 2 x limit x len). Refund: off the count of the
  -- window the request was charged in (its `admitted` time): curr, prev, or nothing when
  -- older. See `settle` in sliding_window.rs.
  settle = function(key, w, now, cost, delta, admitted)
    local s, e, prev, curr = sw_counts(key, w, now)
    if delta > 0 then
      local len = e - s
      local top = idiv(math.max(counter_top(w) * len - prev * (e - now), 0), len)
      curr = add_debt(curr, math.min(delta, debt_ceiling(w)), math.min(top, 4294967295))
    else
      local back = math.min(-delta, cost)
      local charged = bounds(w, admitted, w.offset)
      if charged == s then
        curr = math.max(curr - back, 0)
      elseif s > 0 and charged == bounds(w, s - 1, w.offset) then
        prev = math.max(prev - back, 0)
      else
        return
      end
    end
    local _, next_end = bounds(w, e, w.offset)
    redis.call('SET', key, fmt(s) .. ':' .. fmt(prev) .. ':' .. fmt(curr), 'PX',
               math.max(next_end - now, 1))
  end,
}
