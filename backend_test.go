// Limits.Validate, and what the Queue asks of a Backend through its interfaces.

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
)

// Limits.Validate names the Limits field a Backend author passed; Config's
// Validate names the Config field a user set. One rule, two names.
func TestLimitsValidateNamesItsOwnFields(t *testing.T) {
	for _, tt := range []struct {
		l    ginqueue.Limits
		want string
	}{
		{ginqueue.Limits{}, "ginqueue: Limits.MaxConcurrent must be at least 1, got 0"},
		{ginqueue.Limits{MaxConcurrent: ginqueue.MaxLimit + 1}, "ginqueue: Limits.MaxConcurrent must be at most 1073741824, got 1073741825"},
		{ginqueue.Limits{MaxConcurrent: 1, MaxQueue: -1}, "ginqueue: Limits.MaxQueue must not be negative, got -1"},
		{ginqueue.Limits{MaxConcurrent: 1, QueueTimeout: -time.Second}, "ginqueue: Limits.QueueTimeout must not be negative, got -1s"},
		{ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 2, MaxQueuePerFlow: 3}, "ginqueue: Limits.MaxQueuePerFlow must not exceed Limits.MaxQueue (2), got 3"},
	} {
		err := tt.l.Validate()
		require.Error(t, err, "%+v", tt.l)
		assert.Equal(t, tt.want, err.Error())
		cfg := ginqueue.Config{MaxConcurrent: tt.l.MaxConcurrent, MaxQueue: tt.l.MaxQueue, QueueTimeout: tt.l.QueueTimeout,
			MaxQueuePerFlow: tt.l.MaxQueuePerFlow, FlowKey: ginqueue.ByRoute()}
		assert.Equal(t, strings.ReplaceAll(tt.want, "Limits.", "Config."), cfg.Validate().Error())
	}
	assert.NoError(t, ginqueue.Limits{MaxConcurrent: 1}.Validate())
	for _, n := range []int{0, -1, ginqueue.MaxLimit + 1} {
		assert.ErrorContains(t, ginqueue.CheckLimit(n), "ginqueue: limit must be in [1, 1073741824]")
	}
	assert.NoError(t, ginqueue.CheckLimit(ginqueue.MaxLimit))
}

// countingFast is a FastBackend of its own type (not the package's), so the
// Queue can only know its fast path through the interface; it counts what
// the Queue calls.
type countingFast struct {
	ginqueue.FastBackend
	tries, acquires, stats atomic.Int64
}

func (c *countingFast) TryAcquire() uint64 { c.tries.Add(1); return c.FastBackend.TryAcquire() }
func (c *countingFast) Acquire(ctx context.Context, a ginqueue.Arrival) (ginqueue.Ticket, error) {
	c.acquires.Add(1)
	return c.FastBackend.Acquire(ctx, a)
}
func (c *countingFast) Stats() ginqueue.BackendStats { c.stats.Add(1); return c.FastBackend.Stats() }
func (c *countingFast) SetLimit(n int) error         { return c.FastBackend.(ginqueue.LimitSetter).SetLimit(n) }

// Any Backend that implements FastBackend gets the fast path and the cheap
// counts: an unsaturated request calls TryAcquire only, and a queued grant
// never pays for Stats. A Backend without it is called through Acquire.
func TestThirdBackendsGetTheFastPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &countingFast{FastBackend: ginqueue.NewMemoryBackend().(ginqueue.FastBackend)}
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
			Backend: plainBackend{ginqueue.NewMemoryBackend()}})
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
		b := &limitsRecorder{Backend: ginqueue.NewMemoryBackend()}
		cfg := ginqueue.Config{MaxConcurrent: 4, Backend: b}
		if weighted {
			cfg.Cost = byQueryCost
		}
		mustQueue(t, cfg)
		assert.Equal(t, weighted, b.limits.Weighted)
	}

	b := &countingFast{FastBackend: ginqueue.NewMemoryBackend().(ginqueue.FastBackend)}
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
