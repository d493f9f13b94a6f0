package ginqueue

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// dispatcher is the in-memory Backend: a counting semaphore with a bounded
// FIFO queue of waiters. It knows nothing of HTTP or gin.
//
// The order of grants is the order of the queue, never the runtime's
// scheduling order:
//   - Acquire takes a slot at once only when one is free and nobody waits, so
//     no arrival overtakes a waiter. That check is one CAS on state, without
//     the mutex, which keeps an unsaturated throttle nearly free.
//   - Otherwise the request parks on a waiter; every decision about waiters is
//     made under mu. Release hands its slot straight to the head waiter
//     (a send on its ready channel) in the releasing goroutine: one wake-up per
//     hand-off, where a separate dispatcher goroutine would cost two.
//   - One timer, armed for the oldest waiter's deadline, expires waiters. All
//     waiters share QueueTimeout, so arrival order is deadline order and the
//     timer only ever needs the head. The timer runs a function (AfterFunc),
//     so an idle dispatcher owns no goroutine at all.
//
// A waiter's fate (granted, timed out, evicted, closed) is decided once, under
// mu, and sent on its ready channel; its goroutine reads w.state after the
// receive, which the send happens before. Waiters are pooled: a queued
// request allocates nothing once the pool is warm.
type dispatcher struct {
	// grants counts the slots taken by arrivals that found one free (low 63
	// bits) and carries slowBit; releases counts the slots given back, less
	// those handed straight to a waiter (a hand-off takes one back off
	// releases). Running is grants - releases, in modular arithmetic.
	// accepted counts the hand-offs their waiter kept; Served is grants +
	// accepted, a sum of two counters that only grow, so it never goes down.
	// While slowBit is clear nobody waits, the dispatcher is open and nobody
	// drains, so Acquire is one CAS on grants and Release one Add on
	// releases, without mu. While it is set, grants and the hand-offs change
	// only under mu, and a CAS based on a word read before the bit was set
	// fails.
	//
	// A release and a parking waiter race like this: Release adds to
	// releases, then reads slowBit; the waiter sets slowBit, then reads
	// releases. Atomics are sequentially consistent, so at least one of them
	// sees the other: either the releaser takes mu and grants, or the waiter
	// sees the freed slot and takes it instead of parking. No wake-up is lost.
	// TestReleaseBetweenFastPathAndParking and TestPingPongNeverHangs catch a
	// waiter that skips its second look; the order of the two steps inside
	// Release (add, then read) is argued here, not tested.
	grants   atomic.Uint64
	releases atomic.Uint64
	accepted atomic.Uint64
	limit    atomic.Int64 // current number of slots, >= 1

	mu sync.Mutex

	// All fields below are guarded by mu. slowBit is set exactly when
	// room.n > 0 || closed || idle != nil (changed together, under mu).
	limits Limits
	room   *waitroom // the waiters; 0 <= room.n <= limits.MaxQueue
	closed bool

	epoch   time.Time     // times are nanoseconds since epoch (monotonic)
	timer   *time.Timer   // AfterFunc(expire); nil when QueueTimeout is 0
	timerAt int64         // deadline the timer is armed for; 0 when disarmed
	idle    chan struct{} // closed when running reaches 0; nil unless draining
	waiters sync.Pool     // of *waiter; see newWaiter

	// Mirrors of the waitroom for Stats, which must not wait for mu. They are
	// written under mu by settle and read without it.
	queuedN  atomic.Int64
	oldestAt atomic.Int64  // arrival of the oldest waiter + 1; 0 when none
	roomVer  atomic.Uint64 // room.ver as of the last settle
	split    atomic.Pointer[prioSplit]
}

// prioSplit is the queued count per priority, sorted highest first, as of
// room version ver. A newer split never gives way to an older one.
type prioSplit struct {
	ver    uint64
	counts []PriorityCount
}

const (
	slowBit   uint64 = 1 << 63
	grantMask uint64 = slowBit - 1
)

// running is the number of slots held now, from a grants word g read just
// before. Without mu it may be stale in either direction (releases is read
// after g): the fast path is safe anyway because its CAS fails if grants
// moved, and Stats clamps a transient negative value to 0.
func (d *dispatcher) running(g uint64) int64 {
	return int64(g&grantMask - d.releases.Load())
}

// waiterState is the fate of a waiter. It leaves waiting exactly once.
type waiterState uint8

const (
	waiting waiterState = iota
	granted
	timedOut
	closedOut
	evicted // gave its place to an arrival of higher priority
)

// waiter is one request parked in the queue. It holds no gin state: the
// request's own goroutine keeps the gin.Context and waits on ready.
type waiter struct {
	inAll, inLevel, inFlow links // see waitroom
	flow                   *flow
	arrived                int64         // nanoseconds since dispatcher.epoch
	ready                  chan struct{} // capacity 1: one wake-up per use
	state                  waiterState   // guarded by dispatcher.mu until the wake-up is received
}

// NewMemoryBackend returns the in-memory Backend that NewQueue uses when
// Config.Backend is nil: one process, strict FIFO, no polling. Other backends
// may use it as a local fallback. Like every Backend it serves one Queue.
func NewMemoryBackend() Backend { return &dispatcher{} }

var _ Backend = (*dispatcher)(nil)

// Start implements Backend.
func (d *dispatcher) Start(l Limits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.limits = l
	d.room = newWaitroom()
	d.limit.Store(int64(l.MaxConcurrent))
	d.epoch = time.Now()
	if l.QueueTimeout > 0 && l.MaxQueue > 0 {
		d.timer = time.AfterFunc(time.Hour, d.expire)
		d.timer.Stop()
	}
	return nil
}

// Acquire implements Backend.
func (d *dispatcher) Acquire(ctx context.Context, a Arrival) (Ticket, error) {
	if d.tryFast() {
		return Ticket{}, nil
	}
	return d.acquireSlow(ctx, a)
}

// tryFast takes a slot without mu when one is free and slowBit is clear.
func (d *dispatcher) tryFast() bool {
	for {
		g := d.grants.Load()
		if g&slowBit != 0 || d.running(g) >= d.limit.Load() {
			return false
		}
		if d.grants.CompareAndSwap(g, g+1) {
			return true
		}
	}
}

// acquireSlow is Acquire when the fast path failed: take a slot under mu if
// one is free and nobody waits, else wait for one.
func (d *dispatcher) acquireSlow(ctx context.Context, a Arrival) (Ticket, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return Ticket{}, ErrClosed
	}
	for d.room.n == 0 {
		g := d.grants.Load()
		if g&slowBit == 0 {
			// Announce that we may park, then look at the slots once more
			// (see the race note on grants).
			if !d.grants.CompareAndSwap(g, g|slowBit) {
				continue // a fast path moved: look again
			}
			g |= slowBit
		}
		if d.running(g) < d.limit.Load() {
			// A slot is free and nobody waits: take it.
			d.grants.Add(1)
			d.settle()
			d.mu.Unlock()
			return Ticket{}, nil
		}
		break
	}
	if !d.makeRoom(a) {
		d.settle()
		d.mu.Unlock()
		return Ticket{}, ErrQueueFull
	}
	if err := ctx.Err(); err != nil {
		// The client left before it could queue: take no place.
		d.settle()
		d.mu.Unlock()
		return Ticket{}, err
	}
	w := d.newWaiter()
	d.push(w, a)
	d.settle()
	d.mu.Unlock()

	select {
	case <-w.ready:
		err := w.err()
		if err == nil {
			d.accepted.Add(1)
		}
		d.waiters.Put(w)
		return Ticket{}, err
	case <-ctx.Done():
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	err := ctx.Err()
	switch w.state {
	case waiting:
		d.room.remove(w)
		d.settle()
	case granted:
		// The grant and the hang-up came in the same instant. Nobody will run
		// on this slot: give it back (it was never counted as served) and
		// hand it to the next waiter.
		<-w.ready
		d.releases.Add(1)
		d.grantLocked()
		d.settle()
	default:
		// Timed out, evicted or closed first: that outcome stands.
		<-w.ready
		err = w.err()
	}
	d.waiters.Put(w)
	return Ticket{}, err
}

// newWaiter takes a waiter from the pool, arrived now. A waiter goes back to
// the pool only when its wake-up, if any, has been received and it is on no
// list, so a pooled waiter is referenced by nobody. Requires d.mu.
func (d *dispatcher) newWaiter() *waiter {
	w, _ := d.waiters.Get().(*waiter)
	if w == nil {
		w = &waiter{ready: make(chan struct{}, 1)}
	}
	w.state = waiting
	w.arrived = d.now()
	return w
}

// wake gives a waiter that has left the room its fate. The send never blocks:
// ready has room for one, and a waiter is woken once per use. Requires d.mu.
func (d *dispatcher) wake(w *waiter, st waiterState) {
	w.state = st
	w.ready <- struct{}{}
}

// err is the result of a woken waiter.
func (w *waiter) err() error {
	switch w.state {
	case granted:
		return nil
	case timedOut:
		return ErrQueueTimeout
	case evicted:
		return ErrQueueFull
	default:
		return ErrClosed
	}
}

// load is the running and queued counts, without Stats' other work.
func (d *dispatcher) load() (running, queued int) {
	return int(max(d.running(d.grants.Load()), 0)), int(d.queuedN.Load())
}

// served is the number of grants so far, without Stats' other work.
func (d *dispatcher) served() uint64 { return d.grants.Load()&grantMask + d.accepted.Load() }

// Release implements Backend.
func (d *dispatcher) Release(Ticket) {
	d.releases.Add(1)
	if d.grants.Load()&slowBit == 0 {
		return
	}
	d.mu.Lock()
	d.grantLocked()
	d.settle()
	d.mu.Unlock()
}

// grantLocked wakes head waiters, in order, while slots are free, and tells a
// drainer when none is held. A waiter past its deadline is timed out, not
// granted. Requires d.mu.
func (d *dispatcher) grantLocked() {
	now := int64(-1) // read the clock once, and only if a waiter is granted
	for d.room.n > 0 && d.running(d.grants.Load()) < d.limit.Load() {
		w := d.room.next()
		if d.timer != nil {
			if now < 0 {
				now = d.now()
			}
			if d.deadline(w) <= now {
				// Its deadline passed and the timer has not fired yet (a
				// loaded machine): it gets its 408, not the slot.
				d.wake(w, timedOut)
				continue
			}
		}
		d.releases.Add(^uint64(0)) // the slot goes to w: running + 1
		d.wake(w, granted)
	}
	if d.idle != nil && d.running(d.grants.Load()) == 0 {
		close(d.idle)
		d.idle = nil
	}
}

// settle ends every change made under mu: it sets slowBit exactly when
// something needs the slow path, and refreshes the mirrors Stats reads.
// Requires d.mu.
func (d *dispatcher) settle() {
	if d.room.n > 0 || d.closed || d.idle != nil {
		d.grants.Or(slowBit)
	} else {
		d.grants.And(^slowBit)
	}
	d.queuedN.Store(int64(d.room.n))
	d.roomVer.Store(d.room.ver)
	oldest := int64(0)
	if w := d.room.all.first; w != nil {
		oldest = w.arrived + 1
	}
	d.oldestAt.Store(oldest)
}

// makeRoom reports whether a waiting place can be found for a, giving it
// the place of the newest waiter of the lowest lower priority if the queue is
// full. Requires d.mu.
func (d *dispatcher) makeRoom(a Arrival) bool {
	if d.limits.MaxQueuePerFlow > 0 && d.room.flowLen(a.Priority, a.Flow) >= d.limits.MaxQueuePerFlow {
		return false
	}
	if d.room.n < d.limits.MaxQueue {
		return true
	}
	v := d.room.victim(a.Priority)
	if v == nil {
		return false
	}
	d.finish(v, evicted)
	return true
}

// push queues w and arms the timer if it was idle. Requires d.mu.
func (d *dispatcher) push(w *waiter, a Arrival) {
	d.room.push(w, a.Priority, a.Flow)
	if d.timer != nil && d.timerAt == 0 {
		d.arm(d.deadline(w))
	}
}

// deadline is when w times out, in nanoseconds since epoch.
// It saturates: a QueueTimeout of centuries means never, not the past.
func (d *dispatcher) deadline(w *waiter) int64 {
	if t := int64(d.limits.QueueTimeout); w.arrived > math.MaxInt64-t {
		return math.MaxInt64
	}
	return w.arrived + int64(d.limits.QueueTimeout)
}

// finish removes a waiting w and wakes it with its fate. Requires d.mu.
func (d *dispatcher) finish(w *waiter, st waiterState) {
	d.room.remove(w)
	d.wake(w, st)
}

// arm sets the timer to fire at deadline. Requires d.mu.
func (d *dispatcher) arm(deadline int64) {
	d.timerAt = deadline
	d.timer.Reset(time.Duration(deadline - d.now()))
}

func (d *dispatcher) now() int64 { return int64(time.Since(d.epoch)) }

// expire answers every waiter whose deadline has passed and re-arms the timer
// for the next one. It runs in the timer's goroutine. A waiter that left the
// queue early makes the timer fire for nothing once; it then re-arms.
func (d *dispatcher) expire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.timerAt = 0
	if d.closed {
		return
	}
	now := d.now()
	for w := d.room.all.first; w != nil && d.deadline(w) <= now; w = d.room.all.first {
		d.finish(w, timedOut)
	}
	if w := d.room.all.first; w != nil {
		d.arm(d.deadline(w))
	}
	d.settle()
}

// SetLimit implements LimitSetter. Raising the limit wakes waiters at once;
// lowering it lets running requests finish and admits nobody until running
// is below the new limit.
func (d *dispatcher) SetLimit(n int) error {
	if n < 1 || n > maxLimit {
		return fmt.Errorf("ginqueue: limit must be in [1, %d], got %d", maxLimit, n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.limit.Store(int64(n))
	d.grantLocked()
	d.settle()
	return nil
}

// Stats implements Backend. It never waits for mu: counts come from atomics,
// and the split by priority is refreshed only if mu is free at that moment
// (otherwise the last split is returned, which may lag by the operations in
// flight).
func (d *dispatcher) Stats() BackendStats {
	running, queued := d.load()
	st := BackendStats{Running: running, Queued: queued, Limit: int(d.limit.Load()), Served: d.served()}
	if o := d.oldestAt.Load(); o != 0 {
		st.OldestWait = time.Duration(d.now() - (o - 1))
	}
	if p := d.split.Load(); (p == nil || p.ver != d.roomVer.Load()) && d.mu.TryLock() {
		next := &prioSplit{ver: d.room.ver, counts: d.room.byPriority()} // O(P) under the lock ...
		d.mu.Unlock()
		slices.SortFunc(next.counts, func(a, b PriorityCount) int { return cmp.Compare(b.Priority, a.Priority) }) // ... the sort outside
		for p := d.split.Load(); (p == nil || p.ver < next.ver) && !d.split.CompareAndSwap(p, next); p = d.split.Load() {
		}
	}
	if p := d.split.Load(); p != nil && st.Queued > 0 {
		st.QueuedByPriority = slices.Clone(p.counts)
	}
	return st
}

// Close implements Backend.
func (d *dispatcher) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.settle()
	if d.timer != nil {
		d.timer.Stop()
		d.timerAt = 0
	}
	for w := d.room.all.first; w != nil; w = d.room.all.first {
		d.finish(w, closedOut)
	}
	d.settle()
	return nil
}

// Drain implements Backend.
func (d *dispatcher) Drain(ctx context.Context) error {
	d.mu.Lock()
	if d.idle == nil {
		d.idle = make(chan struct{})
		d.settle() // from here on every Release takes mu and sees idle
	}
	idle := d.idle
	d.grantLocked() // closes idle at once if nothing runs
	d.settle()
	d.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
