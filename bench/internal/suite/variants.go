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

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/promqueue"
)

// Limits are the throttle settings every variant of one measurement gets.
type Limits struct {
	MaxConcurrent int           // slots
	MaxQueue      int           // waiting places beyond the slots
	QueueTimeout  time.Duration // longest wait for a slot
}

// Variant is one way of guarding a gin route.
type Variant struct {
	Name string // the column heading
	ID   string // the name in Go benchmark names
	Peer bool   // a peer, one of those the best peer of a row is chosen from
	Slow bool   // grants on a 100 ms tick: the harnesses give it fewer samples
	// New serves h on GET / behind the throttle. The func it returns
	// releases the throttle; where the variant can (ginqueue, the seed port),
	// waiters still queued are answered at once, so that a harness never
	// waits for a deep queue to drain through a slow throttle.
	New func(l Limits, h gin.HandlerFunc) (http.Handler, func())
	// Request builds the seq-th request of one client; nil is GET / with no
	// headers. The feature variants send what Priority and FlowKey read.
	Request func(client, seq int) *http.Request
}

func (v Variant) throttles() bool { return v.ID != "bare" }

func (v Variant) request(client, seq int) *http.Request {
	if v.Request != nil {
		return v.Request(client, seq)
	}
	return httptest.NewRequest(http.MethodGet, "/", nil)
}

// requests prebuilds what one client cycles through: one request, or one
// per priority class for the feature variants.
func (v Variant) requests(client int) []*http.Request {
	rs := make([]*http.Request, 1)
	if v.Request != nil {
		rs = make([]*http.Request, len(priorities))
	}
	for i := range rs {
		rs[i] = v.request(client, i)
	}
	return rs
}

// Column names of the report.
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
	GoodFIFO      = "ginqueue FIFO"
	GoodReject    = "FIFO + RejectEarly"
	GoodCoDel     = "CoDel"
	GoodCoDelLIFO = "CoDel + LIFO"
)

// Variants are the columns of the main table.
func Variants() []Variant {
	return []Variant{
		{Name: Bare, ID: "bare", New: func(_ Limits, h gin.HandlerFunc) (http.Handler, func()) { return route(h, func() {}) }},
		{Name: GinQueue, ID: "ginqueue", New: withQueue(nil)},
		{Name: Chi, ID: "chi", Peer: true, New: newChi},
		{Name: XSync, ID: "xsync", Peer: true, New: newXSync},
		{Name: Seed, ID: "seed", Peer: true, Slow: true, New: newSeed(false)},
	}
}

// burstVariants are the table's and the seed port as the tutorial wrote it.
func burstVariants() []Variant {
	return append(Variants(), Variant{Name: SeedAsWritten, ID: "seed-as-written", Peer: true, Slow: true, New: newSeed(true)})
}

// route is a gin engine serving h on GET / behind mw; stop is its release.
func route(h gin.HandlerFunc, stop func(), mw ...gin.HandlerFunc) (http.Handler, func()) {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(mw...)
	r.GET("/", h)
	return r, stop
}

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

// withQueue is ginqueue with the limits, changed by set.
func withQueue(set func(*ginqueue.Config)) func(Limits, gin.HandlerFunc) (http.Handler, func()) {
	return func(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
		q := newQueue(l, set)
		return route(h, func() { _ = q.Close() }, q.Handler())
	}
}

// newChi wraps the whole engine, as chi decorates an http.Handler: a
// waiting request holds no gin.Context yet. chi admits Limit+BacklogLimit
// in all, so BacklogLimit is the queue bound. Its one status for every
// refusal (429) is left as a user of chi gets it.
func newChi(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	r, stop := route(h, func() {})
	return middleware.ThrottleWithOpts(middleware.ThrottleOpts{
		Limit: l.MaxConcurrent, BacklogLimit: l.MaxQueue, BacklogTimeout: l.QueueTimeout,
	})(r), stop
}

// newXSync is the throttle a Gin user would write on
// golang.org/x/sync/semaphore: TryAcquire first (it fails while anyone
// waits, so FIFO holds), otherwise an atomic count of waiters bounds the
// queue and Acquire waits under a context that ends at QueueTimeout. Queue
// full and timeout answer 503 and 408, like ginqueue; a client that hung up
// gets nothing written and 499 recorded.
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
			waiting.Add(-1)
			if err != nil && c.Request.Context().Err() != nil {
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

// The feature variants' requests: client c is flow c mod flows (header
// X-Flow), its seq-th request has priority seq mod 3 (header X-Priority).
var priorities = [...]string{"0", "1", "2"}

// FeatureVariants are the columns of section 10, plain ginqueue first, over
// flows flows. spread gives Adaptive the bounds [limit/2, 2 × limit], which
// a harness whose limit is never reached cannot feel; otherwise MinLimit =
// MaxLimit = limit, so that every sample, window and update runs while the
// limit stays the plain one, and the figures compare cost, not limits.
func FeatureVariants(flows int, spread bool) []Variant {
	req := func(client, seq int) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["X-Flow"] = []string{strconv.Itoa(client % flows)}
		r.Header["X-Priority"] = []string{priorities[seq%len(priorities)]}
		return r
	}
	return []Variant{
		{Name: Plain, ID: "plain", Request: req, New: withQueue(nil)},
		{Name: PrioFlows, ID: "prioflows", Request: req, New: withQueue(func(c *ginqueue.Config) {
			c.Priority = func(c *gin.Context) int { p, _ := strconv.Atoi(c.GetHeader("X-Priority")); return p }
			c.FlowKey = ginqueue.ByHeader("X-Flow")
		})},
		{Name: Observed, ID: "observed", Request: req, New: newObserved},
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
// far more often than any Prometheus scrapes, the worst case.
const ScrapeInterval = 5 * time.Millisecond

// newObserved is ginqueue with ServerTiming and a promqueue Collector,
// gathered every ScrapeInterval while the variant serves.
func newObserved(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	q := newQueue(l, func(c *ginqueue.Config) { c.ServerTiming = true })
	col := promqueue.NewCollector()
	if err := col.Add("bench", q); err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for t := time.NewTicker(ScrapeInterval); ; {
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
				if _, err := reg.Gather(); err != nil {
					panic(err) // a collector that cannot be gathered is a bug
				}
			}
		}
	})
	return route(h, func() { close(done); wg.Wait(); _ = q.Close() }, q.Handler())
}

// GoodputVariants are the columns of section 12: four configurations of
// ginqueue, then chi and x/sync with the same limit, backlog and timeout.
// CoDel is at its defaults (Target 5 ms, Interval 100 ms); its drops are
// queue timeouts, answered 408.
func GoodputVariants() []Variant {
	return []Variant{
		{Name: GoodFIFO, ID: "fifo", New: withQueue(nil)},
		{Name: GoodReject, ID: "rejectearly", New: withQueue(func(c *ginqueue.Config) { c.RejectEarly = true })},
		{Name: GoodCoDel, ID: "codel", New: withQueue(func(c *ginqueue.Config) { c.CoDel = &ginqueue.CoDel{} })},
		{Name: GoodCoDelLIFO, ID: "codel-lifo", New: withQueue(func(c *ginqueue.Config) { c.CoDel = &ginqueue.CoDel{LIFO: true} })},
		{Name: Chi, ID: "chi", Peer: true, New: newChi},
		{Name: XSync, ID: "xsync", Peer: true, New: newXSync},
	}
}
