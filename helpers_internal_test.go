// Helpers shared by the internal tests.

package ginqueue

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/stretchr/testify/require"
)

func startDispatcher(t *testing.T, l backend.Limits) *dispatcher {
	t.Helper()
	d := newMemoryBackend()
	require.NoError(t, d.Start(l))
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// acquireAsync parks an Acquire in its own goroutine; its error comes back
// on the returned channel.
func acquireAsync(d *dispatcher, ctx context.Context) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := d.Acquire(ctx, backend.Arrival{})
		errc <- err
	}()
	return errc
}

// parked is what one Acquire came back with, and after how long.
type parked struct {
	t      backend.Ticket
	err    error
	waited time.Duration
}

// park runs an Acquire of a in its own goroutine and waits until it has
// parked or returned, so arrivals have a known order; its result comes back
// on the channel.
func park(d *dispatcher, ctx context.Context, a backend.Arrival) <-chan parked {
	out := make(chan parked, 1)
	t0 := time.Now()
	go func() {
		t, err := d.Acquire(ctx, a)
		out <- parked{t, err, time.Since(t0)}
	}()
	synctest.Wait()
	return out
}

// pending reports whether an Acquire has not returned yet.
func pending(c <-chan parked) bool { return len(c) == 0 }

// slots is the number of slots held and the limit.
func (d *dispatcher) slots() (run, limit int64) {
	st := d.state.Load()
	return running(st), limitOf(st)
}

// fakeSetter is a LimitSetter that records every limit it is given, and
// refuses them while fail is set (a Backend that is down).
type fakeSetter struct {
	args []int
	fail bool
}

func (s *fakeSetter) SetLimit(n int) error {
	s.args = append(s.args, n)
	if s.fail {
		return errors.New("ginqueue: backend down")
	}
	return nil
}
