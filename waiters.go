package ginqueue

import (
	"context"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// Waiters: a request that cannot take its slots at once parks on a waiter,
// and is granted, timed out, evicted or closed out under the mutex, in the
// order of the wait room.

// waiterState is the fate of a waiter. It leaves waiting exactly once.
type waiterState uint8

const (
	waiting waiterState = iota
	granted
	timedOut
	closedOut
	evicted // gave its place to an arrival of higher priority
	gone    // its client had left when its fate came: the outcome is ctx.Err()
)

// waiter is one request parked in the queue. It holds no gin state: the
// request's own goroutine keeps the gin.Context and waits on ready.
type waiter struct {
	inAll, inLevel, inFlow links // see waitroom
	flow                   *flow
	ctx                    context.Context // the request's; nil while pooled
	arrived                int64           // nanoseconds since dispatcher.epoch
	ready                  chan struct{}   // capacity 1: one wake-up per use
	state                  waiterState     // guarded by dispatcher.mu until the wake-up is received
	// cost is the slots asked for (at least 1) while it waits, and once
	// granted the slots granted (clamped to the limit). Guarded like state;
	// it does not change while the waiter is in the room, which counts the
	// waiters whose cost is above 1.
	cost int
	// cutoff is when it stops being worth granting: Arrival.MinTimeLeft
	// before its context's deadline, in nanoseconds since dispatcher.epoch;
	// 0 when there is none. Set under mu once it is in the room and was not
	// granted on arrival; unchanged afterwards.
	cutoff int64
	// passNext links the waiters grantLocked passed over, out of the room,
	// until it wakes them; nil otherwise. wakeNext links the waiters whose
	// wake-up waits for the end of the section (see dispatcher.sendWakeUps).
	// Both guarded by dispatcher.mu.
	passNext, wakeNext *waiter
}

// Acquire implements Backend. It applies a.MaxAhead, and grants a.Cost slots
// (at least 1, at most the limit at the grant), carried in the Ticket.
//
// A slot it takes at once counts as a grant through Acquire, never as a
// fast one (Counts.ServedAtOnce): the caller records the wait of what Acquire
// grants, so a fast count too would count the request twice.
func (d *dispatcher) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	if n := d.tryAcquireN(max(a.Cost, 1)); n != 0 {
		return backend.Ticket{Cost: int(n)}, nil
	}
	return d.acquireSlow(ctx, a)
}

// acquireSlow is Acquire when the fast path failed: take the slots under mu
// if they are free and nobody waits, else wait for them, unless a.MaxAhead
// refuses.
func (d *dispatcher) acquireSlow(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	cost := max(a.Cost, 1)
	d.lock()
	if d.closed {
		d.unlock()
		return backend.Ticket{}, backend.ErrClosed
	}
	if n, ok := d.takeFree(cost); ok {
		d.unlock()
		d.served(n)
		return backend.Ticket{Cost: int(n)}, nil
	}
	if err := ctx.Err(); err != nil {
		// The client left before it could queue: take no place, and take
		// none from anybody else.
		d.unlock()
		return backend.Ticket{}, err
	}
	if a.MaxAhead != 0 && d.tooFarBack(a, cost) {
		// Checked with the place taken, under one lock: a flood of
		// arrivals cannot all see the same short queue.
		d.unlock()
		return backend.Ticket{}, errRejectedEarly
	}
	// With a waiter of cost above 1 in the room, free slots can wait for
	// it at the head: this arrival (or the eviction that makes its place)
	// may change the head, so look again once it is in.
	heavy := d.room.heavy > 0
	if !d.makeRoom(a) {
		d.unlock()
		return backend.Ticket{}, backend.ErrQueueFull
	}
	w := d.newWaiter(ctx, cost)
	d.push(w, a)
	if heavy || d.room.heavy > 0 {
		d.grantLocked()
	}
	watch := d.setCutoff(ctx, w, a)
	d.unlock()
	return d.await(ctx, w, watch)
}

// takeFree takes cost slots if they are free and nobody waits, and
// returns how many it took (cost, clamped to the limit). Otherwise it sets
// slowBit, so that no fast path passes the arrival that will wait.
// Requires d.mu.
func (d *dispatcher) takeFree(cost int) (uint64, bool) {
	for d.room.n == 0 {
		d.at(stepSlowLoad)
		st := d.state.Load()
		if st&slowBit == 0 {
			// Announce that we may park; the word we set the bit in tells
			// whether a slot is free (see the note on state).
			d.at(stepSlowMark)
			if !d.state.CompareAndSwap(st, st|slowBit) {
				continue // a fast path or a release moved: look again
			}
		}
		if n := d.fits(st, cost); n != 0 {
			// The slots are free and nobody waits: take them. Only
			// releases can change state now, and they only free slots.
			d.at(stepSlowTake)
			d.state.Add(n)
			return n, true
		}
		break
	}
	return 0, false
}

// setCutoff sets the cutoff of w, a waiter that just arrived with a, from
// its context's deadline and a.MinTimeLeft. A heavy waiter past its cutoff
// may block the waiters behind it while their slots are free. Then no
// release or arrival may come to pass it over before its deadline, so it
// watches its cutoff itself: setCutoff returns how long until the cutoff,
// or zero for no watch. A light waiter holds nobody up: it is passed over
// at the next grant. This is decided under mu, since a grant may change
// w.cost as soon as mu is released.
func (d *dispatcher) setCutoff(ctx context.Context, w *waiter, a backend.Arrival) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok || a.MinTimeLeft <= 0 || w.state != waiting {
		return 0 // one granted as it arrived runs whatever its time left
	}
	w.cutoff = max(int64(dl.Sub(d.epoch)-a.MinTimeLeft), 1) // 0 means none
	if w.cost <= 1 {
		return 0
	}
	return max(time.Duration(w.cutoff-d.now())+1, 1)
}

// await waits for w's wake-up, its client's hang-up, or its cutoff when
// watch is above zero.
func (d *dispatcher) await(ctx context.Context, w *waiter, watch time.Duration) (backend.Ticket, error) {
	var cut <-chan time.Time
	if watch > 0 {
		tm := time.NewTimer(watch)
		defer tm.Stop()
		cut = tm.C
	}
	select {
	case <-w.ready:
		return d.woken(w)
	case <-ctx.Done():
	case <-cut:
	}
	return d.leave(ctx, w)
}

// leave ends the wait of w, whose client left or whose cutoff passed,
// unless a wake-up came first: a grant in the instant its cutoff passed,
// its client still there, runs; other fates stand.
func (d *dispatcher) leave(ctx context.Context, w *waiter) (backend.Ticket, error) {
	d.lock()
	defer d.unlock()
	err := ctx.Err()
	if err == nil {
		err = backend.ErrQueueTimeout // its cutoff passed
	}
	switch w.state {
	case waiting:
		heavy := d.room.heavy > 0
		d.room.remove(w)
		if heavy {
			d.grantLocked() // w may have held up the waiters behind it
		}
	case granted:
		if ctx.Err() == nil {
			<-w.ready
			return d.woken(w)
		}
		// The grant and the hang-up came in the same instant. Nobody will run
		// on these slots: give them back (they were never counted as
		// served) and hand them to the next waiter.
		<-w.ready
		d.at(stepRelease)
		d.state.Add(-uint64(w.cost))
		d.grantLocked()
	default:
		// Timed out, evicted or closed first: that outcome stands.
		<-w.ready
		err = w.err()
	}
	w.ctx = nil
	d.waiters.Put(w)
	return backend.Ticket{}, err
}

// woken is the result of a waiter whose wake-up has been received: its
// Ticket if granted (counted as served), else its error; w goes back to the
// pool.
func (d *dispatcher) woken(w *waiter) (backend.Ticket, error) {
	var t backend.Ticket
	err := w.err()
	if err == nil {
		t.Cost = w.cost
		d.served(uint64(w.cost))
	}
	w.ctx = nil
	d.waiters.Put(w)
	return t, err
}

// newWaiter takes a waiter from the pool, arrived now, asking for cost slots.
// A waiter goes back to the pool only when its wake-up, if any, has been
// received and it is on no list, so a pooled waiter is referenced by nobody.
// Requires d.mu.
func (d *dispatcher) newWaiter(ctx context.Context, cost int) *waiter {
	w, _ := d.waiters.Get().(*waiter)
	if w == nil {
		w = &waiter{ready: make(chan struct{}, 1)}
	}
	w.ctx = ctx
	w.state = waiting
	w.cost = cost
	w.arrived = d.now()
	w.cutoff = 0
	return w
}

// wake gives a waiter that has left the room its fate, and queues its
// wake-up, which the end of the section sends (see sendWakeUps). The send
// never blocks: ready has room for one, and a waiter is woken once per use.
// A waiter whose client has already left is not timed out, evicted or
// closed: that is not why it leaves. Requires d.mu.
func (d *dispatcher) wake(w *waiter, st waiterState) {
	if st != granted && w.ctx.Err() != nil {
		st = gone
	}
	w.state = st
	if d.wakeLast == nil {
		d.wakeFirst = w
	} else {
		d.wakeLast.wakeNext = w
	}
	d.wakeLast = w
}

// err is the result of a woken waiter.
func (w *waiter) err() error {
	switch w.state {
	case granted:
		return nil
	case timedOut:
		return backend.ErrQueueTimeout
	case evicted:
		return backend.ErrQueueFull
	case gone:
		return w.ctx.Err()
	default:
		return backend.ErrClosed
	}
}

// grantLocked wakes head waiters, in order, while the head's slots are free,
// and tells a drainer when none is held. A head whose slots are not all free
// blocks the waiters behind it: nobody behind it is granted. A waiter past
// its expiry, or past its cutoff and so too late to finish, is timed out,
// not granted. One whose client has left is passed over. Those passed over
// are woken after the grants, so that the granted run first: each passed
// over goes on to write a response, and under overload there are several
// for each grant. Under CoDel with LIFO, while the queue stands, the head
// is the newest waiter of the flow whose turn it is. grantLocked reports
// whether it granted anyone. Requires d.mu.
func (d *dispatcher) grantLocked() (grantedAny bool) {
	now := int64(-1) // read the clock once, and only if a waiter is granted or LIFO may apply
	// The waiters passed over, out of the room, linked through passNext in
	// the order passed, and woken at the end.
	var first, last *waiter
	pass := func(w *waiter, st waiterState) {
		w.state = st
		if last == nil {
			first = w
		} else {
			last.passNext = w
		}
		last = w
	}
	for d.room.n > 0 {
		lifo := d.lifoNow(&now)
		h := d.room.peek(lifo)
		// A head whose client has left, or past its cutoff, is passed over
		// whether or not its slots are free (a heavy one would block the
		// waiters for nobody), and without using its flow's turn: as if it
		// had left the room itself.
		if st := d.headLeaves(h, &now); st != waiting {
			d.room.remove(h)
			pass(h, st)
			continue
		}
		n := d.grantable(h)
		if n == 0 {
			break
		}
		// The maximum wait before w leaves the room: with w the last waiter,
		// the room would look empty, and the queue not standing.
		var maxWait int64
		if d.timer != nil {
			maxWait = d.maxWait(d.readNow(&now))
		}
		w := d.take(lifo) // h
		if d.timer != nil && now-w.arrived >= maxWait {
			// Its expiry passed and the timer has not fired yet (a loaded
			// machine, or CoDel's maximum wait shrank this instant): it
			// gets its 408, not the slot.
			pass(w, timedOut)
			continue
		}
		d.at(stepGrantTake)
		d.state.Add(n) // the slots go to w
		w.cost = int(n)
		d.wake(w, granted)
		grantedAny = true
	}
	for w := first; w != nil; {
		next := w.passNext
		w.passNext = nil
		d.wake(w, w.state)
		w = next
	}
	if d.idle != nil && running(d.state.Load()) == 0 {
		close(d.idle)
		d.idle = nil
	}
	return grantedAny
}

// readNow returns *now, reading the clock into it first if it is still
// unread (below zero).
func (d *dispatcher) readNow(now *int64) int64 {
	if *now < 0 {
		*now = d.now()
	}
	return *now
}

// lifoNow reports whether CoDel's LIFO grants now: it is on and the queue
// stands. It reads the clock into *now only if LIFO is on.
func (d *dispatcher) lifoNow(now *int64) bool {
	if c := d.codel; c != nil && c.lifo {
		return d.standing(d.readNow(now))
	}
	return false
}

// headLeaves returns gone if the client of h, the head, has left and it has
// not noticed yet, timedOut if h is past its cutoff (its client would leave
// before the handler finished), and waiting otherwise. It reads the clock
// into *now only if h has a cutoff.
func (d *dispatcher) headLeaves(h *waiter, now *int64) waiterState {
	if h.ctx.Err() != nil {
		return gone
	}
	if h.cutoff != 0 && d.readNow(now) > h.cutoff {
		return timedOut
	}
	return waiting
}

// take removes and returns the waiter that room.peek(lifo) returns.
// Requires d.mu.
func (d *dispatcher) take(lifo bool) *waiter {
	if lifo {
		return d.room.newest()
	}
	return d.room.next()
}

// makeRoom reports whether a place can be found for a, giving it the place
// of the newest waiter of the lowest priority below a's if the queue is
// full. Requires d.mu.
func (d *dispatcher) makeRoom(a backend.Arrival) bool {
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
func (d *dispatcher) push(w *waiter, a backend.Arrival) {
	if d.codel != nil && d.room.n == 0 {
		d.busySince = w.arrived
	}
	d.room.push(w, a.Priority, a.Flow)
	if d.timer != nil && d.timerAt == 0 {
		d.arm(d.wakeAt(w.arrived))
	}
}

// finish removes a waiting w and wakes it with its fate. Requires d.mu.
func (d *dispatcher) finish(w *waiter, st waiterState) {
	d.room.remove(w)
	d.wake(w, st)
}

// grantable returns the slots w is granted now, or 0 if they are not free.
// Requires d.mu: the limit cannot move before they are added.
func (d *dispatcher) grantable(w *waiter) uint64 {
	d.at(stepGrantRead)
	return d.fits(d.state.Load(), w.cost)
}
