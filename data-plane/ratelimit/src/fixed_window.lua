-- Fixed window, one atomic decision. Mirrors algorithm::fixed_window (src/algorithm.rs).
--
-- KEYS[1]  the budget key, rl:{<subject>}:<policy> (a hash)
-- ARGV[1]  limit: requests per window
-- ARGV[2]  window in milliseconds; windows are aligned to multiples of it since the Unix epoch
-- ARGV[3]  requests decided together (merged concurrent requests of one key), at least 1
-- Returns {admitted, remaining, reset_after_ms, retry_after_ms}: the first `admitted`
-- requests are admitted, the rest denied, as if they had come one after another at this
-- instant; `retry_after_ms` is the wait of the denied ones (0 when all were admitted).
--
-- Time comes from Redis (TIME), so replicas with skewed clocks agree on the window.
-- Fields: fw = window index, fn = requests admitted in it. Denials write nothing.

if redis.replicate_commands then
  -- Redis < 5 needs effects replication for a script that reads TIME; later versions ignore this.
  redis.replicate_commands()
end

-- Integers are written as plain decimal strings: Redis would format a Lua
-- number in the shortest form, which may use an exponent ("1e+8") that
-- PEXPIRE refuses.
local function int(x)
  return string.format('%.0f', x)
end

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = math.floor(now / window)

local stored = redis.call('HMGET', key, 'fw', 'fn')
local w = tonumber(stored[1])
local n = tonumber(stored[2])
-- An older window (or none) starts empty; a newer one (Redis's clock went back) is kept.
if w == nil or n == nil or w < current then
  w = current
  n = 0
end

local reset_after = (w + 1) * window - now
local admitted = math.min(cost, limit - n)
if admitted > 0 then
  n = n + admitted
  redis.call('HSET', key, 'fw', int(w), 'fn', int(n))
  -- The count means nothing after the window ends: let the key vanish then.
  redis.call('PEXPIRE', key, int(reset_after))
  local retry_after = 0
  if admitted < cost then
    retry_after = reset_after
  end
  return {admitted, limit - n, reset_after, retry_after}
end
return {0, 0, reset_after, reset_after}
