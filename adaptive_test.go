// Config.Adaptive through the Queue: the adaptive limit under load.

package ginqueue_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
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
	"github.com/ginqueue/ginqueue/internal/inmem"
)

type nonSetter struct{ backend.Backend }

func TestAdaptiveNeedsLimitSetter(t *testing.T) {
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, Backend: nonSetter{inmem.New()}})
	require.NoError(t, err)
	assert.ErrorContains(t, q.SetLimit(2), "cannot change its limit")
	_, err = ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, Adaptive: &ginqueue.AdaptiveConfig{},
		Backend: nonSetter{inmem.New()}})
	assert.ErrorContains(t, err, "Config.Adaptive needs a Backend that implements backend.LimitSetter")
	for _, tt := range []struct {
		a    ginqueue.AdaptiveConfig
		want string
	}{
		{ginqueue.AdaptiveConfig{MinLimit: -1}, "Config.Adaptive.MinLimit must be in"},
		{ginqueue.AdaptiveConfig{MinLimit: 50, MaxLimit: 10}, "Config.Adaptive.MinLimit 50 exceeds MaxLimit 10"},
		{ginqueue.AdaptiveConfig{Tolerance: 0.5}, "Config.Adaptive.Tolerance must be at least 1, got 0.5"},
		{ginqueue.AdaptiveConfig{Backoff: 1.5}, "Config.Adaptive.Backoff must be in (0, 1), got 1.5"},
		{ginqueue.AdaptiveConfig{Algorithm: 7}, "Config.Adaptive.Algorithm 7 is not Gradient or AIMD"},
		{ginqueue.AdaptiveConfig{MaxLimit: -1}, "Config.Adaptive.MaxLimit must be in"},
		{ginqueue.AdaptiveConfig{MinLimit: backend.MaxLimit + 1}, "Config.Adaptive.MinLimit must be in"},
		{ginqueue.AdaptiveConfig{Tolerance: math.NaN()}, "Config.Adaptive.Tolerance must be at least 1, got NaN"},
		{ginqueue.AdaptiveConfig{Tolerance: math.Inf(1)}, "Config.Adaptive.Tolerance must be at least 1, got +Inf"},
		{ginqueue.AdaptiveConfig{Backoff: -0.5}, "Config.Adaptive.Backoff must be in (0, 1), got -0.5"},
		{ginqueue.AdaptiveConfig{Backoff: math.NaN()}, "Config.Adaptive.Backoff must be in (0, 1), got NaN"},
		{ginqueue.AdaptiveConfig{Window: -1}, "Config.Adaptive.Window must be in [0, 32768], got -1"},
		{ginqueue.AdaptiveConfig{Window: 1<<15 + 1}, "Config.Adaptive.Window must be in [0, 32768], got 32769"},
		{ginqueue.AdaptiveConfig{ProbeEvery: -1}, "Config.Adaptive.ProbeEvery must not be negative, got -1"},
	} {
		cfg := ginqueue.Config{MaxConcurrent: 1, Adaptive: &tt.a}
		assert.ErrorContains(t, cfg.Validate(), tt.want)
	}
}

// simulation is a backend whose service time is s while at most k requests
// run and s × (running/k)² above k, under a steady overload of arrivals.
type simulation struct {
	s       time.Duration
	k       atomic.Int64
	running atomic.Int64

	mu      sync.Mutex
	samples []simSample
}

type simSample struct {
	at      time.Duration // when it finished, since the start
	latency time.Duration // handler time
	limit   int           // the Queue's limit when it finished
	k       int
}

// adaptivePhases is the capacity K of each phase and its length in samples.
var adaptivePhases = []struct{ k, samples int }{{20, 4000}, {10, 4000}, {20, 4000}}

const settleSamples = 2000

func runSimulation(t *testing.T, alg ginqueue.Algorithm, start int) []simSample {
	sim := &simulation{s: 100 * time.Millisecond}
	sim.k.Store(int64(adaptivePhases[0].k))
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: start, MaxQueue: 10_000,
		Adaptive: &ginqueue.AdaptiveConfig{MinLimit: 1, MaxLimit: 200, Algorithm: alg}})
	t0 := time.Now()
	var stop atomic.Bool
	r := gin.New()
	r.Use(q.Handler())
	r.GET("/", func(c *gin.Context) {
		n, k := sim.running.Add(1), sim.k.Load()
		d := sim.s
		if n > k {
			f := float64(n) / float64(k)
			d = time.Duration(float64(d) * f * f)
		}
		time.Sleep(d)
		sim.running.Add(-1)
		sim.mu.Lock()
		sim.samples = append(sim.samples, simSample{at: time.Since(t0), latency: d, limit: q.Stats().Limit, k: int(k)})
		total := len(sim.samples)
		sim.mu.Unlock()
		// Move to the next phase, or stop, after the phase's samples.
		end := 0
		for i, p := range adaptivePhases {
			end += p.samples
			if total == end {
				if i+1 < len(adaptivePhases) {
					sim.k.Store(int64(adaptivePhases[i+1].k))
				} else {
					stop.Store(true)
				}
			}
		}
		c.Status(http.StatusOK)
	})
	var wg sync.WaitGroup
	for range 300 { // closed-loop clients: more than MaxLimit, so always overloaded
		wg.Go(func() {
			for !stop.Load() {
				r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil))
			}
		})
	}
	wg.Wait()
	assert.Positive(t, q.Stats().NoLoadLatency)
	return sim.samples
}

// The adaptive limit, from MinLimit or MaxLimit and with either algorithm,
// settles within [0.7 K, 1.5 K] within 2000 samples, keeps p99 handler time
// within 2 s and throughput at 85% of K/s, and follows K when it halves and
// when it doubles.
func TestAdaptiveLimitFollowsCapacity(t *testing.T) {
	csv := os.Getenv("ADAPTIVE_CSV") // make adaptive-chart writes the runs here
	var rows []string
	for _, alg := range []ginqueue.Algorithm{ginqueue.Gradient, ginqueue.AIMD} {
		for _, start := range []int{1, 200} {
			name := fmt.Sprintf("%v from %d", alg, start)
			t.Run(name, func(t *testing.T) {
				var samples []simSample
				synctest.Test(t, func(t *testing.T) { samples = runSimulation(t, alg, start) })
				from := 0
				for i, p := range adaptivePhases {
					phase := samples[from : from+p.samples]
					settled := phase[settleSamples:]
					lo, hi := 0.7*float64(p.k), 1.5*float64(p.k)
					var lat []time.Duration
					for j, s := range settled {
						if float64(s.limit) < lo || float64(s.limit) > hi {
							t.Errorf("phase %d (K=%d): limit %d at sample %d, outside [%.0f, %.0f]",
								i, p.k, s.limit, from+settleSamples+j, lo, hi)
							break
						}
						lat = append(lat, s.latency)
					}
					slices.Sort(lat)
					p99 := lat[len(lat)*99/100]
					assert.LessOrEqual(t, p99, 200*time.Millisecond, "phase %d: p99 handler time above 2 × s", i)
					span := settled[len(settled)-1].at - settled[0].at
					tput := float64(len(settled)-1) / span.Seconds()
					ideal := float64(p.k) / 0.1
					assert.GreaterOrEqual(t, tput, 0.85*ideal, "phase %d: throughput %.1f/s of %.0f/s", i, tput, ideal)
					t.Logf("phase %d K=%d: p99 %v, throughput %.1f/s (%.0f%% of K/s), final limit %d",
						i, p.k, p99, tput, 100*tput/ideal, settled[len(settled)-1].limit)
					from += p.samples
				}
				for i, s := range samples {
					rows = append(rows, fmt.Sprintf("%s,%d,%d,%.4f,%d,%.4f,%d", alg, start, i, s.at.Seconds(), s.limit, s.latency.Seconds(), s.k))
				}
			})
		}
	}
	if csv != "" {
		data := "algorithm,start,sample,time_s,limit,latency_s,k\n"
		for _, r := range rows {
			data += r + "\n"
		}
		require.NoError(t, os.WriteFile(csv, []byte(data), 0o644))
	}
}

// failingSetter is a Backend whose limit cannot change right now.
type failingSetter struct {
	backend.Backend
	fail bool
}

func (f *failingSetter) SetLimit(n int) error {
	if f.fail {
		return fmt.Errorf("backend down")
	}
	return f.Backend.(backend.LimitSetter).SetLimit(n)
}

// With Adaptive on, SetLimit returns the Backend's error and keeps nothing.
func TestAdaptiveSetLimitReportsBackendError(t *testing.T) {
	b := &failingSetter{Backend: inmem.New()}
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, Backend: b, Adaptive: &ginqueue.AdaptiveConfig{MinLimit: 1, MaxLimit: 50}})
	require.NoError(t, q.SetLimit(8))
	assert.Equal(t, 8, q.Stats().Limit)
	b.fail = true
	assert.ErrorContains(t, q.SetLimit(20), "backend down")
	b.fail = false
	require.NoError(t, q.SetLimit(9))
	assert.Equal(t, 9, q.Stats().Limit)
}

// recordingSetter is a Backend that records every limit it is given.
type recordingSetter struct {
	backend.Backend
	mu   sync.Mutex
	args []int
}

func (r *recordingSetter) SetLimit(n int) error {
	r.mu.Lock()
	r.args = append(r.args, n)
	r.mu.Unlock()
	return r.Backend.(backend.LimitSetter).SetLimit(n)
}

// limits returns the limits given so far.
func (r *recordingSetter) limits() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.args)
}

// assertLimitsWithin checks every limit given to b and every one seen, and
// reports the first outside [lo, hi] of each.
func assertLimitsWithin(t *testing.T, b *recordingSetter, seen []int, lo, hi int) {
	t.Helper()
	outside := func(n int) bool { return n < lo || n > hi }
	if i := slices.IndexFunc(b.limits(), outside); i >= 0 {
		t.Errorf("SetLimit #%d was %d, outside [%d, %d]", i, b.limits()[i], lo, hi)
	}
	if i := slices.IndexFunc(seen, outside); i >= 0 {
		t.Errorf("request %d saw limit %d, outside [%d, %d]", i, seen[i], lo, hi)
	}
}

// Handlers that take no time at all (a plain c.Status(204), or an auth
// middleware answering 401 at once) give windows whose mean is under the 1 µs
// resolution. The limit stays valid and, outside probes, where it started:
// instant handlers are no reason to lower it.
func TestAdaptiveInstantHandlers(t *testing.T) {
	for _, alg := range []ginqueue.Algorithm{ginqueue.Gradient, ginqueue.AIMD} {
		t.Run(alg.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const start, lo, hi, clients, each = 8, 1, 64, 64, 50
				b := &recordingSetter{Backend: inmem.New()}
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: start, MaxQueue: 1000, QueueTimeout: time.Minute, Backend: b,
					Adaptive: &ginqueue.AdaptiveConfig{MinLimit: lo, MaxLimit: hi, Algorithm: alg, Window: 10, ProbeEvery: 3}})
				seen := make(chan int, clients*each+200)
				r := newEngine(q.Handler(), func(c *gin.Context) {
					seen <- q.Stats().Limit
					c.Status(http.StatusNoContent)
				})
				codes := make(chan int, clients*each)
				var wg sync.WaitGroup
				for range clients {
					wg.Go(func() {
						for range each {
							w := httptest.NewRecorder()
							r.ServeHTTP(w, httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil))
							codes <- w.Code
						}
					})
				}
				wg.Wait()
				close(codes)
				for code := range codes {
					require.Equal(t, http.StatusNoContent, code)
				}
				var all []int
				for range clients * each {
					all = append(all, <-seen)
				}
				// Then one at a time, for five cycles of three windows and a probe.
				var after []int
				for range 200 {
					w := httptest.NewRecorder()
					r.ServeHTTP(w, httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil))
					require.Equal(t, http.StatusNoContent, w.Code)
					after = append(after, <-seen)
				}
				assertLimitsWithin(t, b, append(all, after...), lo, hi)
				last := 0 // the last limit seen outside a probe (which holds MinLimit)
				for _, n := range after {
					if n != lo {
						last = n
					}
				}
				assert.GreaterOrEqual(t, last, start, "the limit outside probes, seen by the last requests %v", after[len(after)-40:])
				assert.Equal(t, time.Microsecond, q.Stats().NoLoadLatency, "under the resolution counts as 1 µs")
			})
		})
	}
}

// A burst of fast responses (instant 401s, or 200 µs cache hits) under a
// steady load of 10 ms handlers, then the 10 ms handlers again: the limit
// may fall while the burst's latency stands as the no-load latency, but it
// reaches its floor (MinLimit 4) and, measured again there, climbs back
// above it within a bounded number of windows, and stays above it.
//
// The bound, in windows (one SetLimit each) after the burst's last response:
// at most 2 windows that still hold burst samples; then the fall from
// MaxLimit 40 to the floor while every window looks slow, Gradient at least
// halving (limit/2 + max(1, √limit/2): 40 → 23.2 → 14.0 → 8.9 → 5.9 → 4.2,
// rounded 4, in 5 windows), AIMD by × 0.9 (40 × 0.9ⁿ < 4.5 for n = 21); one
// window at the floor measures no-load latency as 10 ms; then growth to the
// next whole limit, Gradient by ≥ 0.2 per window (3 windows), AIMD by 1 (1
// window). Gradient: 2 + 5 + 1 + 3 = 11; AIMD: 2 + 21 + 1 + 1 = 25.
func TestAdaptiveRecoversAfterFastBurst(t *testing.T) {
	for _, tt := range []struct {
		alg    ginqueue.Algorithm
		burst  time.Duration // handler time of the burst's responses
		within int           // windows
	}{
		{ginqueue.Gradient, 0, 11},
		{ginqueue.Gradient, 200 * time.Microsecond, 11},
		{ginqueue.AIMD, 0, 25},
		{ginqueue.AIMD, 200 * time.Microsecond, 25},
	} {
		t.Run(fmt.Sprintf("%v after %v", tt.alg, tt.burst), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const lo, hi, clients, burstSize = 4, 40, 40, 400
				b := &recordingSetter{Backend: inmem.New()}
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: hi, MaxQueue: 1000, QueueTimeout: time.Minute, Backend: b,
					Adaptive: &ginqueue.AdaptiveConfig{MinLimit: lo, MaxLimit: hi, Algorithm: tt.alg}})
				var burst atomic.Int64        // fast responses still to give
				var burstDone atomic.Int64    // fast responses their clients have read
				burstEnd := make(chan int, 1) // the number of limits set when the burst ended
				r := newEngine(q.Handler(), func(c *gin.Context) {
					if n := burst.Add(-1); n >= 0 {
						time.Sleep(tt.burst)
						c.Status(http.StatusUnauthorized)
						return
					}
					time.Sleep(10 * time.Millisecond)
					c.Status(http.StatusOK)
				})
				var stop atomic.Bool
				codes := make(chan int, clients)
				var wg sync.WaitGroup
				for range clients { // closed loop: every slot in use
					wg.Go(func() {
						bad := 0
						for !stop.Load() {
							w := httptest.NewRecorder()
							r.ServeHTTP(w, httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil))
							// The burst ends when its last response is read:
							// its handler time, and every window it closed,
							// have been counted by then.
							if w.Code == http.StatusUnauthorized && burstDone.Add(1) == burstSize {
								burstEnd <- len(b.limits())
							}
							if w.Code != http.StatusOK && w.Code != http.StatusUnauthorized {
								bad = w.Code
							}
						}
						codes <- bad
					})
				}
				time.Sleep(time.Second) // normal load: the limit at MaxLimit
				burst.Store(burstSize)
				time.Sleep(3 * time.Second)
				stop.Store(true)
				wg.Wait()
				for range clients {
					assert.Zero(t, <-codes, "a response other than 200 or 401")
				}
				end := <-burstEnd
				assertLimitsWithin(t, b, nil, lo, hi)
				after := b.limits()[end:]
				lastLow := -1 // the last window, after the burst, that left the limit at MinLimit
				for i, n := range after {
					if n <= lo {
						lastLow = i
					}
				}
				assert.Less(t, lastLow+1, tt.within, "limits after the burst: %v", after[:min(len(after), 40)])
				assert.Greater(t, after[len(after)-1], lo)
				t.Logf("after the burst: %d windows, the last at MinLimit #%d, final limit %d, no-load latency %v; first limits %v",
					len(after), lastLow+1, after[len(after)-1], q.Stats().NoLoadLatency, after[:min(len(after), 30)])
			})
		})
	}
}

// queuingStats is a Backend whose Stats report extra requests waiting.
type queuingStats struct {
	*recordingSetter
	waiting int
}

func (b queuingStats) Stats() backend.Stats {
	st := b.recordingSetter.Stats()
	st.Queued += b.waiting
	return st
}

// A limit less than half used does not grow, and a limit with a queue
// waiting is used, whatever is running at the instant a window ends: here
// one request at a time runs, the one whose handler time ends the window.
func TestAdaptiveGrowsOnlyWhenUsed(t *testing.T) {
	for _, tt := range []struct {
		name    string
		waiting int
		grows   bool
	}{
		{"nobody waits", 0, false},
		{"a queue waits", 50, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const start = 10
				b := queuingStats{&recordingSetter{Backend: inmem.New()}, tt.waiting}
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: start, MaxQueue: 10, QueueTimeout: time.Minute, Backend: b,
					Adaptive: &ginqueue.AdaptiveConfig{MaxLimit: 100, Window: 10}})
				r := newEngine(q.Handler(), func(c *gin.Context) {
					time.Sleep(10 * time.Millisecond)
					c.Status(http.StatusOK)
				})
				for range 1000 { // 100 windows of 10 ms handlers, one at a time
					w := httptest.NewRecorder()
					r.ServeHTTP(w, httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil))
					require.Equal(t, http.StatusOK, w.Code)
				}
				limits := b.limits()
				final := limits[len(limits)-1]
				if tt.grows {
					assert.Greater(t, final, 2*start, "limits %v", limits)
				} else {
					assert.Equal(t, start, final, "limits %v", limits)
					assert.LessOrEqual(t, slices.Max(limits), start, "limits %v", limits)
				}
			})
		})
	}
}

// blockingSetter is a Backend whose next SetLimit, once armed, waits for
// release, as the dispatcher's does while its lock is busy.
type blockingSetter struct {
	backend.Backend
	armed   atomic.Bool
	entered chan int
	release <-chan struct{}
}

func (b *blockingSetter) SetLimit(n int) error {
	if b.armed.CompareAndSwap(true, false) {
		b.entered <- n
		<-b.release
	}
	return b.Backend.(backend.LimitSetter).SetLimit(n)
}

// Stats never waits, not even for an adaptive update that is itself waiting
// in the Backend's SetLimit.
func TestStatsDoesNotWaitForAdaptiveUpdate(t *testing.T) {
	// release is made outside the bubble so that the watchdog, on real time,
	// can free a Stats that waits (and fails the test) instead of hanging.
	release := make(chan struct{})
	var once sync.Once
	var freedByWatchdog atomic.Bool
	watchdog := time.AfterFunc(10*time.Second, func() {
		freedByWatchdog.Store(true)
		once.Do(func() { close(release) })
	})
	defer watchdog.Stop()
	synctest.Test(t, func(t *testing.T) {
		b := &blockingSetter{Backend: inmem.New(), entered: make(chan int, 1), release: release}
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 10, QueueTimeout: time.Minute, Backend: b,
			Adaptive: &ginqueue.AdaptiveConfig{MinLimit: 1, MaxLimit: 8}})
		b.armed.Store(true)
		r := newEngine(q.Handler(), sleeper(time.Millisecond))
		out := make(chan result, 10)
		for i := range 10 { // the opening probe: ten samples at MinLimit
			send(r, context.Background(), i, time.Now(), out)
		}
		assert.Equal(t, 4, <-b.entered, "the probe ends: the limit goes back to 4")
		st := q.Stats() // the update that ended the probe waits in SetLimit
		assert.False(t, freedByWatchdog.Load(), "Stats waited until SetLimit was released")
		assert.Equal(t, time.Millisecond, st.NoLoadLatency)
		once.Do(func() { close(release) })
		for range 10 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
	})
}

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
					b := &recordingSetter{Backend: inmem.New()}
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
