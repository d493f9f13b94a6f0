package promqueue_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
	"github.com/ginqueue/ginqueue/promqueue"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	goleak.VerifyTestMain(m)
}

// newQueue builds a Queue that is closed when the test ends.
func newQueue(t *testing.T, cfg ginqueue.Config) *ginqueue.Queue {
	t.Helper()
	q, err := ginqueue.NewQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// newCollector returns a Collector exporting each queue under its name.
func newCollector(t *testing.T, queues map[string]*ginqueue.Queue) *promqueue.Collector {
	t.Helper()
	c := promqueue.NewCollector()
	for name, q := range queues {
		if err := c.Add(name, q); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// byHeader ranks a request by its X-Priority header.
func byHeader(c *gin.Context) int {
	p, _ := strconv.Atoi(c.GetHeader("X-Priority"))
	return p
}

// compare checks the named metrics of c against the exposition text want.
func compare(t *testing.T, c prometheus.Collector, want string, names ...string) {
	t.Helper()
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

func TestAddRefuses(t *testing.T) {
	q := newQueue(t, ginqueue.Config{MaxConcurrent: 1})
	c := promqueue.NewCollector()
	if err := c.Add("api", q); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, queue, want string
		q                 *ginqueue.Queue
	}{
		{"empty name", "", `promqueue: queue name must not be empty`, q},
		{"duplicate name", "api", `promqueue: queue "api" is already added`, q},
		{"nil queue", "web", `promqueue: queue "web" is nil`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Add(tc.queue, tc.q)
			if err == nil || err.Error() != tc.want {
				t.Errorf("Add(%q) = %v, want %s", tc.queue, err, tc.want)
			}
		})
	}
	if n := testutil.CollectAndCount(c, "ginqueue_limit"); n != 1 {
		t.Errorf("after refused adds: %d ginqueue_limit series, want 1", n)
	}
}

// An idle Queue exports every series, at zero, with its limit.
func TestIdleQueue(t *testing.T) {
	c := newCollector(t, map[string]*ginqueue.Queue{
		"api": newQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 10}),
		"web": newQueue(t, ginqueue.Config{MaxConcurrent: 2}),
	})
	compare(t, c, `
# HELP ginqueue_limit Slots of the queue: how many requests of cost 1 may run at once.
# TYPE ginqueue_limit gauge
ginqueue_limit{queue="api"} 4
ginqueue_limit{queue="web"} 2
# HELP ginqueue_queued Requests waiting for a slot now.
# TYPE ginqueue_queued gauge
ginqueue_queued{queue="api"} 0
ginqueue_queued{queue="web"} 0
# HELP ginqueue_requests_total Requests that passed the queue, by outcome: served, queue_full, queue_timeout, canceled, closed or panic.
# TYPE ginqueue_requests_total counter
ginqueue_requests_total{outcome="canceled",queue="api"} 0
ginqueue_requests_total{outcome="closed",queue="api"} 0
ginqueue_requests_total{outcome="panic",queue="api"} 0
ginqueue_requests_total{outcome="queue_full",queue="api"} 0
ginqueue_requests_total{outcome="queue_timeout",queue="api"} 0
ginqueue_requests_total{outcome="served",queue="api"} 0
ginqueue_requests_total{outcome="canceled",queue="web"} 0
ginqueue_requests_total{outcome="closed",queue="web"} 0
ginqueue_requests_total{outcome="panic",queue="web"} 0
ginqueue_requests_total{outcome="queue_full",queue="web"} 0
ginqueue_requests_total{outcome="queue_timeout",queue="web"} 0
ginqueue_requests_total{outcome="served",queue="web"} 0
`, "ginqueue_limit", "ginqueue_queued", "ginqueue_queued_by_priority", "ginqueue_requests_total")
	// Per queue: 7 gauges (no priority seen yet), 1 histogram, the outages
	// and abandoned counters and the 6 outcomes make 16 series.
	if n := testutil.CollectAndCount(c); n != 32 {
		t.Errorf("%d series, want 32", n)
	}
	if !c.Remove("web") || c.Remove("web") {
		t.Error("Remove(web) twice: want true, then false")
	}
	if n := testutil.CollectAndCount(c); n != 16 {
		t.Errorf("after Remove: %d series, want 16", n)
	}
}

// request is one request in flight against an engine.
type request struct {
	code   chan int
	cancel context.CancelFunc
}

// send serves one request with priority prio in its own goroutine, and
// waits until it has run, been answered or parked in the queue.
func send(r http.Handler, prio int) request {
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	req.Header.Set("X-Priority", strconv.Itoa(prio))
	code := make(chan int, 1)
	go func() {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		code <- w.Code
	}()
	synctest.Wait()
	return request{code: code, cancel: cancel}
}

// expectCode checks the status that req was answered with.
func expectCode(t *testing.T, what string, req request, want int) {
	t.Helper()
	if got := <-req.code; got != want {
		t.Errorf("%s: status %d, want %d", what, got, want)
	}
}

// A Queue driven through every outcome is exported as it is: the gauges while
// requests wait, then one counter per outcome and the histogram of waits.
func TestEveryOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: time.Second, Priority: byHeader})
		release := make(chan struct{}) // each send lets the running handler finish
		r := gin.New()
		r.Use(q.Handler())
		r.GET("/", func(c *gin.Context) { <-release; c.Status(http.StatusOK) })
		c := newCollector(t, map[string]*ginqueue.Queue{"api": q})

		a := send(r, 0) // runs at once
		b := send(r, 1) // waits, ahead of c
		cc := send(r, 0)
		time.Sleep(250 * time.Millisecond)
		full := send(r, 0) // no room, and no lower priority to evict
		expectCode(t, "full", full, http.StatusServiceUnavailable)

		compare(t, c, `
# HELP ginqueue_oldest_wait_seconds How long the oldest waiting request has waited so far; 0 when nobody waits.
# TYPE ginqueue_oldest_wait_seconds gauge
ginqueue_oldest_wait_seconds{queue="api"} 0.25
# HELP ginqueue_queued Requests waiting for a slot now.
# TYPE ginqueue_queued gauge
ginqueue_queued{queue="api"} 2
# HELP ginqueue_queued_by_priority Requests waiting for a slot now, by priority; 0 for a priority seen before that has no waiter.
# TYPE ginqueue_queued_by_priority gauge
ginqueue_queued_by_priority{priority="0",queue="api"} 1
ginqueue_queued_by_priority{priority="1",queue="api"} 1
# HELP ginqueue_running Slots of the queue held now: one per running request, or its Config.Cost.
# TYPE ginqueue_running gauge
ginqueue_running{queue="api"} 1
`, "ginqueue_oldest_wait_seconds", "ginqueue_queued", "ginqueue_queued_by_priority", "ginqueue_running")

		release <- struct{}{} // a finishes at 250ms; b (priority 1) runs
		synctest.Wait()
		expectCode(t, "a", a, http.StatusOK)
		time.Sleep(time.Second) // c times out at 1s
		synctest.Wait()
		expectCode(t, "c", cc, http.StatusRequestTimeout)

		gone := send(r, 0)
		gone.cancel()
		synctest.Wait()
		expectCode(t, "canceled", gone, ginqueue.StatusClientClosedRequest)

		late := send(r, 0)
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		expectCode(t, "closed", late, http.StatusServiceUnavailable)
		release <- struct{}{}
		synctest.Wait()
		expectCode(t, "b", b, http.StatusOK)

		compare(t, c, `
# HELP ginqueue_oldest_wait_seconds How long the oldest waiting request has waited so far; 0 when nobody waits.
# TYPE ginqueue_oldest_wait_seconds gauge
ginqueue_oldest_wait_seconds{queue="api"} 0
# HELP ginqueue_queued Requests waiting for a slot now.
# TYPE ginqueue_queued gauge
ginqueue_queued{queue="api"} 0
# HELP ginqueue_queued_by_priority Requests waiting for a slot now, by priority; 0 for a priority seen before that has no waiter.
# TYPE ginqueue_queued_by_priority gauge
ginqueue_queued_by_priority{priority="0",queue="api"} 0
ginqueue_queued_by_priority{priority="1",queue="api"} 0
# HELP ginqueue_queue_wait_seconds Time served requests waited in the queue for a slot; those that ran at once count as 0.
# TYPE ginqueue_queue_wait_seconds histogram
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.0001"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.00025"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.0005"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.001"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.0025"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.005"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.01"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.025"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.05"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.1"} 1
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.25"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.5"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.6"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.7"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.8"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="0.9"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="1"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="1.25"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="1.5"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="1.75"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="2"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="2.5"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="5"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="10"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="30"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="60"} 2
ginqueue_queue_wait_seconds_bucket{queue="api",le="+Inf"} 2
ginqueue_queue_wait_seconds_sum{queue="api"} 0.25
ginqueue_queue_wait_seconds_count{queue="api"} 2
# HELP ginqueue_requests_total Requests that passed the queue, by outcome: served, queue_full, queue_timeout, canceled, closed or panic.
# TYPE ginqueue_requests_total counter
ginqueue_requests_total{outcome="canceled",queue="api"} 1
ginqueue_requests_total{outcome="closed",queue="api"} 1
ginqueue_requests_total{outcome="panic",queue="api"} 0
ginqueue_requests_total{outcome="queue_full",queue="api"} 1
ginqueue_requests_total{outcome="queue_timeout",queue="api"} 1
ginqueue_requests_total{outcome="served",queue="api"} 2
# HELP ginqueue_running Slots of the queue held now: one per running request, or its Config.Cost.
# TYPE ginqueue_running gauge
ginqueue_running{queue="api"} 0
`, "ginqueue_oldest_wait_seconds", "ginqueue_queued", "ginqueue_queued_by_priority",
			"ginqueue_queue_wait_seconds", "ginqueue_requests_total", "ginqueue_running")

		// The drain rate is the Queue's own measurement: the collector
		// passes it on unchanged.
		if got, want := gaugeValue(t, c, "ginqueue_drain_rate_per_second"), q.Stats().DrainRate; got != want || got <= 0 {
			t.Errorf("drain rate %v, want %v (the Queue's) and above 0", got, want)
		}
	})
}

// gaugeValue gathers c and returns the value of its single series name.
func gaugeValue(t *testing.T, c prometheus.Collector, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single series %s", name)
	return 0
}

// The names, units and help texts pass promlint, with every series present.
func TestLint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, Priority: byHeader})
		release := make(chan struct{})
		r := gin.New()
		r.Use(q.Handler())
		r.GET("/", func(c *gin.Context) { <-release; c.Status(http.StatusOK) })
		c := newCollector(t, map[string]*ginqueue.Queue{"api": q})
		running, waiting := send(r, 0), send(r, 2)
		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
		close(release)
		expectCode(t, "running", running, http.StatusOK)
		expectCode(t, "waiting", waiting, http.StatusOK)
	})
}

// A Collector registers in a pedantic registry, which checks Describe
// against Collect, and Queues may come and go after registration.
func TestRegisterThenAdd(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := promqueue.NewCollector()
	reg.MustRegister(c)
	if err := c.Add("api", newQueue(t, ginqueue.Config{MaxConcurrent: 3})); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ginqueue_limit Slots of the queue: how many requests of cost 1 may run at once.
# TYPE ginqueue_limit gauge
ginqueue_limit{queue="api"} 3
`), "ginqueue_limit"); err != nil {
		t.Error(err)
	}
	c.Remove("api")
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("after Remove: %d series (%v), want 0", n, err)
	}
}

// Scrapes may overlap each other and Add and Remove (run with -race).
func TestConcurrentScrapes(t *testing.T) {
	q := newQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1})
	reg := prometheus.NewPedanticRegistry()
	c := promqueue.NewCollector()
	reg.MustRegister(c)
	errs := make(chan error, 4)
	for range cap(errs) {
		go func() {
			var err error
			for range 50 {
				if _, err = reg.Gather(); err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	for i := range 50 {
		name := "q" + strconv.Itoa(i%3)
		if err := c.Add(name, q); err != nil {
			c.Remove(name)
		}
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// storeBackend is an in-memory Backend that reports the state of a store
// shared with other replicas, as redisqueue reports Redis.
type storeBackend struct {
	backend.Backend
	unavailable atomic.Bool
	outages     atomic.Uint64
}

func newStoreBackend() *storeBackend {
	return &storeBackend{Backend: inmem.New()}
}

func (b *storeBackend) Stats() backend.Stats {
	st := b.Backend.Stats()
	st.Unavailable, st.Outages = b.unavailable.Load(), b.outages.Load()
	return st
}

// The Backend's store is exported as it reports it: 1 and its outages while
// it is down, 0 and 0 for the in-memory Backend, which has no store to lose.
func TestBackendUnavailable(t *testing.T) {
	down := newStoreBackend()
	down.unavailable.Store(true)
	down.outages.Store(3)
	for _, tc := range []struct {
		name                 string
		backend              backend.Backend // nil: the in-memory Backend
		unavailable, outages int
	}{
		{"in-memory", nil, 0, 0},
		{"store down", down, 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newQueue(t, ginqueue.Config{MaxConcurrent: 2, Backend: tc.backend})
			c := newCollector(t, map[string]*ginqueue.Queue{"api": q})
			compare(t, c, fmt.Sprintf(`
# HELP ginqueue_backend_outages_total Times the queue's Backend turned unavailable since it started; always 0 for the in-memory Backend.
# TYPE ginqueue_backend_outages_total counter
ginqueue_backend_outages_total{queue="api"} %d
# HELP ginqueue_backend_unavailable Whether the queue's Backend cannot reach the store it shares with other replicas and applies its fallback policy: 1 while so, else 0.
# TYPE ginqueue_backend_unavailable gauge
ginqueue_backend_unavailable{queue="api"} %d
`, tc.outages, tc.unavailable), "ginqueue_backend_outages_total", "ginqueue_backend_unavailable")
		})
	}
}

// storeState gathers c and returns its single series of
// ginqueue_backend_unavailable and ginqueue_backend_outages_total.
func storeState(t *testing.T, c prometheus.Collector) (unavailable, outages float64) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, f := range families {
		if len(f.GetMetric()) != 1 {
			continue
		}
		switch m := f.GetMetric()[0]; f.GetName() {
		case "ginqueue_backend_unavailable":
			unavailable = m.GetGauge().GetValue()
			found++
		case "ginqueue_backend_outages_total":
			outages = m.GetCounter().GetValue()
			found++
		}
	}
	if found != 2 {
		t.Fatalf("%d of the 2 single series of the Backend's store", found)
	}
	return unavailable, outages
}

// While the store goes down and comes back, the gauge follows it and the
// outages counter never goes down from one gather to the next.
func TestBackendOutagesNeverGoDown(t *testing.T) {
	b := newStoreBackend()
	c := newCollector(t, map[string]*ginqueue.Queue{"api": newQueue(t, ginqueue.Config{MaxConcurrent: 1, Backend: b})})
	var prev float64
	for i, down := range []bool{false, true, true, false, true, false, false, true} {
		if down && !b.unavailable.Load() {
			b.outages.Add(1)
		}
		b.unavailable.Store(down)
		unavailable, outages := storeState(t, c)
		if want := map[bool]float64{false: 0, true: 1}[down]; unavailable != want {
			t.Errorf("gather %d: ginqueue_backend_unavailable %v, want %v", i, unavailable, want)
		}
		if outages < prev {
			t.Errorf("gather %d: ginqueue_backend_outages_total went down from %v to %v", i, prev, outages)
		}
		if want := float64(b.outages.Load()); outages != want {
			t.Errorf("gather %d: ginqueue_backend_outages_total %v, want %v (the Backend's)", i, outages, want)
		}
		prev = outages
	}
	if prev != 3 {
		t.Errorf("after three outages: ginqueue_backend_outages_total %v, want 3", prev)
	}
}
