// The checks of Limits, and what the Queue asks of a Backend through its interfaces.

package ginqueue_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
)

// The in-memory Backend's Start names the Limits field a Backend author
// passed; Config's Validate names the Config field a user set. One rule, two
// names.
func TestLimitsValidateNamesItsOwnFields(t *testing.T) {
	for _, tt := range []struct {
		l    backend.Limits
		want string
	}{
		{backend.Limits{}, "ginqueue: Limits.MaxConcurrent must be at least 1, got 0"},
		{backend.Limits{MaxConcurrent: backend.MaxLimit + 1}, "ginqueue: Limits.MaxConcurrent must be at most 1073741824, got 1073741825"},
		{backend.Limits{MaxConcurrent: 1, MaxQueue: -1}, "ginqueue: Limits.MaxQueue must not be negative, got -1"},
		{backend.Limits{MaxConcurrent: 1, QueueTimeout: -time.Second}, "ginqueue: Limits.QueueTimeout must not be negative, got -1s"},
		{backend.Limits{MaxConcurrent: 1, MaxQueue: 2, MaxQueuePerFlow: 3}, "ginqueue: Limits.MaxQueuePerFlow must not exceed Limits.MaxQueue (2), got 3"},
	} {
		err := inmem.New().Start(tt.l)
		require.Error(t, err, "%+v", tt.l)
		assert.Equal(t, tt.want, err.Error())
		cfg := ginqueue.Config{MaxConcurrent: tt.l.MaxConcurrent, MaxQueue: tt.l.MaxQueue, QueueTimeout: tt.l.QueueTimeout,
			MaxQueuePerFlow: tt.l.MaxQueuePerFlow, FlowKey: ginqueue.ByRoute()}
		assert.Equal(t, strings.ReplaceAll(tt.want, "Limits.", "Config."), cfg.Validate().Error())
	}
	assert.NoError(t, inmem.New().Start(backend.Limits{MaxConcurrent: 1}))
	for _, n := range []int{0, -1, backend.MaxLimit + 1} {
		assert.ErrorContains(t, backend.CheckLimit(n), "ginqueue: limit must be in [1, 1073741824]")
	}
	assert.NoError(t, backend.CheckLimit(backend.MaxLimit))
}

// countingFast is a FastBackend of its own type (not the package's), so the
// Queue can only know its fast path through the interface; it counts what
// the Queue calls.
type countingFast struct {
	backend.FastBackend
	tries, acquires, stats atomic.Int64
}

func (c *countingFast) FastPath() backend.FastBackend { return c }
func (c *countingFast) TryAcquire() uint64            { c.tries.Add(1); return c.FastBackend.TryAcquire() }
func (c *countingFast) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	c.acquires.Add(1)
	return c.FastBackend.Acquire(ctx, a)
}
func (c *countingFast) Stats() backend.Stats { c.stats.Add(1); return c.FastBackend.Stats() }
func (c *countingFast) SetLimit(n int) error { return c.FastBackend.(backend.LimitSetter).SetLimit(n) }

// Any Backend that implements FastBackend gets the fast path and the cheap
// counts: an unsaturated request calls TryAcquire only, and a queued grant
// never pays for Stats. A Backend without it is called through Acquire.
func TestThirdBackendsGetTheFastPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &countingFast{FastBackend: inmem.New().(backend.FastBackend)}
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Minute, Backend: b, RejectEarly: true})
		r := newEngine(q.Handler(), sleeper(10*time.Millisecond))
		out := make(chan result, 8)
		burst(r, 1, 0, out)
		time.Sleep(10 * time.Millisecond)
		require.Equal(t, http.StatusOK, (<-out).code)
		assert.EqualValues(t, 1, b.tries.Load())
		assert.Zero(t, b.acquires.Load(), "a free slot is taken by TryAcquire alone")

		burst(r, 3, 1, out) // 1 runs, 2 wait
		for range 3 {
			require.Equal(t, http.StatusOK, (<-out).code)
		}
		assert.EqualValues(t, 2, b.acquires.Load())
		assert.Zero(t, b.stats.Load(), "queued grants read Counts, never Stats")
		st := q.Stats()
		assert.EqualValues(t, 4, st.Served)
		assert.EqualValues(t, 1, b.stats.Load())
	})
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Minute,
			Backend: plainBackend{inmem.New()}})
		r := newEngine(q.Handler(), sleeper(10*time.Millisecond))
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, http.StatusOK, w.Code)
		assert.EqualValues(t, 1, q.Stats().Served)
	})
}

// Limits.Weighted tells the Backend whether Config.Cost is set, so that one
// that cannot count slots can refuse it; and a FastBackend sees TryAcquire
// for cost-1 requests only, Acquire with Arrival.Cost for the others.
func TestBackendsLearnOfCosts(t *testing.T) {
	for _, weighted := range []bool{false, true} {
		b := &limitsRecorder{Backend: inmem.New()}
		cfg := ginqueue.Config{MaxConcurrent: 4, Backend: b}
		if weighted {
			cfg.Cost = byQueryCost
		}
		mustQueue(t, cfg)
		assert.Equal(t, weighted, b.limits.Weighted)
	}

	b := &countingFast{FastBackend: inmem.New().(backend.FastBackend)}
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, Backend: b, Cost: byQueryCost})
	var seen atomic.Int64
	r := newEngine(q.Handler(), func(c *gin.Context) { seen.Store(int64(q.Stats().Running)); c.Status(http.StatusOK) })
	for _, cost := range []string{"1", "3", "0"} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?c="+cost, nil))
		require.Equal(t, http.StatusOK, w.Code)
		want := max(byQueryCost(&gin.Context{Request: httptest.NewRequest(http.MethodGet, "/?c="+cost, nil)}), 1)
		assert.EqualValues(t, want, seen.Load(), "cost %s", cost)
	}
	assert.EqualValues(t, [2]int64{2, 1}, [2]int64{b.tries.Load(), b.acquires.Load()}, "tries and acquires")
}

// pather is a Backend that is no FastBackend itself but names one.
type pather struct {
	plainBackend
	fast backend.FastBackend
}

func (p pather) FastPath() backend.FastBackend { return p.fast }

// A FastPather's FastPath is the Queue's fast path; a nil one means none.
func TestFastPatherNamesTheFastPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := inmem.New()
		c := &countingFast{FastBackend: mem.(backend.FastBackend)}
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Minute,
			Backend: pather{plainBackend{mem}, c}})
		r := newEngine(q.Handler(), sleeper(10*time.Millisecond))
		out := make(chan result, 8)
		burst(r, 2, 0, out) // 1 runs, 1 waits
		for range 2 {
			require.Equal(t, http.StatusOK, (<-out).code)
		}
		assert.EqualValues(t, 2, c.tries.Load(), "both requests tried the named fast path")
		assert.EqualValues(t, 1, c.acquires.Load(), "the one that waited went through its Acquire")
	})
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Minute,
			Backend: pather{plainBackend{inmem.New()}, nil}})
		r := newEngine(q.Handler(), sleeper(10*time.Millisecond))
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, http.StatusOK, w.Code)
	})
}

// SetShare takes 0, which admits nobody until the share is raised, and
// refuses what SetLimit refuses beyond that.
func TestSetShareOfZeroAdmitsNobody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := inmem.New()
		require.NoError(t, mem.Start(backend.Limits{MaxConcurrent: 2, MaxQueue: 4, Weighted: true}))
		s := mem.(inmem.Sharer)
		require.NoError(t, s.SetShare(0))
		fast := mem.(backend.FastBackend)
		assert.Zero(t, fast.TryAcquire(), "no slot with a share of 0")
		assert.Equal(t, 0, fast.Counts().Limit)
		got := make(chan backend.Ticket, 1)
		go func() {
			tk, err := mem.Acquire(context.Background(), backend.Arrival{Cost: 2})
			if err == nil {
				got <- tk
			}
		}()
		synctest.Wait()
		assert.Empty(t, got, "a waiter waits while the share is 0")
		require.NoError(t, s.SetShare(1))
		synctest.Wait()
		tk := <-got
		assert.Equal(t, 1, tk.Cost, "a cost above the share is granted as the whole share")
		mem.Release(tk)
		assert.EqualError(t, s.SetShare(-1), "ginqueue: share must be in [0, 1073741824], got -1")
		assert.EqualError(t, s.SetShare(backend.MaxLimit+1), "ginqueue: share must be in [0, 1073741824], got 1073741825")
		require.NoError(t, mem.Close())
	})
}

// Counts.Held is the slots taken at the instant of the read, weighted
// grants counted in slots.
func TestCountsHeldIsTheSlotsTaken(t *testing.T) {
	mem := inmem.New()
	require.NoError(t, mem.Start(backend.Limits{MaxConcurrent: 4, Weighted: true}))
	fast := mem.(backend.FastBackend)
	require.NotZero(t, fast.TryAcquire())
	tk, err := mem.Acquire(context.Background(), backend.Arrival{Cost: 2})
	require.NoError(t, err)
	assert.Equal(t, 3, fast.Counts().Held)
	mem.Release(tk)
	assert.Equal(t, 1, fast.Counts().Held)
	mem.Release(backend.Ticket{})
	assert.Equal(t, 0, fast.Counts().Held)
	require.NoError(t, mem.Close())
}
