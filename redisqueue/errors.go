package redisqueue

import (
	"errors"
	"fmt"

	"github.com/ginqueue/ginqueue/backend"
)

// ErrUnavailable is wrapped by the error Acquire returns under FailClosed
// while Redis cannot be reached. That error also wraps backend.ErrQueueFull,
// so a Queue answers it as queue full (503 with Retry-After).
var ErrUnavailable = errors.New("redisqueue: redis unavailable")

// ErrConflict is wrapped by the error that Start (and so ginqueue.NewQueue)
// returns when a live replica of the same Name declared other limits; Acquire
// returns it too, wrapping backend.ErrQueueFull, when the conflict is found
// only after Redis came back.
var ErrConflict = errors.New("redisqueue: limits disagree with another replica")

// errEvicted is what a waiter gets when an arrival of higher priority took
// its place in the full global queue: a Queue answers it as queue full.
var errEvicted = fmt.Errorf("redisqueue: an arrival of higher priority took this place in the full queue: %w", backend.ErrQueueFull)

// unavailableError is what FailClosed answers: ErrUnavailable, queue full,
// and the cause.
type unavailableError struct{ cause error }

func (e *unavailableError) Error() string {
	return "redisqueue: redis unavailable, answered as queue full: " + e.cause.Error()
}

func (e *unavailableError) Unwrap() []error {
	return []error{ErrUnavailable, backend.ErrQueueFull, e.cause}
}

// errCoDel refuses Config.CoDel. Its maximum wait hangs on when the queue last
// emptied, and the queue here is the fleet's, while each replica times out
// only its own waiters: each would apply a rule of its own.
var errCoDel = errors.New("redisqueue: Config.CoDel is not supported: its maximum wait depends on when the queue " +
	"shared by every replica last emptied, which no replica knows; leave Config.CoDel nil with this Backend")

// errPerFlow refuses Config.MaxQueuePerFlow. The fleet's queue is ordered by
// priority and arrival only (flows do not take turns in it), and it keeps no
// count of places per flow, so no replica could answer an arrival at its
// flow's cap as queue full.
var errPerFlow = errors.New("redisqueue: Config.MaxQueuePerFlow is not supported: the queue shared by every replica " +
	"keeps no count of places per flow; leave it zero with this Backend (MaxQueue still bounds the queue)")

// errSplitCost refuses Config.Cost on a Name split into parts: a part's
// limit can be below the cost of a request that waits there, and the
// rebalancer does not yet give a part the slots of its largest request.
var errSplitCost = errors.New("redisqueue: Config.Cost (weighted requests) is not supported with Options.Shares.Parts above 1")
