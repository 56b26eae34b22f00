-- A login attempt against the failed-login counters (throttle.rs). Counting happens before the
-- password is checked, so concurrent guesses cannot all pass a check that is only updated once
-- each has failed: every admitted attempt holds one unit until login_succeeded.lua gives it back.
--
-- KEYS     = the counters (per user name, per client address), each with its limit in ARGV.
-- ARGV[1]  = window in milliseconds, set on a counter when it starts (fixed window).
-- ARGV[2..] = the limit of KEYS[1..].
-- Returns {0, ms until the longest blocking counter ends} when any counter is at its limit
-- (nothing is counted: a refused attempt does not extend the block), otherwise counts the
-- attempt on every counter and returns {1, bitmask of the counters this attempt filled}.
local window = tonumber(ARGV[1])
local wait = 0
for i, key in ipairs(KEYS) do
  local count = tonumber(redis.call('GET', key) or '0')
  if count >= tonumber(ARGV[i + 1]) then
    local ttl = redis.call('PTTL', key)
    if ttl < 0 then
      -- No expiry (never written so by this code): give it one rather than block forever.
      redis.call('PEXPIRE', key, window)
      ttl = window
    end
    if ttl > wait then
      wait = ttl
    end
  end
end
if wait > 0 then
  return {0, wait}
end
local filled = 0
for i, key in ipairs(KEYS) do
  local count = redis.call('INCR', key)
  if redis.call('PTTL', key) < 0 then
    redis.call('PEXPIRE', key, window)
  end
  if count == tonumber(ARGV[i + 1]) then
    filled = filled + 2 ^ (i - 1)
  end
end
return {1, filled}
