package otelqueue_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/otelqueue"
)

// tracing is what otelgin does, for the tests: it starts a server span for
// every request (named by its X-Name header, else its path), puts it in
// c.Request's context for the handlers after it, and ends it once they
// have returned; then it sends the span's name on ended, if not nil.
func tracing(tp trace.TracerProvider, ended chan<- string) gin.HandlerFunc {
	tracer := tp.Tracer("otelqueue-test")
	return func(c *gin.Context) {
		name := c.GetHeader("X-Name")
		if name == "" {
			name = c.Request.URL.Path
		}
		ctx, span := tracer.Start(c.Request.Context(), name, trace.WithSpanKind(trace.SpanKindServer))
		c.Request = c.Request.WithContext(ctx)
		c.Next()
		span.SetAttributes(attribute.Int("http.response.status_code", c.Writer.Status()))
		span.End()
		if ended != nil {
			ended <- name
		}
	}
}

// newTracerProvider returns an SDK TracerProvider that samples every span
// and records it in the returned SpanRecorder as it ends.
func newTracerProvider(t testing.TB) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, spans
}

// server is a real gin server on loopback, with the tracing middleware, a
// Queue named "api" with SpanEvents, and two routes: /hold runs until
// release gets a value, / answers at once.
type server struct {
	q       *ginqueue.Queue
	url     string
	client  *http.Client
	spans   *tracetest.SpanRecorder
	ended   chan string
	release chan struct{}
	done    map[string]bool // spans seen on ended; the test's goroutine only
}

func newServer(t *testing.T, cfg ginqueue.Config) *server {
	t.Helper()
	tp, spans := newTracerProvider(t)
	s := &server{spans: spans, ended: make(chan string, 64), release: make(chan struct{}), done: map[string]bool{}}
	cfg.Priority = byHeader
	cfg.OnDecision = otelqueue.SpanEvents("api")
	s.q = newQueue(t, cfg)
	r := gin.New()
	r.Use(tracing(tp, s.ended), s.q.Handler())
	r.GET("/hold", func(c *gin.Context) { <-s.release; c.Status(http.StatusOK) })
	r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
	srv := httptest.NewServer(r)
	transport := &http.Transport{}
	t.Cleanup(func() {
		transport.CloseIdleConnections()
		srv.Close()
	})
	s.url, s.client = srv.URL, &http.Client{Transport: transport, Timeout: 10 * time.Second}
	return s
}

// get sends a GET of path named name (its span's name) with priority prio,
// and returns the status it gets (0 for an error) once it has.
func (s *server) get(ctx context.Context, path, name string, prio int) <-chan int {
	code := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+path, nil)
		req.Header.Set("X-Name", name)
		req.Header.Set("X-Priority", strconv.Itoa(prio))
		resp, err := s.client.Do(req)
		if err != nil {
			code <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		code <- resp.StatusCode
	}()
	return code
}

// hold takes the Queue's only slot with a request to /hold, and returns
// the function that lets it finish.
func (s *server) hold(t *testing.T) (free func()) {
	t.Helper()
	code := s.get(t.Context(), "/hold", "hold", 0)
	s.until(t, "the slot taken", func(st ginqueue.Stats) bool { return st.Running == 1 })
	return func() {
		t.Helper()
		s.release <- struct{}{}
		assert.Equal(t, http.StatusOK, <-code, "hold")
	}
}

// until waits for cond on the Queue's Stats, for at most 5 s.
func (s *server) until(t *testing.T, what string, cond func(ginqueue.Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond(s.q.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for %s; stats %+v", what, s.q.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

// span waits until the span named name has ended, and returns it.
func (s *server) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for !s.done[name] {
		select {
		case n := <-s.ended:
			s.done[n] = true
		case <-timeout:
			t.Fatalf("span %s did not end within 5 s", name)
		}
	}
	for _, sp := range s.spans.Ended() {
		if sp.Name() == name {
			return sp
		}
	}
	t.Fatalf("span %s ended, but was not recorded", name)
	return nil
}

// decision is what SpanEvents recorded on one span.
type decision struct {
	event string                            // the name of its only ginqueue event
	attrs map[attribute.Key]attribute.Value // the event's
	span  map[attribute.Key]attribute.Value // the span's own, ginqueue.* only
	wait  float64                           // ginqueue.wait.duration, taken out of attrs and span
}

// decisionOf returns the decision recorded on sp, checking that there is
// exactly one, and that the span's attributes are those of the event.
func decisionOf(t *testing.T, sp sdktrace.ReadOnlySpan) decision {
	t.Helper()
	var d decision
	n := 0
	for _, e := range sp.Events() {
		if e.Name != otelqueue.GrantedEvent && e.Name != otelqueue.RejectedEvent {
			continue
		}
		n++
		d.event, d.attrs = e.Name, map[attribute.Key]attribute.Value{}
		for _, kv := range e.Attributes {
			d.attrs[kv.Key] = kv.Value
		}
	}
	require.Equal(t, 1, n, "ginqueue events on span %s: %v", sp.Name(), sp.Events())
	d.span = map[attribute.Key]attribute.Value{}
	for _, kv := range sp.Attributes() {
		if kv.Key != "http.response.status_code" {
			d.span[kv.Key] = kv.Value
		}
	}
	d.wait = d.attrs[otelqueue.WaitKey].AsFloat64()
	assert.Equal(t, d.attrs[otelqueue.WaitKey], d.span[otelqueue.WaitKey], "the span's wait")
	delete(d.attrs, otelqueue.WaitKey)
	delete(d.span, otelqueue.WaitKey)
	return d
}

// want builds the attributes of an event, without the wait.
func want(outcome string, priority, queued, cost int) map[attribute.Key]attribute.Value {
	return map[attribute.Key]attribute.Value{
		otelqueue.QueueKey:         attribute.StringValue("api"),
		otelqueue.OutcomeKey:       attribute.StringValue(outcome),
		otelqueue.PriorityKey:      attribute.IntValue(priority),
		otelqueue.ArrivalQueuedKey: attribute.IntValue(queued),
		otelqueue.CostKey:          attribute.IntValue(cost),
	}
}

// spanWant is the span's own attributes, without the wait.
func spanWant(outcome string) map[attribute.Key]attribute.Value {
	return map[attribute.Key]attribute.Value{
		otelqueue.QueueKey:   attribute.StringValue("api"),
		otelqueue.OutcomeKey: attribute.StringValue(outcome),
	}
}

// A request that finds a free slot gets a grant with no wait.
func TestSpanGrantedAtOnce(t *testing.T) {
	s := newServer(t, ginqueue.Config{MaxConcurrent: 1})
	assert.Equal(t, http.StatusOK, <-s.get(t.Context(), "/", "now", 5))
	d := decisionOf(t, s.span(t, "now"))
	assert.Equal(t, otelqueue.GrantedEvent, d.event)
	// It did not wait, so its priority was not asked for.
	assert.Equal(t, want("served", 0, 0, 1), d.attrs)
	assert.Equal(t, spanWant("served"), d.span)
	assert.Zero(t, d.wait)
}

// Requests that wait get a grant with their wait, priority and place.
func TestSpanGrantedAfterWaiting(t *testing.T) {
	s := newServer(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 2})
	free := s.hold(t)
	low := s.get(t.Context(), "/", "low", 0)
	s.until(t, "one waiter", func(st ginqueue.Stats) bool { return st.Queued == 1 })
	high := s.get(t.Context(), "/", "high", 3) // arrives behind low, runs before it
	s.until(t, "two waiters", func(st ginqueue.Stats) bool { return st.Queued == 2 })
	time.Sleep(5 * time.Millisecond)
	free()
	assert.Equal(t, http.StatusOK, <-high)
	assert.Equal(t, http.StatusOK, <-low)

	for _, tc := range []struct {
		name             string
		priority, queued int
	}{{"high", 3, 1}, {"low", 0, 0}} {
		d := decisionOf(t, s.span(t, tc.name))
		assert.Equal(t, otelqueue.GrantedEvent, d.event, tc.name)
		assert.Equal(t, want("served", tc.priority, tc.queued, 1), d.attrs, tc.name)
		assert.Equal(t, spanWant("served"), d.span, tc.name)
		assert.GreaterOrEqual(t, d.wait, 0.005, "%s waited at least until the release", tc.name)
	}
}

// A request that outwaits QueueTimeout is rejected, with its wait.
func TestSpanQueueTimeout(t *testing.T) {
	const timeout = 30 * time.Millisecond
	s := newServer(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: timeout})
	free := s.hold(t)
	assert.Equal(t, http.StatusRequestTimeout, <-s.get(t.Context(), "/", "late", 2))
	free()

	d := decisionOf(t, s.span(t, "late"))
	assert.Equal(t, otelqueue.RejectedEvent, d.event)
	assert.Equal(t, want("queue_timeout", 2, 0, 1), d.attrs)
	assert.Equal(t, spanWant("queue_timeout"), d.span)
	assert.GreaterOrEqual(t, d.wait, timeout.Seconds())
}

// A request that finds no place is rejected at once.
func TestSpanQueueFull(t *testing.T) {
	s := newServer(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1})
	free := s.hold(t)
	waiter := s.get(t.Context(), "/", "waiter", 0)
	s.until(t, "one waiter", func(st ginqueue.Stats) bool { return st.Queued == 1 })
	assert.Equal(t, http.StatusServiceUnavailable, <-s.get(t.Context(), "/", "full", 0))
	free()
	assert.Equal(t, http.StatusOK, <-waiter)

	d := decisionOf(t, s.span(t, "full"))
	assert.Equal(t, otelqueue.RejectedEvent, d.event)
	assert.Equal(t, want("queue_full", 0, 1, 1), d.attrs)
	assert.Equal(t, spanWant("queue_full"), d.span)
}

// A client that hangs up while its request waits: canceled, recorded 499.
func TestSpanClientGone(t *testing.T) {
	s := newServer(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1})
	free := s.hold(t)
	ctx, cancel := context.WithCancel(t.Context())
	gone := s.get(ctx, "/", "gone", 1)
	s.until(t, "one waiter", func(st ginqueue.Stats) bool { return st.Queued == 1 })
	cancel()
	assert.Zero(t, <-gone, "a canceled request gets no response")
	sp := s.span(t, "gone")
	free()

	d := decisionOf(t, sp)
	assert.Equal(t, otelqueue.RejectedEvent, d.event)
	assert.Equal(t, want("canceled", 1, 0, 1), d.attrs)
	assert.Equal(t, spanWant("canceled"), d.span)
	assert.Positive(t, d.wait)
	assert.Contains(t, sp.Attributes(), attribute.Int("http.response.status_code", ginqueue.StatusClientClosedRequest))
}

// In a synctest bubble the waits are exact: a request of cost 2 that runs
// at once, one that waits 250 ms, and one that outwaits its second.
func TestSpanEventsExactWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, spans := newTracerProvider(t)
		q := newQueue(t, ginqueue.Config{
			MaxConcurrent: 2, MaxQueue: 2, QueueTimeout: time.Second, Priority: byHeader,
			Cost:       func(c *gin.Context) int { n, _ := strconv.Atoi(c.GetHeader("X-Cost")); return n },
			OnDecision: otelqueue.SpanEvents("api"),
		})
		release := make(chan struct{})
		r := gin.New()
		r.Use(tracing(tp, nil), q.Handler())
		r.GET("/", func(c *gin.Context) { <-release; c.Status(http.StatusOK) })
		a := send(r, get("X-Name", "a", "X-Cost", "2")) // both slots, at once
		b := send(r, get("X-Name", "b", "X-Priority", "2", "X-Cost", "1"))
		c := send(r, get("X-Name", "c", "X-Cost", "2")) // behind b
		time.Sleep(250 * time.Millisecond)
		release <- struct{}{} // a ends; b runs on one slot, c still needs two
		expectCode(t, "a", a, http.StatusOK)
		time.Sleep(time.Second)
		synctest.Wait()
		expectCode(t, "c", c, http.StatusRequestTimeout)
		release <- struct{}{}
		expectCode(t, "b", b, http.StatusOK)

		got := map[string]decision{}
		for _, sp := range spans.Ended() {
			got[sp.Name()] = decisionOf(t, sp)
		}
		assert.Equal(t, map[string]decision{
			"a": {event: otelqueue.GrantedEvent, attrs: want("served", 0, 0, 2), span: spanWant("served"), wait: 0},
			"b": {event: otelqueue.GrantedEvent, attrs: want("served", 2, 0, 1), span: spanWant("served"), wait: 0.25},
			"c": {event: otelqueue.RejectedEvent, attrs: want("queue_timeout", 0, 1, 2), span: spanWant("queue_timeout"), wait: 1},
		}, got)
	})
}

// Without a span, or with one that is not sampled, the hook does nothing
// and the request is served as usual.
func TestSpanEventsWithoutRecordingSpan(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSpanProcessor(spans))
	defer func() { _ = unsampled.Shutdown(context.Background()) }()
	for _, tc := range []struct {
		name string
		mw   []gin.HandlerFunc
	}{
		{"no span", nil},
		{"not sampled", []gin.HandlerFunc{tracing(unsampled, nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newQueue(t, ginqueue.Config{MaxConcurrent: 1, OnDecision: otelqueue.SpanEvents("api")})
			r := gin.New()
			r.Use(append(tc.mw, q.Handler())...)
			r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			assert.Equal(t, http.StatusOK, w.Code)
			assert.Equal(t, "ok", w.Body.String())
			assert.EqualValues(t, 1, q.Stats().Served)
		})
	}
	assert.Empty(t, spans.Started(), "spans recorded")
}

// A span that a middleware ended before the Queue decided takes nothing,
// and the request is served as usual.
func TestSpanEventsEndedSpan(t *testing.T) {
	tp, spans := newTracerProvider(t)
	tracer := tp.Tracer("otelqueue-test")
	q := newQueue(t, ginqueue.Config{MaxConcurrent: 1, OnDecision: otelqueue.SpanEvents("api")})
	r := gin.New()
	r.Use(func(c *gin.Context) {
		ctx, span := tracer.Start(c.Request.Context(), "early")
		span.End()
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	}, q.Handler())
	r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusOK, w.Code)
	ended := spans.Ended()
	require.Len(t, ended, 1)
	assert.Empty(t, ended[0].Events())
	assert.Empty(t, ended[0].Attributes())
}

func TestSpanEventsRefusesEmptyName(t *testing.T) {
	assert.PanicsWithValue(t, "otelqueue: SpanEvents: queue name must not be empty", func() { otelqueue.SpanEvents("") })
}

// An outcome newer than the hook still gets its name.
func TestSpanEventsUnknownOutcome(t *testing.T) {
	tp, spans := newTracerProvider(t)
	ctx, span := tp.Tracer("otelqueue-test").Start(t.Context(), "direct")
	c, _ := gin.CreateTestContext(httptest.NewRecorder())
	c.Request = httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	otelqueue.SpanEvents("api")(c, ginqueue.Decision{Outcome: ginqueue.Outcome(42), Wait: time.Second, Cost: 1})
	span.End()
	d := decisionOf(t, spans.Ended()[0])
	assert.Equal(t, otelqueue.RejectedEvent, d.event)
	assert.Equal(t, want(ginqueue.Outcome(42).String(), 0, 0, 1), d.attrs)
	assert.Equal(t, 1.0, d.wait)
}

// Each call's attributes stay on its event: one hook called twice on the
// same span (a request through two groups with one Queue, say), and a hook
// of another Queue.
func TestSpanEventsKeepTheirAttributes(t *testing.T) {
	tp, spans := newTracerProvider(t)
	ctx, span := tp.Tracer("otelqueue-test").Start(t.Context(), "three")
	c, _ := gin.CreateTestContext(httptest.NewRecorder())
	c.Request = httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	outer := otelqueue.SpanEvents("outer")
	outer(c, ginqueue.Decision{Outcome: ginqueue.OutcomeServed, Wait: time.Second, Cost: 1})
	outer(c, ginqueue.Decision{Outcome: ginqueue.OutcomeQueueTimeout, Wait: 2 * time.Second, Priority: 7, Queued: 3, Cost: 4})
	otelqueue.SpanEvents("inner")(c, ginqueue.Decision{Outcome: ginqueue.OutcomeQueueFull, Cost: 1})
	span.End()
	var got []string
	for _, e := range spans.Ended()[0].Events() {
		set := attribute.NewSet(e.Attributes...)
		got = append(got, e.Name+" "+set.Encoded(attribute.DefaultEncoder()))
	}
	assert.Equal(t, []string{
		"ginqueue.granted ginqueue.arrival.queued=0,ginqueue.cost=1,ginqueue.outcome=served,ginqueue.priority=0,ginqueue.queue=outer,ginqueue.wait.duration=1",
		"ginqueue.rejected ginqueue.arrival.queued=3,ginqueue.cost=4,ginqueue.outcome=queue_timeout,ginqueue.priority=7,ginqueue.queue=outer,ginqueue.wait.duration=2",
		"ginqueue.rejected ginqueue.arrival.queued=0,ginqueue.cost=1,ginqueue.outcome=queue_full,ginqueue.priority=0,ginqueue.queue=inner,ginqueue.wait.duration=0",
	}, got)
	// The span keeps the last decision's.
	assert.Contains(t, spans.Ended()[0].Attributes(), otelqueue.QueueKey.String("inner"))
	assert.Contains(t, spans.Ended()[0].Attributes(), otelqueue.OutcomeKey.String("queue_full"))
}

// watchedSpan is a span that is not recording and counts the calls that
// would record on it.
type watchedSpan struct {
	tracenoop.Span
	calls int
}

func (s *watchedSpan) AddEvent(string, ...trace.EventOption) { s.calls++ }
func (s *watchedSpan) SetAttributes(...attribute.KeyValue)   { s.calls++ }

// The hook does not even call a span that is not recording.
func TestSpanEventsSkipsNonRecordingSpan(t *testing.T) {
	span := &watchedSpan{}
	c := testContext(trace.ContextWithSpan(t.Context(), span))
	otelqueue.SpanEvents("api")(c, decided)
	assert.Zero(t, span.calls)
}
