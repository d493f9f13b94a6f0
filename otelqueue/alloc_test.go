// Allocation counts. Those that use a recording span skip under -race,
// which makes sync.Pool drop items at random.

package otelqueue_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/otelqueue"
)

// decided is the Decision the allocation tests record.
var decided = ginqueue.Decision{Outcome: ginqueue.OutcomeQueueTimeout, Wait: 250 * time.Millisecond, Priority: 2, Queued: 3, Cost: 1}

// testContext returns a gin.Context for a request with ctx.
func testContext(ctx context.Context) *gin.Context {
	c, _ := gin.CreateTestContext(httptest.NewRecorder())
	c.Request = httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	return c
}

// Without a recording span the hook allocates nothing.
func TestHookWithoutRecordingSpanAllocatesNothing(t *testing.T) {
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	notSampled, span := unsampled.Tracer("otelqueue-test").Start(context.Background(), "not sampled")
	defer span.End()
	tp, _ := newTracerProvider(t)
	ended, span := tp.Tracer("otelqueue-test").Start(context.Background(), "ended")
	span.End()
	hook := otelqueue.SpanEvents("api")
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{{"no span", context.Background()}, {"not sampled", notSampled}, {"ended", ended}} {
		t.Run(tc.name, func(t *testing.T) {
			c := testContext(tc.ctx)
			assert.Zero(t, testing.AllocsPerRun(100, func() { hook(c, decided) }))
		})
	}
}

// On a recording span the hook allocates what the span itself does for
// the same event and attributes, and nothing of its own.
func TestHookAllocatesOnlyWhatTheSpanDoes(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts need a build without -race")
	}
	tp := sdktrace.NewTracerProvider() // samples every span, exports none
	tracer := tp.Tracer("otelqueue-test")
	hook := otelqueue.SpanEvents("api")
	c := testContext(context.Background())
	req := c.Request
	queue, outcome, wait := otelqueue.QueueKey.String("api"), otelqueue.OutcomeKey.String("queue_timeout"), otelqueue.WaitKey.Float64(0.25)
	event := []trace.EventOption{trace.WithAttributes(queue, outcome, wait,
		otelqueue.PriorityKey.Int(2), otelqueue.ArrivalQueuedKey.Int(3), otelqueue.CostKey.Int(1))}
	attrs := []attribute.KeyValue{queue, outcome, wait}
	// Each run starts a span, puts it in the request and ends it, as a
	// tracing middleware does, around what is measured.
	allocs := func(record func(trace.Span)) float64 {
		return testing.AllocsPerRun(200, func() {
			ctx, span := tracer.Start(context.Background(), "request")
			c.Request = req.WithContext(ctx)
			record(span)
			span.End()
		})
	}
	direct := allocs(func(span trace.Span) {
		span.AddEvent(otelqueue.RejectedEvent, event...)
		span.SetAttributes(attrs...)
	})
	hooked := allocs(func(trace.Span) { hook(c, decided) })
	assert.Equal(t, direct, hooked, "allocations per request: the span's own calls, then the hook")
	t.Logf("%v allocations per request, span included", hooked)
}
