package redisqueue

// The Redis data of a Name split into parts (Options.Shares.Parts), beside each
// part's Shares keys, which carry the hash tag {Name:p} for part p (':'
// cannot appear in a Name, so no Name's keys are a part's). The Name's own
// keys, under {Name}:
//
//	pl    HASH   n: the limit set by SetLimit (absent: d); d: the
//	             MaxConcurrent the replicas declared; dt: when a live
//	             replica last declared it (ms); p: the number of parts;
//	             t: when the last rebalance began (ms); g: its generation;
//	             l<p>: the last limit part p was known for sure to have,
//	             its bound while Redis lost the part's data; nr: the
//	             replicas in all parts, as the last rebalance counted them
//	r, d         GlobalQueue's live replicas and their declarations: the
//	             split fleet enters itself as one replica, so that a
//	             GlobalQueue replica refuses to start beside it
//
// Each part's sm holds the limit the rebalancer gave it (n, absent: none)
// and the generation of the last rebalancer that wrote it (g).

// Split keys, in the order of the script's KEYS.
const (
	pkL = iota // pl
	pkR        // r
	pkD        // d
	numSplitKeys
)

// splitScript is every operation on a split Name's own keys, by ARGV[1]:
//
//	join  ARGV[2..5] = the declared MaxConcurrent, the parts, the time (ms)
//	      after which a declaration no live replica renewed lapses, how long
//	      the fleet's entry in r lasts (ms). Reply {1, the Name's replicas
//	      as last counted}, or {"conflict", why}.
//	turn  ARGV[2..5] = the declared MaxConcurrent, the parts, the shortest
//	      time between two rebalances (ms), how long the fleet's entry in r
//	      lasts (ms). Reply {generation, the Name's replicas as last
//	      counted, limit, then each part's bound known for sure} when this
//	      caller rebalances now, {0, replicas} when another did lately.
//	wrote ARGV[2] = the Name's replicas, ARGV[3..] = each part's bound
//	      known for sure now, -1 for one whose last stays. Reply: 1.
//	limit ARGV[2] = the new limit. Reply: the limit.
//	gen   ARGV[2] = a generation a part has seen: later ones start above
//	      it. Reply: 1.
//	total Reply: the limit.
var splitScript = newScript(`
local L, GR, GD = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local m = redis.call('HMGET', L, 'n', 'd', 'dt', 'p', 't', 'g')
local keep = 24 * 3600 * 1000

-- enter puts the split fleet in GlobalQueue's keys as one live replica.
local function enter(decl, parts, entry)
  redis.call('ZADD', GR, now + entry, 'split')
  redis.call('PEXPIRE', GR, keep)
  redis.call('HSET', GD, 'split', 'Shares Parts=' .. parts .. ' MaxConcurrent=' .. decl)
  redis.call('PEXPIRE', GD, keep)
end

if op == 'join' then
  local decl, parts, lapse = ARGV[2], ARGV[3], tonumber(ARGV[4])
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', GR, '(' .. now, '+inf')) do
    if r ~= 'split' then
      local d = redis.call('HGET', GD, r) or 'GlobalQueue'
      return {'conflict', 'replica ' .. r .. ' of this Name runs without Parts (' .. d .. ')'}
    end
  end
  local live = m[3] and now - tonumber(m[3]) < lapse
  if live and m[4] and m[4] ~= parts then
    return {'conflict', 'live replicas split this Name into ' .. m[4] .. ' parts, this one into ' .. parts}
  end
  if live and m[2] and m[2] ~= decl then
    return {'conflict', 'live replicas declared MaxConcurrent=' .. m[2] .. ', this one ' .. decl}
  end
  if not live and m[2] and m[2] ~= decl then
    -- nobody of the old declaration is live: the limit set for it goes too
    redis.call('HDEL', L, 'n')
  end
  redis.call('HSET', L, 'd', decl, 'dt', now, 'p', parts)
  redis.call('PEXPIRE', L, keep)
  enter(decl, parts, tonumber(ARGV[5]))
  return {1, tonumber(redis.call('HGET', L, 'nr')) or 0}
end

if op == 'turn' then
  local decl, parts, every, entry = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  redis.call('HSET', L, 'dt', now)
  enter(decl, parts, entry)
  local nr = tonumber(redis.call('HGET', L, 'nr')) or 0
  if m[5] and now - tonumber(m[5]) < every then return {0, nr} end
  -- A generation above every earlier one, and above the time: a Redis that
  -- lost these keys still starts above what the parts saw.
  local g = math.max((tonumber(m[6]) or 0) + 1, now)
  redis.call('HSET', L, 't', now, 'g', g)
  redis.call('PEXPIRE', L, keep)
  local out = {g, nr, tonumber(m[1]) or tonumber(m[2]) or tonumber(decl)}
  for p = 0, tonumber(parts) - 1 do out[#out + 1] = tonumber(redis.call('HGET', L, 'l' .. p)) or 0 end
  return out
end

if op == 'wrote' then
  redis.call('HSET', L, 'nr', ARGV[2])
  for i = 3, #ARGV do
    if tonumber(ARGV[i]) >= 0 then redis.call('HSET', L, 'l' .. (i - 3), ARGV[i]) end
  end
  return 1
end

if op == 'limit' then
  redis.call('HSET', L, 'n', ARGV[2])
  redis.call('HDEL', L, 't')
  redis.call('PEXPIRE', L, keep)
  return tonumber(ARGV[2])
end

if op == 'gen' then
  if tonumber(ARGV[2]) > (tonumber(m[6]) or 0) then redis.call('HSET', L, 'g', ARGV[2]) end
  return 1
end

return tonumber(m[1]) or tonumber(m[2]) or 0
`)
