package ginqueue

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// acquired is the result of one Acquire, sent back from its goroutine.
type acquired struct {
	t   Ticket
	err error
}

// acquireCost parks an Acquire of a in its own goroutine, then waits for
// the bubble to settle; the result comes back on the returned channel.
func acquireCost(d *dispatcher, ctx context.Context, a Arrival) <-chan acquired {
	out := make(chan acquired, 1)
	go func() {
		t, err := d.Acquire(ctx, a)
		out <- acquired{t, err}
	}()
	synctest.Wait()
	return out
}

// pending reports whether an Acquire has not returned yet.
func pending(c <-chan acquired) bool { return len(c) == 0 }

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
				d := startDispatcher(t, Limits{MaxConcurrent: 4, MaxQueue: 4})
				tk, err := d.Acquire(context.Background(), Arrival{Cost: tt.cost})
				require.NoError(t, err)
				assert.Equal(t, tt.want, max(tk.Cost, 1), "granted at once")
				assert.Equal(t, BackendStats{Running: tt.want, Limit: 4, Served: 1}, d.Stats())
				d.Release(tk)
				run, _ := d.slots()
				assert.Zero(t, run, "Release gave back what was granted")

				// The same cost when a slot is held: it waits for its clamped
				// slots (and is granted them once they are free).
				require.NotZero(t, d.TryAcquire())
				got := acquireCost(d, context.Background(), Arrival{Cost: tt.cost})
				assert.Equal(t, tt.want == 4, pending(got), "waits only if it needs every slot")
				d.Release(Ticket{})
				r := <-got
				require.NoError(t, r.err)
				assert.Equal(t, tt.want, max(r.t.Cost, 1))
				assert.Equal(t, tt.want, d.Stats().Running)
				d.Release(r.t)
				assert.Equal(t, BackendStats{Limit: 4, Served: 3}, d.Stats())
			})
		})
	}
}

// A head waiter that needs more slots than are free holds the line: the
// fast path refuses cost-1 arrivals while it waits, and a cost-1 waiter
// behind it is not granted the free slots; once its slots are free it runs,
// then those behind it.
func TestHeadOfLineHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 4, MaxQueue: 8})
		require.NotZero(t, d.TryAcquire())
		require.NotZero(t, d.TryAcquire())
		heavy := acquireCost(d, context.Background(), Arrival{Cost: 4})
		require.True(t, pending(heavy))
		assert.Zero(t, d.TryAcquire(), "the fast path passed a heavy waiter")
		light := acquireCost(d, context.Background(), Arrival{Cost: 1})
		other := acquireCost(d, context.Background(), Arrival{Cost: 1, Flow: "other"}) // a flow of its own joins behind the head
		assert.Equal(t, 3, d.Stats().Queued)

		d.Release(Ticket{}) // 3 of 4 free: not enough for the head
		synctest.Wait()
		assert.True(t, pending(heavy))
		assert.True(t, pending(light), "a cost-1 waiter overtook the head")
		assert.True(t, pending(other), "a cost-1 waiter of another flow overtook the head")
		assert.Zero(t, d.TryAcquire())

		d.Release(Ticket{})
		h := <-heavy
		require.NoError(t, h.err)
		assert.Equal(t, 4, h.t.Cost)
		assert.True(t, pending(light))
		assert.Equal(t, 4, d.Stats().Running)

		d.Release(h.t)
		require.NoError(t, (<-light).err)
		require.NoError(t, (<-other).err)
		assert.Equal(t, BackendStats{Running: 2, Limit: 4, Served: 5}, d.Stats())
		d.Release(Ticket{Cost: 1})
		d.Release(Ticket{Cost: 1})
	})
}

// What can change the head while free slots wait for it lets the line move
// at once: a higher priority arrival (it runs on the free slots), the head
// hanging up, timing out or being evicted (the waiter behind it runs).
func TestALeavingHeadLetsTheLineMove(t *testing.T) {
	// blocked is a dispatcher of limit 4 with 2 slots held, a cost-4 head
	// and, for most cases, a cost-1 waiter behind it.
	blocked := func(t *testing.T, l Limits, ctx context.Context, behind bool) (d *dispatcher, heavy, light <-chan acquired) {
		d = startDispatcher(t, l)
		require.NotZero(t, d.TryAcquire())
		require.NotZero(t, d.TryAcquire())
		heavy = acquireCost(d, ctx, Arrival{Cost: 4})
		require.True(t, pending(heavy))
		if behind {
			time.Sleep(time.Second) // the heavy waiter's deadline comes first
			light = acquireCost(d, context.Background(), Arrival{Cost: 1})
			require.True(t, pending(light))
		}
		return d, heavy, light
	}
	t.Run("a higher priority", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, heavy, light := blocked(t, Limits{MaxConcurrent: 4, MaxQueue: 4}, context.Background(), true)
			high := acquireCost(d, context.Background(), Arrival{Cost: 1, Priority: 1})
			require.False(t, pending(high), "a higher priority waited behind the free slots")
			assert.NoError(t, (<-high).err)
			assert.True(t, pending(light), "the same priority passed the head")
			assert.Equal(t, 3, d.Stats().Running)
			for range 3 {
				d.Release(Ticket{})
			}
			assert.NoError(t, (<-heavy).err)
			d.Release(Ticket{Cost: 4})
			assert.NoError(t, (<-light).err)
			d.Release(Ticket{})
		})
	})
	t.Run("the head hangs up", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			d, heavy, light := blocked(t, Limits{MaxConcurrent: 4, MaxQueue: 4}, ctx, true)
			cancel()
			synctest.Wait()
			assert.ErrorIs(t, (<-heavy).err, context.Canceled)
			require.False(t, pending(light), "the free slots waited for a head that left")
			assert.NoError(t, (<-light).err)
			assert.Equal(t, BackendStats{Running: 3, Limit: 4, Served: 3}, d.Stats())
			for range 3 {
				d.Release(Ticket{})
			}
		})
	})
	t.Run("the head times out", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, heavy, light := blocked(t, Limits{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: 5 * time.Second}, context.Background(), true)
			time.Sleep(4 * time.Second) // the head's deadline passes, not the other's
			synctest.Wait()
			assert.ErrorIs(t, (<-heavy).err, ErrQueueTimeout)
			require.False(t, pending(light), "the free slots waited for a head that timed out")
			assert.NoError(t, (<-light).err)
			for range 3 {
				d.Release(Ticket{})
			}
		})
	})
	t.Run("the head is evicted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, heavy, _ := blocked(t, Limits{MaxConcurrent: 4, MaxQueue: 1}, context.Background(), false)
			high := acquireCost(d, context.Background(), Arrival{Cost: 1, Priority: 1})
			assert.ErrorIs(t, (<-heavy).err, ErrQueueFull)
			require.False(t, pending(high), "the arrival that took the head's place waited behind free slots")
			assert.NoError(t, (<-high).err)
			for range 3 {
				d.Release(Ticket{})
			}
		})
	})
}

// Lowering the limit below the slots held preempts nobody and admits nobody
// until the head's slots fit; a waiter granted after is clamped to the new
// limit; a Ticket granted before the limit moved gives back what it got.
func TestSetLimitWithCosts(t *testing.T) {
	t.Run("lowered below the slots held", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := startDispatcher(t, Limits{MaxConcurrent: 8, MaxQueue: 4})
			a, err := d.Acquire(context.Background(), Arrival{Cost: 4})
			require.NoError(t, err)
			b, err := d.Acquire(context.Background(), Arrival{Cost: 4})
			require.NoError(t, err)
			require.NoError(t, d.SetLimit(2))
			assert.Equal(t, BackendStats{Running: 8, Limit: 2, Served: 2}, d.Stats(), "preempted")
			light := acquireCost(d, context.Background(), Arrival{Cost: 1})
			assert.Zero(t, d.TryAcquire())
			d.Release(a) // 4 held, limit 2
			synctest.Wait()
			assert.True(t, pending(light), "admitted with 4 of 2 slots held")
			assert.Equal(t, 4, d.Stats().Running)
			d.Release(b)
			r := <-light
			require.NoError(t, r.err)
			assert.Equal(t, BackendStats{Running: 1, Limit: 2, Served: 3}, d.Stats())
			d.Release(r.t)
		})
	})
	t.Run("a waiter granted under a lowered limit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := startDispatcher(t, Limits{MaxConcurrent: 8, MaxQueue: 4})
			held, err := d.Acquire(context.Background(), Arrival{Cost: 6})
			require.NoError(t, err)
			heavy := acquireCost(d, context.Background(), Arrival{Cost: 8})
			require.NoError(t, d.SetLimit(4))
			synctest.Wait()
			assert.True(t, pending(heavy))
			d.Release(held)
			r := <-heavy
			require.NoError(t, r.err)
			assert.Equal(t, 4, r.t.Cost, "clamped to the limit at the grant")
			require.NoError(t, d.SetLimit(8))
			d.Release(r.t)
			assert.Equal(t, BackendStats{Limit: 8, Served: 2}, d.Stats())
		})
	})
	for _, tt := range []struct {
		name      string
		from, to  int
		cost, got int
	}{
		{"released after the limit dropped", 8, 3, 8, 8},
		{"released after the limit rose", 2, 10, 5, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := startDispatcher(t, Limits{MaxConcurrent: tt.from})
			tk, err := d.Acquire(context.Background(), Arrival{Cost: tt.cost})
			require.NoError(t, err)
			assert.Equal(t, tt.got, tk.Cost)
			require.NoError(t, d.SetLimit(tt.to))
			d.Release(tk)
			run, limit := d.slots()
			assert.Equal(t, [2]int64{0, int64(tt.to)}, [2]int64{run, limit}, "Release gave back other than what was granted")
			assert.Equal(t, BackendStats{Limit: tt.to, Served: 1}, d.Stats())
		})
	}
}

// Stats and Counts count slots in Running and Limit, requests in Queued,
// Served, Fast and Finished.
func TestStatsCountSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 6, MaxQueue: 4})
		require.NotZero(t, d.TryAcquire())
		require.NotZero(t, d.TryAcquire())
		three, err := d.Acquire(context.Background(), Arrival{Cost: 3})
		require.NoError(t, err)
		heavy := acquireCost(d, context.Background(), Arrival{Cost: 4})
		assert.Equal(t, 5, d.Stats().Running)
		assert.Equal(t, 1, d.Stats().Queued)
		assert.Equal(t, uint64(3), d.Stats().Served)
		assert.Equal(t, Counts{Running: 5, Queued: 1, Limit: 6, Fast: 2}, d.Counts())

		d.Release(Ticket{})
		d.Release(three)
		r := <-heavy
		require.NoError(t, r.err)
		assert.Equal(t, BackendStats{Running: 5, Limit: 6, Served: 4}, d.Stats())
		assert.Equal(t, Counts{Running: 5, Limit: 6, Fast: 2, Finished: 2}, d.Counts())
		d.Release(Ticket{})
		d.Release(r.t)
		assert.Equal(t, BackendStats{Limit: 6, Served: 4}, d.Stats())
		assert.Equal(t, Counts{Limit: 6, Fast: 2, Finished: 4}, d.Counts())
	})
}

// Under CoDel's LIFO, while the queue stands, the head is the newest waiter:
// a cost-4 newest waiter holds the line as an oldest one does, nobody is
// granted past it, and it is granted its 4 slots, not the 1 that would fit
// the waiter before it.
func TestLIFOHeadHoldsTheLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 4, MaxQueue: 8, QueueTimeout: time.Minute,
			CoDel: &CoDel{Target: 10 * time.Millisecond, Interval: 10 * time.Millisecond, LIFO: true}})
		for range 4 {
			require.NotZero(t, d.TryAcquire())
		}
		first := acquireCost(d, context.Background(), Arrival{Cost: 1}) // the queue is busy from now on
		time.Sleep(8 * time.Millisecond)
		light := acquireCost(d, context.Background(), Arrival{Cost: 1})
		time.Sleep(time.Millisecond)
		heavy := acquireCost(d, context.Background(), Arrival{Cost: 4})
		time.Sleep(time.Millisecond) // 10 ms: the queue stands, the first waiter is dropped
		synctest.Wait()
		assert.ErrorIs(t, (<-first).err, ErrQueueTimeout)

		d.Release(Ticket{})
		synctest.Wait()
		assert.True(t, pending(light), "a waiter passed the newest, heavy head")
		assert.True(t, pending(heavy))
		for range 3 {
			d.Release(Ticket{})
		}
		h := <-heavy
		require.NoError(t, h.err)
		assert.Equal(t, 4, h.t.Cost)
		assert.True(t, pending(light))
		d.Release(h.t)
		l := <-light
		require.NoError(t, l.err)
		d.Release(l.t)
		assert.Equal(t, BackendStats{Limit: 4, Served: 6}, d.Stats())
	})
}
