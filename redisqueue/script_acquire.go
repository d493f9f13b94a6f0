package redisqueue

// acquireScript: ARGV[6] max queue, ARGV[7] lease id, ARGV[8] priority key,
// ARGV[9] the slots asked for (at least 1). Returns {outcome, limit,
// slots, held}: outcome 1 granted, 0 queued, -1 queue full; limit the
// fleet's limit it went by; slots those granted (the cost clamped to that
// limit), 0 unless granted; held the slots the fleet holds after it. While
// a recovery holds grants back, an arrival waits (or finds the queue full). A full queue evicts a waiter of lower priority, if
// any, to make room; see below. Idempotent: an id already holding or
// queued gets its state back, so a retried call changes nothing.
var acquireScript = newScript(prelude + `
local maxq, id, pk, cost = tonumber(ARGV[6]), ARGV[7], ARGV[8], tonumber(ARGV[9]) or 1
lim()
local hn = redis.call('ZCARD', H)
local n = hn + extra
local qn = redis.call('ZCARD', Q)
local rec = rc and recovering()
if cost <= 1 then
  -- The common case: a free slot and nobody waiting. A retried call finds
  -- its id here or in w only when the slots are full or someone waits, so
  -- the checks below are not needed here; ZADD of a held id only moves its
  -- expiry.
  if n < limit and qn == 0 and not rec then
    redis.call('ZADD', H, clock() + ttl, id)
    if hn == 0 then redis.call('PEXPIRE', H, keep) end
    return {1, limit, 1, n + 1}
  end
  if redis.call('ZSCORE', H, id) then return {1, limit, 1, n} end
elseif redis.call('ZSCORE', H, id) then
  -- a retried call: its slots may well still fit beside it
  return {1, limit, tonumber(redis.call('HGET', L, id)) or 1, n}
end
if qn > 0 and redis.call('HEXISTS', W, id) == 1 then return {0, limit, 0, n} end
local g = math.min(cost, limit)
if n + g > limit then
  expire_holders()
  n = held()
end
if qn > 0 and n < limit then
  -- slots free (freed by expired leases, or waited for by a head with a
  -- cost): serve the waiters first
  promote()
  n = held()
  qn = redis.call('ZCARD', Q)
end
-- Slots are taken at once only when nobody waits, so nobody is overtaken,
-- or when the head waits for more slots than are free and this arrival is
-- of a higher priority: it would be the head.
if n + g <= limit and not rec then
  local first = qn == 0
  if not first then
    local head = redis.call('ZRANGE', Q, 0, 0)
    first = #head == 0 or pk < string.sub(head[1], 1, 16)
  end
  if first then
    take(id, g)
    return {1, limit, g, n + g}
  end
end
if qn >= maxq then
  expire_waiters()
  -- Full: an arrival of higher priority takes the place of the newest
  -- waiter of the lowest priority present, the lexically largest member of
  -- q; an arrival of that priority or lower is refused.
  while redis.call('ZCARD', Q) >= maxq do
    local last = redis.call('ZRANGE', Q, -1, -1)
    if #last == 0 or string.sub(last[1], 1, 16) <= pk then
      -- a waiter with a cost that left may have unblocked the queue
      if dropped then promote() end
      return {-1, limit, 0, held()}
    end
    local m = last[1]
    local vid = string.sub(m, 33)
    redis.call('ZREM', Q, m)
    if redis.call('HGET', W, vid) == m then
      redis.call('HDEL', W, vid)
      redis.call('ZREM', WE, vid)
      drop_waiter_cost(vid)
      redis.call('ZADD', EV, clock() + ttl, vid)
      redis.call('PEXPIRE', EV, keep)
      notify(vid, '!' .. vid)
    end
  end
end
local seq = redis.call('INCR', SEQ)
if seq == 1 then redis.call('PEXPIRE', SEQ, keep) end
local m = pk .. string.format('%016x', seq) .. id
-- counted now: expiries and evictions above may have emptied q, which
-- deletes q, w and we
local fresh = redis.call('ZCARD', Q) == 0
redis.call('ZADD', Q, 0, m)
redis.call('HSET', W, id, m)
redis.call('ZADD', WE, clock() + live, id)
if fresh then
  for _, k in ipairs({Q, W, WE}) do redis.call('PEXPIRE', k, keep) end
end
if cost > 1 then
  redis.call('HSET', L, id, cost)
  add_heavyq(1)
end
-- a waiter with a cost that left (evicted, expired) may have let the line
-- move: this arrival included, granted then by a notice
if dropped then promote() end
return {0, limit, 0, held()}
`)
