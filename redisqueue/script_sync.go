package redisqueue

// syncScript is the heartbeat, the lease refresh, the safety net and the
// reconcile in one call; every replica makes it every tick. ARGV[6]
// replica id, ARGV[7] its declared limits, ARGV[8] the number of holder
// ids, ARGV[9] the number of queued waiter ids, ARGV[10] the highest id this
// replica had given out when it listed them, ARGV[11] "1" while this
// replica has Redis marked down (its list may lack requests it admits on its
// own meanwhile), ARGV[12] "o" if it may admit on its own (FailOpen),
// ARGV[13] the live replicas it saw last, ARGV[14] the token of the
// recovery it was last asked to sync for (empty if none), then from
// ARGV[15] holder ids
// (each with "*" and its slots if it holds more than one), then queued
// waiter ids, then the ids of waiters
// whose acquire is in flight. Every lease of this replica in h, w or q up to
// that id that is none of these is a phantom (a lease of a higher id is an
// acquire that began after the list was taken, and may have reached Redis
// first) (a release or cancel acknowledged by a master that then lost it in
// a failover, say) and is dropped, its slots promoted: a replica knows which
// slots it holds.
//
// Replicas: a replica whose heartbeat ran out while the others' went on is
// dead or cut off: its slots, its places and its notice list are dropped
// here, so that the fleet has its capacity back within the liveness lease
// and a tick. After a gap in every replica's heartbeats (no sync for longer
// than the liveness lease less a tick: Redis was paused, or a failover
// happened), nobody is taken for dead: every replica and place that was live
// when the gap began gets one more liveness lease. A replica back from an
// outage, or a gap, starts a recovery: grants are held back until every
// FailOpen replica live then has synced with a full list (a notice asks each
// to, at once), this one included, and with it counted the requests it
// admitted on its own; if Redis lost its data, until as many replicas as
// this one saw have registered again; at most a liveness lease.
//
// Returns {0, other replica, its limits} when a live replica of the same
// Name declared other limits (nothing else is done), or {1, live replicas,
// the fleet's limit, this replica's rank among them by id, the slots held
// in the fleet, the token of the recovery under way (empty if none), one
// status per holder id, one per waiter id}. A replica
// that declares limits while l was set by a replica of other limits (none
// is live, or this would be a conflict) deletes its limit from l: a fleet
// started again with other limits starts from its own MaxConcurrent.
// Holder status: 1 refreshed, 2 reclaimed (Redis had lost the lease, as
// after a restart, and its slots, clamped to the limit, were free: the
// request is running, so count it), -1 lost (the slots went to someone
// else; the limit is exceeded until this request ends). Waiter status: 0
// queued (refreshed), n > 0 granted n slots (the notice may be lost), -2
// evicted (likewise), -1 lost (not in Redis: enqueue again).
var syncScript = newScript(prelude + `
local rep, decl, nh, nw, maxid = ARGV[6], ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local wasdown, open, seen, token = ARGV[11] == '1', ARGV[12] == 'o', tonumber(ARGV[13]), ARGV[14]
local first = 15
local counted = false -- this call set the replicas awaited
clock()
lim()
local prev = beat
local gap = prev ~= nil and now - prev > live - tickms
if gap or wasdown then
  -- every replica live when it began that may admit on its own (FailOpen)
  -- may have been cut off too: grants wait until each has synced with a
  -- full list, which a notice asks of it at once; this one included, when
  -- it comes back from an outage (its list may lack what it admitted while
  -- this call was on its way)
  local lo = now
  if gap then lo = prev end
  local added, others = 0, 0
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', R, lo, '+inf')) do
    if r ~= rep then
      others = others + 1
      if redis.call('SISMEMBER', F, r) == 1 then
        redis.call('SADD', U, r)
        added = added + 1
      end
    end
  end
  if wasdown and open then
    redis.call('SADD', U, rep)
    added = added + 1
  end
  -- replicas this one saw that Redis no longer knows (it lost its data):
  -- each is awaited until it registers again
  if wasdown and seen - 1 > others then
    counted = true
    uw = seen - 1 - others
    redis.call('HSET', L, 'uw', uw)
    added = added + uw
  end
  if added > 0 and (not rc or rc < now + live) then
    rc = now + live
    redis.call('HSET', L, 'rc', rc)
  end
  -- each awaited replica is asked to sync, with the recovery's token: only
  -- a sync that carries it (its list taken after the notice) counts
  if added > 0 then
    for _, r in ipairs(redis.call('SMEMBERS', U)) do
      if r ~= rep then notify(r, '?' .. rc) end
    end
  end
end
if gap then
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', R, prev, now + live)) do redis.call('ZADD', R, now + live, r) end
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', WE, '-inf', now + live)) do redis.call('ZADD', WE, now + live, w) end
  -- the slots held when the gap began may still run: their leases move on
  -- by the gap (no call could refresh them meanwhile)
  local hs = redis.call('ZRANGE', H, 0, -1, 'WITHSCORES')
  for i = 1, #hs, 2 do
    local e = tonumber(hs[i + 1])
    if e > prev then redis.call('ZADD', H, e + now - prev, hs[i]) end
  end
end
redis.call('HSET', L, 'b', now)
beat = now
if not wasdown and rc and token == tostring(rc) then
  -- this replica's list is full, and was taken after the recovery began:
  -- what it admitted on its own is counted below
  redis.call('SREM', U, rep)
end
if open then redis.call('SADD', F, rep) else redis.call('SREM', F, rep) end
-- replicas whose heartbeat ran out: their slots, places and notices go
local dead = redis.call('ZRANGEBYSCORE', R, '-inf', now, 'LIMIT', 0, 64)
if #dead > 0 then
  local gone = {}
  for _, r in ipairs(dead) do
    gone[r] = true
    redis.call('ZREM', R, r)
    redis.call('HDEL', D, r)
    redis.call('DEL', ARGV[3] .. r)
    redis.call('SREM', U, r)
    redis.call('SREM', F, r)
  end
  for _, id in ipairs(redis.call('ZRANGE', H, 0, -1)) do
    if gone[string.sub(id, 1, 16)] then drop_holder(id, extra > 0) end
  end
  local wl = redis.call('HGETALL', W)
  for i = 1, #wl, 2 do
    local id = wl[i]
    if gone[string.sub(id, 1, 16)] then
      redis.call('HDEL', W, id)
      redis.call('ZREM', Q, wl[i + 1])
      redis.call('ZREM', WE, id)
      drop_waiter_cost(id)
    end
  end
end
if redis.call('HGET', D, rep) ~= decl then
  local all = redis.call('HGETALL', D)
  for i = 1, #all, 2 do
    if all[i] ~= rep and all[i + 1] ~= decl and redis.call('ZSCORE', R, all[i]) then
      return {0, all[i], all[i + 1]}
    end
  end
  if not counted and uw > 0 and not redis.call('HGET', D, rep) then
    -- a replica awaited after Redis lost its data registers again
    uw = uw - 1
    redis.call('HSET', L, 'uw', uw)
  end
  redis.call('HSET', D, rep, decl)
  local ld = redis.call('HGET', L, 'd')
  -- the costs stay: their leases may still be held
  if ld and ld ~= decl then
    redis.call('HDEL', L, 'n', 'd', 'o')
    limit, over = tonumber(ARGV[1]), nil
  end
end
redis.call('ZADD', R, now + live, rep)
for _, k in ipairs({H, Q, W, WE, SEQ, R, D, EV, L, U, F, G}) do redis.call('PEXPIRE', k, keep) end
expire_holders()
if over and held() <= limit then
  redis.call('HDEL', L, 'o')
  over = false
end
redis.call('ZREMRANGEBYSCORE', EV, '-inf', now)
-- a reader that stopped reading must not let its list grow without bound:
-- notices dropped here are caught by this very safety net
redis.call('LTRIM', G, -1000, -1)
expire_waiters()
local mine, ids, costs = {}, {}, {}
for i = first, #ARGV do
  local id, _, c = arg_lease(ARGV[i])
  mine[id] = true
  ids[i] = id
  costs[i] = c
end
local plen = #rep
local function phantom(id)
  if string.sub(id, 1, plen) ~= rep or mine[id] then return false end
  local n = tonumber(string.sub(id, plen + 1), 36)
  return n ~= nil and n <= maxid
end
for _, id in ipairs(redis.call('ZRANGE', H, 0, -1)) do
  if phantom(id) then drop_holder(id, extra > 0) end
end
local wl = redis.call('HGETALL', W)
for i = 1, #wl, 2 do
  local id = wl[i]
  if phantom(id) then
    redis.call('HDEL', W, id)
    redis.call('ZREM', Q, wl[i + 1])
    redis.call('ZREM', WE, id)
    drop_waiter_cost(id)
  end
end
if over and held() <= limit then
  redis.call('HDEL', L, 'o')
  over = false
end
-- this replica's rank among the live ones by id, so that FailOpen's
-- local limits split the fleet's exactly (ids are stable; expiries are not)
local rank, reps = 0, redis.call('ZRANGE', R, 0, -1)
for _, r in ipairs(reps) do
  if r < rep then rank = rank + 1 end
end
local out = {1, #reps, limit, rank, 0, tostring(rc or '')}
for i = first, first - 1 + nh do
  local id = ids[i]
  if redis.call('ZSCORE', H, id) then
    redis.call('ZADD', H, now + ttl, id)
    out[#out + 1] = 1
  else
    local g = math.min(costs[i], limit)
    if not redis.call('HGET', W, id) and held() + g <= limit then
      take(id, g)
      out[#out + 1] = 2
    else
      out[#out + 1] = -1
    end
  end
end
promote()
for i = first + nh, first - 1 + nh + nw do
  local id = ids[i]
  if redis.call('ZSCORE', H, id) then
    local g = 1
    if extra > 0 then g = tonumber(redis.call('HGET', L, id)) or 1 end
    out[#out + 1] = g
  elseif redis.call('HEXISTS', W, id) == 1 then
    redis.call('ZADD', WE, now + live, id)
    out[#out + 1] = 0
  elseif redis.call('ZSCORE', EV, id) then
    out[#out + 1] = -2
  else
    out[#out + 1] = -1
  end
end
out[5] = held()
return out
`)
