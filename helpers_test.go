// Helpers shared by the external tests, and TestMain: goleak checks every test.

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
	"go.uber.org/goleak"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	goleak.VerifyTestMain(m)
}

// result is what one request saw, sent back from its goroutine.
type result struct {
	id     int
	code   int
	body   string
	header http.Header
	at     time.Duration // when the response was complete, since the test began
}

// gate is a handler that blocks until released, so tests decide when a slot
// frees. It counts how many run at once.
type gate struct {
	release chan struct{}
	running atomic.Int64
	maxRun  atomic.Int64
	started chan int
}

func newGate() *gate {
	return &gate{release: make(chan struct{}), started: make(chan int, 1024)}
}

func (g *gate) handler(c *gin.Context) {
	n := g.running.Add(1)
	for {
		m := g.maxRun.Load()
		if n <= m || g.maxRun.CompareAndSwap(m, n) {
			break
		}
	}
	id := 0
	fmt.Sscan(c.Query("id"), &id)
	g.started <- id
	<-g.release
	g.running.Add(-1)
	c.String(http.StatusOK, "ok %d", id)
}

// open lets n held handlers finish.
func (g *gate) open(n int) {
	for range n {
		g.release <- struct{}{}
	}
}

// gated is an engine whose route, behind q and gin.Recovery, is a new gate.
func gated(q *ginqueue.Queue) (*gate, *gin.Engine) {
	g := newGate()
	return g, newEngine(q.Handler(), g.handler)
}

func newEngine(mw gin.HandlerFunc, h gin.HandlerFunc) *gin.Engine {
	r := gin.New()
	r.Use(gin.Recovery(), mw)
	r.GET("/", h)
	return r
}

// send runs one request in a new goroutine and sends its result to out.
func send(r http.Handler, ctx context.Context, id int, t0 time.Time, out chan<- result) {
	sendBy(r, ctx, id, "", t0, out)
}

func mustQueue(t *testing.T, cfg ginqueue.Config) *ginqueue.Queue {
	t.Helper()
	q, err := ginqueue.NewQueue(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// sleeper is a handler that works for d of fake time.
func sleeper(d time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		time.Sleep(d)
		c.Status(http.StatusOK)
	}
}

func burst(r http.Handler, n, firstID int, out chan<- result) {
	for i := range n {
		send(r, context.Background(), firstID+i, time.Now(), out)
		synctest.Wait()
	}
}

// byQuery reads the priority and flow of a test request from its query.
func byQueryPriority(c *gin.Context) int { p, _ := strconv.Atoi(c.Query("p")); return p }
func byQueryFlow(c *gin.Context) string  { return c.Query("flow") }

// sendAt runs GET /?id=..&p=..&flow=.. in its own goroutine and waits until
// it has settled (running or parked), so arrivals have a known order.
func sendAt(r http.Handler, id, prio int, flow string, out chan<- result) {
	go func() {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, fmt.Sprintf("/?id=%d&p=%d&flow=%s", id, prio, flow), nil))
		out <- result{id: id, code: w.Code}
	}()
	synctest.Wait()
}

func priorityQueue(t *testing.T, maxQueue, perFlow int) *ginqueue.Queue {
	return mustQueue(t, ginqueue.Config{
		MaxConcurrent: 1, MaxQueue: maxQueue, QueueTimeout: time.Minute,
		Priority: byQueryPriority, FlowKey: byQueryFlow, MaxQueuePerFlow: perFlow,
	})
}

// byQueryCost is a Config.Cost that reads the cost from the query ("c").
func byQueryCost(c *gin.Context) int { n, _ := strconv.Atoi(c.Query("c")); return n }

// clientTimeout is the header the tests send their deadlines in.
const clientTimeout = "X-Client-Timeout"

// sendBy runs one request in a new goroutine with the clientTimeout header
// set to wait (none if empty), and sends its result to out.
func sendBy(r http.Handler, ctx context.Context, id int, wait string, t0 time.Time, out chan<- result) {
	go func() {
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("/?id=%d", id), nil)
		if wait != "" {
			req.Header.Set(clientTimeout, wait)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		out <- result{id: id, code: w.Code, body: w.Body.String(), header: w.Header(), at: time.Since(t0)}
	}()
}

// deadlineQueue is a Queue with the clientTimeout header as its Deadline.
func deadlineQueue(t *testing.T, cfg ginqueue.Config) *ginqueue.Queue {
	cfg.Deadline = ginqueue.DeadlineHeader(clientTimeout)
	return mustQueue(t, cfg)
}

// outcomeLog records the outcomes OnOutcome reports, from any goroutine.
type outcomeLog struct {
	mu   sync.Mutex
	seen []ginqueue.Outcome
}

func (l *outcomeLog) add(_ *gin.Context, o ginqueue.Outcome, _ time.Duration) {
	l.mu.Lock()
	l.seen = append(l.seen, o)
	l.mu.Unlock()
}

func (l *outcomeLog) get() []ginqueue.Outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen
}

// counted is the rejection counters of st, by outcome.
func counted(st ginqueue.Stats) map[ginqueue.Outcome]uint64 {
	return map[ginqueue.Outcome]uint64{
		ginqueue.OutcomeServed:       st.Served,
		ginqueue.OutcomeQueueFull:    st.QueueFull,
		ginqueue.OutcomeQueueTimeout: st.QueueTimeout,
		ginqueue.OutcomeCanceled:     st.Canceled,
		ginqueue.OutcomeClosed:       st.Closed,
		ginqueue.OutcomePanic:        st.Panicked,
	}
}

// plainBackend hides every method but the Backend's.
type plainBackend struct{ backend.Backend }

// limitsRecorder is a Backend that records the Limits it was started with.
type limitsRecorder struct {
	backend.Backend
	limits backend.Limits
}

func (b *limitsRecorder) Start(l backend.Limits) error { b.limits = l; return b.Backend.Start(l) }

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

// statsWatch checks, at every look, what Prometheus and dashboards rely on:
// counters (Abandoned too, never above Served) and histogram buckets never
// go down, Served >= Running, the split by priority adds up to Queued,
// DrainRate is finite and not negative, the percentiles are ordered.
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
	was := counted(w.last)
	for o, n := range counted(st) {
		if n < was[o] {
			bad("the %v counter went down: %d after %d", o, n, was[o])
		}
	}
	if st.Abandoned < w.last.Abandoned || st.Abandoned > st.Served {
		bad("Abandoned %d after %d, with Served %d", st.Abandoned, w.last.Abandoned, st.Served)
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

// discardWriter is a minimal http.ResponseWriter that allocates nothing, so
// the benchmarks measure the router and the middleware, not a recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}
