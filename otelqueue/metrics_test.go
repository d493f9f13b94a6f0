package otelqueue_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
	"github.com/ginqueue/ginqueue/otelqueue"
)

// bounds are the values of ginqueue.wait.upper_bound, in order.
func bounds() []string {
	var bs []string
	for _, b := range ginqueue.WaitBuckets() {
		bs = append(bs, strconv.FormatFloat(b, 'g', -1, 64))
	}
	return append(bs, "+Inf")
}

// idle is what an idle Queue with limit slots reports.
func idle(limit int) map[string]float64 {
	want := map[string]float64{
		"ginqueue.slot.usage":               0,
		"ginqueue.slot.limit":               float64(limit),
		"ginqueue.request.queued":           0,
		"ginqueue.backend.unavailable":      0,
		"ginqueue.backend.outages":          0,
		"ginqueue.abandoned_requests":       0,
		"ginqueue.wait.oldest":              0,
		"ginqueue.drain_rate":               0,
		"ginqueue.adaptive.no_load_latency": 0,
		"ginqueue.wait.time":                0,
	}
	for _, p := range []string{"50", "90", "99"} {
		want["ginqueue.wait.percentile{ginqueue.percentile="+p+"}"] = 0
	}
	for _, o := range []string{"served", "queue_full", "queue_timeout", "canceled", "closed", "panic"} {
		want["ginqueue.requests{ginqueue.outcome="+o+"}"] = 0
	}
	for _, b := range bounds() {
		want["ginqueue.wait.bucket{ginqueue.wait.upper_bound="+b+"}"] = 0
	}
	return want
}

// Every instrument has the kind and unit the package doc gives it.
func TestInstruments(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	newMetrics(t, reader, map[string]*ginqueue.Queue{"api": newQueue(t, ginqueue.Config{MaxConcurrent: 1})})
	ps := collect(t, reader)
	for _, tc := range []struct{ name, kind, unit string }{
		{"ginqueue.slot.usage", "sum", "{slot}"},
		{"ginqueue.slot.limit", "sum", "{slot}"},
		{"ginqueue.request.queued", "sum", "{request}"},
		{"ginqueue.backend.unavailable", "sum", "{backend}"},
		{"ginqueue.backend.outages", "monotonic sum", "{outage}"},
		{"ginqueue.abandoned_requests", "monotonic sum", "{request}"},
		{"ginqueue.requests{ginqueue.outcome=served}", "monotonic sum", "{request}"},
		{"ginqueue.wait.bucket{ginqueue.wait.upper_bound=+Inf}", "monotonic sum", "{request}"},
		{"ginqueue.wait.time", "monotonic sum", "s"},
		{"ginqueue.wait.oldest", "gauge", "s"},
		{"ginqueue.wait.percentile{ginqueue.percentile=99}", "gauge", "s"},
		{"ginqueue.drain_rate", "gauge", "{request}/s"},
		{"ginqueue.adaptive.no_load_latency", "gauge", "s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := ps[tc.name]
			if !ok {
				t.Fatalf("no series %s", tc.name)
			}
			assert.Equal(t, tc.kind, p.kind)
			assert.Equal(t, tc.unit, p.unit)
		})
	}
}

func TestNewMetricsRefusesNilProvider(t *testing.T) {
	m, err := otelqueue.NewMetrics(nil)
	assert.Nil(t, m)
	assert.EqualError(t, err, "otelqueue: MeterProvider is nil")
}

// refusingProvider is a MeterProvider whose Meter refuses callbacks.
type refusingProvider struct{ noop.MeterProvider }

func (refusingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return refusingMeter{} }

type refusingMeter struct{ noop.Meter }

func (refusingMeter) RegisterCallback(metric.Callback, ...metric.Observable) (metric.Registration, error) {
	return nil, errors.New("no callbacks here")
}

// noInstrumentsProvider is a MeterProvider whose Meter refuses every
// instrument.
type noInstrumentsProvider struct{ noop.MeterProvider }

func (noInstrumentsProvider) Meter(string, ...metric.MeterOption) metric.Meter {
	return noInstrumentsMeter{}
}

type noInstrumentsMeter struct{ noop.Meter }

var errNoInstruments = errors.New("no instruments here")

func (noInstrumentsMeter) Int64ObservableUpDownCounter(string, ...metric.Int64ObservableUpDownCounterOption) (metric.Int64ObservableUpDownCounter, error) {
	return nil, errNoInstruments
}

func (noInstrumentsMeter) Int64ObservableCounter(string, ...metric.Int64ObservableCounterOption) (metric.Int64ObservableCounter, error) {
	return nil, errNoInstruments
}

func (noInstrumentsMeter) Float64ObservableGauge(string, ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	return nil, errNoInstruments
}

func (noInstrumentsMeter) Float64ObservableCounter(string, ...metric.Float64ObservableCounterOption) (metric.Float64ObservableCounter, error) {
	return nil, errNoInstruments
}

// A provider's error is passed on, with what was being done.
func TestNewMetricsPassesProviderErrors(t *testing.T) {
	m, err := otelqueue.NewMetrics(refusingProvider{})
	assert.Nil(t, m)
	assert.EqualError(t, err, "otelqueue: registering the callback: no callbacks here")

	m, err = otelqueue.NewMetrics(noInstrumentsProvider{})
	assert.Nil(t, m)
	require.ErrorIs(t, err, errNoInstruments)
	assert.True(t, strings.HasPrefix(err.Error(), "otelqueue: creating the instruments: no instruments here"), err.Error())
}

func TestAddRefuses(t *testing.T) {
	q := newQueue(t, ginqueue.Config{MaxConcurrent: 1})
	reader := sdkmetric.NewManualReader()
	m := newMetrics(t, reader, map[string]*ginqueue.Queue{"api": q})
	for _, tc := range []struct {
		name, queue, want string
		q                 *ginqueue.Queue
	}{
		{"empty name", "", `otelqueue: queue name must not be empty`, q},
		{"duplicate name", "api", `otelqueue: queue "api" is already added`, q},
		{"nil queue", "web", `otelqueue: queue "web" is nil`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.EqualError(t, m.Add(tc.queue, tc.q), tc.want)
		})
	}
	assert.Len(t, collect(t, reader).named("ginqueue.slot.limit"), 1, "after refused adds")

	require.NoError(t, m.Unregister())
	assert.EqualError(t, m.Add("web", q), `otelqueue: queue "web" not added: Unregister was called`)
}

// Idle Queues report every series, at zero, with their limits; Remove
// drops a Queue's series.
func TestIdleQueues(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	m := newMetrics(t, reader, map[string]*ginqueue.Queue{
		"api": newQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 10}),
		"web": newQueue(t, ginqueue.Config{MaxConcurrent: 2}),
	})
	ps := collect(t, reader)
	api := map[string]float64{}
	for s, v := range ps.values() {
		if !strings.Contains(s, "ginqueue.queue=web") {
			api[s] = v
		}
	}
	assert.Equal(t, idle(4), api)
	assert.Equal(t, 2.0, ps["ginqueue.slot.limit{ginqueue.queue=web}"].value)
	// Per queue: 10 single series, 3 percentiles, 6 outcomes and 27 buckets.
	assert.Len(t, ps, 2*46)

	assert.True(t, m.Remove("web"))
	assert.False(t, m.Remove("web"), "Remove(web) again")
	assert.Equal(t, idle(4), collect(t, reader).values(), "after Remove(web)")
}

// A Queue driven through every outcome is reported as it is: the current
// values while requests wait, then one counter per outcome and the
// distribution of waits.
func TestEveryOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: time.Second, Priority: byHeader})
		release := make(chan struct{}) // each send lets the running handler finish
		r := gin.New()
		r.Use(q.Handler())
		r.GET("/", func(c *gin.Context) { <-release; c.Status(http.StatusOK) })
		reader := sdkmetric.NewManualReader()
		newMetrics(t, reader, map[string]*ginqueue.Queue{"api": q})

		a := send(r, priority(0)) // runs at once
		b := send(r, priority(1)) // waits, ahead of c
		cc := send(r, priority(0))
		time.Sleep(250 * time.Millisecond)
		full := send(r, priority(0)) // no room, and no lower priority to evict
		expectCode(t, "full", full, http.StatusServiceUnavailable)

		assert.Equal(t, map[string]float64{
			"ginqueue.slot.usage":     1,
			"ginqueue.request.queued": 2,
			"ginqueue.request.queued_by_priority{ginqueue.priority=0}": 1,
			"ginqueue.request.queued_by_priority{ginqueue.priority=1}": 1,
			"ginqueue.wait.oldest": 0.25,
		}, collect(t, reader).named("ginqueue.slot.usage", "ginqueue.request.queued",
			"ginqueue.request.queued_by_priority", "ginqueue.wait.oldest"), "while two wait")

		release <- struct{}{} // a finishes at 250ms; b (priority 1) runs
		synctest.Wait()
		expectCode(t, "a", a, http.StatusOK)
		time.Sleep(time.Second) // c times out at 1s
		synctest.Wait()
		expectCode(t, "c", cc, http.StatusRequestTimeout)

		gone := send(r, priority(0))
		gone.cancel()
		synctest.Wait()
		expectCode(t, "canceled", gone, ginqueue.StatusClientClosedRequest)

		late := send(r, priority(0))
		require.NoError(t, q.Close())
		synctest.Wait()
		expectCode(t, "closed", late, http.StatusServiceUnavailable)
		release <- struct{}{}
		synctest.Wait()
		expectCode(t, "b", b, http.StatusOK)

		ps := collect(t, reader)
		st := q.Stats()
		want := map[string]float64{
			"ginqueue.slot.usage":     0,
			"ginqueue.request.queued": 0,
			// Both priorities have had a waiter: both still read, at 0.
			"ginqueue.request.queued_by_priority{ginqueue.priority=0}": 0,
			"ginqueue.request.queued_by_priority{ginqueue.priority=1}": 0,
			"ginqueue.wait.oldest":                              0,
			"ginqueue.requests{ginqueue.outcome=served}":        2,
			"ginqueue.requests{ginqueue.outcome=queue_full}":    1,
			"ginqueue.requests{ginqueue.outcome=queue_timeout}": 1,
			"ginqueue.requests{ginqueue.outcome=canceled}":      1,
			"ginqueue.requests{ginqueue.outcome=closed}":        1,
			"ginqueue.requests{ginqueue.outcome=panic}":         0,
			"ginqueue.wait.time":                                0.25,
			// The Queue's own measurements, passed on unchanged.
			"ginqueue.wait.percentile{ginqueue.percentile=50}": st.WaitP50.Seconds(),
			"ginqueue.wait.percentile{ginqueue.percentile=90}": st.WaitP90.Seconds(),
			"ginqueue.wait.percentile{ginqueue.percentile=99}": st.WaitP99.Seconds(),
			"ginqueue.drain_rate":                              st.DrainRate,
		}
		// a ran at once (0 s), b waited 250 ms.
		for _, b := range bounds() {
			n := 1.0
			if f, _ := strconv.ParseFloat(b, 64); f >= 0.25 {
				n = 2
			}
			want["ginqueue.wait.bucket{ginqueue.wait.upper_bound="+b+"}"] = n
		}
		assert.Equal(t, want, ps.named("ginqueue.slot.usage", "ginqueue.request.queued", "ginqueue.request.queued_by_priority",
			"ginqueue.wait.oldest", "ginqueue.requests", "ginqueue.wait.time", "ginqueue.wait.percentile",
			"ginqueue.drain_rate", "ginqueue.wait.bucket"))
		assert.Positive(t, st.DrainRate)
		assert.Positive(t, st.WaitP99)
	})
}

// collectErr is collect for a goroutine: it returns the error.
func collectErr(reader sdkmetric.Reader) (points, error) {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		return nil, err
	}
	return flatten(rm), nil
}

// checkCollection collects reader between two looks at q, and returns what
// does not hold: counters between the looks and never below prev's (the
// previous collection of the same reader), the split by priority adding up,
// the buckets cumulative up to +Inf.
func checkCollection(q *ginqueue.Queue, reader sdkmetric.Reader, prev points, limit, maxQueue int) (points, []string) {
	before, hb := q.Stats(), q.WaitHistogram()
	ps, err := collectErr(reader)
	after, ha := q.Stats(), q.WaitHistogram()
	if err != nil {
		return nil, []string{err.Error()}
	}
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	between := func(series string, lo, hi float64) {
		p, ok := ps[series]
		if !ok {
			fail("no series %s", series)
		} else if p.value < lo || p.value > hi {
			fail("%s = %v, want between %v and %v (Stats before and after)", series, p.value, lo, hi)
		}
	}
	for o, n := range map[string][2]uint64{
		"served":        {before.Served, after.Served},
		"queue_full":    {before.QueueFull, after.QueueFull},
		"queue_timeout": {before.QueueTimeout, after.QueueTimeout},
		"canceled":      {before.Canceled, after.Canceled},
		"closed":        {before.Closed, after.Closed},
	} {
		between("ginqueue.requests{ginqueue.outcome="+o+"}", float64(n[0]), float64(n[1]))
	}
	between("ginqueue.abandoned_requests", float64(before.Abandoned), float64(after.Abandoned))
	between("ginqueue.backend.outages", 0, 0)
	between("ginqueue.slot.limit", float64(limit), float64(limit))
	between("ginqueue.slot.usage", 0, float64(limit))
	between("ginqueue.request.queued", 0, float64(maxQueue))
	between("ginqueue.wait.time", hb.Sum, ha.Sum)
	var split float64
	for _, v := range ps.named("ginqueue.request.queued_by_priority") {
		split += v
	}
	if queued := ps["ginqueue.request.queued"].value; split != queued {
		fail("queued by priority adds up to %v, queued is %v", split, queued)
	}
	last := 0.0
	for i, b := range bounds() {
		series := "ginqueue.wait.bucket{ginqueue.wait.upper_bound=" + b + "}"
		if i < len(hb.Counts) {
			between(series, float64(hb.Counts[i]), float64(ha.Counts[i]))
		} else {
			between(series, float64(hb.Count), float64(ha.Count))
		}
		if v := ps[series].value; v < last {
			fail("bucket %s = %v, below the one before it (%v): not cumulative", b, v, last)
		} else {
			last = v
		}
	}
	for s, p := range prev {
		if p.kind == "monotonic sum" && ps[s].value < p.value {
			fail("counter %s went down from %v to %v", s, p.value, ps[s].value)
		}
	}
	return ps, problems
}

// A burst of real requests over loopback, collected again and again by two
// readers at once: every collection agrees with Stats around it, and no
// counter ever goes down. Once the burst is over, a collection is Stats.
func TestCollectionsDuringBurst(t *testing.T) {
	const limit, maxQueue = 2, 4
	q := newQueue(t, ginqueue.Config{MaxConcurrent: limit, MaxQueue: maxQueue, QueueTimeout: 20 * time.Millisecond, Priority: byHeader})
	r := gin.New()
	r.Use(q.Handler())
	r.GET("/", func(c *gin.Context) { time.Sleep(5 * time.Millisecond); c.Status(http.StatusOK) })
	srv := httptest.NewServer(r)
	defer srv.Close()
	transport := &http.Transport{MaxIdleConnsPerHost: 12}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: 5 * time.Second}

	readers := []*sdkmetric.ManualReader{sdkmetric.NewManualReader(), sdkmetric.NewManualReader()}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[0]), sdkmetric.WithReader(readers[1]))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	m, err := otelqueue.NewMetrics(provider)
	require.NoError(t, err)
	defer func() { _ = m.Unregister() }()
	require.NoError(t, m.Add("api", q))

	stop := make(chan struct{})
	type report struct {
		collections int
		problems    []string
		priorities  map[string]bool // the priority series seen during the burst
	}
	reports := make(chan report, len(readers))
	for _, reader := range readers {
		go func() {
			rep := report{priorities: map[string]bool{}}
			var prev points
			for {
				select {
				case <-stop:
					reports <- rep
					return
				default:
				}
				ps, problems := checkCollection(q, reader, prev, limit, maxQueue)
				rep.collections++
				rep.problems = append(rep.problems, problems...)
				if ps != nil {
					prev = ps
					for name := range ps.named("ginqueue.request.queued_by_priority") {
						rep.priorities[name] = true
					}
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}

	// 12 clients for 2 slots and 4 places: the queue overflows.
	statuses := make(chan map[int]int, 12)
	for i := range cap(statuses) {
		go func() {
			seen := map[int]int{}
			for range 30 {
				req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
				req.Header.Set("X-Priority", strconv.Itoa(i%3))
				resp, err := client.Do(req)
				if err != nil {
					seen[0]++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				seen[resp.StatusCode]++
			}
			statuses <- seen
		}()
	}
	total := map[int]int{}
	for range cap(statuses) {
		for code, n := range <-statuses {
			total[code] += n
		}
	}
	close(stop)
	seen := map[string]bool{}
	for range readers {
		rep := <-reports
		assert.Positive(t, rep.collections)
		for _, p := range rep.problems {
			t.Error(p)
		}
		for name := range rep.priorities {
			seen[name] = true
		}
	}
	t.Logf("statuses %v", total)
	assert.Zero(t, total[0], "requests that failed")
	assert.Positive(t, total[http.StatusOK])
	assert.Positive(t, total[http.StatusServiceUnavailable]+total[http.StatusRequestTimeout], "the burst should overflow the queue")

	// Quiet now: a collection is the Queue's Stats and WaitHistogram.
	ps := collect(t, readers[0])
	st, h := q.Stats(), q.WaitHistogram()
	assert.EqualValues(t, st.Served, ps["ginqueue.requests{ginqueue.outcome=served}"].value)
	assert.EqualValues(t, st.QueueFull, ps["ginqueue.requests{ginqueue.outcome=queue_full}"].value)
	assert.EqualValues(t, st.QueueTimeout, ps["ginqueue.requests{ginqueue.outcome=queue_timeout}"].value)
	assert.EqualValues(t, total[http.StatusOK], st.Served)
	assert.EqualValues(t, h.Count, ps["ginqueue.wait.bucket{ginqueue.wait.upper_bound=+Inf}"].value)
	assert.EqualValues(t, st.Served, h.Count)
	assert.Equal(t, h.Sum, ps["ginqueue.wait.time"].value)
	assert.Zero(t, ps["ginqueue.slot.usage"].value)
	assert.Zero(t, ps["ginqueue.request.queued"].value)
	// A priority is reported from the first collection that sees it
	// waiting, then at 0 when it has none: every series seen during the
	// burst is still there, and nothing else.
	require.NotEmpty(t, seen, "no collection saw a waiter")
	quiet := map[string]bool{}
	for name, p := range ps.named("ginqueue.request.queued_by_priority") {
		quiet[name] = true
		assert.Zero(t, p, name)
	}
	assert.Equal(t, seen, quiet)
}

// blockingBackend is an in-memory Backend whose Stats, once armed, blocks
// until released: a collection stuck in the middle.
type blockingBackend struct {
	backend.Backend
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newBlockingBackend() *blockingBackend {
	return &blockingBackend{Backend: inmem.New(), entered: make(chan struct{}), release: make(chan struct{})}
}

func (b *blockingBackend) Stats() backend.Stats {
	if b.armed.CompareAndSwap(true, false) {
		close(b.entered)
		<-b.release
	}
	return b.Backend.Stats()
}

// Add and Remove do not wait for a collection in progress, Unregister
// during one lets it finish, and after it nothing is reported.
func TestChangesDuringCollection(t *testing.T) {
	b := newBlockingBackend()
	reader := sdkmetric.NewManualReader()
	m := newMetrics(t, reader, map[string]*ginqueue.Queue{"api": newQueue(t, ginqueue.Config{MaxConcurrent: 3, Backend: b})})
	b.armed.Store(true)
	collected := make(chan points, 1)
	go func() {
		ps, err := collectErr(reader)
		if err != nil {
			ps = points{"error: " + err.Error(): {}}
		}
		collected <- ps
	}()
	<-b.entered // the callback is inside the Queue's Stats

	changed := make(chan struct{})
	go func() {
		_ = m.Add("web", newQueue(t, ginqueue.Config{MaxConcurrent: 1}))
		m.Remove("web")
		close(changed)
	}()
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("Add and Remove waited for the collection")
	}
	unregistered := make(chan error, 1)
	go func() { unregistered <- m.Unregister() }()
	close(b.release)

	ps := <-collected
	assert.Equal(t, 3.0, ps["ginqueue.slot.limit"].value, "the collection Unregister interrupted: %v", ps)
	require.NoError(t, <-unregistered)
	assert.Empty(t, collect(t, reader), "after Unregister")
	assert.NoError(t, m.Unregister(), "a second Unregister")
	assert.Empty(t, collect(t, reader), "after a second Unregister")
}

// Collections, Add, Remove and Unregister all at once (run with -race):
// every collection reports whole Queues, and nothing after Unregister.
func TestConcurrentCollections(t *testing.T) {
	q := newQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1})
	readers := []*sdkmetric.ManualReader{sdkmetric.NewManualReader(), sdkmetric.NewManualReader()}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[0]), sdkmetric.WithReader(readers[1]))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	m, err := otelqueue.NewMetrics(provider)
	require.NoError(t, err)

	perQueue := seriesOfOneQueue(t, q)
	var wg sync.WaitGroup
	errs := make(chan string, 4*len(readers))
	stop := make(chan struct{})
	for _, reader := range readers {
		for range 2 { // two goroutines on each reader: overlapping collections of one pipeline too
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					ps, err := collectErr(reader)
					if err != nil {
						errs <- err.Error()
						return
					}
					// whole Queues, none half reported
					if n := len(ps); n%perQueue != 0 {
						errs <- fmt.Sprintf("%d series, not a multiple of %d", n, perQueue)
						return
					}
				}
			})
		}
	}
	for i := range 200 {
		name := "q" + strconv.Itoa(i%3)
		if err := m.Add(name, q); err != nil {
			m.Remove(name)
		}
		if i == 150 {
			require.NoError(t, m.Unregister())
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for _, reader := range readers {
		assert.Empty(t, collect(t, reader), "after Unregister")
	}
}

// seriesOfOneQueue is how many series q alone reports.
func seriesOfOneQueue(t *testing.T, q *ginqueue.Queue) int {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	m, err := otelqueue.NewMetrics(provider)
	require.NoError(t, err)
	require.NoError(t, m.Add("one", q))
	n := len(collect(t, reader))
	require.Positive(t, n)
	return n
}

// On a no-op MeterProvider everything works and nothing is reported.
func TestNoopProvider(t *testing.T) {
	m, err := otelqueue.NewMetrics(noop.NewMeterProvider())
	require.NoError(t, err)
	q := newQueue(t, ginqueue.Config{MaxConcurrent: 1})
	require.NoError(t, m.Add("api", q))
	assert.EqualError(t, m.Add("api", q), `otelqueue: queue "api" is already added`)
	assert.True(t, m.Remove("api"))
	assert.NoError(t, m.Unregister())
	assert.NoError(t, m.Unregister())
}

// storeBackend is an in-memory Backend that reports the state of a store
// shared with other replicas, as redisqueue reports Redis.
type storeBackend struct {
	backend.Backend
	unavailable atomic.Bool
	outages     atomic.Uint64
}

func (b *storeBackend) Stats() backend.Stats {
	st := b.Backend.Stats()
	st.Unavailable, st.Outages = b.unavailable.Load(), b.outages.Load()
	return st
}

// While the store goes down and comes back, ginqueue.backend.unavailable
// follows it and ginqueue.backend.outages counts the outages, never going
// down.
func TestBackendOutages(t *testing.T) {
	b := &storeBackend{Backend: inmem.New()}
	reader := sdkmetric.NewManualReader()
	newMetrics(t, reader, map[string]*ginqueue.Queue{"api": newQueue(t, ginqueue.Config{MaxConcurrent: 1, Backend: b})})
	for i, down := range []bool{false, true, true, false, true, false, false, true} {
		if down && !b.unavailable.Load() {
			b.outages.Add(1)
		}
		b.unavailable.Store(down)
		want := map[string]float64{
			"ginqueue.backend.unavailable": map[bool]float64{false: 0, true: 1}[down],
			"ginqueue.backend.outages":     float64(b.outages.Load()),
		}
		assert.Equal(t, want, collect(t, reader).named("ginqueue.backend.unavailable", "ginqueue.backend.outages"), "collection %d", i)
	}
	assert.EqualValues(t, 3, b.outages.Load())
}

// Counters are reported up to math.MaxInt64, the most an Int64 counter
// holds; below it, as they are.
func TestCountBound(t *testing.T) {
	b := &storeBackend{Backend: inmem.New()}
	reader := sdkmetric.NewManualReader()
	newMetrics(t, reader, map[string]*ginqueue.Queue{"api": newQueue(t, ginqueue.Config{MaxConcurrent: 1, Backend: b})})
	for _, tc := range []struct {
		outages uint64
		want    float64
	}{{7, 7}, {math.MaxInt64, math.MaxInt64}, {math.MaxUint64, math.MaxInt64}} {
		b.outages.Store(tc.outages)
		assert.Equal(t, tc.want, collect(t, reader)["ginqueue.backend.outages"].value, "outages %d", tc.outages)
	}
}

// stubbornProvider is an SDK MeterProvider whose registrations refuse to be
// unregistered.
type stubbornProvider struct{ metric.MeterProvider }

func (p stubbornProvider) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return stubbornMeter{p.MeterProvider.Meter(name, opts...)}
}

type stubbornMeter struct{ metric.Meter }

func (m stubbornMeter) RegisterCallback(f metric.Callback, insts ...metric.Observable) (metric.Registration, error) {
	reg, err := m.Meter.RegisterCallback(f, insts...)
	return stubbornRegistration{reg}, err
}

type stubbornRegistration struct{ metric.Registration }

func (stubbornRegistration) Unregister() error { return errors.New("not today") }

// When the provider fails to unregister the callback, Unregister says so,
// and the callback reports nothing all the same.
func TestUnregisterFails(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	m, err := otelqueue.NewMetrics(stubbornProvider{provider})
	require.NoError(t, err)
	require.NoError(t, m.Add("api", newQueue(t, ginqueue.Config{MaxConcurrent: 1})))
	assert.NotEmpty(t, collect(t, reader))
	assert.EqualError(t, m.Unregister(), "otelqueue: unregistering the callback: not today")
	assert.Empty(t, collect(t, reader), "after a failed Unregister")
	assert.NoError(t, m.Unregister(), "a second Unregister")
}

// Every Queue keeps its 27 bucket series once the provider's cardinality
// limit allows for them, as docs/observability.md says to set it for more
// than 74 Queues.
func TestManyQueuesKeepTheirBucketsUnderARaisedCardinalityLimit(t *testing.T) {
	const queues = 80
	reader := sdkmetric.NewManualReader()
	// 80 Queues are 2160 bucket series, past the SDK's default of 2000 per
	// instrument: the limit the docs say to raise.
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithCardinalityLimit(10000))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	m, err := otelqueue.NewMetrics(provider)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Unregister() }()
	for i := range queues {
		q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = q.Close() }()
		if err := m.Add("q"+strconv.Itoa(i), q); err != nil {
			t.Fatal(err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != "ginqueue.wait.bucket" {
				continue
			}
			sum := mt.Data.(metricdata.Sum[int64])
			perQueue := map[string]int{}
			overflow := 0
			for _, dp := range sum.DataPoints {
				if v, ok := dp.Attributes.Value("otel.metric.overflow"); ok && v.AsBool() {
					overflow++
					continue
				}
				name, _ := dp.Attributes.Value(otelqueue.QueueKey)
				perQueue[name.AsString()]++
			}
			want := len(ginqueue.WaitBuckets()) + 1
			missing := 0
			for i := range queues {
				if perQueue["q"+strconv.Itoa(i)] != want {
					missing++
				}
			}
			if missing > 0 || overflow > 0 {
				t.Errorf("ginqueue.wait.bucket: %d data points, %d of %d Queues without their %d buckets, %d overflow series",
					len(sum.DataPoints), missing, queues, want, overflow)
			}
			return
		}
	}
	t.Fatal("no ginqueue.wait.bucket")
}
