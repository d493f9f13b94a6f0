// QueueTimeout: the maximum wait and the one timer that enforces it.

package ginqueue

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A waiter that leaves early makes the timer fire for nothing; it re-arms for
// the next waiter, which still times out exactly at its own deadline.
func TestTimerRearmsAfterEarlyDeparture(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 3, QueueTimeout: 100 * time.Millisecond})
		_, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)
		t0 := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		early := acquireAsync(d, ctx)
		time.Sleep(30 * time.Millisecond)
		late := acquireAsync(d, context.Background())
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-early, context.Canceled)
		assert.ErrorIs(t, <-late, backend.ErrQueueTimeout)
		assert.Equal(t, 130*time.Millisecond, time.Since(t0))
		d.Release(backend.Ticket{})
		assert.Equal(t, backend.Stats{Limit: 1, Served: 1}, d.Stats())
	})
}

// A waiter whose deadline passed before its timer fired (a loaded machine)
// is timed out when a slot frees, not granted; the slot goes to the next.
func TestLateTimerDoesNotGrantExpiredWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: 100 * time.Millisecond})
		_, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)
		old := acquireAsync(d, context.Background())
		time.Sleep(50 * time.Millisecond)
		young := acquireAsync(d, context.Background())
		synctest.Wait()
		d.mu.Lock()
		d.timer.Stop() // the timer is late
		d.mu.Unlock()
		time.Sleep(60 * time.Millisecond) // old is 10 ms past its deadline
		d.Release(backend.Ticket{})
		assert.ErrorIs(t, <-old, backend.ErrQueueTimeout)
		assert.NoError(t, <-young)
		assert.Equal(t, 1, d.Stats().Running)
		d.Release(backend.Ticket{})
	})
}

// A QueueTimeout of centuries means "never", not a deadline in the past.
func TestHugeQueueTimeoutNeverFires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: math.MaxInt64})
		_, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)
		w := acquireAsync(d, context.Background())
		time.Sleep(100 * time.Millisecond)
		d.Release(backend.Ticket{})
		assert.NoError(t, <-w)
		d.Release(backend.Ticket{})
	})
}
