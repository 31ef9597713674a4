-- Every quota of one key, all or nothing: the same decisions as src/gcra.rs (GCRA) and
-- src/algo/window.rs (fixed window, sliding-window log, sliding-window counter).
--
-- KEYS[1]  the key. Without a sliding-log quota, a string: the quotas' words in order,
--          separated by spaces (GCRA: its TAT; fixed window: end, used; counter: start,
--          prev, cur). With one, a sorted set: the log, one member "<time>:<total>:<cost>"
--          per request at score <time> (<total>: the running total of costs through it, 16
--          digits, so that members of one time sort as they were added), and the words as the
--          member "w<words>" at score -inf. Times in microseconds. Absent is an idle key.
-- ARGV[1]  cost (0 only reports); a negative cost -u gives back u units of a request admitted
--          earlier: of what its reservation (below) took, only what still counts (src/algo/
--          mod.rs `KeyState::refund`); without one (units of an expired lease), u emission intervals of
--          each time, never before now, and the newest log entries. "+c" charges c whatever
--          the limit (a cost settled after the response): decided as if every quota admitted
--          it, beyond the limit if need be (`KeyState::charge`)
-- ARGV[2]  now in microseconds, or "" to use the server's TIME (shared by every instance)
-- ARGV[3]  number of quotas n, then for quota i: ARGV[1+3i] kind (0 GCRA, 1 fixed window,
--          2 sliding log, 3 sliding counter, 4 GCRA with warm-up), ARGV[2+3i], ARGV[3+3i]:
--          GCRA emission interval and tolerance, or a window's count and width, in
--          microseconds
-- ARGV[4+3n] for a refund, the cost of the reservation it gives back from (0: none); for a
--          report, "~" lengthens the key's expiry to when it is idle under these quotas
--          (prelude.lua `follow_widening`)
-- ARGV[5+3n..] for each warm-up quota in order, its warm-up period in microseconds and its
--          cold factor (src/warmup.rs; its words are the TAT and the deficit of stored permits)
-- then     for each quota, what had left its windows at the changes of quotas (src/algo/
--          window.rs `Window::replacing`): gone, gone_cur, times before which it is gone (0:
--          nothing; 0 for other kinds)
-- then     for a refund with a reservation, each quota's spot (src/gcra.rs `Reservation`):
--          GCRA and warm-up the slice start, end; fixed window its end, 0; counter its start,
--          0; log the entry's time, 0
-- then     after live changes of a warm-up curve (src/redis/script.rs `Renewals`), how many,
--          then for each, oldest first, its time, for each warm-up quota in order its
--          period and cold factor before it, and for each sliding log or counter in order its
--          width and gone times (as above) before it: a key idle at one of those times under
--          the quotas then in force is a new key, whatever time to live it has left
--          Arguments left out at the end (after any warm-up settings) read as 0.
--
-- Returns {outcome, retry_after, remaining_1, reset_after_1, ..., remaining_n, reset_after_n}
-- with outcome 0 = allowed, 1 = limited, 2 = never admissible; times in microseconds; an
-- admission with a cost adds each quota's spot (two numbers, as above), what it took.
-- Every number stays below 2^53, where Lua's doubles are exact integers.

-- (prelude.lua, before this: cost, force, now, n, key, idiv)

local function fmt(x) return string.format('%.0f', x) end

local kind, pa, pb = {}, {}, {}
local warm = {}
local log_width = nil
local reserved = tonumber(ARGV[4 + 3 * n]) or 0
local gone, gone_cur, spot_a, spot_b = {}, {}, {}, {}
local renewals = {}
do
  local extra = 5 + 3 * n
  for q = 1, n do
    kind[q] = tonumber(ARGV[1 + 3 * q])
    pa[q] = tonumber(ARGV[2 + 3 * q])
    pb[q] = tonumber(ARGV[3 + 3 * q])
    if kind[q] == 2 and (log_width == nil or pb[q] > log_width) then log_width = pb[q] end
    if kind[q] == 4 then
      warm[q] = {period = tonumber(ARGV[extra]), cold = tonumber(ARGV[extra + 1])}
      extra = extra + 2
    end
  end
  for q = 1, n do
    gone[q] = tonumber(ARGV[extra + 2 * q - 2]) or 0
    gone_cur[q] = tonumber(ARGV[extra + 2 * q - 1]) or 0
    spot_a[q] = tonumber(ARGV[extra + 2 * n + 2 * q - 2]) or 0
    spot_b[q] = tonumber(ARGV[extra + 2 * n + 2 * q - 1]) or 0
  end
  local at = extra + 4 * n + 1
  for i = 1, tonumber(ARGV[extra + 4 * n]) or 0 do
    local r = {at = tonumber(ARGV[at]), warm = {}, win = {}}
    at = at + 1
    for q = 1, n do
      if kind[q] == 4 then
        r.warm[q] = {period = tonumber(ARGV[at]), cold = tonumber(ARGV[at + 1])}
        at = at + 2
      end
    end
    for q = 1, n do
      if kind[q] == 2 or kind[q] == 3 then
        r.win[q] = {width = tonumber(ARGV[at]), gone = tonumber(ARGV[at + 1]),
                    gone_cur = tonumber(ARGV[at + 2])}
        at = at + 3
      end
    end
    renewals[i] = r
  end
end
local WORDS = {[0] = 1, [1] = 2, [2] = 0, [3] = 3, [4] = 2}


-- floor(x * y / d) exactly, for integers 0 <= x, y < 2^52 and 0 < d < 2^52 whose result is
-- below 2^53 (src/warmup.rs computes the same in 128 bits), and the remainder. A product
-- beyond 2^52 is taken bit by bit: x * y = x * (q0 * d + r0), and x * r0 is divided by
-- doubling.
local function muldiv(x, y, d)
  if x == 0 or y == 0 then return 0, 0 end
  local p = x * y
  if p < 4503599627370496 then
    local q = idiv(p, d)
    return q, p - q * d
  end
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
  return x * q0 + q, r
end

-- The warm-up curve of quota q (src/warmup.rs `Curve`), in microseconds; stored permits are
-- measured in time and kept as the deficit below `max` (0: fully cold, as a key never seen).
local function curve_of(t, w)
  local zone = idiv(2 * w.period, w.cold + 1)
  local threshold = idiv(w.period, 2)
  return {t = t, period = w.period, cold = w.cold, threshold = threshold, zone = zone,
          max = threshold + zone}
end
local curves = {}
local function curve(q)
  local c = curves[q]
  if c then return c end
  c = curve_of(pa[q], warm[q])
  curves[q] = c
  return c
end

local function warm_regain(c, deficit, idle)
  if deficit == 0 or idle <= 0 then return deficit end
  if idle > c.period then idle = c.period end
  -- A deficit beyond max (stored under a larger curve) regains from max, as in memory.
  if deficit > c.max then deficit = c.max end
  local d = deficit - muldiv(idle, c.max, c.period)
  if d < 0 then d = 0 end
  return d
end

local function warm_surcharge_to(c, x)
  if c.zone == 0 or c.cold == 1 or x <= 0 then return 0 end
  return (muldiv(x, (c.cold - 1) * x, 2 * c.zone))
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

-- A log entry: its time, the running total of costs through it, and its own cost.
local function entry(m)
  local t, total, c = string.match(m, '^(%d+):(%d+):(%d+)$')
  return tonumber(t), tonumber(total), tonumber(c)
end

local function member(t, total, c)
  return fmt(t) .. ':' .. string.format('%016.0f', total) .. ':' .. fmt(c)
end

local raw
-- The newest log entry (time, running total, cost), read once and then kept in step with the
-- script's own writes: `newest_known` is false until it is read, and again after a write that
-- may change it other than by adding the newest entry.
local newest_t, newest_total, newest_c
local newest_known = false
if log_width then
  -- What no window can see any more goes first: entries with t + width <= now.
  redis.call('ZREMRANGEBYSCORE', key, '(-inf', fmt(now - log_width))
  -- A log written by an earlier version (one member per unit, without costs) is forgotten.
  local top = redis.call('ZRANGE', key, '-1', '-1')
  if top[1] and string.byte(top[1]) ~= 119 then
    if string.match(top[1], '^%d+:%d+:%d+$') then
      newest_t, newest_total, newest_c = entry(top[1])
    else
      redis.call('DEL', key)
    end
  end
  newest_known = true
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

-- The newest log entry: time, running total, cost (nil when the log is empty).
local function log_newest()
  if not newest_known then
    local top = redis.call('ZRANGE', key, '-1', '-1')
    newest_t, newest_total, newest_c = nil, nil, nil
    if top[1] and string.byte(top[1]) ~= 119 then
      newest_t, newest_total, newest_c = entry(top[1])
    end
    newest_known = true
  end
  return newest_t, newest_total, newest_c
end

-- The first entry of quota q's window (not before `gone`): its member and rank, and the cost the
-- window holds.
-- The first entry of each log quota's window (member, and the running total before it), read
-- once: an entry added at the newest end leaves a window's first entry where it was, unless
-- the window was empty (`window_first[q]` false); a refund forgets them all.
local window_first, window_before = {}, {}
local function log_window(q, width)
  if not log_width then return nil, nil, 0 end
  local first, before = window_first[q], window_before[q]
  if not first then
    local cut = now - width
    if gone[q] > cut + 1 then cut = gone[q] - 1 end
    local found = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(cut), '+inf', 'LIMIT', '0', '1')
    if not found[1] then return nil, nil, 0 end
    local _, total, c = entry(found[1])
    first, before = found[1], total - c
    window_first[q], window_before[q] = first, before
  end
  local _, newest = log_newest()
  return first, before, newest - before
end

-- ---- the kinds ----

-- Fixed window: the current window at now (its end, what it used).
local function fixed_current(s, width)
  if s[2] > 0 and now < s[1] then return s[1], s[2] end
  return now + width, 0
end

-- The time a request admitted now is logged at: never before the newest entry (a server
-- clock that stepped back counts as the newest).
local log_at = now
if log_width then
  local t = log_newest()
  if t and t > log_at then log_at = t end
end

-- Returns 'allow', new state, spot | 'deny', retry | 'never'
local function step(q, c)
  local k, a, b, s = kind[q], pa[q], pb[q], st[q]
  if k == 4 then
    local inc = c * a
    if inc > b and not force then return 'never' end
    local base, deficit = warm_resync(q, s)
    -- The lead first (exact, as base >= now), then the cost: today\'s time plus both may
    -- pass 2^53 us and round where the lead and the cost alone do not.
    local ahead = (base - now) + inc
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
    return 'allow', {base + inc + extra, deficit + spent, 0}, {base, base + inc + extra}
  end
  if k == 0 then
    local inc = c * a
    if inc > b and not force then return 'never' end
    local base = s[1]
    if now > base then base = now end
    local ahead = (base - now) + inc
    if ahead <= b or force then return 'allow', {base + inc, 0, 0}, {base, base + inc} end
    return 'deny', ahead - b
  end
  if c > a and not force then return 'never' end
  if k == 1 then
    local e, used = fixed_current(s, b)
    if used + c <= a or force then return 'allow', {e, used + c, 0}, {e, 0} end
    local r = e - now
    if r < 1 then r = 1 end
    return 'deny', r
  elseif k == 2 then
    local first, before, cnt = log_window(q, b)
    if cnt + c <= a or force then return 'allow', {0, 0, 0}, {log_at, 0} end
    -- The oldest entries of the window holding cnt + c - a must leave it first: the first
    -- whose running total reaches before + cnt + c - a, found by rank.
    local goal = before + cnt + c - a
    local lo = redis.call('ZRANK', key, first)
    local hi = redis.call('ZCARD', key) - 1
    while lo < hi do
      local mid = lo + idiv(hi - lo, 2)
      local at = fmt(mid)
      local _, total = entry(redis.call('ZRANGE', key, at, at)[1])
      if total >= goal then hi = mid else lo = mid + 1 end
    end
    local at = fmt(lo)
    local t = entry(redis.call('ZRANGE', key, at, at)[1])
    local r = t + b - now
    if r < 1 then r = 1 end
    return 'deny', r
  else
    local start, prev, cur = counter_current(s[1], s[2], s[3], gone[q], gone_cur[q], b)
    if force or (cur + c) * b + counter_weighted(start, prev, b) <= a * b then
      return 'allow', {start, prev, cur + c}, {start, 0}
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
    local remaining = 0
    if b > ahead then remaining = idiv(b - ahead, a) end
    return remaining, ahead
  elseif k == 1 then
    local e, used = fixed_current(s, b)
    local reset = 0
    if used > 0 then reset = e - now end
    -- More used than the count after a lower count was set while serving: none remaining.
    local remaining = a - used
    if remaining < 0 then remaining = 0 end
    return remaining, reset
  elseif k == 2 then
    local _, _, cnt = log_window(q, b)
    local reset = 0
    if cnt > 0 then reset = log_newest() + b - now end
    local remaining = a - cnt
    if remaining < 0 then remaining = 0 end
    return remaining, reset
  else
    local start, prev, cur = counter_current(s[1], s[2], s[3], gone[q], gone_cur[q], b)
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
  elseif k == 1 then if s[2] > 0 then return s[1] end return 0
  elseif k == 2 then
    local t = log_newest()
    if t and t >= gone[q] then return t + b end
    return 0
  else
    return counter_idle(s[1], s[2], s[3], gone[q], gone_cur[q], b)
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
    local text = table.concat(words, ' ')
    if text ~= raw then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', '-inf')
      redis.call('ZADD', key, '-inf', 'w' .. text)
      raw = text
    end
    redis.call('PEXPIRE', key, fmt(ttl))
  else
    redis.call('SET', key, table.concat(words, ' '), 'PX', fmt(ttl))
  end
end

-- Removes the log members `old` and adds `add` (score, member pairs), a thousand at a call:
-- Lua's `unpack` has a bound on how many values it spreads.
local function replace_entries(old, add)
  for i = 1, #old, 1000 do redis.call('ZREM', key, unpack(old, i, math.min(i + 999, #old))) end
  for i = 1, #add, 1000 do redis.call('ZADD', key, unpack(add, i, math.min(i + 999, #add))) end
end

-- Gives back u units of the log entries at time t (the newest entries when t is nil), newest
-- first; the running totals of the entries after them follow.
local function log_give_back(t, u)
  newest_known = false
  window_first, window_before = {}, {}
  local list
  if t then
    list = redis.call('ZRANGEBYSCORE', key, fmt(t), '+inf')
  else
    list = redis.call('ZRANGEBYSCORE', key, '(-inf', '+inf')
  end
  local es = {}
  for i, m in ipairs(list) do
    local et, total, c = entry(m)
    es[i] = {et, total, c, m}
  end
  local left = u
  for i = #es, 1, -1 do
    if left == 0 then break end
    if t == nil or es[i][1] == t then
      local back = es[i][3]
      if back > left then back = left end
      es[i][3] = es[i][3] - back
      left = left - back
    end
  end
  if left == u or #es == 0 then return end
  local running = es[1][2] - tonumber(string.match(es[1][4], ':(%d+)$'))
  local old, add = {}, {}
  for i, e in ipairs(es) do
    old[i] = e[4]
    if e[3] > 0 then
      running = running + e[3]
      add[#add + 1] = fmt(e[1])
      add[#add + 1] = member(e[1], running, e[3])
    end
  end
  -- A few calls of many members each, in slices: unpack gives at most a few thousand values.
  replace_entries(old, add)
end

-- Counts the log's running totals from 0 before its oldest entry again, and returns the total
-- through the newest: what any window holds stays. A charge near 2^52 calls it first, so totals
-- stay exact below 2^53: a charge adds less than 2^32, and a request at most 10 000 (plain.lua
-- adds requests without it), so from 2^52 more than 2^38 requests of the largest cost reach 2^53.
local function log_rebase()
  newest_known = false
  window_first, window_before = {}, {}
  local list = redis.call('ZRANGEBYSCORE', key, '(-inf', '+inf')
  local old, add, running = {}, {}, 0
  for i, m in ipairs(list) do
    local t, _, c = entry(m)
    old[i] = m
    running = running + c
    add[#add + 1] = fmt(t)
    add[#add + 1] = member(t, running, c)
  end
  replace_entries(old, add)
  return running
end

-- ---- a key idle at a change of a warm-up curve is new ----

-- The memory store makes such a key new at the change (src/limiter/memory.rs
-- `renews_idle_keys`); here its words are those of a key never seen, whatever time to live it
-- has left, if it was idle at any of the changes the script is told of (a key new at one is
-- judged at the later ones as new, which it is). Under the old curve a warm-up quota is idle once its backlog is past and its
-- deficit regained, to the microsecond rounded up, as memory measures it (`Curve::cold_in`).
-- A key written since the change has a time at or after it, so this never touches it.
local function idle_at_renewal(r)
  local horizon = 0
  for q = 1, n do
    local h
    if kind[q] == 4 then
      local s, c = st[q], curve_of(pa[q], r.warm[q])
      h = s[1]
      if s[2] > 0 and c.max > 0 then
        local d = s[2]
        if d > c.max then d = c.max end
        local f, rest = muldiv(d, c.period, c.max)
        if rest > 0 then f = f + 1 end
        h = s[1] + f
      end
    elseif kind[q] == 2 then
      -- The log and the counter as they were: a narrower or wider window goes idle at
      -- another time.
      local w, t = r.win[q], log_newest()
      h = 0
      if t and t >= w.gone then h = t + w.width end
    elseif kind[q] == 3 then
      local w, s = r.win[q], st[q]
      h = counter_idle(s[1], s[2], s[3], w.gone, w.gone_cur, w.width)
    else
      h = idle_at(q)
    end
    if h > horizon then horizon = h end
  end
  return horizon <= r.at
end
if raw then
  for i = 1, #renewals do
    if idle_at_renewal(renewals[i]) then
      for q = 1, n do st[q] = {0, 0, 0} end
      break
    end
  end
end

-- ---- refund ----

if cost < 0 then
  local u = -cost
  if reserved > 0 and u > reserved then u = reserved end
  local log_spot = nil
  for q = 1, n do
    local k, a, b, s = kind[q], pa[q], pb[q], st[q]
    if k == 0 or k == 4 then
      local tat = s[1]
      if tat > now then
        local back
        if reserved > 0 then
          -- The end part of its own slice that is still ahead of now.
          back = 0
          if spot_b[q] > now then
            local units = u
            if units > reserved then units = reserved end
            local from = spot_b[q] - muldiv(spot_b[q] - spot_a[q], units, reserved)
            if from < now then from = now end
            back = spot_b[q] - from
          end
        else
          back = u * a
        end
        tat = tat - back
        if tat < now then tat = now end
      end
      if k == 4 then st[q] = {tat, s[2], 0} else st[q] = {tat, 0, 0} end
    elseif k == 1 then
      local e, used = s[1], s[2]
      if used > 0 and now < e and (reserved == 0 or e == spot_a[q]) then
        used = used - u
        if used <= 0 then st[q] = {0, 0, 0} else st[q] = {e, used, 0} end
      end
    elseif k == 2 then
      log_spot = spot_a[q]
    elseif k == 3 then
      local start, prev, cur = counter_current(s[1], s[2], s[3], gone[q], gone_cur[q], b)
      if prev == 0 and cur == 0 then
        st[q] = {0, 0, 0}
      elseif reserved == 0 then
        local from_cur = u
        if from_cur > cur then from_cur = cur end
        prev = prev - (u - from_cur)
        if prev < 0 then prev = 0 end
        cur = cur - from_cur
        if prev == 0 and cur == 0 then st[q] = {0, 0, 0} else st[q] = {start, prev, cur} end
      elseif start == spot_a[q] or start == spot_a[q] + b then
        if start == spot_a[q] then
          cur = cur - u
          if cur < 0 then cur = 0 end
        else
          prev = prev - u
          if prev < 0 then prev = 0 end
        end
        if prev == 0 and cur == 0 then st[q] = {0, 0, 0} else st[q] = {start, prev, cur} end
      end
    end
  end
  if log_width then
    if reserved > 0 then
      if log_spot then log_give_back(log_spot, u) end
    else
      log_give_back(nil, u)
    end
  end
  save()
  cost = 0
end

-- ---- decision ----

local outcome = 0
local retry = 0
local new, spots = {}, {}
for q = 1, n do
  local verdict, v, spot = step(q, cost)
  if verdict == 'allow' then
    new[q] = v
    spots[q] = spot
  elseif verdict == 'deny' then
    if outcome == 0 then outcome = 1 end
    if v > retry then retry = v end
  else
    outcome = 2
  end
end

local took = outcome == 0 and cost > 0
if took then
  for q = 1, n do st[q] = new[q] end
  if log_width then
    -- One entry per request, carrying its cost; a charge is logged whole (a debt stands
    -- when a limit is raised later).
    local _, total = log_newest()
    if force and total and total + cost > 2 ^ 52 then total = log_rebase() end
    total = (total or 0) + cost
    redis.call('ZADD', key, fmt(log_at), member(log_at, total, cost))
    -- Members of one time sort by their running total: the new entry is the newest.
    newest_t, newest_total, newest_c = log_at, total, cost
  end
  save()
elseif cost >= 0 then
  -- A rejection or a report writes nothing; the expiry follows a widened window.
  follow_widening(gone, idle_at)
end
if outcome ~= 1 then retry = 0 end

local reply = {outcome, retry}
for q = 1, n do
  local remaining, reset = figures(q)
  reply[1 + 2 * q] = remaining
  reply[2 + 2 * q] = reset
end
if took and not force then
  for q = 1, n do
    reply[#reply + 1] = spots[q][1]
    reply[#reply + 1] = spots[q][2]
  end
end
return reply
