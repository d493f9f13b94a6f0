package otelqueue_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
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
