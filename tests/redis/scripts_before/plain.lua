-- The decision script of a request or a report (a cost of 0 or more; never a refund or a
-- charge, which gcra.lua makes) on quotas without warm-up: GCRA, fixed window, sliding log,
-- sliding counter. The same arguments, storage, reply and decisions as gcra.lua, without its
-- per-call closures and tables and with fewer Redis calls: a sliding log's words member and
-- its oldest entry come in one read, and an admission writes the words member and the new
-- entry in one. tests/redis/scripts.rs holds it to gcra.lua on random sequences.
--
-- KEYS[1]  the key, as gcra.lua keeps it.
-- ARGV     as gcra.lua: cost (0 only reports), now or "", the number of quotas n, then per
--          quota its kind (0 to 3) and two numbers; then 0 (no reservation), and for each
--          quota what had left its windows at the changes of quotas (gone, gone_cur).
-- Returns  as gcra.lua.

-- (prelude.lua, before this: cost, force, now, n, key, idiv)

-- Integers below 2^53 print alike with '%d' (a C long) and gcra.lua's '%.0f', at half the cost.
local fmt = string.format
local K, A, B, GONE, GONE_CUR = {}, {}, {}, {}, {}
local S1, S2, S3 = {}, {}, {}
local log_width, log_limit = nil, 0
for q = 1, n do
  local k = tonumber(ARGV[1 + 3 * q])
  K[q], A[q], B[q] = k, tonumber(ARGV[2 + 3 * q]), tonumber(ARGV[3 + 3 * q])
  -- Mostly "0": read as a string first, which costs less than a number.
  local g, gc = ARGV[3 + 3 * n + 2 * q], ARGV[4 + 3 * n + 2 * q]
  if g == '0' then GONE[q] = 0 else GONE[q] = tonumber(g) or 0 end
  if gc == '0' then GONE_CUR[q] = 0 else GONE_CUR[q] = tonumber(gc) or 0 end
  if k == 2 then
    if log_width == nil or B[q] > log_width then log_width = B[q] end
    if A[q] > log_limit then log_limit = A[q] end
  end
end

-- ---- state ----

local raw
-- The newest log entry (time, running total), and the oldest one still in the widest window
-- (member, running total before it); nil when the log is empty.
local newest_t, newest_total
local oldest, oldest_before
if log_width then
  -- What no window can see any more goes first: entries with t + width <= now.
  redis.call('ZREMRANGEBYSCORE', key, '(-inf', now - log_width)
  local top = redis.call('ZRANGE', key, -1, -1)[1]
  if top and string.byte(top) ~= 119 then
    local t, total = string.match(top, '^(%d+):(%d+):%d+$')
    if t then
      newest_t, newest_total = tonumber(t), tonumber(total)
    else
      -- A log written by an earlier version (one member per unit, without costs) is forgotten.
      redis.call('DEL', key)
    end
  end
  if newest_t then
    -- The words member sorts first (score -inf), then the oldest entry.
    local low = redis.call('ZRANGE', key, 0, 1)
    local i = 1
    if string.byte(low[1]) == 119 then
      raw = string.sub(low[1], 2)
      i = 2
    end
    oldest = low[i]
    local total, c = string.match(oldest, '^%d+:(%d+):(%d+)$')
    oldest_before = tonumber(total) - tonumber(c)
  else
    local w = redis.call('ZRANGEBYSCORE', key, '-inf', '-inf')[1]
    if w then raw = string.sub(w, 2) end
  end
else
  raw = redis.call('GET', key)
end
do
  local pos = 1
  local flat = {}
  if raw then
    for word in string.gmatch(raw, '%d+') do
      flat[pos] = tonumber(word)
      pos = pos + 1
    end
  end
  pos = 1
  for q = 1, n do
    local k = K[q]
    if k ~= 2 then
      S1[q], S2[q], S3[q] = flat[pos] or 0, flat[pos + 1] or 0, flat[pos + 2] or 0
      if k == 0 then pos = pos + 1 elseif k == 1 then pos = pos + 2 else pos = pos + 3 end
    end
  end
end

-- The first entry of log quota q's window (member, running total before it), or nil.
local function log_first(q)
  if not newest_t then return nil, 0 end
  local b = B[q]
  local cut = now - b
  if GONE[q] > 0 and GONE[q] > cut then cut = GONE[q] end
  if cut <= now - log_width then return oldest, oldest_before end
  local found = redis.call('ZRANGEBYSCORE', key, '(' .. fmt('%d', cut), '+inf', 'LIMIT', 0, 1)[1]
  if not found then return nil, 0 end
  local total, c = string.match(found, '^%d+:(%d+):(%d+)$')
  return found, tonumber(total) - tonumber(c)
end

-- The first entry of each log quota's window, and the running total before it.
local FIRST, BEFORE = {}, {}
for q = 1, n do
  if K[q] == 2 then FIRST[q], BEFORE[q] = log_first(q) end
end

-- Sliding counter q at now: start, prev, cur; what had left the windows of replaced quotas
-- stays gone.
local function counter_current(q, width)
  local start, prev, cur = S1[q], S2[q], S3[q]
  if GONE_CUR[q] > 0 and start <= GONE_CUR[q] then return now, 0, 0 end
  if GONE[q] > 0 and start <= GONE[q] then prev = 0 end
  if prev == 0 and cur == 0 then return now, 0, 0 end
  if now < start + width then return start, prev, cur end
  if cur > 0 and now < start + 2 * width then return start + width, cur, 0 end
  return now, 0, 0
end

local function counter_weighted(start, prev, width)
  local e = now - start
  if e < 0 then e = 0 end
  if e > width then e = width end
  return prev * (width - e)
end

-- The time a request admitted now is logged at: never before the newest entry.
local log_at = now
if newest_t and newest_t > log_at then log_at = newest_t end

-- ---- decision ----

local outcome, retry = 0, 0
-- Per quota, the words after an admission and its spot.
local N1, N2, N3, SPOT = {}, {}, {}, {}
for q = 1, n do
  local k, a, b = K[q], A[q], B[q]
  local deny = nil
  if k == 0 then
    local inc = cost * a
    if inc > b then
      outcome = 2
    else
      local base = S1[q]
      if now > base then base = now end
      local ahead = base + inc - now
      if ahead <= b then
        N1[q], N2[q], N3[q], SPOT[q] = base + inc, 0, 0, base
      else
        deny = ahead - b
      end
    end
  elseif cost > a then
    outcome = 2
  elseif k == 1 then
    local e, used = S1[q], S2[q]
    if not (used > 0 and now < e) then e, used = now + b, 0 end
    if used + cost <= a then
      N1[q], N2[q], N3[q], SPOT[q] = e, used + cost, 0, e
    else
      deny = e - now
      if deny < 1 then deny = 1 end
    end
  elseif k == 2 then
    local first, before = FIRST[q], BEFORE[q]
    local cnt = 0
    if first then cnt = newest_total - before end
    if cnt + cost <= a then
      SPOT[q] = log_at
    else
      -- The oldest entries of the window holding cnt + cost - a must leave it first: the
      -- first whose running total reaches before + cnt + cost - a, found by rank.
      local goal = before + cnt + cost - a
      local lo = redis.call('ZRANK', key, first)
      local hi = redis.call('ZCARD', key) - 1
      while lo < hi do
        local mid = lo + idiv(hi - lo, 2)
        local total = string.match(redis.call('ZRANGE', key, mid, mid)[1], '^%d+:(%d+):')
        if tonumber(total) >= goal then hi = mid else lo = mid + 1 end
      end
      local t = tonumber(string.match(redis.call('ZRANGE', key, lo, lo)[1], '^(%d+):'))
      deny = t + b - now
      if deny < 1 then deny = 1 end
    end
  else
    local start, prev, cur = counter_current(q, b)
    if (cur + cost) * b + counter_weighted(start, prev, b) <= a * b then
      N1[q], N2[q], N3[q], SPOT[q] = start, prev, cur + cost, start
    else
      local function first_fit(count, room)
        if count == 0 then return 0 end
        local keep = idiv(room * b, count)
        if keep > b then keep = b end
        return b - keep
      end
      local at
      if cur + cost <= a then
        at = start + first_fit(prev, a - cur - cost)
      else
        at = start + b + first_fit(cur, a - cost)
      end
      deny = at - now
      if deny < 1 then deny = 1 end
    end
  end
  if deny then
    if outcome == 0 then outcome = 1 end
    if deny > retry then retry = deny end
  end
end

-- When quota q's state is idle again.
local function idle_at(q)
  local k, b = K[q], B[q]
  if k == 0 then return S1[q]
  elseif k == 1 then if S2[q] > 0 then return S1[q] end return 0
  elseif k == 2 then
    if newest_t and (GONE[q] == 0 or newest_t > GONE[q]) then return newest_t + b end
    return 0
  else
    if GONE_CUR[q] > 0 and S1[q] <= GONE_CUR[q] then return 0 end
    local prev = S2[q]
    if GONE[q] > 0 and S1[q] <= GONE[q] then prev = 0 end
    if S3[q] > 0 then return S1[q] + 2 * b end
    if prev > 0 then return S1[q] + b end
    return 0
  end
end

local took = outcome == 0 and cost > 0
if took then
  local words = {}
  for q = 1, n do
    local k = K[q]
    if k ~= 2 then
      S1[q], S2[q], S3[q] = N1[q], N2[q], N3[q]
      words[#words + 1] = fmt('%d', N1[q])
      if k ~= 0 then words[#words + 1] = fmt('%d', N2[q]) end
      if k == 3 then words[#words + 1] = fmt('%d', N3[q]) end
    end
  end
  local entry
  if log_width then
    -- One entry per request, carrying its cost.
    local total = (newest_total or 0) + cost
    entry = fmt('%d', log_at) .. ':' .. fmt('%016d', total) .. ':' .. fmt('%d', cost)
    -- A window that was empty starts at the new entry.
    for q = 1, n do
      if K[q] == 2 and not FIRST[q] then FIRST[q], BEFORE[q] = entry, newest_total or 0 end
    end
    newest_t, newest_total = log_at, total
  end
  local horizon = 0
  for q = 1, n do
    local h = idle_at(q)
    if h > horizon then horizon = h end
  end
  local text = table.concat(words, ' ')
  if horizon <= now then
    redis.call('DEL', key)
  else
    -- The key is idle again at the latest horizon: let Redis forget it then (rounded up to
    -- 1 ms).
    local ttl = math.ceil((horizon - now) / 1000)
    if ttl < 1 then ttl = 1 end
    if log_width then
      if text ~= raw then
        if raw then redis.call('ZREM', key, 'w' .. raw) end
        redis.call('ZADD', key, '-inf', 'w' .. text, log_at, entry)
      else
        redis.call('ZADD', key, log_at, entry)
      end
      redis.call('PEXPIRE', key, ttl)
    else
      redis.call('SET', key, text, 'PX', ttl)
    end
  end
else
  -- A rejection or a report writes nothing; the expiry follows a widened window.
  follow_widening(GONE, idle_at)
end
if outcome ~= 1 then retry = 0 end

-- remaining, reset_after of each quota in the state as it now is.
local reply = {outcome, retry}
for q = 1, n do
  local k, a, b = K[q], A[q], B[q]
  local remaining, reset
  if k == 0 then
    local ahead = S1[q] - now
    if ahead < 0 then ahead = 0 end
    remaining = 0
    if b > ahead then remaining = idiv(b - ahead, a) end
    reset = ahead
  elseif k == 1 then
    local e, used = S1[q], S2[q]
    if not (used > 0 and now < e) then e, used = now + b, 0 end
    reset = 0
    if used > 0 then reset = e - now end
    -- More used than the count after a lower count was set while serving: none remaining.
    remaining = a - used
  elseif k == 2 then
    local cnt = 0
    if FIRST[q] then cnt = newest_total - BEFORE[q] end
    reset = 0
    if cnt > 0 then reset = newest_t + b - now end
    remaining = a - cnt
  else
    local start, prev, cur = counter_current(q, b)
    local weight = idiv(counter_weighted(start, prev, b) + b - 1, b)
    remaining = a - cur - weight
    reset = 0
    if cur > 0 then reset = start + 2 * b - now
    elseif prev > 0 then reset = start + b - now end
  end
  if remaining < 0 then remaining = 0 end
  reply[1 + 2 * q] = remaining
  reply[2 + 2 * q] = reset
end
if took then
  for q = 1, n do
    reply[#reply + 1] = SPOT[q]
    if K[q] == 0 then reply[#reply + 1] = N1[q] else reply[#reply + 1] = 0 end
  end
end
return reply
