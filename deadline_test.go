// Config.Deadline and DeadlineHeader: a client's own deadline.

package ginqueue_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
)

// DeadlineHeader reads seconds or a Go duration; zero is a deadline that has
// already come, and a value that is not a usable wait is no deadline.
func TestDeadlineHeaderValues(t *testing.T) {
	tests := []struct {
		name   string
		values []string // nil: no header
		want   time.Duration
		none   bool // no deadline: the zero Time
	}{
		{name: "decimal seconds", values: []string{"2.5"}, want: 2500 * time.Millisecond},
		{name: "whole seconds", values: []string{"30"}, want: 30 * time.Second},
		{name: "fraction of a second", values: []string{"0.25"}, want: 250 * time.Millisecond},
		{name: "exponent", values: []string{"1e-3"}, want: time.Millisecond},
		{name: "plus sign", values: []string{"+2"}, want: 2 * time.Second},
		{name: "milliseconds", values: []string{"2500ms"}, want: 2500 * time.Millisecond},
		{name: "minute", values: []string{"1m"}, want: time.Minute},
		{name: "compound duration", values: []string{"1h30m"}, want: 90 * time.Minute},
		{name: "spaces around", values: []string{" 2 "}, want: 2 * time.Second},
		{name: "the first of several", values: []string{"1", "5"}, want: time.Second},
		{name: "large but a Duration", values: []string{"1e9"}, want: 1e9 * time.Second},
		{name: "zero: no time left", values: []string{"0"}, want: 0},
		{name: "zero duration", values: []string{"0s"}, want: 0},
		{name: "negative zero", values: []string{"-0"}, want: 0},
		{name: "missing", values: nil, none: true},
		{name: "empty", values: []string{""}, none: true},
		{name: "blank", values: []string{"   "}, none: true},
		{name: "negative seconds", values: []string{"-1"}, none: true},
		{name: "negative fraction", values: []string{"-0.5"}, none: true},
		{name: "negative duration", values: []string{"-1s"}, none: true},
		{name: "NaN", values: []string{"NaN"}, none: true},
		{name: "infinity", values: []string{"Inf"}, none: true},
		{name: "plus infinity", values: []string{"+Inf"}, none: true},
		{name: "minus infinity", values: []string{"-Inf"}, none: true},
		{name: "beyond float64", values: []string{"1e400"}, none: true},
		{name: "beyond a Duration in seconds", values: []string{"1e10"}, none: true},
		{name: "beyond a Duration", values: []string{"3000000h"}, none: true},
		{name: "garbage", values: []string{"soon"}, none: true},
		{name: "two dots", values: []string{"2.5.1"}, none: true},
		{name: "no unit after a number", values: []string{"1m5"}, none: true},
		{name: "a date", values: []string{"Mon, 02 Jan 2006 15:04:05 GMT"}, none: true},
	}
	deadline := ginqueue.DeadlineHeader("x-client-timeout") // any case: headers are canonical
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, _ := gin.CreateTestContext(httptest.NewRecorder())
				c.Request = httptest.NewRequest(http.MethodGet, "/", nil)
				if tt.values != nil {
					c.Request.Header[clientTimeout] = tt.values
				}
				now := time.Now()
				got := deadline(c)
				if tt.none {
					assert.True(t, got.IsZero(), "want no deadline, got %v from now", got.Sub(now))
					return
				}
				require.False(t, got.IsZero(), "want a deadline")
				assert.Equal(t, tt.want, got.Sub(now))
			})
		})
	}
}

// Under a full throttle each waiter is answered as queue timeout at its own
// client deadline, in deadline order, not arrival order, long before
// QueueTimeout; one without a deadline keeps waiting and is served.
func TestDeadlineEndsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var outcomes outcomeLog
		q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: time.Minute,
			OnQueueTimeout: func(c *gin.Context) { c.String(http.StatusRequestTimeout, "late") },
			OnOutcome:      outcomes.add,
		})
		g, r := gated(q)
		out := make(chan result, 5)
		t0 := time.Now()
		send(r, context.Background(), 0, t0, out) // holds the slot
		<-g.started
		for id, wait := range map[int]string{1: "300ms", 2: "0.1", 3: "200ms", 4: ""} {
			sendBy(r, context.Background(), id, wait, t0, out)
			synctest.Wait()
		}
		require.Equal(t, 4, q.Stats().Queued)
		for _, want := range []struct {
			id int
			at time.Duration
		}{{2, 100 * time.Millisecond}, {3, 200 * time.Millisecond}, {1, 300 * time.Millisecond}} {
			res := <-out
			assert.Equal(t, want.id, res.id)
			assert.Equal(t, http.StatusRequestTimeout, res.code)
			assert.Equal(t, "late", res.body, "OnQueueTimeout answers")
			assert.NotEmpty(t, res.header.Get("Retry-After"))
			assert.Equal(t, want.at, res.at, "waiter %d must leave at its deadline", want.id)
		}
		time.Sleep(time.Second)
		assert.Equal(t, 1, q.Stats().Queued, "the waiter without a deadline stays")
		g.open(2)
		assert.Equal(t, 4, <-g.started)
		for range 2 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
		st := q.Stats()
		assert.EqualValues(t, 3, st.QueueTimeout)
		assert.EqualValues(t, 2, st.Served)
		assert.Zero(t, st.Canceled)
		assert.Equal(t, []ginqueue.Outcome{ginqueue.OutcomeQueueTimeout, ginqueue.OutcomeQueueTimeout,
			ginqueue.OutcomeQueueTimeout, ginqueue.OutcomeServed, ginqueue.OutcomeServed}, outcomes.get())
	})
}

// A client that hangs up before its deadline is canceled (499), not timed
// out: the deadline's context still tells a hang-up from a deadline.
func TestDeadlineHangUpIsStillCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute})
		g, r := gated(q)
		out := make(chan result, 2)
		t0 := time.Now()
		send(r, context.Background(), 0, t0, out)
		<-g.started
		ctx, cancel := context.WithCancel(context.Background())
		sendBy(r, ctx, 1, "1s", t0, out)
		time.Sleep(100 * time.Millisecond)
		cancel()
		res := <-out
		assert.Equal(t, ginqueue.StatusClientClosedRequest, res.code)
		assert.Equal(t, 100*time.Millisecond, res.at)
		g.open(1)
		assert.Equal(t, http.StatusOK, (<-out).code)
		st := q.Stats()
		assert.EqualValues(t, 1, st.Canceled)
		assert.Zero(t, st.QueueTimeout)
	})
}

// The deadline is the earlier of the header's and the request context's,
// whichever comes first: a waiter leaves at it, and the handler's context
// ends at it, also after waiting.
func TestDeadlineEarlierWins(t *testing.T) {
	type seen struct {
		deadline time.Time
		ok       bool
		ended    time.Duration // when the handler's context ended, since t0
	}
	tests := []struct {
		name   string
		header string        // empty: none
		ctx    time.Duration // the request context's timeout; zero: none
		want   time.Duration // the deadline, from arrival; zero: none
	}{
		{name: "header only", header: "2s", want: 2 * time.Second},
		{name: "context only", ctx: time.Second, want: time.Second},
		{name: "header earlier", header: "500ms", ctx: time.Second, want: 500 * time.Millisecond},
		{name: "context earlier", header: "2s", ctx: time.Second, want: time.Second},
		{name: "a bad header: the context's", header: "-1", ctx: time.Second, want: time.Second},
		{name: "neither"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A free slot: the handler runs at once and sees the deadline,
			// and its context ends at it.
			synctest.Test(t, func(t *testing.T) {
				q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute})
				got := make(chan seen, 1)
				t0 := time.Now()
				r := newEngine(q.Handler(), func(c *gin.Context) {
					var s seen
					s.deadline, s.ok = c.Request.Context().Deadline()
					if s.ok {
						<-c.Request.Context().Done() // a call that gives up with the client
						s.ended = time.Since(t0)
					}
					got <- s
					c.Status(http.StatusOK)
				})
				ctx := context.Background()
				if tt.ctx > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.ctx)
					defer cancel()
				}
				out := make(chan result, 1)
				sendBy(r, ctx, 0, tt.header, t0, out)
				s := <-got
				assert.Equal(t, http.StatusOK, (<-out).code)
				if tt.want == 0 {
					assert.False(t, s.ok, "no deadline")
					return
				}
				require.True(t, s.ok, "the handler must see the deadline")
				assert.Equal(t, tt.want, s.deadline.Sub(t0))
				assert.Equal(t, tt.want, s.ended)
			})
			if tt.want == 0 {
				return
			}
			// A full throttle: the waiter leaves at the deadline.
			synctest.Test(t, func(t *testing.T) {
				q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute})
				g, r := gated(q)
				out := make(chan result, 2)
				t0 := time.Now()
				send(r, context.Background(), 0, t0, out)
				<-g.started
				ctx := context.Background()
				if tt.ctx > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.ctx)
					defer cancel()
				}
				sendBy(r, ctx, 1, tt.header, t0, out)
				res := <-out
				assert.Equal(t, http.StatusRequestTimeout, res.code)
				assert.Equal(t, tt.want, res.at)
				g.open(1)
				<-out
				assert.EqualValues(t, 1, q.Stats().QueueTimeout)
			})
		})
	}
	// A waiter served before its deadline keeps it: the handler's context
	// ends at arrival + the header's wait, not later.
	synctest.Test(t, func(t *testing.T) {
		q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute})
		ended := make(chan time.Duration, 1)
		t0 := time.Now()
		r := newEngine(q.Handler(), func(c *gin.Context) {
			if c.Query("id") == "0" {
				time.Sleep(200 * time.Millisecond)
			} else {
				<-c.Request.Context().Done()
				ended <- time.Since(t0)
			}
			c.Status(http.StatusOK)
		})
		out := make(chan result, 2)
		send(r, context.Background(), 0, t0, out)
		synctest.Wait()
		sendBy(r, context.Background(), 1, "500ms", t0, out)
		assert.Equal(t, 500*time.Millisecond, <-ended)
		for range 2 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
		assert.Equal(t, 200*time.Millisecond, q.Stats().WaitP99.Round(10*time.Millisecond), "it waited, then ran")
	})
}

// The handler gets a copy of the request with the deadline's context; the
// middleware in front gets its own request back, with a live context, and
// the deadline's context is ended, also when the handler panics.
func TestDeadlineRequestPutBack(t *testing.T) {
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics=%v", panics), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute})
				type look struct {
					before, after *http.Request
					afterErr      error
				}
				looks := make(chan look, 1)
				var innerCtx atomic.Pointer[context.Context]
				var inner atomic.Pointer[http.Request]
				r := gin.New()
				r.Use(gin.Recovery(), func(c *gin.Context) {
					var l look
					l.before = c.Request
					defer func() {
						l.after = c.Request
						l.afterErr = c.Request.Context().Err()
						looks <- l
					}()
					c.Next()
				}, q.Handler())
				r.GET("/", func(c *gin.Context) {
					ctx := c.Request.Context()
					innerCtx.Store(&ctx)
					inner.Store(c.Request)
					if panics {
						panic("boom")
					}
					c.Status(http.StatusOK)
				})
				out := make(chan result, 2)
				sendBy(r, context.Background(), 0, "10s", time.Now(), out)
				res := <-out
				l := <-looks
				want := http.StatusOK
				if panics {
					want = http.StatusInternalServerError
				}
				assert.Equal(t, want, res.code)
				assert.NotSame(t, l.before, inner.Load(), "the handler gets a copy")
				assert.Same(t, l.before, l.after, "the chain in front gets its own request back")
				assert.NoError(t, l.afterErr)
				ctx := *innerCtx.Load()
				assert.ErrorIs(t, ctx.Err(), context.Canceled, "the deadline's context is ended when the Queue returns")
				assert.Equal(t, 0, q.Stats().Running)
				sendBy(r, context.Background(), 1, "", time.Now(), out)
				assert.Equal(t, want, (<-out).code, "the slot was given back")
				<-looks
			})
		})
	}
}

// A request whose deadline has passed on arrival does not run, even with a
// slot free: queue timeout at once, or queue full with RejectEarly; a client
// that has hung up is canceled, and after Close it is closed. A bad header
// is no deadline, and without Config.Deadline nothing changes.
func TestDeadlinePassedOnArrival(t *testing.T) {
	tests := []struct {
		name        string
		header      string
		ctx         func() (context.Context, context.CancelFunc)
		rejectEarly bool
		closed      bool
		noDeadline  bool // Config.Deadline nil
		code        int
		outcome     ginqueue.Outcome
	}{
		{name: "zero", header: "0", code: http.StatusRequestTimeout, outcome: ginqueue.OutcomeQueueTimeout},
		{name: "zero with RejectEarly", header: "0s", rejectEarly: true,
			code: http.StatusServiceUnavailable, outcome: ginqueue.OutcomeQueueFull},
		{name: "the context's deadline passed", header: "10s", ctx: pastDeadline,
			code: http.StatusRequestTimeout, outcome: ginqueue.OutcomeQueueTimeout},
		{name: "the client hung up", header: "0", ctx: hungUp,
			code: ginqueue.StatusClientClosedRequest, outcome: ginqueue.OutcomeCanceled},
		{name: "closed", header: "0", closed: true, code: http.StatusServiceUnavailable, outcome: ginqueue.OutcomeClosed},
		{name: "negative: ignored", header: "-1", code: http.StatusOK, outcome: ginqueue.OutcomeServed},
		{name: "without Config.Deadline, as before", header: "0", ctx: pastDeadline, noDeadline: true,
			code: http.StatusOK, outcome: ginqueue.OutcomeServed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var outcomes outcomeLog
				cfg := ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute,
					RejectEarly: tt.rejectEarly, OnOutcome: outcomes.add}
				if !tt.noDeadline {
					cfg.Deadline = ginqueue.DeadlineHeader(clientTimeout)
				}
				q := mustQueue(t, cfg)
				if tt.closed {
					require.NoError(t, q.Close())
				}
				var ran atomic.Int64
				r := newEngine(q.Handler(), func(c *gin.Context) { ran.Add(1); c.Status(http.StatusOK) })
				ctx := context.Background()
				if tt.ctx != nil {
					var cancel context.CancelFunc
					ctx, cancel = tt.ctx()
					defer cancel()
				}
				out := make(chan result, 1)
				t0 := time.Now()
				sendBy(r, ctx, 0, tt.header, t0, out)
				res := <-out
				assert.Equal(t, tt.code, res.code)
				assert.Zero(t, res.at, "answered at once")
				assert.Equal(t, []ginqueue.Outcome{tt.outcome}, outcomes.get())
				assert.Equal(t, tt.outcome == ginqueue.OutcomeServed, ran.Load() == 1, "only a served request runs")
				want := counted(ginqueue.Stats{})
				want[tt.outcome] = 1
				assert.Equal(t, want, counted(q.Stats()))
			})
		})
	}
}

func pastDeadline() (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
}

func hungUp() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx, cancel
}

// A waiter whose deadline is nearer than its handler needs when its turn
// comes is answered queue timeout at that instant, and its slot goes to the
// next waiter in the same instant: no handler starts for a client that will
// not wait for it. The need is the measured handler time by default,
// Config.MinTimeLeft when set, and nothing when it is negative.
func TestMinTimeLeft(t *testing.T) {
	for _, tc := range []struct {
		name        string
		minTimeLeft time.Duration
		want        map[int]int // status by request id
		timedOutAt  time.Duration
	}{
		// 1 runs 0–100 ms; 2 (150 ms) would have 50 ms left at 100 ms, below
		// the 100 ms measured: 408 at 100 ms, and 3 runs from 100 ms.
		{"measured", 0, map[int]int{1: 200, 2: 408, 3: 200}, 100 * time.Millisecond},
		{"set below the time left", 40 * time.Millisecond, map[int]int{1: 200, 2: 200, 3: 200}, 0},
		{"set above the time left", 60 * time.Millisecond, map[int]int{1: 200, 2: 408, 3: 200}, 100 * time.Millisecond},
		{"off", -1, map[int]int{1: 200, 2: 200, 3: 200}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second,
					MinTimeLeft: tc.minTimeLeft})
				r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
				out := make(chan result, 4)
				sendBy(r, context.Background(), 0, "", time.Now(), out) // measures the handler: 100 ms
				require.Equal(t, http.StatusOK, (<-out).code)

				t0 := time.Now()
				sendBy(r, context.Background(), 1, "", t0, out)
				synctest.Wait()
				sendBy(r, context.Background(), 2, "150ms", t0, out)
				synctest.Wait()
				sendBy(r, context.Background(), 3, "", t0, out)
				synctest.Wait()
				got, at := map[int]int{}, map[int]time.Duration{}
				for range 3 {
					res := <-out
					got[res.id], at[res.id] = res.code, res.at
				}
				assert.Equal(t, tc.want, got)
				st := q.Stats()
				if tc.timedOutAt > 0 {
					assert.Equal(t, tc.timedOutAt, at[2], "answered when its turn came, not at its deadline")
					assert.Equal(t, 200*time.Millisecond, at[3], "3 ran from the instant 2 was refused")
					assert.EqualValues(t, 1, st.QueueTimeout)
					assert.EqualValues(t, 3, st.Served, "a refused grant is not served")
				} else {
					assert.Equal(t, 300*time.Millisecond, at[3])
					assert.Zero(t, st.QueueTimeout)
					assert.EqualValues(t, 4, st.Served)
				}
				assert.Zero(t, st.Running)
			})
		})
	}
}

// MinTimeLeft never refuses a request that finds its slot free, nor one
// that waits before any handler time is measured, nor any request without
// Config.Deadline (a context deadline alone does not bring it in).
func TestMinTimeLeftLeavesAlone(t *testing.T) {
	t.Run("a free slot", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second})
			r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
			out := make(chan result, 1)
			sendBy(r, context.Background(), 0, "", time.Now(), out)
			require.Equal(t, http.StatusOK, (<-out).code)
			sendBy(r, context.Background(), 1, "10ms", time.Now(), out)
			assert.Equal(t, http.StatusOK, (<-out).code, "no wait: its time left is not looked at")
		})
	})
	t.Run("nothing measured yet", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second})
			r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
			out := make(chan result, 2)
			t0 := time.Now()
			sendBy(r, context.Background(), 1, "", t0, out)
			synctest.Wait()
			sendBy(r, context.Background(), 2, "101ms", t0, out)
			for range 2 {
				assert.Equal(t, http.StatusOK, (<-out).code)
			}
		})
	})
	t.Run("no Config.Deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second})
			r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
			out := make(chan result, 2)
			sendBy(r, context.Background(), 0, "", time.Now(), out)
			require.Equal(t, http.StatusOK, (<-out).code)
			t0 := time.Now()
			sendBy(r, context.Background(), 1, "", t0, out)
			synctest.Wait()
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			sendBy(r, ctx, 2, "", t0, out)
			for range 2 {
				assert.Equal(t, http.StatusOK, (<-out).code, "a context deadline alone: MinTimeLeft does not apply")
			}
		})
	})
}

// With RejectEarly, the time a request may wait is its time left less what
// its handler needs: one that would be refused at its grant is refused on
// arrival instead (503), and one that fits both runs.
func TestMinTimeLeftWithRejectEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second,
			RejectEarly: true})
		r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
		out := make(chan result, 4)
		sendBy(r, context.Background(), 0, "", time.Now(), out)
		require.Equal(t, http.StatusOK, (<-out).code)
		t0 := time.Now()
		sendBy(r, context.Background(), 1, "", t0, out)
		synctest.Wait()
		sendBy(r, context.Background(), 2, "150ms", t0, out) // waits 100 ms, needs 100 ms: refused now
		synctest.Wait()
		res := <-out
		assert.Equal(t, 2, res.id)
		assert.Equal(t, http.StatusServiceUnavailable, res.code)
		assert.Zero(t, res.at, "refused on arrival")
		sendBy(r, context.Background(), 3, "250ms", t0, out) // waits 100 ms, needs 100 ms, has 250: runs
		got := map[int]int{}
		for range 2 {
			res := <-out
			got[res.id] = res.code
		}
		assert.Equal(t, map[int]int{1: 200, 3: 200}, got)
		st := q.Stats()
		assert.EqualValues(t, 1, st.QueueFull)
		assert.Zero(t, st.QueueTimeout)
	})
}

// MinTimeLeft's default is the measured handler time plus a tenth of the
// time the request had left on arrival: with a 100 ms handler and 1 s left,
// a waiter needs 200 ms at its turn.
func TestMinTimeLeftDefaultAddsATenthOfTheTimeLeft(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ahead int // requests of 100 ms ahead of it
		want  int
	}{
		{"granted with 300 ms left", 7, http.StatusOK},
		{"granted with 200 ms left", 8, http.StatusOK},
		{"granted with 100 ms left", 9, http.StatusRequestTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 20, QueueTimeout: 10 * time.Second})
				r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
				out := make(chan result, 16)
				sendBy(r, context.Background(), 0, "", time.Now(), out) // measures the handler: 100 ms
				require.Equal(t, http.StatusOK, (<-out).code)
				t0 := time.Now()
				for i := range tc.ahead {
					sendBy(r, context.Background(), i+1, "", t0, out)
					synctest.Wait()
				}
				sendBy(r, context.Background(), 100, "1", t0, out)
				for range tc.ahead + 1 {
					if res := <-out; res.id == 100 {
						assert.Equal(t, tc.want, res.code)
						turn := time.Duration(tc.ahead) * 100 * time.Millisecond
						if res.code == http.StatusOK {
							turn += 100 * time.Millisecond // its own handler
						}
						assert.Equal(t, turn, res.at, "answered at its turn")
					}
				}
			})
		})
	}
}

// A heavy head waiter past its MinTimeLeft cutoff (it will be answered 408
// whatever happens) does not hold the line: it is passed over as soon as a
// slot frees, not once all its slots are free, and the light waiter behind
// it runs on the slot.
//
//	0 ms    A (cost 1, 400 ms) and B (cost 1, 100 ms) run; limit 2.
//	0 ms    H (cost 2, deadline 200 ms, cutoff 50 ms) waits for 2 slots.
//	0 ms    L (cost 1, deadline 290 ms, cutoff 140 ms) waits behind H.
//	100 ms  B ends: one slot free. H is past its cutoff: 408; L has 190 ms
//	        left, needs 150 ms: it runs.
func TestMinTimeLeftPassesOverAHeavyHeadPastItsCutoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 2, MaxQueue: 10, QueueTimeout: 10 * time.Second,
			Deadline: ginqueue.DeadlineHeader("X-T"), MinTimeLeft: 150 * time.Millisecond,
			Cost: func(c *gin.Context) int { n, _ := strconv.Atoi(c.Query("c")); return n }})
		r := gin.New()
		r.Use(q.Handler())
		r.GET("/", func(c *gin.Context) {
			ms, _ := strconv.Atoi(c.Query("ms"))
			time.Sleep(time.Duration(ms) * time.Millisecond)
			c.Status(http.StatusOK)
		})
		type res struct {
			name string
			code int
			at   time.Duration
		}
		out := make(chan res, 4)
		t0 := time.Now()
		send := func(name string, cost, ms int, deadline string) {
			go func() {
				req := httptest.NewRequestWithContext(context.Background(), http.MethodGet, fmt.Sprintf("/?c=%d&ms=%d", cost, ms), nil)
				if deadline != "" {
					req.Header.Set("X-T", deadline)
				}
				w := httptest.NewRecorder()
				r.ServeHTTP(w, req)
				out <- res{name, w.Code, time.Since(t0)}
			}()
			synctest.Wait()
		}
		send("A", 1, 400, "")
		send("B", 1, 100, "")
		send("H", 2, 10, "200ms")
		send("L", 1, 100, "290ms")
		got := map[string]res{}
		for range 4 {
			x := <-out
			got[x.name] = x
		}
		assert.Equal(t, http.StatusRequestTimeout, got["H"].code)
		assert.Equal(t, http.StatusOK, got["L"].code,
			"L could run on the slot B freed at 100 ms; it was held for H, which was already past its cutoff (L answered at %v)", got["L"].at)
	})
}

// MinTimeLeft's default starts from the handler time, not the slot time
// (handler time × slots held): with Config.Cost a request of cost 4 whose
// handler takes 100 ms needs 140 ms of its 400, not 440.
func TestMinTimeLeftDefaultIsTheHandlerTimeWhateverTheCost(t *testing.T) {
	for _, cost := range []int{1, 4} {
		t.Run(map[int]string{1: "cost 1", 4: "cost 4"}[cost], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: cost, MaxQueue: 10, QueueTimeout: 10 * time.Second,
					Cost: func(*gin.Context) int { return cost }})
				r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
				out := make(chan result, 4)
				sendBy(r, context.Background(), 0, "", time.Now(), out) // measures the handler: 100 ms
				require.Equal(t, http.StatusOK, (<-out).code)

				t0 := time.Now()
				sendBy(r, context.Background(), 1, "", t0, out) // runs 0-100 ms, holds every slot
				synctest.Wait()
				// Needs 100 ms + 40 ms; has 300 ms left when its turn comes at 100 ms.
				sendBy(r, context.Background(), 2, "400ms", t0, out)
				got := map[int]int{}
				for range 2 {
					res := <-out
					got[res.id] = res.code
				}
				assert.Equal(t, map[int]int{1: 200, 2: 200}, got, "a 100 ms handler with 300 ms left is refused")
			})
		})
	}
}

// After a quiet period served at once (10 ms handlers), the handlers slow
// to 1 s under a load 5 times what the slots serve: MinTimeLeft's default
// follows within a few requests, so that most of the requests served after
// the slowdown still have their client (a mean that moved 1/16 per sample,
// with the fast path's samples weighing 16, left 25 of 27 abandoned).
func TestMinTimeLeftFollowsASlowdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var slow atomic.Bool
		q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 2, MaxQueue: 1000, QueueTimeout: time.Minute})
		r := newEngine(q.Handler(), func(c *gin.Context) {
			d := 10 * time.Millisecond
			if slow.Load() {
				d = time.Second
			}
			time.Sleep(d)
			c.Status(http.StatusOK)
		})
		fire := func(n int, every time.Duration) {
			for range n {
				go func() {
					req := httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil)
					req.Header.Set(clientTimeout, "1.5") // clients wait 1.5 s
					r.ServeHTTP(httptest.NewRecorder(), req)
				}()
				time.Sleep(every)
			}
		}
		fire(100, 10*time.Millisecond) // 10 ms handlers, mostly served at once
		time.Sleep(time.Second)
		slow.Store(true)
		before := q.Stats()
		fire(120, 100*time.Millisecond) // 12 s at 10 requests/s: 5x what 2 slots of 1 s serve
		time.Sleep(3 * time.Second)
		st := q.Stats()
		served, abandoned := st.Served-before.Served, st.Abandoned-before.Abandoned
		assert.Less(t, abandoned*2, served, "served %d after the slowdown, %d of them for clients who had left", served, abandoned)
	})
}

// A positive MinTimeLeft needs no measure: a waiter on a fresh Queue with
// less than it left at its turn is answered 408 then.
func TestPositiveMinTimeLeftAppliesBeforeAnythingIsMeasured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second,
			MinTimeLeft: time.Second})
		r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
		out := make(chan result, 2)
		t0 := time.Now()
		sendBy(r, context.Background(), 1, "", t0, out) // runs 0-100 ms: nothing measured before it ends
		synctest.Wait()
		sendBy(r, context.Background(), 2, "500ms", t0, out)
		got := map[int]int{}
		for range 2 {
			res := <-out
			got[res.id] = res.code
		}
		assert.Equal(t, map[int]int{1: 200, 2: http.StatusRequestTimeout}, got, "400 ms left at its turn, 1 s needed")
	})
}

// With RejectEarly, an arrival whose time left (500 ms) is below a positive
// MinTimeLeft (1 s) cannot be granted: it is refused on arrival (503), even
// before a handler time is measured, since that needs no estimate.
func TestRejectEarlyRefusesBeyondAPositiveMinTimeLeftBeforeAnythingIsMeasured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second,
			MinTimeLeft: time.Second, RejectEarly: true})
		r := newEngine(q.Handler(), sleeper(100*time.Millisecond))
		out := make(chan result, 2)
		t0 := time.Now()
		sendBy(r, context.Background(), 1, "", t0, out)
		synctest.Wait()
		sendBy(r, context.Background(), 2, "500ms", t0, out)
		for range 2 {
			if res := <-out; res.id == 2 {
				assert.Equal(t, http.StatusServiceUnavailable, res.code, "refused on arrival, not at its turn (answered at %v)", res.at)
			}
		}
	})
}
