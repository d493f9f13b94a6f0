package otelqueue_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/otelqueue"
)

// Report a Queue to a MeterProvider: here the SDK's, read by hand; in a
// server, one with a periodic reader and an exporter.
func ExampleNewMetrics() {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())

	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 8, MaxQueue: 100, QueueTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	defer q.Close()
	m, err := otelqueue.NewMetrics(provider)
	if err != nil {
		panic(err)
	}
	defer m.Unregister()
	if err := m.Add("api", q); err != nil {
		panic(err)
	}

	router := gin.New()
	api := router.Group("/api", q.Handler())
	api.GET("/hello", func(c *gin.Context) { c.String(http.StatusOK, "hello") })
	router.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/api/hello", nil))

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if sum, ok := mt.Data.(metricdata.Sum[int64]); ok && (mt.Name == "ginqueue.slot.limit" || mt.Name == "ginqueue.requests") {
				for _, dp := range sum.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %s %d", mt.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value))
				}
			}
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// ginqueue.requests ginqueue.outcome=canceled,ginqueue.queue=api 0
	// ginqueue.requests ginqueue.outcome=closed,ginqueue.queue=api 0
	// ginqueue.requests ginqueue.outcome=panic,ginqueue.queue=api 0
	// ginqueue.requests ginqueue.outcome=queue_full,ginqueue.queue=api 0
	// ginqueue.requests ginqueue.outcome=queue_timeout,ginqueue.queue=api 0
	// ginqueue.requests ginqueue.outcome=served,ginqueue.queue=api 1
	// ginqueue.slot.limit ginqueue.queue=api 8
}

// Record each decision of a Queue on the request's span. The span comes
// from a tracing middleware in front of the Queue (otelgin, say); this one
// stands in for it.
func ExampleSpanEvents() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	tracer := tp.Tracer("example")

	q, err := ginqueue.NewQueue(ginqueue.Config{
		MaxConcurrent: 8, MaxQueue: 100, QueueTimeout: 5 * time.Second,
		OnDecision: otelqueue.SpanEvents("api"),
	})
	if err != nil {
		panic(err)
	}
	defer q.Close()

	router := gin.New()
	router.Use(func(c *gin.Context) {
		ctx, span := tracer.Start(c.Request.Context(), c.Request.Method+" "+c.FullPath())
		defer span.End()
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	})
	api := router.Group("/api", q.Handler())
	api.GET("/hello", func(c *gin.Context) { c.String(http.StatusOK, "hello") })
	router.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/api/hello", nil))

	for _, span := range spans.Ended() {
		fmt.Println(span.Name())
		for _, e := range span.Events() {
			fmt.Println(" event", e.Name)
			for _, kv := range e.Attributes {
				fmt.Printf("  %s=%s\n", kv.Key, kv.Value.String())
			}
		}
	}
	// Output:
	// GET /api/hello
	//  event ginqueue.granted
	//   ginqueue.queue=api
	//   ginqueue.outcome=served
	//   ginqueue.wait.duration=0
	//   ginqueue.priority=0
	//   ginqueue.arrival.queued=0
	//   ginqueue.cost=1
}
