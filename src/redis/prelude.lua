-- The arguments every decision script reads alike (gcra.lua describes them), and exact
-- integer division, the sliding-window counter at now, and the expiry that follows a widened
-- window or a live change; put before gcra.lua, gcra_only.lua and plain.lua.

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
local key = KEYS[1]

-- floor(a / b) for integers a >= 0, b > 0 below 2^53, exactly.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- A rejection or a report writes nothing, but a sliding window widened since the key last
-- changed (`gone[q] > 0` for some of the `n` quotas: replaced at least a width after the
-- clock's first instant) may see its entries for longer than its expiry says, and so may any
-- key of a limit changed live (a report whose ARGV[4+3n], a refund's reservation, is "~",
-- sent to every key after a change under which requests may count longer: src/redis/
-- expiry.rs): the expiry follows the latest time a quota goes idle (`idle_at(q)`), in whole
-- milliseconds, and is never shortened.
local function follow_widening(gone, idle_at)
  local replaced = ARGV[4 + 3 * n] == '~'
  for q = 1, n do
    if gone[q] > 0 then replaced = true end
  end
  if not replaced then return end
  local horizon = 0
  for q = 1, n do
    local h = idle_at(q)
    if h > horizon then horizon = h end
  end
  local ttl = math.ceil((horizon - now) / 1000)
  local left = redis.call('PTTL', key)
  if ttl > 0 and left >= 0 and left < ttl then redis.call('PEXPIRE', key, ttl) end
end

-- A sliding-window counter at now, from its stored window start and counts: the current
-- window's start, the previous window's count and its own. What had left the windows of
-- replaced quotas stays gone: times before `g` (the previous count's window) and before `gc`
-- (both counts).
local function counter_current(start, prev, cur, g, gc, width)
  if start < gc then return now, 0, 0 end
  if start < g then prev = 0 end
  if prev == 0 and cur == 0 then return now, 0, 0 end
  if now < start + width then return start, prev, cur end
  if cur > 0 and now < start + 2 * width then return start + width, cur, 0 end
  return now, 0, 0
end

-- When a sliding-window counter stored as (start, prev, cur) is idle (0: it is now); what had
-- left the windows of replaced quotas stays gone, as in `counter_current`.
local function counter_idle(start, prev, cur, g, gc, width)
  if start < gc then return 0 end
  if start < g then prev = 0 end
  if cur > 0 then return start + 2 * width end
  if prev > 0 then return start + width end
  return 0
end

-- The weight of a counter's previous window at now, times the width.
local function counter_weighted(start, prev, width)
  local e = now - start
  if e < 0 then e = 0 end
  if e > width then e = width end
  return prev * (width - e)
end
