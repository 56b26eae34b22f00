-- Token bucket, one atomic decision. Mirrors algorithm::token_bucket (src/algorithm.rs).
--
-- KEYS[1]  the budget key, rl:{<subject>}:<policy> (a hash)
-- ARGV[1]  limit: bucket capacity in tokens
-- ARGV[2]  window in milliseconds: time to refill the whole bucket
-- ARGV[3]  requests decided together (merged concurrent requests of one key), at least 1
-- Returns {admitted, remaining, reset_after_ms, retry_after_ms}: the first `admitted`
-- requests are admitted, the rest denied, exactly as if they had come one after another
-- at this instant; `remaining` and `reset_after_ms` describe the bucket after them,
-- `retry_after_ms` the wait of the denied ones (0 when all were admitted).
--
-- The level is kept in token-milliseconds (one token = window ms, every
-- elapsed millisecond adds `limit`), so the refill is exact integer arithmetic;
-- Policy::new keeps limit * window <= 2^53, where Lua doubles are exact.
-- Time comes from Redis (TIME), so replicas with skewed clocks agree.
-- Fields: tl = level, tt = time of that level (ms). Denials write nothing.

if redis.replicate_commands then
  -- Redis < 5 replicates scripts verbatim unless told otherwise; TIME makes
  -- this script non-deterministic, so ask for effects replication. Later
  -- versions always do that and ignore the call.
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

local capacity = limit * window
local stored = redis.call('HMGET', key, 'tl', 'tt')
local level = tonumber(stored[1])
local at = tonumber(stored[2])
if level == nil or at == nil then
  level = capacity
  at = now
elseif level > capacity then
  level = capacity
end

if now > at then
  local elapsed = now - at
  if elapsed >= window then
    level = capacity
  else
    level = math.min(capacity, level + elapsed * limit)
  end
  at = now
end
-- Non-zero only if Redis's clock went backwards: every wait starts at `at`.
local ahead = at - now

local admitted = math.min(cost, math.floor(level / window))
if admitted > 0 then
  level = level - admitted * window
  local reset_after = ahead + math.ceil((capacity - level) / limit)
  redis.call('HSET', key, 'tl', int(level), 'tt', int(at))
  -- Once full again the key is the same as a missing one: let it vanish.
  redis.call('PEXPIRE', key, int(math.max(1, reset_after)))
  local retry_after = 0
  if admitted < cost then
    retry_after = ahead + math.ceil((window - level) / limit)
  end
  return {admitted, math.floor(level / window), reset_after, retry_after}
end

local reset_after = ahead + math.ceil((capacity - level) / limit)
local retry_after = ahead + math.ceil((window - level) / limit)
return {0, 0, reset_after, retry_after}
