package suite

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

// weightedSample is one request. The goroutine that serves it writes arrive
// and status; the handler, on that same goroutine, start and end.
type weightedSample struct {
	cost               int
	arrive, start, end time.Time
	status             int
}

type sampleKey struct{}

// weightedRun is section 13: the requests that arrived in the window, and
// the most slots the handlers counted running at once.
func (p Plan) weightedRun() (window []*weightedSample, most int64, err error) {
	runtime.GC() // the previous section's garbage is collected on its own time
	var running, top atomic.Int64
	sample := func(c *gin.Context) *weightedSample { return c.Request.Context().Value(sampleKey{}).(*weightedSample) }
	q := newQueue(p.WeightedLimits, func(c *ginqueue.Config) { c.Cost = func(c *gin.Context) int { return sample(c).cost } })
	h, _ := route(func(c *gin.Context) {
		s := sample(c)
		s.start = time.Now()
		raise(&top, running.Add(int64(s.cost)))
		time.Sleep(p.WeightedWork)
		running.Add(-int64(s.cost))
		s.end = time.Now()
		c.String(http.StatusOK, "ok")
	}, nil, q.Handler())
	meanCost := 1 + p.WeightedHeavyShare*float64(p.WeightedHeavy-1)
	rate := p.WeightedLoad * float64(p.WeightedSlotCapacity()) / meanCost // requests per second
	rng := rand.New(rand.NewPCG(13, 13))
	var wg sync.WaitGroup
	start := time.Now()
	from, to := start.Add(p.WeightedWarmUp), start.Add(p.WeightedWarmUp+p.WeightedWindow)
	for at := start; ; {
		at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if !at.Before(to) {
			break
		}
		s := &weightedSample{cost: 1}
		if rng.Float64() < p.WeightedHeavyShare {
			s.cost = p.WeightedHeavy
		}
		if !at.Before(from) {
			window = append(window, s)
		}
		time.Sleep(time.Until(at))
		req := httptest.NewRequestWithContext(context.WithValue(context.Background(), sampleKey{}, s), http.MethodGet, "/", nil)
		wg.Go(func() {
			w := httptest.NewRecorder()
			s.arrive = time.Now()
			h.ServeHTTP(w, req)
			s.status = w.Code
		})
	}
	wg.Wait()
	if err := q.Close(); err != nil {
		return window, top.Load(), err
	}
	if n := running.Load(); n != 0 {
		return window, top.Load(), fmt.Errorf("%d slots still counted running after every request ended", n)
	}
	return window, top.Load(), nil
}

// WeightedSlotCapacity is what the slots serve, in slot-requests (a request
// of cost k counts k) per second.
func (p Plan) WeightedSlotCapacity() int {
	return p.WeightedLimits.MaxConcurrent * int(time.Second/p.WeightedWork)
}

// weighted runs section 13 once: its columns are the light requests, the
// heavy ones, and all.
func (r *runner) weighted() {
	t, heavy := &r.res.Weighted, fmt.Sprintf("cost %d", r.WeightedHeavy)
	t.Cols = []string{"cost 1", heavy, "all"}
	samples, most, err := r.weightedRun()
	if err != nil {
		r.fail(GinQueue, "13. weighted requests", err)
		return
	}
	rows := []Row{
		{Metric: "13. offered load", Unit: "share of slot capacity, cost-weighted", Format: FormatShare, Given: true},
		{Metric: "13. served", Unit: "requests", Format: FormatCount, Higher: true},
		{Metric: "13. queue wait p50", Unit: "arrival to handler start", Format: FormatDuration},
		{Metric: "13. queue wait p99", Unit: "arrival to handler start", Format: FormatDuration},
		{Metric: "13. slots busy, mean", Unit: "share of slots", Format: FormatShare, Given: true},
		{Metric: "13. most slots running at once", Unit: fmt.Sprintf("slots, of %d", r.WeightedLimits.MaxConcurrent), Format: FormatCount,
			Values: map[string]float64{"all": float64(most)}, Note: "over the warm-up and the window, counted by the handlers inside the slots they were granted"},
	}
	capacity := float64(r.WeightedLimits.MaxConcurrent) * r.WeightedWindow.Seconds() // slot-seconds in the window
	failed := 0
	for i, col := range t.Cols {
		var waits []float64
		var work, held float64
		for _, s := range samples {
			if (i == 0 && s.cost != 1) || (i == 1 && s.cost == 1) {
				continue
			}
			if work += float64(s.cost) * r.WeightedWork.Seconds(); s.status != http.StatusOK {
				failed += i / 2 // counted in the column of all
				continue
			}
			waits = append(waits, float64(s.start.Sub(s.arrive)))
			held += float64(s.cost) * s.end.Sub(s.start).Seconds()
		}
		for j, x := range []float64{work / capacity, float64(len(waits)), pct(0, 0.5)([][]float64{waits}), pct(0, 0.99)([][]float64{waits}), held / capacity} {
			if rows[j].Values == nil {
				rows[j].Values = map[string]float64{}
			}
			if !math.IsNaN(x) {
				rows[j].Values[col] = x
			}
		}
	}
	if failed > 0 {
		r.res.Errors = append(r.res.Errors, fmt.Sprintf("13. served: %d of %d requests were not served", failed, len(samples)))
	}
	r.logf("  %d requests in %v, most slots running %d of %d", len(samples), r.WeightedWindow, most, r.WeightedLimits.MaxConcurrent)
	t.Rows = append(t.Rows, rows...)
}
