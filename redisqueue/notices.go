package redisqueue

import (
	"strconv"
	"strings"
)

// notice acts on one notice from Redis and reports whether a waiter was
// woken: a lease id is a grant of one slot, a lease id, "*" and n a grant of
// n slots, "!" and a lease id an eviction, "?" and a token a request to
// sync at once with that token. A lease that
// no longer waits here was abandoned: for a grant, its leave, already sent
// or pending, runs after the grant in Redis and frees the slot; an evicted
// lease holds nothing.
func (b *Backend) notice(n string) bool {
	if n == "s" {
		// Shares mode: a move concerns this replica.
		b.resync.Store(true)
		b.wake()
		return false
	}
	if tok, ok := strings.CutPrefix(n, "?"); ok {
		// A recovery waits for this replica's sync, with its token.
		b.mu.Lock()
		b.token = tok
		b.mu.Unlock()
		b.resync.Store(true)
		b.wake()
		return false
	}
	lease, evicted := strings.CutPrefix(n, "!")
	slots := 1
	if l, s, ok := strings.Cut(lease, "*"); ok {
		var err error
		if slots, err = strconv.Atoi(s); err != nil || slots < 1 {
			return false
		}
		lease = l
	}
	id, ok := b.parseLease(lease)
	if !ok {
		return false
	}
	if !evicted && b.lapsed() {
		// Read after a freeze or an outage longer than the liveness lease:
		// the slots may have been dropped and given to others since they
		// were granted. The next sync says whether Redis still counts them
		// (the waiter is granted then) or lost them (it queues again).
		b.resync.Store(true)
		b.wake()
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiters[id]
	if w == nil || w.state != waiting {
		return false
	}
	if evicted {
		b.finishLocked(w, evictedOut)
	} else {
		w.granted = slots
		b.grantLocked(w)
		// Handed on by a release elsewhere, most likely: the fleet holds as
		// many as before, this replica more.
		b.heard.mine += max(slots, 1)
	}
	return true
}

// parseLease is the inverse of leaseID for this replica's leases.
func (b *Backend) parseLease(lease string) (uint64, bool) {
	rest, ok := strings.CutPrefix(lease, b.replica)
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(rest, 36, 64)
	return id, err == nil
}
