// Command otel serves a throttled API on 127.0.0.1 and reports its Queue to
// OpenTelemetry through otelqueue: metrics through the OpenTelemetry
// Prometheus exporter on /metrics (outside the throttle), and spans to
// stdout, where each request's span carries the Queue's decision as an
// event. A tracing middleware written here stands in for otelgin. It sends
// itself a burst that overflows the queue, prints the ginqueue lines of
// /metrics, then the spans as the tracer provider flushes them, and exits.
//
//	cd _example && go run ./otel
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/otelqueue"
)

const (
	slots        = 2
	places       = 4
	queueTimeout = 300 * time.Millisecond
	work         = 200 * time.Millisecond // each API request
	burst        = 12                     // requests at once: 2 run, 4 wait, 6 are turned away
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "otel:", err)
		os.Exit(1)
	}
}

func run(out io.Writer) error {
	gin.SetMode(gin.ReleaseMode)
	a, err := newApp(out, work)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return errors.Join(err, a.shutdown(context.Background()))
	}
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "serving %s/api/work (%d slots, %d places, %v queue timeout, %v handlers) and %s/metrics\n",
		base, slots, places, queueTimeout, work, base)

	transport := &http.Transport{MaxIdleConnsPerHost: burst}
	client := &http.Client{Transport: transport, Timeout: 5 * time.Second}
	statuses := sendBurst(client, base+"/api/work", burst)
	fmt.Fprintf(out, "\na burst of %d requests: %v (status: count)\n\n", burst, statuses)

	body, err := get(client, base+"/metrics")
	if err != nil {
		return errors.Join(err, a.shutdown(context.Background()))
	}
	fmt.Fprintln(out, "GET /metrics (the ginqueue lines, without the exporter's otel_scope_ labels):")
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "ginqueue_") {
			fmt.Fprint(out, scopeLabels.ReplaceAllString(line, ""))
		}
	}

	fmt.Fprint(out, "\nthe spans, one JSON object each, as the tracer provider flushes them:\n\n")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// First the client's connections: one it dialed and never used would
	// hold the server's Shutdown for 5 s.
	transport.CloseIdleConnections()
	return errors.Join(srv.Shutdown(ctx), a.shutdown(ctx))
}

// app is the server: a Queue, its telemetry and its routes.
type app struct {
	q        *ginqueue.Queue
	handler  http.Handler
	shutdown func(context.Context) error // stops the Queue and flushes the telemetry
}

// newApp builds the server, its API handlers taking work each, writing
// spans to spans.
func newApp(spans io.Writer, work time.Duration) (*app, error) {
	// Metrics: a MeterProvider read by the Prometheus exporter, which
	// registers with its own registry, served on /metrics.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))

	// Traces: every span, batched to spans.
	spanExporter, err := stdouttrace.New(stdouttrace.WithWriter(spans))
	if err != nil {
		return nil, errors.Join(err, mp.Shutdown(context.Background()))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(spanExporter))

	q, err := ginqueue.NewQueue(ginqueue.Config{
		MaxConcurrent: slots,
		MaxQueue:      places,
		QueueTimeout:  queueTimeout,
		OnDecision:    otelqueue.SpanEvents("api"),
	})
	if err != nil {
		return nil, errors.Join(err, tp.Shutdown(context.Background()), mp.Shutdown(context.Background()))
	}
	m, err := otelqueue.NewMetrics(mp)
	if err == nil {
		err = m.Add("api", q)
	}
	if err != nil {
		return nil, errors.Join(err, q.Close(), tp.Shutdown(context.Background()), mp.Shutdown(context.Background()))
	}

	r := gin.New()
	r.Use(gin.Recovery())
	// Outside the throttle: a scrape must never wait behind, or be turned
	// away with, the traffic it reports on.
	r.GET("/metrics", gin.WrapH(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	// The tracing middleware runs before the Queue, so that the Queue's
	// decision lands on the request's span.
	api := r.Group("/api", tracing(tp.Tracer("example/otel")), q.Handler())
	api.GET("/work", func(c *gin.Context) {
		time.Sleep(work)
		c.String(http.StatusOK, "done")
	})

	return &app{q: q, handler: r, shutdown: func(ctx context.Context) error {
		return errors.Join(q.Shutdown(ctx), m.Unregister(), tp.Shutdown(ctx), mp.Shutdown(ctx))
	}}, nil
}

// tracing does what otelgin does, in brief: it continues the caller's trace
// (W3C traceparent), starts a server span named for the route, puts it in
// c.Request's context for the handlers after it, and ends it once they have
// returned, with the status.
func tracing(tracer trace.Tracer) gin.HandlerFunc {
	var propagator propagation.TraceContext
	return func(c *gin.Context) {
		ctx := propagator.Extract(c.Request.Context(), propagation.HeaderCarrier(c.Request.Header))
		ctx, span := tracer.Start(ctx, c.Request.Method+" "+c.FullPath(),
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", c.Request.Method),
				attribute.String("http.route", c.FullPath())))
		defer span.End()
		c.Request = c.Request.WithContext(ctx)
		c.Next()
		status := c.Writer.Status()
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= http.StatusInternalServerError {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	}
}

// sendBurst sends n GETs of url at once and counts their statuses (0: no
// response).
func sendBurst(client *http.Client, url string, n int) map[int]int {
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			code := 0
			if resp, err := client.Get(url); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
			mu.Lock()
			statuses[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return statuses
}

// scopeLabels are the labels the exporter adds to every series to name the
// instrumentation scope: the same on every ginqueue line.
var scopeLabels = regexp.MustCompile(`,otel_scope_[a-z_]+="[^"]*"`)

// get returns the body of a GET of url.
func get(client *http.Client, url string) (string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}
