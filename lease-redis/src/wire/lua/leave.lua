-- leave: KEYS[1] the base key; ARGV: waiter, kind. A waiter that gives up leaves the line, and
-- the waiters it held up are woken.
local k = keys_of(KEYS[1])
local w, kind = ARGV[1], ARGV[2]
local now = clock()
if redis.call('ZREM', k.queue, w) == 0 then
  redis.call('ZREM', k.waiting, w)
  return 0
end
redis.call('ZREM', k.waiting, w)
local count = count_holders(k, kind, now)
local limit = tonumber(redis.call('HGET', k.meta, 'limit') or '1') or 1
wake(k, capacity(kind, limit) - count)
forget_kind_if_idle(k, count)
return 1
