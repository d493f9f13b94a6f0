// The dispatcher as a whole: invariants under stress, lost wake-ups, SetLimit.

package ginqueue

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Many goroutines in real time, with hang-ups and timeouts, racing releases
// against parking waiters: the count never exceeds the limit and ends at 0.
func TestStressKeepsInvariants(t *testing.T) {
	const limit = 3
	d := startDispatcher(t, backend.Limits{MaxConcurrent: limit, MaxQueue: 8, QueueTimeout: 2 * time.Millisecond})
	var mu sync.Mutex
	running, peak := 0, 0
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 300 {
				ctx, cancel := context.WithCancel(context.Background())
				if (i+j)%7 == 0 {
					cancel()
				}
				_, err := d.Acquire(ctx, backend.Arrival{})
				cancel()
				if err != nil {
					continue
				}
				mu.Lock()
				running++
				peak = max(peak, running)
				mu.Unlock()
				time.Sleep(time.Duration(j%3) * 10 * time.Microsecond)
				mu.Lock()
				running--
				mu.Unlock()
				d.Release(backend.Ticket{})
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, peak, limit)
	st := d.Stats()
	assert.Equal(t, 0, st.Running)
	assert.Equal(t, 0, st.Queued)
	assert.Zero(t, d.state.Load()&slowBit, "slowBit left set with nobody waiting")
}

// Two goroutines share one slot with no timeout, in real time: a lost
// wake-up would hang them.
func TestPingPongNeverHangs(t *testing.T) {
	d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 2})
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			for range 20_000 {
				if _, err := d.Acquire(context.Background(), backend.Arrival{}); err != nil {
					break
				}
				d.Release(backend.Ticket{})
			}
			done <- struct{}{}
		}()
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("a waiter was never woken")
		}
	}
	assert.EqualValues(t, 40_000, d.Stats().Served)
}

// Lowering the limit below the slots held preempts nobody and admits nobody
// until the head's slots fit; a waiter granted after is clamped to the new
// limit; a Ticket granted before the limit moved gives back what it got.
func TestSetLimitWithCosts(t *testing.T) {
	t.Run("lowered below the slots held", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := startDispatcher(t, backend.Limits{MaxConcurrent: 8, MaxQueue: 4})
			a, err := d.Acquire(context.Background(), backend.Arrival{Cost: 4})
			require.NoError(t, err)
			b, err := d.Acquire(context.Background(), backend.Arrival{Cost: 4})
			require.NoError(t, err)
			require.NoError(t, d.SetLimit(2))
			assert.Equal(t, backend.Stats{Running: 8, Limit: 2, Served: 2}, d.Stats(), "preempted")
			light := park(d, context.Background(), backend.Arrival{Cost: 1})
			assert.Zero(t, d.TryAcquire())
			d.Release(a) // 4 held, limit 2
			synctest.Wait()
			assert.True(t, pending(light), "admitted with 4 of 2 slots held")
			assert.Equal(t, 4, d.Stats().Running)
			d.Release(b)
			r := <-light
			require.NoError(t, r.err)
			assert.Equal(t, backend.Stats{Running: 1, Limit: 2, Served: 3}, d.Stats())
			d.Release(r.t)
		})
	})
	t.Run("a waiter granted under a lowered limit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := startDispatcher(t, backend.Limits{MaxConcurrent: 8, MaxQueue: 4})
			held, err := d.Acquire(context.Background(), backend.Arrival{Cost: 6})
			require.NoError(t, err)
			heavy := park(d, context.Background(), backend.Arrival{Cost: 8})
			require.NoError(t, d.SetLimit(4))
			synctest.Wait()
			assert.True(t, pending(heavy))
			d.Release(held)
			r := <-heavy
			require.NoError(t, r.err)
			assert.Equal(t, 4, r.t.Cost, "clamped to the limit at the grant")
			require.NoError(t, d.SetLimit(8))
			d.Release(r.t)
			assert.Equal(t, backend.Stats{Limit: 8, Served: 2}, d.Stats())
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
			d := startDispatcher(t, backend.Limits{MaxConcurrent: tt.from})
			tk, err := d.Acquire(context.Background(), backend.Arrival{Cost: tt.cost})
			require.NoError(t, err)
			assert.Equal(t, tt.got, tk.Cost)
			require.NoError(t, d.SetLimit(tt.to))
			d.Release(tk)
			run, limit := d.slots()
			assert.Equal(t, [2]int64{0, int64(tt.to)}, [2]int64{run, limit}, "Release gave back other than what was granted")
			assert.Equal(t, backend.Stats{Limit: tt.to, Served: 1}, d.Stats())
		})
	}
}
