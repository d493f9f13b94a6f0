package ginqueue_test

import (
	"context"
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

	"github.com/ginqueue/ginqueue"
)

// Through a real Queue: 100 closed-loop clients, handlers whose time has an
// ordinary spread around 50 ms whatever the load (a backend that is never
// overloaded). Without Adaptive the 100 slots serve about 2000/s. The
// adaptive limit, from MaxLimit 100, has no reason to fall: it must keep
// most of the throughput and stay in the upper half most of the time.
func TestAdaptiveSpreadLatencyKeepsThroughput(t *testing.T) {
	const mean = 50 * time.Millisecond
	for _, d := range []struct {
		name string
		draw func(r *rand.Rand) time.Duration
	}{
		{"exponential", func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * float64(mean)) }},
		// mean exp(σ²/2) × 44 ms ≈ 50 ms
		{"lognormal σ0.5", func(r *rand.Rand) time.Duration { return time.Duration(44e6 * math.Exp(0.5*r.NormFloat64())) }},
	} {
		for _, alg := range []ginqueue.Algorithm{ginqueue.Gradient, ginqueue.AIMD} {
			t.Run(d.name+" "+alg.String(), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					const clients, hi = 100, 100
					b := &recordingSetter{Backend: ginqueue.NewMemoryBackend()}
					q := mustQueue(t, ginqueue.Config{MaxConcurrent: hi, MaxQueue: 1000, QueueTimeout: time.Hour, Backend: b,
						Adaptive: &ginqueue.AdaptiveConfig{MinLimit: 1, MaxLimit: hi, Algorithm: alg}})
					var mu sync.Mutex
					rng := rand.New(rand.NewPCG(7, 8))
					var served atomic.Int64
					r := newEngine(q.Handler(), func(c *gin.Context) {
						mu.Lock()
						took := d.draw(rng)
						mu.Unlock()
						time.Sleep(took)
						served.Add(1)
						c.Status(http.StatusOK)
					})
					var stop atomic.Bool
					var wg sync.WaitGroup
					for range clients {
						wg.Go(func() {
							for !stop.Load() {
								r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil))
							}
						})
					}
					time.Sleep(10 * time.Second) // settle
					from := served.Load()
					var limits []int
					for range 100 {
						time.Sleep(100 * time.Millisecond)
						limits = append(limits, q.Stats().Limit)
					}
					tput := float64(served.Load()-from) / 10
					stop.Store(true)
					wg.Wait()
					slices.Sort(limits)
					set := b.limits()
					t.Logf("throughput %.0f/s of about 2000/s, median limit %d, %d SetLimit calls, %d of them probes at 1; first %v",
						tput, limits[50], len(set), countOf(set, 1), set[:min(len(set), 16)])
					assert.GreaterOrEqual(t, tput, 0.5*2000, "throughput under a load that is not overloaded")
					assert.GreaterOrEqual(t, limits[50], hi/2, "median limit")
				})
			})
		}
	}
}

func countOf(s []int, v int) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

// With Adaptive on and the limit thrown far below the running count (by
// SetLimit and by the algorithm, whose windows are slow), under arrivals
// that time out, overflow the queue and hang up: every request gets exactly
// one outcome, Stats counters never go down, and Served >= Running in every
// snapshot.
func TestAdaptiveCountersAndOutcomes(t *testing.T) {
	for _, alg := range []ginqueue.Algorithm{ginqueue.Gradient, ginqueue.AIMD} {
		t.Run(alg.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const requests = 3000
				var outcomes sync.Map // request id -> *atomic.Int32
				var hookCalls atomic.Int64
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: 64, MaxQueue: 40, QueueTimeout: 300 * time.Millisecond,
					Adaptive: &ginqueue.AdaptiveConfig{MinLimit: 1, MaxLimit: 64, Algorithm: alg, Window: 5, ProbeEvery: 3},
					OnOutcome: func(c *gin.Context, o ginqueue.Outcome, _ time.Duration) {
						hookCalls.Add(1)
						v, _ := outcomes.LoadOrStore(c.Query("id"), new(atomic.Int32))
						v.(*atomic.Int32).Add(1)
					}})
				var inflight atomic.Int64
				var mu sync.Mutex
				rng := rand.New(rand.NewPCG(3, 4))
				r := newEngine(q.Handler(), func(c *gin.Context) {
					n := inflight.Add(1)
					time.Sleep(time.Duration(n) * time.Millisecond) // slower with every one in flight
					inflight.Add(-1)
					c.Status(http.StatusOK)
				})
				bad := make(chan string, 16)
				done := make(chan struct{})
				go func() { // Stats watcher
					var prev ginqueue.Stats
					for {
						select {
						case <-done:
							close(bad)
							return
						default:
						}
						st := q.Stats()
						if st.Served < uint64(st.Running) {
							select {
							case bad <- "Served below Running":
							default:
							}
						}
						if st.Served < prev.Served || st.QueueFull < prev.QueueFull || st.QueueTimeout < prev.QueueTimeout ||
							st.Canceled < prev.Canceled || st.Closed < prev.Closed {
							select {
							case bad <- "a counter went down":
							default:
							}
						}
						prev = st
						time.Sleep(time.Millisecond)
					}
				}()
				codes := make(chan int, requests)
				var wg sync.WaitGroup
				for i := range requests {
					mu.Lock()
					gap := time.Duration(rng.IntN(400)) * time.Microsecond
					hang := rng.IntN(10) == 0
					mu.Unlock()
					time.Sleep(gap)
					if i%500 == 250 {
						if err := q.SetLimit(1); err != nil {
							t.Errorf("SetLimit: %v", err)
						}
					}
					wg.Go(func() {
						ctx, cancel := context.WithCancel(context.Background())
						defer cancel()
						if hang {
							time.AfterFunc(50*time.Millisecond, cancel)
						}
						w := httptest.NewRecorder()
						r.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodGet, "/?id="+itoa(i), nil))
						codes <- w.Code
					})
				}
				wg.Wait()
				close(done)
				for s := range bad {
					t.Error(s)
				}
				close(codes)
				n := 0
				for range codes {
					n++
				}
				assert.Equal(t, requests, n)
				assert.EqualValues(t, requests, hookCalls.Load(), "OnOutcome calls")
				multi := 0
				outcomes.Range(func(_, v any) bool {
					if v.(*atomic.Int32).Load() != 1 {
						multi++
					}
					return true
				})
				assert.Zero(t, multi, "requests with other than one outcome")
				st := q.Stats()
				assert.EqualValues(t, requests, st.Served+st.QueueFull+st.QueueTimeout+st.Canceled+st.Closed, "%+v", st)
				assert.Zero(t, st.Running)
				t.Logf("%+v", st)
			})
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
