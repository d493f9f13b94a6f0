package ginqueue

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// Estimates of the wait ahead: RejectEarly's refusal and the Retry-After
// header, both from the time a slot is held.

// serviceEvery: one in this many requests served at once is timed.
const serviceEvery = 16

// load reads the Backend's slots and queue now (Running, Queued and Limit),
// cheaply for the in-memory one (no split by priority, no
// allocation).
func (q *Queue) load() backend.Stats {
	if q.fast != nil {
		return q.fast.Counts()
	}
	b := q.backend.Stats()
	return backend.Stats{Running: b.Running, Queued: b.Queued, Limit: b.Limit}
}

// progress is the fast path's counts, read once: ServedAtOnce, the requests served
// without waiting (which record no wait), Released and Held. Without a fast
// path, only Released, which the Queue counts itself.
func (q *Queue) progress() backend.Stats {
	if q.fast != nil {
		return q.fast.Counts()
	}
	return backend.Stats{Released: q.finished.Load()}
}

// errRejectedEarly is ErrQueueFull for RejectEarly.
var errRejectedEarly = fmt.Errorf("%w: the expected wait exceeds QueueTimeout or the client's deadline", backend.ErrQueueFull)

// maxAhead is RejectEarly's bound, as Arrival.MaxAhead, for slots of the
// given limit and an arrival that may wait left (see timeLeft). An arrival
// whose expected wait, (ahead + 1) × slot time / limit, would exceed left
// has at least left × limit / slot time waiters ahead. The slot time is
// the measured mean of handler time × slots held. So with Config.Cost the
// waiters ahead count as requests of the mix served so far, whatever each
// of them costs.
//
// It is zero, no bound, with RejectEarly off or before a handler time is
// measured, so nobody is refused on a guess. It is -1 when even the first
// waiter would wait too long. That needs no measure when left is zero or
// less, as when a positive Config.MinTimeLeft exceeds the time left.
func (q *Queue) maxAhead(limit int, left time.Duration) int {
	if !q.rejectEarly {
		return 0
	}
	if left <= 0 {
		return -1
	}
	perSlot, ok := q.service.mean()
	if !ok || perSlot <= 0 {
		return 0
	}
	n := math.Floor(float64(left) * float64(q.servingLimit(limit)) / float64(perSlot))
	switch {
	case !(n < math.MaxInt32):
		return 0
	case n < 1:
		return -1
	}
	return int(n)
}

// tooFarBack applies maxAhead's bound for a Backend that is not a
// FastBackend, from its Stats b: the waiters of a's priority or higher. An
// arrival that finds a free slot and nobody waiting would not wait, so no
// bound refuses it (Arrival.MaxAhead's rule).
func (q *Queue) tooFarBack(a backend.Arrival, left time.Duration, b backend.Stats) bool {
	if b.Queued == 0 && b.Running < b.Limit {
		return false
	}
	m := q.maxAhead(b.Limit, left)
	return m < 0 || m > 0 && aheadIn(b, a) >= m
}

// aheadIn is the number of waiters of a Backend other than the in-memory
// one that would be served before a: those of a's priority or higher (the
// in-memory one also counts the turns of flows exactly).
func aheadIn(b backend.Stats, a backend.Arrival) int {
	if b.QueuedByPriority == nil {
		return b.Queued
	}
	n := 0
	for _, p := range b.QueuedByPriority {
		if p.Priority >= a.Priority {
			n += p.Queued
		}
	}
	return n
}

// drainTime is how long limit slots take to serve n requests of perSlot
// each, saturating instead of overflowing.
func drainTime(n int, perSlot time.Duration, limit int) time.Duration {
	d := float64(n) * float64(perSlot) / float64(max(limit, 1))
	if !(d < math.MaxInt64) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(d)
}

// retryAfterNow is the Retry-After for a request turned away now, in whole
// seconds, at least one: how long the slots take to serve the queue at the
// measured slot time, and never more than QueueTimeout, by which time
// every waiter now has left. Config.RetryAfter until a timed request has
// finished.
func (q *Queue) retryAfterNow() string {
	perSlot, ok := q.service.mean()
	if !ok {
		return q.retryAfter
	}
	l := q.load()
	secs := math.Ceil(drainTime(l.Queued+1, perSlot, q.servingLimit(l.Limit)).Seconds())
	if q.timeout > 0 {
		// Whole seconds, rounded down: a header above QueueTimeout would
		// send clients back later than every waiter has gone.
		secs = min(secs, math.Floor(q.timeout.Seconds()))
	}
	return strconv.Itoa(int(max(secs, 1)))
}

// servingLimit is the limit the slots serve at, for estimates: the Backend's
// limit, or with Adaptive the limit outside probes (a probe holds MinLimit
// for a few samples only).
func (q *Queue) servingLimit(limit int) int {
	if q.adaptive != nil {
		return int(q.adaptive.steady.Load())
	}
	return limit
}

// drainMeter measures how fast requests finish, from samples of the
// backend's completed count taken when someone asks (never on the fast
// path).
type drainMeter struct {
	mu      sync.Mutex
	samples [drainWindow / drainSpacing]drainSample // ring, guarded by mu
	next    int
	n       int
}

type drainSample struct {
	at   time.Time
	done uint64
}

const (
	drainWindow = 10 * time.Second
	// drainSpacing spreads the ring's samples over the whole window: closer
	// samples would push the older ones out and shorten it.
	drainSpacing = drainWindow / 16
)

// rate returns finished requests per second over about the last ten
// seconds, and false until a request has finished.
func (m *drainMeter) rate(now time.Time, done uint64) (float64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 || now.Sub(m.samples[(m.next+len(m.samples)-1)%len(m.samples)].at) >= drainSpacing {
		m.samples[m.next] = drainSample{at: now, done: done}
		m.next = (m.next + 1) % len(m.samples)
		m.n = min(m.n+1, len(m.samples))
	}
	// The base is the oldest sample within the window, or else the newest
	// sample older than it: a rate over a longer span is still a rate.
	var base *drainSample
	for k := 1; k <= m.n; k++ {
		s := &m.samples[(m.next+len(m.samples)-k)%len(m.samples)]
		if s.done > done || !s.at.Before(now) {
			continue
		}
		base = s
		if now.Sub(s.at) > drainWindow {
			break
		}
	}
	if done == 0 {
		return 0, false
	}
	if base == nil {
		return 0, true
	}
	return float64(done-base.done) / now.Sub(base.at).Seconds(), true
}

// serviceMeter estimates the slot time of a request: its handler time ×
// the slots it held, one without Config.Cost. Its samples are every request
// that went through Acquire and one in serviceEvery of the others. Requests
// go through Acquire when they wait, and with Config.Cost when they cost
// more than 1.
//
// Each sample weighs as many requests as it represents: serviceEvery for
// the fast path, one for Acquire. Unweighted, heavy requests, which are all
// timed, would outweigh light ones served at once serviceEvery to one, and
// RejectEarly would refuse a queue of light ones that fits. Limit over the
// estimate is the rate at which the slots serve requests of the mix seen,
// whatever the demand was. It is a per-request average, not a per-second
// one, so an idle period changes nothing: the first burst after it is
// judged by the handler times seen last.
type serviceMeter struct {
	mu sync.Mutex
	// The fields below are guarded by mu. sum is the samples' seconds × the
	// requests each represents, and reqs the requests they represent; both
	// decay together. n is the samples so far, up to serviceWeight.
	sum  float64
	reqs float64
	n    int
}

// serviceWeight: the estimate is the weighted mean of the first samples,
// then an exponentially weighted one that takes 1/serviceWeight off the
// weight of the older samples at each new one. With samples of one weight it
// is their mean, then an average that gives a new sample 1/serviceWeight.
const serviceWeight = 16

// sample adds the handler time d of one timed request that held slots
// slots and represents of requests: its path timed one in of.
func (m *serviceMeter) sample(d time.Duration, slots, of int) {
	x := max(d, 0).Seconds() * float64(slots)
	w := float64(max(of, 1))
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n < serviceWeight {
		m.n++
	} else {
		m.sum -= m.sum / serviceWeight
		m.reqs -= m.reqs / serviceWeight
	}
	m.sum += w * x
	m.reqs += w
}

// mean returns the estimated slot time of a request, and false until a
// timed request has finished.
func (m *serviceMeter) mean() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 {
		return 0, false
	}
	return time.Duration(m.sum / m.reqs * float64(time.Second)), true
}

// tooFarBack reports whether a.MaxAhead, which is not 0, refuses a. A
// MaxAhead of -1 refuses it if it would wait at all. One of n > 0 refuses it
// if n or more would be granted before it, in the order of grants now: under
// CoDel's LIFO, while the queue is standing, newest first. An arrival that would
// be granted at once, first in order with its slots free, is never refused.
// That can happen while others wait: for an arrival of a higher priority
// than a heavy head that waits for its slots, say. Requires d.mu.
func (d *dispatcher) tooFarBack(a backend.Arrival, cost int) bool {
	lifo := false
	if c := d.codel; c != nil && c.lifo {
		lifo = d.standing(d.now())
	}
	ahead := d.room.ahead(a.Priority, a.Flow, lifo)
	if ahead == 0 && d.fits(d.state.Load(), cost) != 0 {
		return false
	}
	return a.MaxAhead < 0 || ahead >= a.MaxAhead
}
