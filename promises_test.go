package ginqueue_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
)

// Tests of the figures that users and their clients act on: Retry-After,
// RejectEarly, Served and Running, the counters and the histogram.

// drainOf returns how long q's queue takes to empty from now, in fake time.
func drainOf(q *ginqueue.Queue) time.Duration {
	t0 := time.Now()
	for q.Stats().Queued > 0 {
		time.Sleep(time.Millisecond)
	}
	return time.Since(t0)
}

// retryAfterSeconds parses a Retry-After header; -1 if missing or bad.
func retryAfterSeconds(h http.Header) int {
	n, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil {
		return -1
	}
	return n
}

// After load and a long idle period, the first rejections of a burst tell
// clients about how long the queue really takes to drain: within 2× of it,
// never below a second. An idle period does not enter the estimate.
func TestRetryAfterAfterIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 8, MaxQueue: 64, QueueTimeout: 10 * time.Second})
		r := newEngine(q.Handler(), sleeper(20*time.Millisecond))
		out := make(chan result, 4096)
		// 3 s at 800/s against a capacity of 400/s.
		t0 := time.Now()
		for i := range 2400 {
			send(r, context.Background(), i, t0, out)
			time.Sleep(1250 * time.Microsecond)
		}
		time.Sleep(3 * time.Minute)
		for range 2400 {
			<-out
		}
		for round := range 10 { // a burst a second for 10 s
			t1 := time.Now()
			for i := range 100 {
				send(r, context.Background(), i, t1, out)
			}
			synctest.Wait()
			drain := drainOf(q)
			limit := max(time.Second, 2*drain)
			rejected := 0
			for range 100 {
				res := <-out
				if res.code != http.StatusServiceUnavailable {
					continue
				}
				rejected++
				ra := time.Duration(retryAfterSeconds(res.header)) * time.Second
				assert.GreaterOrEqual(t, ra, time.Second, "round %d: never below a second", round)
				assert.LessOrEqual(t, ra, limit, "round %d: the queue drained in %v", round, drain)
				assert.GreaterOrEqual(t, ra, drain/2, "round %d: the queue drained in %v", round, drain)
			}
			assert.Equal(t, 100-8-64, rejected, "round %d", round)
			time.Sleep(time.Second - time.Since(t1))
		}
	})
}

// When the limit changes, Retry-After follows the new rate of service.
func TestRetryAfterFollowsTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 8, QueueTimeout: time.Minute})
		r := newEngine(q.Handler(), sleeper(time.Second))
		out := make(chan result, 64)
		burst(r, 1, 0, out) // times the handler: 1 s
		time.Sleep(time.Second)
		<-out
		burst(r, 12, 1, out) // 4 run, 8 wait
		burst(r, 1, 13, out)
		res := <-out
		assert.Equal(t, http.StatusServiceUnavailable, res.code)
		assert.Equal(t, "3", res.header.Get("Retry-After"), "(8 + 1) × 1 s / 4 slots, rounded up")
		require.NoError(t, q.SetLimit(1))
		burst(r, 1, 14, out)
		res = <-out
		assert.Equal(t, "9", res.header.Get("Retry-After"), "(8 + 1) × 1 s / 1 slot")
		require.NoError(t, q.SetLimit(4))
		for range 12 {
			<-out
		}
	})
}

// RejectEarly counts only who would be served before an arrival: a request
// of a higher priority, or the first of a new flow, that would run soon is
// admitted while the low-priority queue is long.
func TestRejectEarlyCountsOnlyThoseAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 250 * time.Millisecond,
			RejectEarly: true, Priority: byQueryPriority, FlowKey: byQueryFlow})
		r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
		out := make(chan result, 16)
		sendAt(r, 0, 0, "A", out) // times the handler: 100 ms
		time.Sleep(100 * time.Millisecond)
		require.Equal(t, http.StatusOK, (<-out).code)

		sendAt(r, 1, 0, "A", out) // runs
		sendAt(r, 2, 0, "A", out) // 100 ms ahead: waits
		sendAt(r, 3, 0, "A", out) // 200 ms: waits
		sendAt(r, 4, 0, "A", out) // 300 ms > 250 ms: refused
		res := <-out
		assert.Equal(t, 4, res.id)
		assert.Equal(t, http.StatusServiceUnavailable, res.code, "its expected wait is past QueueTimeout")

		sendAt(r, 5, 1, "A", out) // a higher priority: next, 100 ms
		sendAt(r, 6, 0, "B", out) // a new flow: after one turn of A and the priority 1, 300 ms: refused
		res = <-out
		assert.Equal(t, 6, res.id)
		assert.Equal(t, http.StatusServiceUnavailable, res.code)
		got := map[int]int{}
		for range 4 {
			res := <-out
			got[res.id] = res.code
		}
		assert.Equal(t, map[int]int{1: 200, 2: 200, 3: 408, 5: 200}, got,
			"the priority-1 arrival ran second; 3 waited past its timeout")
		assert.EqualValues(t, 2, q.Stats().QueueFull)
	})
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 250 * time.Millisecond,
			RejectEarly: true, FlowKey: byQueryFlow})
		r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
		out := make(chan result, 16)
		sendAt(r, 0, 0, "A", out)
		time.Sleep(100 * time.Millisecond)
		<-out
		for id := 1; id <= 3; id++ {
			sendAt(r, id, 0, "A", out) // 1 runs, 2 and 3 wait
		}
		sendAt(r, 4, 0, "B", out) // a new flow: one turn of A ahead, 200 ms
		got := map[int]int{}
		for range 4 {
			res := <-out
			got[res.id] = res.code
		}
		assert.Equal(t, map[int]int{1: 200, 2: 200, 3: 408, 4: 200}, got, "the new flow's first request was admitted and ran")
	})
}

// RejectEarly estimates what the slots can serve, not what clients asked
// for: after 30 s of light traffic, a burst that fits in QueueTimeout is
// served, none refused.
func TestRejectEarlyAfterLightTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 16, QueueTimeout: 500 * time.Millisecond, RejectEarly: true})
		r := newEngine(q.Handler(), sleeper(10*time.Millisecond))
		out := make(chan result, 64)
		for i := range 30 {
			burst(r, 1, i, out)
			time.Sleep(time.Second)
			require.Equal(t, http.StatusOK, (<-out).code)
		}
		burst(r, 8, 100, out)
		for range 8 {
			res := <-out
			assert.Equal(t, http.StatusOK, res.code, "request %d would wait 10 ms", res.id)
		}
		assert.Zero(t, q.Stats().QueueFull)
	})
}

// A client that left before it could queue takes nobody's place: a full
// queue evicts no waiter for it.
func TestGoneClientEvictsNobody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute, Priority: byQueryPriority})
		g, r := gated(q)
		out := make(chan result, 4)
		sendAt(r, 0, 0, "", out) // holds the slot
		<-g.started
		sendAt(r, 1, 0, "", out) // waits
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodGet, "/?id=2&p=5", nil))
		assert.Equal(t, ginqueue.StatusClientClosedRequest, w.Code)
		st := q.Stats()
		assert.Equal(t, 1, st.Queued, "the waiter kept its place")
		assert.Zero(t, st.QueueFull)
		assert.EqualValues(t, 1, st.Canceled)
		g.open(1)
		<-g.started
		g.open(1)
		assert.Equal(t, http.StatusOK, (<-out).code)
		assert.Equal(t, http.StatusOK, (<-out).code)
	})
}

// statsWatch checks, at every look, what Prometheus and dashboards rely on:
// counters and histogram buckets never go down, Served >= Running, the split
// by priority adds up to Queued, DrainRate is finite and not negative, the
// percentiles are ordered.
type statsWatch struct {
	mu    sync.Mutex // serializes looks, so "before" means before
	last  ginqueue.Stats
	lastH ginqueue.WaitHistogram
	fails []string
}

func (w *statsWatch) look(q *ginqueue.Queue) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st, h := q.Stats(), q.WaitHistogram()
	bad := func(format string, args ...any) {
		if len(w.fails) < 10 {
			w.fails = append(w.fails, fmt.Sprintf(format, args...))
		}
	}
	counters := func(s ginqueue.Stats) [5]uint64 {
		return [5]uint64{s.Served, s.QueueFull, s.QueueTimeout, s.Canceled, s.Closed}
	}
	if now, was := counters(st), counters(w.last); now[0] < was[0] || now[1] < was[1] || now[2] < was[2] || now[3] < was[3] || now[4] < was[4] {
		bad("a counter went down: %v after %v", now, was)
	}
	if uint64(max(st.Running, 0)) > st.Served || st.Running < 0 {
		bad("Running %d with Served %d", st.Running, st.Served)
	}
	sum := 0
	for _, p := range st.QueuedByPriority {
		sum += p.Queued
	}
	if sum != st.Queued || (st.Queued == 0) != (st.QueuedByPriority == nil) {
		bad("Queued %d but the split %v", st.Queued, st.QueuedByPriority)
	}
	if math.IsNaN(st.DrainRate) || math.IsInf(st.DrainRate, 0) || st.DrainRate < 0 || st.DrainRate > 1e9 {
		bad("DrainRate %v", st.DrainRate)
	}
	if st.WaitP50 > st.WaitP90 || st.WaitP90 > st.WaitP99 || st.WaitP50 < 0 {
		bad("percentiles %v %v %v", st.WaitP50, st.WaitP90, st.WaitP99)
	}
	if h.Count < w.lastH.Count || h.Sum < w.lastH.Sum {
		bad("histogram count or sum went down: %d %v after %d %v", h.Count, h.Sum, w.lastH.Count, w.lastH.Sum)
	}
	for i := range h.Counts {
		if h.Counts[i] < w.lastH.Counts[i] {
			bad("bucket %d went down: %d after %d", i, h.Counts[i], w.lastH.Counts[i])
		}
		if i > 0 && h.Counts[i] < h.Counts[i-1] || h.Counts[i] > h.Count {
			bad("buckets not cumulative: %v of %d", h.Counts, h.Count)
		}
	}
	w.last, w.lastH = st, h
}

func (w *statsWatch) check(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Empty(t, w.fails)
}

// In real time, with priorities, hang-ups and the limit moving up and down,
// a reader that looks at Stats and WaitHistogram as fast as it can never
// sees a counter or a bucket go down, Served below Running, a split that
// does not add up or a wild drain rate.
func TestStatsNeverContradictThemselves(t *testing.T) {
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 64, QueueTimeout: 20 * time.Millisecond,
		Priority: byQueryPriority, FlowKey: byQueryFlow})
	r := newEngine(q.Handler(), func(c *gin.Context) {
		time.Sleep(time.Duration(len(c.Query("id"))) * 50 * time.Microsecond)
		c.Status(http.StatusOK)
	})
	var w statsWatch
	stop := make(chan struct{})
	var readers, clients sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					w.look(q)
				}
			}
		})
	}
	readers.Go(func() { // the limit moves: raises wake many waiters at once
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				_ = q.SetLimit([]int{1, 32, 2, 64, 4}[i%5])
			}
		}
	})
	var sent atomic.Int64
	deadline := time.Now().Add(1500 * time.Millisecond)
	for c := range 32 {
		clients.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%7)*time.Millisecond)
				target := fmt.Sprintf("/?id=%d&p=%d&flow=%d", i%1000, i%3, c%4)
				r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(ctx, http.MethodGet, target, nil))
				cancel()
				sent.Add(1)
			}
		})
	}
	clients.Wait()
	close(stop)
	readers.Wait()
	w.look(q)
	w.check(t)
	st := q.Stats()
	assert.EqualValues(t, sent.Load(), st.Served+st.QueueFull+st.QueueTimeout+st.Canceled+st.Closed, "one outcome per request")
	assert.Equal(t, 0, st.Running)
}

// RejectEarly counts only the waiters that would be served before an
// arrival: a second request of the flow whose turn is next waits behind one
// turn of each other flow, not two, and is served after about 1.05 s of a
// 1.5 s QueueTimeout, with RejectEarly as without.
func TestRejectEarlyCountsTurnsFromTheCursor(t *testing.T) {
	for _, early := range []bool{false, true} {
		t.Run(fmt.Sprint("RejectEarly=", early), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 64, QueueTimeout: 1500 * time.Millisecond,
					RejectEarly: early, FlowKey: byQueryFlow})
				r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
				out := make(chan result, 64)
				// Nothing is measured yet, so nobody is refused while the queue fills.
				sendAt(r, 0, 0, "X", out) // runs, 0-100 ms; timed
				sendAt(r, 1, 0, "Z", out) // ring Z, A, B..J; cursor on Z
				sendAt(r, 2, 0, "A", out)
				id := 3
				for _, f := range []string{"B", "C", "D", "E", "F", "G", "H", "I", "J"} {
					sendAt(r, id, 0, f, out)
					sendAt(r, id+1, 0, f, out)
					id += 2
				}
				time.Sleep(150 * time.Millisecond) // X done (100 ms measured), Z runs, the cursor is on A
				synctest.Wait()
				<-out // X
				// A's second request: ahead of it are A's first and one of each
				// of B..J, 10 in all, after Z's remaining 50 ms: it starts at
				// 1.2 s, 1.05 s after it arrived, and ends at 1.3 s.
				t0 := time.Now()
				sendAt(r, 100, 0, "A", out)
				var code int
				var took time.Duration
				for res := range out {
					if res.id == 100 {
						code, took = res.code, time.Since(t0)
						break
					}
				}
				assert.Equal(t, http.StatusOK, code, "answered %d after %v; it would wait about 1.05 s of 1.5 s", code, took)
				if code == http.StatusOK {
					assert.Equal(t, 1150*time.Millisecond, took, "waited 1.05 s, ran 100 ms")
				}
				_ = q.Close()
				time.Sleep(time.Second) // let the running handler end
			})
		})
	}
}

// Retry-After is at most QueueTimeout, also when QueueTimeout is not a whole
// number of seconds.
func TestRetryAfterNeverAboveQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: 1500 * time.Millisecond})
		r := newEngine(q.Handler(), sleeper(3*time.Second))
		out := make(chan result, 8)
		burst(r, 1, 0, out) // times the handler: 3 s
		time.Sleep(3 * time.Second)
		<-out
		burst(r, 3, 1, out) // 1 runs, 2 waits, 3 is refused
		res := <-out
		require.Equal(t, http.StatusServiceUnavailable, res.code)
		ra := time.Duration(retryAfterSeconds(res.header)) * time.Second
		assert.LessOrEqual(t, ra, 1500*time.Millisecond, "Retry-After %v is past QueueTimeout 1.5 s", ra)
		res = <-out // the waiter's 408
		require.Equal(t, http.StatusRequestTimeout, res.code)
		ra = time.Duration(retryAfterSeconds(res.header)) * time.Second
		assert.LessOrEqual(t, ra, 1500*time.Millisecond, "408 Retry-After %v is past QueueTimeout 1.5 s", ra)
		<-out
	})
}

// With Adaptive, the limit sits at MinLimit for a probe of ten samples (at
// start and every ProbeEvery windows). RejectEarly and Retry-After estimate
// with the limit outside the probe: a burst that is served within about a
// second of a 2 s QueueTimeout is not refused, and Retry-After stays within
// 2× of the real drain.
func TestRejectEarlyDuringAdaptiveProbe(t *testing.T) {
	for _, early := range []bool{false, true} {
		t.Run(fmt.Sprint("RejectEarly=", early), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: 32, MaxQueue: 40, QueueTimeout: 2 * time.Second,
					RejectEarly: early, Adaptive: &ginqueue.AdaptiveConfig{MinLimit: 1, MaxLimit: 64}})
				r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
				out := make(chan result, 64)
				burst(r, 1, 0, out) // times the handler (100 ms); the first probe sample
				time.Sleep(100 * time.Millisecond)
				require.Equal(t, http.StatusOK, (<-out).code)
				require.Equal(t, 1, q.Stats().Limit, "probing")
				t0 := time.Now()
				burst(r, 40, 1, out)
				codes := map[int]int{}
				var last time.Duration
				for range 40 {
					res := <-out
					codes[res.code]++
					if res.code == http.StatusOK {
						last = max(last, time.Since(t0))
					}
				}
				t.Logf("codes %v, the last served finished %v after the burst; limit now %d", codes, last, q.Stats().Limit)
				assert.Equal(t, 40, codes[http.StatusOK],
					"the whole burst can be served within %v of a 2 s QueueTimeout", last)
			})
		})
	}
}

// Retry-After during the same probe: within 2× of the real time to drain.
func TestRetryAfterDuringAdaptiveProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 32, MaxQueue: 30, QueueTimeout: 10 * time.Second,
			Adaptive: &ginqueue.AdaptiveConfig{MinLimit: 1, MaxLimit: 64}})
		r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
		out := make(chan result, 64)
		burst(r, 1, 0, out)
		time.Sleep(100 * time.Millisecond)
		<-out
		burst(r, 32, 1, out) // 1 runs, 30 wait, 1 refused
		res := <-out
		require.Equal(t, http.StatusServiceUnavailable, res.code)
		drain := drainOf(q)
		ra := time.Duration(retryAfterSeconds(res.header)) * time.Second
		t.Logf("Retry-After %v, queue drained in %v", ra, drain)
		assert.LessOrEqual(t, ra, max(time.Second, 2*drain), "Retry-After %v, the queue drained in %v", ra, drain)
		for range 31 {
			<-out
		}
	})
}
