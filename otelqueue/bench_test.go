package otelqueue_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/otelqueue"
)

// discardWriter is an http.ResponseWriter that allocates nothing, so the
// benchmarks measure the route, not a recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

// BenchmarkSpanEvents is one request through gin and a Queue with a free
// slot, with and without SpanEvents, behind a tracing middleware whose
// spans record (sampled, not exported) or without one: the difference
// between "span" and "span+events" is what the event and the attributes
// cost.
func BenchmarkSpanEvents(b *testing.B) {
	tp := sdktrace.NewTracerProvider() // samples every span, exports none
	for _, bc := range []struct {
		name         string
		span, events bool
	}{
		{"no span", false, false},
		{"no span+events", false, true},
		{"span", true, false},
		{"span+events", true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			gin.SetMode(gin.ReleaseMode)
			defer gin.SetMode(gin.TestMode)
			cfg := ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4}
			if bc.events {
				cfg.OnDecision = otelqueue.SpanEvents("api")
			}
			q := newQueue(b, cfg)
			r := gin.New()
			if bc.span {
				r.Use(tracing(tp, nil))
			}
			r.Use(q.Handler())
			r.GET("/", func(c *gin.Context) { c.Status(http.StatusNoContent) })
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				r.ServeHTTP(w, req)
			}
		})
	}
}

// BenchmarkCollect is one collection of a ManualReader whose provider
// holds a Metrics with 1 and with 50 Queues.
func BenchmarkCollect(b *testing.B) {
	for _, n := range []int{1, 50} {
		b.Run(strconv.Itoa(n)+" queues", func(b *testing.B) {
			reader := sdkmetric.NewManualReader()
			provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			b.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
			m, err := otelqueue.NewMetrics(provider)
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				q := newQueue(b, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: time.Second})
				if err := m.Add("q"+strconv.Itoa(i), q); err != nil {
					b.Fatal(err)
				}
			}
			var rm metricdata.ResourceMetrics
			b.ReportAllocs()
			for b.Loop() {
				if err := reader.Collect(context.Background(), &rm); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
