-- lease-redis: what every script shares. A name's keys share its hash tag, `{<name>}`, so they
-- live in one slot; KEYS[1] is the name's base key, `<prefix>{<name>}`, which is also the leader
-- key. A number stored is written with %.0f: Lua's own conversion would round it (1.7e+15).
local function fmt(n)
  return string.format('%.0f', n)
end

-- The server's clock, in milliseconds and in microseconds (both exact in a double).
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- How long the bookkeeping keys of a name outlive their last write: past any TTL (a day at
-- most), so a name whose holders all crashed leaves nothing behind for long.
local KEEP_MS = 2 * 86400000

local function keys_of(base)
  return {
    base = base,
    meta = base .. ':meta',
    slots = base .. ':slots',
    held = base .. ':held',
    queue = base .. ':queue',
    waiting = base .. ':waiting',
    wake = base .. ':wake',
  }
end

local function holder_key(k, kind, h)
  if kind == 'leader' then
    return k.base
  end
  return k.base .. ':s:' .. h
end

-- The holder and token of the leader key, if it is one of ours (a hash); `false` if the key is
-- absent; 'foreign' if something else is there (an operator's SET).
local function leader_of(k)
  local t = redis.call('TYPE', k.base)
  local ty = t.ok or t
  if ty == 'none' then
    return false
  end
  if ty ~= 'hash' then
    return 'foreign'
  end
  local v = redis.call('HMGET', k.base, 'holder', 'token')
  if not v[1] then
    return 'foreign'
  end
  return v[1], v[2]
end

local function alive(k, kind, h)
  if kind == 'leader' then
    return leader_of(k) == h
  end
  return redis.call('EXISTS', k.base .. ':s:' .. h) == 1
end

-- The kind of lock the name is, as recorded, or as its keys show when the record is gone.
local function kind_of(k)
  local kind = redis.call('HGET', k.meta, 'kind')
  if kind then
    return kind
  end
  if redis.call('EXISTS', k.base) == 1 then
    return 'leader'
  end
  if redis.call('ZCARD', k.slots) > 0 then
    return 'semaphore'
  end
  return false
end

local function min(a, b)
  if not a then
    return b
  end
  if not b then
    return a
  end
  return math.min(a, b)
end

-- Counts the holders of the name: live ones, and those removed without a release (an operator's
-- DEL, an eviction) whose settle time has not run out since this was first noticed (never past
-- the expiry they had). Forgets expired holders. Returns the count and the soonest moment one of
-- them may go (a holder's expiry, a bar's end).
local function count_holders(k, kind, now)
  local entries = redis.call('ZRANGE', k.slots, 0, -1, 'WITHSCORES')
  local count, soonest, seen = 0, nil, {}
  for i = 1, #entries, 2 do
    local h, untl = entries[i], tonumber(entries[i + 1])
    local ends = nil
    if alive(k, kind, h) then
      ends = untl
      seen[h] = true
    elseif untl > now then
      local bar = tonumber(redis.call('HGET', k.held, h .. '#bar') or '')
      if not bar then
        local settle = tonumber(redis.call('HGET', k.held, h) or '0') or 0
        bar = math.min(untl, now + settle)
        redis.call('HSET', k.held, h .. '#bar', fmt(bar))
      end
      if bar > now then
        ends = bar
      end
    end
    if ends then
      count = count + 1
      soonest = min(soonest, ends)
    else
      redis.call('ZREM', k.slots, h)
      redis.call('HDEL', k.held, h, h .. '#bar')
    end
  end
  -- A leader key that is not one of ours (an operator's SET, a holder missing from the slots)
  -- holds the name until it expires.
  if kind == 'leader' then
    local holder = leader_of(k)
    if holder and not seen[holder] then
      count = count + 1
      local pttl = redis.call('PTTL', k.base)
      if pttl > 0 then
        soonest = min(soonest, now + pttl)
      end
    end
  end
  return count, soonest
end

-- Forgets waiters that stopped refreshing their place (a process that died waiting).
local function prune_waiters(k, now)
  local gone = redis.call('ZRANGEBYSCORE', k.waiting, '-inf', now)
  for _, w in ipairs(gone) do
    redis.call('ZREM', k.queue, w)
    redis.call('ZREM', k.waiting, w)
  end
end

-- Wakes the first `n` waiters in line, by name: the ones that may take a slot now.
local function wake(k, n)
  if n <= 0 then
    return
  end
  local first = redis.call('ZRANGE', k.queue, 0, n - 1)
  if #first > 0 then
    redis.call('PUBLISH', k.wake, table.concat(first, ' '))
  end
end

-- Wakes every waiter of the name: something changed that each must judge (a holder removed
-- without a release, whose bar each waiter must learn).
local function wake_all(k)
  if redis.call('ZCARD', k.queue) > 0 then
    redis.call('PUBLISH', k.wake, '*')
  end
end

local function capacity(kind, limit)
  if kind == 'leader' then
    return 1
  end
  return limit
end

local function touch(k)
  redis.call('PEXPIRE', k.meta, KEEP_MS)
  redis.call('PEXPIRE', k.slots, KEEP_MS)
  redis.call('PEXPIRE', k.held, KEEP_MS)
  redis.call('PEXPIRE', k.queue, KEEP_MS)
  redis.call('PEXPIRE', k.waiting, KEEP_MS)
end

-- A name with no holder and no waiter is free of its kind and limit (its token stays).
local function forget_kind_if_idle(k, count)
  if count == 0 and redis.call('ZCARD', k.queue) == 0 then
    redis.call('HDEL', k.meta, 'kind', 'limit')
  end
end
