-- renew: KEYS the base keys of the leases renewed; ARGV three per lease: holder, kind, ttl (ms).
-- Answers one entry per lease: 1 renewed, 0 gone, or {holder, token} when another holder has the
-- leader key. A lease gone has its removal judged (a bar for its settle time) and its waiters
-- woken to learn it.
local now = clock()
local out = {}
for i = 1, #KEYS do
  local k = keys_of(KEYS[i])
  local h, kind, ttl = ARGV[3 * i - 2], ARGV[3 * i - 1], tonumber(ARGV[3 * i])
  local hk = holder_key(k, kind, h)
  local held = alive(k, kind, h) and redis.call('ZSCORE', k.slots, h)
  if held then
    redis.call('PEXPIRE', hk, ttl)
    redis.call('ZADD', k.slots, now + ttl, h)
    touch(k)
    -- Tracking follows the key again after our own write (NOLOOP dropped it).
    redis.call('HGET', hk, 'token')
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
