package redisqueue

// The second part of sharesScript (script_shares.go): the sync, the call
// every replica makes to report its demand and learn its share.
const sharesSyncLua = `-- sync.
local beat = tonumber(meta[9])
if beat and now - beat > tonumber(ARGV[13]) then
  -- Nobody synced for longer than any live replica's renewal: Redis was
  -- paused or unreachable for everyone, whoever syncs first now. Every
  -- lease is moved on by the gap (the lease clock goes back by it), so
  -- that nobody is taken for dead for it while it may still run its share:
  -- a replica stops admitting at its own lease end and reports what it
  -- runs at its next sync. If the fleet had died instead, its shares come
  -- back a lease later.
  off = off + (now - beat)
  redis.call('HSET', SM, 'o', off)
end
redis.call('HSET', SM, 'b', now)
-- sm is new (a first sync, or Redis lost the Name): its expiry now, for a
-- return below that comes before the end, where every key gets its own.
if not beat then redis.call('PEXPIRE', SM, keep) end
local clock = now - off

local old = parse(redis.call('HGET', S, me))
-- A sync that reaches Redis after a later one of the same replica (its
-- caller gave up on it, and synced again) says what the replica held then:
-- applied, it would lower what Redis counts as the replica's and let
-- another grow into slots still in use.
local seq = tonumber(ARGV[16])
if old and seq <= old.seq then return {'stale'} end
-- A live replica in GlobalQueue's r that has no record here runs in
-- GlobalQueue mode. GlobalQueue's d names every replica of either mode:
-- only when it names more than there are records is r read, and what it
-- names of replicas long gone is cleared then.
if redis.call('HLEN', GD) > tot.R then
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', GR, '(' .. now, '+inf')) do
    if r == 'split' then
      return {'conflict', 'live replicas split this Name into parts (Options.Shares.Parts)'}
    end
    if r ~= me and redis.call('HEXISTS', S, r) == 0 then
      return {'conflict', 'replica ' .. r .. ' of this Name runs in GlobalQueue mode'}
    end
  end
  for _, r in ipairs(redis.call('HKEYS', GD)) do
    if r ~= me and redis.call('HEXISTS', S, r) == 0 and not redis.call('ZSCORE', GR, r) then
      redis.call('HDEL', GD, r)
    end
  end
end
if meta[2] and meta[2] ~= declared then
  -- Only replicas whose leases have not run out count: the others are
  -- swept below, a few at a time.
  local live = redis.call('ZCOUNT', SE, '(' .. clock, '+inf')
  local myLease = tonumber(redis.call('ZSCORE', SE, me) or 0)
  if myLease > clock then live = live - 1 end
  if live > 0 then
    return {'conflict', 'live replicas declared MaxConcurrent=' .. meta[2] .. ', this one ' .. declared}
  end
  -- Nobody of the old declaration is live: the limit set for it goes too.
  redis.call('HDEL', SM, 'n')
  limit = tonumber(declared)
end
redis.call('HSET', SM, 'd', declared)

-- A few leases that ran out: their replicas stopped syncing. Only a sync
-- sweeps, after the gap above: a call of another kind that reached Redis
-- first after an outage would take every replica for dead. After the checks
-- above: a sync that returns early must change no total. Not this replica:
-- it is alive, and its record (read above) is swapped for its report below;
-- swept too, its slots would leave the totals twice.
local freed = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', SE, '-inf', clock, 'LIMIT', 0, 4)) do
  if id ~= me then freed = freed + forget(id) end
end
-- Replicas told that slots are free that did not sync since: they leave
-- the turns (a replica that syncs again joins at the end).
for _, id in ipairs(redis.call('ZRANGEBYSCORE', SN, '-inf', now - tonumber(ARGV[17]), 'LIMIT', 0, 4)) do
  redis.call('ZREM', SN, id)
  redis.call('ZREM', SW, id)
end


local epoch, freeze = meta[3], tonumber(meta[4]) or 0
local awaited, since, counted = tonumber(meta[5]), tonumber(meta[6]) or 0, tonumber(meta[7]) or 0
local v = tonumber(meta[8]) or 0
if not epoch then
  -- New keys: a new Name, or Redis lost its data. A replica that held
  -- slots of the old data and has not synced yet would not be counted, and
  -- one that knew nothing cannot tell: no share grows for as long as it
  -- takes a live replica to sync (ARGV[14]), or until a replica that knew
  -- the old data says how many to wait for (below).
  epoch = me .. '.' .. now
  freeze, since, counted, awaited = now + tonumber(ARGV[14]), 1, 0, nil
  redis.call('HSET', SM, 'e', epoch, 'fz', freeze, 'fs', since, 'fc', 0)
  redis.call('HDEL', SM, 'fw')
end
local knew, seenN, seenV = ARGV[10], tonumber(ARGV[11]) or 0, tonumber(ARGV[12]) or 0
local lostData = knew ~= '' and knew ~= epoch
if lostData or (knew == epoch and seenV > v) then
  -- This replica saw an epoch Redis no longer has (Redis lost its data), or
  -- a later sync than Redis remembers (it lost its last writes, as a
  -- failover to a replica they had not reached does): shares may have moved
  -- to replicas that Redis no longer counts. No share grows until as many
  -- replicas as this one last saw, of those that knew the data before, have
  -- synced since, or for a lease (by then a replica that did not has
  -- stopped using its share). A replica that joins meanwhile does not
  -- count: it held nothing.
  if not lostData then
    v = math.max(v, seenV)
    since, counted = v + 1, 0
  end
  freeze = math.max(freeze, now + ttl)
  awaited = math.max(awaited or 0, seenN)
  redis.call('HSET', SM, 'fz', freeze, 'fw', awaited, 'fs', since, 'fc', counted)
end
v = v + 1
redis.call('HSET', SM, 'v', v)
if now < freeze and awaited then
  -- The first sync since the loss of a replica that knew the data before.
  if (old and old.v < since) or (not old and knew ~= '') then counted = counted + 1 end
  if counted >= awaited then
    freeze = 0
    redis.call('HDEL', SM, 'fz', 'fw', 'fs', 'fc')
  else
    redis.call('HSET', SM, 'fc', counted)
  end
end
local frozen = now < freeze

-- This replica's new demand replaces its old in the totals.
local cur = tonumber(ARGV[6])
local r = {held = cur, need = tonumber(ARGV[7]), queued = tonumber(ARGV[9]), v = v, least = tonumber(ARGV[15]) or 1,
  seq = seq, short = 0, lst = 0, bands = {}, raw = ARGV[8]}
r = parse(string.format('%d %d %d %d %d %d 0 0 %s', r.held, r.need, r.queued, r.v, r.least, r.seq, r.raw)) or r
if #r.bands > 0 then
  -- the least share that lets its largest waiting request run: its cost,
  -- at most the limit and at most its demand in its top band
  r.lst = math.max(1, math.min(r.least, limit, r.bands[1][2]))
end
replace(old, r)
local info, total = shape()
local target, turn, exact = share(r, info, total)
local myTop = top(r)
local free = limit - tot.H

-- Slots short of target, of the replicas whose top band is above this
-- one's: what is free goes to them first.
local higher = 0
local ks = redis.call('HGETALL', SK)
for i = 1, #ks, 2 do
  if tonumber(ks[i]) > myTop then higher = higher + tonumber(ks[i + 1]) end
end

-- The score that orders the turns: highest band first, then the order in
-- which the replicas began to wait.
local function turnScore()
  local j = redis.call('HINCRBY', SM, 'j', 1) % 4294967296
  return -math.max(-1048576, math.min(1048576, myTop)) * 4294967296 + j
end
-- roundsUp reports whether, holding held, this replica may round its share
-- up: its share lost a fraction to rounding down (only while the fleet's
-- demand is above the limit), and its demand wants a slot more.
local function roundsUp(held)
  return not turn and exact - target > 1e-9 and math.min(r.need, math.ceil(exact - 1e-9)) > math.max(held, target)
end
-- A replica waits in sw while it is short: of its target, or, in a band
-- that takes turns, of a turn (it leaves while it holds one, and waits
-- again, at the end, once its turn went back).
local function short(held)
  if turn then return r.need > held and held < r.lst end
  return held < target
end
local inTurns = redis.call('ZSCORE', SW, me)
if not short(cur) then
  if inTurns then redis.call('ZREM', SW, me) end
  inTurns = false
elseif inTurns == false then
  redis.call('ZADD', SW, turnScore(), me)
elseif inTurns then
  -- Its top band moved: the same place in the order of waiting, in the
  -- new band (else a replica that first reported only running requests,
  -- below every band, would wait behind every replica of a band forever).
  local j = tonumber(inTurns) % 4294967296
  local want = -math.max(-1048576, math.min(1048576, myTop)) * 4294967296 + j
  if want ~= tonumber(inTurns) then redis.call('ZADD', SW, want, me) end
end

-- This replica's share grows from what is free, after the needs of
-- replicas of a higher band: up to its target rounded up; or, while its
-- top band has fewer slots than replicas to run, by its least share when
-- its turn comes, that is when it is among the first of sw as many as
-- there are slots free.
local grant, retry = 0, 0
if not frozen and free > 0 then
  if turn and r.need > cur then
    local room = free - higher
    local rank = redis.call('ZRANK', SW, me)
    -- the slots the replicas ahead in the turns wait for (the first eight
    -- read; one each beyond)
    local ahead = 0
    if rank and rank > 0 and r.lst <= room then
      ahead = math.max(0, rank - 8)
      for _, id in ipairs(redis.call('ZRANGE', SW, 0, math.min(rank, 8) - 1)) do
        if ahead + r.lst > room then break end
        local h = parse(redis.call('HGET', S, id))
        if h then ahead = ahead + math.max(0, h.lst - h.held) end
      end
    end
    if cur < r.lst and rank and ahead + r.lst <= room then
      -- a turn is the least share: there are fewer slots than least
      -- shares, so a slot more here is a turn less for another
      grant = r.lst - cur
    elseif rank and rank > 0 and room > 0 and rank < room + 8 then
      -- Slots are free, for replicas just ahead of this one: tell those
      -- not told yet (they leave the turns if they do not claim within the
      -- claim window), and ask again after it. A replica further back
      -- waits for a notice: the turns reach it as slots are freed.
      for _, id in ipairs(redis.call('ZRANGE', SW, 0, math.min(rank, 8) - 1)) do
        if redis.call('ZADD', SN, 'NX', now, id) == 1 then notify(id) end
      end
      retry = 1
    end
  elseif not turn then
    -- Up to the target first; above it, rounded up, only from what no
    -- replica short of its target needs.
    local toTarget = math.max(0, math.min(target - cur, free - higher))
    local spare = free - toTarget - tot.K
    local up = 0
    if roundsUp(cur) then
      redis.call('ZADD', SC, target - exact, me)
      if redis.call('ZRANK', SC, me) < spare then up = 1 end
    end
    grant = toTarget + math.max(0, math.min(up, spare))
  end
end
r.held = cur + grant
tot.H = tot.H + grant
free = free - grant
-- The first replica waiting for a turn, with no slot free for it: it asks
-- again after the claim window, when the holders that took their slots
-- before the band took turns may be asked for them (below).
if turn and not frozen and grant == 0 and r.need > r.held and r.held < r.lst and free - higher < r.lst
  and redis.call('ZRANK', SW, me) == 0 then
  retry = 1
end
if r.held >= math.ceil(exact - 1e-9) or turn or total <= limit then
  redis.call('ZREM', SC, me)
elseif roundsUp(r.held) then
  -- With no slot free, the grant above did not enter it: it may round up
  -- when a holder above its own rounding gives one back.
  redis.call('ZADD', SC, target - exact, me)
end
if grant > 0 then
  -- It got slots: it waits again, if it does, at the end.
  redis.call('ZREM', SW, me)
  if short(r.held) then redis.call('ZADD', SW, turnScore(), me) end
elseif not short(r.held) then
  redis.call('ZREM', SW, me)
end
redis.call('ZREM', SN, me)
redis.call('ZREM', SV, me)

-- Shares shrink while the fleet holds more than its limit (SetLimit
-- lowered it, or a replica came back with slots counted away), while
-- replicas short of their targets are not served from what is free, and
-- while the first replica waiting for a turn finds no slot free: a turn is
-- used once, and slots held beyond a target go back.
local headNeeds, othersWait = 0, 0
for _, id in ipairs(redis.call('ZRANGE', SW, 0, 1)) do
  if id ~= me then
    othersWait = 1
    if headNeeds == 0 then
      local h = parse(redis.call('HGET', S, id))
      if h then
        local _, hturn = share(h, info, total)
        if hturn and h.held < h.lst then headNeeds = h.lst end
      end
    end
    break
  end
end
local over = tot.H > limit
if not turn then r.short = math.max(0, target - r.held) end
local shortOthers = tot.K
-- A slot held above the target, rounded up, goes to a replica whose share
-- lost more to rounding down.
local roundedOut = false
if not turn and total > limit and r.held > target and free <= 0 then
  local first = redis.call('ZRANGE', SC, 0, 0, 'WITHSCORES')
  if first[1] and first[1] ~= me then
    local mine = exact - target
    local theirs = -tonumber(first[2])
    roundedOut = theirs > mine + 1e-9 or (math.abs(theirs - mine) <= 1e-9 and first[1] < me)
  end
end
-- A slot held above the target rounded up goes to a replica that may
-- round its share up.
local aboveRound = false
if not turn and total > limit and r.held > math.ceil(exact - 1e-9) then
  local first = redis.call('ZRANGE', SC, 0, 0)
  aboveRound = first[1] ~= nil and first[1] ~= me
end
local shrink = over or (r.held > target and (shortOthers > free or headNeeds > free or roundedOut or aboveRound))
-- Slots held in a band with fewer slots than least shares are a turn,
-- from the moment they are granted: they go back after the turn's time.
local isTurn = turn and r.held > 0
if isTurn then shrink, target = true, 0 end

-- Write the record back, with its slots short of target in the totals.
tot.K = tot.K + r.short
tot.E = tot.E + excess(r)
if old and top(old) == myTop then
  bump(SK, myTop, r.short - old.short)
else
  if old then bump(SK, top(old), -old.short) end
  bump(SK, myTop, r.short)
end
local rec = string.format('%d %d %d %d %d %d %d %d %s', r.held, r.need, r.queued, v, r.least, seq, r.short, r.lst, r.raw)
redis.call('HSET', S, me, rec)
saveTotals()
redis.call('ZADD', SE, clock + ttl, me)
if r.held > 0 then
  redis.call('ZADD', SX, holderScore(r), me)
else
  redis.call('ZREM', SX, me)
end
-- Declared in GlobalQueue's keys as well, so that a replica of that mode
-- refuses to start beside this one.
redis.call('ZADD', GR, now + ttl, me)
if not old then redis.call('HSET', GD, me, 'Shares MaxConcurrent=' .. declared) end

-- Notices. Slots freed now go to the first replicas that wait.
local lowered = 0
if old then lowered = math.max(0, old.held - r.held) end
if not frozen and free > 0 then
  -- Free slots that no replica told is coming for (freed now, or one
  -- told did not claim, or left the turns): the next in turn are told.
  tellWaiting(free)
  if freed + lowered > 0 then tellHolders(math.min(free, freed + lowered)) end
end
-- Slots this replica needs and cannot take from what is free: the first
-- holders that hold more than their targets give back (those of the lowest
-- band first, then those with the most slots for their demand), and so do
-- holders while the fleet holds more than its limit.
local want = 0
if over then want = tot.H - limit end
if not frozen and r.short > free - higher then want = math.max(want, r.short - math.max(free - higher, 0)) end
if not frozen and turn and r.held < r.lst and r.need > r.held and free < r.lst then want = math.max(want, r.lst) end
-- Slots held beyond a demand (a replica that went idle before anyone
-- waited keeps its slots as room for arrivals, and reports nothing more)
-- while replicas wait and none is free: ask the first such holder not
-- asked already and silent for a quarter of the claim window (one that
-- synced since gives its slots back as its requests end), whoever syncs.
if not frozen and tot.E > 0 and free - higher <= 0 and redis.call('ZCARD', SW) > 0 then
  local quiet = clock + ttl - tonumber(ARGV[17]) / 4
  for _, id in ipairs(redis.call('ZRANGE', SX, 0, 15)) do
    if id ~= me and not redis.call('ZSCORE', SV, id) and tonumber(redis.call('ZSCORE', SE, id) or 0) < quiet then
      local h = parse(redis.call('HGET', S, id))
      if h and h.held > h.need then
        redis.call('ZADD', SV, now, id)
        notify(id)
        break
      end
    end
  end
end
-- Holders asked before and not synced since (sv) are passed over: they
-- give back to the replicas that asked first. A holder that cannot be
-- asked is passed over by its score in sx, without reading its record: one
-- of a band above this one's while the fleet is within its limit, and,
-- while this band takes turns, one with a single band at or below it (its
-- band takes turns too, or has no slot: what it holds is a turn), unless
-- it held its slots past a turn (below).
-- pastTurn reports whether a holder of a band that takes turns has not
-- synced for a claim window: its slots are no turn that goes back by
-- itself, but a share granted before its band took turns, which it would
-- keep until its renewal, seconds away in a large fleet.
local function pastTurn(id)
  return tonumber(redis.call('ZSCORE', SE, id) or clock + ttl) - ttl < clock - tonumber(ARGV[17])
end
local function mayAsk(id, score)
  local band, single = holderOf(score)
  if not over and band > myTop then return false end
  return not (turn and single and band <= myTop) or pastTurn(id)
end
if want > 0 then
  local xs = redis.call('ZRANGE', SX, 0, math.min(want, 8) + 7, 'WITHSCORES')
  for i = 1, #xs, 2 do
    local id = xs[i]
    if want <= 0 then break end
    if id ~= me and mayAsk(id, tonumber(xs[i + 1])) and not redis.call('ZSCORE', SV, id) then
      local h = parse(redis.call('HGET', S, id))
      if h then
        local ht, hturn = share(h, info, total)
        -- a turn goes back once used, without a notice
        if (not hturn or pastTurn(id)) and h.held > ht and (over or low(h) <= myTop) then
          redis.call('ZADD', SV, now, id)
          notify(id)
          want = want - (h.held - ht)
        end
      end
    end
  end
end

renewAll()
local left_ms = 0
if frozen then left_ms = freeze - now end
local anyWait = 0
if headNeeds > 0 or shortOthers > 0 then anyWait = 1 end
local turnFlag = 0
if isTurn then turnFlag = 1 end
local again = 0
if retry == 1 then again = tonumber(ARGV[17]) end
-- The replicas a loss found now would wait for: those with a record, and
-- those a freeze still waits for (they may hold slots of older data).
local seen = math.max(tot.R, 0)
if frozen and awaited then seen = seen + math.max(0, awaited - counted) end
-- Free slots are news to this replica only if its demand is met: else
-- it took what it may, and a notice comes when that changes.
local freeForMe = math.max(free, 0)
if r.need > r.held then freeForMe = 0 end
return {r.held, target, shrink and 1 or 0, limit, epoch, left_ms, seen, freeForMe, anyWait, v, over and 1 or 0, turnFlag, again,
  floorOf(r, info, total)}
`
