// The slot word, the fast path, Counts and Release.

package ginqueue

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// In the instant between a release and its hand-off, the freed slot belongs
// to the head waiter: an arrival on the fast path must not take it.
func TestFastPathNeverOvertakesWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 1})
		_, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)
		waiter := acquireAsync(d, context.Background())
		synctest.Wait()

		d.finished.Add(1) // the first half of Release: the slot is free
		d.state.Add(^uint64(0))
		assert.Zero(t, d.TryAcquire(), "an arrival overtook the waiter")
		d.mu.Lock()
		d.grantLocked() // the second half
		d.unlock()
		assert.NoError(t, <-waiter)
		assert.Equal(t, backend.Stats{Running: 1, Limit: 1, Served: 2}, d.Stats())
	})
}

// The fields of the state word stay apart at the bounds: a limit of 1<<30
// with a thousand holders, lowered to 1 and raised back.
func TestStateWordAtTheBounds(t *testing.T) {
	d := startDispatcher(t, backend.Limits{MaxConcurrent: backend.MaxLimit, MaxQueue: backend.MaxLimit, QueueTimeout: 1})
	for range 1000 {
		require.NotZero(t, d.TryAcquire(), "fast path refused below the limit")
	}
	require.NoError(t, d.SetLimit(1))
	run, limit := d.slots()
	assert.Equal(t, [2]int64{1000, 1}, [2]int64{run, limit})
	assert.Zero(t, d.TryAcquire(), "admitted past a lowered limit")
	require.NoError(t, d.SetLimit(backend.MaxLimit))
	assert.Error(t, d.SetLimit(backend.MaxLimit+1))
	for range 1000 {
		d.Release(backend.Ticket{})
	}
	run, limit = d.slots()
	assert.Equal(t, [2]int64{0, backend.MaxLimit}, [2]int64{run, limit})
	assert.Equal(t, backend.Stats{Limit: backend.MaxLimit, Served: 1000}, d.Stats())
}

// A cost below 1 is 1; one above the limit is the limit, at the grant, on the
// lock-free path as on the slow one and for a waiter granted later; the
// Ticket carries what was granted and Release gives exactly that back.
func TestCostIsClampedAtTheGrant(t *testing.T) {
	for _, tt := range []struct {
		name       string
		cost, want int
	}{
		{"zero", 0, 1},
		{"negative", -5, 1},
		{"one", 1, 1},
		{"three", 3, 3},
		{"the limit", 4, 4},
		{"limit+10", 14, 4},
		{"MaxInt", math.MaxInt, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := startDispatcher(t, backend.Limits{MaxConcurrent: 4, MaxQueue: 4})
				tk, err := d.Acquire(context.Background(), backend.Arrival{Cost: tt.cost})
				require.NoError(t, err)
				assert.Equal(t, tt.want, max(tk.Cost, 1), "granted at once")
				assert.Equal(t, backend.Stats{Running: tt.want, Limit: 4, Served: 1}, d.Stats())
				d.Release(tk)
				run, _ := d.slots()
				assert.Zero(t, run, "Release gave back what was granted")

				// The same cost when a slot is held: it waits for its clamped
				// slots (and is granted them once they are free).
				require.NotZero(t, d.TryAcquire())
				got := park(d, context.Background(), backend.Arrival{Cost: tt.cost})
				assert.Equal(t, tt.want == 4, pending(got), "waits only if it needs every slot")
				d.Release(backend.Ticket{})
				r := <-got
				require.NoError(t, r.err)
				assert.Equal(t, tt.want, max(r.t.Cost, 1))
				assert.Equal(t, tt.want, d.Stats().Running)
				d.Release(r.t)
				assert.Equal(t, backend.Stats{Limit: 4, Served: 3}, d.Stats())
			})
		})
	}
}

// Stats and Counts count slots in Running and Limit, requests in Queued,
// Served, ServedAtOnce and Released.
func TestStatsCountSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 6, MaxQueue: 4})
		require.NotZero(t, d.TryAcquire())
		require.NotZero(t, d.TryAcquire())
		three, err := d.Acquire(context.Background(), backend.Arrival{Cost: 3})
		require.NoError(t, err)
		heavy := park(d, context.Background(), backend.Arrival{Cost: 4})
		assert.Equal(t, 5, d.Stats().Running)
		assert.Equal(t, 1, d.Stats().Queued)
		assert.Equal(t, uint64(3), d.Stats().Served)
		assert.Equal(t, backend.Stats{Running: 5, Queued: 1, Limit: 6, ServedAtOnce: 2, Held: 5}, d.Counts())

		d.Release(backend.Ticket{})
		d.Release(three)
		r := <-heavy
		require.NoError(t, r.err)
		assert.Equal(t, backend.Stats{Running: 5, Limit: 6, Served: 4}, d.Stats())
		assert.Equal(t, backend.Stats{Running: 5, Limit: 6, ServedAtOnce: 2, Released: 2, Held: 5}, d.Counts())
		d.Release(backend.Ticket{})
		d.Release(r.t)
		assert.Equal(t, backend.Stats{Limit: 6, Served: 4}, d.Stats())
		assert.Equal(t, backend.Stats{Limit: 6, ServedAtOnce: 2, Released: 4}, d.Counts())
	})
}

// A Release that grants a waiter yields, so that the waiter runs at once
// rather than behind the rest of the releasing request; one that grants
// nobody (no waiter, or a heavy head whose slots are not all free) does not.
func TestReleaseYieldsToTheWaiterItGranted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 2, MaxQueue: 4, Weighted: true})
		var yields atomic.Int64
		d.step = func(s step) {
			if s == stepYield {
				yields.Add(1)
			}
		}
		a, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)
		b, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)
		d.Release(b)
		assert.Zero(t, yields.Load(), "nobody waited: no yield")
		b, err = d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)

		heavy := make(chan error, 1)
		go func() {
			tk, err := d.Acquire(context.Background(), backend.Arrival{Cost: 2})
			if err == nil {
				d.Release(tk)
			}
			heavy <- err
		}()
		synctest.Wait()
		d.Release(a)
		assert.Zero(t, yields.Load(), "one slot free, the head needs two: nobody granted, no yield")
		d.Release(b)
		require.NoError(t, <-heavy)
		assert.EqualValues(t, 1, yields.Load(), "the release that granted the heavy waiter yielded")
	})
}
