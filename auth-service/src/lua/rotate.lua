-- Consume a refresh token and make its successor current, atomically: of two concurrent
-- refreshes with the same token exactly one sees `current == presented`.
-- KEYS[1] = family hash, KEYS[2] = token -> family mapping for the new token
-- ARGV[1] = SHA-256 hex of the presented token, ARGV[2] = SHA-256 hex of the new token,
-- ARGV[3] = now (Unix seconds), ARGV[4] = family id
-- Returns {'rotated', sub, role, expires_at} | {'unknown'} | {'revoked'} | {'expired'} | {'reused'}
local f = redis.call('HMGET', KEYS[1], 'current', 'sub', 'role', 'expires_at', 'revoked')
if not f[1] then
  return {'unknown'}
end
if f[5] == '1' then
  return {'revoked'}
end
if tonumber(f[4]) <= tonumber(ARGV[3]) then
  return {'expired'}
end
if f[1] ~= ARGV[1] then
  -- A token of this family that was already consumed: someone holds a stolen copy.
  -- Revoke every descendant (RFC 9700 section 4.14.2).
  redis.call('HSET', KEYS[1], 'revoked', '1')
  return {'reused'}
end
redis.call('HSET', KEYS[1], 'current', ARGV[2])
-- The family's absolute expiry is kept: rotation never extends a session.
redis.call('SET', KEYS[2], ARGV[4], 'EX', tonumber(f[4]) - tonumber(ARGV[3]))
return {'rotated', f[2], f[3], f[4]}
