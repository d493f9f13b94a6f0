package ginqueue

import (
	"cmp"
	"context"
	"errors"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// dispatcher is the in-memory Backend (a FastBackend): a counting semaphore
// with a bounded queue of waiters. It knows nothing of HTTP or gin.
//
// Grants are made by the goroutine that releases a slot, not by a goroutine
// of the dispatcher's own: Release hands its slot straight to the head
// waiter (a send on its ready channel) before it returns. That is one
// wake-up per hand-off, where a dispatcher goroutine would cost two (the
// releaser wakes it, it wakes the waiter), and an idle dispatcher owns no
// goroutine at all. The decisions are still made in one place, under mu,
// in the queue's order, never the runtime's scheduling order:
//   - Acquire takes a slot at once only when one is free and nobody waits, so
//     no arrival overtakes a waiter. That check is one CAS on state, without
//     the mutex, which keeps an unsaturated throttle nearly free.
//   - A request may cost several slots (Arrival.Cost, clamped to the limit
//     when it is granted). A head waiter whose slots are not all free holds
//     the line: nobody behind it is granted, and since it waits slowBit is
//     set, so nobody takes the fast path either; the slots it needs free up
//     as holders release. Arrivals of a higher priority still go first, and
//     a waiter that leaves the head lets grantLocked look again.
//   - Otherwise the request parks on a waiter; every decision about waiters is
//     made under mu, and every section under mu ends with unlock, which
//     settles slowBit and the mirrors first.
//   - One timer, armed for the oldest waiter's deadline, expires waiters. All
//     waiters share QueueTimeout, so arrival order is deadline order and the
//     timer only ever needs the head. The timer runs a function (AfterFunc),
//     so an idle dispatcher owns no goroutine at all. CoDel keeps this: see
//     wakeAt.
//
// A waiter's fate (granted, timed out, evicted, closed) is decided once, under
// mu, and sent on its ready channel; its goroutine reads w.state after the
// receive, which the send happens before. Waiters are pooled: a queued
// request allocates nothing once the pool is warm.
type dispatcher struct {
	// state is the one word every admission decision reads and changes:
	// the slots held (low 32 bits), the limit (the next 31) and slowBit.
	// Holding both counts and the bit in one word makes each decision one
	// atomic step: a CAS that succeeds on state s admits exactly when s
	// admits (slowBit clear, running + cost <= limit), whatever happened
	// between the load and the CAS, since equal words mean equal counts,
	// limit and bit. A hand-off by a releaser leaves running where it was
	// (the release takes its slots, the grant adds the waiter's back), which
	// is harmless for the same reason: the word only says what is true now.
	// Slots are only ever added when they fit under the limit, and a cost
	// is at most the limit, so running never exceeds the highest limit
	// there has been (MaxLimit), and fits its 32 bits.
	//
	// While slowBit is clear nobody waits, the dispatcher is open and nobody
	// drains, so Acquire is one CAS and Release one Add, without mu. While
	// it is set, slots are granted only under mu; Release still subtracts
	// without mu and learns from the word its Add returns whether to take
	// mu and hand the slot on. A parking waiter sets the bit with a CAS
	// under mu and reads running from the same word, so a release lands
	// either before that CAS (the waiter sees the free slot and takes it)
	// or after (the releaser sees the bit and grants under mu): no wake-up
	// is lost. TestInterleavings enumerates every order of these steps,
	// SetLimit's included, and checks the limit after each.
	state atomic.Uint64

	// Counters that only grow, for Stats: fastServed counts the slots the
	// fast path took, slowServed the grants kept through Acquire (slots
	// taken at once or a hand-off its waiter kept), finished the Releases;
	// all three count requests. Served is fastServed + slowServed. The
	// slots beyond the first of each grant kept and of each Release are in
	// heavyServed and heavyFinished, which stay zero while every cost is 1,
	// so the fast path and Release of a cost-1 request touch neither. The
	// running slots Stats reports are (Served + heavyServed) - (finished +
	// heavyFinished), the grants read before the releases (heavyServed
	// before slowServed): a request counts its grant before it can release,
	// so the result is never negative, and never above the slots the
	// requests in Served were granted (without costs, never above Served).
	fastServed    atomic.Uint64
	slowServed    atomic.Uint64
	finished      atomic.Uint64
	heavyServed   atomic.Uint64
	heavyFinished atomic.Uint64

	mu sync.Mutex

	// All fields below are guarded by mu. slowBit is set exactly when
	// room.n > 0 || closed || idle != nil (changed together, under mu).
	limits  Limits
	room    *waitroom // the waiters; 0 <= room.n <= limits.MaxQueue
	started bool
	closed  bool

	epoch   time.Time     // times are nanoseconds since epoch (monotonic)
	timer   *time.Timer   // AfterFunc(expire); nil when no waiter has a deadline
	timerAt int64         // deadline the timer is armed for; 0 when disarmed
	idle    chan struct{} // closed when running reaches 0; nil unless draining
	waiters sync.Pool     // of *waiter; see newWaiter

	// codel is Limits.CoDel compiled; nil when off, and then busySince is
	// neither written nor read. busySince is when the room last went from empty to not
	// empty: while room.n > 0 the queue has not emptied since, and it
	// stands from busySince + codel.interval on.
	codel     *codel
	busySince int64

	// step, when set, is called before each atomic step on state and
	// before taking mu; the interleaving tests use it to enumerate the
	// orders of those steps. Nil in production.
	step func(step)

	// The waitroom as Stats and Counts read it, without mu: settle writes
	// them under mu. pubs holds the last two publications of the room (length, oldest waiter,
	// split by priority); pubs[pubSeq%2] is the last complete one, and the
	// next is written into the other before pubSeq moves on to it. A reader
	// that finds pubSeq unchanged after reading a publication has read one
	// that nobody wrote meanwhile: the next writer of that half starts only
	// once pubSeq has moved. So Stats gets one consistent view, as of the
	// last section under mu, and never waits: not for mu, and not for a
	// writer stopped halfway (it writes the other half);
	// TestInterleavingsOfStats enumerates the orders of these reads against a
	// publication. pubVer is room.ver as of the last publication, guarded by
	// mu.
	pubs   [2]roomPub
	pubSeq atomic.Uint64
	pubVer uint64
}

// roomPub is one publication of the room for Stats. Every field is an
// atomic only so that a reader may race with the writer of the half it then
// discards.
type roomPub struct {
	queued   atomic.Int64
	oldestAt atomic.Int64 // arrival of the oldest waiter + 1; 0 when none
	// levels is the number of priorities waiting, whose (priority, count)
	// are in prio and count, in no order; -1 when there are more than
	// pubLevels, and the split is in many, sorted highest first.
	levels atomic.Int64
	prio   [pubLevels]atomic.Int64
	count  [pubLevels]atomic.Int64
	many   atomic.Pointer[[]PriorityCount]
}

// pubLevels is how many priorities a publication holds without allocating.
const pubLevels = 8

// codel is Limits.CoDel as the dispatcher uses it: the two budgets a waiter
// can have, in nanoseconds, each already capped by QueueTimeout, so at any
// moment one of them is every waiter's budget.
type codel struct {
	long     int64 // while the queue absorbs a burst: Interval, capped
	short    int64 // while it stands: Target, capped; never above long
	interval int64 // the queue stands once it has not emptied for this long
	lifo     bool  // while it stands, grant the newest waiter first
}

// newCoDel compiles c, whose defaults are filled in, for a QueueTimeout.
func newCoDel(c CoDel, timeout time.Duration) *codel {
	long, short := c.Interval, c.Target
	if timeout > 0 {
		long, short = min(long, timeout), min(short, timeout)
	}
	return &codel{long: int64(long), short: int64(short), interval: int64(c.Interval), lifo: c.LIFO}
}

// The fields of dispatcher.state.
const (
	slowBit    uint64 = 1 << 63
	runMask    uint64 = 1<<32 - 1
	limitShift        = 32
	limitMask  uint64 = 1<<31 - 1 // after the shift; MaxLimit fits
)

// running and limitOf read the fields of a state word.
func running(s uint64) int64 { return int64(s & runMask) }
func limitOf(s uint64) int64 { return int64(s >> limitShift & limitMask) }

// admits reports whether state s lets an arrival take a slot without mu.
func admits(s uint64) bool { return s&slowBit == 0 && running(s) < limitOf(s) }

// fits returns the slots a request of the given cost (at least 1) is granted
// in state s, its cost clamped to the limit of s, or 0 if they are not free.
// It ignores slowBit.
func fits(s uint64, cost int) uint64 {
	n := min(int64(cost), limitOf(s))
	if running(s)+n > limitOf(s) {
		return 0
	}
	return uint64(n)
}

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
}

// NewMemoryBackend returns the in-memory Backend that NewQueue uses when
// Config.Backend is nil: one process, strict FIFO within a priority and flow
// (unless CoDel.LIFO serves a standing queue newest first), no polling. It
// honours Limits.CoDel. It is a FastBackend and a LimitSetter. Other backends
// may use it as a local fallback. Like every Backend it serves one Queue: a
// second Start fails. Close and Drain work before Start too (after a NewQueue
// that refused its Config), and a Backend closed before it started starts
// no Queue.
func NewMemoryBackend() Backend { return &dispatcher{room: newWaitroom()} }

var (
	_ FastBackend = (*dispatcher)(nil)
	_ LimitSetter = (*dispatcher)(nil)
)

// Start implements Backend.
func (d *dispatcher) Start(l Limits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	d.lock()
	defer d.unlock()
	if d.started {
		return errors.New("ginqueue: this in-memory Backend already serves a Queue; give each Queue its own NewMemoryBackend()")
	}
	if d.closed {
		return errors.New("ginqueue: this in-memory Backend was closed before it started; make a new one with NewMemoryBackend()")
	}
	d.started = true
	d.limits = l
	d.state.Store(uint64(l.MaxConcurrent) << limitShift)
	d.epoch = time.Now()
	if l.CoDel != nil {
		d.codel = newCoDel(l.CoDel.withDefaults(), l.QueueTimeout)
	}
	if (l.QueueTimeout > 0 || d.codel != nil) && l.MaxQueue > 0 {
		d.timer = time.AfterFunc(time.Hour, d.expire)
		d.timer.Stop()
	}
	return nil
}

// Acquire implements Backend. It applies a.MaxAhead, and grants a.Cost slots
// (at least 1, at most the limit at the grant), carried in the Ticket.
//
// A slot it takes at once counts as a grant through Acquire, never as a
// fast one (Counts.Fast): the caller records the wait of what Acquire
// grants, so a fast count too would count the request twice.
func (d *dispatcher) Acquire(ctx context.Context, a Arrival) (Ticket, error) {
	if n := d.tryAcquireN(max(a.Cost, 1)); n != 0 {
		return Ticket{Cost: int(n)}, nil
	}
	return d.acquireSlow(ctx, a)
}

// TryAcquire implements FastBackend: it takes a slot without mu when one is
// free and slowBit is clear, and returns how many slots it has taken so far,
// this one included, or 0 if it took none.
func (d *dispatcher) TryAcquire() uint64 {
	for {
		d.at(stepFastLoad)
		st := d.state.Load()
		if !admits(st) {
			return 0
		}
		d.at(stepFastCAS)
		if d.state.CompareAndSwap(st, st+1) {
			return d.fastServed.Add(1)
		}
	}
}

// tryAcquireN is Acquire's TryAcquire: it takes the request's slots (its
// cost clamped to the limit) without mu when they are free and slowBit is
// clear, and returns how many it took, or 0. The grant counts as one through
// Acquire, not as a fast one: the Queue records its wait.
func (d *dispatcher) tryAcquireN(cost int) uint64 {
	for {
		d.at(stepFastLoad)
		st := d.state.Load()
		n := fits(st, cost)
		if st&slowBit != 0 || n == 0 {
			return 0
		}
		d.at(stepFastCAS)
		if d.state.CompareAndSwap(st, st+n) {
			d.served(n)
			return n
		}
	}
}

// served counts a grant of n slots kept through Acquire: the request, then
// its slots beyond the first. counts reads them the other way round, so the
// extra slots it sees belong to requests it counts.
func (d *dispatcher) served(n uint64) {
	d.slowServed.Add(1)
	if n > 1 {
		d.heavyServed.Add(n - 1)
	}
}

// acquireSlow is Acquire when the fast path failed: take the slots under mu
// if they are free and nobody waits, else wait for them, unless a.MaxAhead
// refuses.
func (d *dispatcher) acquireSlow(ctx context.Context, a Arrival) (Ticket, error) {
	cost := max(a.Cost, 1)
	d.lock()
	if d.closed {
		d.unlock()
		return Ticket{}, ErrClosed
	}
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
		if n := fits(st, cost); n != 0 {
			// The slots are free and nobody waits: take them. Only
			// releases can change state now, and they only free slots.
			d.at(stepSlowTake)
			d.state.Add(n)
			d.unlock()
			d.served(n)
			return Ticket{Cost: int(n)}, nil
		}
		break
	}
	if err := ctx.Err(); err != nil {
		// The client left before it could queue: take no place, and take
		// none from anybody else.
		d.unlock()
		return Ticket{}, err
	}
	if a.MaxAhead != 0 && d.tooFarBack(a, cost) {
		// Checked with the place taken, under one lock: a flood of
		// arrivals cannot all see the same short queue.
		d.unlock()
		return Ticket{}, errRejectedEarly
	}
	// With a waiter of cost above 1 in the room, free slots can wait for
	// it at the head: this arrival (or the eviction that makes its place)
	// may change the head, so look again once it is in.
	heavy := d.room.heavy > 0
	if !d.makeRoom(a) {
		d.unlock()
		return Ticket{}, ErrQueueFull
	}
	w := d.newWaiter(ctx, cost)
	d.push(w, a)
	if heavy || d.room.heavy > 0 {
		d.grantLocked()
	}
	d.unlock()

	select {
	case <-w.ready:
		var t Ticket
		err := w.err()
		if err == nil {
			t.Cost = w.cost
			d.served(uint64(w.cost))
		}
		w.ctx = nil
		d.waiters.Put(w)
		return t, err
	case <-ctx.Done():
	}

	d.lock()
	defer d.unlock()
	err := ctx.Err()
	switch w.state {
	case waiting:
		heavy := d.room.heavy > 0
		d.room.remove(w)
		if heavy {
			d.grantLocked() // w may have held the line
		}
	case granted:
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
	return Ticket{}, err
}

// tooFarBack reports whether a.MaxAhead refuses a (not 0): -1 if it would
// wait at all, n > 0 if n or more would be served before it, in the order
// of the moment (under CoDel's LIFO while the queue stands, newest first). One that
// would be granted at once, first in line with its slots free (a higher
// priority than a heavy head that waits for slots, say), is never refused.
// Requires d.mu.
func (d *dispatcher) tooFarBack(a Arrival, cost int) bool {
	lifo := false
	if c := d.codel; c != nil && c.lifo {
		lifo = d.standing(d.now())
	}
	ahead := d.room.ahead(a.Priority, a.Flow, lifo)
	if ahead == 0 && fits(d.state.Load(), cost) != 0 {
		return false
	}
	return a.MaxAhead < 0 || ahead >= a.MaxAhead
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
	return w
}

// wake gives a waiter that has left the room its fate. The send never blocks:
// ready has room for one, and a waiter is woken once per use. A waiter whose
// client has already left is not timed out, evicted or closed: that is not
// why it leaves. Requires d.mu.
func (d *dispatcher) wake(w *waiter, st waiterState) {
	if st != granted && w.ctx.Err() != nil {
		st = gone
	}
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
	case gone:
		return w.ctx.Err()
	default:
		return ErrClosed
	}
}

// Counts implements FastBackend. Running is the slots granted less those
// released, read in that order, so it is never negative, and never above the
// served count while every cost is 1 (see dispatcher.heavyServed).
func (d *dispatcher) Counts() Counts {
	c, _ := d.counts()
	return c
}

// counts is Counts and the served count, from one read of each counter.
func (d *dispatcher) counts() (c Counts, served uint64) {
	heavy := d.heavyServed.Load() // before slowServed: see served
	fast, slow := d.fastServed.Load(), d.slowServed.Load()
	finished, heavyDone := d.finished.Load(), d.heavyFinished.Load()
	return Counts{
		Running:  int(max(int64(fast+slow+heavy-finished-heavyDone), 0)),
		Queued:   int(d.pubs[d.pubSeq.Load()%2].queued.Load()),
		Limit:    int(limitOf(d.state.Load())),
		Fast:     fast,
		Finished: finished,
	}, fast + slow
}

// Release implements Backend: it gives back t.Cost slots (one for a Ticket
// of cost 0 or 1), those granted, whatever the limit is now.
func (d *dispatcher) Release(t Ticket) {
	n := uint64(1)
	if t.Cost > 1 {
		n = uint64(t.Cost)
		d.heavyFinished.Add(n - 1)
	}
	d.finished.Add(1)
	d.at(stepRelease)
	if d.state.Add(-n)&slowBit == 0 {
		return
	}
	d.lock()
	d.grantLocked()
	d.unlock()
}

// grantLocked wakes head waiters, in order, while the head's slots are free,
// and tells a drainer when none is held. A head whose slots are not all free
// holds the line: nobody behind it is granted. A waiter past its deadline is
// timed out, not granted. Under CoDel with LIFO, while the queue stands, the
// head is the newest waiter of the flow whose turn it is. Requires d.mu.
func (d *dispatcher) grantLocked() {
	now := int64(-1) // read the clock once, and only if a waiter is granted or LIFO may apply
	for d.room.n > 0 {
		lifo := false
		if c := d.codel; c != nil && c.lifo {
			if now < 0 {
				now = d.now()
			}
			lifo = d.standing(now)
		}
		n := d.grantable(d.room.peek(lifo))
		if n == 0 {
			break
		}
		// The budget before w leaves the room: with w the last waiter,
		// the room would look empty, and the queue not standing.
		var budget int64
		if d.timer != nil {
			if now < 0 {
				now = d.now()
			}
			budget = d.budget(now)
		}
		var w *waiter // the waiter peek returned
		if lifo {
			w = d.room.newest()
		} else {
			w = d.room.next()
		}
		if w.ctx.Err() != nil {
			// Its client left and it has not noticed yet: the slot goes to
			// the next waiter instead.
			d.wake(w, gone)
			continue
		}
		if d.timer != nil {
			if now-w.arrived >= budget {
				// Its deadline passed and the timer has not fired yet (a
				// loaded machine, or CoDel's budget shrank this instant):
				// it gets its 408, not the slot.
				d.wake(w, timedOut)
				continue
			}
		}
		d.at(stepGrantTake)
		d.state.Add(n) // the slots go to w
		w.cost = int(n)
		d.wake(w, granted)
	}
	if d.idle != nil && running(d.state.Load()) == 0 {
		close(d.idle)
		d.idle = nil
	}
}

// unlock ends a section under mu: it settles, then unlocks. Every section
// that may have changed the room, closed or idle ends here, so slowBit can
// never be left out of step.
func (d *dispatcher) unlock() {
	d.settle()
	d.mu.Unlock()
}

// settle ends every change made under mu: it sets slowBit exactly when
// something needs the slow path, and refreshes the mirrors Stats reads.
// Requires d.mu.
func (d *dispatcher) settle() {
	d.at(stepSettle)
	if d.room.n > 0 || d.closed || d.idle != nil {
		d.state.Or(slowBit)
	} else {
		d.state.And(^slowBit)
	}
	if d.room.ver != d.pubVer {
		d.publish()
	}
}

// publish writes the room into the half of pubs that readers are not
// reading, then makes it the last publication. O(P) for P priorities
// waiting; it allocates only when P > pubLevels. A field that already holds
// its value (from two publications ago) is not written again: on a hand-off
// the priorities and their number seldom change. Requires d.mu.
func (d *dispatcher) publish() {
	seq := d.pubSeq.Load() + 1
	p := &d.pubs[seq%2]
	store(&p.queued, int64(d.room.n))
	oldest := int64(0)
	if w := d.room.all.first; w != nil {
		oldest = w.arrived + 1
	}
	store(&p.oldestAt, oldest)
	d.at(stepPublish)
	if levels := d.room.high.items; len(levels) <= pubLevels {
		for i, l := range levels {
			store(&p.prio[i], int64(l.prio))
			store(&p.count[i], int64(l.n))
		}
		store(&p.levels, int64(len(levels)))
		if p.many.Load() != nil {
			p.many.Store(nil)
		}
	} else {
		split := d.room.byPriority()
		sortByPriority(split)
		p.many.Store(&split)
		p.levels.Store(-1)
	}
	d.at(stepPublish)
	d.pubSeq.Store(seq)
	d.pubVer = d.room.ver
}

// store writes v to a unless a holds it already (a load is cheaper than a
// store). Only for fields with one writer.
func store(a *atomic.Int64, v int64) {
	if a.Load() != v {
		a.Store(v)
	}
}

// sortByPriority sorts a split highest priority first.
func sortByPriority(split []PriorityCount) {
	slices.SortFunc(split, func(a, b PriorityCount) int { return cmp.Compare(b.Priority, a.Priority) })
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
	if d.codel != nil && d.room.n == 0 {
		d.busySince = w.arrived
	}
	d.room.push(w, a.Priority, a.Flow)
	if d.timer != nil && d.timerAt == 0 {
		d.arm(d.wakeAt(w.arrived))
	}
}

// budget is how long a waiter may wait, as of now: QueueTimeout, or under
// CoDel the budget of the queue's state now. Every waiter has the same, so
// the oldest waiter is always the first to run out. Requires d.mu.
func (d *dispatcher) budget(now int64) int64 {
	c := d.codel
	if c == nil {
		return int64(d.limits.QueueTimeout)
	}
	if d.standing(now) {
		return c.short
	}
	return c.long
}

// standing reports whether, under CoDel, the queue stands at now: it has
// waiters and has not emptied for a whole interval. Requires d.mu.
func (d *dispatcher) standing(now int64) bool {
	return d.room.n > 0 && now-d.busySince >= d.codel.interval
}

// wakeAt is when the timer must fire next for the waiters queued at now:
// the oldest waiter's deadline under the budget now, or, under CoDel, the
// moment the queue starts standing if that is sooner, since the budget
// shrinks from long to short then and every waiter's deadline moves with
// it. That is enough for one timer: between two such moments the budget is
// fixed, so arrival order is deadline order and only the head can be due.
// Once the queue stands, only its emptying changes the budget, and that
// lengthens it (the room is then empty: nobody to expire), so the timer
// never fires late; it may fire early (the head left, or the room emptied
// and filled again), and then it re-arms. Saturates: a budget of centuries
// means never, not the past. Requires d.mu and room.n > 0.
func (d *dispatcher) wakeAt(now int64) int64 {
	at := addSat(d.room.all.first.arrived, d.budget(now))
	// With LIFO the moment matters even when the budgets are equal: the
	// head changes to the newest waiter then.
	if c := d.codel; c != nil && (c.short < c.long || c.lifo) && !d.standing(now) {
		at = min(at, addSat(d.busySince, c.interval))
	}
	return at
}

// addSat is a + b for b >= 0, or math.MaxInt64 if that overflows.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
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
	d.lock()
	defer d.unlock()
	d.timerAt = 0
	if d.closed {
		return
	}
	now := d.now()
	heavy := d.room.heavy > 0
	// One budget for the whole sweep: removing waiters cannot make the queue
	// stand or stop standing until it is empty, and then the sweep ends.
	budget := d.budget(now)
	for w := d.room.all.first; w != nil && now-w.arrived >= budget; w = d.room.all.first {
		d.finish(w, timedOut)
	}
	if d.room.n > 0 {
		d.arm(d.wakeAt(now))
	}
	if heavy {
		d.grantLocked() // a waiter that held the line may have gone
	}
}

// SetLimit implements LimitSetter. Raising the limit wakes waiters at once;
// lowering it lets running requests finish and admits nobody until the head
// waiter's slots fit beside those still held. Tickets granted before keep
// the cost they were granted, and Release gives back exactly that.
func (d *dispatcher) SetLimit(n int) error {
	if err := CheckLimit(n); err != nil {
		return err
	}
	d.lock()
	defer d.unlock()
	d.at(stepSetLimit)
	// Only SetLimit changes the limit field, under mu: adding the difference
	// moves it without disturbing the other fields.
	d.state.Add(uint64(int64(n)-limitOf(d.state.Load())) << limitShift)
	d.grantLocked()
	return nil
}

// Stats implements Backend. It never waits for mu: the counts come from
// atomics, and Queued, OldestWait and the split by priority from the last
// publication of the room (see dispatcher.pubs), one consistent view as of
// the last section under mu.
func (d *dispatcher) Stats() BackendStats {
	c, served := d.counts()
	st := BackendStats{Running: c.Running, Limit: c.Limit, Served: served}
	var split [pubLevels]PriorityCount
	var many *[]PriorityCount
	var queued, oldest, levels int64
	for try := 1; ; try++ {
		seq := d.pubSeq.Load()
		p := &d.pubs[seq%2]
		d.at(stepStatsRead)
		queued, oldest = p.queued.Load(), p.oldestAt.Load()
		d.at(stepStatsRead)
		levels = p.levels.Load()
		if levels < 0 {
			many = p.many.Load()
		} else {
			for i := range min(levels, pubLevels) {
				split[i] = PriorityCount{Priority: int(p.prio[i].Load()), Queued: int(p.count[i].Load())}
			}
		}
		if d.at(stepStatsSeq); d.pubSeq.Load() == seq {
			break // nobody wrote that half while it was read
		}
		if try%16 == 0 {
			runtime.Gosched() // publications keep coming: let them pass
		}
	}
	if queued == 0 {
		return st // nobody waits: no split
	}
	st.Queued = int(queued)
	st.OldestWait = time.Duration(max(d.now()-(oldest-1), 0))
	if levels < 0 {
		st.QueuedByPriority = slices.Clone(*many)
	} else {
		st.QueuedByPriority = slices.Clone(split[:levels])
		sortByPriority(st.QueuedByPriority)
	}
	return st
}

// Close implements Backend.
func (d *dispatcher) Close() error {
	d.lock()
	defer d.unlock()
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
	return nil
}

// Drain implements Backend.
func (d *dispatcher) Drain(ctx context.Context) error {
	d.lock()
	if d.idle == nil {
		d.idle = make(chan struct{})
		d.settle() // from here on every Release takes mu and sees idle
	}
	idle := d.idle
	d.grantLocked() // closes idle at once if nothing runs
	d.unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// grantable returns the slots w is granted now, or 0 if they are not free.
// Requires d.mu: the limit cannot move before they are added.
func (d *dispatcher) grantable(w *waiter) uint64 {
	d.at(stepGrantRead)
	return fits(d.state.Load(), w.cost)
}

// step names an atomic step for the interleaving tests.
type step uint8

const (
	stepNone step = iota
	stepStart
	stepLock
	stepFastLoad
	stepFastCAS
	stepRelease
	stepSlowLoad
	stepSlowMark
	stepSlowTake
	stepGrantRead
	stepGrantTake
	stepSettle
	stepSetLimit
	stepPublish   // a publication half written, and written before pubSeq moves to it
	stepStatsSeq  // Stats, before it reads pubSeq again
	stepStatsRead // Stats, between its reads of a publication
)

// at reports step s to the interleaving tests.
func (d *dispatcher) at(s step) {
	if d.step != nil {
		d.step(s)
	}
}

// lock takes mu, after telling the interleaving tests.
func (d *dispatcher) lock() {
	d.at(stepLock)
	d.mu.Lock()
}
