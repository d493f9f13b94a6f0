package redisqueue

// prelude is shared by every script. ARGV[1] is the declared MaxConcurrent,
// ARGV[2] the lease TTL in ms, ARGV[3] the prefix of the notice list keys,
// ARGV[4] the liveness lease in ms (how long a replica's heartbeat and
// queue places last without a sync), ARGV[5] the tick in ms (how often
// every replica syncs). A script's own arguments start at ARGV[6].
// A lease id in the ARGV of leave, bye and sync may carry "*" and the
// caller's count of its slots: only such an id (the replica asked for more
// than one slot for it) has its cost looked up in l.
const prelude = `
local H, Q, W, WE, SEQ, R, D, EV, G, L, U, F = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local ttl, live, tickms = tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local keep = 10 * ttl
-- limit is the fleet's limit, over whether the slots held may exceed it,
-- extra the slots held beyond one per holder, heavyq the waiters with a
-- cost, beat when a replica last synced, rc the end of a recovery; all read
-- from l on first use (lim()), since a release with nobody to promote needs
-- none of them.
local limit, over, extra, heavyq, beat, rc, uw
local read = false
local function lim()
  if not read then
    read = true
    local v = redis.call('HMGET', L, 'n', 'o', 'x', 'hw', 'b', 'rc', 'uw')
    limit = tonumber(v[1]) or tonumber(ARGV[1])
    over = v[2]
    extra = tonumber(v[3]) or 0
    heavyq = tonumber(v[4]) or 0
    beat = tonumber(v[5])
    rc = tonumber(v[6])
    uw = tonumber(v[7]) or 0
  end
  return limit
end
-- the slots held
local function held()
  lim()
  return redis.call('ZCARD', H) + extra
end
-- l may have been lost (a flush, a failover): a write to it keeps its TTL
local function add_extra(d)
  if d ~= 0 then
    extra = extra + d
    redis.call('HINCRBY', L, 'x', d)
    redis.call('PEXPIRE', L, keep)
  end
end
local function add_heavyq(d)
  heavyq = heavyq + d
  redis.call('HINCRBY', L, 'hw', d)
  redis.call('PEXPIRE', L, keep)
end
-- the id of an ARGV lease and whether the caller counts more than one slot
-- for it, and how many
local function arg_lease(a)
  local s = string.find(a, '*', 1, true)
  if not s then return a, false, 1 end
  return string.sub(a, 1, s - 1), true, tonumber(string.sub(a, s + 1)) or 1
end
-- now is Redis's clock in ms, read on first use: the common paths of
-- acquire and release never need it, and TIME is a call of its own.
local now
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

-- whether places and heartbeats can be judged by their expiry: only while
-- the fleet's heartbeats are recent. After a gap (Redis paused, a failover),
-- nobody could refresh anything, and nobody is taken for dead.
local function judging()
  lim()
  return beat ~= nil and clock() - beat <= live - tickms
end

-- whether grants are held back: a replica that was cut off may be running
-- requests it admitted on its own, which Redis counts once it syncs. A
-- recovery that ran out, or whose replicas have all synced, is ended here.
local function recovering()
  lim()
  if not rc then return false end
  if clock() < rc and (uw > 0 or redis.call('SCARD', U) > 0) then return true end
  redis.call('HDEL', L, 'rc', 'uw')
  redis.call('DEL', U)
  rc, uw = nil, 0
  return false
end

-- make id a holder of g slots; h gets its TTL back if this creates it
local hkept = false
local function take(id, g)
  redis.call('ZADD', H, clock() + ttl, id)
  if not hkept then
    hkept = true
    redis.call('PEXPIRE', H, keep)
  end
  if g > 1 then
    redis.call('HSET', L, id, g)
    add_extra(g - 1)
  end
end

-- take id out of the holders; returns the slots it held, 0 if none. Its
-- cost is looked up only when heavy (it may hold more than one slot).
local function drop_holder(id, heavy)
  if redis.call('ZREM', H, id) == 0 then return 0 end
  if not heavy then return 1 end
  local c = tonumber(redis.call('HGET', L, id))
  if not c then return 1 end
  redis.call('HDEL', L, id)
  lim()
  add_extra(1 - c)
  return c
end

-- forget the cost of a waiter that left the queue other than by a grant;
-- dropped notes that a waiter with a cost left: the line may move.
local dropped = false
local function drop_waiter_cost(id)
  lim()
  if heavyq > 0 and redis.call('HDEL', L, id) == 1 then
    add_heavyq(-1)
    dropped = true
  end
end

-- drop the holders whose lease expired, their costs with them; only while
-- the fleet's heartbeats are recent: after a gap (Redis paused for
-- everyone) the first sync moves every lease on by the gap instead, since
-- the requests on them may still run
local function expire_holders()
  if not judging() then return end
  if extra > 0 then
    local gone = redis.call('ZRANGEBYSCORE', H, '-inf', clock())
    local d = 0
    for i = 1, #gone, 256 do
      local part = {}
      for j = i, math.min(i + 255, #gone) do part[#part + 1] = gone[j] end
      local cs = redis.call('HMGET', L, unpack(part))
      for j = 1, #part do
        local c = tonumber(cs[j])
        if c then d = d + c - 1 end
      end
      redis.call('HDEL', L, unpack(part))
    end
    add_extra(-d)
  end
  redis.call('ZREMRANGEBYSCORE', H, '-inf', clock())
end

-- drop waiters whose replica stopped refreshing them
local function expire_waiters()
  if not judging() then return end
  local gone = redis.call('ZRANGEBYSCORE', WE, '-inf', clock(), 'LIMIT', 0, 256)
  for _, id in ipairs(gone) do
    local m = redis.call('HGET', W, id)
    if m then
      redis.call('ZREM', Q, m)
      redis.call('HDEL', W, id)
      drop_waiter_cost(id)
    end
    redis.call('ZREM', WE, id)
  end
end

-- push a notice to the replica of lease id; a list this creates gets a TTL
local function notify(id, what)
  local k = ARGV[3] .. string.sub(id, 1, 16)
  if redis.call('RPUSH', k, what) == 1 then redis.call('PEXPIRE', k, keep) end
end

-- whether the place of waiter id has run out: its replica stopped syncing
-- (it died, or is cut off). Such a waiter is never granted.
local function place_gone(id)
  local e = tonumber(redis.call('ZSCORE', WE, id))
  return e ~= nil and e < clock() and judging()
end

-- grant the head waiter if its slots (its cost clamped to the limit) are
-- at most free: move it to the holders and push it a grant notice on its
-- replica's list. Returns the slots granted, or false when the queue is
-- empty or the head's slots are not all free (it blocks the queue). A member
-- whose w entry is gone is stale and is dropped (an id is enqueued at most
-- once, so its w entry, if any, is this member). While no waiter has a
-- cost, the head is popped as it is: it needs one slot, and free is at
-- least 1. Requires lim().
local function grant_head(free)
  while true do
    if heavyq == 0 then
      local p = redis.call('ZPOPMIN', Q)
      if #p == 0 then return false end
      local id = string.sub(p[1], 33)
      if redis.call('HDEL', W, id) == 1 then
        local gone = place_gone(id)
        redis.call('ZREM', WE, id)
        if not gone then
          take(id, 1)
          notify(id, id)
          return 1
        end
      end
    else
      local p = redis.call('ZRANGE', Q, 0, 0)
      if #p == 0 then return false end
      local m = p[1]
      local id = string.sub(m, 33)
      if redis.call('HEXISTS', W, id) == 0 then
        redis.call('ZREM', Q, m)
      elseif place_gone(id) then
        redis.call('ZREM', Q, m)
        redis.call('HDEL', W, id)
        redis.call('ZREM', WE, id)
        drop_waiter_cost(id)
      else
        local c = tonumber(redis.call('HGET', L, id))
        local g = 1
        if c then g = math.min(c, limit) end
        if g > free then return false end
        redis.call('ZREM', Q, m)
        redis.call('HDEL', W, id)
        redis.call('ZREM', WE, id)
        if c then
          add_heavyq(-1)
          if g == 1 then redis.call('HDEL', L, id) end -- else take overwrites it
        end
        take(id, g)
        if g > 1 then notify(id, id .. '*' .. g) else notify(id, id) end
        return g
      end
    end
  end
end

-- while the head waiter's slots are free, move it to the holders
local function promote()
  if redis.call('ZCARD', Q) == 0 or recovering() then return end
  local n = held()
  local swept = false
  if n >= limit then
    -- expired leases count only when they stand in the way
    expire_holders()
    n = held()
    swept = true
  end
  while n < limit do
    local g = grant_head(limit - n)
    if g then
      n = n + g
    elseif swept or heavyq == 0 then
      return
    else
      -- the head waits for more slots than are free: expired leases
      -- stand in its way
      expire_holders()
      swept = true
      local m = held()
      if m == n then return end
      n = m
    end
  end
end

-- give back the slots or the queue place of each id; unknown ids are fine.
-- While nobody has a cost, each slot given back goes to the head waiter,
-- if any: since the slots held are at most the limit and no head holds the
-- line, a slot removed is a slot free, and counting them spares the ZCARDs
-- of promote on the hand-off path (each Redis call inside a script costs
-- several µs when Redis wakes from idle). A slot freed by an expired lease
-- is filled by the next acquire or sync instead. After SetLimit lowered the
-- limit below the slots held (o), or with costs about (a head may hold the
-- line with slots free), that count would be wrong: the slots held are
-- counted instead, and the flag dropped once they fit.
local function leave(from)
  local freed, heavy = 0, false
  for i = from, #ARGV do
    local id, h = arg_lease(ARGV[i])
    heavy = heavy or h
    local f = drop_holder(id, h)
    if f > 0 then
      freed = freed + f
    else
      local m = redis.call('HGET', W, id)
      if m then
        redis.call('ZREM', Q, m)
        redis.call('HDEL', W, id)
        redis.call('ZREM', WE, id)
        if h then drop_waiter_cost(id) end
      end
    end
  end
  if freed == 0 and not heavy then return end
  lim()
  if over then
    if held() <= limit then
      redis.call('HDEL', L, 'o')
      over = false
    end
    promote()
    return
  end
  -- during or just after a recovery the slots freed meanwhile were not
  -- handed on: count them
  if heavy or extra > 0 or heavyq > 0 or rc then
    promote()
    return
  end
  while freed > 0 and grant_head(1) do
    freed = freed - 1
  end
end
`
