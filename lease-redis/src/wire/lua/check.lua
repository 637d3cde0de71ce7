-- check: KEYS[1] the base key; ARGV: holder, kind, token. Answers {'held'}, {'taken', holder,
-- token} (another holder has the leader key) or {'gone'}.
local k = keys_of(KEYS[1])
local h, kind, token = ARGV[1], ARGV[2], ARGV[3]
if kind == 'leader' then
  local holder, found = leader_of(k)
  if holder == h and found == token and redis.call('ZSCORE', k.slots, h) then
    return {'held'}
  end
  if holder and holder ~= 'foreign' and holder ~= h then
    return {'taken', holder, found or ''}
  end
  return {'gone'}
end
local found = redis.call('HGET', holder_key(k, kind, h), 'token')
if found == token and redis.call('ZSCORE', k.slots, h) then
  return {'held'}
end
return {'gone'}
