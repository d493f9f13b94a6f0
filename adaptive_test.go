package ginqueue_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
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

// Raising the limit wakes several waiters at once; lowering it preempts
// nobody and admits nobody until running is below the new limit.
func TestSetLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: time.Minute})
		g, r := gated(q)
		out := make(chan result, 8)
		burst(r, 5, 0, out)
		assert.Equal(t, 0, <-g.started)
		require.NoError(t, q.SetLimit(4))
		synctest.Wait()
		assert.ElementsMatch(t, []int{1, 2, 3}, []int{<-g.started, <-g.started, <-g.started}, "three woken at once")
		assert.Equal(t, ginqueue.Stats{Running: 4, Queued: 1, Limit: 4, Served: 4,
			QueuedByPriority: []ginqueue.PriorityCount{{0, 1}}}, q.Stats())

		require.NoError(t, q.SetLimit(2))
		assert.Equal(t, 4, q.Stats().Running, "nobody is preempted")
		g.open(2) // running 2: still not below 2
		synctest.Wait()
		assert.Equal(t, 1, q.Stats().Queued)
		g.open(1) // running 1 < 2: the waiter goes
		assert.Equal(t, 4, <-g.started)
		g.open(2)
		for range 5 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
		assert.ErrorContains(t, q.SetLimit(0), "ginqueue: limit must be in [1, ")
	})
}

type nonSetter struct{ ginqueue.Backend }

func TestAdaptiveNeedsLimitSetter(t *testing.T) {
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, Backend: nonSetter{ginqueue.NewMemoryBackend()}})
	require.NoError(t, err)
	assert.ErrorContains(t, q.SetLimit(2), "cannot change its limit")
	_, err = ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, Adaptive: &ginqueue.AdaptiveConfig{},
		Backend: nonSetter{ginqueue.NewMemoryBackend()}})
	assert.ErrorContains(t, err, "Config.Adaptive needs a Backend that implements LimitSetter")
	for _, tt := range []struct {
		a    ginqueue.AdaptiveConfig
		want string
	}{
		{ginqueue.AdaptiveConfig{MinLimit: -1}, "Config.Adaptive.MinLimit must be in"},
		{ginqueue.AdaptiveConfig{MinLimit: 50, MaxLimit: 10}, "Config.Adaptive.MinLimit 50 exceeds MaxLimit 10"},
		{ginqueue.AdaptiveConfig{Tolerance: 0.5}, "Config.Adaptive.Tolerance must be at least 1, got 0.5"},
		{ginqueue.AdaptiveConfig{Backoff: 1.5}, "Config.Adaptive.Backoff must be in (0, 1), got 1.5"},
		{ginqueue.AdaptiveConfig{Algorithm: 7}, "Config.Adaptive.Algorithm 7 is not Gradient or AIMD"},
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
	ginqueue.Backend
	fail bool
}

func (f *failingSetter) SetLimit(n int) error {
	if f.fail {
		return fmt.Errorf("backend down")
	}
	return f.Backend.(ginqueue.LimitSetter).SetLimit(n)
}

// With Adaptive on, SetLimit returns the Backend's error and keeps nothing.
func TestAdaptiveSetLimitReportsBackendError(t *testing.T) {
	b := &failingSetter{Backend: ginqueue.NewMemoryBackend()}
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, Backend: b, Adaptive: &ginqueue.AdaptiveConfig{MinLimit: 1, MaxLimit: 50}})
	require.NoError(t, q.SetLimit(8))
	assert.Equal(t, 8, q.Stats().Limit)
	b.fail = true
	assert.ErrorContains(t, q.SetLimit(20), "backend down")
	b.fail = false
	require.NoError(t, q.SetLimit(9))
	assert.Equal(t, 9, q.Stats().Limit)
}

// blockingSetter is a Backend whose next SetLimit, once armed, waits for
// release, as the dispatcher's does while its lock is busy.
type blockingSetter struct {
	ginqueue.Backend
	armed   atomic.Bool
	entered chan int
	release <-chan struct{}
}

func (b *blockingSetter) SetLimit(n int) error {
	if b.armed.CompareAndSwap(true, false) {
		b.entered <- n
		<-b.release
	}
	return b.Backend.(ginqueue.LimitSetter).SetLimit(n)
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
		b := &blockingSetter{Backend: ginqueue.NewMemoryBackend(), entered: make(chan int, 1), release: release}
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
