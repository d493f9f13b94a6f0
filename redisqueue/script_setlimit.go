package redisqueue

// setLimitScript: ARGV[6] the new limit, ARGV[7] the caller's declared
// limits, ARGV[8] the caller's replica id. Lowering preempts nobody: if the slots held exceed the new limit,
// o is set and no one is admitted until they fit. Raising grants waiters at
// once, in the order of q, with notices as for any grant. Returns the
// limit.
var setLimitScript = newScript(prelude + `
local n = tonumber(ARGV[6])
lim()
redis.call('HSET', L, 'n', n, 'd', ARGV[7])
redis.call('PEXPIRE', L, keep)
-- every other replica syncs at once: it learns the limit, and the slots
-- held, now rather than a tick from now
for _, r in ipairs(redis.call('ZRANGE', R, 0, -1)) do
  if r ~= ARGV[8] then notify(r, '?') end
end
limit = n
expire_holders()
if held() > n then
  redis.call('HSET', L, 'o', 1)
  over = '1'
else
  redis.call('HDEL', L, 'o')
  over = false
  promote()
end
return n
`)
