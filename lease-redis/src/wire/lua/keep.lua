-- keep: KEYS[1] the base key; ARGV: holder, kind, left (ms). The holder's lease stays held until
-- `left` from now, then expires as an unrenewed one does (with no bar: it was not removed).
-- Answers 1 if the holder held it, 0 if not.
local k = keys_of(KEYS[1])
local h, kind, left = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = clock()
if not (alive(k, kind, h) and redis.call('ZSCORE', k.slots, h)) then
  return 0
end
redis.call('PEXPIRE', holder_key(k, kind, h), left)
redis.call('ZADD', k.slots, now + left, h)
redis.call('HSET', k.held, h, '0')
return 1
