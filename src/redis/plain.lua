-- The decision script of a request or a report (a cost of 0 or more; never a refund or a
-- charge, which gcra.lua makes) on quotas without warm-up: GCRA, fixed window, sliding log,
-- sliding counter. The same arguments, storage, reply and decisions as gcra.lua, with fewer
-- Redis calls and less work per call: a sliding log's words member and its oldest entry come
-- in one read, and an admission writes the words member and the new entry in one.
-- tests/redis/scripts.rs holds it to gcra.lua on random sequences.
--
-- What the server spends, counted under callgrind (BENCHMARKS.md, "Redis throughput"): a
-- number given to redis.call is printed by Redis with '%.17g', about 4 000 instructions for a
-- time in µs, twice string.format('%d'), where a string constant costs nothing, so every
-- argument goes as a string; a pattern match with captures costs about twice a plain find and two subs, so log
-- entries are cut at their fixed offsets; the per-quota tables are sized by their
-- constructors, and an admission writes its new state over the old.
--
-- KEYS[1]  the key, as gcra.lua keeps it.
-- ARGV     as gcra.lua: cost (0 only reports), now or "", the number of quotas n, then per
--          quota its kind (0 to 3) and two numbers; then 0 (no reservation), and for each
--          quota what had left its windows at the changes of quotas (gone, gone_cur); zeros
--          at the end may be left out.
-- Returns  as gcra.lua.

-- (prelude.lua, before this: cost, force, now, n, key, idiv)

-- Integers below 2^53 print alike with '%d' (a C long) and gcra.lua's '%.0f', at half the cost.
local fmt, find, sub = string.format, string.find, string.sub
-- Per quota (at most four; more only grow the tables): its kind as sent ('0' to '3'), its two
-- numbers, what had left its windows, and its words (GCRA: TAT; fixed: end, used; counter:
-- start, prev, cur).
local K, A, B = {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}
local GONE, GONE_CUR = {0, 0, 0, 0}, {0, 0, 0, 0}
local S1, S2, S3 = {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}
local log_width, log_limit = nil, 0
for q = 1, n do
  local k, a, b = ARGV[1 + 3 * q], ARGV[2 + 3 * q] + 0, ARGV[3 + 3 * q] + 0
  K[q], A[q], B[q], S1[q], S2[q], S3[q] = k, a, b, 0, 0, 0
  -- Mostly "0" or left out: compared as a string first, which costs less than a number.
  local g, gc = ARGV[3 + 3 * n + 2 * q], ARGV[4 + 3 * n + 2 * q]
  if g == '0' or not g then GONE[q] = 0 else GONE[q] = tonumber(g) or 0 end
  if gc == '0' or not gc then GONE_CUR[q] = 0 else GONE_CUR[q] = tonumber(gc) or 0 end
  if k == '2' then
    if log_width == nil or b > log_width then log_width = b end
    if a > log_limit then log_limit = a end
  end
end

-- ---- state ----

-- A log entry "<time>:<total, 16 digits>:<cost>" (gcra.lua): its time, and the running
-- total of costs through it; nil for a member of another layout.
local function entry_at(m)
  local p = find(m, ':', 1, true)
  if not p or string.byte(m, p + 17) ~= 58 then return nil end
  return sub(m, 1, p - 1) + 0, sub(m, p + 1, p + 16) + 0
end

-- The running total of costs before a log entry.
local function entry_before(m)
  local p = find(m, ':', 1, true)
  return sub(m, p + 1, p + 16) - sub(m, p + 18)
end

local raw
-- The newest log entry (time, running total), and the oldest one still in the widest window
-- (member, running total before it); nil when the log is empty.
local newest_t, newest_total
local oldest, oldest_before
if log_width then
  -- What no window can see any more goes first: entries with t + width <= now.
  redis.call('ZREMRANGEBYSCORE', key, '(-inf', fmt('%d', now - log_width))
  local top = redis.call('ZRANGE', key, '-1', '-1')[1]
  if top then
    if string.byte(top) == 119 then
      -- The words member alone (score -inf): the log is empty.
      raw = sub(top, 2)
    else
      newest_t, newest_total = entry_at(top)
      -- A log written by an earlier version (one member per unit, without costs) is forgotten.
      if not newest_t then redis.call('DEL', key) end
    end
  end
  if newest_t then
    -- The words member sorts first (score -inf), then the oldest entry.
    local low = redis.call('ZRANGE', key, '0', '1')
    oldest = low[1]
    if string.byte(oldest) == 119 then
      raw = sub(oldest, 2)
      oldest = low[2]
    end
    oldest_before = entry_before(oldest)
  end
else
  raw = redis.call('GET', key)
end
if raw then
  -- The words in order, to each quota but the logs.
  local q, i, pos = 1, 1, 1
  while true do
    while q <= n and K[q] == '2' do q = q + 1 end
    if q > n then break end
    local sp = find(raw, ' ', pos, true)
    local word
    if sp then word = sub(raw, pos, sp - 1) else word = sub(raw, pos) end
    if word == '' then break end
    word = word + 0
    if i == 1 then S1[q] = word elseif i == 2 then S2[q] = word else S3[q] = word end
    local k = K[q]
    if (k == '0' and i == 1) or (k == '1' and i == 2) or i == 3 then
      q, i = q + 1, 1
    else
      i = i + 1
    end
    if not sp then break end
    pos = sp + 1
  end
end

-- The first entry of each log quota's window and the running total before it (nil, 0: none).
local FIRST, BEFORE
if log_width then
  FIRST, BEFORE = {false, false, false, false}, {0, 0, 0, 0}
  for q = 1, n do
    if K[q] == '2' and newest_t then
      local cut = now - B[q]
      if GONE[q] > cut + 1 then cut = GONE[q] - 1 end
      if cut <= now - log_width then
        FIRST[q], BEFORE[q] = oldest, oldest_before
      else
        local found = redis.call('ZRANGEBYSCORE', key, '(' .. fmt('%d', cut), '+inf',
          'LIMIT', '0', '1')[1]
        if found then FIRST[q], BEFORE[q] = found, entry_before(found) end
      end
    end
  end
end

-- The time a request admitted now is logged at: never before the newest entry.
local log_at = now
if newest_t and newest_t > log_at then log_at = newest_t end

-- ---- decision ----

local outcome, retry = 0, 0
for q = 1, n do
  local k, a, b = K[q], A[q], B[q]
  local deny = nil
  if k == '0' then
    local inc = cost * a
    if inc > b then
      outcome = 2
    else
      local base = S1[q]
      if now > base then base = now end
      -- The lead first (exact, as base >= now), then the cost: today\'s time plus both may
      -- pass 2^53 us and round where the lead and the cost alone do not.
      local ahead = (base - now) + inc
      if ahead > b then deny = ahead - b end
    end
  elseif cost > a then
    outcome = 2
  elseif k == '1' then
    local e, used = S1[q], S2[q]
    if not (used > 0 and now < e) then e, used = now + b, 0 end
    if used + cost > a then
      deny = e - now
      if deny < 1 then deny = 1 end
    end
  elseif k == '2' then
    local first, before = FIRST[q], BEFORE[q]
    local cnt = 0
    if first then cnt = newest_total - before end
    if cnt + cost > a then
      -- The oldest entries of the window holding cnt + cost - a must leave it first: the
      -- first whose running total reaches before + cnt + cost - a, found by rank.
      local goal = before + cnt + cost - a
      local lo = redis.call('ZRANK', key, first)
      local hi = redis.call('ZCARD', key) - 1
      while lo < hi do
        local mid = fmt('%d', lo + idiv(hi - lo, 2))
        local m = redis.call('ZRANGE', key, mid, mid)[1]
        local p = find(m, ':', 1, true)
        if sub(m, p + 1, p + 16) + 0 >= goal then hi = mid + 0 else lo = mid + 1 end
      end
      local at = fmt('%d', lo)
      local m = redis.call('ZRANGE', key, at, at)[1]
      deny = sub(m, 1, find(m, ':', 1, true) - 1) + b - now
      if deny < 1 then deny = 1 end
    end
  else
    local start, prev, cur = counter_current(S1[q], S2[q], S3[q], GONE[q], GONE_CUR[q], b)
    if (cur + cost) * b + counter_weighted(start, prev, b) > a * b then
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
  if k == '0' then return S1[q]
  elseif k == '1' then if S2[q] > 0 then return S1[q] end return 0
  elseif k == '2' then
    if newest_t and newest_t >= GONE[q] then return newest_t + b end
    return 0
  else
    return counter_idle(S1[q], S2[q], S3[q], GONE[q], GONE_CUR[q], b)
  end
end

local took = outcome == 0 and cost > 0
-- What an admission took, per quota its spot (two numbers, gcra.lua), after the figures.
local spots
if took then
  -- Every quota admitted: its words become the state after the admission.
  spots = {0, 0, 0, 0, 0, 0, 0, 0}
  local words, w = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0
  for q = 1, n do
    local k, b = K[q], B[q]
    if k == '0' then
      local base = S1[q]
      if now > base then base = now end
      S1[q] = base + cost * A[q]
      spots[2 * q - 1], spots[2 * q] = base, S1[q]
      w = w + 1
      words[w] = fmt('%d', S1[q])
    elseif k == '1' then
      local e, used = S1[q], S2[q]
      if not (used > 0 and now < e) then e, used = now + b, 0 end
      S1[q], S2[q] = e, used + cost
      spots[2 * q - 1], spots[2 * q] = e, 0
      words[w + 1], words[w + 2] = fmt('%d', e), fmt('%d', used + cost)
      w = w + 2
    elseif k == '2' then
      spots[2 * q - 1], spots[2 * q] = log_at, 0
    else
      local start, prev, cur = counter_current(S1[q], S2[q], S3[q], GONE[q], GONE_CUR[q], b)
      S1[q], S2[q], S3[q] = start, prev, cur + cost
      spots[2 * q - 1], spots[2 * q] = start, 0
      words[w + 1], words[w + 2], words[w + 3] = fmt('%d', start), fmt('%d', prev),
        fmt('%d', cur + cost)
      w = w + 3
    end
  end
  local entry, at
  if log_width then
    -- One entry per request, carrying its cost (ARGV[1], an integer as the store sends it).
    local total = (newest_total or 0) + cost
    at = fmt('%d', log_at)
    entry = at .. ':' .. fmt('%016d', total) .. ':' .. ARGV[1]
    -- A window that was empty starts at the new entry, unless the entry's time is gone from
    -- it (a change of quotas made on a clock ahead of the server's).
    for q = 1, n do
      if K[q] == '2' and not FIRST[q] and log_at >= GONE[q] then
        FIRST[q], BEFORE[q] = entry, newest_total or 0
      end
    end
    newest_t, newest_total = log_at, total
  end
  local horizon = 0
  for q = 1, n do
    local h = idle_at(q)
    if h > horizon then horizon = h end
  end
  if horizon <= now then
    redis.call('DEL', key)
  else
    -- The key is idle again at the latest horizon: let Redis forget it then (rounded up to
    -- 1 ms).
    local ttl = math.ceil((horizon - now) / 1000)
    if ttl < 1 then ttl = 1 end
    ttl = fmt('%d', ttl)
    local text = table.concat(words, ' ', 1, w)
    if log_width then
      if text ~= raw then
        if raw then redis.call('ZREM', key, 'w' .. raw) end
        redis.call('ZADD', key, '-inf', 'w' .. text, at, entry)
      else
        redis.call('ZADD', key, at, entry)
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
  if k == '0' then
    local ahead = S1[q] - now
    if ahead < 0 then ahead = 0 end
    remaining = 0
    if b > ahead then remaining = idiv(b - ahead, a) end
    reset = ahead
  elseif k == '1' then
    local e, used = S1[q], S2[q]
    if not (used > 0 and now < e) then e, used = now + b, 0 end
    reset = 0
    if used > 0 then reset = e - now end
    -- More used than the count after a lower count was set while serving: none remaining.
    remaining = a - used
  elseif k == '2' then
    local cnt = 0
    if FIRST[q] then cnt = newest_total - BEFORE[q] end
    reset = 0
    if cnt > 0 then reset = newest_t + b - now end
    remaining = a - cnt
  else
    local start, prev, cur = counter_current(S1[q], S2[q], S3[q], GONE[q], GONE_CUR[q], b)
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
  for i = 1, 2 * n do reply[2 + 2 * n + i] = spots[i] end
end
return reply
