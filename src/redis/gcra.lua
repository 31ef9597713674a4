-- GCRA for every quota of one key, all or nothing: the same decision as src/gcra.rs.
--
-- KEYS[1]  the key; its value is the quotas' theoretical arrival times (TAT), in microseconds,
--          separated by spaces. Absent, or a TAT <= now, is an idle key.
-- ARGV[1]  cost (0 only reports); a negative cost -c gives back a request of cost c admitted
--          earlier: each TAT moves back by c * interval, never below now, and a TAT already
--          <= now is left as it is (the same rule as src/store/memory.rs `refunded`);
--          "+c" charges c whatever the limit (a cost settled after the response): each TAT
--          moves c * interval past max(TAT, now), beyond the tolerance if need be (`charged`)
-- ARGV[2]  now in microseconds, or "" to use the server's TIME (shared by every instance)
-- ARGV[3]  number of quotas n, then ARGV[2+2i], ARGV[3+2i]: emission interval and tolerance
--          of quota i, in microseconds
--
-- Returns {outcome, retry_after, remaining_1, reset_after_1, ..., remaining_n, reset_after_n}
-- with outcome 0 = allowed, 1 = limited, 2 = never admissible; times in microseconds.
-- Every number stays below 2^53, where Lua's doubles are exact integers.

local cost = tonumber(ARGV[1])
local force = string.byte(ARGV[1]) == 43
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
local n = tonumber(ARGV[3])

local tats = {}
local raw = redis.call('GET', KEYS[1])
if raw then
  local i = 0
  for word in string.gmatch(raw, '%d+') do
    i = i + 1
    tats[i] = tonumber(word)
  end
end

local outcome = 0
local retry = 0

if cost < 0 then
  local words = {}
  local horizon = now
  local moved = false
  for q = 1, n do
    local interval = tonumber(ARGV[2 + 2 * q])
    local tat = tats[q] or 0
    if tat > now then
      tat = tat + cost * interval
      if tat < now then tat = now end
      moved = true
    end
    tats[q] = tat
    words[q] = string.format('%.0f', tat)
    if tat > horizon then horizon = tat end
  end
  if moved then
    if horizon > now then
      local ttl = math.ceil((horizon - now) / 1000)
      redis.call('SET', KEYS[1], table.concat(words, ' '), 'PX', ttl)
    else
      redis.call('DEL', KEYS[1])
    end
  end
  cost = 0
end

local new = {}
for q = 1, n do
  local interval = tonumber(ARGV[2 + 2 * q])
  local tolerance = tonumber(ARGV[3 + 2 * q])
  local tat = tats[q] or 0
  local inc = cost * interval
  if inc > tolerance and not force then
    outcome = 2
  else
    local base = tat
    if now > base then base = now end
    local ahead = base + inc - now
    if ahead <= tolerance or force then
      new[q] = base + inc
    else
      if outcome == 0 then outcome = 1 end
      if ahead - tolerance > retry then retry = ahead - tolerance end
    end
  end
end

if outcome == 0 and cost > 0 then
  local words = {}
  local horizon = now
  for q = 1, n do
    tats[q] = new[q]
    words[q] = string.format('%.0f', new[q])
    if new[q] > horizon then horizon = new[q] end
  end
  -- The key is idle again at the latest TAT: let Redis forget it then (rounded up to 1 ms).
  local ttl = math.ceil((horizon - now) / 1000)
  if ttl < 1 then ttl = 1 end
  redis.call('SET', KEYS[1], table.concat(words, ' '), 'PX', ttl)
end

local reply = {outcome, retry}
for q = 1, n do
  local interval = tonumber(ARGV[2 + 2 * q])
  local tolerance = tonumber(ARGV[3 + 2 * q])
  local ahead = (tats[q] or 0) - now
  if ahead < 0 then ahead = 0 end
  local remaining = 0
  if tolerance > ahead then remaining = math.floor((tolerance - ahead) / interval) end
  reply[1 + 2 * q] = remaining
  reply[2 + 2 * q] = ahead
end
return reply
