package suite

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/otelqueue"
	"github.com/ginqueue/ginqueue/promqueue"
)

// Limits are the throttle settings every variant of one measurement gets:
// slots, waiting places beyond them, and the longest wait for a slot.
type Limits struct {
	MaxConcurrent, MaxQueue int
	QueueTimeout            time.Duration
}

// Variant is one way of guarding a gin route, a column of the report.
// New serves h on GET / behind the throttle; the func it returns releases
// the throttle, answering queued waiters at once where the variant can.
type Variant struct {
	Name, ID       string // the column heading; the name in Go benchmark names
	Slow           bool   // grants on a 100 ms tick: it gets fewer samples
	New            func(l Limits, h gin.HandlerFunc) (http.Handler, func())
	Request        func(client, seq int) *http.Request // the seq-th request of a client; nil: GET /
	PatienceHeader string                              // where section 12's clients send their patience, if set
}

func (v Variant) throttles() bool { return v.ID != "bare" }

func (v Variant) request(client, seq int) *http.Request {
	if v.Request != nil {
		return v.Request(client, seq)
	}
	return httptest.NewRequest(http.MethodGet, "/", nil)
}

// Column names of the report. The peers are chi, x/sync and the seed port.
const (
	Bare          = "bare gin"
	GinQueue      = "ginqueue"
	Chi           = "chi Throttle"
	XSync         = "x/sync semaphore"
	Seed          = "interval-polled queue"
	SeedAsWritten = "interval-polled, as written" // the burst alone (see seedQueue)
	Plain         = "plain ginqueue"
	PrioFlows     = "Priority + FlowKey"
	Observed      = "ServerTiming + promqueue"
	AdaptiveCol   = "Adaptive"
	GoodCoDelLIFO = "CoDel + LIFO"
	GoodDeadline  = "FIFO + Deadline"
	OTel          = "otelqueue"
	Traced        = "traced"
	TracedOTel    = "traced + otelqueue"
)

// PatienceHeader is the header of the Deadline variants of section 12.
const PatienceHeader = "X-Patience"

// Variants are the columns of the main table, the bare route first.
func Variants() []Variant {
	return []Variant{
		{Name: Bare, ID: "bare", New: func(_ Limits, h gin.HandlerFunc) (http.Handler, func()) { return route(h, func() {}) }},
		{Name: GinQueue, ID: "ginqueue", New: withQueue(nil)},
		{Name: Chi, ID: "chi", New: newChi},
		{Name: XSync, ID: "xsync", New: newXSync},
		{Name: Seed, ID: "seed", Slow: true, New: newSeed(false)},
	}
}

// burstVariants are the table's and the seed port as the tutorial wrote it.
func burstVariants() []Variant {
	return append(Variants(), Variant{Name: SeedAsWritten, ID: "seed-as-written", Slow: true, New: newSeed(true)})
}

// route is a gin engine serving h on GET / behind mw; stop is its release.
func route(h gin.HandlerFunc, stop func(), mw ...gin.HandlerFunc) (http.Handler, func()) {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(mw...)
	r.GET("/", h)
	return r, stop
}

// newQueue is ginqueue with the limits l, changed by set.
func newQueue(l Limits, set func(*ginqueue.Config)) *ginqueue.Queue {
	cfg := ginqueue.Config{MaxConcurrent: l.MaxConcurrent, MaxQueue: l.MaxQueue, QueueTimeout: l.QueueTimeout}
	if set != nil {
		set(&cfg)
	}
	q, err := ginqueue.NewQueue(cfg)
	if err != nil {
		panic(err) // the harnesses' limits are valid
	}
	return q
}

func withQueue(set func(*ginqueue.Config)) func(Limits, gin.HandlerFunc) (http.Handler, func()) {
	return func(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
		q := newQueue(l, set)
		return route(h, func() { _ = q.Close() }, q.Handler())
	}
}

// newChi wraps the whole engine, as chi decorates an http.Handler; chi
// admits Limit+BacklogLimit in all, so BacklogLimit is the queue bound.
func newChi(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	r, stop := route(h, func() {})
	return middleware.ThrottleWithOpts(middleware.ThrottleOpts{Limit: l.MaxConcurrent, BacklogLimit: l.MaxQueue, BacklogTimeout: l.QueueTimeout})(r), stop
}

// newXSync is the throttle a Gin user would write on x/sync's semaphore:
// TryAcquire first, else an atomic count of waiters bounds the queue and
// Acquire waits until QueueTimeout. It answers 503 and 408, like ginqueue.
func newXSync(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	sem := semaphore.NewWeighted(int64(l.MaxConcurrent))
	var waiting atomic.Int64
	return route(h, func() {}, func(c *gin.Context) {
		if !sem.TryAcquire(1) {
			if waiting.Add(1) > int64(l.MaxQueue) {
				waiting.Add(-1)
				c.AbortWithStatus(http.StatusServiceUnavailable)
				return
			}
			ctx, cancel := context.WithTimeout(c.Request.Context(), l.QueueTimeout)
			err := sem.Acquire(ctx, 1)
			cancel()
			if waiting.Add(-1); err != nil && c.Request.Context().Err() != nil {
				c.Abort()
				c.Status(499) // nothing written: the client is gone
				return
			} else if err != nil {
				c.AbortWithStatus(http.StatusRequestTimeout)
				return
			}
		}
		defer sem.Release(1)
		c.Next()
	})
}

func newSeed(doubleIncrement bool) func(Limits, gin.HandlerFunc) (http.Handler, func()) {
	return func(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
		s := newSeedQueue(l, doubleIncrement)
		return route(h, s.Close, s.Handler)
	}
}

// priorities are the X-Priority values the feature clients cycle through.
var priorities = [...]string{"0", "1", "2"}

// FeatureVariants are the columns of section 10, plain ginqueue first:
// client c is flow c mod flows, request seq has priority seq mod 3. spread
// gives Adaptive the bounds [limit/2, 2 × limit]; otherwise both are the
// limit, so that the figures compare cost, not limits.
func FeatureVariants(flows int, spread bool) []Variant {
	req := func(client, seq int) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["X-Flow"], r.Header["X-Priority"] = []string{strconv.Itoa(client % flows)}, []string{priorities[seq%len(priorities)]}
		return r
	}
	return []Variant{
		{Name: Plain, ID: "plain", Request: req, New: withQueue(nil)},
		{Name: PrioFlows, ID: "prioflows", Request: req, New: withQueue(func(c *ginqueue.Config) {
			c.Priority = func(c *gin.Context) int { p, _ := strconv.Atoi(c.GetHeader("X-Priority")); return p }
			c.FlowKey = ginqueue.ByHeader("X-Flow")
		})},
		{Name: Observed, ID: "observed", Request: req, New: newObserved},
		{Name: OTel, ID: "otel", Request: req, New: newOTel(false)},
		{Name: Traced, ID: "traced", Request: req, New: newTraced},
		{Name: TracedOTel, ID: "traced-otel", Request: req, New: newOTel(true)},
		{Name: AdaptiveCol, ID: "adaptive", Request: req, New: withQueue(func(c *ginqueue.Config) {
			lo, hi := c.MaxConcurrent, c.MaxConcurrent
			if spread {
				lo, hi = max(1, lo/2), 2*hi
			}
			c.Adaptive = &ginqueue.AdaptiveConfig{MinLimit: lo, MaxLimit: hi}
		})},
	}
}

// ScrapeInterval is how often the Observed variant's registry is gathered:
// far more often than Prometheus would.
const ScrapeInterval = 5 * time.Millisecond

// every calls f every d until the func it returns is called.
func every(d time.Duration, f func()) (stop func()) {
	done, t := make(chan struct{}), time.NewTicker(d)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-t.C:
				f()
			}
		}
	})
	return func() { close(done); wg.Wait(); t.Stop() }
}

// newObserved is ginqueue with ServerTiming and a promqueue Collector,
// gathered every ScrapeInterval.
func newObserved(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	q := newQueue(l, func(c *ginqueue.Config) { c.ServerTiming = true })
	col, reg := promqueue.NewCollector(), prometheus.NewRegistry()
	if err := col.Add("bench", q); err != nil {
		panic(err)
	}
	reg.MustRegister(col)
	stop := every(ScrapeInterval, func() {
		if _, err := reg.Gather(); err != nil {
			panic(err) // a collector that cannot be gathered is a bug
		}
	})
	return route(h, func() { stop(); _ = q.Close() }, q.Handler())
}

// GoodputVariants are the columns of section 12: six configurations of
// ginqueue, then chi and x/sync. CoDel and MinTimeLeft are at their defaults.
func GoodputVariants() []Variant {
	codel := func(lifo bool) func(*ginqueue.Config) {
		return func(c *ginqueue.Config) { c.CoDel = &ginqueue.CoDel{LIFO: lifo} }
	}
	deadline := func(rejectEarly bool) func(*ginqueue.Config) {
		return func(c *ginqueue.Config) {
			c.Deadline = ginqueue.DeadlineHeader(PatienceHeader)
			c.RejectEarly = rejectEarly
		}
	}
	return []Variant{
		{Name: "ginqueue FIFO", ID: "fifo", New: withQueue(nil)},
		{Name: "FIFO + RejectEarly", ID: "rejectearly", New: withQueue(func(c *ginqueue.Config) { c.RejectEarly = true })},
		{Name: GoodDeadline, ID: "deadline", New: withQueue(deadline(false)), PatienceHeader: PatienceHeader},
		{Name: "Deadline + RejectEarly", ID: "deadline-rejectearly", New: withQueue(deadline(true)), PatienceHeader: PatienceHeader},
		{Name: "CoDel", ID: "codel", New: withQueue(codel(false))},
		{Name: GoodCoDelLIFO, ID: "codel-lifo", New: withQueue(codel(true))},
		{Name: Chi, ID: "chi", New: newChi},
		{Name: XSync, ID: "xsync", New: newXSync},
	}
}

// newOTel is ginqueue with otelqueue Metrics, collected every
// ScrapeInterval, and its span events on; traced starts a sampled span per
// request in front, so that the events are recorded.
func newOTel(traced bool) func(Limits, gin.HandlerFunc) (http.Handler, func()) {
	return func(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
		q := newQueue(l, func(c *ginqueue.Config) { c.OnDecision = otelqueue.SpanEvents("bench") })
		reader := sdkmetric.NewManualReader()
		provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		m, err := otelqueue.NewMetrics(provider)
		if err != nil {
			panic(err) // a provider of our own: cannot fail
		}
		if err := m.Add("bench", q); err != nil {
			panic(err)
		}
		var rm metricdata.ResourceMetrics
		collecting := every(ScrapeInterval, func() {
			if err := reader.Collect(context.Background(), &rm); err != nil {
				panic(err) // a collection that fails is a bug
			}
		})
		stop := func() {
			collecting()
			_ = m.Unregister()
			_ = provider.Shutdown(context.Background())
			_ = q.Close()
		}
		if !traced {
			return route(h, stop, q.Handler())
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
		return route(h, func() { stop(); _ = tp.Shutdown(context.Background()) }, spans(tp), q.Handler())
	}
}

// newTraced is plain ginqueue behind a sampled span per request: the base
// of newOTel(true).
func newTraced(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	q := newQueue(l, nil)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	return route(h, func() { _ = q.Close(); _ = tp.Shutdown(context.Background()) }, spans(tp), q.Handler())
}

// spans is an otelgin-like middleware: a server span per request.
func spans(tp trace.TracerProvider) gin.HandlerFunc {
	tracer := tp.Tracer("bench")
	return func(c *gin.Context) {
		ctx, span := tracer.Start(c.Request.Context(), c.FullPath(), trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	}
}
