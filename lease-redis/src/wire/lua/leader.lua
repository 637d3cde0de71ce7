-- leader: KEYS[1] the base key. Answers {holder, token, value, pttl} of the leader key, or {}
-- while nobody holds it (or something not ours is there).
local k = keys_of(KEYS[1])
local holder = leader_of(k)
if not holder or holder == 'foreign' then
  return {}
end
local v = redis.call('HMGET', k.base, 'holder', 'token', 'value')
return {v[1], v[2], v[3] or '', redis.call('PTTL', k.base)}
