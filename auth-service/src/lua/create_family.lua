-- Start a refresh-token family at login.
-- KEYS[1] = family hash, KEYS[2] = token -> family mapping of the first token
-- ARGV[1] = SHA-256 hex of the first token, ARGV[2] = sub, ARGV[3] = role,
-- ARGV[4] = absolute expiry (Unix seconds), ARGV[5] = family id, ARGV[6] = lifetime (seconds)
-- Redis TTLs are relative, so clock differences between this host and Redis do not matter.
redis.call('HSET', KEYS[1], 'current', ARGV[1], 'sub', ARGV[2], 'role', ARGV[3],
           'expires_at', ARGV[4], 'revoked', '0')
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[6])
return 1
