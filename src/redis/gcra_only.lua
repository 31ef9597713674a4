-- The decision script of a policy whose quotas are all GCRA (kind 0): the same arguments,
-- storage and reply as gcra.lua, and the same decisions, without the other kinds' machinery
-- (no closures or tables built per call but the quotas' times), which is most of the server's
-- time per call. tests/redis/scripts.rs holds it to gcra.lua. Every GCRA policy runs through
-- this script; a request on other kinds without warm-up through plain.lua, the rest through
-- gcra.lua.
--
-- KEYS[1]  the key: the quotas' TATs in order, separated by spaces, in microseconds.
-- ARGV     as gcra.lua: cost ("-u" gives back u units, "+c" charges c whatever the limit),
--          now or "", the number of quotas n, then per quota 0, emission interval,
--          tolerance; then the cost of the reservation a refund gives back from (0: none),
--          two zeros per quota, and for a refund with a reservation each quota's slice
--          (start, end).
-- Returns  as gcra.lua: an admission with a cost adds each quota's slice.

-- (prelude.lua, before this: cost, force, now, n, key, idiv)
local reserved = tonumber(ARGV[4 + 3 * n]) or 0

local tat = {}
local raw = redis.call('GET', key)
local found = 0
if raw then
  for word in string.gmatch(raw, '%d+') do
    found = found + 1
    tat[found] = tonumber(word)
  end
end
for q = found + 1, n do tat[q] = 0 end


local function save()
  local words = {}
  local horizon = 0
  for q = 1, n do
    words[q] = string.format('%.0f', tat[q])
    if tat[q] > horizon then horizon = tat[q] end
  end
  if horizon <= now then
    redis.call('DEL', key)
    return
  end
  local ttl = math.ceil((horizon - now) / 1000)
  if ttl < 1 then ttl = 1 end
  redis.call('SET', key, table.concat(words, ' '), 'PX', ttl)
end

if cost < 0 then
  local u = -cost
  if reserved > 0 and u > reserved then u = reserved end
  for q = 1, n do
    local t = tat[q]
    if t > now then
      local back
      if reserved > 0 then
        -- The end part of the request's own slice that is still ahead of now. The slice is
        -- its cost times the interval, so the part is an exact division.
        local sa = tonumber(ARGV[3 + 5 * n + 2 * q])
        local sb = tonumber(ARGV[4 + 5 * n + 2 * q])
        back = 0
        if sb > now then
          local from = sb - (sb - sa) / reserved * u
          if from < now then from = now end
          back = sb - from
        end
      else
        back = u * tonumber(ARGV[2 + 3 * q])
      end
      t = t - back
      if t < now then t = now end
    end
    tat[q] = t
  end
  save()
  cost = 0
end

local outcome = 0
local retry = 0
local new, starts = {}, {}
for q = 1, n do
  local a, b = tonumber(ARGV[2 + 3 * q]), tonumber(ARGV[3 + 3 * q])
  local inc = cost * a
  if inc > b and not force then
    outcome = 2
  else
    local base = tat[q]
    if now > base then base = now end
    -- The lead first (exact, as base >= now), then the cost: today\'s time plus both may
    -- pass 2^53 us and round where the lead and the cost alone do not.
    local ahead = (base - now) + inc
    if ahead <= b or force then
      new[q] = base + inc
      starts[q] = base
    else
      if outcome == 0 then outcome = 1 end
      if ahead - b > retry then retry = ahead - b end
    end
  end
end

local took = outcome == 0 and cost > 0
if took then
  for q = 1, n do tat[q] = new[q] end
  save()
end
if outcome ~= 1 then retry = 0 end

local reply = {outcome, retry}
for q = 1, n do
  local a, b = tonumber(ARGV[2 + 3 * q]), tonumber(ARGV[3 + 3 * q])
  local ahead = tat[q] - now
  if ahead < 0 then ahead = 0 end
  local remaining = 0
  if b > ahead then remaining = idiv(b - ahead, a) end
  reply[1 + 2 * q] = remaining
  reply[2 + 2 * q] = ahead
end
if took and not force then
  for q = 1, n do
    reply[#reply + 1] = starts[q]
    reply[#reply + 1] = new[q]
  end
end
return reply
