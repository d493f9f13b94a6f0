package redisqueue

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/redis/go-redis/v9"
)

// Stats implements backend.Backend with this replica's view, from memory:
// Running counts the slots held by this replica's requests, Queued its
// waiting requests, and Unavailable and Outages whether it has Redis marked
// down and how many times it did. GlobalStats asks Redis for the fleet's
// figures, its limit included.
//
// In Shares mode Stats is the in-memory backend's, and Limit is this
// replica's share of the limit, not the fleet's limit; Queued counts the
// requests that wait for a share made for their priority band too.
//
// In GlobalQueue mode Running includes the FailOpen fallback's slots, and
// Limit is the fleet's limit as last seen: MaxConcurrent until SetLimit
// moves it, then the value of the last acquire, sync or SetLimit reply from
// Redis (a change made on another replica shows here at this replica's
// next acquire or sync, within an Options.GlobalQueue.TickInterval).
func (b *Backend) Stats() backend.Stats {
	if b.sh != nil {
		return b.sh.stats()
	}
	now := time.Now()
	released := b.released.Load() // before servedSlots: never more than it
	byPrio := map[int]int{}
	var oldest time.Time
	b.mu.Lock()
	s := backend.Stats{
		Running: b.slots + b.localSlots,
		Queued:  len(b.waiters),
		Limit:   int(b.limit.Load()),
		Served:  b.served.Load(),
	}
	for _, w := range b.waiters {
		byPrio[w.prio]++
		if oldest.IsZero() || w.since.Before(oldest) {
			oldest = w.since
		}
	}
	fb := b.fb
	b.mu.Unlock()
	s.Unavailable = b.down.Load()
	s.Outages = b.outages.Load()
	if !oldest.IsZero() {
		s.OldestWait = now.Sub(oldest)
	}
	if fb != nil {
		ls := fb.Stats()
		s.Queued += ls.Queued
		s.OldestWait = max(s.OldestWait, ls.OldestWait)
		for _, p := range ls.QueuedByPriority {
			byPrio[p.Priority] += p.Queued
		}
	}
	// A grant counts as served once Acquire returns it: until then its slots
	// are held but not yet served, and Running must never exceed the slots
	// of the requests in Served.
	servedSlots := b.servedSlots.Load()
	s.Running = min(s.Running, int(servedSlots-min(servedSlots, released)))
	if s.Queued > 0 {
		s.QueuedByPriority = make([]backend.PriorityCount, 0, len(byPrio))
		for p, n := range byPrio {
			s.QueuedByPriority = append(s.QueuedByPriority, backend.PriorityCount{Priority: p, Queued: n})
		}
		slices.SortFunc(s.QueuedByPriority, func(a, b backend.PriorityCount) int { return cmp.Compare(b.Priority, a.Priority) })
	}
	return s
}

// GlobalStats is the fleet's view of one Name, as Redis holds it. Of the
// Backend's figures it fills Running (the slots every replica holds),
// Queued (the waiters of every replica) and Limit (the fleet's limit: what
// SetLimit set, else the declared MaxConcurrent); the others are zero.
type GlobalStats struct {
	backend.Stats
	// Replicas is the replicas whose lease is live; a dead one lingers
	// until its lease runs out.
	Replicas int
}

// GlobalStats asks Redis for the fleet's figures of the Name: the slots
// held, the waiters, the live replicas and the limit. It returns the Redis
// error, if any; it is safe for concurrent use.
//
// In Shares mode Running is the slots the replicas hold (each its share, or
// what it runs if more; an idle replica's share counts), not the requests
// running, and Queued their waiters as of their last syncs;
// each call is bounded by CallTimeout (a Name split into parts takes one
// call per part, and one more). In GlobalQueue mode Running is the slots
// granted, leases that expired but were not yet swept included, and only
// ctx bounds the call.
func (b *Backend) GlobalStats(ctx context.Context) (GlobalStats, error) {
	if b.sh != nil {
		return b.sh.globalStats(ctx)
	}
	var h, q, r *redis.IntCmd
	var l *redis.SliceCmd
	_, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		h = p.ZCard(ctx, b.keys[keyH])
		q = p.ZCard(ctx, b.keys[keyQ])
		r = p.ZCard(ctx, b.keys[keyR])
		l = p.HMGet(ctx, b.keys[keyL], "n", "x")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return GlobalStats{}, err
	}
	// The slots held are the holders plus the slots beyond one of those
	// with a cost (see scripts.go).
	limit, extra := b.limits.MaxConcurrent, 0
	if v := l.Val(); len(v) == 2 {
		if s, ok := v[0].(string); ok {
			if n, err := strconv.Atoi(s); err == nil {
				limit = n
			}
		}
		if s, ok := v[1].(string); ok {
			extra, _ = strconv.Atoi(s)
		}
	}
	return GlobalStats{Stats: backend.Stats{Running: int(h.Val()) + extra, Queued: int(q.Val()), Limit: limit}, Replicas: int(r.Val())}, nil
}
