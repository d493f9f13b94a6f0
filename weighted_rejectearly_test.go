package ginqueue_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
)

// Through the Queue: Cost, Priority, RejectEarly and a client Deadline. A
// cost-4 head holds two free slots; a priority-1 request with a 50 ms client
// deadline would run at once on one of them (Config.Cost: "a waiter of a
// higher priority ... runs at once on free slots that the head is waiting
// for"), but RejectEarly answers it 503 as if it had to wait.
func TestRejectEarlyLetsAHigherPriorityRunOnFreeSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 10, QueueTimeout: time.Second,
			RejectEarly: true, Cost: byQueryCost, Priority: byQueryPriority,
			Deadline: ginqueue.DeadlineHeader("X-Client-Timeout")})
		block := make(chan struct{})
		r := gin.New()
		r.Use(q.Handler())
		r.GET("/", func(c *gin.Context) {
			switch c.Query("h") {
			case "slow":
				time.Sleep(400 * time.Millisecond) // the measured slot time
			case "block":
				<-block
			}
			c.Status(http.StatusOK)
		})
		do := func(url, wait string) <-chan int {
			out := make(chan int, 1)
			go func() {
				req := httptest.NewRequest(http.MethodGet, url, nil)
				if wait != "" {
					req.Header.Set("X-Client-Timeout", wait)
				}
				w := httptest.NewRecorder()
				r.ServeHTTP(w, req)
				out <- w.Code
			}()
			synctest.Wait()
			return out
		}
		require.Equal(t, http.StatusOK, <-do("/?h=slow&c=1", "")) // slot time 400 ms measured
		b1, b2 := do("/?h=block&c=1", ""), do("/?h=block&c=1", "")
		heavy := do("/?c=4", "")
		require.Equal(t, 2, q.Stats().Running)
		require.Equal(t, 1, q.Stats().Queued)

		code := <-do("/?p=1&c=1", "50ms")
		assert.Equal(t, http.StatusOK, code, "a free slot, and a priority above the heavy head's: it runs at once")
		close(block)
		assert.Equal(t, http.StatusOK, <-b1)
		assert.Equal(t, http.StatusOK, <-b2)
		assert.Equal(t, http.StatusOK, <-heavy)
	})
}
