-- The decision script of a policy whose quotas are all GCRA (kind 0): the same arguments,
-- storage and reply as gcra.lua, and the same decisions, without the other kinds' machinery
-- (no closures or tables built per call but the quotas' times), which is most of the server's
-- time per call. tests/redis_properties.rs and the spec tables run every GCRA policy through
-- this script; the other kinds through gcra.lua.
--
-- KEYS[1]  the key: the quotas' TATs in order, separated by spaces, in microseconds.
-- ARGV     as gcra.lua: cost ("-c" gives back c, "+c" charges c whatever the limit), now or
--          "", the number of quotas n, then per quota 0, emission interval, tolerance; then
--          the bits of the quotas that hold a key to their tolerance.

-- (prelude.lua, before this: cost, force, now, n, key, idiv)
local hold = tonumber(ARGV[4 + 3 * n]) or 0

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
  local c = -cost
  for q = 1, n do
    local t = tat[q]
    if t > now then
      t = t - c * tonumber(ARGV[2 + 3 * q])
      if t < now then t = now end
    end
    tat[q] = t
  end
  save()
  cost = 0
end

local clamped = false
if cost > 0 and not force then
  for q = 1, n do
    local b = tonumber(ARGV[3 + 3 * q])
    if math.floor(hold / 2 ^ (q - 1)) % 2 == 1 and tat[q] > now + b then
      tat[q] = now + b
      clamped = true
    end
  end
end

local outcome = 0
local retry = 0
local new = {}
for q = 1, n do
  local a, b = tonumber(ARGV[2 + 3 * q]), tonumber(ARGV[3 + 3 * q])
  local inc = cost * a
  if inc > b and not force then
    outcome = 2
  else
    local base = tat[q]
    if now > base then base = now end
    local ahead = base + inc - now
    if ahead <= b or force then
      new[q] = base + inc
    else
      if outcome == 0 then outcome = 1 end
      if ahead - b > retry then retry = ahead - b end
    end
  end
end

if outcome == 0 and cost > 0 then
  for q = 1, n do tat[q] = new[q] end
  save()
elseif clamped then
  save()
end
if outcome ~= 1 then retry = 0 end

local reply = {outcome, retry}
for q = 1, n do
  local a, b = tonumber(ARGV[2 + 3 * q]), tonumber(ARGV[3 + 3 * q])
  local ahead = tat[q] - now
  if ahead < 0 then ahead = 0 end
  if ahead > b and math.floor(hold / 2 ^ (q - 1)) % 2 == 1 then ahead = b end
  local remaining = 0
  if b > ahead then remaining = idiv(b - ahead, a) end
  reply[1 + 2 * q] = remaining
  reply[2 + 2 * q] = ahead
end
return reply
