package redisqueue

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ginqueue/ginqueue/backend"
)

// ErrUnavailable means that this replica cannot reach Redis, and so did not
// admit a request or change the limit. Acquire returns an error wrapping it
// and backend.ErrQueueFull, which a Queue answers as queue full (503 with
// Retry-After): under FailClosed, and in Shares mode under either policy
// once the replica has no share to admit within (see Backend.Acquire).
// SetLimit returns an error wrapping it when Redis is marked down or the
// call fails.
var ErrUnavailable = errors.New("redisqueue: redis unavailable")

// ErrConflict means that a live replica of the same Name disagrees with
// this one: it declared another MaxConcurrent (or, in GlobalQueue mode,
// another MaxQueue), runs in the other Mode, or splits the Name into other
// Options.Shares.Parts. Start (and so ginqueue.NewQueue) returns an error
// wrapping it, which names the Name and what disagrees.
//
// A conflict can also be found after Start, when Redis did not answer
// then. In Shares mode the replica then stops admitting: Acquire answers
// with an error wrapping ErrUnavailable and backend.ErrQueueFull that
// names the conflict, and SetLimit an error wrapping ErrConflict, until a
// sync finds no conflict. In GlobalQueue mode Acquire and SetLimit return
// an error wrapping ErrConflict (from Acquire, with backend.ErrQueueFull)
// until a sync finds no conflict.
var ErrConflict = errors.New("redisqueue: limits disagree with another replica")

// conflictError is a conflict that a Shares-mode script found, why being
// the script's words. Its message is "redisqueue: Name %q: why", with the
// prefix once, and it wraps ErrConflict.
type conflictError struct{ name, why string }

func (e *conflictError) Error() string { return fmt.Sprintf("redisqueue: Name %q: %s", e.name, e.why) }

func (e *conflictError) Unwrap() error { return ErrConflict }

// wrapError is an error with a message of its own that wraps others (see
// errorf).
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }

// errorf is fmt.Errorf, but the messages of the errors it wraps lose their
// package prefix ("redisqueue: " or "ginqueue: "), so that a message names
// its package once.
func errorf(format string, args ...any) error {
	plain := make([]any, len(args))
	for i, a := range args {
		if err, ok := a.(error); ok {
			msg := err.Error()
			for _, p := range []string{"redisqueue: ", "ginqueue: "} {
				msg = strings.TrimPrefix(msg, p)
			}
			a = msg
		}
		plain[i] = a
	}
	return &wrapError{msg: fmt.Sprintf(strings.ReplaceAll(format, "%w", "%s"), plain...), err: fmt.Errorf(format, args...)}
}

// errEvicted is what a waiter gets when an arrival of higher priority took
// its place in the full global queue: a Queue answers it as queue full.
var errEvicted = errorf("redisqueue: an arrival of higher priority took this place in the full queue: %w", backend.ErrQueueFull)

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
