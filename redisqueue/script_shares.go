package redisqueue

// The Redis data of one Name in Shares mode (see shares.go), beside the
// GlobalQueue keys of scripts.go under the same hash tag:
//
//	s     HASH   replica id → "held need prio told queued v low seq": the slots
//	             Redis counts as the replica's (never below what it runs or
//	             may run before its next sync), its demand (its running
//	             slots and waiters, at their peak since its previous sync),
//	             the highest priority among its waiters ("" when none
//	             wait), the share it was last told it may keep, its waiters
//	             now, the v of its last sync, the largest cost among its
//	             waiters (the least share that runs each of them), and the
//	             number of its last sync applied
//	se    ZSET   replica id → when its lease runs out (ms, Redis clock)
//	sm    HASH   n: the fleet's limit set by SetLimit (absent: the declared
//	             MaxConcurrent); d: the MaxConcurrent the live replicas
//	             declared; e: the epoch, made when the keys are created, so
//	             that a replica can tell Redis lost its data; v: the syncs of
//	             the epoch, so that a replica can tell Redis lost its last
//	             writes; fz: until when no share grows (ms), after a loss,
//	             unless every replica of fw (those the replica that found
//	             the loss last saw) has synced since v was fs
//	sg:R  LIST   "s" notices for replica R: sync now
//
// Each replica also enters itself in GlobalQueue's r and d (with the lease
// as its heartbeat and "Shares MaxConcurrent=n" as its limits), so that the
// two modes never run under one Name: either refuses to start beside the
// other (ErrConflict).
//
// The slots held across the fleet are the sum of s's held. A replica raises
// the limit it admits within only to the held value a reply gave it, and
// reports, before each call, at least what it runs and may run until it
// hears again; Redis lowers a held value only on that replica's report, or
// when its lease ran out. So the slots running across the fleet are never
// above that sum, and a share grows only from what is free: the sum stays
// at most the limit, except where SetLimit lowered it below what was held,
// or a replica came back from an outage with slots Redis had counted away;
// no share grows until the sum is back under the limit.

// Shares-mode keys, in the order of the scripts' KEYS.
const (
	skS  = iota // s: the holders and their demand
	skSE        // se: the leases
	skSM        // sm: the limit, the declaration, the epoch
	skR         // r: GlobalQueue's live replicas, to refuse mixing modes
	skD         // d: GlobalQueue's declarations, likewise
	skG         // sg:R of the calling replica
	numShareKeys
)

// sharesScript is every Shares-mode operation, by ARGV[5]:
//
//	sync  ARGV[6..12] = held now, need, prio ("" none), queued, the epoch
//	      this replica knows ("" none), the replicas and the v of its last
//	      reply, the gap (ms) that moves leases on, the freeze (ms) of new
//	      keys, the largest cost waiting (1 without costs), the number of
//	      this sync (each of a replica's syncs has a higher one). Reply {held,
//	      target, shrink, limit, epoch, freeze left ms,
//	      the replicas "id,id,...", free, 1 if a replica is short of its
//	      target else 0, v, 1 if the fleet holds more than its limit else
//	      0}, or {"conflict", why}, or {"stale"} for a sync that arrived
//	      after a later one of the same replica (nothing is changed).
//	limit ARGV[6] = the new limit. Reply: the limit.
//	bye   the replica leaves: its share goes back at once. Reply: 1.
//	stats Reply {held in all, queued in all, replicas, limit}.
//
// ARGV[1..4] (every call): the declared MaxConcurrent, the lease TTL (ms),
// the prefix of the notice lists, this replica's id.
var sharesScript = newScript(`
local S, SE, SM, GR, GD, MINE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local declared, ttl, lists, me, op = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = 10 * ttl

local function notify(id)
  local k = lists .. id
  if redis.call('LLEN', k) == 0 then
    redis.call('RPUSH', k, 's')
    redis.call('PEXPIRE', k, keep)
  end
end

local meta = redis.call('HMGET', SM, 'n', 'd', 'e', 'fz', 'fw', 'v', 'fs', 'b')
local limit = tonumber(meta[1]) or tonumber(declared)

if op == 'sync' then
  local beat = tonumber(meta[8])
  if beat and now - beat > tonumber(ARGV[13]) then
    -- Nobody synced for longer than any replica's period: Redis was paused
    -- or unreachable for everyone, whoever syncs first now (a replica back
    -- from an outage, one that never marked Redis down, one that just
    -- started). Every lease is moved on by the gap, so that nobody is
    -- taken for dead for it while it may still run its share: a replica
    -- stops admitting at its own lease end and reports what it runs at its
    -- next sync. If the fleet had died instead, its shares come back a
    -- lease later.
    local gap = now - beat
    local all = redis.call('ZRANGE', SE, 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do redis.call('ZADD', SE, tonumber(all[i + 1]) + gap, all[i]) end
  end
  redis.call('HSET', SM, 'b', now)

  -- Leases that ran out: their replicas stopped syncing. Only a sync
  -- sweeps, after the gap above: a call of another kind that reached Redis
  -- first after an outage would take every replica for dead.
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', SE, '-inf', now)) do
    redis.call('HDEL', S, id)
    redis.call('ZREM', SE, id)
    redis.call('DEL', lists .. id)
    redis.call('ZREM', GR, id)
    redis.call('HDEL', GD, id)
  end
end

-- Every replica's record.
local ids, held, need, prio, told, queued, synced, low, sent = {}, {}, {}, {}, {}, {}, {}, {}, {}
local function load()
  ids, held, need, prio, told, queued, synced, low, sent = {}, {}, {}, {}, {}, {}, {}, {}, {}
  local all = redis.call('HGETALL', S)
  for i = 1, #all, 2 do
    local id = all[i]
    local h, n, p, d, q, v, w, c = string.match(all[i + 1], '^(%d+) (%d+) (%S*) (%d+) (%d+) (%d+) (%d+) (%d+)$')
    if h then
      ids[#ids + 1] = id
      held[id], need[id], prio[id], told[id], queued[id] = tonumber(h), tonumber(n), tonumber(p), tonumber(d), tonumber(q)
      synced[id], low[id], sent[id] = tonumber(v), tonumber(w), tonumber(c)
    end
  end
  table.sort(ids)
end


if op == 'stats' then
  load()
  local h, q = 0, 0
  for _, id in ipairs(ids) do h = h + held[id]; q = q + queued[id] end
  return {h, q, #ids, limit}
end

if op == 'bye' then
  redis.call('HDEL', S, me)
  redis.call('ZREM', SE, me)
  redis.call('DEL', MINE)
  redis.call('ZREM', GR, me)
  redis.call('HDEL', GD, me)
  load()
  for _, id in ipairs(ids) do
    if need[id] > held[id] then notify(id) end
  end
  return 1
end

if op == 'limit' then
  redis.call('HSET', SM, 'n', ARGV[6])
  redis.call('PEXPIRE', SM, keep)
  load()
  for _, id in ipairs(ids) do
    if id ~= me then notify(id) end
  end
  return tonumber(ARGV[6])
end

-- sync. A live replica in r that has no share runs in GlobalQueue mode.
load()
-- A sync that reaches Redis after a later one of the same replica (its
-- caller gave up on it, and synced again) says what the replica held then:
-- applied, it would lower what Redis counts as the replica's and let
-- another grow into slots still in use.
local seq = tonumber(ARGV[16])
if sent[me] and seq <= sent[me] then return {'stale'} end
for _, r in ipairs(redis.call('ZRANGEBYSCORE', GR, '(' .. now, '+inf')) do
  if r ~= me and not held[r] then
    return {'conflict', 'replica ' .. r .. ' of this Name runs in GlobalQueue mode'}
  end
end
local others = 0
for _, id in ipairs(ids) do
  if id ~= me then others = others + 1 end
end
if meta[2] and meta[2] ~= declared then
  if others > 0 then
    return {'conflict', 'live replicas declared MaxConcurrent=' .. meta[2] .. ', this one ' .. declared}
  end
  -- Nobody of the old declaration is live: the limit set for it goes too.
  redis.call('HDEL', SM, 'n')
  limit = tonumber(declared)
end
redis.call('HSET', SM, 'd', declared)

local epoch, freeze = meta[3], tonumber(meta[4]) or 0
local cur = tonumber(ARGV[6])
-- v counts the syncs of the epoch; each record keeps the v of its last.
-- fw: the replicas a freeze waits for, "id,id,..."; absent, only time ends it.
local awaited, v, since = meta[5], tonumber(meta[6]) or 0, tonumber(meta[7]) or 0
if not epoch then
  -- New keys: a new Name, or Redis lost its data. A replica that held
  -- slots of the old data and has not synced yet would not be counted, and
  -- one that knew nothing cannot tell: no share grows for as long as it
  -- takes a live replica to sync (ARGV[14]), or until a replica that knew
  -- the old data says whom to wait for (below).
  epoch = me .. '.' .. now
  freeze, since = now + tonumber(ARGV[14]), 1
  redis.call('HSET', SM, 'e', epoch, 'fz', freeze, 'fs', since)
end
local seenV = tonumber(ARGV[12]) or 0
local lostData = ARGV[10] ~= '' and ARGV[10] ~= epoch
if lostData or (ARGV[10] == epoch and seenV > v) then
  -- This replica saw an epoch Redis no longer has (Redis lost its data), or
  -- a later sync than Redis remembers (it lost its last writes, as a
  -- failover to a replica they had not reached does): shares may have moved
  -- to replicas that Redis no longer counts. No share grows until every
  -- replica this one last saw has synced since, or for a lease (by then a
  -- replica that did not has stopped using its share). A replica that
  -- joins meanwhile does not count: it held nothing.
  if not lostData then
    v = math.max(v, seenV)
    since = v + 1
  end
  freeze = math.max(freeze, now + ttl)
  if awaited and awaited ~= '' then awaited = awaited .. ',' .. ARGV[11] else awaited = ARGV[11] end
  redis.call('HSET', SM, 'fz', freeze, 'fw', awaited, 'fs', since)
end
v = v + 1
redis.call('HSET', SM, 'v', v)

if not held[me] then ids[#ids + 1] = me; table.sort(ids) end
synced[me] = v
if now < freeze and awaited then
  local back = true
  for id in string.gmatch(awaited, '[^,]+') do
    if not synced[id] or synced[id] < since then back = false end
  end
  if back then
    freeze = 0
    redis.call('HDEL', SM, 'fz', 'fw', 'fs')
  end
end
held[me], need[me], prio[me], queued[me] = cur, tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
low[me] = tonumber(ARGV[15]) or 1
-- the least share that lets a replica's largest waiting request run: its
-- cost, at most the limit and at most its demand
local function least(id) return math.max(1, math.min(low[id] or 1, limit, math.max(need[id], 1))) end

-- Targets: the limit goes to the demand of the highest priority first,
-- then the next; within a priority that the rest cannot cover, a slot to
-- each replica with demand, then in proportion to the demand beyond it
-- (largest remainders first, then replica id); replicas that never had
-- waiters come last. What no demand takes is split evenly, as room for
-- arrivals.
local order = {}
for i, id in ipairs(ids) do order[i] = id end
table.sort(order, function(a, b)
  local pa, pb = prio[a], prio[b]
  if pa ~= pb then
    if pa == nil then return false end
    if pb == nil then return true end
    return pa > pb
  end
  return a < b
end)
local target, left = {}, limit
local i = 1
while i <= #order do
  local j, d = i, 0
  while j <= #order and prio[order[j]] == prio[order[i]] do d = d + need[order[j]]; j = j + 1 end
  if d <= left then
    for k = i, j - 1 do target[order[k]] = need[order[k]] end
    left = left - d
  else
    local dem = {}
    for k = i, j - 1 do
      local id = order[k]
      target[id] = 0
      if need[id] > 0 then dem[#dem + 1] = id end
    end
    table.sort(dem)
    -- Each replica first gets the least share that runs its largest
    -- waiting request (one slot without costs).
    local lows = 0
    for _, id in ipairs(dem) do lows = lows + least(id) end
    if lows > left then
      -- Fewer slots than those least shares: each in turn gets its least
      -- share while the slots last, in an order that turns every second,
      -- so that none waits forever.
      local turn, pos = math.floor(now / 1000), {}
      for k, id in ipairs(dem) do pos[id] = (k - 1 + turn) % #dem end
      table.sort(dem, function(a, b) return pos[a] < pos[b] end)
      local rest = left
      for _, id in ipairs(dem) do
        if least(id) <= rest then
          target[id] = least(id)
          rest = rest - least(id)
        end
      end
    else
      -- The least shares first, so that no replica whose requests wait is
      -- starved by rounding; the rest in proportion to the demand beyond.
      local rest, beyond, given, fr = left - lows, d - lows, 0, {}
      for _, id in ipairs(dem) do
        local exact = 0
        if beyond > 0 then exact = rest * (need[id] - least(id)) / beyond end
        target[id] = least(id) + math.floor(exact)
        given = given + math.floor(exact)
        fr[#fr + 1] = {id, exact - math.floor(exact)}
      end
      table.sort(fr, function(a, b)
        if a[2] ~= b[2] then return a[2] > b[2] end
        return a[1] < b[1]
      end)
      for k = 1, rest - given do target[fr[k][1]] = target[fr[k][1]] + 1 end
    end
    left = 0
  end
  i = j
end
if left > 0 then
  local per, extra = math.floor(left / #ids), left % #ids
  for k, id in ipairs(ids) do
    target[id] = target[id] + per
    if k <= extra then target[id] = target[id] + 1 end
  end
end

-- This replica's share grows from what is free, after the needs of
-- replicas of a higher priority.
local sum = 0
for _, id in ipairs(ids) do sum = sum + held[id] end
local free = limit - sum
local frozen = now < freeze
if not frozen and target[me] > cur and free > 0 then
  local reserve = 0
  for _, id in ipairs(ids) do
    if id ~= me and prio[id] ~= nil and (prio[me] == nil or prio[id] > prio[me]) then
      reserve = reserve + math.max(0, target[id] - held[id])
    end
  end
  local grant = math.max(0, math.min(target[me] - cur, free - reserve))
  held[me] = cur + grant
  free = free - grant
end

-- Shares shrink only while the fleet holds more than its limit (SetLimit
-- lowered it, or a replica came back with slots counted away), or while
-- another's need is not met from what is free. Slots a replica holds
-- beyond its own demand (idle) go to any replica short of its target, and
-- so do busy slots of a lower priority than its waiters'. Busy slots of
-- the same priority move only when the replica short of its target waits
-- longer than the giver would after the move, by a fifth (a wait grows as
-- demand per slot beyond 1): demand measured at saturation wavers by a
-- slot or two, and moving busy slots for that costs round trips and evens
-- out no waits. A replica that holds less than the least share that runs
-- its largest waiting request (no slot, without costs), whose requests
-- would wait without end, takes slots from anyone above target.
local function deficit(id) return math.max(0, target[id] - held[id]) end
local function above(a, b) -- a's waiters are of a higher priority than b's
  return prio[a] ~= nil and (prio[b] == nil or prio[a] > prio[b])
end
local function significant(j)
  if deficit(j) <= 0 then return false end
  for _, i in ipairs(ids) do
    if i ~= j and held[i] > target[i] then
      if above(j, i) then return true end
      -- below the least share that runs its largest waiting request (no
      -- slot at all, without costs), it waits without end
      if held[j] < least(j) then return true end
      if held[i] > 1 then
        local wj, wi = need[j] / held[j] - 1, math.max(need[i] / (held[i] - 1) - 1, 0)
        if wj > 0 and wj > 1.2 * wi then return true end
      end
    end
  end
  return false
end
local function idle(id) return held[id] > math.max(target[id], need[id]) end
local short, shortBusy = 0, 0
for _, id in ipairs(ids) do
  short = short + deficit(id)
  if significant(id) then shortBusy = shortBusy + deficit(id) end
end
local over = free < 0
local shrinkIdle, shrinkBusy = short > free, shortBusy > free
local shrink = over or shrinkBusy or (shrinkIdle and idle(me))
-- told: the share this replica now believes it may keep.
local keepTold = math.max(target[me], held[me])
if shrink then keepTold = target[me] end
redis.call('HSET', S, me, held[me] .. ' ' .. need[me] .. ' ' .. ARGV[8] .. ' ' .. keepTold .. ' ' .. queued[me] .. ' ' .. v .. ' ' .. low[me] .. ' ' .. seq)
redis.call('ZADD', SE, now + ttl, me)
-- Declared in GlobalQueue's keys as well, so that a replica of that mode
-- refuses to start beside this one.
redis.call('ZADD', GR, now + ttl, me)
redis.call('HSET', GD, me, 'Shares MaxConcurrent=' .. declared)
for _, id in ipairs(ids) do
  if id ~= me then
    -- Tell a replica above its target once, when its target fell below
    -- the share it believes it may keep, so that it gives back; tell one
    -- short of its target when slots are free.
    local give = over or (shrinkBusy and significant(me)) or (shrinkIdle and deficit(me) > 0 and idle(id))
    if give and held[id] > target[id] and told[id] > target[id] then
      notify(id)
    elseif free > 0 and not frozen and deficit(id) > 0 then
      notify(id)
    end
  end
end
for _, k in ipairs({S, SE, SM, GR, GD}) do redis.call('PEXPIRE', k, keep) end
local left_ms = 0
if frozen then left_ms = freeze - now end
local anyShort = 0
if short > 0 then anyShort = 1 end
-- The replicas a loss found now would wait for: those with a record, and
-- those a freeze still waits for (they may hold slots of older data).
local seen = table.concat(ids, ',')
if frozen and awaited and awaited ~= '' then seen = seen .. ',' .. awaited end
return {held[me], target[me], shrink and 1 or 0, limit, epoch, left_ms, seen, math.max(free, 0), anyShort, v, over and 1 or 0}
`)
