package suite

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
)

// discardWriter is an http.ResponseWriter that allocates nothing and keeps
// the status.
type discardWriter struct {
	h    http.Header
	code int
}

func newWriter() *discardWriter                      { return &discardWriter{h: http.Header{}} }
func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }

// serve sends req through h with w: the status, 200 if none was written.
func serve(h http.Handler, w *discardWriter, req *http.Request) int {
	w.code = 0
	clear(w.h)
	if h.ServeHTTP(w, req); w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

func get(h http.Handler) int {
	return serve(h, newWriter(), httptest.NewRequest(http.MethodGet, "/", nil))
}

func noContent(c *gin.Context) { c.Status(http.StatusNoContent) }

// spin busy-waits for d: a handler that works rather than sleeps.
func spin(d time.Duration) {
	for t := time.Now(); time.Since(t) < d; {
	}
}

// waitFor polls cond every millisecond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// holding is a handler that keeps the first n requests until gate closes
// and then runs then, if any, in every request; seq counts up to n.
func holding(n int64, seq *atomic.Int64, gate <-chan struct{}, then func()) gin.HandlerFunc {
	return func(c *gin.Context) {
		if seq.Load() < n && seq.Add(1) <= n {
			<-gate
		}
		if then != nil {
			then()
		}
		noContent(c)
	}
}

// counted counts the requests that reach h.
func counted(h http.Handler, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1); h.ServeHTTP(w, r) })
}

// bench serves from every b.RunParallel goroutine: with fresh, a new
// request and recorder per operation; else prebuilt ones.
func bench(v Variant, l Limits, h gin.HandlerFunc, fresh bool, parallelism int) func(*testing.B) {
	return func(b *testing.B) {
		srv, stop := v.New(l, h)
		defer stop()
		var bad, clients atomic.Int64
		b.SetParallelism(parallelism)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			client, w := int(clients.Add(1)-1), newWriter()
			var reqs []*http.Request
			for i := 0; !fresh && i < len(priorities) && (i == 0 || v.Request != nil); i++ {
				reqs = append(reqs, v.request(client, i))
			}
			for i := 0; pb.Next(); i++ {
				code := 0
				if fresh {
					rec := httptest.NewRecorder()
					srv.ServeHTTP(rec, v.request(client, i))
					code = rec.Code
				} else {
					code = serve(srv, w, reqs[i%len(reqs)])
				}
				if code != http.StatusNoContent {
					bad.Add(1)
				}
			}
		})
		b.StopTimer()
		if n := bad.Load(); n > 0 {
			b.Fatalf("%s: %d requests not served", v.Name, n)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	}
}

// BenchRoute is metric 1a (BENCHMARKS.md says how each figure is measured).
func (p Plan) BenchRoute(v Variant) func(*testing.B) {
	return bench(v, p.Uncontended, noContent, false, 1)
}

// BenchRequest is metric 1b.
func (p Plan) BenchRequest(v Variant) func(*testing.B) {
	return bench(v, p.Uncontended, noContent, true, 1)
}

// BenchHandoff is metric 2; ns/op is the inverse of the throughput.
func (p Plan) BenchHandoff(v Variant) func(*testing.B) {
	procs := runtime.GOMAXPROCS(0)
	return bench(v, p.Handoff, func(c *gin.Context) { spin(p.HandoffWork); noContent(c) }, false, (p.HandoffGoroutines+procs-1)/procs)
}

// grantLatency is metric 4: from one handler's return to the next one's
// first line, in ns.
func (p Plan) grantLatency(v Variant, waiters int) ([]float64, error) {
	base := time.Now()
	starts, ends := make([]time.Duration, waiters+1), make([]time.Duration, waiters+1)
	var seq, entered, bad atomic.Int64
	gate := make(chan struct{})
	h, stop := v.New(Limits{1, waiters + 1, time.Minute}, func(c *gin.Context) {
		i := seq.Add(1) - 1
		if starts[i] = time.Since(base); i == 0 {
			<-gate
		} else {
			spin(p.GrantWork)
		}
		ends[i] = time.Since(base)
		noContent(c)
	})
	defer stop()
	var wg sync.WaitGroup
	for i := range waiters + 1 {
		wg.Go(func() {
			if get(counted(h, &entered)) != http.StatusNoContent {
				bad.Add(1)
			}
		})
		if i == 0 && !waitFor(5*time.Second, func() bool { return seq.Load() == 1 }) {
			close(gate)
			return nil, fmt.Errorf("the first request never started")
		}
	}
	waitFor(5*time.Second, func() bool { return entered.Load() == int64(waiters+1) })
	time.Sleep(20 * time.Millisecond) // let the last arrivals park
	close(gate)
	if wg.Wait(); bad.Load() > 0 {
		return nil, fmt.Errorf("%d of %d requests not served", bad.Load(), waiters+1)
	}
	out := make([]float64, waiters)
	for i := range out {
		out[i] = float64(starts[i+1] - ends[i])
	}
	return out, nil
}

// timeoutLateness is metric 5: how late after its deadline each waiter was
// answered, in ns; on the bare route, a plain time.Timer (the floor).
func (p Plan) timeoutLateness(v Variant) ([]float64, error) {
	n, slots := p.TimeoutWaiters, p.TimeoutSlots
	var seq, served atomic.Int64
	waiter := func() func() { return func() { <-time.NewTimer(p.TimeoutDeadline).C } }
	if v.throttles() {
		gate := make(chan struct{})
		h, stop := v.New(Limits{slots, n + slots, p.TimeoutDeadline}, holding(int64(slots), &seq, gate, nil))
		defer stop()
		var holders sync.WaitGroup
		defer holders.Wait()
		defer close(gate)
		for range slots {
			// Retry, shifted by 13 ms each time: the seed port times out a
			// request that reaches it more than 20 ms before a tick.
			holders.Go(func() {
				for try, end := 0, time.Now().Add(10*time.Second); time.Now().Before(end) && get(h) != http.StatusNoContent; try++ {
					time.Sleep(time.Duration(try%8) * 13 * time.Millisecond)
				}
			})
		}
		if !waitFor(10*time.Second, func() bool { return seq.Load() == int64(slots) }) {
			return nil, fmt.Errorf("the slot holders never started")
		}
		waiter = func() func() {
			req, w := httptest.NewRequest(http.MethodGet, "/", nil), newWriter()
			return func() {
				if serve(h, w, req) == http.StatusNoContent {
					served.Add(1)
				}
			}
		}
	}
	late := make([]float64, n)
	var wg sync.WaitGroup
	for i := range n {
		wait := waiter()
		wg.Go(func() {
			t0 := time.Now()
			wait()
			late[i] = float64(time.Since(t0) - p.TimeoutDeadline)
		})
		time.Sleep(time.Millisecond)
	}
	if wg.Wait(); served.Load() > 0 {
		return nil, fmt.Errorf("%d waiters ran although every slot was held", served.Load())
	}
	return late, nil
}

// liveBytes is the live heap and the goroutine stacks after a full
// collection (twice, so that sync.Pools are empty).
func liveBytes() (heap, stack int64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), int64(m.StackInuse)
}

// memoryPerWaiter is metric 6. The waiters' goroutines exist before the
// first reading and call the route directly, as a connection's would.
func (p Plan) memoryPerWaiter(v Variant) (heap, stack float64, err error) {
	n, slots := p.MemoryWaiters, p.MemorySlots
	var seq, entered atomic.Int64
	gate, start := make(chan struct{}), make(chan struct{})
	h, stop := v.New(Limits{slots, n + slots, 5 * time.Minute}, holding(int64(slots), &seq, gate, nil))
	hc := counted(h, &entered)
	var wg sync.WaitGroup
	defer func() { close(gate); stop(); wg.Wait() }()
	for range slots {
		wg.Go(func() { get(hc) })
	}
	if !waitFor(5*time.Second, func() bool { return seq.Load() == int64(slots) }) {
		return 0, 0, fmt.Errorf("the slot holders never started")
	}
	for range n {
		req, w := httptest.NewRequest(http.MethodGet, "/", nil), newWriter()
		wg.Go(func() {
			<-start
			hc.ServeHTTP(w, req)
		})
	}
	time.Sleep(20 * time.Millisecond)
	h0, s0 := liveBytes()
	close(start)
	if !waitFor(30*time.Second, func() bool { return entered.Load() == int64(n+slots) }) {
		return 0, 0, fmt.Errorf("only %d of %d requests arrived", entered.Load(), n+slots)
	}
	time.Sleep(50 * time.Millisecond) // let the last arrivals park
	h1, s1 := liveBytes()
	return float64(h1-h0) / float64(n), float64(s1-s0) / float64(n), nil
}

// backendHeapPerWaiter is metric 6's own structures: the live heap that
// parked Acquire calls add to ginqueue's Backend, without gin.
func (p Plan) backendHeapPerWaiter() ([]float64, error) {
	n, b, bg := p.MemoryWaiters, inmem.New(), context.Background()
	if err := b.Start(backend.Limits{MaxConcurrent: 1, MaxQueue: n, QueueTimeout: 5 * time.Minute}); err != nil {
		return nil, err
	}
	holder, err := b.Acquire(bg, backend.Arrival{})
	if err != nil {
		return nil, err
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			if t, err := b.Acquire(bg, backend.Arrival{}); err == nil {
				b.Release(t)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	before, _ := liveBytes()
	close(start)
	ok := waitFor(30*time.Second, func() bool { return b.Stats().Queued == n })
	after, _ := liveBytes()
	_ = b.Close()
	wg.Wait()
	if b.Release(holder); !ok {
		return nil, fmt.Errorf("ginqueue backend: %d of %d waiters queued", b.Stats().Queued, n)
	}
	return []float64{float64(after-before) / float64(n)}, nil
}

// growthCost is metric 7, in ns per request: a served client queues again,
// keeping the depth. Handlers yield once, or the queue would empty.
func (p Plan) growthCost(v Variant, depth int) (float64, error) {
	var seq, entered, done, bad atomic.Int64
	gate := make(chan struct{})
	h, stop := v.New(Limits{p.GrowthSlots, depth + 64, 5 * time.Minute}, holding(int64(p.GrowthSlots), &seq, gate, runtime.Gosched))
	hc := counted(h, &entered)
	clients := depth + p.GrowthSlots
	var halt atomic.Bool
	var wg sync.WaitGroup
	for client := range clients {
		wg.Go(func() {
			// One request per client: a feature variant's client keeps one
			// priority class, and the lower classes wait behind the higher.
			for req, w := v.request(client, client), newWriter(); !halt.Load(); done.Add(1) {
				if serve(hc, w, req) != http.StatusNoContent && !halt.Load() {
					bad.Add(1)
				}
			}
		})
	}
	ok := waitFor(time.Minute, func() bool { return entered.Load() >= int64(clients) })
	time.Sleep(20 * time.Millisecond) // let the last arrivals park
	close(gate)
	time.Sleep(p.GrowthWindow / 10) // warm up
	c0, t0 := done.Load(), time.Now()
	time.Sleep(p.GrowthWindow)
	c1, took := done.Load(), time.Since(t0)
	halt.Store(true)
	stop()
	wg.Wait()
	switch {
	case !ok:
		return 0, fmt.Errorf("clients did not start")
	case bad.Load() > 0:
		return 0, fmt.Errorf("%d requests not served at depth %d", bad.Load(), depth)
	case c1 == c0:
		return 0, fmt.Errorf("no request completed in %v at depth %d", p.GrowthWindow, depth)
	}
	return float64(took) / float64(c1-c0), nil
}

// listen serves h on a port of 127.0.0.1 until stop.
func listen(h http.Handler) (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// loopbackRate is metric 8, requests per second once each client has
// opened its connection, over three ticks at least for a Slow variant.
func (p Plan) loopbackRate(v Variant) (float64, error) {
	h, stop := v.New(p.Uncontended, noContent)
	defer stop()
	addr, closeSrv, err := listen(h)
	if err != nil {
		return 0, err
	}
	defer closeSrv()
	n, window := p.LoopbackClients, p.LoopbackWindow
	if v.Slow {
		window = max(window, 3*seedInterval)
	}
	tr := &http.Transport{MaxIdleConns: n, MaxIdleConnsPerHost: n, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var count atomic.Int64
	var first atomic.Value
	clients := func(until time.Time) { // one request each, or requests until then
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				for i := 0; i == 0 || time.Now().Before(until); i++ {
					resp, err := client.Get("http://" + addr + "/")
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusNoContent {
							err = fmt.Errorf("status %d", resp.StatusCode)
						}
					}
					if err != nil {
						first.CompareAndSwap(nil, err)
						return
					} else if !until.IsZero() {
						count.Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	clients(time.Time{})
	start := time.Now()
	clients(start.Add(window))
	if err, _ := first.Load().(error); err != nil {
		return 0, err
	}
	return float64(count.Load()) / time.Since(start).Seconds(), nil
}

// Outcomes of a burst.
const (
	OutcomeServed  = "served"
	OutcomeFull    = "refused at once"
	OutcomeTimeout = "timed out"
)

// Event is one request of a burst, times from the burst's start.
type Event struct {
	Arrive, Start, End time.Duration // Start is -1 for a request that never ran
	Outcome            string
}

// Timeline is a burst as one variant answered it, in arrival order.
type Timeline struct {
	Variant string
	Events  []Event
}

// Count is how many events had outcome o.
func (t Timeline) Count(o string) (n int) {
	for _, e := range t.Events {
		if e.Outcome == o {
			n++
		}
	}
	return n
}

// Last is when the last response came back.
func (t Timeline) Last() (last time.Duration) {
	for _, e := range t.Events {
		last = max(last, e.End)
	}
	return last
}

// burst sends n requests at once through v under l, to handlers that sleep
// work. It is the tutorial's test (metric 9) and metric 3.
func (p Plan) burst(v Variant, l Limits, n int, work time.Duration) Timeline {
	base := time.Now()
	events := make([]Event, n)
	h, stop := v.New(l, func(c *gin.Context) {
		id, _ := strconv.Atoi(c.Query("id"))
		events[id].Start = time.Since(base)
		time.Sleep(work)
		noContent(c)
	})
	defer stop()
	var wg sync.WaitGroup
	ready := make(chan struct{})
	for i := range events {
		events[i].Start = -1
		req := httptest.NewRequest(http.MethodGet, "/?id="+strconv.Itoa(i), nil)
		wg.Go(func() {
			<-ready
			w := httptest.NewRecorder()
			events[i].Arrive = time.Since(base)
			h.ServeHTTP(w, req)
			e := &events[i]
			if e.End, e.Outcome = time.Since(base), OutcomeFull; w.Code < 300 {
				e.Outcome = OutcomeServed
			} else if w.Code == http.StatusRequestTimeout || strings.Contains(w.Body.String(), "Timed out") {
				e.Outcome = OutcomeTimeout // chi says so in its body
			}
		})
	}
	base = time.Now()
	close(ready)
	wg.Wait()
	slices.SortStableFunc(events, func(a, b Event) int { return cmp.Compare(a.Arrive, b.Arrive) })
	return Timeline{Variant: v.Name, Events: events}
}

// seedBurst is the tutorial's test (the tutorial's timeout is 5 s).
func (p Plan) seedBurst(v Variant) Timeline {
	return p.burst(v, Limits{p.BurstSlots, p.BurstQueue, p.BurstTimeout}, p.BurstRequests, p.BurstWork)
}

// scheduleEfficiency is metric 3: the ideal makespan over the measured
// one, from the burst's start to the last response.
func (p Plan) scheduleEfficiency(v Variant) ([]float64, error) {
	n := p.ScheduleRequests
	t := p.burst(v, Limits{p.ScheduleSlots, n, 30 * time.Second}, n, p.ScheduleWork)
	if s := t.Count(OutcomeServed); s < n {
		return nil, fmt.Errorf("%d of %d requests not served", n-s, n)
	}
	return []float64{float64(time.Duration(n)*p.ScheduleWork/time.Duration(p.ScheduleSlots)) / float64(t.Last())}, nil
}
