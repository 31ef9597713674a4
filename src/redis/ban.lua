-- The penalty box around the quota decision: the same rules as src/penalty.rs, in one step.
--
-- This text is the head of a script whose body is the quota script (gcra.lua) wrapped as the
-- function `decide` (see src/redis/ban.rs); the script ends with `return penalize(decide)`.
--
-- KEYS[1]  the quota key (read and written by `decide` only)
-- KEYS[2]  the penalty key: "<run_end> <strikes> <offences> <banned_until> <retry_at>",
--          microseconds; absent is a key with no strikes, no offences and no ban. retry_at is
--          when the request that brought the ban is admitted (the ban, and the quotas that
--          refused it); a record without it (written before it existed) reads as banned_until
-- ARGV     the quota script's arguments, then six more, removed before `decide` runs:
--          now in microseconds ("" for the server's TIME), strikes, within, ban, max_ban,
--          forget_after (times in microseconds)
--
-- `ban_only` (a peek at the ban alone) answers the ban left instead of the wait. `no_strike`
-- (the decisions of a dry run) checks the ban and decides, but a rejection is no strike.
--
-- Returns {3, wait, ban} when the key is banned (before the decision, or by the strike this
-- rejection made), wait being the time until a retry is admitted: the end of the ban, or later
-- when the quotas that refused the request admit it later (src/penalty.rs `Record::wait`),
-- and ban the time until the ban itself ends (other requests are decided by the quotas from
-- then on); else what `decide` returns. A ban is checked before the quotas are asked, so
-- a banned key's request consumes nothing. Every number stays below 2^53.

local function penalize(decide, ban_only, no_strike)
  local n = #ARGV
  local now
  if ARGV[n - 5] == '' then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  else
    now = tonumber(ARGV[n - 5])
  end
  local need = tonumber(ARGV[n - 4])
  local within = tonumber(ARGV[n - 3])
  local ban = tonumber(ARGV[n - 2])
  local max_ban = tonumber(ARGV[n - 1])
  local forget = tonumber(ARGV[n])
  for i = n, n - 5, -1 do
    table.remove(ARGV, i)
  end

  local run_end, strikes, offences, banned_until, retry_at = 0, 0, 0, 0, 0
  local raw = redis.call('GET', KEYS[2])
  if raw then
    local words = {}
    for word in string.gmatch(raw, '%d+') do
      words[#words + 1] = tonumber(word)
    end
    run_end = words[1] or 0
    strikes = words[2] or 0
    offences = words[3] or 0
    banned_until = words[4] or 0
    retry_at = words[5] or banned_until
  end

  if banned_until > now then
    if ban_only or retry_at < banned_until then retry_at = banned_until end
    return {3, retry_at - now, banned_until - now}
  end

  local reply = decide()
  if no_strike or (reply[1] ~= 1 and reply[1] ~= 2) then
    return reply
  end

  -- A rejection: one strike.
  if offences > 0 and now >= banned_until + forget then
    offences = 0
  end
  if strikes == 0 or now >= run_end then
    strikes = 0
    run_end = now + within
  end
  strikes = strikes + 1
  local left, banned_for = 0, 0
  if strikes >= need then
    offences = offences + 1
    local length = max_ban
    -- ban * 2^(offences - 1), at most max_ban (checked before it could grow past 2^53).
    if offences <= 53 then
      length = ban * 2 ^ (offences - 1)
      if length > max_ban then length = max_ban end
    end
    banned_until = now + length
    banned_for = length
    strikes = 0
    run_end = 0
    left = length
    -- A limited request (1) waits for its quotas too; one that can never pass (2) does not.
    if reply[1] == 1 and tonumber(reply[2]) > left then left = tonumber(reply[2]) end
    retry_at = now + left
  end

  -- Kept until it is idle: the run over, the ban over, the offences forgotten.
  local idle = banned_until
  if strikes > 0 and run_end > idle then idle = run_end end
  if offences > 0 and banned_until + forget > idle then idle = banned_until + forget end
  if idle > now then
    local ttl = math.ceil((idle - now) / 1000)
    redis.call('SET', KEYS[2], string.format('%.0f %.0f %.0f %.0f %.0f', run_end, strikes,
      offences, banned_until, retry_at), 'PX', ttl)
  end

  if left > 0 then
    return {3, left, banned_for}
  end
  return reply
end
