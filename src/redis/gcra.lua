-- Every quota of one key, all or nothing: the same decisions as src/gcra.rs (GCRA) and
-- src/algo/window.rs (fixed window, sliding-window log, sliding-window counter).
--
-- KEYS[1]  the key. Without a sliding-log quota, a string: the quotas' words in order,
--          separated by spaces (GCRA: its TAT; fixed window: start, used; counter: start,
--          prev, cur). With one, a sorted set: the log, one member "<time>:<index>" per unit
--          of cost at score <time>, and the words as the member "w<words>" at score -inf.
--          Times in microseconds. Absent is an idle key.
-- ARGV[1]  cost (0 only reports); a negative cost -c gives back a request of cost c admitted
--          earlier (src/algo/mod.rs `KeyState::refund`; the log loses its newest c entries);
--          "+c" charges c whatever the limit (a cost settled after the response): decided as
--          if every quota admitted it, beyond the limit if need be (`KeyState::charge`)
-- ARGV[2]  now in microseconds, or "" to use the server's TIME (shared by every instance)
-- ARGV[3]  number of quotas n, then for quota i: ARGV[1+3i] kind (0 GCRA, 1 fixed window,
--          2 sliding log, 3 sliding counter, 4 GCRA with warm-up), ARGV[2+3i], ARGV[3+3i]:
--          GCRA emission interval and tolerance, or a window's count and width, in
--          microseconds
-- ARGV[4+3n] bit q-1 set: GCRA quota q was replaced while serving and a key may still hold a
--          time earned under the old quota beyond this one's tolerance (src/gcra.rs
--          `Gcra::holds`); such a time is held to the tolerance. A warm-up quota's state is
--          carried as it is.
-- ARGV[5+3n..] for each warm-up quota in order, its warm-up period in microseconds and its
--          cold factor (src/warmup.rs; its words are the TAT and the deficit of stored permits)
--
-- Returns {outcome, retry_after, remaining_1, reset_after_1, ..., remaining_n, reset_after_n}
-- with outcome 0 = allowed, 1 = limited, 2 = never admissible; times in microseconds.
-- Every number stays below 2^53, where Lua's doubles are exact integers.

-- (prelude.lua, before this: cost, force, now, n, key, idiv)

local function fmt(x) return string.format('%.0f', x) end

local kind, pa, pb = {}, {}, {}
local warm = {}
local log_width = nil
local log_limit = 0
do
  local extra = 5 + 3 * n
  for q = 1, n do
    kind[q] = tonumber(ARGV[1 + 3 * q])
    pa[q] = tonumber(ARGV[2 + 3 * q])
    pb[q] = tonumber(ARGV[3 + 3 * q])
    if kind[q] == 2 and (log_width == nil or pb[q] > log_width) then log_width = pb[q] end
    if kind[q] == 2 and pa[q] > log_limit then log_limit = pa[q] end
    if kind[q] == 4 then
      warm[q] = {period = tonumber(ARGV[extra]), cold = tonumber(ARGV[extra + 1])}
      extra = extra + 2
    end
  end
end
local hold = tonumber(ARGV[4 + 3 * n]) or 0
local WORDS = {[0] = 1, [1] = 2, [2] = 0, [3] = 3, [4] = 2}


-- floor(x * y / d) exactly, for integers 0 <= x, y < 2^52 and 0 < d < 2^52 whose result is
-- below 2^53 (src/warmup.rs computes the same in 128 bits). A product beyond 2^52 is taken
-- bit by bit: x * y = x * (q0 * d + r0), and x * r0 is divided by doubling.
local function muldiv(x, y, d)
  if x == 0 or y == 0 then return 0 end
  local p = x * y
  if p < 4503599627370496 then return idiv(p, d) end
  local q0 = idiv(y, d)
  local r0 = y - q0 * d
  local bits, m = {}, x
  while m > 0 do
    local b = m % 2
    bits[#bits + 1] = b
    m = (m - b) / 2
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q = q * 2
    r = r * 2
    if r >= d then r = r - d; q = q + 1 end
    if bits[i] == 1 then
      r = r + r0
      if r >= d then r = r - d; q = q + 1 end
    end
  end
  return x * q0 + q
end

-- The warm-up curve of quota q (src/warmup.rs `Curve`), in microseconds; stored permits are
-- measured in time and kept as the deficit below `max` (0: fully cold, as a key never seen).
local curves = {}
local function curve(q)
  local c = curves[q]
  if c then return c end
  local w = warm[q]
  local zone = idiv(2 * w.period, w.cold + 1)
  local threshold = idiv(w.period, 2)
  c = {t = pa[q], period = w.period, cold = w.cold, threshold = threshold, zone = zone,
       max = threshold + zone}
  curves[q] = c
  return c
end

local function warm_regain(c, deficit, idle)
  if deficit == 0 or idle <= 0 then return deficit end
  if idle > c.period then idle = c.period end
  local d = deficit - muldiv(idle, c.max, c.period)
  if d < 0 then d = 0 end
  return d
end

local function warm_surcharge_to(c, x)
  if c.zone == 0 or c.cold == 1 or x <= 0 then return 0 end
  return muldiv(x, (c.cold - 1) * x, 2 * c.zone)
end

local function warm_above(c, deficit)
  local a = c.max - deficit - c.threshold
  if a < 0 then a = 0 end
  return a
end

-- The surcharge of n requests taken one after another from `deficit`.
local function warm_surcharge(c, deficit, n)
  local a = warm_above(c, deficit)
  local k = c.t * n
  if k > a then k = a end
  return warm_surcharge_to(c, a) - warm_surcharge_to(c, a - k)
end

-- The state as of now: (base, deficit).
local function warm_resync(q, s)
  if s[1] < now then return now, warm_regain(curve(q), s[2], now - s[1]) end
  return s[1], s[2]
end

-- The most requests of cost 1 that fit in `budget` from `deficit`.
local function warm_fits(c, deficit, budget)
  local hi = idiv(budget, c.t)
  local function fits(k) return k * c.t + warm_surcharge(c, deficit, k) <= budget end
  if fits(hi) then return hi end
  local lo = 0
  while hi - lo > 1 do
    local mid = lo + idiv(hi - lo, 2)
    if fits(mid) then lo = mid else hi = mid end
  end
  return lo
end

-- ---- state ----

local raw
if log_width then
  -- What no window can see any more goes first: entries with t + width <= now.
  redis.call('ZREMRANGEBYSCORE', key, 0, now - log_width)
  local w = redis.call('ZRANGEBYSCORE', key, '-inf', '-inf')
  if w[1] then raw = string.sub(w[1], 2) end
else
  raw = redis.call('GET', key)
end
local flat = {}
if raw then
  for word in string.gmatch(raw, '%d+') do flat[#flat + 1] = tonumber(word) end
end
local st = {}
do
  local pos = 1
  for q = 1, n do
    st[q] = {flat[pos] or 0, flat[pos + 1] or 0, flat[pos + 2] or 0}
    pos = pos + WORDS[kind[q]]
  end
end

local function log_count(width)
  if not log_width then return 0 end
  return redis.call('ZCOUNT', key, '(' .. fmt(now - width), '+inf')
end

local function log_newest()
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] and top[2] ~= '-inf' then return tonumber(top[2]) end
  return nil
end

-- ---- the kinds ----

-- Fixed window: the current window at now.
local function fixed_current(s, width)
  if s[2] > 0 and now < s[1] + width then return s[1], s[2] end
  return now, 0
end

-- Sliding counter: the current window at now (start, prev, cur).
local function counter_current(s, width)
  local start, prev, cur = s[1], s[2], s[3]
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

-- Returns 'allow', new state | 'deny', retry | 'never'
local function step(q, c)
  local k, a, b, s = kind[q], pa[q], pb[q], st[q]
  if k == 4 then
    local inc = c * a
    if inc > b and not force then return 'never' end
    local base, deficit = warm_resync(q, s)
    local ahead = base + inc - now
    if ahead > b and not force then return 'deny', ahead - b end
    local cv = curve(q)
    local stored = cv.max - deficit
    if stored < 0 then stored = 0 end
    local spent = inc
    if spent > stored then spent = stored end
    local above = warm_above(cv, deficit)
    local kk = spent
    if kk > above then kk = above end
    local extra = warm_surcharge_to(cv, above) - warm_surcharge_to(cv, above - kk)
    return 'allow', {base + inc + extra, deficit + spent, 0}
  end
  if k == 0 then
    local inc = c * a
    if inc > b and not force then return 'never' end
    local base = s[1]
    if now > base then base = now end
    local ahead = base + inc - now
    if ahead <= b or force then return 'allow', {base + inc, 0, 0} end
    return 'deny', ahead - b
  end
  if c > a and not force then return 'never' end
  if k == 1 then
    local start, used = fixed_current(s, b)
    if used + c <= a or force then return 'allow', {start, used + c, 0} end
    local r = start + b - now
    if r < 1 then r = 1 end
    return 'deny', r
  elseif k == 2 then
    local cnt = log_count(b)
    if cnt + c <= a or force then return 'allow', {0, 0, 0} end
    local kth = cnt + c - a
    local t = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - b), '+inf', 'WITHSCORES',
      'LIMIT', kth - 1, 1)
    local r = tonumber(t[2]) + b - now
    if r < 1 then r = 1 end
    return 'deny', r
  else
    local start, prev, cur = counter_current(s, b)
    if force or (cur + c) * b + counter_weighted(start, prev, b) <= a * b then
      return 'allow', {start, prev, cur + c}
    end
    local function first_fit(count, room)
      if count == 0 then return 0 end
      local keep = idiv(room * b, count)
      if keep > b then keep = b end
      return b - keep
    end
    local at
    if cur + c <= a then
      at = start + first_fit(prev, a - cur - c)
    else
      at = start + b + first_fit(cur, a - c)
    end
    local r = at - now
    if r < 1 then r = 1 end
    return 'deny', r
  end
end

-- remaining, reset_after of quota q in the current state
local function figures(q)
  local k, a, b, s = kind[q], pa[q], pb[q], st[q]
  if k == 4 then
    local base, deficit = warm_resync(q, s)
    local ahead = base - now
    local remaining = 0
    if b - ahead >= a then remaining = warm_fits(curve(q), deficit, b - ahead - a) + 1 end
    return remaining, ahead
  elseif k == 0 then
    local ahead = s[1] - now
    if ahead < 0 then ahead = 0 end
    -- A time earned under a replaced quota reads as held to the tolerance; a debt does not.
    if ahead > b and math.floor(hold / 2 ^ (q - 1)) % 2 == 1 then ahead = b end
    local remaining = 0
    if b > ahead then remaining = idiv(b - ahead, a) end
    return remaining, ahead
  elseif k == 1 then
    local start, used = fixed_current(s, b)
    local reset = 0
    if used > 0 then reset = start + b - now end
    -- More used than the count after a lower count was set while serving: none remaining.
    local remaining = a - used
    if remaining < 0 then remaining = 0 end
    return remaining, reset
  elseif k == 2 then
    local cnt = log_count(b)
    local reset = 0
    if cnt > 0 then reset = log_newest() + b - now end
    local remaining = a - cnt
    if remaining < 0 then remaining = 0 end
    return remaining, reset
  else
    local start, prev, cur = counter_current(s, b)
    local weighted = counter_weighted(start, prev, b)
    local weight = idiv(weighted + b - 1, b)
    local remaining = a - cur - weight
    if remaining < 0 then remaining = 0 end
    local reset = 0
    if cur > 0 then reset = start + 2 * b - now
    elseif prev > 0 then reset = start + b - now end
    return remaining, reset
  end
end

-- When quota q's state is idle again.
local function idle_at(q)
  local k, b, s = kind[q], pb[q], st[q]
  if k == 4 then
    -- No backlog and fully cold again (rounded up by 1 µs, which only keeps it longer).
    local c = curve(q)
    if s[2] <= 0 or c.max == 0 then return s[1] end
    return s[1] + muldiv(s[2], c.period, c.max) + 1
  elseif k == 0 then return s[1]
  elseif k == 1 then if s[2] > 0 then return s[1] + b end return 0
  elseif k == 2 then
    local t = log_newest()
    if t then return t + b end
    return 0
  else
    if s[3] > 0 then return s[1] + 2 * b end
    if s[2] > 0 then return s[1] + b end
    return 0
  end
end

-- Writes the words (and the log's expiry) back; an idle key is deleted.
local function save()
  local words = {}
  local horizon = 0
  for q = 1, n do
    local k, s = kind[q], st[q]
    for i = 1, WORDS[k] do words[#words + 1] = fmt(s[i]) end
    local h = idle_at(q)
    if h > horizon then horizon = h end
  end
  if horizon <= now then
    redis.call('DEL', key)
    return
  end
  -- The key is idle again at the latest horizon: let Redis forget it then (rounded up to 1 ms).
  local ttl = math.ceil((horizon - now) / 1000)
  if ttl < 1 then ttl = 1 end
  if log_width then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', '-inf')
    redis.call('ZADD', key, '-inf', 'w' .. table.concat(words, ' '))
    redis.call('PEXPIRE', key, ttl)
  else
    redis.call('SET', key, table.concat(words, ' '), 'PX', ttl)
  end
end

-- ---- refund ----

if cost < 0 then
  local c = -cost
  for q = 1, n do
    local k, a, b, s = kind[q], pa[q], pb[q], st[q]
    if k == 0 or k == 4 then
      -- Warm-up: the TAT moves back by the stable cost, the warm-up is kept.
      local tat = s[1]
      if tat > now then
        tat = tat - c * a
        if tat < now then tat = now end
      end
      if k == 4 then st[q] = {tat, s[2], 0} else st[q] = {tat, 0, 0} end
    elseif k == 1 then
      local start, used = fixed_current(s, b)
      used = used - c
      if used <= 0 then st[q] = {0, 0, 0} else st[q] = {start, used, 0} end
    elseif k == 3 then
      local start, prev, cur = counter_current(s, b)
      local from_cur = c
      if from_cur > cur then from_cur = cur end
      prev = prev - (c - from_cur)
      if prev < 0 then prev = 0 end
      cur = cur - from_cur
      if prev == 0 and cur == 0 then st[q] = {0, 0, 0} else st[q] = {start, prev, cur} end
    end
  end
  if log_width then
    local have = redis.call('ZCOUNT', key, 0, '+inf')
    local take = c
    if take > have then take = have end
    if take > 0 then redis.call('ZPOPMAX', key, take) end
  end
  save()
  cost = 0
end

-- ---- decision ----

-- A GCRA TAT more than the tolerance ahead, while a replaced quota may explain it, was earned
-- under that quota: it is brought back to exactly the tolerance ahead, and stored so even when
-- the request is rejected (src/gcra.rs `Gcra::held`). Otherwise it is a debt a charge made
-- after a response ("+c"), which stands; a charge itself is never held.
local clamped = false
if cost > 0 and not force then
  for q = 1, n do
    if kind[q] == 0 and math.floor(hold / 2 ^ (q - 1)) % 2 == 1 and st[q][1] > now + pb[q] then
      st[q] = {now + pb[q], 0, 0}
      clamped = true
    end
  end
end

local outcome = 0
local retry = 0
local new = {}
for q = 1, n do
  local verdict, v = step(q, cost)
  if verdict == 'allow' then
    new[q] = v
  elseif verdict == 'deny' then
    if outcome == 0 then outcome = 1 end
    if v > retry then retry = v end
  else
    outcome = 2
  end
end

if outcome == 0 and cost > 0 then
  for q = 1, n do st[q] = new[q] end
  if log_width then
    -- Times never go back in the log (a server clock that stepped back counts as the newest).
    local at = now
    local newest = log_newest()
    if newest and newest > at then at = newest end
    local stamp = fmt(at)
    local have = redis.call('ZCOUNT', key, at, at)
    local args = {}
    -- A charge logs at most the largest limit: more entries at one time change no decision.
    local logged = cost
    if force and logged > log_limit then logged = log_limit end
    for i = 0, logged - 1 do
      args[#args + 1] = at
      args[#args + 1] = stamp .. ':' .. string.format('%010d', have + i)
    end
    -- ZADD in slices: Lua's unpack has a limit on the number of values.
    local i = 1
    while i <= #args do
      local last = i + 1999
      if last > #args then last = #args end
      redis.call('ZADD', key, unpack(args, i, last))
      i = last + 1
    end
  end
  save()
elseif clamped then
  save()
end
if outcome ~= 1 then retry = 0 end

local reply = {outcome, retry}
for q = 1, n do
  local remaining, reset = figures(q)
  reply[1 + 2 * q] = remaining
  reply[2 + 2 * q] = reset
end
return reply
