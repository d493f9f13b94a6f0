// Outcomes, and the answers to requests not served: statuses, hooks, OnOutcome.

package ginqueue_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
)

// A rejection hook starts from the default response: one that writes
// nothing answers with the default status and Retry-After, never a 200; one
// that sets its own status or writes a body wins.
func TestRejectionHookStartsFromTheDefault(t *testing.T) {
	kinds := []struct {
		name   string
		status int // the default
		hook   func(*ginqueue.Config, gin.HandlerFunc)
		close  bool
	}{
		{"queue full", http.StatusServiceUnavailable, func(c *ginqueue.Config, h gin.HandlerFunc) {
			c.MaxQueue, c.QueueTimeout, c.OnQueueFull = 0, 0, h
		}, false},
		{"queue timeout", http.StatusRequestTimeout, func(c *ginqueue.Config, h gin.HandlerFunc) { c.OnQueueTimeout = h }, false},
		{"closed", http.StatusServiceUnavailable, func(c *ginqueue.Config, h gin.HandlerFunc) { c.OnClosed = h }, true},
	}
	hooks := []struct {
		name       string
		hook       gin.HandlerFunc
		code       int // zero: the default
		body       string
		retryAfter string
	}{
		{"writes nothing", func(*gin.Context) {}, 0, "", "1"},
		{"sets a status only", func(c *gin.Context) { c.Status(http.StatusTooManyRequests) }, http.StatusTooManyRequests, "", "1"},
		{"writes a body", func(c *gin.Context) { c.String(http.StatusGone, "bye") }, http.StatusGone, "bye", "1"},
		{"drops Retry-After", func(c *gin.Context) { c.Writer.Header().Del("Retry-After") }, 0, "", ""},
	}
	for _, k := range kinds {
		for _, h := range hooks {
			t.Run(k.name+"/"+h.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					cfg := ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Second}
					k.hook(&cfg, h.hook)
					q := mustQueue(t, cfg)
					g, r := gated(q)
					out := make(chan result, 2)
					t0 := time.Now()
					send(r, context.Background(), 0, t0, out) // holds the slot
					synctest.Wait()
					if k.close {
						require.NoError(t, q.Close())
					}
					send(r, context.Background(), 1, t0, out)
					res := <-out
					g.open(1)
					assert.Equal(t, http.StatusOK, (<-out).code)

					want := h.code
					if want == 0 {
						want = k.status
					}
					assert.Equal(t, 1, res.id)
					assert.Equal(t, want, res.code)
					assert.Equal(t, h.body, res.body)
					assert.Equal(t, h.retryAfter, res.header.Get("Retry-After"))
				})
			})
		}
	}
}

// OnQueueTimeout is allowed without a QueueTimeout: a deadline on the
// request's context that passes in the queue is a queue timeout, and the
// hook answers it.
func TestTimeoutHookAnswersARequestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var outcomes outcomeLog
		q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1,
			OnQueueTimeout: func(c *gin.Context) { c.String(http.StatusServiceUnavailable, "try later") },
			OnOutcome:      outcomes.add,
		})
		require.NoError(t, err, "an OnQueueTimeout hook without QueueTimeout can run")
		t.Cleanup(func() { _ = q.Close() })
		g, r := gated(q)
		out := make(chan result, 2)
		t0 := time.Now()
		send(r, context.Background(), 0, t0, out)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		send(r, ctx, 1, t0, out)
		res := <-out
		assert.Equal(t, 1, res.id)
		assert.Equal(t, http.StatusServiceUnavailable, res.code)
		assert.Equal(t, "try later", res.body)
		assert.Equal(t, 50*time.Millisecond, res.at)
		g.open(1)
		<-out
		assert.EqualValues(t, 1, q.Stats().QueueTimeout)
		assert.Equal(t, []ginqueue.Outcome{ginqueue.OutcomeQueueTimeout, ginqueue.OutcomeServed}, outcomes.get())
	})
}

// QueueTimeoutStatus sets the status of the default queue-timeout response,
// and the status a silent OnQueueTimeout hook answers with; zero is 408.
func TestQueueTimeoutStatus(t *testing.T) {
	tests := []struct {
		name   string
		status int
		hook   gin.HandlerFunc
		want   int
	}{
		{"zero is 408", 0, nil, http.StatusRequestTimeout},
		{"503 for browsers", http.StatusServiceUnavailable, nil, http.StatusServiceUnavailable},
		{"429", http.StatusTooManyRequests, nil, http.StatusTooManyRequests},
		{"a silent hook answers with it", http.StatusServiceUnavailable, func(*gin.Context) {}, http.StatusServiceUnavailable},
		{"a hook's own status wins", http.StatusServiceUnavailable, func(c *gin.Context) { c.Status(http.StatusGatewayTimeout) },
			http.StatusGatewayTimeout},
	}
	for _, status := range []int{0, 400, 503, 599} {
		assert.NoError(t, ginqueue.Config{MaxConcurrent: 1, QueueTimeoutStatus: status}.Validate(), status)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: 500 * time.Millisecond,
					QueueTimeoutStatus: tt.status, OnQueueTimeout: tt.hook})
				g, r := gated(q)
				out := make(chan result, 2)
				t0 := time.Now()
				send(r, context.Background(), 0, t0, out)
				synctest.Wait()
				send(r, context.Background(), 1, t0, out)
				res := <-out
				assert.Equal(t, 1, res.id)
				assert.Equal(t, tt.want, res.code)
				assert.Equal(t, "1", res.header.Get("Retry-After"))
				assert.Equal(t, 500*time.Millisecond, res.at)
				g.open(1)
				<-out
				assert.EqualValues(t, 1, q.Stats().QueueTimeout)
			})
		})
	}
}

// A response an earlier middleware already wrote is left alone by a
// rejection: the outcome is counted, nothing more is written.
func TestRejectionAfterAnEarlierWrite(t *testing.T) {
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 0})
	require.NoError(t, q.Close())
	r := gin.New()
	r.Use(func(c *gin.Context) { c.String(http.StatusOK, "early"); c.Next() }, q.Handler())
	r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "late") })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "early", w.Body.String())
	assert.Empty(t, w.Header().Get("Retry-After"))
	assert.EqualValues(t, 1, q.Stats().Closed)
}

// OnOutcome is called once per request with its outcome and wait; a hook
// that panics cannot keep a slot.
func TestOnOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		seen := map[ginqueue.Outcome][]time.Duration{}
		q := mustQueue(t, ginqueue.Config{
			MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: 300 * time.Millisecond,
			OnOutcome: func(c *gin.Context, o ginqueue.Outcome, wait time.Duration) {
				mu.Lock()
				seen[o] = append(seen[o], wait)
				mu.Unlock()
				if c.Query("hook") == "panic" {
					panic("hook")
				}
			},
		})
		r := newEngine(q.Handler(), sleeper(time.Second))
		out := make(chan result, 8)
		t0 := time.Now()
		send(r, context.Background(), 0, t0, out)
		synctest.Wait()
		send(r, context.Background(), 1, t0, out) // times out after 300 ms
		synctest.Wait()
		send(r, context.Background(), 2, t0, out) // full
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		time.Sleep(400 * time.Millisecond)
		send(r, ctx, 3, t0, out)
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		cancel() // after 100 ms of waiting
		for range 4 {
			<-out
		}
		mu.Lock()
		assert.Equal(t, map[ginqueue.Outcome][]time.Duration{
			ginqueue.OutcomeServed:       {0},
			ginqueue.OutcomeQueueTimeout: {300 * time.Millisecond},
			ginqueue.OutcomeQueueFull:    {0},
			ginqueue.OutcomeCanceled:     {100 * time.Millisecond},
		}, seen)
		mu.Unlock()

		// A panicking hook on a served request: gin.Recovery answers, the
		// slot is back.
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?hook=panic", nil))
		assert.Equal(t, http.StatusInternalServerError, w.Code)
		assert.Equal(t, 0, q.Stats().Running)
		require.NoError(t, q.Close())
		w = httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		mu.Lock()
		assert.Len(t, seen[ginqueue.OutcomeClosed], 1)
		mu.Unlock()
	})
}

// A deadline on the request's context that passes in the queue (a timeout
// middleware in front) is a queue timeout: 408, not a hang-up.
func TestRequestDeadlineInQueueIsTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute})
		g, r := gated(q)
		out := make(chan result, 2)
		t0 := time.Now()
		send(r, context.Background(), 0, t0, out)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		send(r, ctx, 1, t0, out)
		res := <-out
		assert.Equal(t, result{id: 1, code: http.StatusRequestTimeout, header: res.header, at: 50 * time.Millisecond}, res)
		g.open(1)
		<-out
		st := q.Stats()
		assert.EqualValues(t, 1, st.QueueTimeout)
		assert.Zero(t, st.Canceled)
	})
}

// stubBackend is a Backend whose Acquire answers what acquire returns for
// the request's context, at once.
type stubBackend struct {
	acquire func(ctx context.Context) error
}

func (b *stubBackend) Start(backend.Limits) error { return nil }
func (b *stubBackend) Acquire(ctx context.Context, _ backend.Arrival) (backend.Ticket, error) {
	return backend.Ticket{}, b.acquire(ctx)
}
func (b *stubBackend) Release(backend.Ticket)      {}
func (b *stubBackend) Stats() backend.Stats        { return backend.Stats{Limit: 1} }
func (b *stubBackend) Drain(context.Context) error { return nil }
func (b *stubBackend) Close() error                { return nil }

// unavailable is what a remote backend answers when it cannot reach its
// store: it says queue full and wraps the cause, here its own call's
// timeout.
type unavailable struct{ cause error }

func (e unavailable) Error() string   { return "stub: store unavailable: " + e.cause.Error() }
func (e unavailable) Unwrap() []error { return []error{backend.ErrQueueFull, e.cause} }

// What the Backend says wins over any cause its error wraps; only the
// request's own context or ErrQueueTimeout makes a queue timeout. A backend
// whose own call timed out is not the request timing out.
func TestBackendErrorOutcomes(t *testing.T) {
	errDown := errors.New("stub: store unreachable") // wraps none of the Err values
	alive := func() context.Context { return context.Background() }
	canceled := func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	expired := func() context.Context {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		t.Cleanup(cancel)
		return ctx
	}
	tests := []struct {
		name    string
		ctx     func() context.Context // the request's
		err     func(ctx context.Context) error
		code    int
		outcome ginqueue.Outcome
	}{
		{"queue full wrapping the call's deadline", alive,
			func(context.Context) error { return unavailable{context.DeadlineExceeded} },
			http.StatusServiceUnavailable, ginqueue.OutcomeQueueFull},
		{"queue full and the call's deadline, two %w", alive,
			func(context.Context) error {
				return fmt.Errorf("%w (%w)", context.DeadlineExceeded, backend.ErrQueueFull)
			},
			http.StatusServiceUnavailable, ginqueue.OutcomeQueueFull},
		{"unavailable wrapping the call's deadline, request alive", alive,
			func(context.Context) error { return fmt.Errorf("%w: %w", errDown, context.DeadlineExceeded) },
			http.StatusServiceUnavailable, ginqueue.OutcomeQueueFull},
		{"the backend's own cancel, request alive", alive,
			func(context.Context) error { return fmt.Errorf("stub: %w", context.Canceled) },
			http.StatusServiceUnavailable, ginqueue.OutcomeQueueFull},
		{"an unknown error", alive,
			func(context.Context) error { return errDown },
			http.StatusServiceUnavailable, ginqueue.OutcomeQueueFull},
		{"closed wrapping the call's deadline", alive,
			func(context.Context) error { return fmt.Errorf("%w: %w", backend.ErrClosed, context.DeadlineExceeded) },
			http.StatusServiceUnavailable, ginqueue.OutcomeClosed},
		{"closed wrapping queue full", alive,
			func(context.Context) error { return fmt.Errorf("%w: %w", backend.ErrClosed, backend.ErrQueueFull) },
			http.StatusServiceUnavailable, ginqueue.OutcomeClosed},
		{"queue timeout", alive,
			func(context.Context) error { return fmt.Errorf("stub: %w", backend.ErrQueueTimeout) },
			http.StatusRequestTimeout, ginqueue.OutcomeQueueTimeout},
		{"request canceled", canceled,
			func(ctx context.Context) error { return ctx.Err() },
			ginqueue.StatusClientClosedRequest, ginqueue.OutcomeCanceled},
		{"request canceled, the backend wraps it", canceled,
			func(ctx context.Context) error { return fmt.Errorf("stub: %w", ctx.Err()) },
			ginqueue.StatusClientClosedRequest, ginqueue.OutcomeCanceled},
		{"request canceled, the backend unavailable", canceled,
			func(context.Context) error { return fmt.Errorf("%w: %w", errDown, context.DeadlineExceeded) },
			ginqueue.StatusClientClosedRequest, ginqueue.OutcomeCanceled},
		{"request deadline passed", expired,
			func(ctx context.Context) error { return ctx.Err() },
			http.StatusRequestTimeout, ginqueue.OutcomeQueueTimeout},
		{"request deadline passed, the backend unavailable", expired,
			func(context.Context) error { return errDown },
			http.StatusRequestTimeout, ginqueue.OutcomeQueueTimeout},
		{"request deadline passed, the backend says queue full", expired,
			func(context.Context) error { return backend.ErrQueueFull },
			http.StatusServiceUnavailable, ginqueue.OutcomeQueueFull},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen []ginqueue.Outcome // the request runs on this goroutine
			q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Second,
				Backend:   &stubBackend{acquire: tt.err},
				OnOutcome: func(_ *gin.Context, o ginqueue.Outcome, _ time.Duration) { seen = append(seen, o) },
			})
			r := newEngine(q.Handler(), func(c *gin.Context) { c.String(http.StatusOK, "served") })
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequestWithContext(tt.ctx(), http.MethodGet, "/", nil))

			assert.Equal(t, tt.code, w.Code)
			assert.NotEqual(t, "served", w.Body.String())
			assert.Equal(t, []ginqueue.Outcome{tt.outcome}, seen)
			want := counted(ginqueue.Stats{})
			want[tt.outcome] = 1
			assert.Equal(t, want, counted(q.Stats()))
		})
	}
}

// OnDecision is called once per request, when its fate is decided: before
// the handler of a served request runs (with its wait, priority and the
// requests waiting when it arrived), before the response of the others.
func TestOnDecision(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var seen []ginqueue.Decision
		var handlerSaw []int // decisions seen when each handler began
		q := mustQueue(t, ginqueue.Config{
			MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: 300 * time.Millisecond, Priority: byQueryPriority,
			Deadline: ginqueue.DeadlineHeader(clientTimeout),
			OnDecision: func(c *gin.Context, d ginqueue.Decision) {
				mu.Lock()
				defer mu.Unlock()
				assert.False(t, c.Writer.Written(), "called before the response")
				seen = append(seen, d)
				if c.Query("hook") == "panic" {
					panic("hook")
				}
			},
		})
		r := newEngine(q.Handler(), func(c *gin.Context) {
			mu.Lock()
			handlerSaw = append(handlerSaw, len(seen))
			mu.Unlock()
			time.Sleep(250 * time.Millisecond)
			c.Status(http.StatusOK)
		})
		get := func(url string, ctx context.Context, wait string) {
			go func() {
				req := httptest.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if wait != "" {
					req.Header.Set(clientTimeout, wait)
				}
				r.ServeHTTP(httptest.NewRecorder(), req)
			}()
			synctest.Wait()
		}
		get("/", context.Background(), "")     // A: served at once, runs 0–250 ms
		get("/?p=2", context.Background(), "") // B: served at 250 ms, runs to 500 ms
		get("/?p=1", context.Background(), "") // C: one ahead; times out at 300 ms
		get("/", context.Background(), "")     // D: full, two waiting
		get("/", context.Background(), "0")    // E: its deadline passed on arrival
		time.Sleep(400 * time.Millisecond)
		ctx, cancel := context.WithCancel(context.Background())
		get("/?p=3", ctx, "") // F: waits behind B, hangs up after 50 ms
		time.Sleep(50 * time.Millisecond)
		cancel()
		synctest.Wait()
		time.Sleep(time.Second)
		mu.Lock()
		assert.Equal(t, []ginqueue.Decision{
			{Outcome: ginqueue.OutcomeServed, Cost: 1},
			{Outcome: ginqueue.OutcomeQueueFull, Queued: 2, Cost: 1},
			{Outcome: ginqueue.OutcomeQueueTimeout, Cost: 1},
			{Outcome: ginqueue.OutcomeServed, Wait: 250 * time.Millisecond, Priority: 2, Cost: 1},
			{Outcome: ginqueue.OutcomeQueueTimeout, Wait: 300 * time.Millisecond, Priority: 1, Queued: 1, Cost: 1},
			{Outcome: ginqueue.OutcomeCanceled, Wait: 50 * time.Millisecond, Priority: 3, Cost: 1},
		}, seen)
		assert.Equal(t, []int{1, 4}, handlerSaw, "each served request's decision came before its handler")
		mu.Unlock()

		// A hook that panics on a grant: gin.Recovery answers, the slot is
		// back.
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?hook=panic", nil))
		assert.Equal(t, http.StatusInternalServerError, w.Code)
		assert.Zero(t, q.Stats().Running)
	})
}

// Decision.Cost is Config.Cost's value for a request refused after Close:
// Cost was asked before the Queue looked at Close.
func TestDecisionCostAfterClose(t *testing.T) {
	var got []ginqueue.Decision
	asked := 0
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Second,
		Cost:       func(*gin.Context) int { asked++; return 3 },
		OnDecision: func(_ *gin.Context, d ginqueue.Decision) { got = append(got, d) }})
	r := newEngine(q.Handler(), func(c *gin.Context) { c.Status(http.StatusOK) })
	require.NoError(t, q.Close())
	out := make(chan result, 1)
	send(r, context.Background(), 1, time.Now(), out)
	assert.Equal(t, http.StatusServiceUnavailable, (<-out).code)
	require.Len(t, got, 1)
	assert.Equal(t, ginqueue.OutcomeClosed, got[0].Outcome)
	assert.Equal(t, 1, asked, "Cost was asked")
	assert.Equal(t, 3, got[0].Cost, "Decision.Cost is the cost asked")
}

// An outcome's name is the label metrics use for it; one the package does
// not define is "unknown".
func TestOutcomeNames(t *testing.T) {
	want := map[ginqueue.Outcome]string{
		ginqueue.OutcomeServed: "served", ginqueue.OutcomeQueueFull: "queue_full",
		ginqueue.OutcomeQueueTimeout: "queue_timeout", ginqueue.OutcomeCanceled: "canceled",
		ginqueue.OutcomeClosed: "closed", ginqueue.OutcomePanic: "panic", ginqueue.OutcomePanic + 1: "unknown",
	}
	for o, name := range want {
		assert.Equal(t, name, o.String())
	}
}
