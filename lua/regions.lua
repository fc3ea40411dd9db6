-- regions.lua: the sync loop's script for `fleet = "regions"` windows (src/regions/store.rs
-- writes and reads this layout; a test there checks it). Assembled after prelude.lua and
-- fixed_window.lua (rg_key, rg_create, RG_GRACE): a window's count is this region's `own`,
-- its hash rg_key(KEYS[i], start) holds
--   cap, demand                 this region's cap and demand in the window,
--   given:<j>, heard:<j>        what it granted to region j, what it heard of j's grants,
--   c:<j>, d:<j>, w:<j>, h:<j>  region j's count, demand and want, and what j heard of
--                               this region's grants to it (as j last wrote them; max-
--                               merged, so d:<j> keeps the highest demand j reported,
--                               though j's own demand falls when unused leases return);
-- <j> is a region's index (its place among the sorted region names).
--
-- ARGV[1]  now in Unix ms, or '' for the server clock (only tests pass a time).
-- ARGV[2]  'read', 'grant' or 'merge'.
-- ARGV[3]  R, the number of regions.
-- ARGV[4]  this region's index (merge: the receiver's, whose allotment creates the cap).
-- ARGV[5]  merge: the writer's index; otherwise 0.
-- Then, per window key:
--   read   KEYS[i]; start, prev_start (the previous window's start, 0: none).
--          Reply per key: own cap demand prior, then per region j: given heard count
--          demand want heard_of_mine prior (-1: absent; a prior is a demand of the
--          previous window: this region's when its hash exists, or j's when j wrote in
--          it).
--   grant  KEYS[i]; start, end, allot, peer, amount, keep: if cap - own >= amount (the
--          rule) and cap - amount >= keep (the policy's forecast need: two gateways of
--          one region planning alike do not both give the same spare away), adds it to
--          given:<peer> and takes it from cap, atomically with the admissions.
--          Reply per key: 1 granted, 0 not.
--   merge  KEYS[1] the live index (a sorted set of the windows peers wrote, scored by
--          their end: how this region's sync loop learns of a key only its peers saw),
--          then KEYS[i + 1]; start, end, limit, count, demand, want, granted, heard.
--          Refuses a window already over by this server's clock (a held write cannot
--          recreate an expired hash); else max-merges count, demand and heard, sets want,
--          and raises cap by granted - heard:<writer> when positive.
--          Reply per key: 1 merged (the acknowledgement), 0 refused.
--   merge_keys  the same without the index (KEYS[i] are the windows): on a Redis Cluster
--          the windows of one call share a hash tag, and the index is written apart.
-- Reply: one string of integers separated by spaces.

local now = now_ms()
local op = ARGV[2]
local R = tonumber(ARGV[3])
local me = tonumber(ARGV[4])
local from = tonumber(ARGV[5])
local out = {}

local function own_of(key, s)
  local start, count = split2(redis.call('GET', key))
  if start ~= s then return 0 end
  return count
end

local function num(v)
  if v then return tonumber(v) end
  return -1
end

if op == 'read' then
  for i = 1, #KEYS do
    local b = 6 + (i - 1) * 2
    local s, prev = tonumber(ARGV[b]), tonumber(ARGV[b + 1])
    local fields = { 'cap', 'demand' }
    local pfields = { 'demand', 'cap' }
    for j = 0, R - 1 do
      local t = tostring(j)
      for _, f in ipairs({ 'given:', 'heard:', 'c:', 'd:', 'w:', 'h:' }) do
        fields[#fields + 1] = f .. t
      end
      pfields[#pfields + 1] = 'd:' .. t
      pfields[#pfields + 1] = 'w:' .. t
    end
    local v = redis.call('HMGET', rg_key(KEYS[i], s), unpack(fields))
    local p = {}
    if prev > 0 then p = redis.call('HMGET', rg_key(KEYS[i], prev), unpack(pfields)) end
    out[#out + 1] = fmt(own_of(KEYS[i], s))
    out[#out + 1] = fmt(num(v[1]))
    out[#out + 1] = fmt(num(v[2]))
    -- The previous window's hash exists (its cap is made first): its demand, 0 if none.
    local prior = -1
    if p[2] then prior = tonumber(p[1]) or 0 end
    out[#out + 1] = fmt(prior)
    for j = 0, R - 1 do
      local at = 3 + j * 6
      for k = 0, 5 do
        out[#out + 1] = fmt(num(v[at + k]))
      end
      local peer_prior = -1
      if p[4 + j * 2] then peer_prior = tonumber(p[3 + j * 2]) or 0 end
      out[#out + 1] = fmt(peer_prior)
    end
  end
elseif op == 'grant' then
  for i = 1, #KEYS do
    local b = 6 + (i - 1) * 6
    local s, e, allot = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
    local peer, g, keep = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
    local ok = 0
    if now < e and g >= 1 and peer ~= me and peer >= 0 and peer < R then
      local h = rg_key(KEYS[i], s)
      rg_create(h, allot, s, e, now)
      local cap = tonumber(redis.call('HGET', h, 'cap'))
      if cap - own_of(KEYS[i], s) >= g and cap - g >= keep then
        redis.call('HINCRBY', h, 'given:' .. fmt(peer), g)
        redis.call('HINCRBY', h, 'cap', -g)
        ok = 1
      end
    end
    out[#out + 1] = fmt(ok)
  end
elseif op == 'merge' or op == 'merge_keys' then
  local first = 2
  if op == 'merge' then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  else
    first = 1
  end
  local w = fmt(from)
  for i = first, #KEYS do
    local b = 6 + (i - first) * 8
    local s, e, limit = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
    local count, demand, want = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
    local granted, heard = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
    local ok = 0
    if now < e and from ~= me and from >= 0 and from < R then
      local h = rg_key(KEYS[i], s)
      local allot = idiv(limit, R)
      if me < limit % R then allot = allot + 1 end
      rg_create(h, allot, s, e, now)
      local v = redis.call('HMGET', h, 'c:' .. w, 'd:' .. w, 'h:' .. w, 'heard:' .. w)
      local old = tonumber(v[4]) or 0
      redis.call('HSET', h,
        'c:' .. w, fmt(math.max(tonumber(v[1]) or 0, count)),
        'd:' .. w, fmt(math.max(tonumber(v[2]) or 0, demand)),
        'h:' .. w, fmt(math.max(tonumber(v[3]) or 0, heard)),
        'w:' .. w, fmt(want))
      if granted > old then
        redis.call('HINCRBY', h, 'cap', granted - old)
        redis.call('HSET', h, 'heard:' .. w, fmt(granted))
      end
      if first == 2 then
        redis.call('ZADD', KEYS[1], e, KEYS[i] .. '|' .. fmt(s) .. '|' .. fmt(e) .. '|' .. fmt(limit))
      end
      ok = 1
    end
    out[#out + 1] = fmt(ok)
  end
end
return table.concat(out, ' ')
