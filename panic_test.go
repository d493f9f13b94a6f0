// What a panic in a function of the Config means: one outcome, counted
// once, reported once to OnOutcome, answered once, nothing held.

package ginqueue_test

import (
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
)

// boom panics for a request sent with ?boom=1.
func boom(c *gin.Context) {
	if c.Query("boom") != "" {
		panic("boom")
	}
}

func TestAPanickingFunctionIsOneOutcome(t *testing.T) {
	cases := []struct {
		name string
		// set puts the panicking function into cfg.
		set func(cfg *ginqueue.Config)
		// busy: the slot is held while the request arrives (Priority and
		// FlowKey are asked only of a request that may wait); closed: the
		// Queue is closed first.
		busy, closed bool
		want         ginqueue.Outcome
		code         int // the status the client gets
	}{
		{name: "Skip", set: func(cfg *ginqueue.Config) {
			cfg.Skip = func(c *gin.Context) bool { boom(c); return false }
		}, want: ginqueue.OutcomePanic, code: http.StatusInternalServerError},
		{name: "Deadline", set: func(cfg *ginqueue.Config) {
			cfg.Deadline = func(c *gin.Context) time.Time { boom(c); return time.Time{} }
		}, want: ginqueue.OutcomePanic, code: http.StatusInternalServerError},
		{name: "Cost", set: func(cfg *ginqueue.Config) {
			cfg.Cost = func(c *gin.Context) int { boom(c); return 1 }
		}, want: ginqueue.OutcomePanic, code: http.StatusInternalServerError},
		{name: "Priority", busy: true, set: func(cfg *ginqueue.Config) {
			cfg.Priority = func(c *gin.Context) int { boom(c); return 0 }
		}, want: ginqueue.OutcomePanic, code: http.StatusInternalServerError},
		{name: "FlowKey", busy: true, set: func(cfg *ginqueue.Config) {
			cfg.FlowKey = func(c *gin.Context) string { boom(c); return "" }
		}, want: ginqueue.OutcomePanic, code: http.StatusInternalServerError},
		{name: "OnQueueFull", busy: true, set: func(cfg *ginqueue.Config) {
			cfg.MaxQueue = 0
			cfg.OnQueueFull = boom
		}, want: ginqueue.OutcomeQueueFull, code: http.StatusInternalServerError},
		{name: "OnQueueTimeout", busy: true, set: func(cfg *ginqueue.Config) {
			cfg.QueueTimeout = 100 * time.Millisecond
			cfg.OnQueueTimeout = boom
		}, want: ginqueue.OutcomeQueueTimeout, code: http.StatusInternalServerError},
		{name: "OnClosed", closed: true, set: func(cfg *ginqueue.Config) {
			cfg.OnClosed = boom
		}, want: ginqueue.OutcomeClosed, code: http.StatusInternalServerError},
		{name: "OnDecision on a rejection", busy: true, set: func(cfg *ginqueue.Config) {
			cfg.MaxQueue = 0
			cfg.OnDecision = func(c *gin.Context, _ ginqueue.Decision) { boom(c) }
		}, want: ginqueue.OutcomeQueueFull, code: http.StatusInternalServerError},
		{name: "OnDecision on a grant", set: func(cfg *ginqueue.Config) {
			cfg.OnDecision = func(c *gin.Context, _ ginqueue.Decision) { boom(c) }
		}, want: ginqueue.OutcomeServed, code: http.StatusInternalServerError},
		{name: "OnDecision on a grant after a wait", busy: true, set: func(cfg *ginqueue.Config) {
			cfg.OnDecision = func(c *gin.Context, _ ginqueue.Decision) { boom(c) }
		}, want: ginqueue.OutcomeServed, code: http.StatusInternalServerError},
	}
	for _, tc := range cases {
		for _, outcomePanics := range []bool{false, true} {
			name := tc.name
			if outcomePanics {
				name += ", and OnOutcome too"
			}
			t.Run(name, func(t *testing.T) {
				checkOnePanic(t, tc.set, tc.busy, tc.closed, outcomePanics, tc.want, tc.code)
			})
		}
	}
}

// checkOnePanic sends a request that makes the function set puts in the
// Config panic, and checks that it has exactly one outcome everywhere and
// that nothing is held afterwards.
func checkOnePanic(t *testing.T, set func(*ginqueue.Config), busy, closed, outcomePanics bool,
	want ginqueue.Outcome, code int) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var reported []ginqueue.Outcome // OnOutcome's calls for the ?boom=1 request
		var recovered []any
		cfg := ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Second,
			OnOutcome: func(c *gin.Context, o ginqueue.Outcome, _ time.Duration) {
				if c.Query("boom") == "" {
					return
				}
				mu.Lock()
				reported = append(reported, o)
				mu.Unlock()
				if outcomePanics {
					panic("OnOutcome")
				}
			}}
		set(&cfg)
		q := mustQueue(t, cfg)
		r := gin.New()
		r.Use(gin.CustomRecovery(func(c *gin.Context, err any) {
			mu.Lock()
			recovered = append(recovered, err)
			mu.Unlock()
			c.AbortWithStatus(http.StatusInternalServerError)
		}), q.Handler())
		r.GET("/", func(c *gin.Context) {
			if c.Query("hold") != "" {
				time.Sleep(500 * time.Millisecond)
			}
			c.Status(http.StatusOK)
		})

		held := make(chan struct{})
		if busy {
			go func() {
				r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/?hold=1", nil))
				close(held)
			}()
			synctest.Wait()
		}
		if closed {
			require.NoError(t, q.Close())
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?boom=1", nil))
		if busy {
			<-held
		}
		synctest.Wait()

		assert.Equal(t, code, w.Code, "answered once, by gin.Recovery")
		mu.Lock()
		assert.Equal(t, []ginqueue.Outcome{want}, reported, "reported once to OnOutcome")
		panics := []any{"boom"}
		if outcomePanics {
			panics = []any{"OnOutcome"} // the last panic is the one recovered
		}
		assert.Equal(t, panics, recovered, "the panic reached gin.Recovery")
		mu.Unlock()
		st := q.Stats()
		wantCounts := counted(ginqueue.Stats{})
		wantCounts[want]++
		if busy {
			wantCounts[ginqueue.OutcomeServed]++ // the request that held the slot
		}
		assert.Equal(t, wantCounts, counted(st), "counted once")
		assert.Zero(t, st.Running, "no slot held")
		assert.Zero(t, st.Queued, "no place held")
		if !closed { // the slot is there for the next request
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			assert.Equal(t, http.StatusOK, w.Code)
		}
	})
}
