package redisqueue

import (
	"errors"
	"fmt"

	"github.com/ginqueue/ginqueue"
)

var _ ginqueue.LimitSetter = (*Backend)(nil)

// SetLimit implements ginqueue.LimitSetter for the whole fleet: it sets the
// limit of every replica of the Name at once, in Redis, where every acquire,
// release and sync reads it inside its script. Raising it grants waiters at
// once, wherever their replica is, in the global order (priority, then
// arrival). Lowering it preempts nobody: running requests finish, and
// nobody is admitted until fewer than n run.
//
// The limit stays until the next SetLimit, on any replica; it outlives a
// replica's restart, but not a Redis flush or restart without persistence,
// after which the fleet is back at MaxConcurrent. It does not change what a
// replica declares to the others: they still must all be started with the
// same MaxConcurrent and MaxQueue. A fleet that is started again with other
// limits, once no replica of the old ones is live, starts from its own
// MaxConcurrent.
//
// SetLimit returns an error wrapping ginqueue.CheckLimit's when n is below 1
// or above ginqueue.MaxLimit; one
// wrapping ErrUnavailable when Redis is marked down or the call fails (then
// this replica changed nothing, though a call that timed out may still have
// reached Redis); one wrapping ginqueue.ErrClosed after Close; and one
// wrapping ErrConflict while this replica's limits disagree with a live
// replica's. It is safe for concurrent use; it calls Redis once, bounded by
// CallTimeout.
func (b *Backend) SetLimit(n int) error {
	if err := ginqueue.CheckLimit(n); err != nil {
		return fmt.Errorf("redisqueue: SetLimit(%d): %w", n, err)
	}
	b.mu.Lock()
	decl, started, closed, conflict := b.decl, b.started, b.closed, b.conflict
	b.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("redisqueue: SetLimit(%d) after Close: %w", n, ginqueue.ErrClosed)
	case !started:
		return errors.New("redisqueue: SetLimit before Start; a Backend gets its limits from ginqueue.NewQueue")
	case conflict != nil:
		return fmt.Errorf("redisqueue: SetLimit(%d): %w", n, conflict)
	case b.down.Load():
		return fmt.Errorf("redisqueue: SetLimit(%d): Redis is marked down, nothing changed: %w", n, ErrUnavailable)
	}
	res, err := b.call(setLimitScript, n, decl, b.replica)
	if err != nil {
		return fmt.Errorf("redisqueue: SetLimit(%d): %w: %w", n, ErrUnavailable, err)
	}
	l, ok := res.(int64)
	if !ok {
		return fmt.Errorf("redisqueue: SetLimit(%d): unexpected reply %v", n, res)
	}
	b.limit.Store(l)
	return nil
}
