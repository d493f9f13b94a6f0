// Queue.Stats, its JSON and StatusHandler.

package ginqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
)

// Stats reports the age of the oldest waiter, and StatusHandler serves Stats
// as JSON.
func TestOldestWaitAndStatusHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Minute,
			Priority: byQueryPriority})
		g, r := gated(q)
		out := make(chan result, 4)
		sendAt(r, 0, 0, "", out)
		sendAt(r, 1, 2, "", out)
		time.Sleep(1500 * time.Millisecond)
		sendAt(r, 2, 0, "", out)
		time.Sleep(500 * time.Millisecond)
		assert.Equal(t, 2*time.Second, q.Stats().OldestWait)

		w := httptest.NewRecorder()
		ops := gin.New() // the ops route sits outside the throttle
		ops.GET("/debug/queue", q.StatusHandler())
		ops.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/queue", nil))
		var got map[string]any
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got))
		assert.EqualValues(t, 1, got["running"])
		assert.EqualValues(t, 2, got["queued"])
		assert.EqualValues(t, 2.0, got["oldest_wait_seconds"])
		assert.Equal(t, []any{
			map[string]any{"priority": 2.0, "queued": 1.0},
			map[string]any{"priority": 0.0, "queued": 1.0},
		}, got["queued_by_priority"])
		for _, k := range []string{"served", "queue_full", "queue_timeout", "canceled", "closed", "limit",
			"wait_p50_seconds", "wait_p90_seconds", "wait_p99_seconds", "drain_rate_per_second",
			"no_load_latency_seconds", "unavailable", "outages"} {
			assert.Contains(t, got, k)
		}
		g.open(3)
		for range 3 {
			<-out
		}
		assert.Zero(t, q.Stats().OldestWait)
	})
}

// Count reads each outcome's counter: every uint64 counter of Stats (its
// Backend's included) gets a value of its own, and each outcome must read
// a different one, so a new outcome that Count forgets reads 0 and fails.
func TestStatsCountReadsEachOutcomesCounter(t *testing.T) {
	var st ginqueue.Stats
	next := uint64(0)
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		for i := range v.NumField() {
			switch f := v.Field(i); f.Kind() {
			case reflect.Uint64:
				next++
				f.SetUint(next)
			case reflect.Struct:
				fill(f)
			}
		}
	}
	fill(reflect.ValueOf(&st).Elem())
	want := map[ginqueue.Outcome]uint64{
		ginqueue.OutcomeServed: st.Served, ginqueue.OutcomeQueueFull: st.QueueFull,
		ginqueue.OutcomeQueueTimeout: st.QueueTimeout, ginqueue.OutcomeCanceled: st.Canceled,
		ginqueue.OutcomeClosed: st.Closed, ginqueue.OutcomePanic: st.Panicked,
	}
	seen := map[uint64]ginqueue.Outcome{}
	o := ginqueue.Outcome(0)
	for ; o.String() != "unknown"; o++ {
		n := st.Count(o)
		assert.NotZero(t, n, "Count(%v)", o)
		if w, ok := want[o]; ok {
			assert.Equal(t, w, n, "Count(%v)", o)
		}
		if other, ok := seen[n]; ok {
			t.Errorf("Count(%v) and Count(%v) read the same counter", o, other)
		}
		seen[n] = o
	}
	assert.Len(t, seen, len(want))
	assert.Zero(t, st.Count(o), "Count of a value past the last outcome")
}

// In real time, with priorities, hang-ups and the limit moving up and down,
// a reader that looks at Stats and WaitHistogram as fast as it can never
// sees a counter or a bucket go down, Served below Running, a split that
// does not add up or a wild drain rate.
func TestStatsNeverContradictThemselves(t *testing.T) {
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 64, QueueTimeout: 20 * time.Millisecond,
		Priority: byQueryPriority, FlowKey: byQueryFlow})
	r := newEngine(q.Handler(), func(c *gin.Context) {
		time.Sleep(time.Duration(len(c.Query("id"))) * 50 * time.Microsecond)
		c.Status(http.StatusOK)
	})
	var w statsWatch
	stop := make(chan struct{})
	var readers, clients sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					w.look(q)
				}
			}
		})
	}
	readers.Go(func() { // the limit moves: raises wake many waiters at once
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				_ = q.SetLimit([]int{1, 32, 2, 64, 4}[i%5])
			}
		}
	})
	var sent atomic.Int64
	deadline := time.Now().Add(1500 * time.Millisecond)
	for c := range 32 {
		clients.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%7)*time.Millisecond)
				target := fmt.Sprintf("/?id=%d&p=%d&flow=%d", i%1000, i%3, c%4)
				r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(ctx, http.MethodGet, target, nil))
				cancel()
				sent.Add(1)
			}
		})
	}
	clients.Wait()
	close(stop)
	readers.Wait()
	w.look(q)
	w.check(t)
	st := q.Stats()
	assert.EqualValues(t, sent.Load(), st.Served+st.QueueFull+st.QueueTimeout+st.Canceled+st.Closed, "one outcome per request")
	assert.Equal(t, 0, st.Running)
}

// Stats.Abandoned counts the served requests whose client had gone by the
// time the handler returned: a hang-up while it ran, or its deadline passed
// (Config.Deadline), on the fast path and after a wait; never a request
// whose client was still there, nor one that was not served.
func TestAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 10 * time.Second})
		r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
		out := make(chan result, 8)
		t0 := time.Now()

		send(r, context.Background(), 1, t0, out) // ran at once, client stays
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		send(r, ctx, 2, t0, out) // waits, runs 100–200 ms, hangs up at 150 ms
		synctest.Wait()
		sendBy(r, context.Background(), 3, "250ms", t0, out) // runs 200–300 ms: its deadline passes at 250 ms
		synctest.Wait()
		gone, cancelGone := context.WithCancel(context.Background())
		send(r, gone, 4, t0, out) // hangs up while waiting: canceled, not abandoned
		synctest.Wait()
		cancelGone()
		time.Sleep(150 * time.Millisecond)
		cancel()
		for range 4 {
			<-out
		}
		st := q.Stats()
		assert.EqualValues(t, 3, st.Served)
		assert.EqualValues(t, 1, st.Canceled)
		assert.EqualValues(t, 2, st.Abandoned)

		fast, cancelFast := context.WithCancel(context.Background())
		send(r, fast, 5, t0, out) // the fast path, hung up while it runs
		synctest.Wait()
		cancelFast()
		<-out
		assert.EqualValues(t, 3, q.Stats().Abandoned)
		b, err := json.Marshal(q.Stats())
		require.NoError(t, err)
		assert.Contains(t, string(b), `"abandoned":3`)
	})
}

// Stats.Abandoned looks at the request context the Queue passed on, not at
// c.Request once the chain has returned: a middleware behind the Queue that
// puts its own context on c.Request (the usual per-route timeout:
// WithTimeout, defer cancel) leaves a context it has just canceled there,
// though its client got the answer; and one that detaches the work from the
// client (context.WithoutCancel) must not hide a hang-up.
func TestAbandonedLooksAtTheContextTheQueuePassedOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 10 * time.Second})
		r := gin.New()
		r.Use(q.Handler(), func(c *gin.Context) { // a per-route timeout middleware behind the Queue
			ctx, cancel := context.WithTimeout(c.Request.Context(), 5*time.Second)
			defer cancel()
			c.Request = c.Request.WithContext(ctx)
			c.Next()
		})
		r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
		for range 3 {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil)) // client stays, context never ends
			assert.Equal(t, http.StatusOK, w.Code)
		}
		assert.Zero(t, q.Stats().Abandoned, "no client left: nothing was abandoned")
	})
}

func TestAbandonedSeesAHangUpHiddenBehindTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 10 * time.Second})
		r := gin.New()
		r.Use(q.Handler(), func(c *gin.Context) { // detaches the work from the client (context.WithoutCancel)
			c.Request = c.Request.WithContext(context.WithoutCancel(c.Request.Context()))
			c.Next()
		})
		r.GET("/", sleeper(100*time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil))
			close(done)
		}()
		synctest.Wait()
		cancel() // the client hangs up while its handler runs
		<-done
		assert.EqualValues(t, 1, q.Stats().Abandoned, "the client hung up while its handler ran")
	})
}

// A reader racing a load never sees Abandoned above Served, nor outcomes
// that no instant had: the requests that had returned before the read are
// all counted in it, and it counts no more than had arrived after it. The
// clients hung up before they arrived and the handler is empty, so every
// request is served at once and abandoned as it returns: a read of Served
// before Abandoned sees one counted in the second and not the first.
func TestStatsAreOneCutUnderLoad(t *testing.T) {
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4})
	r := newEngine(q.Handler(), func(*gin.Context) {})
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	var arrived, returned atomic.Uint64
	stop := make(chan struct{})
	var clients sync.WaitGroup
	for range 2 {
		clients.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				arrived.Add(1)
				r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(gone, http.MethodGet, "/", nil))
				returned.Add(1)
			}
		})
	}
	var fails []string
	for i := 0; i < 20000 && len(fails) < 10; i++ {
		before := returned.Load()
		st := q.Stats()
		after := arrived.Load()
		total := st.Served + st.QueueFull + st.QueueTimeout + st.Canceled + st.Closed + st.Panicked
		if st.Abandoned > st.Served || total < before || total > after {
			fails = append(fails, fmt.Sprintf("read %d: Abandoned %d, Served %d, outcomes %d, returned before %d, arrived after %d",
				i, st.Abandoned, st.Served, total, before, after))
		}
	}
	close(stop)
	clients.Wait()
	assert.Empty(t, fails)
	assert.NotZero(t, q.Stats().Abandoned, "the clients had hung up")
}

// statsDuring is a Backend whose Stats lets requests go on before it
// counts, once: what any Backend's Stats allows when its goroutine is
// descheduled, or waits on a lock, between the Queue's counters and its own.
type statsDuring struct {
	backend.Backend
	during func()
}

func (b *statsDuring) Stats() backend.Stats {
	if f := b.during; f != nil {
		b.during = nil
		f()
	}
	return b.Backend.Stats()
}

// lateThenPlain is an engine behind q, and the two requests one client sends
// in turn: one whose deadline has passed (queue timeout at once, 408), then a
// plain one (served, 200). While the client does only this, QueueTimeout is
// never below Served.
func lateThenPlain(q *ginqueue.Queue) (r *gin.Engine, late, plain *http.Request) {
	r = gin.New()
	r.Use(gin.Recovery(), q.Handler())
	r.GET("/", func(c *gin.Context) { c.Status(http.StatusOK) })
	late = httptest.NewRequest(http.MethodGet, "/", nil)
	late.Header.Set(clientTimeout, "0")
	return r, late, httptest.NewRequest(http.MethodGet, "/", nil)
}

// A Stats read that overlaps a queue timeout and the request served after it
// must not show the second without the first (Served 1, QueueTimeout 0, a
// state the Queue never had): the Queue's counters are read again after
// the Backend's.
func TestStatsCutBesideABackendRead(t *testing.T) {
	b := &statsDuring{Backend: inmem.New()}
	q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: time.Second, Backend: b})
	r, late, plain := lateThenPlain(q)
	var codes []int
	b.during = func() {
		for _, req := range []*http.Request{late, plain} {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			codes = append(codes, w.Code)
		}
	}
	st := q.Stats()
	assert.Equal(t, []int{http.StatusRequestTimeout, http.StatusOK}, codes)
	assert.LessOrEqual(t, st.Served, st.QueueTimeout,
		"Stats counts the served request but not the queue timeout answered before it arrived")
}

// The same with the in-memory Backend as it is: readers racing one client
// that alternates the two requests never see Served above QueueTimeout
// (more threads than CPUs, so that a reader is descheduled between the
// Queue's counters and the Backend's). A read in one fixed order saw it
// within milliseconds.
func TestStatsNeverShowServedAheadOfAnEarlierTimeout(t *testing.T) {
	procs := max(8, 2*runtime.NumCPU())
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: time.Second})
	r, late, plain := lateThenPlain(q)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			r.ServeHTTP(httptest.NewRecorder(), late)
			r.ServeHTTP(httptest.NewRecorder(), plain)
		}
	})
	seen := make(chan ginqueue.Stats, 1)
	for range procs - 1 {
		wg.Go(func() {
			for !stop.Load() {
				if st := q.Stats(); st.Served > st.QueueTimeout {
					select {
					case seen <- st:
					default:
					}
					return
				}
			}
		})
	}
	select {
	case st := <-seen:
		t.Errorf("Stats shows Served %d above QueueTimeout %d, which it never was", st.Served, st.QueueTimeout)
	case <-time.After(2 * time.Second):
	}
	stop.Store(true)
	wg.Wait()
}
