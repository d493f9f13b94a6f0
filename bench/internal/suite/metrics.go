package suite

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

// The limits of each measurement. Every variant of a measurement gets the
// same ones.
var (
	// UncontendedLimits are never reached by a parallel benchmark on a
	// machine with fewer than 64 threads.
	UncontendedLimits = Limits{MaxConcurrent: 64, MaxQueue: 64, QueueTimeout: time.Second}
	// HandoffLimits: 4 slots, room for all 32 goroutines, no timeout hit.
	HandoffLimits = Limits{MaxConcurrent: 4, MaxQueue: 64, QueueTimeout: 10 * time.Second}
)

// The fixed settings of the harnesses, the same in every Plan; the report
// quotes them where it says how each figure is measured.
const (
	HandoffGoroutines = 32                   // metric 2: goroutines over HandoffLimits
	HandoffWork       = 2 * time.Microsecond // metric 2: the handler's spin
	ScheduleSlots     = 8                    // metric 3
	ScheduleWork      = 2 * time.Millisecond // metric 3: the handler's sleep
	GrantWork         = 5 * time.Microsecond // metric 4: each waiter's spin
	TimeoutSlots      = 2                    // metric 5: slots held throughout
	MemorySlots       = 4                    // metric 6: slots held throughout
	GrowthSlots       = 4                    // metric 7
	BurstRequests     = 15                   // metric 9: requests at once
	BurstSlots        = 3                    // metric 9
	BurstQueue        = 10                   // metric 9: waiting places
)

// TimeoutPrecisionTimeout is the QueueTimeout of the timeout-precision
// measurement.
const TimeoutPrecisionTimeout = 20 * time.Millisecond

// discardWriter is an http.ResponseWriter that allocates nothing and keeps
// the status, so the route-only benchmarks measure the router and the
// throttle, not a recorder.
type discardWriter struct {
	h    http.Header
	code int
}

func newDiscardWriter() *discardWriter { return &discardWriter{h: http.Header{}} }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }

// reset readies w for the next request.
func (w *discardWriter) reset() {
	w.code = 0
	clear(w.h)
}

// status is the status written, 200 if the handler wrote none.
func (w *discardWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// noContent is the handler of the per-operation benchmarks.
func noContent(c *gin.Context) { c.Status(http.StatusNoContent) }

// spin busy-waits for d: a handler that works rather than sleeps.
func spin(d time.Duration) {
	for t := time.Now(); time.Since(t) < d; {
	}
}

// counted wraps h with a count of the requests that reached the throttle.
func counted(h http.Handler, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h.ServeHTTP(w, r)
	})
}

// waitFor polls cond every millisecond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); !cond(); {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// BenchUncontendedRoute is metric 1, strictest form: one request at a time
// per goroutine, in parallel, with a pre-built request and a writer that
// allocates nothing, limits never reached.
func BenchUncontendedRoute(v Variant) func(*testing.B) {
	return func(b *testing.B) {
		h, stop := v.New(UncontendedLimits, noContent)
		defer stop()
		b.ReportAllocs()
		b.ResetTimer()
		if n := serveParallel(b, v, h); n > 0 {
			b.Fatalf("%s: %d requests not served", v.Name, n)
		}
	}
}

// BenchUncontendedRequest is metric 1 as a request costs in practice: a new
// httptest request and recorder per operation.
func BenchUncontendedRequest(v Variant) func(*testing.B) {
	return func(b *testing.B) {
		h, stop := v.New(UncontendedLimits, noContent)
		defer stop()
		var bad, clients atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			client := int(clients.Add(1) - 1)
			for i := 0; pb.Next(); i++ {
				req := v.request(client, i)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusNoContent {
					bad.Add(1)
				}
			}
		})
		if n := bad.Load(); n > 0 {
			b.Fatalf("%s: %d requests not served", v.Name, n)
		}
	}
}

// serveParallel sends the variant's pre-built requests through h from every
// b.RunParallel goroutine with a writer that allocates nothing, and returns
// how many were not answered 204.
func serveParallel(b *testing.B, v Variant, h http.Handler) int64 {
	var bad, clients atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		reqs := v.requests(int(clients.Add(1) - 1))
		w := newDiscardWriter()
		for i := 0; pb.Next(); i++ {
			w.reset()
			h.ServeHTTP(w, reqs[i%len(reqs)])
			if w.status() != http.StatusNoContent {
				bad.Add(1)
			}
		}
	})
	return bad.Load()
}

// BenchHandoff is metric 2: 32 goroutines over 4 slots, handlers that spin
// 2 µs, so nearly every request waits and is handed a slot. ns/op is the
// inverse of the throughput.
func BenchHandoff(v Variant) func(*testing.B) {
	return func(b *testing.B) {
		h, stop := v.New(HandoffLimits, func(c *gin.Context) {
			spin(HandoffWork)
			c.Status(http.StatusNoContent)
		})
		defer stop()
		procs := runtime.GOMAXPROCS(0)
		b.SetParallelism((HandoffGoroutines + procs - 1) / procs)
		b.ReportAllocs()
		b.ResetTimer()
		n := serveParallel(b, v, h)
		b.StopTimer()
		if n > 0 {
			b.Fatalf("%s: %d requests not served", v.Name, n)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	}
}

// scheduleEfficiency is metric 3: n requests of 2 ms arrive at once over 8
// slots. It returns the ideal makespan (n × 2 ms / 8) over the measured one,
// from the first arrival to the last response.
func scheduleEfficiency(v Variant, n int) (float64, error) {
	h, stop := v.New(Limits{MaxConcurrent: ScheduleSlots, MaxQueue: n, QueueTimeout: 30 * time.Second}, func(c *gin.Context) {
		time.Sleep(ScheduleWork)
		c.Status(http.StatusNoContent)
	})
	defer stop()
	var bad atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Go(func() {
			w := newDiscardWriter()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			if w.status() != http.StatusNoContent {
				bad.Add(1)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if b := bad.Load(); b > 0 {
		return 0, fmt.Errorf("%s: %d of %d requests not served", v.Name, b, n)
	}
	ideal := time.Duration(n) * ScheduleWork / ScheduleSlots
	return float64(ideal) / float64(took), nil
}

// grantLatency is metric 4: one slot, held while waiters queue behind it;
// then the slot is let go and the waiters run one after another, each
// spinning 5 µs. A sample is the time from one handler's return (its slot
// about to be released) to the next handler's first line.
func grantLatency(v Variant, waiters int) ([]time.Duration, error) {
	base := time.Now()
	n := waiters + 1
	starts := make([]time.Duration, n)
	ends := make([]time.Duration, n)
	var seq atomic.Int64
	gate := make(chan struct{})
	h, stop := v.New(Limits{MaxConcurrent: 1, MaxQueue: n, QueueTimeout: 60 * time.Second}, func(c *gin.Context) {
		i := seq.Add(1) - 1
		starts[i] = time.Since(base)
		if i == 0 {
			<-gate
		} else {
			spin(GrantWork)
		}
		ends[i] = time.Since(base)
		c.Status(http.StatusNoContent)
	})
	defer stop()
	var entered, bad atomic.Int64
	hc := counted(h, &entered)
	var wg sync.WaitGroup
	serve := func() {
		w := newDiscardWriter()
		hc.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		if w.status() != http.StatusNoContent {
			bad.Add(1)
		}
	}
	wg.Go(serve)
	if !waitFor(5*time.Second, func() bool { return seq.Load() == 1 }) {
		close(gate)
		return nil, fmt.Errorf("%s: the first request never started", v.Name)
	}
	for range waiters {
		wg.Go(serve)
	}
	waitFor(5*time.Second, func() bool { return entered.Load() == int64(n) })
	time.Sleep(20 * time.Millisecond) // let the last arrivals park
	close(gate)
	wg.Wait()
	if b := bad.Load(); b > 0 {
		return nil, fmt.Errorf("%s: %d of %d requests not served", v.Name, b, n)
	}
	out := make([]time.Duration, 0, waiters)
	for i := range waiters {
		out = append(out, starts[i+1]-ends[i])
	}
	return out, nil
}

// timeoutLateness is metric 5: two slots held throughout; waiters arrive
// 1 ms apart with a QueueTimeout of 20 ms, and each is answered with a
// timeout. A sample is how long after its own deadline a waiter's response
// came back.
func timeoutLateness(v Variant, waiters int) ([]time.Duration, error) {
	var seq atomic.Int64
	gate := make(chan struct{})
	h, stop := v.New(Limits{MaxConcurrent: TimeoutSlots, MaxQueue: waiters + TimeoutSlots, QueueTimeout: TimeoutPrecisionTimeout}, func(c *gin.Context) {
		if seq.Add(1) <= TimeoutSlots {
			<-gate
		}
		c.Status(http.StatusNoContent)
	})
	defer stop()
	// The holders retry until they hold the slots: the seed port times out a
	// request that arrives at an idle server more than 20 ms before a tick.
	var blockers sync.WaitGroup
	for range TimeoutSlots {
		blockers.Go(func() {
			// A retry right after a 408 arrives just after a tick and would
			// expire again; shifting each retry by 13 ms finds the window.
			for try, end := 0, time.Now().Add(10*time.Second); time.Now().Before(end); try++ {
				w := newDiscardWriter()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
				if w.status() == http.StatusNoContent {
					return
				}
				time.Sleep(time.Duration(try%8) * 13 * time.Millisecond)
			}
		})
	}
	if !waitFor(10*time.Second, func() bool { return seq.Load() == TimeoutSlots }) {
		close(gate)
		return nil, fmt.Errorf("%s: the slot holders never started", v.Name)
	}
	late := make([]time.Duration, waiters)
	var served atomic.Int64
	var wg sync.WaitGroup
	for i := range waiters {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		w := newDiscardWriter()
		wg.Go(func() {
			t0 := time.Now()
			h.ServeHTTP(w, req)
			late[i] = time.Since(t0) - TimeoutPrecisionTimeout
			if w.status() == http.StatusNoContent {
				served.Add(1)
			}
		})
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	close(gate)
	blockers.Wait()
	if s := served.Load(); s > 0 {
		return nil, fmt.Errorf("%s: %d waiters ran although every slot was held", v.Name, s)
	}
	return late, nil
}

// timerLateness is the floor of metric 5: the same arrivals, each waiting on
// a plain time.Timer of TimeoutPrecisionTimeout instead of a throttle. It is
// how late the Go runtime wakes a goroutine on this machine.
func timerLateness(waiters int) []time.Duration {
	late := make([]time.Duration, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			t0 := time.Now()
			<-time.NewTimer(TimeoutPrecisionTimeout).C
			late[i] = time.Since(t0) - TimeoutPrecisionTimeout
		})
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	return late
}

// memoryPerWaiter is metric 6: with every slot held, n requests queue; the
// figure is the growth of live heap plus goroutine stacks from just before
// they enter the route to once they all wait, per request. The goroutines
// exist before the first reading, so what a bare goroutine costs is left out
// and what the router and throttle add is counted.
func memoryPerWaiter(v Variant, n int) (heap, stack float64, err error) {
	var seq atomic.Int64
	gate := make(chan struct{})
	h, stop := v.New(Limits{MaxConcurrent: MemorySlots, MaxQueue: n + MemorySlots, QueueTimeout: 5 * time.Minute}, func(c *gin.Context) {
		if seq.Add(1) <= MemorySlots {
			<-gate
		}
		c.Status(http.StatusNoContent)
	})
	var entered atomic.Int64
	hc := counted(h, &entered)
	var blockers, wg sync.WaitGroup
	for range MemorySlots {
		blockers.Go(func() { hc.ServeHTTP(newDiscardWriter(), httptest.NewRequest(http.MethodGet, "/", nil)) })
	}
	defer func() {
		close(gate)
		stop()
		blockers.Wait()
		wg.Wait()
	}()
	if !waitFor(5*time.Second, func() bool { return seq.Load() == MemorySlots }) {
		return 0, 0, fmt.Errorf("%s: the slot holders never started", v.Name)
	}
	start := make(chan struct{})
	for range n {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		w := newDiscardWriter()
		wg.Go(func() {
			<-start
			hc.ServeHTTP(w, req)
		})
	}
	time.Sleep(20 * time.Millisecond)
	h0, s0 := liveBytes()
	close(start)
	want := int64(n + MemorySlots)
	if !waitFor(30*time.Second, func() bool { return entered.Load() == want }) {
		return 0, 0, fmt.Errorf("%s: only %d of %d requests arrived", v.Name, entered.Load(), want)
	}
	time.Sleep(50 * time.Millisecond) // let the last arrivals park
	h1, s1 := liveBytes()
	return float64(h1-h0) / float64(n), float64(s1-s0) / float64(n), nil
}

// liveBytes is the live heap and the goroutine stacks in use, after a full
// collection (twice, so that sync.Pools are empty).
func liveBytes() (heap, stack int64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), int64(m.StackInuse)
}

// backendHeapPerWaiter is the second half of metric 6: ginqueue's own
// structures per waiter, measured on its Backend alone (no gin, no HTTP):
// the live heap that n parked Acquire calls add.
func backendHeapPerWaiter(n int) (float64, error) {
	b := ginqueue.NewMemoryBackend()
	if err := b.Start(ginqueue.Limits{MaxConcurrent: 1, MaxQueue: n, QueueTimeout: 5 * time.Minute}); err != nil {
		return 0, err
	}
	holder, err := b.Acquire(context.Background(), ginqueue.Arrival{})
	if err != nil {
		return 0, err
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			if t, err := b.Acquire(context.Background(), ginqueue.Arrival{}); err == nil {
				b.Release(t)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	before := heapBytes()
	close(start)
	ok := waitFor(30*time.Second, func() bool { return b.Stats().Queued == n })
	after := heapBytes()
	_ = b.Close()
	wg.Wait()
	b.Release(holder)
	if !ok {
		return 0, fmt.Errorf("ginqueue backend: %d of %d waiters queued", b.Stats().Queued, n)
	}
	return float64(after-before) / float64(n), nil
}

// heapBytes is the live heap after a full collection (twice, so that
// sync.Pools are empty).
func heapBytes() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// growthCost is metric 7: depth+4 clients in a closed loop over 4 slots.
// The first 4 requests hold the slots until every client has queued, so the
// run starts with depth requests waiting; from then on each client that is
// served queues again at the tail, which keeps the queue that deep. The
// figure is the wall time per completed request over window. A throttle
// whose costs grow with its queue shows it here.
func growthCost(v Variant, depth int, window time.Duration) (time.Duration, error) {
	var seq atomic.Int64
	gate := make(chan struct{})
	h, stop := v.New(Limits{MaxConcurrent: GrowthSlots, MaxQueue: depth + 64, QueueTimeout: 5 * time.Minute}, func(c *gin.Context) {
		if seq.Load() < GrowthSlots && seq.Add(1) <= GrowthSlots {
			<-gate
		}
		// Yield once while holding the slot: with more slots than cores and
		// handlers that never block, the queue would empty and stay empty.
		runtime.Gosched()
		c.Status(http.StatusNoContent)
	})
	clients := depth + GrowthSlots
	var entered, done, bad atomic.Int64
	hc := counted(h, &entered)
	var halt atomic.Bool
	var wg sync.WaitGroup
	for client := range clients {
		wg.Go(func() {
			// One request per client, so that a deep queue holds no more
			// requests than the table's variants hold: a feature variant's
			// client keeps one priority class, and the lower classes wait
			// behind the higher ones, which keeps the queue as deep.
			req := v.request(client, client)
			w := newDiscardWriter()
			for !halt.Load() {
				w.reset()
				hc.ServeHTTP(w, req)
				if w.status() != http.StatusNoContent && !halt.Load() {
					bad.Add(1)
				}
				done.Add(1)
			}
		})
	}
	ok := waitFor(60*time.Second, func() bool { return entered.Load() >= int64(clients) })
	time.Sleep(20 * time.Millisecond) // let the last arrivals park
	close(gate)
	time.Sleep(window / 10) // warm up
	c0, t0 := done.Load(), time.Now()
	time.Sleep(window)
	c1, took := done.Load(), time.Since(t0)
	halt.Store(true)
	stop()
	wg.Wait()
	switch {
	case !ok:
		return 0, fmt.Errorf("%s: clients did not start", v.Name)
	case bad.Load() > 0:
		return 0, fmt.Errorf("%s: %d requests not served at depth %d", v.Name, bad.Load(), depth)
	case c1 == c0:
		return 0, fmt.Errorf("%s: no request completed in %v at depth %d", v.Name, window, depth)
	}
	return took / time.Duration(c1-c0), nil
}

// loopbackRate is metric 8: keep-alive clients against a real server on
// 127.0.0.1, limits not engaged; requests per second over window. The loop
// is bounded by time and by count.
func loopbackRate(v Variant, clients int, window time.Duration) (float64, error) {
	const maxRequests = 50_000_000
	h, stop := v.New(UncontendedLimits, noContent)
	defer stop()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	tr := &http.Transport{MaxIdleConns: clients, MaxIdleConnsPerHost: clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	url := "http://" + ln.Addr().String() + "/"
	get := func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Errorf("%s: status %d", v.Name, resp.StatusCode)
		}
		return nil
	}
	// Open the connections before the clock starts.
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Go(func() {
			if err := get(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	var count atomic.Int64
	start := time.Now()
	deadline := start.Add(window)
	for range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) && count.Load() < maxRequests {
				if err := get(); err != nil {
					errs <- err
					return
				}
				count.Add(1)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(count.Load()) / took.Seconds(), nil
}

// Outcome names in the burst timeline.
const (
	OutcomeServed  = "served"
	OutcomeFull    = "refused at once"
	OutcomeTimeout = "timed out"
)

// Event is one request of the seed burst, times from the burst's start.
type Event struct {
	Arrive, Start, End time.Duration // Start is -1 for a request that never ran
	Status             int
	Outcome            string
}

// Timeline is the seed burst as one variant answered it.
type Timeline struct {
	Variant string
	Events  []Event // in arrival order
}

// Count is how many events had outcome o.
func (t Timeline) Count(o string) int {
	n := 0
	for _, e := range t.Events {
		if e.Outcome == o {
			n++
		}
	}
	return n
}

// Last is when the last response of the burst came back.
func (t Timeline) Last() time.Duration {
	var last time.Duration
	for _, e := range t.Events {
		last = max(last, e.End)
	}
	return last
}

// seedBurst is metric 9, the seed lesson's test: 15 requests at once, 3
// slots, 10 waiting places, the given queue timeout (the lesson's is 5 s)
// and handlers that take work.
func seedBurst(v Variant, work, timeout time.Duration) Timeline {
	base := time.Now()
	events := make([]Event, BurstRequests)
	h, stop := v.New(Limits{MaxConcurrent: BurstSlots, MaxQueue: BurstQueue, QueueTimeout: timeout}, func(c *gin.Context) {
		id, _ := strconv.Atoi(c.Query("id"))
		events[id].Start = time.Since(base)
		time.Sleep(work)
		c.Status(http.StatusNoContent)
	})
	defer stop()
	var wg sync.WaitGroup
	ready := make(chan struct{})
	for i := range BurstRequests {
		events[i].Start = -1
		req := httptest.NewRequest(http.MethodGet, "/?id="+strconv.Itoa(i), nil)
		wg.Go(func() {
			<-ready
			w := httptest.NewRecorder()
			events[i].Arrive = time.Since(base)
			h.ServeHTTP(w, req)
			events[i].End = time.Since(base)
			events[i].Status = w.Code
			switch {
			case w.Code < 300:
				events[i].Outcome = OutcomeServed
			case w.Code == http.StatusRequestTimeout || strings.Contains(w.Body.String(), "Timed out"):
				events[i].Outcome = OutcomeTimeout
			default:
				events[i].Outcome = OutcomeFull
			}
		})
	}
	base = time.Now()
	close(ready)
	wg.Wait()
	sort.SliceStable(events, func(a, b int) bool { return events[a].Arrive < events[b].Arrive })
	return Timeline{Variant: v.Name, Events: events}
}
