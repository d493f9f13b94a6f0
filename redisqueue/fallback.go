package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
)

// localBit marks the ID of a Ticket granted by the local fallback
// (FailOpen); the rest of the ID is a lease id of this replica's, under
// which Redis counts the request once it answers again (see localHold).
// Redis ids never reach it.
const localBit = 1 << 63

// fallbackBackend is what the FailOpen fallback needs of the in-memory
// Backend.
type fallbackBackend interface {
	backend.FastBackend
	backend.LimitSetter
}

// localHold is a request running on the FailOpen fallback's slots.
type localHold struct {
	slots   int  // how many
	inRedis bool // a sync counted it in Redis: its release leaves there too
}

// openFallbackLocked opens the FailOpen fallback for an outage: it builds it
// at the first, sets its limit to the outage's allowance (plus the blocker's
// slot) and reserves in it the slots of the requests running on grants from
// Redis. Requires b.mu.
func (b *Backend) openFallbackLocked() {
	if b.fb == nil {
		n := max(b.replicas, 1)
		queue := b.opts.LocalQueue
		if queue == 0 {
			queue = (b.limits.MaxQueue + n - 1) / n
		}
		fb := inmem.New().(fallbackBackend)
		// Deadlines are enforced by fallback, so that the whole wait, Redis
		// part included, stays within QueueTimeout.
		_ = fb.Start(backend.Limits{MaxConcurrent: 1, MaxQueue: queue, Weighted: b.limits.Weighted})
		fb.TryAcquire() // the blocker, for good
		b.fb = fb
	}
	b.fbAllowance = b.allowanceLocked()
	_ = b.fb.SetLimit(min(b.fbAllowance, backend.MaxLimit-1) + 1)
	b.downCtx, b.downCancel = context.WithCancel(context.Background())
	b.reserveLocked()
}

// allowanceLocked is the slots this replica may run while Redis is down, those
// of its requests still running on grants from Redis included: the slots it
// held when Redis last reported how many the fleet held, plus its part of the
// slots free then; but no more than its share of the fleet's limit (the
// limit split among the live replicas). Options.GlobalQueue.LocalLimit, when set, is the
// allowance. If what each replica last heard is still true (each hears it at
// least every tick), the allowances add up to at most the fleet's limit: every
// slot held then stays with the replica that held it (up to its share),
// every free one goes to one replica. The share bounds what a replica that
// heard too late, or that is cut off from Redis alone while the others take
// its slots back, runs beyond the limit. Requires b.mu.
func (b *Backend) allowanceLocked() int {
	if b.opts.LocalLimit > 0 {
		return b.opts.LocalLimit
	}
	fleet := int(b.limit.Load())
	if b.replicas == 0 {
		// Redis never answered: other replicas may be running the whole
		// limit, and nothing says how much of it is this one's.
		return 0
	}
	return min(b.splitLocked(fleet), b.heard.mine+b.splitLocked(max(0, fleet-b.heard.fleet)))
}

// split is this replica's part of n slots among the live replicas last
// reported: n/r, and one more for the first n%r by id, so that the parts add
// up to n. Requires b.mu.
func (b *Backend) splitLocked(n int) int {
	r := max(b.replicas, 1)
	p := n / r
	if b.rank%r < n%r {
		p++
	}
	return p
}

// reserveLocked reserves in the fallback, while Redis is down, the slots
// granted by Redis that are not reserved yet, as far as they fit. Requires
// b.mu.
func (b *Backend) reserveLocked() {
	for b.fbReserved < b.slots && b.fb.TryAcquire() != 0 {
		b.fbReserved++
	}
}

// fallback applies OnRedisDown to a request that Redis could not serve.
// again reports that the request is to go to Redis again instead: it was
// waiting in the fallback when Redis was marked up, or the call failed
// without Redis being marked down (then after a pause: the maintainer's
// probe tells within a call timeout).
func (b *Backend) fallback(ctx context.Context, a backend.Arrival, deadline time.Time, cause error) (_ backend.Ticket, _ error, again bool) {
	if b.opts.OnRedisDown == FailClosed {
		return backend.Ticket{}, &unavailableError{cause: cause}, false
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return backend.Ticket{}, backend.ErrClosed, false
	}
	if !b.down.Load() {
		// One failed call: until the replica marks Redis down (or finds
		// it answering), nothing is admitted on its own.
		b.mu.Unlock()
		return pauseBeforeRetry(ctx, deadline)
	}
	fb, dctx, allowance := b.fb, b.downCtx, b.fbAllowance
	b.mu.Unlock()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopUp := context.AfterFunc(dctx, cancel)
	defer stopUp()
	if !deadline.IsZero() {
		var cancelD context.CancelFunc
		lctx, cancelD = context.WithDeadline(lctx, deadline)
		defer cancelD()
	}
	if err := b.beyondAllowance(a, allowance); err != nil {
		return backend.Ticket{}, err, false
	}
	t, err := fb.Acquire(lctx, a)
	if err != nil {
		return fallbackFailure(ctx, lctx, dctx, deadline, err)
	}
	return b.holdLocal(dctx, fb, t)
}

// pauseBeforeRetry waits retryPause before a request tries Redis again,
// unless ctx ends or the deadline passes first.
func pauseBeforeRetry(ctx context.Context, deadline time.Time) (_ backend.Ticket, _ error, again bool) {
	t := time.NewTimer(retryPause)
	defer t.Stop()
	var expired <-chan time.Time
	if !deadline.IsZero() {
		d := time.NewTimer(time.Until(deadline))
		defer d.Stop()
		expired = d.C
	}
	select {
	case <-ctx.Done():
		return backend.Ticket{}, ctx.Err(), false
	case <-expired:
		return backend.Ticket{}, backend.ErrQueueTimeout, false
	case <-t.C:
		return backend.Ticket{}, errRetry, true
	}
}

// beyondAllowance returns an unavailable error if a request a could never
// run within this replica's allowance, or nil.
func (b *Backend) beyondAllowance(a backend.Arrival, allowance int) error {
	if cost := min(max(a.Cost, 1), int(b.limit.Load())); allowance < 1 || b.limits.Weighted && cost > allowance {
		// It could never run within this replica's allowance: say so now
		// rather than at its QueueTimeout.
		return &unavailableError{cause: fmt.Errorf(
			"a request of %d slots while this replica may run %d on its own until Redis answers", cost, allowance)}
	}
	return nil
}

// fallbackFailure answers a request whose acquire in the fallback failed
// with err: ctx's error, errRetry when Redis is back (dctx ended) before
// the deadline, ErrQueueTimeout when lctx ended, else err.
func fallbackFailure(ctx, lctx, dctx context.Context, deadline time.Time, err error) (_ backend.Ticket, _ error, again bool) {
	switch {
	case ctx.Err() != nil:
		return backend.Ticket{}, ctx.Err(), false
	case dctx.Err() != nil && (deadline.IsZero() || time.Now().Before(deadline)) && !errors.Is(err, backend.ErrClosed):
		return backend.Ticket{}, errRetry, true // Redis is back
	case lctx.Err() != nil:
		return backend.Ticket{}, backend.ErrQueueTimeout, false
	}
	return backend.Ticket{}, err, false
}

// holdLocal books t, granted by the fallback fb, as a local hold and counts
// it as served, unless Redis was marked up meanwhile (dctx ended): then t
// goes back and the request is to try Redis again.
func (b *Backend) holdLocal(dctx context.Context, fb fallbackBackend, t backend.Ticket) (_ backend.Ticket, _ error, again bool) {
	slots := max(t.Cost, 1)
	id := b.nextID.Add(1)
	b.mu.Lock()
	if dctx.Err() != nil {
		// Granted as Redis was marked up: the sync that counts this
		// replica's own grants may have gone, so this one goes to Redis.
		b.mu.Unlock()
		fb.Release(t)
		return backend.Ticket{}, errRetry, true
	}
	b.localHeld[id] = &localHold{slots: slots}
	b.localSlots += slots
	b.mu.Unlock()
	b.served.Add(1)
	b.servedSlots.Add(uint64(slots))
	return backend.Ticket{ID: localBit | id, Cost: t.Cost}, nil, false
}

// errRetry is fallback's answer when the request is to go through Redis
// again: Redis answers again, or was not marked down yet.
var errRetry = errors.New("redisqueue: try Redis again")

// retryPause is how long a request whose call failed waits before it tries
// Redis again, while Redis is not marked down.
const retryPause = 10 * time.Millisecond
