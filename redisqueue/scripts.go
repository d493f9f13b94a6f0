package redisqueue

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

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
//	            failover) is not taken for replicas that died. rc: while
//	            set and not passed, grants are held back until every
//	            replica in u has synced.
//	u    SET    the FailOpen replicas live when a replica came back from an
//	            outage or a gap was seen: each may have been cut off too and
//	            admitted requests on its own, which Redis does not count
//	            until it syncs with a full list. KEYS[11]. In l, uw: how many
//	            replicas Redis lost with its data are still awaited.
//	f    SET    the replicas that may admit on their own (FailOpen).
//	            KEYS[12].
//
// Every key gets a TTL of 10 lease TTLs where it is created and at every
// sync and bye, so that nothing outlives the last replica of a Name.
//
// The slots held are len(h) + x. Invariants, kept by every script: a lease
// id is in at most one of h and w; w and q agree (a member of q whose w
// entry is gone is stale and is skipped); x and hw match the costs in l;
// the slots held are at most the limit unless l has o. The limit is read
// inside each script, at most once, so every replica sees a change at once
// and no two scripts disagree. Time is redis.call('TIME'), read at most
// once per script and only when needed; since Redis 5 scripts replicate
// their effects, so that is deterministic on replicas.
//
// Every script gets the same KEYS, in the order of the constants below
// (KEYS[1] is h, ..., KEYS[12] is f; script_prelude.go names them H ... F),
// built once by New; Backend.keys holds them at these indices.
const (
	keyH   = iota // h: the holders
	keyQ          // q: the waiters in order
	keyW          // w: lease id → member of q
	keyWE         // we: when each place runs out
	keySeq        // seq: the arrival counter
	keyR          // r: the live replicas
	keyD          // d: the limits each replica declared
	keyEV         // ev: the evicted waiters
	keyG          // g:R of the calling replica: its notices
	keyL          // l: the limit, the costs, the recovery
	keyU          // u: the replicas a recovery waits for
	keyF          // f: the FailOpen replicas
	numKeys
)

// Head of the line: a head waiter whose slots (its cost, clamped to the
// limit) are not all free blocks the waiters behind it: nobody behind it is granted, and
// an arrival takes free slots without queueing only if it is of a higher
// priority than the head. While nobody has a cost (x and hw are zero), the
// scripts make the same Redis calls as they would without costs.

// script is a Lua script and its SHA1. Backend.call runs it with EVALSHA
// and, if Redis does not know it yet (NOSCRIPT), with EVAL.
type script struct{ src, sha string }

func newScript(src string) *script {
	h := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(h[:])}
}

// call runs one script, bounded by CallTimeout and not by the request: a
// request that leaves mid-call learns the outcome and undoes it. The command
// is built as one slice (no per-key conversions, as Script.Run would do).
func (b *Backend) call(s *script, args ...any) (any, error) {
	return b.callIn(context.Background(), s, args...)
}

// callIn is call within parent: a call that parent ended is not a failure
// of Redis.
func (b *Backend) callIn(parent context.Context, s *script, args ...any) (any, error) {
	return b.callFor(parent, b.opts.CallTimeout, s, args...)
}

// callWithin is call bounded by wait instead of CallTimeout.
func (b *Backend) callWithin(wait time.Duration, s *script, args ...any) (any, error) {
	return b.callFor(context.Background(), wait, s, args...)
}

// callFor is callIn bounded by wait.
func (b *Backend) callFor(parent context.Context, wait time.Duration, s *script, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(parent, wait)
	defer cancel()
	start := time.Now()
	res, err := evalScript(ctx, b.rdb, s, b.keyArgs, b.base, args)
	switch {
	case err == nil:
		b.lastOK.Store(time.Now().UnixNano())
		b.fails.Store(0)
	case errors.Is(err, redis.ErrClosed):
		b.clientClosed.Store(true)
		b.failed(err, start)
	case parent.Err() == nil:
		b.failed(err, start)
	}
	return res, err
}

// evalScript runs s with EVALSHA, and with EVAL if Redis does not know it
// yet (NOSCRIPT). keys holds the key count and the keys; base and args the
// arguments.
func evalScript(ctx context.Context, rdb redis.UniversalClient, s *script, keys, base, args []any) (any, error) {
	argv := make([]any, 0, 2+len(keys)+len(base)+len(args))
	argv = append(argv, "evalsha", s.sha)
	argv = append(append(append(argv, keys...), base...), args...)
	res, err := rdb.Do(ctx, argv...).Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		argv[0], argv[1] = "eval", s.src
		res, err = rdb.Do(ctx, argv...).Result()
	}
	return res, err
}

// probeScript does nothing: an answer says the master of the Name's slot
// answers.
var probeScript = newScript(`return 1`)
