// Package backend is the contract between a ginqueue Queue and the Backend
// that admits its requests. Applications do not need it: a Queue uses an
// in-memory Backend unless Config.Backend names another, such as the one of
// the redisqueue module. It is for those who write a Backend.
package backend

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors a Backend returns from Acquire. The Queue turns each into its own
// outcome, counter and response.
var (
	// ErrQueueFull means the request found no free slot and no place to
	// wait in, or was refused a place.
	ErrQueueFull = errors.New("ginqueue: queue full")
	// ErrQueueTimeout means the request waited its maximum wait without
	// being granted.
	ErrQueueTimeout = errors.New("ginqueue: queue timeout")
	// ErrClosed means the Backend was closed before the request was granted.
	ErrClosed = errors.New("ginqueue: closed")
)

// MaxLimit is the largest value the limit, MaxConcurrent and MaxQueue can
// take: counts derived from them never overflow an int on any platform.
const MaxLimit = 1 << 30

// CheckLimit returns an error naming n unless it can be the limit: from 1
// to MaxLimit.
func CheckLimit(n int) error {
	if n < 1 || n > MaxLimit {
		return fmt.Errorf("ginqueue: limit must be in [1, %d], got %d", MaxLimit, n)
	}
	return nil
}

// Limits are the parts of a Queue's Config that a Backend enforces. The
// Queue checks them before it calls Start.
type Limits struct {
	MaxConcurrent   int           // the limit to start with: at least 1, at most MaxLimit
	MaxQueue        int           // zero: no waiting room; at most MaxLimit
	QueueTimeout    time.Duration // zero: no timeout
	MaxQueuePerFlow int           // zero: no cap per flow; at most MaxQueue
	// Weighted is set when an Arrival may ask for more than one slot
	// (Arrival.Cost). A Backend that counts every request as one slot must
	// refuse it in Start rather than ignore the costs.
	Weighted bool
	// CoDelTarget, CoDelInterval and CoDelLIFO are the Queue's CoDel
	// setting, its defaults filled in; CoDel is off when all three are zero.
	// A Backend that cannot honour CoDel must refuse it in Start rather than
	// ignore it.
	CoDelTarget, CoDelInterval time.Duration
	CoDelLIFO                  bool
}

// Arrival describes a request asking for slots. The zero value is a request
// of priority 0 in the single default flow, with no bound on its wait. The
// Queue builds one only for a request that goes through Acquire: a request
// that a fast path's TryAcquire admitted has none.
type Arrival struct {
	// Priority orders waiters: higher is granted first.
	Priority int
	// Flow names the flow the request belongs to, for fair queuing between
	// flows. Empty is the default flow.
	Flow string
	// MaxAhead bounds how many waiters may be granted before this request,
	// counted when it arrives. Above zero, the request is refused with
	// ErrQueueFull if MaxAhead or more would be; below zero, if it would wait
	// at all; zero means no bound. A request that finds its slots free runs
	// whatever MaxAhead says. A FastBackend applies it; for other Backends
	// the Queue applies it from Stats.
	MaxAhead int
	// Cost is how many slots the request holds while it runs. Zero or below
	// means 1; above 1 only when Limits.Weighted is set. A cost above the
	// limit is granted as the whole limit, and a head waiter whose slots are
	// not all free lets nobody of its priority past it.
	Cost int
	// MinTimeLeft is the least time the request needs before its context's
	// deadline once it is granted: a waiter whose deadline is nearer than
	// that when its turn comes is answered ErrQueueTimeout at once. Zero or
	// below, or a context without a deadline: no such check. A Backend that
	// cannot honour it may ignore it.
	MinTimeLeft time.Duration
}

// Ticket is what a Backend hands out with a grant and takes back on Release.
// Its ID and Cost belong to the Backend; the Queue passes it back untouched.
type Ticket struct {
	ID uint64
	// Cost is the number of slots the Ticket holds, as granted, so that
	// Release gives back exactly those whatever the limit is by then. Zero
	// means one: the Ticket{} that gives back a slot of TryAcquire.
	Cost int
}

// Stats is what a Backend reports of its slots and queue. Running, Held and
// Limit count slots; Queued, Served, ServedAtOnce and Released count
// requests.
// Counters only grow.
type Stats struct {
	Running int // slots held by running requests, never above what Served was granted
	Queued  int // requests waiting for slots
	Limit   int // slots in all
	// Served counts the requests granted since Start, whatever their cost.
	// A grant that Acquire took back (its caller left in the same instant)
	// does not count.
	Served uint64
	// QueuedByPriority splits Queued by priority, highest first; nil when
	// nobody waits, and always nil from FastBackend.Counts.
	QueuedByPriority []PriorityCount
	// OldestWait is how long the oldest waiter has waited; zero when nobody
	// waits, when the Backend cannot tell, and from FastBackend.Counts.
	OldestWait time.Duration
	// Unavailable is set while the Backend cannot reach the store it shares
	// with other replicas and applies its fallback policy instead.
	Unavailable bool
	// Outages counts the times the Backend turned Unavailable since Start.
	Outages uint64

	// The fields below are a FastBackend's, filled by Counts; zero otherwise.

	// Held is the slots held at the instant they were read, as admission
	// counts them; Running is worked out from counters instead and can
	// miss a grant or a release made during the read, where Held never
	// does.
	Held int
	// ServedAtOnce counts the slots TryAcquire took: requests served
	// without waiting. Released counts the Releases.
	ServedAtOnce, Released uint64
}

// PriorityCount is the number of requests waiting at one priority.
type PriorityCount struct {
	Priority int
	Queued   int
}

// Backend admits requests: it decides which run now, which wait and in what
// order. A Backend belongs to exactly one Queue and must be safe for
// concurrent use.
type Backend interface {
	// Start is called once, before any other method, with the Limits to
	// enforce. An error stops the Queue from being built. A second call
	// must fail.
	Start(l Limits) error

	// Acquire returns when the request may run, with a Ticket that must be
	// given back to Release exactly once. Otherwise it holds no slot and
	// returns ErrQueueFull, ErrQueueTimeout, ErrClosed, or ctx.Err() when
	// ctx ends first. The Queue reads an error that wraps ErrClosed as
	// closed, else ErrQueueFull as queue full, else ErrQueueTimeout as queue
	// timeout; any other error by ctx: canceled, past its deadline (queue
	// timeout), or alive (queue full). A Backend that cannot reach its
	// store should wrap ErrQueueFull.
	Acquire(ctx context.Context, a Arrival) (Ticket, error)

	// Release gives back the slots of a Ticket from Acquire, even if the
	// limit moved since. It never blocks for long.
	Release(t Ticket)

	// Stats reports the slots and the queue now. It must not block behind
	// waiters and should be cheap: without a fast path, the Queue calls it
	// on the request path too. QueuedByPriority must add up to Queued, and
	// Running must stay within what Served was granted.
	Stats() Stats

	// Drain returns once every slot this Backend granted in this process has
	// been released, or with ctx.Err() when ctx ends first.
	Drain(ctx context.Context) error

	// Close answers every waiter with ErrClosed, refuses new arrivals with
	// ErrClosed and frees the Backend's resources. Running requests keep
	// their slots until they Release. Close may be called more than once.
	Close() error
}

// LimitSetter is a Backend whose limit can change while it runs. A Queue's
// SetLimit and its adaptive limit need one.
type LimitSetter interface {
	// SetLimit sets the number of slots. Raising it grants waiters at once;
	// lowering it preempts nobody. It returns CheckLimit's error for an n
	// out of range. It must be safe for concurrent use.
	SetLimit(n int) error
}

// FastPather is a Backend with a path that admits a request without an
// Arrival, a context, a clock or a lock when a slot is free and nobody
// waits. The Queue calls FastPath once, after Start, and uses its result
// when it is not nil.
type FastPather interface {
	Backend
	FastPath() FastBackend
}

// FastBackend is a Backend's fast path. It acts on the same slots as the
// Backend: the Queue calls TryAcquire, Counts and Acquire on it, and
// Release, Stats, Drain and Close on the Backend. Its methods must be safe
// for concurrent use and must not allocate, and its Acquire must apply
// Arrival.MaxAhead.
type FastBackend interface {
	Backend

	// TryAcquire takes one slot if one is free and nobody waits, and returns
	// how many slots it has taken so far, this one included (the Queue
	// samples one request in many by it, without a counter of its own); 0
	// means it took none. The Queue gives the slot back with
	// Release(Ticket{}). It must
	// never let a request pass a waiter and must take nothing once Close
	// has been called.
	TryAcquire() uint64

	// Counts is Stats without QueuedByPriority and OldestWait, cheap enough
	// to read on every queued grant, with Held, ServedAtOnce and Released
	// filled.
	Counts() Stats
}
