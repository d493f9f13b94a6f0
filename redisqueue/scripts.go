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
//	h    ZSET   lease id → lease expiry (ms, Redis clock): the slots held
//	q    ZSET   all scores 0; member = prio(16 hex) seq(16 hex) lease id, so
//	            the lexically smallest member is the highest priority, then
//	            the earliest arrival: ZPOPMIN pops the next waiter
//	w    HASH   lease id → its member of q
//	we   ZSET   lease id → waiter lease expiry: a queued place whose replica
//	            stops refreshing it is dropped
//	seq  STRING arrival counter
//	r    ZSET   replica id → replica expiry: the live replicas
//	d    HASH   replica id → the limits it declared
//	ev   ZSET   lease id → expiry: waiters evicted by an arrival of higher
//	            priority, kept a lease TTL so that the safety net can tell
//	            an eviction from a loss when the notice did not arrive
//	g:R  LIST   notices for replica R (R = first 16 chars of a lease id):
//	            a lease id (granted), or "!" and a lease id (evicted);
//	            RPUSHed by the scripts, BLPOPed by R's reader. KEYS[9] is
//	            the calling replica's own list; other replicas' lists are
//	            named from ARGV[3], since which replica a notice goes to is
//	            known only inside the script (same hash tag, same slot).
//	l    HASH   the fleet's limit, set by SetLimit; absent, the declared
//	            MaxConcurrent (ARGV[1]) is the limit. n: the limit; d: the
//	            limits declared by the replica that set it (a replica that
//	            declares others, once no replica of those is live, deletes
//	            l); o: present while the holders may outnumber the limit
//	            (SetLimit lowered it below them). KEYS[10].
//
// Invariants, kept by every script: a lease id is in at most one of h and
// w; w and q agree (a member of q whose w entry is gone is stale and is
// skipped); len(h) <= limit unless l has o. The limit is read inside each
// script, at most once, so every replica sees a change at once and no two
// scripts disagree. Time is redis.call('TIME'), read at most once
// per script and only when needed; since Redis 5 scripts replicate their
// effects, so that is deterministic on replicas. New builds KEYS in this order.

// prelude is shared by every script. ARGV[1] is the declared MaxConcurrent,
// ARGV[2] the lease TTL in ms, ARGV[3] the prefix of the notice list keys.
const prelude = `
local H, Q, W, WE, SEQ, R, D, EV, G, L = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local ttl = tonumber(ARGV[2])
-- limit is the fleet's limit, over whether holders may outnumber it; both
-- read from l on first use (lim()), since a release with nobody to promote
-- needs neither.
local limit, over
local function lim()
  if not limit then
    local v = redis.call('HMGET', L, 'n', 'o')
    limit = tonumber(v[1]) or tonumber(ARGV[1])
    over = v[2]
  end
  return limit
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

-- drop waiters whose replica stopped refreshing them
local function expire_waiters()
  local gone = redis.call('ZRANGEBYSCORE', WE, '-inf', clock(), 'LIMIT', 0, 256)
  for _, id in ipairs(gone) do
    local m = redis.call('HGET', W, id)
    if m then
      redis.call('ZREM', Q, m)
      redis.call('HDEL', W, id)
    end
    redis.call('ZREM', WE, id)
  end
end

-- push a notice to the replica of lease id
local function notify(id, what)
  redis.call('RPUSH', ARGV[3] .. string.sub(id, 1, 16), what)
end

-- pop the head waiter into the holders and push it a grant notice on its
-- replica's list; false when the queue is empty. A popped member whose w
-- entry is gone is stale and is dropped (HDEL both checks and removes: an
-- id is enqueued at most once, so its w entry, if any, is this member).
local function grant_head()
  while true do
    local p = redis.call('ZPOPMIN', Q)
    if #p == 0 then return false end
    local id = string.sub(p[1], 33)
    if redis.call('HDEL', W, id) == 1 then
      redis.call('ZREM', WE, id)
      redis.call('ZADD', H, clock() + ttl, id)
      notify(id, id)
      return true
    end
  end
end

-- while a slot is free, move the head waiter to the holders
local function promote()
  if redis.call('ZCARD', Q) == 0 then return end
  local n = redis.call('ZCARD', H)
  if n >= lim() then
    -- expired leases count only when they stand in the way
    redis.call('ZREMRANGEBYSCORE', H, '-inf', clock())
    n = redis.call('ZCARD', H)
  end
  while n < limit and grant_head() do
    n = n + 1
  end
end

-- give back the slot or the queue place of each id; unknown ids are fine.
-- Each slot given back goes to the head waiter, if any: since len(h) <=
-- limit, a slot removed is a slot free, and counting them spares the
-- ZCARDs of promote on the hand-off path (each Redis call inside a script
-- costs several µs when Redis wakes from idle). A slot freed by an expired
-- lease is filled by the next acquire or sync instead. After SetLimit
-- lowered the limit below the holders (o), that count would be wrong: the
-- holders are counted instead, and the flag dropped once they fit.
local function leave(from)
  local freed = 0
  for i = from, #ARGV do
    local id = ARGV[i]
    if redis.call('ZREM', H, id) == 1 then
      freed = freed + 1
    else
      local m = redis.call('HGET', W, id)
      if m then
        redis.call('ZREM', Q, m)
        redis.call('HDEL', W, id)
        redis.call('ZREM', WE, id)
      end
    end
  end
  if freed == 0 then return end
  lim()
  if over then
    if redis.call('ZCARD', H) <= limit then
      redis.call('HDEL', L, 'o')
      over = false
    end
    promote()
    return
  end
  while freed > 0 and grant_head() do
    freed = freed - 1
  end
end
`

// acquireScript: ARGV[4] max queue, ARGV[5] lease id, ARGV[6] priority key.
// Returns {outcome, limit}: outcome 1 granted, 0 queued, -1 queue full;
// limit the fleet's limit it went by. A full queue evicts a waiter
// of lower priority, if any, to make room; see below. Idempotent: an id already
// holding or queued gets its state back, so a retried call changes nothing.
var acquireScript = newScript(prelude + `
local maxq, id = tonumber(ARGV[4]), ARGV[5]
lim()
local n = redis.call('ZCARD', H)
local qn = redis.call('ZCARD', Q)
-- The common case: a free slot and nobody waiting. A retried call finds
-- its id here or in w only when the slots are full or someone waits, so
-- the checks below are not needed here; ZADD of a held id only moves its
-- expiry.
if n < limit and qn == 0 then
  redis.call('ZADD', H, clock() + ttl, id)
  return {1, limit}
end
if redis.call('ZSCORE', H, id) then return {1, limit} end
if qn > 0 and redis.call('HEXISTS', W, id) == 1 then return {0, limit} end
if n >= limit then
  redis.call('ZREMRANGEBYSCORE', H, '-inf', clock())
  n = redis.call('ZCARD', H)
end
if qn > 0 and n < limit then
  -- slots freed by expired leases: serve the waiters first
  promote()
  n = redis.call('ZCARD', H)
  qn = redis.call('ZCARD', Q)
end
-- a slot is taken at once only when nobody waits, so nobody is overtaken
if n < limit and qn == 0 then
  redis.call('ZADD', H, clock() + ttl, id)
  return {1, limit}
end
if qn >= maxq then
  expire_waiters()
  -- Full: an arrival of higher priority takes the place of the newest
  -- waiter of the lowest priority present, the lexically largest member of
  -- q; an arrival of that priority or lower is refused.
  while redis.call('ZCARD', Q) >= maxq do
    local last = redis.call('ZRANGE', Q, -1, -1)
    if #last == 0 or string.sub(last[1], 1, 16) <= ARGV[6] then return {-1, limit} end
    local m = last[1]
    local vid = string.sub(m, 33)
    redis.call('ZREM', Q, m)
    if redis.call('HGET', W, vid) == m then
      redis.call('HDEL', W, vid)
      redis.call('ZREM', WE, vid)
      redis.call('ZADD', EV, clock() + ttl, vid)
      notify(vid, '!' .. vid)
    end
  end
end
local m = ARGV[6] .. string.format('%016x', redis.call('INCR', SEQ)) .. id
redis.call('ZADD', Q, 0, m)
redis.call('HSET', W, id, m)
redis.call('ZADD', WE, clock() + ttl, id)
return {0, limit}
`)

// leaveScript: ARGV[4...] lease ids to release or cancel. Idempotent.
var leaveScript = newScript(prelude + `
leave(4)
return 1
`)

// syncScript is the heartbeat, the lease refresh, the safety net and the
// reconcile in one call. ARGV[4] replica id, ARGV[5] its declared limits,
// ARGV[6] the number of holder ids, ARGV[7] the number of queued waiter ids,
// ARGV[8] the highest id this replica had given out when it listed them,
// then holder ids, then queued waiter ids, then the ids of waiters whose
// acquire is in flight. Every lease of this replica in h, w or q up to that
// id that is none of these is a phantom (a lease of a higher id is an
// acquire that began after the list was taken, and may have reached Redis
// first) (a release or cancel acknowledged by a master
// that then lost it in a failover, say) and is dropped, its slot promoted:
// a replica knows which slots it holds.
//
// Returns {0, other replica, its limits} when a live replica of the same
// Name declared other limits (nothing else is done), or {1, live replicas,
// the fleet's limit, this replica's rank among them by id, one status per
// holder id, one per waiter id}. A
// replica that declares limits while l was set by a replica of other
// limits (none is live, or this would be a conflict) deletes l: a fleet
// started again with other limits starts from its own MaxConcurrent. Holder status: 1 refreshed,
// 2 reclaimed (Redis had lost the lease, as after a restart, and a slot was
// free: the request is running, so count it), -1 lost (the slot went to
// someone else; the limit is exceeded until this request ends). Waiter
// status: 0 queued (refreshed), 1 granted (the notice may be lost), -2
// evicted (likewise), -1 lost (not in Redis: enqueue again).
var syncScript = newScript(prelude + `
local rep, decl, nh, nw, maxid = ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
clock()
local dead = redis.call('ZRANGEBYSCORE', R, '-inf', now, 'LIMIT', 0, 64)
for _, r in ipairs(dead) do
  redis.call('ZREM', R, r)
  redis.call('HDEL', D, r)
  redis.call('DEL', ARGV[3] .. r)
end
if redis.call('HGET', D, rep) ~= decl then
  local all = redis.call('HGETALL', D)
  for i = 1, #all, 2 do
    if all[i] ~= rep and all[i + 1] ~= decl and redis.call('ZSCORE', R, all[i]) then
      return {0, all[i], all[i + 1]}
    end
  end
  redis.call('HSET', D, rep, decl)
  local ld = redis.call('HGET', L, 'd')
  if ld and ld ~= decl then redis.call('DEL', L) end
end
redis.call('ZADD', R, now + ttl, rep)
for _, k in ipairs({R, D, SEQ, EV, L}) do redis.call('PEXPIRE', k, 10 * ttl) end
redis.call('ZREMRANGEBYSCORE', H, '-inf', now)
if lim() and over and redis.call('ZCARD', H) <= limit then
  redis.call('HDEL', L, 'o')
end
redis.call('ZREMRANGEBYSCORE', EV, '-inf', now)
-- a reader that stopped reading must not let its list grow without bound:
-- notices dropped here are caught by this very safety net
redis.call('LTRIM', G, -1000, -1)
expire_waiters()
local mine = {}
for i = 9, #ARGV do mine[ARGV[i]] = true end
local plen = #rep
local function phantom(id)
  if string.sub(id, 1, plen) ~= rep or mine[id] then return false end
  local n = tonumber(string.sub(id, plen + 1), 36)
  return n ~= nil and n <= maxid
end
for _, id in ipairs(redis.call('ZRANGE', H, 0, -1)) do
  if phantom(id) then redis.call('ZREM', H, id) end
end
local wl = redis.call('HGETALL', W)
for i = 1, #wl, 2 do
  local id = wl[i]
  if phantom(id) then
    redis.call('HDEL', W, id)
    redis.call('ZREM', Q, wl[i + 1])
    redis.call('ZREM', WE, id)
  end
end
if lim() and over and redis.call('ZCARD', H) <= limit then
  redis.call('HDEL', L, 'o')
end
-- this replica's rank among the live ones by id, so that FailOpen's
-- local limits split the fleet's exactly (ids are stable; expiries are not)
local rank, reps = 0, redis.call('ZRANGE', R, 0, -1)
for _, r in ipairs(reps) do
  if r < rep then rank = rank + 1 end
end
local out = {1, #reps, limit, rank}
for i = 9, 8 + nh do
  local id = ARGV[i]
  if redis.call('ZSCORE', H, id) then
    redis.call('ZADD', H, now + ttl, id)
    out[#out + 1] = 1
  elseif not redis.call('HGET', W, id) and redis.call('ZCARD', H) < limit then
    redis.call('ZADD', H, now + ttl, id)
    out[#out + 1] = 2
  else
    out[#out + 1] = -1
  end
end
promote()
for i = 9 + nh, 8 + nh + nw do
  local id = ARGV[i]
  if redis.call('ZSCORE', H, id) then
    out[#out + 1] = 1
  elseif redis.call('HEXISTS', W, id) == 1 then
    redis.call('ZADD', WE, now + ttl, id)
    out[#out + 1] = 0
  elseif redis.call('ZSCORE', EV, id) then
    out[#out + 1] = -2
  else
    out[#out + 1] = -1
  end
end
return out
`)

// setLimitScript: ARGV[4] the new limit, ARGV[5] the caller's declared
// limits. Lowering preempts nobody: if the holders outnumber the new limit,
// o is set and no one is admitted until they fit. Raising grants waiters at
// once, in the order of q, with notices as for any grant. Returns the
// limit.
var setLimitScript = newScript(prelude + `
local n = tonumber(ARGV[4])
redis.call('HSET', L, 'n', n, 'd', ARGV[5])
redis.call('PEXPIRE', L, 10 * ttl)
limit = n
redis.call('ZREMRANGEBYSCORE', H, '-inf', clock())
if redis.call('ZCARD', H) > n then
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

// byeScript: ARGV[4] replica id, ARGV[5...] lease ids to leave. Run by Close
// once nothing is held here.
var byeScript = newScript(prelude + `
leave(5)
local rep = ARGV[4]
redis.call('ZREM', R, rep)
redis.call('HDEL', D, rep)
redis.call('DEL', G)
return 1
`)
