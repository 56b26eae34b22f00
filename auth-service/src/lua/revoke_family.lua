-- Revoke a family (logout). The record stays until its expiry so every token of it is refused.
-- KEYS[1] = family hash. Returns 1 if the family existed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'revoked', '1')
  return 1
end
return 0
