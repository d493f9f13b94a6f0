// RejectEarly and Retry-After, through the Queue.

package ginqueue_test

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
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

// Retry-After counts slots: with every request of cost 4 on 4 slots they run
// one at a time, so one running and two waiting, 1 s each, take 3 s to
// serve, not 3/4 s. The handler time is weighed by the slots it held.
func TestRetryAfterCountsSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 2, QueueTimeout: time.Minute,
			Cost: func(*gin.Context) int { return 4 }})
		r := newEngine(q.Handler(), sleeper(time.Second))
		out := make(chan result, 8)
		burst(r, 1, 0, out)
		time.Sleep(time.Second) // timed: 1 s on 4 slots
		synctest.Wait()
		require.Equal(t, http.StatusOK, (<-out).code)
		burst(r, 3, 1, out) // 1 runs alone, 2 wait
		assert.Equal(t, [2]int{4, 2}, [2]int{q.Stats().Running, q.Stats().Queued})
		burst(r, 1, 4, out)
		res := <-out
		assert.Equal(t, http.StatusServiceUnavailable, res.code)
		assert.Equal(t, "3", res.header.Get("Retry-After"), "(2 waiting + 1) × 1 s × 4 slots / 4 slots")
		for range 3 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
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

// Under LIFO, RejectEarly counts who is served before an arrival in the order
// of the moment: while the queue stands, a new arrival is the next of its
// flow, so the older waiters are not ahead of it. One slot, whose measured
// time is 300 ms, and a QueueTimeout of 1 s: RejectEarly refuses an arrival
// with 3 or more ahead. The queue stands from 2.01 s on with waiters 3, 4
// and 5; waiter 6, arriving at 2.03 s, is served first when the slot frees at
// 2.06 s, and must not be refused for the three older ones.
func TestRejectEarlyUnderLIFOCountsTheNewestFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 100, QueueTimeout: time.Second, RejectEarly: true,
			CoDel: &ginqueue.CoDel{Target: time.Second, Interval: time.Second, LIFO: true}})
		hold := map[int]time.Duration{0: 300 * time.Millisecond, 1: 1060 * time.Millisecond}
		r := newEngine(q.Handler(), func(c *gin.Context) {
			var id int
			_, _ = fmt.Sscan(c.Query("id"), &id)
			time.Sleep(cmp.Or(hold[id], 10*time.Millisecond))
			c.Status(http.StatusOK)
		})
		t0 := time.Now()
		out := make(chan result, 8)
		send(r, context.Background(), 0, t0, out) // measures the slot: 300 ms
		<-out
		for _, a := range []struct {
			id int
			at time.Duration
		}{{1, 1000}, {2, 1010}, {3, 1100}, {4, 1200}, {5, 2020}, {6, 2030}} {
			time.Sleep(a.at*time.Millisecond - time.Since(t0))
			send(r, context.Background(), a.id, t0, out)
		}
		got := map[int]result{}
		for range 6 {
			res := <-out
			got[res.id] = res
		}
		assert.Equal(t, http.StatusRequestTimeout, got[2].code, "waiter 2 is dropped as the queue starts standing")
		require.Equal(t, http.StatusOK, got[6].code, "the newest waiter of a standing LIFO queue was refused")
		for _, id := range []int{3, 4, 5} {
			assert.Equal(t, http.StatusOK, got[id].code, "waiter %d", id)
			assert.Less(t, got[6].at, got[id].at, "waiter 6 is served before waiter %d", id)
		}
	})
}

// RejectEarly with a Backend that is not a FastBackend follows the same
// rule from its Stats: with 100 ms handlers on one slot and a 250 ms
// QueueTimeout, two waiters may be ahead, not three.
func TestRejectEarlyOnAPlainBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 8, QueueTimeout: 250 * time.Millisecond,
			RejectEarly: true, Backend: plainBackend{inmem.New()}})
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

// mixEngine serves GET /?c=<cost>&ms=<handler time> behind q.
func mixEngine(q *ginqueue.Queue) *gin.Engine {
	r := gin.New()
	r.Use(q.Handler())
	r.GET("/", func(c *gin.Context) {
		ms, _ := strconv.Atoi(c.Query("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		c.Status(http.StatusOK)
	})
	return r
}

// serveMix sends rounds of 16 light requests (10 ms, one slot) and one
// other, one at a time, so that the light ones run at once (on the fast
// path, which times one in 16) and a heavy one goes through Acquire (which
// times every request).
func serveMix(t *testing.T, r http.Handler, rounds int, other string) {
	t.Helper()
	for range rounds {
		for i := range 17 {
			url := "/?c=1&ms=10"
			if i == 16 {
				url = "/?" + other
			}
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, url, nil))
			if w.Code != http.StatusOK {
				t.Fatalf("warm-up %s: status %d", url, w.Code)
			}
		}
	}
}

// RejectEarly judges a queue by the mean slot time of the requests served,
// each request counting once whichever path it took: one heavy request in
// 17 must not make the light ones look four times their slot time. After
// 16 light requests (10 ms, one slot) to one heavy (40 ms, four slots), a
// mean slot time of about 19 ms, a burst of 60 light requests on 4 slots,
// the last of which waits 140 ms, fits in a QueueTimeout of 500 ms.
func TestRejectEarlyJudgesTheMixOfCosts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other string // the 17th request of each warm-up round
	}{
		{"one heavy in 17", "c=4&ms=40"},
		{"all light", "c=1&ms=10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 100, QueueTimeout: 500 * time.Millisecond,
					RejectEarly: true, Cost: byQueryCost})
				r := mixEngine(q)
				serveMix(t, r, 30, tc.other) // 60 samples: the decay of the older ones is reached

				const burst = 60
				codes := make(chan int, burst)
				for range burst {
					go func() {
						w := httptest.NewRecorder()
						r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?c=1&ms=10", nil))
						codes <- w.Code
					}()
				}
				synctest.Wait()
				st := q.Stats()
				assert.Equal(t, 4, st.Running)
				assert.Equal(t, burst-4, st.Queued, "the burst, less the 4 that run, waits (the last 140 ms)")
				got := map[int]int{}
				for range burst {
					got[<-codes]++
				}
				assert.Equal(t, map[int]int{http.StatusOK: burst}, got, "statuses of the burst")
				st = q.Stats()
				assert.Zero(t, st.QueueFull, "refused by RejectEarly")
				assert.Zero(t, st.QueueTimeout)
			})
		})
	}
}

// Through the Queue: Cost, Priority, RejectEarly and a client Deadline. A
// cost-4 head holds two free slots; a priority-1 request with a 50 ms client
// deadline would run at once on one of them (Config.Cost: "a waiter of a
// higher priority ... runs at once on free slots that the head is waiting
// for"), but RejectEarly answers it 503 as if it had to wait.
func TestRejectEarlyLetsAHigherPriorityRunOnFreeSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 10, QueueTimeout: time.Second,
			RejectEarly: true, Cost: byQueryCost, Priority: byQueryPriority,
			Deadline: ginqueue.DeadlineHeader("X-Client-Timeout")})
		block := make(chan struct{})
		r := gin.New()
		r.Use(q.Handler())
		r.GET("/", func(c *gin.Context) {
			switch c.Query("h") {
			case "slow":
				time.Sleep(400 * time.Millisecond) // the measured slot time
			case "block":
				<-block
			}
			c.Status(http.StatusOK)
		})
		do := func(url, wait string) <-chan int {
			out := make(chan int, 1)
			go func() {
				req := httptest.NewRequest(http.MethodGet, url, nil)
				if wait != "" {
					req.Header.Set("X-Client-Timeout", wait)
				}
				w := httptest.NewRecorder()
				r.ServeHTTP(w, req)
				out <- w.Code
			}()
			synctest.Wait()
			return out
		}
		require.Equal(t, http.StatusOK, <-do("/?h=slow&c=1", "")) // slot time 400 ms measured
		b1, b2 := do("/?h=block&c=1", ""), do("/?h=block&c=1", "")
		heavy := do("/?c=4", "")
		require.Equal(t, 2, q.Stats().Running)
		require.Equal(t, 1, q.Stats().Queued)

		code := <-do("/?p=1&c=1", "50ms")
		assert.Equal(t, http.StatusOK, code, "a free slot, and a priority above the heavy head's: it runs at once")
		close(block)
		assert.Equal(t, http.StatusOK, <-b1)
		assert.Equal(t, http.StatusOK, <-b2)
		assert.Equal(t, http.StatusOK, <-heavy)
	})
}

// RejectEarly weighs an arrival's expected wait against the smaller of
// QueueTimeout and the time its client has left: with 100 ms handlers on one
// slot, a client that gives 150 ms is admitted first in line and refused at
// once second in line, one that gives 50 ms is refused if it would wait at
// all and runs if a slot is free; a context's deadline counts too. The same
// with a Backend that is not a FastBackend (the rule read from Stats).
func TestDeadlineRejectEarly(t *testing.T) {
	backends := map[string]func() backend.Backend{
		"memory": inmem.New,
		"plain":  func() backend.Backend { return plainBackend{inmem.New()} },
	}
	for name, backend := range backends {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// MinTimeLeft off: this is RejectEarly's arithmetic alone
				// (TestMinTimeLeftWithRejectEarly has the two together).
				q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second,
					RejectEarly: true, MinTimeLeft: -1, Backend: backend()})
				r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
				out := make(chan result, 16)
				sendBy(r, context.Background(), 0, "", time.Now(), out) // times the handler: 100 ms
				require.Equal(t, http.StatusOK, (<-out).code)

				soon, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				defer cancel()
				t0 := time.Now()
				for _, a := range []struct {
					id   int
					ctx  context.Context
					wait string
				}{
					{1, context.Background(), ""},      // runs
					{2, context.Background(), "150ms"}, // first in line: 100 ms, fits
					{3, context.Background(), "150ms"}, // second: 200 ms > 150 ms, refused
					{4, context.Background(), "50ms"},  // any wait is too long: refused
					{5, soon, "1m"},                    // the context's 50 ms: refused
					{6, context.Background(), ""},      // QueueTimeout's 10 s: admitted
					{7, context.Background(), "1m"},    // longer than QueueTimeout: QueueTimeout's
				} {
					sendBy(r, a.ctx, a.id, a.wait, t0, out)
					synctest.Wait()
				}
				got := map[int]int{}
				for range 3 {
					res := <-out
					assert.Zero(t, res.at, "request %d refused at once", res.id)
					got[res.id] = res.code
				}
				assert.Equal(t, map[int]int{3: 503, 4: 503, 5: 503}, got)
				for range 4 {
					res := <-out
					got[res.id] = res.code
				}
				assert.Equal(t, map[int]int{1: 200, 2: 200, 3: 503, 4: 503, 5: 503, 6: 200, 7: 200}, got)

				sendBy(r, context.Background(), 8, "50ms", t0, out)
				assert.Equal(t, http.StatusOK, (<-out).code, "a free slot: no wait, so the time left does not matter")
				st := q.Stats()
				assert.EqualValues(t, 3, st.QueueFull)
				assert.Zero(t, st.QueueTimeout)
			})
		})
	}
	// Without Config.Deadline, RejectEarly looks at QueueTimeout only, as
	// before: the context's deadline ends the wait as a queue timeout.
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second,
			RejectEarly: true})
		r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
		out := make(chan result, 4)
		send(r, context.Background(), 0, time.Now(), out)
		require.Equal(t, http.StatusOK, (<-out).code)
		soon, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		send(r, context.Background(), 1, t0, out)
		synctest.Wait()
		sendBy(r, soon, 2, "1ms", t0, out)
		res := <-out
		assert.Equal(t, result{id: 2, code: http.StatusRequestTimeout, at: 50 * time.Millisecond}, result{id: res.id, code: res.code, at: res.at})
		assert.Equal(t, http.StatusOK, (<-out).code)
	})
}

// After Close an arrival is closed even when RejectEarly would turn it
// away: OnClosed answers, Closed counts it, OnOutcome says closed.
func TestCloseBeatsRejectEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var outcomes outcomeLog
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 500 * time.Millisecond,
			RejectEarly: true,
			OnQueueFull: func(c *gin.Context) { c.String(http.StatusServiceUnavailable, "full") },
			OnClosed:    func(c *gin.Context) { c.String(http.StatusServiceUnavailable, "closed") },
			OnOutcome:   outcomes.add,
		})
		r := newEngine(q.Handler(), sleeper(time.Second))
		out := make(chan result, 4)
		burst(r, 1, 0, out)
		time.Sleep(time.Second) // one finished in a second: an arrival expects to wait 1 s > 500 ms
		assert.Equal(t, http.StatusOK, (<-out).code)
		require.InDelta(t, 1.0, q.Stats().DrainRate, 1e-9)

		burst(r, 1, 1, out) // runs
		burst(r, 1, 2, out) // turned away early
		res := <-out
		assert.Equal(t, result{id: 2, code: http.StatusServiceUnavailable, body: "full", header: res.header}, res)

		require.NoError(t, q.Close())
		burst(r, 1, 3, out)
		res = <-out
		assert.Equal(t, result{id: 3, code: http.StatusServiceUnavailable, body: "closed", header: res.header}, res)
		assert.Equal(t, 1, (<-out).id)

		st := q.Stats()
		assert.EqualValues(t, 1, st.QueueFull)
		assert.EqualValues(t, 1, st.Closed)
		assert.Equal(t, []ginqueue.Outcome{ginqueue.OutcomeServed, ginqueue.OutcomeQueueFull, ginqueue.OutcomeClosed,
			ginqueue.OutcomeServed}, outcomes.get())
	})
}
