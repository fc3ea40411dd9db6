-- fixed_window.lua: twin of src/limiter/algorithm/fixed_window.rs.
-- State: string "start:count" for the epoch-aligned window (calendar month for 1mo),
-- shifted by the per-key offset. TTL: until the window ends. Leases are charged to the
-- window and end with it; unused tokens come back only while it lasts.

ALG[3] = {
  decide = function(key, w, now, cost)
    local s, e = bounds(w, now, w.offset)
    local start, count = split2(redis.call('GET', key))
    if start ~= s then count = 0 end
    local current = count + cost
    local reset = e - now
    if current <= w.limit then
      return decision(1, w.limit, w.limit - current, current, reset, 0), { s, current }
    end
    return decision(0, w.limit, 0, current, reset, reset), nil
  end,
  write = function(key, w, now, cost, nxt, d)
    redis.call('SET', key, fmt(nxt[1]) .. ':' .. fmt(nxt[2]), 'PX', math.max(d.reset_after, 1))
  end,
  refund = function(key, w, now, cost)
    local s = bounds(w, now, w.offset)
    local start, count = split2(redis.call('GET', key))
    if start ~= s then return end
    count = count - cost
    if count < 0 then count = 0 end
    redis.call('SET', key, fmt(start) .. ':' .. fmt(count), 'KEEPTTL')
  end,
  -- Adds up to n tokens (never beyond the limit), leased until till or the window's end.
  -- Tags: the window's start, 0.
  take = function(key, w, now, n, till)
    if n < 1 or till <= now then return 0, 0, 0, 0 end
    local s, e = bounds(w, now, w.offset)
    local start, count = split2(redis.call('GET', key))
    if start ~= s then count = 0 end
    local granted = math.min(n, math.max(w.limit - count, 0))
    if granted < 1 then return 0, 0, 0, 0 end
    redis.call('SET', key, fmt(s) .. ':' .. fmt(count + granted), 'PX', math.max(e - now, 1))
    return granted, math.min(till, e), s, 0
  end,
  -- k unused tokens of the lease taken in the window starting at tag1 come back while the
  -- state is still that window's; later they are gone with it.
  give_back = function(key, w, now, k, tag1, tag2, size)
    local start, count = split2(redis.call('GET', key))
    if start ~= tag1 then return end
    count = count - k
    if count < 0 then count = 0 end
    redis.call('SET', key, fmt(start) .. ':' .. fmt(count), 'KEEPTTL')
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
    elseif start == s and bounds(w, admitted, w.offset) == s then
      count = math.max(count - math.min(-delta, cost), 0)
      redis.call('SET', key, fmt(s) .. ':' .. fmt(count), 'KEEPTTL')
    end
  end,
}
