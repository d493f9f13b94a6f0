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
	// ErrQueueTimeout means the request waited QueueTimeout without a slot.
	ErrQueueTimeout = errors.New("ginqueue: queue timeout")
	// ErrClosed means the backend was closed before the request got a slot.
	ErrClosed = errors.New("ginqueue: closed")
)

// Limits are the parts of a Config that a Backend enforces.
type Limits struct {
	MaxConcurrent   int           // at least 1
	MaxQueue        int           // zero: no waiting room
	QueueTimeout    time.Duration // zero: no time limit
	MaxQueuePerFlow int           // zero: no cap per flow
}

// Validate reports the first limit that cannot work, naming the Config
// field it comes from; nil for usable limits. NewQueue checks them before
// Backend.Start, and a Backend may check them again in Start.
func (l Limits) Validate() error {
	switch {
	case l.MaxConcurrent < 1:
		return fmt.Errorf("ginqueue: Config.MaxConcurrent must be at least 1, got %d", l.MaxConcurrent)
	case l.MaxConcurrent > maxLimit:
		return fmt.Errorf("ginqueue: Config.MaxConcurrent must be at most %d, got %d", maxLimit, l.MaxConcurrent)
	case l.MaxQueue < 0:
		return fmt.Errorf("ginqueue: Config.MaxQueue must not be negative, got %d", l.MaxQueue)
	case l.MaxQueue > maxLimit:
		return fmt.Errorf("ginqueue: Config.MaxQueue must be at most %d, got %d", maxLimit, l.MaxQueue)
	case l.QueueTimeout < 0:
		return fmt.Errorf("ginqueue: Config.QueueTimeout must not be negative, got %v", l.QueueTimeout)
	case l.MaxQueuePerFlow < 0:
		return fmt.Errorf("ginqueue: Config.MaxQueuePerFlow must not be negative, got %d", l.MaxQueuePerFlow)
	case l.MaxQueuePerFlow > l.MaxQueue:
		return fmt.Errorf("ginqueue: Config.MaxQueuePerFlow %d exceeds Config.MaxQueue %d", l.MaxQueuePerFlow, l.MaxQueue)
	}
	return nil
}

// Arrival describes a request asking for a slot. The zero value is a request
// of priority 0 in the single default flow.
type Arrival struct {
	// Priority orders waiters: higher runs first. Zero is the default.
	Priority int
	// Flow names the flow the request belongs to, for fair queuing between
	// flows. Empty is the default flow.
	Flow string
}

// Ticket is what a Backend hands out with a slot and takes back on Release.
// Its fields belong to the Backend; the Queue passes them back untouched.
type Ticket struct {
	ID  uint64
	Key string
}

// BackendStats is a Backend's view of its slots and queue.
type BackendStats struct {
	Running int // requests holding a slot
	Queued  int // requests waiting for one
	Limit   int // slots in all
	// Served counts the Tickets Acquire has handed out since Start. A grant
	// that Acquire took back (its caller left in the same instant) does not
	// count.
	Served uint64
	// QueuedByPriority splits Queued by priority, highest first; nil when
	// nobody waits.
	QueuedByPriority []PriorityCount
	// OldestWait is how long the oldest waiter has waited; zero when nobody
	// waits or the backend cannot tell.
	OldestWait time.Duration
}

// PriorityCount is the number of requests waiting at one priority.
type PriorityCount struct {
	Priority int
	Queued   int
}

// Backend admits requests: it decides which run now, which wait and in what
// order. The in-memory dispatcher of this package is one (NewMemoryBackend);
// the redisqueue module has another. A Backend serves exactly one Queue and
// must be safe for concurrent use.
type Backend interface {
	// Start is called once by NewQueue before any other method, with the
	// limits to enforce. An error stops NewQueue and is returned from it.
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

	// Release gives back the slot of a Ticket from Acquire. It never blocks
	// for long: a remote backend retries in the background.
	Release(t Ticket)

	// Stats reports the current slots and queue. It must not block behind
	// waiters.
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
// in-memory dispatcher is one. Queue.SetLimit and the adaptive limit need it.
type LimitSetter interface {
	// SetLimit sets the number of slots. Raising it grants waiters at once;
	// lowering it preempts nobody: running requests finish, and nobody is
	// admitted until fewer than n run. It returns an error for n < 1.
	SetLimit(n int) error
}
