-- release: KEYS[1] the base key; ARGV: holder, kind. Answers 1 if the holder held it (and gave
-- it back), 0 if not (it was lost before).
local k = keys_of(KEYS[1])
local h, kind = ARGV[1], ARGV[2]
local now = clock()
local held = alive(k, kind, h)
if held then
  redis.call('DEL', holder_key(k, kind, h))
end
redis.call('ZREM', k.slots, h)
redis.call('HDEL', k.held, h, h .. '#bar')
local count = count_holders(k, kind, now)
local limit = tonumber(redis.call('HGET', k.meta, 'limit') or '1') or 1
wake(k, capacity(kind, limit) - count)
forget_kind_if_idle(k, count)
if held then
  return 1
end
return 0
