-- Gives back the unit login_attempt.lua counted for an attempt that did not fail (right
-- password, or the user database was unavailable). Only that one unit: earlier failures stay,
-- so a success never resets a counter (an attacker with an account of their own cannot clear
-- their address's failures by logging in as themselves between guesses).
--
-- KEYS = the counters the attempt was counted on. A counter whose window ended meanwhile is
-- left alone (its unit went with it).
for _, key in ipairs(KEYS) do
  local count = tonumber(redis.call('GET', key) or '0')
  if count > 1 then
    redis.call('DECR', key)
  elseif count == 1 then
    redis.call('DEL', key)
  end
end
return 0
