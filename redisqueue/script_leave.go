package redisqueue

// leaveScript: ARGV[6...] lease ids to release or cancel. Idempotent.
// Returns the slots the fleet holds after it.
var leaveScript = newScript(prelude + `
leave(6)
return held()
`)

// byeScript: ARGV[6] replica id, ARGV[7...] lease ids to leave. Run by Close
// once nothing is held here. Every key keeps a TTL, so that nothing outlives
// the last replica of the Name.
var byeScript = newScript(prelude + `
leave(7)
local rep = ARGV[6]
redis.call('ZREM', R, rep)
redis.call('HDEL', D, rep)
redis.call('SREM', U, rep)
redis.call('SREM', F, rep)
redis.call('DEL', G)
for _, k in ipairs({H, Q, W, WE, SEQ, R, D, EV, L, U, F}) do redis.call('PEXPIRE', k, keep) end
return 1
`)
