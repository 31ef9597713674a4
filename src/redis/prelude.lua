-- The arguments every decision script reads alike (gcra.lua describes them), and exact
-- integer division; put before gcra.lua, gcra_only.lua and plain.lua.

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

