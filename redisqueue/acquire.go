package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// waiter is one lease id waiting in the Redis queue for a grant.
type waiter struct {
	id   uint64
	prio int // its Arrival's, for Stats
	cost int // the slots it asks for, at least 1
	// granted is the slots granted (its cost clamped to the limit), set
	// before ready is closed with state granted; zero means one.
	granted int
	since   time.Time     // when it arrived, for Stats
	ready   chan struct{} // closed when state leaves waiting
	state   waitState     // guarded by Backend.mu until ready is closed
	// queued is set, under Backend.mu, once Redis answered that the id is
	// queued. Only then may the safety net call it lost: before, the
	// acquire call may still be on its way.
	queued bool
}

type waitState uint8

const (
	waiting    waitState = iota
	granted              // a slot is held under this id; it is in Backend.held
	lost                 // Redis no longer knows the id: enqueue again
	closedOut            // Close answered it
	evictedOut           // an arrival of higher priority took its place in Redis
	abandoned            // its request left; a leave is under way
)

// Acquire implements backend.Backend: it returns a Ticket once the request
// may run, or an error.
//
// In Shares mode it is the in-memory backend's Acquire, within this
// replica's share, and makes no Redis call: a request that finds a slot of
// the share free runs at once; others wait in this replica's own queue
// (and may make the replica ask Redis for more of the limit), and so do
// requests of a priority band the share was not made for, until a sync
// makes room for them. It returns backend.ErrQueueFull,
// backend.ErrQueueTimeout, backend.ErrClosed or ctx.Err() as the in-memory
// backend does. While this replica admits nothing (the lease on its share
// ran out with Redis unreachable, it holds no share while Redis is marked
// down and a probe found it still down, or a conflict was found) it
// returns an error wrapping ErrUnavailable and backend.ErrQueueFull, under
// either OnRedisDown.
//
// In GlobalQueue mode it makes one Redis call or more: Redis grants the
// slots or queues the request in the fleet's one queue. It returns
// backend.ErrQueueFull (for a waiter whose place in the full queue an
// arrival of higher priority took, an error wrapping it),
// backend.ErrQueueTimeout (after Limits.QueueTimeout, measured here),
// backend.ErrClosed, ctx.Err() when ctx ends first, or while Redis is down
// what OnRedisDown says: a local grant (FailOpen) or an error wrapping
// ErrUnavailable and backend.ErrQueueFull (FailClosed). A request never
// waits longer than QueueTimeout plus one CallTimeout.
//
// With Limits.Weighted the request asks for a.Cost slots (below 1, one),
// clamped to the fleet's limit, and the Ticket's Cost says how many it got.
// In Shares mode it waits until the share covers them; in GlobalQueue mode
// Redis grants them once they are free and no waiter ahead of it in the
// fleet's order waits.
func (b *Backend) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	if b.sh != nil {
		return b.sh.acquire(ctx, a)
	}
	var deadline time.Time
	if b.limits.QueueTimeout > 0 {
		deadline = time.Now().Add(b.limits.QueueTimeout)
	}
	if err := ctx.Err(); err != nil {
		return backend.Ticket{}, err
	}
	prio := prioKey(a.Priority)
	cost := 1
	if b.limits.Weighted {
		cost = min(max(a.Cost, 1), backend.MaxLimit)
	}
	for {
		t, err, again := b.acquireOnce(ctx, a, deadline, prio, cost)
		if !again {
			return t, err
		}
	}
}

// acquireOnce makes one attempt of Acquire: it enqueues a new lease id in
// Redis and waits for its grant, or applies OnRedisDown. again reports that
// Acquire is to try again with a new id.
func (b *Backend) acquireOnce(ctx context.Context, a backend.Arrival, deadline time.Time, prio string, cost int) (_ backend.Ticket, _ error, again bool) {
	b.mu.Lock()
	switch {
	case b.closed || !b.started:
		b.mu.Unlock()
		return backend.Ticket{}, backend.ErrClosed, false
	case b.conflict != nil:
		err := b.conflict
		b.mu.Unlock()
		return backend.Ticket{}, fmt.Errorf("%w (%w)", err, backend.ErrQueueFull), false
	case b.down.Load():
		b.probeLocked()
		b.mu.Unlock()
		return b.fallback(ctx, a, deadline, errors.New("earlier calls failed"))
	}
	// Register before the call: the grant notice can beat the reply.
	w := &waiter{id: b.nextID.Add(1), prio: a.Priority, cost: cost, since: time.Now(), ready: make(chan struct{})}
	b.waiters[w.id] = w
	downCh := b.downCh
	b.mu.Unlock()

	outcome, slots, fleet, err := b.callAcquire(w, prio, cost)
	if err != nil {
		return b.acquireFailed(ctx, a, deadline, w, err)
	}
	b.mu.Lock()
	closed := b.noteOutcomeLocked(w, outcome, slots, fleet)
	b.mu.Unlock()
	if outcome == -1 {
		return backend.Ticket{}, backend.ErrQueueFull, false
	}
	if closed {
		b.leave(w.id, w.cost)
	}
	t, err, again := b.wait(ctx, w, deadline, downCh)
	if !again {
		t, err := b.handOut(ctx, a, t, err, outcome == 0)
		return t, err, false
	}
	if err != nil {
		return b.fallback(ctx, a, deadline, err)
	}
	// Lost by Redis (restarted, flushed): enqueue again with a new id.
	return backend.Ticket{}, nil, true
}

// callAcquire runs the acquire script for w and reads its reply.
func (b *Backend) callAcquire(w *waiter, prio string, cost int) (outcome, slots, fleet int64, err error) {
	res, err := b.callIn(b.stopCtx, acquireScript, b.limits.MaxQueue, b.leaseID(w.id), prio, cost)
	if err == nil {
		outcome, slots, fleet, err = b.acquireReply(res)
	}
	return outcome, slots, fleet, err
}

// acquireFailed answers a request whose acquire call for w failed (err):
// ErrClosed if Close ran, else what OnRedisDown says.
func (b *Backend) acquireFailed(ctx context.Context, a backend.Arrival, deadline time.Time, w *waiter, err error) (_ backend.Ticket, _ error, again bool) {
	// The script may have run: undo it in the background.
	b.abandon(w)
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		// Close answered it, and ended the call.
		return backend.Ticket{}, backend.ErrClosed, false
	}
	// This request gets OnRedisDown now; the replica turns to it
	// only after Options.FailureThreshold failures in a row.
	return b.fallback(ctx, a, deadline, err)
}

// noteOutcomeLocked acts on the acquire script's outcome for w (queued,
// granted, or queue full) and notes what the fleet held. It reports whether
// Close answered w meanwhile: what Redis gave it is to be given back.
// Requires b.mu.
func (b *Backend) noteOutcomeLocked(w *waiter, outcome, slots, fleet int64) (closed bool) {
	// Close may have answered it while the call was on its way, and
	// given its id back before the script ran: then what the script
	// granted or queued is given back now. (Not any other state: a
	// grant notice can beat the reply.)
	switch outcome {
	case 0:
		w.queued = true
		closed = w.state == closedOut
	case 1:
		if w.state == waiting {
			w.granted = int(slots)
			b.grantLocked(w)
		}
		closed = w.state == closedOut
	case -1:
		if w.state == waiting {
			w.state = abandoned
			delete(b.waiters, w.id)
		}
	}
	// What the fleet held after the script, this grant included.
	b.heard.fleet, b.heard.mine = int(fleet), b.slots+b.localSlots
	return closed
}

// handOut answers a request with what its wait ended in. A ticket it
// waited for (queued) is released as errTooLate if its client would leave
// before its handler finished; a ticket handed out is counted as served.
func (b *Backend) handOut(ctx context.Context, a backend.Arrival, t backend.Ticket, err error, queued bool) (backend.Ticket, error) {
	if err == nil && queued && tooLate(ctx, a.MinTimeLeft) {
		// It waited, and its client would leave before its handler
		// finished: the slots go to the next waiter (never counted
		// as served).
		b.release(t)
		return backend.Ticket{}, errTooLate
	}
	if err == nil {
		b.served.Add(1)
		b.servedSlots.Add(uint64(t.Cost))
	}
	return t, err
}

// errTooLate is ErrQueueTimeout for a waiter granted with less time left
// before its deadline than Arrival.MinTimeLeft.
var errTooLate = fmt.Errorf("%w: granted with less time left than the request needs", backend.ErrQueueTimeout)

// tooLate reports whether a request whose context is ctx, granted now, has
// less than need left before its deadline (Arrival.MinTimeLeft); false
// without a deadline or a need.
func tooLate(ctx context.Context, need time.Duration) bool {
	dl, ok := ctx.Deadline()
	return ok && need > 0 && time.Until(dl) < need
}

// acquireReply reads the acquire script's reply (its layout is in
// script_acquire.go) and notes the limit.
func (b *Backend) acquireReply(res any) (outcome, slots, fleet int64, err error) {
	r, _ := res.([]any)
	if len(r) == 4 {
		outcome, ok1 := r[0].(int64)
		limit, ok2 := r[1].(int64)
		slots, ok3 := r[2].(int64)
		fleet, ok4 := r[3].(int64)
		if ok1 && ok2 && ok3 && ok4 {
			b.limit.Store(limit)
			return outcome, slots, fleet, nil
		}
	}
	return 0, 0, 0, fmt.Errorf("redisqueue: unexpected acquire reply %v", res)
}

// wait waits for w's grant. again reports that Acquire must go on: with
// err == nil to enqueue again, with err != nil to apply OnRedisDown.
func (b *Backend) wait(ctx context.Context, w *waiter, deadline time.Time, downCh <-chan struct{}) (t backend.Ticket, err error, again bool) {
	var expired <-chan time.Time
	if !deadline.IsZero() {
		tm := time.NewTimer(time.Until(deadline))
		defer tm.Stop()
		expired = tm.C
	}
	select {
	case <-w.ready:
	case <-ctx.Done():
		if !b.abandon(w) {
			// Granted in the same instant as the hang-up: nobody will run on
			// the slot, so give it back (it was never counted as served).
			b.release(backend.Ticket{ID: w.id})
		}
		return backend.Ticket{}, ctx.Err(), false
	case <-expired:
		t, err := b.answerExpired(w)
		return t, err, false
	case <-downCh:
		if !b.abandon(w) {
			return b.ticket(w), nil, false
		}
		return backend.Ticket{}, errors.New("safety-net call failed"), true
	}
	// ready is closed, so w.state is final and safe to read.
	return b.answerEnded(w, deadline)
}

// answerExpired answers w when its deadline passed: a grant that came in
// the same instant, else ErrQueueTimeout, or unavailable (FailClosed) when
// Redis stopped answering.
func (b *Backend) answerExpired(w *waiter) (backend.Ticket, error) {
	if !b.abandon(w) {
		// Granted in the same instant as the deadline: serve it.
		return b.ticket(w), nil
	}
	if b.opts.OnRedisDown == FailClosed && !b.answering() {
		// Redis stopped answering while it waited (a pause, a failover
		// not yet marked down): that, not the queue, is why no grant
		// came. FailClosed answers it as unavailable.
		return backend.Ticket{}, &unavailableError{cause: errors.New("no answer from Redis while the request waited")}
	}
	return backend.Ticket{}, backend.ErrQueueTimeout
}

// answerEnded answers w once its ready is closed, by its final state. again
// reports that Redis lost it and Acquire is to enqueue it again.
func (b *Backend) answerEnded(w *waiter, deadline time.Time) (_ backend.Ticket, _ error, again bool) {
	switch w.state {
	case granted:
		return b.ticket(w), nil, false
	case lost:
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return backend.Ticket{}, backend.ErrQueueTimeout, false
		}
		return backend.Ticket{}, nil, true
	case evictedOut:
		return backend.Ticket{}, errEvicted, false
	}
	return backend.Ticket{}, backend.ErrClosed, false
}

// ticket is the Ticket of w, granted.
func (b *Backend) ticket(w *waiter) backend.Ticket {
	return backend.Ticket{ID: w.id, Cost: max(w.granted, 1)}
}

// grantLocked hands w its w.granted slots (zero: one). Requires b.mu and
// w.state == waiting.
func (b *Backend) grantLocked(w *waiter) {
	w.granted = max(w.granted, 1)
	w.state = granted
	delete(b.waiters, w.id)
	b.held[w.id] = w.granted
	b.slots += w.granted
	if b.down.Load() && b.fb != nil {
		b.reserveLocked() // a grant that came as Redis was marked down
	}
	close(w.ready)
}

// finishLocked ends w's wait with st, which holds nothing in Redis. Requires
// b.mu and w.state == waiting.
func (b *Backend) finishLocked(w *waiter, st waitState) {
	w.state = st
	delete(b.waiters, w.id)
	close(w.ready)
}

// abandon takes w out of the local books and has its place or slot given
// back in Redis, since the script may have queued or granted it. It reports false
// if w had been granted and Close had not run: the caller holds the slot then,
// and nothing was given back.
func (b *Backend) abandon(w *waiter) bool {
	b.mu.Lock()
	switch w.state {
	case waiting:
		w.state = abandoned
		delete(b.waiters, w.id)
	case granted:
		b.mu.Unlock()
		return false
	}
	b.mu.Unlock()
	// In the background, so that a 408 or a 499 is answered at once; the
	// maintainer sends it within microseconds, batched with others.
	b.mu.Lock()
	b.pending[w.id] = w.cost
	b.mu.Unlock()
	b.wake()
	return true
}

// prioKey orders priorities as strings: higher priority, smaller key.
func prioKey(p int) string {
	u := uint64(int64(p)) ^ (1 << 63)
	return fmt.Sprintf("%016x", ^u)
}
