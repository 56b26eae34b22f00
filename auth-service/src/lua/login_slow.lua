-- The per-name brute-force bound (throttle.rs): failed logins on one user name from every
-- address together. Under the limit an attempt is counted and goes on at once; past it the name
-- is slowed, never locked: at most one password check on it per slot across every replica, so
-- the right password still gets through while guesses are held to one per slot.
--
-- KEYS[1] = the name's failure counter, KEYS[2] = the name's slot (held for ARGV[3] ms).
-- ARGV[1] = window in milliseconds (fixed, from the counter's first failure).
-- ARGV[2] = the limit before slowing down. ARGV[3] = the slot in milliseconds.
-- Returns {1, 0} when the attempt was counted and may go on, or {0, ms until the slot frees}
-- when it must wait and ask again (nothing counted).
local window = tonumber(ARGV[1])
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= tonumber(ARGV[2]) then
  if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', tonumber(ARGV[3])) then
    local ttl = redis.call('PTTL', KEYS[2])
    if ttl < 1 then
      ttl = 1
    end
    return {0, ttl}
  end
end
redis.call('INCR', KEYS[1])
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], window)
end
return {1, 0}
