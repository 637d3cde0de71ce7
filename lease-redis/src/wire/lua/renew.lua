-- renew: no KEYS (the server would remember every declared key for tracking at each read the
-- script makes: quadratic in the batch); ARGV four per lease: base key, holder, kind, ttl (ms).
-- The caller arms tracking with one EXISTS of the holder keys after it, in the same MULTI.
-- Answers one entry per lease: 1 renewed, 0 gone, or {holder, token} when another holder has the
-- leader key. A lease gone has its removal judged (a bar for its settle time) and its waiters
-- woken to learn it.
local now = clock()
local out = {}
for i = 1, #ARGV / 4 do
  local k = keys_of(ARGV[4 * i - 3])
  local h, kind, ttl = ARGV[4 * i - 2], ARGV[4 * i - 1], tonumber(ARGV[4 * i])
  local hk = holder_key(k, kind, h)
  local held = alive(k, kind, h) and redis.call('ZSCORE', k.slots, h)
  if held then
    redis.call('PEXPIRE', hk, ttl)
    redis.call('ZADD', k.slots, now + ttl, h)
    redis.call('PEXPIRE', k.meta, KEEP_MS)
    redis.call('PEXPIRE', k.slots, KEEP_MS)
    redis.call('PEXPIRE', k.held, KEEP_MS)
    out[i] = 1
  else
    local holder, token = false, nil
    if kind == 'leader' then
      holder, token = leader_of(k)
    end
    -- One of ours without its slot (an operator removed the entry): ours no more.
    if holder == h then
      redis.call('DEL', hk)
      holder = false
    end
    count_holders(k, kind, now)
    wake_all(k)
    if holder then
      out[i] = {holder, token or ''}
    else
      out[i] = 0
    end
  end
end
return out
