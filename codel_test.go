// Config.CoDel through the Queue: its drops are queue timeouts, and its configuration.

package ginqueue_test

import (
	"context"
	"net/http"
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

// A waiter that CoDel drops is a queue timeout in every respect: the status
// (408, or QueueTimeoutStatus), Retry-After, the OnQueueTimeout hook, the
// QueueTimeout counter and the outcome given to OnOutcome. With the default
// CoDel and a 10 s QueueTimeout, arrivals every 2 ms on a held slot keep the
// queue from emptying: it stands from 100 ms on, so a request that arrives
// at a is answered at max(100 ms, a + 5 ms), not at a + 10 s.
func TestCoDelDropIsAQueueTimeout(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		want   int
	}{
		{"default status", 0, http.StatusRequestTimeout},
		{"QueueTimeoutStatus", http.StatusServiceUnavailable, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var hooks atomic.Int64
				var mu sync.Mutex
				waits := map[ginqueue.Outcome][]time.Duration{}
				q := mustQueue(t, ginqueue.Config{
					MaxConcurrent: 1, MaxQueue: 100, QueueTimeout: 10 * time.Second, QueueTimeoutStatus: tc.status,
					CoDel: &ginqueue.CoDel{},
					OnQueueTimeout: func(c *gin.Context) {
						hooks.Add(1)
						c.Header("X-Hook", "timeout")
					},
					OnOutcome: func(c *gin.Context, o ginqueue.Outcome, wait time.Duration) {
						mu.Lock()
						waits[o] = append(waits[o], wait)
						mu.Unlock()
					},
				})
				g, r := gated(q)
				out := make(chan result, 64)
				t0 := time.Now()
				send(r, context.Background(), 0, t0, out) // holds the slot
				synctest.Wait()
				const n = 60
				var want []time.Duration
				for i := range n {
					a := time.Duration(2*i) * time.Millisecond
					time.Sleep(a - time.Since(t0))
					send(r, context.Background(), i+1, t0, out)
					want = append(want, max(100*time.Millisecond, a+5*time.Millisecond)-a)
				}
				for range n {
					res := <-out
					a := time.Duration(2*(res.id-1)) * time.Millisecond
					assert.Equal(t, tc.want, res.code, "request %d", res.id)
					assert.Equal(t, max(100*time.Millisecond, a+5*time.Millisecond), res.at, "request %d (at %v) answered", res.id, a)
					assert.Equal(t, "timeout", res.header.Get("X-Hook"), "request %d", res.id)
					assert.Equal(t, "1", res.header.Get("Retry-After"), "request %d", res.id)
				}
				g.open(1)
				assert.Equal(t, http.StatusOK, (<-out).code)
				assert.EqualValues(t, n, hooks.Load())
				st := q.Stats()
				assert.EqualValues(t, n, st.QueueTimeout)
				assert.EqualValues(t, 1, st.Served)
				assert.Zero(t, st.QueueFull)
				mu.Lock()
				defer mu.Unlock()
				assert.ElementsMatch(t, want, waits[ginqueue.OutcomeQueueTimeout], "OnOutcome's waits")
				assert.Len(t, waits[ginqueue.OutcomeServed], 1)
			})
		})
	}
}

// Validate refuses a CoDel that cannot work, naming the field; NewQueue
// returns the same error. A usable one reaches Backend.Start with its
// defaults filled in, as a copy: changing the Config's afterwards changes
// nothing. Without CoDel, the CoDel fields of Limits are zero.
func TestCoDelConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		codel *ginqueue.CoDel
		err   string
		want  *ginqueue.CoDel
	}{
		{"off", nil, "", nil},
		{"defaults", &ginqueue.CoDel{LIFO: true}, "", &ginqueue.CoDel{Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond, LIFO: true}},
		{"Target default below Interval", &ginqueue.CoDel{Interval: time.Second}, "", &ginqueue.CoDel{Target: 5 * time.Millisecond, Interval: time.Second}},
		{"Target == Interval", &ginqueue.CoDel{Target: time.Second, Interval: time.Second}, "", &ginqueue.CoDel{Target: time.Second, Interval: time.Second}},
		{"1 ns", &ginqueue.CoDel{Target: 1, Interval: 1}, "", &ginqueue.CoDel{Target: 1, Interval: 1}},
		{"negative Target", &ginqueue.CoDel{Target: -time.Millisecond}, "ginqueue: Config.CoDel.Target must not be negative, got -1ms", nil},
		{"negative Interval", &ginqueue.CoDel{Interval: -1}, "ginqueue: Config.CoDel.Interval must not be negative, got -1ns", nil},
		{"Target above Interval", &ginqueue.CoDel{Target: 2 * time.Second, Interval: time.Second},
			"ginqueue: Config.CoDel.Target must not exceed Config.CoDel.Interval, got 2s and 1s", nil},
		{"Target above the default Interval", &ginqueue.CoDel{Target: time.Second},
			"ginqueue: Config.CoDel.Target must not exceed Config.CoDel.Interval, got 1s and 100ms (the default for zero)", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &limitsRecorder{Backend: inmem.New()}
			cfg := ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, CoDel: tc.codel, Backend: b}
			q, err := ginqueue.NewQueue(cfg)
			if tc.err != "" {
				assert.EqualError(t, cfg.Validate(), tc.err)
				assert.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			defer q.Close()
			assert.Equal(t, tc.want, limitsCoDel(b.limits))
			if tc.codel != nil {
				tc.codel.Target = time.Hour
				assert.Equal(t, tc.want, limitsCoDel(b.limits), "the Backend keeps what it was given")
			}
		})
	}
}

// limitsCoDel is the CoDel setting l carries, nil when it is off.
func limitsCoDel(l backend.Limits) *ginqueue.CoDel {
	if l == (backend.Limits{MaxConcurrent: l.MaxConcurrent, MaxQueue: l.MaxQueue, QueueTimeout: l.QueueTimeout,
		MaxQueuePerFlow: l.MaxQueuePerFlow, Weighted: l.Weighted}) {
		return nil
	}
	return &ginqueue.CoDel{Target: l.CoDelTarget, Interval: l.CoDelInterval, LIFO: l.CoDelLIFO}
}
