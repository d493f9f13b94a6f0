package suite

import (
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/ginqueue/ginqueue"
)

// Limits are the throttle settings every variant of one measurement gets.
type Limits struct {
	MaxConcurrent int           // slots
	MaxQueue      int           // waiting places beyond the slots
	QueueTimeout  time.Duration // longest wait for a slot
}

// Variant is one way of guarding a gin route.
type Variant struct {
	// Name is the column heading in the report.
	Name string
	// ID names the variant in Go benchmark names: bare, ginqueue, chi,
	// xsync, seed.
	ID string
	// Peer marks the variants that count as peers when the best peer of a
	// metric is chosen: not the bare route, not ginqueue itself.
	Peer bool
	// Throttles is false for the bare route, which has no queue to measure.
	Throttles bool
	// Slow marks variants that grant only on a 100 ms tick; the harnesses
	// give them fewer samples so that a run stays within its time budget.
	Slow bool
	// New builds a handler that serves h on GET / behind the throttle. The
	// returned func releases the throttle: waiters still queued are answered
	// at once where the variant can do so (ginqueue, seed), so a harness never
	// waits for a deep queue to drain through a slow throttle.
	New func(l Limits, h gin.HandlerFunc) (http.Handler, func())
	// Request builds the seq-th request of one client (a goroutine of a
	// harness). Nil means GET / with no headers. The feature variants send
	// the headers their Priority and FlowKey read (see featureRequest).
	Request func(client, seq int) *http.Request
}

// request is the seq-th request of client for v.
func (v Variant) request(client, seq int) *http.Request {
	if v.Request != nil {
		return v.Request(client, seq)
	}
	return httptest.NewRequest(http.MethodGet, "/", nil)
}

// requests prebuilds the requests that one client of v cycles through: one
// for the table's variants, one per priority class for the feature
// variants.
func (v Variant) requests(client int) []*http.Request {
	n := 1
	if v.Request != nil {
		n = priorityClasses
	}
	rs := make([]*http.Request, n)
	for i := range rs {
		rs[i] = v.request(client, i)
	}
	return rs
}

// Names of the variants, as they head the report's columns.
const (
	Bare     = "bare gin"
	GinQueue = "ginqueue"
	Chi      = "chi Throttle"
	XSync    = "x/sync semaphore"
	Seed     = "interval-polled queue"
	// SeedAsWritten is the seed port with the lesson's double increment; it
	// appears only in the burst timeline (see seedQueue).
	SeedAsWritten = "interval-polled, as written"
)

// Variants returns the variants of the table, in column order.
func Variants() []Variant {
	return []Variant{
		{Name: Bare, ID: "bare", New: newBare},
		{Name: GinQueue, ID: "ginqueue", Throttles: true, New: newGinQueue},
		{Name: Chi, ID: "chi", Peer: true, Throttles: true, New: newChi},
		{Name: XSync, ID: "xsync", Peer: true, Throttles: true, New: newXSync},
		{Name: Seed, ID: "seed", Peer: true, Throttles: true, Slow: true, New: newSeed(false)},
	}
}

// timelineVariants returns the variants of the seed burst timeline: the
// table's, plus the seed port with its double increment.
func timelineVariants() []Variant {
	return append(Variants(), Variant{Name: SeedAsWritten, ID: "seed-as-written", Peer: true, Throttles: true, Slow: true, New: newSeed(true)})
}

func engine(mw ...gin.HandlerFunc) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(mw...)
	return r
}

func newBare(_ Limits, h gin.HandlerFunc) (http.Handler, func()) {
	r := engine()
	r.GET("/", h)
	return r, func() {}
}

func newGinQueue(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	q, err := ginqueue.NewQueue(ginqueue.Config{
		MaxConcurrent: l.MaxConcurrent,
		MaxQueue:      l.MaxQueue,
		QueueTimeout:  l.QueueTimeout,
	})
	if err != nil {
		panic(err) // the harnesses' limits are valid
	}
	r := engine(q.Handler())
	r.GET("/", h)
	return r, func() { _ = q.Close() }
}

// newChi wraps the whole gin engine, as chi's middleware decorates an
// http.Handler: a waiting request holds no gin.Context yet. chi admits
// Limit+BacklogLimit requests in all, so BacklogLimit is the queue bound.
// chi answers every rejection with one status (429 by default), which is
// left as it is: it is part of what a user of chi gets.
func newChi(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	r := engine()
	r.GET("/", h)
	throttle := middleware.ThrottleWithOpts(middleware.ThrottleOpts{
		Limit:          l.MaxConcurrent,
		BacklogLimit:   l.MaxQueue,
		BacklogTimeout: l.QueueTimeout,
	})
	return throttle(r), func() {}
}

func newXSync(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	r := engine(semaphoreMiddleware(l))
	r.GET("/", h)
	return r, func() {}
}

func newSeed(doubleIncrement bool) func(Limits, gin.HandlerFunc) (http.Handler, func()) {
	return func(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
		s := newSeedQueue(l, seedInterval, doubleIncrement)
		r := engine(s.Handler)
		r.GET("/", h)
		return r, s.Close
	}
}
