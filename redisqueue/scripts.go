package redisqueue

import (
	"crypto/sha1"
	"encoding/hex"
)

// script is a Lua script and its SHA1. Backend.call runs it with EVALSHA
// and, if Redis does not know it yet (NOSCRIPT), with EVAL.
type script struct{ src, sha string }

func newScript(src string) *script {
	h := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(h[:])}
}

// The Redis data of one Name. Every key carries the hash tag {Name}, so all
// of them live in one Redis Cluster slot and each script touches one node.
//
//	h    ZSET   lease id → lease expiry (ms, Redis clock): the holders
//	q    ZSET   all scores 0; member = prio(16 hex) seq(16 hex) lease id, so
//	            the lexically smallest member is the highest priority, then
//	            the earliest arrival: ZPOPMIN pops the next waiter
//	w    HASH   lease id → its member of q
//	we   ZSET   lease id → when its place runs out (its replica's last sync
//	            plus the liveness lease): a place whose replica stops
//	            refreshing it is never granted, and is dropped
//	seq  STRING arrival counter
//	r    ZSET   replica id → when its heartbeat runs out (its last sync plus
//	            the liveness lease): the live replicas
//	d    HASH   replica id → the limits it declared
//	ev   ZSET   lease id → expiry: waiters evicted by an arrival of higher
//	            priority, kept a lease TTL so that the safety net can tell
//	            an eviction from a loss when the notice did not arrive
//	g:R  LIST   notices for replica R (R = first 16 chars of a lease id):
//	            a lease id (granted one slot), a lease id, "*" and n
//	            (granted n slots), "!" and a lease id (evicted), or "?"
//	            and a token (sync now with that token: a recovery waits
//	            for it);
//	            RPUSHed by the scripts, BLPOPed by R's reader. KEYS[9] is
//	            the calling replica's own list; other replicas' lists are
//	            named from ARGV[3], since which replica a notice goes to is
//	            known only inside the script (same hash tag, same slot).
//	l    HASH   the fleet's limit, set by SetLimit; absent, the declared
//	            MaxConcurrent (ARGV[1]) is the limit. n: the limit; d: the
//	            limits declared by the replica that set it (a replica that
//	            declares others, once no replica of those is live, deletes
//	            n, d and o); o: present while the slots held may exceed the
//	            limit (SetLimit lowered it below them). KEYS[10]. Weighted
//	            requests (Config.Cost) keep their costs here too: a lease id
//	            → its cost, for a holder of more than one slot (the slots
//	            granted) and a waiter that asks for more than one (the slots
//	            asked; absent, 1); x: the slots held beyond one per holder
//	            (the sum of cost-1 over the holders); hw: the waiters with a
//	            cost. In one key with the limit, so that the one HMGET every
//	            script makes reads them, and so that they expire together:
//	            when l expires (no sync for 10 lease TTLs), every lease with
//	            a cost expired long before, and x goes with the costs. b:
//	            when any replica last synced (every replica syncs every
//	            tick), so that a gap in the heartbeats (Redis paused, or a
//	            failover) is told from replicas that died. rc: while set and
//	            not passed, grants are held back until every replica in u
//	            has synced.
//	u    SET    the FailOpen replicas live when a replica came back from an
//	            outage or a gap was seen: each may have been cut off too and
//	            admitted requests on its own, which Redis does not count
//	            until it syncs with a full list. KEYS[11]. In l, uw: how many
//	            replicas Redis lost with its data are still awaited.
//	f    SET    the replicas that may admit on their own (FailOpen).
//	            KEYS[12].
//
// Every key gets a TTL of 10 lease TTLs where it is created and at every
// sync and goodbye, so that nothing outlives the last replica of a Name.
//
// The slots held are len(h) + x. Invariants, kept by every script: a lease
// id is in at most one of h and w; w and q agree (a member of q whose w
// entry is gone is stale and is skipped); x and hw match the costs in l;
// the slots held are at most the limit unless l has o. The limit is read
// inside each script, at most once, so every replica sees a change at once
// and no two scripts disagree. Time is redis.call('TIME'), read at most
// once per script and only when needed; since Redis 5 scripts replicate
// their effects, so that is deterministic on replicas. New builds KEYS in
// this order.
//
// Head of the line: a head waiter whose slots (its cost, clamped to the
// limit) are not all free holds the line; nobody behind it is granted, and
// an arrival takes free slots without queueing only if it is of a higher
// priority than the head. While nobody has a cost (x and hw are zero), the
// scripts make the same Redis calls as they would without costs.

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

-- drop the holders whose lease expired, their costs with them
local function expire_holders()
  lim()
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
-- empty or the head's slots are not all free (it holds the line). A member
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
      -- a waiter with a cost that left may have let the line move
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
redis.call('ZADD', Q, 0, m)
redis.call('HSET', W, id, m)
redis.call('ZADD', WE, clock() + live, id)
if qn == 0 then
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

// leaveScript: ARGV[6...] lease ids to release or cancel. Idempotent.
// Returns the slots the fleet holds after it.
var leaveScript = newScript(prelude + `
leave(6)
return held()
`)

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

// probeScript does nothing: an answer says the master of the Name's slot
// answers.
var probeScript = newScript(`return 1`)

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
