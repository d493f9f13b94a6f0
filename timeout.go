package ginqueue

import (
	"math"
	"time"
)

// How long a waiter may wait, and the one timer that answers those who have
// waited that long.

// maxWait is how long a waiter may wait, as of now: QueueTimeout, or under
// CoDel the maximum wait of the queue's state now. Every waiter has the
// same, so the oldest waiter is always the first to run out. Requires d.mu.
func (d *dispatcher) maxWait(now int64) int64 {
	c := d.codel
	if c == nil {
		return int64(d.limits.QueueTimeout)
	}
	if d.standing(now) {
		return c.short
	}
	return c.long
}

// wakeAt is when the timer must fire next for the waiters queued at now.
// That is the oldest waiter's expiry under the maximum wait now. Under
// CoDel it is the moment the queue starts standing, if that is sooner: the
// maximum wait then shrinks from long to short, and every expiry moves with
// it.
//
// One timer is enough. Between two such moments the maximum wait is fixed,
// so arrival order is expiry order and only the head can be due. Once the
// queue is standing, only its emptying changes the maximum wait. That lengthens
// it, and the room is then empty, with nobody to expire. So the timer never
// fires late. It may fire early, when the head left or the room emptied and
// filled again, and then it re-arms. The sum saturates: a maximum wait of
// centuries means never, not the past. Requires d.mu and room.n > 0.
func (d *dispatcher) wakeAt(now int64) int64 {
	at := addSat(d.room.all.first.arrived, d.maxWait(now))
	// With LIFO the moment matters even when the maximum waits are equal: the
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

// arm sets the timer to fire at deadline, a waiter's expiry. Requires d.mu.
func (d *dispatcher) arm(deadline int64) {
	d.timerAt = deadline
	d.timer.Reset(time.Duration(deadline - d.now()))
}

func (d *dispatcher) now() int64 { return int64(time.Since(d.epoch)) }

// expire answers every waiter whose expiry has passed and re-arms the timer
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
	// One maximum wait for the whole sweep: removing waiters cannot make the
	// queue stand or stop standing until it is empty, and then the sweep
	// ends.
	maxWait := d.maxWait(now)
	for w := d.room.all.first; w != nil && now-w.arrived >= maxWait; w = d.room.all.first {
		d.finish(w, timedOut)
	}
	if d.room.n > 0 {
		d.arm(d.wakeAt(now))
	}
	if heavy {
		d.grantLocked() // a heavy head that held up the others may have gone
	}
}
