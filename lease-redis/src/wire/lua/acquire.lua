-- acquire: KEYS[1] the base key, KEYS[2] the holder key (declared, and read after the last
-- write, so that client-side tracking follows it); ARGV: holder, kind ('leader' | 'semaphore'), limit, ttl (ms),
-- settle (ms), value, enqueue (1: the caller waits, so it takes or keeps its place in line),
-- waiter ttl (ms).
-- Answers {'acquired', token, holders}, {'busy', holders, retry_in_ms (-1: none)},
-- {'kind', found_kind} or {'limit', stored_limit}.
local k = keys_of(KEYS[1])
local h, kind, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local ttl, settle, value = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local enqueue, waiter_ttl = ARGV[7] == '1', tonumber(ARGV[8])
local now, now_us = clock()

local stored = kind_of(k)
if stored and stored ~= kind then
  local others = count_holders(k, stored, now)
  if others > 0 then
    return {'kind', stored}
  end
end
local count, soonest = count_holders(k, kind, now)
if kind == 'semaphore' and count > 0 then
  local stored_limit = tonumber(redis.call('HGET', k.meta, 'limit') or '')
  if stored_limit and stored_limit ~= limit then
    return {'limit', stored_limit}
  end
end
prune_waiters(k, now)

local free = capacity(kind, limit) - count
local rank = redis.call('ZRANK', k.queue, h)
local ahead = rank or redis.call('ZCARD', k.queue)
if free > 0 and ahead < free then
  redis.call('ZREM', k.queue, h)
  redis.call('ZREM', k.waiting, h)
  local last = tonumber(redis.call('HGET', k.meta, 'token') or '0') or 0
  local token = math.max(last + 1, now_us)
  local hk = holder_key(k, kind, h)
  redis.call('DEL', hk)
  if kind == 'leader' then
    redis.call('HSET', hk, 'holder', h, 'token', fmt(token), 'value', value)
  else
    redis.call('HSET', hk, 'token', fmt(token), 'value', value)
  end
  redis.call('PEXPIRE', hk, ttl)
  redis.call('ZADD', k.slots, now + ttl, h)
  redis.call('HSET', k.held, h, fmt(settle))
  redis.call('HDEL', k.held, h .. '#bar')
  redis.call('HSET', k.meta, 'kind', kind, 'limit', fmt(capacity(kind, limit)), 'token', fmt(token))
  touch(k)
  wake(k, free - 1)
  -- Read last, after every write: client-side tracking follows the holder key from here.
  redis.call('HGET', hk, 'token')
  return {'acquired', fmt(token), count + 1}
end

if enqueue then
  if not rank then
    local ticket = redis.call('HINCRBY', k.meta, 'ticket', 1)
    redis.call('ZADD', k.queue, ticket, h)
    ahead = redis.call('ZRANK', k.queue, h)
  end
  redis.call('ZADD', k.waiting, now + waiter_ttl, h)
  if not redis.call('HGET', k.meta, 'kind') then
    redis.call('HSET', k.meta, 'kind', kind, 'limit', fmt(capacity(kind, limit)))
  end
  touch(k)
end
-- Free slots that the waiters ahead have not taken: they may be asleep, so wake them; and if
-- one of them died waiting, its place expires.
local retry = soonest
if free > 0 and ahead > 0 then
  wake(k, free)
  local first = redis.call('ZRANGE', k.queue, 0, ahead - 1)
  for _, w in ipairs(first) do
    local expires = tonumber(redis.call('ZSCORE', k.waiting, w) or '')
    retry = min(retry, expires)
  end
end
local retry_in = -1
if retry then
  retry_in = math.max(retry - now, 0)
end
return {'busy', count, retry_in}
