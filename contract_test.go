package ginqueue_test

import (
	"context"
	"errors"
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

// A Backend serves one Queue: giving the same one to a second Queue is
// refused with a clear error, and the first keeps its own limits.
func TestBackendServesOneQueue(t *testing.T) {
	b := ginqueue.NewMemoryBackend()
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 3, Backend: b})
	_, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 7, MaxQueue: 5, Backend: b})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already serves a Queue")
	assert.Equal(t, 3, q.Stats().Limit, "the first Queue keeps its limits")
}

// A Backend that never started (NewQueue refused its Config first) can still
// be closed and drained, more than once, and once closed it starts no Queue.
func TestMemoryBackendClosedBeforeStart(t *testing.T) {
	b := ginqueue.NewMemoryBackend()
	_, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: -1, Backend: b})
	require.Error(t, err)
	assert.NoError(t, b.Drain(context.Background()))
	assert.NoError(t, b.Close())
	assert.NoError(t, b.Close())
	assert.NoError(t, b.Drain(context.Background()))
	_, err = ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, Backend: b})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "closed before it started")
}

// failingClose is a Backend whose Close fails.
type failingClose struct{ ginqueue.Backend }

var errCloseFailed = errors.New("stub: close failed")

func (b failingClose) Close() error {
	_ = b.Backend.Close()
	return errCloseFailed
}

// Shutdown gives Close's error first, even with a ctx that has already
// ended, and once it has returned no arrival is served: the fast path is
// closed too.
func TestShutdownClosesBeforeItReturns(t *testing.T) {
	for range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, Backend: failingClose{ginqueue.NewMemoryBackend()}})
		require.ErrorIs(t, q.Shutdown(ctx), errCloseFailed)

		q = mustQueue(t, ginqueue.Config{MaxConcurrent: 4})
		_ = q.Shutdown(ctx) // nil or ctx.Err(): nothing runs, and ctx has ended
		w := httptest.NewRecorder()
		newEngine(q.Handler(), func(c *gin.Context) { c.Status(http.StatusOK) }).
			ServeHTTP(w, httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil))
		require.Equal(t, http.StatusServiceUnavailable, w.Code, "an arrival after Shutdown returned")
	}
}

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

// plainBackend hides every method but the Backend's.
type plainBackend struct{ ginqueue.Backend }

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

// RejectEarly with a Backend that is not a FastBackend follows the same
// rule from its Stats: with 100 ms handlers on one slot and a 250 ms
// QueueTimeout, two waiters may be ahead, not three.
func TestRejectEarlyOnAPlainBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 8, QueueTimeout: 250 * time.Millisecond,
			RejectEarly: true, Backend: plainBackend{ginqueue.NewMemoryBackend()}})
		r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
		out := make(chan result, 8)
		burst(r, 1, 0, out) // times the handler: 100 ms
		time.Sleep(100 * time.Millisecond)
		require.Equal(t, http.StatusOK, (<-out).code)
		burst(r, 4, 1, out) // 1 runs, 2 and 3 wait, 4 would be third in line
		res := <-out
		assert.Equal(t, 4, res.id)
		assert.Equal(t, http.StatusServiceUnavailable, res.code)
		for range 3 {
			<-out
		}
	})
}

// refusingFast is a FastBackend whose TryAcquire always refuses, as when a
// slot frees between the Queue's fast path and its Acquire.
type refusingFast struct{ ginqueue.FastBackend }

func (refusingFast) TryAcquire() uint64 { return 0 }

// A request the in-memory Backend's Acquire serves at once, after the
// Queue's own fast path failed, is counted once in the wait histogram: its
// wait as the Queue records it, not also as a fast grant.
func TestAcquireAtOnceCountsOnceInTheHistogram(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 2, MaxQueue: 4, QueueTimeout: time.Minute,
			Backend: refusingFast{ginqueue.NewMemoryBackend().(ginqueue.FastBackend)}})
		r := newEngine(q.Handler(), sleeper(time.Millisecond))
		for range 3 {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			require.Equal(t, http.StatusOK, w.Code)
		}
		h := q.WaitHistogram()
		assert.EqualValues(t, 3, h.Count, "three requests served, each counted once")
		assert.EqualValues(t, 3, q.Stats().Served)
	})
}
