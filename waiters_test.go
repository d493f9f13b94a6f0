// Waiters through the Queue: places in a full queue, grants to weighted requests.

package ginqueue_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
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
	"github.com/ginqueue/ginqueue/backend"
)

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

// A full queue gives the newest waiter of the lowest priority below an
// arrival's to that arrival (503 for the evicted one); an arrival of the
// lowest priority present gets 503.
func TestFullQueueEvictsLowestNewest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := priorityQueue(t, 3, 0)
		g, r := gated(q)
		out := make(chan result, 8)
		sendAt(r, 0, 0, "", out) // runs
		sendAt(r, 1, 1, "", out)
		sendAt(r, 2, 0, "", out)
		sendAt(r, 3, 0, "", out) // the queue is full now: 1(p1), 2(p0), 3(p0)

		sendAt(r, 4, 0, "", out) // lowest priority present: refused
		res := <-out
		assert.Equal(t, result{id: 4, code: http.StatusServiceUnavailable}, res)

		sendAt(r, 5, 2, "", out) // evicts 3, the newest of priority 0
		res = <-out
		assert.Equal(t, result{id: 3, code: http.StatusServiceUnavailable}, res)
		assert.Equal(t, []backend.PriorityCount{{Priority: 2, Queued: 1}, {Priority: 1, Queued: 1}, {Priority: 0, Queued: 1}}, q.Stats().QueuedByPriority)
		sendAt(r, 6, 1, "", out) // evicts 2: the queue length stays, its split does not
		assert.Equal(t, 2, (<-out).id)
		assert.Equal(t, []backend.PriorityCount{{Priority: 2, Queued: 1}, {Priority: 1, Queued: 2}}, q.Stats().QueuedByPriority)
		sendAt(r, 7, 1, "", out) // nobody below priority 1 is left: refused
		assert.Equal(t, result{id: 7, code: http.StatusServiceUnavailable}, <-out)

		assert.Equal(t, 0, <-g.started)
		for _, id := range []int{5, 1, 6} {
			g.open(1)
			assert.Equal(t, id, <-g.started)
		}
		g.open(1)
		for range 4 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
		st := q.Stats()
		assert.EqualValues(t, 4, st.QueueFull)
		assert.EqualValues(t, 4, st.Served)
	})
}

// MaxQueuePerFlow: a flow at its cap gets 503 while other flows are admitted.
func TestPerFlowCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := priorityQueue(t, 10, 2)
		g, r := gated(q)
		out := make(chan result, 8)
		sendAt(r, 0, 0, "A", out) // runs: a running request holds no place
		sendAt(r, 1, 0, "A", out)
		sendAt(r, 2, 0, "A", out)
		sendAt(r, 3, 0, "A", out) // A holds 2 places: refused
		assert.Equal(t, result{id: 3, code: http.StatusServiceUnavailable}, <-out)
		sendAt(r, 4, 0, "B", out)
		sendAt(r, 5, 0, "B", out)
		assert.Equal(t, 4, q.Stats().Queued)
		sendAt(r, 6, 0, "B", out)
		assert.Equal(t, result{id: 6, code: http.StatusServiceUnavailable}, <-out)
		<-g.started
		g.open(1)
		<-g.started // A's 1 leaves the queue: A may queue again
		sendAt(r, 7, 0, "A", out)
		assert.Equal(t, 4, q.Stats().Queued)
		g.open(5)
		for range 4 {
			<-g.started
		}
		for range 6 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
	})
}

// p99 is the 99th percentile of waits (nearest rank).
func p99(waits []time.Duration) time.Duration {
	s := slices.Clone(waits)
	slices.Sort(s)
	return s[int(math.Ceil(0.99*float64(len(s))))-1]
}

// Under a steady mixed load, 3 of 4 requests of cost 1 and 1 of 4 of cost 4,
// on 8 slots at about 70% of their capacity, with exponential handler times
// (mean 10 ms) and Poisson arrivals, for 20 s of a synctest bubble's clock
// (deterministic: a seeded generator, virtual time): the slots in use,
// counted inside the handlers, never exceed the limit, cost-4 requests do
// run beside cost-1 ones, and the p99 wait of the cost-4 requests is within
// twice that of the cost-1 requests (they are not starved: a heavy head
// holds the line until its slots are free, and nobody takes a slot past it).
func TestMixedCostsKeepTheLimitAndServeTheHeavy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 8
		var mu sync.Mutex
		waits := map[int][]time.Duration{} // by cost
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: limit, MaxQueue: 10000, QueueTimeout: time.Minute,
			Cost: byQueryCost,
			OnOutcome: func(c *gin.Context, o ginqueue.Outcome, wait time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				if o == ginqueue.OutcomeServed {
					waits[byQueryCost(c)] = append(waits[byQueryCost(c)], wait)
				}
			}})
		var slots slotMeter
		var heavyBesideLight atomic.Bool
		r := newEngine(q.Handler(), func(c *gin.Context) {
			cost := int64(byQueryCost(c))
			slots.enter(cost)
			if cost == 4 && slots.now.Load() > 4 {
				heavyBesideLight.Store(true)
			}
			us, _ := strconv.Atoi(c.Query("us"))
			time.Sleep(time.Duration(us) * time.Microsecond)
			slots.leave(cost)
			c.Status(http.StatusOK)
		})

		rng := rand.New(rand.NewPCG(14, 4))
		const meanCost, load = 1.75, 0.7
		rate := load * limit / (meanCost * 0.010) // requests per second
		codes := make(chan int, 1<<16)
		sent := 0
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); sent++ {
			time.Sleep(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
			cost := 1
			if rng.IntN(4) == 0 {
				cost = 4
			}
			target := fmt.Sprintf("/?c=%d&us=%d", cost, int(rng.ExpFloat64()*10000))
			go func() {
				w := httptest.NewRecorder()
				r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, target, nil))
				codes <- w.Code
			}()
		}
		for range sent {
			require.Equal(t, http.StatusOK, <-codes)
		}

		assert.LessOrEqual(t, slots.peak.Load(), int64(limit), "more slots in use than the limit")
		assert.True(t, heavyBesideLight.Load(), "cost-4 requests never ran beside cost-1 ones")
		mu.Lock()
		light, heavy := p99(waits[1]), p99(waits[4])
		n1, n4 := len(waits[1]), len(waits[4])
		mu.Unlock()
		t.Logf("%d requests: %d of cost 1 (p99 wait %v), %d of cost 4 (p99 wait %v)", sent, n1, light, n4, heavy)
		assert.Greater(t, n4, sent/5)
		assert.Positive(t, light, "nobody queued: the load tells nothing")
		assert.LessOrEqual(t, heavy, 2*light, "the cost-4 requests wait too long")
		st := q.Stats()
		assert.Zero(t, st.Running)
		assert.EqualValues(t, sent, st.Served, "Served counts requests, not slots")
	})
}
