package ginqueue_test

import (
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
)

// byQueryCost is a Config.Cost that reads the cost from the query ("c").
func byQueryCost(c *gin.Context) int { n, _ := strconv.Atoi(c.Query("c")); return n }

// slotMeter is a handler's own count of the slots in use: each request adds
// its cost on entry and takes it off before it returns (so before its slots
// are released), and the highest count seen is kept.
type slotMeter struct {
	now, peak atomic.Int64
}

func (m *slotMeter) enter(cost int64) {
	n := m.now.Add(cost)
	for p := m.peak.Load(); n > p && !m.peak.CompareAndSwap(p, n); p = m.peak.Load() {
	}
}

func (m *slotMeter) leave(cost int64) { m.now.Add(-cost) }

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

// The Queue counts a cost below 1 as 1; the Backend grants a cost above the
// limit as the whole limit, so the request runs alone. Running counts slots,
// Served requests.
func TestCostIsClampedByTheQueue(t *testing.T) {
	for _, tt := range []struct {
		cost  string
		slots int
	}{{"0", 1}, {"-5", 1}, {"1", 1}, {"3", 3}, {"14", 4}, {strconv.Itoa(math.MaxInt), 4}} {
		t.Run("cost "+tt.cost, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: time.Minute, Cost: byQueryCost})
				g := newGate()
				r := newEngine(q.Handler(), g.handler)
				out := make(chan int, 2)
				get := func(target string) {
					go func() {
						w := httptest.NewRecorder()
						r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, target, nil))
						out <- w.Code
					}()
					synctest.Wait()
				}
				get("/?c=" + tt.cost)
				<-g.started
				assert.Equal(t, tt.slots, q.Stats().Running)
				get("/?c=1") // runs beside it only if a slot is left
				st := q.Stats()
				if tt.slots == 4 {
					assert.Equal(t, [2]int{4, 1}, [2]int{st.Running, st.Queued}, "running, queued")
				} else {
					<-g.started
					assert.Equal(t, [2]int{tt.slots + 1, 0}, [2]int{st.Running, st.Queued}, "running, queued")
				}
				g.open(2)
				for range 2 {
					assert.Equal(t, http.StatusOK, <-out)
				}
				st = q.Stats()
				assert.Equal(t, [2]int{0, 2}, [2]int{st.Running, int(st.Served)}, "running, served")
			})
		})
	}
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

// limitsRecorder is a Backend that records the Limits it was started with.
type limitsRecorder struct {
	ginqueue.FastBackend
	limits ginqueue.Limits
}

func (b *limitsRecorder) Start(l ginqueue.Limits) error { b.limits = l; return b.FastBackend.Start(l) }

// Limits.Weighted tells the Backend whether Config.Cost is set, so that one
// that cannot count slots can refuse it; and a FastBackend sees TryAcquire
// for cost-1 requests only, Acquire with Arrival.Cost for the others.
func TestBackendsLearnOfCosts(t *testing.T) {
	for _, weighted := range []bool{false, true} {
		b := &limitsRecorder{FastBackend: ginqueue.NewMemoryBackend().(ginqueue.FastBackend)}
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

// The adaptive limit works on slots: with a mix of cost-1 and cost-4
// requests whose handler time grows once more than 6 slots are in use, the
// limit moves within [MinLimit, MaxLimit] (its probes hold MinLimit 2, below
// the cost of the heavy requests, which then run on 2 slots alone), every
// request is served, and none is left holding a slot.
func TestAdaptiveWithCosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 8, MaxQueue: 1000, QueueTimeout: time.Minute, Cost: byQueryCost,
			Adaptive: &ginqueue.AdaptiveConfig{MinLimit: 2, MaxLimit: 16}})
		var slots slotMeter
		limits := map[int]bool{}
		var mu sync.Mutex
		r := newEngine(q.Handler(), func(c *gin.Context) {
			cost := int64(byQueryCost(c))
			slots.enter(cost)
			st := q.Stats()
			mu.Lock()
			limits[st.Limit] = true
			mu.Unlock()
			time.Sleep(10 * time.Millisecond * time.Duration(max(1, slots.now.Load()/6)))
			slots.leave(cost)
			c.Status(http.StatusOK)
		})
		var sent, ok, heavy atomic.Int64
		var clients sync.WaitGroup
		end := time.Now().Add(10 * time.Second)
		for i := range 24 {
			clients.Go(func() {
				for j := 0; time.Now().Before(end); j++ {
					cost := 1
					if (i+j)%4 == 0 {
						cost = 4
					}
					w := httptest.NewRecorder()
					r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?c="+strconv.Itoa(cost), nil))
					sent.Add(1)
					if w.Code == http.StatusOK {
						ok.Add(1)
						if cost == 4 {
							heavy.Add(1)
						}
					}
				}
			})
		}
		clients.Wait()
		assert.Equal(t, sent.Load(), ok.Load(), "every request served")
		assert.Positive(t, heavy.Load())
		assert.LessOrEqual(t, slots.peak.Load(), int64(16), "more slots in use than MaxLimit")
		mu.Lock()
		defer mu.Unlock()
		assert.Greater(t, len(limits), 1, "the limit never moved")
		for l := range limits {
			assert.True(t, l >= 2 && l <= 16, "limit %d", l)
		}
		st := q.Stats()
		assert.Zero(t, st.Running)
		assert.EqualValues(t, sent.Load(), st.Served)
		t.Logf("%d requests (%d of cost 4), limits seen %v", sent.Load(), heavy.Load(), limits)
	})
}
