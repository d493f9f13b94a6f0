package suite

import (
	"context"
	"fmt"
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

// Section 13 serves a mix of light and heavy requests through ginqueue with
// Config.Cost, in process: WeightedSlots slots, handlers that sleep
// WeightedWork, and open-loop arrivals (Poisson, from a fixed seed) of which
// a share WeightedHeavyShare cost WeightedHeavy slots and the rest cost 1,
// offered at WeightedLoad of the slots' capacity counted in slots. It
// checks that the slots the handlers hold never add up to more than the
// limit, and compares the queue waits of the two classes: a heavy request
// waits for its slots to free at the head of the line, and the light ones
// behind it wait with it.
const (
	WeightedSlots = 8
	WeightedWork  = 10 * time.Millisecond
	// WeightedHeavy is the cost of a heavy request; a light one costs 1.
	WeightedHeavy = 4
	// WeightedHeavyShare is the share of the requests that are heavy.
	WeightedHeavyShare = 0.25
	// WeightedLoad is the offered load, as a share of
	// WeightedSlotCapacity: each request counts its cost.
	WeightedLoad = 0.8
	// WeightedSlotCapacity is what the slots can serve, in slot-requests
	// (a request of cost k counts k) per second.
	WeightedSlotCapacity = WeightedSlots * int(time.Second/WeightedWork)
	// weightedSeed fixes the arrivals and their costs, so that every run
	// offers the same sequence.
	weightedSeed = 13
)

// WeightedLimits are the throttle settings of section 13: a queue and a
// timeout that a load below capacity never reaches.
var WeightedLimits = Limits{MaxConcurrent: WeightedSlots, MaxQueue: 10_000, QueueTimeout: 10 * time.Second}

// The columns of section 13: the light requests, the heavy ones, and all.
const (
	WeightedLightCol = "cost 1"
	WeightedHeavyCol = "cost 4"
	WeightedAllCol   = "all"
)

// WeightedColumns are the columns of section 13, in order.
var WeightedColumns = []string{WeightedLightCol, WeightedHeavyCol, WeightedAllCol}

// What the rows of section 13 measure.
const (
	MWeightedOffered    = "13. offered load"
	MWeightedServed     = "13. served"
	MWeightedWaitP50    = "13. queue wait p50"
	MWeightedWaitP99    = "13. queue wait p99"
	MWeightedBusy       = "13. slots busy, mean"
	MWeightedMaxRunning = "13. most slots running at once"
)

// WeightedReport is section 13: weighted requests.
type WeightedReport struct {
	Rows []Row
}

// weightedSample is one request of section 13. The goroutine that serves it
// writes arrive and status; the handler, on that same goroutine, writes
// start and end.
type weightedSample struct {
	heavy      bool
	arrive     time.Time // just before the engine's ServeHTTP
	start, end time.Time // the handler's first line and its last
	status     int
}

func (s *weightedSample) cost() int {
	if s.heavy {
		return WeightedHeavy
	}
	return 1
}

// weightedSampleKey carries a request's *weightedSample in its context.
type weightedSampleKey struct{}

// weightedCounts is what one run of section 13 saw.
type weightedCounts struct {
	window     time.Duration
	samples    []*weightedSample // those that arrived in the window
	maxRunning int64             // the most slots held by handlers at any instant of the run
}

// weightedRun offers the mix for warmUp, then for window, and returns the
// requests that arrived in the window once every request has ended. The
// handler adds its request's cost to a count of running slots on its first
// line and takes it off on its last, inside the slots the Queue granted, so
// the count never exceeds the slots truly held; the most it reached is
// maxRunning.
func weightedRun(warmUp, window time.Duration) (weightedCounts, error) {
	runtime.GC() // the previous section's garbage is collected on its own time
	var running, most atomic.Int64
	handler := func(c *gin.Context) {
		s, _ := c.Request.Context().Value(weightedSampleKey{}).(*weightedSample)
		if s == nil {
			c.Status(http.StatusInternalServerError)
			return
		}
		s.start = time.Now()
		k := int64(s.cost())
		n := running.Add(k)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(WeightedWork)
		running.Add(-k)
		s.end = time.Now()
		c.String(http.StatusOK, "ok")
	}
	q, err := ginqueue.NewQueue(ginqueue.Config{
		MaxConcurrent: WeightedLimits.MaxConcurrent, MaxQueue: WeightedLimits.MaxQueue, QueueTimeout: WeightedLimits.QueueTimeout,
		Cost: func(c *gin.Context) int {
			if c.Request.URL.Path == "/heavy" {
				return WeightedHeavy
			}
			return 1
		},
	})
	if err != nil {
		return weightedCounts{}, err
	}
	r := engine(q.Handler())
	r.GET("/light", handler)
	r.GET("/heavy", handler)

	meanCost := 1 + WeightedHeavyShare*(WeightedHeavy-1)
	rate := WeightedLoad * float64(WeightedSlotCapacity) / meanCost // requests per second
	rng := rand.New(rand.NewPCG(weightedSeed, weightedSeed))
	got := weightedCounts{window: window}
	var wg sync.WaitGroup
	start := time.Now()
	from, to := start.Add(warmUp), start.Add(warmUp+window)
	for at := start; ; {
		at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if !at.Before(to) {
			break
		}
		s := &weightedSample{heavy: rng.Float64() < WeightedHeavyShare}
		if !at.Before(from) {
			got.samples = append(got.samples, s)
		}
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		path := "/light"
		if s.heavy {
			path = "/heavy"
		}
		req := httptest.NewRequestWithContext(context.WithValue(context.Background(), weightedSampleKey{}, s), http.MethodGet, path, nil)
		wg.Go(func() {
			w := httptest.NewRecorder()
			s.arrive = time.Now()
			r.ServeHTTP(w, req)
			s.status = w.Code
		})
	}
	wg.Wait()
	got.maxRunning = most.Load()
	if err := q.Close(); err != nil {
		return got, err
	}
	if n := running.Load(); n != 0 {
		return got, fmt.Errorf("%d slots still counted running after every request ended", n)
	}
	return got, nil
}

// weighted runs section 13 once and adds its rows.
func (r *runner) weighted() {
	r.logf("13. weighted requests")
	v := Variant{Name: GinQueue}
	c, err := weightedRun(r.plan.WeightedWarmUp, r.plan.WeightedWindow)
	if err != nil {
		r.fail(v, MWeightedMaxRunning, err)
		return
	}
	offered := newRow(MWeightedOffered, "share of slot capacity, cost-weighted", false, FormatShare)
	served := newRow(MWeightedServed, "requests", true, FormatCount)
	p50 := newRow(MWeightedWaitP50, "arrival to handler start", false, FormatDuration)
	p99 := newRow(MWeightedWaitP99, "arrival to handler start", false, FormatDuration)
	busy := newRow(MWeightedBusy, "share of slots", false, FormatShare)
	most := newRow(MWeightedMaxRunning, fmt.Sprintf("slots, of %d", WeightedSlots), false, FormatCount)
	offered.Given, busy.Given = true, true
	capacity := float64(WeightedSlots) * c.window.Seconds() // slot-seconds in the window
	failed := 0
	for _, col := range WeightedColumns {
		var waits []time.Duration
		var slotWork, busyTime float64
		n := 0
		for _, s := range c.samples {
			if (col == WeightedLightCol && s.heavy) || (col == WeightedHeavyCol && !s.heavy) {
				continue
			}
			slotWork += float64(s.cost()) * WeightedWork.Seconds()
			if s.status != http.StatusOK {
				if col == WeightedAllCol {
					failed++
				}
				continue
			}
			n++
			waits = append(waits, s.start.Sub(s.arrive))
			busyTime += float64(s.cost()) * s.end.Sub(s.start).Seconds()
		}
		offered.Values[col] = slotWork / capacity
		served.Values[col] = float64(n)
		busy.Values[col] = busyTime / capacity
		if len(waits) > 0 {
			p50.Values[col] = float64(quantile(waits, 0.5))
			p99.Values[col] = float64(quantile(waits, 0.99))
		}
	}
	most.Values[WeightedAllCol] = float64(c.maxRunning)
	most.Note = "over the warm-up and the window, counted by the handlers inside the slots they were granted"
	if failed > 0 {
		r.res.Errors = append(r.res.Errors, fmt.Sprintf("%s: %d of %d requests were not served", MWeightedServed, failed, len(c.samples)))
	}
	r.logf("  %d requests in %v, most slots running %d of %d", len(c.samples), c.window, c.maxRunning, WeightedSlots)
	r.res.Weighted.Rows = append(r.res.Weighted.Rows, offered, served, p50, p99, busy, most)
}
