package suite

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/promqueue"
)

// The feature variants: ginqueue with one of its optional features on,
// against plain ginqueue. Each sends the same requests (featureRequest), so
// a column differs from the plain one only by what the feature does.
const (
	Plain       = "plain ginqueue"
	PrioFlows   = "Priority + FlowKey"
	Observed    = "ServerTiming + promqueue"
	AdaptiveCol = "Adaptive"
)

// Headers the feature requests carry, and how they spread.
const (
	headerFlow     = "X-Flow"
	headerPriority = "X-Priority"
	// priorityClasses is the number of priorities a Priority variant sees.
	priorityClasses = 3
	// ScrapeInterval is how often the ServerTiming + promqueue variant's
	// registry is gathered while it serves: far more often than any
	// Prometheus scrapes, the worst case for the request path.
	ScrapeInterval = 5 * time.Millisecond
)

// priorityValues are the X-Priority header values, prebuilt so that
// building a request allocates the same for every class.
var priorityValues = [priorityClasses]string{"0", "1", "2"}

// featureRequest returns the Request func of the feature variants: client c
// is flow c mod flows, its seq-th request has priority seq mod 3.
func featureRequest(flows int) func(client, seq int) *http.Request {
	return func(client, seq int) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header[headerFlow] = []string{strconv.Itoa(client % flows)}
		r.Header[headerPriority] = []string{priorityValues[seq%priorityClasses]}
		return r
	}
}

// priorityOf is the Config.Priority of the PrioFlows variant.
func priorityOf(c *gin.Context) int {
	switch c.GetHeader(headerPriority) {
	case "2":
		return 2
	case "1":
		return 1
	}
	return 0
}

// FeatureVariants returns the columns of the feature table, plain first.
// Requests spread over flows flows. adaptiveSpread chooses the Adaptive
// column's bounds: true gives [limit/2, 2 × limit], which a harness whose
// limit is never reached cannot feel; false pins MinLimit = MaxLimit =
// limit, so that every sample, window and update runs while the limit stays
// the plain column's, and the figures compare cost, not limits.
func FeatureVariants(flows int, adaptiveSpread bool) []Variant {
	req := featureRequest(flows)
	return []Variant{
		{Name: Plain, ID: "plain", Throttles: true, Request: req, New: newFeature(nil)},
		{Name: PrioFlows, ID: "prioflows", Throttles: true, Request: req, New: newFeature(func(c *ginqueue.Config) {
			c.Priority = priorityOf
			c.FlowKey = ginqueue.ByHeader(headerFlow)
		})},
		{Name: Observed, ID: "observed", Throttles: true, Request: req, New: newObserved},
		{Name: AdaptiveCol, ID: "adaptive", Throttles: true, Request: req, New: newFeature(func(c *ginqueue.Config) {
			lo, hi := c.MaxConcurrent, c.MaxConcurrent
			if adaptiveSpread {
				lo, hi = max(1, c.MaxConcurrent/2), 2*c.MaxConcurrent
			}
			c.Adaptive = &ginqueue.AdaptiveConfig{MinLimit: lo, MaxLimit: hi}
		})},
	}
}

// newFeature builds ginqueue with the limits l, changed by set.
func newFeature(set func(*ginqueue.Config)) func(Limits, gin.HandlerFunc) (http.Handler, func()) {
	return func(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
		q := featureQueue(l, set)
		r := engine(q.Handler())
		r.GET("/", h)
		return r, func() { _ = q.Close() }
	}
}

func featureQueue(l Limits, set func(*ginqueue.Config)) *ginqueue.Queue {
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

// newObserved is ginqueue with ServerTiming on and a promqueue Collector
// registered, gathered every ScrapeInterval while the variant serves.
func newObserved(l Limits, h gin.HandlerFunc) (http.Handler, func()) {
	q := featureQueue(l, func(c *ginqueue.Config) { c.ServerTiming = true })
	col := promqueue.NewCollector()
	if err := col.Add("bench", q); err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(ScrapeInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if _, err := reg.Gather(); err != nil {
					panic(err) // a collector that cannot be gathered is a bug
				}
			}
		}
	})
	r := engine(q.Handler())
	r.GET("/", h)
	return r, func() {
		close(done)
		wg.Wait()
		_ = q.Close()
	}
}

// Metric names of the feature table.
const (
	MFRoute        = "10a. uncontended, route only"
	MFRouteA       = "10a. uncontended, route only: allocs"
	MFRequest      = "10b. uncontended, request"
	MFRequestA     = "10b. uncontended, request: allocs"
	MFHandoff      = "10c. saturated hand-off"
	MFHandoffA     = "10c. saturated hand-off: allocs"
	MFGrowthPrefix = "10d. per-request cost over flows, queue depth "
	MFGrowthFlat   = "10d. growth over flows, deepest / shallowest"
)

// features measures the feature variants on the harnesses of metrics 1, 2
// and 7, the variants alternating within each round like the table's.
func (r *runner) features() {
	r.logf("10. features: Priority + FlowKey, ServerTiming + promqueue, Adaptive")
	spread := FeatureVariants(r.plan.Flows, true)
	pinned := FeatureVariants(r.plan.Flows, false)
	r.res.FeatureVariants = spread
	add := func(rows ...Row) { r.res.FeatureRows = append(r.res.FeatureRows, rows...) }
	add(r.gobenchRows(MFRoute, MFRouteA, false, spread, BenchUncontendedRoute))
	add(r.gobenchRows(MFRequest, MFRequestA, false, spread, BenchUncontendedRequest))
	add(r.gobenchRows(MFHandoff, MFHandoffA, true, pinned, BenchHandoff))
	r.logf("10d. growth over %s flows", GroupDigits(r.plan.Flows))
	d := r.plan.GrowthDepths
	add(r.growthRows(MFGrowthPrefix, MFGrowthFlat, spread[:2], []int{d[0], d[len(d)-1]})...)
}
