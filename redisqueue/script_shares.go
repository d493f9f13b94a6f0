package redisqueue

// The Redis data of one Name in Shares mode (see shares.go), beside the
// GlobalQueue keys of scripts.go under the same hash tag. A sync reads and
// writes only its own record and running totals, so that it costs the same
// at 4 replicas as at a thousand:
//
//	s     HASH   replica id → "held need queued v least seq short lst bands":
//	             the slots Redis counts as the replica's (never below what
//	             it runs or may run before its next sync), its demand (its
//	             running slots and waiters, at their peak since its
//	             previous sync), its waiters now, the v of its last sync,
//	             the largest cost among its waiters, the number of its last
//	             sync applied, the slots it was short of its target then,
//	             the least share it counts in its top band (below), and its
//	             demand by priority band, "band:slots,..." from the highest
//	             band ("-" for none)
//	se    ZSET   replica id → when its lease runs out, on the lease clock:
//	             Redis's clock (ms) less sm's o
//	sm    HASH   n: the fleet's limit set by SetLimit (absent: the declared
//	             MaxConcurrent); d: the MaxConcurrent the live replicas
//	             declared; e: the epoch, made when the keys are created, so
//	             that a replica can tell Redis lost its data; v: the syncs of
//	             the epoch, so that a replica can tell Redis lost its last
//	             writes; fz: until when no share grows (ms), after a loss,
//	             unless fw replicas that knew the data before synced since v
//	             was fs (fc counts them); b: the last sync's time; o: the
//	             lease clock's offset; H, Q, R, K, E: the totals of held,
//	             queued, records, short and held beyond the demand over the
//	             records; j: the count that orders sw
//	sb    HASH   band → the demand of every replica in that band (slots)
//	sl    HASH   band → the least shares of the replicas whose top band it is
//	sk    HASH   band → the slots short of target of those replicas
//	sw    ZSET   the replicas whose demand is not met: highest band first,
//	             then in the order they began to wait (the turns)
//	sx    ZSET   the replicas that hold slots: lowest band first, then the
//	             most slots for their demand (who gives back first;
//	             holderScore)
//	sn    ZSET   replica id → when it was notified slots are free for it: one
//	             that does not sync within the claim window is dead or
//	             stuck, and leaves sw
//	sc    ZSET   replica id → minus the fraction its share lost to rounding
//	             down, for those that want a slot more: the largest
//	             fractions round up first, then by replica id
//	sv    ZSET   replica id → when it was asked to give slots back, until
//	             it syncs: the next replica that asks asks another
//	sg:R  LIST   "s" notices for replica R: sync now
//
// Each replica also enters itself in GlobalQueue's r and d (with the lease
// as its heartbeat and "Shares MaxConcurrent=n" as its limits), so that the
// two modes never run under one Name: either refuses to start beside the
// other (ErrConflict).
//
// Every key expires ten leases after the Name's last call: every call that
// writes renews every key's expiry.
//
// The slots held across the fleet are H, the sum of s's held. A replica
// raises the limit it admits within only to the held value a reply gave it,
// and reports, before each call, at least what it runs and may run until it
// hears again; Redis lowers a held value only on that replica's report, or
// when its lease ran out. So the slots running across the fleet are never
// above H, and a share grows only from what is free: H stays at most the
// limit, except where SetLimit lowered it below what was held, or a replica
// came back from an outage with slots Redis had counted away; no share
// grows until H is back under the limit.

// Shares-mode keys, in the order of the scripts' KEYS.
const (
	skS  = iota // s: the records
	skSE        // se: the leases
	skSM        // sm: the limit, the epoch, the totals
	skR         // r: GlobalQueue's live replicas, to refuse mixing modes
	skD         // d: GlobalQueue's declarations, likewise
	skG         // sg:R of the calling replica
	skSB        // sb: demand by band
	skSL        // sl: least shares by band
	skSK        // sk: slots short of target by band
	skSW        // sw: the replicas whose demand is not met, in turn order
	skSX        // sx: the holders, who gives back first
	skSN        // sn: the replicas notified that slots are free for them
	skSC        // sc: the replicas that may round their share up
	skSV        // sv: the holders asked to give slots back
	numShareKeys
)

// shareKeyNames are the keys' names after the Name's prefix.
func shareKeyNames(replica string) [numShareKeys]string {
	return [numShareKeys]string{skS: "s", skSE: "se", skSM: "sm", skR: "r", skD: "d", skG: "sg:" + replica,
		skSB: "sb", skSL: "sl", skSK: "sk", skSW: "sw", skSX: "sx", skSN: "sn", skSC: "sc", skSV: "sv"}
}

// noBand is the band of running slots whose replica never had a waiter:
// below every priority a replica reports (priorities are clamped to
// ±maxBand).
const (
	maxBand = 1_000_000
	noBand  = -maxBand - 1
)

// sharesScript is every Shares-mode operation, by ARGV[5]:
//
//	sync  ARGV[6..17] = held now, need, demand by band ("band:slots,..."
//	      from the highest, "-" for none), queued, the epoch this replica
//	      knows ("" none), the replicas and the v of its last reply, the
//	      gap (ms) that moves leases on, the freeze (ms) of new keys, the
//	      largest cost waiting (1 without costs), the number of this sync
//	      (each of a replica's syncs has a higher one), the claim window
//	      (ms). Reply {held, target, shrink, limit, epoch, freeze left ms,
//	      replicas, free, 1 if another replica's demand is not met, v, 1 if
//	      the fleet holds more than its limit, 1 if held is a turn to give
//	      back once used, ms after which to ask again for a turn (0: wait
//	      for a notice), the lowest priority band the share serves (noBand:
//	      every band)}, or {"conflict", why}, or {"stale"} for a sync
//	      that arrived after a later one of the same replica (nothing is
//	      changed).
//	limit ARGV[6] = the new limit. Reply: the limit.
//	part  ARGV[6..7] = a rebalancer's generation, the new limit (-1:
//	      none). Reply {generation, limit, held in all, replicas, 1 if
//	      no replica synced since the keys were made or the part is
//	      frozen after a loss of its data, then band, demand, ... }, or
//	      {-1, the later generation seen}.
//	bye   the replica leaves: its share goes back at once. Reply: 1.
//	stats Reply {held in all, queued in all, replicas, limit}.
//
// ARGV[1..4] (every call): the declared MaxConcurrent, the lease TTL (ms),
// the prefix of the notice lists, this replica's id.
var sharesScript = newScript(`
local S, SE, SM, GR, GD, MINE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local SB, SL, SK, SW, SX, SN, SC, SV = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local declared, ttl, lists, me, op = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = 10 * ttl
local NONE = ` + noBandLua + `

local function notify(id)
  local k = lists .. id
  if redis.call('LLEN', k) == 0 then
    redis.call('RPUSH', k, 's')
    redis.call('PEXPIRE', k, keep)
  end
end

local meta = redis.call('HMGET', SM, 'n', 'd', 'e', 'fz', 'fw', 'fs', 'fc', 'v', 'b', 'o', 'H', 'Q', 'R', 'K', 'j', 'E')
local limit = tonumber(meta[1]) or tonumber(declared)
local off = tonumber(meta[10]) or 0
local tot = {H = tonumber(meta[11]) or 0, Q = tonumber(meta[12]) or 0, R = tonumber(meta[13]) or 0, K = tonumber(meta[14]) or 0,
  E = tonumber(meta[16]) or 0}
-- excess is what r holds beyond its demand.
local function excess(r) return math.max(0, r.held - r.need) end

-- A record, parsed; nil if absent.
local function parse(s)
  if not s then return nil end
  local h, n, q, v, w, sq, df, ls, bs = string.match(s, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%S+)$')
  if not h then return nil end
  local r = {held = tonumber(h), need = tonumber(n), queued = tonumber(q), v = tonumber(v), least = tonumber(w),
    seq = tonumber(sq), short = tonumber(df), lst = tonumber(ls), bands = {}, raw = bs}
  if bs ~= '-' then
    for b, d in string.gmatch(bs, '(%-?%d+):(%d+)') do r.bands[#r.bands + 1] = {tonumber(b), tonumber(d)} end
  end
  return r
end
local function top(r) if #r.bands > 0 then return r.bands[1][1] end return NONE end
local function low(r) if #r.bands > 0 then return r.bands[#r.bands][1] end return NONE end

-- holderScore is r's score in sx: 8 a band, less its slots for its demand
-- (at most 4, rounded up to a 1,024th), plus a 4,096th when all its demand
-- is in one band: the order of the bands and the slots for the demand,
-- with whether it has one band in its last bits. holderOf reads back the
-- lowest band and that.
local function holderScore(r)
  local q = math.ceil(math.min(r.held / math.max(r.need, 1), 4) * 1024) / 1024
  local one = 0
  if #r.bands == 1 and r.bands[1][2] > 0 then one = 1 / 4096 end
  return low(r) * 8 - q + one
end
local function holderOf(score)
  local band = math.ceil(score / 8)
  local m = math.floor((band * 8 - score) * 4096 + 0.5)
  return band, m % 4 ~= 0
end

-- renewAll gives every key its expiry again, last in every call that
-- writes: sm's alone, kept by calls without syncs, would keep the totals of
-- records that expired, which no sweep could take out.
local function renewAll()
  for _, k in ipairs({S, SE, SM, GR, GD, SB, SL, SK, SW, SX, SN, SC, SV}) do redis.call('PEXPIRE', k, keep) end
end

local function bump(key, field, d)
  if d ~= 0 and redis.call('HINCRBY', key, field, d) <= 0 then redis.call('HDEL', key, field) end
end
-- count adds r to the totals (sign 1) or takes it out (sign -1).
local function count(r, sign)
  tot.H, tot.Q, tot.R, tot.K = tot.H + sign * r.held, tot.Q + sign * r.queued, tot.R + sign, tot.K + sign * r.short
  tot.E = tot.E + sign * excess(r)
  for _, bd in ipairs(r.bands) do bump(SB, bd[1], sign * bd[2]) end
  bump(SL, top(r), sign * r.lst)
  bump(SK, top(r), sign * r.short)
end
local function saveTotals()
  redis.call('HSET', SM, 'H', math.max(tot.H, 0), 'Q', math.max(tot.Q, 0), 'R', math.max(tot.R, 0), 'K', math.max(tot.K, 0),
    'E', math.max(tot.E, 0))
end

-- replace swaps o's part of the totals (nil: none) for n's, writing only
-- what changed; the slots short of target (sk) are written with the record.
local function replace(o, n)
  if o then
    tot.H, tot.Q, tot.R, tot.K = tot.H - o.held, tot.Q - o.queued, tot.R - 1, tot.K - o.short
    tot.E = tot.E - excess(o)
  end
  tot.H, tot.Q, tot.R = tot.H + n.held, tot.Q + n.queued, tot.R + 1
  local d, l = {}, {}
  if o then
    for _, bd in ipairs(o.bands) do d[bd[1]] = (d[bd[1]] or 0) - bd[2] end
    l[top(o)] = -o.lst
  end
  for _, bd in ipairs(n.bands) do d[bd[1]] = (d[bd[1]] or 0) + bd[2] end
  l[top(n)] = (l[top(n)] or 0) + n.lst
  for b, x in pairs(d) do bump(SB, b, x) end
  for b, x in pairs(l) do bump(SL, b, x) end
end

-- forget takes a replica out; it returns the slots it held.
local function forget(id)
  local r = parse(redis.call('HGET', S, id))
  local h = 0
  if r then count(r, -1); h = r.held end
  redis.call('HDEL', S, id)
  for _, k in ipairs({SE, SW, SX, SN, SC, SV, GR}) do redis.call('ZREM', k, id) end
  redis.call('DEL', lists .. id)
  redis.call('HDEL', GD, id)
  return h
end

-- tellWaiting tells the first replicas of sw (not me) that n slots are
-- free: as many as those slots serve, in turn order, after those told
-- before and not synced since (they are coming for theirs, a slot each at
-- least). Those are mostly the first of sw: past the first eight (where
-- replicas of a higher band that began to wait since come), those told are
-- looked for a little before their count, up to 64 a call, so that a
-- thousand slots freed at once reach a thousand waiting replicas in a few
-- calls, not 64 at a time. A head that does not claim within the claim
-- window leaves sw, and a later sync tells the next one in its place.
local function tellWaiting(n)
  if n <= 0 then return end
  local pending = redis.call('ZCARD', SN)
  local left = n - pending
  if left <= 0 then return end
  local cum, read = 0, 0
  -- tell tells id if it was not told; false once the slots are spent
  local function tell(id)
    if id == me or redis.call('ZSCORE', SN, id) then return true end
    -- what it waits for: its least share, read for the first eight
    local want = 1
    if read < 8 then
      read = read + 1
      local h = parse(redis.call('HGET', S, id))
      if h then want = math.max(1, h.lst - h.held) end
    end
    if cum + want > left then return false end
    cum = cum + want
    redis.call('ZADD', SN, now, id)
    notify(id)
    return true
  end
  local from = math.max(0, pending - 8)
  local head = math.min(from, 8)
  if head > 0 then
    for _, id in ipairs(redis.call('ZRANGE', SW, 0, head - 1)) do
      if not tell(id) then return end
    end
  end
  from = math.max(from, head)
  for _, id in ipairs(redis.call('ZRANGE', SW, from, from + math.min(left + 8, 64) - 1)) do
    if not tell(id) then return end
  end
end

-- tellHolders tells that n slots were freed, beside the replicas of sw:
-- with fewer waiting, the first holders (an idle share grows as room for
-- arrivals), and the first that may round its share up.
local function tellHolders(n)
  if n <= 0 then return end
  for _, id in ipairs(redis.call('ZRANGE', SC, 0, 0)) do
    if id ~= me then notify(id) end
  end
  if redis.call('ZCARD', SW) < n then
    for _, id in ipairs(redis.call('ZRANGE', SX, 0, math.min(n, 8))) do
      if id ~= me then notify(id) end
    end
  end
end

-- tellFreed tells that n slots were freed: the replicas of sw they serve,
-- and the holders above.
local function tellFreed(n)
  tellWaiting(n)
  tellHolders(n)
end

-- shape reads the totals by band: for each band, from the highest, the
-- slots left for it by the bands above (avail), its demand (D), the least
-- shares of the replicas whose top band it is (L), and the share of its
-- demand it gets (ratio); and the demand in all.
local function shape()
  local raw, bs = redis.call('HGETALL', SB), {}
  for i = 1, #raw, 2 do bs[#bs + 1] = {tonumber(raw[i]), tonumber(raw[i + 1])} end
  table.sort(bs, function(a, b) return a[1] > b[1] end)
  local ls, L = redis.call('HGETALL', SL), {}
  for i = 1, #ls, 2 do L[tonumber(ls[i])] = tonumber(ls[i + 1]) end
  local info, cum = {}, 0
  for _, bd in ipairs(bs) do
    local avail = math.max(0, limit - cum)
    local ratio = 1
    if bd[2] > avail then ratio = avail / bd[2] end
    info[bd[1]] = {avail = avail, D = bd[2], L = L[bd[1]] or 0, ratio = ratio}
    cum = cum + bd[2]
  end
  return info, cum
end

-- share is r's target: its demand, with what no demand takes split evenly
-- as room for arrivals, while the fleet's demand fits the limit; else the
-- slots of each of its bands in proportion to its demand there, after a
-- least share (the slots its largest waiting request needs) in its top
-- band. It reports whether that top band has fewer slots than least shares
-- (its replicas take turns), and the share before rounding.
local function share(r, info, total)
  if total <= limit then
    local f = r.need + math.floor((limit - total) / math.max(tot.R, 1))
    return f, false, f
  end
  local f, turn = 0, false
  for k, bd in ipairs(r.bands) do
    local x = info[bd[1]]
    if not x or x.ratio >= 1 then
      f = f + bd[2]
    elseif k == 1 then
      if x.avail >= x.L and x.D > x.L then
        f = f + r.lst + (x.avail - x.L) * (bd[2] - r.lst) / (x.D - x.L)
      else
        turn = true
      end
    else
      f = f + bd[2] * x.ratio
    end
  end
  return math.floor(f + 1e-9), turn, f
end

-- floorOf is the lowest band of r that its share serves, while the fleet's
-- demand is above the limit: its top band, and each band below whose part
-- of the share is a slot or more. Requests of the bands below wait for it
-- to fall, so that a slot made for a higher band here does not go to a
-- lower one while higher ones wait elsewhere. NONE while all fits.
local function floorOf(r, info, total)
  if total <= limit or #r.bands == 0 then return NONE end
  local fl = r.bands[1][1]
  for k = 2, #r.bands do
    local x = info[r.bands[k][1]]
    if x and r.bands[k][2] * x.ratio < 1 - 1e-9 then break end
    fl = r.bands[k][1]
  end
  if fl == low(r) then return NONE end
  return fl
end

if op == 'stats' then
  return {math.max(tot.H, 0), math.max(tot.Q, 0), math.max(tot.R, 0), limit}
end

if op == 'bye' then
  local h = forget(me)
  redis.call('DEL', MINE)
  saveTotals()
  if h > 0 then tellFreed(limit - tot.H) end
  renewAll()
  return 1
end

if op == 'limit' then
  local n = tonumber(ARGV[6])
  redis.call('HSET', SM, 'n', n)
  -- Rare: every holder checks its share now (they are at most n of the
  -- old limit), and the first to wait if slots are free.
  for _, id in ipairs(redis.call('ZRANGE', SX, 0, -1)) do
    if id ~= me then notify(id) end
  end
  tellFreed(n - tot.H)
  renewAll()
  return n
end

if op == 'part' then
  -- A rebalancer of a Name split into parts (split.go): ARGV[6] its
  -- generation, ARGV[7] this part's new limit (-1: none). A generation
  -- below the last one seen here is refused, so that a rebalancer that
  -- stalled cannot undo a later one's work.
  local g, n = tonumber(ARGV[6]), tonumber(ARGV[7])
  local seen = tonumber(redis.call('HGET', SM, 'g')) or 0
  if g < seen then return {-1, seen} end
  -- Unsure: no replica synced since the keys were made (new, or Redis lost
  -- them), or the part is frozen after a loss: what it holds may be
  -- undercounted.
  local unsure = 0
  if not meta[3] or (tonumber(meta[4]) or 0) > now then unsure = 1 end
  redis.call('HSET', SM, 'g', g)
  if n >= 0 then redis.call('HSET', SM, 'n', n) end
  if n >= 0 and n ~= limit then
    if n < tot.H then
      -- the first holders to give back learn it now, the rest at their
      -- next sync
      for _, id in ipairs(redis.call('ZRANGE', SX, 0, math.min(tot.H - n, 64) - 1)) do notify(id) end
    end
    limit = n
    tellFreed(n - tot.H)
  end
  renewAll()
  local out = {g, limit, math.max(tot.H, 0), math.max(tot.R, 0), unsure}
  for _, x in ipairs(redis.call('HGETALL', SB)) do out[#out + 1] = tonumber(x) end
  return out
end

` + sharesSyncLua)

// noBandLua is noBand as the script spells it.
const noBandLua = "-1000001"
