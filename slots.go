package ginqueue

import (
	"runtime"

	"github.com/ginqueue/ginqueue/backend"
)

// The slot word and the fast path: every admission decision is one atomic
// step on dispatcher.state, and a request that finds a slot free and nobody
// waiting takes it without the mutex.

// The fields of dispatcher.state.
const (
	slowBit    uint64 = 1 << 63
	runMask    uint64 = 1<<32 - 1
	limitShift        = 32
	limitMask  uint64 = 1<<31 - 1 // after the shift; backend.MaxLimit fits
)

// running and limitOf read the fields of a state word.
func running(s uint64) int64 { return int64(s & runMask) }

func limitOf(s uint64) int64 { return int64(s >> limitShift & limitMask) }

// admits reports whether state s lets an arrival take a slot without mu.
func admits(s uint64) bool { return s&slowBit == 0 && running(s) < limitOf(s) }

// fits returns the slots a request of the given cost (at least 1) is granted
// in state s, its cost clamped to the limit of s (or to clampTo, when set),
// or 0 if they are not free or the lease is over. It ignores slowBit.
func (d *dispatcher) fits(s uint64, cost int) uint64 {
	most := limitOf(s)
	if c := d.clampTo.Load(); c > 0 {
		most = c
	}
	n := min(int64(cost), most)
	if running(s)+n > limitOf(s) || d.leaseOver() {
		return 0
	}
	return uint64(n)
}

// TryAcquire implements FastBackend: it takes a slot without mu when one is
// free and slowBit is clear, and returns how many slots it has taken so far,
// this one included, or 0 if it took none.
func (d *dispatcher) TryAcquire() uint64 {
	for {
		d.at(stepFastLoad)
		st := d.state.Load()
		if !admits(st) || d.leaseOver() {
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
		n := d.fits(st, cost)
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

// Counts implements FastBackend. Running is the slots granted less those
// released, read in that order, so it is never negative, and never above the
// served count while every cost is 1 (see dispatcher.heavyServed).
func (d *dispatcher) Counts() backend.Stats {
	c, _ := d.counts()
	return c
}

// counts is Counts and the served count, from one read of each counter.
func (d *dispatcher) counts() (c backend.Stats, served uint64) {
	heavy := d.heavyServed.Load() // before slowServed: see served
	fast, slow := d.fastServed.Load(), d.slowServed.Load()
	finished, heavyDone := d.finished.Load(), d.heavyFinished.Load()
	return backend.Stats{
		Running:      int(max(int64(fast+slow+heavy-finished-heavyDone), 0)),
		Queued:       int(d.pubs[d.pubSeq.Load()%2].queued.Load()),
		Limit:        int(limitOf(d.state.Load())),
		ServedAtOnce: fast,
		Released:     finished,
		Held:         int(running(d.state.Load())),
	}, fast + slow
}

// Release implements Backend: it gives back t.Cost slots (one for a Ticket
// of cost 0 or 1), those granted, whatever the limit is now.
func (d *dispatcher) Release(t backend.Ticket) {
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
	granted := d.grantLocked()
	d.unlock()
	if granted {
		// Yield: the waiter just granted was made runnable on this P, where
		// it would wait for this goroutine to write its response and block,
		// and another P does not take it from there at once. Yielding runs
		// it now, so the slot does not sit idle meanwhile. The benchmark of
		// the saturated hand-off shows the difference.
		d.at(stepYield)
		runtime.Gosched()
	}
}
