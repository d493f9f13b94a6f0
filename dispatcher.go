package ginqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
)

// dispatcher is the in-memory Backend: a counting semaphore with a bounded
// queue of waiters, granted from the releasing goroutine. It knows nothing
// of HTTP or gin. docs/internals.md says how it decides and why.
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
	// is lost. The interleaving tests enumerate every order of these steps,
	// SetLimit's included, and check the limit after each.
	state atomic.Uint64

	tallies

	mu sync.Mutex

	// All fields below are guarded by mu. slowBit is set exactly when
	// room.n > 0 || closed || idle != nil (changed together, under mu).
	limits  backend.Limits
	room    *waitroom // the waiters; 0 <= room.n <= limits.MaxQueue
	started bool
	closed  bool

	epoch   time.Time     // times are nanoseconds since epoch (monotonic)
	timer   *time.Timer   // AfterFunc(expire); nil when no waiter can expire
	timerAt int64         // the expiry the timer is armed for; 0 when disarmed
	idle    chan struct{} // closed when running reaches 0; nil unless draining
	waiters sync.Pool     // of *waiter; see newWaiter

	// codel is the CoDel of Limits compiled; nil when off, and then busySince is
	// neither written nor read. busySince is when the room last went from
	// empty to not empty: while room.n > 0 the queue has not emptied since,
	// and it is standing from busySince + codel.interval on.
	codel     *codel
	busySince int64

	// step, when set, is called before each atomic step on state and
	// before taking mu; the interleaving tests use it to enumerate the
	// orders of those steps. Nil in production.
	step func(step)

	// The waitroom as Stats and Counts read it, without mu: settle writes
	// them under mu. pubs holds the last two publications of the room
	// (length, oldest waiter, split by priority); pubs[pubSeq%2] is the last
	// complete one, and the next is written into the other before pubSeq
	// moves on to it. A reader that finds pubSeq unchanged after reading a
	// publication has read one that nobody wrote meanwhile: the next writer
	// of that half starts only once pubSeq has moved. So Stats gets one
	// consistent view, as of the last section under mu, and never waits: not
	// for mu, and not for a writer stopped halfway (it writes the other
	// half); the interleaving tests enumerate the orders of these reads
	// against a publication. pubVer is room.ver as of the last publication,
	// guarded by mu.
	pubs   [2]roomPub
	pubSeq atomic.Uint64
	pubVer uint64

	// leaseEnd is when granting stops (see SetLease), in nanoseconds since
	// epoch; 0 when it never does. clampTo is the most slots one grant
	// takes; 0 means the limit. Both written under mu, read anywhere.
	leaseEnd atomic.Int64
	clampTo  atomic.Int64

	// The waiters answered in the current section under mu, linked through
	// wakeNext, whose wake-ups settle sends once the publication is done.
	// Guarded by mu.
	wakeFirst, wakeLast *waiter
}

// tallies are the dispatcher's counters that only grow, for Stats.
type tallies struct {
	// Counters that only grow, for Stats. All three of fastServed,
	// slowServed and finished count requests. fastServed counts those the
	// fast path admitted. slowServed counts the grants kept through
	// Acquire, whether the slots were taken at once or handed to a waiter
	// that kept them. finished counts the Releases. Served is fastServed +
	// slowServed. heavyServed and heavyFinished count the slots beyond the
	// first of each grant kept and of each Release. They stay zero while
	// every cost is 1, so the fast path and the Release of a cost-1 request
	// touch neither.
	//
	// The running slots Stats reports are (Served + heavyServed) -
	// (finished + heavyFinished). counts reads the grants before the
	// releases, and heavyServed before slowServed. A request counts its
	// grant before it can release, so the result is never negative. Nor is
	// it ever above the slots granted to the requests in Served, which
	// without costs means never above Served.
	fastServed    atomic.Uint64
	slowServed    atomic.Uint64
	finished      atomic.Uint64
	heavyServed   atomic.Uint64
	heavyFinished atomic.Uint64
}

var (
	_ backend.FastPather  = (*dispatcher)(nil)
	_ backend.FastBackend = (*dispatcher)(nil)
	_ backend.LimitSetter = (*dispatcher)(nil)
	_ inmem.Sharer        = (*dispatcher)(nil)
)

// FastPath implements backend.FastPather: the in-memory Backend is its own
// fast path.
func (d *dispatcher) FastPath() backend.FastBackend { return d }

// Start implements Backend.
func (d *dispatcher) Start(l backend.Limits) error {
	if err := checkLimits(l, codelOf(l), "Limits"); err != nil {
		return err
	}
	d.lock()
	defer d.unlock()
	if d.started {
		return errors.New("ginqueue: this in-memory Backend already serves a Queue; give each Queue its own")
	}
	if d.closed {
		return errors.New("ginqueue: this in-memory Backend was closed before it started; make a new one")
	}
	d.started = true
	d.limits = l
	d.state.Store(uint64(l.MaxConcurrent) << limitShift)
	d.epoch = time.Now()
	if cd := codelOf(l); cd != nil {
		d.codel = newCoDel(cd.withDefaults(), l.QueueTimeout)
	}
	if (l.QueueTimeout > 0 || d.codel != nil) && l.MaxQueue > 0 {
		d.timer = time.AfterFunc(time.Hour, d.expire)
		d.timer.Stop()
	}
	return nil
}

// unlock ends a section under mu: it settles, then unlocks. Every section
// that may have changed the room, closed or idle ends here, so slowBit can
// never be left out of step.
func (d *dispatcher) unlock() {
	d.settle()
	d.mu.Unlock()
}

// settle ends every change made under mu, in this order: it refreshes the
// publication Stats reads, sends the wake-ups of the waiters the section
// answered, then sets slowBit exactly when something needs the slow path.
// A woken waiter may return and answer its request at once, and a release
// that finds slowBit clear skips mu: either comes after a publication that
// no longer shows the waiters that left. Requires d.mu.
func (d *dispatcher) settle() {
	if d.room.ver != d.pubVer {
		d.publish()
	}
	d.sendWakeUps()
	d.at(stepSettle)
	if d.room.n > 0 || d.closed || d.idle != nil {
		d.state.Or(slowBit)
	} else {
		d.state.And(^slowBit)
	}
}

// sendWakeUps sends the wake-ups that wake queued, in the order queued
// (see settle). Requires d.mu.
func (d *dispatcher) sendWakeUps() {
	for d.wakeFirst != nil {
		w := d.wakeFirst
		d.at(stepWake)
		d.wakeFirst, w.wakeNext = w.wakeNext, nil
		w.ready <- struct{}{} // after this, w may be pooled and reused
	}
	d.wakeLast = nil
}

// SetLimit implements LimitSetter. Raising the limit grants waiters at
// once; lowering it lets running requests finish and grants nobody until
// the head waiter's slots fit beside those still held. A Ticket keeps the
// cost it was granted, and Release gives back exactly that.
func (d *dispatcher) SetLimit(n int) error {
	if err := backend.CheckLimit(n); err != nil {
		return err
	}
	return d.setLimit(n)
}

// SetShare implements inmem.Sharer: SetLimit, for n from 0. With a limit of
// 0 no slot fits (see fits), so every arrival waits.
func (d *dispatcher) SetShare(n int) error {
	if n < 0 || n > backend.MaxLimit {
		return fmt.Errorf("ginqueue: share must be in [0, %d], got %d", backend.MaxLimit, n)
	}
	return d.setLimit(n)
}

// SetLease implements inmem.Sharer. A lease renewed grants the waiters its
// end held back.
func (d *dispatcher) SetLease(until time.Time, fleet int) {
	d.lock()
	defer d.unlock()
	end := int64(0)
	if !until.IsZero() {
		end = max(int64(until.Sub(d.epoch)), 1)
	}
	d.leaseEnd.Store(end)
	d.clampTo.Store(int64(max(min(fleet, backend.MaxLimit), 0)))
	d.grantLocked()
}

// leaseOver reports whether the lease set by SetLease has run out: then
// nothing is granted.
func (d *dispatcher) leaseOver() bool {
	end := d.leaseEnd.Load()
	return end != 0 && d.now() >= end
}

// setLimit moves the limit to n, checked by the caller.
func (d *dispatcher) setLimit(n int) error {
	d.lock()
	defer d.unlock()
	d.at(stepSetLimit)
	// Only SetLimit changes the limit field, under mu: adding the difference
	// moves it without disturbing the other fields.
	d.state.Add(uint64(int64(n)-limitOf(d.state.Load())) << limitShift)
	d.grantLocked()
	return nil
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
