package ginqueue_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
)

// sleeper is a handler that works for d of fake time.
func sleeper(d time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		time.Sleep(d)
		c.Status(http.StatusOK)
	}
}

func burst(r http.Handler, n, firstID int, out chan<- result) {
	for i := range n {
		send(r, context.Background(), firstID+i, time.Now(), out)
		synctest.Wait()
	}
}

// Served responses carry the queue wait as Server-Timing, set before the
// handler writes.
func TestServerTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute, ServerTiming: true})
		seen := make(chan string, 2)
		r := newEngine(q.Handler(), func(c *gin.Context) {
			seen <- c.Writer.Header().Get("Server-Timing")
			time.Sleep(250 * time.Millisecond)
			c.Status(http.StatusOK)
		})
		out := make(chan result, 2)
		burst(r, 2, 0, out)
		first, second := <-out, <-out
		assert.Equal(t, "queue;dur=0", first.header.Get("Server-Timing"))
		assert.Equal(t, "queue;dur=250.000", second.header.Get("Server-Timing"))
		assert.Equal(t, "queue;dur=0", <-seen, "set before the handler runs")
		assert.Equal(t, "queue;dur=250.000", <-seen)

		plain := newEngine(mustQueue(t, ginqueue.Config{MaxConcurrent: 1}).Handler(), sleeper(0))
		w := httptest.NewRecorder()
		plain.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Empty(t, w.Header().Get("Server-Timing"), "off by default")
	})
}

// Retry-After is Config.RetryAfter until a request has finished, then the
// time the slots need to serve the queue at the measured handler time, at
// least 1 s and at most QueueTimeout.
func TestRetryAfterFollowsDrainRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 2, MaxQueue: 4, QueueTimeout: time.Minute, RetryAfter: 7 * time.Second})
		r := newEngine(q.Handler(), sleeper(time.Second))
		out := make(chan result, 16)
		burst(r, 6, 0, out) // 2 run, 4 wait
		burst(r, 1, 6, out)
		res := <-out
		assert.Equal(t, http.StatusServiceUnavailable, res.code)
		assert.Equal(t, "7", res.header.Get("Retry-After"), "nothing finished yet: the constant")

		time.Sleep(time.Second) // 2 finish (2/s), 2 start, 2 wait
		synctest.Wait()
		for range 2 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
		burst(r, 2, 7, out) // the queue is full again: 4 waiting
		burst(r, 1, 9, out)
		res = <-out
		assert.Equal(t, 9, res.id)
		assert.Equal(t, "3", res.header.Get("Retry-After"), "(4 waiting + 1) / 2 per second, rounded up")
		assert.InDelta(t, 2.0, q.Stats().DrainRate, 1e-9)
		for range 6 {
			<-out
		}
	})
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: 90 * time.Second})
		r := newEngine(q.Handler(), sleeper(100*time.Second))
		out := make(chan result, 8)
		burst(r, 1, 0, out)
		time.Sleep(100 * time.Second) // one finished in 100 s: 0.01/s
		synctest.Wait()
		<-out
		burst(r, 2, 1, out) // one runs, one waits
		burst(r, 1, 3, out)
		res := <-out
		assert.Equal(t, 3, res.id)
		assert.Equal(t, "90", res.header.Get("Retry-After"), "2 × 100 s of handler time, capped at QueueTimeout: every waiter has left by then")
		res = <-out // the waiter times out after 90 s, with a Retry-After too
		assert.Equal(t, http.StatusRequestTimeout, res.code)
		assert.Equal(t, "90", res.header.Get("Retry-After"))
		<-out
	})
}

// RejectEarly answers 503 at once when the expected wait already exceeds
// QueueTimeout; without it the same arrival waits and gets 408.
func TestRejectEarly(t *testing.T) {
	for _, early := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 2500 * time.Millisecond, RejectEarly: early})
			r := newEngine(q.Handler(), sleeper(time.Second))
			out := make(chan result, 8)
			burst(r, 3, 0, out) // 1 runs, 2 wait
			time.Sleep(time.Second)
			synctest.Wait() // 1 finished (1/s); 1 runs, 1 waits
			assert.Equal(t, 0, (<-out).id)
			burst(r, 1, 3, out)
			burst(r, 1, 4, out) // position 3: expected 3 s > 2.5 s
			if early {
				res := <-out
				assert.Equal(t, 4, res.id)
				assert.Equal(t, http.StatusServiceUnavailable, res.code)
				assert.Zero(t, res.at, "at once")
				assert.EqualValues(t, 1, q.Stats().QueueFull)
			}
			got := map[int]int{}
			for range 3 + map[bool]int{true: 0, false: 1}[early] {
				res := <-out
				got[res.id] = res.code
			}
			if !early {
				assert.Equal(t, http.StatusRequestTimeout, got[4], "without RejectEarly it waits, then 408")
			}
			assert.Equal(t, http.StatusOK, got[3])
		})
	}
}

// OnOutcome is called once per request with its outcome and wait; a hook
// that panics cannot keep a slot.
func TestOnOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		seen := map[ginqueue.Outcome][]time.Duration{}
		q := mustQueue(t, ginqueue.Config{
			MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: 300 * time.Millisecond,
			OnOutcome: func(c *gin.Context, o ginqueue.Outcome, wait time.Duration) {
				mu.Lock()
				seen[o] = append(seen[o], wait)
				mu.Unlock()
				if c.Query("hook") == "panic" {
					panic("hook")
				}
			},
		})
		r := newEngine(q.Handler(), sleeper(time.Second))
		out := make(chan result, 8)
		t0 := time.Now()
		send(r, context.Background(), 0, t0, out)
		synctest.Wait()
		send(r, context.Background(), 1, t0, out) // times out after 300 ms
		synctest.Wait()
		send(r, context.Background(), 2, t0, out) // full
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		time.Sleep(400 * time.Millisecond)
		send(r, ctx, 3, t0, out)
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		cancel() // after 100 ms of waiting
		for range 4 {
			<-out
		}
		mu.Lock()
		assert.Equal(t, map[ginqueue.Outcome][]time.Duration{
			ginqueue.OutcomeServed:       {0},
			ginqueue.OutcomeQueueTimeout: {300 * time.Millisecond},
			ginqueue.OutcomeQueueFull:    {0},
			ginqueue.OutcomeCanceled:     {100 * time.Millisecond},
		}, seen)
		mu.Unlock()

		// A panicking hook on a served request: gin.Recovery answers, the
		// slot is back.
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?hook=panic", nil))
		assert.Equal(t, http.StatusInternalServerError, w.Code)
		assert.Equal(t, 0, q.Stats().Running)
		require.NoError(t, q.Close())
		w = httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		mu.Lock()
		assert.Len(t, seen[ginqueue.OutcomeClosed], 1)
		mu.Unlock()
	})
}

// Stats reports the age of the oldest waiter, and StatusHandler serves Stats
// as JSON.
func TestOldestWaitAndStatusHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Minute,
			Priority: byQueryPriority})
		g, r := gated(q)
		out := make(chan result, 4)
		sendAt(r, 0, 0, "", out)
		sendAt(r, 1, 2, "", out)
		time.Sleep(1500 * time.Millisecond)
		sendAt(r, 2, 0, "", out)
		time.Sleep(500 * time.Millisecond)
		assert.Equal(t, 2*time.Second, q.Stats().OldestWait)

		w := httptest.NewRecorder()
		ops := gin.New() // the ops route sits outside the throttle
		ops.GET("/debug/queue", q.StatusHandler())
		ops.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/queue", nil))
		var got map[string]any
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got))
		assert.EqualValues(t, 1, got["running"])
		assert.EqualValues(t, 2, got["queued"])
		assert.EqualValues(t, 2.0, got["oldest_wait_seconds"])
		assert.Equal(t, []any{
			map[string]any{"priority": 2.0, "queued": 1.0},
			map[string]any{"priority": 0.0, "queued": 1.0},
		}, got["queued_by_priority"])
		for _, k := range []string{"served", "queue_full", "queue_timeout", "canceled", "closed", "limit",
			"wait_p50_seconds", "wait_p90_seconds", "wait_p99_seconds", "drain_rate_per_second",
			"no_load_latency_seconds", "unavailable", "outages"} {
			assert.Contains(t, got, k)
		}
		g.open(3)
		for range 3 {
			<-out
		}
		assert.Zero(t, q.Stats().OldestWait)
	})
}

// The wait histogram counts every served request, those that ran at once in
// the first bucket.
func TestWaitHistogram(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: time.Minute})
		r := newEngine(q.Handler(), sleeper(2*time.Millisecond))
		out := make(chan result, 3)
		burst(r, 3, 0, out) // waits: 0, 2 ms, 4 ms
		for range 3 {
			<-out
		}
		h := q.WaitHistogram()
		assert.EqualValues(t, 3, h.Count)
		assert.InDelta(t, 0.006, h.Sum, 1e-9)
		// Bounds: .0001 .00025 .0005 .001 .0025 .005 ...
		assert.Equal(t, []uint64{1, 1, 1, 1, 2, 3, 3}, h.Counts[:7])
		assert.EqualValues(t, 3, h.Counts[len(h.Counts)-1])
	})
}

// The preset Server-Timing of a request that did not wait is never written
// into by a handler that adds its own entry.
func TestServerTimingPresetIsNotShared(t *testing.T) {
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, ServerTiming: true})
	r := newEngine(q.Handler(), func(c *gin.Context) {
		c.Writer.Header().Add("Server-Timing", "db;dur=1")
		c.Writer.Header()["Server-Timing"][1] = "db;dur=2" // a handler that edits in place
		c.Status(http.StatusOK)
	})
	for range 3 {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, []string{"queue;dur=0", "db;dur=2"}, w.Header().Values("Server-Timing"))
	}
}

// A deadline on the request's context that passes in the queue (a timeout
// middleware in front) is a queue timeout: 408, not a hang-up.
func TestRequestDeadlineInQueueIsTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute})
		g, r := gated(q)
		out := make(chan result, 2)
		t0 := time.Now()
		send(r, context.Background(), 0, t0, out)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		send(r, ctx, 1, t0, out)
		res := <-out
		assert.Equal(t, result{id: 1, code: http.StatusRequestTimeout, header: res.header, at: 50 * time.Millisecond}, res)
		g.open(1)
		<-out
		st := q.Stats()
		assert.EqualValues(t, 1, st.QueueTimeout)
		assert.Zero(t, st.Canceled)
	})
}

// Requests that ran at once count as zero waits: with most requests on the
// fast path, the median wait is zero.
func TestPercentilesCountFastPathAsZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute})
		r := newEngine(q.Handler(), sleeper(10*time.Millisecond))
		out := make(chan result, 2)
		burst(r, 2, 0, out) // one waits 10 ms
		<-out
		<-out
		for range 8 { // eight run at once
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		}
		st := q.Stats()
		assert.Zero(t, st.WaitP50)
		assert.Zero(t, st.WaitP90)
		assert.InEpsilon(t, 10*time.Millisecond, st.WaitP99, 0.1)
	})
}

// A response an earlier middleware already wrote is left alone by a
// rejection: the outcome is counted, nothing more is written.
func TestRejectionAfterAnEarlierWrite(t *testing.T) {
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 0})
	require.NoError(t, q.Close())
	r := gin.New()
	r.Use(func(c *gin.Context) { c.String(http.StatusOK, "early"); c.Next() }, q.Handler())
	r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "late") })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "early", w.Body.String())
	assert.Empty(t, w.Header().Get("Retry-After"))
	assert.EqualValues(t, 1, q.Stats().Closed)
}

// WaitBuckets hands out a copy: changing it changes nothing in the Queue.
func TestWaitBucketsIsACopy(t *testing.T) {
	b := ginqueue.WaitBuckets()
	require.Len(t, b, len(ginqueue.WaitHistogram{}.Counts))
	assert.InDelta(t, 0.0001, b[0], 1e-12)
	assert.InDelta(t, 60, b[len(b)-1], 1e-12)
	b[0] = 1e9
	assert.InDelta(t, 0.0001, ginqueue.WaitBuckets()[0], 1e-12)
}
