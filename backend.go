package ginqueue

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors a Backend returns from Acquire. The Queue turns each into its own
// outcome, counter and response; see Outcome.
var (
	// ErrQueueFull means the request found no free slot and no place to
	// wait in, or was refused a place (see OutcomeQueueFull).
	ErrQueueFull = errors.New("ginqueue: queue full")
	// ErrQueueTimeout means the request waited its maximum wait without
	// being granted: QueueTimeout, or the shorter time that Config.CoDel
	// allowed it.
	ErrQueueTimeout = errors.New("ginqueue: queue timeout")
	// ErrClosed means the Backend was closed before the request was granted.
	ErrClosed = errors.New("ginqueue: closed")
)

// MaxLimit is the largest value the limit, MaxConcurrent and MaxQueue can
// take: counts derived from them never overflow an int on any platform.
const MaxLimit = 1 << 30

// CheckLimit returns an error naming n unless it can be the limit: from 1
// to MaxLimit. Queue.SetLimit, the adaptive limit and every LimitSetter
// check a new limit with it.
func CheckLimit(n int) error {
	if n < 1 || n > MaxLimit {
		return fmt.Errorf("ginqueue: limit must be in [1, %d], got %d", MaxLimit, n)
	}
	return nil
}

// Limits are the parts of a Config that a Backend enforces: its bounds
// (MaxConcurrent is the limit it starts with) and how it weighs and orders
// requests.
type Limits struct {
	MaxConcurrent   int           // at least 1, at most MaxLimit
	MaxQueue        int           // zero: no waiting room; at most MaxLimit
	QueueTimeout    time.Duration // zero: no timeout
	MaxQueuePerFlow int           // zero: no cap per flow; at most MaxQueue
	// Weighted is set when Config.Cost is: an Arrival may then ask for more
	// than one slot (Arrival.Cost). A Backend that counts every request as
	// one slot must refuse it in Start, rather than ignore the costs. False:
	// every Arrival.Cost is 1 (or zero, which means 1).
	Weighted bool

	// CoDel is Config.CoDel with its defaults filled in, a copy the Backend
	// may keep; nil means off. A Backend that cannot honour it must refuse
	// it in Start rather than ignore it.
	CoDel *CoDel
}

// Validate reports the first field of l that cannot work, naming it as a
// Limits field; nil for usable Limits. NewQueue checks them (naming the
// Config fields they come from) before it calls Backend.Start; a Backend
// may check them in Start too.
func (l Limits) Validate() error { return l.check("Limits") }

// check is Validate, naming the fields of the struct called from.
func (l Limits) check(from string) error {
	field := func(name, rule string, got any) error {
		return fmt.Errorf("ginqueue: %s.%s %s, got %v", from, name, rule, got)
	}
	switch {
	case l.MaxConcurrent < 1:
		return field("MaxConcurrent", "must be at least 1", l.MaxConcurrent)
	case l.MaxConcurrent > MaxLimit:
		return field("MaxConcurrent", fmt.Sprintf("must be at most %d", MaxLimit), l.MaxConcurrent)
	case l.MaxQueue < 0:
		return field("MaxQueue", "must not be negative", l.MaxQueue)
	case l.MaxQueue > MaxLimit:
		return field("MaxQueue", fmt.Sprintf("must be at most %d", MaxLimit), l.MaxQueue)
	case l.QueueTimeout < 0:
		return field("QueueTimeout", "must not be negative", l.QueueTimeout)
	case l.MaxQueuePerFlow < 0:
		return field("MaxQueuePerFlow", "must not be negative", l.MaxQueuePerFlow)
	case l.MaxQueuePerFlow > l.MaxQueue:
		return field("MaxQueuePerFlow", fmt.Sprintf("must not exceed %s.MaxQueue (%d)", from, l.MaxQueue), l.MaxQueuePerFlow)
	case l.CoDel != nil:
		return l.CoDel.check(from + ".CoDel")
	}
	return nil
}

// Arrival describes a request asking for slots. The zero value is a request
// of priority 0 in the single default flow, with no bound on its wait.
type Arrival struct {
	// Priority orders waiters: higher is granted first. Zero is the
	// default.
	Priority int
	// Flow names the flow the request belongs to, for fair queuing between
	// flows. Empty is the default flow.
	Flow string
	// MaxAhead bounds how many waiters may be granted before this request,
	// for Config.RejectEarly, counted in the order of grants when it arrives
	// (newest first under CoDel's LIFO while the queue stands; later
	// arrivals may still pass it). Above zero, the request is refused with
	// ErrQueueFull if MaxAhead or more would be; below zero, if it would wait
	// at all; zero means no bound. A request that finds its slots free runs
	// whatever MaxAhead says. A FastBackend applies it as the request takes
	// its place; for other Backends the Queue applies it from Stats.
	MaxAhead int
	// Cost is how many slots the request holds while it runs (Config.Cost).
	// Zero or below means 1; above 1 only when Limits.Weighted is set. A
	// Backend that counts slots grants a cost above its limit as the whole
	// limit, and grants a head waiter whose slots are not all free only once
	// they are, letting nobody of its priority past it.
	Cost int
	// MinTimeLeft is the least time the request needs before its context's
	// deadline once it is granted (Config.MinTimeLeft): a waiter whose
	// deadline is nearer than that when its turn comes is answered
	// ErrQueueTimeout at once, and its slots go to the next waiter, since
	// its client would leave before its handler finished. A request that
	// finds its slots free runs whatever it says. Zero or below, or a
	// context without a deadline: no such check. The in-memory Backend
	// honours it; a Backend that cannot may ignore it.
	MinTimeLeft time.Duration
}

// Ticket is what a Backend hands out with a grant and takes back on Release.
// Its ID and Cost belong to the Backend; the Queue passes it back untouched.
type Ticket struct {
	ID uint64
	// Cost is the number of slots the Ticket holds, as granted (Arrival.Cost
	// after clamping to the limit of that moment), so that Release gives
	// back exactly those, whatever the limit is by then. Zero means one: the
	// Ticket{} that gives back a slot of FastBackend.TryAcquire.
	Cost int
}

// BackendStats is a Backend's view of its slots and queue. Running and Limit
// count slots, Queued and Served requests: without Limits.Weighted every
// request holds one slot, so the two are the same.
type BackendStats struct {
	Running int // slots held by running requests
	Queued  int // requests waiting for slots
	Limit   int // slots in all
	// Served counts the requests granted since Start, whatever their cost:
	// the Tickets of Acquire and, for a FastBackend, the slots TryAcquire
	// took. A grant that Acquire took back (its caller left in the same
	// instant) does not count. It only grows. Without Limits.Weighted it is
	// never below Running; with it, Running is never above the slots the
	// requests counted in Served were granted.
	Served uint64
	// QueuedByPriority splits Queued by priority, highest first; nil when
	// nobody waits.
	QueuedByPriority []PriorityCount
	// OldestWait is how long the oldest waiter has waited; zero when nobody
	// waits or the backend cannot tell.
	OldestWait time.Duration
	// Unavailable is set while the Backend cannot reach the store it shares
	// with other replicas (for redisqueue: while Redis is marked down) and
	// applies its fallback policy instead. False means the store answers,
	// or there is none: always false for the in-memory Backend.
	Unavailable bool
	// Outages counts the times the Backend turned Unavailable since Start.
	// It only grows. Zero means it never did; always zero for the in-memory
	// Backend.
	Outages uint64
}

// PriorityCount is the number of requests waiting at one priority.
type PriorityCount struct {
	Priority int
	Queued   int
}

// Backend admits requests: it decides which run now, which wait and in what
// order. The in-memory Backend of this package is one (NewMemoryBackend);
// the redisqueue module has another. A Backend belongs to exactly one Queue
// and must be safe for concurrent use.
type Backend interface {
	// Start is called once by NewQueue before any other method, with the
	// Limits to enforce. An error stops NewQueue and is returned from it. A
	// second call (the Backend given to a second Queue) must fail.
	Start(l Limits) error

	// Acquire returns when the request may run, with a Ticket that must be
	// given back to Release exactly once. Otherwise it holds no slot and
	// returns ErrQueueFull, ErrQueueTimeout, ErrClosed, or ctx.Err() when
	// ctx ends first. The Queue reads an error that wraps ErrClosed as
	// closed, else ErrQueueFull as queue full, else ErrQueueTimeout as queue
	// timeout, whatever else it wraps; any other error by ctx: canceled,
	// past its deadline (queue timeout), or alive (queue full). So a Backend
	// that cannot reach its store should wrap ErrQueueFull: a cause such as
	// its own call's context.DeadlineExceeded then changes nothing.
	Acquire(ctx context.Context, a Arrival) (Ticket, error)

	// Release gives back the slots of a Ticket from Acquire (Ticket.Cost of
	// them, even if the limit moved since). It never blocks for long: a
	// remote backend retries in the background.
	Release(t Ticket)

	// Stats reports the current slots and queue. It must not block behind
	// waiters and should be cheap: unless the Backend is a FastBackend, the
	// Queue calls it on the request path too (for Retry-After, RejectEarly
	// and the adaptive limit). QueuedByPriority must add up to Queued (nil
	// when nobody waits), and Served must keep BackendStats.Served's rule.
	Stats() BackendStats

	// Drain returns once every slot this Backend granted in this process has
	// been released, or with ctx.Err() when ctx ends first.
	Drain(ctx context.Context) error

	// Close answers every waiter with ErrClosed, refuses new arrivals with
	// ErrClosed and frees the Backend's resources. Running requests keep
	// their slots until they Release. Close may be called more than once.
	Close() error
}

// LimitSetter is a Backend whose limit can change while it runs; the
// in-memory Backend is one. Queue.SetLimit and the adaptive limit need it.
// SetLimit must be safe for concurrent use.
type LimitSetter interface {
	// SetLimit sets the number of slots. Raising it grants waiters at once;
	// lowering it preempts nobody: running requests finish, and a request is
	// granted only once its slots fit under n beside those still held. It
	// returns CheckLimit's error for an n out of range.
	SetLimit(n int) error
}

// FastBackend is a Backend with a path that admits a request without an
// Arrival, a context, a clock or a lock when a slot is free and nobody
// waits, and with counts cheap enough to read on every queued grant. The
// Queue uses both when its Backend has them; the in-memory Backend is one.
// Its methods must be safe for concurrent use and must not allocate. A
// FastBackend must also apply Arrival.MaxAhead in Acquire.
type FastBackend interface {
	Backend

	// TryAcquire takes one slot if one is free and nobody waits, and returns
	// how many slots it has taken so far, this one included; 0 means it took
	// none (the Queue then calls Acquire). The Queue calls it for every
	// request of cost 1, before anything else, and gives the slot back with
	// Release(Ticket{}). It must never let a request pass a waiter (one that
	// needs more slots than are free included), must take nothing once
	// Close has been called, and should not wait for a lock that waiters
	// hold.
	TryAcquire() uint64

	// Counts reports the slots and the queue now, without the split by
	// priority. Running must never exceed the Served of Stats (without
	// Limits.Weighted; see BackendStats.Served).
	Counts() Counts
}

// Counts is a FastBackend's cheap view of itself. Running and Limit count
// slots, Queued requests.
type Counts struct {
	Running, Queued, Limit int
	// Fast counts the slots TryAcquire took (requests of cost 1 served
	// without waiting, whose wait the Queue records as zero); Finished the
	// Releases (requests, whatever their cost). Both only grow.
	Fast, Finished uint64
	// Held is the slots held at the instant Counts read it, as the
	// admission decisions count them. Running is worked out from the
	// counters instead, so that it never exceeds the Served of Stats; it can
	// miss grants and releases made while Counts reads them, where Held
	// never does. A Backend that builds on another and must never count
	// fewer slots than are taken (as redisqueue's leased shares report to
	// Redis) reads Held.
	Held int
}

// ShareSetter is a LimitSetter whose limit may also be zero: a Backend that
// is lent its slots by another (redisqueue's leased shares build on the
// in-memory Backend this way) can hold none for a while. The in-memory
// Backend is one. SetShare must be safe for concurrent use.
type ShareSetter interface {
	// SetShare is SetLimit that also takes 0: nobody is granted until the
	// share is raised again, and waiters wait (or time out) meanwhile. It
	// returns an error naming n when n is below 0 or above MaxLimit.
	SetShare(n int) error
	// SetLease bounds what is granted within the share until the next
	// SetLease: nothing from until on (by the monotonic clock), so that a
	// Backend whose lease ran out while it was frozen grants nothing when
	// it resumes, whatever its timers say; and a cost is clamped to fleet
	// slots rather than to the share, so that a request whose cost is above
	// the share waits until the share covers it. A zero until means no end;
	// a fleet of 0 or less clamps to the share, as SetLimit does.
	SetLease(until time.Time, fleet int)
}

// FastPather is a Backend whose fast path depends on how it was built:
// redisqueue's leased shares have one, its global queue none. NewQueue uses
// FastPath's result as the Backend's FastBackend when it is not nil (and
// then ignores whether the Backend itself is one). The FastBackend returned
// must act on the same slots as the Backend: the Queue calls TryAcquire,
// Counts and Acquire on it, and Release, Stats, Drain and Close on the
// Backend. A type that embeds such a Backend to wrap its Acquire embeds
// FastPath too, and the Queue would then call the embedded Backend's fast
// path and Acquire, not the wrapper's: give the wrapper a FastPath of its
// own (nil, or a fast path that wraps the embedded one).
type FastPather interface {
	Backend
	// FastPath returns the fast path, or nil for none. NewQueue calls it
	// once, after Start.
	FastPath() FastBackend
}
