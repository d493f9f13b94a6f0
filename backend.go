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
	// ErrQueueFull means the request found no free slot and no waiting place.
	ErrQueueFull = errors.New("ginqueue: queue full")
	// ErrQueueTimeout means the request waited QueueTimeout without a slot,
	// or the shorter time that Config.CoDel allowed it.
	ErrQueueTimeout = errors.New("ginqueue: queue timeout")
	// ErrClosed means the backend was closed before the request got a slot.
	ErrClosed = errors.New("ginqueue: closed")
)

// MaxLimit is the largest limit, MaxConcurrent and MaxQueue there can be:
// counts derived from them never overflow an int on any platform.
const MaxLimit = 1 << 30

// CheckLimit returns an error naming n unless it can be a limit: from 1 to
// MaxLimit. Queue.SetLimit, the adaptive limit and every LimitSetter check a
// new limit with it.
func CheckLimit(n int) error {
	if n < 1 || n > MaxLimit {
		return fmt.Errorf("ginqueue: limit must be in [1, %d], got %d", MaxLimit, n)
	}
	return nil
}

// Limits are the parts of a Config that a Backend enforces.
type Limits struct {
	MaxConcurrent   int           // at least 1, at most MaxLimit
	MaxQueue        int           // zero: no waiting room; at most MaxLimit
	QueueTimeout    time.Duration // zero: no time limit
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

// Validate reports the first limit that cannot work, naming the Limits
// field; nil for usable limits. NewQueue has checked them (naming the Config
// fields they come from) before it calls Backend.Start; a Backend may check
// them again in Start.
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

// Arrival describes a request asking for a slot. The zero value is a request
// of priority 0 in the single default flow, with no bound on its wait.
type Arrival struct {
	// Priority orders waiters: higher runs first. Zero is the default.
	Priority int
	// Flow names the flow the request belongs to, for fair queuing between
	// flows. Empty is the default flow.
	Flow string
	// MaxAhead bounds how many waiters may be served before this request,
	// for Config.RejectEarly, counted in the order of its arrival (under
	// CoDel's LIFO while the queue stands, newest first; later arrivals may
	// still pass it). Above zero, the request is refused with
	// ErrQueueFull if MaxAhead or more would be; below zero, if it would
	// wait at all; zero means no bound. A request that finds a free slot
	// runs whatever MaxAhead says. A FastBackend applies it as the request
	// takes its place; the Queue estimates it from Stats for other Backends.
	MaxAhead int
	// Cost is how many slots the request holds while it runs (Config.Cost).
	// Zero or below means 1. A Backend that counts slots grants a cost above
	// its limit as the whole limit (the request runs alone), and serves a
	// waiter that needs more slots than are free only once they are, letting
	// nobody of its priority past it; the in-memory Backend does. Above 1
	// only when Limits.Weighted is set.
	Cost int
}

// Ticket is what a Backend hands out with a slot and takes back on Release.
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
	// Served counts the requests granted slots since Start, whatever their
	// cost: the Tickets of Acquire and, for a FastBackend, the slots
	// TryAcquire took. A grant that Acquire took back (its caller left in
	// the same instant) does not count. It only grows. Without
	// Limits.Weighted it is never below Running; with it, Running is never
	// above the slots the requests counted in Served were granted.
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
// the redisqueue module has another. A Backend serves exactly one Queue and
// must be safe for concurrent use.
type Backend interface {
	// Start is called once by NewQueue before any other method, with the
	// limits to enforce. An error stops NewQueue and is returned from it. A
	// second call (the Backend given to a second Queue) must fail: a Backend
	// serves exactly one Queue.
	Start(l Limits) error

	// Acquire returns when the request may run, with a Ticket that must be
	// given back to Release exactly once. Otherwise it returns ErrQueueFull,
	// ErrQueueTimeout, ErrClosed, or ctx.Err() when ctx ends first (the
	// client hung up, or the request's deadline passed); then no slot is
	// held. The Queue reads an error in that order: one that wraps ErrClosed
	// is closed, else ErrQueueFull is queue full, else ErrQueueTimeout is
	// queue timeout, whatever else it wraps; so a backend that cannot reach
	// its store should wrap ErrQueueFull, and a cause such as its own call's
	// context.DeadlineExceeded then changes nothing. Any other error is
	// decided by ctx: canceled is canceled, past its deadline is queue
	// timeout, and a ctx still alive (an unavailable backend, a timeout of
	// the backend's own) is queue full. Only ctx or ErrQueueTimeout ever
	// make a queue timeout.
	Acquire(ctx context.Context, a Arrival) (Ticket, error)

	// Release gives back the slots of a Ticket from Acquire (Ticket.Cost of
	// them, even if the limit moved since). It never blocks for long: a
	// remote backend retries in the background.
	Release(t Ticket)

	// Stats reports the current slots and queue. It must not block behind
	// waiters: the Queue calls it for Queue.Stats and, for a Backend that is
	// not a FastBackend, on the request path too (every rejection, for
	// Retry-After; every queued arrival with RejectEarly; every adaptive
	// window), so keep it cheap. Queue.Stats passes on what it returns:
	// QueuedByPriority must add up to Queued (nil when nobody waits), and
	// Served must never be below Running (in a Backend that counts every
	// request as one slot; see BackendStats.Served).
	Stats() BackendStats

	// Drain returns once every slot this Backend granted in this process has
	// been released, or with ctx.Err() when ctx ends first.
	Drain(ctx context.Context) error

	// Close answers every waiter with ErrClosed, refuses new arrivals with
	// ErrClosed and frees the backend's resources. Running requests keep
	// their slots until they Release. Close may be called more than once.
	Close() error
}

// LimitSetter is a Backend whose limit can change while it runs; the
// in-memory Backend is one. Queue.SetLimit and the adaptive limit need it.
type LimitSetter interface {
	// SetLimit sets the number of slots. Raising it grants waiters at once;
	// lowering it preempts nobody: running requests finish, and a request is
	// admitted only once its slots fit under n beside those still held. It
	// returns CheckLimit's error for an n out of range.
	SetLimit(n int) error
}

// FastBackend is a Backend with a path that admits a request without an
// Arrival, a context, a clock or a lock when a slot is free and nobody waits,
// and with counts cheap enough to read on every queued grant. The Queue uses
// both when its Backend has them; the in-memory Backend is one. Its
// methods must be safe for concurrent use and must not allocate. A
// FastBackend must also apply Arrival.MaxAhead in Acquire.
type FastBackend interface {
	Backend

	// TryAcquire takes one slot if one is free and nobody waits, and returns
	// how many slots it has taken so far, this one included; 0 means it took
	// none (the Queue then calls Acquire). The Queue calls it only for a
	// request of cost 1; heavier ones go to Acquire. A slot it took is given
	// back with Release(Ticket{}). It must never let a request pass one that
	// waits (a waiter that needs more slots than are free included), and
	// must take nothing once Close has been called: the Queue tries it before
	// anything else, so an arrival after Close is answered as closed only if
	// TryAcquire refuses it. It is called on every request of cost 1: it
	// must not allocate, and should not wait for a lock that waiters hold.
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
}
