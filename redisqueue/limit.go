package redisqueue

import (
	"errors"
	"fmt"

	"github.com/ginqueue/ginqueue/backend"
)

var _ backend.LimitSetter = (*Backend)(nil)

// SetLimit implements backend.LimitSetter for the whole fleet: it sets the
// limit of every replica of the Name, in Redis, with one call bounded by
// CallTimeout. The limit stays until the next SetLimit on any replica, or
// until Redis loses its data; it does not change what a replica declares
// (docs/fleet.md says what follows).
//
// In Shares mode the new limit is shared out as the shares move: the
// replicas that hold slots, and those that wait if slots are now free, are
// asked to sync at once, and so does this replica: its share (its
// Stats().Limit) follows. Lowering it preempts nobody: the shares shrink
// as running requests end. With Options.Shares.Parts above 1 it sets the
// Name's limit and moves the parts' limits to it at once, which takes a few
// calls more.
//
// In GlobalQueue mode raising it grants waiters at once, in the fleet's
// order, wherever their replica is; lowering it preempts nobody, and nobody
// is admitted until fewer than n slots are held.
//
// SetLimit returns an error wrapping backend.CheckLimit's when n is below 1
// or above backend.MaxLimit; one wrapping ErrUnavailable when Redis is
// marked down or the call fails (this replica then changed nothing, though a
// call that timed out may still have reached Redis); one wrapping
// backend.ErrClosed after Close; one wrapping ErrConflict while this
// replica's limits disagree with a live replica's; and an error before
// Start. It is safe for concurrent use.
func (b *Backend) SetLimit(n int) error {
	if err := backend.CheckLimit(n); err != nil {
		return errorf("redisqueue: SetLimit(%d): %w", n, err)
	}
	b.mu.Lock()
	decl, started, closed, conflict := b.decl, b.started, b.closed, b.conflict
	b.mu.Unlock()
	switch {
	case closed:
		return errorf("redisqueue: SetLimit(%d) after Close: %w", n, backend.ErrClosed)
	case !started:
		return errors.New("redisqueue: SetLimit before Start; a Backend gets its limits from ginqueue.NewQueue")
	case conflict != nil:
		return errorf("redisqueue: SetLimit(%d): %w", n, conflict)
	case b.down.Load():
		return errorf("redisqueue: SetLimit(%d): Redis is marked down, nothing changed: %w", n, ErrUnavailable)
	}
	if b.sh != nil {
		return b.sh.setLimit(n)
	}
	res, err := b.call(setLimitScript, n, decl, b.replica)
	if err != nil {
		return errorf("redisqueue: SetLimit(%d): %w: %w", n, ErrUnavailable, err)
	}
	l, ok := res.(int64)
	if !ok {
		return fmt.Errorf("redisqueue: SetLimit(%d): unexpected reply %v", n, res)
	}
	b.limit.Store(l)
	return nil
}
