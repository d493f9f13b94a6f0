package ginqueue_test

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
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
		var outcomes []ginqueue.Outcome // appended on the requests' goroutines, read after both answered
		q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1,
			OnQueueTimeout: func(c *gin.Context) { c.String(http.StatusServiceUnavailable, "try later") },
			OnOutcome:      func(_ *gin.Context, o ginqueue.Outcome, _ time.Duration) { outcomes = append(outcomes, o) },
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
		assert.Equal(t, []ginqueue.Outcome{ginqueue.OutcomeQueueTimeout, ginqueue.OutcomeServed}, outcomes)
	})
}
