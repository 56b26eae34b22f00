-- Gives back what a split stacked decision spent on this slot and did not use
-- (redis.rs, decide_split): its limits on other slots admitted fewer requests
-- than these did, so the difference must not stay spent here.
--
-- KEYS[i]  the budget key of limit i (every key of this run shares a slot)
-- ARGV[1]  requests to give back, k
-- ARGV[2]  Redis's time of the spend, in ms (the last value stacked.lua returned)
-- ARGV[3i], ARGV[3i+1], ARGV[3i+2]  limit i: algorithm (0 token bucket, 1 fixed
--          window, 2 sliding window), limit, window in milliseconds
-- Returns the number of keys changed.
--
-- Never gives back more than the spend still weighs, so a refund can only make
-- a limit err towards refusing, never admit more than it allows:
-- * a fixed window: k off the count, only if the stored window is the one spent in;
-- * a sliding window: k off the current count if the window is unchanged, or
--   off the previous count if one window has passed since;
-- * a token bucket: k tokens minus what refill has added since the spend (time
--   passed × rate), because a bucket that refilled to full meanwhile would have
--   lost that refill anyway.
-- A key that expired meanwhile is a whole budget already and is left alone.

if redis.replicate_commands then
  redis.replicate_commands()
end

local function int(x)
  return string.format('%.0f', x)
end

local k = tonumber(ARGV[1])
local spent_at = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local changed = 0

for i = 1, #KEYS do
  local key = KEYS[i]
  local algo = tonumber(ARGV[3 * i])
  local limit = tonumber(ARGV[3 * i + 1])
  local window = tonumber(ARGV[3 * i + 2])
  local spent_window = math.floor(spent_at / window)
  if algo == 0 then
    local stored = redis.call('HMGET', key, 'tl', 'tt')
    local level = tonumber(stored[1])
    if level ~= nil and tonumber(stored[2]) ~= nil then
      local credit = k * window - math.max(0, now - spent_at) * limit
      if credit > 0 then
        redis.call('HSET', key, 'tl', int(math.min(limit * window, level + credit)))
        changed = changed + 1
      end
    end
  elseif algo == 1 then
    local stored = redis.call('HMGET', key, 'fw', 'fn')
    local w = tonumber(stored[1])
    local c = tonumber(stored[2])
    if w ~= nil and c ~= nil and w == spent_window and c > 0 then
      redis.call('HSET', key, 'fn', int(math.max(0, c - k)))
      changed = changed + 1
    end
  else
    local stored = redis.call('HMGET', key, 'sw', 'sc', 'sp')
    local w = tonumber(stored[1])
    local c = tonumber(stored[2])
    local p = tonumber(stored[3])
    if w ~= nil and c ~= nil and p ~= nil then
      if w == spent_window and c > 0 then
        redis.call('HSET', key, 'sc', int(math.max(0, c - k)))
        changed = changed + 1
      elseif w == spent_window + 1 and p > 0 then
        redis.call('HSET', key, 'sp', int(math.max(0, p - k)))
        changed = changed + 1
      end
    end
  end
end
return changed
