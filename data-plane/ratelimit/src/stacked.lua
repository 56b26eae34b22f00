-- Stacked limits, one atomic decision over N budgets, all or nothing. Mirrors
-- stacked::decide (src/stacked.rs); also the script of a single sliding window.
--
-- KEYS[i]  the budget key of limit i, rl:{<subject>}:<policy> (a hash; on Redis
--          Cluster every key of one run must share a slot, see redis.rs)
-- ARGV[1]  requests decided together (merged concurrent requests of one key set), at least 1
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]  limit i: algorithm (0 token bucket, 1 fixed
--          window, 2 sliding window), limit, window in milliseconds
-- Returns {admitted, remaining_1, reset_1, retry_1, ..., remaining_N, reset_N, retry_N, now}:
-- the first `admitted` requests are admitted — the fewest any limit could
-- admit — and every limit spends exactly that many, as if the requests had
-- come one after another at this instant (a refused request spends nowhere).
-- remaining_i and reset_i (ms until the whole budget is back) describe limit i
-- after them; retry_i is, when remaining_i is 0, the wait until it admits one
-- more (else 0). now is Redis's time of the decision in milliseconds (what
-- refund.lua needs to give back a spend that other slots' limits refused).
--
-- Fields: token bucket tl, tt (as token_bucket.lua); fixed window fw, fn (as
-- fixed_window.lua); sliding window sw = window index, sc = its count,
-- sp = the previous window's count. Limits that spend nothing write nothing.
-- Arithmetic is exact: Policy::new keeps limit * window <= 2^53.

if redis.replicate_commands then
  -- Redis < 5 needs effects replication for a script that reads TIME; later versions ignore this.
  redis.replicate_commands()
end

-- Integers as plain decimal strings (never "1e+8", which PEXPIRE refuses).
local function int(x)
  return string.format('%.0f', x)
end

local cost = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local n = #KEYS
local st = {}
local admitted = cost

-- Read every limit: how many it could admit now.
for i = 1, n do
  local key = KEYS[i]
  local s = {
    algo = tonumber(ARGV[3 * i - 1]),
    limit = tonumber(ARGV[3 * i]),
    window = tonumber(ARGV[3 * i + 1]),
  }
  local limit, window = s.limit, s.window
  if s.algo == 0 then
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
    s.level, s.at, s.ahead = level, at, at - now
    s.cap = math.floor(level / window)
  elseif s.algo == 1 then
    local current = math.floor(now / window)
    local stored = redis.call('HMGET', key, 'fw', 'fn')
    local w = tonumber(stored[1])
    local c = tonumber(stored[2])
    if w == nil or c == nil or w < current then
      w = current
      c = 0
    end
    s.w, s.c = w, c
    s.cap = math.max(0, limit - c)
  else
    local current = math.floor(now / window)
    local stored = redis.call('HMGET', key, 'sw', 'sc', 'sp')
    local w = tonumber(stored[1])
    local c = tonumber(stored[2])
    local p = tonumber(stored[3])
    if w == nil or c == nil or p == nil then
      w, c, p = current, 0, 0
    elseif w + 1 == current then
      w, c, p = current, 0, c
    elseif w < current then
      w, c, p = current, 0, 0
    end
    -- A window after now's (Redis's clock went back) is kept: waits start at its start.
    local start = w * window
    s.w, s.c, s.p = w, c, p
    s.e = math.max(0, now - start)
    s.ahead = math.max(0, start - now)
    local room = limit * window - p * (window - s.e)
    if room < 0 then
      s.cap = 0
    else
      s.cap = math.max(0, math.floor(room / window) - c)
    end
  end
  st[i] = s
  if s.cap < admitted then
    admitted = s.cap
  end
end

-- Spend `admitted` from every limit.
local out = {admitted}
for i = 1, n do
  local s = st[i]
  local key = KEYS[i]
  local limit, window = s.limit, s.window
  local remaining = s.cap - admitted
  local reset, retry = 0, 0
  if s.algo == 0 then
    local level = s.level - admitted * window
    reset = s.ahead + math.ceil((limit * window - level) / limit)
    if remaining == 0 then
      retry = s.ahead + math.ceil((window - level) / limit)
    end
    if admitted > 0 then
      redis.call('HSET', key, 'tl', int(level), 'tt', int(s.at))
      redis.call('PEXPIRE', key, int(math.max(1, reset)))
    end
  elseif s.algo == 1 then
    reset = (s.w + 1) * window - now
    if remaining == 0 then
      retry = reset
    end
    if admitted > 0 then
      redis.call('HSET', key, 'fw', int(s.w), 'fn', int(s.c + admitted))
      redis.call('PEXPIRE', key, int(reset))
    end
  else
    local c = s.c + admitted
    local to_end = s.ahead + (window - s.e)
    if c > 0 then
      reset = to_end + window
    elseif s.p > 0 then
      reset = to_end
    end
    if remaining == 0 then
      -- In this window: the first e with p * (window - e) <= (limit - c - 1) * window.
      local room = limit - c - 1
      if room >= 0 and s.p > 0 then
        local e = window - math.min(window, math.floor(room * window / s.p))
        if e < window then
          retry = s.ahead + math.max(1, e - s.e)
        end
      end
      if retry == 0 then
        -- In the next one, where c becomes the previous count.
        local e = 0
        if c > 0 then
          e = window - math.min(window, math.floor((limit - 1) * window / c))
        end
        retry = to_end + e
      end
    end
    if admitted > 0 then
      redis.call('HSET', key, 'sw', int(s.w), 'sc', int(c), 'sp', int(s.p))
      -- Once both windows are over the key is the same as a missing one.
      redis.call('PEXPIRE', key, int(math.max(1, reset)))
    end
  end
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
end
out[#out + 1] = now
return out
