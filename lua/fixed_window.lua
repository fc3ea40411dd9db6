-- fixed_window.lua: twin of src/limiter/algorithm/fixed_window.rs.
-- State: string "start:count" for the epoch-aligned window (calendar month for 1mo),
-- shifted by the per-key offset. TTL: until the window ends.

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
}
