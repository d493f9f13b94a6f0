package otelqueue_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/otelqueue"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	goleak.VerifyTestMain(m)
}

// newQueue builds a Queue that is closed when the test ends.
func newQueue(t testing.TB, cfg ginqueue.Config) *ginqueue.Queue {
	t.Helper()
	q, err := ginqueue.NewQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// newMetrics returns Metrics on a new SDK MeterProvider read by reader,
// reporting each queue under its name, unregistered when the test ends.
func newMetrics(t *testing.T, reader sdkmetric.Reader, queues map[string]*ginqueue.Queue) *otelqueue.Metrics {
	t.Helper()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	m, err := otelqueue.NewMetrics(provider)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Unregister() })
	for name, q := range queues {
		if err := m.Add(name, q); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// point is one data point of a collection.
type point struct {
	value float64
	kind  string // "sum", "monotonic sum" or "gauge"
	unit  string
}

// points is a collection flattened: by series, "name{key=value,…}" with the
// attributes sorted by key (ginqueue.queue left out when it is "api", to
// keep the tests short).
type points map[string]point

// collect reads reader once.
func collect(t testing.TB, reader sdkmetric.Reader) points {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return flatten(rm)
}

// flatten turns a collection into points.
func flatten(rm metricdata.ResourceMetrics) points {
	ps := points{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					ps[series(m.Name, dp.Attributes)] = point{float64(dp.Value), sumKind(d.IsMonotonic), m.Unit}
				}
			case metricdata.Sum[float64]:
				for _, dp := range d.DataPoints {
					ps[series(m.Name, dp.Attributes)] = point{dp.Value, sumKind(d.IsMonotonic), m.Unit}
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					ps[series(m.Name, dp.Attributes)] = point{float64(dp.Value), "gauge", m.Unit}
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					ps[series(m.Name, dp.Attributes)] = point{dp.Value, "gauge", m.Unit}
				}
			default:
				ps[m.Name] = point{kind: fmt.Sprintf("unexpected %T", d)}
			}
		}
	}
	return ps
}

func sumKind(monotonic bool) string {
	if monotonic {
		return "monotonic sum"
	}
	return "sum"
}

// series names one data point.
func series(name string, set attribute.Set) string {
	var attrs []string
	for _, kv := range set.ToSlice() {
		if kv.Key == otelqueue.QueueKey && kv.Value.AsString() == "api" {
			continue
		}
		attrs = append(attrs, string(kv.Key)+"="+kv.Value.String())
	}
	if len(attrs) == 0 {
		return name
	}
	return name + "{" + strings.Join(attrs, ",") + "}"
}

// values returns the value of every series, without kinds and units.
func (ps points) values() map[string]float64 {
	vs := make(map[string]float64, len(ps))
	for s, p := range ps {
		vs[s] = p.value
	}
	return vs
}

// named returns the series of ps whose name is one of names, as values.
func (ps points) named(names ...string) map[string]float64 {
	vs := map[string]float64{}
	for s, p := range ps {
		name, _, _ := strings.Cut(s, "{")
		if slices.Contains(names, name) {
			vs[s] = p.value
		}
	}
	return vs
}

// byHeader ranks a request by its X-Priority header.
func byHeader(c *gin.Context) int {
	p, _ := strconv.Atoi(c.GetHeader("X-Priority"))
	return p
}

// request is one request in flight against an engine, in a synctest
// bubble.
type request struct {
	code   chan int
	cancel context.CancelFunc
}

// get returns a GET of / with the headers given as name, value pairs.
func get(header ...string) *http.Request {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// priority returns a GET of / with priority prio.
func priority(prio int) *http.Request { return get("X-Priority", strconv.Itoa(prio)) }

// send serves req in its own goroutine, and waits until it has run, been
// answered or parked in the queue. It must run in a synctest bubble.
func send(r http.Handler, req *http.Request) request {
	ctx, cancel := context.WithCancel(req.Context())
	req = req.WithContext(ctx)
	code := make(chan int, 1)
	go func() {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		code <- w.Code
	}()
	synctest.Wait()
	return request{code: code, cancel: cancel}
}

// expectCode checks the status that req was answered with.
func expectCode(t *testing.T, what string, req request, want int) {
	t.Helper()
	if got := <-req.code; got != want {
		t.Errorf("%s: status %d, want %d", what, got, want)
	}
}
